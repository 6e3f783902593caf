"""vLLM 0.33.0's V1 runner under async scheduling (``vllm-v1-async``): the scheduler's
optimistic computed tokens after a verify, corrected by the runner's own code, every
field held to a fresh engine sent the true counts; and a mutant of the correction
caught."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_async

    return runner_step_v1_async


def config():
    """Two drafts, capture sizes 3 and 6 (whole queries of a speculative decode),
    FULL_AND_PIECEWISE, pages of 16 tokens (the Triton backend's on V1)."""
    return spec_config(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=16, max_model_len=64,
        cudagraph_capture_sizes=(3, 6), num_spec=2, runner="v1",
    )  # fmt: skip


def decodes() -> tuple[Batch, ...]:
    """Two requests prefill (5 and 3 tokens), decode with both drafts (request 7 rejects
    both, request 8 one), decode again with both drafts, then request 8 alone."""
    pages = ((1,), (2,))
    return (
        Batch((0, 0), (5, 3), req_ids=(7, 8), pages=pages, new_pages=(1, 1)),
        Batch((5, 3), (3, 3), req_ids=(7, 8), pages=pages, new_pages=(0, 0), rejected=(2, 1)),
        Batch((6, 5), (3, 3), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
        Batch((8,), (1,), req_ids=(8,), pages=pages[1:], new_pages=(0,)),
    )


def run(trace: Trace, engine=None) -> list[ref.RunnerStepOutputs]:
    engine = engine or adapter().AsyncRunnerStepEngine()
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_the_scheduler_s_optimistic_counts_are_corrected_and_every_property_holds(monkeypatch):
    """Each engine is sent ``AsyncScheduler``'s counts (request 7 at 8 computed tokens in
    step 2, not 6); the runner corrects them on the device
    (``update_num_computed_tokens_for_batch_change``) and takes the input ids of the
    requests it ran from its sampled tokens (``_prepare_input_ids``' async path). Every
    property holds, the fresh engine (sent the true counts) included."""
    a = adapter()  # before vLLM
    import vllm.v1.worker.gpu_model_runner as gmr

    calls = Calls(monkeypatch)
    calls.count(gmr, "update_num_computed_tokens_for_batch_change")
    sent: list[dict[str, int]] = []
    output = a._AsyncEngine.output

    def recorded(self, inputs):
        out = output(self, inputs)
        cached = out.scheduled_cached_reqs
        sent.append(dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True)))
        return out

    monkeypatch.setattr(a._AsyncEngine, "output", recorded)
    outs = run(Trace(config(), decodes()))
    for out in outs:
        assert ref.violations(out) == []
    assert {"7": 8, "8": 6} in sent and {"7": 6, "8": 5} not in sent[:4]
    assert calls["update_num_computed_tokens_for_batch_change"] >= 2


def test_an_uncorrected_drift_is_caught_by_history_invariance():
    """The mutant ``vllm-v1-async-drift-uncorrected`` runs on from the optimistic count:
    its smallest trace (a rejected draft after a one-token prompt) fails at step 2 by
    history invariance on the positions the fresh engine computes from the true count;
    the engine passes it, and so does the mutant where the draft was accepted."""
    from attnfuzz.harness.registry import get_target

    a = adapter()
    trace = a.smallest_drift_uncorrected()
    assert a.trigger_drift_uncorrected(trace) and a.reach_drift(trace)
    target = get_target("runner-step")
    verdict = target.judge_trace(target.implementations["vllm-v1-async-drift-uncorrected"], trace)
    assert verdict.step == 2, verdict
    fields = {m.where.rsplit(".", 1)[-1] for m in verdict.mismatches}
    assert "positions" in fields, verdict
    assert target.judge_trace(target.implementations["vllm-v1-async"], trace).ok
    accepted = dataclasses.replace(trace.steps[1], rejected=(0,))
    after = dataclasses.replace(trace.steps[2], num_computed_tokens=(3,))
    kept = dataclasses.replace(trace, steps=(trace.steps[0], accepted, after))
    assert not a.trigger_drift_uncorrected(kept) and a.reach_drift(kept)
    mutant = target.implementations["vllm-v1-async-drift-uncorrected"]
    assert target.judge_trace(mutant, kept).ok


def near_the_limit(max_model_len: int = 71) -> Trace:
    """One request prefills 63 tokens, decodes with three drafts and rejects them all,
    then decodes with three drafts again from 64 computed tokens: the scheduler counts
    67, so the runner's host count of the longest sequence is 71, the true one 68."""
    config = spec_config(
        max_model_len=max_model_len, max_num_seqs=1, max_num_batched_tokens=312,
        block_size=16, num_spec=3, cudagraph_capture_sizes=(4,), cudagraph_mode="FULL",
        cg_support="ALWAYS", runner="v1",
    )  # fmt: skip
    pages = ((1, 2, 3, 4, 5),)
    return Trace(
        config,
        (
            Batch((0,), (63,), req_ids=(0,), pages=pages, new_pages=(5,)),
            Batch((63,), (4,), req_ids=(0,), pages=pages, new_pages=(0,), rejected=(3,)),
            Batch((64,), (4,), req_ids=(0,), pages=pages, new_pages=(0,), rejected=(1,)),
        ),
    )


def test_a_proposal_the_upper_bound_withholds_leaves_the_fresh_drafts_unjudged():
    """Found by the search (seed 1): near the drafter's limit the async engine proposes
    nothing after step 2 (``_input_fits_in_drafter`` reads ``max_seq_len``, the
    optimistic 71, and 71 + 3 > 71), while the fresh engine, sent the true 64, fits
    (68 + 3) and proposes. By design (``max_seq_len`` may be an upper bound): the fresh
    engine's draft sub-steps of that step are left out, every other build judged. Three
    tokens more room (74) and both propose, all their sub-steps judged; the engine
    scheduled synchronously proposes on every engine."""
    from attnfuzz.adapters.vllm import runner_step_v1

    engine = adapter().AsyncRunnerStepEngine()
    outs = run(near_the_limit(), engine)
    assert engine.withheld(outs[2]) and not engine.withheld(outs[1])
    for out in outs:
        assert ref.violations(out) == []
    assert not [b for b in outs[2].builds if b.draft is not None and b.how != "capture"]
    roomy = run(near_the_limit(74))
    assert {b.draft for b in roomy[2].of("fresh")} == {None, 0, 1, 2}
    assert {b.draft for b in roomy[2].of("eager")} == {None, 0, 1, 2}
    sync = run(near_the_limit(), runner_step_v1.RunnerStepEngine())
    assert {b.draft for b in sync[2].of("eager")} == {None, 0, 1, 2}


def test_a_withheld_proposal_is_judged_as_such_only_where_the_upper_bound_explains_it(
    monkeypatch,
):
    """The same trace judged whole: it passes; with the upper bound not consulted (every
    withheld proposal kept), the fresh engine's draft sub-steps have no eager build and
    the step fails as ``[type] builds``: the leaving out is what makes it pass."""
    from attnfuzz.harness.registry import get_target

    target = get_target("runner-step")
    impl = target.implementations["vllm-v1-async"]
    assert target.judge_trace(impl, near_the_limit()).ok
    monkeypatch.setattr(adapter().AsyncRunnerStepEngine, "withheld", lambda self, out: False)
    adapter().run.new_engine()
    verdict = target.judge_trace(impl, near_the_limit())
    assert verdict.step == 2 and [m.where for m in verdict.mismatches] == ["builds"], verdict


def test_a_request_back_after_a_step_left_out_is_sent_all_its_tokens():
    """Request 1 prefills and samples a token, is left out of step 1 (preempted) and
    comes back at step 2, recomputing its 5 tokens. ``Scheduler._make_cached_request_data``
    sends the tokens of a request not scheduled in the step before (``all_token_ids``),
    which ``_update_states`` reads under async scheduling to recover its outputs: sent
    none, the runner failed on the lookup. Every property holds."""
    steps = (
        Batch((0, 0), (3, 4), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3,), (1,), req_ids=(0,), pages=((1,),), new_pages=(0,)),
        Batch((4, 0), (1, 5), req_ids=(0, 1), pages=((1,), (3,)), new_pages=(0, 1)),
    )
    for out in run(Trace(config(), steps)):
        assert ref.violations(out) == []
