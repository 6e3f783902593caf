"""vLLM 0.33.0's model runner V1 step of an MLA model on the Tokenspeed MLA backend
(``vllm-v1-tokenspeed-mla``): ``TokenspeedMLAMetadataBuilder`` builds every step and
capture over an fp8 latent cache, judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def tokenspeed():
    from attnfuzz.adapters.vllm import runner_step_tokenspeed_mla

    return runner_step_tokenspeed_mla


def spec_decode(block_size: int) -> Trace:
    """``smallest_full_spec_decode`` at pages of ``block_size``: a prefill of 5 tokens,
    then a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    config = dataclasses.replace(trace.config, block_size=block_size, max_model_len=256)
    return Trace(config, trace.steps)


@pytest.mark.parametrize("block_size", [32, 128])
def test_the_tokenspeed_builder_builds_every_step_and_capture(monkeypatch, block_size):
    """Pages of one kernel block (32) and of two (128, split into kernel blocks of 64):
    the builder builds the prefill, the verify and the capture runs of an fp8 latent
    cache of DeepSeek-R1's dimensions; every property holds."""
    m = tokenspeed()
    m.prepare()
    from vllm.v1.attention.backends.mla.tokenspeed_mla import TokenspeedMLAMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(TokenspeedMLAMetadataBuilder, "build", "build_for_cudagraph_capture")
    engine = m.TokenspeedRunnerStepEngine()
    first, second = run_trace(spec_decode(block_size), engine)
    group = engine.graphs.runner.attn_groups[0][0]
    assert isinstance(group.get_metadata_builder(), TokenspeedMLAMetadataBuilder)
    assert group.kv_cache_spec.cache_dtype_str == "fp8"
    hf = engine.graphs.vllm_config.model_config.hf_text_config
    assert (hf.qk_nope_head_dim, hf.qk_rope_head_dim, hf.v_head_dim) == (128, 64, 128)
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (replay,) = own(second, "replay")
    assert values(replay, "mla.decode.seq_lens") == [7, 0]
    assert values(replay, "kv_len") == [7, 0]


def test_pages_under_the_smallest_kernel_page_are_declined():
    """Tokenspeed's kernel pages are 32 or 64 tokens: pages of 16 are declined."""
    m = tokenspeed()
    config = spec_decode(32).config
    assert "32 or 64" in m.declines_config(dataclasses.replace(config, block_size=16))
    assert m.declines_config(config) is None


def test_decode_seq_lens_copied_fails_replay_equals_eager(monkeypatch):
    """``_build_decode`` handing the kernel a copy of the decodes' seq_lens: the FULL
    graph's replay reads the capture's lengths (replay equals eager fails)."""
    m = tokenspeed()
    m.prepare()
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder

    original = MLACommonMetadataBuilder._build_decode

    def copied(self, *args, **kwargs):
        decode = original(self, *args, **kwargs)
        decode.seq_lens = decode.seq_lens.clone()
        return decode

    monkeypatch.setattr(MLACommonMetadataBuilder, "_build_decode", copied)
    _, second = run_trace(spec_decode(32), m.TokenspeedRunnerStepEngine())
    stale = {v.field for v in ref.violations(second) if v.prop == "replay equals eager"}
    assert "mla.decode.seq_lens" in stale
