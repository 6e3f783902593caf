"""``flex-block-mask`` by vLLM 0.33.0's own FlexAttentionMetadataBuilder (``--impl vllm``)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.adapters.vllm import flex_block_mask as adapter
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets.flex_block_mask import (
    reach_upstream_capacity,
    trigger_capacity,
    trigger_upstream_capacity,
)
from attnfuzz.harness.testing import assert_detected, assert_passes
from attnfuzz.reference import flex_block_mask as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig, build_common_metadata
from attnfuzz.reference.invariants import violations

pytestmark = requires_vllm

TARGET = "flex-block-mask"
UPSTREAM = "upstream-pr39353-capacity"


def case_of(q_lens, computed, q_block_log2: int, seed: int = 5, **config) -> Case:
    """A case on a small engine (no speculative decoding unless asked)."""
    base = dict(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=32, block_size=2)
    base.update(config)
    case = Case(
        EngineConfig(**base), Batch(tuple(computed), tuple(q_lens), seed=seed),
        ((ref.Q_BLOCK_PARAM, q_block_log2),),
    )  # fmt: skip
    assert violations(case.config, case.batch) == []
    return case


MIXED = case_of((1, 3, 9), (2, 0, 5), 1)  # query blocks of 2 rows span requests
# next_n = 2: three decodes, 6 tokens padded to a graph of 8 (a padding request)
PADDED = case_of((2, 2, 2), (3, 5, 1), 1, num_spec=1, cudagraph_capture_sizes=(2, 4, 8))


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def test_vllm_passes_the_fuzzer():
    assert_passes(TARGET, "vllm", max_examples=150)


def test_upstream_mutant_is_detected_with_a_minimized_trigger():
    result = assert_detected(TARGET, UPSTREAM)  # asserts the trigger of the minimized case
    assert result.verdict.key == "exception:RuntimeError"


def test_smallest_case_fails_only_the_upstream_mutant():
    """One token, max_model_len 8 in one page, q_block_size 16: the mask [1, 16] does
    not fit the pre-fix table [8, 1]; vLLM's copy_to_persistent slice refuses it."""
    case = get_target(TARGET).implementations[UPSTREAM].smallest()
    assert trigger_upstream_capacity(case) and reach_upstream_capacity(case)
    assert judge("vllm", case).ok
    verdict = judge(UPSTREAM, case)
    assert verdict.key == "exception:RuntimeError"
    assert "shape [1, 1] doesn't match the broadcast shape [1, 16]" in verdict.mismatches[0].got


def test_vllm_s_tables_are_views_of_the_case_s_persistent_memory():
    inputs = ref.make_inputs(MIXED)
    out = adapter.run(inputs)
    assert out.kv_indices.data_ptr() == inputs.persistent_kv_indices.data_ptr()
    assert out.kv_num_blocks.data_ptr() == inputs.persistent_kv_num_blocks.data_ptr()
    # The strided slice [:rows, :cols] of the [cdiv(32, 2), 2 * cdiv(16, 2)] table.
    rows, cols = ref.mask_shape(inputs.num_tokens, inputs.max_seq_len, 2, 2)
    assert tuple(out.kv_indices.shape) == (rows, cols)
    assert out.kv_indices.stride() == (16, 1) and cols < 16


def test_fidelity_strided_slice_old_oracle_refused_it():
    """The old oracle asked for a contiguous table; vLLM's strided slice is read by
    its strides, and passes now. The re-created mutant is still caught."""
    out = adapter.run(ref.make_inputs(MIXED))
    assert not out.kv_indices.is_contiguous()
    assert judge("vllm", MIXED).ok
    assert judge("pr39353-capacity", get_target(TARGET).implementations[
        "pr39353-capacity"].smallest()).key == "exception:RuntimeError"  # fmt: skip


def test_fidelity_rows_count_the_real_tokens():
    """Padded step: vLLM's mask has cdiv(6, 2) = 3 rows, the old oracle wanted
    cdiv(8, 2) = 4 (a row for the padding request's block); both pass now."""
    inputs = ref.make_inputs(PADDED)
    expected = ref.reference(PADDED, inputs)
    out = adapter.run(inputs)
    assert expected.kv_indices.shape[0] == 4 and expected.num_real_rows == 3
    assert out.kv_indices.shape[0] == out.kv_num_blocks.shape[0] == 3
    assert judge("vllm", PADDED).ok and judge("triton", PADDED).ok


def test_fidelity_page_0_is_the_null_block():
    """Unreserved, request 2 of MIXED owns page 0 and vLLM's builder drops it from
    every query block (unique_static_unsorted(ignored_val=0)): its attention would
    lose a page. The oracle says so; the target's inputs reserve the null page."""
    inputs = ref.make_inputs(MIXED)
    raw = build_common_metadata(MIXED.config, MIXED.batch)
    assert raw.block_table[2, 2] == 0  # page 0 owned by request 2 (seq_len 14, 7 pages)
    unreserved = dataclasses.replace(
        inputs,
        block_table=torch.as_tensor(raw.block_table),
        num_pages=raw.num_blocks,
        common=raw,
    )
    expected = ref.reference(MIXED, unreserved)
    got = adapter.run(unreserved)
    mismatches = get_target(TARGET).compare(MIXED, unreserved, expected, got)
    assert [m.check for m in mismatches][:1] == ["mask.missing"], mismatches
    assert "missing [0]" in mismatches[0].got
    assert judge("vllm", MIXED).ok  # reserved: no real request owns page 0


@pytest.mark.parametrize("q_block_log2", [0, 2, 4])
def test_vllm_and_triton_agree_on_a_step_past_max_model_len(q_block_log2):
    """16 tokens in an engine of max_model_len 8: the pre-fix tables overflow."""
    case = case_of(
        (1, 7, 8), (3, 0, 0), q_block_log2, max_model_len=8, max_num_batched_tokens=16,
        block_size=1,
    )  # fmt: skip
    assert trigger_capacity(case) and trigger_upstream_capacity(case)
    assert judge("vllm", case).ok and judge("triton", case).ok
    assert judge(UPSTREAM, case).key == "exception:RuntimeError"
