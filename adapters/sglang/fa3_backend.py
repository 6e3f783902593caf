"""FlashAttention 3's Python module, as SGLang's FA3 backend imports it, where the
kernels are not built: ``sgl_kernel.flash_attn`` (the ``sgl-kernel`` wheel, a CUDA
build).

``layers/attention/flashattention_backend.py:FlashAttentionBackend.__init__`` imports
``flash_attn_varlen_func``, ``flash_attn_with_kvcache`` and ``get_scheduler_metadata``
from it. The first two are the attention kernels, called only by a forward, which
attnfuzz never runs: they refuse to run. ``get_scheduler_metadata`` is called while
the metadata is built (``_compute_scheduler_metadata``: a normal decode, eager and
in the graph's capture and replay), so it is modelled by its contract, read from
FlashAttention 3's ``hopper/flash_api.cpp:mha_fwd_get_scheduler_metadata``:

- it refuses what that function's checks refuse: a ``qkv_dtype`` other than fp16,
  bf16 or fp8 e4m3, query heads not a multiple of the KV heads, and (as the kernels
  read them through ``data_ptr<int>()``, one entry a request) a ``cache_seqlens``
  that is not int32 of ``batch_size`` entries or a ``cu_seqlens_q`` that is not int32
  of ``batch_size + 1``;
- it returns the tile scheduler's buffer on an sm90 GPU (what attnfuzz's device
  stands in for), batches of at most 992 requests: int32, ``1 + batch_size`` entries,
  the tile-count semaphore (zeroed by the kernel before use) then each request's
  dynamic number of splits. The splits are the vendor's own choice of how to
  schedule the work, never a value SGLang computes; the model takes no split (1),
  a schedule every kernel launch accepts.

Nothing here computes what SGLang computes; a metadata value of SGLang's never
comes from this module.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from attnfuzz.adapters.standins import VendorContractError

MODULE = "sgl_kernel.flash_attn"
"""The module SGLang's FA3 backend imports its kernels from."""

DYNAMIC_SPLIT_BATCH = 992
"""``mha_fwd_get_scheduler_metadata``: ``use_dynamic_split = params.b <= 992``."""

QKV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
"""The dtypes FlashAttention 3 runs (``TORCH_CHECK`` in ``mha_fwd_get_scheduler_metadata``)."""


def get_scheduler_metadata(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_heads: int,
    num_heads_k: int,
    headdim: int,
    cache_seqlens: torch.Tensor,
    qkv_dtype: torch.dtype = torch.bfloat16,
    headdim_v: int | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_size: int | None = None,
    max_seqlen_k_new: int = 0,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    attention_chunk: int = 0,
    has_softcap: bool = False,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """FlashAttention 3's tile-scheduler metadata, by its contract (module docstring)."""
    if qkv_dtype not in QKV_DTYPES:
        raise VendorContractError(
            f"FlashAttention only supports fp16, bf16, and fp8_e4m3 data type, got {qkv_dtype}"
        )
    if num_heads % num_heads_k:
        raise VendorContractError(
            f"Number of heads in key/value ({num_heads_k}) must divide number of heads in "
            f"query ({num_heads})"
        )
    _int32_of("cache_seqlens", cache_seqlens, batch_size)
    if cu_seqlens_q is not None:
        _int32_of("cu_seqlens_q", cu_seqlens_q, batch_size + 1)
    dynamic = batch_size <= DYNAMIC_SPLIT_BATCH
    out = torch.zeros(1 + dynamic * batch_size, dtype=torch.int32, device=cache_seqlens.device)
    out[1:] = 1  # each request's splits: none
    return out


def _int32_of(name: str, t: torch.Tensor, entries: int) -> None:
    if t.dtype != torch.int32 or tuple(t.shape) != (entries,):
        raise VendorContractError(
            f"{name} must be int32 of shape ({entries},), got {t.dtype} {tuple(t.shape)}"
        )


def _kernel(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{MODULE}.{name} is attnfuzz's stand-in; no forward runs here")

    kernel.__name__ = name
    return kernel


def stand_in() -> types.ModuleType:
    """The stand-in module: the two kernels (refusing) and the scheduler's contract."""
    module = types.ModuleType(MODULE)
    module.get_scheduler_metadata = get_scheduler_metadata  # type: ignore[attr-defined]
    module.flash_attn_with_kvcache = _kernel("flash_attn_with_kvcache")  # type: ignore[attr-defined]
    module.flash_attn_varlen_func = _kernel("flash_attn_varlen_func")  # type: ignore[attr-defined]
    return module


def _vendor_imports() -> bool:
    """Whether the vendor's ``sgl_kernel.flash_attn`` imports: not where it is absent,
    where a CUDA build fails, or where the module found is attnfuzz's own stand-in of
    the kernels' package (``_engine``'s finder answers an SGLang module's unguarded
    import at load with one, e.g. ``xpu_backend.py``'s; once made it stays in
    ``sys.modules`` and would import)."""
    try:
        import sgl_kernel.flash_attn as module
    except Exception:  # noqa: BLE001 - absent, a stand-in package, or a CUDA build that fails
        return False
    from attnfuzz.adapters.sglang._engine import is_kernel_stand_in

    return not is_kernel_stand_in(module)


@contextlib.contextmanager
def flash_attn_module() -> Iterator[None]:
    """While SGLang's FA3 backend is built: ``import sgl_kernel.flash_attn`` finds the
    vendor's module where it imports (a CUDA machine), else the stand-in."""
    if _vendor_imports():
        yield
        return
    saved = sys.modules.get(MODULE)
    sys.modules[MODULE] = stand_in()
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(MODULE, None)
        else:
            sys.modules[MODULE] = saved
