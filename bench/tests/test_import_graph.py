"""bench/ has no import cycle: its modules' imports, read with `ast` (nothing is imported),
form a graph without a cycle. Imports inside functions count too: a lazy import hides a cycle
from Python's loader, not from the reader who has to know which module comes first.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# times nothing it asserts on: runs beside the correctness suite's workers (conftest.py)
pytestmark = pytest.mark.shares_cores

BENCH = Path(__file__).resolve().parents[1]


def module_name(path: Path, root: Path) -> str:
    """`root`/harness/kept.py -> "bench.harness.kept"; a package's __init__.py is the package."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path) -> bool:
    """Whether the dotted `name` (under `root`'s package) is a module or package file."""
    relative = Path(*name.split(".")[1:])
    return (root / relative).with_suffix(".py").is_file() or (root / relative).is_dir()


def imports(path: Path, root: Path) -> set[str]:
    """The modules of `root`'s package that the file at `path` imports, anywhere in it."""
    package, name = root.name, module_name(path, root)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y, from .. import y
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                # `from bench.harness import kept` imports the module bench.harness.kept
                child = f"{base}.{a.name}"
                found.add(child if _is_module(child, root) else base)
    return {m for m in found if m == package or m.startswith(package + ".")} - {name}


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports} for every .py under `root`."""
    return {module_name(p, root): imports(p, root) for p in sorted(root.rglob("*.py"))}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None when the graph has none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_bench_has_no_import_cycle():
    graph = import_graph(BENCH)
    # the graph is really read: a known edge of each kind (module level, inside a function)
    assert "bench.harness.kept" in graph["bench.harness.runner"]
    assert "bench.reporting.summary" in graph["bench.harness.suite"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_even_through_a_lazy_import(tmp_path):
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from . import c\n")
    (root / "sub" / "c.py").write_text("from ..sub.a import thing\nimport os\n")
    graph = import_graph(root)
    assert graph["pkg.sub.c"] == {"pkg.sub.a"}  # outside the package (os) is left out
    assert find_cycle(graph) == ["pkg.sub.a", "pkg.sub.b", "pkg.sub.c", "pkg.sub.a"]
    (root / "sub" / "b.py").write_text("import os\n")
    assert find_cycle(import_graph(root)) is None


def test_no_test_file_imports_another():
    """Shared test data and helpers live in helper modules (bench/tests/helpers.py,
    correctness/sparse_checker.py, ...) or conftest.py, never in another test file, so each test
    file can change without breaking its neighbours."""
    root = BENCH.parent
    offenders = []
    for path in sorted([*root.glob("bench/tests/test_*.py"), *root.glob("correctness/test_*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(root)} imports {n}" for n in names
                          if n.rpartition(".")[2].startswith("test_")]
    assert not offenders, offenders
