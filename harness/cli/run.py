"""``attnfuzz run``: fuzz one implementation of one target; write its failing case."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnfuzz.harness.cli.args import (
    MESSAGE_LIMIT,
    add_device_argument,
    add_scale_argument,
    add_timeout_argument,
    non_negative_int,
    one_line,
    positive_int,
)
from attnfuzz.harness.definitions import (
    DEFAULT_CASES,
    DEFAULT_DB,
    EXIT_ERROR,
    EXIT_FOUND,
    EXIT_INCOMPLETE,
    EXIT_LATENT,
    EXIT_OK,
    HARNESS_FAULT_NOTE,
    LATENT,
    finding_id,
    invoked_as,
    repro_command,
)
from attnfuzz.harness.errors import Interrupted

if TYPE_CHECKING:  # the command imports what it runs when it runs
    from attnfuzz.harness.cli.found import Found, HistoryDependent
    from attnfuzz.harness.runner import RunResult
    from attnfuzz.reference.batch import Case

HELP = "fuzz one implementation of one target"
CHECKS_DEVICE = True  # main() checks --device before any work
CONFIG = {"db": "db", "cases": "out", "max_examples": "max_examples", "scale": "scale"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=None, help="required unless --impl names it")
    p.add_argument(
        "--impl",
        default="triton",
        help="registered name, module:attribute, or TARGET=IMPL (then --target may be left out)",
    )
    p.add_argument("--max-examples", type=positive_int, default=200)
    p.add_argument("--seed", type=non_negative_int, default=None, help="derandomized run")
    p.add_argument("--out", type=Path, default=DEFAULT_CASES)
    p.add_argument(
        "--db",
        default=str(DEFAULT_DB),
        help="example database: a directory, redis://HOST:PORT, or "
        "DIR+github:OWNER/REPO[/ARTIFACT] (unused with --seed)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="fuzz traces: each example is one engine's life over several steps, run in a "
        "new process; a failure is shrunk to the fewest, smallest steps",
    )
    add_scale_argument(p)
    add_device_argument(p)
    add_timeout_argument(p, "per example: a call without a verdict by then is a 'timeout'")


def print_failure(doc: dict, path: Path | None, shrunk: bool = True, word: str = "FAIL") -> None:
    from attnfuzz.harness.reachability import reachability_lines

    reach = doc.get("reachability")
    print(f"{word} {doc['target']} / {doc['implementation']}  [{doc['verdict']['key']}]")
    for m in doc["verdict"]["mismatches"][:8]:
        # An implementation's exception text may hold anything: one printable line each.
        print(
            "  "
            + one_line(
                f"[{m['check']}] {m['where']}: expected {m['expected']}, got {m['got']}",
                MESSAGE_LIMIT,
            )
        )
    if "trace" in doc:  # one engine's steps: each on its line, the failing one marked
        steps = doc["trace"]["steps"]
        what = "minimized trace" if shrunk else "trace"
        print(f"{what}: {len(steps)} step(s) of one engine, failing at step {doc['step']}")
        print("  config: " + json.dumps(doc["trace"]["config"]))
        if doc["trace"].get("params"):
            print("  params: " + json.dumps(doc["trace"]["params"]))
        for k, (step, summary) in enumerate(zip(steps, doc["derived"]["steps"], strict=True)):
            mark = "FAILS" if k == doc["step"] else "ok"
            print(f"  step {k} [{mark}]: {summary}")
            print("    " + json.dumps(step))
        derived = {k: v for k, v in doc["derived"].items() if k != "steps"}
        print(f"  derived (step {doc['step']}): " + json.dumps(derived))
    else:
        print("minimized case:" if shrunk else "case:")
        print(
            "  "
            + json.dumps(doc["case"] if isinstance(doc["case"], dict) else doc["case"].to_dict())
        )
        print("  derived: " + json.dumps(doc["derived"]))
    if reach:
        for line in reachability_lines(reach):
            print(line)
    if path is not None:
        print(f"written to {path}")
        print(f"replay: {repro_command(path, doc['implementation'], invoked_as())}")


def save_case(out: Path, name: str, doc: dict) -> Path | None:
    """Write a case file, ``<out>/<name>.json`` (``-2``, ``-3``, ... when that holds
    another case: two runs into one ``--out`` keep both); if that fails, the case
    goes to the terminal, never lost."""
    from attnfuzz.harness.casefile import write_new_case

    path = out / f"{name}.json"
    try:
        return write_new_case(out, name, doc)
    except OSError as err:
        print(
            f"attnfuzz: could not write {path} ({err.strerror or err}); the case:", file=sys.stderr
        )
        print(json.dumps(doc, indent=2), file=sys.stderr)
        return None


class Signals:
    """SIGINT and SIGTERM end a run as Ctrl-C does (``KeyboardInterrupt``), and are
    remembered: what was found is still written, and the exit status is 128 + signal."""

    def __init__(self) -> None:
        self.signum = signal.SIGINT
        self._got = False
        self._previous: dict[int, Any] = {}

    def received(self) -> bool:
        return self._got

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signum, self._got = signum, True
        raise Interrupted

    def _unraisable(self, unraisable: Any) -> None:
        # Our KeyboardInterrupt landed where Python ignores exceptions (a garbage
        # collector callback): the run still stops, at the next example
        # (stop_requested), so the "Exception ignored" traceback is noise.
        if self._got and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        self._previous_hook(unraisable)

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._previous[s] = signal.signal(s, self._on_signal)
        self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        sys.unraisablehook = self._previous_hook


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness.casefile import case_document
    from attnfuzz.harness.cli.found import Found, HistoryDependent, report_history
    from attnfuzz.harness.cli.progress import Counted, RunProgress
    from attnfuzz.harness.confirm import Status
    from attnfuzz.harness.database import (
        check_database,
        database_spec,
        note_artifact,
        split_github,
    )
    from attnfuzz.harness.errors import HarnessError, UsageError
    from attnfuzz.harness.history_trace import trace_after_history
    from attnfuzz.harness.isolation import DEFAULT_TIMEOUT_S, IsolatedJudge
    from attnfuzz.harness.reachability import finding_reachability, is_latent
    from attnfuzz.harness.registry import get_target, split_impl_spec
    from attnfuzz.harness.runner import fuzz
    from attnfuzz.harness.storage import prepare_out, private_hypothesis_home
    from attnfuzz.harness.traces import reachable_step
    from attnfuzz.strategies.batches import SCALES

    private_hypothesis_home()
    named, spec = split_impl_spec(args.impl)
    if named is not None and args.target is not None and named != args.target:
        raise UsageError(f"--impl {args.impl} names target {named}, --target {args.target}")
    if named is None and args.target is None:
        raise UsageError("the target is missing: --target TARGET, or --impl TARGET=IMPL")
    target = get_target(named or args.target)
    target.float_dtype_name()  # ATTNFUZZ_DTYPE this target cannot build in: before any work
    device = args.device  # checked by main() before any work
    # Paths first, before any user code runs (it may change directory).
    out = prepare_out(args.out, create=False)
    db = database_spec(args.db)
    searched: str | None = db
    if args.seed is None:  # a derandomized run neither reads nor writes the database
        check_database(db)
        if note_artifact(db).empty:  # said once; not fetched (and warned about) again
            searched = split_github(db)[0]
    impl = target.resolve(spec)
    timeout = args.example_timeout or DEFAULT_TIMEOUT_S
    dependent: HistoryDependent | None = None
    # An implementation that lives across steps is judged by traces, asked or not.
    traced = args.trace or impl.traced
    progress = RunProgress(args.max_examples)  # on stderr, every few seconds
    with IsolatedJudge(target, impl, device, timeout) as isolated, Signals() as signals:
        before: list[Case] = []  # what the child judged up to the first failure

        def judge(example: Any, clock: Any) -> Any:
            verdict = isolated.judge(example, clock)
            if not verdict.ok and not before:
                before.extend(isolated.history)
            return verdict

        def search(traced: bool) -> RunResult:
            progress.search(traced)
            return fuzz(
                target,
                impl,
                max_examples=args.max_examples,
                rng_seed=args.seed,
                database=searched,
                scale=SCALES[args.scale],
                device=device,
                judge=isolated.judge_trace if traced else judge,
                stop_requested=signals.received,
                traced=traced,
                on_case=progress.judged_one,
            )

        found: Found | None = None
        phase = "search"  # where an interrupt landed: what the case went without
        try:
            result = search(traced)
            if result.failed and not result.interrupted:
                found = Found(result)
                phase = "replays"
                progress.confirming()
                found.confirm(Counted(isolated, progress), before)
                if found.confirmation and found.confirmation.status is Status.HISTORY_DEPENDENT:
                    # It fails only after what ran before it in the process: never written
                    # as a case that passes; said so, and made a trace of one engine.
                    dependent = HistoryDependent(result, before)
                    report_history(target.name, impl.name, dependent, out)
                    # Its history as one engine's trace first, cut down within
                    # --max-examples judgements (harness.history_trace); else a search.
                    phase = "history"
                    replayed = trace_after_history(
                        target, Counted(isolated, progress), before, result.verdict,
                        args.max_examples,
                    )  # fmt: skip
                    if replayed is not None:
                        phase = "replays"
                        print("  " + replayed[0].summary())
                        result = dataclasses.replace(
                            result, case=replayed[0].trace, verdict=replayed[0].verdict,
                            traced=True, shrunk=True, shrink_cut=False, flaky=False,
                        )  # fmt: skip
                        found = Found(result)
                        found.confirmation = replayed[1]
                    else:
                        print("searching again as traces of one engine (--trace):")
                        result = search(True)
                        found, phase = None, "search"
                        if result.failed and not result.interrupted:
                            found, phase = Found(result), "replays"
                            progress.confirming()
                            found.confirm(Counted(isolated, progress), [])
                elif found.confirmation is not None:
                    result.verdict = found.confirmation.verdict  # a timeout judged again
                if found is not None and found.reportable:
                    phase = "reachability"
                    progress.reachability()
                    found.reach = finding_reachability(
                        target, impl, *reachable_step(result, isolated.judge_trace, isolated.judge)
                    )
        except HarnessError as err:  # no verdict on the implementation, no case file
            print(f"ERROR {target.name} / {impl.name}  [attnfuzz error]")
            print("  " + one_line(err, MESSAGE_LIMIT))
            print(HARNESS_FAULT_NOTE)
            return EXIT_ERROR
        except KeyboardInterrupt:  # while a failure was replayed: kept as it was found
            result.interrupted = True
            if phase == "history":  # its history as a trace: the history file holds it
                result = dataclasses.replace(result, case=None, verdict=None)
    rate = result.examples / result.seconds if result.seconds else 0.0
    print(
        f"{target.name} / {impl.name}: {result.examples} "
        f"{progress.what} in {result.seconds:.1f}s "
        f"({rate:.1f}/s)" + (" (interrupted)" if result.interrupted else "")
    )
    if result.statistics:
        print("statistics: " + ", ".join(f"{k} {v}" for k, v in sorted(result.statistics.items())))
    if not result.failed:
        if dependent is not None:  # the history file holds it: a finding all the same
            if result.interrupted:
                print(
                    "INTERRUPTED: the trace search found no failing trace so far; the "
                    "history-dependent failure above stands"
                )
                return 128 + signals.signum
            print(
                f"no trace of one engine failed within {result.examples} examples: the "
                "failure above depends on what ran before it in the process"
            )
            return EXIT_FOUND
        if result.interrupted:
            print("INTERRUPTED: no failure found so far")
            return 128 + signals.signum
        print("PASS: no failure found")
        return EXIT_OK
    assert result.case is not None and result.verdict is not None
    confirmation = found.confirmation if found is not None else None
    if confirmation is not None and confirmation.status is Status.SLOW:
        print(
            f"INCOMPLETE {target.name} / {impl.name}: a call had no verdict within "
            f"{timeout:g}s, and the same {'trace' if result.traced else 'case'} passed in a "
            f"new process within {confirmation.timeout_s:g}s: this machine was too slow for "
            "--example-timeout, which is no verdict on the implementation (raise it)"
        )
        return EXIT_INCOMPLETE
    doc = case_document(
        target.name, impl.name, result.case, result.verdict, device, example_timeout=timeout
    )
    reach = found.reach if found is not None else None
    if reach is not None:
        doc["reachability"] = reach.to_dict()
    flaky = confirmation is not None and confirmation.status is Status.FLAKY
    if flaky:
        assert confirmation is not None
        doc["flaky"] = confirmation.flaky_record()
    path = save_case(out, finding_id(target.name, impl.name, result.verdict.key), doc)
    print(
        f"first failure after {result.examples_to_failure} examples, "
        f"{result.seconds_to_failure:.2f}s"
    )
    print(progress.totals())
    for line in found.lines(timeout) if found is not None else []:
        print(line)
    if result.interrupted and phase == "replays":
        print(
            "interrupted before the failure was replayed in a new process: the case as "
            "it failed in the search"
        )
    elif result.interrupted and phase == "reachability":
        print("interrupted while its reachability was computed: the case, reachability unknown")
    elif not result.shrunk:
        print(f"the case that failed as it ran (a {result.verdict.key} is not shrunk)")
    elif result.interrupted:
        print("interrupted while shrinking: the smallest failing case so far")
    elif result.shrink_cut:
        print(
            f"shrinking stopped after {args.max_examples} judgements (--max-examples): the "
            "smallest failing case so far"
        )
    word = "FLAKY" if flaky else LATENT if is_latent(reach) else "FAIL"
    print_failure(doc, path, shrunk=result.shrunk and not result.interrupted, word=word)
    if result.interrupted:
        return 128 + signals.signum
    return EXIT_LATENT if is_latent(reach) else EXIT_FOUND
