"""Graded labs: load a lab's implementation, give tests points, grade submissions.

A lab is a folder ``labs/labNN_topic/`` that follows these conventions (adding a lab means
adding a folder; nothing here lists the labs):

    labNN_topic.ipynb          guided notebook; ``lab = load_lab()`` gives it the implementation
    student.py                 documented stubs that raise NotImplementedError (students edit it)
    reference.py               the same names as thin adapters over specdecode_ref
    solution.py                (optional) a worked solution written the way a student would
    grading_labNN.py           pytest tests with ``@points(n)``: the self-check students may see
    grading_labNN_hidden.py    more tests, the edge cases the notebook does not show
    planted_bugs/*.py          wrong solutions that must lose points (checked by ``--self-test``)
    mutants/*.py               more of them: each one realistic mistake, also self-tested

A planted bug or mutant is the worked solution with one function replaced (:func:`one_mistake`);
its docstring names the tests that must catch it (``caught by: test_a, test_b``) and may cap the
score it keeps (``at most: 60 %``).

Which implementation runs is one switch, read by the notebook and the grading tests alike:
``load_lab(impl)`` or the environment variable ``SPECDECODE_LAB_IMPL`` = ``student`` (default),
``reference``, ``solution`` or a path to a ``.py`` file (a submission).

The package, by purpose:

    api.py        what notebooks and grading tests import: load_lab, lab_fixture, points,
                  chi2_pvalue, self_check
    mutation.py   one_mistake: planted bugs and mutants as the solution with one function replaced
    labs.py       lab folders, a class's submissions on disk, which lab a file belongs to
    runner.py     the way through: find the file, start the judge, apply the limits, assemble records
    judge.py      the judging side: pytest, the tests, every verdict; ``lab`` is the submission, remote
    student_side.py  the student side: the only process that imports a submission; answers calls
    wire.py       the data-only channel between the two sides (JSON and raw tensor bytes, no pickle)
    sandbox.py    where the student side runs (own user, hidden files, no network) and what it hides
    instruments.py   objects both sides build alike from a description (a scripted draft model)
    report.py     report.json, scores.csv and the printed tables
    selftest.py   reference 100 %, stubs 0, every planted bug and mutant loses points, every
                  tamper attempt (tamper_attempts/*.py) is caught; sample submissions
    handouts.py   what students get (handout)
    gradebook.py  the class's grade book: a row per student, a column per lab
    gradescope.py inside Gradescope's container: grade the upload, write results.json
    autograder.py a lab as a Gradescope autograder zip (autograder_scripts/), tried locally
    cli.py        ``python -m specdecode_ref.grading`` (``__main__.py``)

Command line (``python -m specdecode_ref.grading --help``)::

    python -m specdecode_ref.grading labs/lab01_rejection_sampler              # grade student.py
    python -m specdecode_ref.grading labs/lab01_rejection_sampler --reference  # the reference
    python -m specdecode_ref.grading labs/lab01_rejection_sampler --submission alice/student.py
    python -m specdecode_ref.grading labs/lab0* --submissions collected/ --out grades/
    python -m specdecode_ref.grading labs/lab0* --self-test     # reference 100 %, stubs 0, bugs < 100 %
    python -m specdecode_ref.grading handout labs/lab01_rejection_sampler --out handout/
    python -m specdecode_ref.grading samples labs/lab01_rejection_sampler --out submissions/
    python -m specdecode_ref.grading gradebook grades/ --out class.csv
    python -m specdecode_ref.grading gradescope labs/lab01_rejection_sampler --out lab01_autograder.zip
    python -m specdecode_ref.grading gradescope-try lab01_autograder.zip --submission alice/student.py

The process that decides a grade never runs student code: the tests run on the judging side,
the submission on a student side of its own (an unprivileged user that cannot see the lab's
files or the class's, where the machine allows; see sandbox.py), and the two exchange plain data
only. Every test has a time limit on each side, so an infinite loop or a crash costs that test
and nothing else. A test that raises NotImplementedError (an untouched stub) simply scores 0. A
file handed in for another lab is reported "wrong lab" (or "ambiguous"), not graded. The grader
prints a score table and writes ``report.json`` (everything, with failure messages and how the
submission was isolated) and ``scores.csv`` (one row per submission, one column per test).
"""
from __future__ import annotations

from .api import (IMPL_ENV, NAMED_IMPLS, GradingTimeout, LabLoadError, chi2_pvalue, lab_fixture, load_lab, points,
                  resolve_impl, self_check)
from .mutation import one_mistake

__all__ = ["IMPL_ENV", "NAMED_IMPLS", "GradingTimeout", "LabLoadError", "chi2_pvalue", "lab_fixture", "load_lab",
           "points", "resolve_impl", "self_check", "one_mistake",
           "Lab", "Submission", "find_submissions", "grade", "self_test", "check_self_test", "self_test_submissions",
           "format_report", "write_report", "handout", "main", "DEFAULT_TEST_TIMEOUT", "DEFAULT_TIMEOUT"]

_LAZY = {
    "Lab": "labs", "Submission": "labs", "find_submissions": "labs", "which_lab": "labs",
    "grade": "runner", "DEFAULT_TEST_TIMEOUT": "runner", "DEFAULT_TIMEOUT": "runner",
    "self_test": "selftest", "check_self_test": "selftest", "self_test_submissions": "selftest",
    "tamper_attempts": "selftest",
    "format_report": "report", "write_report": "report",
    "handout": "handouts", "main": "cli",
}


def __getattr__(name):
    """The grader's own names (runner, report, self-test, command line), imported when first
    used: grading tests and notebooks need only the API above."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
