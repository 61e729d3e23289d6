"""The committed notebooks state results through code: guards on what a re-run could make false.

Sentences about measured values are rendered by the cells that measure them
(``specdecode_ref.measure.harness.claims``), so the markdown cells keep only what no run changes. These
checks read the committed notebooks (no execution): a markdown cell that types measured decimals,
an output taken on a busy machine, a leaked repr, a frozen progress bar or a stray warning would
each let the text or the saved outputs mislead a reader.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?!\.?\d)")
# Hand-typed decimals allowed in a notebook's markdown: derivation constants and cited literature
# figures (source and version named next to them). Measured values belong in rendered output.
DECIMAL_BUDGET = {"00": 13, "01": 35, "02": 32, "03": 0, "04": 7,
                  "05": 10, "06": 15, "07": 15, "08": 7, "09": 2, "10": 2, "11": 3, "12": 10, "13": 5}


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _markdown(path):
    return ["".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown"]


def _outputs(path):
    for i, cell in enumerate(_cells(path)):
        for out in cell.get("outputs", []):
            if out["output_type"] == "stream":
                yield i, out.get("name"), "".join(out["text"])
            elif "data" in out:
                data = out["data"]
                yield i, out["output_type"], "".join(data.get("text/markdown", data.get("text/plain", "")))


def markdown_decimals(text: str) -> list:
    """Decimal numbers typed in markdown, outside code spans (`...`) where they name code values,
    and not counting arXiv identifiers (2211.17192), which are citations."""
    text = re.sub(r"`[^`]*`", "", text)
    return DECIMAL.findall(re.sub(r"(?<![\w.])\d{4}\.\d{4,5}(?![\w.])", "", text))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_markdown_types_few_decimals(path):
    found = [d for md in _markdown(path) for d in markdown_decimals(md)]
    budget = DECIMAL_BUDGET[path.stem[:2]]
    assert len(found) <= budget, (f"{path.name}: {len(found)} decimals typed in markdown (budget {budget}): "
                                  f"{found}. Render measured values from the cell that computes them "
                                  "(specdecode_ref.measure.harness.claims.say)")


def test_decimal_finder_sees_typed_numbers_and_skips_code():
    assert markdown_decimals("speedup 1.43x, tau 2.1 at k = 4; `draft_vocab=0.5`, v1.2.3, arXiv:2211.17192") == ["1.43", "2.1"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_are_clean(path):
    from specdecode_ref.measure.harness.timing import BUSY_NOTICE

    for i, kind, text in _outputs(path):
        assert BUSY_NOTICE not in text, f"{path.name} cell {i}: committed from a run on a busy machine"
        assert "MachineLoad(" not in text, f"{path.name} cell {i}: a repr leaked into the output"
        assert not re.search(r"\d+it/s\]|\|\s*\d+/\d+ \[", text), f"{path.name} cell {i}: a frozen progress bar"
        if kind == "stderr":
            assert not re.search(r"Warning|warn\(", text), f"{path.name} cell {i}: a warning on stderr: {text[:200]}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_cites_no_development_history(path):
    history = re.compile(r"DESIGN\.md|first corpus|earlier corpus|last stop|at the last run|we retrained", re.I)
    for md in _markdown(path):
        assert not history.search(md), f"{path.name}: {history.search(md).group(0)!r} in the prose"
