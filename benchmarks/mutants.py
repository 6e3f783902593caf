"""Time to detection of every mutant: median and worst over seeds, one CPU core.

    python benchmarks/mutants.py [--seeds 10] [--max-examples 2000] [--target T ...]
                                 [--markdown docs/performance.md]

Each seed is a derandomized search with no example database (of traces, for a
mutant that lives across steps), timed from the first example to the first
failing one (shrinking is not counted; it runs after detection and only makes
the reported case smaller); ``most examples`` is the most any found seed took
(a seed that misses is counted in ``found``). The bar: every mutant found in
every seed, median <= 5 s. ``--markdown FILE`` rewrites the
section ``mutants:detection`` of FILE with the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import median, pin_one_core, table
from _markdown import command_line, write_section
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.runner import fuzz

BAR_SECONDS = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--max-examples", type=int, default=2000)
    parser.add_argument("--target", action="append", default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    where = pin_one_core()

    rows, ok = [], True
    for name in args.target or target_names():
        target = get_target(name)
        triton = target.resolve("triton")
        fuzz(target, triton, max_examples=3, rng_seed=0, database=None)  # compile/warm up
        for mutant in target.mutants:
            seconds, examples = [], []
            for s in range(args.seeds):
                # A mutant that lives across steps is searched with traces, as attnfuzz
                # run and the zoo search it (its single steps each pass).
                r = fuzz(
                    target, mutant, max_examples=args.max_examples, rng_seed=s,
                    database=None, shrink=False, traced=mutant.traced,
                )  # fmt: skip
                if r.failed:
                    seconds.append(r.seconds_to_failure)
                    examples.append(r.examples_to_failure)
            found = len(seconds)
            med = median(seconds)
            passed = found == args.seeds and med <= BAR_SECONDS
            ok &= passed
            rows.append([
                name, mutant.name, f"{found}/{args.seeds}", f"{med:.2f}",
                f"{max(seconds, default=float('nan')):.2f}",
                f"{median(examples):.0f}", f"{max(examples, default=0)}",
                "yes" if passed else "NO",
            ])  # fmt: skip
    title = f"Mutant time to detection ({where}; bar: all seeds, median <= {BAR_SECONDS:.0f} s)"
    text = table(
        ["target", "mutant", "found", "median s", "worst s", "median examples", "most examples",
         "bar"], rows
    )  # fmt: skip
    print(f"{title}\n\n{text}")
    if args.markdown is not None:
        command = command_line("mutants", sys.argv[1:])
        lines = [f"{title}: `{command}`.", "", *text.splitlines()]
        write_section(args.markdown, "mutants", "detection", lines)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
