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
    p.add_argument(
        "--standalone",
        action="store_true",
        help="write instead a script that imports only the engine and torch and shows the "
        "engine's wrong value (engine findings that declare one; -o: a FILE.py or a "
        "directory, default the current one)",
    )


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness.export import export_case

    if args.standalone:
        return _standalone(args)
    path = export_case(args.case, args.out, args.impl)
    print(one_line(f"wrote {path}", PATH_LIMIT))
    # The interpreter that has attnfuzz, whatever ``pytest`` on the PATH is.
    command = f"{shlex.quote(sys.executable)} -m pytest {shlex.quote(str(path))}"
    print(one_line(f"run: {command}", PATH_LIMIT))
    return EXIT_OK


def _standalone(args: argparse.Namespace) -> int:
    from attnfuzz.harness.standalone import export_standalone

    # -o's default is the pytest directory; a script goes to the current one.
    out = None if args.out == DEFAULT_REGRESSIONS else args.out
    path = export_standalone(args.case, out, args.impl)
    print(one_line(f"wrote {path}", PATH_LIMIT))
    print(one_line(f"run: python {shlex.quote(str(path))}", PATH_LIMIT))
    return EXIT_OK
