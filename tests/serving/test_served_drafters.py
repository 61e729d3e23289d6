"""Our trained drafters exported and served in vLLM (``serving.served_drafters``).

The cheap tests read the committed measurement (``data/measured/served_drafters.json``) without
vLLM: every output equal on both sides and to plain greedy decoding, the counters consistent with
the per-step records, and the EAGLE-3 head's mean acceptance length in vLLM within 10 % of ours.

The vLLM tests (``make test-vllm``) run the round trip for every drafter that exports (the draft
model, the EAGLE-3 head, the Medusa heads): export, serve in vLLM on two benchmark prompts, decode
the same prompts with ours, and compare outputs, counters and drafts.
"""
import math

import pytest

from support import need_vllm

from specdecode_ref.serving import served_drafters as SD
from specdecode_ref.serving import suffix_vllm as S

MAL_TOLERANCE = 0.10  # vLLM's mean acceptance length over ours, within max_tokens: at most 10 % apart


def test_per_position_counts_survival():
    pos = SD.per_position([(3, 0), (3, 2), (3, 3), (1, 1), (0, 0)], k=3)
    assert pos == {"drafts": 4, "drafted": [4, 3, 3], "accepted": [3, 2, 1], "rate": [0.75, 0.5, 0.25]}
    empty = SD.per_position([], 2)
    assert (empty["drafts"], empty["drafted"], empty["accepted"]) == (0, [0, 0], [0, 0])
    assert all(math.isnan(r) for r in empty["rate"])


def test_unknown_drafter_is_refused(embedded):
    model, _ = embedded
    with pytest.raises(ValueError, match="no served comparison"):
        SD.our_proposer("hydra", model, 3)
    from specdecode_ref.serving.export import export_drafter

    with pytest.raises(ValueError, match="no vLLM export"):
        export_drafter("suffix", "/nonexistent", target=model)


def test_stored_comparison_is_consistent():
    stored = SD.load_served()
    meta = stored["meta"]
    for key in ("cpu", "date", "command", "max_new_tokens", "prompts"):
        assert meta.get(key), f"meta lacks {key}"
    assert {"eagle3", "medusa", "draft"} <= set(stored["drafters"])
    for name, result in stored["drafters"].items():
        rows, totals = result["rows"], result["totals"]
        n = result["meta"]["max_new_tokens"]
        assert len(rows) == totals["requests"] == meta["prompts"]
        assert all(r["ours_plain"] and r["vllm_plain"] for r in rows), f"{name}: an output differs from plain"
        for r in rows:
            counts = S.recount(r["vllm_steps"], n)
            assert counts["vllm_within"] == {c: r[f"vllm_within_{c}"] for c in S.COUNTERS}
            assert sum(d for d, _ in r["ours_steps"]) == r["ours_draft_tokens"]
        k = result["meta"]["k"]
        for side in ("ours", "vllm_within"):
            pos = result["per_position"][side]
            assert pos["drafts"] == totals[side]["drafts"] and sum(pos["accepted"]) == totals[side]["accepted"]
            assert len(pos["rate"]) == k
    table = SD.summary_table(stored)
    assert set(table.drafter) == set(stored["drafters"]) and len(table) == len(S.SIDES) * len(stored["drafters"])


def test_stored_eagle3_acceptance_in_vllm_is_ours():
    result = SD.load_served()["drafters"]["eagle3"]
    assert result["totals"]["ours"]["accepted"] > 0, "the stored EAGLE-3 head accepted nothing"
    assert abs(SD.mal_ratio(result) - 1) <= MAL_TOLERANCE


@pytest.mark.vllm
@pytest.mark.vllm_extra
@pytest.mark.parametrize("name", ["draft", "eagle3", "medusa"])
def test_exported_drafter_round_trip_in_vllm(embedded, name):
    need_vllm()
    from specdecode_ref.measure.harness.workloads import load_workloads

    model, tok = embedded
    items = [{"category": c, "id": p["id"], "messages": p["messages"]}
             for c, ps in load_workloads("qa,code", per_category=1).items() for p in ps]
    result = SD.compare_served(model, tok, name, items, k=3, max_new_tokens=24)
    rows, totals = result["rows"], result["totals"]
    assert all(r["ours_plain"] and r["vllm_plain"] for r in rows)
    assert totals["ours"]["drafts"] > 0 and totals["vllm_within"]["drafts"] > 0
    ratio = SD.mal_ratio(result)
    assert math.isfinite(ratio) and abs(ratio - 1) <= MAL_TOLERANCE, SD.summary_table({name: result}).to_string()
    compared = totals["drafts_compared"]
    assert compared > 0 and totals["drafts_differ"] <= max(1, compared // 10)  # near-ties only
