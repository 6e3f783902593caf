"""``attnfuzz zoo``: every mutant of every target, the detection scoreboard."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnfuzz.harness.cli.args import (
    DURATION_HELP,
    add_device_argument,
    add_mutants_argument,
    add_scale_argument,
    non_negative_int,
    parse_duration,
    positive_int,
)
from attnfuzz.harness.definitions import DEFAULT_MIN_EXAMPLES, DEFAULT_ZOO_OUT

HELP = "every mutant of every target: the detection scoreboard"
CHECKS_DEVICE = True
# see cli.campaign; max_examples is not the zoo's: it would drop the zoo's time budget
CONFIG = {
    "targets": "targets",
    "mutants": "mutants",
    "scale": "scale",
    "min_examples": "min_examples",
}
DEFAULT_BUDGET_S = 10.0  # without --max-examples


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Search every mutant with S derandomized seeds; print and write the scoreboard. "
        "exit status: 1 a mutant survived (a seed searched the floor and missed it); "
        "3 a mutant incomplete (a seed's budget ended short of the floor, none survived); "
        "2 usage error; 0 every mutant killed."
    )
    p.add_argument("--targets", nargs="+", default=None, help="default: every target")
    p.add_argument("--seeds", type=positive_int, default=5, help="derandomized runs per mutant")
    p.add_argument(
        "--budget",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help=f"search per mutant and seed ({DURATION_HELP}; default 10s; with "
        "--max-examples none, unless given: a safety net)",
    )
    p.add_argument(
        "--max-examples",
        type=positive_int,
        default=None,
        metavar="N",
        help="examples per mutant and seed: with no --budget every seed judges exactly N "
        "(fewer when detected), so two runs print the same scoreboard",
    )
    p.add_argument(
        "--min-examples",
        type=non_negative_int,
        default=DEFAULT_MIN_EXAMPLES,
        metavar="N",
        help="the floor: a seed that missed is 'survived' only after N examples (at most "
        "--max-examples); cut sooner by --budget it is INCOMPLETE "
        f"(default {DEFAULT_MIN_EXAMPLES})",
    )
    p.add_argument(
        "--shrink-budget",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help=f"shrinking per run ({DURATION_HELP}; default 60s)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_ZOO_OUT)
    add_mutants_argument(p)
    add_scale_argument(p)
    add_device_argument(p)


def command(args: argparse.Namespace) -> int:
    """``attnfuzz zoo``: the scoreboard of the attnfuzz arm; exit 1 if a mutant survives,
    else 3 if one is incomplete."""
    from attnfuzz.harness import registry
    from attnfuzz.harness.cli.run import Signals
    from attnfuzz.harness.errors import UsageError
    from attnfuzz.harness.storage import private_hypothesis_home
    from attnfuzz.harness.zoo import (
        MutantScore,
        ZooInterrupted,
        exit_status,
        run_zoo,
        scoreboard,
        verdict_lines,
        write_reports,
    )
    from attnfuzz.harness.zoo.report import LEGEND
    from attnfuzz.kernels._triton import device as kernel_device
    from attnfuzz.strategies.batches import SCALES

    private_hypothesis_home()  # nothing written outside --out (Hypothesis' constants cache)
    for name in ("budget", "shrink_budget"):
        value = getattr(args, name)
        if value is not None and not value > 0:  # also refuses NaN
            raise UsageError(f"--{name.replace('_', '-')} must be > 0 seconds")
    # Counted in examples (--max-examples), a seed has no time budget unless asked for one.
    budget = args.budget if args.budget is not None or args.max_examples else DEFAULT_BUDGET_S
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
        print(f"{score.target} / {score.mutant}: {score.found}/{runs} seeds, {score.status_text()}")

    interrupted = False
    with Signals() as signals:  # SIGTERM ends the zoo as Ctrl-C does
        try:
            scores = run_zoo(
                names, seeds=args.seeds, budget_s=budget, shrink_budget_s=args.shrink_budget,
                max_examples=args.max_examples, min_examples=args.min_examples,
                scale=SCALES[args.scale], device=device, progress=progress,
                stop_requested=signals.received,
            )  # fmt: skip
        except ZooInterrupted as stop:  # what ran is written, marked; never a survivor
            scores, interrupted = stop.scores, True
    json_path, md_path = write_reports(
        scores, args.out, seeds=args.seeds, budget_s=budget, device=device,
        max_examples=args.max_examples, min_examples=args.min_examples, interrupted=interrupted,
    )  # fmt: skip
    print()
    print(scoreboard(scores, times=args.max_examples is None))
    print(LEGEND)
    print(f"\nwritten to {json_path} and {md_path}")
    for line in verdict_lines(scores):
        print(line)
    if interrupted:
        print(f"INTERRUPTED after {len(scores)} mutant(s): the rest never ran")
        return 128 + signals.signum
    return exit_status(scores)
