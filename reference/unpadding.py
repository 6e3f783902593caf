"""Reference of CUDA-graph padding and unpadding of the common metadata (docs/domain.md, section 4).

A step replayed in a captured graph is padded to the graph's sizes: ``T_pad``
tokens and ``R_pad`` requests. The model runner writes each step's metadata
into persistent buffers allocated once at start-up and hands on views of
their first ``R_pad`` (``+ 1``) rows and ``T_pad`` tokens; the padding rows
and tokens are written so that the graph's kernels see a harmless step:

- ``query_start_loc[R + 1 : R_pad + 1] = T`` (non-decreasing: zero-length
  padding requests);
- ``seq_lens[R:R_pad] = 0``;
- block-table rows ``R .. R_pad`` hold ``PAD_PAGE`` (0, vLLM's null block);
- slots ``T .. T_pad`` are ``-1`` (``PAD_SLOT_ID``: the cache write skips them).

A consumer that works on the real requests only (the drafter) unpads:
``CommonAttentionMetadata.unpadded(T, R)`` slices the per-request fields back
to ``R`` requests (``R + 1`` for ``query_start_loc``) and ``slot_mapping`` to
``T`` tokens, as *views* of the padded fields (no copy: the call runs every
step), and keeps ``max_query_len`` (padding requests have ``q_len = 0``, so
the maximum over the real requests is the same).

The expected values are :func:`~attnfuzz.reference.batch.build_common_metadata`
(padded where the engine pads, see :func:`~attnfuzz.reference.batch.pad_for_cudagraph`)
and :meth:`~attnfuzz.reference.batch.CommonMetadata.unpadded`.

Inputs. An implementation receives what the model runner has before it
pads: the real step (per-request lengths, the real block-table rows, which
include stale entries past each request's pages), the padded sizes, and the
persistent buffers holding what earlier steps left (seeded stale values:
slot ids that look valid, lengths, page ids).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    build_common_metadata,
    split_decodes_and_prefills,
)

_DATA_SEED_SALT = 0x29644


@dataclass
class UnpaddingInputs:
    """The real step, the graph's sizes, and the persistent buffers as earlier steps left them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_reqs: int  # R
    num_tokens: int  # T
    num_reqs_padded: int  # R_pad (R when not padded)
    num_tokens_padded: int  # T_pad (T when not padded)
    num_computed_tokens: np.ndarray  # int32 [R]
    query_lens: np.ndarray  # int32 [R]
    block_table: np.ndarray  # int32 [R, W]: real rows, stale entries past each request's pages
    num_pages: np.ndarray  # int32 [R]: pages each request owns (cdiv(seq_len, block_size))
    # persistent buffers: stale content of earlier steps (the buffers themselves, torch)
    query_start_loc_buffer: torch.Tensor  # int32 [max_num_seqs + 1]
    seq_lens_buffer: torch.Tensor  # int32 [max_num_seqs]
    block_table_buffer: torch.Tensor  # int32 [max_num_seqs, W]
    slot_mapping_buffer: torch.Tensor  # int64 [max_num_batched_tokens]


@dataclass
class StepMetadata:
    """The fields of the common metadata that padding and unpadding touch."""

    query_start_loc: object  # int32 [R' + 1]
    seq_lens: object  # int32 [R']
    block_table: object  # int32 [R', W]
    slot_mapping: object  # int64 [T']
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int


@dataclass
class UnpaddingOutputs:
    padded: StepMetadata  # at the graph's sizes, views of ``buffers``
    unpadded: StepMetadata  # at the real sizes, views of ``padded``
    # the persistent buffers the padded fields live in (an engine's own), by field name
    buffers: dict[str, torch.Tensor]


@dataclass
class UnpaddingExpected:
    padded: CommonMetadata
    unpadded: CommonMetadata


FIELDS = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    meta = build_common_metadata(case.config, case.batch)
    return meta, split_decodes_and_prefills(meta, case.config.threshold)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> UnpaddingInputs:
    config = case.config
    meta = build_common_metadata(config, case.batch)
    real = build_common_metadata(config, dataclasses.replace(case.batch, use_cudagraph=False))
    R, T, W = real.num_reqs, real.num_actual_tokens, config.max_blocks_per_seq
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)
    S, N = config.max_num_seqs, config.max_num_batched_tokens
    # Stale content: lengths and page ids of earlier steps; slot ids that look valid
    # (never -1), so a padded token left stale is visible.
    qsl = torch.randint(0, N + 1, (S + 1,), generator=gen).to(torch.int32)
    seq = torch.randint(1, config.max_model_len + 1, (S,), generator=gen).to(torch.int32)
    table = torch.randint(0, real.num_blocks, (S, W), generator=gen).to(torch.int32)
    table[:R] = torch.as_tensor(real.block_table)  # a reused row's tail is stale
    slots = torch.randint(0, real.num_blocks * config.block_size, (N,), generator=gen)
    q = real.query_lens
    seq_lens = real.seq_lens
    return UnpaddingInputs(
        max_num_seqs=S,
        max_num_batched_tokens=N,
        block_size=config.block_size,
        num_reqs=R,
        num_tokens=T,
        num_reqs_padded=meta.num_reqs,
        num_tokens_padded=meta.num_actual_tokens,
        num_computed_tokens=(seq_lens - q).astype(np.int32),
        query_lens=q.astype(np.int32),
        block_table=real.block_table.copy(),
        num_pages=-(-seq_lens // config.block_size).astype(np.int32),
        query_start_loc_buffer=qsl.to(device),
        seq_lens_buffer=seq.to(device),
        block_table_buffer=table.to(device),
        slot_mapping_buffer=slots.to(torch.int64).to(device),
    )


def reference(case: Case, inputs: UnpaddingInputs) -> UnpaddingExpected:
    meta = build_common_metadata(case.config, case.batch)
    return UnpaddingExpected(meta, meta.unpadded(inputs.num_tokens, inputs.num_reqs))
