"""The vLLM runner without vLLM: a clear message when its environment is missing, and the
counters' arithmetic (vLLM's names turned into the course's SpecStats quantities)."""
import importlib.util

import pytest

from specdecode_ref.serving import vllm_runner as V


def test_missing_environment_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.setenv(V.VLLM_PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    ok, why = V.vllm_available()
    assert not ok and "make vllm-env" in why
    with pytest.raises(RuntimeError, match="make vllm-env"):
        V.run_vllm(tmp_path, [[1, 2, 3]], max_tokens=4)


def test_bad_prompts_are_refused(tmp_path):
    with pytest.raises(ValueError, match="empty prompt"):
        V.run_vllm(tmp_path, [[1, 2], []], max_tokens=4)
    with pytest.raises(ValueError, match="at least one prompt"):
        V.run_vllm(tmp_path, [], max_tokens=4)


def test_acceptance_summary_uses_vllm_definitions():
    metrics = {V.DRAFTS: 4, V.DRAFT_TOKENS: 20, V.ACCEPTED_TOKENS: 6, V.ACCEPTED_PER_POS: [3, 2, 1, 0, 0]}
    s = V.acceptance_summary(metrics)
    assert s["acceptance_rate"] == pytest.approx(0.3)
    assert s["mean_accepted_length"] == pytest.approx(1 + 6 / 4)  # 1 + accepted / drafting steps
    assert s["accepted_per_pos"] == [3, 2, 1, 0, 0]


def test_job_reports_only_the_timed_part():
    spec = importlib.util.spec_from_file_location("vllm_job", V.JOB_SCRIPT)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)  # stdlib only at import time: vLLM is imported inside run()
    after = {V.DRAFTS: 10, V.ACCEPTED_PER_POS: [5, 3, 1]}
    before = {V.DRAFTS: 2, V.ACCEPTED_PER_POS: [1, 1]}
    assert job._difference(after, before) == {V.DRAFTS: 8, V.ACCEPTED_PER_POS: [4, 2, 1]}


def test_required_vllm_fails_instead_of_skipping(monkeypatch, tmp_path):
    """CI sets SPECDECODE_REQUIRE_VLLM=1: a missing vLLM environment then fails the cross-checks
    instead of skipping them, so a green CI means they ran."""
    from support import need_vllm

    monkeypatch.setenv(V.VLLM_PYTHON_ENV, str(tmp_path / "no-venv" / "bin" / "python"))
    monkeypatch.setenv(V.REQUIRE_ENV, "1")
    assert V.vllm_required()
    with pytest.raises(pytest.fail.Exception, match="SPECDECODE_REQUIRE_VLLM=1 but vLLM is not available"):
        need_vllm()
    monkeypatch.setenv(V.REQUIRE_ENV, "0")
    with pytest.raises(pytest.skip.Exception, match="vLLM is not available"):
        need_vllm()


def test_quick_check_reads_the_version_without_importing(monkeypatch, tmp_path):
    """quick=True asks the package metadata (no `import vllm`), and a success is remembered."""
    import sys

    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\ncase \"$2\" in *importlib.metadata*) echo 9.9.9;; *) exit 1;; esac\n")
    py.chmod(0o755)
    monkeypatch.setenv(V.VLLM_PYTHON_ENV, str(py))
    monkeypatch.setattr(V, "_IMPORTS_OK", {})
    assert V.vllm_available() == (False, V.vllm_available()[1])        # a full check imports vllm: fails here
    assert V.vllm_available(quick=True) == (True, "9.9.9")
    assert V.vllm_available() == (True, "9.9.9")                       # remembered for this interpreter
