"""vLLM 0.33.0's model runner V1 step of a sparse-attention MLA model on FlashAttention's
sparse MLA backend (``vllm-v1-flashattn-mla-sparse``): its builder builds every step and
capture, judged by the step's properties."""

from __future__ import annotations

import dataclasses

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


def flashattn_sparse():
    from attnfuzz.adapters.vllm import runner_step_flashattn_mla_sparse

    return runner_step_flashattn_mla_sparse


def test_the_builder_builds_every_step_and_capture(monkeypatch):
    """``FlashAttnMLASparseMetadataBuilder`` builds the prefill, the verify (eager,
    padded, replayed, the drafter's sub-step) and the capture runs; every property holds,
    and the verify's 2 tokens and its graph padding map to request 0."""
    m = flashattn_sparse()
    m.prepare()
    from vllm.v1.attention.backends.mla.flashattn_mla_sparse import (
        FlashAttnMLASparseMetadataBuilder,
    )

    calls = Calls(monkeypatch)
    calls.count(FlashAttnMLASparseMetadataBuilder, "build", "build_for_cudagraph_capture")
    made = m.FlashAttnRunnerStepEngine()
    first, second = run_trace(full_spec_decode(), made)
    builder = made.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert type(builder) is FlashAttnMLASparseMetadataBuilder
    # __init__: 2 heads a rank are no count the table lists, so 256; one DCP rank.
    assert builder.reorder_batch_threshold == 256
    assert builder.supports_draft_decode_metadata_update is True
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    (replay,) = own(second, "replay")
    assert values(eager, "sparse.req_id_per_token") == [0, 0]
    assert values(replay, "sparse.seq_lens") == [7, 0]
    assert values(replay, "sparse.req_id_per_token") == [0, 0, 0, 0]


def test_pages_the_backend_has_no_kernel_for_are_declined():
    """Pages of 32 are not multiples of 64 (``get_supported_kernel_block_sizes``)."""
    m = flashattn_sparse()
    config = full_spec_decode().config
    assert m.declines_config(config) is None
    assert "multiples of 64" in m.declines_config(dataclasses.replace(config, block_size=32))


def test_a_token_mapped_past_the_step_s_requests_is_unsafe(monkeypatch):
    """Safe padding holds the builder's ``sparse.req_id_per_token`` to the step's rows: a
    map that puts every token one request on fails it."""
    m = flashattn_sparse()
    m.prepare()
    unsafe = unsafe_with_req_id_per_token_shifted(
        monkeypatch, full_spec_decode(), m.FlashAttnRunnerStepEngine()
    )
    assert unsafe == {"sparse.req_id_per_token"}
