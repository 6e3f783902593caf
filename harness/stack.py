"""Judging on a stack of its own, so that its speed does not hang on how deep it starts.

CPython keeps its frames' locals on a stack of chunks (16 KiB, or larger when one frame
needs more) that it maps when a call finds no room left in the current chunk and unmaps
when that call returns (``_PyThreadState_PopFrame``, CPython 3.11 and 3.12). A loop
that calls a function from just below a chunk's end maps and unmaps a chunk on every
call: two system calls and fresh pages each time. Whether an engine's hot loop (the
Triton interpreter's, under an adapter, under Hypothesis, under pytest) sits there
depends only on how deep the caller was, so one search ran twice as long under pytest
as from a script, most of the difference system time (CPython issue gh-142183; 3.13
and later releases cache one chunk instead).

:func:`on_own_stack` calls a function from a frame sized to take a new chunk of
1 MiB alone and leave about half of it free: every frame the judge pushes lands in that
half, at the same place whoever called, far from its end. Nothing is computed
differently, and the chunk costs one map and one unmap a call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_R = TypeVar("_R")

_FRAME_SLOTS = 66_000
"""Slots (8 bytes each) of :func:`on_own_stack`'s frame: with CPython's margin of 1000
slots, more than 512 KiB, so that the chunk made for it is 1 MiB (sizes double from
16 KiB), of which about 490 KiB stay free for the frames above it; deeper than any
judge's call stack reaches short of the recursion limit."""


def on_own_stack(fn: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``fn(*args, **kwargs)``, its frames on a chunk of CPython's frame stack of their own."""
    return fn(*args, **kwargs)


# Only the frame's size changes: the evaluation stack a code object declares is what a
# call reserves, and reserving more than the bytecode uses is harmless.
on_own_stack.__code__ = on_own_stack.__code__.replace(co_stacksize=_FRAME_SLOTS)
