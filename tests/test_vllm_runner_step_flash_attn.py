"""vLLM 0.33.0's model runner V1 step on the FlashAttention backend as on an sm90 GPU
(FA3), as the implementation ``vllm-v1-flash-attn`` of ``runner-step``:
``FlashAttentionMetadataBuilder`` builds every step, its ahead-of-time scheduler
metadata in the graph buffer, judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def fa():
    from attnfuzz.adapters.vllm import runner_step_flash_attn

    return runner_step_flash_attn


def smallest_full_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_mla

    return runner_step_mla.smallest_full_decode()


def smallest_full_spec_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_the_flash_attn_builder_builds_a_decode_padded_for_a_full_graph(monkeypatch):
    """The runner's own ``_build_attention_metadata`` calls ``FlashAttentionMetadataBuilder``
    on every step and in the capture runs, FA3's scheduler metadata with it: a prefill,
    then a one-token decode padded to the FULL graph of 2 requests (the padding row a
    request of no key), its schedule in the graph buffer, replayed with the config's
    split cap; built afresh; the correct engine holds every property."""
    m = fa()
    m.prepare()
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(
        FlashAttentionMetadataBuilder,
        "build",
        "build_for_cudagraph_capture",
        "_get_scheduler_metadata",
    )
    engine = m.FlashAttnRunnerStepEngine()
    first, second = run_trace(smallest_full_decode(), engine)
    assert min(calls.values()) > 0 and len(calls) == 3
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert isinstance(builder, FlashAttentionMetadataBuilder)
    assert builder.aot_schedule and builder.use_full_cuda_graph
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "fa.query_start_loc") == [0, 3]
    assert values(prefill, "fa.seq_lens") == [3]
    # Eager: the vendor's schedule as it returns it (no graph buffer, no split cap).
    assert prefill.field("fa.scheduler_metadata.tail") is None
    assert prefill.field("fa.full_graph.max_num_splits") is None
    (eager,) = own(second, "eager")
    (padded,) = own(second, "padded")
    (replay,) = own(second, "replay")
    (fresh,) = own(second, "fresh")
    assert values(eager, "fa.seq_lens") == values(fresh, "fa.seq_lens") == [4]
    assert values(padded, "fa.seq_lens") == values(replay, "fa.seq_lens") == [4, 0]
    assert values(padded, "fa.query_start_loc") == values(replay, "fa.query_start_loc") == [0, 1, 1]
    assert [row[0] for row in values(padded, "fa.block_table")] == [1, 0]
    # 2 requests, causal (head size 128, paged): 1 + round_up(2, 4) * 4 entries.
    assert len(values(replay, "fa.scheduler_metadata")) == 17
    cap = builder.attention_config.flash_attn_max_num_splits_for_cuda_graph
    assert values(replay, "fa.full_graph.max_num_splits") == [cap, cap]
    captured = [b for b in first.builds if b.how == "capture"]
    assert any(b.field("fa.scheduler_metadata.tail") is not None for b in captured)


def test_a_mixed_step_replays_a_full_graph():
    """FA3's ``AttentionCGSupport.ALWAYS``: in cudagraph mode FULL a decode beside a
    12-token chunk of a prompt is padded to the FULL graph of 16 tokens and replayed,
    its schedule that of the padded batch."""
    m = fa()
    config = dataclasses.replace(
        smallest_full_spec_decode().config, cudagraph_mode="FULL", cudagraph_capture_sizes=(16,)
    )
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3, 5), (2, 12), req_ids=(0, 1), pages=((1,), (2, 3)), new_pages=(0, 1)),
    )
    _, out = run_trace(Trace(config, steps), m.run)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    (replay,) = own(out, "replay")
    assert values(eager, "fa.query_start_loc") == [0, 2, 14]
    assert values(eager, "fa.seq_lens") == [5, 17]
    assert values(replay, "fa.seq_lens")[:2] == [5, 17]
    assert replay.field("fa.full_graph.max_num_splits") is not None
    # The graph's query bound is its capture's (16 tokens), over the 12-token chunk.
    assert values(eager, "fa.max_query_len") == [12, 12]
    assert values(replay, "fa.full_graph.max_query_len") == [16] * 4
    assert not replay.field("fa.scheduler_metadata.tail").values.any()


def test_a_speculative_decode_in_a_full_graph_and_its_drafts():
    """With one draft a 2-token decode is padded to the FULL graph of 4 tokens (2
    requests); the drafter's sub-steps are built by the same builder
    (``build_for_drafting``: a fast build, no ahead-of-time schedule)."""
    m = fa()
    _, out = run_trace(smallest_full_spec_decode(), m.run)
    assert ref.violations(out) == []
    (padded,) = own(out, "padded")
    (replay,) = own(out, "replay")
    assert values(padded, "fa.seq_lens") == values(replay, "fa.seq_lens") == [7, 0]
    drafts = [b for b in out.of("eager") if b.draft is not None]
    assert drafts and all(b.field("fa.seq_lens") is not None for b in drafts)
    assert all(b.field("fa.scheduler_metadata") is None for b in drafts)


def test_the_mutant_fails_safe_padding_on_its_smallest_trace():
    """The correct engine zeroes the graph buffer past each schedule; the mutant's
    capture of the graph of 2 requests keeps the graph of 8's schedule past its own."""
    m = fa()
    trace = m.smallest_tail
    assert m.trigger_tail(trace())
    assert all(
        ref.violations(out) == [] for out in run_trace(trace(), m.FlashAttnRunnerStepEngine())
    )
    *_, out = run_trace(trace(), m.scheduler_tail_kept)
    found = ref.violations(out)
    assert found and {(v.prop, v.field) for v in found} == {
        ("safe padding", "fa.scheduler_metadata.tail")
    }
    assert "capture" in {v.build for v in found}


@pytest.mark.parametrize(("block_size", "declined"), [(8, True), (24, True), (32, False)])
def test_declines_page_sizes_the_flash_attn_backend_has_no_kernel_for(block_size, declined):
    """``FlashAttentionBackend.get_supported_kernel_block_sizes``: multiples of 16."""
    m = fa()
    smallest = smallest_full_decode()
    config = dataclasses.replace(smallest.config, block_size=block_size)
    case = next(iter(Trace(config, smallest.steps).cases()))
    reason = m.declines(case)
    assert (reason is not None) == declined
    assert reason is None or "FlashAttentionBackend.get_supported_kernel_block_sizes" in reason


def test_the_scheduler_metadata_stand_in_keeps_the_vendors_contract():
    """``mha_fwd_get_scheduler_metadata`` on sm90: 1 + round_up(batch, 4) * vectors int32
    entries (3 vectors for a single-row query of head size 64, 4 when causal), and its
    checks refused."""
    from attnfuzz.adapters.sglang.fa3_backend import VendorContractError

    m = fa()
    lens = torch.tensor([3, 4, 5], dtype=torch.int32)
    cu = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    args = dict(batch_size=3, max_seqlen_k=5, num_heads_q=4, num_heads_kv=1,
                cache_seqlens=lens, cu_seqlens_q=cu, page_size=16, causal=True)  # fmt: skip
    assert m.get_scheduler_metadata(max_seqlen_q=1, headdim=128, **args).shape == (17,)
    assert m.get_scheduler_metadata(max_seqlen_q=1, headdim=64, **args).shape == (13,)
    assert m.get_scheduler_metadata(max_seqlen_q=2, headdim=64, **args).shape == (17,)
    with pytest.raises(VendorContractError):
        m.get_scheduler_metadata(max_seqlen_q=1, headdim=128, qkv_dtype=torch.float32, **args)
    with pytest.raises(VendorContractError):
        m.get_scheduler_metadata(max_seqlen_q=1, headdim=128, **{**args, "cache_seqlens": lens[:2]})
