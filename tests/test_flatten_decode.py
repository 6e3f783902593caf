"""Target ``flatten-decode``: the reference by hand, the kernel, the oracle, end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import hand_case, spec_config
from attnfuzz.kernels import flatten_decode as kernels
from attnfuzz.reference import flatten_decode as ref

TARGET = "flatten-decode"


def judge(impl: str, case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def checks_of(mismatches) -> list[str]:
    return [m.check for m in mismatches]


# -- the reference, by hand ---------------------------------------------------------


def test_reference_ragged_decodes_are_right_aligned_on_their_own_length():
    """d = [1, 3, 2] (next_n = 3) with seq_lens [5, 8, 8]: each decode's last token
    sees its whole sequence, [5], [6, 7, 8], [7, 8]."""
    case = hand_case((1, 3, 2), (4, 5, 6), num_spec=2, cudagraph_capture_sizes=(3, 6))
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    assert expected.context_lens.tolist() == [5, 6, 7, 8, 7, 8]
    assert expected.decode_lens.tolist() == [1] * 6
    assert expected.per_req_decode_lens.tolist() == [1, 3, 2]
    assert (expected.context_lens_buffer[6:] == 0).all()
    table = inputs.block_table.numpy()
    # block_size 4: token 0 (5 keys) reads pages 0 and 1 of decode 0's row, nothing more.
    assert expected.pages[0].tolist()[:3] == [True, True, False]
    assert expected.block_table[0, :2].tolist() == table[0, :2].tolist()
    assert expected.block_table[3, :2].tolist() == table[1, :2].tolist()


def test_reference_padded_tokens_see_no_key_and_their_first_page_is_the_pad_page():
    """3 decodes of 2 tokens padded to 8: flattened tokens 6 and 7 belong to no request."""
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case)
    assert (inputs.num_decodes, inputs.num_decode_tokens, inputs.num_real_decode_tokens) == (
        4,
        8,
        6,
    )
    expected = ref.reference(case, inputs)
    assert expected.context_lens.tolist() == [4, 5, 6, 7, 2, 3, 0, 0]
    assert expected.pages[6:].sum() == 2 and expected.pages[6:, 0].all()
    assert expected.block_table[6:, 0].tolist() == [0, 0]
    assert expected.per_req_decode_lens.tolist() == [2, 2, 2, 0]


def test_reference_a_step_without_decodes_touches_nothing():
    case = hand_case((5, 7), (0, 3), use_cudagraph=False)
    inputs = ref.make_inputs(case)
    assert inputs.num_decodes == 0
    expected = ref.reference(case, inputs)
    np.testing.assert_array_equal(expected.context_lens_buffer, expected.before.context_lens)
    for impl in ("triton", "reference"):
        assert judge(impl, case).ok, impl


@pytest.mark.parametrize(
    "max_model_len, block_size, width",
    [(64, 4, 32), (8, 1, 128), (128, 64, 2), (200, 64, 4), (256, 2, 128), (300, 2, 192)],
)
def test_block_table_width_is_the_runners_aligned_to_128_tokens(max_model_len, block_size, width):
    """vLLM 0.33.0 get_block_table_width: pages rounded up to whole 128-token spans."""
    config = spec_config(max_model_len=max_model_len, block_size=block_size)
    assert ref.block_table_width(config) == width


def test_inputs_present_the_table_at_the_runners_width_past_columns_zero():
    case = hand_case((1, 2), (1, 1))
    inputs = ref.make_inputs(case)
    assert inputs.block_table.shape == (2, 32) and inputs.buffers.block_table.shape[1] == 32
    assert (inputs.block_table[:, 16:] == 0).all()
    assert inputs.common.block_table.shape == (2, 32)


# -- the kernel and the oracle -------------------------------------------------------


def test_kernel_refuses_buffers_it_cannot_address():
    case = hand_case((1, 2), (1, 1))
    inputs = ref.make_inputs(case)
    bufs = dataclasses.replace(
        inputs.buffers, context_lens=inputs.buffers.context_lens.to(torch.int64)
    )
    with pytest.raises(ValueError, match="context_lens"):
        kernels.flatten_decode(dataclasses.replace(inputs, buffers=bufs))


def test_oracle_lets_entries_no_consumer_reads_be_anything():
    """Entries past a token's pages, and past the first entry of a padded token's row,
    are free: a kernel that leaves them stale is right."""
    case = hand_case((2, 2, 2), (3, 5, 1))
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    got = kernels.flatten_decode(inputs)
    got.block_table[~torch.as_tensor(expected.pages)] = 12345
    assert target.compare(case, inputs, expected, got) == []
    got.block_table[0, 0] += 1  # a page token 0 reads
    assert checks_of(target.compare(case, inputs, expected, got)) == ["values"]


def test_oracle_catches_a_write_past_the_owned_rows():
    case = hand_case((1, 2), (1, 1))
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    got = kernels.flatten_decode(inputs)
    got.buffers.decode_lens[3] += 1
    assert checks_of(target.compare(case, inputs, expected, got)) == ["unchanged"]


def test_oracle_catches_an_unzeroed_tail_and_a_copy():
    case = hand_case((1, 2), (1, 1))
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    got = kernels.flatten_decode(inputs)
    got.buffers.context_lens[5] = 9
    assert checks_of(target.compare(case, inputs, expected, got)) == ["zeroed"]
    got.buffers.context_lens[5] = 0
    copied = dataclasses.replace(got, context_lens=got.context_lens.clone())
    assert checks_of(target.compare(case, inputs, expected, copied)) == ["view"]


def test_uniform_decodes_trigger_no_ragged_mutant():
    """d = [2, 2] unpadded: right-aligned on L is d[b], row i // L is the decode's own."""
    case = hand_case((2, 2), (3, 5))
    for mutant in ("right-aligned-on-max", "row-by-max"):
        assert not get_target(TARGET).resolve(mutant).trigger(case)
        assert judge(mutant, case).ok
