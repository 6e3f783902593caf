"""max-seq-len implementations whose faults depend on when they are called, as a
user's code can: a crash or a hang at the k-th call of a process, a failure at
random, on every k-th call, or in a window of the wall clock.

Each is the fixed Triton path otherwise, so that the fault is the only finding.
Named ``faulty_impls:NAME`` (of ``max-seq-len``); a new process starts counting
calls afresh (each trace runs in one, as does each fresh replay).
"""

from __future__ import annotations

import ctypes
import os
import random
import time

from attnfuzz.kernels.max_seq_len import max_seq_len_metadata
from attnfuzz.reference.max_seq_len import MaxSeqLenInputs, MaxSeqLenOutputs

_calls = 0  # calls in this process


def _count() -> int:
    global _calls
    _calls += 1
    return _calls


def segv_on_the_4th_call(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    if _count() == 4:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
    return max_seq_len_metadata(inputs)


def hang_on_the_4th_call(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    if _count() == 4:
        while True:
            time.sleep(0.05)
    return max_seq_len_metadata(inputs)


def raises_at_random(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    # Seeded from the OS: no replay of the same case decides it.
    if random.SystemRandom().random() < 0.15:
        raise RuntimeError("a fault that comes and goes")
    return max_seq_len_metadata(inputs)


def fails_every_7th_call(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    if _count() % 7 == 0:
        raise RuntimeError("the 7th call of a process")
    return max_seq_len_metadata(inputs)


def fails_in_a_window_of_the_clock(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    # One millisecond in five: a fault of when it runs, not of what ran before. Windows
    # this short leave each replay's call (a new process, its start jittering by far
    # more) independent of the last; with 100 ms ones a replay often began in the same
    # phase as the one before, and five replays in a row failed now and then (CONFIRMED).
    if int(time.time() * 1000) % 5 == 0:
        raise RuntimeError("a window of the clock")
    return max_seq_len_metadata(inputs)


def slow_once_per_process(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Right, but its first call in a process is slow (``ATTNFUZZ_TEST_SLOW_S``
    seconds): a machine too slow for the per-example timeout, not a hang."""
    if _count() == 1:
        time.sleep(float(os.environ.get("ATTNFUZZ_TEST_SLOW_S", "3")))
    return max_seq_len_metadata(inputs)


def raises_and_replays_slowly(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Raises on every call; in any process but the first that called it (a replay in a
    new process), only after two seconds. Each calling process appends its pid to the
    file ``ATTNFUZZ_TEST_CALLS`` names, so that a test knows when replays began."""
    calls = os.environ["ATTNFUZZ_TEST_CALLS"]
    with open(calls, "a+") as f:
        f.seek(0)
        pids = f.read().split()
        if str(os.getpid()) not in pids:
            f.write(f"{os.getpid()}\n")
    if pids and pids[0] != str(os.getpid()):
        time.sleep(2.0)
    raise RuntimeError("always")


_engines = 0  # new engines started in this process (new_engine calls)


def fails_on_every_7th_new_engine(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Fails on the 7th, 14th, ... new engine of a process: a case on its own starts one
    (as each example of a single-step search does), a trace one for all its steps. Its
    history brings it back; no trace of one engine does."""
    if _engines and _engines % 7 == 0:
        raise RuntimeError("the 7th new engine of a process")
    return max_seq_len_metadata(inputs)


def _new_engine() -> None:
    global _engines
    _engines += 1


fails_on_every_7th_new_engine.new_engine = _new_engine  # type: ignore[attr-defined]
