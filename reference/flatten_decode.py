"""Reference of the sparse indexer's flattened decode metadata (docs/domain.md, section 5).

Where the paged logits kernel cannot take ``next_n`` query rows per request
(vLLM's ``_use_flattening``: no native kernel for this ``next_n``, or adaptive
verification), the indexer's decode path *flattens* the decodes: each decode
token becomes a request of its own, with one query row. Per flattened token
``i``, token ``j`` of decode ``b`` (``i = query_start_loc[b] + j``):

- ``context_lens[i] = seq_len[b] - d[b] + j + 1``, the causal end of section 5
  (right-aligned on ``d[b]``, the decode's own length, so ragged decodes are
  exact);
- ``block_table[i]`` is decode ``b``'s block-table row: the logits kernel
  reads pages ``0 .. cdiv(context_lens[i], block_size)`` of it;
- ``decode_lens[i] = 1``.

The decodes are split by the *ragged* rule of section 2 (vLLM:
``split_decodes_and_prefills(require_uniform=False)`` when flattening). In a
step of decodes only, ``N_d`` counts the padded tokens of a graph too: the
flattened tokens ``sum(d) .. N_d`` belong to no request, see no key
(``context_lens = 0``) and have ``decode_lens = 1``; the first entry of their
block-table row is ``PAD_PAGE`` (0), a page that exists, in case a kernel
loads it.

Storage (vLLM 0.33.0, ``vllm/v1/attention/backends/mla/indexer.py``,
``DeepseekV32IndexerMetadataBuilder``): four persistent buffers of
``max_num_batched_tokens`` rows, allocated with the builder; each output is a
view of its buffer's first rows, so that a replayed graph finds it at the same
address. What a step may write, buffer by buffer (``_prepare_decode_tensors``,
both of its flattening branches, and ``build``):

- context lengths: ``[0, N_d)`` as above, and *every* element from ``sum(d)``
  to the end of the buffer is zeroed (both branches write
  ``decode_seq_lens_buffer[sum(d):] = 0``), so a kernel reading past the view
  sees no keys;
- expanded block table: rows ``[0, N_d)`` only; rows past ``N_d`` keep their
  content. In a real token's row only the pages it may read are checked
  (entries past them are never read, docs/domain.md section 3); in a padded
  token's row only the first entry;
- decode lengths: ``[0, N_d)`` only;
- per-request decode lengths: ``d`` in ``[0, B)`` only.

``requires_padding`` is False: flattened tokens need no packing.

Block-table width. The model runner's block table is wider than
``max_blocks_per_seq``: its rows are aligned to whole 128-token spans
(vLLM 0.33.0, ``vllm/v1/worker/block_table.py`` ``get_block_table_width``,
used by both model runners and, through ``AttentionGroup``, to size the
builder's ``block_table_width``). Columns past ``max_blocks_per_seq`` are
never written by any request, so they hold 0. The inputs present the step's
block table at that width, and the expanded buffer has it too.
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
    DecodeSplit,
    EngineConfig,
    build_common_metadata,
    cdiv,
    runner_table_width,
    split_decodes_and_prefills,
)

_DATA_SEED_SALT = 0xF1A7  # keeps the stale-buffer stream apart from the page-id stream


@dataclass
class DecodeBuffers:
    """The builder's persistent buffers, ``max_num_batched_tokens`` rows each (int32)."""

    context_lens: torch.Tensor  # [M]
    block_table: torch.Tensor  # [M, W]
    decode_lens: torch.Tensor  # [M]
    per_req_decode_lens: torch.Tensor  # [M]

    def numpy(self) -> DecodeBuffers:
        return DecodeBuffers(*(t.detach().cpu().numpy().copy() for t in self.tensors()))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.context_lens, self.block_table, self.decode_lens, self.per_req_decode_lens


@dataclass
class FlattenDecodeInputs:
    """What the indexer's metadata builder receives for one step, and its buffers as
    the step finds them (stale content of earlier steps). Tensors on the
    implementation's device."""

    config: EngineConfig
    common: CommonMetadata  # the step's common metadata (padded sizes)
    split: DecodeSplit  # the ragged split
    seq_lens: torch.Tensor  # int32 [R]
    query_start_loc: torch.Tensor  # int32 [R+1]
    block_table: torch.Tensor  # int32 [R, W]
    buffers: DecodeBuffers

    @property
    def num_decodes(self) -> int:
        return self.split.num_decodes

    @property
    def num_decode_tokens(self) -> int:
        return self.split.num_decode_tokens

    @property
    def num_real_decode_tokens(self) -> int:
        """``sum(d)``: the flattened tokens that belong to a decode."""
        return sum(self.split.decode_lens)


@dataclass
class FlattenDecodeOutputs:
    """The decode metadata (None where the step has no decodes) and the buffers written."""

    context_lens: torch.Tensor | None  # int32 [N_d, 1], a view of buffers.context_lens
    block_table: torch.Tensor | None  # int32 [N_d, W], a view of buffers.block_table
    decode_lens: torch.Tensor | None  # int32 [N_d], a view of buffers.decode_lens
    per_req_decode_lens: torch.Tensor | None  # int32 [B], a view of buffers.per_req_decode_lens
    requires_padding: bool
    buffers: DecodeBuffers


@dataclass
class FlattenDecodeExpected:
    context_lens: np.ndarray  # int32 [N_d]
    context_lens_buffer: np.ndarray  # int32 [M]: the whole buffer after the step
    block_table: np.ndarray  # int32 [N_d, W]: the checked entries, -1 at the others
    pages: np.ndarray  # bool [N_d, W]: the entries a consumer may read
    decode_lens: np.ndarray  # int32 [N_d]
    per_req_decode_lens: np.ndarray  # int32 [B]
    before: DecodeBuffers  # the buffers as the step found them (NumPy)


def block_table_width(config: EngineConfig) -> int:
    """The model runner's block-table width for ``config``'s pages (see
    :func:`~attnfuzz.reference.batch.runner_table_width`)."""
    return runner_table_width(config.max_model_len, config.block_size)


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    """The step's metadata and its ragged split (the flattening path's)."""
    meta = build_common_metadata(case.config, case.batch)
    return meta, split_decodes_and_prefills(meta, case.config.threshold)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> FlattenDecodeInputs:
    """The step of ``case``; the builder's buffers hold stale values from the seed."""
    config = case.config
    meta, split = describe(case)
    M, W = config.max_num_batched_tokens, block_table_width(config)
    # The runner's table: the model's columns, then columns no request ever wrote.
    wide = np.zeros((meta.num_reqs, W), dtype=np.int32)
    wide[:, : meta.block_table.shape[1]] = meta.block_table
    meta = dataclasses.replace(meta, block_table=wide)
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)

    def stale(lo: int, hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=gen).to(torch.int32).to(device)

    # Stale lengths of earlier steps, negative ones too, and page ids of the cache.
    buffers = DecodeBuffers(
        context_lens=stale(-9, config.max_model_len + 9, M),
        block_table=stale(0, meta.num_blocks, M, W),
        decode_lens=stale(0, config.next_n + 3, M),
        per_req_decode_lens=stale(0, config.next_n + 3, M),
    )

    def dev(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x)).to(device)

    return FlattenDecodeInputs(
        config=config,
        common=meta,
        split=split,
        seq_lens=dev(meta.seq_lens),
        query_start_loc=dev(meta.query_start_loc),
        block_table=dev(meta.block_table),
        buffers=buffers,
    )


def reference(case: Case | None, inputs: FlattenDecodeInputs) -> FlattenDecodeExpected:
    """Per flattened token, by plain loops; and the buffers before the step."""
    before = inputs.buffers.numpy()
    seq_lens = inputs.seq_lens.cpu().numpy()
    qsl = inputs.query_start_loc.cpu().numpy()
    table = inputs.block_table.cpu().numpy()
    bs = inputs.config.block_size
    B, N_d, W = inputs.num_decodes, inputs.num_decode_tokens, table.shape[1]
    context_lens = np.zeros(N_d, dtype=np.int32)
    expanded = np.full((N_d, W), -1, dtype=np.int32)  # -1: an entry no consumer reads
    pages = np.zeros((N_d, W), dtype=bool)
    for b in range(B):
        d = int(qsl[b + 1] - qsl[b])
        for j in range(d):
            i = int(qsl[b]) + j
            context_lens[i] = int(seq_lens[b]) - d + j + 1
            n = cdiv(int(context_lens[i]), bs)
            expanded[i, :n] = table[b, :n]
            pages[i, :n] = True
    for i in range(inputs.num_real_decode_tokens, N_d):  # padded tokens of a graph
        expanded[i, 0] = PAD_PAGE
        pages[i, 0] = True
    buffer = before.context_lens.copy()
    if B:  # a step without decodes leaves the buffer alone
        buffer[: inputs.num_real_decode_tokens] = context_lens[: inputs.num_real_decode_tokens]
        buffer[inputs.num_real_decode_tokens :] = 0
    d = np.asarray(inputs.split.decode_lens, dtype=np.int32)
    return FlattenDecodeExpected(
        context_lens=context_lens,
        context_lens_buffer=buffer,
        block_table=expanded,
        pages=pages,
        decode_lens=np.ones(N_d, dtype=np.int32),
        per_req_decode_lens=d,
        before=before,
    )
