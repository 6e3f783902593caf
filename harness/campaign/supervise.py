"""Running the workers' pytest run and watching it until every unit has ended."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from attnfuzz.harness.campaign.collect import Replays, Snapshot, collect
from attnfuzz.harness.campaign.document import campaign_record, finding_record
from attnfuzz.harness.campaign.options import Options
from attnfuzz.harness.campaign.plan import Unit
from attnfuzz.harness.campaign.progress import LineProgress, LiveProgress, StartupNotes
from attnfuzz.harness.campaign.results import CaseWriter, report_new, write_results
from attnfuzz.harness.campaign.timing import (
    campaign_timing,
    item_states,
    run_timing,
    startup_state,
)
from attnfuzz.harness.database import note_artifact
from attnfuzz.harness.definitions import RunStatus, timestamp
from attnfuzz.harness.lifetime import dies_with_this_process

# Workers end their units at the deadline by themselves (a call still running
# then is cut short, see IsolatedJudge.judge); these only bound a worker that does not.
STOP_GRACE_S = 1.0  # after the deadline, before the workers are told to stop
KILL_GRACE_S = 2.0  # after they were told, before they are killed
POLL_S = 0.25


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def child_env(roots: list[str], scratch: Path) -> dict[str, str]:
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


# A finished campaign's files, kept for inspection (a run that did not finish, an
# error, ATTNFUZZ_KEEP_WORK): the next campaign replaces them.
KEPT_WORK = ".work-kept"


def run_locked(
    options: Options,
    stream: TextIO,
    plan: dict[str, Any],
    units: list[Unit],
    roots: list[str],
    out: Path,
) -> tuple[dict[str, Any], int]:
    """The campaign proper, its ``--out`` locked: start the workers, supervise."""
    from attnfuzz.harness.campaign.worker import PLAN, write_json

    started = plan["started"]
    scratch = out / ".work"  # the workers' files: absolute, whatever their cwd
    if scratch.exists():  # a campaign that never finished: its findings may be only there
        stamp, n = int(scratch.stat().st_mtime), 1
        kept = out / f".work-unfinished-{stamp}"
        while kept.exists():  # two killed within a second: neither is lost
            n += 1
            kept = out / f".work-unfinished-{stamp}-{n}"
        scratch.rename(kept)
        print(f"a previous campaign in {out} did not finish; its files are in {kept}", file=stream)
    for sub in ("items", "inflight", "faults", "started", "crashed", "hypothesis"):
        (scratch / sub).mkdir(parents=True)
    if plan["database"]:
        # Fetched once, here, where its warning can be heard: the workers (their
        # Hypothesis storage: scratch/hypothesis) read the cached download.
        fetched = note_artifact(plan["database"], scratch / "hypothesis", stream)
        plan["database_note"] = fetched.note
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
        "attnfuzz.harness.campaign.plugin",
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
    stopper = Stopper()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = in_main_thread()
    if in_main:  # from here on a signal is noted, never raised: the report gets written
        signal.signal(signal.SIGINT, stopper.on_signal)
        signal.signal(signal.SIGTERM, stopper.on_signal)
    try:
        stopper.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(roots, scratch),
            start_new_session=True,  # Ctrl-C reaches us; we stop the workers in order
            # Killed (SIGKILL: no handler runs), we take the pytest run with us; its
            # workers die with it in turn (plugin.py), no one left writing in --out.
            preexec_fn=dies_with_this_process(),
        )
        return supervise(stopper, options, plan, units, scratch, stream, started, log)
    finally:
        log.close()
        stopper.kill()
        if in_main:
            for s, handler in previous.items():
                signal.signal(s, handler)


class Stopper:
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


def supervise(
    stopper: Stopper,
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
    writer = CaseWriter(out, device)
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
        if plan.get("deadline_soft"):
            budget_text += " (each run judges its floor first)"
        cap_text = f", {options.max_examples} examples per run" if options.max_examples else ""
        cap_text += f", floor {options.min_examples}" if options.min_examples else ""
        db_text = plan["database"] or "none (derandomized)"
        if plan.get("database_note"):  # said above in full; the header must not imply it is read
            db_text += " (its GitHub artifact could not be fetched)"
        progress.say(f"{title}, {budget_text}{cap_text}, database {db_text}")
        notes = StartupNotes(plan["workers"], started)  # start-up is said as it goes
        progress.say(notes.begin(time.time()))
        announced = False
        snap = Snapshot()
        while proc.poll() is None and snap.settled < len(items):
            time.sleep(POLL_S)
            if stopper.interrupted_by is not None and not announced:
                progress.say("interrupted: stopping the workers, writing what ran")
                announced = True
            snap = collect(scratch, plan, units, replays=replays)
            report_new(snap, writer, progress, started)
            now = time.time()
            boot = startup_state(item_states(scratch), plan["workers"], len(items))
            for line in notes.lines(boot, now):
                progress.say(line)
            left = max(0.0, plan["deadline"] - now) if plan["deadline"] else None
            progress.update(snap, now - started, left, boot)
            # A soft deadline is the workers' to keep, once each run has its floor.
            stopper.tick(snap, None if plan.get("deadline_soft") else plan["deadline"])
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
        report_new(snap, writer, progress, started)
        for line in writer.withdraw(set(snap.findings)):  # what its replays took back
            progress.say(line)
        finished = time.time()
        states = item_states(scratch)  # where the wall time went: campaign.json's timing
        for u, run in enumerate(snap.runs):  # in the units' order
            if (parts := run_timing(states, u, run["seconds"])) is not None:
                run["timing"] = parts
        findings = []
        for f in sorted(snap.findings.values(), key=lambda f: f["found"]):
            writer.write(f)  # sets f["derived"]
            findings.append(
                finding_record(
                    f["target"],
                    f["implementation"],
                    f["case"],
                    f["verdict"],
                    derived=f["derived"],
                    shown_out=shown,
                    examples_to_failure=f["examples_to_failure"],
                    seconds_to_failure=f["seconds_to_failure"],
                    reachability=f.get("reachability"),
                    step=f.get("step"),
                    history_dependent=bool(f.get("history_dependent")),
                    flaky=f.get("flaky"),
                )
            )
        fields: dict[str, Any] = dict(
            runs=snap.runs,
            findings=findings,
            started=timestamp(started),
            finished=timestamp(finished),
            seconds=finished - started,
            environment=env_info,
            budget_seconds=budget,
            max_examples=options.max_examples,
            min_examples=options.min_examples,
            profile=plan["profile"],
            seed=plan["seed"],
            workers=plan["workers"],
            database=plan["database"] or "none",
            interrupted=stopper.interrupted_by is not None,
            events=snap.events,
            timing=campaign_timing(states, plan["workers"], started, finished),
            database_note=plan.get("database_note"),
        )
        # Each result on its own; what cannot be written is told below, never raised.
        results = write_results(campaign_record, fields, writer)
        campaign, code = results.campaign, results.status(stopper.interrupted_by)
        for line in results.summary(shown, code):
            progress.say(line)
        if results.reports:
            progress.say("reports: " + ", ".join(str(shown / p.name) for p in results.reports))
    # After the live display: on stderr, the cases not written, whole, then one line each.
    writer.print_unwritten(sys.stderr)
    for line in results.problems(shown):
        print(line, file=sys.stderr, flush=True)
    clean = snap.settled == len(items) or proc.returncode in (0, 1)
    clean = clean and not any(r["status"] == RunStatus.ERROR for r in snap.runs)
    if clean and not os.environ.get("ATTNFUZZ_KEEP_WORK"):
        shutil.rmtree(scratch, ignore_errors=True)
    else:  # this campaign finished (its results are written): kept, never "unfinished"
        kept = out / KEPT_WORK
        shutil.rmtree(kept, ignore_errors=True)  # the previous campaign's: one kept at a time
        scratch.rename(kept)
        print(f"campaign files kept for inspection: {kept}", file=stream)
    return campaign, code


def in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
