"""vLLM 0.33.0's model runner V1 step, whole, as the implementation ``vllm-v1`` of
``runner-step``: ``execute_model`` with its own padding, graph dispatch, data-parallel
padding, capture runs and dummy runs, judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.lookahead import num_lookahead_tokens
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies import batches, traces
from hypothesis import HealthCheck, given, settings

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1

    return runner_step_v1


def small_config(**overrides):
    """next_n = 2, a few capture sizes, FULL_AND_PIECEWISE (vLLM's default), pages of
    16 tokens (the Triton backend's kernel block size)."""
    base = dict(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=16, max_model_len=64,
        cudagraph_capture_sizes=(2, 4, 8), runner="v1",
    )  # fmt: skip
    return spec_config(**{**base, **overrides})


def run_trace(trace: Trace, *, holds: bool = True) -> list[ref.RunnerStepOutputs]:
    engine = adapter().RunnerStepEngine()
    outs = []
    for case in trace.cases():
        out = engine(ref.make_inputs(case))
        if holds:
            assert ref.violations(out) == [], case
        outs.append(out)
    return outs


def builds(out: ref.RunnerStepOutputs, how: str) -> list[ref.StepBuild]:
    """The step's own builds of ``how`` (not the drafter's)."""
    return [b for b in out.of(how) if b.draft is None]


def drafts(out: ref.RunnerStepOutputs, how: str) -> list[ref.StepBuild]:
    """The drafter's builds of ``how``, in the order it made them."""
    return [b for b in out.of(how) if b.draft is not None]


def tokens_of(build: ref.StepBuild) -> int:
    """The build's padded token rows (the positions its forward reads)."""
    return len(build.field("positions").values)


PREFILL_THEN_DECODE = (
    Batch((0,), (5,), req_ids=(7,), pages=((1,),), new_pages=(1,)),
    Batch((5,), (2,), req_ids=(7,), pages=((1,),), new_pages=(0,)),
)
"""One request prefills 5 tokens, then decodes next_n = 2 (a uniform decode)."""


def test_a_decode_below_every_capture_size_is_padded_to_the_graph_and_replayed():
    """Capture sizes 4 and 8 (FULL decode graphs of 2 and 4 requests of 2 tokens): the
    decode is dispatched to a FULL graph, its padding request holds seq_len 0 and its
    padded tokens slot -1; the replay reads what the padded build holds."""
    config = small_config(cudagraph_capture_sizes=(4, 8))
    first, out = run_trace(Trace(config, PREFILL_THEN_DECODE))
    (eager,) = builds(out, "eager")
    assert (eager.num_reqs, eager.num_tokens, tokens_of(eager)) == (1, 2, 2)
    (padded,) = builds(out, "padded")
    assert (padded.num_reqs, padded.num_tokens) == (1, 2)
    assert tokens_of(padded) >= 4 and len(padded.field("seq_lens").values) >= 2
    assert padded.field("seq_lens").values[1:].tolist() == [0] * (
        len(padded.field("seq_lens").values) - 1
    )
    assert padded.field("slot_mapping").values[2:].tolist() == [-1] * (tokens_of(padded) - 2)
    (replay,) = builds(out, "replay")
    assert "CUDAGraphWrapper" in replay.where
    assert len(builds(out, "fresh")) == 1
    captured = {tokens_of(b) for b in builds(first, "capture")}
    assert set(config.cudagraph_capture_sizes) <= captured


def test_capture_runs_cover_every_capture_size_of_each_mode():
    for mode in ("FULL", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        config = small_config(cudagraph_mode=mode)
        case = Case(config, Batch((0,), (3,), req_ids=(0,), pages=((1,),), new_pages=(1,)))
        (out,) = run_trace(Trace.of_case(case))
        captured = {tokens_of(b) for b in builds(out, "capture")}
        assert set(config.cudagraph_capture_sizes) <= captured, mode


def test_an_idle_rank_runs_a_dummy_step_padded_to_the_peers_graph():
    """Each step this rank also runs ``execute_dummy_batch`` (``_dummy_run`` of one
    decode of next_n = 2 tokens) while the peer runs the step, two decodes of 2 tokens:
    ``coordinate_batch_across_dp`` agrees on the peer's 4 tokens, the decode graph of 4."""
    config = small_config()
    step = Batch((4, 4), (2, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1))
    (out,) = run_trace(Trace.of_case(Case(config, step)))
    # The step's own dummy run, after the capture runs (then its drafter's dummy run).
    dummy = [b for b in builds(out, "dummy") if "execute_dummy_batch" in b.where][-1]
    assert dummy.num_reqs == dummy.num_tokens == 0
    assert tokens_of(dummy) == 4


def test_the_v1_runner_s_own_functions_compute_every_build(monkeypatch):
    """The metadata comes from the engine's own code: each function named here ran."""
    import vllm.v1.worker.gpu_model_runner as gmr
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    calls = Calls(monkeypatch)

    runner = gmr.GPUModelRunner
    for name in (
        "_update_states", "_prepare_inputs", "_determine_batch_execution_and_padding",
        "_get_slot_mappings", "_build_attention_metadata", "_dummy_run",
        "_capture_cudagraphs",
    ):  # fmt: skip
        calls.count(runner, name)
    calls.count(CudagraphDispatcher, "dispatch")
    calls.count(TritonAttentionMetadataBuilder, "build")
    calls.count(gmr, "coordinate_batch_across_dp")
    run_trace(Trace(small_config(cudagraph_capture_sizes=(4, 8)), PREFILL_THEN_DECODE))
    for name in (
        "_update_states", "_prepare_inputs", "_determine_batch_execution_and_padding",
        "_get_slot_mappings", "_build_attention_metadata", "_dummy_run",
        "_capture_cudagraphs", "dispatch", "build", "coordinate_batch_across_dp",
    ):  # fmt: skip
        assert calls[name] > 0, name


def test_a_wrong_padded_offset_in_vllm_s_buffer_is_caught(monkeypatch):
    """A mutant of the engine, as ``padded-count-offsets``: after a FULL step's metadata
    is built, the last real offset of ``query_start_loc`` moved to the padded token
    count. The padded build and the replay disagree with the eager build."""
    import vllm.v1.worker.gpu_model_runner as gmr

    original = gmr.GPUModelRunner._build_attention_metadata

    def padded_count_offsets(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        R, R_pad = kwargs["num_reqs"], kwargs.get("num_reqs_padded")
        T_pad = kwargs.get("num_tokens_padded")
        if R_pad is not None and R_pad > R and T_pad is not None:
            self.query_start_loc.gpu[R] = T_pad
        return out

    monkeypatch.setattr(gmr.GPUModelRunner, "_build_attention_metadata", padded_count_offsets)
    _, out = run_trace(
        Trace(small_config(cudagraph_capture_sizes=(4, 8)), PREFILL_THEN_DECODE), holds=False
    )
    found = {(v.prop, v.field, v.build) for v in ref.violations(out)}
    assert ("padding invariance", "query_start_loc", "padded") in found
    assert ("replay equals eager", "query_start_loc", "replay") in found


def test_a_stand_in_s_error_is_attnfuzz_s_and_the_engine_s_is_a_finding():
    """Blame on both sides of the V1 adapter: a graph stand-in replayed with nothing
    captured fails in attnfuzz (never a finding against vLLM); an error raised inside
    vLLM's own V1 input batch is the engine's."""
    from attnfuzz.harness.blame import attnfuzz_fault
    from vllm.v1.worker.gpu_input_batch import InputBatch

    rs = adapter()
    with pytest.raises(RuntimeError) as standin:
        rs._Graph(rs._Recorder()).replay()
    assert attnfuzz_fault(standin.value, standin.tb) is not None
    with pytest.raises(AttributeError) as engine:
        InputBatch._register_add_request(object.__new__(InputBatch), None)
    assert attnfuzz_fault(engine.value, engine.tb) is None


def test_the_v1_runner_declines_what_it_cannot_run():
    rs = adapter()
    step = Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,))
    assert rs.declines(Case(small_config(), step)) is None
    assert "V2" in rs.declines(Case(small_config(runner="v2"), step))
    assert "multiples of 16" in rs.declines(Case(small_config(block_size=4), step))


def test_rows_reused_and_a_fresh_engine_in_the_same_rows_agree():
    """A finished request's row goes to an arrival; the running request keeps its row.
    The fresh engine holds the step's requests in the eager engine's rows (V1's
    persistent batch keeps a request in its row: the order is the engine's history)."""
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((5, 0), (2, 4), req_ids=(1, 2), pages=((2,), (4,)), new_pages=(0, 1)),
        Batch((6, 4), (2, 2), req_ids=(1, 2), pages=((2,), (4,)), new_pages=(0, 0)),
    )
    outs = run_trace(Trace(small_config(), steps))
    (eager,) = builds(outs[1], "eager")
    # Request 2 took request 0's row 0; request 1 kept row 1.
    assert eager.field("seq_lens").values.tolist() == [4, 7]
    (fresh,) = builds(outs[-1], "fresh")
    assert fresh.field("seq_lens").values.tolist() == [6, 8]


def test_a_preempted_request_is_resumed_with_its_new_pages(monkeypatch):
    """Request 1 is left out of step 1 (preempted: unscheduled, its state kept) and
    comes back at step 2 with other pages (``resumed_req_ids``: its block ids replaced),
    recomputing from 0; an arrival takes a row first. The fresh engine agrees."""
    from attnfuzz.adapters.vllm import runner_step_v1

    steps = (
        Batch((0, 0), (3, 4), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3,), (1,), req_ids=(0,), pages=((1,),), new_pages=(0,)),
        Batch((4, 0, 0), (1, 5, 2), req_ids=(0, 1, 2), pages=((1,), (3,), (4,)),
              new_pages=(0, 1, 1)),
    )  # fmt: skip
    resumed = []
    original = runner_step_v1._output

    def spy(inputs, held):
        out = original(inputs, held)
        resumed.append(set(out.scheduled_cached_reqs.resumed_req_ids))
        return out

    monkeypatch.setattr(runner_step_v1, "_output", spy)
    outs = run_trace(Trace(small_config(num_spec=0), steps))
    assert {"1"} in resumed
    (eager,) = builds(outs[-1], "eager")
    assert sorted(eager.field("seq_lens").values.tolist()) == [2, 5, 5]
    (fresh,) = builds(outs[-1], "fresh")
    assert fresh.field("seq_lens").values.tolist() == eager.field("seq_lens").values.tolist()


def test_a_resumed_request_recomputing_in_chunks_is_scheduled_no_drafts(monkeypatch):
    """Request 1 prefills 9 tokens, is preempted at step 1 and recomputes from 0 in
    chunks; at step 3 its query of 2 tokens is a chunk of that recomputation, not a
    token and a draft: ``Scheduler.schedule`` schedules drafts only past a request's
    tokens, and the fresh engine holds the request as recomputing too, so both agree on
    the drafter's sub-steps after it (before, the eager engine took the chunk for a
    draft, and its second draft sub-step read request 0's position for request 1)."""
    from attnfuzz.adapters.vllm import runner_step_v1

    steps = (
        Batch((0, 0), (5, 9), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((5,), (1,), req_ids=(0,), pages=((1,),), new_pages=(0,)),
        Batch((6, 0), (1, 4), req_ids=(0, 1), pages=((1,), (3,)), new_pages=(0, 1)),
        Batch((7, 4), (1, 2), req_ids=(0, 1), pages=((1,), (3,)), new_pages=(0, 0)),
    )  # fmt: skip
    scheduled = []
    original = runner_step_v1._Engine.output

    def spy(self, inputs):
        out = original(self, inputs)
        scheduled.append(dict(out.scheduled_spec_decode_tokens))
        return out

    monkeypatch.setattr(runner_step_v1._Engine, "output", spy)
    outs = run_trace(Trace(small_config(num_spec=2), steps))
    assert "1" not in scheduled[-1]  # the last step's fresh engine: a chunk, no drafts
    (eager,) = [b for b in drafts(outs[-1], "eager") if b.draft == 1]
    (fresh,) = [b for b in drafts(outs[-1], "fresh") if b.draft == 1]
    assert eager.field("positions").values.tolist() == fresh.field("positions").values.tolist()


def v1_traces(block_size: int, max_steps: int, max_examples: int):  # noqa: ANN201
    """A derandomized test over traces of a V1 engine of ``block_size`` (the Triton
    backend's kernel block sizes are multiples of 16), with the lookahead vLLM's
    scheduler reserves for the drafter."""
    drawn = traces.traces(
        batches.SMALL,
        fixes={"block_size": block_size},
        varlen=False,
        max_steps=max_steps,
        lookahead=num_lookahead_tokens,
    )
    run = settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    return lambda test: run(given(drawn)(test))


@v1_traces(block_size=16, max_steps=2, max_examples=6)
def test_drawn_traces_hold_every_property(trace):
    rs = adapter()
    config = dataclasses.replace(trace.config, runner="v1")
    assert rs.declines(Case(config, trace.steps[0])) is None
    run_trace(Trace(config, trace.steps))


@pytest.mark.slow
@pytest.mark.nightly  # the suite's own search of vllm-v1 (tests/test_entries.py) runs in CI
@v1_traces(block_size=32, max_steps=3, max_examples=30)
def test_longer_drawn_traces_hold_every_property(trace):
    config = dataclasses.replace(trace.config, runner="v1")
    run_trace(Trace(config, trace.steps))


FINISH_THEN_DECODE = (
    Batch((0, 0, 0), (3, 4, 5), req_ids=(0, 1, 2), pages=((1,), (2,), (3,)), new_pages=(1, 1, 1)),
    Batch((4, 5), (2, 2), req_ids=(1, 2), pages=((2,), (3,)), new_pages=(0, 0), finished=(0,)),
    Batch((6, 7), (2, 2), req_ids=(1, 2), pages=((2,), (3,)), new_pages=(0, 0)),
)
"""Three requests prefill; request 0 finishes (``finished``) and the other two decode."""


def test_a_finished_request_is_removed_and_the_batch_condensed(monkeypatch):
    """Request 0 finishes: the scheduler output names it in ``finished_req_ids``,
    ``_update_states`` drops its state and ``remove_request`` its row 0, and
    ``condense`` moves request 2 down from row 2 into it (its block-table row too).
    The fresh engine, which never held request 0, agrees on every build."""
    rs = adapter()  # before vLLM
    from vllm.v1.worker.gpu_input_batch import InputBatch

    finished, moved = [], []
    output, condense = rs._output, InputBatch.condense

    def spy_output(inputs, held):
        out = output(inputs, held)
        finished.append(set(out.finished_req_ids))
        return out

    def spy_condense(self):
        before = list(self._req_ids)
        condense(self)
        moved.append((before, list(self._req_ids)))

    monkeypatch.setattr(rs, "_output", spy_output)
    monkeypatch.setattr(InputBatch, "condense", spy_condense)
    outs = run_trace(Trace(small_config(), FINISH_THEN_DECODE))
    assert {"0"} in finished
    assert ([None, "1", "2"], ["2", "1"]) in moved
    (eager,) = builds(outs[1], "eager")
    assert eager.field("seq_lens").values.tolist() == [7, 6]
    assert eager.field("block_table").values[:2, 0].tolist() == [3, 2]


def test_a_condense_that_leaves_the_block_table_row_behind_is_caught(monkeypatch):
    """A mutant of the persistent batch: ``condense`` moves a request down into a
    finished one's row without its block-table row (``MultiGroupBlockTable.move_row``
    does nothing). The moved request reads the finished one's pages: the engine's
    builds disagree with the fresh engine's, which never held the finished request."""
    adapter()  # before vLLM
    from vllm.v1.worker.block_table import MultiGroupBlockTable

    monkeypatch.setattr(MultiGroupBlockTable, "move_row", lambda self, src, tgt: None)
    outs = run_trace(Trace(small_config(), FINISH_THEN_DECODE), holds=False)
    found = {(v.prop, v.field, v.build) for v in ref.violations(outs[1])}
    assert ("history invariance", "block_table", "fresh") in found
    assert ("history invariance", "kv_slots", "fresh") in found
    assert ref.violations(outs[0]) == []


REJECTING_DECODES = (
    Batch((0, 0), (5, 3), req_ids=(7, 8), pages=((1,), (2,)), new_pages=(1, 1)),
    Batch((5, 3), (3, 3), req_ids=(7, 8), pages=((1,), (2,)), new_pages=(0, 0), rejected=(1, 0)),
    Batch((7, 6), (3, 3), req_ids=(7, 8), pages=((1,), (2,)), new_pages=(0, 0), rejected=(2, 1)),
)
"""Two requests prefill, then decode with 2 drafts each: request 7 rejects 1 then 2,
request 8 none then 1 (the steps' ``rejected``)."""


def test_v1_s_rejection_sampler_decides_the_trace_s_acceptance(monkeypatch):
    """``sample_tokens`` runs after each ``execute_model``: V1's ``RejectionSampler``
    samples the stand-in model's logits greedily, accepting the drafts the step accepts
    , and the drafter proposes from there; its
    first draft loop sub-step of step 2 is request 7's computed tokens, its one
    accepted draft, the bonus token and the new draft (5 + 1 + 1 + 1)."""
    adapter()  # before vLLM
    import vllm.v1.worker.gpu_model_runner as gmr
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    calls = Calls(monkeypatch)
    calls.count(gmr.GPUModelRunner, "sample_tokens", "_bookkeeping_sync")
    calls.count(RejectionSampler, "forward")
    outs = run_trace(Trace(small_config(num_spec=2), REJECTING_DECODES))
    assert calls["sample_tokens"] >= 3 * 3 and calls["_bookkeeping_sync"] >= 3 * 3
    assert calls["forward"] >= 2 * 3  # the decode steps of each engine
    (loop,) = [b for b in outs[1].of("eager") if b.draft == 1]
    assert loop.field("seq_lens").values.tolist()[:2] == [5 + 1 + 1 + 1, 3 + 2 + 1 + 1]


def test_a_rejection_sampler_that_keeps_the_last_step_s_tokens_is_caught(monkeypatch):
    """A mutant of the rejection sampler: a rejected position keeps the token the
    previous step sampled there (an output buffer not reset between steps). How many
    drafts a request accepts then depends on the engine's history: the drafter's
    builds disagree with the fresh engine's."""
    adapter()  # before vLLM
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    original = RejectionSampler.forward
    last: dict[int, object] = {}

    def stale(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        tokens, before = out.sampled_token_ids, last.get(id(self))
        if before is not None and before.shape == tokens.shape:
            tokens[tokens == -1] = before[tokens == -1]
        last[id(self)] = tokens.clone()
        return out

    monkeypatch.setattr(RejectionSampler, "forward", stale)
    outs = run_trace(Trace(small_config(num_spec=2), REJECTING_DECODES), holds=False)
    found = {(v.prop, v.build) for v in ref.violations(outs[2])}
    assert ("history invariance", "fresh.draft1") in found


def test_the_drafters_dummy_run_writes_the_last_proposals_slots_kept_apart():
    """``vllm-v1-drafter-dummy-slots``, a finding of vLLM 0.33.0 kept apart: an idle
    data-parallel rank's ``_dummy_run`` fills its slot mappings with -1 and hands them to
    the drafter's ``dummy_run``, whose draft layer writes through the drafter's own
    slot-mapping buffer: the prefill's slots 16-19 that the proposal after it left
    there, keys of the request the engine still holds. ``vllm-v1`` does not judge a dummy
    run between steps against the requests it holds, so that its searches judge the rest;
    the kept-apart entry does."""
    from attnfuzz.adapters.vllm.testing import kept_apart_verdict

    m = adapter()
    witness = m.smallest_drafter_dummy()
    assert m.trigger_drafter_dummy(witness)
    verdict = kept_apart_verdict("vllm-v1", "vllm-v1-drafter-dummy-slots", witness)
    assert {(m.check, m.where) for m in verdict.mismatches} == {
        ("dummy-run-writes-nothing-live", "dummy.slot_mapping")
    }
    m.run_drafter_dummy.new_engine()
    _, out = [m.run_drafter_dummy(ref.make_inputs(c)) for c in witness.cases()]
    drafter = [b for b in out.of("dummy") if b.where.startswith("llm_base_proposer.py")]
    assert [b.field("slot_mapping").values.tolist() for b in drafter] == [[16, 17, 18, 19]]
    # The target's (its forward, and its FULL graph's replay): -1, no write.
    targets = [b for b in out.of("dummy") if b not in drafter]
    assert targets and all(set(b.field("slot_mapping").values.tolist()) == {-1} for b in targets)
