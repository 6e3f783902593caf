"""vLLM 0.33.0's model runner V1 step of a sparse-attention MLA model on the FlashMLA
sparse backend, as the implementation ``vllm-v1-flashmla-sparse`` of ``runner-step``:
``FlashMLASparseMetadataBuilder`` builds every step, its uniform split and its
per-token request map judged by the step's properties."""

from __future__ import annotations

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
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def sparse():
    from attnfuzz.adapters.vllm import runner_step_sparse_mla

    return runner_step_sparse_mla


def test_the_sparse_builder_builds_a_verify_padded_for_a_full_graph(monkeypatch):
    """A prefill, then a verify of 2 tokens padded to the FULL graph of 2 requests: each
    token's request in the builder's buffer, the padding tokens given a row of the
    step; every property holds."""
    m = sparse()
    m.prepare()
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(FlashMLASparseMetadataBuilder, "build", "build_for_cudagraph_capture")
    first, second = run_trace(full_spec_decode(), m.SparseMLARunnerStepEngine())
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    (replay,) = own(second, "replay")
    assert values(eager, "sparse.req_id_per_token") == [0, 0]
    assert values(eager, "sparse.seq_lens") == [7]
    assert values(replay, "sparse.seq_lens") == [7, 0]
    assert values(replay, "sparse.req_id_per_token") == [0, 0, 0, 0]


def test_a_step_of_unequal_queries_has_prefills_after_the_uniform_decodes():
    """With ``require_uniform``, a verify of 2 tokens beside a chunk of 5 more: the
    verify is the decode, the chunk a prefill, its query offsets from its first token."""
    m = sparse()
    config = full_spec_decode().config
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3, 5), (2, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 0)),
    )
    _, out = run_trace(Trace(config, steps), m.run)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    assert values(eager, "sparse.req_id_per_token") == [0, 0, 1, 1, 1, 1, 1]
    assert values(eager, "sparse.prefill.query_start_loc") == [0, 5]


def test_a_token_mapped_past_the_step_s_requests_is_unsafe(monkeypatch):
    """Safe padding holds ``sparse.req_id_per_token`` to the step's rows: a map that puts
    every token one request on fails it."""
    m = sparse()
    m.prepare()
    unsafe = unsafe_with_req_id_per_token_shifted(
        monkeypatch, full_spec_decode(), m.SparseMLARunnerStepEngine()
    )
    assert unsafe == {"sparse.req_id_per_token"}


def test_the_drafter_s_later_sub_steps_hand_req_id_per_token_the_first_pass_s_map():
    """Two requests prefill 2 tokens each, two drafts: the sparse builder's
    ``req_id_per_token`` of the drafter's second sub-step is the first pass's first two
    rows, ``[0, 0]``, where the offsets place its tokens in requests 0 and 1: request 1's
    draft token's top-k positions become request 0's KV slots. The kept-apart
    implementation says so; ``vllm-v1-flashmla-sparse`` leaves that map of the later
    sub-steps unjudged."""
    m = sparse()
    m.prepare()
    trace = m.smallest_draft_requests_stale()
    (main,) = run_trace(trace, m.SparseMLARunnerStepEngine())
    assert ref.violations(main) == []
    (kept,) = run_trace(trace, m.draft_requests_stale)
    found = ref.violations(kept)
    assert {(v.prop, v.field) for v in found} == {
        ("agreement within a build", "sparse.req_id_per_token")
    }
    assert {v.build for v in found} == {"eager.draft1", "padded.draft1", "fresh.draft1"}
    builds = {b.name: b for b in kept.builds}
    assert values(builds["eager.draft0"], "sparse.req_id_per_token") == [0, 0, 1, 1]
    assert values(builds["eager.draft1"], "sparse.req_id_per_token") == [0, 0]
    assert values(builds["eager.draft1"], "sparse.token_request") == [0, 1]
