"""Reference of the FlexAttention block-sparse mask of a paged, causal, varlen step (bug E).

FlexAttention skips work by blocks: queries are cut into *query blocks* of
``q_block_size`` consecutive token rows of the step, and for each query block
the mask lists the KV pages (``block_size`` slots each) that its kernel walks.
Written per token, in NumPy, to be read:

- the step runs ``num_tokens`` query rows (``num_actual_tokens``: a padded
  graph's padding rows included); query block ``g`` holds rows
  ``g * q_block_size .. (g + 1) * q_block_size - 1`` (the last one may be
  short), so there are ``cdiv(num_tokens, q_block_size)`` blocks, the first
  ``cdiv(query_start_loc[-1], q_block_size)`` of them holding real tokens;
- row ``t`` belongs to the request ``r`` with
  ``query_start_loc[r] <= t < query_start_loc[r + 1]`` and sits at position
  ``pos = seq_len[r] - q_len[r] + (t - query_start_loc[r])`` of its sequence;
  causally it attends keys ``0 .. pos`` of request ``r``, which live in pages
  ``block_table[r, 0 .. pos // block_size]``; a padding row (beyond the real
  tokens) attends nothing;
- ``kv_indices[g, :kv_num_blocks[g]]`` lists the pages the kernel walks for
  block ``g``.

**What the consumer computes.** The attention kernel (``flex_attention``)
walks, for each query block, the first ``kv_num_blocks[g]`` entries of row
``g`` of ``kv_indices`` (by the tensor's strides) and, for every slot of every
page it walks, asks the *mask function* whether the query row may see it. In
vLLM 0.33.0 (``vllm/v1/attention/backends/flex_attention.py``,
``FlexAttentionMetadata.get_paged_mask_mod``) the mask function admits slot
``s`` of page ``p`` for row ``t`` of request ``r`` exactly when ``p`` sits at
a logical index ``i`` of ``r``'s block table below ``cdiv(seq_len[r],
block_size)`` and ``i * block_size + s <= pos``. So a walked page that row
``t`` does not need (a page of another request in the same block, a future
page, a stale id, the null block) contributes nothing, and the output of
row ``t`` is the reference's exactly when, for its query block:

1. every page it needs is walked (the causal pages; more are allowed);
2. no page is walked twice (its keys would count twice in the softmax);
3. every walked id is a page of the cache, ``[0, num_pages)`` (the kernel
   loads each walked page's keys; any other id reads outside the cache).

Query blocks made of padding rows only may be left out of the tables (vLLM
counts the rows of the step's mask from the real tokens of
``query_start_loc``); if they are present, 2 and 3 hold for them. The entries
after a row's head are never read (the kernel's look-ahead load is masked by
``kv_num_blocks``), so they are free. :func:`reference` states the smallest
mask: each block's needed pages, ascending, ``-1`` after.

Page 0 is the KV cache's *null block*: the engine's block pool keeps it out
of every request (vLLM 0.33.0 ``vllm/v1/core/block_pool.py``,
``BlockPool.__init__`` pops it as ``null_block``), padding rows of the block
table point at it (``PAD_PAGE``), and the FlexAttention builder drops it from
every query block (``unique_static_unsorted(..., ignored_val=0)``) and masks it
(``physical_to_logical_mapping``: "block 0 is always empty"). The common
metadata hands out pages from 0, so :func:`make_inputs` moves every page id up
by one (:func:`reserve_null_page`): the cache gains the null block and no real
request owns it. Walking page 0 is allowed (the mask function hides it).

A query block may span several requests, so its pages are a union of prefixes
of several block-table rows. Each of its at most ``q_block_size`` rows attends
at most ``cdiv(max_seq_len, block_size)`` pages, which bounds the row width:
the step's mask is ``[cdiv(num_tokens, q_block_size),
q_block_size * cdiv(max_seq_len, block_size)]``; a *column* is one slot for a
page id, not a page.

The two tables are metadata that a CUDA graph replays, so the builder keeps
them in *persistent* buffers allocated once at engine start and views them per
step: the step's ``[rows, cols]`` mask starts at the head of the persistent
table, either its first ``rows * cols`` elements viewed contiguous (as
``kernels/flex_block_mask.py`` re-strides them) or the strided slice
``table[:rows, :cols]`` of the 2-D table (as vLLM 0.33.0's
``copy_to_persistent`` does); the consumer reads either by its strides. For
every step the scheduler can produce to fit, the buffers need
``cdiv(max_num_batched_tokens, q_block_size)`` rows of ``q_block_size *
cdiv(max_model_len, block_size)`` columns (:func:`persistent_shape`). Nothing
outside the step's view may change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    PAD_PAGE,
    Case,
    CommonMetadata,
    EngineConfig,
    build_common_metadata,
    cdiv,
)

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
    steps); the builder views its persistent tables there, per step. Host-side
    integers are what the builder knows on the CPU. ``config`` and ``common``
    are what an engine's builder receives (its limits and the step's common
    metadata, on the host, with the null page reserved); None in hand-built
    inputs that only attnfuzz's own implementations read.
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
    num_pages: int  # pages in the KV cache, page 0 the null block
    config: EngineConfig | None = None
    common: CommonMetadata | None = None


@dataclass
class FlexBlockMaskOutputs:
    kv_indices: torch.Tensor  # int32 [rows, cols], a view of persistent_kv_indices
    kv_num_blocks: torch.Tensor  # int32 [rows], a view of persistent_kv_num_blocks


@dataclass
class FlexBlockMaskExpected:
    kv_indices: np.ndarray  # int32 [rows, cols]: each block's needed pages sorted, then -1
    kv_num_blocks: np.ndarray  # int32 [rows]
    kv_indices_before: np.ndarray  # the persistent memory as the step found it
    kv_num_blocks_before: np.ndarray
    num_real_rows: int = 0  # query blocks holding real tokens: cdiv(query_start_loc[-1], q)
    num_pages: int = 0  # valid page ids: [0, num_pages)

    @property
    def needed(self) -> list[set[int]]:
        """Per query block, the pages its rows need (the consumer may walk more)."""
        return [
            set(row[:n].tolist())
            for row, n in zip(self.kv_indices, self.kv_num_blocks, strict=True)
        ]


def reserve_null_page(meta: CommonMetadata, block_size: int) -> CommonMetadata:
    """``meta`` in a cache one page larger whose page 0 is the null block.

    Every page id of a real request's row (stale entries included) moves up by
    one, and so do the slots of its tokens; padding requests keep ``PAD_PAGE``
    (page 0, the null block) and padded tokens slot ``-1``. The engine's block
    pool never hands page 0 to a request (vLLM 0.33.0 ``BlockPool.__init__``).
    """
    real = meta.num_real_reqs
    table = meta.block_table.copy()
    table[:real] += 1
    table[real:] = PAD_PAGE
    slots = meta.slot_mapping.copy()
    slots[slots >= 0] += block_size  # page p + 1 starts block_size slots further
    return dataclasses.replace(
        meta, block_table=table, slot_mapping=slots, num_blocks=meta.num_blocks + 1
    )


def make_inputs(case: Case, device: torch.device | str = "cpu") -> FlexBlockMaskInputs:
    """Build every tensor of ``case`` from its seed (same values on every machine)."""
    config = case.config
    meta = reserve_null_page(build_common_metadata(config, case.batch), config.block_size)
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
        num_pages=meta.num_blocks,
        config=config,
        common=meta,
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
    """The smallest mask: each block's needed pages in ascending order (the order is free)."""
    rows, cols = mask_shape(
        inputs.num_tokens, inputs.max_seq_len, inputs.block_size, inputs.q_block_size
    )
    kv_indices = np.full((rows, cols), -1, dtype=np.int32)
    kv_num_blocks = np.zeros(rows, dtype=np.int32)
    for g, pages in enumerate(attended_pages(inputs)):
        kv_indices[g, : len(pages)] = sorted(pages)
        kv_num_blocks[g] = len(pages)
    real_tokens = int(inputs.query_start_loc[inputs.num_reqs].item())
    return FlexBlockMaskExpected(
        kv_indices,
        kv_num_blocks,
        inputs.persistent_kv_indices.cpu().numpy().copy(),
        inputs.persistent_kv_num_blocks.cpu().numpy().copy(),
        num_real_rows=cdiv(real_tokens, inputs.q_block_size),
        num_pages=inputs.num_pages,
    )
