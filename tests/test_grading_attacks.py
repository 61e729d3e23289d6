"""A student attacks the grader, and gets what the submission deserves.

One test per class of attack, on a toy lab that needs only the standard library: reaching into
the test runner, using the answer key, reading the hidden tests, forging the grader's messages,
outliving the grading to rewrite the results, changing a classmate's file; and honest-but-odd
files (an exception whose ``__str__`` is broken, a nested upload) that must be graded on their
merit. The student's code runs in a sandbox (grading/sandbox.py): where the machine allows only a
weaker mode than ``namespace``, the tests that need files hidden say so and skip.
"""
from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from specdecode_ref import grading
from specdecode_ref.grading import gradescope, labs
from toy_lab import TOY_HIDDEN, TOY_SOLUTION, TOY_STUDENT, TOY_TESTS, make_lab

HIDDEN_LINE = "def test_count(lab):"
ATTEMPTS = Path(__file__).resolve().parents[1] / "specdecode_ref" / "grading" / "tamper_attempts"


@pytest.fixture
def toy(tmp_path):
    return make_lab(tmp_path / "course" / "labs", "lab01_toy", TOY_TESTS, TOY_STUDENT, TOY_SOLUTION, TOY_HIDDEN)


def grade_files(lab: Path, files: dict, root: Path, **kw) -> tuple:
    """Grade ``{student: source}`` as a class folder (root/class/NAME/student.py); returns
    ({student: record}, report)."""
    folder = root / "class"
    for name, text in files.items():
        path = folder / name / "student.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    kw = {"test_timeout": 5, "timeout": 60, "jobs": 2, **kw}
    report = grading.grade(lab, labs.find_submissions(folder, labs.Lab.open(lab)), **kw)
    return {r["student"]: r for r in report["submissions"]}, report


def mode(report) -> str:
    """How the run isolated the student's code (a grader that does not say is taken at its
    strongest claim: as root, everything hidden)."""
    return report.get("isolation", {}).get("mode", "namespace" if os.geteuid() == 0 else "process")


def hides_files(report) -> bool:
    """Whether this run must have hidden the course's and the class's files: the namespace modes
    promise it; a weaker mode (not root, no namespaces) says it cannot, and the test skips."""
    if mode(report) not in ("namespace", "userns"):
        pytest.skip(f"isolation {mode(report)} does not hide files on this machine")
    return True


def attempt(name: str) -> str:
    return (ATTEMPTS / f"{name}.py").read_text()


def messages(rec) -> str:
    return "\n".join(t.get("message", "") for t in rec["tests"]) + rec.get("message", "")


# --- 1. reaching into the test runner ---------------------------------------------------------------

@pytest.mark.parametrize("how", ["rewrite_test_objects", "patch_pytest", "plugin_rewrite", "atexit_rewrite",
                                 "exit_early"])
def test_code_that_rewrites_the_runner_changes_nothing(toy, tmp_path, how):
    """Stubs (an honest 0) plus code that rewrites pytest's tests, reports or hooks where it runs:
    pytest does not run there, so the grade is the stubs' 0, and honest code beside the same attack
    keeps its points."""
    r, _ = grade_files(toy, {"stubs": TOY_STUDENT + "\n" + attempt(how),
                             "honest": TOY_SOLUTION + "\n" + attempt(how)}, tmp_path)
    assert r["stubs"]["score"] == 0 and r["stubs"]["passed"] == 0, r["stubs"]
    if how != "exit_early":  # a file that exits while it is imported cannot be graded at all
        assert r["honest"]["percent"] == 100.0 and r["honest"]["status"] == "ok", r["honest"]


def test_the_submission_never_runs_in_the_judging_process(toy, tmp_path):
    """The module is imported only in the student side: another process than the grader's and the
    judge's, and (as root) a user id of its own."""
    source = TOY_SOLUTION.replace("return a + b", "import os\n    raise AssertionError(f'pid={os.getpid()} "
                                                  "ppid={os.getppid()} uid={os.getuid()}')")
    r, report = grade_files(toy, {"alice": source}, tmp_path)
    msg = next(t["message"] for t in r["alice"]["tests"] if t["name"] == "test_add")
    pid, ppid, uid = (int(x.split("=")[1]) for x in msg.split()[:3])
    assert pid != os.getpid() and ppid != os.getpid()  # its parent is the judge, not this grader
    if mode(report) in ("namespace", "user"):
        assert uid == r["alice"]["isolation"]["uid"] != os.getuid()


# --- 2. the answer key by name ------------------------------------------------------------------------

def test_answer_key_is_out_of_reach(toy, tmp_path):
    """``import reference``/``import solution`` and a search of the disk for a lab's answer key find
    nothing: the stubs' 0."""
    r, report = grade_files(toy, {"mallory": TOY_STUDENT + "\n" + attempt("import_answer_key")}, tmp_path)
    hides_files(report)
    assert r["mallory"]["score"] == 0


def test_a_link_to_the_answer_key_is_not_a_submission(toy, tmp_path):
    """A student.py that is a link to the reference (or a NAME.py link in the class folder) is not
    graded as the student's file."""
    folder = tmp_path / "class"
    (folder / "mallory").mkdir(parents=True)
    (folder / "mallory" / "student.py").symlink_to(toy / "reference.py")
    (folder / "trent.py").symlink_to(toy / "solution.py")
    (folder / "alice").mkdir()
    (folder / "alice" / "student.py").write_text(TOY_SOLUTION)
    report = grading.grade(toy, labs.find_submissions(folder, labs.Lab.open(toy)), test_timeout=5, timeout=60)
    r = {x["student"]: x for x in report["submissions"]}
    assert r["alice"]["percent"] == 100.0
    for name in ("mallory", "trent"):
        assert r[name]["score"] == 0 and r[name]["status"] == "missing" and "link" in r[name]["message"], r[name]


# --- 3. what the student must not see --------------------------------------------------------------------

def test_hidden_tests_do_not_reach_the_student(toy, tmp_path):
    """Code that searches for the hidden tests and the grader's job files to put them into its
    failure messages finds nothing to put there."""
    r, report = grade_files(toy, {"mallory": TOY_STUDENT + "\n" + attempt("leak_hidden_tests")}, tmp_path)
    hides_files(report)
    assert HIDDEN_LINE not in messages(r["mallory"]) and "job" not in messages(r["mallory"])
    assert r["mallory"]["score"] == 0


def test_gradescope_shows_no_hidden_message_and_bounds_the_visible_ones():
    """results.json: a hidden test shows its description and outcome, never its message; a
    visible test's message is cut to a few hundred characters."""
    rec = {"student": "s", "status": "ok", "score": 0.0, "max_score": 3.0, "percent": 0.0, "flags": [],
           "evidence": ["x"], "duration_s": 1.0, "message": "",
           "tests": [{"name": "test_v", "points": 1.0, "earned": 0.0, "outcome": "failed", "hidden": False,
                      "doc": "visible", "message": "y" * 5000},
                     {"name": "test_h", "points": 2.0, "earned": 0.0, "outcome": "failed", "hidden": True,
                      "doc": "hidden", "message": "the secret edge case"}]}
    out = gradescope.results_json({"lab": "lab01_toy", "submissions": [rec]})
    v, h = out["tests"]
    assert "secret" not in h["output"] and h["visibility"] == "after_published"
    assert len(v["output"]) < gradescope.MESSAGE_LIMIT + 50
    assert "x" not in out["output"].split("\n")[1:] and not gradescope.validate_results(out)


# --- 4. breaking the grader -------------------------------------------------------------------------------

def test_forged_messages_cost_only_the_forger(toy, tmp_path):
    """Well-formed and malformed replies written to every file descriptor: the forger's tests
    fail, the grader writes its report, and a classmate graded in the same run is unaffected."""
    r, report = grade_files(toy, {"mallory": TOY_STUDENT + "\n" + attempt("forge_channel"), "alice": TOY_SOLUTION},
                            tmp_path)
    assert r["mallory"]["score"] == 0
    assert r["alice"]["percent"] == 100.0 and r["alice"]["status"] == "ok"


def test_a_broken_str_is_an_honest_failure(toy, tmp_path):
    """An exception whose __str__ has a typo is the student's answer (a failed test), not a
    broken grader and not cheating: the same points as with the typo fixed."""
    broken = TOY_SOLUTION.replace("def add(a, b):\n    return a + b", textwrap.dedent('''
        class SumError(ValueError):
            def __str__(self):
                return f"cannot add {self.valeu}"


        def add(a, b):
            if a < 0:
                raise SumError()
            return a + b'''))
    fixed = broken.replace("self.valeu", "self.args")
    r, _ = grade_files(toy, {"typo": broken, "fixed": fixed}, tmp_path)
    assert r["typo"]["status"] == r["fixed"]["status"] == "ok"
    assert r["typo"]["score"] == r["fixed"]["score"] == 5  # all but test_add_negative
    assert not r["typo"]["flags"] and not r["typo"]["evidence"]


# --- 5. outliving the grading --------------------------------------------------------------------------------

def test_a_detached_process_cannot_rewrite_the_report(toy, tmp_path):
    """A double-forked, detached process that waits for the report to be written and then rewrites
    it is stopped with everything else of the student side before the report is written."""
    out = tmp_path / "grades"
    rewrite = attempt("detached_rewrite").replace('"/tmp/**/report.json"', repr(str(out / "**" / "*.json")))
    r, report = grade_files(toy, {"mallory": TOY_STUDENT + "\n" + rewrite}, tmp_path, out=out)
    before = (out / "report.json").read_text()
    time.sleep(4)
    assert (out / "report.json").read_text() == before
    assert json.loads(before)["submissions"][0]["score"] == 0
    if mode(report) in ("namespace", "user"):
        from specdecode_ref.grading import sandbox

        assert not sandbox.processes_of(r["mallory"]["isolation"]["uid"])


# --- 6. a classmate's file ------------------------------------------------------------------------------------

def test_a_classmates_file_is_out_of_reach(toy, tmp_path):
    """Mallory appends an early exit to Bob's file and tries to read it; Bob, graded after her, keeps
    his grade and his file."""
    bob = tmp_path / "class" / "bob" / "student.py"
    mallory = TOY_STUDENT + textwrap.dedent(f'''
        try:
            with open({str(bob)!r}, "a") as _f:
                _f.write("\\nraise SystemExit\\n")
        except OSError:
            pass
        try:
            _BOB = open({str(bob)!r}).read()
        except OSError:
            _BOB = ""


        def add(a, b):
            raise AssertionError(_BOB[:200])
        ''')
    r, report = grade_files(toy, {"bob": TOY_SOLUTION, "mallory": mallory}, tmp_path)
    hides_files(report)
    assert bob.read_text() == textwrap.dedent(TOY_SOLUTION)
    assert r["bob"]["percent"] == 100.0
    assert "return a + b" not in messages(r["mallory"])


# --- 7. ordinary uploads ----------------------------------------------------------------------------------------

def test_uploads_are_found_where_students_put_them(toy, tmp_path):
    lab = labs.Lab.open(toy)

    def upload(files: dict):
        d = tmp_path / f"u{len(list(tmp_path.iterdir()))}"
        for name, text in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)
        return labs.find_upload(d, lab)

    found, _ = upload({"Archive/student.py": TOY_SOLUTION, "Archive/notes.txt": "hi"})
    assert found is not None and found.name == "student.py"
    found, note = upload({"lab01_toy.ipynb": "{}"})
    assert found is None and "notebook" in note and "student.py" in note
    found, note = upload({"a/student.py": "x = 1\n", "b/student.py": "x = 2\n"})
    assert found is None and "several" in note
    found, _ = upload({"x/lab01_toy/student.py": "x = 1\n", "other/student.py": "x = 2\n"})
    assert found is not None and found.parent.name == "lab01_toy"


def test_wrong_lab_is_decided_from_one_table(toy, tmp_path):
    """The local grader and the autograder decide which lab a file is for from the same table of
    each lab's function names, so a file of two labs gets one verdict on both."""
    both = tmp_path / "both.py"
    both.write_text(TOY_SOLUTION + "\n\ndef mul(a, b):\n    return a * b\n")
    apis = {"lab01_toy": ["add", "count"], "lab02_other": ["mul"]}
    assert labs.which_lab(both, "lab01_toy", apis)[0] == "ambiguous"
    assert labs.which_lab(both, "lab01_toy", {"lab01_toy": ["add", "count"]})[0] == ""


def test_a_failure_of_the_grader_still_writes_results(tmp_path):
    """Whatever breaks inside autograde, results.json is written: 0 points, one sentence for the
    student, the reason for the instructor."""
    config = tmp_path / "autograder.json"
    config.write_text(json.dumps({"lab": "lab01_toy", "lab_dir": "no/such/lab", "test_timeout": 5, "timeout": 60,
                                  "tests": [{"name": "test_add", "points": 2.0, "hidden": False}]}))
    results = tmp_path / "results" / "results.json"
    out = gradescope.autograde(config, tmp_path / "submission", results, quiet=True)
    on_disk = json.loads(results.read_text())
    assert on_disk == out and on_disk["score"] == 0 and on_disk["output"] == gradescope.GRADER_FAILED
    assert on_disk["extra_data"]["status"] == "grader error" and on_disk["tests"][0]["score"] == 0
    assert not gradescope.validate_results(on_disk)


def test_work_done_in_a_child_process_counts_against_the_time_limit(toy, tmp_path):
    """A function that does its work in a forked child (whose CPU its own process never sees)
    is still held to the test's CPU limit: the grader counts every process the student side started."""
    source = TOY_SOLUTION.replace("def add(a, b):\n    return a + b", textwrap.dedent('''
        def add(a, b):
            import os
            import time

            r, w = os.pipe()
            if os.fork() == 0:
                t = time.process_time()
                while time.process_time() - t < 3.0:
                    pass
                os.write(w, str(a + b).encode())
                os._exit(0)
            os.close(w)
            return int(os.read(r, 100))''').strip())
    r, report = grade_files(toy, {"mallory": source}, tmp_path, test_timeout=1)
    if mode(report) not in ("namespace", "user"):
        pytest.skip(f"isolation {mode(report)}: the grader counts only the student side's own process")
    add = next(t for t in r["mallory"]["tests"] if t["name"] == "test_add")
    assert add["outcome"] == "timeout", add


def test_plain_values_of_other_types_are_compared_as_values(toy, tmp_path):
    """A Fraction, a namedtuple or a list subclass is the value it stands for, as in one process."""
    odd = TOY_SOLUTION.replace("return a + b", "from fractions import Fraction\n    return Fraction(a + b)")
    odd = odd.replace("return n", "import collections\n    return collections.Counter({'n': n})['n']")
    r, _ = grade_files(toy, {"odd": odd}, tmp_path)
    assert r["odd"]["percent"] == 100.0, r["odd"]["tests"]


def test_a_weaker_mode_says_what_it_cannot_promise(toy, tmp_path):
    """Forced to the weakest mode (a separate process only, as on a machine without root or user
    namespaces), grading still works, and the report says which mode graded and what it could not
    hide, so no sentence promises more than the probe measured."""
    r, report = grade_files(toy, {"alice": TOY_SOLUTION}, tmp_path, isolation="process")
    iso = r["alice"]["isolation"]
    assert r["alice"]["percent"] == 100.0
    assert iso["mode"] == report["isolation"]["mode"] == "process" and "do not grade untrusted code" in iso["guarantees"]
    assert any(p.endswith("reference.py") for p in iso["readable_secrets"])  # measured, not assumed
