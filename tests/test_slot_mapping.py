"""Target ``slot-mapping``: the reference by hand, the kernel, the oracle, end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.engine import fuzz_settings
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import hand_case
from attnfuzz.kernels import slot_mapping as kernels
from attnfuzz.reference import slot_mapping as ref
from attnfuzz.reference.batch import build_common_metadata
from hypothesis import given

TARGET = "slot-mapping"


def judge(impl: str, case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def checks(verdict) -> list[str]:
    return [m.check for m in verdict.mismatches]


# -- the reference, by hand ---------------------------------------------------------


def test_reference_by_hand_one_request_across_a_page_boundary():
    """block_size 4, 3 tokens at positions 3, 4, 5: page 0 offset 3, page 1 offsets 0, 1."""
    case = hand_case((3,), (3,), use_cudagraph=False)
    inputs = ref.make_inputs(case)
    row = inputs.block_table[int(inputs.req_state_rows[0])]
    p0, p1 = int(row[0]), int(row[1])
    expected = ref.reference(case, inputs)
    assert expected.slot_mapping.tolist() == [4 * p0 + 3, 4 * p1 + 0, 4 * p1 + 1]
    assert expected.slot_mapping.dtype == np.int64
    assert (expected.buffer[3:] == ref.PAD_SLOT_ID).all()
    assert expected.buffer.shape == (case.config.max_num_batched_tokens,)


def test_reference_padded_graph_maps_padded_tokens_and_the_rest_of_the_buffer_to_minus_one():
    """3 decodes of 2 tokens padded to 8: slots 6 and 7 and every later slot are -1."""
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case)
    assert (inputs.num_tokens, inputs.num_tokens_padded) == (6, 8)
    expected = ref.reference(case, inputs)
    assert expected.slot_mapping[6:].tolist() == [-1, -1]
    assert (expected.buffer[6:] == -1).all()
    assert (inputs.slot_mapping_buffer.numpy() >= 0).all()  # stale slots are valid-looking ids


def test_reference_reads_each_request_through_its_state_row():
    """The persistent table's row of request r is req_state_rows[r], not r."""
    case = hand_case((1, 1, 1), (0, 0, 0), use_cudagraph=False, seed=3)
    inputs = ref.make_inputs(case)
    rows = inputs.req_state_rows.tolist()
    assert rows != [0, 1, 2] and len(set(rows)) == 3
    expected = ref.reference(case, inputs)
    pages = [int(inputs.block_table[row, 0]) for row in rows]
    assert expected.slot_mapping.tolist() == [4 * p for p in pages]


@fuzz_settings(max_examples=300, database=None)
@given(get_target(TARGET).cases())
def test_reference_agrees_with_the_common_metadata(case):
    """The loops here and ``build_common_metadata``'s slot_mapping are one formula."""
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    meta = build_common_metadata(case.config, case.batch)
    # The runner's slot mapping: the metadata's real (and padded) tokens, then -1.
    assert len(expected.slot_mapping) == meta.slot_mapping_tokens
    np.testing.assert_array_equal(
        expected.slot_mapping[: len(meta.slot_mapping)], meta.slot_mapping
    )
    assert (expected.slot_mapping[len(meta.slot_mapping) :] == -1).all()


# -- the kernel and the oracle -------------------------------------------------------


def test_every_implementation_agrees_on_a_mixed_step_without_graph():
    case = hand_case((2, 1, 7), (5, 0, 9), use_cudagraph=False)
    for impl in ("triton", "reference"):
        assert judge(impl, case).ok, impl


def test_kernel_refuses_buffers_it_cannot_address():
    case = hand_case((1,), (0,))
    inputs = ref.make_inputs(case)
    bad = dataclasses.replace(
        inputs, slot_mapping_buffer=inputs.slot_mapping_buffer.to(torch.int32)
    )
    with pytest.raises(ValueError, match="int64"):
        kernels.slot_mapping(bad)


def test_oracle_catches_a_copy_instead_of_the_view():
    case = hand_case((2, 2, 2), (3, 5, 1))
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    got = kernels.slot_mapping(inputs)
    copied = ref.SlotMappingOutputs(got.slot_mapping.clone(), got.buffer)
    assert checks_of(target.compare(case, inputs, expected, copied)) == ["view"]


def test_oracle_catches_stale_slots_past_the_view():
    case = hand_case((1,), (0,), use_cudagraph=False)  # an eager step: the view is T slots
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    got = kernels.write_slot_mapping(inputs, pad_from=inputs.num_tokens + 3)
    assert checks_of(target.compare(case, inputs, expected, got)) == ["padding"]


def checks_of(mismatches) -> list[str]:
    return [m.check for m in mismatches]


def test_stale_padding_fails_on_values_of_the_padded_tokens():
    case = get_target(TARGET).resolve("stale-padding").smallest()
    verdict = judge("stale-padding", case)
    assert checks(verdict) == ["values"]
    assert "slot_mapping[6]" in verdict.mismatches[0].where
