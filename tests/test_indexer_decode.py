"""Target ``indexer-decode``: reference by hand, kernels, mutants, end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case
from attnfuzz.kernels import indexer_decode as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.kernels.indexer_ops import top_k_per_row
from attnfuzz.reference import indexer_decode as ref
from attnfuzz.reference.batch import Case
from attnfuzz.reference.invariants import violations

TARGET = "indexer-decode"
MUTANTS = ["pr39542-writeback", "pr39542-lengths", "pr39542-overlap"]
DEV = device()  # where the kernels run: the CPU under the interpreter


def hand_inputs(k: int) -> ref.IndexerDecodeInputs:
    """One decode of d = 2 tokens at seq_len 3; pages of 2 slots, H = 1, D = 1.

    Block table [1, 0]: keys 0, 1 live in page 1 (values 1, -2), key 2 in
    page 0 (value 5). Token 0 sees 2 keys, token 1 all 3. Tensors on ``DEV``.
    """
    i32 = dict(dtype=torch.int32, device=DEV)
    return ref.IndexerDecodeInputs(
        q=torch.tensor([[[2.0]], [[-1.0]]], device=DEV),
        weights=torch.tensor([[1.0], [3.0]], device=DEV),
        kv_cache=torch.tensor([[[5.0], [7.0]], [[1.0], [-2.0]]], device=DEV),
        query_start_loc=torch.tensor([0, 2], **i32),
        seq_lens=torch.tensor([3], **i32),
        block_table=torch.tensor([[1, 0]], **i32),
        decode_lens=torch.tensor([2], **i32),
        topk_indices_buffer=torch.full((4, k), 9, **i32),
        num_reqs=1,
        num_decodes=1,
        num_decode_tokens=2,
        max_decode_len=2,
        requires_padding=False,
        max_model_len=4,
        topk=k,
    )


def test_reference_by_hand():
    expected = ref.reference(None, hand_inputs(k=2))
    inf = np.inf
    # token 0: 1*relu(2*1), 1*relu(2*-2); token 1: 3*relu(-1*1), 3*relu(-1*-2), 3*relu(-1*5)
    np.testing.assert_array_equal(expected.logits, [[2, 0, -inf, -inf], [0, 6, 0, -inf]])
    assert expected.context_lens[:2].tolist() == [2, 3]
    assert sorted(expected.buffer[0].tolist()) == [0, 1]
    assert expected.buffer[1, 0] == 1 and expected.buffer[1, 1] in (0, 2)  # a tie at 0
    assert expected.buffer[2:].tolist() == [[9, 9], [9, 9]]  # rows it does not own
    assert expected.checked_rows.tolist() == [True, True, False, False]


def test_reference_fills_minus_one_when_fewer_keys_than_k():
    expected = ref.reference(None, hand_inputs(k=3))
    assert sorted(expected.buffer[0].tolist()) == [-1, 0, 1]
    assert sorted(expected.buffer[1].tolist()) == [0, 1, 2]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_triton_matches_the_hand_case(k):
    inputs = hand_inputs(k)
    expected = ref.reference(None, inputs)
    got = kernels.indexer_decode(inputs)
    torch.testing.assert_close(got.logits.cpu(), torch.as_tensor(expected.logits))
    assert get_target(TARGET).compare(None, inputs, expected, got) == []


def test_top_k_checks_its_contract():
    logits = torch.zeros(4, 8, device=DEV)
    i32 = dict(dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="int32"):
        top_k_per_row(logits, torch.ones(4, dtype=torch.int64, device=DEV), 2)
    with pytest.raises(ValueError, match="contiguous"):
        top_k_per_row(logits, torch.ones(4, 2, **i32)[:, 0], 2)
    with pytest.raises(ValueError, match="6 elements for 4 rows"):
        top_k_per_row(logits, torch.ones(6, **i32), 2)


def test_top_k_handles_ties_negatives_and_short_rows():
    logits = torch.tensor(
        [[-3.0, -1.0, -1.0, -2.0, 0.0, -0.0], [5.0, 5.0, 5.0, 5.0, 1.0, 2.0], [1.0] * 6],
        device=DEV,
    )
    lengths = torch.tensor([6, 4, 1], dtype=torch.int32, device=DEV)
    got = top_k_per_row(logits, lengths, 3)
    assert sorted(got[0].tolist())[1:] == [4, 5] and sorted(got[0].tolist())[0] in (1, 2)
    assert len(set(got[1].tolist()) & {0, 1, 2, 3}) == 3
    assert sorted(got[2].tolist()) == [-1, -1, 0]


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def test_smallest_trigger_6_padded_to_8():
    """d = [2, 2, 2, 0]: rows 0..5 are real, rows 6, 7 padded slots, the rest untouched."""
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case)
    assert (inputs.num_decodes, inputs.num_decode_tokens) == (4, 8)
    assert inputs.decode_lens.tolist() == [2, 2, 2, 0] and inputs.requires_padding
    expected = ref.reference(case, inputs)
    assert np.flatnonzero(expected.checked_rows).tolist() == [0, 1, 2, 3, 4, 5]
    assert np.flatnonzero(expected.free_rows).tolist() == [6, 7]
    assert judge("triton", case).ok and judge("reference", case).ok
    verdict = judge("pr39542-writeback", case)
    assert verdict.key == "exception:RuntimeError"
    assert "(8) must match the existing size (6)" in verdict.mismatches[0].got


def test_production_shape_98_padded_to_104():
    """49 requests x 2 tokens = 98, graph of 104: the upstream crash, at K = 4."""
    case = hand_case((2,) * 49, (1,) * 49)
    assert judge("triton", case).ok
    verdict = judge("pr39542-writeback", case)
    assert "(104) must match the existing size (98)" in verdict.mismatches[0].got


def test_unsliced_lengths_break_the_top_k_contract():
    case = hand_case((1, 2, 3), (4, 4, 0), use_cudagraph=False)
    assert judge("triton", case).ok
    verdict = judge("pr39542-lengths", case)
    assert verdict.key == "exception:ValueError"
    assert "lengths has 6 elements for 4 rows" in verdict.mismatches[0].got


def test_overlap_corrupts_the_first_prefill_row_silently():
    """B = 2, L = 2, N_d = 3: the top-k view buffer[:4] covers prefill row 3."""
    case = hand_case((1, 2, 3), (4, 4, 0), use_cudagraph=False)
    assert judge("triton", case).ok
    verdict = judge("pr39542-overlap", case)
    assert verdict.key == "unchanged"  # no exception: silent corruption
    assert verdict.mismatches[0].where.startswith("topk_indices_buffer[3]")


def test_uniform_unpadded_decodes_do_not_trigger_any_mutant():
    case = hand_case((2, 2, 2, 2), (1, 2, 3, 4))  # 8 tokens: a capture size, no padding
    for impl in get_target(TARGET).implementations:
        assert judge(impl, case).ok, impl


@pytest.mark.parametrize(
    "mutant, key",
    [
        ("pr39542-writeback", "exception:RuntimeError"),
        ("pr39542-lengths", "exception:ValueError"),
        ("pr39542-overlap", "unchanged"),
    ],
)
def test_smallest_trigger_is_valid_meets_the_trigger_and_fails(mutant, key):
    impl = get_target(TARGET).resolve(mutant)
    case = impl.smallest()
    assert violations(case.config, case.batch) == []
    assert impl.reach(case) and impl.trigger(case)
    assert judge("triton", case).ok and judge("reference", case).ok
    assert judge(mutant, case).key == key


@pytest.mark.parametrize(
    "mutant, case",
    [
        ("pr39542-writeback", hand_case((1, 2), (1, 1))),  # ragged, unpadded: sum(d) == N_d
        ("pr39542-lengths", hand_case((1, 2), (1, 1))),  # no prefill after the decodes: R == B
        ("pr39542-overlap", hand_case((2, 2, 3), (1, 1, 0))),  # uniform decodes: B*L == N_d
    ],
)
def test_reached_but_not_triggered_passes(mutant, case):
    """The mutant runs the code its bug lives in, and the bug cannot show."""
    impl = get_target(TARGET).resolve(mutant)
    assert impl.reach(case) and not impl.trigger(case)
    assert judge(mutant, case).ok


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_passes_300_examples(impl):
    result = assert_passes(TARGET, impl, max_examples=300)
    assert result.labels["requires_padding"] > 0 and result.labels["next_n>1"] > 0


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_is_detected_with_a_minimized_trigger(mutant):
    result = assert_detected(TARGET, mutant)
    split = ref.describe(result.case)[1]
    assert result.case.config.next_n >= 2
    # the sizes that differ: sum(d), N_d and B*L are not all equal
    sizes = {sum(split.decode_lens), split.num_decode_tokens,
             split.num_decodes * split.max_decode_len}  # fmt: skip
    assert len(sizes) > 1, sizes
