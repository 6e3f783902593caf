"""Reference of the drafter's per-group attention on a padded step (docs/domain.md, bug C).

A model with several KV-cache groups keeps one block table per group. Here
there are two, as in models that mix attention types:

- group 0, full attention, pages of ``config.block_size`` tokens;
- group 1, sliding-window attention, pages of ``2 ** swa_block_size_log2``
  tokens, window ``sliding_window`` (a token sees itself and the
  ``sliding_window - 1`` positions before it).

Group ``g``'s table is a row-slice of the engine's persistent per-group table,
whose width ``W_g`` is the group's page count ``cdiv(max_model_len, block_size_g)``
rounded up to whole 128-token spans
(:func:`~attnfuzz.reference.batch.runner_table_width`), and is stored at the size
of the step the graph replays: ``[R_pad, W_g]``, its padding rows holding
``PAD_PAGE``. The drafter builds each group's attention
metadata from the *unpadded* common metadata of the step (``R`` requests,
``T`` tokens):

    query_start_loc[:R+1], seq_lens[:R], block_table_g[:R]

and runs varlen paged attention over it. Token ``j`` of request ``r`` sits at
position ``pos = seq_len[r] - q_len[r] + j``; in group ``g`` it attends to the
keys at positions ``lo_g .. pos`` (``lo = 0`` for full attention,
``max(0, pos - window + 1)`` for the sliding window), read through
``block_table_g[r, k // block_size_g]`` (the keys of this step are already in
the cache):

    out_g[t, h] = sum_k softmax_k(scale * q[t, h] . K_g[k, h]) * V_g[k, h]

with ``scale = 1 / sqrt(head_dim)``.

Pages: page ``PAD_PAGE`` of every group is the *null page*, owned by no
request; its content is garbage (NaN here, so that a read of it shows). Every
real request owns distinct pages for its keys, except that in the sliding
window group the pages wholly before the window of its first new token were
freed and hold the null page, as the engine's sliding-window manager leaves
them. Entries past a request's valid pages hold stale page ids. None of those
may be read.
"""

from __future__ import annotations

import math
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
    runner_table_width,
)

NULL_PAGE = PAD_PAGE
"""Page id of the null page of every group (the pad value of padding rows, too)."""

PARAMS: dict[str, tuple[int, int]] = {
    "sliding_window": (1, 64),  # tokens a sliding-window query sees, itself included
    "swa_block_size_log2": (0, 4),  # the sliding-window group's pages: 1 .. 16 tokens
}

_DATA_SEED_SALT = 0x43982  # keeps the data stream apart from the page-id stream


@dataclass
class KVCacheGroup:
    """One KV-cache group as the drafter finds it on the device."""

    block_table: torch.Tensor  # int32 [R_pad, W_g]: stored at the padded size
    key_cache: torch.Tensor  # fp32 [num_blocks_g, block_size_g, H, D]
    value_cache: torch.Tensor  # fp32 [num_blocks_g, block_size_g, H, D]
    block_size: int
    sliding_window: int | None  # None: full attention


@dataclass
class DraftBlockTablesInputs:
    """The padded common metadata of the step, its real sizes, queries and the groups."""

    query_start_loc: torch.Tensor  # int32 [R_pad + 1]
    seq_lens: torch.Tensor  # int32 [R_pad] (padding requests: 0)
    q: torch.Tensor  # fp32 [T_pad, H, D]: the draft step's queries (padded rows unused)
    groups: list[KVCacheGroup]
    num_reqs: int  # R_pad: the size the graph replays
    num_actual_tokens: int  # T_pad
    num_real_reqs: int  # R
    num_real_tokens: int  # T
    max_seq_len: int  # max(seq_lens[:R])
    softmax_scale: float
    # The engine's limits, as the drafter's metadata builders and the runner's
    # persistent per-group tables are sized from them (an engine adapter needs them).
    config: EngineConfig


@dataclass
class GroupAttentionMetadata:
    """What the drafter hands one group's attention kernel."""

    query_start_loc: torch.Tensor  # int32 [R + 1]
    seq_lens: torch.Tensor  # int32 [R]
    block_table: torch.Tensor  # int32 [R, W_g]


@dataclass
class DraftBlockTablesOutputs:
    metadata: list[GroupAttentionMetadata]  # one per group
    out: list[torch.Tensor]  # one per group: fp32 [T, H, D]


@dataclass
class GroupExpected:
    query_start_loc: np.ndarray  # int32 [R + 1]
    seq_lens: np.ndarray  # int32 [R]
    block_table: np.ndarray  # int32 [R, W_g]
    out: np.ndarray  # fp32 [T, H, D]


@dataclass
class DraftBlockTablesExpected:
    groups: list[GroupExpected]


def group_block_sizes(case: Case) -> tuple[int, int]:
    """Pages of the full-attention group and of the sliding-window group."""
    return case.config.block_size, 2 ** case.param("swa_block_size_log2")


def freed_pages(seq_len: int, q_len: int, block_size: int, window: int | None) -> int:
    """Leading pages of a request that no token of this step can see (sliding window only).

    The first new token sits at ``seq_len - q_len`` and sees nothing before
    ``lo = max(0, seq_len - q_len - window + 1)``; later tokens see even less
    far back, so every page ending at or before ``lo`` is free.
    """
    if window is None:
        return 0
    lo = max(0, seq_len - q_len - window + 1)
    return lo // block_size


def build_group_table(
    meta: CommonMetadata,
    max_model_len: int,
    block_size: int,
    window: int | None,
    gen: torch.Generator,
) -> tuple[np.ndarray, int]:
    """One group's stored table ``[R_pad, W_g]`` and its number of pages, from ``gen``.

    Real requests own distinct pages (never the null page) for their visible
    keys; freed leading pages hold the null page; entries past the valid pages
    hold stale ids drawn from the whole cache; padding rows hold the pad value.
    """
    width = runner_table_width(max_model_len, block_size)
    R, R_pad = meta.num_real_reqs, meta.num_reqs
    q_lens = meta.query_lens
    needed = [cdiv(int(meta.seq_lens[r]), block_size) for r in range(R)]
    freed = [
        freed_pages(int(meta.seq_lens[r]), int(q_lens[r]), block_size, window) for r in range(R)
    ]
    owned = sum(n - f for n, f in zip(needed, freed, strict=True))
    num_blocks = 1 + owned + 2  # the null page, the owned pages, two spare pages
    pages = (1 + torch.randperm(num_blocks - 1, generator=gen)).numpy().astype(np.int32)
    table = torch.randint(0, num_blocks, (R_pad, width), generator=gen).numpy().astype(np.int32)
    start = 0
    for r in range(R):
        table[r, : freed[r]] = NULL_PAGE
        table[r, freed[r] : needed[r]] = pages[start : start + needed[r] - freed[r]]
        start += needed[r] - freed[r]
    table[R:] = PAD_PAGE
    return table, num_blocks


def make_inputs(case: Case, device: torch.device | str = "cpu") -> DraftBlockTablesInputs:
    """Build every tensor of ``case`` from its seed (same values on every machine)."""
    config = case.config
    meta = build_common_metadata(config, case.batch)
    H, D = config.num_heads, config.head_dim
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)

    def small_ints(*shape: int) -> torch.Tensor:
        return torch.randint(-2, 3, shape, generator=gen).to(torch.float32)

    full_bs, swa_bs = group_block_sizes(case)
    groups = []
    for block_size, window in ((full_bs, None), (swa_bs, case.param("sliding_window"))):
        table, num_blocks = build_group_table(meta, config.max_model_len, block_size, window, gen)
        key_cache = small_ints(num_blocks, block_size, H, D)
        value_cache = small_ints(num_blocks, block_size, H, D)
        key_cache[NULL_PAGE] = value_cache[NULL_PAGE] = float("nan")  # garbage: never read
        groups.append(
            KVCacheGroup(
                block_table=torch.as_tensor(table).to(device),
                key_cache=key_cache.to(device),
                value_cache=value_cache.to(device),
                block_size=block_size,
                sliding_window=window,
            )
        )
    return DraftBlockTablesInputs(
        query_start_loc=torch.as_tensor(meta.query_start_loc).to(device),
        seq_lens=torch.as_tensor(meta.seq_lens).to(device),
        q=small_ints(meta.num_actual_tokens, H, D).to(device),
        groups=groups,
        num_reqs=meta.num_reqs,
        num_actual_tokens=meta.num_actual_tokens,
        num_real_reqs=meta.num_real_reqs,
        num_real_tokens=meta.num_real_tokens,
        max_seq_len=meta.max_seq_len,
        softmax_scale=1.0 / math.sqrt(D),
        config=config,
    )


def attention(
    q: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    block_table: np.ndarray,
    window: int | None,
    scale: float,
) -> np.ndarray:
    """Varlen paged attention in float64, one request at a time; fp32 ``[T, H, D]``.

    Every token sees at least itself, so no row is empty.
    """
    bs = key_cache.shape[1]
    T, H, D = q.shape
    out = np.zeros((T, H, D), dtype=np.float64)
    for r in range(len(seq_lens)):
        start, end, seq_len = int(query_start_loc[r]), int(query_start_loc[r + 1]), int(seq_lens[r])
        q_len = end - start
        if q_len == 0:
            continue
        pos = np.arange(seq_len - q_len, seq_len)  # positions of the request's new tokens
        keys = np.arange(seq_len)
        visible = keys[None, :] <= pos[:, None]  # causal
        if window is not None:
            visible &= keys[None, :] > pos[:, None] - window
        # Read only the visible keys' pages: the rest may be freed, stale or garbage.
        k = np.zeros((seq_len, H, D))
        v = np.zeros((seq_len, H, D))
        read = np.flatnonzero(visible.any(axis=0))
        pages = block_table[r, read // bs]
        k[read], v[read] = key_cache[pages, read % bs], value_cache[pages, read % bs]
        scores = scale * np.einsum("qhd,khd->hqk", q[start:end].astype(np.float64), k)
        scores = np.where(visible[None], scores, -np.inf)
        p = np.exp(scores - scores.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[start:end] = np.einsum("hqk,khd->qhd", p, v)
    return out.astype(np.float32)


def reference(case: Case | None, inputs: DraftBlockTablesInputs) -> DraftBlockTablesExpected:
    """Per group: the unpadded metadata, and attention over the group's pages."""
    R, T = inputs.num_real_reqs, inputs.num_real_tokens
    query_start_loc = inputs.query_start_loc.cpu().numpy()[: R + 1]
    seq_lens = inputs.seq_lens.cpu().numpy()[:R]
    q = inputs.q.cpu().numpy()[:T]
    groups = []
    for group in inputs.groups:
        table = group.block_table.cpu().numpy()[:R]
        out = attention(
            q,
            group.key_cache.cpu().numpy(),
            group.value_cache.cpu().numpy(),
            query_start_loc,
            seq_lens,
            table,
            group.sliding_window,
            inputs.softmax_scale,
        )
        groups.append(GroupExpected(query_start_loc.copy(), seq_lens.copy(), table.copy(), out))
    return DraftBlockTablesExpected(groups)
