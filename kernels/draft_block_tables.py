"""The drafter's per-group attention: metadata from the unpadded step, varlen paged attention.

``flash_attn_varlen_paged`` models the consumer, FlashAttention's varlen
forward with a paged KV cache: it checks its arguments as FlashAttention does
(``batch_size``, the rows of ``cu_seqlens_q`` less one, must equal
``batch_size_k``, the rows of the page table) and computes attention with an
online softmax in one Triton kernel. ``draft_attention`` is the fixed drafter
(upstream #43982); ``mutant_padded_table`` re-creates the bug, differing from
it in the one line the bug lived in.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import add, block, tl, triton
from attnfuzz.reference.draft_block_tables import (
    DraftBlockTablesInputs,
    DraftBlockTablesOutputs,
    GroupAttentionMetadata,
)

# The combiners of ``tl.max`` and ``tl.min``, for the same reason as ``_triton.add``:
# compiled they are what ``tl.max``/``tl.min`` emit, interpreted they go straight to NumPy.
_max = tl.standard._elementwise_max
_min = tl.standard._elementwise_min


# ``batch_size`` is never specialized: Triton 3.6 fails to compile the kernel for a
# constant batch of 1 (a layout-conversion pass gives up), later releases do not.
@triton.jit(do_not_specialize=["batch_size"])
def _varlen_paged_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, table_ptr,
    batch_size, total_q, H, D, num_blocks, block_size, table_stride, window, scale,
    SLIDING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    # A tile is BLOCK_H heads x BLOCK_M query tokens, as the rows of 2-D tiles: row r is
    # head r // BLOCK_M of token r % BLOCK_M. Columns of head dims are (head, dim) pairs
    # likewise, so that one 2-D dot scores every head: the queries sit in their own
    # head's columns (zeros elsewhere) against the keys of all heads. q and out are
    # [total_q, H, D]; the caches [num_blocks, block_size, H, D].
    # Keys are indexed flat over the batch (key j of sequence b is cu_seqlens_k[b] + j),
    # so that one tile can hold the tokens of several sequences.
    rows = tl.arange(0, BLOCK_H * BLOCK_M)
    tokens = tl.program_id(0) * BLOCK_M + rows % BLOCK_M
    head = tl.program_id(1) * BLOCK_H + rows // BLOCK_M
    in_rows = (tokens < total_q) & (head < H)
    cols = tl.arange(0, BLOCK_H * BLOCK_D)
    col_head = tl.program_id(1) * BLOCK_H + cols // BLOCK_D
    dim = cols % BLOCK_D
    in_cols = (col_head < H) & (dim < D)
    head_dim = col_head * D + dim  # where (head, dim) lives in a token's or a slot's H * D

    # The sequence of each token: how many sequences end at or before it.
    seq = tl.full((BLOCK_H * BLOCK_M,), 0, tl.int32)
    for b0 in range(0, batch_size, BLOCK_B):
        seqs = b0 + tl.arange(0, BLOCK_B)
        ends = tl.load(cu_seqlens_q_ptr + 1 + seqs, mask=seqs < batch_size, other=2**31 - 1)
        seq += tl.reduce((ends[None, :] <= tokens[:, None]).to(tl.int32), 1, add)
    # Only rows the metadata describes are computed: token t of sequence seq < batch_size
    # with cu_seqlens_q[seq] <= t < cu_seqlens_q[seq + 1]. Rows of q past cu_seqlens_q[-1]
    # (seq == batch_size) belong to no sequence: they keep the output's initial value, and
    # no entry past cu_seqlens_q[batch_size] or cu_seqlens_k[batch_size] is ever loaded.
    in_rows = in_rows & (seq < batch_size)
    seq = tl.where(in_rows, seq, 0)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_end = tl.load(cu_seqlens_q_ptr + seq + 1)
    in_rows = in_rows & (q_start <= tokens) & (tokens < q_end)
    k_start = tl.load(cu_seqlens_k_ptr + seq)
    # The new tokens are the last ones of the sequence: token t sits at position
    # seq_len - (q_end - t), i.e. at flat key k_end - (q_end - t), and sees the flat
    # keys first .. last (first > last on rows past the end: they see nothing).
    last = tl.load(cu_seqlens_k_ptr + seq + 1) - q_end + tokens
    first = k_start
    if SLIDING:
        first = tl.maximum(last - window + 1, k_start)
    first = tl.where(in_rows, first, 2**31 - 1)
    last = tl.where(in_rows, last, -1)
    k_lo = tl.reduce(first, 0, _min)
    k_hi = tl.reduce(last, 0, _max) + 1

    # Queries in their own head's columns; the output is read back from the same places.
    own = in_rows[:, None] & in_cols[None, :] & (col_head[None, :] == head[:, None])
    q_offsets = (tokens[:, None].to(tl.int64) * H + head[:, None]) * D + dim[None, :]
    q = tl.load(q_ptr + q_offsets, mask=own, other=0.0).to(tl.float32) * scale

    # Online softmax; a finite floor for m keeps rows without a visible key yet NaN-free.
    m_i = tl.full((BLOCK_H * BLOCK_M,), -1.0e30, tl.float32)
    l_i = tl.full((BLOCK_H * BLOCK_M,), 0, tl.float32)
    acc = tl.full((BLOCK_H * BLOCK_M, BLOCK_H * BLOCK_D), 0, tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_N):
        keys = k0 + tl.arange(0, BLOCK_N)
        visible = (keys[None, :] >= first[:, None]) & (keys[None, :] <= last[:, None])
        # Per key, the sequence (plus one; 0: no row sees it) and where it starts. Only
        # keys some row sees read the page table: other entries may be freed or stale.
        key_seq = tl.reduce(tl.where(visible, seq[:, None] + 1, 0), 0, _max) - 1
        needed = key_seq >= 0
        key_pos = keys - tl.reduce(tl.where(visible, k_start[:, None], 0), 0, _max)
        page = tl.load(
            table_ptr + key_seq * table_stride + key_pos // block_size, mask=needed, other=0
        )
        # A page id outside the cache is never dereferenced: its key is not attended.
        in_cache = needed & (page >= 0) & (page < num_blocks)
        slot = (page.to(tl.int64) * block_size + key_pos % block_size) * H * D  # [BLOCK_N]
        # Masked lanes must read 0, not garbage: 0 * NaN would poison the dots.
        kv_mask = in_cols[:, None] & in_cache[None, :]
        k = tl.load(k_ptr + slot[None, :] + head_dim[:, None], mask=kv_mask, other=0.0)
        s = tl.dot(q, k.to(tl.float32), input_precision="ieee")  # [rows, BLOCK_N]
        s = tl.where(visible & in_cache[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, _max))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_ptr + slot[:, None] + head_dim[None, :], mask=tl.trans(kv_mask), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        l_i = l_i * alpha + tl.reduce(p, 1, add)
        m_i = m_new
    # With consistent metadata every token sees at least itself: l_i > 0 on real rows.
    # A row that sees no key (seqused_k shorter than its queries, or pages outside the
    # cache) is 0, as in FlashAttention, not 0 / 0.
    l_i = tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(out_ptr + q_offsets, acc / l_i[:, None], mask=own)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def check_varlen_arguments(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    sliding_window: int | None = None,
) -> None:
    """Refuse the arguments of :func:`flash_attn_varlen_paged` as FlashAttention does
    (``RuntimeError``): dtypes, shapes, and ``batch_size == batch_size_k``."""
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("seqused_k", seqused_k),
                    ("block_table", block_table)):  # fmt: skip
        _check(t.dtype == torch.int32, f"{name} must have dtype int32 (got {t.dtype})")
    _check(
        cu_seqlens_q.dim() == 1 and cu_seqlens_q.numel() >= 1 and cu_seqlens_q.is_contiguous(),
        f"cu_seqlens_q must be a contiguous 1-D tensor of batch_size + 1 offsets "
        f"(got shape {list(cu_seqlens_q.shape)}, stride {list(cu_seqlens_q.stride())})",
    )
    _check(block_table.dim() == 2, f"block_table must be 2-D (got {list(block_table.shape)})")
    _check(q.dim() == 3, f"q must be [total_q, H, D] (got {list(q.shape)})")
    batch_size = cu_seqlens_q.numel() - 1
    batch_size_k = block_table.shape[0]
    _check(
        batch_size == batch_size_k,
        f"batch_size must be equal to batch_size_k (cu_seqlens_q has {batch_size + 1} rows: "
        f"batch_size {batch_size}; block_table has {batch_size_k} rows)",
    )
    _check(
        tuple(seqused_k.shape) == (batch_size,),
        f"seqused_k must have shape ({batch_size},) (got {list(seqused_k.shape)})",
    )
    total_q, H, D = q.shape
    _check(
        key_cache.shape == value_cache.shape and tuple(key_cache.shape[2:]) == (H, D),
        f"caches must be [num_blocks, block_size, {H}, {D}] "
        f"(got {list(key_cache.shape)} and {list(value_cache.shape)})",
    )
    _check(block_table.stride(1) == 1, "block_table must have contiguous last dimension")
    _check(sliding_window is None or sliding_window >= 1, "sliding_window must be >= 1")


def flash_attn_varlen_paged(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    max_seqlen_k: int,
    softmax_scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Causal varlen attention over a paged KV cache, fp32 ``[total_q, H, D]``.

    ``q`` is ``[total_q, H, D]`` (``total_q = cu_seqlens_q[-1]``), the caches
    ``[num_blocks, block_size, H, D]``, ``cu_seqlens_q`` int32 ``[batch_size + 1]``,
    ``seqused_k`` int32 ``[batch_size]`` and ``block_table`` int32
    ``[batch_size_k, W]``. Sequence ``b``'s queries are its last tokens; with
    ``sliding_window`` a query sees itself and the ``sliding_window - 1``
    positions before it. Arguments are checked as FlashAttention checks them.

    Inconsistent metadata is never read past its bounds: rows of ``q`` that
    ``cu_seqlens_q`` does not describe (``q`` padded past ``cu_seqlens_q[-1]``)
    are left 0, a sequence sees at most the keys its table row maps, and page
    ids outside the cache are not attended.
    """
    check_varlen_arguments(
        q, key_cache, value_cache, cu_seqlens_q, seqused_k, block_table, sliding_window
    )
    total_q, H, D = q.shape
    batch_size = cu_seqlens_q.numel() - 1

    # Zeros: rows of q that cu_seqlens_q does not describe are never written.
    out = torch.zeros_like(q, dtype=torch.float32)
    num_blocks, block_size, width = key_cache.shape[0], key_cache.shape[1], block_table.shape[1]
    if total_q == 0 or batch_size == 0 or H == 0:
        return out
    # Flat key offsets of the sequences (the kernel indexes keys over the whole batch).
    # A sequence holds at most the width * block_size keys its table row maps (and no
    # fewer than 0): a longer seqused_k would walk past the row, and the flat key range
    # a tile loops over stays bounded by the tables, whatever seqused_k holds. On
    # consistent metadata the clamp changes nothing.
    used_k = seqused_k.clamp(0, min(width * block_size, 2**31 - 1))
    cu_seqlens_k = torch.zeros(batch_size + 1, dtype=torch.int32, device=q.device)
    torch.cumsum(used_k, 0, dtype=torch.int32, out=cu_seqlens_k[1:])
    # Under the interpreter one tile holds every head and token (a program costs
    # Python time); on a GPU tiles are register-sized and the grid does the rest.
    block_d = block(D, interpret_cap=1024, cuda_cap=256)
    block_h = block(H, interpret_cap=1024, cuda_cap=1, floor=1)
    block_m = block(total_q, interpret_cap=1024, cuda_cap=16)
    keys = batch_size * max_seqlen_k  # an upper bound of the flat keys a tile sees
    cap = max(16, 2**18 // (block_h * block_m))  # elements of a [rows, BLOCK_N] score tile
    block_n = block(keys, interpret_cap=cap, cuda_cap=32)
    block_b = block(batch_size, interpret_cap=1024, cuda_cap=64)
    grid = (triton.cdiv(total_q, block_m), triton.cdiv(H, block_h))
    _varlen_paged_attention_kernel[grid](
        q.contiguous(), key_cache.contiguous(), value_cache.contiguous(), out,
        cu_seqlens_q, cu_seqlens_k, block_table,
        batch_size, total_q, H, D, num_blocks, block_size, block_table.stride(0),
        sliding_window or 0, softmax_scale,
        SLIDING=sliding_window is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_B=block_b,
    )  # fmt: skip
    return out


def group_metadata(
    inp: DraftBlockTablesInputs, block_table: torch.Tensor
) -> GroupAttentionMetadata:
    """One group's metadata: the unpadded common fields and the given table."""
    R = inp.num_real_reqs
    return GroupAttentionMetadata(inp.query_start_loc[: R + 1], inp.seq_lens[:R], block_table)


def attend(
    inp: DraftBlockTablesInputs, metadata: list[GroupAttentionMetadata]
) -> DraftBlockTablesOutputs:
    """Each group's attention over its metadata, on the step's real tokens."""
    q = inp.q[: inp.num_real_tokens]
    out = [
        flash_attn_varlen_paged(
            q,
            group.key_cache,
            group.value_cache,
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_table,
            inp.max_seq_len,
            inp.softmax_scale,
            group.sliding_window,
        )
        for group, meta in zip(inp.groups, metadata, strict=True)
    ]
    return DraftBlockTablesOutputs(metadata, out)


def draft_attention(inp: DraftBlockTablesInputs) -> DraftBlockTablesOutputs:
    """Fixed (#43982): each group's stored table sliced to the ``R`` real requests."""
    R = inp.num_real_reqs
    return attend(inp, [group_metadata(inp, g.block_table[:R]) for g in inp.groups])


def mutant_padded_table(inp: DraftBlockTablesInputs) -> DraftBlockTablesOutputs:
    """#43982: each group's stored ``[R_pad, W_g]`` table attached unsliced."""
    return attend(inp, [group_metadata(inp, g.block_table) for g in inp.groups])


__all__ = [
    "attend",
    "check_varlen_arguments",
    "draft_attention",
    "flash_attn_varlen_paged",
    "group_metadata",
    "mutant_padded_table",
]
