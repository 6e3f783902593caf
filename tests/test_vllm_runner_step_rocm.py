"""vLLM 0.33.0's model runner V1 step on the ROCm attention backend (``vllm-v1-rocm-attn``),
the ROCm segmented-prefill backend (``vllm-v1-rocm-segmented``) and the ROCm Octave
backend (``vllm-v1-rocm-octave``) of ``runner-step``: each builder builds every step,
judged by the step's properties."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def rocm():
    from attnfuzz.adapters.vllm import runner_step_rocm

    return runner_step_rocm


def spec_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_the_rocm_attn_builder_builds_every_step_and_capture(monkeypatch):
    """``RocmAttentionMetadataBuilder`` builds every step and the capture runs (which
    fill the runner's seq_lens with 1 and zero its query offsets): the decode after
    them, padded to the FULL graph of 2 requests and replayed, holds every property."""
    m = rocm()
    m.prepare()
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(RocmAttentionMetadataBuilder, "build", "build_for_cudagraph_capture")
    first, second = run_trace(spec_decode(), m.RocmAttnRunnerStepEngine())
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    captured = [b for b in first.builds if b.how == "capture" and b.field("seq_lens")]
    assert captured and all(set(values(b, "seq_lens")) == {1} for b in captured)
    assert all(set(values(b, "query_start_loc")) == {0} for b in captured)
    (replay,) = own(second, "replay")
    assert values(replay, "query_start_loc") == [0, 2, 2]
    assert values(replay, "seq_lens") == [7, 0]


def test_the_segmented_builder_builds_every_step_and_capture(monkeypatch):
    """``RocmSegmentedAttentionMetadataBuilder`` (ROCm attention's builder, sized for the
    token-major kernel: the query heads, KV heads and head size of the group) builds
    every step and capture of the FULL spec decode: every property holds."""
    m = rocm()
    m.prepare()
    from vllm.v1.attention.backends.rocm_segmented_attn import (
        RocmSegmentedAttentionMetadataBuilder,
    )

    calls = Calls(monkeypatch)
    calls.count(RocmSegmentedAttentionMetadataBuilder, "build", "build_for_cudagraph_capture")
    engine = m.SegmentedRunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert isinstance(builder, RocmSegmentedAttentionMetadataBuilder)
    assert (builder.num_heads_kv, builder.headdim) == (1, 128)
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (replay,) = own(second, "replay")
    assert values(replay, "seq_lens") == [7, 0]


def test_octave_maps_each_query_token_to_its_request_and_k_length():
    """A decode of 2 tokens (one draft) padded to the FULL graph of 2 requests: its tokens
    read 6 and 7 keys of request 0; the graph's padding tokens are past the last
    request, K length 0; the decode reads request 0's 7 keys."""
    m = rocm()
    _, out = run_trace(spec_decode(), m.run_octave)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    (replay,) = own(out, "replay")
    assert values(eager, "octave.q_to_req") == [0, 0]
    assert values(eager, "octave.q_to_klen") == [6, 7]
    assert values(replay, "octave.q_to_req") == [0, 0, 2, 2]
    assert values(replay, "octave.q_to_klen") == [6, 7, 0, 0]
    assert values(eager, "kv_len") == values(replay, "kv_len")[:1] == [7]


def test_octave_k_lengths_past_a_request_are_unsafe(monkeypatch):
    """Safe padding holds ``octave.q_to_klen`` to the block-table row's reach: a fill that
    runs every token's K length 1000 keys on fails it."""
    m = rocm()
    m.prepare()
    from vllm.v1.attention.backends.rocm_octave_attn import RocmOctaveMetadataBuilder

    original = RocmOctaveMetadataBuilder._fill_query_maps

    def fill(md):
        original(md)
        md.q_to_klen.add_(1000)

    monkeypatch.setattr(RocmOctaveMetadataBuilder, "_fill_query_maps", staticmethod(fill))
    _, second = run_trace(spec_decode(), m.OctaveRunnerStepEngine())
    unsafe = {v.field for v in ref.violations(second) if v.prop == "safe padding"}
    assert "octave.q_to_klen" in unsafe


def test_octave_declines_a_step_its_prefill_kernel_runs():
    m = rocm()
    config = dataclasses.replace(
        spec_decode().config, max_num_batched_tokens=256, max_model_len=256
    )
    step = Batch((0,), (129,), req_ids=(0,), pages=(tuple(range(1, 10)),), new_pages=(9,))
    (case,) = Trace(config, (step,)).cases()
    assert "over 128" in m.declines_octave(case)
    assert m.declines(case) is None
