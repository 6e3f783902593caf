"""The bug zoo: every mutant of every target, searched under a budget, on a scoreboard.

One *run* searches one mutant with one *arm* (a way of producing cases) and
one seed, for at most ``budget_s`` seconds of wall clock and/or
``max_examples`` examples, and stops at the first case the oracle rejects. Arms:

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

A seed that misses is *survived* only once it judged the example floor
(``min_examples``, default :data:`~attnfuzz.harness.definitions.DEFAULT_MIN_EXAMPLES`,
at most its ``max_examples``); one whose time budget ended sooner is
*INCOMPLETE*: the machine's speed, not the search, decided it. A detection
counts at any number of examples. A mutant is *killed* when every seed
detects it; *survived* when some seed survived (``attnfuzz zoo`` exits 1);
otherwise, some seed incomplete and none survived, *INCOMPLETE* (exit 3,
unless another mutant survived).
"""

from __future__ import annotations

from attnfuzz.harness.definitions import markdown_table
from attnfuzz.harness.zoo.arms import (
    ZooInterrupted,
    run_arm,
    run_attnfuzz,
    run_baseline,
    run_zoo,
    score_mutant,
    warm_up,
)
from attnfuzz.harness.zoo.report import (
    exit_status,
    incomplete,
    scoreboard,
    survivors,
    verdict_lines,
    write_reports,
    zoo_verdict,
)
from attnfuzz.harness.zoo.scores import (
    ARMS,
    COLUMNS,
    TIME_COLUMNS,
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
    "TIME_COLUMNS",
    "ZooInterrupted",
    "exit_status",
    "incomplete",
    "markdown_table",  # re-exported: the benchmarks' tables
    "run_arm",
    "run_attnfuzz",
    "run_baseline",
    "run_zoo",
    "score_mutant",
    "scoreboard",
    "size_gap",
    "survivors",
    "verdict_lines",
    "warm_up",
    "write_reports",
    "zoo_verdict",
]
