"""``run_campaign``: check and plan everything, then run it with ``--out`` locked."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from attnfuzz.harness.campaign.options import Options
from attnfuzz.harness.campaign.outdir import keep_previous, lock_out, release_out
from attnfuzz.harness.campaign.plan import import_root, plan_items, plan_units
from attnfuzz.harness.campaign.supervise import run_locked
from attnfuzz.harness.database import check_database, database_spec
from attnfuzz.harness.definitions import PROFILE_ENV
from attnfuzz.harness.devices import check_device
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.storage import prepare_out


def run_campaign(options: Options, stream: TextIO | None = None) -> tuple[dict[str, Any], int]:
    """Run a campaign; returns campaign.json's contents and the exit status.

    Usage errors raise :class:`UsageError` before anything runs.
    """
    from attnfuzz.harness.settings import PROFILES

    started = time.time()
    stream = stream or sys.stdout
    profile_name = options.profile or os.environ.get(PROFILE_ENV) or "dev"
    if profile_name not in PROFILES:
        source = "--profile" if options.profile else f"${PROFILE_ENV}"
        raise UsageError(
            f"unknown profile {profile_name!r} (from {source}; known: {', '.join(PROFILES)})"
        )
    profile = PROFILES[profile_name]
    derandomized = profile.derandomized or options.seed is not None
    seed = options.seed if options.seed is not None else (0 if derandomized else None)
    budget = options.budget_s
    # No budget asked for: the profile's is a target, not a limit. Every run first
    # judges its example floor, however long that takes on this machine (the
    # verdict must not depend on its speed), then the rest of the budget is spent.
    soft = budget is None and options.max_examples is None
    if soft:
        budget = profile.budget_s
    timeout = options.example_timeout_s or profile.example_timeout_s
    options.device = check_device(options.device)  # one line and exit 2, before any work
    workers = cap_workers(options.workers, stream)
    # Paths are checked and made absolute before any user code runs (it may
    # change directory); the database must answer before any worker starts.
    out = prepare_out(options.out, create=False)
    database = None
    if not derandomized:
        database = database_spec(options.database)
        check_database(database)
    from attnfuzz.harness.registry import add_mutants

    added = [pair for spec in options.mutants for pair in add_mutants(spec)]
    units = plan_units(
        options.targets, options.impls, options.zoo, mutants=added, trace=options.trace
    )
    if options.zoo:
        note_unavailable_mutants(options.targets, stream)
    user_modules = [u.impl for u in units if ":" in u.impl] + list(options.mutants)
    roots = [r for spec in user_modules if (r := import_root(spec.split(":")[0]))]
    plan = {
        "started": started,
        "budget": budget,
        "deadline": started + budget if budget is not None else None,
        "deadline_soft": soft,  # the floor comes first (see budget.share_spent)
        "workers": workers,
        "profile": profile.name,
        "derandomized": derandomized,
        "seed": seed,
        "database": database,
        "scale": options.scale,
        "device": options.device,
        "example_timeout": timeout,
        "items": plan_items(units, workers, options.max_examples),
        "min_examples": options.min_examples,  # read by collect: a run's verdict
        "mutants": list(options.mutants),  # the workers register them too
    }
    out.mkdir(parents=True, exist_ok=True)  # no usage error left: now it may be made
    lock = lock_out(out, stream)  # one campaign at a time in one --out
    try:
        keep_previous(out, stream)
        return run_locked(options, stream, plan, units, roots, out)
    finally:
        release_out(out, lock)


def note_unavailable_mutants(targets: list[str] | None, stream: TextIO) -> None:
    """One line per reason the zoo leaves mutants out (an engine that is not installed)."""
    from attnfuzz.harness.registry import unavailable_mutants

    for reason, names in unavailable_mutants(targets).items():
        print(f"zoo: {len(names)} mutant(s) left out ({reason})", file=stream)


def cap_workers(asked: int, stream: TextIO) -> int:
    """At most one worker per core: each loads torch and judges on one core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if asked > cores:
        print(
            f"asked for {asked} workers; using {cores}, one per core of this machine", file=stream
        )
        return cores
    return asked
