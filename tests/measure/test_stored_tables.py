"""Every table stored with the course says how it was taken, and no stored per-prompt timing is a
spike: each run lies within SPIKE_LIMIT of its prompt's median over methods. The notebooks read
these tables, so a spike here would become a sentence there."""
from __future__ import annotations

import json
import statistics

import pytest

from specdecode_ref.measure.routing import MEASURED_DIR

SPIKE_LIMIT = 1.8
TABLES = sorted(p.name for p in MEASURED_DIR.glob("*.json"))
PER_PROMPT = [name for name in TABLES if name.startswith(("routing_", "parallel_"))]


def spikes(table: dict, limit: float = SPIKE_LIMIT) -> list:
    """(prompt, method, seconds / the prompt's median over methods) for every run beyond ``limit``."""
    out = []
    for prompt in table["prompts"]:
        median = statistics.median(prompt["seconds"].values())
        out += [(prompt["id"], m, s / median) for m, s in prompt["seconds"].items() if s > limit * median]
    return out


@pytest.mark.parametrize("name", TABLES)
def test_every_table_records_its_protocol(name):
    table = json.loads((MEASURED_DIR / name).read_text())
    meta = table.get("meta", table)
    assert meta.get("protocol"), f"{name} does not say how it was taken"


@pytest.mark.parametrize("name", PER_PROMPT)
def test_per_prompt_tables_are_timed_in_rounds_without_spikes(name):
    table = json.loads((MEASURED_DIR / name).read_text())
    assert table["meta"]["rounds"] >= 2 and "t1_s" in table["meta"] and not table["meta"]["busy_before"]
    assert not spikes(table), f"{name}: runs far from their prompt's median: {spikes(table)}"


def test_a_planted_spike_is_found():
    """Planted twin: one run at twice its prompt's other times."""
    table = {"prompts": [{"id": "p", "seconds": {"plain": 2.0, "ngram": 1.7, "draft": 1.9}},
                         {"id": "q", "seconds": {"plain": 2.0, "ngram": 4.1, "draft": 1.9}}]}
    assert [(p, m) for p, m, _ in spikes(table)] == [("q", "ngram")]
