"""Target ``indexer-decode``: reference by hand, kernels, mutants, end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets.indexer_decode import SPEC3
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case
from attnfuzz.kernels import indexer_decode as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.kernels.indexer_ops import (
    decode_context_lens,
    pack_seq,
    paged_mqa_logits,
    top_k_per_row,
    unpack_seq,
    write_rows,
)
from attnfuzz.reference import indexer_decode as ref
from attnfuzz.reference.batch import Case
from attnfuzz.reference.invariants import violations

TARGET = "indexer-decode"
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
    case = hand_case((1, 2, 4), (4, 4, 0), use_cudagraph=False, **SPEC3)
    assert judge("triton", case).ok
    verdict = judge("pr39542-lengths", case)
    assert verdict.key == "exception:ValueError"
    assert "lengths has 6 elements for 4 rows" in verdict.mismatches[0].got


def test_overlap_corrupts_the_first_prefill_row_silently():
    """next_n = 3, B = 2, L = 2, N_d = 3: the top-k view buffer[:4] covers prefill row 3."""
    case = hand_case((1, 2, 4), (4, 4, 0), use_cudagraph=False, **SPEC3)
    assert judge("triton", case).ok
    verdict = judge("pr39542-overlap", case)
    assert verdict.key == "unchanged"  # no exception: silent corruption
    assert verdict.mismatches[0].where.startswith("topk_indices_buffer[3, ")


def test_uniform_unpadded_decodes_do_not_trigger_any_mutant():
    case = hand_case((2, 2, 2, 2), (1, 2, 3, 4))  # 8 tokens: a capture size, no padding
    target = get_target(TARGET)
    for impl in target.implementations:
        if target.implementations[impl].engine is None:  # vLLM's own: tests/test_vllm_*
            assert judge(impl, case).ok, impl


def test_native_steps_split_uniformly_as_the_engine_does():
    """vLLM 0.33.0 splits native decode steps (next_n <= 2) with ``require_uniform``
    (indexer.py: DeepseekV32IndexerMetadataBuilder.build): d = [1, 2] is one decode of
    1 token and a prefill of 2, never a ragged pair; next_n = 3 flattens and splits ragged."""
    split = ref.describe(hand_case((1, 2), (1, 1)))[1]
    assert (split.num_decodes, split.num_prefills, split.requires_padding) == (1, 1, False)
    split = ref.describe(hand_case((1, 2), (1, 1), **SPEC3))[1]
    assert (split.num_decodes, split.decode_lens, split.requires_padding) == (2, (1, 2), True)


def engine_weights_path(inp: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """Our fixed path with the engine's one difference on the native path: the logits
    take the *unpacked* ``weights[:B*L]`` (vLLM 0.33.0 sparse_attn_indexer, decode
    branch), right only under the engine's uniform split."""
    from attnfuzz.kernels import indexer_ops as ops

    B, L = inp.num_decodes, inp.max_decode_len
    q, _ = kernels._packed_queries(inp)
    context_lens = ops.decode_context_lens(inp.seq_lens[:B], inp.decode_lens, L)
    w = inp.weights[: B * L].reshape(B, L, -1)
    logits = ops.paged_mqa_logits(
        q, inp.kv_cache, w, context_lens, inp.block_table[:B], inp.max_model_len
    )
    topk = ops.top_k_per_row(logits, context_lens.view(-1), inp.topk)
    ops.write_rows(inp.topk_indices_buffer, kernels._unpacked(inp, topk))
    return ref.IndexerDecodeOutputs(logits)


def test_the_engine_weights_are_right_under_its_split_and_wrong_under_a_ragged_one():
    """The old model split d = [1, 2] ragged at next_n = 2 and so judged the engine's
    unpacked weights wrong (token 1 in slot (1, 0) got weights[2]); under the engine's
    split (uniform: one decode, then prefills) they are right."""
    case = hand_case((1, 2, 3), (3, 4, 0), use_cudagraph=False, seed=3)
    target = get_target(TARGET)
    inputs = ref.make_inputs(case, DEV)
    assert inputs.num_decodes == 1 and not inputs.requires_padding  # the engine's split
    expected = ref.reference(case, inputs)
    assert target.compare(case, inputs, expected, engine_weights_path(inputs)) == []
    # The old, ragged split of the same step: B = 2, L = 2, packed.
    meta = ref.build_common_metadata(case.config, case.batch)
    ragged = ref.split_decodes_and_prefills(meta, case.config.threshold)
    assert ragged.decode_lens == (1, 2) and ragged.requires_padding
    inputs.decode_lens = torch.tensor(ragged.decode_lens, dtype=torch.int32, device=DEV)
    inputs.num_decodes, inputs.max_decode_len, inputs.requires_padding = 2, 2, True
    inputs.num_decode_tokens = ragged.num_decode_tokens
    expected = ref.reference(case, inputs)
    assert target.compare(case, inputs, expected, engine_weights_path(inputs)) != []


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
        # ragged (next_n = 3), unpadded: sum(d) == N_d
        ("pr39542-writeback", hand_case((1, 2), (1, 1), **SPEC3)),
        # no prefill after the decodes: R == B
        ("pr39542-lengths", hand_case((1, 2), (1, 1), **SPEC3)),
        ("pr39542-overlap", hand_case((2, 2, 3), (1, 1, 0))),  # uniform decodes: B*L == N_d
    ],
)
def test_reached_but_not_triggered_passes(mutant, case):
    """The mutant runs the code its bug lives in, and the bug cannot show."""
    impl = get_target(TARGET).resolve(mutant)
    assert impl.reach(case) and not impl.trigger(case)
    assert judge(mutant, case).ok


# A derandomized search draws the same cases for each of attnfuzz's implementations that
# pass it (same seed, same guiding statistics): the reference's (NumPy) in CI, Triton's nightly.
@pytest.mark.slow
@pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.nightly), "reference"])
def test_the_search_draws_padded_mtp_steps(impl):
    result = assert_passes(TARGET, impl)  # the generic test's run (tests/test_entries.py)
    assert result.labels["requires_padding"] > 0 and result.labels["next_n>1"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("mutant", [m.name for m in get_target(TARGET).mutants if not m.engine])
def test_each_minimized_case_is_a_padded_or_mtp_step_whose_sizes_differ(mutant):
    result = assert_detected(TARGET, mutant)  # the generic test's run
    split = ref.describe(result.case)[1]
    # A speculative step, or padded one-token decodes (their padding row makes
    # N_d != sum(d) as well: the write-back needs no drafts, see docs/findings.md).
    assert result.case.config.next_n >= 2 or split.requires_padding
    # the sizes that differ: sum(d), N_d and B*L are not all equal
    sizes = {sum(split.decode_lens), split.num_decode_tokens,
             split.num_decodes * split.max_decode_len}  # fmt: skip
    assert len(sizes) > 1, sizes


# -- inconsistent metadata: refused with a message, or nothing read or written past it --

POISON = 1000.0
FAR = 2**30  # a page id, an offset: dereferenced, it would land gigabytes away


def i32(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=DEV)


def head(values: list, n: int) -> torch.Tensor:
    """The first ``n`` entries of ``values`` (int32): what follows them in memory is the rest."""
    return i32(values)[:n]


@pytest.mark.parametrize(
    "qsl, d",
    [
        ([0, 2], [4]),  # d[0] = 4 tokens from row 0: rows 3 (and 4) are past x's 3 rows
        ([-2, 2], [3]),  # an offset before x: rows -2, -1
    ],
    ids=["past-the-end", "before-the-start"],
)
def test_pack_reads_no_token_row_outside_x(qsl, d):
    """Token rows the metadata names outside ``x`` pack as zeros; the memory around x
    holds a poison the kernel would otherwise have read."""
    poisoned = torch.tensor([POISON, POISON, 1.0, 2.0, 3.0, POISON, POISON], device=DEV)
    x = poisoned[2:5, None]  # 3 token rows, 1 feature
    packed = pack_seq(x, i32(qsl), i32(d), 5)
    src = [qsl[0] + j for j in range(5)]
    want = [float(x[s, 0]) if 0 <= s < 3 and j < d[0] else 0.0 for j, s in enumerate(src)]
    assert packed.flatten().tolist() == want


def test_pack_and_unpack_refuse_offsets_fewer_than_requests():
    """Two requests, one offset: the second offset would be read past the tensor."""
    x = torch.ones(4, 1, device=DEV)
    with pytest.raises(ValueError, match="query_start_loc must be a contiguous 1-D tensor"):
        pack_seq(x, head([0, FAR], 1), i32([1, 1]), 2)
    with pytest.raises(ValueError, match="query_start_loc must be a contiguous 1-D tensor"):
        unpack_seq(x.view(2, 2, 1), head([0, FAR], 1), i32([1, 1]), 2)
    with pytest.raises(ValueError, match="d must be a contiguous 1-D tensor of at least 2"):
        unpack_seq(x.view(2, 2, 1), i32([0, 1, 2]), head([1, FAR], 1), 2)


@pytest.mark.parametrize("qsl", [[0, FAR, FAR + 1], [FAR, 0, 1]], ids=["past", "before"])
def test_unpack_writes_no_token_row_outside_its_output(qsl):
    """Request 1's row, its offset less request 0's, lands far outside the 1 output row:
    its token is dropped (it was stored there, gigabytes away), request 0's comes back."""
    x = torch.tensor([[[5.0]], [[7.0]]], device=DEV)  # B = 2, L = 1
    d = i32([1, 1])
    assert unpack_seq(x, i32(qsl), d, 1).tolist() == [[5.0]]


def test_context_lens_refuse_short_lengths_and_a_short_out():
    """2 decodes of 2 tokens: 2 seq_lens and 4 output slots are needed; nothing is
    written past a short ``out`` (a sentinel follows it in memory)."""
    d = i32([2, 2])
    with pytest.raises(ValueError, match="seq_lens must be a contiguous 1-D tensor of at least 2"):
        decode_context_lens(head([5, 10**6], 1), d, 2)
    memory = torch.full((6,), 77, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="out must hold 4 int32 lengths"):
        decode_context_lens(i32([5, 6]), d, 2, out=memory[:2])
    assert memory.tolist() == [77] * 6


def logits_of(context_lens, block_table, **kw) -> torch.Tensor:
    """The hand case's decode (q 2 and -1, weights 1 and 3) over pages 0 (5, 7) and
    1 (1, -2), with ``max_model_len`` 8."""
    inputs = hand_inputs(k=1)
    args = dict(
        q=inputs.q.view(1, 2, 1, 1),
        kv_cache=inputs.kv_cache,
        weights=inputs.weights.view(1, 2, 1),
        context_lens=i32(context_lens),
        block_table=block_table,
        max_model_len=8,
    )
    args.update(kw)
    return paged_mqa_logits(**args).cpu()


INF = float("inf")


def test_logits_read_no_table_entry_past_the_width():
    """Context length 8 against a table row of 2 pages of 2 slots: keys 4..7 are not mapped
    and are -inf. The table is the head of wider rows whose next entries are FAR pages."""
    table = i32([[1, 0, FAR, FAR]])[:, :2]
    got = logits_of([[8, 8]], table)
    # keys 0..3 in pages 1, 0: K = 1, -2, 5, 7; row scores w * relu(q * K)
    assert got.tolist() == [[2, 0, 10, 14] + [-INF] * 4, [0, 6, 0, 0] + [-INF] * 4]


@pytest.mark.parametrize("page", [FAR, -FAR, 2])
def test_logits_never_dereference_a_page_outside_the_cache(page):
    """Keys 2, 3 in a page the cache (2 pages) does not hold are -inf, as if not visible."""
    got = logits_of([[4, 4]], i32([[1, page]]))
    assert got.tolist() == [[2, 0] + [-INF] * 6, [0, 6] + [-INF] * 6]


def test_logits_refuse_shapes_they_would_read_past():
    """One table row for two requests, weights for one token of two, a cache of another
    head dim: each refused before the launch (the memory after them holds poison)."""
    table = i32([[1, 0], [FAR, FAR]])
    ones = dict(q=torch.ones(2, 1, 1, 1, device=DEV), weights=torch.ones(2, 1, 1, device=DEV))
    with pytest.raises(ValueError, match=r"block_table must be \[2, W\]"):
        logits_of([[4], [4]], table[:1], **ones)  # a [1, 2] table for B = 2
    assert logits_of([[4], [4]], table[:2].clamp(max=1), **ones).isfinite().any()
    short = torch.tensor([1.0, float("nan")], device=DEV)[:1].view(1, 1, 1)
    with pytest.raises(ValueError, match=r"weights must be \[1, 2, 1\]"):
        logits_of([[4, 4]], table[:1], weights=short)
    with pytest.raises(ValueError, match=r"kv_cache must be \[num_blocks, block_size, 2\]"):
        logits_of([[4, 4]], table[:1], q=torch.ones(1, 2, 1, 2, device=DEV))


def test_top_k_and_write_rows_refuse_memory_they_would_index_past():
    """Logits and a buffer with a column stride of 0 (expanded): read or written as
    row-major they run past their storage."""
    scores = torch.tensor([0.0, 1.0, 2.0, 3.0, POISON, POISON], device=DEV)
    with pytest.raises(ValueError, match="unit column stride"):
        top_k_per_row(scores[:4, None].expand(4, 3), i32([3, 3, 3, 3]), 1)
    memory = torch.full((6,), 77, dtype=torch.int32, device=DEV)
    buffer = memory[:4, None].expand(4, 3)
    with pytest.raises(RuntimeError, match="unit column stride"):
        write_rows(buffer, i32([[1, 2, 3]] * 4))
    assert memory.tolist() == [77] * 6
