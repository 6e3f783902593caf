"""Target ``draft-block-tables``: the drafter's per-group attention metadata (bug C, #43982)."""

from __future__ import annotations

import torch
from attnfuzz.harness.oracle import Mismatch, expect_close, expect_equal, expect_meta
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import draft_block_tables as ref
from attnfuzz.reference.batch import Batch, Case, build_common_metadata


def compare(
    case: Case,
    inputs: ref.DraftBlockTablesInputs,
    expected: ref.DraftBlockTablesExpected,
    got: ref.DraftBlockTablesOutputs,
) -> list[Mismatch]:
    """Per group: the metadata's shapes, dtypes and values exactly, then the attention output."""
    metadata, outs = getattr(got, "metadata", None), getattr(got, "out", None)
    num_groups = len(expected.groups)
    if not isinstance(metadata, list | tuple) or not isinstance(outs, list | tuple):
        return [Mismatch("type", "outputs", "metadata and out lists", type(got).__name__)]
    if len(metadata) != num_groups or len(outs) != num_groups:
        return [
            Mismatch(
                "groups", "outputs", f"{num_groups} groups", f"{len(metadata)} and {len(outs)}"
            )
        ]
    out: list[Mismatch] = []
    for g, (want, meta, result) in enumerate(zip(expected.groups, metadata, outs, strict=True)):
        for field in ("query_start_loc", "seq_lens", "block_table"):
            name, reference = f"group{g}.{field}", getattr(want, field)
            value = getattr(meta, field, None)  # a missing field is a "type" mismatch
            wrong = expect_meta(name, value, reference.shape, torch.int32)
            out += wrong or expect_equal(name, value, reference)
        name = f"group{g}.out"
        wrong = expect_meta(name, result, want.out.shape, torch.float32)
        out += wrong or expect_close(name, result, want.out)
    return out


def reference_impl(inputs: ref.DraftBlockTablesInputs) -> ref.DraftBlockTablesOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    expected = ref.reference(None, inputs)
    device = inputs.q.device

    def dev(x) -> torch.Tensor:
        return torch.as_tensor(x).to(device)

    metadata = [
        ref.GroupAttentionMetadata(dev(g.query_start_loc), dev(g.seq_lens), dev(g.block_table))
        for g in expected.groups
    ]
    return ref.DraftBlockTablesOutputs(metadata, [dev(g.out) for g in expected.groups])


def reach_padded_table(case: Case) -> bool:
    """The step is replayed in a graph with request padding: the stored tables are padded."""
    return build_common_metadata(case.config, case.batch).padded


def trigger_padded_table(case: Case) -> bool:
    """``R_pad != R``: a stored table has rows of padding requests."""
    meta = build_common_metadata(case.config, case.batch)
    return meta.padded and meta.num_reqs != meta.num_real_reqs


def smallest_padded_table() -> Case:
    """docs/domain.md, bug C: next_n = 2, 3 requests -> 6 tokens -> graph of 8 -> R_pad 4.

    The example engine of docs/domain.md, section 7 (capture sizes 2, 4, 8, ...: 6 tokens is no
    capture size); every other integer at its smallest.
    """
    from attnfuzz.harness.testing import spec_config

    params = tuple(sorted((name, lo) for name, (lo, _) in ref.PARAMS.items()))
    return Case(spec_config(), Batch((0, 0, 0), (2, 2, 2), seed=0), params)


def build() -> Target:
    from attnfuzz.kernels import draft_block_tables as k

    target = Target(
        name="draft-block-tables",
        summary="drafter's per-group attention metadata on a padded step and the varlen paged "
        "attention that consumes it (full and sliding-window KV-cache groups)",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        params=dict(ref.PARAMS),
        # Bug C needs stored tables with rows of padding requests (R_pad != R).
        guided=("padding_requests",),
        # Queries, keys and values are built in float32 whatever ATTNFUZZ_DTYPE says.
        dtypes=(torch.float32,),
    )
    target.add(
        Implementation("triton", k.draft_attention, "fixed", "tables sliced to R, Triton attention")
    )
    target.add(Implementation("reference", reference_impl, "reference", "the NumPy reference"))
    target.add(
        Implementation(
            "pr43982-padded-table",
            k.mutant_padded_table,
            "mutant",
            "#43982: each group's stored [R_pad, W_g] table attached unsliced",
            trigger=trigger_padded_table,
            reach=reach_padded_table,
            smallest=smallest_padded_table,
        )
    )
    return target
