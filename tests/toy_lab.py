"""A toy lab for the grader's own tests: two functions and tests that need only the standard
library, so a grading run takes a fraction of a second."""
from __future__ import annotations

import textwrap
from pathlib import Path

TOY_TESTS = '''
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(2)
def test_add(lab):
    """add adds."""
    assert lab.add(2, 3) == 5


@points(1)
def test_add_negative(lab):
    assert lab.add(-1, -1) == -2
'''
TOY_HIDDEN = '''
from specdecode_ref.grading import lab_fixture, points

lab = lab_fixture(__file__)


@points(3)
def test_count(lab):
    assert lab.count(3) == 3
'''
TOY_STUDENT = '''
def add(a, b):
    """Return a + b."""
    raise NotImplementedError


def count(n):
    """Return n."""
    raise NotImplementedError
'''
TOY_SOLUTION = '''
def add(a, b):
    return a + b


def count(n):
    return n
'''


def make_lab(root: Path, name: str, tests: str, student: str, solution: str, hidden: str | None = None) -> Path:
    lab = root / name
    lab.mkdir(parents=True)
    files = {f"grading_{name}.py": tests, "student.py": student, "reference.py": solution, "solution.py": solution}
    if hidden:
        files[f"grading_{name}_hidden.py"] = hidden
    for fname, text in files.items():
        (lab / fname).write_text(textwrap.dedent(text))
    return lab
