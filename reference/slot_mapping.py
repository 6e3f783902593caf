"""Reference of the slot mapping: the KV-cache slot each new token is written to.

docs/domain.md, sections 3 and 4. Token ``j`` of request ``r`` sits at position
``pos = seq_len[r] - q_len[r] + j`` and is written to

    slot = block_table[r, pos // block_size] * block_size + pos % block_size

The engine computes it once per step into a persistent int64 buffer of
``max_num_batched_tokens`` slots and hands the attention layers the view of its
first ``T_pad`` slots; ``T_pad`` is the runner's padded token count on every
graph step of Model Runner V2 (PIECEWISE ones included: ``prepare_attn`` of
``vllm/v1/worker/gpu/model_runner.py`` passes ``num_tokens_after_padding``), and
on V1's FULL steps or where a backend updates the KV cache outside
``forward`` (``has_separate_kv_update`` in ``GPUModelRunner.execute_model``).
Two storage facts are part of the contract (vLLM 0.33.0,
``vllm/v1/worker/gpu/block_table.py``, ``_compute_slot_mappings_kernel``, and
the V1 runner's ``vllm/v1/worker/block_table.py``, ``ComputeSlotMappingKernel``,
write the same):

- every slot from the real token count ``T`` to the end of the buffer holds
  ``PAD_SLOT_ID`` (-1), not only the padded tokens ``T .. T_pad`` of this step:
  the slots past ``T`` may hold valid-looking ids of earlier, longer steps, and
  a kernel of a replayed graph may read past ``T`` (the comments of both
  kernels and of ``BlockTables.get_dummy_slot_mappings`` say so);
- the step's view starts at the buffer's first element (a CUDA graph replays
  on fixed addresses).

Block tables. The model runner (V2, the default of vLLM 0.33.0) keeps one
persistent ``[max_num_seqs, W]`` block table indexed by a request's *state
row*, and the step maps its batch index ``r`` to ``req_state_rows[r]``
(vLLM's ``idx_mapping``). The rows of requests not in the step hold stale
page ids. The inputs draw those rows from the seed, so an implementation that
reads the batch row instead of the state row reads the wrong pages. Its width is the
runner's, aligned to whole 128-token spans
(:func:`attnfuzz.reference.batch.runner_table_width`); columns past
``max_blocks_per_seq`` are 0, as no request ever writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    EngineConfig,
    build_common_metadata,
    runner_table_width,
)

PAD_SLOT_ID = -1
"""Slot of a token that must not be written to the cache (padding)."""

_DATA_SEED_SALT = 0x510F  # keeps the stale-buffer stream apart from the page-id stream


@dataclass
class SlotMappingInputs:
    """What the model runner has at hand for one step (tensors on the implementation's device).

    ``block_table`` and ``slot_mapping_buffer`` are the engine's persistent
    buffers as the step finds them; the step writes the latter only.
    """

    config: EngineConfig
    common: CommonMetadata  # the step's metadata (padded sizes), as the reference builds it
    query_start_loc: torch.Tensor  # int32 [R+1], real requests
    seq_lens: torch.Tensor  # int32 [R], real requests
    positions: torch.Tensor  # int64 [T_pad]: real tokens' positions, then stale values
    req_state_rows: torch.Tensor  # int64 [R]: row of request r in the persistent block table
    block_table: torch.Tensor  # int32 [max_num_seqs, W]: persistent, stale rows included
    slot_mapping_buffer: torch.Tensor  # int64 [max_num_batched_tokens]: stale slots
    num_reqs: int  # R, real requests
    num_tokens: int  # T, real tokens
    num_tokens_padded: int  # T_pad
    block_size: int

    @property
    def max_num_tokens(self) -> int:
        return int(self.slot_mapping_buffer.shape[0])


@dataclass
class SlotMappingOutputs:
    slot_mapping: torch.Tensor  # int64 [T_pad], a view of the buffer's first T_pad slots
    buffer: torch.Tensor  # the persistent buffer the implementation wrote into


@dataclass
class SlotMappingExpected:
    slot_mapping: np.ndarray  # int64 [T_pad]
    buffer: np.ndarray  # int64 [max_num_batched_tokens]: the whole buffer after the step


def make_inputs(case: Case, device: torch.device | str = "cpu") -> SlotMappingInputs:
    """The step of ``case``; stale block-table rows, positions and slots from the seed."""
    config, batch = case.config, case.batch
    meta = build_common_metadata(config, batch)
    R, T = meta.num_real_reqs, meta.num_real_tokens
    gen = torch.Generator().manual_seed(batch.seed ^ _DATA_SEED_SALT)
    width = runner_table_width(config.max_model_len, config.block_size)
    # State rows: a seeded choice of R distinct rows of the persistent table.
    rows = torch.randperm(config.max_num_seqs, generator=gen)[:R].to(torch.int64)
    table = torch.randint(0, meta.num_blocks, (config.max_num_seqs, width), generator=gen)
    table = table.to(torch.int32)
    table[:, config.max_blocks_per_seq :] = 0  # columns no request writes
    table[rows, : config.max_blocks_per_seq] = torch.as_tensor(meta.block_table[:R])
    # Stale slots of earlier steps: valid-looking ids, never -1.
    num_slots = meta.num_blocks * config.block_size
    stale = torch.randint(0, num_slots, (config.max_num_batched_tokens,), generator=gen)
    T_pad = meta.slot_mapping_tokens  # the runner's padded count, on unpadded steps too
    positions = torch.randint(0, config.max_model_len, (T_pad,), generator=gen)
    q_lens = meta.query_lens[:R]
    for r in range(R):
        start = int(meta.query_start_loc[r])
        first = int(meta.seq_lens[r]) - int(q_lens[r])
        positions[start : start + int(q_lens[r])] = torch.arange(first, first + int(q_lens[r]))
    return SlotMappingInputs(
        config=config,
        common=meta,
        query_start_loc=torch.as_tensor(meta.query_start_loc[: R + 1].copy()).to(device),
        seq_lens=torch.as_tensor(meta.seq_lens[:R].copy()).to(device),
        positions=positions.to(torch.int64).to(device),
        req_state_rows=rows.to(device),
        block_table=table.to(device),
        slot_mapping_buffer=stale.to(torch.int64).to(device),
        num_reqs=R,
        num_tokens=T,
        num_tokens_padded=T_pad,
        block_size=config.block_size,
    )


def reference(case: Case | None, inputs: SlotMappingInputs) -> SlotMappingExpected:
    """The slot of every token, by plain loops, and the whole buffer after the step."""
    bs = inputs.block_size
    qsl = inputs.query_start_loc.cpu().numpy()
    seq_lens = inputs.seq_lens.cpu().numpy()
    rows = inputs.req_state_rows.cpu().numpy()
    table = inputs.block_table.cpu().numpy()
    buffer = np.full(inputs.max_num_tokens, PAD_SLOT_ID, dtype=np.int64)
    for r in range(inputs.num_reqs):
        q_len = int(qsl[r + 1] - qsl[r])
        for j in range(q_len):
            pos = int(seq_lens[r]) - q_len + j
            page = int(table[rows[r], pos // bs])
            buffer[int(qsl[r]) + j] = page * bs + pos % bs
    return SlotMappingExpected(buffer[: inputs.num_tokens_padded].copy(), buffer)
