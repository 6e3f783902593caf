"""The slot mapping, written by a Triton kernel into the persistent buffer.

One program per real request writes the slots of its tokens; one more program
writes ``PAD_SLOT_ID`` from the real token count to the end of the buffer.
The mutants differ from the fixed kernel in one constant each: where the
padding starts, the position of a token, the page width.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.slot_mapping import PAD_SLOT_ID, SlotMappingInputs, SlotMappingOutputs


@triton.jit
def _slot_mapping_kernel(
    query_start_loc_ptr, seq_lens_ptr, req_state_rows_ptr, block_table_ptr, bt_row_stride,
    bt_width, out_ptr, pad_from, max_num_tokens,
    PAGE: tl.constexpr, POS_SHIFT: tl.constexpr, PAD_ID: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    if r == tl.num_programs(0) - 1:
        # Padding: every slot from ``pad_from`` to the end of the buffer.
        for i in range(pad_from, max_num_tokens, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(
                out_ptr + offs, tl.full((BLOCK,), PAD_ID, tl.int64), mask=offs < max_num_tokens
            )
        return
    start = tl.load(query_start_loc_ptr + r)
    end = tl.load(query_start_loc_ptr + r + 1)
    first = tl.load(seq_lens_ptr + r) - (end - start) + POS_SHIFT  # position of token 0
    row = tl.load(req_state_rows_ptr + r)
    for i in range(start, end, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < end
        pos = (first + offs - start).to(tl.int64)
        idx = pos // PAGE
        # Never read past the row, whatever a position says.
        page = tl.load(
            block_table_ptr + row * bt_row_stride + idx, mask=mask & (idx < bt_width), other=0
        ).to(tl.int64)
        tl.store(out_ptr + offs, page * PAGE + pos % PAGE, mask=mask)


def write_slot_mapping(
    inp: SlotMappingInputs,
    *,
    page: int | None = None,
    pos_shift: int = 0,
    pad_from: int | None = None,
) -> SlotMappingOutputs:
    """Fill ``inp.slot_mapping_buffer`` and return the view of its first ``T_pad`` slots.

    ``page`` (default: the cache's block size), ``pos_shift`` and ``pad_from``
    (default: the real token count) are the knobs the mutants turn.
    """
    buf, table = inp.slot_mapping_buffer, inp.block_table
    if buf.dtype != torch.int64 or buf.dim() != 1 or buf.stride(0) != 1:
        raise ValueError(
            f"slot_mapping_buffer: contiguous int64 [N], got {buf.dtype} {buf.stride()}"
        )
    if table.dtype != torch.int32 or table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(f"block_table: int32 [S, W] with unit column stride, got {table.dtype}")
    R = inp.num_reqs
    longest = int(inp.common.max_query_len) if R else 0
    tile = block(max(longest, buf.shape[0] - inp.num_tokens), cuda_cap=1024)
    _slot_mapping_kernel[(R + 1,)](
        inp.query_start_loc, inp.seq_lens, inp.req_state_rows, table, table.stride(0),
        table.shape[1], buf, inp.num_tokens if pad_from is None else pad_from, buf.shape[0],
        PAGE=inp.block_size if page is None else page, POS_SHIFT=pos_shift, PAD_ID=PAD_SLOT_ID,
        BLOCK=tile,
    )  # fmt: skip
    return SlotMappingOutputs(buf[: inp.num_tokens_padded], buf)


def slot_mapping(inp: SlotMappingInputs) -> SlotMappingOutputs:
    """Fixed: the real tokens' slots, then ``-1`` from ``T`` to the end of the buffer."""
    return write_slot_mapping(inp)


def mutant_stale_padding(inp: SlotMappingInputs) -> SlotMappingOutputs:
    """Padding written from ``T_pad`` on: the padded tokens ``T .. T_pad`` of a graph
    keep the stale slots of an earlier step, and their garbage K/V is written there."""
    return write_slot_mapping(inp, pad_from=inp.num_tokens_padded)


def mutant_position(inp: SlotMappingInputs) -> SlotMappingOutputs:
    """Off by one: token ``j`` placed at ``seq_len - q_len + j + 1``, one slot late."""
    return write_slot_mapping(inp, pos_shift=1)


def mutant_page_width(inp: SlotMappingInputs) -> SlotMappingOutputs:
    """Pages of twice the cache's block size (the allocator's block where the cache
    splits each into two kernel pages): wrong page index and offset."""
    return write_slot_mapping(inp, page=2 * inp.block_size)
