"""``attnfuzz zoo``: every mutant of every target, the detection scoreboard."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnfuzz.harness.cli.args import (
    add_device_argument,
    add_mutants_argument,
    add_scale_argument,
    positive_int,
    seconds,
)
from attnfuzz.harness.definitions import DEFAULT_ZOO_OUT, EXIT_FOUND, EXIT_OK

HELP = "every mutant of every target: the detection scoreboard"
CHECKS_DEVICE = True
CONFIG = {"targets": "targets", "mutants": "mutants", "scale": "scale"}  # see cli.campaign


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--targets", nargs="+", default=None, help="default: every target")
    p.add_argument("--seeds", type=positive_int, default=5, help="derandomized runs per mutant")
    p.add_argument(
        "--budget",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="seconds of search per mutant and seed: a plain number, in seconds (default 10)",
    )
    p.add_argument(
        "--shrink-budget",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="seconds of shrinking per run: a plain number, in seconds (default 60)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_ZOO_OUT)
    add_mutants_argument(p)
    add_scale_argument(p)
    add_device_argument(p)


def command(args: argparse.Namespace) -> int:
    """``attnfuzz zoo``: the scoreboard of the attnfuzz arm; exit 1 if a mutant survives."""
    from attnfuzz.harness import registry
    from attnfuzz.harness.target import UsageError
    from attnfuzz.harness.zoo import MutantScore, run_zoo, scoreboard, survivors, write_reports
    from attnfuzz.kernels._triton import device as kernel_device
    from attnfuzz.strategies.batches import SCALES

    for name in ("budget", "shrink_budget"):
        if not getattr(args, name) > 0:  # also refuses NaN
            raise UsageError(f"--{name.replace('_', '-')} must be > 0 seconds")
    for spec in args.mutants or []:
        registry.add_mutants(spec)  # a UsageError before any run
    names = args.targets or registry.target_names()
    for name in names:
        # An unknown name, or an ATTNFUZZ_DTYPE the target cannot build in: before any run.
        registry.get_target(name).float_dtype_name()
    device = args.device or str(kernel_device())
    for reason, left in registry.unavailable_mutants(names).items():
        print(f"zoo: {len(left)} mutant(s) left out ({reason})")

    def progress(score: MutantScore) -> None:
        runs = len(score.runs)
        print(f"{score.target} / {score.mutant}: {score.found}/{runs} seeds, {score.status}")

    scores = run_zoo(
        names, seeds=args.seeds, budget_s=args.budget, shrink_budget_s=args.shrink_budget,
        scale=SCALES[args.scale], device=device, progress=progress,
    )  # fmt: skip
    json_path, md_path = write_reports(
        scores, args.out, seeds=args.seeds, budget_s=args.budget, device=device
    )
    print()
    print(scoreboard(scores))
    print(f"\nwritten to {json_path} and {md_path}")
    lost = survivors(scores)
    if lost:
        print(
            "SURVIVED: "
            + ", ".join(f"{s.target}/{s.mutant} ({s.found}/{len(s.runs)})" for s in lost)
        )
        return EXIT_FOUND
    print(f"every mutant killed in every seed ({len(scores)} mutants)")
    return EXIT_OK
