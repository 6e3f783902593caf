"""vLLM 0.33.0's V1 runner with the GPU n-gram drafter (``vllm-v1-ngram-gpu``): the
scheduler schedules each running request's drafts the last proposal made, invalid ones
too, and the runner trims them (``update_scheduler_for_invalid_drafts``) before it builds
the step, which the step's properties judge; a mutant of the n-gram token rows caught."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_ngram

    return runner_step_v1_ngram


def three_decodes() -> Trace:
    """Three requests prefill 4, 5 and 6 tokens, then decode two, one and no drafts
    (request 7 rejecting one), then one, two and two."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=2, cudagraph_capture_sizes=(3, 9), runner="v1",
    )  # fmt: skip
    pages = ((1,), (2,), (3,))
    return Trace(
        config,
        (
            Batch((0, 0, 0), (4, 5, 6), req_ids=(7, 8, 9), pages=pages, new_pages=(1, 1, 1)),
            Batch((4, 5, 6), (3, 2, 1), req_ids=(7, 8, 9), pages=pages, new_pages=(0, 0, 0),
                  rejected=(1, 0, 0)),
            Batch((6, 7, 7), (2, 3, 3), req_ids=(7, 8, 9), pages=pages, new_pages=(0, 0, 0)),
        ),
    )  # fmt: skip


def test_the_invalid_drafts_are_trimmed_before_the_step_is_built(monkeypatch):
    """After the prefills the drafter proposes two, one and no valid drafts; the scheduler
    schedules both drafts of each request (9 tokens), and the runner trims them to the
    trace's 6 before it builds the step, on every engine (the fresh one's warm-up
    proposes the same counts). The next step trims nothing on the engines that lived
    the trace (request 7 sampled a token that proposes two: the scheduler schedules its
    one), and request 7's drafts on the fresh one. Every property holds."""
    m = adapter()
    import vllm.v1.worker.gpu_model_runner as gmr
    from vllm.v1.spec_decode.ngram_proposer_gpu import NgramProposerGPU

    trims: list[tuple[int, int]] = []
    trim = gmr.update_scheduler_for_invalid_drafts

    def counted(event, counts, scheduler_output, rows):
        before = scheduler_output.total_num_scheduled_tokens
        trim(event, counts, scheduler_output, rows)
        trims.append((before, scheduler_output.total_num_scheduled_tokens))

    monkeypatch.setattr(gmr, "update_scheduler_for_invalid_drafts", counted)
    calls = Calls(monkeypatch)
    calls.count(NgramProposerGPU, "propose")
    calls.count(gmr, "update_ngram_gpu_tensors_incremental")
    engine = m.NgramRunnerStepEngine()
    outs = run_trace(three_decodes(), engine)
    assert isinstance(engine.eager.runner.drafter, NgramProposerGPU)
    assert all(ref.violations(out) == [] for out in outs)
    assert min(calls.values()) > 0 and len(calls) == 2
    # Each step's eager engine, graphs engine, then the fresh one (its warm-up, its step;
    # none at step 0), before and after: the fresh engine's step 2 trims request 7's
    # second draft, which the others never scheduled.
    step1, step2 = [(9, 6), (9, 6), (3, 3), (9, 6)], [(8, 8), (8, 8), (3, 3), (9, 8)]
    assert trims == [(15, 15)] * 3 + step1 + step2
    for how in ("eager", "padded", "fresh"):
        (step,) = own(outs[1], how)
        assert step.num_tokens == 6, how
        assert values(step, "query_start_loc")[:4] == [0, 3, 5, 6], how
        assert values(step, "positions")[:6] == [4, 5, 6, 5, 6, 6], how
        assert values(step, "slot_mapping")[:6] == [20, 21, 22, 37, 38, 54], how
    (eager,) = own(outs[2], "eager")
    assert values(eager, "seq_lens") == [8, 10, 10]


def test_a_row_condense_moved_left_stale_is_caught():
    """The mutant ``vllm-v1-ngram-gpu-moved-rows-stale`` (the n-gram token rows refreshed
    for new requests only) on its smallest trace: request 1, moved into request 0's row,
    finds its last token at the start of request 0's tokens on the device, so its
    proposal holds two valid drafts and the runner trims neither of the two scheduled,
    where the trace decodes one (a fresh engine does, as the real engine)."""
    m = adapter()
    trace = m.smallest_moved_rows_stale()
    assert m.trigger_moved_rows_stale(trace) and m.reach_ngram(trace)
    good = run_trace(trace, m.run)
    assert all(ref.violations(out) == [] for out in good)
    assert [b.num_tokens for b in own(good[2], "eager")] == [2]
    bad = run_trace(trace, m.run_moved_rows_stale)
    assert all(ref.violations(out) == [] for out in bad[:2])
    assert [b.num_tokens for b in own(bad[2], "eager")] == [3]
    found = {(v.prop, v.field, v.build) for v in ref.violations(bad[2])}
    assert found == {("history invariance", "-", "fresh")}, found
