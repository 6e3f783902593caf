"""Target ``flex-block-mask``: FlexAttention block mask in persistent tables (bug E, #39353)."""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import (
    Mismatch,
    expect_contiguous,
    expect_equal,
    expect_meta,
    expect_untouched_outside,
    expect_view_of,
)
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import flex_block_mask as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig, build_common_metadata


def expect_page_sets(
    name: str, got: torch.Tensor, expected: np.ndarray, counts: np.ndarray
) -> list[Mismatch]:
    """Row ``g`` holds the distinct pages of ``expected[g, :counts[g]]`` in any order,
    left-packed, then ``-1`` to the end of the row.

    Compared exactly once the first ``counts[g]`` entries of each row are sorted
    (``expected`` lists them in ascending order); a mismatch shows the row so.
    """
    g = got.detach().cpu().numpy()
    if g.shape != expected.shape:
        return [Mismatch("shape", name, str(list(expected.shape)), str(list(g.shape)))]
    head = np.arange(g.shape[1])[None, :] < np.asarray(counts)[:, None]
    keyed = np.where(head, g, np.iinfo(g.dtype).max)
    keyed.sort(axis=1)  # each head ascending, ahead of the keyed-away tail
    canonical = np.where(head, keyed, g)
    return expect_equal(name, torch.from_numpy(canonical), expected, check="mask")


def compare(
    case: Case,
    inputs: ref.FlexBlockMaskInputs,
    expected: ref.FlexBlockMaskExpected,
    got: ref.FlexBlockMaskOutputs,
) -> list[Mismatch]:
    rows, cols = expected.kv_indices.shape
    kv_indices = getattr(got, "kv_indices", got)
    kv_num_blocks = getattr(got, "kv_num_blocks", None)
    out = expect_meta("kv_indices", kv_indices, (rows, cols), torch.int32)
    out += expect_meta("kv_num_blocks", kv_num_blocks, (rows,), torch.int32)
    if out:
        return out
    # The step's tables are the re-strided heads of the persistent ones.
    out += expect_view_of("kv_indices", kv_indices, inputs.persistent_kv_indices)
    out += expect_contiguous("kv_indices", kv_indices)
    out += expect_view_of("kv_num_blocks", kv_num_blocks, inputs.persistent_kv_num_blocks)
    out += expect_contiguous("kv_num_blocks", kv_num_blocks)
    out += expect_equal("kv_num_blocks", kv_num_blocks, expected.kv_num_blocks)
    out += expect_page_sets("kv_indices", kv_indices, expected.kv_indices, expected.kv_num_blocks)
    out += expect_untouched_outside(
        "persistent_kv_indices", inputs.persistent_kv_indices, expected.kv_indices_before,
        kv_indices,
    )  # fmt: skip
    out += expect_untouched_outside(
        "persistent_kv_num_blocks", inputs.persistent_kv_num_blocks,
        expected.kv_num_blocks_before, kv_num_blocks,
    )  # fmt: skip
    return out


def reference_impl(inputs: ref.FlexBlockMaskInputs) -> ref.FlexBlockMaskOutputs:
    """The reference written into the heads of the persistent memory (a self-check)."""
    expected = ref.reference(None, inputs)
    rows, cols = expected.kv_indices.shape
    kv_indices = inputs.persistent_kv_indices[: rows * cols].view(rows, cols)
    kv_num_blocks = inputs.persistent_kv_num_blocks[:rows]
    # In place: no allocation on the device.
    kv_indices.copy_(torch.from_numpy(expected.kv_indices))
    kv_num_blocks.copy_(torch.from_numpy(expected.kv_num_blocks))
    return ref.FlexBlockMaskOutputs(kv_indices, kv_num_blocks)


def _overflows(tables: tuple[int, int], mask: tuple[int, int]) -> bool:
    """A ``mask`` that the re-stride of persistent ``tables`` (and its row counts) cannot hold."""
    return mask[0] * mask[1] > tables[0] * tables[1] or mask[0] > tables[0]


def _model_len_tables(case: Case) -> tuple[int, int]:
    return ref.model_len_shape(case.config.max_model_len, case.config.block_size)


def trigger_capacity(case: Case) -> bool:
    """This step's mask outgrows ``[max_model_len, cdiv(max_model_len, bs)]``.

    Its rows are the query blocks of the whole step, so usually the step has
    more tokens than ``max_model_len``: ``max_num_batched_tokens > max_model_len``
    and a step near its budget. Less often a short step overflows because
    its ``q_block_size`` page slots per page outnumber ``max_model_len``.
    """
    config = case.config
    meta = build_common_metadata(config, case.batch)
    mask = ref.mask_shape(
        meta.num_actual_tokens, meta.max_seq_len, config.block_size, ref.q_block_size(case)
    )
    return _overflows(_model_len_tables(case), mask)


def reach_capacity(case: Case) -> bool:
    """The engine's limits admit a mask that the pre-fix tables cannot hold
    (``max_num_batched_tokens`` tokens and a sequence at ``max_model_len``)."""
    config = case.config
    largest = ref.persistent_shape(
        config.max_num_batched_tokens, config.max_model_len, config.block_size,
        ref.q_block_size(case),
    )  # fmt: skip
    return _overflows(_model_len_tables(case), largest)


def smallest_capacity() -> Case:
    """One token, ``max_model_len = 8`` (the strategies' least) in one page, q_block_size 16.

    The pre-fix tables hold ``8 * cdiv(8, 8) = 8`` elements, but even a one-token
    step's mask has ``q_block_size * cdiv(max_seq_len, bs) = 16`` page slots:
    ``[1, 16]`` cannot be re-strided from ``[8, 1]``. Nothing smaller triggers: a
    step has a token, and a one-token mask ``[1, q * cdiv(max_seq_len, bs)]``
    outgrows ``max_model_len * cdiv(max_model_len, bs)`` elements only when
    ``q > max_model_len >= 8``.
    """
    config = EngineConfig(
        max_model_len=8,
        max_num_seqs=1,
        max_num_batched_tokens=1,
        block_size=8,
        cudagraph_capture_sizes=(1,),
    )
    return Case(config, Batch((0,), (1,), seed=0), ((ref.Q_BLOCK_PARAM, 4),))


def build() -> Target:
    from attnfuzz.kernels import flex_block_mask as k

    target = Target(
        name="flex-block-mask",
        summary="FlexAttention block mask per query block, re-strided into persistent tables",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        params={ref.Q_BLOCK_PARAM: (0, 4)},  # q_block_size 1, 2, 4, 8, 16
        graph_safe=True,
    )
    target.add(
        Implementation("triton", k.flex_block_mask, "fixed", "tables sized by the #39353 fix")
    )
    target.add(Implementation("reference", reference_impl, "reference", "the NumPy reference"))
    target.add(
        Implementation(
            "pr39353-capacity",
            k.mutant_capacity,
            "mutant",
            "#39353: persistent tables sized [max_model_len, cdiv(max_model_len, bs)]",
            trigger=trigger_capacity,
            reach=reach_capacity,
            smallest=smallest_capacity,
        )
    )
    return target
