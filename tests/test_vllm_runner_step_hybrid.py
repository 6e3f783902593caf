"""vLLM 0.33.0's model runner V1 step of a hybrid model, as the implementation
``vllm-v1-hybrid`` of ``runner-step``: the V1 step whose second KV-cache group is a GDN
linear-attention layer, its builder's metadata judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm
from attnfuzz.harness.testing import assert_detected
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def hybrid():
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid


def run_trace(trace: Trace, run=None) -> list[ref.RunnerStepOutputs]:
    engine = run or hybrid().HybridRunnerStepEngine()
    engine.new_engine()
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def gdn(build: ref.StepBuild, name: str) -> list:
    return build.field(f"gdn.{name}").values.tolist()


def test_the_gdn_builder_of_the_second_group_builds_every_step(monkeypatch):
    """The runner's own ``_build_attention_metadata`` calls the GDN builder for the second
    group: its prefill (``non_spec_*``), then its FULL decode, padded to the graph of 2
    requests (the padding row's state indices the null block, its offsets the total,
    its accepted count 1), replayed and built afresh; capture runs build it too."""
    h = hybrid()
    h.prepare()  # vLLM's environment, set by the adapter before vLLM is imported
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(GDNAttentionMetadataBuilder, "build", "build_for_cudagraph_capture")
    first, second = run_trace(h.smallest_full_spec_decode())
    assert calls["build"] > 0 and calls["build_for_cudagraph_capture"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert gdn(prefill, "non_spec_query_start_loc") == [0, 5]
    blocks = h.state_blocks(h.smallest_full_spec_decode().config, 0)
    assert gdn(prefill, "non_spec_state_indices_tensor") == blocks[:1]
    (eager,) = own(second, "eager")
    assert gdn(eager, "spec_state_indices_tensor") == [blocks]
    (padded,) = own(second, "padded")
    assert gdn(padded, "spec_state_indices_tensor") == [blocks, [h.NULL_BLOCK_ID] * 2]
    assert gdn(padded, "spec_query_start_loc") == [0, 2, 2]
    assert gdn(padded, "num_accepted_tokens") == [1, 1]
    (replay,) = own(second, "replay")
    assert gdn(replay, "spec_state_indices_tensor") == gdn(padded, "spec_state_indices_tensor")
    (fresh,) = own(second, "fresh")
    assert gdn(fresh, "spec_state_indices_tensor") == [blocks]
    assert any(b.field("gdn.spec_state_indices_tensor") for b in first.builds if b.how == "capture")


def test_a_new_request_takes_the_lowest_free_state_slot():
    """Request 0 is left out of step 1 (preempted: its state slot freed) while request 1
    runs; arriving at step 2, request 2 takes slot 0, and request 0 resumed slot 2."""
    h = hybrid()
    engine = h.HybridRunnerStepEngine()
    config = h.smallest_full_spec_decode().config
    steps = (
        Batch((0, 0), (3, 4), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((4,), (1,), req_ids=(1,), pages=((2,),), new_pages=(0,)),
        Batch((5, 0, 0), (1, 2, 3), req_ids=(1, 2, 0), pages=((2,), (3,), (4,)),
              new_pages=(0, 1, 1)),
    )  # fmt: skip
    outs = [engine(ref.make_inputs(case)) for case in Trace(config, steps).cases()]
    assert engine.states == {"1": 1, "2": 0, "0": 2}
    assert all(ref.violations(out) == [] for out in outs)


@pytest.mark.parametrize(
    ("mutant", "found"),
    [
        ("pad_slot_padding", {("safe padding", "padded"), ("safe padding", "replay")}),
        (
            "last_state_nulled",
            {("padding invariance", "padded"), ("replay equals eager", "replay")},
        ),
        (
            "padding_repeats_last",
            {("padding writes no real state", how) for how in ("padded", "replay")},
        ),
    ],
)
def test_each_mutant_fails_its_property_on_its_smallest_trace(mutant, found):
    """The correct engine holds every property on the trace; each mutant breaks its own
    property on the GDN state indices."""
    h = hybrid()
    _, out = run_trace(h.smallest_full_spec_decode(), getattr(h, mutant))
    got = {(v.prop, v.build) for v in ref.violations(out)}
    assert found <= got
    assert {v.field for v in ref.violations(out)} == {"gdn.spec_state_indices_tensor"}


@pytest.mark.slow
@pytest.mark.nightly
@pytest.mark.parametrize(
    "mutant",
    [
        "vllm-v1-hybrid-pad-slot-states",
        "vllm-v1-hybrid-last-state-nulled",
        "vllm-v1-hybrid-padding-repeats-last",
    ],
)
def test_the_derandomized_search_finds_each_mutant(mutant):
    """The generic test's search (tests/test_entries.py: the same run, made once per
    process; both nightly), found within 200 examples at seed 0."""
    result = assert_detected("runner-step", mutant)
    assert result.examples <= 200


def test_a_first_chunk_in_a_full_decode_graph_replays_stale_state_indices():
    """A finding of vLLM 0.33.0's own, kept apart: the V1 runner replays a FULL decode
    graph for a uniform batch (``_is_uniform_decode``) although GDN builds its
    one-token first chunk as a prefill (``GDNAttentionMetadataBuilder.build``: no prior
    state) and so stages nothing in the graph's buffers (``_stage_decode``); the replay
    reads the capture's null state index where the eager build has the request's
    block. The padded build itself agrees with the eager one. ``vllm-v1-hybrid``
    declines the step; the finding's implementation runs it."""
    h = hybrid()
    trace = h.smallest_prefill_in_decode_graph()
    (case,) = trace.cases()
    assert h.declines(case) is not None and h.declines_engine(case) is None
    (out,) = run_trace(trace, h.run)
    found = [(v.prop, v.field, v.build) for v in ref.violations(out)]
    assert found == [("replay equals eager", "gdn.non_spec_state_indices_tensor", "replay")]
    (replay,) = own(out, "replay")
    assert gdn(replay, "non_spec_state_indices_tensor") == [h.NULL_BLOCK_ID]
    (padded,) = own(out, "padded")
    assert gdn(padded, "non_spec_state_indices_tensor") == h.state_blocks(trace.config, 0)[:1]


def test_the_finding_is_declined_only_where_the_graph_replays_a_prefill():
    h = hybrid()
    config = h.smallest_full_spec_decode().config  # next_n = 2, FULL graphs up to 8 tokens
    running = Batch((5,), (2,), req_ids=(7,), pages=((1,),), new_pages=(0,))
    arriving = Batch((0,), (2,), req_ids=(7,), pages=((1,),), new_pages=(1,))
    chunk = Batch((0,), (3,), req_ids=(7,), pages=((1,),), new_pages=(1,))
    assert not h.prefill_in_decode_graph(config, running)  # a speculative decode: staged
    assert h.prefill_in_decode_graph(config, arriving)  # a 2-token first chunk, no drafts
    assert not h.prefill_in_decode_graph(config, chunk)  # not uniform: piecewise
    eager = dataclasses.replace(config, cudagraph_mode="PIECEWISE")
    assert not h.prefill_in_decode_graph(eager, arriving)  # no FULL graph


@pytest.mark.parametrize("one_token_short", [False, True])
def test_the_fresh_engine_keeps_the_eager_rows_through_gdn_s_reorder(one_token_short):
    """GDN's ``reorder_batch_threshold`` makes the runner reorder its batch (extends
    first, first chunks last). A warm-up adding request 0 (one computed token: a first
    chunk) and request 1 (four: an extend) one token short of their computed tokens
    would swap their rows, and the fresh build would disagree with the eager one; the
    hybrid's warm-up adds both as first chunks, in their rows."""
    h = hybrid()
    engine = h.HybridRunnerStepEngine()
    if one_token_short:  # vllm-v1's warm-up
        engine.warm_computed = lambda computed: computed - 1
    config = h.smallest_full_spec_decode().config
    steps = (
        Batch((0, 0), (1, 4), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((1, 4), (2, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 0)),
    )
    *_, out = [engine(ref.make_inputs(case)) for case in Trace(config, steps).cases()]
    (eager,) = own(out, "eager")
    (fresh,) = own(out, "fresh")
    assert eager.field("seq_lens").values.tolist() == [3, 6]
    swapped = fresh.field("seq_lens").values.tolist() == [6, 3]
    assert swapped == one_token_short
    assert (ref.history_invariance(out) != []) == one_token_short


def test_a_dummy_run_through_the_held_requests_rows_is_kept_apart():
    """``vllm-v1-hybrid-dummy-held-rows``, a finding of vLLM 0.33.0 kept apart: the idle
    rank's ``_dummy_run`` before the decode builds the GDN metadata from the persistent
    batch's row 0, which holds the running request: the dummy request's state index is
    that request's state block, which the layer's kernels update in place (V2 zeroes a
    dummy run's rows). ``vllm-v1-hybrid`` does not judge a dummy run against the
    requests it holds, so that its searches judge the rest; the kept-apart entry does."""
    from attnfuzz.adapters.vllm.testing import kept_apart_verdict

    m = hybrid()
    witness = m.smallest_dummy_held_rows()
    assert m.trigger_dummy_held_rows(witness)
    verdict = kept_apart_verdict("vllm-v1-hybrid", "vllm-v1-hybrid-dummy-held-rows", witness)
    slot = m.state_blocks(witness.config, 0)[0]
    assert verdict.mismatches and all(
        m.check == "dummy-run-writes-nothing-live" and m.where.startswith("dummy.")
        and f"slot {slot}," in m.got
        for m in verdict.mismatches
    )  # fmt: skip
