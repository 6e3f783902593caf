"""Fuzz one implementation of one target and keep what it finds.

The search is :func:`attnfuzz.harness.engine.fuzz_test`'s (the one fuzz
engine); this module adds what ``attnfuzz run``, the zoo and the benchmarks
ask of a run: budgets, Ctrl-C, timings and the minimized failing case.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import DEFAULT_DB
from attnfuzz.harness.engine import Finding, fuzz_settings, fuzz_test
from attnfuzz.harness.errors import HarnessError
from attnfuzz.harness.oracle import UNSHRUNK_CHECKS, Verdict
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.traces import lived
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.batches import SMALL, Scale
from hypothesis import seed
from hypothesis.database import ExampleDatabase
from hypothesis.errors import FlakyFailure
from hypothesis.reporting import with_reporter


class _OutOfBudget(BaseException):
    """Raised inside the property to end the run; not an ``Exception``, so
    Hypothesis lets it through instead of taking it for a failure to shrink."""


class HarnessFailed(BaseException):
    """Carries a :class:`HarnessError` through Hypothesis, which would otherwise take it
    for the property failing and shrink it: attnfuzz's own fault ends the run at once."""


class _NotShrunk(BaseException):
    """Ends the run on a hang: each shrinking step would cost a whole timeout,
    so the case that hung is kept as it ran."""


# A hang ends the run with its case as it ran (every front-end alike: the oracle's).
ENDS_RUN_UNSHRUNK = UNSHRUNK_CHECKS

Judge = Callable[[Any, Counter], Verdict]  # a Case, or a Trace in a traced run


@dataclass
class RunResult:
    target: str
    implementation: str
    examples: int = 0  # cases judged, shrinking included
    examples_to_failure: int | None = None  # cases judged until the first failure
    seconds: float = 0.0
    seconds_to_failure: float | None = None  # from the first example
    case: Case | Trace | None = None  # the minimized failing case (or trace)
    verdict: Verdict | None = None
    labels: Counter = field(default_factory=Counter)
    phase_seconds: Counter = field(default_factory=Counter)  # see Target.judge
    statistics: Counter = field(default_factory=Counter)  # Verdict.statistics, summed
    stopped_by_budget: bool = False  # ``budget_s`` or ``shrink_budget_s`` ran out
    shrink_cut: bool = False  # shrinking reached its count (max_examples judgements)
    interrupted: bool = False  # Ctrl-C: ``case`` is the smallest failure found so far, if any
    shrunk: bool = True  # False: ``case`` is the case that failed as it ran (a hang)
    traced: bool = False  # the examples were traces of one engine's steps
    # Hypothesis' own replay of the failure passed (its FlakyFailure): ``case`` is the
    # last case that failed, shrunk as far as the search got; confirm it (harness.confirm).
    flaky: bool = False

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0

    def time_breakdown(self) -> dict[str, float]:
        """Seconds per phase; ``generation`` is everything outside the judge (Hypothesis)."""
        judged = sum(self.phase_seconds.values())
        return {"generation": max(self.seconds - judged, 0.0), **self.phase_seconds}

    @property
    def failed(self) -> bool:
        return self.case is not None


def fuzz(
    target: Target,
    impl: Implementation,
    *,
    max_examples: int = 200,
    rng_seed: int | None = None,
    database: Path | str | ExampleDatabase | None = DEFAULT_DB,
    scale: Scale = SMALL,
    device: str | None = None,  # None: where the kernels run
    shrink: bool = True,
    budget_s: float | None = None,
    shrink_budget_s: float | None = None,
    on_case: Callable[[Case, Verdict], None] | None = None,
    judge: Judge | None = None,
    stop_requested: Callable[[], bool] | None = None,
    examples: Sequence[Case | Trace] = (),
    traced: bool = False,
) -> RunResult:
    """Run a campaign; a failure is shrunk and returned, never raised. A
    :class:`HarnessError` (attnfuzz's own code failed) ends the run at once and is
    raised: it is no verdict on ``impl``.

    ``rng_seed`` makes the run derandomized and independent of any database;
    without it the run is random and replays the database's saved failures first.

    ``budget_s`` ends a search that found nothing after that many wall-clock
    seconds from the first example (``max_examples`` still applies);
    ``shrink_budget_s`` ends shrinking that long after the first failure, the
    smallest failing case so far being kept; so does a count: shrinking judges at
    most ``max_examples`` cases (a run at most twice ``max_examples`` in all). Each
    is checked before an example, so a run overshoots by at most one example. A
    shrunk failing trace is then shrunk further by the moves Hypothesis cannot make
    (:mod:`~attnfuzz.harness.trace_shrink`), at most ``max_examples`` judgements more
    (a traced run at most three times ``max_examples`` in all).
    ``on_case`` sees every judged case and its verdict, shrinking included, in order.

    ``judge`` replaces the in-process :meth:`Target.judge` (``attnfuzz run``
    passes an :class:`~attnfuzz.harness.isolation.IsolatedJudge`'s). A hang
    (the ``timeout`` check) ends the run at once, its case not shrunk. Ctrl-C
    ends it too (``interrupted``), keeping the smallest failure found so far;
    ``stop_requested`` is asked before each example, so that a signal whose
    ``KeyboardInterrupt`` landed where Python ignores exceptions (a garbage
    collector callback) still ends the run.

    ``examples`` are judged first, as Hypothesis explicit examples (see
    :func:`~attnfuzz.harness.engine.fuzz_test`): a failing one is the run's
    case, unshrunk, and ends the run.

    ``traced``: the examples are traces of one engine's steps
    (:class:`~attnfuzz.reference.trace.Trace`), judged by ``judge`` (by default
    :meth:`Target.judge_trace`); ``case`` is then the minimized failing trace,
    and ``verdict.step`` the step it fails at.
    """
    if judge is None:

        def judge(case: Case | Trace, clock: Counter) -> Verdict:
            if isinstance(case, Trace):
                return target.judge_trace(impl, case, device, clock)
            return target.judge(impl, case, device, clock)

    result = RunResult(target.name, impl.name, traced=traced)
    clock: dict[str, float] = {}

    def timed_judge(case: Case) -> Verdict:
        """The budgets and Ctrl-C, checked before each example; then the judge."""
        if stop_requested is not None and stop_requested():
            raise KeyboardInterrupt
        now = time.perf_counter()
        clock.setdefault("start", now)
        if result.case is None:
            if budget_s is not None and now - clock["start"] > budget_s:
                raise _OutOfBudget
        elif shrink_budget_s is not None and now - clock["found"] > shrink_budget_s:
            raise _OutOfBudget
        elif result.examples - (result.examples_to_failure or 0) >= max_examples:
            # Shrinking is held to a count too: at most max_examples judgements after
            # the first failure (a trace's each costs a process), the smallest so far kept.
            result.shrink_cut = True
            raise _OutOfBudget
        try:
            return judge(case, result.phase_seconds)
        except HarnessError as err:
            raise HarnessFailed(err) from err

    def record(case: Case, verdict: Verdict, labels: list[str]) -> None:
        result.labels.update(labels)
        result.examples += 1
        result.statistics.update(verdict.statistics)
        if on_case is not None:
            on_case(case, verdict)
        if not verdict.ok:
            if result.examples_to_failure is None:
                result.examples_to_failure = result.examples
                clock["found"] = time.perf_counter()
                result.seconds_to_failure = clock["found"] - clock["start"]
            # Hypothesis replays the minimal example last, so this ends as the shrunk one.
            result.case, result.verdict = lived(case, verdict), verdict
            if verdict.key in ENDS_RUN_UNSHRUNK:
                result.shrunk = False
                raise _NotShrunk

    test = fuzz_test(
        target,
        impl,
        # A derandomized run neither reads nor writes the database.
        settings=fuzz_settings(
            max_examples=max_examples,
            database=None if rng_seed is not None else database,
            shrink=shrink,
            report_multiple_bugs=False,
            print_blob=False,
        ),
        judge=timed_judge,
        scale=scale,
        on_case=record,
        examples=examples,
        traced=traced,
    )
    if rng_seed is not None:
        test = seed(rng_seed)(test)

    start = time.perf_counter()
    try:
        # Hypothesis speaks only of its own ways to reproduce a failure (@seed):
        # attnfuzz says what it found, and how to replay it, itself.
        with with_reporter(lambda _message: None):
            test()
    except FlakyFailure:
        result.flaky = True
    except Finding:
        pass
    except _NotShrunk:
        pass
    except _OutOfBudget:
        result.stopped_by_budget = True
    except KeyboardInterrupt:
        result.interrupted = True
    except HarnessFailed as failed:
        raise failed.args[0] from None
    timed_out = result.stopped_by_budget and not result.shrink_cut  # a time budget
    ended = result.flaky or result.interrupted or timed_out
    # An explicit example that fails is the run's case as it is (judged first: the
    # failures among the first len(examples) are theirs), never shrunk.
    explicit = (result.examples_to_failure or 0) <= len(examples)
    if traced and shrink and result.shrunk and not (ended or explicit):
        _shrink_tied(target, impl, result, judge, on_case, stop_requested, max_examples)
    result.seconds = time.perf_counter() - start
    return result


def _shrink_tied(
    target: Target,
    impl: Implementation,
    result: RunResult,
    judge: Judge,
    on_case: Callable[[Case, Verdict], None] | None,
    stop_requested: Callable[[], bool] | None,
    budget: int,
) -> None:
    """A failing trace, shrunk further by the moves Hypothesis cannot make
    (:mod:`attnfuzz.harness.trace_shrink`: a limit lowered with what it bounds),
    at most ``budget`` more judgements; each kept trace is the run's case at once,
    so that Ctrl-C keeps the smallest so far."""
    from attnfuzz.harness.trace_shrink import shrink_tied

    found, verdict = result.case, result.verdict
    if not isinstance(found, Trace) or verdict is None or verdict.ok:
        return
    key = verdict.key

    def fails(candidate: Trace) -> Verdict | None:
        if stop_requested is not None and stop_requested():
            raise KeyboardInterrupt
        got = judge(candidate, result.phase_seconds)
        result.examples += 1
        result.statistics.update(got.statistics)
        if on_case is not None:
            on_case(candidate, got)
        if got.ok or got.key != key:
            return None
        result.case, result.verdict = lived(candidate, got), got
        return got

    try:
        shrink_tied(target, found, fails, budget, impl)
    except KeyboardInterrupt:
        result.interrupted = True
