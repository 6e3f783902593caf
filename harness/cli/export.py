"""``attnfuzz export``: a case file as a standalone pytest file."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from attnfuzz.harness.cli.args import PATH_LIMIT, one_line
from attnfuzz.harness.definitions import DEFAULT_REGRESSIONS, EXIT_OK

HELP = "write a case file as a standalone pytest file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("case", type=Path)
    p.add_argument(
        "-o",
        "--out",
        type=Path,
        default=DEFAULT_REGRESSIONS,
        help="a directory or a FILE.py (default: tests/regressions of the current directory)",
    )
    p.add_argument("--impl", default=None, help="the implementation the test judges")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness.export import export_case

    path = export_case(args.case, args.out, args.impl)
    print(one_line(f"wrote {path}", PATH_LIMIT))
    # The interpreter that has attnfuzz, whatever ``pytest`` on the PATH is.
    command = f"{shlex.quote(sys.executable)} -m pytest {shlex.quote(str(path))}"
    print(one_line(f"run: {command}", PATH_LIMIT))
    return EXIT_OK
