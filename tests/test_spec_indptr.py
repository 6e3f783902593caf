"""Target ``spec-indptr``: the reference by hand, the kernel, the mutant's trigger."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import spec_indptr as t
from attnfuzz.harness.testing import spec_config
from attnfuzz.kernels import spec_indptr as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import spec_indptr as ref
from attnfuzz.reference.batch import Batch, Case

TARGET = "spec-indptr"
MUTANT = "pr27545-draft-extend-stride"


def case(
    phase: int, topk: int, steps: int, draft_tokens: int, computed=(3, 0, 6), graph=True
) -> Case:
    """Three requests of one new token each (committed lengths ``computed + 1``);
    graphs of 1, 2 and 4 requests (next_n 1: capture sizes are request counts)."""
    config = spec_config(num_spec=0, cudagraph_capture_sizes=(1, 2, 4))
    params = {
        "spec_phase": phase,
        "spec_topk": topk,
        "spec_steps": steps,
        "spec_draft_tokens": draft_tokens,
    }
    batch = Batch(tuple(computed), (1,) * len(computed), seed=3, use_cudagraph=graph)
    return Case(config, batch, tuple(sorted(params.items())))


def hand_inputs(phase: str, graph_bs: int | None) -> ref.SpecIndptrInputs:
    """Two requests on rows 2 and 1 of a 5-row pool (it holds the graph of 4),
    committed lengths 2 and 1, N = 2."""
    table = torch.tensor(
        [[0, 0, 0, 0, 0], [7, 8, 9, 40, 41], [3, 4, 5, 6, 42], [43] * 5, [44] * 5],
        dtype=torch.int32,
        device=device(),
    )
    return ref.SpecIndptrInputs(
        phase=phase,
        spec=ref.SpecConfig(topk=2, num_steps=1, num_draft_tokens=2),
        req_to_token=table,
        req_pool_indices=torch.tensor([2, 1], device=device()),
        seq_lens=torch.tensor([2, 1], device=device()),
        graph_bs=graph_bs,
        capture_bs=(1, 4),
        config=spec_config(),
    )


def test_target_verify_eager_by_hand():
    e = ref.reference(None, hand_inputs(ref.TARGET_VERIFY, None))
    assert e.qo_indptr.tolist() == [0, 2, 4]
    assert e.kv_indptr.tolist() == [0, 2, 3]
    assert e.kv_indices.tolist() == [3, 4, 7]
    assert e.mask_indptr.tolist() == [0, 2 * (2 + 2), 8 + 2 * (1 + 2)]
    assert e.max_extend_len == 2


def test_target_verify_replayed_pads_with_the_fill_length_on_row_zero():
    """Two requests in the graph of 4: two padding requests read one cached token each,
    row 0's slot 0, and their tree-mask blocks are 2 * (1 + 2)."""
    e = ref.reference(None, hand_inputs(ref.TARGET_VERIFY, 4))
    assert e.qo_indptr.tolist() == [0, 2, 4, 6, 8]
    assert e.kv_indptr.tolist() == [0, 2, 3, 4, 5]
    assert e.kv_indices.tolist() == [3, 4, 7, 0, 0]
    assert e.mask_indptr.tolist() == [0, 8, 14, 20, 26]


def test_draft_extend_replayed_padding_requests_read_no_prefix():
    e = ref.reference(None, hand_inputs(ref.DRAFT_EXTEND, 4))
    assert e.qo_indptr.tolist() == [0, 2, 4, 6, 8]
    assert e.kv_indptr.tolist() == [0, 2, 3, 3, 3]
    assert e.kv_indices.tolist() == [3, 4, 7]
    assert e.mask_indptr is None


@pytest.mark.parametrize("phase", [ref.TARGET_VERIFY, ref.DRAFT_EXTEND])
@pytest.mark.parametrize("graph_bs", [None, 4])
def test_kernel_matches_the_hand_reference(phase, graph_bs):
    inputs = hand_inputs(phase, graph_bs)
    got = kernels.spec_indptr(inputs)
    target = get_target(TARGET)
    assert target.compare(None, inputs, ref.reference(None, inputs), got) == []


def test_mutant_strides_a_replayed_draft_extend_by_num_steps_plus_one():
    got = kernels.mutant_draft_extend_stride(hand_inputs(ref.DRAFT_EXTEND, 4))
    assert got.qo_indptr.tolist() == [0, 2, 4, 6, 8]  # num_steps + 1 = 2 = N here
    inputs = dataclasses.replace(hand_inputs(ref.DRAFT_EXTEND, 4), spec=ref.SpecConfig(2, 1, 3))
    got = kernels.mutant_draft_extend_stride(inputs)
    assert got.qo_indptr.tolist() == [0, 2, 4, 6, 8]
    assert ref.reference(None, inputs).qo_indptr.tolist() == [0, 3, 6, 9, 12]


def test_spec_config_is_a_chain_at_topk_one_and_bounded_by_the_tree():
    assert ref.spec_config_of(case(0, 1, 3, 8)) == ref.SpecConfig(1, 3, 4)
    assert ref.spec_config_of(case(0, 2, 1, 8)) == ref.SpecConfig(2, 1, 3)  # root + 2
    assert ref.spec_config_of(case(0, 2, 2, 8)) == ref.SpecConfig(2, 2, 7)  # root + 2 + 4
    assert ref.spec_config_of(case(0, 3, 2, 5)) == ref.SpecConfig(3, 2, 5)


def test_graph_size_is_the_smallest_capture_that_holds_the_step():
    assert ref.graph_bs(case(0, 1, 1, 2)) == 4  # three requests in the graph of 4
    assert ref.graph_bs(case(0, 1, 1, 2, computed=(0, 0))) == 2
    assert ref.graph_bs(case(0, 1, 1, 2, graph=False)) is None
    five = case(0, 1, 1, 2, computed=(0,) * 5)
    assert ref.graph_bs(five) is None  # past the largest capture: eager
    # No graph of more requests than the pool holds.
    small_pool = spec_config(num_spec=0, max_num_seqs=2, cudagraph_capture_sizes=(1, 4))
    assert ref.capture_bs(small_pool) == (1,)


@pytest.mark.parametrize(
    ("c", "triggers"),
    [
        (case(1, 2, 1, 3), True),
        (case(1, 2, 2, 3), False),  # N = num_steps + 1 even at topk 2
        (case(1, 1, 3, 8), False),  # a chain
        (case(0, 2, 1, 3), False),  # target verify
        (case(1, 2, 1, 3, graph=False), False),  # eager
    ],
)
def test_trigger_is_exactly_where_the_mutant_differs(c, triggers):
    target = get_target(TARGET)
    assert t.trigger_draft_extend_stride(c) is triggers
    assert target.judge(target.resolve(MUTANT), c).ok is not triggers


def test_compare_reads_kv_indices_up_to_kv_indptr_only():
    """A replayed graph hands its whole buffer: the tail past kv_indptr[-1] is unread."""
    target = get_target(TARGET)
    inputs = hand_inputs(ref.TARGET_VERIFY, 4)
    expected = ref.reference(None, inputs)
    got = kernels.spec_indptr(inputs)
    got.kv_indices[len(expected.kv_indices) :] = -5
    assert target.compare(None, inputs, expected, got) == []
    got.kv_indices[len(expected.kv_indices) - 1] = -5
    assert [m.check for m in target.compare(None, inputs, expected, got)] == ["values"]


def test_compare_names_max_extend_len():
    target = get_target(TARGET)
    inputs = hand_inputs(ref.DRAFT_EXTEND, None)
    got = dataclasses.replace(kernels.spec_indptr(inputs), max_extend_len=3)
    (m,) = target.compare(None, inputs, ref.reference(None, inputs), got)
    assert m.check == t.OwnCheck.MAX_EXTEND_LEN


def test_table_rows_hold_distinct_slots_and_row_zero_is_reserved():
    inputs = ref.make_inputs(case(0, 2, 1, 3))
    table = inputs.req_to_token.numpy()
    assert not table[ref.PAD_ROW].any()
    owned = [
        table[int(row), : int(s) + 3]
        for row, s in zip(inputs.req_pool_indices, inputs.seq_lens, strict=True)
    ]
    slots = np.concatenate(owned)
    assert len(set(slots.tolist())) == len(slots) and 0 not in slots
