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

from attnfuzz.harness.definitions import markdown_table
from attnfuzz.harness.zoo.arms import (
    run_arm,
    run_attnfuzz,
    run_baseline,
    run_zoo,
    score_mutant,
    warm_up,
)
from attnfuzz.harness.zoo.report import scoreboard, survivors, write_reports
from attnfuzz.harness.zoo.scores import (
    ARMS,
    COLUMNS,
    CaseSize,
    MutantScore,
    SeedRun,
    size_gap,
)

__all__ = [
    "ARMS",
    "COLUMNS",
    "CaseSize",
    "MutantScore",
    "SeedRun",
    "markdown_table",  # re-exported: the benchmarks' tables
    "run_arm",
    "run_attnfuzz",
    "run_baseline",
    "run_zoo",
    "score_mutant",
    "scoreboard",
    "size_gap",
    "survivors",
    "warm_up",
    "write_reports",
]
