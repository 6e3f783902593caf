"""Campaign scaling: examples done by 1 and by 2 workers in the same wall-clock budget.

    python benchmarks/scaling.py [--budget 60] [--target indexer-decode] [--impl triton]
                                 [--workers 1 2] [--repeat 1] [--markdown docs/performance.md]

Each row is one whole ``attnfuzz campaign`` (derandomized ``ci`` profile, no
example database), timed as a user sees it: worker start-up is inside the
budget. With one target x implementation and N workers the unit is split into
N shards, so every worker has work. The bar, on a 2-core machine: 2 workers do
at least 1.7x the examples of 1. The load average is printed with each row:
other work on the machine takes cores from the workers. ``--markdown FILE``
rewrites the section ``scaling:workers`` of FILE with the table and the ratio.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

from _common import median, table
from _markdown import command_line, write_section
from attnfuzz.harness.campaign import Options, run_campaign

BAR = 1.7


def campaign(target: str, impl: str, budget: float, workers: int, out: Path) -> dict:
    options = Options(
        targets=[target],
        impls=[impl],
        budget_s=budget,
        workers=workers,
        out=out,
        profile="ci",
        quiet=True,
    )
    with open(os.devnull, "w") as sink:
        doc, _ = run_campaign(options, stream=sink)
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per campaign")
    parser.add_argument("--target", default="indexer-decode")
    parser.add_argument("--impl", default="triton")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    title = (
        f"{args.target} / {args.impl}, budget {args.budget:g}s, "
        f"{cores} cores of {platform.processor() or platform.machine()}"
    )
    print(title)

    examples: dict[int, list[int]] = {}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeat):
            for n in args.workers:
                load = os.getloadavg()[0]
                doc = campaign(args.target, args.impl, args.budget, n, Path(tmp) / f"{r}-{n}")
                (run,) = doc["runs"]
                examples.setdefault(n, []).append(run["examples"])
                rows.append(
                    [
                        n,
                        run["examples"],
                        f"{run['examples'] / doc['seconds']:.1f}",
                        f"{run['examples_per_second']:.1f}",
                        f"{doc['seconds']:.1f}",
                        f"{load:.2f}",
                    ]
                )
    header = ["workers", "examples", "ex/s (wall)", "ex/s per worker", "wall s", "load before"]
    text = table(header, rows)
    print(text)
    base = median(examples.get(1, []))
    ok, verdicts = True, []
    for n in args.workers:
        if n == 1 or not base:
            continue
        ratio = median(examples[n]) / base
        verdicts.append(f"{n} workers / 1 worker: {ratio:.2f}x examples in the same budget")
        if n == 2:
            ok = ratio >= BAR
            verdicts.append(f"bar (2 workers >= {BAR}x): {'met' if ok else 'NOT met'}")
    print("\n".join(verdicts))
    if args.markdown is not None:
        command = command_line("scaling", sys.argv[1:])
        lines = [f"{title}: `{command}`.", "", *text.splitlines(), ""]
        lines += [f"{line}." for line in verdicts]
        write_section(args.markdown, "scaling", "workers", lines)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
