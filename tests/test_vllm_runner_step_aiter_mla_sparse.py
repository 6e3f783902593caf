"""vLLM 0.33.0's model runner V1 step of a sparse-attention MLA model on ROCm's AITER MLA
sparse backend, as the implementation ``vllm-v1-aiter-mla-sparse`` of ``runner-step``:
``ROCMAiterMLASparseMetadataBuilder`` builds every step, its per-token offsets, their
graph tail and the schedule judged by the step's properties; a mutant of the tail seen
failing."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import Calls, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref

pytestmark = [*requires_vllm]


def aiter_sparse():
    from attnfuzz.adapters.vllm import runner_step_aiter_mla_sparse

    return runner_step_aiter_mla_sparse


def test_each_verify_token_reads_its_causal_keys_and_padding_tokens_none(monkeypatch):
    """Two requests verify 2 tokens each, then the first alone, padded to the FULL graph
    of 4 tokens: each token's keys are its causal extent (``min(context + position + 1,
    topk)``), the graph's padding tokens read none and map to request 0; the builder runs
    in every build and in the capture runs; every property holds."""
    m = aiter_sparse()
    m.prepare()
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import (
        ROCMAiterMLASparseMetadataBuilder,
    )

    calls = Calls(monkeypatch)
    calls.count(ROCMAiterMLASparseMetadataBuilder, "build")
    outs = run_trace(m.smallest_shrunk_replay(), m.AiterMLASparseRunnerStepEngine())
    assert min(calls.values()) > 0
    assert all(ref.violations(out) == [] for out in outs)
    (eager,) = [b for b in outs[1].of("eager") if b.draft is None]
    assert values(eager, "aiter_sparse.paged_kv_len") == [2, 3, 6, 7]
    assert values(eager, "aiter_sparse.qo_end") == [1, 2, 3, 4]
    (replay,) = outs[2].of("replay")
    assert values(replay, "aiter_sparse.paged_kv_len") == [8, 9, 0, 0]
    assert values(replay, "aiter_sparse.paged_kv_end") == [8, 17, 17, 17]
    assert values(replay, "sparse.req_id_per_token") == [0, 0, 0, 0]
    assert values(replay, "aiter_sparse.schedule_stale") == [0, 0, 0, 0]


def test_an_offset_tail_left_by_a_larger_step_runs_backwards():
    """The mutant ``vllm-v1-aiter-mla-sparse-indptr-tail-kept``: the replayed step's first
    padding token starts at the earlier step's 11, before the real keys' end at 17 (a
    length of -6 that ``mla_decode_fwd`` does not accept); nothing else differs."""
    m = aiter_sparse()
    trace = m.smallest_shrunk_replay()
    assert m.trigger_padded_replay(trace)
    *_, last = run_trace(trace, m.indptr_tail_kept)
    (replay,) = last.of("replay")
    assert values(replay, "aiter_sparse.paged_kv_len") == [8, 9, -6, 7]
    failing = ref.violations(last)
    assert {(v.prop, v.field) for v in failing} == {("safe padding", "aiter_sparse.paged_kv_len")}


def test_a_schedule_made_for_other_offsets_is_stale(monkeypatch):
    """``aiter_sparse.schedule_stale`` counts the offsets the kernel reads that differ from
    those AITER was asked to schedule: a builder that asks AITER for the offsets one key
    short (its fingerprint then keeps that schedule) fails safety on it."""
    m = aiter_sparse()
    m.prepare()
    from attnfuzz.adapters.vllm import runner_step_aiter_mla as aiter_mla

    original = aiter_mla.get_mla_metadata_v1

    def short(qo_indptr, kv_indptr, *rest, **kwargs):
        original(qo_indptr, (kv_indptr - 1).clamp(min=0), *rest, **kwargs)

    monkeypatch.setattr(aiter_mla.AITER, "get_mla_metadata_v1", short)
    outs = run_trace(m.smallest_shrunk_replay(), m.AiterMLASparseRunnerStepEngine())
    unsafe = {v.field for out in outs for v in ref.violations(out) if v.prop == "safe padding"}
    assert unsafe == {"aiter_sparse.schedule_stale"}
