"""The shrink moves Hypothesis cannot make on a trace (harness/trace_shrink.py): a
request dropped with the limit that bounded it lowered together, so that a failure
whose trigger ties ``max_num_seqs`` to the requests of a step keeps its trigger.

``stateful_impl:full_after_fewer`` is off by one on a step that fills
``max_num_seqs`` right after a step with fewer requests. Hypothesis alone shrinks
its traces to steps of up to 8 requests at seeds 1 and 2 (lowering the limit,
or dropping a request, each loses the trigger); with the moves, every seed ends
at one request, then two, under ``max_num_seqs = 2``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.campaign.findings import shrink_tied_findings
from attnfuzz.harness.campaign.worker import ItemLog
from attnfuzz.harness.errors import InvalidCase
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.testing import nightly_seeds, spec_config
from attnfuzz.harness.trace_shrink import (
    shrink_tied,
    tied_moves,
    without_request,
    without_step,
)
from attnfuzz.harness.traces import refuse_invalid_trace
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

TESTS = Path(__file__).parent
TARGET = get_target("max-seq-len")
PARAMS = (("capturing", 0),)


def grown_to_the_limit(arrivals: int) -> Trace:
    """Step 0: request 0 prefills; step 1: it decodes and ``arrivals`` more arrive,
    filling ``max_num_seqs = arrivals + 1``. Block size 4: a page per prefill."""
    config = spec_config(
        num_spec=0, cudagraph_mode="NONE", cudagraph_capture_sizes=(), max_num_seqs=arrivals + 1
    )
    first = Batch((0,), (4,), req_ids=(0,), pages=((1,),), new_pages=(1,))
    ids = tuple(range(arrivals + 1))
    second = Batch(
        (4,) + (0,) * arrivals,
        (1,) + (3,) * arrivals,
        req_ids=ids,
        pages=((1, 2), *((3 + i,) for i in range(arrivals))),
        new_pages=(1,) + (1,) * arrivals,
    )
    return Trace(config, (first, second), PARAMS)


def _full_after_fewer(trace: Trace) -> Verdict | None:
    """The trigger of ``stateful_impl:full_after_fewer``, judged without running it."""
    steps, limit = trace.steps, trace.config.max_num_seqs
    for k in range(1, len(steps)):
        if steps[k - 1].num_reqs < steps[k].num_reqs == limit:
            return Verdict([Mismatch("value", "max_seq_len", "6", "5")], step=k)
    return None


def test_without_request_drops_it_from_every_step_and_from_finished():
    trace = grown_to_the_limit(2)
    third = Batch((5,), (1,), req_ids=(0,), pages=((1, 2),), new_pages=(0,), finished=(1, 2))
    trace = dataclasses.replace(trace, steps=(*trace.steps, third))
    cut = without_request(trace, 1)
    assert cut is not None
    assert [s.req_ids for s in cut.steps] == [(0,), (0, 2), (0,)]
    assert cut.steps[1].pages == ((1, 2), (4,)) and cut.steps[1].q_lens == (1, 3)
    assert cut.steps[2].finished == (2,)
    refuse_invalid_trace(TARGET, cut)  # still a life an engine can have


def test_without_request_drops_a_step_it_alone_was_in_but_never_the_last():
    trace = grown_to_the_limit(1)
    cut = without_request(trace, 0)
    assert cut is not None and [s.req_ids for s in cut.steps] == [(1,)]
    lone = dataclasses.replace(trace, steps=trace.steps[:1])
    assert without_request(lone, 0) is None


def test_without_request_keeps_a_step_between_two_that_share_a_request():
    """Request 0 was away (preempted) in the step request 5 ran alone: without that
    step the two around it would join as if request 0 had run on."""
    first = Batch((0,), (4,), req_ids=(0,), pages=((1,),), new_pages=(1,))
    away = Batch((0,), (2,), req_ids=(5,), pages=((2,),), new_pages=(1,))
    back = Batch((0,), (4,), req_ids=(0,), pages=((3,),), new_pages=(1,), finished=(5,))
    config = spec_config(num_spec=0, cudagraph_mode="NONE", cudagraph_capture_sizes=())
    trace = Trace(config, (first, away, back), PARAMS)
    refuse_invalid_trace(TARGET, trace)
    assert without_request(trace, 5) is None


def test_without_step_drops_the_first_step_or_one_whose_requests_end_there():
    """The first step's successor becomes the engine's first step; a later step goes only
    when none of its requests is scheduled after it: one that continued would come back
    with tokens computed in a step that never ran, or arrive holding them."""
    trace = grown_to_the_limit(2)
    first = without_step(trace, 0)
    assert first is not None and first.steps == (
        dataclasses.replace(trace.steps[1], new_pages=(2, 1, 1)),
    )
    refuse_invalid_trace(TARGET, first)  # request 0 is new there, with both its pages
    third = Batch((0,), (2,), req_ids=(3,), pages=((9,),), new_pages=(1,), finished=(0, 1, 2))
    longer = dataclasses.replace(trace, steps=(*trace.steps, third))
    fourth = Batch((2,), (1,), req_ids=(3,), pages=((9,),), new_pages=(0,))
    longest = dataclasses.replace(longer, steps=(*longer.steps, fourth))
    assert without_step(longest, 2) is None  # request 3 decodes in step 3
    cut = without_step(longest, 1)  # requests 0-2 finish after step 1
    assert cut is not None and [s.req_ids for s in cut.steps] == [(0,), (3,), (3,)]
    assert cut.steps[1].finished == (0,)  # 1 and 2 were never held: not finished
    refuse_invalid_trace(TARGET, cut)


def test_a_lowered_limit_renumbers_the_pages_into_the_smaller_kv_cache():
    """Dropping a request and lowering ``max_num_seqs`` with it shrinks the KV cache
    (``kv_cache_pages``: 34 pages for 2 requests of 16): the pages left are
    renumbered into it, the same pages for the same requests. Left as they were, the
    trace names a page past the cache, a life no engine can have, and is refused."""
    config = spec_config(
        num_spec=0, cudagraph_mode="NONE", cudagraph_capture_sizes=(), max_num_seqs=3
    )
    first = Batch((0,), (4,), req_ids=(0,), pages=((1,),), new_pages=(1,))
    full = (tuple(range(3, 19)), tuple(range(19, 35)))  # 16 pages each: 63 tokens
    second = Batch(
        (4, 0, 0), (1, 63, 63), req_ids=(0, 1, 2), pages=((1, 2), *full), new_pages=(1, 16, 16)
    )
    trace = Trace(config, (first, second), PARAMS)
    refuse_invalid_trace(TARGET, trace)
    cut = without_request(trace, 1)
    assert cut is not None
    as_it_was = dataclasses.replace(cut, config=dataclasses.replace(config, max_num_seqs=2))
    with pytest.raises(InvalidCase, match="page 34 past the KV cache's 34 pages"):
        refuse_invalid_trace(TARGET, as_it_was)
    lowered = [m for m in tied_moves(trace) if m.config.max_num_seqs == 2 and len(m.steps) == 2]
    assert len(lowered) == 4  # request 2, then request 1, dropped: both limits, then one
    for move in lowered:
        refuse_invalid_trace(TARGET, move)
        assert move.steps[1].pages == ((1, 2), full[0])
        assert move.steps[1].req_ids[0] == 0


def test_without_the_first_step_a_request_that_rejected_drafts_is_no_first_step():
    """Dropping step 0 makes a request that drafted in step 1 new there: no engine's
    request rejects drafts in its first step (none were proposed), and its next step's
    computed tokens count the rollback. The move is passed over, unjudged."""
    config = spec_config(num_spec=2, cudagraph_mode="NONE", cudagraph_capture_sizes=())
    first = Batch((0,), (4,), req_ids=(0,), pages=((1, 2),), new_pages=(2,))
    drafting = Batch((4,), (3,), req_ids=(0,), pages=((1, 2),), new_pages=(0,), rejected=(2,))
    after = Batch((5,), (1,), req_ids=(0,), pages=((1, 2),), new_pages=(0,))
    trace = Trace(config, (first, drafting, after), PARAMS)
    refuse_invalid_trace(TARGET, trace)
    cut = without_step(trace, 0)
    assert cut is not None
    with pytest.raises(InvalidCase, match="request 0 is new, yet rejects 2 drafts"):
        refuse_invalid_trace(TARGET, cut)
    judged: list[Trace] = []

    def fails(candidate: Trace) -> Verdict | None:
        judged.append(candidate)
        return None

    assert shrink_tied(TARGET, trace, fails, budget=10, impl=None)[2] == len(judged)
    assert cut not in judged


def test_tied_moves_lower_each_limit_by_what_the_trace_lost():
    trace = grown_to_the_limit(3)
    moves = list(tied_moves(trace))
    assert moves[0] == without_step(trace, 0)  # the steps first
    first = moves[1]
    assert first.steps[1].req_ids == (0, 1, 2)  # then requests, the latest first
    assert first.config.max_num_seqs == trace.config.max_num_seqs - 1
    assert first.config.max_num_batched_tokens == trace.config.max_num_batched_tokens - 3
    configs = [c.config for c in moves[1:4]]
    assert [c.max_num_seqs for c in configs] == [3, 3, 4]
    assert configs[1].max_num_batched_tokens == trace.config.max_num_batched_tokens


def test_no_single_move_keeps_a_tied_trigger():
    """Why Hypothesis stops: dropping a request leaves the step short of the limit,
    and lowering the limit alone makes the step one the scheduler would not admit."""
    trace = grown_to_the_limit(4)
    assert _full_after_fewer(trace) is not None
    assert _full_after_fewer(without_request(trace, 4)) is None
    lowered = dataclasses.replace(trace, config=dataclasses.replace(trace.config, max_num_seqs=4))
    with pytest.raises(InvalidCase, match="max_num_seqs"):
        refuse_invalid_trace(TARGET, lowered)


def test_shrink_tied_reaches_two_requests_under_a_limit_of_two():
    trace = grown_to_the_limit(6)
    calls: list[Trace] = []

    def fails(candidate: Trace) -> Verdict | None:
        calls.append(candidate)
        return _full_after_fewer(candidate)

    cut, verdict, made = shrink_tied(TARGET, trace, fails, budget=100, impl=None)
    assert [s.num_reqs for s in cut.steps] == [1, 2] and cut.config.max_num_seqs == 2
    assert verdict.step == 1 and made == len(calls)
    # Five rounds of two (the first step, then the latest request), and a last round
    # of at most seven candidates that keeps none.
    assert made <= 5 * 2 + 7


def test_shrink_tied_passes_over_a_candidate_its_implementation_declines():
    """A move to a trace the implementation declines (a step it runs through other
    code, or one outside its engine's limits) is not judged: judging it raised
    InvalidCase and ended a search whose shrinking crossed such a step."""
    trace = grown_to_the_limit(6)
    impl = dataclasses.replace(
        TARGET.implementations["triton"],
        declines=lambda case: "four requests" if case.batch.num_reqs == 4 else None,
    )
    calls: list[Trace] = []

    def fails(candidate: Trace) -> Verdict | None:
        calls.append(candidate)
        return _full_after_fewer(candidate)

    cut, verdict, made = shrink_tied(TARGET, trace, fails, budget=100, impl=impl)
    assert made == len(calls) and verdict is not None
    assert not any(s.num_reqs == 4 for c in calls for s in c.steps)
    assert cut.steps[-1].num_reqs == 5  # the shrink stops above the declined size
    # Without the implementation, the declined trace is judged (and would raise).
    calls.clear()
    shrink_tied(TARGET, trace, fails, budget=100, impl=None)
    assert any(s.num_reqs == 4 for c in calls for s in c.steps)


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_shrink_tied_judges_at_most_its_budget(budget):
    trace = grown_to_the_limit(6)
    calls: list[Trace] = []

    def fails(candidate: Trace) -> Verdict | None:
        calls.append(candidate)
        return _full_after_fewer(candidate)

    cut, _, made = shrink_tied(TARGET, trace, fails, budget, impl=None)
    assert made == len(calls) == budget
    assert cut.steps[-1].num_reqs == 7 - budget // 2  # each round: the step, then a request


@pytest.mark.parametrize("seed", [2, *nightly_seeds((0, 1))])
def test_a_traced_run_ends_at_the_smallest_tied_trace(seed, monkeypatch):
    """The run's own shrinking (harness.runner.fuzz), on a user's stateful
    implementation kept in tests/: one request, then two, under a limit of two."""
    monkeypatch.syspath_prepend(str(TESTS))
    impl = TARGET.resolve("stateful_impl:full_after_fewer")
    result = fuzz(TARGET, impl, max_examples=300, rng_seed=seed, traced=True, database=None)
    assert isinstance(result.case, Trace) and result.verdict is not None
    assert result.verdict.step == 1
    assert [s.num_reqs for s in result.case.steps] == [1, 2]
    assert result.case.config.max_num_seqs == 2
    assert result.examples <= 3 * 300  # the search, Hypothesis' shrinking, then the moves


def test_a_campaign_unit_keeps_the_smaller_tied_trace_of_its_finding(tmp_path):
    """The campaign's worker makes the same moves on each traced finding, within its
    count, and its finding's case becomes the smaller trace at once."""
    for sub in ("items", "inflight"):
        (tmp_path / sub).mkdir()
    unit = cp.Unit(TARGET.name, "stateful_impl:full_after_fewer", "user", True)
    (item,) = cp.plan_items([unit], 1, 20)
    log = ItemLog(tmp_path, item, time.time())
    trace = grown_to_the_limit(4)
    log.before(trace.to_dict())
    log.found(trace.to_dict(), _full_after_fewer(trace))
    judged: list[Trace] = []

    def judge_trace(candidate: Trace) -> Verdict:
        judged.append(candidate)
        return _full_after_fewer(candidate) or Verdict([])

    shrink_tied_findings(log, TARGET, TARGET.implementations["triton"], judge_trace, budget=50)
    (finding,) = log.state["findings"].values()
    kept = Trace.from_dict(finding["case"])
    assert [s.num_reqs for s in kept.steps] == [1, 2] and kept.config.max_num_seqs == 2
    assert finding["step"] == 1 and log.examples == len(judged) <= 50
