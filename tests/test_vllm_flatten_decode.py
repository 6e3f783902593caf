"""vLLM's flattened indexer decode metadata (both branches) against the reference."""

from __future__ import annotations

import pytest
import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case

pytestmark = requires_vllm

TARGET = "flatten-decode"


def test_vllm_passes():
    assert_passes(TARGET, "vllm", max_examples=150)


def _run_counting_uniform_kernel(monkeypatch, case):
    """Run vLLM on ``case``; how often the uniform branch's kernel ran."""
    import vllm.v1.attention.backends.mla.indexer as indexer

    calls = []
    kernel = indexer._PREPARE_UNIFORM_DECODE_KERNEL

    def counted(*args, **kwargs):
        calls.append(args)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(indexer, "_PREPARE_UNIFORM_DECODE_KERNEL", counted)
    target = get_target(TARGET)
    verdict = target.judge(target.resolve("vllm"), case, "cpu")
    return verdict, len(calls)


@pytest.mark.parametrize(
    "q_lens, computed, uniform",
    [
        ((3, 3), (4, 9), True),  # d = [3, 3], 6 tokens captured as they are: the Triton kernel
        ((1, 3, 2), (4, 5, 6), False),  # ragged: repeat_interleave
        ((3, 3, 3), (1, 2, 3), False),  # 9 tokens padded to 12, d = [3, 3, 3, 0]
    ],
)
def test_vllm_agrees_on_both_branches(monkeypatch, q_lens, computed, uniform):
    case = hand_case(q_lens, computed, num_spec=2, cudagraph_capture_sizes=(3, 6, 12))
    verdict, calls = _run_counting_uniform_kernel(monkeypatch, case)
    assert verdict.ok, verdict
    assert calls == (1 if uniform else 0)


def test_vllm_zeroes_the_tail_and_keeps_rows_past_the_step():
    """The padded step of next_n = 2 (flattening forced, see the adapter): context
    lengths zero from sum(d) = 6 to the end of the buffer, rows from N_d = 8 on as they were."""
    target = get_target(TARGET)
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = target.make_inputs(case, "cpu")
    got = target.implementations["vllm"].fn(inputs)
    assert got.context_lens[:, 0].tolist() == [4, 5, 6, 7, 2, 3, 0, 0]
    assert (got.buffers.context_lens[6:] == 0).all()
    assert torch.equal(got.buffers.block_table[8:], inputs.buffers.block_table[8:])
    assert torch.equal(got.buffers.decode_lens[8:], inputs.buffers.decode_lens[8:])
    assert got.requires_padding is False


def test_vllm_block_table_has_the_runners_aligned_width():
    """Fidelity: the runner hands the builder a table 128-token aligned, and
    ``block_table_width`` to match (vllm/v1/worker/utils.py AttentionGroup,
    get_block_table_width); vLLM's expanded table has that width, 32 here, where
    ``max_blocks_per_seq`` is 16. An oracle of width 16 rejected vLLM's correct output."""
    target = get_target(TARGET)
    case = hand_case((1, 2), (1, 1))
    assert case.config.max_blocks_per_seq == 16
    inputs = target.make_inputs(case, "cpu")
    got = target.implementations["vllm"].fn(inputs)
    assert tuple(got.block_table.shape) == (3, 32)
    assert tuple(got.buffers.block_table.shape) == (case.config.max_num_batched_tokens, 32)
    assert target.compare(case, inputs, target.reference(case, inputs), got) == []


def test_upstream_pr50302_raises_the_historical_error_on_ragged_decodes():
    """d = [1, 2]: the variable branch assigns [3, 32] rows into a [3, 16] slice."""
    target = get_target(TARGET)
    verdict = target.judge(target.resolve(UPSTREAM), hand_case((1, 2), (1, 1)))
    assert verdict.key == "exception:RuntimeError"
    assert "must match the existing size (32)" in verdict.mismatches[0].got


UPSTREAM = "upstream-pr50302-unaligned-width"


def test_upstream_mutant_is_detected():
    assert_detected(TARGET, UPSTREAM)


@pytest.mark.parametrize("mutant", ["right-aligned-on-max", "row-by-max", "padding-not-zeroed"])
def test_vllm_passes_each_mutants_smallest_case(mutant):
    target = get_target(TARGET)
    case = target.resolve(mutant).smallest()
    assert target.judge(target.resolve("vllm"), case).ok
