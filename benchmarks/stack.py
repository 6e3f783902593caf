"""One search started at many depths, judged on a frame stack of its own and straight.

    python benchmarks/stack.py [--target indexer-decode] [--impl triton] [--examples 20]
                               [--depths 0 200 2] [--markdown docs/performance.md]

Each measurement is one derandomized search (``--examples`` generated cases or traces,
seed 0, no example database) started ``depth`` frames below the benchmark's own, on one
core; for each depth of ``range(*--depths)`` it runs twice, side by side: as attnfuzz
judges (``attnfuzz.harness.stack.on_own_stack``: every judgement's frames on a chunk of
CPython's frame stack of their own) and with that wrapper taken out (the judge called
from wherever its caller stands). CPython 3.11 and 3.12 map a chunk of 16 KiB when a
call finds no room left in the current one and unmap it when the call returns, so a hot
loop that happens to sit at a chunk's end maps one per call; which depth does that
depends on the caller (pytest, Hypothesis, a campaign), and the depths swept here span
more than a chunk. Printed, per way: the median and the slowest search, at which depth,
and the most system time and minor page faults a search took. ``--markdown FILE``
rewrites the section ``stack:depths`` of FILE.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from _common import median, pin_one_core, table
from _markdown import command_line, write_section
from attnfuzz.harness import target as target_module
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.stack import on_own_stack


def _straight(fn, *args, **kwargs):  # noqa: ANN001, ANN202
    return fn(*args, **kwargs)


def _at_depth(depth: int, fn):  # noqa: ANN001, ANN202
    return fn() if depth == 0 else _at_depth(depth - 1, fn)


def search(target: str, impl: str, examples: int) -> int:
    t = get_target(target)
    i = t.resolve(impl)
    result = fuzz(t, i, max_examples=examples, rng_seed=0, database=None, traced=i.traced)
    assert not result.failed, f"{target}/{impl} failed: {result.verdict}"
    return result.examples


def measure(args: argparse.Namespace, depth: int) -> tuple[float, float, int]:
    """Wall seconds, system seconds and minor page faults of one search at ``depth``."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    _at_depth(depth, lambda: search(args.target, args.impl, args.examples))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    return wall, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="indexer-decode")
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--depths", type=int, nargs=3, default=[0, 200, 2], metavar="N")
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    where = pin_one_core()
    python = ".".join(map(str, sys.version_info[:3]))
    title = (
        f"{args.target} / {args.impl}, {args.examples} examples a search, depths "
        f"range({', '.join(map(str, args.depths))}), {where}, CPython {python}"
    )
    print(title)
    search(args.target, args.impl, args.examples)  # imports and caches, before any timing
    ways = {"own stack (attnfuzz)": on_own_stack, "straight": _straight}
    runs: dict[str, list[tuple[int, float, float, int]]] = {way: [] for way in ways}
    for depth in range(*args.depths):
        for way, call in ways.items():
            target_module.on_own_stack = call
            try:
                runs[way].append((depth, *measure(args, depth)))
            finally:
                target_module.on_own_stack = on_own_stack
    rows = []
    for way, measured in runs.items():
        slowest = max(measured, key=lambda m: m[1])
        rows.append(
            [
                way,
                f"{median([m[1] for m in measured]):.2f}",
                f"{slowest[1]:.2f}",
                slowest[0],
                f"{max(m[2] for m in measured):.2f}",
                max(m[3] for m in measured),
            ]
        )
    header = ["judged", "median s", "slowest s", "at depth", "most system s", "most faults"]
    text = table(header, rows)
    print(text)
    if args.markdown is not None:
        command = command_line("stack", sys.argv[1:])
        write_section(args.markdown, "stack", "depths", [f"{title}: `{command}`.", "", text])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
