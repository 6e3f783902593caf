"""Reference of the sparse-attention indexer's decode path (docs/domain.md section 5).

Per decode token, the indexer scores every earlier key of its request and keeps
the ``K`` best positions in the shared ``topk_indices_buffer``. Written per
token, in NumPy, to be read:

- decode ``b`` has ``d[b]`` tokens at rows ``query_start_loc[b] + j``;
- token ``j`` of decode ``b`` sees ``ctx = seq_len[b] - d[b] + j + 1`` keys;
- ``logit[k] = sum_h w[h] * relu(q[h] . key[k])`` for ``k < ctx``, ``-inf`` after,
  where key ``k`` is read through the request's block table;
- its row of the buffer gets the indices of the ``K`` largest logits (any
  order), ``-1`` filling the row when fewer than ``K`` keys are visible.

Only rows of real decode tokens (``0 .. sum(d)``) are written. Rows of padded
decode tokens (``sum(d) .. N_d``, present when a graph pads the step) may hold
anything; every other row, the prefill rows included, must stay as it was.

What the engine's contract fixes (vLLM 0.33.0):

- The split is the engine's: the native ``[B, L]`` decode path (``next_n <= 2``
  where DeepGEMM cannot take more rows per request) splits with the *uniform*
  rule, so its decodes share one length but for trailing zero-length padding
  requests, and beyond it the engine flattens every decode token to its own row
  and splits ragged (``v1/attention/backends/mla/indexer.py``:
  ``DeepseekV32IndexerMetadataBuilder.build``, ``require_uniform=not
  (self.use_flattening or self.supports_varlen)``; ``_use_flattening``,
  ``_supports_native_decode``). The decode branch of ``sparse_attn_indexer``
  relies on it: it hands the logits the *unpacked* ``weights[:B*L]``.
- The prefill rows hold what the prefill branch computes: ``sparse_attn_indexer``
  clears the step's rows and runs its prefill branch before the decode branch, in
  the same call. So the buffer a case starts from holds, for each prefill token,
  its own top-k (ties to the lowest index), and the decode path must leave it.
- Logits past a row's context are not cleaned by the engine's kernel
  (``vllm/utils/deep_gemm.py:fp8_fp4_paged_mqa_logits``): only the visible
  columns of a row are judged (``row_context_lens``).

The data are small integers stored as fp32, so every logit is exact in fp32
whatever the summation order: a correct kernel matches bit for bit, and ties,
which are frequent, are real ties.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    EngineConfig,
    build_common_metadata,
    float_dtype,
    split_decodes_and_prefills,
)

_DATA_SEED_SALT = 0x1D3C  # keeps the data stream apart from the page-id stream


@dataclass
class IndexerDecodeInputs:
    """What the engine hands the indexer's decode path for one layer.

    Tensors live on the implementation's device; ``topk_indices_buffer`` is
    shared by all layers and already holds the prefill path's rows. Host-side
    integers are what the metadata builder knows on the CPU.
    """

    q: torch.Tensor  # [T, H, D], fp32 (fp16/bf16 on CUDA, see batch.float_dtype)
    weights: torch.Tensor  # [T, H], same dtype
    kv_cache: torch.Tensor  # [num_blocks, block_size, D] (one MQA key head), same dtype
    query_start_loc: torch.Tensor  # int32 [R+1]
    seq_lens: torch.Tensor  # int32 [R]
    block_table: torch.Tensor  # int32 [R, W]
    decode_lens: torch.Tensor  # int32 [B]: d
    topk_indices_buffer: torch.Tensor  # int32 [max_num_batched_tokens, K]
    num_reqs: int
    num_decodes: int  # B
    num_decode_tokens: int  # N_d
    max_decode_len: int  # L
    requires_padding: bool
    max_model_len: int
    topk: int
    # What the engine's indexer call also receives: its engine and the step's common
    # metadata (vLLM's adapters build the engine's own metadata from them).
    config: EngineConfig | None = None
    common: CommonMetadata | None = None


@dataclass
class IndexerDecodeOutputs:
    """What an implementation returns; it also writes ``topk_indices_buffer`` in place."""

    logits: torch.Tensor  # fp32 [B*L, max_model_len]; rows of padded slots are not checked


@dataclass
class IndexerDecodeExpected:
    logits: np.ndarray  # fp32 [B*L, max_model_len]
    logit_rows: np.ndarray  # bool [B*L]: rows of real tokens
    buffer: np.ndarray  # int32 [max_num_batched_tokens, K]: the buffer afterwards
    checked_rows: np.ndarray  # bool [rows]: rows written by the decode path
    free_rows: np.ndarray  # bool [rows]: rows of padded decode tokens (any content)
    context_lens: np.ndarray  # int32 [rows]: visible keys of each checked row
    logit_row: np.ndarray  # int64 [rows]: the logits row of each checked row, else -1
    row_context_lens: np.ndarray  # int32 [B*L]: visible keys of each logits row


NATIVE_MAX_NEXT_N = 2
"""The largest ``next_n`` the engine scores natively as ``[B, L]`` rows on a platform
without DeepGEMM's wider kernels (vLLM 0.33.0 ``indexer.py:_supports_native_decode``:
``next_n in (1, 2)``); beyond it, decode tokens are flattened to one row each."""


def native_path(config: EngineConfig) -> bool:
    return config.next_n <= NATIVE_MAX_NEXT_N


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    """The step and its split as the engine's indexer splits it: uniform on the native
    path, ragged where decode tokens are flattened (module docstring)."""
    meta = build_common_metadata(case.config, case.batch)
    uniform = native_path(case.config)
    return meta, split_decodes_and_prefills(meta, case.config.threshold, require_uniform=uniform)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> IndexerDecodeInputs:
    """Build every tensor of ``case`` from its seed (same values on every machine)."""
    config = case.config
    meta, split = describe(case)
    T, H, D = meta.num_actual_tokens, config.num_heads, config.head_dim
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)

    def small_ints(*shape: int) -> torch.Tensor:
        return torch.randint(-2, 3, shape, generator=gen).to(torch.float32)

    q = small_ints(T, H, D)
    weights = small_ints(T, H)
    kv_cache = small_ints(meta.num_blocks, config.block_size, D)
    # The shared buffer: stale rows from earlier steps, then this step's prefill rows.
    buffer = torch.randint(
        -1, config.max_model_len, (config.max_num_batched_tokens, config.topk), generator=gen
    ).to(torch.int32)
    prefill = slice(split.num_decode_tokens, split.num_decode_tokens + split.num_prefill_tokens)
    buffer[prefill] = torch.as_tensor(
        prefill_rows(q, weights, kv_cache, meta, split, config.topk), dtype=torch.int32
    )

    def dev(x: np.ndarray | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(x).to(device)

    dtype = float_dtype(device)
    return IndexerDecodeInputs(
        q=dev(q).to(dtype),
        weights=dev(weights).to(dtype),
        kv_cache=dev(kv_cache).to(dtype),
        query_start_loc=dev(meta.query_start_loc),
        seq_lens=dev(meta.seq_lens),
        block_table=dev(meta.block_table),
        decode_lens=dev(np.asarray(split.decode_lens, dtype=np.int32)),
        topk_indices_buffer=dev(buffer),
        num_reqs=meta.num_reqs,
        num_decodes=split.num_decodes,
        num_decode_tokens=split.num_decode_tokens,
        max_decode_len=split.max_decode_len,
        requires_padding=split.requires_padding,
        max_model_len=config.max_model_len,
        topk=config.topk,
        config=config,
        common=meta,
    )


def _token_logits(
    q: np.ndarray, w: np.ndarray, kv: np.ndarray, table: np.ndarray, ctx: int
) -> np.ndarray:
    """``sum_h w[h] * relu(q[h] . key[k])`` for the ``ctx`` keys ``k`` of one token."""
    if ctx == 0:
        return np.zeros(0, dtype=np.float32)
    bs, pos = kv.shape[1], np.arange(ctx)
    keys = kv[table[pos // bs], pos % bs]  # [ctx, D], read through the block table
    return (np.maximum(keys @ q.T, 0.0) @ w).astype(np.float32)


def prefill_rows(
    q: torch.Tensor,
    weights: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: CommonMetadata,
    split: DecodeSplit,
    k: int,
) -> np.ndarray:
    """The prefill branch's result: each prefill token's top-k over its causal context
    (``seq_len - q_len + j + 1`` keys), ties to the lowest index."""
    qn, wn, kvn = q.float().numpy(), weights.float().numpy(), kv_cache.float().numpy()
    rows = np.zeros((split.num_prefill_tokens, k), dtype=np.int32)
    qsl, seq_lens = meta.query_start_loc, meta.seq_lens
    first = split.num_decode_tokens
    for r in range(split.num_decodes, split.num_decodes + split.num_prefills):
        q_len = int(qsl[r + 1] - qsl[r])
        for j in range(q_len):
            token = int(qsl[r]) + j
            ctx = int(seq_lens[r]) - q_len + j + 1
            row = _token_logits(qn[token], wn[token], kvn, meta.block_table[r], ctx)
            rows[token - first] = topk_row(row, ctx, k)
    return rows


def topk_row(logits: np.ndarray, ctx: int, k: int) -> np.ndarray:
    """Indices of the ``k`` largest of ``logits[:ctx]``, ``-1``-filled to ``k``."""
    row = np.full(k, -1, dtype=np.int32)
    order = np.argsort(-logits[:ctx], kind="stable")[:k]
    row[: len(order)] = order
    return row


def reference(case: Case | None, inputs: IndexerDecodeInputs) -> IndexerDecodeExpected:
    """The expected logits and buffer, token by token (everything is read off ``inputs``)."""
    M, K = inputs.max_model_len, inputs.topk
    q = inputs.q.float().cpu().numpy()
    w = inputs.weights.float().cpu().numpy()
    kv = inputs.kv_cache.float().cpu().numpy()
    qsl = inputs.query_start_loc.cpu().numpy()
    seq_lens = inputs.seq_lens.cpu().numpy()
    table = inputs.block_table.cpu().numpy()
    buffer = inputs.topk_indices_buffer.cpu().numpy().copy()
    d = inputs.decode_lens.cpu().numpy()
    B, L = inputs.num_decodes, inputs.max_decode_len

    logits = np.full((B * L, M), -np.inf, dtype=np.float32)
    logit_rows = np.zeros(B * L, dtype=bool)
    rows = buffer.shape[0]
    checked = np.zeros(rows, dtype=bool)
    context_lens = np.zeros(rows, dtype=np.int32)
    logit_row = np.full(rows, -1, dtype=np.int64)
    row_context_lens = np.zeros(B * L, dtype=np.int32)
    for b in range(B):
        for j in range(int(d[b])):
            token = int(qsl[b]) + j
            ctx = int(seq_lens[b]) - int(d[b]) + j + 1
            row = logits[b * L + j]
            row[:ctx] = _token_logits(q[token], w[token], kv, table[b], ctx)
            logit_rows[b * L + j] = True
            row_context_lens[b * L + j] = ctx
            buffer[token] = topk_row(row, ctx, K)
            checked[token] = True
            context_lens[token] = ctx
            logit_row[token] = b * L + j
    free = np.zeros(rows, dtype=bool)
    num_real = int(d.sum()) if B else 0
    free[num_real : inputs.num_decode_tokens] = True
    return IndexerDecodeExpected(
        logits, logit_rows, buffer, checked, free, context_lens, logit_row, row_context_lens
    )
