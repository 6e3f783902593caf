"""vLLM 0.33.0's model runner V1 step of a sparse-attention MLA model on FlashInfer's
sparse MLA backends (``vllm-v1-flashinfer-mla-sparse``: the TRT-LLM one;
``vllm-v1-flashinfer-mla-sparse-sm120``): each builder builds every step and capture,
judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import (
    Calls,
    full_spec_decode,
    own,
    requires_vllm,
    run_trace,
    unsafe_with_req_id_per_token_shifted,
    values,
)
from attnfuzz.reference import runner_step as ref

pytestmark = [*requires_vllm]


def flashinfer_sparse():
    from attnfuzz.adapters.vllm import runner_step_flashinfer_mla_sparse

    return runner_step_flashinfer_mla_sparse


@pytest.mark.parametrize(
    ("engine", "builder", "block_size"),
    [
        ("TRTLLMRunnerStepEngine", "FlashInferMLASparseTRTLLMMetadataBuilder", 32),
        ("SM120RunnerStepEngine", "FlashInferMLASparseMetadataBuilder", 64),
    ],
)
def test_each_builder_builds_every_step_and_capture(monkeypatch, engine, builder, block_size):
    """The backend's own builder builds the prefill, the verify (eager, padded, replayed,
    the drafter's sub-step) and the capture runs; every property holds, and the verify's
    2 tokens and its graph padding map to request 0."""
    m = flashinfer_sparse()
    m.prepare()
    from vllm.v1.attention.backends.mla import flashinfer_mla_sparse

    cls = getattr(flashinfer_mla_sparse, builder)
    calls = Calls(monkeypatch)
    calls.count(cls, "build", "build_for_cudagraph_capture")
    made = getattr(m, engine)()
    first, second = run_trace(full_spec_decode(block_size), made)
    assert type(made.graphs.runner.attn_groups[0][0].get_metadata_builder()) is cls
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    (replay,) = own(second, "replay")
    assert values(eager, "sparse.req_id_per_token") == [0, 0]
    assert values(replay, "sparse.seq_lens") == [7, 0]
    assert values(replay, "sparse.req_id_per_token") == [0, 0, 0, 0]


def test_the_trtllm_builder_takes_the_drafter_s_in_place_update():
    """One rank, no HiSparse: ``FlashInferMLASparseTRTLLMMetadataBuilder.__init__`` lets a
    drafter update its decode metadata in place; FlashInfer's SM120 builder does not."""
    m = flashinfer_sparse()
    trtllm, sm120 = m.TRTLLMRunnerStepEngine(), m.SM120RunnerStepEngine()
    run_trace(full_spec_decode(), trtllm)
    run_trace(full_spec_decode(), sm120)
    builders = [e.graphs.runner.attn_groups[0][0].get_metadata_builder() for e in (trtllm, sm120)]
    assert [b.supports_draft_decode_metadata_update for b in builders] == [True, False]
    assert sm120.graphs.vllm_config.model_config.hf_text_config.index_topk == 2048


def test_pages_the_backend_has_no_kernel_for_are_declined():
    """Pages of 32 are the TRT-LLM backend's, not SM120's (multiples of 64); 16 neither's."""
    m = flashinfer_sparse()
    config = full_spec_decode().config
    assert m.declines_config(dataclasses.replace(config, block_size=32)) is None
    assert "multiples of 32" in m.declines_config(dataclasses.replace(config, block_size=16))
    assert "multiples of 64" in m.declines_config_sm120(dataclasses.replace(config, block_size=32))


def test_a_token_mapped_past_the_step_s_requests_is_unsafe(monkeypatch):
    """Safe padding holds the TRT-LLM builder's ``sparse.req_id_per_token`` to the step's
    rows: a map that puts every token one request on fails it."""
    m = flashinfer_sparse()
    m.prepare()
    unsafe = unsafe_with_req_id_per_token_shifted(
        monkeypatch, full_spec_decode(32), m.TRTLLMRunnerStepEngine()
    )
    assert unsafe == {"sparse.req_id_per_token"}
