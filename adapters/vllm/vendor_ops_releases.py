"""Stand-ins for the vendor contracts that releases before 0.33.0 call.

The sparse indexer's glue calls the same vendor kernels in every supported
release, but not under one contract: DeepGEMM's wrappers in
``vllm/utils/deep_gemm.py`` changed their signature *and* their output layout,
and 0.21.0's ROCm glue selects its top-k with ``torch.topk`` on logits it
expects cleaned to ``-inf``. A stand-in of one contract driven by a release
that calls the other gives a false mismatch (a prefill row read in the wrong
columns), so each contract has its own stand-in here, and the adapter picks
the one whose signature the installed glue calls
(:mod:`attnfuzz.adapters.vllm.indexer_decode`). Each is built from the 0.33.0
stand-ins of :mod:`.vendor_ops` (same cache layout, same exact small-integer
arithmetic) and differs only where its contract does.

Contracts, as each release's ``vllm/utils/deep_gemm.py`` declares them:

- ``fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)``
  (0.21.0 to 0.32.0): "Logits tensor of shape [M, N]", over the *absolute* key
  columns of the chunk (the glue's top-k reads row ``i`` on
  ``[cu_seqlen_ks[i], cu_seqlen_ke[i])``); 0.33.0's takes ``max_seqlen_k`` and
  returns rows compressed from column 0 instead.
- ``fp8_fp4_paged_mqa_logits(..., max_model_len, clean_logits, indices=None)``
  (0.21.0 to 0.32.0; ``indices`` from 0.28.0): the layout of 0.33.0's, with
  ``clean_logits`` ("Whether to clean the unfilled logits into -inf").
- 0.21.0 ``v1/attention/ops/rocm_aiter_mla_sparse.py``: ``rocm_fp8_paged_mqa_logits``
  and ``rocm_fp8_mqa_logits`` return logits that are ``-inf`` outside each row's
  keys (the wrappers fill their output with ``-inf`` before AITER writes it; the
  torch fallbacks mask to ``-inf``), which ``_topk_indices_torch`` relies on.
"""

from __future__ import annotations

import torch
from attnfuzz.adapters.vllm import vendor_ops as vendor

_require = vendor._require


def _clean_past(logits: torch.Tensor, row_lens: torch.Tensor) -> torch.Tensor:
    """``logits`` with every column at or past its row's length set to ``-inf``."""
    cols = torch.arange(logits.shape[1], device=logits.device)
    return logits.masked_fill(cols >= row_lens.to(logits.device).unsqueeze(1), float("-inf"))


def fp8_fp4_paged_mqa_logits_cleanable(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
    clean_logits: bool,
    indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """DeepGEMM's paged MQA logits as 0.21.0 to 0.32.0 declare them
    (``utils/deep_gemm.py:fp8_fp4_paged_mqa_logits`` with ``clean_logits``).

    Contract: that of :func:`.vendor_ops.fp8_fp4_paged_mqa_logits` (0.33.0: fp32
    ``[B * next_n, max_model_len]``, 2-D context lengths, one row per query), and
    with ``clean_logits`` every column past a row's context length is ``-inf``;
    without it those columns are not cleaned (here: ``UNCLEANED``). The glue of
    every release passes ``clean_logits=False``.
    """
    values = q[0]
    out = vendor.fp8_fp4_paged_mqa_logits(
        q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len, indices
    )
    if not clean_logits:
        return out
    batch, next_n = values.shape[:2]
    return _clean_past(out, vendor._row_context_lens(context_lens, batch, next_n))


def fp8_fp4_mqa_logits_absolute(
    q: tuple[torch.Tensor, torch.Tensor | None],
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    clean_logits: bool,
) -> torch.Tensor:
    """DeepGEMM's ragged MQA logits as 0.21.0 to 0.32.0 declare them
    (``utils/deep_gemm.py:fp8_fp4_mqa_logits`` with ``clean_logits``).

    Contract (its docstring): ``q = (values [M, H, D] fp8, None)``, ``kv = (k [N, D]
    fp8, scales [N] fp32)``, ``weights`` fp32 ``[M, H]``, int32 ``cu_seqlen_ks`` /
    ``cu_seqlen_ke`` ``[M]``; returns fp32 ``[M, N]``: row ``i`` holds key ``n``
    in column ``n`` for ``ks[i] <= n < ke[i]`` (absolute columns: the glue reads
    the row with ``row_starts = cu_seqlen_ks``); the rest is ``-inf`` with
    ``clean_logits``, else not cleaned. Refuses MX q scales, non-fp8 operands,
    bounds outside ``k``.
    """
    op = "fp8_fp4_mqa_logits"
    values, q_scale = q
    keys, scales = kv
    _require(q_scale is None, op, "MX q scales (SM100) are not modelled")
    _require(values.dtype == vendor.FP8 and keys.dtype == vendor.FP8, op, "q and k must be fp8")
    _require(scales.dtype == torch.float32, op, f"k scales are {scales.dtype}, not float32")
    _require(cu_seqlen_ks.dtype == torch.int32 and cu_seqlen_ke.dtype == torch.int32, op, "int32")
    m = values.shape[0]
    _require(cu_seqlen_ks.shape[0] == m and cu_seqlen_ke.shape[0] == m, op, "one bound per row")
    ks, ke = cu_seqlen_ks.to(torch.int64), cu_seqlen_ke.to(torch.int64)
    _require(bool(((0 <= ks) & (ks <= ke) & (ke <= keys.shape[0])).all()), op, "keys outside k")
    fill = float("-inf") if clean_logits else vendor.UNCLEANED
    scores = vendor._weighted_relu(values, keys.float() * scales.unsqueeze(-1), weights)
    return vendor.in_key_columns(scores, ks, ke, fill)


def rocm_fp8_paged_mqa_logits_cleaned(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    schedule_metadata: torch.Tensor,
    max_model_len: int,
) -> torch.Tensor:
    """AITER's paged MQA logits as 0.21.0's ``rocm_fp8_paged_mqa_logits`` returns them.

    Contract: that of :func:`.vendor_ops.rocm_fp8_paged_mqa_logits`, with every
    column past a row's context length ``-inf`` (0.21.0 fills the output with
    ``-inf`` before the kernel writes the visible columns, and its torch
    fallback ``fp8_paged_mqa_logits_torch`` does the same).
    """
    out = vendor.rocm_fp8_paged_mqa_logits(
        q_fp8, kv_cache_fp8, weights, context_lens, block_tables, schedule_metadata, max_model_len
    )
    batch, next_n = q_fp8.shape[:2]
    return _clean_past(out, vendor._row_context_lens(context_lens, batch, next_n))


def rocm_fp8_mqa_logits_cleaned(
    q: torch.Tensor,
    kv: tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
) -> torch.Tensor:
    """AITER's ragged MQA logits as 0.21.0's ``rocm_fp8_mqa_logits`` returns them.

    Contract: that of :func:`.vendor_ops.rocm_fp8_mqa_logits` (``[M, N]``, absolute
    key columns), ``-inf`` outside ``[ks[i], ke[i])`` as the torch fallback
    ``fp8_mqa_logits_torch`` masks them ("Take from DeepGEMM tests").
    """
    out = vendor.rocm_fp8_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke)
    return vendor.in_key_columns(out, cu_seqlen_ks, cu_seqlen_ke, float("-inf"))
