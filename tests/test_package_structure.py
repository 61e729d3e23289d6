"""The package's imports flow one way: no module imports, directly or through others, a module
that imports it back, and no module reaches into another's private (underscore) names.

Imports inside functions count too: deferring an import hides a circle from Python's loader, not
from a reader, who still cannot understand either module without the other.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specdecode_ref"


def module_files(root: Path = PACKAGE) -> dict:
    """{dotted module name: path} for every module of the package rooted at ``root``."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def import_graph(mods: dict) -> tuple:
    """(edges {module: set of package modules it imports}, [(importer, module, private name)])."""
    edges, private = {m: set() for m in mods}, []
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                if source is None or source.split(".")[0] != PACKAGE.name:
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}" if f"{source}.{alias.name}" in mods else source
                    if target in mods and target != name:
                        edges[name].add(target)
                    if alias.name.startswith("_") and target == source and source != name:
                        private.append((name, source, alias.name))
            elif isinstance(node, ast.Import):
                edges[name].update(a.name for a in node.names if a.name in mods and a.name != name)
    return edges, private


def import_circles(edges: dict) -> list:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return groups


def test_no_import_circle():
    edges, _ = import_graph(module_files())
    assert import_circles(edges) == []


def test_no_private_name_is_imported_across_modules():
    _, private = import_graph(module_files())
    assert private == [], "import the public name instead: " + ", ".join(f"{a} <- {b}.{n}" for a, b, n in private)


def test_the_core_imports_no_tooling():
    """The decoding core (engine, batch, request, verification, proposers) never imports measurement,
    training, serving or grading code."""
    edges, _ = import_graph(module_files())
    part = lambda module: (module.split(".") + [""])[1]  # noqa: E731  (the package's own __init__: "")
    core = [m for m in edges if part(m) in {"engine", "batch", "request", "verify", "sampling", "kv",
                                            "ragged_cache", "masks", "trees", "proposers"}]
    tooling = ("measure", "training", "serving", "grading")
    leaks = sorted((m, t) for m in core for t in edges[m] if part(t) in tooling)
    assert leaks == []


@pytest.fixture
def planted_package(tmp_path):
    """A three-module package with a circle hidden in a function-level import and a private import."""
    root = tmp_path / PACKAGE.name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "a.py").write_text("from .b import helper\n")
    (root / "b.py").write_text("def helper():\n    from .c import _secret\n    return _secret\n")
    (root / "c.py").write_text("def _secret():\n    from . import a\n    return a\n")
    return root


def test_planted_circle_and_private_import_are_found(planted_package):
    edges, private = import_graph(module_files(planted_package))
    pkg = PACKAGE.name
    assert import_circles(edges) == [[f"{pkg}.a", f"{pkg}.b", f"{pkg}.c"]]
    assert private == [(f"{pkg}.b", f"{pkg}.c", "_secret")]
