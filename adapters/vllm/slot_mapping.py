"""vLLM's slot mapping, as the implementations ``vllm`` and ``vllm-v1`` of ``slot-mapping``.

- ``run``: the V2 model runner (the default of vLLM 0.33.0,
  ``VllmConfig.use_v2_model_runner``): ``vllm/v1/worker/gpu/block_table.py``
  ``BlockTables.compute_slot_mappings`` and its ``_compute_slot_mappings_kernel``,
  as ``GPUModelRunner.prepare_attn`` (``vllm/v1/worker/gpu/model_runner.py``)
  calls it: the step's ``idx_mapping`` (request -> state row), query start
  locations, positions and ``num_tokens_padded``.
- ``run_v1``: the V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``):
  ``vllm/v1/worker/block_table.py`` ``BlockTable.compute_slot_mapping`` and its
  ``ComputeSlotMappingKernel``, as ``GPUModelRunner._prepare_inputs``
  (``vllm/v1/worker/gpu_model_runner.py``) calls it, then the view
  ``slot_mapping.gpu[:num_tokens_padded]`` the runner hands to attention.

- ``upstream_stale_padding``: the V2 kernel with #36580 reverted (padding
  from the padded token count), an upstream mutant.

The kernels are ``@triton.jit`` and run under the Triton interpreter here.
Each adapter keeps one block-table object per engine shape, as the runner
keeps one for its life, and before every step fills its persistent buffers
with what the case says they hold (stale rows and stale slots included).
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  - sets TRITON_INTERPRET before vLLM is imported
import torch
from attnfuzz.adapters.vllm import _engine  # noqa: F401  - vLLM's environment, before vLLM
from attnfuzz.harness.blame import under_test
from attnfuzz.kernels._triton import tl, triton
from attnfuzz.reference.slot_mapping import SlotMappingInputs, SlotMappingOutputs
from vllm.v1.worker.gpu.buffer_utils import _load_ptr


def prepare() -> None:
    """Import both block-table modules (and with them vLLM) before a judge forks."""
    import vllm.v1.worker.block_table  # noqa: F401
    import vllm.v1.worker.gpu.block_table  # noqa: F401


@lru_cache(maxsize=4)  # a few engine shapes at a time: every draw brings its own
def _block_tables(
    max_num_seqs: int, max_num_batched_tokens: int, width: int, block_size: int, device: str
) -> Any:
    """The V2 runner's ``BlockTables`` for one KV-cache group of ``block_size`` pages.

    ``BlockTables.__init__`` stages its block tables in pinned host memory
    (``StagedWriteTensor``), which needs CUDA; the step's slot mapping reads only
    the device side. So the object is made as ``__init__`` makes it for one
    group, each persistent tensor a plain device tensor of the same shape and
    dtype, and vLLM's own ``init_block_table_layout_tensors`` derives the
    pointer, stride and size tensors the kernel reads. Nothing of
    ``compute_slot_mappings`` is replaced.
    """
    from vllm.v1.worker.gpu.block_table import BlockTables

    dev = torch.device(device)
    bt = BlockTables.__new__(BlockTables)
    bt.block_sizes = [block_size]
    bt.max_num_reqs = max_num_seqs
    bt.max_num_batched_tokens = max_num_batched_tokens
    bt.device = dev
    bt.cp_size, bt.cp_rank, bt.cp_interleave = 1, 0, 1
    bt.num_kv_cache_groups = 1
    bt._slot_mapping_enabled = [True]
    bt.dcp_sharded = torch.tensor([True], dtype=torch.bool, device=dev)
    bt._sliding_window_reach = [0]
    bt.has_sliding_window_groups = False
    staged = torch.zeros((max_num_seqs, width), dtype=torch.int32, device=dev)
    bt.block_tables = [SimpleNamespace(gpu=staged)]  # the device side of a StagedWriteTensor
    bt.input_block_tables = [torch.zeros_like(staged)]
    bt._num_dirty_rows = 0
    bt.slot_mappings = torch.zeros(1, max_num_batched_tokens, dtype=torch.int64, device=dev)
    bt.init_block_table_layout_tensors()
    return bt


def _key(inputs: SlotMappingInputs) -> tuple[int, int, int, int, str]:
    seqs, width = inputs.block_table.shape
    device = str(inputs.slot_mapping_buffer.device)
    return seqs, inputs.max_num_tokens, width, inputs.block_size, device


def run(inputs: SlotMappingInputs) -> SlotMappingOutputs:
    """V2 runner: ``BlockTables.compute_slot_mappings``, unchanged."""
    bt = _block_tables(*_key(inputs))
    # The persistent buffers as the step finds them.
    bt.block_tables[0].gpu.copy_(inputs.block_table)
    bt.slot_mappings[0].copy_(inputs.slot_mapping_buffer)
    out = bt.compute_slot_mappings(
        inputs.req_state_rows,
        inputs.query_start_loc,
        inputs.positions,
        num_tokens_padded=inputs.num_tokens_padded,
    )
    return SlotMappingOutputs(out[0], bt.slot_mappings[0])


@lru_cache(maxsize=4)  # a few engine shapes at a time: every draw brings its own
def _block_table_v1(
    max_num_seqs: int, max_num_batched_tokens: int, width: int, block_size: int, device: str
) -> Any:
    """The V1 runner's ``BlockTable`` of one KV-cache group (no context parallelism)."""
    from vllm.v1.worker.block_table import BlockTable

    return BlockTable(
        block_size=block_size,
        max_num_reqs=max_num_seqs,
        max_num_blocks_per_req=width,
        max_num_batched_tokens=max_num_batched_tokens,
        pin_memory=False,
        device=torch.device(device),
        cp_kv_cache_interleave_size=1,
    )


def run_v1(inputs: SlotMappingInputs) -> SlotMappingOutputs:
    """V1 runner: ``BlockTable.compute_slot_mapping``, unchanged.

    The V1 runner's input batch keeps request ``r``'s row at row ``r`` of its
    block table (it condenses the batch on the host), so the step's rows are
    gathered there first; the rows after them keep the persistent table's
    stale content. Positions are those of the real tokens
    (``self.positions[:total_num_scheduled_tokens]``).
    """
    bt = _block_table_v1(*_key(inputs))
    table = bt.block_table.gpu
    table.copy_(inputs.block_table)
    R, T = inputs.num_reqs, inputs.num_tokens
    table[:R] = inputs.block_table[inputs.req_state_rows]
    bt.slot_mapping.gpu.copy_(inputs.slot_mapping_buffer)
    bt.compute_slot_mapping(R, inputs.query_start_loc, inputs.positions[:T])
    buffer = bt.slot_mapping.gpu
    return SlotMappingOutputs(buffer[: inputs.num_tokens_padded], buffer)


# -- upstream mutant: #36580 reverted -------------------------------------------------


@under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
@triton.jit
def _compute_slot_mappings_kernel_pre_pr36580(
    num_tokens,  # pre-fix: positions.shape[0], the padded token count
    max_num_tokens,
    idx_mapping,  # [num_reqs]
    query_start_loc,  # [num_reqs + 1]
    pos,  # [num_tokens]
    block_table_ptrs,  # [num_kv_cache_groups]
    block_table_strides,  # [num_kv_cache_groups]
    block_sizes,  # [num_kv_cache_groups]
    slot_mapping_enabled,  # [num_kv_cache_groups]
    dcp_sharded,  # [num_kv_cache_groups]
    slot_mappings_ptr,  # [num_kv_cache_groups, max_num_tokens]
    slot_mappings_stride,
    cp_rank,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
):
    """vLLM 0.33.0's ``_compute_slot_mappings_kernel`` with the fix of #36580
    ("[Model Runner V2] Fix ``_compute_slot_mappings_kernel`` for chunked
    prefill") reverted. The lines that differ: the padding loop starts at the
    ``num_tokens`` argument, as before the fix,

        for i in range(num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):

    where 0.33.0 starts at the real token count,

        actual_num_tokens = tl.load(query_start_loc + batch_idx)
        for i in range(actual_num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):

    and ``num_tokens`` is the kernel's first argument again. The pre-fix lines
    are those of a stored copy of an earlier ``vllm/v1/worker/gpu/block_table.py``;
    that #36580 is the fix is read from its title and from the comment 0.33.0
    carries on these lines. The rest is 0.33.0's kernel, line for line.
    """
    # kv cache group id
    group_id = tl.program_id(0)
    batch_idx = tl.program_id(1)
    slot_mapping_ptr = slot_mappings_ptr + group_id * slot_mappings_stride

    if batch_idx == tl.num_programs(1) - 1:
        # Pad remaining slots to -1. This is needed for CUDA graphs.
        for i in range(num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):
            offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(slot_mapping_ptr + offset, PAD_ID, mask=offset < max_num_tokens)
        return

    block_table_ptr = _load_ptr(block_table_ptrs + group_id, tl.int32)
    block_table_stride = tl.load(block_table_strides + group_id)
    kv_block_size = tl.load(block_sizes + group_id)
    mapping_enabled = tl.load(slot_mapping_enabled + group_id)
    if CP_SIZE != 1:
        sharded = tl.load(dcp_sharded + group_id)

    req_state_idx = tl.load(idx_mapping + batch_idx)
    # idx_mapping == -1 marks a dummy (or CUDA-graph padding) request that owns
    # no blocks: never read its block-table row and emit PAD for its tokens.
    is_real_req = req_state_idx >= 0
    start_idx = tl.load(query_start_loc + batch_idx)
    end_idx = tl.load(query_start_loc + batch_idx + 1)
    for i in range(start_idx, end_idx, TRITON_BLOCK_SIZE):
        offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
        positions = tl.load(pos + offset, mask=offset < end_idx, other=0)

        if CP_SIZE == 1:
            # Common case: Context parallelism is not used.
            local_positions = positions
            is_local = True
        else:
            # Context parallelism is used.
            virtual_block_size = kv_block_size * CP_SIZE
            virtual_block_indices = positions // virtual_block_size
            virtual_block_offsets = positions % virtual_block_size
            is_local = virtual_block_offsets // CP_INTERLEAVE % CP_SIZE == cp_rank
            rounds = virtual_block_offsets // (CP_INTERLEAVE * CP_SIZE)
            remainder = virtual_block_offsets % CP_INTERLEAVE
            local_offsets = rounds * CP_INTERLEAVE + remainder
            local_positions = virtual_block_indices * kv_block_size + local_offsets
            local_positions = tl.where(sharded, local_positions, positions)
            is_local = ~sharded | is_local

        block_indices = tl.where(mapping_enabled, local_positions // kv_block_size, 0)
        block_offsets = local_positions % kv_block_size
        block_numbers = tl.load(
            block_table_ptr + req_state_idx * block_table_stride + block_indices,
            mask=is_local & is_real_req,
            other=0,
        )
        slot_ids = block_numbers * kv_block_size + block_offsets
        if CP_SIZE != 1:
            slot_ids = tl.where(is_local, slot_ids, PAD_ID)

        slot_ids = tl.where(mapping_enabled & is_real_req, slot_ids, PAD_ID)
        tl.store(slot_mapping_ptr + offset, slot_ids, mask=offset < end_idx)


@under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
def launch_pre_pr36580(
    tables: Any,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    num_tokens: int,
) -> torch.Tensor:
    """``BlockTables.compute_slot_mappings`` of 0.33.0 launching the pre-#36580 kernel
    on ``tables`` (a V2 ``BlockTables``), its padding program starting at
    ``num_tokens``; the two upstream mutants of #36580 (this target's and
    ``unpadding``'s) share it. Returns the ``[groups, max_num_tokens]`` buffer."""
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID

    slot_mappings = tables.slot_mappings
    _compute_slot_mappings_kernel_pre_pr36580[
        (tables.num_kv_cache_groups, idx_mapping.shape[0] + 1)
    ](
        num_tokens,
        slot_mappings.shape[1],
        idx_mapping,
        query_start_loc,
        positions,
        tables.block_table_ptrs,
        tables.block_table_strides,
        tables.block_sizes_tensor,
        tables.slot_mapping_enabled,
        tables.dcp_sharded,
        slot_mappings,
        slot_mappings.stride(0),
        tables.cp_rank,
        CP_SIZE=tables.cp_size,
        CP_INTERLEAVE=tables.cp_interleave,
        PAD_ID=PAD_SLOT_ID,
        TRITON_BLOCK_SIZE=1024,
    )
    return slot_mappings


def upstream_stale_padding(inputs: SlotMappingInputs) -> SlotMappingOutputs:
    """vLLM 0.33.0's ``BlockTables.compute_slot_mappings`` with #36580 reverted.

    The method is 0.33.0's but for the launch: the pre-fix kernel above, given
    ``positions.shape[0]`` as ``num_tokens`` as the pre-fix method did. The
    runner hands it positions of the padded length, so a graph's padded tokens
    ``T .. T_pad`` keep the slots an earlier, longer step wrote there: the
    step's padding K/V overwrites another request's cache.
    """
    bt = _block_tables(*_key(inputs))
    bt.block_tables[0].gpu.copy_(inputs.block_table)
    bt.slot_mappings[0].copy_(inputs.slot_mapping_buffer)
    positions = inputs.positions
    # The pre-fix method passed positions.shape[0], the padded length, as num_tokens.
    slot_mappings = launch_pre_pr36580(
        bt, inputs.req_state_rows, inputs.query_start_loc, positions, positions.shape[0]
    )
    return SlotMappingOutputs(slot_mappings[0, : inputs.num_tokens_padded], bt.slot_mappings[0])
