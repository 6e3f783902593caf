"""What a failure must survive before it is reported: replays in new processes.

A search judges its examples in one long-lived child (a trace: each in a new
one), and Hypothesis replays a failure there. That replay proves little: the
child remembers what ran before, and a slow machine times out where a fast
one would not. So before a run reports a failure, :func:`confirm` replays its
minimized case (or trace) in new processes:

- a **timeout** is judged once more, in a new process, under
  :data:`RECHECK_FACTOR` times the per-example timeout. Still no verdict: a
  hang, the ``timeout`` finding. A verdict that fails: that verdict is the
  finding (the call was only slow). A pass: ``SLOW``, no verdict at all (the
  run is incomplete), never a finding from the machine's speed;
- any other failure is replayed up to :data:`REPLAYS` times, each in a new
  process. Failing the first :data:`CONFIRMING` replays with the same check,
  it is ``CONFIRMED``; failing some of them, ``FLAKY`` (``failed`` of
  ``replays``);
- failing none: the examples the judging process ran up to the failure (its
  history) are replayed, in order, in one new process, :data:`HISTORY_REPLAYS`
  times. When each replay fails at the same place, the case that failed and
  none before it, with the same check, the failure is ``HISTORY_DEPENDENT``:
  what ran before it in the process decides. Otherwise it is ``FLAKY`` with 0
  failed replays: it failed in the search only.

Replays are a count, never a time. A failure of a user's code that comes and
goes at random (or with the wall clock, or a loaded machine's pace), failing a
fraction ``p`` of calls, can still fail :data:`CONFIRMING` replays in a row
(``p**5``: below 1e-4 for ``p`` up to 15%), or pass :data:`REPLAYS` replays and
then fail at the same place of every history replay (at most
``(1 - p)**10 * p**5``, below 1e-4 whatever ``p``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnfuzz.harness.oracle import Check, Verdict
from attnfuzz.reference.trace import Trace

if TYPE_CHECKING:
    from attnfuzz.harness.isolation import IsolatedJudge
    from attnfuzz.reference.batch import Case

RECHECK_FACTOR = 10  # a timeout is judged again under this many times the timeout
CONFIRMING = 5  # replays that all fail confirm a failure
REPLAYS = 10  # replays that count how often a failure that comes and goes fails
HISTORY_REPLAYS = 5  # replays of the history that must each fail where it failed


class Status(enum.Enum):
    CONFIRMED = "confirmed"  # it fails each time, in a new process
    FLAKY = "flaky"  # it fails some of the times, or none, of the same case's replays
    HISTORY_DEPENDENT = "history-dependent"  # it fails after what ran before it, only
    SLOW = "slow"  # a timeout that a longer limit turns into a pass: no verdict


@dataclass
class Confirmation:
    """How a failure fared on replay.

    ``verdict`` is the finding's verdict after confirmation: the search's, or
    for a timeout judged again with a longer limit, that judgement's.
    ``replays`` and ``failed`` count the replays of the same case (or trace)
    in new processes and how many failed with the finding's check.
    """

    status: Status
    verdict: Verdict
    replays: int = 0
    failed: int = 0
    timeout_s: float | None = None  # a timeout's second judgement: its limit

    def flaky_record(self) -> dict[str, int]:
        """The case file's ``flaky`` entry."""
        return {"failed": self.failed, "replays": self.replays}


def confirm(
    isolated: IsolatedJudge,
    example: Case | Trace,
    verdict: Verdict,
    history: Sequence[Case] = (),
    deadline: float | None = None,
) -> Confirmation:
    """Replay a failure of ``example`` (``verdict``) in new processes (module doc).

    ``history``: the cases the judging process judged up to the failure, oldest
    first, the failing one last (a single-step search's; empty for a trace).
    ``deadline`` (``time.time()``) bounds each judgement as the isolated judge's
    does (:class:`~attnfuzz.harness.isolation.OutOfTime` past it). A Ctrl-C
    (``KeyboardInterrupt``) goes through: the caller keeps the failure unconfirmed.
    """
    if verdict.key == Check.TIMEOUT:
        return _recheck_timeout(isolated, example, verdict, deadline)
    key = verdict.key
    failed = 0
    for replays in range(1, REPLAYS + 1):
        failed += _fails_alike(_judge_fresh(isolated, example, deadline), key)
        if replays == CONFIRMING and failed == CONFIRMING:
            return Confirmation(Status.CONFIRMED, verdict, replays, failed)
    if failed == 0 and _history_reproduces(isolated, history, key, deadline):
        return Confirmation(Status.HISTORY_DEPENDENT, verdict, REPLAYS, 0)
    return Confirmation(Status.FLAKY, verdict, REPLAYS, failed)


def _recheck_timeout(
    isolated: IsolatedJudge, example: Case | Trace, verdict: Verdict, deadline: float | None
) -> Confirmation:
    base = isolated.timeout_s
    isolated.timeout_s = base * RECHECK_FACTOR
    try:
        again = _judge_fresh(isolated, example, deadline)
    finally:
        isolated.timeout_s = base
    limit = base * RECHECK_FACTOR
    if again.ok:
        return Confirmation(Status.SLOW, verdict, 1, 0, timeout_s=limit)
    if again.key == Check.TIMEOUT:
        return Confirmation(Status.CONFIRMED, verdict, 1, 1, timeout_s=limit)
    return Confirmation(Status.CONFIRMED, again, 1, 1, timeout_s=limit)


def _judge_fresh(isolated: IsolatedJudge, example: Case | Trace, deadline: float | None) -> Verdict:
    if isinstance(example, Trace):  # every trace is judged in a new process
        return isolated.judge_trace(example, deadline=deadline)
    return isolated.judge_fresh(example, deadline=deadline)


def _fails_alike(verdict: Verdict, key: str) -> bool:
    return not verdict.ok and verdict.key == key


def _history_reproduces(
    isolated: IsolatedJudge, history: Sequence[Case], key: str, deadline: float | None
) -> bool:
    """Whether the case that failed (the history's last) fails again, with the same
    check and at the same place, each time its history is replayed in order in a
    new process: a case before it that fails alike is a fault of when it ran."""
    if len(history) < 2:
        return False  # nothing ran before it in its process: no history to depend on
    for _ in range(HISTORY_REPLAYS):
        if _fails_alike(isolated.judge_fresh(history[0], deadline=deadline), key):
            return False
        for case in history[1:-1]:
            if _fails_alike(isolated.judge(case, deadline=deadline), key):
                return False
        if not _fails_alike(isolated.judge(history[-1], deadline=deadline), key):
            return False
    return True
