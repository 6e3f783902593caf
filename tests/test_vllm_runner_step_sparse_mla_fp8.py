"""vLLM 0.33.0's model runner V1 step of a sparse-attention MLA model on the FlashMLA
sparse backend with an fp8 cache, as the implementation ``vllm-v1-flashmla-sparse-fp8``
of ``runner-step``: ``_build_fp8_separate_prefill_decode`` lays out the FP8 decode's rows
and each prefill's workspace, judged by the step's properties."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref

pytestmark = [*requires_vllm]


def fp8():
    from attnfuzz.adapters.vllm import runner_step_sparse_mla_fp8

    return runner_step_sparse_mla_fp8


def test_the_separate_path_lays_out_each_prefills_workspace(monkeypatch):
    """64 heads a rank and an fp8_ds_mla cache: the builder takes the separate
    prefill/decode path. A decode, then two prefills (the first with 4 keys of context):
    each token's prefill, each prefill's gathered keys within its room of the workspace,
    the chunk's pages; every property holds."""
    m = fp8()
    m.prepare()
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(FlashMLASparseMetadataBuilder, "_build_fp8_separate_prefill_decode")
    engine = m.SparseMLAFp8RunnerStepEngine()
    first, second = run_trace(m.smallest_workspace(), engine)
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert builder.use_fp8_kv_cache and not builder.fp8_use_mixed_batch
    assert calls["_build_fp8_separate_prefill_decode"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    assert values(eager, "sparse_fp8.decode.row_start") == [0]
    assert values(eager, "sparse_fp8.decode.cache_lens") == [64]
    assert values(eager, "sparse_fp8.prefill.request_ids") == [-1, 0, 0, 0, 0, 1, 1, 1]
    assert values(eager, "sparse_fp8.prefill.token_chunk") == [-1] + [0] * 7
    assert values(eager, "sparse_fp8.prefill.chunk_seq_lens") == [8, 3]
    assert values(eager, "sparse_fp8.prefill.workspace_room") == [0, 0]
    assert [row[0] for row in values(eager, "sparse_fp8.prefill.chunk_block_table")] == [2, 3]


def test_the_mutant_fails_on_its_smallest_trace():
    """The mutant starts the second prefill at the first's 4 queries, not its 8 keys: the
    first's gathered keys run 4 rows over it (and the chunk keeps 4 rows no one uses)."""
    m = fp8()
    trace = m.smallest_workspace
    assert m.trigger_workspace(trace()) and m.reach_prefill(trace())
    *_, out = run_trace(trace(), m.workspace_by_query)
    found = ref.violations(out)
    assert found and {(v.prop, v.field) for v in found} == {
        ("safe padding", "sparse_fp8.prefill.workspace_room")
    }
    (eager,) = own(out, "eager")
    assert values(eager, "sparse_fp8.prefill.workspace_room") == [-4, 4]
