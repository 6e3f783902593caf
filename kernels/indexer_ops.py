"""Triton kernels of the sparse indexer's decode path, with thin torch glue.

Read top to bottom: pack, unpack, per-token context lengths, paged MQA logits,
per-row top-k, row write-back. Each kernel works on 2-D tiles of rows so that,
under the interpreter, a whole small problem is one program; compiled on a GPU
the tiles are register-sized and the grid supplies the parallelism. Every
dimension larger than its tile is looped over, so production sizes take the
same code.
"""

from __future__ import annotations

import math

import torch
from attnfuzz.kernels._triton import INTERPRET, add, block, tl, triton

# ---------------------------------------------------------------------------
# pack / unpack: token-major rows <-> [B, L] per-request rows
# ---------------------------------------------------------------------------


@triton.jit
def _pack_kernel(
    x_ptr, qsl_ptr, d_ptr, out_ptr, num_rows, L, F, num_tokens,
    BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    # Packed row r holds token j = r % L of request b = r // L, or zeros. A token row
    # outside x's num_tokens rows (offsets or lengths past the tokens) reads as zeros.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = rows < num_rows
    b, j = rows // L, rows % L
    d = tl.load(d_ptr + b, mask=in_rows, other=0)
    src = tl.load(qsl_ptr + b, mask=in_rows, other=0) + j
    real = in_rows & (j < d) & (src >= 0) & (src < num_tokens)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + tl.arange(0, BLOCK_F)
        in_cols = cols < F
        v = tl.load(
            x_ptr + src[:, None].to(tl.int64) * F + cols[None, :],
            mask=real[:, None] & in_cols[None, :],
            other=0,
        )
        tl.store(
            out_ptr + rows[:, None].to(tl.int64) * F + cols[None, :],
            v,
            mask=in_rows[:, None] & in_cols[None, :],
        )


@triton.jit
def _unpack_kernel(
    x_ptr, qsl_ptr, d_ptr, out_ptr, num_rows, L, F, num_tokens,
    BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr,
):  # fmt: skip
    # The inverse: only real tokens (j < d[b]) come back, at their token row; a token
    # row outside out's num_tokens rows (offsets or lengths past them) is dropped.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = rows < num_rows
    b, j = rows // L, rows % L
    d = tl.load(d_ptr + b, mask=in_rows, other=0)
    base = tl.load(qsl_ptr)
    dst = tl.load(qsl_ptr + b, mask=in_rows, other=0) - base + j
    real = in_rows & (j < d) & (dst >= 0) & (dst < num_tokens)
    for f0 in range(0, F, BLOCK_F):
        cols = f0 + tl.arange(0, BLOCK_F)
        mask = real[:, None] & (cols < F)[None, :]
        v = tl.load(x_ptr + rows[:, None].to(tl.int64) * F + cols[None, :], mask=mask)
        tl.store(out_ptr + dst[:, None].to(tl.int64) * F + cols[None, :], v, mask=mask)


def _check_vector(op: str, name: str, t: torch.Tensor, need: int, what: str) -> None:
    """``t`` is 1-D, contiguous and holds at least ``need`` entries: the kernels index
    it as a flat array, so a shorter (or strided, or expanded) one would be read past."""
    if t.dim() != 1 or t.numel() < need or (need > 1 and t.stride(0) != 1):
        raise ValueError(
            f"{op}: {name} must be a contiguous 1-D tensor of at least {need} entries "
            f"({what}); got shape {list(t.shape)}, stride {list(t.stride())}"
        )


def _row_tiles(num_rows: int, features: int) -> tuple[int, int]:
    block_f = block(features, interpret_cap=1024, cuda_cap=128)
    block_r = block(num_rows, interpret_cap=max(16, 65536 // block_f), cuda_cap=16)
    return block_r, block_f


def pack_seq(
    x: torch.Tensor, query_start_loc: torch.Tensor, d: torch.Tensor, max_len: int
) -> torch.Tensor:
    """``[N, *F]`` token rows to ``[B, max_len, *F]``, each request left-aligned, zero-padded.

    Token rows the metadata names outside ``x`` read as zeros.
    """
    B, features = d.numel(), math.prod(x.shape[1:])
    out = x.new_empty((B, max_len, *x.shape[1:]))
    num_rows = B * max_len
    if num_rows == 0:
        return out
    _check_vector("pack_seq", "d", d, B, f"one length per request: {B}")
    _check_vector("pack_seq", "query_start_loc", query_start_loc, B + 1, f"B + 1 = {B + 1}")
    block_r, block_f = _row_tiles(num_rows, features)
    grid = (triton.cdiv(num_rows, block_r),)
    _pack_kernel[grid](
        x.contiguous(), query_start_loc, d, out, num_rows, max_len, features, x.shape[0],
        BLOCK_R=block_r, BLOCK_F=block_f,
    )  # fmt: skip
    return out


def unpack_seq(
    x: torch.Tensor, query_start_loc: torch.Tensor, d: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """``[B, L, *F]`` back to ``[num_tokens, *F]`` token rows (``num_tokens = sum(d)``).

    Token rows the metadata names outside ``[0, num_tokens)`` are dropped.
    """
    B, L = x.shape[0], x.shape[1]
    features = math.prod(x.shape[2:])
    out = x.new_empty((num_tokens, *x.shape[2:]))
    num_rows = B * L
    if num_rows == 0 or num_tokens == 0:
        return out
    _check_vector("unpack_seq", "d", d, B, f"one length per request: {B}")
    _check_vector("unpack_seq", "query_start_loc", query_start_loc, B + 1, f"B + 1 = {B + 1}")
    block_r, block_f = _row_tiles(num_rows, features)
    grid = (triton.cdiv(num_rows, block_r),)
    _unpack_kernel[grid](
        x.contiguous(), query_start_loc, d, out, num_rows, L, features, num_tokens,
        BLOCK_R=block_r, BLOCK_F=block_f,
    )  # fmt: skip
    return out


# ---------------------------------------------------------------------------
# per-token context lengths
# ---------------------------------------------------------------------------


@triton.jit
def _context_lens_kernel(seq_lens_ptr, d_ptr, out_ptr, num_rows, L, BLOCK: tl.constexpr):
    # Token j of decode b sees seq_len - d + j + 1 keys; packed padding sees none.
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_rows = rows < num_rows
    b, j = rows // L, rows % L
    seq_len = tl.load(seq_lens_ptr + b, mask=in_rows, other=0)
    d = tl.load(d_ptr + b, mask=in_rows, other=0)
    ctx = tl.where(j < d, seq_len - d + j + 1, 0)
    tl.store(out_ptr + rows, ctx.to(tl.int32), mask=in_rows)


def decode_context_lens(
    seq_lens: torch.Tensor, d: torch.Tensor, max_len: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``[B, max_len]`` int32 context lengths; a view of ``out``'s head when given."""
    B = d.numel()
    num_rows = B * max_len
    if out is None:
        flat = torch.empty(num_rows, dtype=torch.int32, device=d.device)
    else:
        flat = out.view(-1)[:num_rows]
        if flat.numel() < num_rows or flat.dtype != torch.int32:
            raise ValueError(
                f"decode_context_lens: out must hold {num_rows} int32 lengths "
                f"(got {out.dtype} {list(out.shape)})"
            )
    if num_rows:
        _check_vector("decode_context_lens", "d", d, B, f"one length per request: {B}")
        _check_vector("decode_context_lens", "seq_lens", seq_lens, B, f"one per request: {B}")
        tile = block(num_rows, cuda_cap=256)
        grid = (triton.cdiv(num_rows, tile),)
        _context_lens_kernel[grid](seq_lens, d, flat, num_rows, max_len, BLOCK=tile)
    return flat.view(B, max_len)


# ---------------------------------------------------------------------------
# paged MQA logits
# ---------------------------------------------------------------------------


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr, w_ptr, kv_ptr, ctx_ptr, table_ptr, out_ptr,
    num_rows, L, H, D, M, num_blocks, block_size, table_stride, table_width,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    keys = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    in_rows = rows < num_rows
    b = rows // L
    ctx = tl.load(ctx_ptr + rows, mask=in_rows, other=0)
    # A key is visible below the row's context length, and only where the block table
    # maps it: a length past the table's width reads no entry of the next row.
    mapped = keys < table_width * block_size
    visible = in_rows[:, None] & (keys[None, :] < ctx[:, None]) & mapped[None, :]
    # Only visible keys read the block table: later entries may hold stale page ids.
    page = tl.load(
        table_ptr + b[:, None].to(tl.int64) * table_stride + keys[None, :] // block_size,
        mask=visible,
        other=0,
    )
    # A page id outside the cache is never dereferenced: its key is not visible.
    visible = visible & (page >= 0) & (page < num_blocks)
    slot = (page.to(tl.int64) * block_size + keys[None, :] % block_size) * D  # [R, N]
    acc = tl.full((BLOCK_R, BLOCK_N), 0, tl.float32)
    for h in range(H):
        score = tl.full((BLOCK_R, BLOCK_N), 0, tl.float32)
        for d0 in range(0, D, BLOCK_D):
            dims = d0 + tl.arange(0, BLOCK_D)
            in_d = dims < D
            q = tl.load(
                q_ptr + (rows[:, None].to(tl.int64) * H + h) * D + dims[None, :],
                mask=in_rows[:, None] & in_d[None, :],
                other=0.0,
            )
            k = tl.load(
                kv_ptr + slot[:, :, None] + dims[None, None, :],
                mask=visible[:, :, None] & in_d[None, None, :],
                other=0.0,
            )
            score += tl.reduce(q[:, None, :].to(tl.float32) * k.to(tl.float32), 2, add)
        w = tl.load(w_ptr + rows * H + h, mask=in_rows, other=0.0).to(tl.float32)
        acc += w[:, None] * tl.maximum(score, 0.0)
    acc = tl.where(visible, acc, float("-inf"))
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * M + keys[None, :],
        acc,
        mask=in_rows[:, None] & (keys < M)[None, :],
    )


def check_lengths(op: str, name: str, lengths: torch.Tensor, rows: int) -> None:
    """The contract of the real kernels: int32, contiguous, one length per row."""
    if lengths.dtype != torch.int32:
        raise ValueError(f"{op}: {name} must be int32 (got {lengths.dtype})")
    if not lengths.is_contiguous():
        raise ValueError(
            f"{op}: {name} must be contiguous (got shape {tuple(lengths.shape)}, "
            f"stride {tuple(lengths.stride())})"
        )
    if lengths.numel() != rows:
        raise ValueError(f"{op}: {name} has {lengths.numel()} elements for {rows} rows")


def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    """fp32 logits ``[B*L, max_model_len]``, ``-inf`` at and past each row's context length.

    ``q`` is ``[B, L, H, D]``, ``weights`` ``[B, L, H]``, ``kv_cache``
    ``[num_blocks, block_size, D]``, ``context_lens`` int32 ``[B, L]`` and
    ``block_table`` ``[B, W]``. Keys past a row's ``W * block_size`` mapped
    ones, or in pages outside the cache, are ``-inf`` like keys past its length.
    """
    B, L, H, D = q.shape
    check_lengths("paged_mqa_logits", "context_lens", context_lens, B * L)
    num_rows = B * L
    if tuple(weights.shape) != (B, L, H):
        raise ValueError(
            f"paged_mqa_logits: weights must be [{B}, {L}, {H}] (got {list(weights.shape)})"
        )
    if kv_cache.dim() != 3 or kv_cache.shape[2] != D:
        raise ValueError(
            f"paged_mqa_logits: kv_cache must be [num_blocks, block_size, {D}] "
            f"(got {list(kv_cache.shape)})"
        )
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.stride(1) != 1:
        raise ValueError(
            f"paged_mqa_logits: block_table must be [{B}, W] with contiguous rows, one row "
            f"per request (got shape {list(block_table.shape)}, "
            f"stride {list(block_table.stride())})"
        )
    out = torch.empty((num_rows, max_model_len), dtype=torch.float32, device=q.device)
    if num_rows == 0:
        return out
    block_d = block(D, interpret_cap=128, cuda_cap=32)
    block_n = block(max_model_len, interpret_cap=256, cuda_cap=32)
    block_r = block(num_rows, interpret_cap=max(16, 2**20 // (block_n * block_d)), cuda_cap=16)
    grid = (triton.cdiv(num_rows, block_r), triton.cdiv(max_model_len, block_n))
    _paged_mqa_logits_kernel[grid](
        q.contiguous(), weights.contiguous(), kv_cache.contiguous(), context_lens,
        block_table, out, num_rows, L, H, D, max_model_len, kv_cache.shape[0], kv_cache.shape[1],
        block_table.stride(0), block_table.shape[1],
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_D=block_d,
    )  # fmt: skip
    return out


# ---------------------------------------------------------------------------
# per-row top-k with per-row lengths
# ---------------------------------------------------------------------------


@triton.jit
def _order_key(x):
    # fp32 -> [0, 2**32) with the same order: flip the magnitude bits of negatives.
    bits = x.to(tl.int32, bitcast=True)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) + 2**31


@triton.jit
def _top_k_kernel(
    logits_ptr, lengths_ptr, out_ptr, num_rows, N, K, logits_stride, out_stride,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_TILE: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = rows < num_rows
    n_valid = tl.minimum(tl.maximum(tl.load(lengths_ptr + rows, mask=in_rows, other=0), 0), N)
    row_base = logits_ptr + rows[:, None].to(tl.int64) * logits_stride

    # 1. Radix select for t, the K-th largest key of each row: the largest t
    #    with count(key >= t) >= K (0 when a row has fewer than K candidates).
    #    Four bits a pass from the top: count the keys at or above each of the
    #    16 candidate digits, keep the largest digit that still holds K keys.
    digits = tl.arange(0, 16).to(tl.int64)
    t = tl.full((BLOCK_R,), 0, tl.int64)
    if ONE_TILE:  # the whole row fits one tile: read it once
        cols = tl.arange(0, BLOCK_N)
        valid = in_rows[:, None] & (cols[None, :] < n_valid[:, None])
        key = _order_key(tl.load(row_base + cols[None, :], mask=valid, other=0.0))
    for p in tl.static_range(8):
        shift = 28 - 4 * p
        cand = (t[:, None] + (digits[None, :] << shift))[:, :, None]  # [R, 16, 1]
        if ONE_TILE:
            at_or_above = valid[:, None, :] & (key[:, None, :] >= cand)
            count = tl.reduce(at_or_above.to(tl.int32), 2, add)
        else:
            count = tl.full((BLOCK_R, 16), 0, tl.int32)
            for n0 in range(0, N, BLOCK_N):
                cols = n0 + tl.arange(0, BLOCK_N)
                valid = in_rows[:, None] & (cols[None, :] < n_valid[:, None])
                key = _order_key(tl.load(row_base + cols[None, :], mask=valid, other=0.0))
                at_or_above = valid[:, None, :] & (key[:, None, :] >= cand)
                count += tl.reduce(at_or_above.to(tl.int32), 2, add)
        # count falls as the digit grows: the digits that hold K are 0 .. best.
        holding = tl.reduce((count >= K).to(tl.int64), 1, add)
        t += tl.maximum(holding - 1, 0) << shift
    threshold = t[:, None]

    # 2. Count keys above the threshold: they all go in, ties fill the rest.
    above = tl.full((BLOCK_R,), 0, tl.int32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        valid = in_rows[:, None] & (cols[None, :] < n_valid[:, None])
        key = _order_key(tl.load(row_base + cols[None, :], mask=valid, other=0.0))
        above += tl.reduce((valid & (key > threshold)).to(tl.int32), 1, add)

    # 3. Compact: a running offset per row plus a prefix sum within the tile.
    out_base = out_ptr + rows[:, None].to(tl.int64) * out_stride
    done_above = tl.full((BLOCK_R,), 0, tl.int32)
    done_ties = tl.full((BLOCK_R,), 0, tl.int32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        valid = in_rows[:, None] & (cols[None, :] < n_valid[:, None])
        key = _order_key(tl.load(row_base + cols[None, :], mask=valid, other=0.0))
        is_above = valid & (key > threshold)
        is_tie = valid & (key == threshold)
        pos = done_above[:, None] + tl.associative_scan(is_above.to(tl.int32), 1, add) - 1
        tl.store(out_base + pos, cols[None, :].broadcast_to(pos.shape), mask=is_above)
        pos = (
            above[:, None]
            + done_ties[:, None]
            + tl.associative_scan(is_tie.to(tl.int32), 1, add)
            - 1
        )
        tl.store(out_base + pos, cols[None, :].broadcast_to(pos.shape), mask=is_tie & (pos < K))
        done_above += tl.reduce(is_above.to(tl.int32), 1, add)
        done_ties += tl.reduce(is_tie.to(tl.int32), 1, add)

    # 4. Rows with fewer than K candidates: -1 in the remaining slots.
    chosen = tl.minimum(n_valid, K)
    for k0 in range(0, K, BLOCK_K):
        slots = k0 + tl.arange(0, BLOCK_K)
        fill = in_rows[:, None] & (slots[None, :] >= chosen[:, None]) & (slots[None, :] < K)
        tl.store(out_base + slots[None, :], tl.full((BLOCK_R, BLOCK_K), -1, tl.int32), mask=fill)


def top_k_per_row(
    logits: torch.Tensor, lengths: torch.Tensor, k: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """int32 ``[rows, k]``: indices of the ``k`` largest of ``logits[r, :lengths[r]]``.

    Order within a row is unspecified; ``-1`` fills rows with fewer than ``k``
    candidates. Written into ``out`` when given.
    """
    rows, N = logits.shape
    check_lengths("top_k_per_row", "lengths", lengths, rows)
    if N > 1 and logits.stride(1) != 1:
        raise ValueError(
            f"top_k_per_row: logits must have unit column stride (got {list(logits.stride())})"
        )
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    elif tuple(out.shape) != (rows, k) or out.dtype != torch.int32 or out.stride(1) != 1:
        raise ValueError(
            f"top_k_per_row: out must be int32 [{rows}, {k}] with unit column stride "
            f"(got {out.dtype} {list(out.shape)})"
        )
    if rows == 0:
        return out
    block_n = block(N, interpret_cap=4096, cuda_cap=1024)
    block_r = block(rows, interpret_cap=max(16, 2**18 // block_n), cuda_cap=1, floor=1)
    block_k = block(k, interpret_cap=4096, cuda_cap=1024)
    grid = (triton.cdiv(rows, block_r),)
    _top_k_kernel[grid](
        logits, lengths, out, rows, N, k, logits.stride(0), out.stride(0),
        BLOCK_R=block_r, BLOCK_N=block_n, BLOCK_K=block_k, ONE_TILE=N <= block_n,
    )  # fmt: skip
    return out


# ---------------------------------------------------------------------------
# write-back into the shared buffer
# ---------------------------------------------------------------------------


@triton.jit
def _write_rows_kernel(
    src_ptr, dst_ptr, num_rows, K, dst_stride, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = (rows < num_rows)[:, None] & (cols < K)[None, :]
        v = tl.load(src_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], mask=mask)
        tl.store(dst_ptr + rows[:, None].to(tl.int64) * dst_stride + cols[None, :], v, mask=mask)


def write_rows(buffer: torch.Tensor, src: torch.Tensor) -> None:
    """``buffer[:n, :k] = src`` for ``src`` of shape ``[n, k]``, by a Triton copy."""
    n, k = src.shape
    if buffer.dim() != 2 or n > buffer.shape[0] or k != buffer.shape[1]:
        raise RuntimeError(
            f"write_rows: cannot write [{n}, {k}] rows into a buffer of shape {list(buffer.shape)}"
        )
    if k > 1 and buffer.stride(1) != 1:
        raise RuntimeError(
            f"write_rows: the buffer must have unit column stride (got {list(buffer.stride())})"
        )
    if n == 0:
        return
    block_k = block(k, interpret_cap=4096, cuda_cap=256)
    block_r = block(n, interpret_cap=max(16, 2**18 // block_k), cuda_cap=16)
    grid = (triton.cdiv(n, block_r),)
    _write_rows_kernel[grid](
        src.contiguous(), buffer, n, k, buffer.stride(0), BLOCK_R=block_r, BLOCK_K=block_k
    )


__all__ = [
    "INTERPRET",
    "check_lengths",
    "decode_context_lens",
    "pack_seq",
    "paged_mqa_logits",
    "top_k_per_row",
    "unpack_seq",
    "write_rows",
]
