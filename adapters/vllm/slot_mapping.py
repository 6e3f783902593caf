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

Both kernels are ``@triton.jit`` and run under the Triton interpreter here.
Each adapter keeps one block-table object per engine shape, as the runner
keeps one for its life, and before every step fills its persistent buffers
with what the case says they hold (stale rows and stale slots included).
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  - sets TRITON_INTERPRET before vLLM is imported
import torch
from attnfuzz.adapters.vllm import _engine  # noqa: F401  - vLLM's environment, before vLLM
from attnfuzz.reference.slot_mapping import SlotMappingInputs, SlotMappingOutputs


def prepare() -> None:
    """Import both block-table modules (and with them vLLM) before a judge forks."""
    import vllm.v1.worker.block_table  # noqa: F401
    import vllm.v1.worker.gpu.block_table  # noqa: F401


@cache
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


@cache
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
