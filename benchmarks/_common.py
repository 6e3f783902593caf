"""Shared set-up of the benchmark scripts: one CPU core, a small table printer."""

from __future__ import annotations

import os
import platform
import statistics

import torch


def pin_one_core() -> str:
    """Run this process (and torch's intra-op pool) on a single CPU core."""
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    return f"1 core of {platform.processor() or platform.machine()}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(header: list[str], rows: list[list[object]]) -> str:
    """A Markdown table, so the output pastes into the README as it is."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
