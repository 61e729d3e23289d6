"""Grading on a busy machine: the load changes how long a grading takes, never its verdict.

The judging process and the student side on a saturated CPU wait for the CPU; the grader's time
limits count the CPU time each side uses, so an honest submission graded beside other work (a
class graded with ``--jobs``, a test suite) comes out ``ok`` with its full score, an endless loop
is still stopped, and every tamper attempt still scores the stubs' 0. The load is made without
loading the CPU: ``starved_children`` pauses both sides two thirds of the time (SIGSTOP/SIGCONT),
so a grading takes about three times as long on the clock as it computes.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from specdecode_ref import grading
from specdecode_ref.grading import selftest
from specdecode_ref.grading.labs import Lab, Submission
from support import starved_children
from toy_lab import TOY_SOLUTION, TOY_STUDENT, make_lab

ROOT = Path(__file__).resolve().parent.parent
CHILD = "specdecode_ref.grading."  # the judging process and the student side (python -m ...)

SLOW_TESTS = '''
import time

from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


def burn(cpu_seconds):
    t = time.process_time()
    while time.process_time() - t < cpu_seconds:
        pass


@points(2)
def test_add_after_work(lab):
    """0.6 s of CPU: within the 1 s limit, though it takes about 2 s on the clock when starved."""
    burn(0.6)
    assert lab.add(2, 3) == 5


@points(1)
def test_count(lab):
    assert lab.count(4) == 4
'''


def test_starved_toy_lab_limits_count_cpu_time_and_tampering_is_caught(tmp_path):
    """Under load: a test that computes less than its limit passes however long it waits for the
    CPU; one that loops forever is stopped ("timeout" for that test, the others graded); and each
    tamper attempt, graded at the same time, scores the stubs' 0."""
    lab = make_lab(tmp_path / "labs", "lab01_toy", SLOW_TESTS, TOY_STUDENT, TOY_SOLUTION)
    loops = tmp_path / "loops.py"
    loops.write_text(TOY_SOLUTION.replace("return n", "while True:\n        pass"))
    tampers = selftest._write_tamper_submissions(Lab.open(lab), tmp_path)
    subs = [Submission("right", lab / "solution.py"), Submission("loops", loops), *tampers]
    with starved_children(CHILD):
        report = grading.grade(lab, subs, test_timeout=1, timeout=30, jobs=len(subs))
    r = {x["student"]: x for x in report["submissions"]}
    assert (r["right"]["status"], r["right"]["percent"], r["right"]["evidence"]) == ("ok", 100.0, [])
    assert r["right"]["duration_s"] > 1.0, "the grading process was not slowed down"
    assert (r["loops"]["status"], r["loops"]["score"], r["loops"]["evidence"]) == ("ok", 2.0, [])
    outcomes = {t["name"]: t["outcome"] for t in r["loops"]["tests"]}
    assert outcomes == {"test_add_after_work": "passed", "test_count": "timeout"}, outcomes
    assert len(tampers) == len(selftest.tamper_attempts()) >= 8
    for t in tampers:
        assert r[t.name]["score"] == 0.0, (t.name, r[t.name]["message"])


def test_model_lab_reference_graded_under_load_is_ok():
    """Lab 4 (tiny Llamas: its first test imports transformers and builds models) at the default
    limits, its grading processes starved: the reference scores 100 % with status "ok" while
    another grading of the same lab runs at once (a tamper attempt, which scores 0)."""
    lab = Lab.open(ROOT / "labs" / "lab04_draft_verify_loop")
    with tempfile.TemporaryDirectory(prefix="specdecode-load-") as tmp:
        tamper = next(s for s in selftest._write_tamper_submissions(lab, Path(tmp)) if s.name == "tamper:plugin_rewrite")
        subs = [Submission("reference", lab.dir / "reference.py", role="reference"), tamper]
        with starved_children(CHILD):
            report = grading.grade(lab.dir, subs, jobs=len(subs), visible_only=True, quiet=True)
    r, t = report["submissions"]
    assert (r["status"], r["percent"], r["evidence"]) == ("ok", 100.0, []), (r["status"], r["message"], r["evidence"])
    # starved: more than twice as long on the clock as it computed, and past the 20 s per-test limit
    assert r["duration_s"] > max(2.0 * r["cpu_s"], grading.DEFAULT_TEST_TIMEOUT), (r["duration_s"], r["cpu_s"])
    assert t["score"] == 0.0, t["message"]


def test_a_thread_left_running_does_not_hold_the_grading(tmp_path):
    """A submission that leaves a thread running would keep a process alive after the tests: its
    student side is killed with everything of its user when the submission is done, so the
    grading ends at once with the points earned."""
    lab = make_lab(tmp_path / "labs", "lab01_toy", SLOW_TESTS.replace("burn(0.6)", ""), TOY_STUDENT, TOY_SOLUTION)
    hangs = tmp_path / "hangs.py"
    hangs.write_text("import threading\nimport time\n\nthreading.Thread(target=time.sleep, args=(3600,)).start()\n\n"
                     + TOY_SOLUTION)
    (r,) = grading.grade(lab, [("hangs", hangs)], test_timeout=1, timeout=2)["submissions"]
    assert (r["status"], r["percent"], r["evidence"]) == ("ok", 100.0, []), (r["status"], r["message"])
    assert r["duration_s"] < 30
