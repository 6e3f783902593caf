"""The device and the float dtype a command runs on, checked once before any work.

``--device`` names where the inputs live and the kernels run: ``cpu``, or
``cuda`` / ``cuda:N`` where torch sees CUDA devices; left out, where the
kernels run (CUDA when compiled, the CPU under the Triton interpreter).
``ATTNFUZZ_DTYPE`` (``float32``, ``float16`` or ``bfloat16``) is the dtype of
the float inputs; reduced precision needs a CUDA device. A case file records
the dtype it was found in, and replaying it uses that one (see
:func:`in_case_dtype`). Every mistake is a one-line :class:`UsageError`.

This module imports nothing of the campaign or the command line, so both can
import it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import torch
from attnfuzz.harness.guards import UsageError
from attnfuzz.reference.batch import (
    DEFAULT_FLOAT_DTYPE,
    DTYPE_VARIABLE,
    FLOAT_DTYPES,
    Case,
    environment_dtype,
    using_float_dtype,
)

_CUDA = re.compile(r"cuda(?::(\d{1,9}))?")


def known_devices() -> list[str]:
    """The device names ``--device`` accepts on this machine."""
    names = ["cpu"]
    if torch.cuda.is_available():
        names += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return names


def _device_name(name: str) -> str:
    if name == "cpu":
        return name
    match = _CUDA.fullmatch(name)
    if match is None:
        raise UsageError(
            f"--device {name!r}: unknown device (known here: {', '.join(known_devices())})"
        )
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {name}: torch sees no CUDA device on this machine "
            "(known here: cpu); run with --device cpu"
        )
    count = torch.cuda.device_count()
    if match.group(1) is not None and int(match.group(1)) >= count:
        raise UsageError(
            f"--device {name}: this machine has {count} CUDA device(s) "
            f"(known here: {', '.join(known_devices())})"
        )
    return name


def check_dtype(name: str, device: str | torch.device, source: str | None = None) -> str:
    """``name`` if it is a float dtype the inputs can be built in on ``device``.

    ``source`` says where the name came from, for the message (default:
    ``ATTNFUZZ_DTYPE``).
    """
    label = f"{source} {name!r}" if source else f"{DTYPE_VARIABLE}={name!r}"
    if name not in FLOAT_DTYPES:
        raise UsageError(f"{label}: expected one of {', '.join(FLOAT_DTYPES)}")
    if name != DEFAULT_FLOAT_DTYPE and torch.device(device).type != "cuda":
        raise UsageError(
            f"{label} needs a CUDA device, the CPU computes in {DEFAULT_FLOAT_DTYPE} "
            f"(device: {device})"
        )
    return name


def check_device(name: str | None = None) -> str:
    """The device a command runs on, with ``ATTNFUZZ_DTYPE`` checked against it.

    ``name`` is ``--device`` as given: None (where the kernels run), ``cpu``,
    ``cuda`` or ``cuda:N`` (when torch sees CUDA and ``N`` is one of its
    devices). Returns the device's name; raises :class:`UsageError` for an
    unknown or absent device, or a dtype setting the device cannot run. It
    initializes no CUDA context.
    """
    if name is None:
        from attnfuzz.kernels._triton import device

        resolved = str(device())
    else:
        resolved = _device_name(name)
    check_dtype(environment_dtype(), resolved)
    return resolved


def in_case_dtype(make_inputs: Callable[[Case, Any], Any]) -> Callable[[Case, Any], Any]:
    """``make_inputs`` that builds a case's float inputs in the dtype the case
    records (``Case.dtype``), or in ``ATTNFUZZ_DTYPE``'s when it records none.

    A recorded dtype the device cannot run is a :class:`UsageError`.
    """

    @functools.wraps(make_inputs)
    def make(case: Case, device: Any = "cpu") -> Any:
        if case.dtype is not None:
            check_dtype(case.dtype, device, "the case's dtype")
        with using_float_dtype(case.dtype):
            return make_inputs(case, device)

    return make
