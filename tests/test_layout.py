"""The shape of the code: modules of a readable size, and no import cycle.

An import cycle is found from the source alone (``ast``): for every module of
the ``attnfuzz`` package, the imports its import runs (module level, class
bodies, ``if``/``try`` blocks; not those inside functions, nor those under
``if TYPE_CHECKING:``) give the edges of a graph of attnfuzz modules, which
must be acyclic.

A second graph, over attnfuzz's packages (:data:`PACKAGES`), counts every import,
those inside functions too: an import deferred to call time hides a cycle from
the first graph, not from this one. It must be acyclic as well: each package
has one role, and the roles are layered.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent  # the checkout is the package `attnfuzz`
PACKAGE = "attnfuzz"
MAX_LINES = 400

# The packages of the second graph, each one role. A module belongs to the longest
# that it is inside; `attnfuzz.harness` holds the harness's own library (the target
# model and judging, errors, definitions, case files, schemas, the targets), which
# the applications built on it (campaign, command line, zoo) import, never the
# reverse. `attnfuzz` itself is the public API, which nothing inside imports.
PACKAGES = (
    "attnfuzz",
    "attnfuzz.reference",
    "attnfuzz.kernels",
    "attnfuzz.strategies",
    "attnfuzz.harness",
    "attnfuzz.harness.campaign",
    "attnfuzz.harness.cli",
    "attnfuzz.harness.zoo",
    "attnfuzz.reports",
    "attnfuzz.adapters",
)

# Imports left out of the second graph: (importing module prefix, imported module
# prefix). None: engines register as plugins, and the core imports none of them.
ALLOWED_PACKAGE_EDGES: tuple[tuple[str, str], ...] = ()


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


def _import_statements(
    body: Iterable[ast.stmt], in_functions: bool = False
) -> Iterable[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (with
    ``in_functions``, also those that run when one of its functions is called)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if in_functions:  # runs when called
                yield from _import_statements(node.body, in_functions)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_statements(node.body, in_functions)
            yield from _import_statements(node.orelse, in_functions)
        elif isinstance(node, ast.ClassDef | ast.With | ast.For | ast.While):
            yield from _import_statements(node.body, in_functions)
            yield from _import_statements(getattr(node, "orelse", []), in_functions)
        elif isinstance(node, ast.Try | ast.TryStar):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_statements(block, in_functions)
            for handler in node.handlers:
                yield from _import_statements(handler.body, in_functions)


def imported_modules(
    source: str, module: str, is_package: bool, known: set[str], in_functions: bool = False
) -> set[str]:
    """The modules of ``known`` that importing ``module`` (whose ``source`` is given)
    imports; with ``in_functions``, also those its functions import when called.

    ``from P import x`` depends on ``P.x`` when that is a module of ``known``
    (``P`` may then still be initializing, as a package importing its own
    submodules is); on ``P`` itself when any name is not a module.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_statements(ast.parse(source).body, in_functions):
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


def import_graph(
    root: Path = ROOT, package: str = PACKAGE, in_functions: bool = False
) -> dict[str, set[str]]:
    modules = package_modules(root, package)
    known = set(modules)
    return {
        name: imported_modules(
            path.read_text(), name, path.name == "__init__.py", known, in_functions
        )
        for name, path in modules.items()
    }


def package_of(module: str, packages: Iterable[str]) -> str:
    """The longest of ``packages`` that ``module`` is, or is inside."""
    return max((p for p in packages if module == p or module.startswith(p + ".")), key=len)


def package_graph(
    graph: Mapping[str, Iterable[str]],
    packages: Iterable[str],
    allowed: Iterable[tuple[str, str]] = (),
) -> dict[str, set[str]]:
    """``graph``'s edges between different packages, as a graph of packages.

    An edge ``a -> b`` of ``allowed`` (prefixes of module names) is left out."""
    packages = list(packages)
    allowed = list(allowed)
    out: dict[str, set[str]] = {p: set() for p in packages}
    for module, imports in graph.items():
        for imported in imports:
            if any(module.startswith(a) and imported.startswith(b) for a, b in allowed):
                continue
            here, there = package_of(module, packages), package_of(imported, packages)
            if here != there:
                out[here].add(there)
    return out


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


def test_a_cycle_through_function_level_imports_is_found_between_packages(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("core", "app"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "model.py").write_text("def f():\n    from pkg.app.ui import show\n")
    (pkg / "app" / "ui.py").write_text("from pkg.core.model import f\n\ndef show(): ...\n")
    packages = ("pkg", "pkg.core", "pkg.app")
    # invisible to the first graph: the import back runs at call time
    assert find_cycle(import_graph(pkg, "pkg")) is None
    graph = package_graph(import_graph(pkg, "pkg", in_functions=True), packages)
    assert find_cycle(graph) == ["pkg.app", "pkg.core", "pkg.app"]
    # imports inside one package are no edge of this graph, and an allowed one is left out
    allowed = [("pkg.core.model", "pkg.app.")]
    assert (
        find_cycle(package_graph(import_graph(pkg, "pkg", in_functions=True), packages, allowed))
        is None
    )
    (pkg / "core" / "model.py").write_text("def f():\n    from pkg.core import other\n")
    (pkg / "core" / "other.py").write_text("")
    assert find_cycle(package_graph(import_graph(pkg, "pkg", in_functions=True), packages)) is None


def test_package_of_is_the_longest_prefix():
    packages = ("p", "p.a", "p.a.b")
    assert package_of("p.a.b.c", packages) == "p.a.b"
    assert package_of("p.a.bc", packages) == "p.a"
    assert package_of("p", packages) == "p"


# -- this project ------------------------------------------------------------------------


def test_the_package_is_found():
    modules = package_modules()
    for name in ("attnfuzz", "attnfuzz.harness.definitions", "attnfuzz.harness.cli.dispatch"):
        assert name in modules
    assert not any(".tests." in name or ".venv" in name for name in modules)


def test_no_import_cycle_between_project_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_cycle_between_packages_even_through_imports_in_functions():
    graph = package_graph(import_graph(in_functions=True), PACKAGES, ALLOWED_PACKAGE_EDGES)
    cycle = find_cycle(graph)
    assert cycle is None, "package cycle: " + " -> ".join(cycle or [])


def test_every_package_is_named():
    """A new package of attnfuzz is a role: it is listed in PACKAGES."""
    named = set(PACKAGES)
    for module, path in package_modules().items():
        if path.name == "__init__.py" and module.count(".") <= 1:
            assert module in named, f"{module} is not in PACKAGES"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "harness").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_harness_module_is_over_400_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_LINES})"
