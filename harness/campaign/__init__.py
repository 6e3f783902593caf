"""Campaigns: many targets and implementations, a budget, N workers, one report.

``attnfuzz campaign`` plans *work units* (target x implementation x shard),
runs them as the items of a pytest run shared among N pytest-xdist workers
(:mod:`attnfuzz.harness.campaign.plugin`), watches their progress on disk,
and writes ``<out>/campaign.json``, one case file per distinct finding under
``<out>/cases/`` and, when :mod:`attnfuzz.reports` provides
``write_reports``, the reports next to them.

- **Budget.** ``--budget`` is wall clock from the start of the campaign,
  worker start-up included. Hypothesis has no wall-clock limit: each unit ends
  its Hypothesis run at its deadline (:mod:`attnfuzz.harness.campaign.worker`),
  and workers still busy a few seconds after it are stopped. ``--max-examples N``
  gives each target x implementation N generated examples (shrinking comes on
  top, as in ``attnfuzz run``); with both, whichever ends first.
- **Workers.** N worker processes share the work and the example database.
  When there are fewer units than workers, each is split into shards with
  their own seeds, so every worker is busy. Mutants go first, and a mutant's
  shard ends once it is caught: the time it leaves goes to the units after it.
- **Database.** Hypothesis' directory database (default ``.attnfuzz/db``):
  failures found once are replayed first in the next campaign.
  ``redis://HOST:PORT`` is Hypothesis' Redis database, shared by campaigns on
  several machines. Derandomized campaigns (``--profile ci`` or ``--seed``)
  neither read nor write it.
- **Fault isolation.** An implementation that raises, hangs past the
  per-example timeout or kills its process is a finding with its case; xdist
  replaces a dead worker and the campaign goes on. Ctrl-C or SIGTERM stops
  the workers and still writes what ran.
- **Traces.** An implementation that lives across steps
  (``Implementation.traced``), or every one with ``--trace``, is searched with
  traces of one engine's steps, each judged in a new child of the worker
  (:meth:`~attnfuzz.harness.isolation.IsolatedJudge.judge_trace`); its run
  says ``traced``, its examples count traces, and a finding's case is the
  minimized trace with the ``step`` it fails at (a trace case file).
- **Deduplication.** One finding per target, implementation and
  :attr:`~attnfuzz.harness.oracle.Verdict.key` (the first failing check, or the
  exception type), with the smallest case seen; the case file is the format of
  :mod:`attnfuzz.harness.casefile` (replay: ``attnfuzz repro``).

``runs[].seconds`` is the worker time spent on the run (its shards' times
added), so ``examples_per_second`` is per worker and compares across worker
counts.

The workers' files live in ``<out>/.work`` while the campaign runs (removed
after it; kept as ``<out>/.work-kept``, replacing the previous campaign's, when
something went wrong or ``ATTNFUZZ_KEEP_WORK`` is set); one left by a campaign
that never finished (killed) is moved aside to ``.work-unfinished-*``, not deleted.

The package's modules, in the order a campaign uses them: :mod:`.options`
(what is asked), :mod:`.plan` (runs and work items), :mod:`.run` (checks, then
the locked ``--out`` of :mod:`.outdir`), :mod:`.supervise` (the workers' pytest
run), :mod:`.collect` (their files), :mod:`.progress` (the console) and
:mod:`.results` (case files, ``campaign.json``, exit status). The worker side:
:mod:`.plugin` (the workers' pytest plugin), :mod:`.worker` (one work unit),
:mod:`.budget` (its share of the budget) and :mod:`.timing` (where the time
went); :mod:`.document` builds ``campaign.json``. The command line is
:mod:`attnfuzz.harness.cli.campaign`.

Exit status, in this order: ``2`` usage error; ``1`` a finding on an
implementation that must pass (fixed, reference, user), or results that
could not all be written; ``4`` a run attnfuzz's own code failed on
(``error``: an adapter's glue, a stand-in, the harness; no verdict on it);
``130`` (Ctrl-C) or ``143`` (SIGTERM) interrupted,
the report covers what ran; ``1`` a mutant survived (no finding in at least
its floor of examples, ``--min-examples``); ``3`` a run has no verdict: it
judged no example (``not run``) or found nothing in fewer examples than its
floor (``INCOMPLETE``: its budget, its worker lost), so the campaign says
nothing of it; ``0`` otherwise.
"""

from __future__ import annotations

from attnfuzz.harness.campaign.collect import Replays, Snapshot, collect
from attnfuzz.harness.campaign.options import Options
from attnfuzz.harness.campaign.outdir import LOCK_FILE, PREVIOUS, RESULTS, keep_previous, lock_out
from attnfuzz.harness.campaign.plan import Unit, plan_items, plan_units, shards_per_unit
from attnfuzz.harness.campaign.progress import LineProgress, LiveProgress
from attnfuzz.harness.campaign.results import exit_status, verdict_word
from attnfuzz.harness.campaign.run import run_campaign
from attnfuzz.harness.definitions import PROFILE_ENV

__all__ = [
    "LOCK_FILE",
    "PREVIOUS",
    "PROFILE_ENV",
    "RESULTS",
    "LineProgress",
    "LiveProgress",
    "Options",
    "Replays",
    "Snapshot",
    "Unit",
    "collect",
    "exit_status",
    "keep_previous",
    "lock_out",
    "plan_items",
    "plan_units",
    "run_campaign",
    "shards_per_unit",
    "verdict_word",
]
