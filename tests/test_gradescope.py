"""Gradescope's autograder and the class's grade book, on toy labs that need only the standard
library: results.json follows Gradescope's documented fields, the zip's own scripts grade in a
fresh folder laid out as /autograder (as root: the student side runs as a user id of its own) to
the points the local grader gives (an attack, a crash, an endless loop, a load error, missing,
nested and wrong-lab uploads included), a planted bug written out as one file grades as the bug
does, and the grade book has a row per student and a column per lab. tests/test_labs.py runs
every real lab's zip on the reference, a planted bug and a tamper attempt.
"""
from __future__ import annotations

import csv
import json
import os
import textwrap
import zipfile
from pathlib import Path

import pytest

from specdecode_ref import grading
from specdecode_ref.cache import cache_dir
from specdecode_ref.grading import autograder, gradebook, gradescope, selftest
from specdecode_ref.grading.labs import Lab, Submission, submission_in
from specdecode_ref.grading.mutation import as_one_file
from toy_lab import TOY_HIDDEN, TOY_SOLUTION, TOY_STUDENT, TOY_TESTS, make_lab

# Offline, as on the course machines: the pinned torch from the machine's own wheels, and the
# embedded model already converted by `make setup`.
LOCAL_ENV = {"SPECDECODE_TORCH_INDEX": "", "SPECDECODE_CACHE": str(cache_dir())}


def a_documented_result() -> dict:
    """Every field Gradescope documents, each with a value of its documented kind."""
    return {"score": 3.0, "execution_time": 12, "output": "summary", "output_format": "simple_format",
            "test_output_format": "text", "test_name_format": "text", "visibility": "after_due_date",
            "stdout_visibility": "hidden", "extra_data": {"any": 1},
            "tests": [{"score": 1.0, "max_score": 2.0, "status": "failed", "name": "t", "name_format": "text",
                       "number": "1.1", "output": "why", "output_format": "md", "tags": ["a"],
                       "visibility": "after_published", "extra_data": {}}],
            "leaderboard": [{"name": "Accuracy", "value": 0.9}]}


def test_validator_accepts_the_documented_fields_and_catches_others():
    assert gradescope.validate_results(a_documented_result()) == []
    assert gradescope.validate_results({"tests": [{"score": 1}, {"score": 0}]}) == []  # scores on the tests only
    planted = {
        "unknown top-level field": dict(a_documented_result(), points=3),
        "visibility must be one of": dict(a_documented_result(), visibility="after_publish"),
        "score must be a finite number": dict(a_documented_result(), score="3"),
        "tests[0].status must be one of": dict(a_documented_result(), tests=[{"score": 1, "status": "ok"}]),
        "tests[0]: unknown field 'points'": dict(a_documented_result(), tests=[{"score": 1, "points": 1}]),
        "a score is required": {"tests": [{"name": "t", "max_score": 1}]},
        "tests[0].tags must be a strings": dict(a_documented_result(), tests=[{"score": 0, "tags": [1]}]),
    }
    for why, bad in planted.items():
        problems = gradescope.validate_results(bad)
        assert any(why in p for p in problems), (why, problems)


@pytest.fixture
def toy(tmp_path):
    return make_lab(tmp_path / "labs", "lab01_toy", TOY_TESTS, TOY_STUDENT, TOY_SOLUTION, TOY_HIDDEN)


def uploads(tmp_path: Path, toy: Path) -> dict:
    """One upload per way a grade can come out."""
    lab = Lab.open(toy)
    files = {
        "correct.py": TOY_SOLUTION,
        "buggy.py": TOY_SOLUTION.replace("a + b", "a - b"),
        "tampering.py": selftest.tampering_file(lab, selftest.TAMPER_DIR / "exit_early.py"),
        "crashing.py": "import os\n\n\ndef add(a, b):\n    os._exit(3)\n\n\ndef count(n):\n    return n\n",
        "looping.py": TOY_SOLUTION + "\n\ndef count(n):\n    import signal\n\n"
                                     "    signal.signal(signal.SIGPROF, signal.SIG_IGN)\n    while True:\n        pass\n",
        "syntax.py": "def add(a, b)\n    return a + b\n",
        "other_lab.py": "def mul(a, b):\n    return a * b\n",
        # A folder as a GitHub upload gives it: the student's copy of the course.
        "repo/labs/lab01_toy/student.py": TOY_SOLUTION,
        "repo/README.md": "my fork",
        "nested/Archive/student.py": TOY_SOLUTION,  # a folder zipped on a laptop
        "empty/notes.txt": "nothing to grade",
    }
    out = {}
    for name, text in files.items():
        path = tmp_path / "uploads" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        key = name.split("/")[0].removesuffix(".py")
        out[key] = tmp_path / "uploads" / key if "/" in name and key in ("repo", "empty", "nested") else path
    return out


def test_results_json_per_outcome(toy, tmp_path):
    """The local report of each kind of submission, as results.json: the points, the hidden tests
    hidden until published, and a summary that says why."""
    ups = uploads(tmp_path, toy)
    subs = [(k, v) for k, v in ups.items() if k not in ("repo", "empty", "nested")]
    report = grading.grade(toy, subs, test_timeout=1, timeout=6, jobs=2)
    by_name = {r["student"]: i for i, r in enumerate(report["submissions"])}
    for name, i in by_name.items():
        rec = report["submissions"][i]
        res = gradescope.results_json(report, i)
        assert gradescope.validate_results(res) == [], name
        assert res["score"] == rec["score"] == sum(t["score"] for t in res["tests"]), name
        assert res["extra_data"]["status"] == rec["status"]
        assert [t["visibility"] for t in res["tests"]] == [
            "after_published" if t["hidden"] else "visible" for t in rec["tests"]]
        if rec["status"] != "ok":
            assert f"Status: {rec['status']}" in res["output"], name
    res = {name: gradescope.results_json(report, i) for name, i in by_name.items()}
    assert res["correct"]["score"] == 6 and all(t["status"] == "passed" for t in res["correct"]["tests"])
    assert res["buggy"]["score"] == 3 and "failed: " in res["buggy"]["tests"][0]["output"]
    assert res["tampering"]["score"] == 0
    assert res["crashing"]["score"] == 3 and "ended" in res["crashing"]["tests"][0]["output"]  # count still works
    assert res["looping"]["score"] == 3 and res["looping"]["tests"][-1]["output"].endswith("timeout")  # hidden: no message
    assert res["syntax"]["extra_data"]["status"] == "load error" and "SyntaxError" in res["syntax"]["output"]
    assert res["other_lab"]["extra_data"]["status"] == "wrong lab" and res["other_lab"]["score"] == 0
    # The summary a student reads at once gives the visible tests' points, never the total.
    assert "Visible tests: 3 of 3 points" in res["correct"]["output"] and "6" not in res["correct"]["output"]


def test_autograder_zip_grades_like_the_local_grader(toy, tmp_path):
    """The zip's setup.sh and run_autograder, in a fresh folder laid out as /autograder, give every
    upload the points and status the local grader gives the same file."""
    zip_path = autograder.build_autograder(toy, tmp_path / "zips", test_timeout=1, timeout=6, allow_dirty=True)
    assert zip_path.name == "lab01_autograder.zip"
    with zipfile.ZipFile(zip_path) as zf:
        names = set(zf.namelist())
        config = json.loads(zf.read("course/autograder.json"))
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    assert {"setup.sh", "run_autograder", "course/requirements.txt", "course/labs/lab01_toy/grading_lab01_toy.py",
            "course/labs/lab01_toy/grading_lab01_toy_hidden.py", "course/specdecode_ref/grading/runner.py"} <= names
    assert "course/labs/lab01_toy/solution.py" not in names  # the worked solution stays with the instructor
    assert not any(n.endswith(".safetensors") for n in names)
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert config["max_score"] == 6 and config["test_timeout"] == 1
    assert autograder.build_autograder(toy, tmp_path / "again.zip", test_timeout=1, timeout=6,
                                       allow_dirty=True).read_bytes() == zip_path.read_bytes()

    ups = {k: v for k, v in uploads(tmp_path, toy).items() if k != "syntax"}  # a load error: test above
    root, results = autograder.try_autograder(zip_path, list(ups.values()), root=tmp_path / "autograder",
                                              env=LOCAL_ENV)
    assert (root / "source" / "venv" / "bin" / "python").is_file()  # setup.sh built the environment
    assert (root / "run_autograder").is_file() and (root / "results" / "stdout").is_file()
    got = dict(zip(ups, results))
    local_subs = [Submission(k, None if k == "empty" else submission_in(v, Lab.open(toy)) if v.is_dir() else v)
                  for k, v in ups.items()]
    local = {r["student"]: r for r in grading.grade(toy, local_subs, test_timeout=1, timeout=6, jobs=2)["submissions"]}
    for name, res in got.items():
        assert gradescope.validate_results({k: v for k, v in res.items() if k != "_stdout"}) == [], name
        status = res["extra_data"]["status"]
        assert status == local[name]["status"], (name, status, local[name]["status"])
        assert res["score"] == local[name]["score"], (name, res["score"], local[name]["score"])
        if local[name]["tests"]:
            assert {t["name"]: t["score"] for t in res["tests"]} == {
                t["name"]: (0 if status == "tampered" else t["earned"]) for t in local[name]["tests"]}, name
    assert got["repo"]["score"] == got["nested"]["score"] == 6 and got["empty"]["extra_data"]["status"] == "missing"
    if os.geteuid() == 0:  # as Gradescope runs it: the student side as a user id of its own, files hidden
        iso = got["correct"]["extra_data"]["isolation"]
        assert iso["mode"] == "namespace" and iso["uid"] != 0 and not iso["readable_secrets"], iso
    assert "notes.txt" in got["empty"]["output"]  # says what it found instead
    assert "submission" in got["correct"]["_stdout"]  # the grader's table, for the instructor


def test_a_planted_bug_as_one_file_grades_as_the_bug(tmp_path):
    """as_one_file writes a planted bug (functions and methods replaced inside the solution) as the
    single file a student would hand in; it loses exactly the points the bug loses."""
    solution = '''
class Counter:
    def __init__(self):
        self.n = 0

    def step(self):
        self.n += 1
        return self.n


def twice(x):
    return helper(x) * 2


def helper(x):
    return x
'''
    tests = '''
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(1)
def test_twice(lab):
    assert lab.twice(3) == 6


@points(2)
def test_counter(lab):
    c = lab.Counter()
    c.step()
    assert c.step() == 2
'''
    student = solution.replace("return x", "raise NotImplementedError").replace("return self.n", "raise NotImplementedError")
    lab = make_lab(tmp_path / "labs", "lab02_toy", tests, student, solution)
    (lab / "planted_bugs").mkdir()
    bug = lab / "planted_bugs" / "two_mistakes.py"
    bug.write_text(textwrap.dedent('''
        """Planted bug: the helper adds one (twice calls it), and the counter steps by two.

        caught by: test_twice, test_counter
        """
        from __future__ import annotations

        from specdecode_ref.grading import one_mistake

        patch = one_mistake(globals())


        @patch
        def helper(x):
            return x + 1


        @patch(Counter)
        def step(self):
            self.n += 2
            return self.n
        ''').lstrip())
    one_file = tmp_path / "bob.py"
    one_file.write_text(as_one_file(bug))
    assert "one_mistake" not in one_file.read_text() and "Counter.step = step" in one_file.read_text()
    # The grader hands a planted bug to the student side written out the same way (it sees no solution.py).
    report = grading.grade(lab, [Submission("bug", bug, role="planted bug"), ("bob", one_file)], isolate=False)
    bug_rec, bob = report["submissions"]
    assert bug_rec["score"] == bob["score"] == 0 and bob["status"] == "ok"
    assert [t["outcome"] for t in bug_rec["tests"]] == [t["outcome"] for t in bob["tests"]] == ["failed", "failed"]


def test_gradebook_a_row_per_student_a_column_per_lab(tmp_path, toy):
    other = make_lab(tmp_path / "labs", "lab02_mul", '''
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(4)
def test_mul(lab):
    assert lab.mul(2, 3) == 6
''', 'def mul(a, b):\n    """a * b"""\n    raise NotImplementedError\n', "def mul(a, b):\n    return a * b\n")
    subs = tmp_path / "subs"
    for name, text in {"alice/lab01_toy/student.py": TOY_SOLUTION, "alice/lab02_mul/student.py": "def mul(a, b):\n    return a * b\n",
                       "bob/lab01/student.py": TOY_SOLUTION.replace("a + b", "a - b"),
                       "bob/lab02/student.py": "def mul(a, b):\n    return a + b\n", "carol/lab01_toy.py": TOY_SOLUTION}.items():
        (subs / name).parent.mkdir(parents=True, exist_ok=True)
        (subs / name).write_text(text)
    out = tmp_path / "grades"
    assert grading.main([str(toy), str(other), "--submissions", str(subs), "--out", str(out), "--reference",
                         "--test-timeout", "5"]) == 0
    rows = list(csv.reader((out / "gradebook.csv").open()))
    assert rows[0] == ["student", "lab01_toy", "lab02_mul", "notes"]
    table = {r[0]: r[1:] for r in rows[1:]}
    assert set(table) == {"alice", "bob", "carol"}  # the reference is not a student
    assert table["alice"] == ["100.0", "100.0", ""]
    assert table["bob"] == ["50.0", "0.0", ""]
    assert table["carol"] == ["100.0", "0.0", "lab02_mul: wrong lab"]  # its one file is lab 1's

    # The same from the command, a lab's report missing a student left empty with a note.
    lab2 = json.loads((out / "lab02_mul" / "report.json").read_text())
    lab2["submissions"] = [r for r in lab2["submissions"] if r["student"] != "bob"]
    (out / "lab02_mul" / "report.json").write_text(json.dumps(lab2))
    assert grading.main(["gradebook", str(out), "--out", str(tmp_path / "book.csv")]) == 0
    table = {r[0]: r[1:] for r in list(csv.reader((tmp_path / "book.csv").open()))[1:]}
    assert table["bob"] == ["50.0", "", "lab02_mul: not graded"]

    lab2["visible_only"] = True
    (out / "lab02_mul" / "report.json").write_text(json.dumps(lab2))
    with pytest.raises(SystemExit, match="visible-only"):
        gradebook.gradebook([out])
    with pytest.raises(SystemExit, match="two reports for lab01_toy"):
        gradebook.gradebook([out / "lab01_toy", out / "lab01_toy" / "report.json"])
