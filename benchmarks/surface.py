"""How much of the engines' attention-metadata code attnfuzz's engine implementations run.

    python benchmarks/surface.py [--examples 200] [--engine vllm|sglang] [--target T ...]
                                 [--jobs N] [--top 10] [--json FILE] [--markdown FILE]

The surface is read from the installed engine's own code, by rules, not from a
hand list: the source files of the installed release are parsed (``ast``, no
import), and each part of the surface is the union of its clauses in
``SURFACE`` below. A clause is one of

- ``class``: every method of the base class named and of every class that
  subclasses it, by base-class name and transitively, in the files named
  (optionally only the methods whose name contains one of some words);
- ``refs``: the functions of the files named whose code names attention
  metadata: an identifier (variable, attribute, argument, keyword or the
  function's own name) that contains one of ``METADATA_NAMES``
  (``query_start_loc``, ``seq_len``, ``block_table``, ``slot_mapping``,
  ``attn_metadata``, ``padded``, ``kv_indptr``, ...), case ignored;
- ``imports``: the functions that name metadata in the files named and in
  every module of ``within`` that they import, directly or through another
  such module (an import anywhere in a module's code counts);
- ``every``: every function of the files named.

vLLM: ``builders``, every method of ``AttentionMetadataBuilder`` and its
subclasses anywhere in ``vllm/``; ``backend-utils``, the module-level
functions of the attention backends that name metadata (the helpers the
builders call) and the metadata modules under ``v1/attention/``;
``drafters``, the metadata-naming functions of V1's and V2's speculative
decoding; ``runner-v1`` and ``runner-v2``, the metadata-naming functions of
each runner's module and of every module of its own package that it imports
(input batches, micro-batch slicing, context parallelism, mamba state, the
sampler's reads of the step's offsets: whatever the runner calls), and the
whole of the modules whose one job is block tables, graph dispatch, padding
and data-parallel padding; ``indexer``, the sparse-attention indexer's.
SGLang: ``backends``,
the methods named for metadata or graphs (``init_forward_metadata*``,
``init_cuda_graph_state``, ``*cuda_graph*``, ...) of every
``AttentionBackend`` subclass under ``srt/layers/attention/``;
``metadata-modules``, the attention layers' and kernels' modules named for
metadata or indices; ``graph-runner``, the metadata-naming functions of the
CUDA-graph runners and their input buffers; ``spec-runners``, those of the
speculative graph runners and the EAGLE workers. A function is in the first
part (in table order) that selects it; a nested function is its enclosing
function's. Files a release lacks are skipped; a part none of whose files
exist is reported ``absent``.

Every engine implementation (kind ``engine``, traced ones too) of every
target runs ``--examples`` derandomized examples (seed 0) through
``attnfuzz.run``, which judges in this process, so that coverage.py
(``pip install 'attnfuzz[bench]'``) sees the engine's code run. ``--jobs N``
runs N implementations at once, each in a new process of its own, and combines
their coverage data: the same runs, so the same figures, in less time. A function's
lines are coverage's statements between its first body line and its last
line, its branches the branch arcs that leave those lines.

Printed per engine: each part's lines and branches run, each builder's (the
first part's classes: vLLM's metadata builders, SGLang's attention backends)
lines run and, where none ran, why: its module does not import here (the error,
as attnfuzz's adapters import it) or no implementation drives it; the
implementations' runs and the largest functions that run no line. ``--json
FILE``: the figures, ``{engine: {"lines_run", "lines", "branches_run",
"branches", "parts": {part: {the same keys, "functions": {name: lines_run}}},
"builders": {name: {the same keys, "driven"}}}}``. ``--markdown FILE``
rewrites each measured engine's section of FILE (``docs/surface.md``:
``surface:vllm``, ``surface:sglang``), so that one engine can be measured again alone.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
import json
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _common import table
from _markdown import command_line, write_section

# An identifier that contains one of these (case ignored) names attention metadata.
METADATA_NAMES = (
    "attn_metadata",
    "forward_metadata",
    "query_start_loc",
    "seq_len",
    "seqlen",
    "block_table",
    "slot_mapping",
    "padded",
    "kv_indptr",
    "kv_indices",
    "qo_indptr",
    "req_to_token",
    "out_cache_loc",
    "page_table",
)


@dataclass(frozen=True)
class Select:
    """One clause of a part: ``kind`` ``class``, ``refs`` or ``every`` over
    ``files`` (globs under the engine's package directory)."""

    kind: str
    files: tuple[str, ...]
    base: str = ""  # class: the base class
    names: tuple[str, ...] = ()  # class: a method's name contains one of these (none: every method)
    module_only: bool = False  # refs: functions outside classes only
    within: tuple[str, ...] = ()  # imports: the modules an import may lead to (globs)

    def describe(self, package: str) -> str:
        where = ", ".join(f"`{package}/{g}`" for g in self.files)
        if self.kind == "class":
            words = " or ".join(f"`{w}`" for w in self.names)
            which = f"the methods whose name contains {words}" if self.names else "every method"
            return f"{which} of `{self.base}` and its subclasses in {where}"
        if self.kind == "refs":
            scope = "module-level functions" if self.module_only else "functions"
            return f"the {scope} that name metadata in {where}"
        if self.kind == "imports":
            inside = ", ".join(f"`{package}/{g}`" for g in self.within)
            return (
                f"the functions that name metadata in {where} and in every module of "
                f"{inside} it imports, directly or through another of them"
            )
        return f"every function in {where}"


@dataclass(frozen=True)
class Part:
    name: str
    clauses: tuple[Select, ...]


# The surface, per engine (its package's name): parts in order, first match wins.
SURFACE: dict[str, tuple[Part, ...]] = {
    "vllm": (
        Part("builders", (Select("class", ("**/*.py",), base="AttentionMetadataBuilder"),)),
        Part(
            "backend-utils",
            (
                Select(
                    "refs",
                    ("v1/attention/backend.py", "v1/attention/backends/**/*.py"),
                    module_only=True,
                ),
                Select("every", ("v1/attention/**/*metadata*.py",)),
            ),
        ),
        Part(
            "drafters",
            (Select("refs", ("v1/spec_decode/**/*.py", "v1/worker/gpu/spec_decode/**/*.py")),),
        ),
        Part(
            "runner-v1",
            (
                Select("imports", ("v1/worker/gpu_model_runner.py",), within=("v1/worker/*.py",)),
                Select(
                    "every",
                    (
                        "v1/cudagraph_dispatcher.py",
                        "v1/worker/block_table.py",
                        "v1/worker/dp_utils.py",
                    ),
                ),
            ),
        ),
        Part(
            "runner-v2",
            (
                Select(
                    "imports",
                    ("v1/worker/gpu/model_runner.py", "v1/worker/gpu/model_states/*.py"),
                    within=("v1/worker/gpu/**/*.py",),
                ),
                Select(
                    "every",
                    (
                        "v1/worker/gpu/input_batch.py",
                        "v1/worker/gpu/block_table.py",
                        "v1/worker/gpu/attn_utils.py",
                        "v1/worker/gpu/cudagraph_utils.py",
                        "v1/worker/gpu/dp_utils.py",
                    ),
                ),
            ),
        ),
        Part("indexer", (Select("refs", ("model_executor/layers/sparse_attn_indexer.py",)),)),
    ),
    "sglang": (
        Part(
            "backends",
            (
                Select(
                    "class",
                    ("srt/layers/attention/**/*.py",),
                    base="AttentionBackend",
                    names=("metadata", "graph"),
                ),
            ),
        ),
        Part(
            "metadata-modules",
            (
                Select(
                    "every",
                    (
                        "srt/layers/attention/**/*metadata*.py",
                        "kernels/ops/attention/**/*metadata*.py",
                        "kernels/ops/attention/**/*indices*.py",
                    ),
                ),
            ),
        ),
        Part(
            "graph-runner",
            (
                Select(
                    "refs",
                    (
                        "srt/model_executor/cuda_graph_runner.py",
                        "srt/model_executor/runner/*cuda_graph_runner.py",
                        "srt/model_executor/runner_utils/buffers.py",
                        "srt/model_executor/cuda_graph_buffer_registry.py",
                    ),
                ),
            ),
        ),
        Part(
            "spec-runners",
            (
                Select(
                    "refs",
                    (
                        "srt/speculative/*cuda_graph_runner.py",
                        "srt/speculative/eagle_info.py",
                        "srt/speculative/eagle_utils.py",
                        "srt/speculative/eagle_worker*.py",
                        "srt/speculative/multi_layer_eagle_*.py",
                    ),
                ),
            ),
        ),
    ),
}
NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


# -- the surface, from the engine's source ------------------------------------------------


@dataclass(frozen=True)
class Function:
    """A function of the surface: ``name`` is ``path:Qual.name``, the path from the
    package's parent; its lines run from its first body line to its last."""

    name: str
    file: Path
    first: int
    last: int


def _nested_bodies(node: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement lists of a compound statement that is no def or class
    (``if TYPE_CHECKING:``, ``try:`` ... at module or class level)."""
    for attr in ("body", "orelse", "finalbody"):
        yield getattr(node, attr, [])
    for handler in getattr(node, "handlers", []):
        yield handler.body


def functions_of(
    tree: ast.Module,
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, ast.ClassDef | None]]:
    """Each outermost function of a module: its qualified name, its node and the
    class it is a method of (None outside classes). Nested functions are not
    listed: they are lines of the function that holds them."""

    def walk(body: list[ast.stmt], prefix: str, cls: ast.ClassDef | None) -> Iterator:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + node.name, node, cls
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.", node)
            else:
                for inner in _nested_bodies(node):
                    yield from walk(inner, prefix, cls)

    yield from walk(tree.body, "", None)


def base_names(cls: ast.ClassDef) -> set[str]:
    """The names of a class's bases: ``a.B`` is ``B``, ``B[M]`` is ``B``."""
    out = set()
    for base in cls.bases:
        while isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name):
            out.add(base.id)
        elif isinstance(base, ast.Attribute):
            out.add(base.attr)
    return out


def subclasses(
    source: Source, paths: Sequence[Path], base: str
) -> tuple[dict[Path, ast.Module], set[str]]:
    """``base`` and the names of the classes of ``paths`` that subclass it,
    transitively, by name (a class is known by its name alone); with the
    modules that hold them. Only a module whose text names ``base`` or a class
    found to subclass it is parsed: parsing all of vLLM would take minutes."""
    trees: dict[Path, ast.Module] = {}
    found, frontier = {base}, {base}
    while frontier:
        word = re.compile(rb"\b(?:" + b"|".join(re.escape(n.encode()) for n in frontier) + rb")\b")
        for path in paths:
            if path not in trees and word.search(source.text(path)):
                if (tree := source.tree(path)) is not None:
                    trees[path] = tree
        frontier = {
            node.name
            for tree in trees.values()
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            and node.name not in found
            and base_names(node) & found
        }
        found |= frontier
    return trees, found


def names_metadata(node: ast.AST) -> bool:
    """Whether a function's code holds an identifier that names attention metadata."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            ident = sub.id
        elif isinstance(sub, ast.Attribute):
            ident = sub.attr
        elif isinstance(sub, ast.arg):
            ident = sub.arg
        elif isinstance(sub, ast.keyword):
            ident = sub.arg or ""
        elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
            ident = sub.name
        else:
            continue
        low = ident.lower()
        if any(word in low for word in METADATA_NAMES):
            return True
    return False


class Source:
    """The parsed modules of one package directory, each parsed once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._trees: dict[Path, ast.Module | None] = {}
        self._texts: dict[Path, bytes] = {}

    def files(self, globs: Sequence[str]) -> list[Path]:
        out: set[Path] = set()
        for pattern in globs:
            out.update(p for p in self.root.glob(pattern) if p.is_file())
        return sorted(out)

    def text(self, path: Path) -> bytes:
        if path not in self._texts:
            self._texts[path] = path.read_bytes()
        return self._texts[path]

    def tree(self, path: Path) -> ast.Module | None:
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.text(path), filename=str(path))
            except (SyntaxError, ValueError, UnicodeDecodeError):
                self._trees[path] = None  # a vendored file of another Python: not ours to count
        return self._trees[path]

    def trees(self, globs: Sequence[str]) -> dict[Path, ast.Module]:
        return {p: t for p in self.files(globs) if (t := self.tree(p)) is not None}

    def name(self, path: Path, qualname: str) -> str:
        return f"{path.relative_to(self.root.parent).as_posix()}:{qualname}"


def _imported(source: Source, path: Path, tree: ast.Module) -> set[Path]:
    """The files of the package that a module imports anywhere in its code
    (function-level imports too): ``from a.b import c`` names ``a/b`` and, where
    it is a module, ``a/b/c``."""
    package = source.root.name
    here = path.relative_to(source.root).parent.parts
    dotted: list[tuple[str, ...]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted += [tuple(alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                stem = (package, *here[: len(here) - node.level + 1])
                base = (*stem, *(node.module or "").split(".")) if node.module else stem
            else:
                base = tuple((node.module or "").split("."))
            dotted.append(base)
            dotted += [(*base, alias.name) for alias in node.names]
    out = set()
    for parts in dotted:
        if parts[:1] != (package,):
            continue
        for candidate in (
            source.root.joinpath(*parts[1:]).with_suffix(".py"),
            source.root.joinpath(*parts[1:], "__init__.py"),
        ):
            if candidate.is_file():
                out.add(candidate)
    return out


def import_closure(source: Source, starts: Sequence[Path], within: Sequence[str]) -> list[Path]:
    """``starts`` and every module of ``within`` they import, directly or through
    another module of ``within``."""
    allowed = set(source.files(within))
    found, frontier = set(starts), list(starts)
    while frontier:
        path = frontier.pop()
        if (tree := source.tree(path)) is None:
            continue
        for module in _imported(source, path, tree) & allowed:
            if module not in found:
                found.add(module)
                frontier.append(module)
    return sorted(found)


def select(source: Source, clause: Select) -> Iterator[Function]:
    """The functions one clause selects."""
    if clause.kind == "class":
        trees, classes = subclasses(source, source.files(clause.files), clause.base)
    elif clause.kind == "imports":
        paths = import_closure(source, source.files(clause.files), clause.within)
        trees = {p: t for p in paths if (t := source.tree(p)) is not None}
        classes = set()
    else:
        trees, classes = source.trees(clause.files), set()
    for path, tree in trees.items():
        for qualname, node, cls in functions_of(tree):
            if clause.kind == "class":
                chosen = cls is not None and cls.name in classes
                chosen = chosen and (not clause.names or any(w in node.name for w in clause.names))
            elif clause.kind in ("refs", "imports"):
                chosen = not (clause.module_only and cls is not None) and names_metadata(node)
            elif clause.kind == "every":
                chosen = True
            else:
                raise ValueError(f"unknown clause kind {clause.kind!r}")
            if chosen:
                first = node.body[0].lineno
                yield Function(source.name(path, qualname), path, first, node.end_lineno or first)


def surface(root: Path, parts: Sequence[Part]) -> dict[str, list[Function] | None]:
    """Each part's functions, a function in the first part that selects it;
    None for a part none of whose files this release has."""
    source, seen, out = Source(root), set(), {}
    for part in parts:
        globs = [g for clause in part.clauses for g in clause.files]
        if not source.files(globs):
            out[part.name] = None
            continue
        chosen = []
        for clause in part.clauses:
            for fn in select(source, clause):
                if fn.name not in seen:
                    seen.add(fn.name)
                    chosen.append(fn)
        out[part.name] = chosen
    return out


# -- counting --------------------------------------------------------------------------


@dataclass
class Count:
    lines: int = 0
    lines_run: int = 0
    branches: int = 0
    branches_run: int = 0

    def add(self, other: Count) -> None:
        self.lines += other.lines
        self.lines_run += other.lines_run
        self.branches += other.branches
        self.branches_run += other.branches_run


@dataclass
class EngineResult:
    engine: str
    release: str
    parts: dict[str, dict[str, Count] | None]  # part -> function name -> count; None: absent
    runs: list[tuple[str, str, int, float, str]] = field(default_factory=list)
    # The builders' part (the first, of class clauses): each module's import here, as
    # attnfuzz's adapters import it (None: it imports; else the error, one line).
    imports: dict[str, str | None] = field(default_factory=dict)

    def builders(self) -> dict[str, Count]:
        """The first part's functions by class (``path:Class``), each class's total."""
        out: dict[str, Count] = {}
        for name, c in (next(iter(self.parts.values())) or {}).items():
            out.setdefault(name.rsplit(".", 1)[0], Count()).add(c)
        return out

    def part_total(self, part: str) -> Count:
        total = Count()
        for count in (self.parts[part] or {}).values():
            total.add(count)
        return total

    def total(self) -> Count:
        total = Count()
        for part in self.parts:
            total.add(self.part_total(part))
        return total


def count(fn: Function, report: dict) -> Count:
    """One function's figures from coverage's JSON report of its file (``None``
    entries: the file was never measured, all of it missing)."""
    inside = range(fn.first, fn.last + 1)
    run = {n for n in report.get("executed_lines", []) if n in inside}
    missing = {n for n in report.get("missing_lines", []) if n in inside}
    taken = [a for a in report.get("executed_branches", []) if a[0] in inside]
    not_taken = [a for a in report.get("missing_branches", []) if a[0] in inside]
    return Count(len(run) + len(missing), len(run), len(taken) + len(not_taken), len(taken))


def figures(results: Sequence[EngineResult]) -> dict:
    """The ``--json`` document: per engine its totals and parts, per part its
    totals and each function's lines run (an absent part: zeros, no functions)."""

    def keys(c: Count) -> dict:
        return {
            "lines_run": c.lines_run,
            "lines": c.lines,
            "branches_run": c.branches_run,
            "branches": c.branches,
        }

    doc = {}
    for r in results:
        parts = {}
        for part, functions in r.parts.items():
            fns = {name: c.lines_run for name, c in (functions or {}).items()}
            parts[part] = {**keys(r.part_total(part)), "functions": fns}
        builders = {
            name: {**keys(c), "driven": driven(r, name, c)} for name, c in r.builders().items()
        }
        doc[r.engine] = {**keys(r.total()), "parts": parts, "builders": builders}
    return doc


def write_json(path: Path, results: Sequence[EngineResult]) -> None:
    path.write_text(json.dumps(figures(results), indent=1) + "\n")


# -- measuring ---------------------------------------------------------------------------


def package_root(engine: str) -> Path | None:
    """The installed engine's package directory, found without importing it."""
    spec = importlib.util.find_spec(engine)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def implementations(engine: str, targets: Sequence[str] | None) -> list[tuple[str, str]]:
    """``(target, implementation)`` for every available engine implementation of
    ``engine``, traced ones included."""
    from attnfuzz.harness.registry import get_target, target_names

    jobs = []
    for name in targets or target_names():
        for impl_name, impl in get_target(name).implementations.items():
            if impl.kind == "engine" and impl.engine == engine:
                why = impl.why_unavailable()
                if why is None:
                    jobs.append((name, impl_name))
                else:
                    print(f"not run: {name} / {impl_name}: {why}")
    return jobs


def _shipped_bug(target: str, impl: str) -> object | None:
    """The defect of its engine's installed release ``impl`` of ``target`` is declared to
    fail on (``Engine.shipped_bug``), or None."""
    from attnfuzz.harness import engines
    from attnfuzz.harness.registry import get_target

    name = get_target(target).implementations[impl].engine
    engine = engines.get(name) if name is not None else None
    return engine.shipped_bug(target, impl) if engine is not None else None


def _run_one(target: str, impl: str, n: int) -> tuple[int, float, str]:
    """One implementation's search, judged in this process: examples, seconds, outcome."""
    import attnfuzz

    start = time.perf_counter()
    try:
        r = attnfuzz.run(target, impl, max_examples=n, seed=0)
        outcome = "FAILED" if r.failed else "passed"
        bug = _shipped_bug(target, impl) if r.failed else None
        if bug is not None:  # the engine's own defect, declared: what the run should find
            outcome = f"fails: {bug.ref} (shipped in {bug.last_buggy})"
        examples = r.examples
    except Exception as err:  # a harness error ends one run, not the measurement
        traceback.print_exc()  # whole, on stderr; the table keeps its first line
        outcome, examples = f"error: {type(err).__name__}: {one_line(str(err))}", 0
    return examples, time.perf_counter() - start, outcome


def _coverage(files: Sequence[str], data_file: str | None):
    import coverage

    cov = coverage.Coverage(data_file=data_file, config_file=False, branch=True, include=files)
    # The engine is imported before the runs (by attnfuzz's registry): said, not a problem.
    cov.set_option("run:disable_warnings", ["module-not-measured", "no-data-collected"])
    return cov


def _measured_job(
    files: Sequence[str], data_file: str, target: str, impl: str, n: int
) -> tuple[int, float, str]:
    """A worker's job (a process of its own): one run under coverage, its data saved."""
    import attnfuzz.kernels._triton  # noqa: F401  (Triton set up before an engine imports it)

    cov = _coverage(files, data_file)
    cov.start()
    try:
        return _run_one(target, impl, n)
    finally:
        cov.stop()
        cov.save()


def measure(
    engine: str,
    parts: dict[str, list[Function] | None],
    jobs: list[tuple[str, str]],
    n: int,
    workers: int = 1,
) -> tuple[dict[str, dict], list[tuple[str, str, int, float, str]]]:
    """Run every job under coverage; coverage's JSON report per surface file
    (absolute path) and each run's target, implementation, examples, seconds, outcome.

    With ``workers`` > 1 each job runs in a new process of its own (``workers`` at a
    time) and the coverage data of every job is combined: the same runs, the same
    examples, so the same lines, in less time on a machine with the cores."""
    files = sorted({str(fn.file) for fns in parts.values() for fn in fns or []})
    runs = []

    def record(target: str, impl: str, result: tuple[int, float, str]) -> None:
        examples, seconds, outcome = result
        runs.append((target, impl, examples, seconds, outcome))
        print(f"  {target} / {impl}: {examples} examples, {seconds:.1f}s, {outcome}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        if workers <= 1:
            cov = _coverage(files, None)
            cov.start()
            try:
                for target, impl in jobs:
                    record(target, impl, _run_one(target, impl, n))
            finally:
                cov.stop()
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            data = [str(Path(tmp) / f".coverage.{i}") for i in range(len(jobs))]
            # A fresh interpreter per job: no engine state or CUDA stand-in carried over.
            pool = ProcessPoolExecutor(
                workers, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1
            )
            with pool:
                futures = [
                    pool.submit(_measured_job, files, d, t, i, n)
                    for d, (t, i) in zip(data, jobs, strict=True)
                ]
                for (target, impl), future in zip(jobs, futures, strict=True):
                    record(target, impl, future.result())
            cov = _coverage(files, str(Path(tmp) / ".coverage"))
            cov.combine([d for d in data if Path(d).exists()], keep=True)
        out = Path(tmp) / "coverage.json"
        # Files never imported are reported too, every line missing.
        cov.json_report(morfs=files, outfile=str(out), ignore_errors=True)
        reports = json.loads(out.read_text())["files"]
    by_path = {str(Path(name).resolve()): report for name, report in reports.items()}
    return by_path, runs


def engine_result(
    engine: str, n: int, targets: Sequence[str] | None, workers: int = 1
) -> EngineResult | None:
    root = package_root(engine)
    if root is None:
        print(f"{NAMES[engine]} is not installed: not measured")
        return None
    release = importlib.metadata.version(engine)
    parts = surface(root, SURFACE[engine])
    jobs = implementations(engine, targets)
    print(f"{NAMES[engine]} {release}: {len(jobs)} implementations, {n} examples each")
    reports, runs = measure(engine, parts, jobs, n, workers)
    counted: dict[str, dict[str, Count] | None] = {}
    for part, fns in parts.items():
        reported = ((fn, reports.get(str(fn.file), {})) for fn in fns or [])
        counted[part] = None if fns is None else {fn.name: count(fn, rep) for fn, rep in reported}
    builders = next(iter(counted.values())) or {}
    return EngineResult(engine, release, counted, runs, import_verdicts(engine, list(builders)))


# What a module of the builders' part does when attnfuzz's adapters import it: the
# engine set up as they set it up (its environment, attnfuzz's stand-ins for the
# kernels and server packages a CPU lacks), then each module imported, in a process
# of its own (an import may leave state behind).
_IMPORTS = """
import json, sys
sys.path.insert(0, {here!r})
import attnfuzz.kernels._triton
from attnfuzz.adapters.{engine} import _engine
from surface import import_each
_engine.prepare()
print("imports:" + json.dumps(import_each(json.loads(sys.argv[1]))))
"""


def import_each(modules: Sequence[str]) -> dict[str, str | None]:
    """Each of ``modules`` imported in turn: None where it imports, else its error.

    A failed import's orphans are dropped: a package whose ``__init__`` raises leaves
    the submodules it loaded first in ``sys.modules`` without it, and a later module
    importing one of them would import only because of the order
    (``vllm.vllm_flash_attn``'s ``flash_attn_interface``, on a CPU). The rest stays: a
    module imported again would register its custom ops twice."""
    out: dict[str, str | None] = {}
    for module in modules:
        before = set(sys.modules)
        try:
            importlib.import_module(module)
            out[module] = None
        except BaseException as exc:  # an import's verdict, whatever it raised
            out[module] = f"{type(exc).__name__}: {str(exc).strip()}"
            for name in set(sys.modules) - before:
                parents = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)]
                if any(p not in sys.modules for p in parents):
                    del sys.modules[name]
    return out


def module_of(name: str) -> str:
    """The module of a surface name ``path/to/file.py:Qual.name``."""
    return name.split(":", 1)[0].removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def one_line(error: str) -> str:
    """An import error as the docs show it: its first line, no path of this machine's
    (a file named in it shortened to its package path), at most 100 characters."""
    first = (error.strip().splitlines() or [""])[0]
    first = re.sub(r"\(?/\S*/(?:site|dist)-packages/([^\s)]*)\)?", r"\1", first)
    first = re.sub(r"(^|\s)\(?/\S+\)?", r"\1", first).strip()
    return first if len(first) <= 100 else first[:99] + "…"


def import_verdicts(engine: str, names: Sequence[str]) -> dict[str, str | None]:
    """Each module of ``names`` (surface names): None where it imports here, else why not."""
    import subprocess

    modules = sorted({module_of(n) for n in names})
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS.format(engine=engine, here=str(Path(__file__).parent)),
         json.dumps(modules)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    for line in done.stdout.splitlines():
        if line.startswith("imports:"):
            found = json.loads(line.removeprefix("imports:"))
            return {m: None if why is None else one_line(why) for m, why in found.items()}
    why = one_line((done.stderr.strip().splitlines() or ["no output"])[-1])
    return dict.fromkeys(modules, f"the engine does not set up: {why}")


def driven(r: EngineResult, builder: str, c: Count) -> str:
    """Whether a builder ran, and why not where it did not."""
    if c.lines_run:
        return "driven"
    why = r.imports.get(module_of(builder))
    return "imports; no implementation drives it" if why is None else f"does not import: {why}"


def builders_table(r: EngineResult) -> str:
    rows = [
        [f"`{name.split('/', 1)[-1]}`", f"{c.lines_run}/{c.lines}",
         _share(c.lines_run, c.lines), driven(r, name, c)]
        for name, c in sorted(r.builders().items(), key=lambda kv: (-kv[1].lines, kv[0]))
    ]  # fmt: skip
    return table(["builder", "lines run", "lines %", "driven"], rows, "lrrl")


def builders_summary(r: EngineResult) -> str:
    """How many builders run, of those that import here."""
    counts = r.builders()
    imported = [b for b in counts if r.imports.get(module_of(b), "") is None]
    ran = [b for b in imported if counts[b].lines_run]
    return f"{len(ran)} of the {len(imported)} that import here run ({len(counts)} in all)."


# -- tables ------------------------------------------------------------------------------


def _share(run: int, total: int) -> str:
    return f"{100 * run / total:.1f}%" if total else "-"


def parts_table(r: EngineResult) -> str:
    rows = []
    for part, functions in r.parts.items():
        if functions is None:
            rows.append([part, "absent", "", "", "", ""])
            continue
        c = r.part_total(part)
        ran = sum(1 for f in functions.values() if f.lines_run)
        rows.append(
            [
                part,
                f"{ran}/{len(functions)}",
                f"{c.lines_run}/{c.lines}",
                _share(c.lines_run, c.lines),
                f"{c.branches_run}/{c.branches}",
                _share(c.branches_run, c.branches),
            ]
        )
    c = r.total()
    ran = sum(1 for fs in r.parts.values() for f in (fs or {}).values() if f.lines_run)
    every = sum(len(fs or {}) for fs in r.parts.values())
    rows.append(
        [
            "**all**",
            f"{ran}/{every}",
            f"{c.lines_run}/{c.lines}",
            _share(c.lines_run, c.lines),
            f"{c.branches_run}/{c.branches}",
            _share(c.branches_run, c.branches),
        ]
    )
    header = ["part", "functions run", "lines run", "lines %", "branches run", "branches %"]
    return table(header, rows, "lrrrrr")


def runs_table(r: EngineResult) -> str:
    rows = [[t, i, n, f"{s:.1f}s", outcome] for t, i, n, s, outcome in r.runs]
    return table(["target", "implementation", "examples", "time", "outcome"], rows, "llrrl")


def not_run(r: EngineResult, top: int) -> list[str]:
    """The ``top`` largest functions that run no line, largest first."""
    idle = [
        (c.lines, part, name)
        for part, fns in r.parts.items()
        for name, c in (fns or {}).items()
        if c.lines and not c.lines_run
    ]
    idle.sort(key=lambda x: (-x[0], x[2]))
    return [f"`{name}` ({part}, {lines} lines)" for lines, part, name in idle[:top]]


def rules_table(engine: str) -> str:
    rows = [
        [part.name, "; ".join(c.describe(engine) for c in part.clauses)] for part in SURFACE[engine]
    ]
    return table(["part", "functions"], rows, pad=False)


def report_lines(results: Sequence[EngineResult], n: int, seconds: float, top: int) -> list[str]:
    lines = []
    for r in results:
        lines += engine_lines(r, n, top)
    lines.append(footer(seconds))
    return lines


def footer(seconds: float) -> str:
    words = ", ".join(f"`{w}`" for w in METADATA_NAMES)
    return (
        f"A function names metadata where an identifier in it contains {words}.\n\n"
        f"Measured in {seconds / 60:.1f} minutes, coverage.py tracing."
    )


def engine_lines(r: EngineResult, n: int, top: int) -> list[str]:
    """One engine's report: its parts, builders, largest functions not run, runs, rules."""
    name = f"{NAMES[r.engine]} {r.release}"
    return [
        f"### {name}",
        "",
        f"{len(r.runs)} engine implementation{'' if len(r.runs) == 1 else 's'}, "
        f"{n} examples each (seed 0).",
        "",
        *parts_table(r).splitlines(),
        "",
        f"Its {next(iter(r.parts))}, each a class and its methods on the surface: "
        + builders_summary(r),
        "",
        *builders_table(r).splitlines(),
        "",
        f"The largest functions of {name}'s surface that run no line:",
        "",
        *[f"- {item}" for item in not_run(r, top)],
        "",
        "The runs:",
        "",
        *runs_table(r).splitlines(),
        "",
        "The parts (a function is in the first that selects it):",
        "",
        *rules_table(r.engine).splitlines(),
        "",
    ]


def reader_command(argv: Sequence[str]) -> str:
    """The command as a reader types it again: without where its files went
    (``--markdown FILE``, ``--json FILE``)."""
    kept, args = [], iter(argv)
    for arg in args:
        if arg == "--json":
            next(args, None)
        elif not arg.startswith("--json="):
            kept.append(arg)
    return command_line("surface", kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200, help="per implementation")
    parser.add_argument("--engine", choices=sorted(SURFACE), action="append", default=None)
    parser.add_argument("--target", action="append", default=None, help="only these targets")
    parser.add_argument("--top", type=int, default=10, help="largest functions not run, listed")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    parser.add_argument(
        "--jobs", type=int, default=1, help="implementations run at once, each in its own process"
    )
    args = parser.parse_args()

    start = time.perf_counter()
    results = []
    for engine in args.engine or list(SURFACE):
        r = engine_result(engine, args.examples, args.target, args.jobs)
        if r is not None:
            results.append(r)
    seconds = time.perf_counter() - start
    lines = report_lines(results, args.examples, seconds, args.top)
    print("\n" + "\n".join(lines))
    if args.json is not None:
        write_json(args.json, results)
    if args.markdown is not None:
        # Each engine's section of its own: measuring one engine leaves the other's.
        head = f"Measured with `{reader_command(sys.argv[1:])}`."
        for r in results:
            body = [head, "", *engine_lines(r, args.examples, args.top), footer(seconds)]
            write_section(args.markdown, "surface", r.engine, body)
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
