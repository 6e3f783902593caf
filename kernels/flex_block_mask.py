"""The FlexAttention block mask of a step, built by a Triton kernel into the persistent tables.

``flex_block_mask`` is the fixed builder of upstream #39353: persistent tables
of ``cdiv(max_num_batched_tokens, q_block_size)`` rows and ``q_block_size *
cdiv(max_model_len, block_size)`` columns, re-strided per step to the step's
``[rows, cols]``, the kernel storing straight into those views (no scratch, so
nothing is allocated under graph capture). ``mutant_capacity`` is the builder
before the fix, its tables sized from ``max_model_len`` alone.

The kernel relies on one invariant of the batch: requests own distinct pages
(no prefix sharing), so the pages of a query block, a union of block-table
prefixes of the requests it spans, are distinct without deduplication. They
come out request by request, each request's pages in logical order.
"""

from __future__ import annotations

import math

import torch
from attnfuzz.kernels._triton import add, block, tl, triton
from attnfuzz.reference.flex_block_mask import (
    FlexBlockMaskInputs,
    FlexBlockMaskOutputs,
    mask_shape,
    model_len_shape,
    persistent_shape,
)


@triton.jit
def _block_mask_kernel(
    qsl_ptr, seq_lens_ptr, table_ptr, table_row_stride, table_width,
    kv_indices_ptr, kv_num_blocks_ptr,
    num_reqs, num_tokens, num_rows, num_cols, block_size,
    Q_BLOCK: tl.constexpr, SPAN: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    # Query blocks g of this program: token rows [start, end).
    g = tl.program_id(0) * BLOCK_G + tl.arange(0, BLOCK_G)
    in_rows = g < num_rows
    start = g * Q_BLOCK
    end = tl.minimum(start + Q_BLOCK, num_tokens)

    # First request of each block: the number of requests that end at or before start.
    first = tl.full((BLOCK_G,), 0, tl.int32)
    for r0 in range(0, num_reqs, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        ends = tl.load(qsl_ptr + 1 + r, mask=r < num_reqs, other=2147483647)
        first += tl.reduce((ends[None, :] <= start[:, None]).to(tl.int32), 1, add)

    # Requests first + i, i < SPAN: every real request has a token, so a block of
    # Q_BLOCK rows spans at most Q_BLOCK of them. Row t of a request sits at
    # position seq_len - q_end + t; its last row in the block, hi - 1, attends
    # the most: pages 0 .. pos // block_size. Padding rows belong to no request.
    req = first[:, None] + tl.arange(0, SPAN)[None, :]  # [BLOCK_G, SPAN]
    real = in_rows[:, None] & (req < num_reqs)
    q_start = tl.load(qsl_ptr + req, mask=real, other=0)
    q_end = tl.load(qsl_ptr + req + 1, mask=real, other=0)
    seq_len = tl.load(seq_lens_ptr + req, mask=real, other=0)
    lo = tl.maximum(start[:, None], q_start)
    hi = tl.minimum(end[:, None], q_end)
    spans = real & (hi > lo)
    n_pages = tl.where(spans, (seq_len - q_end + hi - 1) // block_size + 1, 0)
    # A request holds no more pages than its table row maps (and no fewer than 0):
    # a seq_len past the row would read the next request's entries.
    n_pages = tl.minimum(tl.maximum(n_pages, 0), table_width)
    # Left-packed: request i's pages go to columns [offset_i, offset_i + n_pages_i).
    upto = tl.associative_scan(n_pages, 1, add)
    offset = upto - n_pages
    count = tl.reduce(n_pages, 1, add)
    tl.store(kv_num_blocks_ptr + g, count, mask=in_rows)

    row_base = g.to(tl.int64) * num_cols
    for c0 in range(0, num_cols, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        # [BLOCK_G, BLOCK_C, SPAN]: column c holds page c - offset_i of request i.
        page_no = c[None, :, None] - offset[:, None, :]
        mine = (page_no >= 0) & (c[None, :, None] < upto[:, None, :])
        page = tl.load(
            table_ptr + req[:, None, :].to(tl.int64) * table_row_stride + page_no,
            mask=mine,
            other=0,
        )
        ids = tl.reduce(page, 2, add)  # one request owns each column
        ids = tl.where(c[None, :] < count[:, None], ids, -1)
        tl.store(
            kv_indices_ptr + row_base[:, None] + c[None, :],
            ids,
            mask=in_rows[:, None] & (c < num_cols)[None, :],
        )


def build_block_mask(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_reqs: int,
    num_tokens: int,
    block_size: int,
    q_block_size: int,
    kv_indices: torch.Tensor,
    kv_num_blocks: torch.Tensor,
) -> None:
    """Fill ``kv_indices [rows, cols]`` and ``kv_num_blocks [rows]`` (contiguous) in place.

    Metadata with fewer entries than ``num_reqs`` (or counts than ``rows``) is
    refused from shapes alone (no host sync: the call is captured in graphs);
    a request's pages never come from past its table row.
    """
    rows, cols = kv_indices.shape
    if rows == 0:
        return
    for name, t, need in (
        ("query_start_loc", query_start_loc, num_reqs + 1),
        ("seq_lens", seq_lens, num_reqs),
        ("kv_num_blocks", kv_num_blocks, rows),
    ):
        if t.dim() != 1 or t.numel() < need or (need > 1 and t.stride(0) != 1):
            raise ValueError(
                f"build_block_mask: {name} must be a contiguous 1-D tensor of at least {need} "
                f"entries (got shape {list(t.shape)}, stride {list(t.stride())})"
            )
    if block_table.dim() != 2 or block_table.shape[0] < num_reqs:
        raise ValueError(
            f"build_block_mask: block_table must have a row per request ({num_reqs}), "
            f"got shape {list(block_table.shape)}"
        )
    assert kv_indices.is_contiguous() and kv_num_blocks.is_contiguous()
    assert kv_indices.dtype == kv_num_blocks.dtype == torch.int32
    assert block_table.stride(1) == 1
    span = max(q_block_size, 2)  # a tile dimension: a power of two, at least 2
    block_c = block(cols, interpret_cap=4096, cuda_cap=64)
    # Under the interpreter one program covers as many blocks as Triton's largest
    # tensor (2**20 elements) allows; on a GPU the tiles stay register-sized.
    block_g = block(rows, interpret_cap=max(1, 2**20 // (block_c * span)), cuda_cap=4, floor=1)
    block_r = block(num_reqs, interpret_cap=1024, cuda_cap=64)
    grid = (triton.cdiv(rows, block_g),)
    _block_mask_kernel[grid](
        query_start_loc, seq_lens, block_table, block_table.stride(0), block_table.shape[1],
        kv_indices, kv_num_blocks,
        num_reqs, num_tokens, rows, cols, block_size,
        Q_BLOCK=q_block_size, SPAN=span, BLOCK_G=block_g, BLOCK_C=block_c, BLOCK_R=block_r,
    )  # fmt: skip


def restride(persistent: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The first ``prod(shape)`` elements of a persistent tensor, viewed contiguous as ``shape``.

    A view, never a copy: a graph captured on one step's view replays on the
    same memory. A step that needs more than the persistent tensor holds cannot
    be served; the engine refuses it with this message.
    """
    need = math.prod(shape)
    if need > persistent.numel():
        raise RuntimeError(
            f"Fail to re-stride a persistent tensor of shape {list(persistent.shape)} "
            f"for a tensor of shape {list(shape)}"
        )
    return persistent.view(-1)[:need].view(shape)


def _build(inp: FlexBlockMaskInputs, table_shape: tuple[int, int]) -> FlexBlockMaskOutputs:
    """Re-stride the persistent tables (``table_shape`` and its rows) and build into them."""
    persistent = inp.persistent_kv_indices[: math.prod(table_shape)].view(table_shape)
    persistent_counts = inp.persistent_kv_num_blocks[: table_shape[0]]
    shape = mask_shape(inp.num_tokens, inp.max_seq_len, inp.block_size, inp.q_block_size)
    kv_indices = restride(persistent, shape)
    kv_num_blocks = restride(persistent_counts, shape[:1])
    build_block_mask(
        inp.query_start_loc, inp.seq_lens, inp.block_table, inp.num_reqs, inp.num_tokens,
        inp.block_size, inp.q_block_size, kv_indices, kv_num_blocks,
    )  # fmt: skip
    return FlexBlockMaskOutputs(kv_indices, kv_num_blocks)


def flex_block_mask(inp: FlexBlockMaskInputs) -> FlexBlockMaskOutputs:
    """Fixed (#39353): ``cdiv(max_num_batched_tokens, q)`` x ``q * cdiv(max_model_len, bs)``."""
    shape = persistent_shape(
        inp.max_num_batched_tokens, inp.max_model_len, inp.block_size, inp.q_block_size
    )
    return _build(inp, shape)


def mutant_capacity(inp: FlexBlockMaskInputs) -> FlexBlockMaskOutputs:
    """Before #39353: tables of ``[max_model_len, cdiv(max_model_len, bs)]`` (and
    ``max_model_len`` counts), too small once a step's mask outgrows them."""
    return _build(inp, model_len_shape(inp.max_model_len, inp.block_size))
