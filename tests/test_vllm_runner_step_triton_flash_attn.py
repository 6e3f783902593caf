"""vLLM 0.33.0's model runner V1 step on the Triton/FlashAttention composite backend
(FA3 as on an sm90 GPU), as the implementation ``vllm-v1-triton-flash-attn`` of
``runner-step``: ``CompositeAttentionMetadataBuilder`` routes every build and capture
to a child, judged by the step's properties."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref

pytestmark = [*requires_vllm]


def composite():
    from attnfuzz.adapters.vllm import runner_step_triton_flash_attn

    return runner_step_triton_flash_attn


def smallest_full_decode():
    from attnfuzz.adapters.vllm import runner_step_mla

    return runner_step_mla.smallest_full_decode()


def test_every_build_of_a_text_step_goes_to_flash_attention(monkeypatch):
    """The composite's builder holds both children's builders; a step without an image
    is built by FlashAttention's (``_build`` tags it 1), as is every FULL capture (the
    routing's ``capture_variant``); Triton's builder builds nothing. A prefill, then a
    one-token decode padded to the FULL graph of 2 requests: every property holds."""
    m = composite()
    m.prepare()
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder

    fa_calls, triton_calls = Calls(monkeypatch), Calls(monkeypatch)
    fa_calls.count(FlashAttentionMetadataBuilder, "build", "build_for_cudagraph_capture")
    triton_calls.count(TritonAttentionMetadataBuilder, "build", "build_for_cudagraph_capture")
    engine = m.TritonFlashAttnRunnerStepEngine()
    first, second = run_trace(smallest_full_decode(), engine)
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert type(builder).__name__ == "CompositeAttentionMetadataBuilder"
    assert isinstance(builder.causal_builder, FlashAttentionMetadataBuilder)
    assert isinstance(builder.general_builder, TritonAttentionMetadataBuilder)
    assert set(fa_calls) == {"build", "build_for_cudagraph_capture"} and not triton_calls
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    (replay,) = own(second, "replay")
    assert values(eager, "composite.variant") == [1]
    assert values(replay, "composite.variant") == [1, 1]
    assert values(replay, "fa.seq_lens") == [4, 0]
    # The FULL captures build metadata (a PIECEWISE capture builds none).
    captured = [b for b in first.builds if b.how == "capture" and b.field("composite.variant")]
    assert captured and all(set(values(b, "composite.variant")) == {1} for b in captured)


def test_with_drafts_the_composite_keeps_no_full_decode_graph():
    """``UNIFORM_SINGLE_TOKEN_DECODE``: FULL becomes FULL_AND_PIECEWISE, and with a draft
    (a uniform decode of 2 queries) the FULL decode mode PIECEWISE; the engine checks
    vLLM's resolution against this (``resolves_to``)."""
    from vllm.config import CUDAGraphMode

    m = composite()
    config = smallest_full_decode().config
    spec = dataclasses.replace(config, num_spec=1)
    engine = m._TritonFlashAttnEngine.__new__(m._TritonFlashAttnEngine)
    engine.config = config
    assert engine.resolves_to(CUDAGraphMode.FULL) == CUDAGraphMode.FULL_AND_PIECEWISE
    assert engine.resolves_to(CUDAGraphMode.FULL_DECODE_ONLY) == CUDAGraphMode.FULL_DECODE_ONLY
    engine.config = spec
    assert engine.resolves_to(CUDAGraphMode.FULL) == CUDAGraphMode.PIECEWISE
    assert engine.resolves_to(CUDAGraphMode.PIECEWISE) == CUDAGraphMode.PIECEWISE


def test_the_mutant_fails_on_its_smallest_trace():
    """The correct engine captures by FlashAttention; the mutant's capture runs build by
    Triton (variant 0), so the graph's replays run the child the capture recorded."""
    m = composite()
    trace = m.smallest_capture
    assert m.trigger_capture(trace())
    assert all(
        ref.violations(out) == [] for out in run_trace(trace(), m.TritonFlashAttnRunnerStepEngine())
    )
    *_, out = run_trace(trace(), m.capture_variant_general)
    found = ref.violations(out)
    assert found and {v.field for v in found} == {"composite.variant"}
    assert "capture" in {v.build for v in found}
