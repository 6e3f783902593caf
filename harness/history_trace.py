"""A history-dependent failure as a trace: the life its judging process lived.

A single-step search judges its examples one after another in one long-lived
child. A failure that passes in a new process, and fails again each time that
child's history is replayed (:mod:`attnfuzz.harness.confirm`'s
``HISTORY_DEPENDENT``), depends on what ran before it. That history is a life
an engine had: :func:`trace_of_history` replays it as a trace
(:class:`~attnfuzz.reference.trace.Trace`) of one engine in a new process and,
if it fails there the same way (the same check), cuts it down.

**From a history to a trace** (:func:`history_as_trace`): each example the
child judged, oldest first and the failing one last, becomes a step of one
engine. An example on its own is a new engine's first step: its requests are
all new. A step without the scheduler's fields (``req_ids``, ``pages``) already
says so in a trace; one with them gets request ids no other step of the trace
uses (its requests arrive new, with all their pages), so that every subset of
the steps is a life an engine can have too. A trace has one engine config and
one set of target parameters: first the failing example's. An earlier example
judged under others becomes a step under these (the closest life of one engine)
or, where its batch is no batch of that config, is left out. When that trace
does not fail, the history is tried under that config with limits that admit
every step (:func:`roomy_home`: an earlier example that padded to more requests
than the failing config allows is often what the failure needs), then under each
earlier example's config and parameters, newest first (:func:`history_traces`),
while the count allows. The
trace runs each step with
``fresh_engine=False``: the implementation's ``new_engine()`` (when it has one)
is called once, before step 0, where the history called it before each
example; what the history depended on may be exactly that, and then the trace
does not fail, and the caller falls back to a fresh trace search.

**Cutting it down** (:func:`minimize`): delta debugging over the steps before
the failing one (the failing step is always kept, last): the steps in halves,
then quarters, down to single steps, keeping any complement that still fails
with the same check; then requests are dropped from the steps left, a limit
lowered with what it bounds (:func:`~attnfuzz.harness.trace_shrink.shrink_tied`).
Each candidate is judged in a new process. The steps' lengths are not shrunk: a
step's fields are tied to what the others hold, and Hypothesis' shrinking works
on what it drew, not on a recorded history.

**The bound**: at most ``max_judgements`` traces are judged, the replays of
the whole history included: ``attnfuzz run`` passes ``--max-examples``, a
campaign unit its ``max_examples`` (or its profile's examples per round). A
trace that fails at an earlier step than its last ends there (its later steps
never ran); the minimized trace is then confirmed as any trace finding is
(:func:`~attnfuzz.harness.confirm.confirm`, at most ``REPLAYS`` more).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnfuzz.harness.errors import InvalidCase
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.trace_shrink import shrink_tied
from attnfuzz.harness.traces import lived, refuse_invalid_trace, refuse_unjudgeable_trace
from attnfuzz.reference.trace import Trace

if TYPE_CHECKING:
    from attnfuzz.harness.confirm import Confirmation
    from attnfuzz.harness.target import Target
    from attnfuzz.reference.batch import Batch, Case


@dataclass
class HistoryTrace:
    """A history that failed again as one engine's trace in a new process."""

    trace: Trace  # the minimized trace, its failing step last
    verdict: Verdict  # that trace's verdict in a new process (``step`` set)
    lived: int  # steps of the trace the whole history made
    judgements: int  # traces judged, each in a new process
    bound: int  # the most it could have judged

    def summary(self) -> str:
        return (
            f"its history replays as one engine's trace of {self.lived} steps in a new "
            f"process; cut to {len(self.trace.steps)} step(s) in {self.judgements} "
            f"judgements (at most {self.bound}), each in a new process"
        )


def history_as_trace(target: Target, history: Sequence[Case], home: Case) -> Trace | None:
    """The trace of one engine that ``history`` (oldest first, the failing case last)
    is under ``home``'s config and parameters, as the module doc says; None when the
    failing case is no step of it, or nothing ran before it there."""
    from attnfuzz.reference.batch import Case

    steps: list[Batch] = []
    next_id = 0
    for k, case in enumerate(history):
        batch = case.batch
        if batch.pages:  # the scheduler's fields: its requests arrive, new to the engine
            ids = tuple(range(next_id, next_id + batch.num_reqs))
            batch = dataclasses.replace(batch, req_ids=ids)
            next_id += batch.num_reqs
        try:
            target.refuse_invalid(Case(home.config, batch, home.params, home.dtype))
        except InvalidCase:  # no batch of that config: left out
            if k == len(history) - 1:
                return None
            continue
        steps.append(batch)
    trace = Trace(home.config, tuple(steps), home.params, home.dtype)
    if len(trace.steps) < 2:
        return None
    try:
        refuse_invalid_trace(target, trace)
    except InvalidCase:  # no engine could live it: nothing to replay
        return None
    return trace


def roomy_home(history: Sequence[Case]) -> Case:
    """The failing case (``history``'s last) under an engine whose limits admit every
    step of the history: its config with ``max_num_seqs``, ``max_num_batched_tokens``
    and ``max_model_len`` each the largest of the history's configs. Its graphs, mode
    and block size stay the failing case's: an engine of the same kind, with room."""
    home = history[-1]
    roomy = dataclasses.replace(
        home.config,
        max_num_seqs=max(c.config.max_num_seqs for c in history),
        max_num_batched_tokens=max(c.config.max_num_batched_tokens for c in history),
        max_model_len=max(c.config.max_model_len for c in history),
    )
    return dataclasses.replace(home, config=roomy)


def history_traces(target: Target, history: Sequence[Case]) -> list[Trace]:
    """The traces :func:`trace_of_history` replays, in order: ``history`` under the
    failing case's config and parameters, then under the same config with room for
    every step (:func:`roomy_home`), then under each earlier case's (newest first,
    each config and parameters once)."""
    homes: list[Case] = [history[-1], roomy_home(history)]
    for case in reversed(history[:-1]):
        homes.append(case)
    unique: list[Case] = []
    for case in homes:
        if all((case.config, case.params) != (h.config, h.params) for h in unique):
            unique.append(case)
    traces = [history_as_trace(target, history, home) for home in unique]
    return [t for t in traces if t is not None]


def minimize(
    trace: Trace, fails: Callable[[Trace], Verdict | None], budget: int
) -> tuple[Trace, Verdict | None, int]:
    """Delta debugging over the steps of ``trace`` before its last: the smallest
    trace found that ``fails`` (a failing verdict, else None), within ``budget`` calls.
    Returns that trace, its verdict (None if no candidate failed) and the calls made."""
    before, last = list(trace.steps[:-1]), trace.steps[-1]
    calls, verdict = 0, None
    n = 2
    while before and calls < budget:
        chunk = -(-len(before) // n)
        for i in range(0, len(before), chunk):
            if calls >= budget:
                break
            candidate = before[:i] + before[i + chunk :]
            calls += 1
            got = fails(Trace(trace.config, (*candidate, last), trace.params, trace.dtype))
            if got is not None:
                before, verdict = candidate, got
                n = max(n - 1, 2)
                break
        else:
            if n >= len(before):
                break
            n = min(2 * n, len(before))
    return Trace(trace.config, (*before, last), trace.params, trace.dtype), verdict, calls


def trace_of_history(
    target: Target,
    isolated: Any,
    history: Sequence[Case],
    key: str,
    max_judgements: int,
    deadline: float | None = None,
) -> HistoryTrace | None:
    """``history`` replayed as one engine's trace in a new process and, when it fails
    with check ``key`` there, cut down (module doc): at most ``max_judgements`` traces
    judged (``isolated.judge_trace``), each in a new process. None when the history
    is no trace, or its trace does not fail that way: search traces afresh then."""

    def fails(candidate: Trace) -> Verdict | None:
        try:  # a cut the implementation cannot judge (a step it declines): not judged
            refuse_unjudgeable_trace(target, isolated.impl, candidate)
        except InvalidCase:
            return None
        verdict = isolated.judge_trace(candidate, deadline=deadline)
        return verdict if not verdict.ok and verdict.key == key else None

    tried = 0
    for trace in history_traces(target, history) if len(history) > 1 else []:
        if tried >= max_judgements:
            return None
        tried += 1
        verdict = fails(trace)
        if verdict is not None:
            break
    else:
        return None
    whole = lived(trace, verdict)
    assert isinstance(whole, Trace)
    cut, better, calls = minimize(whole, fails, max_judgements - tried)
    if better is not None:
        verdict = better
        cut = lived(cut, verdict)
        assert isinstance(cut, Trace)
    else:
        cut = whole
    budget = max_judgements - tried - calls
    cut, tied, more = shrink_tied(target, cut, fails, budget, isolated.impl)
    verdict = tied or verdict
    judged = tried + calls + more
    return HistoryTrace(cut, verdict, len(whole.steps), judged, max_judgements)


def trace_after_history(
    target: Target,
    isolated: Any,
    history: Sequence[Case],
    verdict: Verdict,
    max_judgements: int,
    deadline: float | None = None,
) -> tuple[HistoryTrace, Confirmation] | None:
    """What follows a ``HISTORY_DEPENDENT`` confirmation of a single-step failure
    (``verdict``), in ``attnfuzz run`` and in a campaign alike: its ``history`` as a
    cut-down trace (:func:`trace_of_history`, at most ``max_judgements`` traces
    judged), confirmed as any trace finding (:func:`~attnfuzz.harness.confirm.confirm`,
    at most ``REPLAYS`` more). None: no trace of the history fails; the caller
    searches traces afresh (``attnfuzz run``) or keeps the finding history-dependent."""
    from attnfuzz.harness.confirm import confirm

    found = trace_of_history(target, isolated, history, verdict.key, max_judgements, deadline)
    if found is None:
        return None
    return found, confirm(isolated, found.trace, found.verdict, (), deadline)
