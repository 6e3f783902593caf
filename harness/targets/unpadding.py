"""Target ``unpadding``: CUDA-graph padding of the common metadata and its unpadding.

The implementation pads the real step into persistent buffers at the graph's
sizes and unpads it back to the real sizes. The oracle checks, for the padded
and the unpadded metadata, each field's shape and dtype and exact values
(padding rows: ``query_start_loc`` repeats ``T``, ``seq_len`` 0, the null
page; padded tokens: slot -1), the integers, and the storage: padded fields
are views at the start of the persistent buffers the implementation declares,
unpadded fields views at the start of the padded ones (no copy).
"""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import Mismatch, expect_equal, expect_meta, expect_view_of
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import unpadding as ref
from attnfuzz.reference.batch import Batch, Case, CommonMetadata, build_common_metadata

DTYPES = {
    "query_start_loc": torch.int32,
    "seq_lens": torch.int32,
    "block_table": torch.int32,
    "slot_mapping": torch.int64,
}


def _expect_step(name: str, want: CommonMetadata, got: object) -> list[Mismatch]:
    if not isinstance(got, ref.StepMetadata):
        return [Mismatch("type", name, "StepMetadata", type(got).__name__)]
    out: list[Mismatch] = []
    for field in ref.FIELDS:
        expected = np.asarray(getattr(want, field))
        tensor = getattr(got, field)
        bad = expect_meta(f"{name}.{field}", tensor, expected.shape, DTYPES[field])
        out += bad or expect_equal(f"{name}.{field}", tensor, expected)
    for field in ("num_reqs", "num_actual_tokens", "max_query_len"):
        value = getattr(got, field)
        if type(value) is not int or value != getattr(want, field):
            where = f"{name}.{field}"
            out.append(Mismatch("values", where, str(getattr(want, field)), repr(value)))
    return out


def compare(
    case: Case, inputs: ref.UnpaddingInputs, expected: ref.UnpaddingExpected, got
) -> list[Mismatch]:
    out = _expect_step("padded", expected.padded, getattr(got, "padded", None))
    out += _expect_step("unpadded", expected.unpadded, getattr(got, "unpadded", None))
    if out:
        return out
    buffers = getattr(got, "buffers", None) or {}
    for field in ref.FIELDS:
        padded, unpadded = getattr(got.padded, field), getattr(got.unpadded, field)
        buffer = buffers.get(field)
        if not isinstance(buffer, torch.Tensor):
            out.append(Mismatch("view", f"buffers.{field}", "the persistent buffer", "none"))
        else:  # graph safety: every step's metadata lives in the buffers allocated at start-up
            out += expect_view_of(f"padded.{field}", padded, buffer)
        out += expect_view_of(f"unpadded.{field}", unpadded, padded)
    return out


def reference_impl(inputs: ref.UnpaddingInputs) -> ref.UnpaddingOutputs:
    """The fixed torch glue stands in for the reference: the reference is NumPy
    (host copies) and the oracle asks for views of persistent buffers."""
    from attnfuzz.kernels.unpadding import pad_and_unpad

    return pad_and_unpad(inputs)


# The zoo's metadata of each mutant (docs/domain.md, section 8, for the convention).


def _meta(case: Case) -> CommonMetadata:
    return build_common_metadata(case.config, case.batch)


def reach_padded(case: Case) -> bool:
    """The step replays a graph (``padded``): padding and unpadding run."""
    return _meta(case).padded


def trigger_padded_tokens(case: Case) -> bool:
    """The graph has more tokens than the step, ``T_pad > T``."""
    meta = _meta(case)
    return meta.num_actual_tokens > meta.num_real_tokens


def trigger_padding_requests(case: Case) -> bool:
    """The graph has padding requests, ``R_pad > R``."""
    meta = _meta(case)
    return meta.num_reqs > meta.num_real_reqs


def reach_any(case: Case) -> bool:
    """Every step is padded (possibly to its own size) and unpadded."""
    return True


def smallest_padded() -> Case:
    """next_n = 2: three decodes of 2 tokens padded to the graph of 8 (``R_pad = 4``)."""
    from attnfuzz.harness.testing import spec_config

    return Case(spec_config(), Batch((1, 1, 1), (2, 2, 2), seed=0, use_cudagraph=True))


def smallest_any() -> Case:
    """One request of one token: its unpadded metadata is already a copy or a view."""
    from attnfuzz.harness.testing import spec_config

    return Case(spec_config(), Batch((0,), (1,), seed=0, use_cudagraph=True))


def build() -> Target:
    from attnfuzz.kernels import unpadding as k

    target = Target(
        runs_in="runner",
        name="unpadding",
        summary="CUDA-graph padding of the common metadata into persistent buffers, and unpadded()",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        describe=ref.describe,
        # Padding and unpadding differ only where a graph pads tokens and requests.
        guided=("padded_tokens", "padding_requests"),
    )
    target.add(Implementation("triton", k.pad_and_unpad, "fixed", "torch glue, views"))
    target.add(Implementation("reference", reference_impl, "reference", "the fixed glue"))
    stale_slots = dict(trigger=trigger_padded_tokens, reach=reach_padded, smallest=smallest_padded)
    padding_rows = dict(
        trigger=trigger_padding_requests, reach=reach_padded, smallest=smallest_padded
    )
    mutants = [
        ("stale-slots", k.mutant_stale_slots, "padded tokens keep stale slots", stale_slots),
        (
            "stale-table-rows",
            k.mutant_stale_table_rows,
            "padding requests keep stale page ids",
            padding_rows,
        ),
        (
            "stale-seq-lens",
            k.mutant_stale_seq_lens,
            "padding requests keep stale lengths",
            padding_rows,
        ),
        (
            "stale-query-start-loc",
            k.mutant_stale_query_start_loc,
            "query_start_loc past the real requests left stale",
            padding_rows,
        ),
        (
            "unpadded-table",
            k.mutant_unpadded_table,
            "unpadded keeps R_pad block-table rows (#43982's shape)",
            padding_rows,
        ),
        (
            "unpadded-copy",
            k.mutant_unpadded_copy,
            "unpadded copies instead of viewing",
            dict(trigger=reach_any, reach=reach_any, smallest=smallest_any),
        ),
    ]
    for name, fn, description, meta in mutants:
        target.add(Implementation(name, fn, "mutant", description, **meta))
    return target
