"""Graph safety: does a call allocate tensor storage?

Everything a CUDA graph replays must exist at capture time, so the metadata a
graph consumes is written into buffers preallocated at engine start and
*viewed* per step. A call that allocates (a ``.contiguous()`` copy, a fresh
``torch.empty``) cannot be replayed safely.

On the CPU a ``TorchDispatchMode`` sees every aten op; an op whose output has
storage that none of its inputs had is an allocation. Triton launches are
excluded: a compiled launch allocates nothing, while the interpreter stages
host copies that are its own business. On CUDA the caching allocator's
counters say the same thing directly, and both are consulted.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from attnfuzz.harness.blame import transparent
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten


def _storages(values: Any) -> set[int]:
    flat, _ = tree_flatten(values)
    return {t.untyped_storage().data_ptr() for t in flat if isinstance(t, torch.Tensor)}


@transparent  # an op that raises through it was the implementation's call
class AllocationRecorder(TorchDispatchMode):
    """Records the aten ops that produce new, non-empty tensor storage, and
    reads of a tensor's value back to the host (``.item()``, ``int(t)``): a
    device-to-host sync, which a graph capture cannot hold either."""

    def __init__(self) -> None:
        super().__init__()
        self.allocations: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.allocations.append(f"{func} (a value read back to the host)")
        out = func(*args, **(kwargs or {}))
        known = _storages((args, kwargs))
        flat, _ = tree_flatten(out)
        for t in flat:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0:
                if t.untyped_storage().data_ptr() not in known:
                    self.allocations.append(f"{func} -> {list(t.shape)} {t.dtype}")
        return out


@contextmanager
def _triton_launches_unrecorded():
    """Run interpreted Triton launches outside the recorder (see module docstring)."""
    try:
        from triton.runtime.interpreter import GridExecutor
    except ImportError:  # compiled Triton only: nothing to exclude
        yield
        return
    original = GridExecutor.__call__

    @transparent
    def call(self, *args, **kwargs):
        with _disable_current_modes():
            return original(self, *args, **kwargs)

    GridExecutor.__call__ = call
    try:
        yield
    finally:
        GridExecutor.__call__ = original


@transparent  # it calls the implementation: what raises below it is the implementation's
def allocations(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, list[str]]:
    """Call ``fn`` and list what it allocated (empty list: graph-safe)."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    recorder = AllocationRecorder()
    with _triton_launches_unrecorded(), recorder:
        result = fn(*args, **kwargs)
    found = list(recorder.allocations)
    if cuda:
        torch.cuda.synchronize()
        grown = torch.cuda.memory_stats().get("allocation.all.allocated", 0) - before
        if grown and not found:
            found.append(f"{grown} CUDA caching-allocator allocations")
    return result, found
