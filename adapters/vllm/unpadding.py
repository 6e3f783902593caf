"""vLLM's CUDA-graph padding (model runner V2) and ``CommonAttentionMetadata.unpadded``
as the implementation ``vllm`` of ``unpadding``.

What runs, unchanged (each release from 0.21.0 to 0.33.0 has all of it):

- ``vllm/v1/worker/gpu/block_table.py``: ``BlockTables`` with its own persistent
  buffers; ``append_block_ids`` and ``apply_staged_writes`` (the request-state
  table), ``gather_block_tables(idx_mapping, num_reqs_padded)`` (padding rows
  zeroed by ``_gather_block_tables_kernel``) and ``compute_slot_mappings``
  (``_compute_slot_mappings_kernel``: padded tokens get ``PAD_SLOT_ID``);
- ``vllm/v1/worker/gpu/input_batch.py``: ``InputBuffers`` and
  ``prepare_pos_seq_lens`` (``_prepare_pos_seq_lens_kernel``: positions, and
  ``seq_lens`` past the real requests set to 0);
- ``vllm/v1/attention/backend.py``: ``CommonAttentionMetadata`` and its ``unpadded``.

The Triton kernels run under the interpreter. Two things are the adapter's,
copied from ``vllm/v1/worker/gpu/model_runner.py`` ``prepare_inputs``
because they are inline there: the host ``query_start_loc`` with its padding
(``query_start_loc_np[num_reqs + 1:] = num_tokens``) copied into the
persistent buffer (``async_tensor_h2d(..., out=)`` from 0.30.0,
``buffer_utils.async_copy_to_gpu`` before), and the ``CommonAttentionMetadata``
fields as ``vllm/v1/worker/gpu/attn_utils.py`` ``build_attn_metadata`` sets them.
``BlockTables`` is made by the release's ``__init__`` with host buffers a
CPU-only torch can allocate (:func:`attnfuzz.adapters.vllm.slot_mapping.host_memory`);
the kernels under test are the same either way.

Each call first writes the case's stale content (what earlier steps left)
into vLLM's persistent buffers, so that what the padding must overwrite is
there to be seen.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  (TRITON_INTERPRET before vLLM's kernels are defined)
import numpy as np
import torch
from attnfuzz.adapters.vllm import _engine, compat
from attnfuzz.adapters.vllm.slot_mapping import (
    compute_slot_mappings_pre_pr36580,
    host_memory,
    new_block_tables,
)
from attnfuzz.reference.unpadding import StepMetadata, UnpaddingInputs, UnpaddingOutputs

_CPU = torch.device("cpu")


def prepare() -> None:
    _engine.prepare()
    import vllm.v1.worker.gpu.block_table  # noqa: F401
    import vllm.v1.worker.gpu.input_batch  # noqa: F401


@cache
def _runner_state(
    block_size: int, max_num_reqs: int, max_num_tokens: int, max_num_blocks: int
) -> tuple[Any, Any]:
    """vLLM's ``BlockTables`` and ``InputBuffers`` for one engine (allocated once, as the
    model runner does at start-up)."""
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    tables = new_block_tables(block_size, max_num_reqs, max_num_tokens, max_num_blocks, _CPU)
    return tables, InputBuffers(max_num_reqs, max_num_tokens, _CPU)


def _step(fields: Any, num_reqs: int, num_tokens: int) -> StepMetadata:
    return StepMetadata(
        fields.query_start_loc,
        fields.seq_lens,
        fields.block_table_tensor,
        fields.slot_mapping,
        num_reqs,
        num_tokens,
        fields.max_query_len,
    )


def pad_step(inputs: UnpaddingInputs, compute_slot_mappings: Any = None) -> tuple[Any, dict]:
    """The padded ``CommonAttentionMetadata`` of the step, and vLLM's persistent buffers."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.worker.gpu.input_batch import prepare_pos_seq_lens

    R, T = inputs.num_reqs, inputs.num_tokens
    R_pad, T_pad = inputs.num_reqs_padded, inputs.num_tokens_padded
    tables, buffers = _runner_state(
        inputs.block_size,
        inputs.max_num_seqs,
        inputs.max_num_batched_tokens,
        inputs.block_table_buffer.shape[1],
    )
    # what earlier steps left in the persistent buffers
    tables.input_block_tables[0].copy_(inputs.block_table_buffer)
    tables.slot_mappings[0].copy_(inputs.slot_mapping_buffer)
    buffers.query_start_loc.copy_(inputs.query_start_loc_buffer)
    buffers.seq_lens.copy_(inputs.seq_lens_buffer)

    # the requests' states: request r of the batch is request state r (staged through
    # host memory: what CPU-only torch can allocate, see host_memory)
    with host_memory(_CPU):
        for r in range(R):
            pages = inputs.block_table[r, : int(inputs.num_pages[r])].tolist()
            tables.append_block_ids(r, (pages,), overwrite=True)
        tables.apply_staged_writes()
    idx_mapping = torch.arange(R, dtype=torch.int32)
    num_computed = torch.zeros(inputs.max_num_seqs, dtype=torch.int32)
    num_computed[:R] = torch.as_tensor(inputs.num_computed_tokens)

    # model_runner.py prepare_inputs, inline there: query_start_loc and its padding
    query_start_loc_np = np.empty(inputs.max_num_seqs + 1, dtype=np.int32)
    query_start_loc_np[0] = 0
    np.cumsum(inputs.query_lens, out=query_start_loc_np[1 : R + 1])
    query_start_loc_np[R + 1 :] = T
    if compat.has(compat.H2D_OUT):
        from vllm.utils.torch_utils import async_tensor_h2d

        async_tensor_h2d(query_start_loc_np, out=buffers.query_start_loc)
    else:
        # Before 0.30.0: buffer_utils.async_copy_to_gpu(query_start_loc_np, out=...), which
        # is out.copy_(x, non_blocking=True) of x pinned first (0.24.0 to 0.29.0), and
        # CPU-only torch cannot pin; on a CPU device the copy is the same.
        buffers.query_start_loc.copy_(torch.from_numpy(query_start_loc_np), non_blocking=True)
    query_start_loc_np = query_start_loc_np[: R_pad + 1]
    query_start_loc = buffers.query_start_loc[: R_pad + 1]

    prepare_pos_seq_lens(
        idx_mapping, query_start_loc, num_computed, buffers.positions, buffers.seq_lens
    )
    seq_lens = buffers.seq_lens[:R_pad]
    block_tables = tables.gather_block_tables(idx_mapping, num_reqs_padded=R_pad)
    slot_fn = compute_slot_mappings or tables.compute_slot_mappings
    slot_mappings = slot_fn(
        idx_mapping, query_start_loc, buffers.positions, num_tokens_padded=T_pad
    )

    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=torch.from_numpy(query_start_loc_np),
        seq_lens=seq_lens,
        num_reqs=R_pad,
        num_actual_tokens=T_pad,
        max_query_len=int(inputs.query_lens.max()),
        max_seq_len=int((inputs.num_computed_tokens + inputs.query_lens).max()),
        block_table_tensor=block_tables[0],
        slot_mapping=slot_mappings[0],
    )
    owned = {
        "query_start_loc": buffers.query_start_loc,
        "seq_lens": buffers.seq_lens,
        "block_table": tables.input_block_tables[0],
        "slot_mapping": tables.slot_mappings[0],
    }
    return common, owned


def _run(inputs: UnpaddingInputs, compute_slot_mappings: Any = None) -> UnpaddingOutputs:
    common, owned = pad_step(inputs, compute_slot_mappings)
    unpadded = common.unpadded(inputs.num_tokens, inputs.num_reqs)
    return UnpaddingOutputs(
        _step(common, common.num_reqs, common.num_actual_tokens),
        _step(unpadded, unpadded.num_reqs, unpadded.num_actual_tokens),
        owned,
    )


def run(inputs: UnpaddingInputs) -> UnpaddingOutputs:
    return _run(inputs)


# -- upstream mutant: #36580 reverted ----------------------------------------------------


def _compute_slot_mappings_pre_pr36580(tables: Any) -> Any:
    """The release's ``BlockTables.compute_slot_mappings`` launching its kernel with
    #36580 reverted, given the padded token count as ``num_tokens``."""

    def compute_slot_mappings(
        idx_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        positions: torch.Tensor,
        num_tokens_padded: int,
    ) -> torch.Tensor:
        # pre-#36580: padding started at the padded token count
        return compute_slot_mappings_pre_pr36580(
            tables, idx_mapping, query_start_loc, positions, num_tokens_padded, num_tokens_padded
        )

    return compute_slot_mappings


def upstream_stale_slots(inputs: UnpaddingInputs) -> UnpaddingOutputs:
    """#36580 ("[Model Runner V2] Fix ``_compute_slot_mappings_kernel`` for chunked
    prefill") reverted: the release's ``_compute_slot_mappings_kernel`` with its padding
    program starting at a ``num_tokens`` argument, as before the fix::

        for i in range(num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):

    where every release from 0.21.0 to 0.33.0 has::

        actual_num_tokens = tl.load(query_start_loc + batch_idx)
        for i in range(actual_num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):

    Every other line is the release's. The pre-fix kernel line and its ``num_tokens``
    argument are as stored copies of the pre-fix ``block_table.py`` show them;
    that the caller passed the *padded* token count is reconstructed from the
    fix's comment ("Start from actual token count (not padded) to cover the gap
    between actual tokens and padded tokens that can contain stale valid slot
    IDs"), not read from the pre-fix caller. Padded tokens ``T .. T_pad`` keep
    the slots an earlier step left.
    """
    tables, _ = _runner_state(
        inputs.block_size,
        inputs.max_num_seqs,
        inputs.max_num_batched_tokens,
        inputs.block_table_buffer.shape[1],
    )
    return _run(inputs, _compute_slot_mappings_pre_pr36580(tables))
