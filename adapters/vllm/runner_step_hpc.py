"""vLLM's model runner V1 step on the HPC attention backend, as the implementation
``vllm-v1-hpc`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
vLLM's ``HPC_ATTN`` backend (``vllm/v1/attention/backends/hpc_attn.py``, Tencent's
hpc-ops kernels on an sm90 GPU), 1 KV head of 128, bf16. ``HpcAttnMetadataBuilder``
builds every step and capture run:

- the decode/prefill split at the reorder threshold ``1 + num_speculative_tokens``
  (``_init_reorder_batch_threshold(1, supports_spec_as_decode=True)``), uniform
  decodes with drafts (``require_uniform``), and ``decode_query_len`` (the decodes'
  tokens over their count): the decode kernel reads request ``i``'s queries at rows
  ``i * decode_query_len`` on (``attention_decode_bf16``'s ``mtp`` is one less);
- the prefills' query offsets rebased to their first (``qo_indptr``, from the host copy);
- the decode task map: at ``__init__`` one workspace (``hpc.
  get_attention_decode_task_workspace`` for ``max_num_seqs`` requests of
  ``max_model_len`` keys), refilled by every build with decodes (``hpc.
  assign_attention_decode_task`` of ``seq_lens[:num_decodes]`` and
  ``decode_query_len``); the decode kernel reads it beside those lengths.

Its graphs: ``UNIFORM_SINGLE_TOKEN_DECODE`` without drafts, ``UNIFORM_BATCH`` with them
(``get_cudagraph_support``): a FULL mixed mode becomes FULL_AND_PIECEWISE. The builder
refuses more than 3 drafts (its ``__init__``: the decode kernel's ``mtp`` is 0 to 3).

Stood in, as the ``hpc`` package (it is CUDA only) where ``hpc_attn.py`` imports it:
the two scheduling calls, by the contract ``hpc/attention.py`` writes for them
(:mod:`attnfuzz.adapters.hpc_ops`, shared with SGLang's HPC-Ops backend).

Fields: ``vllm-v1``'s, of what the HPC kernels read: ``query_start_loc`` as they find
each request's queries (the decodes at multiples of ``decode_query_len``, then the
prefills at ``num_decode_tokens + qo_indptr``), ``seq_lens`` and the block table
(``attention_decode_bf16``'s ``num_seq_kvcache`` with ``new_kv_included``, the prefill
kernel's ``seqlens_kvcache``), the slot mapping, the positions, ``kv_len`` and
``kv_slots``; and ``hpc.task_map_stale``: how many entries of the task map the decode
kernel reads differ from the stand-in's schedule of the decode lengths and query count
it reads beside it, 0 the only value it accepts (a graph replaying a task map made for
other lengths, or a build that leaves another's).

Declined: ``vllm-v1``'s cases, pages not a multiple of 64 (the backend's one kernel
block size, ``get_supported_kernel_block_sizes``), and more than 3 drafts.
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.hpc_ops import MAX_QUERIES, hpc, stale_entries
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_HPC = "vllm/v1/attention/backends/hpc_attn.py"
HEAD_SIZE = 128  # HpcAttentionBackend.get_supported_head_sizes
KERNEL_PAGE = 64  # HpcAttentionBackend.get_supported_kernel_block_sizes
MAX_DRAFTS = MAX_QUERIES - 1  # HpcAttnMetadataBuilder.__init__: the decode kernel's mtp


def prepare() -> None:
    """Import vLLM's V1 runner and the HPC backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.hpc_attn import HpcAttentionBackend

    return HpcAttentionBackend


# -- declines --------------------------------------------------------------------------------


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, pages the backend has
    no kernel block for, and more drafts than its decode kernel takes."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode:
        if config.block_size % KERNEL_PAGE:
            return (
                f"block_size {config.block_size}: the HPC backend's kernel block size is "
                f"64 ({_HPC} HpcAttentionBackend.get_supported_kernel_block_sizes)"
            )
        if config.num_spec > MAX_DRAFTS:
            return (
                f"{config.num_spec} drafts: HPC attention takes up to 3 speculative tokens "
                f"({_HPC} HpcAttnMetadataBuilder.__init__ raises)"
            )
    return v1.declines_config(config)


# -- the engine ------------------------------------------------------------------------------


def _freeze(meta: Any) -> SimpleNamespace:
    """What the HPC kernels read of ``meta`` now (module docstring)."""
    nd, ndt = int(meta.num_decodes), int(meta.num_decode_tokens)
    dql = int(meta.decode_query_len)
    starts = [i * dql for i in range(nd + 1)]
    if meta.num_prefills > 0:
        starts += [ndt + int(q) for q in meta.qo_indptr.tolist()[1:]]
    stale = None
    if nd > 0 and meta.task_map is not None:
        stale = stale_entries(meta.task_map, meta.seq_lens[:nd], dql)
    return SimpleNamespace(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=meta.seq_lens.clone(), block_table=meta.block_table_tensor.clone(),
        num_decodes=nd, task_map_stale=stale,
    )  # fmt: skip


class _HpcEngine(v1._Engine):
    """A V1 runner whose attention layer is on the HPC backend."""

    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return hpc()  # the builder's decode scheduler

    def attention_group(self) -> tuple[type, Any]:
        return v1.bf16_attention_group(self.vllm_config, self.config, _backend(), HEAD_SIZE)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # UNIFORM_SINGLE_TOKEN_DECODE or UNIFORM_BATCH (with drafts): no FULL mixed graph;
        # a uniform decode of drafts is one (UNIFORM_BATCH), so FULL decode modes stay.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        m = seen.meta
        if m is None or m.task_map_stale is None:
            return out
        # attention_decode_bf16 reads the task map beside num_seq_kvcache: it must be the
        # schedule of those lengths and of decode_query_len queries a request.
        stale = Field("hpc.task_map_stale", "requests",
                      np.full(m.num_decodes, m.task_map_stale, dtype=np.int64), (0, 0))  # fmt: skip
        return (*out, stale)


class HpcRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the HPC backend."""

    engine_type = _HpcEngine
    # The builder's reorder threshold makes the runner reorder its batch, as MLA's does:
    # the fresh engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = HpcRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-hpc`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-hpc`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
