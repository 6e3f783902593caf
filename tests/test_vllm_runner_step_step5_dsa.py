"""vLLM 0.33.0's model runner V1 step of a Step5 model's DSA attention
(``vllm-v1-step5-dsa``): ``Step5DSAMetadataBuilder`` builds every step and capture,
judged by the step's properties."""

from __future__ import annotations

import copy
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


def test_pages_the_backend_or_the_ring_cannot_take_are_declined():
    """Step5's backend inherits FlashAttention's kernel block sizes (multiples of 16); the
    ring needs ``7 + num_spec`` rows of 1 KB in a page (a 16-token page holds 12)."""
    m = step5()
    config = spec_decode().config
    assert m.declines_config(config) is None
    assert "multiples of 16" in m.declines_config(dataclasses.replace(config, block_size=20))
    assert "needs 8 rows" in m.declines_config(dataclasses.replace(config, block_size=8))
    assert "needs 13 rows" in m.declines_config(dataclasses.replace(config, num_spec=6))
    assert m.declines_config(dataclasses.replace(config, num_spec=5)) is None


def test_the_ring_stores_each_scheduled_token_in_its_request_s_block():
    """``Step5CSATailRingMetadataBuilder.build`` on every build: the prefill's positions 0
    to 4 at rows 12 to 16 (block 1, 12 rows of 1 KB a 16-token page), the verify's at
    17 and 18, the graph's padding tokens at none."""
    m = step5()
    first, second = run_trace(spec_decode(), m.Step5DSARunnerStepEngine())
    (prefill,) = own(first, "eager")
    assert values(prefill, "step5.ring.slot_mapping") == [12, 13, 14, 15, 16]
    assert values(prefill, "step5.ring.base") == [12] * 5
    assert values(prefill, "step5.ring.block") == [1]
    (replay,) = own(second, "replay")
    assert values(replay, "step5.ring.slot_mapping") == [17, 18, -1, -1]
    assert values(replay, "step5.ring.block") == [1, 0]


def test_a_ring_slot_mapping_made_anew_each_build_fails_replay_equals_eager(monkeypatch):
    """A ``build`` that hands the ring store a copy of its slot mapping (not the builder's
    buffer, rewritten in place) is captured by the FULL graph, whose replay stores at the
    capture's rows: replay equals eager fails on ``step5.ring.slot_mapping``."""
    m = step5()
    m.prepare()
    from vllm.models.step5.nvidia.csa_tail_ring import Step5CSATailRingMetadataBuilder

    original = Step5CSATailRingMetadataBuilder.build

    def copied(self, *args, **kwargs):
        metadata = copy.copy(original(self, *args, **kwargs))
        metadata.slot_mapping = metadata.slot_mapping.clone()
        return metadata

    monkeypatch.setattr(Step5CSATailRingMetadataBuilder, "build", copied)
    _, second = run_trace(spec_decode(), m.Step5DSARunnerStepEngine())
    stale = {v.field for v in ref.violations(second) if v.prop == "replay equals eager"}
    assert "step5.ring.slot_mapping" in stale


def test_a_dummy_run_into_the_held_requests_ring_is_kept_apart():
    """``vllm-v1-step5-dsa-dummy-held-rows``, a finding of vLLM 0.33.0 kept apart: the
    dummy run before the decode builds the ring's metadata from the persistent batch's
    row 0, which holds the running request: the dummy token stores into that request's
    ring (block 1, row 12: the prefill's position 0). ``vllm-v1-step5-dsa`` does not
    judge a dummy run against the requests it holds; the kept-apart entry does."""
    from attnfuzz.adapters.vllm import runner_step_kpool_tail
    from attnfuzz.adapters.vllm.testing import kept_apart_verdict

    witness = runner_step_kpool_tail.smallest_dummy_held_rows()
    verdict = kept_apart_verdict("vllm-v1-step5-dsa", "vllm-v1-step5-dsa-dummy-held-rows", witness)
    assert verdict.mismatches and all(
        x.check == "dummy-run-writes-nothing-live" and x.where == "dummy.step5.ring.block"
        and "slot 1," in x.got
        for x in verdict.mismatches
    )  # fmt: skip
