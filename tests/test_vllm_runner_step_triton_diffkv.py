"""vLLM 0.33.0's model runner V1 step on the Triton backend of different K and V head sizes
(``TRITON_ATTN_DIFFKV``), as the implementation ``vllm-v1-triton-diffkv`` of
``runner-step``."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref

pytestmark = [*requires_vllm]


def test_the_diffkv_builder_builds_every_step_and_capture(monkeypatch):
    """``TritonAttentionDiffKVMetadataBuilder`` (its softmax buffer sized by the V head)
    builds every step and capture of a FULL spec decode: every property holds."""
    from attnfuzz.adapters.vllm import runner_step_hybrid, runner_step_triton_diffkv

    m = runner_step_triton_diffkv
    m.prepare()
    from vllm.v1.attention.backends.triton_attn_diffkv import (
        TritonAttentionDiffKVMetadataBuilder,
    )

    calls = Calls(monkeypatch)
    calls.count(TritonAttentionDiffKVMetadataBuilder, "build", "build_for_cudagraph_capture")
    engine = m.DiffKVRunnerStepEngine()
    first, second = run_trace(runner_step_hybrid.smallest_full_spec_decode(), engine)
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert isinstance(builder, TritonAttentionDiffKVMetadataBuilder)
    assert builder.softmax_segm_output.shape[-1] == m.HEAD_SIZE_V  # a power of two already
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (replay,) = own(second, "replay")
    assert values(replay, "seq_lens") == [7, 0]
