"""The bug zoo's scoreboard, as ``attnfuzz zoo`` prints it, for the docs.

    python benchmarks/zoo.py [--seeds 3] [--max-examples N] [--targets T ...]
                             [--markdown docs/zoo.md]

Runs ``attnfuzz zoo --seeds S`` (every mutant that can run here: the upstream
ones only where vLLM is installed) in a scratch directory and prints its
``zoo.md``. ``--markdown FILE`` rewrites the section ``zoo:scoreboard`` of FILE
with the scoreboard, the command and the installed engine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from _markdown import command_line, write_section


def engine() -> str:
    try:
        return f"vLLM {importlib.metadata.version('vllm')} installed"
    except importlib.metadata.PackageNotFoundError:
        return "vLLM not installed (no upstream mutants)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--targets", nargs="+", default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "attnfuzz", "zoo", "--seeds", str(args.seeds)]
        if args.max_examples is not None:
            command += ["--max-examples", str(args.max_examples)]
        if args.targets:
            command += ["--targets", *args.targets]
        code = subprocess.call([*command, "--out", tmp], stdout=sys.stderr)
        report = (Path(tmp) / "zoo.md").read_text()
    print(report)
    if args.markdown is not None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        where = f"{cores} cores of {platform.processor() or platform.machine()}, {engine()}"
        board = [line for line in report.splitlines() if line.startswith("|")]
        lines = [f"`{command_line('zoo', sys.argv[1:])}` ({where}, exit {code}):", "", *board]
        write_section(args.markdown, "zoo", "scoreboard", lines)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
