"""Shared set-up of the benchmark scripts: one CPU core, a small table printer."""

from __future__ import annotations

import os
import platform
import statistics

# One core per process: NumPy's BLAS (the interpreter's tl.dot) must not start
# a thread per core before it is imported, nor may torch's pool (below).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import torch  # noqa: E402
from attnfuzz.harness.definitions import markdown_table as table  # noqa: E402, F401 (re-exported)


def pin_one_core() -> str:
    """Run this process (and torch's intra-op pool) on a single CPU core."""
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    return f"1 core of {platform.processor() or platform.machine()}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
