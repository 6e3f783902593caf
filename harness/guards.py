"""The guards around judging a case (the error classes are :mod:`.errors`').

:func:`fits_in_memory` turns an allocation failure while the
harness builds a case into a :class:`CaseTooLarge`. :func:`sigint_noted` tells a real Ctrl-C from a
``KeyboardInterrupt`` an implementation raised itself; :class:`Lap` clocks the
phases of a judgement.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from attnfuzz.harness.errors import (  # noqa: F401 (re-exported: the older home)
    CaseTooLarge,
    HarnessError,
    Interrupted,
    InvalidCase,
    UsageError,
)


def _out_of_memory(err: BaseException) -> bool:
    if isinstance(err, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )


@contextmanager
def fits_in_memory(what: str) -> Iterator[None]:
    """Turn an allocation failure while the harness builds a case into a one-line
    :class:`CaseTooLarge`: a usage error, never a finding (the implementation
    under test has not run yet) and never a traceback."""
    try:
        yield
    except (MemoryError, RuntimeError) as err:
        if not _out_of_memory(err):
            raise
        reason = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
        raise CaseTooLarge(
            f"{what}: the case does not fit in memory ({reason}); replay it on a machine "
            "with more memory, or draw smaller cases (--scale small)"
        ) from err


@contextmanager
def sigint_noted() -> Iterator[list[int]]:
    """Notes SIGINTs delivered while the implementation runs (the handler in
    force still runs): a ``KeyboardInterrupt`` with none noted was raised by the
    implementation itself, and is a finding like any other exception. SIGTERM
    is noted too where a command turns it into a ``KeyboardInterrupt`` (a
    Python handler is installed for it, as ``run`` and ``zoo`` do)."""
    noted: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        noted.append(signal.SIGINT)  # no handler of ours here: take it for a real Ctrl-C
        yield noted
        return
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    if callable(signal.getsignal(signal.SIGTERM)):
        previous[signal.SIGTERM] = signal.getsignal(signal.SIGTERM)

    def note(signum: int, frame: Any) -> None:
        noted.append(signum)
        handler = previous[signal.Signals(signum)]
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            raise Interrupted

    for signum in previous:
        signal.signal(signum, note)
    try:
        yield noted
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def reraise_interruption(err: BaseException, noted: list[int]) -> None:
    """Ctrl-C is the caller's: never a finding."""
    if isinstance(err, KeyboardInterrupt) and noted:
        raise err


class Lap:
    """Adds the seconds since the previous lap to ``clock[phase]``."""

    def __init__(self, clock: Counter | None):
        self.clock, self.last = clock, time.perf_counter()

    def __call__(self, phase: str) -> None:
        if self.clock is not None:
            now = time.perf_counter()
            self.clock[phase] += now - self.last
            self.last = now
