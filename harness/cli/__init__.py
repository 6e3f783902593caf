"""The ``attnfuzz`` command: one module per subcommand, :mod:`.args` for what they share.

Exit status: 0 no failure, 1 a failure was found (or replays), 2 usage error,
3 no verdict (a campaign judged too little of some run; a run whose only failure was a
timeout that a longer limit passed), 141 stdout closed early (see
:mod:`attnfuzz.harness.definitions`).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from attnfuzz.harness.cli.args import (
    DURATION_HELP,
    MESSAGE_LIMIT,
    PATH_LIMIT,
    non_negative_int,
    one_line,
    parse_duration,
    positive_int,
    seconds,
)


def main(argv: list[str] | None = None) -> int:
    """Run one command (:func:`attnfuzz.harness.cli.dispatch.main`).

    The commands load torch and Triton first, seconds on a loaded machine: a
    SIGINT or SIGTERM that comes while they load ends the command quietly with
    exit status 128 + the signal, as it does once the command runs, never with
    a traceback from inside an import (nor a module left half-loaded).
    """
    with _quiet_while_loading():
        from attnfuzz.harness.cli.dispatch import main as run_command
    return run_command(argv)


class _quiet_while_loading:  # noqa: N801 - a context manager, named for where it is used
    def __enter__(self) -> None:
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, _quit)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _quit(signum: int, frame: object) -> None:
    # Nothing has run yet, so nothing is lost; an exception raised inside an import
    # could be caught there and leave a module half-loaded (a false finding later).
    os._exit(128 + signum)


def __getattr__(name: str) -> Any:
    # The parser and the repro helper load every command (and torch) when first asked for.
    if name == "build_parser":
        from attnfuzz.harness.cli.dispatch import build_parser

        return build_parser
    if name == "_note_engine_version":
        from attnfuzz.harness.cli.repro import note_engine_version

        return note_engine_version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DURATION_HELP",
    "MESSAGE_LIMIT",
    "PATH_LIMIT",
    "build_parser",
    "main",
    "non_negative_int",
    "one_line",
    "parse_duration",
    "positive_int",
    "seconds",
]
