"""Target ``flex-block-mask``: FlexAttention block mask in persistent tables (bug E, #39353)."""

from __future__ import annotations

import torch
from attnfuzz.harness.oracle import (
    Mismatch,
    expect_contiguous,
    expect_inside,
    expect_untouched_outside,
    expect_view_of,
)
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import flex_block_mask as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig, build_common_metadata


def _short(values: object, limit: int = 160) -> str:
    text = str(values)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect_walked_pages(
    kv_indices: torch.Tensor, kv_num_blocks: torch.Tensor, expected: ref.FlexBlockMaskExpected
) -> list[Mismatch]:
    """What the consumer computes (reference/flex_block_mask.py): row ``g`` of the
    mask walks ``kv_indices[g, :kv_num_blocks[g]]``. Each count fits its row; each
    walked id is a page of the cache; no page is walked twice; and a block holding
    real tokens walks every page they need (more are allowed: the mask function
    hides the slots a row may not see). Entries after the head are never read."""
    got = kv_indices.detach().cpu().numpy()
    counts = kv_num_blocks.detach().cpu().numpy()
    needed = expected.needed
    cols, num_pages = got.shape[1], expected.num_pages
    out: list[Mismatch] = []
    for g in range(got.shape[0]):
        n = int(counts[g])
        where = f"kv_indices[{g}]"
        if not 0 <= n <= cols:
            out.append(Mismatch("count", f"kv_num_blocks[{g}]", f"a count in [0, {cols}]", str(n)))
        else:
            head = got[g, :n]
            walked = set(head.tolist())
            if ((head < 0) | (head >= num_pages)).any():
                out.append(
                    Mismatch(
                        "mask.invalid",
                        where,
                        f"{n} walked ids in [0, {num_pages}), the pages of the cache",
                        _short(head.tolist()),
                    )
                )
            elif len(walked) != n:
                shown = _short(head.tolist())
                out.append(Mismatch("mask.duplicate", where, "each page walked once", shown))
            elif g < expected.num_real_rows and not needed[g] <= walked:
                missing = sorted(needed[g] - walked)
                out.append(
                    Mismatch(
                        "mask.missing",
                        where,
                        f"pages {_short(sorted(needed[g]))} walked (more allowed)",
                        f"{_short(head.tolist())}, missing {_short(missing)}",
                    )
                )
        if len(out) >= 8:
            break
    return out


def expect_table_view(name: str, got: torch.Tensor, buffer: torch.Tensor) -> list[Mismatch]:
    """``got`` is the step's table in the persistent memory, read by its strides.

    It starts at the head of the persistent memory (where a captured graph reads
    it), each row's entries one after another (the kernel walks ``row + i``), rows
    apart (a row stride of at least the row's length: contiguous re-stride or
    the strided slice of a wider table), every element inside the memory.
    """
    out = expect_view_of(name, got, buffer)
    if out:
        return out
    rows, cols = got.shape
    if cols > 1 and got.stride(1) != 1:
        out.append(Mismatch("stride", name, "column stride 1", str(tuple(got.stride()))))
    if rows > 1 and got.stride(0) < cols:
        out.append(
            Mismatch("stride", name, f"rows apart (row stride >= {cols})", str(tuple(got.stride())))
        )
    return out + expect_inside(name, got, buffer)


def _expect_tables(
    kv_indices: object, kv_num_blocks: object, expected: ref.FlexBlockMaskExpected
) -> list[Mismatch]:
    """Types and shapes: ``[rows, cols]`` and ``[rows]`` int32, ``cols`` the step's page
    slots, ``rows`` at least the query blocks of real tokens and at most all the step's."""
    all_rows, cols = expected.kv_indices.shape
    rows_wanted = (
        f"[{expected.num_real_rows}..{all_rows}, {cols}]"
        if expected.num_real_rows != all_rows
        else str([all_rows, cols])
    )
    out = []
    for name, got, ndim in (("kv_indices", kv_indices, 2), ("kv_num_blocks", kv_num_blocks, 1)):
        if not isinstance(got, torch.Tensor):
            out.append(Mismatch("type", name, "a torch.Tensor", type(got).__name__))
        elif got.dtype != torch.int32:
            out.append(Mismatch("dtype", name, str(torch.int32), str(got.dtype)))
        elif got.dim() != ndim:
            out.append(Mismatch("shape", name, f"{ndim} dimensions", str(list(got.shape))))
    if out:
        return out
    assert isinstance(kv_indices, torch.Tensor) and isinstance(kv_num_blocks, torch.Tensor)
    rows = kv_indices.shape[0]
    if not expected.num_real_rows <= rows <= all_rows or kv_indices.shape[1] != cols:
        out.append(Mismatch("shape", "kv_indices", rows_wanted, str(list(kv_indices.shape))))
    if tuple(kv_num_blocks.shape) != (rows,):
        out.append(Mismatch("shape", "kv_num_blocks", str([rows]), str(list(kv_num_blocks.shape))))
    return out


def compare(
    case: Case,
    inputs: ref.FlexBlockMaskInputs,
    expected: ref.FlexBlockMaskExpected,
    got: ref.FlexBlockMaskOutputs,
) -> list[Mismatch]:
    kv_indices = getattr(got, "kv_indices", got)
    kv_num_blocks = getattr(got, "kv_num_blocks", None)
    out = _expect_tables(kv_indices, kv_num_blocks, expected)
    if out:
        return out
    # The step's tables are views at the head of the persistent memory.
    out += expect_table_view("kv_indices", kv_indices, inputs.persistent_kv_indices)
    out += expect_view_of("kv_num_blocks", kv_num_blocks, inputs.persistent_kv_num_blocks)
    out += expect_contiguous("kv_num_blocks", kv_num_blocks)  # read at block g, no stride
    if out:
        return out
    out += expect_walked_pages(kv_indices, kv_num_blocks, expected)
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


def _upstream_overflows(case: Case, mask: tuple[int, int]) -> bool:
    """vLLM 0.33.0 copies the step's mask into ``table[:rows, :cols]``: it needs the
    pre-fix table ``[max_model_len, cdiv(max_model_len, bs)]`` to be at least as
    long and as wide, each dimension on its own."""
    rows, cols = _model_len_tables(case)
    return mask[0] > rows or mask[1] > cols


def trigger_upstream_capacity(case: Case) -> bool:
    """vLLM's step mask (rows from the real tokens) outgrows the pre-fix tables in a
    dimension: ``q_block_size * cdiv(max_seq_len, bs)`` page slots outnumber a longest
    sequence's pages (any ``q_block_size > 1``), or query blocks ``max_model_len``."""
    config = case.config
    meta = build_common_metadata(config, case.batch)
    mask = ref.mask_shape(
        meta.num_real_tokens, meta.max_seq_len, config.block_size, ref.q_block_size(case)
    )
    return _upstream_overflows(case, mask)


def reach_upstream_capacity(case: Case) -> bool:
    """The engine's limits admit a step mask the pre-fix tables cannot hold."""
    config = case.config
    largest = ref.persistent_shape(
        config.max_num_batched_tokens, config.max_model_len, config.block_size,
        ref.q_block_size(case),
    )  # fmt: skip
    return _upstream_overflows(case, largest)


def build() -> Target:
    from attnfuzz.kernels import flex_block_mask as k

    target = Target(
        name="flex-block-mask",
        summary="FlexAttention block mask per query block, in views of persistent tables",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        params={ref.Q_BLOCK_PARAM: (0, 4)},  # q_block_size 1, 2, 4, 8, 16
        # Not graph-safe in the harness's sense (no allocation inside the call): the
        # engine builds the mask eagerly before the captured forward (vLLM 0.33.0
        # FlexAttentionMetadataBuilder.build: "Pre-build block_mask so it is ready
        # before CUDA graph capture"), allocating temporaries every step. What the
        # graph replays is the tables' address: compare demands views at the head of
        # the persistent memory, and nothing else of it changed.
        graph_safe=False,
        # #39353: the step's mask outgrows tables sized by max_model_len as the
        # step's tokens grow (rows are its query blocks).
        guided=("step_tokens",),
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
