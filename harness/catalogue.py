"""What ``attnfuzz list`` and ``attnfuzz describe`` print of attnfuzz's own targets, kept as data.

Building the targets imports torch, Triton, Hypothesis and every engine plugin
(seconds), while what ``list`` and ``describe`` print of attnfuzz's own targets
and engines follows from attnfuzz's source alone: the targets, their summaries,
their implementations (name, kind, description, engine, whether traced) and
each target's contract. ``catalogue.json``, shipped next to this module, holds
that data and the digest of the source it was built from
(:func:`source_digest`); ``list`` and ``describe`` read it instead of building
the targets where it is sure to say what building them would:

- the digest is the installed source's (an edited checkout builds the targets),
  and it was written by this Python's minor release (the contract's type names);
- no other distribution declares targets (``attnfuzz.targets``) or engines
  (``attnfuzz.engines``): attnfuzz's own engines, from attnfuzz, are all there are;
- the registry was not loaded in this process (where it is, mutants may have been
  added to its targets, and torch is there already);
- for ``list``: no engine is installed. What depends on the machine is asked live,
  without torch: each engine's package (``attnfuzz.adapters.vllm``) says its
  installed version (from ``importlib.metadata``), its status line and why its
  code cannot run; where an engine is installed, ``list`` builds the targets.

Anything else (or ``ATTNFUZZ_LIVE_REGISTRY=1``, for tests and debugging) builds
the targets: a mismatch means the live path, never old data.
``python -m attnfuzz.harness.catalogue --write`` regenerates the file;
``tests/test_catalogue.py`` fails while it differs from what the targets say.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from attnfuzz.harness import entry_points
from attnfuzz.harness.contract import (
    contract_classes,
    defined_symbols,
    describe_dataclass,
    flat_fields,
)

PACKAGE = Path(__file__).resolve().parents[1]
"""The root of the ``attnfuzz`` package (a checkout's root, or site-packages/attnfuzz)."""
CATALOGUE = Path(__file__).with_name("catalogue.json")
WRITE = "python -m attnfuzz.harness.catalogue --write"
"""The command that regenerates :data:`CATALOGUE`."""
LIVE_VARIABLE = "ATTNFUZZ_LIVE_REGISTRY"
"""Set to 1 to build the targets whatever the catalogue says (tests, debugging)."""
NOT_SHIPPED = frozenset({"tests", "benchmarks", "docs"})
"""Folders of a checkout's root that no install holds: their source says nothing of the targets."""
TARGETS_GROUP = "attnfuzz.targets"  # registry.ENTRY_POINT_GROUP, whose module imports torch
ENGINES_GROUP = "attnfuzz.engines"  # engines.ENTRY_POINT_GROUP


def source_files(root: Path = PACKAGE) -> list[Path]:
    """The ``.py`` files of the package, as an install holds them: those of every folder
    with an ``__init__.py`` under ``root`` (a checkout's virtual environment, caches,
    tests, benchmarks and docs have none, or are left out), in a stable order."""
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root):
        here = Path(folder)
        subfolders[:] = sorted(
            name
            for name in subfolders
            if (here / name / "__init__.py").is_file()
            and not (here == root and name in NOT_SHIPPED)
        )
        found += [here / name for name in sorted(files) if name.endswith(".py")]
    return sorted(found, key=lambda path: path.relative_to(root).as_posix())


def source_digest(root: Path = PACKAGE) -> str:
    """SHA-256 of every file of :func:`source_files`, with its path: any edit to
    attnfuzz's own code (a description, a contract's comment) changes it."""
    digest = hashlib.sha256()
    for path in source_files(root):
        content = path.read_bytes()
        name = path.relative_to(root).as_posix().encode()
        digest.update(b"%d:%s:%d:" % (len(name), name, len(content)))
        digest.update(content)
    return digest.hexdigest()


def _python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


# ---------------------------------------------------------------------------
# What list and describe print, as data
# ---------------------------------------------------------------------------


Listed = tuple[list[dict[str, Any]], dict[str, str], list[str], dict[str, tuple[str | None, str]]]
"""``(rows, broken, problems, engines)``: each target's row, the targets of other
distributions that could not be built (with why), the engine plugins or implementations
left out (one line each), and each engine's installed version and status line."""


def target_row(target: Any) -> dict[str, Any]:
    """``target``'s row without what depends on this machine: each implementation's
    ``unavailable`` is added by who asks (``list``'s live path, :func:`listed`)."""
    return {
        "target": target.name,
        "summary": target.summary,
        "implementations": [
            {
                "name": i.name,
                "kind": i.kind,
                "description": i.description,
                "engine": i.engine,
                # It lives across steps: fuzzed with traces of one engine's steps.
                "traced": i.traced,
            }
            for i in target.implementations.values()
        ],
    }


def contract_document(target: Any) -> dict[str, Any]:
    """What ``describe`` prints of ``target``, as data: ``json`` (the ``--json``
    document) and ``classes``, the inputs' and outputs' class names and module that
    the text names besides."""
    inputs_cls, outputs_cls = contract_classes(target)
    inputs = describe_dataclass(inputs_cls) if inputs_cls is not None else None
    outputs = describe_dataclass(outputs_cls) if outputs_cls is not None else None
    views = [(f.name, f.view_of) for f in flat_fields(outputs) if f.view_of]
    symbols = defined_symbols([*flat_fields(inputs), *flat_fields(outputs)])
    declared = inputs or outputs
    return {
        "json": {
            "target": target.name,
            "summary": target.summary,
            "graph_safe": target.graph_safe,
            "dtypes": target.dtype_names,
            "symbols": symbols,
            "inputs": inputs.to_json() if inputs else None,
            "outputs": outputs.to_json() if outputs else None,
            "views": dict(views),
        },
        "classes": {
            "inputs": inputs.cls.__name__ if inputs else None,
            "outputs": outputs.cls.__name__ if outputs else None,
            "module": declared.cls.__module__ if declared else None,
        },
    }


# ---------------------------------------------------------------------------
# Building it from the targets
# ---------------------------------------------------------------------------


def _own_entry_points() -> dict[str, str]:
    """``engine name -> entry point value`` of attnfuzz's own engines; a
    :class:`RuntimeError` where another distribution declares targets or engines (the
    catalogue holds attnfuzz's own only)."""
    others = [
        entry_points.describe(ep)
        for group in (TARGETS_GROUP, ENGINES_GROUP)
        for ep in entry_points.entry_points(group)
        if group == TARGETS_GROUP or _distribution(ep) != entry_points.OWN_DISTRIBUTION
    ]
    if others:
        raise RuntimeError(
            f"the catalogue holds attnfuzz's own targets and engines only; build it where "
            f"no other distribution declares any (found: {'; '.join(others)})"
        )
    return {ep.name: ep.value for ep in entry_points.entry_points(ENGINES_GROUP)}


def _distribution(ep: Any) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else None


def build() -> dict[str, Any]:
    """The catalogue of the source as it is: the targets built, read as ``list`` and
    ``describe`` read them. A :class:`RuntimeError` where it cannot stand for them
    (another distribution's targets or engines, an engine plugin left out)."""
    from attnfuzz.harness import engines, registry

    own = _own_entry_points()
    answers: dict[str, dict[str, str]] = {}
    for name, engine in engines.engines().items():
        # The plugin's package answers for the engine without importing its targets.
        package = own[name].partition(":")[0].rpartition(".")[0]
        module = importlib.import_module(package)
        for question in ("installed_version", "unavailable", "status"):
            if getattr(module, question)() != getattr(engine, question)():
                raise RuntimeError(f"{package}.{question}() does not answer as engine {name}'s")
        answers[name] = {"entry_point": own[name], "answers": package}
    problems = registry.engine_problems()
    if problems:
        raise RuntimeError(f"engine plugins left out: {'; '.join(problems)}")
    rows, documents, asked_live = [], {}, []
    for name in registry.target_names():
        target = registry.get_target(name)
        rows.append(target_row(target))
        documents[name] = contract_document(target)
        for impl in target.implementations.values():
            # attnfuzz's own code that may not run everywhere is asked on each machine.
            if impl.engine is None and impl.unavailable is not None:
                asked_live.append(f"{name}/{impl.name}")
            elif impl.engine is not None and impl.engine not in answers:
                raise RuntimeError(f"{name}/{impl.name} names engine {impl.engine!r}: no plugin")
    return {
        "about": f"what attnfuzz list and describe print of attnfuzz's own targets; {WRITE}",
        "digest": source_digest(),
        "python": _python(),
        "engines": answers,
        "asked_live": asked_live,
        "targets": rows,
        "describe": documents,
    }


def write(path: Path = CATALOGUE) -> None:
    path.write_text(json.dumps(build(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def differences(path: Path = CATALOGUE) -> list[str]:
    """What the catalogue at ``path`` says otherwise than the targets now (``targets``,
    ``describe TARGET``, ...), the digest and the Python release aside: empty where a
    new one would say the same."""
    stored, now = _load(path) or {}, build()
    out = []
    for key in now.keys() - {"digest", "python"}:
        if key == "describe":
            names = sorted(stored.get(key, {}).keys() | now[key].keys())
            out += [f"describe {n}" for n in names if stored.get(key, {}).get(n) != now[key].get(n)]
        elif stored.get(key) != now[key]:
            out.append(key)
    return sorted(out)


# ---------------------------------------------------------------------------
# Reading it
# ---------------------------------------------------------------------------


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not shipped, or unreadable: the targets are built
        return None


def why_live(path: Path | None = None) -> str | None:
    """Why ``list`` and ``describe`` build the targets instead of reading the catalogue
    at ``path`` (:data:`CATALOGUE`), or None where it stands for them."""
    if os.environ.get(LIVE_VARIABLE) == "1":
        return f"{LIVE_VARIABLE}=1"
    if "attnfuzz.harness.registry" in sys.modules:
        return "the registry is loaded (its targets may have been added to)"
    data = _load(path or CATALOGUE)
    if data is None:
        return "no catalogue"
    if data.get("python") != _python():
        return f"the catalogue was written by Python {data.get('python')}"
    if data.get("asked_live"):
        return f"implementations ask whether they can run: {', '.join(data['asked_live'])}"
    declared = [
        (ep.name, ep.value, _distribution(ep))
        for group in (TARGETS_GROUP, ENGINES_GROUP)
        for ep in entry_points.entry_points(group)
    ]
    own = [
        (name, engine["entry_point"], entry_points.OWN_DISTRIBUTION)
        for name, engine in data["engines"].items()
    ]
    if sorted(declared) != sorted(own):
        return "other targets or engines are declared"
    if data.get("digest") != source_digest():
        return "the source differs from the catalogue's"
    return None


def _read(path: Path | None) -> dict[str, Any] | None:
    return _load(path or CATALOGUE) if why_live(path) is None else None


def described(target: str, path: Path | None = None) -> dict[str, Any] | None:
    """What ``describe`` prints of ``target`` (:func:`contract_document`),
    or None where it is built instead (see the module's docstring)."""
    data = _read(path)
    return data["describe"].get(target) if data is not None else None


def listed(path: Path | None = None) -> Listed | None:
    """What ``list`` prints (:data:`Listed`), with each
    engine's answers asked now, or None where the targets are built instead: no
    catalogue to read, or an engine installed."""
    data = _read(path)
    if data is None:
        return None
    said: dict[str, tuple[str, str | None]] = {}  # engine -> (status line, why unavailable)
    for name, engine in data["engines"].items():
        try:
            module = importlib.import_module(engine["answers"])
            if module.installed_version() is not None:
                return None  # its answers may import it: the targets are built
            said[name] = (module.status(), module.unavailable())
        except Exception:  # noqa: BLE001 - the live path says how it fails, in its own words
            return None
    rows = []
    for row in data["targets"]:
        impls = [
            {**impl, "unavailable": None if impl["engine"] is None else said[impl["engine"]][1]}
            for impl in row["implementations"]
        ]
        rows.append({**row, "implementations": impls})
    engines: dict[str, tuple[str | None, str]] = {}
    for impl in (impl for row in rows for impl in row["implementations"]):
        if impl["engine"] is not None and impl["engine"] not in engines:
            engines[impl["engine"]] = (None, said[impl["engine"]][0])
    return rows, {}, [], engines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnfuzz.harness.catalogue",
        description="The catalogue attnfuzz list and describe read: check it, or write it anew.",
    )
    parser.add_argument("--write", action="store_true", help=f"write {CATALOGUE.name} anew")
    args = parser.parse_args(argv)
    if args.write:
        write()
        print(f"wrote {CATALOGUE}")
        return 0
    why = why_live()  # asked first: the check below loads the registry
    stale = differences()
    print(f"read by list and describe: {'yes' if why is None else f'no, {why}'}")
    print(f"differs from the targets in: {', '.join(stale)}" if stale else "up to date")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
