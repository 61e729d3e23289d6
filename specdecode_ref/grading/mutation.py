"""Planted bugs and mutants: the worked solution with one mistake.

A planted bug (``labs/labNN_topic/planted_bugs/NAME.py``) or a mutant (``.../mutants/NAME.py``)
is a complete submission that differs from ``solution.py`` in one function. Instead of copying
the solution, it says which function it replaces::

    '''Mutant: the residual is |p - q| instead of max(p - q, 0).

    caught by: test_first_token_follows_p
    at most: 60 %
    '''
    from specdecode_ref.grading import one_mistake

    patch = one_mistake(globals())   # every name of ../solution.py, in this module


    @patch
    def residual_distribution(p, q):
        ...                          # the solution's function, with the mistake

    @patch(NgramProposer)            # a method of one of the solution's classes
    def lookup(self, tokens):
        ...

The replacement goes into the solution module too, so the solution's other functions call it,
as they would in one student file. Each call of :func:`one_mistake` loads the solution afresh,
so mutants never share state.
"""
from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


class _Patch:
    def __init__(self, base: ModuleType):
        self.base = base

    def __call__(self, target):
        if isinstance(target, type):  # @patch(SomeClass): replace a method
            cls = target

            def method(fn):
                if not hasattr(cls, fn.__name__):
                    raise AttributeError(f"{cls.__name__} has no method {fn.__name__} to replace")
                setattr(cls, fn.__name__, fn)
                return fn

            return method
        fn = target
        if not hasattr(self.base, fn.__name__):
            raise AttributeError(f"the solution has no {fn.__name__} to replace")
        setattr(self.base, fn.__name__, fn)
        return fn


def one_mistake(module_globals: dict) -> _Patch:
    """Fill ``module_globals`` (a planted bug's or mutant's ``globals()``) with every name of the
    lab's ``solution.py`` and return the decorator that replaces one of its functions or methods.

    The lab folder is the parent of the folder holding the calling file.
    """
    here = Path(module_globals["__file__"]).resolve()
    solution = here.parents[1] / "solution.py"
    if not solution.is_file():
        raise FileNotFoundError(f"{here.name}: no solution.py in {solution.parent}")
    name = f"{module_globals.get('__name__', 'mutant')}__solution"
    spec = importlib.util.spec_from_file_location(name, solution)
    base = importlib.util.module_from_spec(spec)
    sys.modules[name] = base
    spec.loader.exec_module(base)
    module_globals.update({k: v for k, v in vars(base).items() if not k.startswith("__")})
    return _Patch(base)



def _is_patch(node) -> bool:
    """``@patch`` or ``@patch(SomeClass)``: the decorator :func:`one_mistake` returns."""
    return getattr(node, "id", None) == "patch" or getattr(getattr(node, "func", None), "id", None) == "patch"


def as_one_file(path) -> str:
    """A planted bug or mutant written out as one student file: the lab's ``solution.py`` with the
    replaced functions appended (a later ``def`` of the same name wins, as a student's edit would)
    and, for a replaced method, its assignment into the class. This is what a student with that one
    mistake would hand in, and it needs nothing from the lab folder (the Gradescope autograder's
    zip carries no solution)."""
    path = Path(path).resolve()
    solution = (path.parents[1] / "solution.py").read_text()
    source = path.read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    parts = [f"# ---- {path.parent.name}/{path.name}: {doc.strip().splitlines()[0] if doc else 'one mistake'}"]
    for node in tree.body:
        if (node is tree.body[0] and doc is not None
                or isinstance(node, ast.ImportFrom) and (node.module == "__future__"
                                                         or any(a.name == "one_mistake" for a in node.names))
                or isinstance(node, ast.Assign) and getattr(getattr(node.value, "func", None), "id", None) == "one_mistake"):
            continue  # the docstring and one_mistake's machinery
        text = ast.get_source_segment(source, node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kept = [ast.get_source_segment(source, d) for d in node.decorator_list if not _is_patch(d)]
            text = "".join(f"@{d}\n" for d in kept) + text
            for d in node.decorator_list:
                if isinstance(d, ast.Call) and _is_patch(d):
                    text += f"\n\n\n{ast.get_source_segment(source, d.args[0])}.{node.name} = {node.name}"
        parts.append(text)
    return solution.rstrip() + "\n\n\n" + "\n\n\n".join(parts) + "\n"
