"""``attnfuzz list``: targets, their implementations and mutants."""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import TYPE_CHECKING, Any

from attnfuzz.harness.catalogue import Listed, target_row
from attnfuzz.harness.definitions import EXIT_OK

if TYPE_CHECKING:  # rich is imported by the text output only: --json, which CI reads, skips it
    from rich.console import RenderableType

HELP = "targets, implementations and mutants"

PIPE_WIDTH = 4096
"""Columns of a table written to a pipe or a file, whatever ``COLUMNS`` says: wide
enough that no row wraps, so that each row stays one line for ``grep`` and ``head``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def show(*renderables: RenderableType) -> None:
    """Print ``renderables`` on stdout with rich: on a tty at its width, in colour;
    elsewhere plain text (no escape codes, whatever ``FORCE_COLOR`` says) at
    ``PIPE_WIDTH``, without the blanks rich pads a table's last column with."""
    from rich.console import Console

    # Our strings are data, not rich markup: "[max_model_len, W]" is a shape, ":x:" no emoji.
    plain: dict[str, Any] = {"markup": False, "emoji": False, "highlight": False}
    if sys.stdout.isatty():
        out = Console(file=sys.stdout, **plain)
        for renderable in renderables:
            out.print(renderable)
        return
    buffer = io.StringIO()
    out = Console(file=buffer, width=PIPE_WIDTH, color_system=None, force_terminal=False, **plain)
    for renderable in renderables:
        out.print(renderable)
    sys.stdout.write("".join(f"{line.rstrip()}\n" for line in buffer.getvalue().splitlines()))


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness import catalogue

    # attnfuzz's own targets and engines as the catalogue keeps them (no torch), else built.
    listed = catalogue.listed()
    rows, broken, problems, engines = listed if listed is not None else _live()
    for row in rows:
        for impl in row["implementations"]:
            if impl["engine"] is not None:
                impl["engine_version"] = engines[impl["engine"]][0]
    if args.json:
        rows += [
            {"target": name, "summary": None, "implementations": [], "unavailable": why}
            for name, why in broken.items()
        ]
        print(json.dumps(rows, indent=2))
        for problem in problems:  # stdout stays the targets' rows
            print(f"attnfuzz list: {problem}", file=sys.stderr)
        return EXIT_OK
    _print_table(rows, broken, [line for _, line in engines.values()], problems)
    return EXIT_OK


def _live() -> Listed:
    """What ``list`` prints, from the targets built (torch, Triton and every plugin)."""
    from attnfuzz.harness import registry
    from attnfuzz.harness.registry import get_target, target_names

    rows = []
    for name in target_names():
        target = get_target(name)
        row = target_row(target)
        for impl, i in zip(row["implementations"], target.implementations.values(), strict=True):
            # Why it cannot run here (an engine not installed), or null.
            impl["unavailable"] = i.why_unavailable()
        rows.append(row)
    # Targets of other distributions (entry points) that could not be built, with why.
    broken = registry.unavailable_targets()
    # Engine plugins, or implementations of theirs, that were left out, with why.
    problems = registry.engine_problems()
    return rows, broken, problems, _engines(rows)


def _engines(rows: list[dict[str, Any]]) -> dict[str, tuple[str | None, str]]:
    """Each engine of an implementation: its installed version (None when it is not
    installed) and the engine's own line on it (:attr:`Engine.status`)."""
    from attnfuzz.harness import engines
    from attnfuzz.harness.errors import one_line

    left_out = engines.unavailable_engines()
    out: dict[str, tuple[str | None, str]] = {}
    for impl in (impl for row in rows for impl in row["implementations"]):
        name = impl["engine"]
        if name is not None and name not in out:
            engine = engines.get(name)
            if name in left_out:  # two distributions declare it: why is said below
                out[name] = (None, f"{name}: engine left out (see 'left out' below)")
            elif engine is None:  # a user's implementation naming an engine no plugin declares
                out[name] = (None, f"{name}: no attnfuzz engine plugin of that name")
            else:
                try:
                    out[name] = (engine.installed_version(), engine.status())
                except Exception as err:  # noqa: BLE001 - an engine's failure is one line
                    said = f"{type(err).__name__}: {err}"
                    out[name] = (None, one_line(f"{name}: failed to say its status: {said}"))
    return out


def _print_table(
    rows: list[dict[str, Any]], broken: dict[str, str], engines: list[str], problems: list[str]
) -> None:
    """The engines installed, then each target's line and its implementations in
    columns that line up across all targets (one width per column, the widest
    name's); last, why each unavailable implementation cannot run, once per reason."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    impls = [impl for row in rows for impl in row["implementations"]]
    name_width = max((len(i["name"]) for i in impls), default=0)
    kind_width = max((len(i["kind"]) for i in impls), default=0)
    lines: list[RenderableType] = [Text(line) for line in engines]
    reasons: dict[str, list[tuple[str, str | None]]] = {}  # reason -> (target/impl, engine)
    for row in rows:
        lines.append(Text(f"{row['target']}: {row['summary']}", style="bold"))
        table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1))
        table.add_column(no_wrap=True, width=name_width)
        table.add_column(no_wrap=True, width=kind_width, style="dim")
        table.add_column()  # wrapped by words on a narrow terminal only
        for impl in row["implementations"]:
            description = Text(impl["description"])
            if impl["traced"]:
                description.append(" (lives across steps: traces)", style="cyan")
            if impl["unavailable"] is not None:
                description.append(" (unavailable)", style="yellow")
                reasons.setdefault(impl["unavailable"], []).append(
                    (f"{row['target']}/{impl['name']}", impl["engine"])
                )
            table.add_row(Text(impl["name"]), Text(impl["kind"]), description)
        lines.append(Padding(table, (0, 0, 0, 2)))
    for reason, unavailable in reasons.items():
        # One reason for every implementation of an engine (not installed) names none.
        engines_of = {engine for _, engine in unavailable}
        whole = len(engines_of) == 1 and None not in engines_of
        whole = whole and len(unavailable) == sum(i["engine"] in engines_of for i in impls)
        which = "" if whole else f" ({', '.join(name for name, _ in unavailable)})"
        lines.append(Text(f"unavailable{which}: {reason}"))
    lines += [Text(f"{name}: unavailable target ({why})") for name, why in broken.items()]
    lines += [Text(f"left out: {problem}") for problem in problems]
    show(*lines)
