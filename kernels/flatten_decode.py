"""The indexer's flattened decode metadata, written by one Triton kernel.

One program per decode writes its tokens' context lengths, block-table rows
and decode lengths, and its own decode length; one more program handles the
rest: the padded tokens of a graph (no keys, decode length 1, first page
``PAD_PAGE``) and the zeroed tail of the context lengths. The mutants differ
in one constant each.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.batch import PAD_PAGE
from attnfuzz.reference.flatten_decode import FlattenDecodeInputs, FlattenDecodeOutputs


@triton.jit
def _flatten_decode_kernel(
    seq_lens_ptr, query_start_loc_ptr, block_table_ptr, bt_stride, ctx_ptr, expanded_ptr,
    expanded_stride, decode_lens_ptr, per_req_ptr, width, num_decode_tokens, max_num_tokens,
    max_decode_len,
    RIGHT_ALIGN_ON_MAX: tl.constexpr, ROW_BY_MAX: tl.constexpr, ZERO_PADDED: tl.constexpr,
    PAD_PAGE_ID: tl.constexpr, BLOCK: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    last = tl.num_programs(0) - 1
    if b == last:
        # Past the decodes' own tokens: padded tokens of a graph, then the tail.
        real_end = tl.load(query_start_loc_ptr + last)  # sum(d)
        zero_from = real_end if ZERO_PADDED else num_decode_tokens
        for i in range(zero_from, max_num_tokens, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(ctx_ptr + offs, tl.full((BLOCK,), 0, tl.int32), mask=offs < max_num_tokens)
        for i in range(real_end, num_decode_tokens, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            mask = offs < num_decode_tokens
            tl.store(decode_lens_ptr + offs, tl.full((BLOCK,), 1, tl.int32), mask=mask)
            pad = tl.full((BLOCK,), PAD_PAGE_ID, tl.int32)
            tl.store(expanded_ptr + offs.to(tl.int64) * expanded_stride, pad, mask=mask)
        return
    start = tl.load(query_start_loc_ptr + b)
    end = tl.load(query_start_loc_ptr + b + 1)
    d = end - start
    tl.store(per_req_ptr + b, d)
    seq_len = tl.load(seq_lens_ptr + b)
    cols = tl.arange(0, BLOCK_W)
    for i in range(start, end, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < end
        j = offs - start
        if RIGHT_ALIGN_ON_MAX:  # the native layout's formula, exact only when d == L
            ctx = tl.maximum(seq_len - max_decode_len + j + 1, 0)
        else:
            ctx = seq_len - d + j + 1
        tl.store(ctx_ptr + offs, ctx.to(tl.int32), mask=mask)
        tl.store(decode_lens_ptr + offs, tl.full((BLOCK,), 1, tl.int32), mask=mask)
        if ROW_BY_MAX:  # the uniform layout's request index, exact only when d == L
            src = offs // max_decode_len
        else:
            src = tl.full((BLOCK,), 0, tl.int32) + b
        for c in range(0, width, BLOCK_W):
            col = c + cols
            m2 = mask[:, None] & (col[None, :] < width)
            rows = tl.load(
                block_table_ptr + src.to(tl.int64)[:, None] * bt_stride + col[None, :], mask=m2
            )
            dst = expanded_ptr + offs.to(tl.int64)[:, None] * expanded_stride + col[None, :]
            tl.store(dst, rows, mask=m2)


def write_flatten_decode(
    inp: FlattenDecodeInputs,
    *,
    right_align_on_max: bool = False,
    row_by_max: bool = False,
    zero_padded: bool = True,
) -> FlattenDecodeOutputs:
    """Fill the buffers of ``inp`` and return the step's views of them."""
    bufs = inp.buffers
    B, N_d = inp.num_decodes, inp.num_decode_tokens
    if B == 0:  # no decode metadata; the buffers stay as they are
        return FlattenDecodeOutputs(None, None, None, None, False, bufs)
    flat = {
        "context_lens": bufs.context_lens,
        "decode_lens": bufs.decode_lens,
        "per_req_decode_lens": bufs.per_req_decode_lens,
    }
    for name, t in flat.items():
        if t.dtype != torch.int32 or t.dim() != 1 or t.stride(0) != 1:
            raise ValueError(f"{name}: contiguous int32 [M], got {t.dtype} {t.stride()}")
    if bufs.block_table.dtype != torch.int32 or bufs.block_table.stride(1) != 1:
        raise ValueError("block_table buffer: int32 [M, W] with unit column stride")
    max_tokens = bufs.context_lens.shape[0]
    width = inp.block_table.shape[1]
    L = inp.split.max_decode_len
    tile = block(max(L, max_tokens - inp.num_real_decode_tokens), cuda_cap=256)
    _flatten_decode_kernel[(B + 1,)](
        inp.seq_lens, inp.query_start_loc, inp.block_table, inp.block_table.stride(0),
        bufs.context_lens, bufs.block_table, bufs.block_table.stride(0), bufs.decode_lens,
        bufs.per_req_decode_lens, width, N_d, max_tokens, L,
        RIGHT_ALIGN_ON_MAX=right_align_on_max, ROW_BY_MAX=row_by_max, ZERO_PADDED=zero_padded,
        PAD_PAGE_ID=PAD_PAGE, BLOCK=tile, BLOCK_W=block(width, interpret_cap=1024, cuda_cap=64),
    )  # fmt: skip
    return FlattenDecodeOutputs(
        context_lens=bufs.context_lens[:N_d].unsqueeze(-1),
        block_table=bufs.block_table[:N_d],
        decode_lens=bufs.decode_lens[:N_d],
        per_req_decode_lens=bufs.per_req_decode_lens[:B],
        requires_padding=False,
        buffers=bufs,
    )


def flatten_decode(inp: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """Fixed: per decode token its own causal end and its decode's block-table row."""
    return write_flatten_decode(inp)


def mutant_right_aligned(inp: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """Context lengths right-aligned on ``max_decode_len`` (``seq_len - L + j + 1``),
    not on the decode's own length: the short decodes of a ragged step see too few keys."""
    return write_flatten_decode(inp, right_align_on_max=True)


def mutant_wrong_row(inp: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """Token ``i`` takes the block-table row ``i // max_decode_len`` (the uniform
    layout's request): ragged decodes read another request's pages."""
    return write_flatten_decode(inp, row_by_max=True)


def mutant_padding_not_zeroed(inp: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """The padded tokens' context lengths, ``sum(d) .. N_d``, keep stale values."""
    return write_flatten_decode(inp, zero_padded=False)
