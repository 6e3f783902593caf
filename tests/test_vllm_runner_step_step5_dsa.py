"""vLLM 0.33.0's model runner V1 step of a Step5 model's DSA attention
(``vllm-v1-step5-dsa``): ``Step5DSAMetadataBuilder`` builds every step and capture,
judged by the step's properties."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def step5():
    from attnfuzz.adapters.vllm import runner_step_step5_dsa

    return runner_step_step5_dsa


def spec_decode() -> Trace:
    """A prefill of 5 tokens, then a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_the_builder_builds_every_step_and_capture(monkeypatch):
    """The DSA builder builds the prefill, the verify (eager, padded, replayed, the
    drafter's sub-step) and the capture runs; every property holds; its host query
    offsets are the step's requests' (the padding request's none)."""
    m = step5()
    m.prepare()
    from vllm.models.step5.nvidia.sparse_attention import Step5DSAMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(Step5DSAMetadataBuilder, "build", "_plan_prefill")
    made = m.Step5DSARunnerStepEngine()
    first, second = run_trace(spec_decode(), made)
    builder = made.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert type(builder) is Step5DSAMetadataBuilder
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "step5.query_start_loc_cpu") == [0, 5]
    (eager,) = own(second, "eager")
    assert values(eager, "step5.query_start_loc_cpu") == [0, 2]
    (replay,) = own(second, "replay")
    assert values(replay, "fa.seq_lens") == [7, 0]


def test_a_host_offset_past_the_step_s_tokens_is_unsafe(monkeypatch):
    """Safe padding holds ``step5.query_start_loc_cpu`` to the step's tokens: a builder
    that hands on offsets one past them fails it."""
    m = step5()
    m.prepare()
    from vllm.models.step5.nvidia.sparse_attention import Step5DSAMetadataBuilder

    original = Step5DSAMetadataBuilder.build

    def shifted(self, common_prefix_len, common_attn_metadata, fast_build=False):
        meta = original(self, common_prefix_len, common_attn_metadata, fast_build)
        meta.query_start_loc_cpu = meta.query_start_loc_cpu + 1000
        return meta

    monkeypatch.setattr(Step5DSAMetadataBuilder, "build", shifted)
    _, second = run_trace(spec_decode(), m.Step5DSARunnerStepEngine())
    unsafe = {v.field for v in ref.violations(second) if v.prop == "safe padding"}
    assert "step5.query_start_loc_cpu" in unsafe


def test_pages_the_backend_has_no_kernel_for_are_declined():
    """Step5's backend inherits FlashAttention's kernel block sizes (multiples of 16)."""
    m = step5()
    config = spec_decode().config
    assert m.declines_config(config) is None
    assert "multiples of 16" in m.declines_config(dataclasses.replace(config, block_size=8))
