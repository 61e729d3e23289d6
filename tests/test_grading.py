"""The grader itself, on toy labs that need nothing but the standard library: a submission cannot
change its own grade, a file for another lab is not graded as this one, the report does not count
the self-test's own files as students, and planted bugs and mutants share one helper.
"""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from specdecode_ref import grading
from specdecode_ref.grading import selftest
from toy_lab import TOY_HIDDEN, TOY_SOLUTION, TOY_STUDENT, make_lab
from toy_lab import TOY_TESTS as TOY_LAB_TESTS

ROOT = Path(__file__).resolve().parent.parent

TOY_TESTS = TOY_LAB_TESTS + '''

@points(1)
def test_grader_stays_light(lab):
    """The grading process does not import torch for a lab that does not need it."""
    import sys

    assert lab.add(0, 0) == 0 and "torch" not in sys.modules
'''
OTHER_STUDENT = '''
def mul(a, b):
    """Return a * b."""
    raise NotImplementedError
'''
OTHER_TESTS = '''
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(1)
def test_mul(lab):
    assert lab.mul(2, 3) == 6
'''




@pytest.fixture
def toy(tmp_path):
    return make_lab(tmp_path / "labs", "lab01_toy", TOY_TESTS, TOY_STUDENT, TOY_SOLUTION, TOY_HIDDEN)


def grade_files(lab: Path, files: dict, tmp_path: Path, **kw) -> dict:
    subs = []
    for name, text in files.items():
        path = tmp_path / "subs" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        subs.append((name, path))
    kw = {"test_timeout": 5, "timeout": 60, "jobs": 2, **kw}
    report = grading.grade(lab, subs, **kw)
    return {r["student"]: r for r in report["submissions"]}


# --- a submission cannot change its own grade --------------------------------------------------------
# (each class of attack, and honest-but-odd files, in test_grading_attacks.py)

def attempt(name: str) -> str:
    return (selftest.TAMPER_DIR / f"{name}.py").read_text()


FORGE_THEN_CRASH = '''
import gc as _gc
import os as _os

for _obj in _gc.get_objects():  # a recorder of pytest's verdicts, if one were here: report every test passed
    if type(_obj).__name__ == "Recorder" and isinstance(getattr(_obj, "tests", None), dict):
        for _t in _obj.tests.values():
            _t.update(outcome="passed", earned=_t.get("points", 1.0))
_os._exit(1)
'''
EXIT_ZERO_AT_EXIT = '''
import atexit as _atexit
import os as _os

_atexit.register(lambda: _os._exit(0))  # turn "some tests failed" into success
'''


@pytest.mark.parametrize("how", ["forge_then_crash", "exit_zero_at_exit"])
def test_old_tricks_score_what_the_code_deserves(toy, tmp_path, how):
    """Tricks that once fooled a grader running the tests in the student's process: stubs plus
    the trick score the stubs' 0."""
    extra = {"forge_then_crash": FORGE_THEN_CRASH, "exit_zero_at_exit": EXIT_ZERO_AT_EXIT}[how]
    r = grade_files(toy, {how: TOY_STUDENT + "\n" + extra}, tmp_path)[how]
    assert r["score"] == 0 and r["passed"] == 0, r


def test_honest_submissions_are_not_flagged(toy, tmp_path, monkeypatch):
    """Printing, failing, crashing and timing out are not tampering; nor is grading from a shell
    (or a notebook) that asks pytest for colours or extra options."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("PY_COLORS", "1")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-q -x")
    printing = TOY_SOLUTION.replace("return a + b", 'print("== 40 passed in 1.00s ==")\n    print("PASSED x::test_add")\n'
                                                    '    return a - b')
    r = grade_files(toy, {
        "right": TOY_SOLUTION,
        "printing": printing,  # prints something that looks like pytest's summary, and fails
        "crash": TOY_SOLUTION.replace("return n", "import os\n    os._exit(3)"),
        # an endless loop that also switches off signals: the student side's CPU is read from outside
        "loops": TOY_SOLUTION.replace("return n", "import signal\n    signal.signal(signal.SIGPROF, signal.SIG_IGN)\n"
                                                  "    while True:\n        pass"),
        "sleeps": TOY_SOLUTION.replace("return n", "import time\n    time.sleep(3600)"),
    }, tmp_path, test_timeout=1, timeout=6)
    assert (r["right"]["status"], r["right"]["percent"]) == ("ok", 100.0)
    assert r["printing"]["status"] == "ok" and r["printing"]["score"] == 4  # test_add and test_add_negative fail
    count = {name: next(t for t in r[name]["tests"] if t["name"] == "test_count") for name in ("crash", "loops", "sleeps")}
    assert r["crash"]["score"] == 4 and "ended" in count["crash"]["message"]  # the visible tests ran before
    assert r["loops"]["score"] == 4 and count["loops"]["outcome"] == "timeout"
    assert r["sleeps"]["score"] == 4 and count["sleeps"]["outcome"] == "timeout"
    assert not any(x["evidence"] or x["flags"] for x in r.values())


def test_self_test_grades_tamper_attempts(toy):
    """The self-test runs every tamper attempt (each in its own judging process) and requires each
    to score the stubs' 0."""
    (toy / "planted_bugs").mkdir()
    for name, body in {"minus": "return a - b", "off": "return a + b + 1"}.items():
        (toy / "planted_bugs" / f"{name}.py").write_text(
            '"""Planted bug.\n\ncaught by: test_add\n"""\nfrom specdecode_ref.grading import one_mistake\n\n'
            f'patch = one_mistake(globals())\n\n\n@patch\ndef add(a, b):\n    {body}\n')
    (toy / "mutants").mkdir()
    (toy / "mutants" / "count_plus_one.py").write_text(
        '"""Mutant.\n\ncaught by: test_count\nat most: 60 %\n"""\nfrom specdecode_ref.grading import one_mistake\n\n'
        'patch = one_mistake(globals())\n\n\n@patch\ndef count(n):\n    return n + 1\n')
    problems, report = grading.self_test(toy, test_timeout=5, timeout=60)
    assert not problems, problems
    by_role = {}
    for r in report["submissions"]:
        by_role.setdefault(r["role"], []).append(r)
    assert len(by_role["tamper attempt"]) == len(selftest.tamper_attempts()) >= 8
    assert all(r["score"] == 0 for r in by_role["tamper attempt"])
    assert by_role["mutant"][0]["percent"] == 57.1  # 4 of 7 points
    text = grading.format_report(report)
    first = text.splitlines()[0]
    assert "submission(s)" not in first and "2 planted bugs" in first and "1 mutant" in first, first
    assert "hardest tests" not in text  # only students are a class


# --- a file for another lab --------------------------------------------------------------------------

def test_submission_for_another_lab(tmp_path, capsys):
    """Grading two labs at once: each bare file or student folder is graded only against the lab
    whose functions it defines; anything else is "wrong lab" or "ambiguous", never "ok"."""
    labs = tmp_path / "labs"
    toy = make_lab(labs, "lab01_toy", TOY_TESTS, TOY_STUDENT, TOY_SOLUTION)
    other = make_lab(labs, "lab02_other", OTHER_TESTS, OTHER_STUDENT, "def mul(a, b):\n    return a * b\n")
    subs = tmp_path / "submissions"
    files = {
        "alice.py": TOY_SOLUTION,  # lab 1
        "bob/student.py": "def mul(a, b):\n    return a * b\n",  # lab 2
        "carol.py": TOY_SOLUTION + "\n\ndef mul(a, b):\n    return a * b\n",  # both, completely
        "dave.py": "def hello():\n    return 1\n",  # neither
        "erin/lab01_toy/student.py": TOY_SOLUTION,  # a folder per lab
        "erin/lab02_other/student.py": "def mul(a, b):\n    return a * b\n",
        "frank.py": "def add(a, b)\n    return a + b\n",  # a syntax error: graded, as a load error
    }
    for name, text in files.items():
        (subs / name).parent.mkdir(parents=True, exist_ok=True)
        (subs / name).write_text(text)
    out = tmp_path / "grades"
    assert grading.main([str(toy), str(other), "--submissions", str(subs), "--out", str(out), "--jobs", "2"]) == 0
    capsys.readouterr()
    r1 = {r["student"]: r for r in json.loads((out / "lab01_toy" / "report.json").read_text())["submissions"]}
    r2 = {r["student"]: r for r in json.loads((out / "lab02_other" / "report.json").read_text())["submissions"]}
    assert {k: v["status"] for k, v in r1.items()} == {
        "alice": "ok", "bob": "wrong lab", "carol": "ambiguous", "dave": "wrong lab", "erin": "ok", "frank": "load error"}
    assert {k: v["status"] for k, v in r2.items()} == {
        "alice": "wrong lab", "bob": "ok", "carol": "ambiguous", "dave": "wrong lab", "erin": "ok", "frank": "load error"}
    assert r1["alice"]["percent"] == r2["bob"]["percent"] == 100.0
    assert "lab02_other" in r1["bob"]["message"] and "lab01_toy" in r2["alice"]["message"]
    for r in list(r1.values()) + list(r2.values()):
        assert not any("AttributeError" in t["message"] for t in r["tests"])
        if r["status"] in ("wrong lab", "ambiguous"):
            assert r["score"] == 0 and {t["outcome"] for t in r["tests"]} == {r["status"]}


# --- the report -----------------------------------------------------------------------------------------

def test_report_states_the_chance_of_a_false_failure(tmp_path):
    """Tests declare how likely a correct submission fails them by chance; the report adds it up per
    submission and flags a failure that could be chance (not one that could not)."""
    lab = make_lab(tmp_path / "labs", "lab01_coin", '''
        from specdecode_ref.grading import lab_fixture, points

        lab = lab_fixture(__file__)


        @points(2, fails_by_chance=1e-4)
        def test_flip(lab):
            assert lab.flip() in (0, 1)


        @points(2, fails_by_chance=1e-3)
        def test_flop(lab):
            assert lab.flop() in (0, 1)


        @points(1)
        def test_exact(lab):
            assert lab.flip() >= 0
        ''', "def flip():\n    raise NotImplementedError\n\n\ndef flop():\n    raise NotImplementedError\n",
        "def flip():\n    return 1\n\n\ndef flop():\n    return 0\n")
    r = grade_files(lab, {"good": "def flip():\n    return 1\n\n\ndef flop():\n    return 0\n",
                          "unlucky": "def flip():\n    return 1\n\n\ndef flop():\n    return 2\n",
                          "wrong": "def flip():\n    return 2\n\n\ndef flop():\n    return 2\n"}, tmp_path)
    assert abs(r["good"]["chance"] - (1 - (1 - 1e-4) * (1 - 1e-3))) < 1e-12
    assert not r["good"]["flags"]
    assert r["unlucky"]["score"] == 3 and any("could be chance" in f and "0.001" in f for f in r["unlucky"]["flags"])
    assert r["wrong"]["score"] == 1 and not r["wrong"]["flags"]  # two failures at once: 1e-7, not chance
    with pytest.raises(ValueError):
        grading.points(1, fails_by_chance=1.5)


def test_chi_square_has_one_implementation():
    """Grading uses the course's chi-square test (specdecode_ref.measure.harness.stats), not a copy of its own."""
    from specdecode_ref.measure.harness import stats

    for counts, probs in (([250, 250, 500], [0.25, 0.25, 0.5]), ([10, 0, 990], [0.0, 0.5, 0.5]),
                          ([900, 100], [0.5, 0.5]), ([3, 1, 40, 56], [0.01, 0.02, 0.4, 0.57])):
        assert grading.chi2_pvalue(counts, probs) == stats.chi_square_pvalue(counts, probs)
    source = "".join(p.read_text() for p in (ROOT / "specdecode_ref" / "grading").glob("*.py"))
    assert "chisquare" not in source and "chi2.sf" not in source


# --- planted bugs and mutants ----------------------------------------------------------------------------

def test_planted_bugs_and_mutants_use_one_helper():
    """Every planted bug and mutant is the worked solution with functions replaced through
    one_mistake: no file loads the solution by itself."""
    files = sorted(ROOT.glob("labs/lab*/planted_bugs/*.py")) + sorted(ROOT.glob("labs/lab*/mutants/*.py"))
    assert len([f for f in files if f.parent.name == "mutants"]) >= 20
    for f in files:
        text = f.read_text()
        assert "patch = one_mistake(globals())" in text, f
        assert "spec_from_file_location" not in text and "exec_module" not in text, f
        assert re.search(r"^caught by: \w", text, flags=re.MULTILINE), f


def test_one_mistake_replaces_inside_the_solution(tmp_path):
    lab = make_lab(tmp_path, "lab09_x", OTHER_TESTS, OTHER_STUDENT,
                   "def mul(a, b):\n    return a * b\n\n\ndef square(a):\n    return mul(a, a)\n")
    (lab / "mutants").mkdir()
    (lab / "mutants" / "m.py").write_text("from specdecode_ref.grading import one_mistake\n\npatch = one_mistake(globals())\n"
                                          "\n\n@patch\ndef mul(a, b):\n    return a + b\n")
    m = grading.load_lab(str(lab / "mutants" / "m.py"), lab)
    assert m.mul(3, 3) == 6 and m.square(3) == 6  # the solution's square calls the replaced mul
    assert grading.load_lab("solution", lab).square(3) == 9  # the solution itself is untouched
