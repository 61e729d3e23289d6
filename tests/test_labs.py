"""The graded labs: the grader can pass *and* fail.

For every lab folder: the reference and the worked solution score 100 %, the untouched stubs score
0 (every test stops at NotImplementedError, and the grader does not crash), every planted bug and
mutant loses points on the tests its docstring names (and keeps no more than its "at most"), and
every tamper attempt is caught. Plus the grader's own mechanics on a toy lab (syntax errors,
endless loops, crashes, missing files, the JSON/CSV report), the API of each student file, the
handout, and that `pytest labs` collects only the notebooks. tests/test_grading.py covers the
grader's defences (tampering, files for another lab, the report) on toy labs.
"""
from __future__ import annotations

import csv
import inspect
import json
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from specdecode_ref import grading
from specdecode_ref.cache import cache_dir
from specdecode_ref.grading import gradescope, selftest
from specdecode_ref.grading.autograder import build_autograder, try_autograder
from specdecode_ref.grading.labs import Lab
from specdecode_ref.grading.mutation import as_one_file
from toy_lab import TOY_HIDDEN, TOY_SOLUTION, TOY_STUDENT, TOY_TESTS

ROOT = Path(__file__).resolve().parent.parent
LAB_DIRS = sorted(p for p in (ROOT / "labs").glob("lab[0-9]*") if p.is_dir())
LAB_IDS = [p.name for p in LAB_DIRS]


def test_labs_exist():
    assert [p.name[:5] for p in LAB_DIRS][:5] == ["lab01", "lab02", "lab03", "lab04", "lab05"]


# The tamper attempts are the same files appended to any lab's stubs, and what stops them is the
# runner's two sides, not a lab: they run here on lab 3 (tests/test_grading_attacks.py runs each
# class of attack on a toy lab, and the autograder test below one attempt per lab). Each attempt
# costs a judging process of its own; `python -m specdecode_ref.grading labs/lab0* --self-test`
# runs them on every lab.
TAMPER_LABS = {"lab03_speedup_model"}


@pytest.fixture(scope="module")
def self_tests():
    """Self-test every lab once, the labs in parallel (each grades its submissions in one process)."""
    def one(lab_dir):
        return grading.self_test(lab_dir, test_timeout=60, timeout=300, tamper=lab_dir.name in TAMPER_LABS)

    with ThreadPoolExecutor(max_workers=len(LAB_DIRS)) as pool:
        results = list(pool.map(one, LAB_DIRS))
    return dict(zip(LAB_IDS, results))


@pytest.mark.parametrize("lab", LAB_IDS)
def test_self_test(self_tests, lab):
    problems, report = self_tests[lab]
    print(grading.format_report(report))
    assert not problems, "\n".join(problems)
    by_name = {r["student"]: r for r in report["submissions"]}
    assert by_name["reference"]["percent"] == 100.0
    assert by_name["stubs"]["score"] == 0 and by_name["stubs"]["status"] == "ok"
    bugs = [r for name, r in by_name.items() if name.startswith("bug:")]
    assert len(bugs) >= 2 and all(r["score"] < r["max_score"] for r in bugs)
    mutants = [r for name, r in by_name.items() if name.startswith("mutant:")]
    assert all(r["status"] == "ok" and r["score"] < r["max_score"] for r in mutants)
    tampered = [r for r in report["submissions"] if r["role"] == "tamper attempt"]
    if lab in TAMPER_LABS:
        assert len(tampered) >= 8 and all(r["score"] == 0 for r in tampered)
    assert any(t["hidden"] for t in report["tests"]) and any(not t["hidden"] for t in report["tests"])


@pytest.fixture(scope="module")
def autograders(tmp_path_factory):
    """Every lab's Gradescope autograder, built from this checkout and run as Gradescope runs it:
    the zip unpacked into a fresh folder laid out as /autograder, setup.sh, then run_autograder on
    the reference, the first planted bug (written out as the one file a student would hand in) and
    a tamper attempt (each lab another of the four). Beside it, the local grader's verdict on the
    tamper attempts the self-test did not grade. The labs share one environment (setup.sh finds
    it already built after the first) and run two at a time."""
    base = tmp_path_factory.mktemp("autograders")
    env = {"SPECDECODE_TORCH_INDEX": "", "SPECDECODE_CACHE": str(cache_dir()),  # offline, as make setup left it
           "SPECDECODE_AUTOGRADER_VENV": str(base / "venv")}
    attempts = selftest.tamper_attempts()

    def one(i, lab_dir):
        lab = Lab.open(lab_dir)
        uploads = base / "uploads" / lab.name
        uploads.mkdir(parents=True)
        files = {"reference": (lab_dir / "reference.py").read_text(), "bug": as_one_file(lab.planted_bugs[0]),
                 "tamper": selftest.tampering_file(lab, attempts[i % len(attempts)])}
        for name, text in files.items():
            (uploads / f"{name}.py").write_text(text)
        zip_path = build_autograder(lab_dir, base / "zips", count_points=False, allow_dirty=True)
        _, results = try_autograder(zip_path, [uploads / f"{n}.py" for n in files], root=base / lab.name, env=env)
        local_tamper = None
        if lab.name not in TAMPER_LABS:
            local_tamper = grading.grade(lab_dir, [("tamper", uploads / "tamper.py")], quiet=True)["submissions"][0]
        return dict(zip(files, results)), local_tamper, attempts[i % len(attempts)].stem

    first = one(0, LAB_DIRS[0])  # builds the shared environment
    with ThreadPoolExecutor(max_workers=2) as pool:
        rest = list(pool.map(one, range(1, len(LAB_DIRS)), LAB_DIRS[1:]))
    return dict(zip(LAB_IDS, [first] + rest))


@pytest.mark.parametrize("lab", LAB_IDS)
def test_gradescope_autograder_grades_like_the_local_grader(self_tests, autograders, lab):
    """The reference, a planted bug and a tamper attempt earn on Gradescope, test by test, the
    points the local grader gives them, in a results.json that follows Gradescope's format with
    the hidden tests shown only once grades are published."""
    _, report = self_tests[lab]
    results, local_tamper, attempt = autograders[lab]
    by_name = {r["student"]: r for r in report["submissions"]}
    bug = by_name[f"bug:{Lab.open(ROOT / 'labs' / lab).planted_bugs[0].stem}"]
    tamper = local_tamper or by_name[f"tamper:{attempt}"]
    for name, local in (("reference", by_name["reference"]), ("bug", bug), ("tamper", tamper)):
        res = results[name]
        assert gradescope.validate_results({k: v for k, v in res.items() if k != "_stdout"}) == [], name
        assert res["extra_data"]["status"] == local["status"], (name, res["extra_data"], local["status"])
        assert {t["name"]: t["score"] for t in res["tests"]} == {
            t["name"]: t["earned"] for t in local["tests"]}, name
        assert res["score"] == local["score"] and res["extra_data"]["max_score"] == local["max_score"], name
        hidden = {t["name"] for t in local["tests"] if t["hidden"]}
        assert hidden and all((t["visibility"] == "after_published") == (t["name"] in hidden) for t in res["tests"])
    assert results["reference"]["score"] == by_name["reference"]["max_score"]
    assert results["bug"]["score"] < results["reference"]["score"]
    assert results["tamper"]["score"] == 0


def test_enough_mutants(self_tests):
    """Labs 1 to 4 each have realistic one-mistake mutants, at least 20 together (lab 5's tests are
    held to the same standard by its planted bugs)."""
    counts = {lab: sum(r["role"] == "mutant" for r in report["submissions"]) for lab, (_, report) in self_tests.items()}
    assert sum(counts.values()) >= 20 and all(counts[lab] >= 4 for lab in LAB_IDS[:4]), counts


def test_lossy_samplers_keep_at_most_60_percent(self_tests):
    """Lab 1: a planted bug or mutant whose sampler is not lossless keeps at most ~60 % of the points."""
    _, report = self_tests["lab01_rejection_sampler"]
    lossless = {t["name"] for t in report["tests"] if t["name"] == "test_lossless_in_every_case"}
    assert lossless
    for r in report["submissions"]:
        if r["role"] in ("planted bug", "mutant"):
            failed = {t["name"] for t in r["tests"] if t["outcome"] != "passed"}
            if failed & lossless:
                assert r["percent"] <= 60.0, (r["student"], r["percent"])


def _public(module):
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj))
            and getattr(obj, "__module__", None) == module.__name__}


def _signature(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    return list(inspect.signature(target).parameters)


@pytest.mark.parametrize("lab_dir", LAB_DIRS, ids=LAB_IDS)
def test_student_api_matches_reference(lab_dir):
    """student.py, reference.py and solution.py offer the same names with the same parameters,
    and every stub is documented."""
    student = grading.load_lab("student", lab_dir)
    reference = grading.load_lab("reference", lab_dir)
    solution = grading.load_lab("solution", lab_dir)
    names = set(_public(student))
    assert names, "student.py defines nothing"
    for name, obj in _public(student).items():
        assert inspect.getdoc(obj), f"student.py: {name} has no docstring"
        for other in (reference, solution):
            assert hasattr(other, name), f"{other.__lab_impl__} lacks {name}"
            assert _signature(getattr(other, name)) == _signature(obj), f"{name}: parameters differ in {other.__lab_impl__}"


def test_load_lab_switch(monkeypatch):
    lab_dir = ROOT / "labs" / "lab03_speedup_model"
    monkeypatch.setenv(grading.IMPL_ENV, "reference")
    assert grading.load_lab(lab_dir=lab_dir).expected_tokens_per_step(1.0, 3) == 4.0
    monkeypatch.setenv(grading.IMPL_ENV, str(lab_dir / "planted_bugs" / "bonus_counted_twice.py"))
    assert grading.load_lab(lab_dir=lab_dir).expected_tokens_per_step(1.0, 3) == 5.0
    monkeypatch.delenv(grading.IMPL_ENV)
    with pytest.raises(NotImplementedError):
        grading.load_lab(lab_dir=lab_dir).expected_tokens_per_step(1.0, 3)
    with pytest.raises(grading.LabLoadError, match="no implementation file"):
        grading.load_lab("nope.py", lab_dir)


def test_points_and_chi2_helpers():
    with pytest.raises(ValueError):
        grading.points(-1)
    assert grading.chi2_pvalue([250, 250, 500], [0.25, 0.25, 0.5]) > 0.9
    assert grading.chi2_pvalue([10, 0, 990], [0.0, 0.5, 0.5]) == 0.0
    assert grading.chi2_pvalue([900, 100], [0.5, 0.5]) < 1e-6


def test_names_labs_import():
    """Everything lab notebooks and grading files import from specdecode_ref.grading is there."""
    used = set()
    for f in list((ROOT / "labs").glob("lab*/*.py")) + list((ROOT / "labs").glob("lab*/*/*.py")):
        for m in re.finditer(r"from specdecode_ref\.grading import ([^\n]+)", f.read_text()):
            used |= {n.strip() for n in m.group(1).split(",")}
    for nb in (ROOT / "labs").glob("lab*/*.ipynb"):
        for cell in nbformat.read(nb, as_version=4).cells:
            for m in re.finditer(r"from specdecode_ref\.grading import ([^\n]+)", cell.source):
                used |= {n.strip() for n in m.group(1).split(",")}
    assert {"lab_fixture", "points", "load_lab", "self_check", "chi2_pvalue", "one_mistake"} <= used
    for name in used:
        assert hasattr(grading, name), name


def test_pytest_collects_only_the_notebooks():
    """`pytest labs` must not pick up the grading tests (they would grade the stubs and fail)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "labs", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert out.returncode == 0, out.stdout + out.stderr
    assert ids and all(line.split("::")[0].endswith(".ipynb") for line in ids), ids
    assert {line.split("::")[0] for line in ids} == {f"labs/{d}/{d}.ipynb" for d in LAB_IDS}


@pytest.mark.parametrize("lab_dir", LAB_DIRS, ids=LAB_IDS)
def test_notebook_committed_executed(lab_dir):
    nb = nbformat.read(lab_dir / f"{lab_dir.name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.outputs for c in code[:1]), "commit the notebook executed"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    assert any("load_lab(IMPL" in c.source for c in code) and "self_check(IMPL)" in code[-1].source


def test_handout(tmp_path):
    dest = grading.handout(ROOT / "labs" / "lab01_rejection_sampler", tmp_path)
    names = sorted(p.name for p in dest.iterdir())
    assert names == ["grading_lab01.py", "lab01_rejection_sampler.ipynb", "reference.py", "student.py"]
    nb = nbformat.read(dest / "lab01_rejection_sampler.ipynb", as_version=4)
    assert all(not c.outputs for c in nb.cells if c.cell_type == "code")



# --- the grader's mechanics, on a toy lab that needs nothing but the standard library -------------

SUBMISSIONS = {
    "alice.py": TOY_SOLUTION,
    "bob/student.py": TOY_SOLUTION.replace("a + b", "a - b"),
    "carol/toy/student.py": "def add(a, b)\n    return a + b\n",  # syntax error
    # An endless loop that ignores signals: the judge reads the student side's CPU from outside and stops it.
    "dave.py": TOY_SOLUTION + "\n\ndef count(n):\n    import signal\n\n"
                               "    signal.signal(signal.SIGPROF, signal.SIG_IGN)\n    while True:\n        pass\n",
    "erin.py": "import os\n\n\ndef add(a, b):\n    os._exit(3)\n",  # ends the process that runs her code
    "frank/notes.txt": "no code here",
}


def test_grader_mechanics(tmp_path, capsys):
    lab = tmp_path / "toy"
    lab.mkdir()
    for name, text in {"grading_toy.py": TOY_TESTS, "grading_toy_hidden.py": TOY_HIDDEN,
                       "student.py": TOY_STUDENT, "reference.py": TOY_SOLUTION}.items():
        (lab / name).write_text(textwrap.dedent(text))
    subs = tmp_path / "submissions"
    for name, text in SUBMISSIONS.items():
        (subs / name).parent.mkdir(parents=True, exist_ok=True)
        (subs / name).write_text(text)
    out = tmp_path / "report"
    status = grading.main([str(lab), "--submissions", str(subs), "--reference", "--out", str(out),
                           "--test-timeout", "1", "--timeout", "8", "--jobs", "3"])
    printed = capsys.readouterr().out
    assert status == 0

    report = json.loads((out / "toy" / "report.json").read_text())
    assert report["max_score"] == 6 and [t["name"] for t in report["tests"]] == ["test_add", "test_add_negative",
                                                                                 "test_count"]
    r = {s["student"]: s for s in report["submissions"]}
    assert set(r) == {"reference", "alice", "bob", "carol", "dave", "erin", "frank"}
    assert (r["reference"]["score"], r["alice"]["score"]) == (6, 6)
    assert r["bob"]["score"] == 3 and r["bob"]["status"] == "ok"  # test_add failed, the rest passed
    assert {t["name"]: t["outcome"] for t in r["bob"]["tests"]}["test_add"] == "failed"
    assert r["carol"]["status"] == "load error" and "SyntaxError" in r["carol"]["message"] and r["carol"]["score"] == 0
    dave = {t["name"]: t["outcome"] for t in r["dave"]["tests"]}
    assert r["dave"]["score"] == 3 and dave["test_count"] == "timeout"  # the loop costs its own test only
    erin = {t["name"]: t["message"] for t in r["erin"]["tests"]}
    assert r["erin"]["score"] == 0 and "ended" in erin["test_add"]  # the judge goes on; her tests fail
    assert r["frank"]["status"] == "missing" and r["frank"]["total"] == 3
    assert {t["hidden"] for t in r["alice"]["tests"]} == {False, True}

    rows = list(csv.DictReader((out / "toy" / "scores.csv").open()))
    assert [row["student"] for row in rows] == ["reference", "alice", "bob", "carol", "dave", "erin", "frank"]
    assert rows[2]["score"] == "3" and rows[2]["test_add"] == "0" and rows[2]["test_count"] == "3"
    assert "bob" in printed and "load error" in printed and (out / "toy" / "logs" / "dave.txt").is_file()

    # The untouched stubs: 0 points, every test "not implemented", nothing crashes.
    stub = grading.grade(lab, [("stubs", lab / "student.py")], visible_only=True)
    (only,) = stub["submissions"]
    assert only["score"] == 0 and only["status"] == "ok" and only["total"] == 2
    assert {t["outcome"] for t in only["tests"]} == {"not implemented"}
