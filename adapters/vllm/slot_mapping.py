"""vLLM's slot mapping, as the implementations ``vllm`` and ``vllm-v1`` of ``slot-mapping``.

- ``run``: the V2 model runner (the default of vLLM 0.33.0,
  ``VllmConfig.use_v2_model_runner``): ``vllm/v1/worker/gpu/block_table.py``
  ``BlockTables.compute_slot_mappings`` and its ``_compute_slot_mappings_kernel``,
  as ``GPUModelRunner.prepare_attn`` (``vllm/v1/worker/gpu/model_runner.py``)
  calls it: the step's ``idx_mapping`` (request -> state row), query start
  locations, positions and ``num_tokens_padded``.
- ``run_v1``: the V1 model runner (``VLLM_USE_V2_MODEL_RUNNER=0``):
  ``vllm/v1/worker/block_table.py`` ``BlockTable.compute_slot_mapping`` and its
  kernel, as ``GPUModelRunner._prepare_inputs``
  (``vllm/v1/worker/gpu_model_runner.py``) calls it, then the view
  ``slot_mapping.gpu[:num_tokens_padded]`` the runner hands to attention.

- ``upstream_stale_padding``: the V2 method with #36580 reverted in its kernel
  (padding from the padded token count), an upstream mutant.

Every release from 0.21.0 to 0.33.0 has both methods and calls them as above;
what moves between releases is how their objects are made, and each is made by
the release's own ``__init__`` with the arguments its signature asks for:
``BlockTables(kernel_block_sizes=)`` and ``BlockTable(kernel_block_size=)``
from 0.22.0 and 0.21.0 to 0.31.0 (the case's pages are the attention kernel's
blocks). The kernels are ``@triton.jit`` and run under the Triton interpreter
here. Each adapter keeps one block-table object per engine shape, as the runner
keeps one for its life, and before every step fills its persistent buffers
with what the case says they hold (stale rows and stale slots included).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache, lru_cache
from typing import Any
from unittest import mock

import attnfuzz.kernels._triton  # noqa: F401  - sets TRITON_INTERPRET before vLLM is imported
import torch
from attnfuzz.adapters.vllm import _engine, compat  # noqa: F401  - _engine: vLLM's environment
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.slot_mapping import SlotMappingInputs, SlotMappingOutputs


def prepare() -> None:
    """Import the block-table modules of the release (and with them vLLM) before a judge
    forks (``compat.has`` imports the module it looks in)."""
    compat.has(compat.GPU_BLOCK_TABLES)
    compat.has(compat.V1_BLOCK_TABLE)


# -- the runner's persistent objects, as the release makes them -------------------------


class _HostBuffer:
    """``vllm/v1/worker/gpu/buffer_utils.py`` ``UvaBuffer`` of a release before 0.30.0,
    on a CPU device.

    The release's ``UvaBuffer`` pins host memory and takes the accelerator's view of it
    (``get_accelerator_view_from_cpu_tensor``); CPU-only torch has no pinned memory,
    and those releases have no fallback (0.30.0 adds ``NonUvaBuffer``). On a CPU device
    the host memory is the device's, so the device's view of the buffer is the buffer
    itself: what UVA gives a GPU (it reads the host's writes, no copy).
    """

    def __init__(self, size: int | Sequence[int], dtype: torch.dtype):
        self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
        self.np = self.cpu.numpy()
        self.uva = self.cpu


@contextmanager
def host_memory(device: torch.device) -> Iterator[None]:
    """While the runner's objects for ``device`` are made and used: host memory that
    CPU-only torch can allocate, which has no pinned memory.

    - Buffers: vLLM's CPU platform claims UVA (from 0.23.0). Where the release has
      ``NonUvaBuffer`` (0.30.0), ``is_uva_available`` is answered False and vLLM's own
      buffers for a platform without UVA are made; before, the release's ``UvaBuffer``
      is :class:`_HostBuffer`.
    - Copies: ``StagedWriteTensor.apply_write`` stages through ``async_tensor_h2d``,
      which pins by default where it takes ``pin_memory=`` (0.21.0 to 0.23.0: the
      default ``PIN_MEMORY`` is True on any Linux); it is given the platform's answer,
      ``is_pin_memory_available()``, which 0.24.0 makes its default.

    The kernels under test are the same either way. Any other device is left as it is.
    """
    if device.type != "cpu":
        yield
        return
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils
    from vllm.utils.platform_utils import is_pin_memory_available

    with contextlib.ExitStack() as stack:
        if compat.has(compat.NON_UVA_BUFFER):
            stack.enter_context(mock.patch.object(buffer_utils, "is_uva_available", lambda: False))
        else:
            stack.enter_context(mock.patch.object(buffer_utils, "UvaBuffer", _HostBuffer))
        if compat.has(compat.H2D_PIN_MEMORY):
            h2d = functools.partial(
                torch_utils.async_tensor_h2d, pin_memory=is_pin_memory_available()
            )
            stack.enter_context(mock.patch.object(buffer_utils, "async_tensor_h2d", h2d))
        yield


def new_block_tables(
    block_size: int,
    max_num_reqs: int,
    max_num_batched_tokens: int,
    max_num_blocks: int,
    device: torch.device,
) -> Any:
    """The V2 runner's ``BlockTables`` for one KV-cache group of ``block_size`` pages, made
    by the release's own ``__init__`` (context parallelism off, as in the cases)."""
    from vllm.v1.worker.gpu.block_table import BlockTables

    kwargs: dict[str, Any] = {}
    if compat.has(compat.V2_KERNEL_BLOCK_SIZES):
        # 0.22.0-0.31.0: the table holds the attention kernel's block ids; the case's
        # pages are the kernel's blocks (one per KV-cache block).
        kwargs["kernel_block_sizes"] = [block_size]
    with host_memory(device):
        return BlockTables(
            [block_size], max_num_reqs, max_num_batched_tokens, [max_num_blocks], device, **kwargs
        )


@lru_cache(maxsize=4)  # a few engine shapes at a time: every draw brings its own
def _block_tables(
    max_num_seqs: int, max_num_batched_tokens: int, width: int, block_size: int, device: str
) -> Any:
    return new_block_tables(
        block_size, max_num_seqs, max_num_batched_tokens, width, torch.device(device)
    )


def _key(inputs: SlotMappingInputs) -> tuple[int, int, int, int, str]:
    seqs, width = inputs.block_table.shape
    device = str(inputs.slot_mapping_buffer.device)
    return seqs, inputs.max_num_tokens, width, inputs.block_size, device


def _fill(tables: Any, inputs: SlotMappingInputs) -> None:
    """The persistent buffers as the step finds them (the device side of the staged table)."""
    tables.block_tables[0].gpu.copy_(inputs.block_table)
    tables.slot_mappings[0].copy_(inputs.slot_mapping_buffer)


def run(inputs: SlotMappingInputs) -> SlotMappingOutputs:
    """V2 runner: ``BlockTables.compute_slot_mappings``, unchanged."""
    bt = _block_tables(*_key(inputs))
    _fill(bt, inputs)
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

    kwargs: dict[str, Any] = {}
    if compat.has(compat.V1_KERNEL_BLOCK_SIZE):
        # 0.21.0-0.31.0: the attention kernel's block size; the case's pages are its blocks.
        kwargs["kernel_block_size"] = block_size
    return BlockTable(
        block_size=block_size,
        max_num_reqs=max_num_seqs,
        max_num_blocks_per_req=width,
        max_num_batched_tokens=max_num_batched_tokens,
        pin_memory=False,
        device=torch.device(device),
        cp_kv_cache_interleave_size=1,
        **kwargs,
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

# #36580 ("[Model Runner V2] Fix ``_compute_slot_mappings_kernel`` for chunked prefill")
# made the kernel's padding program start at the real token count. Before it (stored
# copies of the pre-fix ``vllm/v1/worker/gpu/block_table.py``) the kernel took the count
# as its first argument, ``num_tokens``, and padded from there. Every release from
# 0.21.0 to 0.33.0 carries the fixed lines below, each exactly once (checked on each
# release's source); the reverted kernel is the installed release's, all else unchanged.
_PR36580_REVERTED = (
    (
        "def _compute_slot_mappings_kernel(\n    max_num_tokens,\n",
        "def _compute_slot_mappings_kernel(\n    num_tokens,\n    max_num_tokens,\n",
    ),
    (
        "        # Start from actual token count (not padded) to cover the gap\n"
        "        # between actual tokens and padded tokens that can contain stale\n"
        "        # valid slot IDs from previous chunks during chunked prefill.\n"
        "        actual_num_tokens = tl.load(query_start_loc + batch_idx)\n"
        "        for i in range(actual_num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):\n",
        "        for i in range(num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):\n",
    ),
)


def pr36580_source() -> str:
    """The source of the installed release's ``_compute_slot_mappings_kernel`` (with its
    ``@triton.jit``) with exactly the lines of ``_PR36580_REVERTED`` replaced."""
    from vllm.v1.worker.gpu import block_table

    source = inspect.getsource(block_table._compute_slot_mappings_kernel.fn)
    for fixed, pre_fix in _PR36580_REVERTED:
        if source.count(fixed) != 1:
            first = fixed.strip().splitlines()[-1]
            raise RuntimeError(f"vLLM's _compute_slot_mappings_kernel no longer has: {first}")
        source = source.replace(fixed, pre_fix)
    return source


@cache
def _pre_pr36580_kernel() -> Any:
    """:func:`pr36580_source`, compiled against (a copy of) its module's globals, so that it
    calls what the release's kernel calls (its ``_load_ptr``, from
    ``block_table.py`` before 0.24.0 and ``buffer_utils.py`` after), and decorated as
    the release decorates it."""
    from vllm.v1.worker.gpu import block_table

    source = pr36580_source()
    filename = "<vllm/v1/worker/gpu/block_table.py _compute_slot_mappings_kernel, #36580 reverted>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scratch: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), dict(vars(block_table)), scratch)  # noqa: S102
    return under_test(scratch["_compute_slot_mappings_kernel"])


class _PreFixLaunch:
    """Stands for the module's ``_compute_slot_mappings_kernel`` while the release's
    ``BlockTables.compute_slot_mappings`` runs: its launch ``kernel[grid](*args)``
    becomes ``reverted[grid](num_tokens, *args)``, the pre-fix launch."""

    def __init__(self, kernel: Any, num_tokens: int):
        self.kernel, self.num_tokens = kernel, num_tokens

    def __getitem__(self, grid: Any) -> Any:
        return functools.partial(self.kernel[grid], self.num_tokens)


def compute_slot_mappings_pre_pr36580(
    tables: Any,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    num_tokens: int,
    num_tokens_padded: int,
) -> torch.Tensor:
    """The release's ``BlockTables.compute_slot_mappings`` on ``tables``, unchanged, its
    kernel launched with #36580 reverted: the padding program starts at ``num_tokens``.
    The two upstream mutants of #36580 (this target's and ``unpadding``'s) share it.
    Returns the method's ``[groups, num_tokens_padded]`` view."""
    from vllm.v1.worker.gpu import block_table

    launch = _PreFixLaunch(_pre_pr36580_kernel(), num_tokens)
    with mock.patch.object(block_table, "_compute_slot_mappings_kernel", launch):
        return tables.compute_slot_mappings(
            idx_mapping, query_start_loc, positions, num_tokens_padded=num_tokens_padded
        )


def upstream_stale_padding(inputs: SlotMappingInputs) -> SlotMappingOutputs:
    """The release's ``BlockTables.compute_slot_mappings`` with #36580 reverted.

    The pre-fix method passed ``positions.shape[0]`` as ``num_tokens``. The runner
    hands it positions of the padded length, so a graph's padded tokens
    ``T .. T_pad`` keep the slots an earlier, longer step wrote there: the step's
    padding K/V overwrites another request's cache.
    """
    bt = _block_tables(*_key(inputs))
    _fill(bt, inputs)
    positions = inputs.positions
    out = compute_slot_mappings_pre_pr36580(
        bt,
        inputs.req_state_rows,
        inputs.query_start_loc,
        positions,
        positions.shape[0],  # pre-fix: the padded length, as num_tokens
        inputs.num_tokens_padded,
    )
    return SlotMappingOutputs(out[0], bt.slot_mappings[0])
