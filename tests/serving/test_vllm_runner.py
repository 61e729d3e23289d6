"""The vLLM runner without vLLM: a clear message when its environment is missing, and the
counters' arithmetic (vLLM's names turned into the course's SpecStats quantities)."""
import importlib.util
import os
import shutil
import subprocess

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


def _outcome(check) -> tuple:
    """("fail" | "skip" | "ran", message) of ``check()``. Caught here, not with pytest.raises: a
    skip escaping pytest.raises(pytest.fail.Exception) would turn this very test into a skip, the
    silent outcome the switch exists to prevent."""
    try:
        return "ran", check()
    except pytest.fail.Exception as err:
        return "fail", str(err)
    except pytest.skip.Exception as err:
        return "skip", str(err)


def test_required_vllm_fails_instead_of_skipping(monkeypatch, tmp_path):
    """CI sets SPECDECODE_REQUIRE_VLLM=1: a missing vLLM environment then fails the cross-checks
    instead of skipping them, so a green CI means they ran."""
    from support import need_vllm

    monkeypatch.setenv(V.VLLM_PYTHON_ENV, str(tmp_path / "no-venv" / "bin" / "python"))
    monkeypatch.setenv(V.REQUIRE_ENV, "1")
    assert V.vllm_required()
    outcome, message = _outcome(need_vllm)
    assert outcome == "fail" and "SPECDECODE_REQUIRE_VLLM=1 but vLLM is not available" in message
    monkeypatch.setenv(V.REQUIRE_ENV, "0")
    outcome, message = _outcome(need_vllm)
    assert outcome == "skip" and "vLLM is not available" in message


@pytest.mark.parametrize("switch, outcome", [("1", "fail"), (" 1 ", "fail"), ("0", "skip"), ("", "skip"),
                                            (None, "skip")])
def test_a_broken_vllm_fails_only_under_the_switch(monkeypatch, switch, outcome):
    """vLLM's environment present but broken (as vllm_available reports it): the cross-checks fail
    under SPECDECODE_REQUIRE_VLLM=1 and skip otherwise; a working vLLM runs them either way."""
    from support import need_vllm

    if switch is None:
        monkeypatch.delenv(V.REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(V.REQUIRE_ENV, switch)
    monkeypatch.setattr(V, "vllm_available", lambda quick=False: (False, "`import vllm` fails in x: ImportError"))
    got, message = _outcome(need_vllm)
    assert got == outcome and "vLLM is not available: `import vllm` fails in x: ImportError" in message
    monkeypatch.setattr(V, "vllm_available", lambda quick=False: (True, "0.32.0"))
    assert _outcome(need_vllm) == ("ran", "0.32.0")


def _make(*args, require=None):
    """``make`` in the repository with the course's venv and vLLM's build stubbed out: ``setup`` is
    a no-op (PY=true, the venv's stamp taken as up to date) and building vLLM's environment fails
    (MAKE=false), as it does without the package registries."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", V.REQUIRE_ENV)}
    if require is not None:
        env[V.REQUIRE_ENV] = require
    return subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "PY=true", "MAKE=false", *args],
                          cwd=V.REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_make_fails_when_vllm_cannot_be_built_only_under_the_switch():
    strict = _make("vllm-env-if-possible", require="1")
    assert strict.returncode != 0
    assert "SPECDECODE_REQUIRE_VLLM=1 requires it" in strict.stdout
    for require in (None, "0"):
        learner = _make("vllm-env-if-possible", require=require)
        assert learner.returncode == 0, learner.stdout + learner.stderr
        assert "the vLLM cross-checks will be skipped" in learner.stdout


def test_make_test_vllm_0_leaves_vllm_out_and_is_refused_under_the_switch():
    """VLLM=0 leaves vLLM out (neither built nor tested); under SPECDECODE_REQUIRE_VLLM=1 the two
    contradict each other and make test stops at once instead of going green without vLLM."""
    plan = _make("-n", "test", "VLLM=0").stdout  # -n: what would run, nothing run
    assert "vllm-env" not in plan and "vllm and not vllm_extra" not in plan and '-m "not vllm"' in plan
    assert "vllm and not vllm_extra" in _make("-n", "test").stdout
    assert _make("vllm-switch", "VLLM=0").returncode == 0
    assert _make("vllm-switch", "VLLM=0", require="0").returncode == 0
    assert _make("vllm-switch", require="1").returncode == 0  # VLLM=1: the cross-checks decide
    refused = _make("vllm-switch", "VLLM=0", require="1")
    assert refused.returncode != 0
    assert "VLLM=0 leaves the vLLM cross-checks out, but SPECDECODE_REQUIRE_VLLM=1 requires them" in refused.stdout


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
