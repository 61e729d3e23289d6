"""The one switch that sizes the notebooks' experiments: full by default, small under make test."""
import json
import re
from pathlib import Path

import pytest

from specdecode_ref.measure.harness import run_size

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("value", ["", "0", "false", "No", " off "])
def test_full_size_by_default_and_when_off(monkeypatch, value):
    monkeypatch.setenv(run_size.SWITCH, value)
    assert not run_size.small_run()
    assert run_size.size(64, small=16) == 64
    monkeypatch.delenv(run_size.SWITCH)
    assert run_size.size([1, 2, 3], small=[1]) == [1, 2, 3]
    assert "full-size" in run_size.describe()


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_small_when_on(monkeypatch, value):
    monkeypatch.setenv(run_size.SWITCH, value)
    assert run_size.small_run()
    assert run_size.size(64, small=16) == 16
    assert "small run" in run_size.describe()


def test_a_typo_is_an_error_not_a_full_run(monkeypatch):
    monkeypatch.setenv(run_size.SWITCH, "small")
    with pytest.raises(ValueError, match="SPECDECODE_SMALL_RUN='small'"):
        run_size.size(64, small=16)


def test_small_run_leaves_the_notebooks_vllm_runs_out(monkeypatch):
    from specdecode_ref.serving import vllm_runner

    monkeypatch.setenv(run_size.SWITCH, "1")
    ok, why = vllm_runner.vllm_for_notebooks()
    assert not ok and run_size.SWITCH in why


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_that_loads_the_model_is_sized(path):
    """A notebook that decodes with the real model sizes its experiments through run_size.size, so
    make test's small run stays small as notebooks are added."""
    code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    if "load_model(" in code:
        assert re.search(r"from specdecode_ref\.measure\.harness\.run_size import [^\n]*\bsize\b", code) and "size(" in code
