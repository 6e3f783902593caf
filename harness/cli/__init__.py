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

    A command that reads targets loads torch and Triton first and more as it goes
    (seconds on a loaded machine); ``--help``, the parser, and ``list`` and ``describe``
    of attnfuzz's own targets (:mod:`attnfuzz.harness.catalogue`) load neither. Until a
    command installs its own handling of SIGINT and SIGTERM (``run``, ``campaign``
    and ``zoo`` do, before any verdict exists), either signal ends it at once with
    exit status 128 + the signal: never a traceback, nor a ``KeyboardInterrupt``
    raised inside an import (a C extension's aborts the process; one caught there
    leaves a module half-loaded).
    """
    with _quiet_until_handled():
        from attnfuzz.harness.cli.dispatch import main as run_command

        return run_command(argv)


class _quiet_until_handled:  # noqa: N801 - a context manager, named for where it is used
    def __enter__(self) -> None:
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self.previous[signum] = signal.signal(signum, _quit)

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _quit(signum: int, frame: object) -> None:
    # No verdict rests on what is cut short: the commands that judge (run, campaign,
    # zoo) handle the signals themselves before their first example. An exception
    # raised here could land inside an import and leave a module half-loaded.
    os._exit(128 + signum)


def __getattr__(name: str) -> Any:
    # Loaded when first asked for: the parser (every command's module, none of them torch)
    # and the repro helper.
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
