"""The ``flashinfer`` package as vLLM's FlashInfer backend imports it, where it does not
import (it needs a CUDA build): :mod:`attnfuzz.adapters.sglang.flashinfer_stand_in`'s
wrappers, by FlashInfer's contract, under the names ``vllm/v1/attention/backends/
flashinfer.py`` binds at import.

vLLM computes every index array itself (``FlashInferMetadataBuilder.
_compute_flashinfer_kv_metadata``) and hands them to a wrapper's ``plan`` (or, through
its own ``fast_plan_decode``, to FlashInfer's ``fast_decode_plan`` for a graph wrapper
planned before). One difference from SGLang's use: vLLM pads a FULL graph's batch with
rows of no keys (sequence length 0), whose ``paged_kv_last_page_len`` it sets to 0;
FlashInfer's kernels read no key of a row of no pages (``paged_kv_t::get_length`` is 0,
as ``flashinfer.page.get_seq_lens`` computes), so the wrappers here accept any
``last_page_len`` in ``[0, page_size]`` for such a row, and ``[1, page_size]`` for every
other. ``get_seq_lens`` is FlashInfer's (``flashinfer/page.py``). The TRT-LLM kernels,
the sink wrapper and the NVFP4 helpers are bound and refuse: the engine here runs
FlashInfer's native path, which plans none of them.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from attnfuzz.adapters.sglang import flashinfer_stand_in as sgl

Plan = sgl.Plan
PlanContractError = sgl.PlanContractError


class BatchDecodeWithPagedKVCacheWrapper(sgl.BatchDecodeWithPagedKVCacheWrapper):
    """``flashinfer.BatchDecodeWithPagedKVCacheWrapper``; rows of no pages allowed."""

    empty_rows_read_no_last_page = True


class BatchPrefillWithPagedKVCacheWrapper(sgl.BatchPrefillWithPagedKVCacheWrapper):
    """``flashinfer.BatchPrefillWithPagedKVCacheWrapper``; rows of no pages allowed."""

    empty_rows_read_no_last_page = True


class BatchPrefillWithRaggedKVCacheWrapper(sgl.BatchPrefillWithRaggedKVCacheWrapper):
    """``flashinfer.BatchPrefillWithRaggedKVCacheWrapper`` (bound, unplanned here)."""


class _Refused:
    """A FlashInfer class the native path never builds (the sink wrapper, FP4Tensor)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("flashinfer's class is attnfuzz's stand-in; not built here")


def get_seq_lens(
    kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int
) -> torch.Tensor:
    """``flashinfer.page.get_seq_lens``: each row's keys, 0 for a row of no pages."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    return torch.clamp(pages - 1, min=0) * page_size + kv_last_page_len


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("flashinfer's kernel is attnfuzz's stand-in; no forward runs here")


def modules() -> dict[str, types.ModuleType]:
    """``flashinfer`` and the submodules ``flashinfer.py`` imports from."""
    top = types.ModuleType("flashinfer")
    decode = types.ModuleType("flashinfer.decode")
    prefill = types.ModuleType("flashinfer.prefill")
    utils = types.ModuleType("flashinfer.utils")
    names: dict[types.ModuleType, dict[str, Any]] = {
        top: {
            "BatchAttentionWithAttentionSinkWrapper": _Refused,
            "BatchDecodeWithPagedKVCacheWrapper": BatchDecodeWithPagedKVCacheWrapper,
            "BatchPrefillWithPagedKVCacheWrapper": BatchPrefillWithPagedKVCacheWrapper,
            "BatchPrefillWithRaggedKVCacheWrapper": BatchPrefillWithRaggedKVCacheWrapper,
            "get_seq_lens": get_seq_lens,
            "nvfp4_quantize_append_paged_kv_cache_with_slot_mapping": _refuse,
            "merge_state": _refuse,
            "decode": decode,
            "prefill": prefill,
            "utils": utils,
        },
        decode: {
            "fast_decode_plan": sgl.fast_decode_plan,
            "trtllm_batch_decode_with_kv_cache": _refuse,
        },
        prefill: {"trtllm_batch_context_with_kv_cache": _refuse},
        utils: {
            "FP4Tensor": _Refused,
            "get_device_sm_count": _refuse,
            "get_trtllm_gen_multi_ctas_kv_counter_bytes": _refuse,
        },
    }
    for module, attrs in names.items():
        for name, value in attrs.items():
            setattr(module, name, value)
    top.__path__ = []  # type: ignore[attr-defined]  # a package: its submodules import
    return {m.__name__: m for m in names}


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """While vLLM's FlashInfer backend module imports: ``flashinfer`` is the stand-in
    (where the vendor's does not import), restored after; the backend keeps the names
    it bound."""
    if sgl.vendor_imports():
        yield
        return
    # vllm.utils.flashinfer asks at its import whether flashinfer is installed (a
    # find_spec): answered before the stand-in is in sys.modules, as this machine has it.
    import vllm._custom_ops  # noqa: F401
    import vllm.utils.flashinfer  # noqa: F401

    fakes = modules()
    saved = {name: sys.modules.get(name) for name in fakes}
    sys.modules.update(fakes)
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
