"""A user's implementation that keeps state across calls: its output buffer is
allocated on the first call, sized by that step, and reused by every later one.

It agrees with the reference on any step run first in a new process, and fails
on a later step that pads to more requests than the first one did: a defect of
the engine's life, which only a trace (or the history of a long-lived process)
shows. Named ``stateful_impl:first_call_buffer`` (of ``max-seq-len``).
"""

from __future__ import annotations

import dataclasses

import torch
from attnfuzz.kernels.max_seq_len import max_seq_len_metadata
from attnfuzz.reference.max_seq_len import MaxSeqLenInputs, MaxSeqLenOutputs

_OUT: torch.Tensor | None = None  # the consumer's output, [2, R_pad, D] of the first step


def first_call_buffer(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    global _OUT
    got = max_seq_len_metadata(inputs)
    if _OUT is None:
        _OUT = torch.empty_like(got.out)  # sized by this step, kept for the engine's life
    rows = min(got.out.shape[1], _OUT.shape[1])
    _OUT[:, :rows] = got.out[:, :rows]
    return dataclasses.replace(got, out=_OUT[:, : got.out.shape[1]])


_LAST_ROWS = 0  # the rows the previous call's output had


def previous_call_buffer(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Sizes its output by the previous call when that one padded to more requests
    (a buffer kept one step too long): wrong only right after a larger step, on any
    step run first in a new process right. ``stateful_impl:previous_call_buffer``."""
    global _LAST_ROWS
    got = max_seq_len_metadata(inputs)
    rows, before = got.out.shape[1], _LAST_ROWS
    _LAST_ROWS = rows
    if before <= rows:
        return got
    out = got.out.new_zeros((got.out.shape[0], before, *got.out.shape[2:]))
    out[:, :rows] = got.out
    return dataclasses.replace(got, out=out)


_PREV_REQS: int | None = None  # the previous step's request count, on this engine


def full_after_fewer(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Off by one on a step that fills ``max_num_seqs`` right after a step with fewer
    requests (a batch that grew to the limit): its trigger ties the limit to what
    the limit bounds. ``stateful_impl:full_after_fewer``; it says how a new engine
    starts (``new_engine``), so traces judged in one process stay apart."""
    global _PREV_REQS
    got = max_seq_len_metadata(inputs)
    before, _PREV_REQS = _PREV_REQS, inputs.num_real_reqs
    if before is not None and before < inputs.num_real_reqs == inputs.config.max_num_seqs:
        return dataclasses.replace(got, max_seq_len=int(got.max_seq_len) + 1)
    return got


def _full_after_fewer_new_engine() -> None:
    global _PREV_REQS
    _PREV_REQS = None


full_after_fewer.new_engine = _full_after_fewer_new_engine  # type: ignore[attr-defined]
