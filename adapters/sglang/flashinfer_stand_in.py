"""FlashInfer's attention wrappers, as SGLang's FlashInfer backend plans them, where
``flashinfer`` does not import (it needs a CUDA build).

``layers/attention/flashinfer_backend.py`` binds ``BatchDecodeWithPagedKVCacheWrapper``,
``BatchPrefillWithPagedKVCacheWrapper``, ``BatchPrefillWithRaggedKVCacheWrapper`` and
``fast_decode_plan`` at import, only where FlashInfer is available. SGLang computes
every index array itself (``FlashInferIndicesUpdaterDecode`` / ``...Prefill``:
``kv_indptr``, ``kv_indices``, ``qo_indptr``; ``kv_last_page_len``, its ones) and hands
them to a wrapper's ``plan`` (alias ``begin_forward``). The stand-ins here take the
vendor's place and do what the vendor's Python does with them, read from FlashInfer's
``flashinfer/decode.py`` and ``flashinfer/prefill.py``:

- a wrapper built with ``use_cuda_graph=True`` checks its buffers as FlashInfer's
  constructor does (all given; the decode wrapper's batch size is
  ``len(paged_kv_last_page_len_buffer)``, the prefill wrapper's ``len(qo_indptr_buf) - 1``,
  and the indptr buffers one longer);
- ``plan`` refuses what FlashInfer refuses (:class:`PlanContractError`): a batch size
  other than a graph wrapper's fixed one, more indices than its indices buffer holds,
  a graph prefill planning more query rows than its first plan (``_max_total_num_rows``,
  latched at capture), query heads not a multiple of the KV heads; and what its
  documented arguments exclude, which its kernels would read unchecked: an indptr not
  int32 of ``batch_size + 1`` entries from 0, not monotone, or past the indices it was
  handed; a ``last_page_len`` outside ``[1, page_size]`` ("1 <= kv_last_page_len <=
  page_size", the wrappers' docstring);
- a graph wrapper's ``plan`` copies the arrays into its buffers (what its captured
  kernels read); an eager wrapper keeps them (``indptr.to(device)``: the same tensors);
- ``fast_decode_plan`` (FlashInfer's own, installed by SGLang on a decode graph
  wrapper after capture) checks as ``plan`` and copies nothing: SGLang wrote the
  arrays into the buffers itself;
- every plan is recorded (:attr:`Wrapper.plans`: copies of the arrays given).

The kernels (``run``, ``forward``) refuse: attnfuzz runs no forward. The vendor's
work schedule (``_plan_info``, the split-KV partition) is the vendor's own, never a
value SGLang computes: none is modelled. Nothing here computes what SGLang computes.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from attnfuzz.harness.errors import ContractError

NAMES = (
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "fast_decode_plan",
)
"""What ``flashinfer_backend.py`` imports from ``flashinfer`` and calls while it plans."""


class PlanContractError(ContractError):
    """A call FlashInfer refuses, or whose arrays its kernels would read out of range:
    the engine's misuse of the vendor's contract (a finding)."""


@dataclass
class Plan:
    """One ``plan`` call: copies of the arrays it was handed (None: not handed)."""

    kind: str  # "plan" or "fast_decode_plan"
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor | None
    qo_indptr: torch.Tensor | None = None
    custom_mask: torch.Tensor | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _indptr(
    name: str, t: torch.Tensor, batch_size: int, reach: int | None, from_zero: bool = True
) -> None:
    """An indptr as FlashInfer's kernels read it: int32, ``batch_size + 1`` entries from
    0 (or, not ``from_zero``, from any entry of what it indexes), monotone, its last at
    most ``reach`` (the entries it indexes)."""
    if t.dtype != torch.int32 or tuple(t.shape) != (batch_size + 1,):
        raise PlanContractError(
            f"{name} must be int32 of shape ({batch_size + 1},), got {t.dtype} {tuple(t.shape)}"
        )
    host = t.cpu()
    start_wrong = int(host[0]) != 0 if from_zero else int(host[0]) < 0
    if start_wrong or bool((host[1:] < host[:-1]).any()):
        raise PlanContractError(f"{name} must rise from 0, got {host.tolist()}")
    if reach is not None and int(host[-1]) > reach:
        raise PlanContractError(f"{name} reaches {int(host[-1])}, past the {reach} entries given")


class _Wrapper:
    """What the paged wrappers share: the graph buffers' checks, ``plan``'s checks and
    copies, the record."""

    empty_rows_read_no_last_page = False
    """vLLM's use (:mod:`attnfuzz.adapters.vllm.flashinfer_stand_in`): a row of no pages
    may have any ``last_page_len`` in ``[0, page_size]`` (the kernels read no key of it),
    and the paged indptr may start past 0 into the indices handed (a prefill after the
    decodes reads the step's indices from its first page); SGLang's rows each hold a
    page and its indptrs start at 0, so not there."""

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD") -> None:
        if kv_layout not in ("NHD", "HND"):
            raise PlanContractError(f"Invalid kv_layout {kv_layout}")
        self.device = float_workspace_buffer.device
        self._float_workspace_buffer = float_workspace_buffer
        self._use_cuda_graph = False
        self._fixed_batch_size = 0
        self._max_total_num_rows: int | None = None
        self._qo_indptr_buf: torch.Tensor | None = None
        self._paged_kv_indptr_buf: torch.Tensor | None = None
        self._paged_kv_indices_buf: torch.Tensor | None = None
        self._paged_kv_last_page_len_buf: torch.Tensor | None = None
        self._custom_mask_buf: torch.Tensor | None = None
        self._mask_indptr_buf: torch.Tensor | None = None
        self._cached_module: Any = None
        self.plans: list[Plan] = []

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def _graph_buffers(self, batch_size: int, **buffers: Any) -> None:
        for name, t in buffers.items():
            if not torch.is_tensor(t):
                raise PlanContractError(f"{name} should be a torch.Tensor in cudagraph mode")
        self._use_cuda_graph = True
        self._fixed_batch_size = batch_size

    def _check(
        self,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        page_size: int,
    ) -> int:
        batch_size = len(last_page_len)
        if num_qo_heads % num_kv_heads:
            raise PlanContractError(
                f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        if self._use_cuda_graph:
            if batch_size != self._fixed_batch_size:
                raise PlanContractError(
                    f"The batch size should be fixed in cudagraph mode, the runtime batch "
                    f"size {batch_size} mismatches {self._fixed_batch_size}"
                )
            assert self._paged_kv_indices_buf is not None
            if len(kv_indices) > len(self._paged_kv_indices_buf):
                raise PlanContractError(
                    "The size of indices should be less than or equal to the allocated buffer"
                )
        if kv_indices.dtype != torch.int32:
            raise PlanContractError(f"indices must be int32, got {kv_indices.dtype}")
        from_zero = not self.empty_rows_read_no_last_page
        _indptr("indptr", kv_indptr, batch_size, len(kv_indices), from_zero)
        lens = last_page_len.cpu()
        wrong = (lens < 1) | (lens > page_size)
        if self.empty_rows_read_no_last_page:
            # paged_kv_t::get_length: a row of no pages has no keys, its last_page_len unread.
            pages = kv_indptr.cpu()[1:] - kv_indptr.cpu()[:-1]
            wrong &= ~((pages == 0) & (lens >= 0) & (lens <= page_size))
        if last_page_len.dtype != torch.int32 or bool(wrong.any()):
            raise PlanContractError(
                f"1 <= kv_last_page_len <= page_size ({page_size}), got {last_page_len.dtype} "
                f"{lens.tolist()}"
            )
        return batch_size

    def _keep(
        self,
        qo_indptr: torch.Tensor | None,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        last_page_len: torch.Tensor,
    ) -> None:
        """Where FlashInfer's ``plan`` leaves the arrays its kernels read."""
        if self._use_cuda_graph:
            assert self._paged_kv_indptr_buf is not None
            assert self._paged_kv_indices_buf is not None
            assert self._paged_kv_last_page_len_buf is not None
            if qo_indptr is not None and self._qo_indptr_buf is not None:
                self._qo_indptr_buf.copy_(qo_indptr)
            self._paged_kv_indptr_buf.copy_(kv_indptr)
            self._paged_kv_last_page_len_buf.copy_(last_page_len)
            self._paged_kv_indices_buf[: len(kv_indices)].copy_(kv_indices)
        else:
            self._qo_indptr_buf = qo_indptr
            self._paged_kv_indptr_buf = kv_indptr
            self._paged_kv_indices_buf = kv_indices
            self._paged_kv_last_page_len_buf = last_page_len

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("flashinfer's wrapper is attnfuzz's stand-in; no forward runs here")

    forward = run


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    """``flashinfer.BatchDecodeWithPagedKVCacheWrapper``, by its contract."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: Any = None,
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout)
        self._use_tensor_cores = use_tensor_cores
        self._backend = backend
        if use_cuda_graph:
            self._graph_buffers(
                0,
                paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                paged_kv_indices_buffer=paged_kv_indices_buffer,
                paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer,
            )
            assert paged_kv_last_page_len_buffer is not None
            assert paged_kv_indptr_buffer is not None
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise PlanContractError(
                    "The size of paged_kv_indptr_buffer should be batch_size + 1"
                )
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        **options: Any,
    ) -> None:
        self._check(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, page_size)
        self.plans.append(_record("plan", indptr, indices, last_page_len, options=options))
        self._keep(None, indptr, indices, last_page_len)
        # What fast_decode_plan requires of a prior plan (SGLang installs it after capture).
        self._cached_module = "planned"

    begin_forward = plan


def fast_decode_plan(
    self: BatchDecodeWithPagedKVCacheWrapper,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    last_page_len: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    **options: Any,
) -> None:
    """``flashinfer.fast_decode_plan``: ``plan``'s checks; a graph wrapper's buffers are
    not copied into (the caller wrote them); an eager wrapper keeps the arrays."""
    self._check(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, page_size)
    self.plans.append(_record("fast_decode_plan", indptr, indices, last_page_len, options=options))
    if not self._use_cuda_graph:
        self._keep(None, indptr, indices, last_page_len)


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    """``flashinfer.BatchPrefillWithPagedKVCacheWrapper``, by its contract."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout)
        self._backend = backend
        if use_cuda_graph:
            self._graph_buffers(
                0,
                qo_indptr_buf=qo_indptr_buf,
                paged_kv_indptr_buf=paged_kv_indptr_buf,
                paged_kv_indices_buf=paged_kv_indices_buf,
                paged_kv_last_page_len_buf=paged_kv_last_page_len_buf,
            )
            assert qo_indptr_buf is not None and paged_kv_indptr_buf is not None
            assert paged_kv_last_page_len_buf is not None
            self._fixed_batch_size = len(qo_indptr_buf) - 1
            if len(paged_kv_indptr_buf) != self._fixed_batch_size + 1:
                raise PlanContractError(
                    "The length of paged_kv_indptr_buf should be batch_size + 1."
                )
            if len(paged_kv_last_page_len_buf) != self._fixed_batch_size:
                raise PlanContractError(
                    "The length of paged_kv_last_page_len_buf should be batch_size."
                )
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        custom_mask: torch.Tensor | None = None,
        **options: Any,
    ) -> None:
        batch_size = self._check(
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            page_size,
        )
        _indptr("qo_indptr", qo_indptr, batch_size, None)
        total_num_rows = int(qo_indptr.cpu()[-1])
        if self._use_cuda_graph:
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_num_rows
            elif total_num_rows > self._max_total_num_rows:
                raise PlanContractError(
                    f"The total number of rows in qo_indptr {total_num_rows} in cuda graph "
                    f"mode cannot exceed the number of rows set during initialization "
                    f"{self._max_total_num_rows}."
                )
        self.plans.append(
            _record(
                "plan",
                paged_kv_indptr,
                paged_kv_indices,
                paged_kv_last_page_len,
                qo_indptr,
                custom_mask,
                options,
            )
        )
        self._keep(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len)
        self._cached_module = "planned"

    begin_forward = plan


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    """``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` (an extend's new tokens, no
    pages): its indptrs checked and recorded."""

    def __init__(
        self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD", **options: Any
    ) -> None:
        super().__init__(float_workspace_buffer, kv_layout)

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        **options: Any,
    ) -> None:
        if num_qo_heads % num_kv_heads:
            raise PlanContractError(
                f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        batch_size = len(qo_indptr) - 1
        _indptr("qo_indptr", qo_indptr, batch_size, None)
        _indptr("kv_indptr", kv_indptr, batch_size, None)
        self.plans.append(_record("plan", kv_indptr, kv_indptr[:0], None, qo_indptr, None, options))

    begin_forward = plan


def _record(
    kind: str,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    last_page_len: torch.Tensor | None,
    qo_indptr: torch.Tensor | None = None,
    custom_mask: torch.Tensor | None = None,
    options: dict[str, Any] | None = None,
) -> Plan:
    def copy(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().clone()

    used = int(kv_indptr.cpu()[-1])
    return Plan(
        kind,
        kv_indptr.detach().clone(),
        kv_indices[:used].detach().clone(),
        copy(last_page_len),
        copy(qo_indptr),
        copy(custom_mask),
        dict(options or {}),
    )


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("flashinfer's kernel is attnfuzz's stand-in; no forward runs here")


def stand_in() -> types.ModuleType:
    """The module ``flashinfer`` as far as SGLang's FlashInfer and FlashInfer-MLA
    backends plan with it."""
    from attnfuzz.adapters.sglang.flashinfer_mla_stand_in import BatchMLAPagedAttentionWrapper

    module = types.ModuleType("flashinfer")
    for name in NAMES:
        setattr(module, name, globals()[name])
    module.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper  # type: ignore[attr-defined]
    module.merge_state = _refuse  # type: ignore[attr-defined]
    return module


@functools.cache
def vendor_imports() -> bool:
    """Whether the real ``flashinfer`` imports here (a CUDA machine with it installed);
    asked once, before any stand-in is in ``sys.modules``."""
    try:
        import flashinfer  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or a CUDA build that fails to load
        return False
    return True


@contextlib.contextmanager
def bound(module: types.ModuleType, names: tuple[str, ...] = NAMES) -> Iterator[None]:
    """While an SGLang FlashInfer backend (``module``) is built or plans: the ``names``
    it binds from ``flashinfer`` at import are the vendor's where it imports, else the
    stand-ins (``module``'s own and ``sys.modules['flashinfer']``), restored after."""
    if vendor_imports():
        yield
        return
    missing = object()
    fake = stand_in()
    saved = {name: getattr(module, name, missing) for name in names}
    saved_module = sys.modules.get("flashinfer")
    for name in names:
        setattr(module, name, getattr(fake, name))
    sys.modules["flashinfer"] = fake
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                delattr(module, name)
            else:
                setattr(module, name, value)
        if saved_module is None:
            sys.modules.pop("flashinfer", None)
        else:
            sys.modules["flashinfer"] = saved_module
