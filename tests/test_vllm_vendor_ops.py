"""The vendor stand-ins of :mod:`attnfuzz.adapters.vllm.vendor_ops`, each against the reference.

Each stand-in honours its operation's contract (see its docstring for where it is
written upstream); here each is checked on its own: values against
``reference/indexer_decode.py``, rows and columns it may not touch, what it refuses.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from attnfuzz.adapters.vllm import vendor_ops as v
from attnfuzz.adapters.vllm import vendor_ops_releases as older
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.testing import hand_case
from attnfuzz.reference import indexer_decode as ref

pytestmark = requires_vllm

I32 = dict(dtype=torch.int32)


def small_ints(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=gen).to(torch.float32)


def expected_row(inputs: ref.IndexerDecodeInputs, token: int, req: int, ctx: int) -> np.ndarray:
    """The reference's logits of ``token`` over the first ``ctx`` keys of request ``req``."""
    return ref._token_logits(
        inputs.q[token].numpy(),
        inputs.weights[token].numpy(),
        inputs.kv_cache.numpy(),
        inputs.block_table[req].numpy(),
        ctx,
    )


# -- the fp8 cache ------------------------------------------------------------------


def test_cache_round_trips_small_integers_exactly():
    pages = small_ints(5, 4, 6)
    cache = v.quantized_cache(pages)
    assert cache.dtype == torch.uint8 and tuple(cache.shape) == (5, 4, 6 + 4)
    torch.testing.assert_close(v.dequantized_pages(cache, 6), pages, rtol=0, atol=0)


def test_cache_layout_is_values_then_scales_per_page():
    """Per page: block_size * D fp8 values, then block_size fp32 (ue8m0) scales."""
    pages = torch.zeros(2, 2, 3)
    pages[1, 1] = torch.tensor([2.0, -1.0, 0.0])  # amax 2: scale 2 ** ceil(log2(2 / 448))
    cache = v.quantized_cache(pages)
    flat = cache.reshape(2, -1)
    scale = 2.0**-7
    values = flat[1, :6].view(v.FP8).float().view(2, 3)
    assert values[1].tolist() == [2 / scale, -1 / scale, 0.0]
    assert flat[1, 6:].view(torch.float32)[1].item() == scale


def test_cache_writer_skips_padding_slots_and_refuses_other_layouts():
    cache = torch.full((1, 2, 1 + 4), 7, dtype=torch.uint8)
    v.indexer_k_quant_and_cache(torch.ones(2, 1), cache, torch.tensor([-1, 1]), 1, "ue8m0")
    assert cache.reshape(-1)[0].item() == 7  # slot 0 untouched: its token was padding
    with pytest.raises(v.ContractError, match="quant_block_size"):
        v.indexer_k_quant_and_cache(torch.ones(1, 1), cache, torch.tensor([0]), 2, "ue8m0")
    with pytest.raises(v.ContractError, match="uint8"):
        v.indexer_k_quant_and_cache(torch.ones(1, 1), cache.float(), torch.tensor([0]), 1, "x")


# -- paged logits -------------------------------------------------------------------


def padded_inputs() -> ref.IndexerDecodeInputs:
    """d = [2, 2, 2, 0] (three decodes padded to a graph of 8), the native path."""
    return ref.make_inputs(hand_case((2, 2, 2), (3, 5, 1)))


def native_operands(inp: ref.IndexerDecodeInputs):
    B, L = inp.num_decodes, inp.max_decode_len
    q = inp.q[: B * L].view(B, L, *inp.q.shape[1:]).to(v.FP8)  # uniform: a reshape
    lens = torch.stack(
        [torch.clamp(inp.seq_lens[:B] - L + 1 + j, min=0) for j in range(L)], dim=1
    ).to(torch.int32)
    return q, v.quantized_cache(inp.kv_cache).unsqueeze(-2), inp.weights[: B * L], lens


def test_paged_logits_match_the_reference_and_leave_the_tail_uncleaned():
    inp = padded_inputs()
    q, cache, w, lens = native_operands(inp)
    got = v.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens, inp.block_table, None, 64)
    expected = ref.reference(None, inp)
    assert tuple(got.shape) == (8, 64) and got.dtype == torch.float32
    for row in range(8):
        n = int(lens.view(-1)[row])
        if expected.logit_rows[row]:
            assert n == expected.row_context_lens[row]
            np.testing.assert_array_equal(got[row, :n].numpy(), expected.logits[row, :n])
        assert (got[row, n:] == v.UNCLEANED).all()  # "not cleaned": never -inf promised


def test_paged_logits_per_sequence_lengths_derive_each_row():
    """[B, 1] lengths of a sequence of next_n rows: row j sees seq_len - next_n + j + 1."""
    inp = padded_inputs()
    q, cache, w, lens = native_operands(inp)
    per_row = v.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens, inp.block_table, None, 64)
    per_seq = v.fp8_fp4_paged_mqa_logits(
        (q, None), cache, w, lens[:, -1:].contiguous(), inp.block_table, None, 64
    )
    torch.testing.assert_close(per_seq, per_row, rtol=0, atol=0)
    rocm = v.rocm_fp8_paged_mqa_logits(q, cache, w, lens, inp.block_table, None, 64)
    xpu = v.xpu_fp8_paged_mqa_logits(
        q, cache, w, lens[:, -1].contiguous(), inp.block_table, None, 64
    )
    torch.testing.assert_close(rocm, per_row, rtol=0, atol=0)
    torch.testing.assert_close(xpu, per_row, rtol=0, atol=0)


def test_paged_logits_never_dereference_pages_past_a_sequence():
    inp = padded_inputs()
    q, cache, w, lens = native_operands(inp)
    table = inp.block_table.clone()
    table[:, 2:] = 2**30  # 8 keys at most: pages of 4, so entries 2.. are never read
    v.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens, table, None, 64)


def test_paged_logits_refuse_what_deepgemm_refuses():
    inp = padded_inputs()
    q, cache, w, lens = native_operands(inp)
    t = inp.block_table
    with pytest.raises(v.ContractError, match="2-D"):
        v.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens.view(-1), t, None, 64)
    with pytest.raises(v.ContractError, match="MX"):
        v.fp8_fp4_paged_mqa_logits((q, lens), cache, w, lens, t, None, 64)
    with pytest.raises(v.ContractError, match="weights"):
        v.fp8_fp4_paged_mqa_logits((q, None), cache, w[:6], lens, t, None, 64)
    with pytest.raises(v.ContractError, match="int32"):
        v.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens.long(), t, None, 64)
    with pytest.raises(v.ContractError, match="1-D"):
        v.xpu_fp8_paged_mqa_logits(q, cache, w, lens, t, None, 64)


# -- prefill: gather and ragged logits --------------------------------------------------


def test_gather_copies_each_request_contiguously():
    pages = small_ints(6, 2, 3, seed=1)
    cache = v.quantized_cache(pages)
    table = torch.tensor([[4, 1, 0], [5, 2, 3]], **I32)
    bounds = torch.tensor([0, 3, 7], **I32)
    k = torch.zeros(8, 3, dtype=v.FP8)
    scale = torch.full((8, 4), 9, dtype=torch.uint8)
    v.cp_gather_indexer_k_quant_cache(cache, k, scale, table, bounds)
    keys = k.float() * scale.view(torch.float32)
    want = torch.cat([pages[[4, 1]].reshape(-1, 3)[:3], pages[[5, 2]].reshape(-1, 3)[:4]])
    torch.testing.assert_close(keys[:7], want, rtol=0, atol=0)
    assert (scale[7] == 9).all()  # past the chunk: untouched


def test_ragged_logits_match_the_reference_in_both_column_conventions():
    q = small_ints(3, 2, 4, seed=2)
    w = small_ints(3, 2, seed=3)
    keys = small_ints(7, 4, seed=4)
    k8, scales = keys.to(v.FP8), torch.ones(7)
    ks, ke = torch.tensor([0, 0, 3], **I32), torch.tensor([2, 3, 7], **I32)
    compressed = v.fp8_fp4_mqa_logits((q.to(v.FP8), None), (k8, scales), w, ks, ke, 4)
    absolute = v.rocm_fp8_mqa_logits(q.to(v.FP8), (k8, scales), w, ks, ke)
    assert tuple(compressed.shape) == (3, 4) and tuple(absolute.shape) == (3, 7)
    for i in range(3):
        lo, hi = int(ks[i]), int(ke[i])
        want = (torch.relu(keys[lo:hi] @ q[i].T) @ w[i]).numpy()
        np.testing.assert_array_equal(compressed[i, : hi - lo].numpy(), want)
        np.testing.assert_array_equal(absolute[i, lo:hi].numpy(), want)
    with pytest.raises(v.ContractError, match="max_seqlen_k"):
        v.fp8_fp4_mqa_logits((q.to(v.FP8), None), (k8, scales), w, ks, ke, 3)


# -- top-k --------------------------------------------------------------------------


def test_decode_top_k_per_row_lengths_match_the_reference():
    logits = small_ints(5, 9, seed=5)
    lens = torch.tensor([[9, 3], [0, 1], [5, 5]], **I32).view(-1)[:5].contiguous()
    out = torch.full((7, 4), 77, **I32)
    v.top_k_per_row_decode(logits, 2, lens, out, 5, *logits.stride(), 4)
    for i in range(5):
        want = ref.topk_row(logits[i].numpy(), int(lens[i]), 4)
        assert out[i].tolist() == want.tolist()  # same tie rule: lowest index first
    assert (out[5:] == 77).all()  # rows past num_rows: untouched


def test_decode_top_k_per_sequence_lengths_and_unread_columns():
    logits = small_ints(4, 8, seed=6)
    seq = torch.tensor([6, 1], **I32)  # next_n = 2: rows see 5, 6, 0, 1
    poisoned = logits.clone()
    for row, n in enumerate([5, 6, 0, 1]):
        poisoned[row, n:] = float("inf")  # a column read past its row's end would win
    out = torch.empty(4, 3, **I32)
    v.top_k_per_row_decode(poisoned, 2, seq, out, 4, *poisoned.stride(), 3)
    for row, n in enumerate([5, 6, 0, 1]):
        assert out[row].tolist() == ref.topk_row(logits[row].numpy(), n, 3).tolist()


def test_prefill_top_k_is_relative_to_the_row_start():
    logits = small_ints(2, 10, seed=7)
    starts, ends = torch.tensor([2, 0], **I32), torch.tensor([9, 4], **I32)
    out = torch.empty(2, 3, **I32)
    v.top_k_per_row_prefill(logits, starts, ends, out, 2, *logits.stride(), 3)
    assert out[0].tolist() == ref.topk_row(logits[0, 2:9].numpy(), 7, 3).tolist()
    assert out[1].tolist() == ref.topk_row(logits[1, :4].numpy(), 4, 3).tolist()


def test_top_k_refuses_what_the_kernels_refuse():
    logits = torch.zeros(2, 4)
    out = torch.empty(2, 2, **I32)
    with pytest.raises(v.ContractError, match="int32"):
        v.top_k_per_row_decode(logits, 1, torch.ones(2, dtype=torch.int64), out, 2, 4, 1, 2)
    with pytest.raises(v.ContractError, match="index rows"):
        v.top_k_per_row_decode(logits, 1, torch.ones(2, **I32), out[:1], 2, 4, 1, 2)
    with pytest.raises(v.ContractError, match="float32"):
        v.top_k_per_row_decode(logits.half(), 1, torch.ones(2, **I32), out, 2, 4, 1, 2)
    with pytest.raises(v.ContractError, match="lengths for"):
        v.top_k_per_row_decode(logits, 1, torch.ones(1, **I32), out, 2, 4, 1, 2)


# -- registration for one call ----------------------------------------------------------


def test_registered_restores_and_removes():
    obj = types.SimpleNamespace(kept=1)
    with v.registered((obj, "kept", 2), (obj, "added", 3)):
        assert (obj.kept, obj.added) == (2, 3)
    assert obj.kept == 1 and not hasattr(obj, "added")
    with pytest.raises(RuntimeError), v.registered((obj, "kept", 5)):
        raise RuntimeError
    assert obj.kept == 1


# -- the CPU kernels of SparseAttnIndexer.forward_cpu ----------------------------------


def cpu_operands(seed: int = 9):
    """Three one-token queries of 2 heads over a 128-wide fp8 cache of 6 pages of 4."""
    pages = small_ints(6, 4, 128, seed=seed)
    cache = v.quantized_cache(pages)
    flat = cache.view(6, -1)  # as forward_cpu views it: [pages, block_size * 132]
    q = small_ints(3, 2, 128, seed=seed + 1)
    w = small_ints(3, 2, seed=seed + 2)
    table = torch.tensor([[5, 0, 3], [1, 2, 4], [4, 3, 2]], **I32)
    return pages, flat, q, w, table


def cpu_logits_row(pages, q, w, table, b: int, n: int) -> torch.Tensor:
    keys = pages[table[b].long()].reshape(-1, 128)[:n]
    return torch.relu(keys @ q[b].T) @ w[b]


def test_cpu_logits_match_the_reference_per_row_and_leave_the_rest_uninitialized():
    pages, flat, q, w, table = cpu_operands()
    lens = torch.tensor([7, 0, 12], **I32)
    got = v.fp8_paged_mqa_logits_cpu(q.to(v.FP8), flat, w, lens, table, 4, 10)
    assert tuple(got.shape) == (3, 10) and got.dtype == torch.float32
    for b, n in enumerate([7, 0, 10]):  # row 2 is cut at max_seq_len, as the kernel loops
        torch.testing.assert_close(
            got[b, :n], cpu_logits_row(pages, q, w, table, b, n), rtol=0, atol=0
        )
        assert (got[b, n:] == v.UNCLEANED).all()


def test_cpu_logits_read_a_pooled_page_stride_and_only_the_pages_a_row_needs():
    pages, flat, q, w, table = cpu_operands()
    pooled = torch.zeros(6, flat.shape[1] + 40, dtype=torch.uint8)
    pooled[:, : flat.shape[1]] = flat
    view = pooled[:, : flat.shape[1]]  # a page of a larger per-layer allocation
    lens = torch.tensor([4, 8, 1], **I32)
    poisoned = table.clone()
    poisoned[[0, 2], 1:] = 2**30  # rows of 4 keys and fewer never read their second page
    poisoned[1, 2] = 2**30
    got = v.fp8_paged_mqa_logits_cpu(q.to(v.FP8), view, w, lens.long(), poisoned.long(), 4, 8)
    want = v.fp8_paged_mqa_logits_cpu(q.to(v.FP8), flat, w, lens, table, 4, 8)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=lambda q: q[..., :64].contiguous()), "head_dim 64 != 128"),
        (dict(q=lambda q: q.float()), "3-D fp8"),
        (dict(table=lambda t: t[:2]), "page_table must be 2-D"),
        (dict(lens=lambda n: n.view(3, 1)), "seq_lens must be 1-D"),
        (dict(lens=lambda n: n.short()), "int32 or int64"),
        (dict(w=lambda w: w.double()), "weight must be"),
        (dict(flat=lambda f: f[:, :100]), "too small for block_size"),
        (dict(flat=lambda f: f.float()), "2-D uint8"),
        (dict(table=lambda t: t.t().contiguous().t()), "page_table must be contiguous"),
    ],
)
def test_cpu_logits_refuse_what_the_kernel_checks(change, message):
    _, flat, q, w, table = cpu_operands()
    args = dict(q=q.to(v.FP8), flat=flat, w=w, lens=torch.tensor([1, 2, 3], **I32), table=table)
    for name, f in change.items():
        args[name] = f(args[name])
    with pytest.raises(v.ContractError, match=message):
        v.fp8_paged_mqa_logits_cpu(
            args["q"], args["flat"], args["w"], args["lens"], args["table"], 4, 8
        )


def test_cpu_top_512_of_a_short_row_is_its_positions_in_order():
    """A row of at most 512 keys: raw indices 0..n-1 (the scores are not read), -1 after;
    the page indices are the cache slots of those positions."""
    scores = torch.full((2, 12), float("nan"))  # never read on this path
    lens = torch.tensor([12, 5], **I32)
    table = torch.tensor([[3, 0, 2], [1, 4, 5]], **I32)
    pages, raw = torch.empty(2, 512, **I32), torch.empty(2, 512, **I32)
    v.topk_transform_512_cpu(scores, lens, table, pages, 4, raw)
    for i, n in enumerate([12, 5]):
        assert raw[i].tolist() == list(range(n)) + [-1] * (512 - n)
        for pos, slot in zip(raw[i].tolist(), pages[i].tolist(), strict=True):
            assert slot == (-1 if pos < 0 else int(table[i, pos // 4]) * 4 + pos % 4)


def test_cpu_top_512_of_a_long_row_matches_the_reference_and_clamps_to_the_scores():
    scores = small_ints(2, 700, seed=10)
    lens = torch.tensor([900, 600], **I32)  # row 0 is cut to the 700 columns there are
    table = torch.arange(2 * 175, dtype=torch.int32).view(2, 175).flip(1).contiguous()
    pages, raw = torch.empty(2, 512, **I32), torch.empty(2, 512, **I32)
    v.topk_transform_512_cpu(scores, lens, table, pages, 4, raw)
    for i, n in enumerate([700, 600]):
        want = ref.topk_row(scores[i].numpy(), n, 512)
        assert sorted(raw[i].tolist()) == sorted(want.tolist())
    v.topk_transform_512_cpu(scores, lens, table, pages, 4)  # raw indices are optional


def test_cpu_top_512_writes_the_first_512_columns_only():
    scores, lens = small_ints(1, 6, seed=11), torch.tensor([6])  # int64 lengths are taken
    table = torch.tensor([[2, 7]])  # and int64 page tables
    pages, raw = torch.full((1, 520), 9, **I32), torch.full((1, 520), 9, **I32)
    v.topk_transform_512_cpu(scores, lens, table, pages, 4, raw)
    assert raw[0, :6].tolist() == list(range(6)) and (raw[0, 6:512] == -1).all()
    assert pages[0, :6].tolist() == [8, 9, 10, 11, 28, 29]
    assert (raw[0, 512:] == 9).all() and (pages[0, 512:] == 9).all()


def test_cpu_top_512_refuses_what_the_kernel_checks():
    scores, lens, table = torch.zeros(2, 8), torch.tensor([3, 4], **I32), torch.zeros(2, 2, **I32)
    out = torch.empty(2, 512, **I32)
    with pytest.raises(v.ContractError, match="512"):
        v.topk_transform_512_cpu(scores, lens, table, torch.empty(2, 4, **I32), 4)
    with pytest.raises(v.ContractError, match="power of 2"):
        v.topk_transform_512_cpu(scores, lens, table, out, 3)
    with pytest.raises(v.ContractError, match="out_raw_indices"):
        v.topk_transform_512_cpu(scores, lens, table, out, 4, torch.empty(2, 1024, **I32)[:, ::2])
    with pytest.raises(v.ContractError, match="out_raw_indices"):
        v.topk_transform_512_cpu(scores, lens, table, out, 4, torch.empty(2, 513, **I32))
    with pytest.raises(v.ContractError, match="page_tables"):
        v.topk_transform_512_cpu(scores, lens, table.short(), out, 4)
    with pytest.raises(v.ContractError, match="seq_lens"):
        v.topk_transform_512_cpu(scores, lens[:1], table, out, 4)
    with pytest.raises(v.ContractError, match="contiguous"):
        v.topk_transform_512_cpu(scores.t(), lens, table, out, 4)


# -- the contracts older releases call (vendor_ops_releases), each pinned by hand -----------
#
# Two queries of one head over four keys of dim 1, weights 1: query i's score for key n is
# relu(q[i] * k[n]). Row 0 sees keys [1, 3), row 1 keys [0, 4).

HAND_Q = torch.tensor([[[1.0]], [[2.0]]])  # [M=2, H=1, D=1]
HAND_K = torch.tensor([[1.0], [2.0], [-1.0], [4.0]])  # [N=4, D=1]
HAND_W = torch.ones(2, 1)
HAND_KS, HAND_KE = torch.tensor([1, 0], **I32), torch.tensor([3, 4], **I32)


def hand_ragged(fn, *tail):
    q, k = HAND_Q.to(v.FP8), HAND_K.to(v.FP8)
    return fn((q, None), (k, torch.ones(4)), HAND_W, HAND_KS, HAND_KE, *tail)


def test_compressed_ragged_contract_of_0_33_0_starts_each_row_at_column_zero():
    """0.33.0 ``fp8_fp4_mqa_logits(..., max_seqlen_k)``: row i holds keys [ks, ke) from
    column 0; the glue reads it with row_starts 0."""
    got = hand_ragged(v.fp8_fp4_mqa_logits, 4)
    assert tuple(got.shape) == (2, 4)
    assert got[0, :2].tolist() == [2.0, 0.0]  # keys 1, 2 of row 0 in columns 0, 1
    assert got[1].tolist() == [2.0, 4.0, 0.0, 8.0]
    assert (got[0, 2:] == v.UNCLEANED).all()


def test_absolute_ragged_contract_of_0_21_0_to_0_32_0_keeps_key_columns():
    """0.21.0 to 0.32.0 ``fp8_fp4_mqa_logits(..., clean_logits)``: [M, N], key n in column
    n; the glue reads row i with row_starts = ks. Read with the other contract's row start
    (0), row 0 would be a different row: the false mismatch a wrong stand-in gives."""
    got = hand_ragged(older.fp8_fp4_mqa_logits_absolute, False)
    assert tuple(got.shape) == (2, 4)
    assert got[0, 1:3].tolist() == [2.0, 0.0]  # keys 1, 2 in columns 1, 2
    assert got[0, 0] == v.UNCLEANED and got[0, 3] == v.UNCLEANED  # outside [ks, ke)
    assert got[1].tolist() == [2.0, 4.0, 0.0, 8.0]
    cleaned = hand_ragged(older.fp8_fp4_mqa_logits_absolute, True)
    assert cleaned[0, 0] == float("-inf") and cleaned[0, 3] == float("-inf")
    assert cleaned[0, 1:3].tolist() == [2.0, 0.0]
    compressed = hand_ragged(v.fp8_fp4_mqa_logits, 4)
    assert compressed[0, :2].tolist() != got[0, :2].tolist()
    with pytest.raises(v.ContractError, match="keys outside k"):
        older.fp8_fp4_mqa_logits_absolute(
            (HAND_Q.to(v.FP8), None), (HAND_K.to(v.FP8), torch.ones(4)), HAND_W,
            HAND_KS, torch.tensor([3, 5], **I32), False,
        )  # fmt: skip


def test_rocm_cleaned_ragged_contract_of_0_21_0_is_minus_inf_outside_the_keys():
    """0.21.0 ``rocm_fp8_mqa_logits``: absolute columns, -inf outside [ks, ke)."""
    got = older.rocm_fp8_mqa_logits_cleaned(
        HAND_Q.to(v.FP8), (HAND_K.to(v.FP8), torch.ones(4)), HAND_W, HAND_KS, HAND_KE
    )
    assert got[0].tolist() == [float("-inf"), 2.0, 0.0, float("-inf")]
    assert got[1].tolist() == [2.0, 4.0, 0.0, 8.0]


def hand_paged():
    """One sequence of next_n = 2 over pages of 2 keys (page 1, then page 0): keys
    1, 2, -1, 4 in order; per-row lengths 3 and 4, one head, weights 1, q = 1 and 2."""
    pages = torch.tensor([[[-1.0], [4.0]], [[1.0], [2.0]]])  # [2 pages, 2, D=1]
    cache = v.quantized_cache(pages).unsqueeze(-2)
    q = torch.tensor([[[[1.0]], [[2.0]]]]).to(v.FP8)  # [B=1, next_n=2, H=1, D=1]
    lens = torch.tensor([[3, 4]], **I32)
    return q, cache, torch.ones(2, 1), lens, torch.tensor([[1, 0]], **I32)


def test_paged_contract_of_0_21_0_to_0_32_0_cleans_only_when_asked():
    """0.21.0 to 0.32.0 ``fp8_fp4_paged_mqa_logits(..., clean_logits)``: the layout of
    0.33.0's, [B * next_n, max_model_len]; past a row's length -inf with clean_logits."""
    q, cache, w, lens, table = hand_paged()
    kept = older.fp8_fp4_paged_mqa_logits_cleanable(
        (q, None), cache, w, lens, table, None, 6, False
    )
    assert kept[0, :3].tolist() == [1.0, 2.0, 0.0] and kept[1, :4].tolist() == [2.0, 4.0, 0.0, 8.0]
    assert (kept[0, 3:] == v.UNCLEANED).all() and (kept[1, 4:] == v.UNCLEANED).all()
    now = v.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens, table, None, 6)
    torch.testing.assert_close(kept, now, rtol=0, atol=0)  # the same layout as 0.33.0's
    clean = older.fp8_fp4_paged_mqa_logits_cleanable(
        (q, None), cache, w, lens, table, None, 6, True
    )
    assert clean[0].tolist() == [1.0, 2.0, 0.0] + [float("-inf")] * 3
    assert clean[1].tolist() == [2.0, 4.0, 0.0, 8.0] + [float("-inf")] * 2


def test_rocm_cleaned_paged_contract_of_0_21_0_is_minus_inf_past_each_row():
    q, cache, w, lens, table = hand_paged()
    got = older.rocm_fp8_paged_mqa_logits_cleaned(q, cache, w, lens, table, None, 6)
    assert got[0].tolist() == [1.0, 2.0, 0.0] + [float("-inf")] * 3
    assert got[1].tolist() == [2.0, 4.0, 0.0, 8.0] + [float("-inf")] * 2


def test_the_glue_signature_picks_the_contract():
    """The stand-in follows the signature of the wrapper the installed glue imported."""
    from attnfuzz.adapters.vllm import _indexer_glue

    def new_mqa(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k): ...
    def old_mqa(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits): ...
    def new_paged(q, kv_cache, w, lens, table, meta, max_model_len, indices=None): ...
    def old_paged(q, kv_cache, w, lens, table, meta, max_model_len, clean_logits): ...

    def picked(mqa, paged):
        glue = types.SimpleNamespace(fp8_fp4_mqa_logits=mqa, fp8_fp4_paged_mqa_logits=paged)
        return [fn for _, _, fn in _indexer_glue.deepgemm_stand_ins(glue, lambda f: f)]

    assert picked(new_mqa, new_paged) == [v.fp8_fp4_paged_mqa_logits, v.fp8_fp4_mqa_logits]
    assert picked(old_mqa, old_paged) == [
        older.fp8_fp4_paged_mqa_logits_cleanable,
        older.fp8_fp4_mqa_logits_absolute,
    ]
