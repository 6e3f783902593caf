"""vLLM 0.33.0's model runner V1 step of MiniMax M3's block-sparse attention, as the
implementation ``vllm-v1-minimax-m3-sparse`` of ``runner-step``: the MSA main builder
(on ``MiniMaxM3SparseMetadataBuilder``) and the Triton indexer's build every step of a
model whose layers are wired as MiniMax M3's are, in one KV-cache group of vLLM's own
grouping; the graph's padding rows and the prefills' offsets judged by the step's
properties; a mutant of the offsets' rebase seen failing."""

from __future__ import annotations

import collections
import dataclasses

from attnfuzz.adapters.vllm.testing import own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def minimax_m3():
    from attnfuzz.adapters.vllm import runner_step_minimax_m3

    return runner_step_minimax_m3


def spec_decode() -> Trace:
    """``smallest_full_spec_decode`` at pages of 128 (the backends' only size)."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    config = dataclasses.replace(trace.config, block_size=128, max_model_len=256)
    return Trace(config, trace.steps)


def test_both_builders_of_one_group_build_a_verify_padded_to_the_graph(monkeypatch):
    """A prefill of 5 tokens, then a verify of 2 padded to the FULL graph of 4 tokens:
    vLLM groups the sparse layer's cache and its index cache in one KV-cache group, the
    runner's attention groups are the MSA main backend's and the Triton indexer's, each
    builds every step, the capture runs and the drafter's; the verify's tokens read
    their causal keys, the graph's padding request none; every property holds."""
    m = minimax_m3()
    m.prepare()
    modules = m._modules()
    main = modules.sparse_attention_msa.MiniMaxM3SparseMSAMetadataBuilder
    index = modules.indexer.MiniMaxM3IndexerTritonMetadataBuilder
    common = modules.sparse_attention.MiniMaxM3SparseMetadataBuilder
    calls = collections.Counter()
    for builder in (main, index, common):
        original = builder.build

        def counted(self, *args, _builder=builder, _original=original, **kwargs):
            calls[_builder.__name__] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(builder, "build", counted)
    engine = m.MiniMaxM3RunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    # The MSA builder's build runs the common one's (super().build).
    assert calls[main.__name__] == calls[common.__name__] == calls[index.__name__] > 0
    groups = engine.eager.runner.attn_groups
    assert len(groups) == 1 and [type(g.get_metadata_builder()) for g in groups[0]] == [
        main,
        index,
    ]
    # The main attend decodes on Triton (no CUTLASS plan with a bf16 cache).
    layers = engine.eager.vllm_config.compilation_config.static_forward_context
    assert not layers[m._LAYER].impl.use_cutlass_decode
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "m3.prefill.query_start_loc") == [0, 5]
    assert values(prefill, "m3.index.kv_len") == [1, 2, 3, 4, 5]
    assert values(prefill, "m3.index.prefill.context_lens") == [0]
    (eager,) = own(second, "eager")
    assert values(eager, "m3.decode.kv_len") == [6, 7]
    assert values(eager, "m3.index.decode.query_len") == [2, 2]
    (replay,) = own(second, "replay")
    assert values(replay, "m3.decode.seq_lens") == [7, 0]
    assert values(replay, "m3.decode.kv_len") == [6, 7, 0, 0]
    assert values(replay, "m3.index.decode.kv_blocks") == [1, 1, 0, 0]
    assert values(replay, "kv_len") == [7, 0]


def test_offsets_left_unrebased_read_past_the_prefills_rows():
    """The mutant ``vllm-v1-minimax-m3-sparse-prefill-offsets-unrebased`` on its smallest
    trace: a decode beside a prefill of 2 tokens. The real builder hands the prefill
    attend offsets [0, 2] (its own rows), the mutant [1, 3] (past its 2 rows); the
    indexer's are rebased in both; nothing else fails."""
    m = minimax_m3()
    trace = m.smallest_decodes_and_prefills()
    assert m.trigger_decodes_and_prefills(trace) and m.reach_m3(trace)
    _, good = run_trace(trace, m.run)
    assert ref.violations(good) == []
    (eager,) = own(good, "eager")
    assert values(eager, "m3.prefill.query_start_loc") == [0, 2]
    assert values(eager, "m3.decode.kv_len") == [3]
    assert values(eager, "m3.index.kv_len") == [3, 1, 2]
    _, bad = run_trace(trace, m.offsets_unrebased)
    (eager,) = own(bad, "eager")
    assert values(eager, "m3.prefill.query_start_loc") == [1, 3]
    assert values(eager, "m3.index.prefill.query_start_loc") == [0, 2]
    failing = ref.violations(bad)
    assert {(v.prop, v.field) for v in failing} == {("safe padding", "m3.prefill.query_start_loc")}
