"""This project's own attnfuzz target, added through the entry-point group
``attnfuzz.targets`` (pyproject.toml): ``query-start-loc``.

The step's query start offsets, ``query_start_loc[r] = sum(q_lens[:r])`` for
``r`` in ``0..R``, written into the first ``R + 1`` elements of the builder's
persistent int32 buffer of ``max_num_seqs + 1`` elements (a CUDA graph replays
it); the elements after them keep what an earlier step left.
"""

from __future__ import annotations

from dataclasses import dataclass

import attnfuzz
import numpy as np
import torch

NAME = "query-start-loc"


@dataclass
class Inputs:
    q_lens: torch.Tensor  # int32 [R], the step's query lengths
    buffer: torch.Tensor  # int32 [max_num_seqs + 1], persistent; stale values from the seed


@dataclass
class Expected:
    buffer: np.ndarray  # the whole buffer after the step


def make_inputs(case: attnfuzz.Case, device: torch.device) -> Inputs:
    gen = torch.Generator().manual_seed(case.batch.seed)
    stale = torch.randint(-9, 99, (case.config.max_num_seqs + 1,), generator=gen)
    return Inputs(
        q_lens=torch.tensor(case.batch.q_lens, dtype=torch.int32, device=device),
        buffer=stale.to(torch.int32).to(device),
    )


def reference(case: attnfuzz.Case, inputs: Inputs) -> Expected:
    buffer = inputs.buffer.cpu().numpy().copy()
    offsets = np.concatenate([[0], np.cumsum(case.batch.q_lens)])
    buffer[: len(offsets)] = offsets
    return Expected(buffer)


def compare(
    case: attnfuzz.Case, inputs: Inputs, expected: Expected, got: object
) -> list[attnfuzz.Mismatch]:
    """The buffer itself is what a graph reads: it must hold the offsets, nothing
    else changed; the implementation returns a view of its first ``R + 1`` elements."""
    rows = len(case.batch.q_lens) + 1
    if not isinstance(got, torch.Tensor) or got.data_ptr() != inputs.buffer.data_ptr():
        return [
            attnfuzz.Mismatch(
                attnfuzz.Check.GRAPH, "query_start_loc", "a view of the buffer", repr(got)
            )
        ]
    if tuple(got.shape) != (rows,):
        return [
            attnfuzz.Mismatch(
                attnfuzz.Check.SHAPE, "query_start_loc", str([rows]), str(list(got.shape))
            )
        ]
    after = inputs.buffer.cpu().numpy()
    if not np.array_equal(after, expected.buffer):
        wrong = int(np.flatnonzero(after != expected.buffer)[0])
        return [
            attnfuzz.Mismatch(
                attnfuzz.Check.VALUES,
                f"buffer[{wrong}]",
                str(expected.buffer[wrong]),
                str(after[wrong]),
            )
        ]
    return []


def query_start_loc(inputs: Inputs) -> torch.Tensor:
    """Fixed: a leading 0, then the running sum, in place."""
    out = inputs.buffer[: len(inputs.q_lens) + 1]
    out[0] = 0
    torch.cumsum(inputs.q_lens, 0, out=out[1:])
    return out


def query_start_loc_exclusive(inputs: Inputs) -> torch.Tensor:
    """Bug: the running sum without the leading 0, one offset short."""
    out = inputs.buffer[: len(inputs.q_lens) + 1]
    torch.cumsum(inputs.q_lens, 0, out=out[:-1])
    return out


def build() -> attnfuzz.Target:
    target = attnfuzz.Target(
        name=NAME,
        summary="query start offsets of a step in the builder's persistent buffer",
        make_inputs=make_inputs,
        reference=reference,
        compare=compare,
    )
    target.add(attnfuzz.Implementation("torch", query_start_loc, "fixed", "torch.cumsum"))
    target.add(
        attnfuzz.Implementation(
            "exclusive", query_start_loc_exclusive, "mutant", "no leading 0: one offset short"
        )
    )
    return target
