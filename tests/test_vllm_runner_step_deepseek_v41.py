"""vLLM 0.33.0's model runner V1 step of DeepSeek-V4.1's attention layers, as the
implementation ``vllm-v1-deepseek-v41`` of ``runner-step``: the compressed-MLA, sparse
indexer, SWA and compressor builders run on every build and capture, each field their
consumers read judged by the step's properties; a mutant of the sparse indexer's
prefill rows seen failing."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def deepseek_v41():
    from attnfuzz.adapters.vllm import runner_step_deepseek_v41

    return runner_step_deepseek_v41


def spec_decode() -> Trace:
    """``smallest_full_spec_decode`` at pages of 32 (the SWA cache's)."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    return Trace(dataclasses.replace(trace.config, block_size=32), trace.steps)


def test_every_builder_runs_and_a_padding_token_writes_nothing(monkeypatch):
    """A prefill of 5 tokens, then a verify of 2 padded to the FULL graph of 4 tokens:
    every DeepSeek-V4.1 builder runs in every build and capture; the compressed slots
    are each group's last token's (ratio 2: every other token), the ring's a row of the
    request's block (its first page, 1: slots 8 on); a padding token writes no
    compressed row; every property holds."""
    m = deepseek_v41()
    m.prepare()
    from vllm.models.deepseek_v41.compressor import CompressorMetadataBuilder
    from vllm.models.deepseek_v41.sparse_mla import (
        DeepseekV4SparseMLAMetadataBuilder,
        DeepseekV41SparseSWAMetadataBuilder,
    )
    from vllm.v1.attention.backends.mla.sparse_indexer import (
        DeepseekV41SparseIndexerMetadataBuilder,
    )

    builders = (
        DeepseekV4SparseMLAMetadataBuilder, DeepseekV41SparseIndexerMetadataBuilder,
        DeepseekV41SparseSWAMetadataBuilder, CompressorMetadataBuilder,
    )  # fmt: skip
    calls = {cls.__name__: Calls(monkeypatch) for cls in builders}
    for cls in builders:
        calls[cls.__name__].count(cls, "build")
    first, second = run_trace(spec_decode(), m.DeepseekV41RunnerStepEngine())
    assert all(c["build"] > 0 for c in calls.values())
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "mla2.slot_mapping") == [-1, 64, -1, 65, -1]
    assert values(prefill, "mla1.slot_mapping") == [128, 129, 130, 131, 132]
    assert values(prefill, "ring.slot_mapping") == [8, 9, 10, 11, 12]
    (replay,) = own(second, "replay")
    assert values(replay, "mla2.slot_mapping") == [66, -1, -1, -1]
    assert values(replay, "ring.token_to_req_indices") == [0, 0, 0, 0]
    assert values(replay, "swa.lens") == [6, 7, 0, 0]


def test_the_indexers_read_compressed_contexts_past_index_topk():
    """A request prefills 66 tokens, then a chunk of 10 more beside a decode, then both
    decode in a FULL graph of 4 tokens: past ``index_topk`` compressed keys the
    indexers run; each decode row's context is its tokens over the ratio, each prefill
    token's K range its own request's gathered keys (76 at ratio 1, 38 at ratio 2)."""
    m = deepseek_v41()
    config = dataclasses.replace(
        spec_decode().config, num_spec=0, max_model_len=96, max_num_batched_tokens=80,
        cudagraph_capture_sizes=(4,),
    )  # fmt: skip
    pages = ((1, 2, 3), (4,))
    steps = (
        Batch((0, 0), (66, 3), req_ids=(0, 1), pages=pages, new_pages=(3, 1),
              prompt_lens=(76, 3)),
        Batch((66, 3), (10, 1), req_ids=(0, 1), pages=pages, new_pages=(0, 0),
              prompt_lens=(76, 3)),
        Batch((76, 4), (1, 1), req_ids=(0, 1), pages=pages, new_pages=(0, 0)),
    )  # fmt: skip
    outs = run_trace(Trace(config, steps), m.run)
    assert all(ref.violations(out) == [] for out in outs)
    (chunk,) = own(outs[1], "eager")
    assert values(chunk, "idx1.prefill.gather_lens") == [0, 76]
    assert values(chunk, "idx2.prefill.gather_lens") == [0, 38]
    assert values(chunk, "idx2.sparse.prefill.ke")[1:] == [33, 34, 34, 35, 35, 36, 36, 37, 37, 38]
    assert values(chunk, "idx2.sparse.decode.row_ke") == [2]
    (replay,) = own(outs[2], "replay")
    assert values(replay, "idx1.decode.seq_lens") == [5, 77, 0, 0]
    assert values(replay, "idx2.sparse.decode.row_ke") == [2, 38, 0, 0]
    assert values(replay, "idx1.decode.schedule_stale") == [0] * 4


def test_prefill_rows_rebased_share_the_decode_rows_scratch():
    """The mutant ``vllm-v1-deepseek-v41-sparse-rows-shared`` on its smallest trace: the
    prefill chunk's scratch rows start at row 0, the decode row's; the real builder's
    start after it; nothing else fails."""
    m = deepseek_v41()
    trace = m.smallest_sparse_decodes_and_prefills()
    assert m.trigger_sparse_decodes_and_prefills(trace) and m.reach_v41(trace)
    (good,) = run_trace(trace, m.run)
    assert ref.violations(good) == []
    (eager,) = own(good, "eager")
    assert set(values(eager, "idx2.sparse.scratch_shared")) == {0}
    (bad,) = run_trace(trace, m.sparse_rows_shared)
    (eager,) = own(bad, "eager")
    assert set(values(eager, "idx2.sparse.scratch_shared")) == {1}
    failing = ref.violations(bad)
    assert {(v.prop, v.field) for v in failing} == {("safe padding", "idx2.sparse.scratch_shared")}


def test_a_full_capture_past_a_rows_reach_is_declined_as_the_dummy_past_row_family():
    """V1's mixed FULL captures give each dummy request the capture's token count as its
    seq_len, which the SWA builder keeps: a FULL engine with a size past a row's reach
    (rows of 128 tokens here) is declined; FULL_AND_PIECEWISE captures only uniform
    decodes FULL (their seq_len the decode's), so it runs."""
    m = deepseek_v41()
    config = dataclasses.replace(
        spec_decode().config,
        max_model_len=122,
        max_num_batched_tokens=256,
        cudagraph_capture_sizes=(4, 232),
    )
    why = m.declines_config(dataclasses.replace(config, cudagraph_mode="FULL"))
    assert why is not None and "vllm-dummy-past-row" in why
    assert (
        m.declines_config(dataclasses.replace(config, cudagraph_mode="FULL_AND_PIECEWISE")) is None
    )
    assert m.declines_config(dataclasses.replace(config, cudagraph_capture_sizes=(4, 128))) is None
