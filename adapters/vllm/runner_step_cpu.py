"""vLLM's CPU worker's model runner V1 step on the CPU attention backend, as the
implementation ``vllm-v1-cpu`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, made as vLLM's CPU platform makes it: the runner
is ``CPUModelRunner`` (``vllm/v1/worker/cpu_model_runner.py``, the CPU worker's
``GPUModelRunner`` subclass), and its attention layer (and the MTP draft layer) is on
``CPU_ATTN`` (``vllm/v1/attention/backends/cpu_attn.py``), the backend the CPU
platform selects for a decoder model. What this engine runs beside ``vllm-v1``'s:

- ``CPUModelRunner.__init__`` and ``_postprocess_tensors``: after the base runner is
  made, every host/device buffer pair of the runner, its input batch and its block
  tables is made one tensor (``CpuGpuBuffer.gpu = .cpu``, the input batch's device
  tensors its ``*_cpu_tensor``), so every copy the base runner makes from host to
  device is a copy of a tensor onto itself, and what the attention metadata views is
  the host buffer the runner writes the next step into;
- ``CPUAttentionMetadataBuilder.build``: the step's query offsets, ``seq_lens``, block
  table and slot mapping handed on as the runner made them, beside the schedule the C++
  kernel plans from them (``cpu_attn_get_scheduler_metadata``).

The CPU platform captures no graph (``CpuPlatform.check_and_update_config`` empties the
capture sizes) and turns async scheduling off, so the engine's steps run eagerly, never
padded (cudagraph mode NONE, fixed by the plugin's declaration).

Stood in: the C++ scheduler (``vllm._custom_ops.cpu_attn_get_scheduler_metadata``,
``torch.ops._C.get_scheduler_metadata``, which a CUDA build of vLLM does not ship) by
:func:`scheduler_metadata`, a model of what its ``TORCH_CHECK``\\ s refuse and of what it
reads; its schedule is opaque to attnfuzz, as it is to every consumer but the kernel.
``CPUModelRunner.__init__`` sets ``torch.accelerator.synchronize`` and ``empty_cache`` to
no-ops for the process (``_set_torch_accelerator_to_noop``); here they are put back once
the runner is made.

Fields: ``vllm-v1``'s of the CPU metadata (``query_start_loc``, ``seq_lens`` and
``block_table``, the names ``cpu_attention_with_kv_cache`` reads them by, and the
forward context's slot mapping, which ``do_kv_cache_update`` writes the cache by), and
``kv_len`` and ``kv_slots`` as the kernel reads the cache: request ``i``'s first
``seq_lens[i]`` keys (its own step's written before, by ``do_kv_cache_update``), key
``j`` in page ``block_table[i, j // block_size]``, as the Triton kernel reads them
(:meth:`.runner_step_v1._Engine.kv_read`).

Declined: ``vllm-v1``'s cases, and block sizes the backend has no kernel block size for
(``CPUAttentionBackend.get_supported_kernel_block_sizes``: multiples of 32).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.standins import VendorContractError
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

_CPU_ATTN = "vllm/v1/attention/backends/cpu_attn.py"
HEAD_SIZE = 64
"""The model's head size: one the backend supports (``get_supported_head_sizes``)."""
ISAS = ("amx", "vec", "vec16", "neon", "vxe", "rvv")
"""The ISA hints the C++ scheduler takes (``csrc/cpu/cpu_attn.cpp`` get_scheduler_metadata;
anything else fails its ``TORCH_CHECK``)."""
CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
"""The KV-cache dtypes the C++ scheduler parses (``parse_fp8_kv_dtype``)."""


def prepare() -> None:
    """Import vLLM's V1 runner, the CPU runner and the CPU backend before a judge forks."""
    v1.prepare()
    _backend()
    import vllm.v1.worker.cpu_model_runner  # noqa: F401


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s runner cases, and block sizes
    the backend has no kernel block size for."""
    return declines_config(case.config) or v1.step_declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not _backend().supports_block_size(config.block_size):
        return (
            f"block_size {config.block_size}: the CPU attention backend's kernel blocks "
            f"are multiples of 32 ({_CPU_ATTN} CPUAttentionBackend."
            "get_supported_kernel_block_sizes)"
        )
    if config.cudagraph_mode != "NONE":
        return (
            "CUDA graphs: the CPU platform captures none (platforms/cpu.py "
            "CpuPlatform.check_and_update_config empties cudagraph_capture_sizes)"
        )
    return v1.declines_config(config)


# -- the C++ scheduler, as its checks have it ----------------------------------------------


def scheduler_metadata(
    num_reqs: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens: torch.Tensor,
    dtype: torch.dtype,
    query_start_loc: torch.Tensor,
    causal: bool,
    sliding_window_size: int,
    isa: str,
    enable_kv_split: bool,
    dynamic_causal: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
) -> torch.Tensor:
    """``vllm._custom_ops.cpu_attn_get_scheduler_metadata``: what the C++ scheduler
    refuses (its ``TORCH_CHECK``\\ s on the counts, the ISA hint and the cache dtype) and
    what it reads (``seq_lens[:num_reqs]``, ``query_start_loc[:num_reqs + 1]``, int32);
    its schedule is an opaque byte buffer only the kernel reads, returned empty."""
    if num_reqs < 0 or num_heads <= 0 or num_kv_heads <= 0:
        raise VendorContractError(
            f"num_req {num_reqs}, num_heads_q {num_heads}, num_heads_kv {num_kv_heads}: the "
            "request count must be nonnegative and the head counts positive"
        )
    if isa not in ISAS:
        raise VendorContractError(f"Unsupported CPU attention ISA hint: {isa}")
    if kv_cache_dtype not in CACHE_DTYPES:
        raise VendorContractError(f"Unsupported kv_cache_dtype: {kv_cache_dtype}")
    for name, t, need in (("seq_lens", seq_lens, num_reqs),
                          ("query_start_loc", query_start_loc, num_reqs + 1)):  # fmt: skip
        if t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] < need:
            raise VendorContractError(
                f"{name} must be int32 of one dimension with at least {need} entries, got "
                f"{t.dtype} {tuple(t.shape)}"
            )
    return torch.empty(0, dtype=torch.uint8)


@contextlib.contextmanager
def cpu_attention() -> Iterator[None]:
    """``cpu_attn.py`` with the C++ scheduler stood in (:func:`scheduler_metadata`)."""
    import vllm._custom_ops as ops

    with mock.patch.object(ops, "cpu_attn_get_scheduler_metadata", scheduler_metadata):
        yield


@contextlib.contextmanager
def _accelerator_kept() -> Iterator[None]:
    """``torch.accelerator``'s ``synchronize`` and ``empty_cache`` as they were before
    ``CPUModelRunner.__init__`` made them no-ops for the process."""
    kept = torch.accelerator.synchronize, torch.accelerator.empty_cache
    try:
        yield
    finally:
        torch.accelerator.synchronize, torch.accelerator.empty_cache = kept


# -- the engine -----------------------------------------------------------------------------


class CPUWorker:
    """What an engine of :mod:`.runner_step_v1` takes from the CPU worker: its runner
    (``CPUModelRunner``) and the platform's C++ calls stood in."""

    def runner_type(self) -> type:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner

        return CPUModelRunner

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(cpu_attention())
        stack.enter_context(_accelerator_kept())
        return stack


class _CPUEngine(CPUWorker, v1._Engine):
    """A CPU worker's V1 runner whose attention layer is on the CPU backend."""

    def attention_group(self) -> tuple[type, Any]:
        return v1.bf16_attention_group(self.vllm_config, self.config, _backend(), HEAD_SIZE)


class CPURunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, as the CPU worker makes them."""

    engine_type = _CPUEngine


ENGINE = CPURunnerStepEngine()
"""The engine of the implementation ``vllm-v1-cpu`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-cpu`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
