"""Argument types and terminal helpers shared by the subcommands.

Every parser here raises :class:`argparse.ArgumentTypeError` with a one-line
reason; :func:`attnfuzz.harness.cli.main` turns it into a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import math
import os
import re

from attnfuzz.harness.definitions import SCALE_NAMES
from attnfuzz.harness.errors import MESSAGE_LIMIT, one_line  # noqa: F401 (for the commands)

DURATION_HELP = "a number of seconds, or with a unit: 90s, 10m, 1h30m"

PATH_LIMIT = 4096


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


def parse_duration(text: str) -> float:
    """``90`` (seconds), ``90s``, ``10m``, ``1h30m``, ``1.5h``: seconds, > 0."""
    s = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        value = float(s)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", s)
        if not parts or "".join(a + b for a, b in parts) != s:
            raise argparse.ArgumentTypeError(
                f"expected a duration such as 90s, 10m or 1h30m, got {text!r}"
            )
        value = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A plain number of seconds (no unit: ``10`` is ten seconds), finite; whether it
    is > 0 the command checks."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a plain number of seconds such as 10 or 2.5, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def workers(text: str) -> int:
    """A number of worker processes >= 1, or ``auto``: one per core this process may use."""
    if text == "auto":
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of workers or auto, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 worker, got {value}")
    return value


def names(values: list[str] | None) -> list[str] | None:
    """``--targets a b`` and ``--targets a,b`` alike; ``None`` (not given) stays ``None``."""
    if values is None:
        return None
    return [name for value in values for name in value.split(",") if name]


class Repeatable(argparse.Action):
    """``--opt A --opt B`` collects ``[A, B]``; the first one given replaces the
    default (a project's ``[tool.attnfuzz]`` list), it does not add to it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        current = getattr(namespace, self.dest, None)
        items = [] if current is None or current is self.default else list(current)
        items.append(values)
        setattr(namespace, self.dest, items)


def add_mutants_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mutants",
        action=Repeatable,
        default=None,
        metavar="MODULE[:ATTR]",
        help="a user's mutant declaration(s) to register and run (repeatable; see attnfuzz.mutant)",
    )


def add_timeout_argument(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--example-timeout",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help=f"{what} ({DURATION_HELP})",
    )


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu or cuda (default: where kernels run)")


def add_scale_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scale", choices=sorted(SCALE_NAMES), default="small")


def device(name: str | None) -> str:
    """``--device`` checked, with ``ATTNFUZZ_DTYPE``: a one-line :class:`UsageError`
    for an unknown or absent device or a dtype it cannot run (see harness/devices.py)."""
    from attnfuzz.harness.devices import check_device

    return check_device(name)
