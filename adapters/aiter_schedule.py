"""AITER's MLA decode scheduler, as both engines' AITER backends call it.

``aiter.get_mla_metadata_info_v1`` gives the shapes and dtypes of the six work buffers
of the persistent MLA decode kernel (``mla_decode_fwd``); ``aiter.get_mla_metadata_v1``
plans the kernel's work into them from the batch's query and key offsets. Only AITER's
kernel reads the plan, so the stand-ins here keep on the work buffer what the plan was
made for (:func:`scheduled`), and attnfuzz judges that the offsets the kernel is
handed are those (:func:`schedule_stale`): a plan made for another step's offsets
splits the wrong keys across the kernel's workgroups.

The contract each stand-in keeps is AITER's ``mla.py`` (its ``TORCH_CHECK``s): a query
head count a multiple of 8, int32 offsets, one offset array as long as the other.
Importing this module imports neither engine.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from attnfuzz.adapters.standins import VendorContractError


def get_mla_metadata_info_v1(
    batch_size: int, max_seqlen_qo: int, num_head_qo: int, q_dtype: torch.dtype,
    kv_dtype: torch.dtype, is_sparse: bool, fast_mode: bool = True, **kwargs: Any,
) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:  # fmt: skip
    """``aiter.get_mla_metadata_info_v1``: the shapes and dtypes of the six work buffers
    (here one entry each: only AITER's kernels read them)."""
    if num_head_qo % 8 != 0:
        raise VendorContractError(f"num_head_qo {num_head_qo} is not a multiple of 8")
    return (((2,), torch.uint64),) + tuple(((1,), torch.int32) for _ in range(5))


def get_mla_metadata_v1(
    qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor,
    num_heads_per_head_k: int, num_heads_k: int, is_causal: bool,
    work_meta_data: torch.Tensor, *buffers: torch.Tensor, max_seqlen_qo: int = -1,
    **kwargs: Any,
) -> None:  # fmt: skip
    """``aiter.get_mla_metadata_v1``: the schedule of the decode kernel, made into
    ``work_meta_data`` and the other work buffers; the stand-in keeps what it was made
    for on the buffer (on the tensor it views, where it is a view: the kernel reads
    the memory, whichever tensor object names it)."""
    if qo_indptr.dtype != torch.int32 or kv_indptr.dtype != torch.int32:
        raise VendorContractError(f"indptrs must be int32: {qo_indptr.dtype}, {kv_indptr.dtype}")
    if qo_indptr.shape != kv_indptr.shape:
        raise VendorContractError(
            f"qo_indptr {tuple(qo_indptr.shape)} and kv_indptr {tuple(kv_indptr.shape)} "
            "describe different batches"
        )
    _owner(work_meta_data).attnfuzz_scheduled = SimpleNamespace(
        qo_indptr=qo_indptr.clone(), kv_indptr=kv_indptr.clone(), max_seqlen_qo=max_seqlen_qo
    )


def _owner(work: torch.Tensor) -> torch.Tensor:
    return work if work._base is None else work._base


def scheduled(work: torch.Tensor | None) -> SimpleNamespace | None:
    """What the schedule in the work buffer ``work`` was made for (None: no buffer, or
    none planned into it)."""
    return None if work is None else getattr(_owner(work), "attnfuzz_scheduled", None)


def _differing(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many entries of ``got`` are not ``want``'s (all of them, shapes apart)."""
    return int((got != want).sum()) if got.shape == want.shape else max(got.numel(), 1)


def schedule_stale(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, plan: SimpleNamespace) -> int:
    """How many of the offsets a decode kernel is handed differ from those its schedule
    ``plan`` was made for, over the batch entries the schedule covers (all of them,
    where the kernel is handed fewer). Entries past those are a graph's padding
    requests, to which the schedule gives no work: their keys are judged by their own
    fields."""
    covered = int(plan.kv_indptr.numel())
    stale = _differing(qo_indptr[:covered], plan.qo_indptr)
    return stale + _differing(kv_indptr[:covered], plan.kv_indptr)
