"""The zoo's model: a seed's run, a mutant's score over seeds, the size of a case."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from attnfuzz.harness.definitions import CAUGHT, INCOMPLETE, KILLED, SURVIVED
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace

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
    steps: int = 1  # a trace's steps; its requests are distinct ids, its tokens all steps'

    @classmethod
    def of(cls, case: Case | Trace) -> CaseSize:
        if isinstance(case, Trace):
            ids = {i for step in case.steps for i in step.request_ids}
            return cls(
                len(ids),
                sum(sum(step.q_lens) for step in case.steps),
                case.config.next_n,
                case.config.max_model_len,
                tuple(case.params),
                len(case.steps),
            )
        batch = case.batch
        return cls(
            batch.num_reqs,
            sum(batch.q_lens),
            case.config.next_n,
            case.config.max_model_len,
            tuple(case.params),
        )

    def __str__(self) -> str:
        parts = [f"{self.steps} steps"] if self.steps > 1 else []
        parts += [f"{self.requests} req", f"{self.tokens} tok", f"next_n {self.next_n}"]
        parts += [f"len {self.max_model_len}"] + [f"{k} {v}" for k, v in self.params]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = self._asdict()
        d["params"] = dict(self.params)
        if self.steps == 1:  # a case on its own: as before traces
            del d["steps"]
        return d


_SIZE_FIELDS = (
    ("steps", "steps"),
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
    case: Case | Trace | None = None  # minimized (attnfuzz) or first failing (baselines)
    reached: int | None = None  # None: the mutant declares no ``reach``
    triggered: int | None = None  # None: the mutant declares no ``trigger``
    meets_trigger: bool | None = None  # the reported case meets the trigger
    shrink_cut: bool = False  # the shrink budget ran out before shrinking ended
    # What ended a search that found nothing before it ended by itself (its
    # example cap, a finite arm's last case): "time budget", "interrupted".
    cut_by: str | None = None
    budget_s: float | None = None  # the search's time budget, for the record
    min_examples: int = 0  # the floor this seed is judged by (see ``incomplete``)

    @property
    def size(self) -> CaseSize | None:
        return CaseSize.of(self.case) if self.case is not None else None

    @property
    def incomplete(self) -> bool:
        """Missed, but cut short of the floor (the machine's speed decided, not the
        search) or interrupted at any count (an interrupt never makes a survivor). A
        seed that ended by itself (its cap, a finite arm exhausted) is complete."""
        if self.detected or self.cut_by is None:
            return False
        return self.cut_by == "interrupted" or self.examples < self.min_examples

    @property
    def verdict(self) -> str:
        """This seed's word: ``caught``, ``survived`` or ``INCOMPLETE``."""
        return CAUGHT if self.detected else INCOMPLETE if self.incomplete else SURVIVED

    def why_incomplete(self) -> str | None:
        """``120 of 200 examples in the 10 s budget`` for an incomplete seed, else None."""
        if not self.incomplete:
            return None
        if self.cut_by == "interrupted":
            return f"interrupted after {self.examples} examples"
        short = f"{self.examples} of {self.min_examples} examples"
        if self.cut_by == "time budget" and self.budget_s is not None:
            return f"{short} in the {self.budget_s:g} s budget"
        return f"{short} ({self.cut_by})"

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
            "verdict": self.verdict,
            "min_examples": self.min_examples,
            "cut_by": self.cut_by,
            "incomplete": self.why_incomplete(),
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
    budget_s: float | None  # None: no time budget (``max_examples`` ends each seed)
    runs: list[SeedRun] = field(default_factory=list)
    description: str = ""
    smallest: CaseSize | None = None
    max_examples: int | None = None
    min_examples: int = 0  # the floor asked for (each seed's may be lower: its cap)

    @property
    def found(self) -> int:
        return sum(r.detected for r in self.runs)

    @property
    def incomplete_runs(self) -> list[SeedRun]:
        return [r for r in self.runs if r.incomplete]

    @property
    def status(self) -> str:
        """``killed`` (every seed detected it), ``survived`` (some seed searched at least
        the floor and missed), else ``INCOMPLETE`` (the misses were all cut short)."""
        if self.runs and self.found == len(self.runs):
            return KILLED
        if not self.runs or any(r.verdict == SURVIVED for r in self.runs):
            return SURVIVED
        return INCOMPLETE

    def status_text(self) -> str:
        """The status, an incomplete one with each cut seed's examples and why."""
        if self.status != INCOMPLETE:
            return self.status
        seeds = "; ".join(f"seed {r.seed}: {r.why_incomplete()}" for r in self.incomplete_runs)
        return f"{INCOMPLETE} ({seeds})"

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
            self.status_text(),
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
            "incomplete_seeds": len(self.incomplete_runs),
            "budget_s": self.budget_s,
            "max_examples": self.max_examples,
            "min_examples": self.min_examples,
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

# Wall-clock columns: left out of a scoreboard meant to be the same run after run
# (``attnfuzz zoo --max-examples``); zoo.json keeps every seed's seconds.
TIME_COLUMNS = ("median s", "worst s")
