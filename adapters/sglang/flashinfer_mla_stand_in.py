"""FlashInfer's MLA paged wrapper, as SGLang's FlashInfer-MLA backend plans it, where
``flashinfer`` does not import (it needs a CUDA build).

``layers/attention/flashinfer_mla_backend.py`` binds ``BatchMLAPagedAttentionWrapper``
(and the ragged prefill wrapper, :mod:`.flashinfer_stand_in`'s) at import, only where
FlashInfer is available. SGLang computes every array itself (its indices updaters:
``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``kv_len_arr``) and hands them to the
wrapper's ``plan``; its own ``fast_mla_decode_plan`` / ``fast_mla_prefill_plan``, installed
on a graph's wrapper after capture, call the wrapper's ``_cached_module.plan`` directly.
The stand-in does what FlashInfer's ``flashinfer/mla.py`` does with those arrays:

- the constructor keeps the four graph buffers (``use_cuda_graph=True``: all given);
- ``plan`` refuses what its docstring excludes (:class:`PlanContractError`):
  ``qo_indptr`` and ``kv_indptr`` of ``batch_size + 1`` entries, ``kv_len_arr`` of
  ``batch_size``, int32 (SGLang's index type), indptrs rising from 0; on a graph wrapper
  it copies the arrays into the buffers (``copy_``: a buffer of another batch size
  refuses; ``kv_indices`` into the buffer's head, which must hold it); an eager wrapper
  keeps them; then it plans through ``_cached_module.plan`` on the host arrays;
- ``_cached_module.plan`` (:class:`MLAPlanModule`) takes the host ``qo_indptr``,
  ``kv_indptr`` and ``kv_len_arr`` and writes the work schedule the kernel runs into the
  wrapper's int workspace, in place: the kernel reads its queries, the pages of each
  request's keys (from ``kv_indptr[i]`` in the indices buffer) and their count
  (``kv_len_arr[i]``) from that schedule, and the page ids from ``_kv_indices_buf``.
  The stand-in's schedule is those three arrays as handed (:func:`schedule`); the
  vendor's split of the work across CTAs is its own and not modelled.

Nothing here computes what SGLang computes. ``run`` refuses: attnfuzz runs no forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from attnfuzz.adapters.sglang.flashinfer_stand_in import PlanContractError, _indptr


@dataclass(frozen=True)
class Schedule:
    """What a plan leaves for the kernel in the int workspace: each request's query rows
    (``qo_indptr``), the first page of its keys in the indices buffer (``kv_indptr``) and
    its key count (``kv_len_arr``), host copies as the plan was handed them."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_len_arr: torch.Tensor


def _int32(name: str, t: torch.Tensor, length: int) -> None:
    if t.dtype != torch.int32 or tuple(t.shape) != (length,):
        raise PlanContractError(
            f"{name} must be int32 of shape ({length},), got {t.dtype} {tuple(t.shape)}"
        )


class MLAPlanModule:
    """The JIT module a plan binds as ``_cached_module`` (``get_batch_mla_module``): its
    ``plan`` writes the schedule into the int workspace it is handed."""

    def plan(
        self,
        float_workspace_buffer: torch.Tensor,
        int_workspace_buffer: torch.Tensor,
        pin_memory_int_workspace_buffer: torch.Tensor,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_o: int,
        causal: bool,
    ) -> tuple[int, ...]:
        batch_size = len(qo_indptr) - 1
        _indptr("qo_indptr", qo_indptr, batch_size, None)
        _indptr("kv_indptr", kv_indptr, batch_size, None)
        _int32("kv_len_arr", kv_len_arr, batch_size)
        host = [t.detach().cpu().to(torch.int32) for t in (qo_indptr, kv_indptr, kv_len_arr)]
        # In place, as the vendor's plan writes its schedule: the wrapper's buffer.
        int_workspace_buffer.resize_(1 + sum(len(t) for t in host))
        int_workspace_buffer.copy_(
            torch.cat([torch.tensor([batch_size], dtype=torch.int32), *host])
        )
        return (batch_size,)


def schedule(wrapper: Any) -> Schedule:
    """The schedule the wrapper's kernel would run: what its last plan wrote."""
    ws = wrapper._int_workspace_buffer.clone()
    b = int(ws[0])
    return Schedule(ws[1 : b + 2], ws[b + 2 : 2 * b + 3], ws[2 * b + 3 : 3 * b + 3])


class BatchMLAPagedAttentionWrapper:
    """``flashinfer.BatchMLAPagedAttentionWrapper`` (``flashinfer/mla.py``), by its
    contract (module docstring)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._backend = backend
        # The vendor's are 8 MiB of bytes; the stand-in's holds its schedule alone.
        self._int_workspace_buffer = torch.zeros(1, dtype=torch.int32)
        self._pin_memory_int_workspace_buffer = torch.zeros(1, dtype=torch.int32)
        self._use_cuda_graph = use_cuda_graph
        buffers = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
                   "kv_len_arr": kv_len_arr}  # fmt: skip
        if use_cuda_graph:
            for name, t in buffers.items():
                if not torch.is_tensor(t):
                    raise PlanContractError(f"{name} should be a torch.Tensor in cudagraph mode")
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._cached_module: MLAPlanModule | None = None
        self.plans = 0

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype,
        kv_data_type: torch.dtype,
        use_profiler: bool = False,
    ) -> None:
        self._cached_module = MLAPlanModule()
        batch_size = len(qo_indptr) - 1
        _int32("kv_indptr", kv_indptr, batch_size + 1)
        _int32("kv_len_arr", kv_len_arr, batch_size)
        if kv_indices.dtype != torch.int32:
            raise PlanContractError(f"kv_indices must be int32, got {kv_indices.dtype}")
        if int(kv_indptr.cpu()[-1]) > len(kv_indices):
            raise PlanContractError(
                f"kv_indices of shape [kv_indptr[-1]] or larger: {len(kv_indices)} entries "
                f"for kv_indptr[-1] = {int(kv_indptr.cpu()[-1])}"
            )
        if self._use_cuda_graph:
            held = {"qo_indptr": (self._qo_indptr_buf, qo_indptr),
                    "kv_indptr": (self._kv_indptr_buf, kv_indptr),
                    "kv_len_arr": (self._kv_len_arr_buf, kv_len_arr)}  # fmt: skip
            for name, (buf, t) in held.items():
                assert buf is not None
                if buf.shape != t.shape:  # copy_ of another size
                    raise PlanContractError(
                        f"{name} of shape {tuple(t.shape)} into its graph buffer of "
                        f"{tuple(buf.shape)}: the batch size is fixed in cudagraph mode"
                    )
                buf.copy_(t)
            assert self._kv_indices_buf is not None
            if len(kv_indices) > len(self._kv_indices_buf):
                raise PlanContractError(
                    f"kv_indices of {len(kv_indices)} entries past its graph buffer of "
                    f"{len(self._kv_indices_buf)}"
                )
            self._kv_indices_buf[: len(kv_indices)].copy_(kv_indices)
        else:
            self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
            self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._causal, self._page_size, self._sm_scale = causal, page_size, sm_scale
        self._plan_info = self._cached_module.plan(
            self._float_workspace_buffer,
            self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer,
            qo_indptr.cpu(),
            kv_indptr.cpu(),
            kv_len_arr.cpu(),
            num_heads,
            head_dim_ckv,
            causal,
        )
        self.plans += 1

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("flashinfer's MLA wrapper is attnfuzz's stand-in; no forward runs here")
