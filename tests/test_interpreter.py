"""The Triton interpreter as attnfuzz sets it up: the same values, without dead checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.kernels._triton import INTERPRET, tl, triton

pytestmark = pytest.mark.skipif(not INTERPRET, reason="compiled kernels: no interpreter")


@triton.jit
def _add_int32(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def _run() -> list[int]:
    x = torch.tensor([2**31 - 1, 5], dtype=torch.int32)
    y = torch.tensor([1, 7], dtype=torch.int32)
    out = torch.empty(2, dtype=torch.int32)
    _add_int32[(1,)](x, y, out, BLOCK=2)
    return out.tolist()


def test_overflow_checks_are_off_and_an_int32_sum_still_wraps_as_compiled():
    """The checks only feed a device_assert that does nothing without ``debug``:
    off, they change no value (an int32 overflow wraps, as on a GPU)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    assert builder.options.sanitize_overflow is False and builder.options.debug is False
    without = _run()
    saved = builder.options
    builder.options = dataclasses.replace(saved, sanitize_overflow=True)
    try:
        assert _run() == without == [-(2**31), 12]
    finally:
        builder.options = saved


_TRITON_FIRST = """
import triton.language  # as an engine imported before attnfuzz does
import attnfuzz
from attnfuzz.harness.errors import UsageError
try:
    attnfuzz.run("max-seq-len", "triton", max_examples=2, seed=0)
except UsageError as err:
    print("refused:", err)
print("reference failed:", attnfuzz.run("max-seq-len", "reference", max_examples=2, seed=0).failed)
"""


@pytest.mark.parametrize("triton_first", [True, False])
def test_triton_imported_before_attnfuzz_is_refused_not_blamed_on_the_kernel(triton_first):
    """Triton imported before ``TRITON_INTERPRET=1`` is set makes its own ``@jit``
    helpers for a GPU: an interpreted kernel calling one raises, which a run would
    judge as the implementation's exception. Such a run is refused, saying why; the
    reference (no Triton) still runs; imported in the other order, the kernel runs."""
    import os
    import subprocess
    import sys

    script = _TRITON_FIRST if triton_first else _TRITON_FIRST.replace("import triton.language", "")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "reference failed: False" in done.stdout
    refused = "refused: implementation 'triton' of max-seq-len cannot run: Triton was imported"
    assert (refused in done.stdout) is triton_first, done.stdout
