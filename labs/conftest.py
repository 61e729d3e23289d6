"""`pytest labs` (part of `make test`) runs the lab notebooks under nbval with the reference
implementation switched in: the handed-out student.py files are stubs that raise
NotImplementedError, so the notebooks could not run on them.

The switch is the environment variable SPECDECODE_LAB_IMPL (see specdecode_ref/grading/api.py),
set here only while nbval starts a notebook's kernel (the kernel inherits it), and only when it
is not set already: `SPECDECODE_LAB_IMPL=student pytest labs` runs the notebooks on your own
student.py files. The grading tests (grading_*.py) are not collected by `pytest labs`; the
grader runs them (`python -m specdecode_ref.grading labs/labNN_topic`).
"""
import os

import pytest

IMPL_ENV = "SPECDECODE_LAB_IMPL"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    notebook = item.path.suffix == ".ipynb"
    set_here = notebook and IMPL_ENV not in os.environ
    if set_here:
        os.environ[IMPL_ENV] = "reference"
    try:
        return (yield)
    finally:
        if set_here:
            os.environ.pop(IMPL_ENV, None)
