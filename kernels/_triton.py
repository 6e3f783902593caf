"""Triton set-up shared by every kernel module.

Import this module before any ``@triton.jit`` is defined: Triton decides at
decoration time whether a kernel is compiled or interpreted. Without a CUDA
device we default to the interpreter (``TRITON_INTERPRET=1``), so the same
kernels run on a CPU-only machine; a user may still set the variable.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpret_without_overflow_checks() -> None:
    """Under the interpreter, skip integer overflow checks that cannot fire.

    Each int32 add, sub and mul is also computed in int64 and compared with
    the type's range, for a ``device_assert`` that does nothing unless the
    options' ``debug`` is set (``semantic.device_assert``); compiled kernels
    drop the dead check, the interpreter computes it and throws it away, which
    is most of an interpreted kernel's time. With ``debug`` set (to see such an
    assert fire) the checks stay."""
    import dataclasses

    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    if not builder.options.debug:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)


if INTERPRET:
    _interpret_without_overflow_checks()

# The combiner of ``tl.sum``/``tl.cumsum``. Kernels reduce with
# ``tl.reduce(x, axis, add)`` and scan with ``tl.associative_scan(x, axis, add)``
# in hot loops: compiled, that is exactly what ``tl.sum``/``tl.cumsum`` emit;
# interpreted, it skips a ``@jit`` helper call, which re-patches
# ``triton.language`` each time (about 1.5 ms), and goes straight to NumPy.
# For the same reason kernels write ``tl.full(shape, 0, dtype)``, a builtin,
# rather than the ``@jit`` helper ``tl.zeros``.
add = tl.standard._sum_combine


def device() -> torch.device:
    """Where kernels run: CUDA when compiled, the CPU under the interpreter."""
    return torch.device("cpu") if INTERPRET else torch.device("cuda")


def block(n: int, *, interpret_cap: int = 4096, cuda_cap: int = 64, floor: int = 16) -> int:
    """A power-of-two tile size covering ``n`` where that is cheap.

    Under the interpreter every program instance costs about a millisecond of
    Python, so one large tile beats many small ones; compiled on a GPU, tiles
    stay register-sized and the grid supplies the parallelism.
    """
    cap = interpret_cap if INTERPRET else cuda_cap
    return max(floor, min(triton.next_power_of_2(max(n, 1)), cap))


__all__ = ["INTERPRET", "add", "block", "device", "tl", "triton"]
