"""Target ``graph-input-padding``: a decode CUDA-graph runner's persistent input buffers
after a replayed step fills them (:mod:`attnfuzz.reference.graph_input_padding`).

Not ``unpadding``: that target is the attention metadata's padding by vLLM's
convention (zero-length padding requests, ``seq_len`` 0, slot -1) and its
unpadding; this one is the graph's *model inputs* by the convention of a
runner that pads with a dummy request (pool row 0, ``seq_len`` = the
backend's fill value, the padding slot 0 of each KV pool), the sliding-window
pool's slots included.

The oracle checks, for every field the step has: shape and integer dtype of the rows
the graph reads (int32 or int64, the engine's choice: SGLang 0.5.11 and 0.5.12 keep
``seq_lens`` in int32), that they are a view at the start of the persistent buffer
(a graph replays on fixed addresses), the step's rows exactly (``values``),
the padded rows exactly (``padding``; ``input_ids``' padded rows are not part
of the contract, see the reference), and the replay view's ``batch_size``,
``num_padding`` and ``seq_lens_sum``. Rows past the graph's size are not read
by the graph and not checked.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum

import numpy as np
import torch
from attnfuzz.harness.oracle import Mismatch, expect_equal, expect_meta, expect_view_of
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.reference import graph_input_padding as ref
from attnfuzz.reference.batch import (
    Batch,
    Case,
    CommonMetadata,
    DecodeSplit,
    build_common_metadata,
    pad_for_cudagraph,
    split_decodes_and_prefills,
)


class OwnCheck(StrEnum):
    """graph-input-padding's own check, beside the oracle's generic ones."""

    PADDING = "padding"  # the padded rows the graph reads hold the padding value


INDEX_DTYPES = (torch.int32, torch.int64)
"""The integer widths a field may have (the engine's choice)."""


def _expect_field(
    name: str, inputs: ref.GraphInputPaddingInputs, want: np.ndarray, got: object, buffer: object
) -> list[Mismatch]:
    padded_n = inputs.bs if name in ref.REQUEST_FIELDS else inputs.num_tokens
    raw_n = inputs.step[name].shape[0]
    where = f"graph.{name}"
    width = got.dtype if isinstance(got, torch.Tensor) and got.dtype in INDEX_DTYPES else None
    out = expect_meta(where, got, (padded_n,), width or torch.int64)
    if not isinstance(buffer, torch.Tensor):
        return out + [Mismatch("view", f"buffers.{name}", "the persistent buffer", "none")]
    if out:
        return out
    out += expect_view_of(where, got, buffer)
    real = np.s_[:raw_n]
    out += expect_equal(where, got[real], want[real], at=real)
    if ref.pad_value(name, inputs.seq_len_fill_value) is not None:
        pad = np.s_[raw_n:padded_n]
        out += expect_equal(where, got[pad], want[pad], check=OwnCheck.PADDING, at=pad)
    return out


def compare(
    case: Case,
    inputs: ref.GraphInputPaddingInputs,
    expected: ref.GraphInputPaddingExpected,
    got,
) -> list[Mismatch]:
    graph = getattr(got, "graph", None)
    buffers = getattr(got, "buffers", None)
    if not isinstance(graph, dict) or not isinstance(buffers, dict):
        return [Mismatch("type", "outputs", "GraphInputPaddingOutputs", type(got).__name__)]
    out: list[Mismatch] = []
    if sorted(graph) != sorted(expected.graph):
        out.append(Mismatch("values", "graph", str(sorted(expected.graph)), str(sorted(graph))))
    for name, want in expected.graph.items():
        if name in graph:
            out += _expect_field(name, inputs, want, graph[name], buffers.get(name))
    for field in ("batch_size", "num_padding", "seq_lens_sum"):
        value = getattr(got, field, None)
        if type(value) is not int or value != getattr(expected, field):
            out.append(Mismatch("values", field, str(getattr(expected, field)), repr(value)))
    return out


def reference_impl(inputs: ref.GraphInputPaddingInputs) -> ref.GraphInputPaddingOutputs:
    """The reference's rows written into the buffers (a self-check of the harness)."""
    expected = ref.reference(None, inputs)
    graph = {}
    for name, rows in expected.graph.items():
        buf = inputs.buffers[name]
        buf[: len(rows)].copy_(torch.as_tensor(rows))
        padded_n = inputs.bs if name in ref.REQUEST_FIELDS else inputs.num_tokens
        graph[name] = buf[:padded_n]
    return ref.GraphInputPaddingOutputs(
        graph, inputs.buffers, expected.batch_size, expected.num_padding, expected.seq_lens_sum
    )


# The zoo's metadata of each mutant: stale values are never a padding value, so a
# field whose padded rows are left stale differs from the reference exactly when the
# step is padded.


def _padded(case: Case) -> bool:
    return ref.padded_batch_size(case) > case.batch.num_reqs


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    """The step as the graph sees it: the case's requests, then ``bs - raw_bs`` padding
    requests of ``w`` tokens each (so ``padding_requests`` measures the padded rows)."""
    real = build_common_metadata(case.config, dataclasses.replace(case.batch, use_cudagraph=False))
    extra = ref.padded_batch_size(case) - case.batch.num_reqs
    tokens = real.num_actual_tokens + extra * case.config.next_n
    meta = pad_for_cudagraph(real, tokens, real.num_reqs + extra)
    return meta, split_decodes_and_prefills(meta, case.config.threshold)


def reach_always(case: Case) -> bool:
    """Every replayed step fills the buffers."""
    return True


def reach_swa(case: Case) -> bool:
    """The model has a sliding-window pool: the runner fills its slot buffer."""
    return ref.has_swa(case)


def trigger_padded(case: Case) -> bool:
    """The step is padded: ``raw_bs`` is not a captured batch size."""
    return _padded(case)


def trigger_swa_padded(case: Case) -> bool:
    """A padded step of a model with a sliding-window pool."""
    return ref.has_swa(case) and _padded(case)


def _three_padded_to_four(hybrid_swa: int) -> Case:
    from attnfuzz.harness.testing import spec_config

    params = (("hybrid_swa", hybrid_swa), ("seq_len_fill_value", 1))
    return Case(spec_config(), Batch((1, 1, 1), (2, 2, 2), seed=0), params)


def smallest_stale_swa_slots() -> Case:
    """next_n = 2, captured batch sizes 1, 2, 4, ...: three requests replay the graph of
    four; the padded request's two sliding-window slots are stale."""
    return _three_padded_to_four(1)


def smallest_stale_positions() -> Case:
    """Three requests padded to four: the padded request's two positions are stale."""
    return _three_padded_to_four(0)


def build() -> Target:
    from attnfuzz.kernels import graph_input_padding as k

    return Target(
        runs_in="runner",
        name="graph-input-padding",
        summary="a decode graph's persistent input buffers after a padded replay fills them",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        checks=OwnCheck,
        describe=describe,
        # Every mutant's condition is a padded step: the more padding rows, the more
        # rows a stale field shows in.
        guided=("padding_requests",),
        # A model with or without a sliding-window pool; the backend's seq_lens fill value.
        params={"hybrid_swa": (0, 1), "seq_len_fill_value": (1, 3)},
        implementations=(
            Implementation("triton", k.graph_input_padding, Kind.FIXED, "one launch per buffer"),
            Implementation("reference", reference_impl, Kind.REFERENCE, "the reference's rows"),
            Implementation.mutant(
                "stale-swa-slots",
                k.mutant_stale_swa_slots,
                "padded tokens keep stale sliding-window slots (#24743's defect)",
                reach=reach_swa,
                trigger=trigger_swa_padded,
                smallest=smallest_stale_swa_slots,
            ),
            Implementation.mutant(
                "stale-positions",
                k.mutant_stale_positions,
                "padded tokens keep stale positions",
                reach=reach_always,
                trigger=trigger_padded,
                smallest=smallest_stale_positions,
            ),
        ),
    )
