"""What lab notebooks and grading tests use: load an implementation, give tests points, a
chi-square helper, and the self-check at the end of a notebook.

This module imports nothing heavy (no torch, no transformers): the grading process imports it
for every lab, including labs that need only numpy.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .labs import IMPL_ENV

NAMED_IMPLS = ("student", "reference", "solution")
# Set by the judging process (judge.py) while it grades: a function returning the submission as a
# RemoteLab. Empty everywhere else, where ``lab`` is the module itself.
REMOTE_LAB: list = []


class GradingTimeout(BaseException):
    """Raised inside a test that ran past its time limit. A BaseException, so that a submission's
    ``except Exception`` cannot swallow it."""


class LabLoadError(Exception):
    """The implementation file could not be found or imported (e.g. a syntax error)."""


def points(n: float, fails_by_chance: float = 0.0):
    """Decorator: the test is worth ``n`` points (each parametrized case separately).

    fails_by_chance: for a statistical test, the probability that a *correct* submission fails
    it anyway (its random numbers differ from the reference's, so a fixed seed does not fix its
    outcome): e.g. the significance level times the number of checks in the test. The report
    adds these up per submission, so that an instructor can tell bad luck from a bug.
    """
    if not isinstance(n, (int, float)) or n < 0:
        raise ValueError(f"points must be a number >= 0, got {n!r}")
    if not isinstance(fails_by_chance, (int, float)) or not 0.0 <= fails_by_chance < 1.0:
        raise ValueError(f"fails_by_chance must be a probability in [0, 1), got {fails_by_chance!r}")

    def mark(fn):
        fn.__grading_points__ = float(n)
        fn.__grading_chance__ = float(fails_by_chance)
        return fn

    return mark


def resolve_impl(impl, lab_dir: Path) -> tuple[Path, str]:
    """The file behind ``impl`` (see :func:`load_lab`) and a label for messages."""
    impl = impl if impl is not None else os.environ.get(IMPL_ENV, "").strip() or "student"
    impl = str(impl)
    if impl in NAMED_IMPLS:
        path = lab_dir / f"{impl}.py"
        label = {"student": "your student.py", "reference": "the reference implementation (reference.py)",
                 "solution": "the worked solution (solution.py)"}[impl]
    else:
        path = Path(impl).expanduser()
        label = str(path)
    if not path.is_file():
        raise LabLoadError(f"no implementation file {path} (impl={impl!r}; use student, reference, "
                           f"solution or a path to a .py file)")
    return path.resolve(), label


def load_lab(impl: str | os.PathLike | None = None, lab_dir: str | os.PathLike | None = None,
             verbose: bool = False):
    """Import a lab implementation and return it as a module.

    impl: "student" (``student.py`` in the lab folder), "reference", "solution", or a path to a
    .py file; None reads ``$SPECDECODE_LAB_IMPL`` and falls back to "student".
    lab_dir: the lab folder (default: the current directory, which is the notebook's folder in
    Jupyter). Every call imports the file afresh, so re-running it picks up your edits.
    """
    lab_dir = Path(lab_dir if lab_dir is not None else Path.cwd()).resolve()
    path, label = resolve_impl(impl, lab_dir)
    name = f"_lab_impl_{lab_dir.name}_{path.stem}_{abs(hash(str(path))) % 10**8}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a submission may raise anything while importing
        sys.modules.pop(name, None)
        if isinstance(exc, (KeyboardInterrupt, GradingTimeout)):
            raise
        raise LabLoadError(f"could not import {path}: {type(exc).__name__}: {exc}") from exc
    module.__lab_impl__ = label
    if verbose:
        print(f"{lab_dir.name}: using {label}")
    return module


def lab_fixture(grading_file: str):
    """A module-scoped pytest fixture named ``lab``: the implementation under test.

    In a grading file: ``lab = lab_fixture(__file__)``; tests then take ``lab`` as an argument and
    call ``lab.f(x)``. Under the grader, ``lab`` is the submission running in a process of its
    own (see judge.py): the test sends data and gets data back.
    Outside the grader (a learner running the tests with pytest) it is the module itself.
    A file that fails to import makes every test error (0 points) instead of stopping the run.
    """
    import pytest

    lab_dir = Path(grading_file).resolve().parent

    @pytest.fixture(scope="module", name="lab")
    def _lab():
        if REMOTE_LAB:  # under the grader: the submission on its student side (the judge stops it)
            return REMOTE_LAB[0]()
        return load_lab(lab_dir=lab_dir)

    return _lab


def chi2_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """p-value of a chi-square goodness-of-fit test of observed ``counts`` against ``probs``.

    The course's one chi-square test (:func:`specdecode_ref.measure.harness.stats.chi_square_test`): bins
    expected to hold fewer than ``min_expected`` counts are pooled, and any count in a bin of
    probability 0 gives 0.0.
    """
    from specdecode_ref.measure.harness.stats import chi_square_pvalue

    return chi_square_pvalue(counts, probs, min_expected)


def self_check(impl=None, lab_dir=None, hidden: bool = False, **kw) -> dict:
    """For the end of a lab notebook: grade this lab's implementation on the visible tests (the
    hidden ones too with hidden=True) and print the table. ``impl`` as in :func:`load_lab`."""
    from .report import format_report
    from .runner import Submission, grade

    lab_dir = Path(lab_dir if lab_dir is not None else Path.cwd()).resolve()
    path, _ = resolve_impl(impl, lab_dir)
    name = path.stem if path.parent == lab_dir else str(path)
    report = grade(lab_dir, [Submission(name, path)], visible_only=not hidden, quiet=True, **kw)
    print(format_report(report))
    return report
