"""SGLang's decode graph runner step on the FlashAttention 3 backend (runner-step's
``sglang-fa3``), its stand-in for FlashAttention 3's scheduler call, and its mutants."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from attnfuzz.adapters.sglang import fa3_backend
from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

# -- the stand-in for sgl_kernel.flash_attn: FlashAttention 3's contract ------------------------


def _schedule(batch_size: int = 3, **overrides) -> torch.Tensor:
    args = dict(
        batch_size=batch_size,
        max_seqlen_q=1,
        max_seqlen_k=9,
        num_heads=2,
        num_heads_k=1,
        headdim=64,
        cache_seqlens=torch.tensor([5, 9, 1], dtype=torch.int32),
        qkv_dtype=torch.bfloat16,
        cu_seqlens_q=torch.arange(batch_size + 1, dtype=torch.int32),
        page_size=4,
        causal=True,
        has_softcap=False,
        num_splits=0,
    )
    args.update(overrides)
    return fa3_backend.get_scheduler_metadata(**args)


def test_the_scheduler_metadata_is_a_semaphore_then_one_split_count_per_request():
    out = _schedule()
    assert out.dtype == torch.int32
    assert out.tolist() == [0, 1, 1, 1]  # sm90: the semaphore, then each request's splits


def test_past_992_requests_the_scheduler_keeps_only_its_semaphore():
    n = fa3_backend.DYNAMIC_SPLIT_BATCH + 1
    lens = torch.ones(n, dtype=torch.int32)
    out = _schedule(n, cache_seqlens=lens, cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32))
    assert out.tolist() == [0]


@pytest.mark.parametrize(
    "overrides, why",
    [
        (dict(qkv_dtype=torch.float32), "fp16, bf16, and fp8_e4m3"),
        (dict(num_heads=3, num_heads_k=2), "must divide"),
        (dict(cache_seqlens=torch.tensor([5, 9, 1], dtype=torch.int64)), "cache_seqlens"),
        (dict(cache_seqlens=torch.tensor([5, 9], dtype=torch.int32)), "cache_seqlens"),
        (dict(cu_seqlens_q=torch.arange(3, dtype=torch.int32)), "cu_seqlens_q"),
        (dict(cu_seqlens_q=torch.arange(4, dtype=torch.int64)), "cu_seqlens_q"),
    ],
)
def test_the_scheduler_refuses_what_flash_attention_3_refuses(overrides, why):
    with pytest.raises(fa3_backend.VendorContractError, match=why):
        _schedule(**overrides)


def test_a_refusal_of_the_scheduler_is_the_engine_s_finding_not_attnfuzz_s_error():
    """The stand-in refuses what FlashAttention 3 refuses: the engine misused the
    vendor's contract, a finding, though attnfuzz's frame raised it (harness/blame.py)."""
    from attnfuzz.harness.blame import attnfuzz_fault

    with pytest.raises(fa3_backend.VendorContractError) as refused:
        _schedule(qkv_dtype=torch.float32)
    assert attnfuzz_fault(refused.value, refused.tb) is None


def test_the_stand_in_module_is_there_only_while_the_backend_is_built():
    before = sys.modules.get(fa3_backend.MODULE)
    with fa3_backend.flash_attn_module():
        module = sys.modules[fa3_backend.MODULE]
        if module.get_scheduler_metadata is fa3_backend.get_scheduler_metadata:  # stood in
            with pytest.raises(RuntimeError, match="stand-in"):
                module.flash_attn_with_kvcache(None, None, None)
            with pytest.raises(RuntimeError, match="stand-in"):
                module.flash_attn_varlen_func(None, None, None)
    assert sys.modules.get(fa3_backend.MODULE) is before


# -- the engine's step -----------------------------------------------------------------------


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_fa3.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_fa3

    run = getattr(runner_step_fa3, name)
    return life(run, trace)


@_sglang
def test_a_decode_of_three_requests_replays_the_graph_of_four():
    from attnfuzz.adapters.sglang.runner_step_fa3 import ENGINE, graph_batch_sizes

    trace = _arrive_then_decode(num_spec=0)
    first, second = _life(trace)
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    # Page size 4: a page-table row holds pages; 64 tokens of context are 16 pages.
    assert _values(second, "eager", "page_table") == [[1, 2], [3, 0], [5, 0]]
    for how in ("padded", "replay"):
        # The padding request: the fill length 1 (get_cuda_graph_seq_len_fill_value),
        # the reserved row 0 of the request-to-token table, its page 0.
        assert _values(second, how, "cache_seqlens_int32") == [6, 4, 2, 1], how
        table = _values(second, how, "page_table")
        assert [row[:2] for row in table] == [[1, 2], [3, 0], [5, 0], [0, 0]], how
        assert len(table[0]) == 16, how
        assert _values(second, how, "cu_seqlens_q") == [0, 1, 2, 3, 4], how
        assert _values(second, how, "cu_seqlens_k") == [0, 6, 10, 12, 13], how
    assert ref.violations(first) == [] and ref.violations(second) == []
    # The normal decode's scheduler metadata, replayed into its graph buffer: the
    # semaphore and one split count for each of the graph's four requests.
    metadata = ENGINE.engine.backend.forward_metadata
    assert metadata.scheduler_metadata.tolist() == [0, 1, 1, 1, 1]
    assert graph_batch_sizes(trace.config) == list(ENGINE.engine.graph_runner.capture_bs)


@_sglang
def test_a_verify_reads_its_drafts_in_the_graph_as_eagerly():
    _, verify = _life(_arrive_then_decode(num_spec=1))
    # cache_seqlens: the committed prefix and the next_n tokens of the verify; the
    # padding request's the fill 1 and its window.
    assert _values(verify, "eager", "cache_seqlens_int32") == [7, 5, 3]
    assert _values(verify, "replay", "cache_seqlens_int32") == [7, 5, 3, 3]
    assert _values(verify, "replay", "cu_seqlens_q") == [0, 2, 4, 6, 8]
    assert ref.violations(verify) == []


@_sglang
@pytest.mark.parametrize(
    "smallest, mutant, props",
    [
        (
            "smallest_window_forgotten",
            "run_window_forgotten",
            {("padding invariance", "padded"), ("replay equals eager", "replay")},
        ),
        (
            "smallest_table_short_of_window",
            "run_table_short_of_window",
            {("safe padding", "padded"), ("safe padding", "replay")},
        ),
    ],
)
def test_each_mutant_fails_its_property_on_its_smallest_trace(smallest, mutant, props):
    """The correct engine holds every property on the trace; each mutant breaks its own
    on ``cache_seqlens_int32``."""
    from attnfuzz.adapters.sglang import runner_step_fa3

    trace = getattr(runner_step_fa3, smallest)()
    assert all(ref.violations(out) == [] for out in _life(trace))
    *_, out = _life(trace, mutant)
    found = ref.violations(out)
    assert {(v.prop, v.build) for v in found} >= props
    assert "cache_seqlens_int32" in {v.field for v in found}


@_sglang
def test_where_the_mutants_reach():
    """The verify-window mutant lives in a replayed verify; the short table in any graph
    build whose KV passes it: a replayed request's, or a captured verify's."""
    from attnfuzz.adapters.sglang import runner_step_fa3 as fa3

    window, short = fa3.smallest_window_forgotten(), fa3.smallest_table_short_of_window()
    assert fa3.reach_verify_replay(window) and not fa3.reach_verify_replay(short)
    assert fa3.trigger_table_short_of_window(short)
    assert not fa3.trigger_table_short_of_window(window)  # a KV of 3 in a table of 6
    eager_only = Trace(dataclasses.replace(window.config, cudagraph_mode="NONE"), window.steps)
    assert fa3.replayed(eager_only) == [] and not fa3.reach_graph(eager_only)
    # The search's witness: one step, no replay; the capture of the graph of one
    # verifies a KV of 1 + 4 tokens, past a table of 8 - 4.
    config = dataclasses.replace(window.config, num_spec=3, cudagraph_capture_sizes=(4,))
    arrival = Trace(config, window.steps[:1])
    assert fa3.replayed(arrival) == [] and fa3.trigger_table_short_of_window(arrival)
    *_, out = _life(arrival, "run_table_short_of_window")
    assert {(v.prop, v.build) for v in ref.violations(out)} == {("safe padding", "capture")}
    assert all(ref.violations(out) == [] for out in _life(arrival))


# The derandomized searches (each mutant found, the engine passing) are test_entries.py's,
# over every implementation of runner-step: not repeated here.
