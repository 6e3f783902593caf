"""The bug zoo: every mutant of every target, searched under a budget, on a scoreboard.

One *run* searches one mutant with one *arm* (a way of producing cases) and
one seed, for at most ``budget_s`` seconds of wall clock, and stops at the
first case the oracle rejects. Arms:

- ``attnfuzz``: the target's shipped Hypothesis strategy through
  :func:`attnfuzz.harness.runner.fuzz`; the failure is then shrunk;
- ``naive-random``: :func:`attnfuzz.strategies.baselines.naive_random_cases`;
- ``grid``: :func:`attnfuzz.strategies.baselines.grid_cases`, a finite list.

Every arm judges with the same ``Target.judge``: the same oracle. Baselines
report the first failing case as it came (nothing shrinks them).

For each mutant the scoreboard says, over S seeds:

- *reached*: search examples for which ``Implementation.reach`` holds (they
  run the code the bug lives in); *triggered*: those for which
  ``Implementation.trigger`` holds (the case meets the bug's condition). Both
  count the examples of the search, up to and including the first detection
  (never shrinking), so a miss with ``triggered == 0`` says generation fell
  short and a miss with ``triggered > 0`` says the oracle did;
- *detected*: seeds whose run found it; time and examples to the first
  detection, median and worst over *all* seeds, a miss counting as infinite
  (printed ``miss``), so that a median never hides misses;
- the size of the reported case (:class:`CaseSize`) and its gap to
  ``Implementation.smallest``, the smallest trigger derived by hand.

A mutant is *killed* when every seed detects it; otherwise it *survived*
(in some seeds or all), and ``attnfuzz zoo`` exits 1.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from attnfuzz.harness import registry
from attnfuzz.harness.definitions import ZOO_SCHEMA, markdown_table
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference.batch import Case
from attnfuzz.strategies.baselines import grid_cases, naive_random_cases
from attnfuzz.strategies.batches import SMALL, Scale

ARMS = ("attnfuzz", "naive-random", "grid")


class CaseSize(NamedTuple):
    """How big a case is, compared field by field (and ordered in this order).

    ``requests`` and ``tokens`` are the scheduled (real) requests and tokens
    of the step, padding excluded; ``next_n`` and ``max_model_len`` come from
    the engine config; ``params`` are the target's own integers by name. The
    data seed, block size and the other config integers are not sizes: they
    choose among cases of the same size.
    """

    requests: int
    tokens: int
    next_n: int
    max_model_len: int
    params: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, case: Case) -> CaseSize:
        batch = case.batch
        return cls(
            batch.num_reqs,
            sum(batch.q_lens),
            case.config.next_n,
            case.config.max_model_len,
            tuple(case.params),
        )

    def __str__(self) -> str:
        parts = [f"{self.requests} req", f"{self.tokens} tok", f"next_n {self.next_n}"]
        parts += [f"len {self.max_model_len}"] + [f"{k} {v}" for k, v in self.params]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["params"] = dict(self.params)
        return d


_SIZE_FIELDS = (
    ("requests", "req"),
    ("tokens", "tok"),
    ("next_n", "next_n"),
    ("max_model_len", "len"),
)


def size_gap(found: CaseSize, smallest: CaseSize) -> str:
    """The fields where ``found`` differs from the hand-derived ``smallest``.

    ``"none"`` when they are the same size; otherwise signed differences such
    as ``"req +1, tok +2"`` (a negative one means the hand-derived trigger is
    not the smallest in that field, or the shrinker traded one field for
    another); parameters that differ as ``"name 3 vs 1"``.
    """
    parts = []
    for name, short in _SIZE_FIELDS:
        delta = getattr(found, name) - getattr(smallest, name)
        if delta:
            parts.append(f"{short} {delta:+d}")
    mine, hand = dict(found.params), dict(smallest.params)
    for name in sorted(set(mine) | set(hand)):
        if mine.get(name) != hand.get(name):
            parts.append(f"{name} {mine.get(name, '-')} vs {hand.get(name, '-')}")
    return ", ".join(parts) or "none"


@dataclass
class SeedRun:
    """One arm searching one mutant with one seed."""

    seed: int
    examples: int  # search examples judged, up to and including the first detection
    seconds: float  # wall clock of the search, to the first detection when detected
    detected: bool
    key: str | None = None  # the verdict's key (which check failed)
    case: Case | None = None  # minimized (attnfuzz) or first failing (baselines)
    reached: int | None = None  # None: the mutant declares no ``reach``
    triggered: int | None = None  # None: the mutant declares no ``trigger``
    meets_trigger: bool | None = None  # the reported case meets the trigger
    shrink_cut: bool = False  # the shrink budget ran out before shrinking ended

    @property
    def size(self) -> CaseSize | None:
        return CaseSize.of(self.case) if self.case is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "detected": self.detected,
            "examples": self.examples,
            "seconds": round(self.seconds, 4),
            "key": self.key,
            "reached": self.reached,
            "triggered": self.triggered,
            "case": self.case.to_dict() if self.case is not None else None,
            "size": self.size.to_dict() if self.size is not None else None,
            "meets_trigger": self.meets_trigger,
            "shrink_cut": self.shrink_cut,
        }


def _censored(values: Iterable[float | None]) -> list[float]:
    return [math.inf if v is None else v for v in values]


def _fmt(value: float, digits: int) -> str:
    return "miss" if math.isinf(value) else f"{value:.{digits}f}"


@dataclass
class MutantScore:
    """All seeds of one arm on one mutant, and what the scoreboard prints of them."""

    target: str
    mutant: str
    arm: str
    budget_s: float
    runs: list[SeedRun] = field(default_factory=list)
    description: str = ""
    smallest: CaseSize | None = None

    @property
    def found(self) -> int:
        return sum(r.detected for r in self.runs)

    @property
    def status(self) -> str:
        return "killed" if self.runs and self.found == len(self.runs) else "survived"

    def _count(self, name: str) -> int | None:
        values = [getattr(r, name) for r in self.runs]
        return None if any(v is None for v in values) else sum(values)

    @property
    def reached(self) -> int | None:
        return self._count("reached")

    @property
    def triggered(self) -> int | None:
        return self._count("triggered")

    @property
    def examples(self) -> int:
        return sum(r.examples for r in self.runs)

    def seconds(self) -> list[float]:
        """Seconds to detection per seed, a miss as ``inf``."""
        return _censored(r.seconds if r.detected else None for r in self.runs)

    def examples_to_detection(self) -> list[float]:
        return _censored(r.examples if r.detected else None for r in self.runs)

    @property
    def median_seconds(self) -> float:
        return statistics.median(self.seconds()) if self.runs else math.inf

    @property
    def worst_seconds(self) -> float:
        return max(self.seconds(), default=math.inf)

    @property
    def median_examples(self) -> float:
        return statistics.median(self.examples_to_detection()) if self.runs else math.inf

    @property
    def worst_examples(self) -> float:
        return max(self.examples_to_detection(), default=math.inf)

    @property
    def worst_size(self) -> CaseSize | None:
        """The largest reported case over the seeds (what shrinking left at worst)."""
        sizes = [r.size for r in self.runs if r.size is not None]
        return max(sizes, default=None)

    @property
    def gap(self) -> str:
        worst = self.worst_size
        if worst is None or self.smallest is None:
            return "-"
        return size_gap(worst, self.smallest)

    def _share(self, count: int | None) -> str:
        return "-" if count is None else f"{count}/{self.examples}"

    def row(self) -> list[str]:
        """One scoreboard line (see :data:`COLUMNS`)."""
        meets = [r.meets_trigger for r in self.runs if r.meets_trigger is not None]
        cut = any(r.shrink_cut for r in self.runs)
        return [
            self.target,
            self.mutant,
            self.arm,
            f"{self.found}/{len(self.runs)}",
            self._share(self.reached),
            self._share(self.triggered),
            _fmt(self.median_seconds, 2),
            _fmt(self.worst_seconds, 2),
            _fmt(self.median_examples, 0),
            _fmt(self.worst_examples, 0),
            "-" if self.worst_size is None else str(self.worst_size) + (" (cut)" if cut else ""),
            "-" if self.smallest is None else str(self.smallest),
            self.gap,
            "-" if not meets else f"{sum(meets)}/{len(meets)}",
            self.status,
        ]

    def to_dict(self) -> dict[str, Any]:
        inf_none = lambda x: None if math.isinf(x) else x  # noqa: E731 - JSON has no inf
        return {
            "target": self.target,
            "mutant": self.mutant,
            "arm": self.arm,
            "description": self.description,
            "status": self.status,
            "detected": self.found,
            "seeds": len(self.runs),
            "examples": self.examples,
            "reached": self.reached,
            "triggered": self.triggered,
            "median_seconds": inf_none(self.median_seconds),
            "worst_seconds": inf_none(self.worst_seconds),
            "median_examples": inf_none(self.median_examples),
            "worst_examples": inf_none(self.worst_examples),
            "worst_size": self.worst_size.to_dict() if self.worst_size else None,
            "smallest": self.smallest.to_dict() if self.smallest else None,
            "gap": self.gap,
            "runs": [r.to_dict() for r in self.runs],
        }


COLUMNS = [
    "target",
    "mutant",
    "arm",
    "detected",
    "reached",
    "triggered",
    "median s",
    "worst s",
    "median ex",
    "worst ex",
    "reported case (worst)",
    "smallest by hand",
    "gap",
    "meets trigger",
    "status",
]


def _count_matching(predicate: Callable[[Case], bool] | None, cases: Sequence[Case]) -> int | None:
    return None if predicate is None else sum(bool(predicate(c)) for c in cases)


def _finish(impl: Implementation, run: SeedRun, searched: Sequence[Case]) -> SeedRun:
    """Counts over the search examples, evaluated after the run so they cost no search time."""
    run.reached = _count_matching(impl.reach, searched)
    run.triggered = _count_matching(impl.trigger, searched)
    if run.case is not None and impl.trigger is not None:
        run.meets_trigger = bool(impl.trigger(run.case))
    return run


def run_attnfuzz(
    target: Target,
    impl: Implementation,
    seed: int,
    budget_s: float,
    *,
    shrink_budget_s: float | None = None,
    max_examples: int | None = None,
    scale: Scale = SMALL,
    device: str | None = None,
) -> SeedRun:
    """The shipped strategy, derandomized by ``seed``, no example database; then shrinking."""
    searched: list[Case] = []
    state = {"found": False}

    def on_case(case: Case, verdict) -> None:
        if not state["found"]:  # the search only: shrinking starts after
            searched.append(case)
            state["found"] = not verdict.ok

    r = fuzz(
        target,
        impl,
        max_examples=max_examples or 10**9,  # the budget ends the search
        rng_seed=seed,
        database=None,
        scale=scale,
        device=device,
        budget_s=budget_s,
        shrink_budget_s=budget_s if shrink_budget_s is None else shrink_budget_s,
        on_case=on_case,
    )
    run = SeedRun(
        seed=seed,
        examples=r.examples_to_failure or r.examples,
        seconds=r.seconds_to_failure if r.failed else r.seconds,
        detected=r.failed,
        key=r.verdict.key if r.verdict is not None else None,
        case=r.case,
        shrink_cut=r.failed and r.stopped_by_budget,
    )
    return _finish(impl, run, searched)


def run_baseline(
    target: Target,
    impl: Implementation,
    cases: Iterator[Case] | Iterable[Case],
    seed: int,
    budget_s: float,
    *,
    max_examples: int | None = None,
    device: str | None = None,
) -> SeedRun:
    """Judge ``cases`` in order until the first failure, the budget, or the end of them.

    Timed like :func:`~attnfuzz.harness.runner.fuzz`: from the first judged
    example; generating later cases counts. The first failing case is reported
    as it came.
    """
    searched: list[Case] = []
    start: float | None = None
    for case in cases:
        now = time.perf_counter()
        start = now if start is None else start
        if now - start > budget_s or (max_examples is not None and len(searched) >= max_examples):
            break
        verdict = target.judge(impl, case, device)
        searched.append(case)
        if not verdict.ok:
            run = SeedRun(seed, len(searched), time.perf_counter() - start, True, verdict.key, case)
            return _finish(impl, run, searched)
    seconds = 0.0 if start is None else time.perf_counter() - start
    return _finish(impl, SeedRun(seed, len(searched), seconds, False), searched)


def run_arm(
    arm: str,
    target: Target,
    impl: Implementation,
    seed: int,
    budget_s: float,
    *,
    shrink_budget_s: float | None = None,
    max_examples: int | None = None,
    scale: Scale = SMALL,
    device: str | None = None,
) -> SeedRun:
    """One seed of one arm (see :data:`ARMS`) on one implementation.

    ``shrink_budget_s`` (``attnfuzz`` only; default ``budget_s``) bounds shrinking.
    """
    if arm == "attnfuzz":
        return run_attnfuzz(
            target, impl, seed, budget_s, shrink_budget_s=shrink_budget_s,
            max_examples=max_examples, scale=scale, device=device,
        )  # fmt: skip
    if arm == "naive-random":
        cases: Iterable[Case] = naive_random_cases(random.Random(seed), scale, target.params)
    elif arm == "grid":
        cases = grid_cases(scale, target.params, seed=seed)
    else:
        raise ValueError(f"unknown arm {arm!r} (known: {', '.join(ARMS)})")
    return run_baseline(
        target, impl, cases, seed, budget_s, max_examples=max_examples, device=device
    )


def warm_up(target: Target, device: str | None = None) -> None:
    """Judge a few tidy cases on every non-reference implementation: the first
    call of a kernel compiles (or, interpreted, builds its caches), which no
    arm's first run should pay for."""
    for impl in target.implementations.values():
        if impl.kind in ("fixed", "mutant") and impl.why_unavailable() is None:
            for case in grid_cases(SMALL, target.params)[:2]:
                target.judge(impl, case, device)


def score_mutant(
    target: Target,
    impl: Implementation,
    arm: str,
    seeds: int,
    budget_s: float,
    **kwargs: Any,
) -> MutantScore:
    """Seeds ``0 .. seeds - 1`` of one arm on one mutant."""
    smallest = CaseSize.of(impl.smallest()) if impl.smallest is not None else None
    score = MutantScore(target.name, impl.name, arm, budget_s, [], impl.description, smallest)
    for seed in range(seeds):
        score.runs.append(run_arm(arm, target, impl, seed, budget_s, **kwargs))
    return score


def run_zoo(
    targets: Sequence[str] | None = None,
    *,
    seeds: int = 5,
    budget_s: float = 10.0,
    arms: Sequence[str] = ("attnfuzz",),
    shrink_budget_s: float | None = None,
    max_examples: int | None = None,
    scale: Scale = SMALL,
    device: str | None = None,
    progress: Callable[[MutantScore], None] | None = None,
) -> list[MutantScore]:
    """Every mutant of every target (all registered ones by default), every arm.

    Arms of one mutant run one after another, so the machine's load is shared
    alike. ``progress`` is called with each score as soon as it is complete.
    """
    scores = []
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
                    shrink_budget_s=shrink_budget_s,
                    max_examples=max_examples,
                    scale=scale,
                    device=device,
                )
                scores.append(score)
                if progress is not None:
                    progress(score)
    return scores


def scoreboard(scores: Sequence[MutantScore]) -> str:
    return markdown_table(COLUMNS, [s.row() for s in scores])


def survivors(scores: Sequence[MutantScore]) -> list[MutantScore]:
    return [s for s in scores if s.arm == "attnfuzz" and s.status != "killed"]


def write_reports(
    scores: Sequence[MutantScore], out: Path, *, seeds: int, budget_s: float, device: str
) -> tuple[Path, Path]:
    """``zoo.json`` (every run, every case) and ``zoo.md`` (the scoreboard) in ``out``."""
    from attnfuzz.harness.casefile import environment

    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": ZOO_SCHEMA,
        "seeds": seeds,
        "budget_s": budget_s,
        "environment": environment(device),
        "mutants": [s.to_dict() for s in scores],
    }
    json_path, md_path = out / "zoo.json", out / "zoo.md"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    lost = survivors(scores)
    md_path.write_text(
        f"# Bug zoo\n\n{seeds} seeds, {budget_s:g} s budget per mutant and seed, "
        f"device {device}.\n\n{scoreboard(scores)}\n\n"
        + (
            f"Survived: {', '.join(f'{s.target}/{s.mutant}' for s in lost)}\n"
            if lost
            else "Every mutant killed in every seed.\n"
        )
    )
    return json_path, md_path
