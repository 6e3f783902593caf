"""The ``attnfuzz`` command: one module per subcommand, :mod:`.args` for what they share.

Exit status: 0 no failure, 1 a failure was found (or replays), 2 usage error,
3 a campaign judged nothing of some run, 141 stdout closed early (see
:mod:`attnfuzz.harness.definitions`).
"""

from __future__ import annotations

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
from attnfuzz.harness.cli.main import build_parser, main
from attnfuzz.harness.cli.repro import note_engine_version as _note_engine_version  # noqa: F401

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
