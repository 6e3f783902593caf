"""Shrink moves Hypothesis cannot make on a trace: a limit lowered with what it bounds.

Hypothesis shrinks what it drew, one choice at a time. A trace's engine config
is drawn before its steps, and the scheduler admits requests under its limits;
a failure whose trigger ties a limit to what the limit bounds (the step that
fills ``max_num_seqs`` after a step with fewer requests) loses its trigger
with each single move: lowering the limit turns the full step into one the
scheduler no longer admits, dropping a request leaves the step short of the
limit. Both must move together, and Hypothesis has no such move; its shrinking
stops at traces of many requests where two suffice.

:func:`shrink_tied` makes those moves on a failing trace, after the one move on
steps that Hypothesis' count may not have reached: a step before the failing
one dropped (:func:`without_step`: the first step, whose successor becomes the
engine's first, or a later one none of whose requests is scheduled after it).
Then, one request at a time, the trace
without that request (in every step it is in; a step it alone was in goes too),
with

1. ``max_num_seqs`` lowered by as many requests as the trace's fullest step
   lost, and ``max_num_batched_tokens`` by as many tokens as its largest step
   lost (each limit keeps its slack over what it bounds), the pages renumbered
   into the smaller KV cache (:func:`compact_pages`);
2. ``max_num_seqs`` lowered alone, as in 1;
3. the limits as they were (a request the failure does not need).

A candidate no engine could live (:func:`~attnfuzz.harness.traces.refuse_invalid_trace`:
a capture size above the lowered token limit, a request the scheduler would not
admit), or one the implementation cannot judge (a step it declines, or outside
its engine's limits: :func:`~attnfuzz.harness.traces.refuse_unjudgeable_trace`),
is passed over without a judgement. A candidate that fails with the
same check is kept, and the moves start again from it; shrinking ends when no
move keeps the failure, or after ``budget`` judgements (a count, not a time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from attnfuzz.harness.errors import InvalidCase
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.traces import lived, refuse_invalid_trace, refuse_unjudgeable_trace
from attnfuzz.reference.trace import Trace

if TYPE_CHECKING:
    from attnfuzz.harness.target import Implementation, Target
    from attnfuzz.reference.batch import Batch


def without_request(trace: Trace, req: int) -> Trace | None:
    """``trace`` without request ``req`` (a scheduler id) in any step; a step left
    with no request goes. None when that empties the last step (the failing one), or
    a step between two that share a request: that request was away in it (preempted),
    and the steps would join as if it had run on."""
    steps: list[Batch] = []
    last = len(trace.steps) - 1
    for k, step in enumerate(trace.steps):
        finished = tuple(i for i in step.finished if i != req)
        if req not in step.req_ids:
            steps.append(dataclasses.replace(step, finished=finished))
            continue
        if step.num_reqs == 1:
            if k == last:
                return None
            if k and set(trace.steps[k - 1].req_ids) & set(trace.steps[k + 1].req_ids):
                return None
            continue
        r = step.req_ids.index(req)

        def drop(values: tuple, r: int = r) -> tuple:
            return values[:r] + values[r + 1 :] if values else values

        steps.append(
            dataclasses.replace(
                step,
                num_computed_tokens=drop(step.num_computed_tokens),
                q_lens=drop(step.q_lens),
                req_ids=drop(step.req_ids),
                pages=drop(step.pages),
                new_pages=drop(step.new_pages),
                rejected=drop(step.rejected),
                prompt_lens=drop(step.prompt_lens),
                finished=finished,
            )
        )
    return Trace(trace.config, tuple(steps), trace.params, trace.dtype)


def without_step(trace: Trace, k: int) -> Trace | None:
    """``trace`` without step ``k``, where the lives left are lives a scheduler gives:

    - the first step, always: the next one becomes the engine's first, each of its
      requests gaining all its pages there (a case on its own is the same: a new
      engine's first step, whatever its requests computed before);
    - a later step only when none of its requests is scheduled after it (it finished
      or left there); None otherwise: a request that continued would come back with
      tokens computed in a step that never ran, or arrive in the middle of the life
      holding them.

    A later step's finished request that the steps left never held is not said to
    finish."""
    if k:
        later = {i for step in trace.steps[k + 1 :] for i in step.req_ids}
        if later & set(trace.steps[k].req_ids):
            return None
    steps: list[Batch] = []
    seen: set[int] = set()
    for j, step in enumerate(trace.steps[:k] + trace.steps[k + 1 :]):
        step = dataclasses.replace(step, finished=tuple(i for i in step.finished if i in seen))
        if j == 0 and step.pages:  # the engine's first step: every request is new
            step = dataclasses.replace(step, new_pages=tuple(len(p) for p in step.pages))
        steps.append(step)
        seen.update(step.req_ids)
    return Trace(trace.config, tuple(steps), trace.params, trace.dtype)


def compact_pages(trace: Trace) -> Trace:
    """``trace`` with its pages renumbered in order, 1 up (0 up where it holds the
    null page): the same pages shared and reused by the same requests, under fewer
    numbers. A request dropped leaves gaps in the numbering, and a trace whose limits
    drop with it must name only pages of the smaller KV cache
    (:func:`~attnfuzz.reference.batch.kv_cache_pages`)."""
    held = sorted({p for step in trace.steps for row in step.pages for p in row})
    first = 0 if held and held[0] == 0 else 1
    number = {p: first + i for i, p in enumerate(held)}
    steps = tuple(
        dataclasses.replace(step, pages=tuple(tuple(number[p] for p in row) for row in step.pages))
        for step in trace.steps
    )
    return dataclasses.replace(trace, steps=steps)


def _peaks(trace: Trace) -> tuple[int, int]:
    """The trace's fullest step's request count and its largest step's token count."""
    return (
        max(step.num_reqs for step in trace.steps),
        max(sum(step.q_lens) for step in trace.steps),
    )


def tied_moves(trace: Trace) -> Iterator[Trace]:
    """The candidates of the module doc: each step before the last dropped (earliest
    first), then each request, latest first (the last to arrive is the likeliest to
    be one the failure does not need)."""
    for k in range(len(trace.steps) - 1):
        cut = without_step(trace, k)
        if cut is not None:
            yield cut
    ids = dict.fromkeys(i for step in trace.steps for i in step.req_ids)
    reqs, tokens = _peaks(trace)
    for req in reversed(list(ids)):
        cut = without_request(trace, req)
        if cut is None:
            continue
        cut_reqs, cut_tokens = _peaks(cut)
        fewer_reqs, fewer_tokens = reqs - cut_reqs, tokens - cut_tokens
        config = cut.config
        lowered = dataclasses.replace(config, max_num_seqs=config.max_num_seqs - fewer_reqs)
        both = dataclasses.replace(
            lowered, max_num_batched_tokens=config.max_num_batched_tokens - fewer_tokens
        )
        seen: list[object] = []
        for candidate in (both, lowered, config):
            if candidate not in seen:
                seen.append(candidate)
                # Lowered limits, a smaller KV cache: the pages renumbered into it.
                pages = cut if candidate == config else compact_pages(cut)
                yield dataclasses.replace(pages, config=candidate)


def shrink_tied(
    target: Target,
    trace: Trace,
    fails: Callable[[Trace], Verdict | None],
    budget: int,
    impl: Implementation | None,
) -> tuple[Trace, Verdict | None, int]:
    """The smallest trace the moves of the module doc reach from the failing
    ``trace``, each candidate judged by ``fails`` (a failing verdict with the same
    check, else None), within ``budget`` calls. Returns that trace (up to its
    failing step), its verdict (None if no candidate failed) and the calls made.
    A candidate no engine could live, or one ``impl`` cannot judge (a step it
    declines, or outside its engine's limits), is passed over unjudged; ``impl``
    None: the first only."""
    calls, verdict = 0, None
    progress = True
    while progress and calls < budget:
        progress = False
        for candidate in tied_moves(trace):
            try:
                if impl is None:
                    refuse_invalid_trace(target, candidate)
                else:
                    refuse_unjudgeable_trace(target, impl, candidate)
            except InvalidCase:  # no life of an engine, or none it judges: not judged
                continue
            if calls >= budget:
                break
            calls += 1
            got = fails(candidate)
            if got is not None:
                cut = lived(candidate, got)
                assert isinstance(cut, Trace)
                trace, verdict, progress = cut, got, True
                break
    return trace, verdict, calls
