"""``attnfuzz campaign``: its command line (the campaign is :mod:`attnfuzz.harness.campaign`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from attnfuzz.harness.cli.args import (
    DURATION_HELP,
    add_mutants_argument,
    add_scale_argument,
    names,
    non_negative_int,
    parse_duration,
    positive_int,
    workers,
)
from attnfuzz.harness.definitions import (
    DEFAULT_DB,
    DEFAULT_MIN_EXAMPLES,
    DEFAULT_OUT,
    PROFILE_ENV,
    PROFILE_NAMES,
)

if TYPE_CHECKING:  # the campaign package loads what it runs: imported when it runs
    from attnfuzz.harness.campaign.options import Options

HELP = "targets x implementations within a budget, N workers"
# [tool.attnfuzz] key -> this command's option (its dest): the project's defaults
CONFIG = {
    "db": "db",
    "out": "out",
    "budget": "budget",
    "max_examples": "max_examples",
    "min_examples": "min_examples",
    "profile": "profile",
    "targets": "targets",
    "mutants": "mutants",
    "scale": "scale",
    "workers": "workers",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Fuzz targets x implementations within a wall-clock budget on N workers; write "
        "campaign.json, one case file per distinct finding, and the reports."
    )
    p.epilog = (
        "exit status: 2 usage error; 1 a finding on a fixed, reference or user implementation, "
        "or results not all written; 4 attnfuzz's own code failed on a run (ERROR: no verdict "
        "on it); 130/143 interrupted (SIGINT/SIGTERM); 1 a mutant "
        "survived; 3 a run found nothing short of its floor (--min-examples): INCOMPLETE; "
        "0 otherwise"
    )
    p.add_argument("--targets", nargs="+", metavar="TARGET", help="default: every target")
    p.add_argument(
        "--impls",
        nargs="+",
        metavar="IMPL",
        help="registered names or module:attribute (default: each target's fixed one, triton)",
    )
    p.add_argument("--zoo", action="store_true", help="add every mutant of the targets")
    p.add_argument(
        "--trace",
        action="store_true",
        help="fuzz every selected implementation with traces: each example is one engine's "
        "life over several steps, judged in a new process (an implementation that lives "
        "across steps always is)",
    )
    add_mutants_argument(p)
    p.add_argument(
        "--budget",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help=f"wall clock from the start, worker start-up included ({DURATION_HELP})",
    )
    p.add_argument("--max-examples", type=positive_int, default=None, help="per implementation")
    p.add_argument(
        "--min-examples",
        type=non_negative_int,
        default=DEFAULT_MIN_EXAMPLES,
        metavar="N",
        help="the floor: a run that found nothing passes (a mutant survives) only after N "
        f"examples, at most --max-examples; else it is INCOMPLETE (default {DEFAULT_MIN_EXAMPLES})",
    )
    p.add_argument(
        "-n",
        "--workers",
        type=workers,
        default=1,
        help="worker processes, or auto: one per core (more than the cores are capped)",
    )
    p.add_argument(
        "--db",
        default=str(DEFAULT_DB),
        help="a directory, redis://HOST:PORT, or DIR+github:OWNER/REPO[/ARTIFACT]",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    p.add_argument("--seed", type=non_negative_int, default=None, help="derandomized campaign")
    p.add_argument(
        "--profile",
        choices=sorted(PROFILE_NAMES),
        default=None,
        help=f"Hypothesis settings profile (default: ${PROFILE_ENV}, else dev)",
    )
    p.add_argument(
        "--example-timeout",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help=f"per example (default: the profile's; {DURATION_HELP})",
    )
    add_scale_argument(p)
    p.add_argument("--device", default=None, help="cpu or cuda (default: where kernels run)")
    p.add_argument("--quiet", action="store_true", help="plain lines: findings and the summary")


def options_from_args(args: argparse.Namespace) -> Options:
    """The campaign's :class:`Options` from its parsed command line."""
    from attnfuzz.harness.campaign.options import Options

    return Options(
        targets=names(args.targets),
        impls=names(args.impls),
        zoo=args.zoo,
        trace=args.trace,
        budget_s=args.budget,
        max_examples=args.max_examples,
        min_examples=args.min_examples,
        workers=args.workers,
        database=args.db,
        out=args.out,
        seed=args.seed,
        profile=args.profile,
        example_timeout_s=args.example_timeout,
        scale=args.scale,
        device=args.device,
        quiet=args.quiet,
        mutants=list(args.mutants or []),
    )


def command(args: argparse.Namespace) -> int:
    """``attnfuzz campaign``: see :mod:`attnfuzz.harness.campaign` for the exit status."""
    from attnfuzz.harness.campaign import run_campaign

    _, code = run_campaign(options_from_args(args))
    return code
