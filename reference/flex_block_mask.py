"""Reference of the FlexAttention block-sparse mask of a paged, causal, varlen step (bug E).

FlexAttention skips work by blocks: queries are cut into *query blocks* of
``q_block_size`` consecutive token rows of the step, and for each query block
the mask lists the KV pages (``block_size`` slots each) that any of its tokens
may attend. Written per token, in NumPy, to be read:

- the step runs ``num_tokens`` query rows (``num_actual_tokens``: a padded
  graph's padding rows included); query block ``g`` holds rows
  ``g * q_block_size .. (g + 1) * q_block_size - 1`` (the last one may be
  short), so there are ``cdiv(num_tokens, q_block_size)`` blocks;
- row ``t`` belongs to the request ``r`` with
  ``query_start_loc[r] <= t < query_start_loc[r + 1]`` and sits at position
  ``pos = seq_len[r] - q_len[r] + (t - query_start_loc[r])`` of its sequence;
  causally it attends keys ``0 .. pos`` of request ``r``, which live in pages
  ``block_table[r, 0 .. pos // block_size]``; a padding row (beyond the real
  tokens) attends nothing;
- ``kv_indices[g]`` holds the distinct page ids of the union over the block's
  rows, left-packed in any order, the rest of the row ``-1``;
  ``kv_num_blocks[g]`` is their number.

A query block may span several requests, so its pages are a union of prefixes
of several block-table rows. Each of its at most ``q_block_size`` rows attends
at most ``cdiv(max_seq_len, block_size)`` pages, which bounds the row width:
the step's mask is ``[cdiv(num_tokens, q_block_size),
q_block_size * cdiv(max_seq_len, block_size)]``; a *column* is one slot for a
page id, not a page.

The two tables are metadata that a CUDA graph replays, so the builder keeps
them in *persistent* buffers allocated once at engine start and re-strides
them per step: the step's ``[rows, cols]`` mask is the first ``rows * cols``
elements of the persistent table viewed contiguous (and ``kv_num_blocks`` the
first ``rows`` elements of its table). For every step the scheduler can
produce to fit, the buffers need ``cdiv(max_num_batched_tokens, q_block_size)``
rows of ``q_block_size * cdiv(max_model_len, block_size)`` columns
(:func:`persistent_shape`). Nothing outside the step's view may change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Case, build_common_metadata, cdiv

_DATA_SEED_SALT = 0x39353  # keeps the stale-buffer stream apart from the page-id stream

Q_BLOCK_PARAM = "q_block_size_log2"
"""The target's own integer: ``q_block_size = 2 ** q_block_size_log2``."""


def q_block_size(case: Case) -> int:
    return 2 ** case.param(Q_BLOCK_PARAM)


def mask_shape(num_tokens: int, max_seq_len: int, block_size: int, q_block: int) -> tuple[int, int]:
    """``[rows, cols]`` of one step's ``kv_indices``: query blocks by page slots."""
    return cdiv(num_tokens, q_block), q_block * cdiv(max_seq_len, block_size)


def persistent_shape(
    max_num_batched_tokens: int, max_model_len: int, block_size: int, q_block: int
) -> tuple[int, int]:
    """The persistent ``kv_indices`` table that every schedulable step fits (the #39353 fix).

    A step has at most ``max_num_batched_tokens`` rows and a ``max_seq_len`` of at
    most ``max_model_len``, so its :func:`mask_shape` is bounded in both dimensions.
    """
    return mask_shape(max_num_batched_tokens, max_model_len, block_size, q_block)


def model_len_shape(max_model_len: int, block_size: int) -> tuple[int, int]:
    """``[max_model_len, cdiv(max_model_len, block_size)]``: one row per token and one
    column per page of a single longest sequence.

    This is how the table was sized before #39353; it is no bound on a step's
    mask (rows count query blocks of the whole step, columns ``q_block_size``
    page slots per page). The engine's start-up reserve covers it as well, so
    that a builder sizing its table this way runs on the same inputs.
    """
    return max_model_len, cdiv(max_model_len, block_size)


def reserved_elements(
    max_num_batched_tokens: int, max_model_len: int, block_size: int, q_block: int
) -> tuple[int, int]:
    """Elements reserved at start for ``kv_indices`` and for ``kv_num_blocks``."""
    rows, cols = persistent_shape(max_num_batched_tokens, max_model_len, block_size, q_block)
    old_rows, old_cols = model_len_shape(max_model_len, block_size)
    return max(rows * cols, old_rows * old_cols), max(rows, old_rows)


@dataclass
class FlexBlockMaskInputs:
    """What the metadata builder has at hand for one step.

    ``persistent_kv_indices`` and ``persistent_kv_num_blocks`` are the memory the
    builder reserved at engine start (flat, holding stale values from earlier
    steps); the builder views its persistent tables there and re-strides them
    per step. Host-side integers are what the builder knows on the CPU.
    """

    query_start_loc: torch.Tensor  # int32 [R+1]
    seq_lens: torch.Tensor  # int32 [R] (padding requests: 0)
    block_table: torch.Tensor  # int32 [R, W]
    persistent_kv_indices: torch.Tensor  # int32 [reserved], flat
    persistent_kv_num_blocks: torch.Tensor  # int32 [reserved], flat
    num_reqs: int  # R (padded)
    num_tokens: int  # num_actual_tokens (padded)
    max_seq_len: int
    block_size: int
    q_block_size: int
    max_model_len: int
    max_num_batched_tokens: int


@dataclass
class FlexBlockMaskOutputs:
    kv_indices: torch.Tensor  # int32 [rows, cols], a view of persistent_kv_indices
    kv_num_blocks: torch.Tensor  # int32 [rows], a view of persistent_kv_num_blocks


@dataclass
class FlexBlockMaskExpected:
    kv_indices: np.ndarray  # int32 [rows, cols]: each row's pages sorted, then -1
    kv_num_blocks: np.ndarray  # int32 [rows]
    kv_indices_before: np.ndarray  # the persistent memory as the step found it
    kv_num_blocks_before: np.ndarray


def make_inputs(case: Case, device: torch.device | str = "cpu") -> FlexBlockMaskInputs:
    """Build every tensor of ``case`` from its seed (same values on every machine)."""
    config = case.config
    meta = build_common_metadata(config, case.batch)
    q_block = q_block_size(case)
    n_indices, n_counts = reserved_elements(
        config.max_num_batched_tokens, config.max_model_len, config.block_size, q_block
    )
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)
    # Stale contents from earlier steps: page ids, -1 and counts alike.
    high = meta.num_blocks + 2

    def dev(x: np.ndarray | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(x).to(device)

    return FlexBlockMaskInputs(
        query_start_loc=dev(meta.query_start_loc),
        seq_lens=dev(meta.seq_lens),
        block_table=dev(meta.block_table),
        persistent_kv_indices=dev(torch.randint(-1, high, (n_indices,), generator=gen).int()),
        persistent_kv_num_blocks=dev(torch.randint(-1, high, (n_counts,), generator=gen).int()),
        num_reqs=meta.num_reqs,
        num_tokens=meta.num_actual_tokens,
        max_seq_len=meta.max_seq_len,
        block_size=config.block_size,
        q_block_size=q_block,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )


def attended_pages(inputs: FlexBlockMaskInputs) -> list[set[int]]:
    """Per query block, the set of page ids its rows may attend (the definition)."""
    qsl = inputs.query_start_loc.cpu().numpy()
    seq_lens = inputs.seq_lens.cpu().numpy()
    table = inputs.block_table.cpu().numpy()
    bs, q_block, T = inputs.block_size, inputs.q_block_size, inputs.num_tokens
    pages: list[set[int]] = [set() for _ in range(cdiv(T, q_block))]
    for r in range(inputs.num_reqs):
        q_len = int(qsl[r + 1] - qsl[r])
        for j in range(q_len):
            t = int(qsl[r]) + j
            pos = int(seq_lens[r]) - q_len + j
            pages[t // q_block].update(table[r, : pos // bs + 1].tolist())
    return pages


def reference(case: Case | None, inputs: FlexBlockMaskInputs) -> FlexBlockMaskExpected:
    """The expected mask, each row's pages in ascending order (the order is free)."""
    rows, cols = mask_shape(
        inputs.num_tokens, inputs.max_seq_len, inputs.block_size, inputs.q_block_size
    )
    kv_indices = np.full((rows, cols), -1, dtype=np.int32)
    kv_num_blocks = np.zeros(rows, dtype=np.int32)
    for g, pages in enumerate(attended_pages(inputs)):
        kv_indices[g, : len(pages)] = sorted(pages)
        kv_num_blocks[g] = len(pages)
    return FlexBlockMaskExpected(
        kv_indices,
        kv_num_blocks,
        inputs.persistent_kv_indices.cpu().numpy().copy(),
        inputs.persistent_kv_num_blocks.cpu().numpy().copy(),
    )
