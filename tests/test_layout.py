"""The shape of the code: modules of a readable size, and no import cycle.

An import cycle is found from the source alone (``ast``): for every module of
the ``attnfuzz`` package, the imports its import runs (module level, class
bodies, ``if``/``try`` blocks; not those inside functions, nor those under
``if TYPE_CHECKING:``) give the edges of a graph of attnfuzz modules, which
must be acyclic.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the checkout is the package `attnfuzz`
PACKAGE = "attnfuzz"
MAX_LINES = 400


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package: ``{dotted name: file}``, descending only into
    directories that are packages (an ``__init__.py``), as Python's import does."""
    modules: dict[str, Path] = {}

    def walk(directory: Path, name: str) -> None:
        modules[name] = directory / "__init__.py"
        for path in sorted(directory.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                walk(path, f"{name}.{path.name}")
            elif path.suffix == ".py" and path.name != "__init__.py":
                modules[f"{name}.{path.stem}"] = path

    walk(root, package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_statements(body: Iterable[ast.stmt]) -> Iterable[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue  # runs when called, not on import
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_statements(node.body)
            yield from _import_statements(node.orelse)
        elif isinstance(node, ast.ClassDef | ast.With | ast.For | ast.While):
            yield from _import_statements(node.body)
            yield from _import_statements(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_statements(block)
            for handler in node.handlers:
                yield from _import_statements(handler.body)


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that importing ``module`` (whose ``source`` is given) imports.

    ``from P import x`` depends on ``P.x`` when that is a module of ``known``
    (``P`` may then still be initializing, as a package importing its own
    submodules is); on ``P`` itself when any name is not a module.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_statements(ast.parse(source).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            anchor = ".".join(parts[: len(parts) - (node.level - 1)])
            base = f"{anchor}.{base}" if base else anchor
        submodules = {f"{base}.{a.name}" for a in node.names} & known
        found.update(submodules)
        if len(submodules) < len(node.names):
            found.add(base)
    return {name for name in found if name in known} - {module}


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = package_modules(root, package)
    known = set(modules)
    return {
        name: imported_modules(path.read_text(), name, path.name == "__init__.py", known)
        for name, path in modules.items()
    }


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of ``graph`` as ``[a, b, ..., a]``, or None when it is acyclic
    (iterative depth-first search: no recursion limit on a deep graph)."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = [start]
        on_path = {start}
        stack = [iter(sorted(graph.get(start, ())))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
                continue
            if nxt in on_path:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


# -- the finder, on graphs and sources made up here ------------------------------------


def test_find_cycle_finds_a_cycle_and_names_it():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"x"}}) == ["x", "x"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]


def test_find_cycle_accepts_acyclic_graphs():
    assert find_cycle({}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond
    chain = {f"m{i}": {f"m{i + 1}"} for i in range(5000)}  # deeper than recursion allows
    assert find_cycle(chain) is None
    chain["m5000"] = {"m0"}
    assert find_cycle(chain) == [f"m{i}" for i in range(5001)] + ["m0"]


def test_only_imports_that_run_on_import_count():
    known = {"p", "p.a", "p.b", "p.c", "p.d", "p.e", "p.sub", "p.sub.x"}
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
import p.a
from p import b
from .sub import x
if TYPE_CHECKING:
    from p import c
try:
    from p.e import thing
except ImportError:
    pass
def f():
    from p import d
class K:
    import p.sub
"""
    found = imported_modules(source, "p.mod", is_package=False, known=known)
    assert found == {"p.a", "p.b", "p.sub.x", "p.e", "p.sub"}
    # `from P import attribute` depends on P itself; relative imports from a package
    assert imported_modules("from p import name", "p.a", False, known) == {"p"}
    assert imported_modules("from . import a", "p", True, known) == {"p.a"}
    assert imported_modules("from .. import b", "p.sub", True, known) == {"p.b"}


def test_a_real_cycle_between_files_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "__init__.py").write_text("from pkg.inner.one import f\n")
    (pkg / "inner" / "one.py").write_text("from pkg import two\n\ndef f(): ...\n")
    (pkg / "two.py").write_text("import pkg.three\n")
    (pkg / "three.py").write_text("from pkg.inner import f\n")
    graph = import_graph(pkg, "pkg")
    assert find_cycle(graph) == ["pkg.inner", "pkg.inner.one", "pkg.two", "pkg.three", "pkg.inner"]
    (pkg / "three.py").write_text("def g():\n    from pkg.inner import f\n")  # at call time
    assert find_cycle(import_graph(pkg, "pkg")) is None


# -- this project ------------------------------------------------------------------------


def test_the_package_is_found():
    modules = package_modules()
    for name in ("attnfuzz", "attnfuzz.harness.definitions", "attnfuzz.harness.cli.main"):
        assert name in modules
    assert not any(".tests." in name or ".venv" in name for name in modules)


def test_no_import_cycle_between_project_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    "path", sorted((ROOT / "harness").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_harness_module_is_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"
