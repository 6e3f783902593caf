"""Campaigns: many targets and implementations, a budget, N workers, one report.

``attnfuzz campaign`` plans *work units* (target x implementation x shard),
runs them as the items of a pytest run shared among N pytest-xdist workers
(:mod:`attnfuzz.harness.campaign_plugin`), watches their progress on disk,
and writes ``<out>/campaign.json``, one case file per distinct finding under
``<out>/cases/`` and, when :mod:`attnfuzz.reports` provides
``write_reports``, the reports next to them.

- **Budget.** ``--budget`` is wall clock from the start of the campaign,
  worker start-up included. Hypothesis has no wall-clock limit: each unit ends
  its Hypothesis run at its deadline (:mod:`attnfuzz.harness.campaign_worker`),
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
- **Deduplication.** One finding per target, implementation and
  :attr:`~attnfuzz.harness.oracle.Verdict.key` (the first failing check, or the
  exception type), with the smallest case seen; the case file is the format of
  :mod:`attnfuzz.harness.casefile` (replay: ``attnfuzz repro``).

``runs[].seconds`` is the worker time spent on the run (its shards' times
added), so ``examples_per_second`` is per worker and compares across worker
counts.

The workers' files live in ``<out>/.work`` while the campaign runs (removed
after it, kept when something went wrong or ``ATTNFUZZ_KEEP_WORK`` is set);
one left by a campaign that never finished is moved aside, not deleted.

Exit status, in this order: ``2`` usage error; ``1`` a finding on an
implementation that must pass (fixed, reference, user) or a run that could
not go on (``error``); ``130`` (Ctrl-C) or ``143`` (SIGTERM) interrupted,
the report covers what ran; ``1`` a mutant survived (no finding); ``3`` a
run judged no example at all (``not run``: the budget was too short for the
machine), so the campaign says nothing of it; ``0`` otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from attnfuzz.harness.cli import DURATION_HELP, non_negative_int, parse_duration, positive_int
from attnfuzz.harness.definitions import (
    CAMPAIGN_SCHEMA,
    DEFAULT_OUT,
    EXIT_FOUND,
    EXIT_INCOMPLETE,
    EXIT_OK,
    PROFILE_ENV,
    case_size,
    finding_id,
    merge_timelines,
    timestamp,
)
from attnfuzz.harness.definitions import DEFAULT_DB as _DEFAULT_DB
from attnfuzz.harness.devices import check_device
from attnfuzz.harness.storage import check_database, database_spec, prepare_out
from attnfuzz.harness.target import UsageError
from attnfuzz.reports.document import NOT_RUN, SURVIVED, run_verdict

DEFAULT_DB = str(_DEFAULT_DB)  # --db takes a directory or a URL: a string

# Workers end their units at the deadline by themselves (a call still running
# then is cut short, see IsolatedJudge.judge); these only bound a worker that does not.
STOP_GRACE_S = 1.0  # after the deadline, before the workers are told to stop
KILL_GRACE_S = 2.0  # after they were told, before they are killed
POLL_S = 0.25


# -- command line -------------------------------------------------------------


def _workers(text: str) -> int:
    if text == "auto":
        return (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of workers or auto, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1 worker, got {value}")
    return value


def _seconds(text: str) -> float:
    return parse_duration(text)


def _names(values: list[str] | None) -> list[str] | None:
    """``--targets a b`` and ``--targets a,b`` alike."""
    if values is None:
        return None
    return [name for value in values for name in value.split(",") if name]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from attnfuzz.harness.campaign_worker import PROFILES
    from attnfuzz.strategies.batches import SCALES

    p.description = (
        "Fuzz targets x implementations within a wall-clock budget on N workers; write "
        "campaign.json, one case file per distinct finding, and the reports."
    )
    p.epilog = (
        "exit status: 2 usage error; 1 a finding on a fixed, reference or user implementation, "
        "or a run that could not go on; 130/143 interrupted (SIGINT/SIGTERM); 1 a mutant "
        "survived; 0 otherwise"
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
        "--budget",
        type=_seconds,
        default=None,
        metavar="DURATION",
        help=f"wall clock from the start, worker start-up included ({DURATION_HELP})",
    )
    p.add_argument("--max-examples", type=positive_int, default=None, help="per implementation")
    p.add_argument(
        "-n",
        "--workers",
        type=_workers,
        default=1,
        help="worker processes, or auto: one per core (more than the cores are capped)",
    )
    p.add_argument("--db", default=DEFAULT_DB, help="a directory, or redis://HOST:PORT")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default: {DEFAULT_OUT}")
    p.add_argument("--seed", type=non_negative_int, default=None, help="derandomized campaign")
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default=None,
        help=f"Hypothesis settings profile (default: ${PROFILE_ENV}, else dev)",
    )
    p.add_argument(
        "--example-timeout",
        type=_seconds,
        default=None,
        metavar="DURATION",
        help=f"per example (default: the profile's; {DURATION_HELP})",
    )
    p.add_argument("--scale", choices=sorted(SCALES), default="small")
    p.add_argument("--device", default=None, help="cpu or cuda (default: where kernels run)")
    p.add_argument("--quiet", action="store_true", help="plain lines: findings and the summary")


def command(args: argparse.Namespace) -> int:
    """``attnfuzz campaign``: see the module docstring for the exit status."""
    options = Options.from_args(args)
    _, code = run_campaign(options)
    return code


# -- planning -----------------------------------------------------------------


@dataclass
class Options:
    targets: list[str] | None = None
    impls: list[str] | None = None
    zoo: bool = False
    budget_s: float | None = None
    max_examples: int | None = None
    workers: int = 1
    database: str = DEFAULT_DB
    out: Path = DEFAULT_OUT
    seed: int | None = None
    profile: str | None = None
    example_timeout_s: float | None = None
    scale: str = "small"
    device: str | None = None
    quiet: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Options:
        return cls(
            targets=_names(args.targets),
            impls=_names(args.impls),
            zoo=args.zoo,
            budget_s=args.budget,
            max_examples=args.max_examples,
            workers=args.workers,
            database=args.db,
            out=args.out,
            seed=args.seed,
            profile=args.profile,
            example_timeout_s=args.example_timeout,
            scale=args.scale,
            device=args.device,
            quiet=args.quiet,
        )


@dataclass(frozen=True)
class Unit:
    """One target x implementation of the campaign (a run of campaign.json)."""

    target: str
    impl: str
    kind: str


def plan_units(targets: list[str] | None, impls: list[str] | None, zoo: bool) -> list[Unit]:
    """Every selected target against every selected implementation it has.

    A registered name applies to the targets that have it (it must exist on
    one of them); ``module:attribute`` applies to every selected target.
    """
    from attnfuzz.harness.registry import get_target, target_names

    names = targets or target_names()
    for name in names:
        get_target(name)  # a one-line UsageError for an unknown name
    units: list[Unit] = []
    for spec in impls or []:
        if ":" in spec:
            continue
        if not any(spec in get_target(t).implementations for t in names):
            raise UsageError(f"no selected target has an implementation {spec!r}")
    for name in dict.fromkeys(names):
        target = get_target(name)
        chosen: list[str] = []
        if impls is None:
            chosen += [i.name for i in target.implementations.values() if i.kind == "fixed"]
        else:
            chosen += [s for s in impls if ":" in s or s in target.implementations]
        if zoo:
            chosen += [m.name for m in target.mutants]
        for spec in dict.fromkeys(chosen):
            impl = target.resolve(spec)  # imports a user's module: a UsageError if it cannot
            units.append(Unit(name, impl.name, impl.kind))
    if not units:
        raise UsageError("nothing to run: no selected target has a selected implementation")
    return units


def shards_per_unit(units: int, workers: int) -> int:
    """Enough shards that the items divide evenly among the workers."""
    return workers // math.gcd(units, workers)


def plan_items(units: list[Unit], workers: int, max_examples: int | None) -> list[dict[str, Any]]:
    """The work units of the pytest run, in the order they are handed out."""
    shards = shards_per_unit(len(units), workers)
    items = []
    # Mutants first: a caught mutant ends early, and the time it leaves goes
    # to the units after it (see campaign_worker.item_deadline).
    order = sorted(range(len(units)), key=lambda u: units[u].kind != "mutant")
    for u in order:
        unit = units[u]
        for s in range(shards):
            cap = None
            if max_examples is not None:  # split the unit's examples among its shards
                cap = max_examples // shards + (1 if s < max_examples % shards else 0)
            items.append(
                {
                    "id": f"u{u:03d}s{s:02d}",
                    "unit": u,
                    "shard": s,
                    "target": unit.target,
                    "impl": unit.impl,
                    "kind": unit.kind,
                    "max_examples": cap,
                }
            )
    return items


def _import_root(module_name: str) -> str | None:
    """The sys.path entry a user's module was imported from, for the workers."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve().parent
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return str(path.parents[depth - 1]) if depth else str(path)


# -- what the workers wrote ---------------------------------------------------


def _worker_fault(scratch: Path, item_id: str) -> str:
    """How a lost worker died, from its own fault log (a harness event, not a verdict)."""
    from attnfuzz.harness.isolation import describe_fault

    try:
        text = (scratch / "faults" / f"{item_id}.log").read_text(errors="replace")
    except OSError:
        text = ""
    fault = describe_fault(text)
    return fault[1] if fault else "killed without a Python fault report"


class Replays:
    """Cases a lost worker was judging, replayed once each in isolation.

    A worker is lost to what happens outside the implementation too (a
    SIGKILL, the machine's memory): its in-flight case is a finding only
    when it fails again, alone, in a fresh child.
    """

    def __init__(self, plan: dict[str, Any]):
        self.plan = plan
        self.verdicts: dict[str, Any] = {}

    def verdict(self, item_id: str, unit: Unit, case_dict: dict[str, Any]) -> Any:
        if item_id not in self.verdicts:
            from attnfuzz.harness.isolation import IsolatedJudge
            from attnfuzz.harness.registry import get_target
            from attnfuzz.reference.batch import Case

            target = get_target(unit.target)
            impl = target.resolve(unit.impl)
            timeout = self.plan["example_timeout"]
            with IsolatedJudge(target, impl, self.plan["device"], timeout) as judge:
                self.verdicts[item_id] = judge.judge(Case.from_dict(case_dict))
        return self.verdicts[item_id]


@dataclass
class Snapshot:
    """The campaign as its files say it is now."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # the harness's, not findings
    settled: int = 0  # work units that ended (done, error, interrupted, or died judging)


def collect(
    scratch: Path,
    plan: dict[str, Any],
    units: list[Unit],
    *,
    final: bool = False,
    interrupted: bool = False,
    pytest_status: str | None = None,
    replays: Replays | None = None,
) -> Snapshot:
    """Merge the work units' files into runs, deduplicated findings and events.

    A shard whose worker died (xdist's crash mark says so) has ended; the
    case it left in flight is replayed in isolation (``replays``) and is a
    finding if it fails there, else the loss is a ``worker-lost`` event.
    """
    from attnfuzz.harness.campaign_worker import read_json

    items_by_unit: dict[int, list[dict[str, Any]]] = {u: [] for u in range(len(units))}
    for item in plan["items"]:
        items_by_unit[item["unit"]].append(item)
    snap = Snapshot()
    for u, unit in enumerate(units):
        states, errors = [], []
        settled_before = snap.settled
        keyed: dict[str, dict[str, Any]] = {}
        for item in items_by_unit[u]:
            state = read_json(scratch / "items" / f"{item['id']}.json")
            if state is None:
                if final and not interrupted and pytest_status is not None:
                    errors.append(f"shard {item['shard']} never ran ({pytest_status})")
                continue
            states.append(state)
            if state.get("status") != "running":
                snap.settled += 1
            if state.get("status") == "error":
                errors.append(state.get("error") or "the harness failed")
            found = list(state["findings"].values())
            lost = (scratch / "crashed" / item["id"]).exists()
            if lost and state.get("status") == "running":  # the worker died: the shard ended
                snap.settled += 1
                inflight = read_json(scratch / "inflight" / f"{item['id']}.json")
                event = {
                    "event": "worker-lost",
                    "target": unit.target,
                    "implementation": unit.impl,
                    "shard": item["shard"],
                    "detail": _worker_fault(scratch, item["id"]),
                }
                verdict = None
                if inflight is not None and replays is not None:
                    verdict = replays.verdict(item["id"], unit, inflight["case"])
                if verdict is not None and not verdict.ok:
                    _count_dead_example(state, inflight, plan)
                    found.append(
                        {
                            "key": verdict.key,
                            "case": inflight["case"],
                            "verdict": {
                                "key": verdict.key,
                                "mismatches": [m.to_dict() for m in verdict.mismatches],
                            },
                            "examples_to_failure": inflight["examples"] + 1,
                            "seconds_to_failure": inflight["started"]
                            - (state.get("first_example") or inflight["started"]),
                            "found": inflight["started"],
                        }
                    )
                else:
                    event["detail"] += (
                        "; the case it was judging passed when replayed alone"
                        if verdict is not None
                        else "; it was between two cases"
                    )
                    snap.events.append(event)
            for f in found:
                known = keyed.get(f["key"])
                if known is None:
                    keyed[f["key"]] = dict(f)
                    continue
                first = min(known, f, key=lambda x: x["found"])
                small = min(known, f, key=lambda x: case_size(x["case"]))
                keyed[f["key"]] = small | {
                    k: first[k] for k in ("examples_to_failure", "seconds_to_failure", "found")
                }
        examples = sum(s["examples"] for s in states)
        seconds = sum(max(0.0, (s.get("finished") or s["updated"]) - s["started"]) for s in states)
        labels: dict[str, int] = {}
        for s in states:
            for label, count in s["labels"].items():
                labels[label] = labels.get(label, 0) + count
        ids = []
        for key, f in sorted(keyed.items(), key=lambda kv: kv[1]["found"]):
            fid = finding_id(unit.target, unit.impl, key)
            ids.append(fid)
            snap.findings[fid] = {
                "id": fid,
                "target": unit.target,
                "implementation": unit.impl,
                "key": key,
                "check": f["verdict"]["mismatches"][0]["check"],
                "case_file": f"cases/{fid}.json",
                "case": f["case"],
                "verdict": f["verdict"],
                "examples_to_failure": f["examples_to_failure"],
                "seconds_to_failure": round(f["seconds_to_failure"], 3),
                "found": f["found"],
            }
        status = "error" if errors else "fail" if ids else "pass" if examples else NOT_RUN
        running = snap.settled - settled_before < len(items_by_unit[u])
        run = {
            "target": unit.target,
            "implementation": unit.impl,
            "kind": unit.kind,
            "examples": examples,
            "seconds": round(seconds, 3),
            "examples_per_second": round(examples / seconds, 3) if seconds else 0.0,
            "status": status,
            "labels": dict(sorted(labels.items())),
            "timeline": merge_timelines([s["timeline"] for s in states]),
            "findings": ids,
        }
        if errors:
            run["error"] = "; ".join(errors)
        if not final:
            run["_running"] = running
            run["_started"] = min((s["started"] for s in states), default=None)
        snap.runs.append(run)
    return snap


def _count_dead_example(
    state: dict[str, Any], inflight: dict[str, Any], plan: dict[str, Any]
) -> None:
    """The example a worker died on was judged too: its verdict is the replay's."""
    from attnfuzz.reference.batch import Case
    from attnfuzz.strategies.batches import scenario_labels

    examples = max(state["examples"], inflight["examples"] + 1)
    end = max(state["updated"], inflight["started"])
    if examples > state["examples"]:
        for label in scenario_labels(Case.from_dict(inflight["case"])):
            state["labels"][label] = state["labels"].get(label, 0) + 1
    state["examples"], state["updated"] = examples, end
    state["timeline"].append([round(end - plan["started"], 3), examples])


# -- exit status ----------------------------------------------------------------


def exit_status(campaign: dict[str, Any], signum: int | None = None) -> int:
    """See the module docstring: must-pass findings and errors, then interrupts, then
    mutants, then runs that judged nothing."""
    runs = campaign["runs"]
    if any(r["status"] == "error" for r in runs):
        return EXIT_FOUND
    if any(r["findings"] and r["kind"] != "mutant" for r in runs):
        return EXIT_FOUND
    if campaign["interrupted"]:
        return 128 + (signum or signal.SIGINT)
    if any(run_verdict(r) == SURVIVED for r in runs):
        return EXIT_FOUND
    if any(run_verdict(r) == NOT_RUN for r in runs):
        return EXIT_INCOMPLETE
    return EXIT_OK


def verdict_word(run: dict[str, Any]) -> str:
    """The run's verdict as the console shows it: the reports' word, in capitals."""
    return run_verdict(run).upper()


# -- progress -------------------------------------------------------------------


class LineProgress:
    """Plain lines: findings as they come, a progress line every ``every`` seconds."""

    def __init__(self, stream: TextIO, every: float | None):
        self.stream, self.every, self.last = stream, every, time.monotonic()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(self, snap: Snapshot, elapsed: float, left: float | None) -> None:
        if self.every is None or time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        examples = sum(r["examples"] for r in snap.runs)
        done = sum(not r["_running"] for r in snap.runs)
        rest = f", {left:.0f}s left" if left is not None else ""
        self.say(
            f"[{elapsed:6.1f}s] {examples} examples, {len(snap.findings)} findings, "
            f"{done}/{len(snap.runs)} runs done{rest}"
        )


class LiveProgress:
    """A live table per target x implementation (rich), findings printed above it."""

    def __init__(self, title: str):
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.title = title
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def say(self, line: str) -> None:
        self.live.console.print(line, markup=False, highlight=False)

    def update(self, snap: Snapshot, elapsed: float, left: float | None) -> None:
        from rich.table import Table

        rest = f", {left:.0f}s left" if left is not None else ""
        table = Table(title=f"{self.title} - {elapsed:.0f}s{rest}", title_justify="left")
        for name, justify in [
            ("target", "left"),
            ("implementation", "left"),
            ("kind", "left"),
            ("examples", "right"),
            ("failures", "right"),
            ("ex/s", "right"),
            ("time left", "right"),
        ]:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for run in snap.runs:
            if not run["_running"]:
                when = "done"
            elif run["_started"] is None:
                when = "waiting"
            else:
                when = f"{left:.0f}s" if left is not None else "-"
            failures = str(len(run["findings"]))
            if run["findings"]:
                failures = f"[red]{failures}[/red]" if run["kind"] != "mutant" else failures
            table.add_row(
                run["target"],
                run["implementation"],
                run["kind"],
                str(run["examples"]),
                failures,
                f"{run['examples_per_second']:.1f}",
                when,
            )
        self.live.update(table)


# -- the campaign -----------------------------------------------------------------


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _child_env(roots: list[str], scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Hypothesis' own cache stays in the campaign's scratch: nothing outside --out and --db.
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(scratch / "hypothesis")
    for name in list(env):
        # The campaign's pytest run is ours: nothing of an enclosing pytest or xdist.
        if name.startswith(("PYTEST_XDIST_", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")):
            del env[name]
    for name in ("PYTEST_CURRENT_TEST", "PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        env.pop(name, None)
    paths = [os.getcwd(), *roots, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # One worker per core: a worker's BLAS (the interpreter's tl.dot is a NumPy
    # matmul) must not start a thread per core of its own, unless asked to.
    for name in BLAS_THREAD_VARIABLES:
        env.setdefault(name, "1")
    return env


class _CaseWriter:
    """Writes each finding's case file, again whenever a smaller case arrives."""

    def __init__(self, out: Path, device: str):
        self.out, self.device = out, device
        self.shown = out  # the directory as printed
        self.example_timeout: float | None = None  # recorded in each case file
        self.written: dict[str, str] = {}
        self.derived: dict[str, dict[str, Any]] = {}

    def write(self, finding: dict[str, Any]) -> bool:
        from attnfuzz.harness.casefile import case_document, write_case
        from attnfuzz.harness.oracle import Mismatch, Verdict
        from attnfuzz.reference.batch import Case

        text = json.dumps(finding["case"], sort_keys=True)
        if self.written.get(finding["id"]) == text:
            finding["derived"] = self.derived[finding["id"]]
            return False
        case = Case.from_dict(finding["case"])
        verdict = Verdict([Mismatch(**m) for m in finding["verdict"]["mismatches"]])
        doc = case_document(
            finding["target"],
            finding["implementation"],
            case,
            verdict,
            self.device,
            example_timeout=self.example_timeout,
        )
        finding["derived"] = self.derived[finding["id"]] = doc["derived"]
        write_case(self.out / finding["case_file"], doc)
        new = finding["id"] not in self.written
        self.written[finding["id"]] = text
        return new


def run_campaign(options: Options, stream: TextIO | None = None) -> tuple[dict[str, Any], int]:
    """Run a campaign; returns campaign.json's contents and the exit status.

    Usage errors raise :class:`UsageError` before anything runs.
    """
    from attnfuzz.harness.campaign_worker import PROFILES

    started = time.time()
    stream = stream or sys.stdout
    profile_name = options.profile or os.environ.get(PROFILE_ENV) or "dev"
    if profile_name not in PROFILES:
        raise UsageError(
            f"unknown profile {profile_name!r} (from ${PROFILE_ENV}; known: {', '.join(PROFILES)})"
        )
    profile = PROFILES[profile_name]
    derandomized = profile.derandomized or options.seed is not None
    seed = options.seed if options.seed is not None else (0 if derandomized else None)
    budget = options.budget_s
    if budget is None and options.max_examples is None:
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
    units = plan_units(options.targets, options.impls, options.zoo)
    if options.zoo:
        note_unavailable_mutants(options.targets, stream)
    roots = [r for u in units if ":" in u.impl if (r := _import_root(u.impl.split(":")[0]))]
    plan = {
        "started": started,
        "budget": budget,
        "deadline": started + budget if budget is not None else None,
        "workers": workers,
        "profile": profile.name,
        "derandomized": derandomized,
        "seed": seed,
        "database": database,
        "scale": options.scale,
        "device": options.device,
        "example_timeout": timeout,
        "items": plan_items(units, workers, options.max_examples),
    }
    out.mkdir(parents=True, exist_ok=True)  # no usage error left: now it may be made
    lock = lock_out(out)  # one campaign at a time in one --out
    try:
        keep_previous(out, stream)
        return _run_locked(options, stream, plan, units, roots, out)
    finally:
        lock.close()


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


LOCK_FILE = ".campaign.lock"


def lock_out(out: Path) -> TextIO:
    """Hold ``<out>/.campaign.lock`` for the campaign's life; a second campaign
    in the same directory is a usage error, not a corruption of the first."""
    import fcntl

    handle = (out / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UsageError(
            f"--out {out}: a campaign is already running there (pid {holder}); "
            "wait for it or choose another --out"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


PREVIOUS = "previous"
RESULTS = ("campaign.json", "summary.md", "report.html", "junit.xml", "cases")


def keep_previous(out: Path, stream: TextIO) -> None:
    """The last campaign's results move to ``<out>/previous/``: the baseline of
    ``attnfuzz report``, never overwritten by the campaign that follows it."""
    if not (out / "campaign.json").exists():
        return
    previous = out / PREVIOUS
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for name in RESULTS:
        if (out / name).exists():
            os.replace(out / name, previous / name)
    print(f"the previous campaign's results are in {previous}", file=stream)


def _run_locked(
    options: Options,
    stream: TextIO,
    plan: dict[str, Any],
    units: list[Unit],
    roots: list[str],
    out: Path,
) -> tuple[dict[str, Any], int]:
    """The campaign proper, its ``--out`` locked: start the workers, supervise."""
    from attnfuzz.harness.campaign_worker import PLAN, write_json

    started = plan["started"]
    scratch = out / ".work"  # the workers' files: absolute, whatever their cwd
    if scratch.exists():  # a campaign that never finished: its findings may be only there
        kept = out / f".work-unfinished-{int(scratch.stat().st_mtime)}"
        scratch.rename(kept)
        print(f"a previous campaign in {out} did not finish; its files are in {kept}", file=stream)
    for sub in ("items", "inflight", "faults", "started", "crashed", "hypothesis"):
        (scratch / sub).mkdir(parents=True)
    write_json(scratch / PLAN, plan)
    (scratch / "pytest.ini").write_text("[pytest]\n")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        str(scratch / PLAN),
        "-c",
        str(scratch / "pytest.ini"),
        "--rootdir",
        str(scratch),
        "-p",
        "attnfuzz.harness.campaign_plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:faulthandler",
        "-n",
        str(plan["workers"]),
        "--max-worker-restart",
        str(len(plan["items"])),
        "-q",
        "--no-header",
    ]
    log_path = scratch / "pytest.log"
    log = log_path.open("w")
    stopper = _Stopper()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = _in_main_thread()
    if in_main:  # from here on a signal is noted, never raised: the report gets written
        signal.signal(signal.SIGINT, stopper.on_signal)
        signal.signal(signal.SIGTERM, stopper.on_signal)
    try:
        stopper.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(roots, scratch),
            start_new_session=True,  # Ctrl-C reaches us; we stop the workers in order
        )
        return _supervise(stopper, options, plan, units, scratch, stream, started, log)
    finally:
        log.close()
        stopper.kill()
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


class _Stopper:
    """Stops the campaign's pytest run: at the deadline, on a signal, or for good."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.interrupted_by: int | None = None
        self.stop_sent: float | None = None
        self.killed = False

    def on_signal(self, signum: int, frame: object) -> None:
        if self.interrupted_by is None:
            self.interrupted_by = signum
            self.stop()
        else:
            self.kill()  # asked twice: no more waiting

    def _group(self, sig: int) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        """SIGINT to the pytest run and its workers: they end their example and stop."""
        if self.proc is not None and self.stop_sent is None:
            self._group(signal.SIGINT)
            self.stop_sent = time.time()

    def kill(self) -> None:
        if self.proc is not None and not self.killed:
            self._group(signal.SIGKILL)
            self.killed = True
            self.proc.wait()

    def tick(self, snap: Snapshot, deadline: float | None) -> None:
        now = time.time()
        if self.interrupted_by is not None:
            self.stop()  # a signal that came before the run had started
        over = now - deadline if deadline is not None else None
        if over is not None and over > STOP_GRACE_S:
            # Units still judging past the deadline are told to stop; a pytest
            # run merely shutting down is left to finish.
            if any(r["_running"] and r["_started"] for r in snap.runs):
                self.stop()
            if over > STOP_GRACE_S + KILL_GRACE_S:
                self.kill()
        if self.stop_sent is not None and now > self.stop_sent + KILL_GRACE_S:
            self.kill()


def _supervise(
    stopper: _Stopper,
    options: Options,
    plan: dict[str, Any],
    units: list[Unit],
    scratch: Path,
    stream: TextIO,
    started: float,
    log: TextIO,
) -> tuple[dict[str, Any], int]:
    """Watch the workers' files until every unit has ended, then write the campaign."""
    from attnfuzz.harness.casefile import environment
    from attnfuzz.kernels._triton import device as kernel_device

    proc = stopper.proc
    assert proc is not None
    # Files go to the absolute --out; what is printed names it as the user did.
    out, shown, items = scratch.parent, options.out, plan["items"]
    replays = Replays(plan)
    device = options.device or str(kernel_device())
    env_info = environment(device)
    writer = _CaseWriter(out, device)
    writer.shown, writer.example_timeout = shown, plan["example_timeout"]
    title = f"campaign: {len(units)} runs, {plan['workers']} worker(s), profile {plan['profile']}"
    if options.quiet or not stream.isatty():
        progress: LineProgress | LiveProgress = LineProgress(
            stream, None if options.quiet else 10.0
        )
    else:
        progress = LiveProgress(title)
    budget = plan["budget"]
    with progress:
        budget_text = f"budget {budget:g}s" if budget is not None else "no time budget"
        cap_text = f", {options.max_examples} examples per run" if options.max_examples else ""
        db_text = plan["database"] or "none (derandomized)"
        progress.say(f"{title}, {budget_text}{cap_text}, database {db_text}")
        announced = False
        snap = Snapshot()
        while proc.poll() is None and snap.settled < len(items):
            time.sleep(POLL_S)
            if stopper.interrupted_by is not None and not announced:
                progress.say("interrupted: stopping the workers, writing what ran")
                announced = True
            snap = collect(scratch, plan, units, replays=replays)
            _report_new(snap, writer, progress, started)
            now = time.time()
            left = max(0.0, plan["deadline"] - now) if plan["deadline"] else None
            progress.update(snap, now - started, left)
            stopper.tick(snap, plan["deadline"])
        # Every unit has ended: what is left of the pytest run is its teardown,
        # not worth the wait (nor are the workers of a run that failed).
        ended_by_itself = proc.poll() is not None
        stopped = stopper.stop_sent is not None or stopper.killed
        stopper.kill()
        log.flush()
        snap = collect(
            scratch,
            plan,
            units,
            final=True,
            interrupted=stopped,
            pytest_status=f"pytest exit code {proc.returncode}" if ended_by_itself else None,
            replays=replays,
        )
        _report_new(snap, writer, progress, started)
        finished = time.time()
        campaign = {
            "schema": CAMPAIGN_SCHEMA,
            "started": timestamp(started),
            "finished": timestamp(finished),
            "seconds": round(finished - started, 3),
            "budget": {"seconds": budget, "max_examples": options.max_examples},
            "profile": plan["profile"],
            "seed": plan["seed"],
            "workers": plan["workers"],
            "database": plan["database"] or "none",
            "interrupted": stopper.interrupted_by is not None,
            "environment": env_info,
            "runs": snap.runs,
            "findings": [],
            "events": snap.events,
        }
        for f in sorted(snap.findings.values(), key=lambda f: f["found"]):
            writer.write(f)
            f["repro"] = f"attnfuzz repro {shown / f['case_file']}"
            campaign["findings"].append({k: f[k] for k in _FINDING_FIELDS})
        tmp = out / ".campaign.json.tmp"
        tmp.write_text(json.dumps(campaign, indent=2) + "\n")
        os.replace(tmp, out / "campaign.json")
        code = exit_status(campaign, stopper.interrupted_by)
        for line in _summary(campaign, shown, code):
            progress.say(line)
        reports = _write_reports(campaign, out)
        if reports:
            progress.say("reports: " + ", ".join(str(shown / p.name) for p in reports))
    clean = snap.settled == len(items) or proc.returncode in (0, 1)
    clean = clean and not any(r["status"] == "error" for r in snap.runs)
    if clean and not os.environ.get("ATTNFUZZ_KEEP_WORK"):
        shutil.rmtree(scratch, ignore_errors=True)
    else:
        print(f"campaign files kept for inspection: {scratch}", file=stream)
    return campaign, code


_FINDING_FIELDS = (
    "id",
    "target",
    "implementation",
    "key",
    "check",
    "case_file",
    "case",
    "verdict",
    "derived",
    "repro",
    "examples_to_failure",
    "seconds_to_failure",
)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _report_new(snap: Snapshot, writer: _CaseWriter, progress: Any, started: float) -> None:
    for f in sorted(snap.findings.values(), key=lambda f: f["found"]):
        if writer.write(f):
            progress.say(
                f"[{f['found'] - started:6.1f}s] FOUND {f['target']} / {f['implementation']} "
                f"[{f['key']}] -> {writer.shown / f['case_file']}"
            )


def _summary(campaign: dict[str, Any], out: Path, code: int) -> list[str]:
    lines = []
    for run in campaign["runs"]:
        keys = ", ".join(f.rsplit("--", 1)[-1] for f in run["findings"])
        lines.append(
            f"{verdict_word(run):<8} {run['target']} / {run['implementation']} ({run['kind']}): "
            f"{run['examples']} examples, {run['examples_per_second']:.1f}/s"
            + (f"  [{keys}]" if keys else "")
            + (f"  {run['error']}" if run.get("error") else "")
        )
    for event in campaign.get("events", []):
        lines.append(
            f"EVENT    {event['target']} / {event['implementation']}: {event['event']} "
            f"(shard {event['shard']}): {event['detail']}"
        )
    n = len(campaign["findings"])
    lines.append(
        f"{n} finding{'s' if n != 1 else ''} in {campaign['seconds']:.1f}s"
        + (" (interrupted)" if campaign["interrupted"] else "")
        + f"; wrote {out / 'campaign.json'}"
        + (f" and {out / 'cases'}/" if n else "")
    )
    lines.append(f"exit status {code}")
    return lines


def _write_reports(campaign: dict[str, Any], out: Path) -> list[Path]:
    """The reports of :mod:`attnfuzz.reports`, where this version has them."""
    import attnfuzz.reports as reports

    write_reports = getattr(reports, "write_reports", None)
    if write_reports is None:
        return []
    return list(write_reports(campaign, out))
