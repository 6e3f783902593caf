"""``attnfuzz run``'s progress: one short line on stderr, at most every :data:`EVERY_S`.

What it counts is what was judged, never a guess from the clock: the search's
examples (or traces) as the runner records them (``on_case`` of
:func:`attnfuzz.harness.runner.fuzz`, shrinking included), then the replays of a
failure in new processes (:class:`Counted`). A line is written when something
was judged and :data:`EVERY_S` has passed since the last one (or since the
start): a run shorter than that says nothing, and stdout (the verdict) is
never written to.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.reference.batch import Case
    from attnfuzz.reference.trace import Trace

EVERY_S = 5.0
"""Seconds between two progress lines, at least."""


class RunProgress:
    """The phase of a run (searching, shrinking, confirming, reachability) and its counts."""

    def __init__(self, max_examples: int, stream: TextIO | None = None):
        self.max_examples = max_examples
        self.stream = stream  # None: sys.stderr as it is when a line is written
        self.start = self.last = time.monotonic()
        self.phase = "searching"
        self.what = "examples"
        self.judged = 0  # by the search, shrinking included (the runner's count)
        self.first_failure: int | None = None  # the search's count at its first failure
        self.replays = 0
        # The whole run's judgements, never reset: every search's (shrinking included)
        # and every one in a new process (replays, a history's traces).
        self.searched = self.in_new_processes = 0

    def search(self, traced: bool) -> None:
        """A search begins (a second one: a history-dependent failure searched as traces)."""
        self.phase, self.what = "searching", "traces" if traced else "examples"
        self.judged, self.first_failure = 0, None
        self.tick()

    def judged_one(self, case: Case | Trace, verdict: Verdict) -> None:
        """The runner's ``on_case``: one more example (or trace) judged."""
        from attnfuzz.harness.runner import ENDS_RUN_UNSHRUNK

        self.judged += 1
        self.searched += 1
        if not verdict.ok and self.first_failure is None:
            self.first_failure = self.judged
            if verdict.key not in ENDS_RUN_UNSHRUNK:  # a hang ends the search, unshrunk
                self.phase = "shrinking"
        self.tick()

    def confirming(self) -> None:
        """The failure is replayed in new processes (:mod:`attnfuzz.harness.confirm`)."""
        self.phase, self.replays = "confirming", 0
        self.tick()

    def replayed(self) -> None:
        self.replays += 1
        self.in_new_processes += 1
        self.tick()

    def totals(self) -> str:
        """The judgements that made the run's case, for its last lines: a count, not a
        time (reachability, which follows the case, is not counted)."""
        return (
            f"judgements to this case: {self.searched + self.in_new_processes} "
            f"({self.searched} by the search and its shrinking, {self.in_new_processes} in "
            "new processes)"
        )

    def reachability(self) -> None:
        """Whether the engine runs the failing code (:mod:`attnfuzz.harness.reachability`)."""
        self.phase = "reachability"
        self.tick()

    def line(self) -> str:
        if self.phase == "searching":
            return f"searching: {self.judged}/{self.max_examples} {self.what} judged"
        if self.phase == "shrinking":  # held to --max-examples judgements after the failure
            assert self.first_failure is not None
            since = self.judged - self.first_failure
            return (
                f"shrinking: {since}/{self.max_examples} {self.what} judged since the first "
                f"failure ({self.what[:-1]} {self.first_failure})"
            )
        judged = f"after {self.judged} {self.what}"
        if self.phase == "confirming":
            replays = f"{self.replays} replay{'' if self.replays == 1 else 's'}"
            return f"confirming: {replays} in new processes ({judged})"
        return f"reachability: whether the engine runs the failing code ({judged})"

    def tick(self) -> None:
        """Write :meth:`line` if :data:`EVERY_S` has passed since the last one."""
        now = time.monotonic()
        if now - self.last < EVERY_S:
            return
        self.last = now
        stream = self.stream or sys.stderr
        print(f"run: [{now - self.start:6.1f}s] {self.line()}", file=stream, flush=True)


class Counted:
    """An isolated judge (:class:`~attnfuzz.harness.isolation.IsolatedJudge`) whose
    judgements each count as a replay of ``progress``: what :func:`~attnfuzz.harness.
    confirm.confirm` replays the failure on."""

    def __init__(self, isolated: Any, progress: RunProgress):
        self._isolated, self._progress = isolated, progress

    @property
    def impl(self) -> Any:
        """The implementation judged (what a history's cuts are refused by)."""
        return self._isolated.impl

    @property
    def timeout_s(self) -> float:
        return self._isolated.timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:  # a timeout is judged again under a longer one
        self._isolated.timeout_s = value

    def judge(self, case: Case, *args: Any, **kwargs: Any) -> Verdict:
        return self._counted(self._isolated.judge(case, *args, **kwargs))

    def judge_fresh(self, case: Case, *args: Any, **kwargs: Any) -> Verdict:
        return self._counted(self._isolated.judge_fresh(case, *args, **kwargs))

    def judge_trace(self, trace: Trace, *args: Any, **kwargs: Any) -> Verdict:
        return self._counted(self._isolated.judge_trace(trace, *args, **kwargs))

    def _counted(self, verdict: Verdict) -> Verdict:
        self._progress.replayed()
        return verdict
