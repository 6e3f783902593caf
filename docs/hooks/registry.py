"""mkdocs hook: the Targets page, generated from the registry at every build.

No list of targets, implementations or mutants is typed by hand: the page is
what ``attnfuzz list --json`` prints (the command's versioned output) in the
environment that builds the site, with each target's own parameters from the
registry. An implementation that cannot run there (an engine not installed) is
listed all the same, marked with its engine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

PAGE = "targets.md"
"""The page this hook adds to the site (not a file of the checkout)."""

KINDS = {
    "fixed": "attnfuzz's own path: must pass",
    "reference": "the reference itself: a self-check",
    "engine": "the engine's own code: must pass",
    "mutant": "a known bug: must be caught",
}

INTRO = """\
# Targets and implementations

Each target is one metadata computation of the engine with the consumer that
reads it, a NumPy reference and its own oracle checks (see
[The attention-metadata domain](domain.md) for the five historical bugs A to
E). This page is generated from the registry when the site is built (`attnfuzz
list --json`); `attnfuzz list` prints the same on your machine, and `attnfuzz
describe TARGET` the inputs and outputs an implementation of it takes and
returns.

Kinds: {kinds}. A mutant named `upstream-*` is the engine's own function with a
fix reverted; the others re-create a bug in attnfuzz's kernels. An
implementation of an engine runs where that engine is installed
([Fuzzing vLLM itself](vllm.md)).
"""


def listing() -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "attnfuzz", "list", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def parameters(target: str) -> dict[str, tuple[int, int]]:
    """The target's own integers (``Case.params``), name -> inclusive range."""
    from attnfuzz.harness.registry import get_target

    return dict(getattr(get_target(target), "params", {}) or {})


def cell(text: str | None) -> str:
    return (text or "-").replace("|", "\\|").replace("\n", " ")


def render(targets: list[dict[str, Any]]) -> str:
    kinds = "; ".join(f"`{kind}`, {what}" for kind, what in KINDS.items())
    lines = [INTRO.format(kinds=kinds)]
    for target in targets:
        name = target["target"]
        lines += [f"## `{name}`", "", cell(target.get("summary")) + ".", ""]
        params = parameters(name)
        if params:
            own = ", ".join(f"`{p}` {lo}..{hi}" for p, (lo, hi) in sorted(params.items()))
            lines += [f"Own parameters (drawn after the step, kept in the case file): {own}.", ""]
        lines += ["| implementation | kind | engine | what it is |", "|---|---|---|---|"]
        for impl in target["implementations"]:
            engine = impl.get("engine")
            lines.append(
                f"| `{impl['name']}` | {impl['kind']} | {cell(engine)} "
                f"| {cell(impl.get('description'))} |"
            )
        lines.append("")
    return "\n".join(lines)


def on_files(files, config):  # noqa: ANN001, ANN201 (mkdocs' hook signature)
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render(listing())))
    return files
