"""The search arms (attnfuzz, naive-random, grid) and the zoo's loop over mutants and seeds."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from attnfuzz.harness import registry
from attnfuzz.harness.definitions import DEFAULT_MIN_EXAMPLES
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.zoo.scores import ARMS, CaseSize, MutantScore, SeedRun
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace, as_trace
from attnfuzz.strategies.baselines import grid_cases, naive_random_cases
from attnfuzz.strategies.batches import SMALL, Scale


def _count_matching(predicate: Callable[[Any], bool] | None, cases: Sequence[Any]) -> int | None:
    return None if predicate is None else sum(bool(predicate(c)) for c in cases)


def _finish(impl: Implementation, run: SeedRun, searched: Sequence[Case | Trace]) -> SeedRun:
    """Counts over the search examples, evaluated after the run so they cost no search time.
    A mutant of the engine's life reads traces: a baseline's case is a trace of one step."""
    if impl.traced:
        searched = [as_trace(c) for c in searched]
    run.reached = _count_matching(impl.reach, searched)
    run.triggered = _count_matching(impl.trigger, searched)
    if run.case is not None and impl.trigger is not None:
        found = run.case
        if impl.traced and not isinstance(found, Trace):
            found = Trace.of_case(found)
        run.meets_trigger = bool(impl.trigger(found))
    return run


def run_attnfuzz(
    target: Target,
    impl: Implementation,
    seed: int,
    budget_s: float | None,
    *,
    shrink_budget_s: float | None = None,
    max_examples: int | None = None,
    scale: Scale = SMALL,
    device: str | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> SeedRun:
    """The shipped strategy, derandomized by ``seed``, no example database; then shrinking.
    A mutant of the engine's life (``traced``) is searched with traces, each a new engine.

    ``budget_s`` None: no time limit, ``max_examples`` ends the search (and
    ``shrink_budget_s`` None then leaves shrinking unbounded too)."""
    searched: list[Case | Trace] = []
    state = {"found": False}

    def on_case(case: Case | Trace, verdict) -> None:
        if not state["found"]:  # the search only: shrinking starts after
            searched.append(case)
            state["found"] = not verdict.ok

    r = fuzz(
        target,
        impl,
        max_examples=max_examples or 10**9,  # without a cap, the budget ends the search
        rng_seed=seed,
        database=None,
        scale=scale,
        device=device,
        budget_s=budget_s,
        shrink_budget_s=budget_s if shrink_budget_s is None else shrink_budget_s,
        on_case=on_case,
        stop_requested=stop_requested,
        traced=impl.traced,
    )
    run = SeedRun(
        seed=seed,
        examples=r.examples_to_failure or r.examples,
        seconds=r.seconds_to_failure if r.failed else r.seconds,
        detected=r.failed,
        key=r.verdict.key if r.verdict is not None else None,
        case=r.case,
        shrink_cut=r.failed and r.stopped_by_budget,
        budget_s=budget_s,
    )
    if r.interrupted:  # while searching or shrinking: the zoo stops (see score_mutant)
        run.cut_by = "interrupted"
    elif not r.failed and r.stopped_by_budget:
        # A miss's budget stop is the search's (a failure's is shrinking's).
        run.cut_by = "time budget"
    return _finish(impl, run, searched)


def run_baseline(
    target: Target,
    impl: Implementation,
    cases: Iterator[Case] | Iterable[Case],
    seed: int,
    budget_s: float | None,
    *,
    max_examples: int | None = None,
    device: str | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> SeedRun:
    """Judge ``cases`` in order until the first failure, the budget, or the end of them.

    Timed like :func:`~attnfuzz.harness.runner.fuzz`: from the first judged
    example; generating later cases counts. The first failing case is reported
    as it came.
    """
    searched: list[Case] = []
    start: float | None = None
    cut_by = None
    for case in cases:
        if stop_requested is not None and stop_requested():
            raise KeyboardInterrupt
        now = time.perf_counter()
        start = now if start is None else start
        if max_examples is not None and len(searched) >= max_examples:
            break
        if budget_s is not None and now - start > budget_s:
            cut_by = "time budget"
            break
        verdict = target.judge(impl, case, device)
        searched.append(case)
        if not verdict.ok:
            run = SeedRun(seed, len(searched), time.perf_counter() - start, True, verdict.key, case)
            return _finish(impl, run, searched)
    seconds = 0.0 if start is None else time.perf_counter() - start
    run = SeedRun(seed, len(searched), seconds, False, cut_by=cut_by, budget_s=budget_s)
    return _finish(impl, run, searched)


def run_arm(
    arm: str,
    target: Target,
    impl: Implementation,
    seed: int,
    budget_s: float | None,
    *,
    shrink_budget_s: float | None = None,
    max_examples: int | None = None,
    scale: Scale = SMALL,
    device: str | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> SeedRun:
    """One seed of one arm (see :data:`ARMS`) on one implementation; the baseline
    arms draw with the implementation's ``fixes`` too, as the attnfuzz arm does.

    ``shrink_budget_s`` (``attnfuzz`` only; default ``budget_s``) bounds shrinking.
    ``stop_requested`` is asked before each example (a signal whose
    ``KeyboardInterrupt`` landed where Python ignores exceptions still stops).
    """
    if arm == "attnfuzz":
        return run_attnfuzz(
            target, impl, seed, budget_s, shrink_budget_s=shrink_budget_s,
            max_examples=max_examples, scale=scale, device=device,
            stop_requested=stop_requested,
        )  # fmt: skip
    params = target.params_of(impl)  # its narrower ranges, as ``Target.cases`` draws them
    if arm == "naive-random":
        cases: Iterable[Case] = naive_random_cases(
            random.Random(seed), scale, params, fixes=impl.fixes
        )
    elif arm == "grid":
        cases = grid_cases(scale, params, seed=seed, fixes=impl.fixes)
    else:
        raise ValueError(f"unknown arm {arm!r} (known: {', '.join(ARMS)})")
    if impl.declines is not None:  # as ``Target.cases`` draws for it
        cases = (case for case in cases if impl.declines(case) is None)
    if impl.admits is not None:  # nor one its engine never reaches
        cases = (case for case in cases if target.unreachable(impl, case) is None)
    return run_baseline(
        target, impl, cases, seed, budget_s, max_examples=max_examples, device=device,
        stop_requested=stop_requested,
    )  # fmt: skip


def warm_up(target: Target, device: str | None = None) -> None:
    """Judge a few tidy cases on every non-reference implementation: the first
    call of a kernel compiles (or, interpreted, builds its caches), which no
    arm's first run should pay for."""
    for impl in target.implementations.values():
        if impl.kind in ("fixed", "mutant") and impl.why_unavailable() is None:
            tidy = grid_cases(SMALL, target.params_of(impl), fixes=impl.fixes)
            taken = [c for c in tidy if target.unreachable(impl, c) is None]
            for case in taken[:2]:
                target.judge(impl, case, device)


class ZooInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) stopped the zoo: ``scores`` holds what ran, the mutant in
    flight included with its seeds so far (the interrupted one cut, never a survivor)."""

    def __init__(self, scores: list[MutantScore]):
        super().__init__()
        self.scores = scores


def score_mutant(
    target: Target,
    impl: Implementation,
    arm: str,
    seeds: int,
    budget_s: float | None,
    *,
    min_examples: int = DEFAULT_MIN_EXAMPLES,
    **kwargs: Any,
) -> MutantScore:
    """Seeds ``0 .. seeds - 1`` of one arm on one mutant, each judged by the example
    floor ``min_examples`` (at most ``max_examples``: a seed is complete at its cap)."""
    smallest = CaseSize.of(impl.smallest()) if impl.smallest is not None else None
    cap = kwargs.get("max_examples")
    score = MutantScore(target.name, impl.name, arm, budget_s, [], impl.description, smallest)
    score.max_examples, score.min_examples = cap, min_examples
    floor = min_examples if cap is None else min(min_examples, cap)
    for seed in range(seeds):
        try:
            run = run_arm(arm, target, impl, seed, budget_s, **kwargs)
        except KeyboardInterrupt:  # a baseline arm judges without the runner's handling
            run = SeedRun(seed, 0, 0.0, False, cut_by="interrupted", budget_s=budget_s)
        run.min_examples = floor
        score.runs.append(run)
        if run.cut_by == "interrupted":  # Ctrl-C ends the zoo, not just this seed
            raise ZooInterrupted([score])
    return score


def run_zoo(
    targets: Sequence[str] | None = None,
    *,
    seeds: int = 5,
    budget_s: float | None = 10.0,
    arms: Sequence[str] = ("attnfuzz",),
    shrink_budget_s: float | None = None,
    max_examples: int | None = None,
    min_examples: int = DEFAULT_MIN_EXAMPLES,
    scale: Scale = SMALL,
    device: str | None = None,
    progress: Callable[[MutantScore], None] | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> list[MutantScore]:
    """Every mutant of every target (all registered ones by default), every arm.

    Arms of one mutant run one after another, so the machine's load is shared
    alike. ``progress`` is called with each score as soon as it is complete.
    ``budget_s`` None needs ``max_examples``: each seed then judges exactly that
    many examples (fewer when detected), so two runs score alike. Ctrl-C raises
    :class:`ZooInterrupted` with every score so far.
    """
    if budget_s is None and max_examples is None:
        raise ValueError("a zoo without a time budget needs max_examples")
    scores: list[MutantScore] = []
    try:
        _score_all(targets, scores, seeds, budget_s, arms, progress, min_examples=min_examples,
                   shrink_budget_s=shrink_budget_s, max_examples=max_examples, scale=scale,
                   device=device, stop_requested=stop_requested)  # fmt: skip
    except ZooInterrupted as stop:
        raise ZooInterrupted(scores + stop.scores) from None
    except KeyboardInterrupt:  # between two seeds (a warm-up, a report)
        raise ZooInterrupted(scores) from None
    return scores


def _score_all(
    targets: Sequence[str] | None,
    scores: list[MutantScore],
    seeds: int,
    budget_s: float | None,
    arms: Sequence[str],
    progress: Callable[[MutantScore], None] | None,
    **kwargs: Any,
) -> None:
    device = kwargs["device"]
    for name in targets or registry.target_names():
        target = registry.get_target(name)
        warm_up(target, device)
        for impl in target.mutants:
            for arm in arms:
                score = score_mutant(
                    target,
                    impl,
                    arm,
                    seeds,
                    budget_s,
                    **kwargs,
                )
                scores.append(score)
                if progress is not None:
                    progress(score)
