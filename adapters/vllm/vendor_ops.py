"""Pure-torch stand-ins for the vendor operations the sparse indexer's glue calls.

vLLM's indexer glue (``vllm/model_executor/layers/sparse_attn_indexer.py`` and its
backend variants) is Python; the kernels it calls are DeepGEMM, vLLM's compiled
``torch.ops._C`` ops, AITER or XPU kernels, none of which run on this machine. Each
function here models one of them *as its contract is written upstream* (shapes,
dtypes, rows it reads and writes, what it leaves uncleaned, what it refuses), so
that the glue can be driven unchanged. :func:`registered` swaps them in for one
call only: it sets the attribute the glue looks up and restores it afterwards.

The fp8 indexer K cache is modelled byte for byte in the layout vLLM writes
(:func:`indexer_k_quant_and_cache`): per page, ``block_size * head_dim`` fp8
values, then ``block_size`` fp32 scales. With the small-integer data of
attnfuzz and power-of-two (ue8m0) scales every dequantized value is exact, so
logits are exact in fp32 whatever the summation order.

Ties in the top-k stand-ins go to the lowest index (a stable sort), a choice the
contract leaves free; the prefill stand-in must make it, so that the rows the
prefill branch rewrites come out identical to the prefill result a case holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from attnfuzz.harness.blame import ContractError  # a refusal of the vendor's contract: a finding

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
SCALE_BYTES = 4  # one fp32 (or packed ue8m0) scale per cached token
UNCLEANED = 1.0e30  # what the logits stand-ins leave past a row's context ("not cleaned")


def _require(ok: bool, op: str, what: str) -> None:
    if not ok:
        raise ContractError(f"{op}: {what}")


# -- the fp8 indexer K cache ---------------------------------------------------------


def _ue8m0_scale(amax: torch.Tensor) -> torch.Tensor:
    scale = torch.clamp(amax, min=1e-4) / FP8_MAX
    return torch.exp2(torch.ceil(torch.log2(scale)))


def _page_bytes(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, int]:
    """``[num_blocks, block_size * (D + 4)]`` bytes of a ``[num_blocks, block_size, (1,) D + 4]``
    uint8 cache (a view), and where a page's scales start."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.reshape(num_blocks, -1)
    _require(
        flat.shape[1] == block_size * (head_dim + SCALE_BYTES),
        "indexer K cache",
        f"a page holds {flat.shape[1]} bytes, not block_size * (head_dim + 4) = "
        f"{block_size * (head_dim + SCALE_BYTES)}",
    )
    return flat, block_size * head_dim


def _cache_parts(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Values ``[num_blocks, block_size, D]`` (fp8, a view) and scales
    ``[num_blocks, block_size]`` (fp32, a copy: a page's scales need not sit on a
    4-byte boundary when ``block_size * D`` is odd)."""
    flat, start = _page_bytes(kv_cache, head_dim)
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    values = flat[:, :start].view(FP8).view(num_blocks, block_size, head_dim)
    scales = flat[:, start:].contiguous().view(torch.float32).view(num_blocks, block_size)
    return values, scales


def indexer_k_quant_and_cache(
    k: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    quant_block_size: int,
    kv_cache_dtype: str,
) -> None:
    """``vllm._custom_ops.indexer_k_quant_and_cache`` (CUDA ``_C_cache_ops``).

    Contract (vLLM 0.33.0: ``_custom_ops.indexer_k_quant_and_cache``; the layout as
    ``v1/attention/ops/rocm_aiter_mla_sparse.py:indexer_k_quant_and_cache_triton``
    writes it with block_size 1 and as ``utils/deep_gemm.py:fp8_fp4_paged_mqa_logits``
    documents it): ``k`` is ``[T, D]``, ``kv_cache`` uint8 ``[num_blocks, block_size,
    D + 4]``; token ``t`` with ``slot = slot_mapping[t] >= 0`` is quantized with one
    scale ``max(amax, 1e-4) / 448`` (rounded up to a power of two for ``"ue8m0"``)
    and stored at page ``slot // block_size``, row ``slot % block_size``: its fp8
    values in the page's first ``block_size * D`` bytes, its fp32 scale in the
    ``block_size * 4`` bytes after them. Negative slots (padding) are skipped.
    Refuses a non-uint8 cache, a quant block other than ``D`` (one scale a token).
    """
    op = "indexer_k_quant_and_cache"
    head_dim = k.shape[-1]
    _require(kv_cache.dtype == torch.uint8, op, f"kv_cache is {kv_cache.dtype}, not uint8")
    _require(quant_block_size == head_dim, op, f"quant_block_size {quant_block_size} != {head_dim}")
    _require(slot_mapping.shape[0] <= k.shape[0], op, "more slots than tokens")
    flat, start = _page_bytes(kv_cache, head_dim)
    block_size = kv_cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0  # padding tokens are skipped
    rows, slots = k[: slots.shape[0]][keep].float(), slots[keep]
    amax = rows.abs().amax(dim=-1)
    if kv_cache_dtype == "ue8m0":
        scale = _ue8m0_scale(amax)
    else:
        scale = amax.clamp(min=1e-4) / FP8_MAX
    page, pos = slots // block_size, slots % block_size
    values = (rows / scale.unsqueeze(-1)).to(FP8).view(torch.uint8)  # [n, D]
    at = (pos * head_dim).unsqueeze(-1) + torch.arange(head_dim, device=k.device)
    flat[page.unsqueeze(-1), at] = values
    at = (start + pos * SCALE_BYTES).unsqueeze(-1) + torch.arange(SCALE_BYTES, device=k.device)
    flat[page.unsqueeze(-1), at] = scale.to(torch.float32).unsqueeze(-1).view(torch.uint8)


def quantized_cache(pages: torch.Tensor) -> torch.Tensor:
    """The uint8 cache ``[num_blocks, block_size, D + 4]`` holding ``pages`` (float
    ``[num_blocks, block_size, D]``), written slot by slot through
    :func:`indexer_k_quant_and_cache` with ue8m0 scales, as the engine caches keys."""
    num_blocks, block_size, head_dim = pages.shape
    cache = torch.zeros(
        (num_blocks, block_size, head_dim + SCALE_BYTES), dtype=torch.uint8, device=pages.device
    )
    slots = torch.arange(num_blocks * block_size, device=pages.device)
    indexer_k_quant_and_cache(pages.reshape(-1, head_dim), cache, slots, head_dim, "ue8m0")
    return cache


def dequantized_pages(kv_cache: torch.Tensor, head_dim: int) -> torch.Tensor:
    """fp32 ``[num_blocks, block_size, D]``: each cached value times its token's scale."""
    values, scales = _cache_parts(kv_cache, head_dim)
    return values.float() * scales.unsqueeze(-1)


# -- logits ------------------------------------------------------------------------


def _weighted_relu(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[rows, N]``: ``sum_h w[r, h] * relu(q[r, h] . key[n])`` for q ``[rows, H, D]``,
    keys ``[N, D]``, weights ``[rows, H]`` (one matmul: exact on small integers)."""
    rows, heads, dim = q.shape
    dots = (keys @ q.float().reshape(rows * heads, dim).T).view(-1, rows, heads).relu()
    return (dots * weights.float()).sum(-1).T


def _row_context_lens(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """One visible length per logits row from ``[B, next_n]`` per-row lengths, or from
    ``[B]`` / ``[B, 1]`` per-sequence lengths (row ``j`` of a sequence of length ``n``
    sees ``n - next_n + j + 1``): vLLM 0.33.0 ``indexer_topk.py:SparseIndexerTopk._row_ends``."""
    flat = context_lens.reshape(-1)
    if flat.numel() == batch * next_n:
        return flat.to(torch.int64)
    _require(flat.numel() == batch, "context_lens", f"{flat.numel()} lengths for {batch} rows")
    offsets = torch.arange(next_n, device=flat.device)
    return (flat.to(torch.int64).unsqueeze(1) - next_n + 1 + offsets).clamp(min=0).reshape(-1)


def _paged_logits(
    op: str,
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    row_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    batch, next_n, heads, head_dim = q.shape
    _require(q.dtype == FP8, op, f"q is {q.dtype}, not {FP8}")
    _require(kv_cache.dtype == torch.uint8, op, f"kv_cache is {kv_cache.dtype}, not uint8")
    _require(weights.dtype == torch.float32, op, f"weights are {weights.dtype}, not float32")
    _require(
        tuple(weights.shape) == (batch * next_n, heads),
        op,
        f"weights {list(weights.shape)} for {batch * next_n} rows of {heads} heads",
    )
    _require(block_tables.dtype == torch.int32, op, "block_tables are not int32")
    _require(block_tables.shape[0] >= batch, op, f"{block_tables.shape[0]} table rows < {batch}")
    pages = dequantized_pages(kv_cache.squeeze(-2), head_dim)
    block_size = pages.shape[1]
    logits = torch.full(
        (batch * next_n, max_model_len), UNCLEANED, dtype=torch.float32, device=q.device
    )
    for b in range(batch):
        lens = row_lens[b * next_n : (b + 1) * next_n]
        n = int(lens.max())
        _require(n <= max_model_len, op, f"sequence {b}: context {n} > max_model_len")
        if n == 0:
            continue
        # Only the pages the longest row of the sequence needs are dereferenced.
        ids = block_tables[b, : -(-n // block_size)].to(torch.int64)
        keys = pages[ids].reshape(-1, head_dim)[:n]  # [n, D]
        scores = _weighted_relu(q[b], keys, weights[b * next_n : (b + 1) * next_n])
        cols = torch.arange(n, device=q.device)
        block = logits[b * next_n : (b + 1) * next_n, :n]
        block.copy_(torch.where(cols < lens.unsqueeze(1), scores, block))
    return logits


def fp8_fp4_paged_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's paged MQA logits, FP8 path (``vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits``).

    Contract (vLLM 0.33.0 ``utils/deep_gemm.py:fp8_fp4_paged_mqa_logits`` docstring;
    ``sparse_attn_indexer.py`` decode branch: "deep_gemm fp8_fp4_paged_mqa_logits
    requires 2D context_lens"): ``q = (values [B, next_n, H, D] fp8, None)``,
    ``kv_cache`` uint8 ``[num_blocks, block_size, 1, D + 4]``, ``weights`` fp32
    ``[B * next_n, H]`` (row ``b * next_n + j`` weighs query ``(b, j)``),
    ``context_lens`` int32 2-D, ``[B, next_n]`` per row or ``[B, 1]`` per sequence,
    ``block_tables`` int32 ``[B, W]``. Returns fp32 ``[B * next_n, max_model_len]``;
    columns past each row's context length are *not cleaned* (here: 1e30).
    Refuses MX scales (SM100) and the varlen ``indices`` form this stand-in does not model.
    """
    op = "fp8_fp4_paged_mqa_logits"
    values, q_scale = q
    _require(q_scale is None, op, "MX q scales (SM100) are not modelled")
    _require(indices is None, op, "the varlen form (indices) is not modelled")
    _require(context_lens.dtype == torch.int32, op, "context_lens are not int32")
    _require(context_lens.dim() == 2, op, f"context_lens are {context_lens.dim()}-D, not 2-D")
    _require(context_lens.shape[0] == values.shape[0], op, "one context_lens row per sequence")
    batch, next_n = values.shape[:2]
    rows = _row_context_lens(context_lens, batch, next_n)
    return _paged_logits(op, values, kv_cache, weights, rows, block_tables, max_model_len)


def rocm_fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
    *,
    compress_ratio: int = 1,
) -> torch.Tensor:
    """AITER's paged MQA logits (``rocm_fp8_paged_mqa_logits`` of
    ``v1/attention/ops/rocm_aiter_mla_sparse.py``).

    Contract (its docstring, vLLM 0.33.0): ``q_fp8`` ``[B, next_n, H, D]`` fp8,
    ``kv_cache_fp8`` uint8 ``[num_blocks, block_size, 1, D + 4]``, ``weights`` fp32
    ``[B * next_n, H]``, ``context_lens`` int32 ``[B]`` or ``[B, next_n]``; returns
    fp32 ``[B * next_n, max_model_len]``. The cache is read in the plain layout of
    :func:`indexer_k_quant_and_cache` (AITER's pre-shuffled tiles are a byte order
    the glue never touches). Refuses KV compression (``compress_ratio > 1``).
    """
    op = "rocm_fp8_paged_mqa_logits"
    _require(compress_ratio == 1, op, "KV compression is not modelled")
    _require(context_lens.dtype == torch.int32, op, "context_lens are not int32")
    batch, next_n = q_fp8.shape[:2]
    rows = _row_context_lens(context_lens, batch, next_n)
    return _paged_logits(op, q_fp8, kv_cache_fp8, weights, rows, block_tables, max_model_len)


def xpu_fp8_paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    """``torch.ops.vllm.xpu_fp8_paged_mqa_logits`` as the XPU branch of
    ``sparse_attn_indexer`` calls it (vLLM 0.33.0).

    Contract: the glue hands one length per *sequence* (``seq_lens[:, -1]`` of the
    2-D table, 1-D int32 ``[B]``) and the kernel derives row ``j``'s context as
    ``seq_len - next_n + j + 1``, the 1-D convention of the decode top-k
    (``indexer_topk.py:SparseIndexerTopk._row_ends``); shapes otherwise as
    :func:`fp8_fp4_paged_mqa_logits`. Refuses 2-D lengths.
    """
    op = "xpu_fp8_paged_mqa_logits"
    _require(seq_lens.dim() == 1, op, f"seq_lens are {seq_lens.dim()}-D, not 1-D")
    _require(seq_lens.dtype == torch.int32, op, "seq_lens are not int32")
    batch, next_n = q.shape[:2]
    rows = _row_context_lens(seq_lens, batch, next_n)
    return _paged_logits(op, q, kv_cache, weights, rows, block_table, max_model_len)


def fp8_fp4_mqa_logits(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    max_seqlen_k: int,
) -> torch.Tensor:
    """DeepGEMM's ragged MQA logits of the prefill branch
    (``vllm.utils.deep_gemm.fp8_fp4_mqa_logits``).

    Contract (its docstring, vLLM 0.33.0): ``q = (values [M, H, D] fp8, None)``,
    ``kv = (k [N, D] fp8, scales [N] fp32)``, ``weights`` fp32 ``[M, H]``, int32
    ``cu_seqlen_ks`` / ``cu_seqlen_ke`` ``[M]``. Returns compressed fp32 logits
    ``[M, max_seqlen_k]``: row ``i`` holds keys ``[ks[i], ke[i])`` from column 0;
    the tail is not cleaned. Refuses a row longer than ``max_seqlen_k``.
    """
    op = "fp8_fp4_mqa_logits"
    values, q_scale = q
    keys, scales = kv
    _require(q_scale is None, op, "MX q scales (SM100) are not modelled")
    _require(values.dtype == FP8 and keys.dtype == FP8, op, "q and k must be fp8")
    _require(scales.dtype == torch.float32, op, f"k scales are {scales.dtype}, not float32")
    _require(cu_seqlen_ks.dtype == torch.int32 and cu_seqlen_ke.dtype == torch.int32, op, "int32")
    m = values.shape[0]
    _require(cu_seqlen_ks.shape[0] == m and cu_seqlen_ke.shape[0] == m, op, "one bound per row")
    ks, ke = cu_seqlen_ks.to(torch.int64), cu_seqlen_ke.to(torch.int64)
    _require(bool(((0 <= ks) & (ks <= ke) & (ke <= keys.shape[0])).all()), op, "keys outside k")
    _require(bool((ke - ks <= max_seqlen_k).all()), op, "a row is longer than max_seqlen_k")
    out = torch.full((m, max_seqlen_k), UNCLEANED, dtype=torch.float32, device=values.device)
    if m == 0 or keys.shape[0] == 0:
        return out
    k = keys.float() * scales.unsqueeze(-1)
    scores = _weighted_relu(values, k, weights)  # [M, N]
    # Row i's keys [ks, ke) from column 0.
    cols = torch.arange(max_seqlen_k, device=values.device)
    src = (ks.unsqueeze(1) + cols).clamp(max=keys.shape[0] - 1)
    shifted = torch.gather(scores, 1, src)
    return torch.where(cols < (ke - ks).unsqueeze(1), shifted, out)


def rocm_fp8_mqa_logits(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
) -> torch.Tensor:
    """AITER's ragged MQA logits (``rocm_fp8_mqa_logits`` of
    ``v1/attention/ops/rocm_aiter_mla_sparse.py``).

    Contract (its docstring, vLLM 0.33.0): ``q`` fp8 ``[M, H, D]``, ``kv = (k [N, D]
    fp8, scales [N] or [N, 1] fp32)``, ``weights`` fp32 ``[M, H]``; returns fp32
    ``[M, N]`` over the *absolute* key columns: row ``i`` is valid on
    ``[ks[i], ke[i])``, the rest is not cleaned (``clean_logits=False``).
    """
    op = "rocm_fp8_mqa_logits"
    keys, scales = kv
    scales = scales.reshape(-1)
    _require(q.dtype == FP8 and keys.dtype == FP8, op, "q and k must be fp8")
    _require(scales.dtype == torch.float32, op, f"k scales are {scales.dtype}, not float32")
    ks, ke = cu_seqlen_ks.to(torch.int64), cu_seqlen_ke.to(torch.int64)
    _require(bool(((0 <= ks) & (ks <= ke) & (ke <= keys.shape[0])).all()), op, "keys outside k")
    scores = _weighted_relu(q, keys.float() * scales.unsqueeze(-1), weights)
    return in_key_columns(scores, ks, ke, UNCLEANED)


def in_key_columns(
    logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, fill: float
) -> torch.Tensor:
    """``[M, N]`` logits in absolute key columns: row ``i`` keeps ``[ks[i], ke[i])``,
    ``fill`` elsewhere (what a ragged MQA logits contract leaves outside a row's keys)."""
    cols = torch.arange(logits.shape[1], device=logits.device)
    valid = (cols >= ks.to(torch.int64).unsqueeze(1)) & (cols < ke.to(torch.int64).unsqueeze(1))
    return torch.where(valid, logits, torch.full_like(logits, fill))


def xpu_fp8_mqa_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    k_scale: torch.Tensor,
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
) -> torch.Tensor:
    """``torch.ops.vllm.xpu_fp8_mqa_logits`` as the XPU branch of ``sparse_attn_indexer``'s
    prefill calls it (vLLM 0.33.0): the same contract as :func:`rocm_fp8_mqa_logits`
    (absolute columns; the glue hands the top-k ``row_starts = cu_seqlen_ks``)."""
    return rocm_fp8_mqa_logits(q, (k, k_scale), weights, cu_seqlen_ks, cu_seqlen_ke)


def cp_gather_indexer_k_quant_cache_triton(
    k_cache: torch.Tensor,
    k_fp8: torch.Tensor,
    k_fp8_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlen: torch.Tensor,
    token_to_seq: torch.Tensor,
    block_tile_size: int = 16,
    head_tile_size: int = 16,
    cache_layout: str | None = None,
) -> None:
    """ROCm's gather of a prefill chunk's keys (``cp_gather_indexer_k_quant_cache_triton``
    of ``v1/attention/ops/rocm_aiter_mla_sparse.py``): the contract of
    :func:`cp_gather_indexer_k_quant_cache`, on the plain cache layout (the tile
    shuffle AITER reads is a byte order the glue never touches)."""
    cp_gather_indexer_k_quant_cache(k_cache, k_fp8, k_fp8_scale, block_table, cu_seqlen)


def cp_gather_indexer_k_quant_cache(
    kv_cache: torch.Tensor,
    dst_k: torch.Tensor,
    dst_scale: torch.Tensor,
    block_table: torch.Tensor,
    cu_seq_lens: torch.Tensor,
) -> None:
    """``vllm._custom_ops.cp_gather_indexer_k_quant_cache``: a prefill chunk's keys, contiguous.

    Contract (vLLM 0.33.0 ``_custom_ops.py``; the prefill branch of
    ``sparse_attn_indexer``): for request ``r`` of the chunk (row ``r`` of
    ``block_table``) and its ``n = cu_seq_lens[r+1] - cu_seq_lens[r]`` tokens,
    token ``t`` is copied from page ``block_table[r, t // block_size]``, row
    ``t % block_size`` of the cache (layout of :func:`indexer_k_quant_and_cache`)
    to ``dst_k[cu_seq_lens[r] + t]`` (fp8 ``[N, D]``) and its 4 scale bytes to
    ``dst_scale[cu_seq_lens[r] + t]`` (uint8 ``[N, 4]``). Nothing else is written.
    """
    op = "cp_gather_indexer_k_quant_cache"
    head_dim = dst_k.shape[-1]
    _require(dst_k.dtype == FP8, op, f"dst_k is {dst_k.dtype}, not fp8")
    _require(dst_scale.dtype == torch.uint8 and dst_scale.shape[-1] == 4, op, "dst_scale")
    values, scales = _cache_parts(kv_cache, head_dim)
    block_size = kv_cache.shape[1]
    bounds = cu_seq_lens.tolist()
    _require(len(bounds) - 1 <= block_table.shape[0], op, "fewer table rows than requests")
    _require(bounds[-1] <= dst_k.shape[0], op, "dst_k is shorter than the chunk")
    for r in range(len(bounds) - 1):
        for t in range(bounds[r + 1] - bounds[r]):
            page = int(block_table[r, t // block_size])
            dst_k[bounds[r] + t] = values[page, t % block_size]
            dst_scale[bounds[r] + t] = scales[page, t % block_size].reshape(1).view(torch.uint8)


CPU_INDEX_HEAD_DIM = 128  # the CPU logits kernel's compile-time head dim (kIndexHeadDim)
CPU_TOPK = 512  # the CPU top-k's fixed width (kC4Topk)


def fp8_paged_mqa_logits_cpu(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    block_size: int,
    max_seq_len: int,
) -> torch.Tensor:
    """``vllm._custom_ops.fp8_paged_mqa_logits_cpu`` (``torch.ops._C``, AVX512 CPU build).

    Contract (vLLM ``csrc/cpu/sgl-kernels/paged_mqa_logits.cpp``, the kernel
    vLLM 0.33.0's wrapper calls; its fake in ``_custom_ops.py`` gives the shape):
    ``q_fp8`` fp8 ``[batch, heads, 128]`` (the head dim is a compile-time 128),
    ``kvcache_fp8`` uint8 2-D ``[pages, bytes]`` contiguous within a page, at least
    ``block_size * 132`` bytes a page (values, then fp32 scales at byte
    ``block_size * 128``), ``weight`` fp32 ``[batch, heads]``, ``seq_lens`` 1-D
    int32/int64 ``[batch]``, ``page_table`` 2-D int32/int64 ``[batch, pages]``
    (exactly one row per query row), ``block_size > 0``, ``max_seq_len >= 0``;
    ``q_fp8``, ``weight``, ``seq_lens`` and ``page_table`` contiguous.
    Returns fp32 ``[batch, max_seq_len]``: column ``t`` of row ``b`` is written for
    ``t < min(seq_lens[b], max_seq_len)`` (token ``t`` read from page
    ``page_table[b, t // block_size]``), every other column is left uninitialized
    (here: :data:`UNCLEANED`). Refuses what its ``TORCH_CHECK``s refuse.
    """
    op = "fp8_paged_mqa_logits_cpu"
    for name, t in (("q_fp8", q_fp8), ("weight", weight), ("seq_lens", seq_lens)):
        _require(t.is_contiguous(), op, f"{name} must be contiguous")
    _require(page_table.is_contiguous(), op, "page_table must be contiguous")
    _require(
        q_fp8.dim() == 3 and q_fp8.dtype == FP8, op, "q_fp8 must be a 3-D fp8 [batch, heads, 128]"
    )
    _require(q_fp8.shape[2] == CPU_INDEX_HEAD_DIM, op, f"head_dim {q_fp8.shape[2]} != 128")
    _require(
        kvcache_fp8.dim() == 2 and kvcache_fp8.dtype == torch.uint8,
        op,
        "kvcache_fp8 must be a 2-D uint8 [num_pages, bytes_per_page]",
    )
    _require(
        kvcache_fp8.stride(1) == 1 and kvcache_fp8.stride(0) >= kvcache_fp8.shape[1],
        op,
        "kvcache_fp8 must be contiguous within a page",
    )
    _require(block_size > 0, op, "block_size must be positive")
    head_dim = CPU_INDEX_HEAD_DIM
    _require(
        kvcache_fp8.shape[1] >= block_size * (head_dim + SCALE_BYTES),
        op,
        "page byte width too small for block_size",
    )
    batch, heads = q_fp8.shape[:2]
    _require(
        weight.dim() == 2
        and weight.dtype == torch.float32
        and tuple(weight.shape) == (batch, heads),
        op,
        "weight must be a 2-D fp32 [batch, heads]",
    )
    _require(seq_lens.dim() == 1 and seq_lens.shape[0] == batch, op, "seq_lens must be 1-D [batch]")
    _require(
        page_table.dim() == 2 and page_table.shape[0] == batch,
        op,
        "page_table must be 2-D [batch, pages]",
    )
    _require(seq_lens.dtype in (torch.int32, torch.int64), op, "seq_lens must be int32 or int64")
    _require(
        page_table.dtype in (torch.int32, torch.int64), op, "page_table must be int32 or int64"
    )
    _require(max_seq_len >= 0, op, "max_seq_len must be non-negative")
    page_bytes = block_size * (head_dim + SCALE_BYTES)
    cache = kvcache_fp8[:, :page_bytes].reshape(-1, block_size, head_dim + SCALE_BYTES)
    # The kernel computes columns t < max_seq_len only: a longer row is cut there.
    lens = seq_lens.to(torch.int64).clamp(min=0, max=max_seq_len)
    return _paged_logits(
        op,
        q_fp8.unsqueeze(1),
        cache.unsqueeze(-2),
        weight,
        lens,
        page_table.to(torch.int32),
        max_seq_len,
    )


def topk_transform_512_cpu(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    page_tables: torch.Tensor,
    out_page_indices: torch.Tensor,
    page_size: int,
    out_raw_indices: torch.Tensor | None = None,
) -> None:
    """``vllm._custom_ops.topk_transform_512_cpu`` (``torch.ops._C``, AVX512 CPU build).

    Contract (vLLM ``csrc/cpu/sgl-kernels/topk.cpp``: ``topk_transform_512_cpu``, the
    kernel vLLM 0.33.0's wrapper calls): ``scores`` fp32 2-D ``[B, S]``, ``seq_lens``
    1-D int32/int64 ``[B]``, ``page_tables`` 2-D int32/int64 ``[B, pages]``,
    ``out_page_indices`` int32 2-D ``[B, >= 512]`` and ``out_raw_indices`` (when
    given) of the same sizes, every tensor contiguous; ``page_size`` a positive
    power of two. Row ``b`` sees ``n = clamp(seq_lens[b], 0, S)`` columns: when
    ``n <= 512`` its raw indices are ``0 .. n-1`` in order (the scores are not
    read), else the positions of its 512 largest scores (an earlier index wins a
    tie; the kernel leaves them in heap order, here in score order: a set either
    way); ``-1`` fills the rest of the 512. Columns ``0 .. 511`` of
    ``out_page_indices`` get each raw ``r`` as the cache slot
    ``page_tables[b, r // page_size] * page_size + r % page_size`` (``-1`` stays
    ``-1``), those of ``out_raw_indices`` the raw ``r``; nothing else is written.
    Refuses what its checks refuse.
    """
    op = "topk_transform_512_cpu"
    for name, t in (("scores", scores), ("seq_lens", seq_lens), ("page_tables", page_tables)):
        _require(t.is_contiguous(), op, f"{name} must be contiguous")
    _require(scores.dim() == 2 and scores.dtype == torch.float32, op, "scores: 2-D float32")
    rows, width = scores.shape
    _require(seq_lens.dim() == 1 and seq_lens.shape[0] == rows, op, "seq_lens must be 1-D [B]")
    _require(seq_lens.dtype in (torch.int32, torch.int64), op, "seq_lens must be int32 or int64")
    _require(
        page_tables.dim() == 2
        and page_tables.shape[0] == rows
        and page_tables.dtype in (torch.int32, torch.int64),
        op,
        "page_tables must be a 2-D int32 or int64 [B, pages]",
    )
    _require(page_size > 0 and page_size & (page_size - 1) == 0, op, "page_size: power of 2")
    _require(
        out_page_indices.dim() == 2
        and out_page_indices.shape[0] == rows
        and out_page_indices.shape[1] >= CPU_TOPK
        and out_page_indices.dtype == torch.int32
        and out_page_indices.is_contiguous(),
        op,
        f"out_page_indices must be a contiguous int32 [{rows}, >= 512], "
        f"not {list(out_page_indices.shape)}",
    )
    if out_raw_indices is not None:
        _require(
            out_raw_indices.shape == out_page_indices.shape
            and out_raw_indices.dtype == torch.int32
            and out_raw_indices.is_contiguous(),
            op,
            "out_raw_indices must be a contiguous int32 of out_page_indices' shape",
        )
    raw = torch.full((rows, CPU_TOPK), -1, dtype=torch.int32)
    for b, n in enumerate(seq_lens.to(torch.int64).clamp(min=0, max=width).tolist()):
        if n <= CPU_TOPK:
            raw[b, :n] = torch.arange(n, dtype=torch.int32)
        else:
            order = torch.sort(scores[b, :n], descending=True, stable=True).indices[:CPU_TOPK]
            raw[b] = order.to(torch.int32)
    pos = raw.clamp(min=0).to(torch.int64)
    pages = torch.gather(page_tables.to(torch.int64), 1, pos // page_size)
    slots = torch.where(raw >= 0, pages * page_size + pos % page_size, -1)
    out_page_indices[:, :CPU_TOPK] = slots.to(torch.int32)
    if out_raw_indices is not None:
        out_raw_indices[:, :CPU_TOPK] = raw


# -- top-k -------------------------------------------------------------------------


def _top_k_rows(
    op: str,
    logits: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    topk: int,
) -> None:
    """Row ``i``: indices (minus ``starts[i]``) of the ``topk`` largest of
    ``logits[i, starts[i]:ends[i]]``, lowest index first among equals, ``-1`` after."""
    _require(logits.dtype == torch.float32, op, f"logits are {logits.dtype}, not float32")
    _require(indices.dtype == torch.int32, op, f"indices are {indices.dtype}, not int32")
    _require(indices.shape[0] >= num_rows, op, f"{indices.shape[0]} index rows < {num_rows}")
    _require(indices.shape[1] >= topk, op, f"index rows of {indices.shape[1]} < topk {topk}")
    _require(logits.shape[0] >= num_rows, op, f"{logits.shape[0]} logits rows < {num_rows}")
    for i in range(num_rows):
        lo, hi = int(starts[i]), int(ends[i])
        _require(0 <= lo <= hi <= logits.shape[1], op, f"row {i}: [{lo}, {hi}) outside the row")
        order = torch.sort(logits[i, lo:hi], descending=True, stable=True).indices[:topk]
        row = torch.full((topk,), -1, dtype=torch.int32, device=indices.device)
        row[: order.numel()] = order.to(torch.int32)
        indices[i, :topk] = row


def top_k_per_row_decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """``torch.ops._C.top_k_per_row_decode`` (``vllm._custom_ops.top_k_per_row_decode``).

    Contract (vLLM 0.33.0: signature in ``_custom_ops.py``; row lengths as
    ``indexer_topk.py:SparseIndexerTopk._row_ends`` derives them "the same way as the
    other decode top-k kernels"): int32 ``seq_lens`` of ``num_rows`` elements are
    per-row lengths; otherwise one per sequence of ``next_n`` rows, row ``i``
    seeing ``seq_lens[i // next_n] - next_n + i % next_n + 1`` (at least 0). Row
    ``i < num_rows`` of ``indices`` gets the ``topk_tokens`` best columns below its
    length, ``-1`` after; no other row is written, no column at or past a row's
    length is read. Refuses non-fp32 logits, non-int32 indices or lengths, and
    shapes it would index past.
    """
    op = "top_k_per_row_decode"
    _require(seq_lens.dtype == torch.int32, op, f"seq_lens are {seq_lens.dtype}, not int32")
    _require((stride0, stride1) == tuple(logits.stride()), op, "strides differ from the logits'")
    flat = seq_lens.reshape(-1)
    if flat.numel() != num_rows:
        _require(
            flat.numel() * next_n >= num_rows, op, f"{flat.numel()} lengths for {num_rows} rows"
        )
        flat = _row_context_lens(flat[: -(-num_rows // next_n)], -(-num_rows // next_n), next_n)
    ends = flat[:num_rows]
    _top_k_rows(op, logits, torch.zeros_like(ends), ends, indices, num_rows, topk_tokens)


def top_k_per_row_prefill(
    logits: torch.Tensor,
    row_starts: torch.Tensor,
    row_ends: torch.Tensor,
    indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """``torch.ops._C.top_k_per_row_prefill`` (``vllm._custom_ops.top_k_per_row_prefill``).

    Contract (vLLM 0.33.0 ``_custom_ops.py`` signature; the prefill branch of
    ``sparse_attn_indexer``): row ``i < num_rows`` selects among columns
    ``[row_starts[i], row_ends[i])`` of ``logits`` and writes their positions
    relative to ``row_starts[i]`` to ``indices[i]``, ``-1`` after. Refuses as
    :func:`top_k_per_row_decode`.
    """
    op = "top_k_per_row_prefill"
    _require(row_starts.dtype == torch.int32 and row_ends.dtype == torch.int32, op, "int32")
    _require((stride0, stride1) == tuple(logits.stride()), op, "strides differ from the logits'")
    _top_k_rows(op, logits, row_starts, row_ends, indices, num_rows, topk_tokens)


# -- registration for one call -------------------------------------------------------


_MISSING = object()


@contextmanager
def registered(*patches: tuple[Any, str, Any]) -> Iterator[None]:
    """Set ``obj.name = stand_in`` for each ``(obj, name, stand_in)`` while the block
    runs; restore each attribute (or remove it, if it was absent) afterwards."""
    with ExitStack() as stack:
        for obj, name, stand_in in patches:
            old = getattr(obj, name, _MISSING)
            setattr(obj, name, stand_in)
            stack.callback(_restore, obj, name, old)
        yield


def _restore(obj: Any, name: str, old: Any) -> None:
    if old is _MISSING:
        delattr(obj, name)
    else:
        setattr(obj, name, old)
