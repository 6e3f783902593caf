"""vLLM 0.33.0's model runner V1 step of a hybrid model whose linear layer is Mamba2 or
PLE short-conv, as the implementations ``vllm-v1-mamba2`` and ``vllm-v1-ple-short-conv``
of ``runner-step``: the builders' metadata judged by the step's properties."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

BUILDERS = {
    "mamba2": "vllm.v1.attention.backends.mamba2_attn:Mamba2AttentionMetadataBuilder",
    "ple-short-conv": (
        "vllm.v1.attention.backends.short_conv_attn:PleShortConvAttentionMetadataBuilder"
    ),
}
PREFIX = {"mamba2": "mamba2", "ple-short-conv": "short_conv"}


def linear():
    from attnfuzz.adapters.vllm import runner_step_linear

    return runner_step_linear


def hybrid():
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid


@pytest.mark.parametrize("backend", ["mamba2", "ple-short-conv"])
def test_the_builder_of_the_second_group_builds_every_step(backend, monkeypatch):
    """The runner's own ``_build_attention_metadata`` calls the backend's builder for
    the second group: a prefill, then a speculative decode padded to the FULL graph of
    2 requests (the padding row's state the null block), replayed and built afresh;
    the capture runs build it too; the correct engine holds every property."""
    import importlib

    lin = linear()
    lin.prepare()
    module, cls = BUILDERS[backend].split(":")
    builder = getattr(importlib.import_module(module), cls)
    calls = Calls(monkeypatch)
    calls.count(builder, "build", "build_for_cudagraph_capture")
    trace = hybrid().smallest_full_spec_decode()
    engine = lin.LinearRunnerStepEngine(lin.BACKENDS[backend])
    first, second = run_trace(trace, engine)
    assert calls["build"] > 0 and calls["build_for_cudagraph_capture"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    blocks = hybrid().state_blocks(trace.config, 0)
    states = f"{PREFIX[backend]}.state_by_request"
    (prefill,) = own(first, "eager")
    assert values(prefill, states) == blocks[:1]
    (eager,) = own(second, "eager")
    (padded,) = own(second, "padded")
    (replay,) = own(second, "replay")
    (fresh,) = own(second, "fresh")
    assert values(eager, states) == values(fresh, states) == blocks[:1]
    assert values(padded, states) == values(replay, states) == [blocks[0], lin.NULL_BLOCK_ID]
    if backend == "mamba2":
        name = "mamba2.state_indices_tensor_d"  # the request's 1 + num_spec state blocks
        assert values(padded, name) == [blocks, [lin.NULL_BLOCK_ID] * 2]
        assert values(padded, "mamba2.query_start_loc_d") == [0, 2, 2]
    else:
        assert values(padded, "short_conv.spec_state_indices_tensor") == [blocks[0], 0]
        assert values(padded, "short_conv.spec_query_start_loc") == [0, 2, 2]
        assert values(padded, "short_conv.spec_sequence_masks") == [True, False]
    captured = [b for b in first.builds if b.how == "capture"]
    assert any(b.field(states) is not None for b in captured)


def test_mamba2_chunks_a_prompt_by_the_model_s_chunk_size():
    """The model's chunk size (8) reaches the builder: a 10-token prompt after 3
    computed tokens is chunked at the absolute positions 8 (5 tokens) and 13; the
    causal conv's programs cover 8 tokens each."""
    lin = linear()
    config = hybrid().smallest_full_spec_decode().config
    steps = (
        Batch((0,), (3,), req_ids=(0,), pages=((1,),), new_pages=(1,)),
        Batch((3,), (10,), req_ids=(0,), pages=((1,),), new_pages=(0,)),
    )
    _, out = run_trace(Trace(config, steps), lin.run_mamba2)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    assert values(eager, "mamba2.cu_chunk_seqlen_p") == [0, 5, 10]
    assert values(eager, "mamba2.seq_idx_p") == [0, 0]
    assert values(eager, "mamba2.last_chunk_indices_p") == [1]
    assert values(eager, "mamba2.has_initial_states_p") == [True]
    assert values(eager, "mamba2.batch_ptr")[:3] == [0, 0, -1]


@pytest.mark.parametrize(
    ("mutant", "smallest", "fields"),
    [
        (
            "mamba2_pad_slot_states",
            "smallest_full_decode",
            {"mamba2.state_indices_tensor_d", "mamba2.state_by_request"},
        ),
        (
            "ple_short_conv_pad_slot_states",
            "smallest_full_spec_decode",
            {"short_conv.spec_state_indices_tensor", "short_conv.state_by_request"},
        ),
    ],
)
def test_each_mutant_fails_safe_padding_on_its_smallest_trace(mutant, smallest, fields):
    """The correct engine holds every property on the trace; each mutant's padding row
    of the FULL graph holds -1 for a state index, which its kernel reads."""
    lin = linear()
    trace = getattr(lin, smallest, None) or getattr(hybrid(), smallest)
    backend = "mamba2" if mutant.startswith("mamba2") else "ple-short-conv"
    fixed = run_trace(trace(), lin.LinearRunnerStepEngine(lin.BACKENDS[backend]))
    assert all(ref.violations(out) == [] for out in fixed)
    *_, out = run_trace(trace(), getattr(lin, mutant))
    found = ref.violations(out)
    assert {(v.prop, v.build) for v in found} >= {("safe padding", "padded"),
                                                  ("safe padding", "replay")}  # fmt: skip
    assert {v.field for v in found} == fields


@pytest.mark.parametrize("backend", ["mamba2", "ple-short-conv"])
def test_both_builders_share_the_hybrid_finding_of_a_first_chunk_in_a_decode_graph(backend):
    """vLLM 0.33.0's own finding, as GDN's (``vllm-v1-hybrid-prefill-in-decode-graph``):
    a one-token first chunk in a uniform batch replays a FULL decode graph while the
    builder builds it as a prefill and stages nothing; the replay reads the capture's
    null state where the eager build has the request's. Declined; run here anyway."""
    lin = linear()
    trace = hybrid().smallest_prefill_in_decode_graph()
    (case,) = trace.cases()
    assert lin.declines(case) is not None
    (out,) = run_trace(trace, lin.LinearRunnerStepEngine(lin.BACKENDS[backend]))
    states = f"{PREFIX[backend]}.state_by_request"
    found = {(v.prop, v.field, v.build) for v in ref.violations(out)}
    assert ("replay equals eager", states, "replay") in found
    (replay,) = own(out, "replay")
    assert values(replay, states)[:1] == [lin.NULL_BLOCK_ID]


def test_bailing_stages_a_speculative_decode_with_pad_slot_padding():
    """Bailing's builder runs for the second group on every build; a speculative decode
    padded to the FULL graph of 2 requests stages the padding row's state indices,
    query offsets and accepted count (PAD_SLOT_ID, the last offset, 1), which the
    lightning-attention decode skips; every property holds."""
    lin = linear()
    lin.prepare()
    trace = hybrid().smallest_full_spec_decode()
    first, second = run_trace(trace, lin.run_bailing_linear)
    assert ref.violations(first) == [] and ref.violations(second) == []
    blocks = hybrid().state_blocks(trace.config, 0)
    (eager,) = own(second, "eager")
    (replay,) = own(second, "replay")
    assert values(eager, "bailing_linear.state_indices_tensor_d") == [blocks]
    assert values(replay, "bailing_linear.state_indices_tensor_d") == [blocks, [-1, -1]]
    assert values(replay, "bailing_linear.query_start_loc_d") == [0, 2, 2]
    assert values(replay, "bailing_linear.num_accepted_tokens")[1:] == [1]
    assert values(replay, "bailing_linear.state_by_request") == [blocks[0], -1]


def test_bailing_stages_a_first_chunk_in_a_decode_graph():
    """Unlike the conv backends' builders, Bailing's splits by query length alone: the
    first chunk the hybrid finding is about is a decode it stages, so the replay
    agrees with the eager build, and its engine does not decline the step."""
    lin = linear()
    trace = hybrid().smallest_prefill_in_decode_graph()
    (case,) = trace.cases()
    assert lin.declines_bailing_linear(case) is None
    (out,) = run_trace(trace, lin.run_bailing_linear)
    assert ref.violations(out) == []


def test_bailing_last_state_padded_fails_replay_equals_eager():
    """The mutant stages the last real decode as padding (-1): in range, so safe, but
    the replay no longer reads the request's state the eager build names."""
    lin = linear()
    *_, out = run_trace(hybrid().smallest_full_decode(), lin.bailing_linear_last_state_padded)
    found = {(v.prop, v.field) for v in ref.violations(out)}
    assert ("replay equals eager", "bailing_linear.state_by_request") in found
    assert {prop for prop, _ in found} <= {"replay equals eager", "padding invariance"}


def test_mamba1_builds_a_decode_padded_for_a_full_graph(monkeypatch):
    """``Mamba1AttentionMetadataBuilder`` builds a prefill of 3 tokens, then its decode
    padded to the FULL graph of 2 requests (the padding request's state the null block),
    replayed and built afresh; it makes no chunks (the model has none); every property
    holds."""
    lin = linear()
    lin.prepare()
    from vllm.v1.attention.backends.mamba1_attn import Mamba1AttentionMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(Mamba1AttentionMetadataBuilder, "build", "build_for_cudagraph_capture")
    trace = hybrid().smallest_full_decode()
    first, second = run_trace(trace, lin.run_mamba1)
    assert calls["build"] > 0 and calls["build_for_cudagraph_capture"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (state,) = hybrid().state_blocks(trace.config, 0)
    (prefill,) = own(first, "eager")
    assert values(prefill, "mamba1.state_indices_tensor_p") == [state]
    assert values(prefill, "mamba1.query_start_loc_p") == [0, 3]
    assert prefill.field("mamba1.cu_chunk_seqlen_p") is None
    (replay,) = own(second, "replay")
    assert values(replay, "mamba1.state_by_request") == [state, lin.NULL_BLOCK_ID]


def test_mamba1_declines_a_config_that_drafts():
    """A Mamba1 layer's state has no rows for drafts: a config of ``num_spec`` 1 is
    declined, naming the state shape."""
    lin = linear()
    case = next(iter(hybrid().smallest_full_spec_decode().cases()))
    assert "mamba1_state_shape" in lin.declines_mamba1(case)


def test_a_mamba1_padding_row_naming_a_live_state_is_unsafe(monkeypatch):
    """``mamba1.state_indices_tensor_d``'s padding rows must name no live state: a build
    that gives the FULL decode's padding request the first request's state fails
    "padding writes no real state" in the padded build and its replay."""
    lin = linear()
    lin.prepare()
    from vllm.v1.attention.backends.mamba1_attn import Mamba1AttentionMetadataBuilder

    original = Mamba1AttentionMetadataBuilder.build

    def shared(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        d = out.state_indices_tensor_d
        if d is not None and len(d) > 1:  # the step's one request, then padding
            d[1:] = d[0]
        return out

    monkeypatch.setattr(Mamba1AttentionMetadataBuilder, "build", shared)
    _, second = run_trace(hybrid().smallest_full_decode(), lin.run_mamba1)
    shared_state = {
        (v.field, v.build)
        for v in ref.violations(second)
        if v.prop == "padding writes no real state"
    }
    assert ("mamba1.state_indices_tensor_d", "padded") in shared_state
    assert ("mamba1.state_indices_tensor_d", "replay") in shared_state
