"""Examples per second per target and implementation, and where the time goes.

    python benchmarks/throughput.py [--examples 300] [--target T ...] [--impl I ...]

One CPU core, derandomized, default (small) sizes, after a warm-up run that
compiles. Time is split into generation (Hypothesis: drawing, bookkeeping),
inputs (tensors from the seed), reference, implementation and oracle, in
milliseconds per example. The bar: ``triton`` >= 20 examples/s on every target.
"""

from __future__ import annotations

import argparse

from _common import pin_one_core, table
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.runner import fuzz

BAR = 20.0
PHASES = ["generation", "inputs", "reference", "implementation", "oracle"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--target", action="append", default=None)
    parser.add_argument("--impl", action="append", default=None)
    args = parser.parse_args()
    where = pin_one_core()

    rows, ok = [], True
    for name in args.target or target_names():
        target = get_target(name)
        for impl_name in args.impl or ["triton", "reference"]:
            impl = target.resolve(impl_name)
            fuzz(target, impl, max_examples=5, rng_seed=1, database=None)  # warm up
            r = fuzz(target, impl, max_examples=args.examples, rng_seed=0, database=None)
            ms = {k: 1000 * v / max(r.examples, 1) for k, v in r.time_breakdown().items()}
            rate = r.examples_per_second
            passed = not r.failed and (impl_name != "triton" or rate >= BAR)
            ok &= passed
            rows.append(
                [name, impl_name, r.examples, f"{rate:.1f}"]
                + [f"{ms.get(p, 0.0):.1f}" for p in PHASES]
                + ["FAIL" if r.failed else ("yes" if passed else "NO")]
            )
    print(f"Throughput ({where}; ms per example by phase; bar: triton >= {BAR:.0f}/s)\n")
    print(table(["target", "impl", "examples", "ex/s", *PHASES, "ok"], rows))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
