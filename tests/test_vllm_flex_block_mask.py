"""``flex-block-mask`` by the installed vLLM's own FlexAttentionMetadataBuilder (``--impl vllm``).

On a release that fixes ``q_block_size`` in the builder (0.21.0: 16), a hand case of
another size is one it never builds: :func:`runs_here` skips it with the reason.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.adapters.vllm import flex_block_mask as adapter
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets.flex_block_mask import (
    reach_upstream_capacity,
    trigger_capacity,
    trigger_upstream_capacity,
)
from attnfuzz.harness.testing import assert_detected
from attnfuzz.reference import flex_block_mask as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig, build_common_metadata
from attnfuzz.reference.invariants import violations

pytestmark = requires_vllm

TARGET = "flex-block-mask"
UPSTREAM = "upstream-pr39353-capacity"


def case_of(q_lens, computed, q_block_log2: int, seed: int = 5, **config) -> Case:
    """A case on a small engine (no speculative decoding unless asked)."""
    base = dict(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=32, block_size=2)
    base.update(config)
    case = Case(
        EngineConfig(**base), Batch(tuple(computed), tuple(q_lens), seed=seed),
        ((ref.Q_BLOCK_PARAM, q_block_log2),),
    )  # fmt: skip
    assert violations(case.config, case.batch) == []
    return case


MIXED = case_of((1, 3, 9), (2, 0, 5), 1)  # query blocks of 2 rows span requests
# next_n = 2: three decodes, 6 tokens padded to a graph of 8 (a padding request)
PADDED = case_of((2, 2, 2), (3, 5, 1), 1, num_spec=1, cudagraph_capture_sizes=(2, 4, 8))


def runs_here(case: Case) -> Case:
    """``case``, or a skip where the installed release declines it."""
    reason = get_target(TARGET).implementations["vllm"].declines(case)
    if reason is not None:
        pytest.skip(reason)
    return case


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def test_the_upstream_mutant_is_found_as_a_runtime_error():
    result = assert_detected(TARGET, UPSTREAM)  # the generic test's run
    assert result.verdict.key == "exception:RuntimeError"


def test_smallest_case_fails_only_the_upstream_mutant():
    """One token, max_model_len 8 in one page, q_block_size 16: the mask [1, 16] does
    not fit the pre-fix table [8, 1]; vLLM's copy_to_persistent slice refuses it."""
    case = get_target(TARGET).implementations[UPSTREAM].smallest()
    assert trigger_upstream_capacity(case) and reach_upstream_capacity(case)
    assert judge("vllm", case).ok
    verdict = judge(UPSTREAM, case)
    assert verdict.key == "exception:RuntimeError"
    assert "shape [1, 1] doesn't match the broadcast shape [1, 16]" in verdict.mismatches[0].got


def test_vllm_s_tables_are_views_of_the_case_s_persistent_memory():
    inputs = ref.make_inputs(runs_here(MIXED))
    out = adapter.run(inputs)
    assert out.kv_indices.data_ptr() == inputs.persistent_kv_indices.data_ptr()
    assert out.kv_num_blocks.data_ptr() == inputs.persistent_kv_num_blocks.data_ptr()
    # The strided slice [:rows, :cols] of the [cdiv(32, 2), 2 * cdiv(16, 2)] table.
    rows, cols = ref.mask_shape(inputs.num_tokens, inputs.max_seq_len, 2, 2)
    assert tuple(out.kv_indices.shape) == (rows, cols)
    assert out.kv_indices.stride() == (16, 1) and cols < 16


def test_fidelity_strided_slice_old_oracle_refused_it():
    """The old oracle asked for a contiguous table; vLLM's strided slice is read by
    its strides, and passes now. The re-created mutant is still caught."""
    out = adapter.run(ref.make_inputs(runs_here(MIXED)))
    assert not out.kv_indices.is_contiguous()
    assert judge("vllm", MIXED).ok
    assert judge("pr39353-capacity", get_target(TARGET).implementations[
        "pr39353-capacity"].smallest()).key == "exception:RuntimeError"  # fmt: skip


def test_fidelity_rows_count_the_real_tokens():
    """Padded step: vLLM's mask has cdiv(6, 2) = 3 rows, the old oracle wanted
    cdiv(8, 2) = 4 (a row for the padding request's block); both pass now."""
    inputs = ref.make_inputs(runs_here(PADDED))
    expected = ref.reference(PADDED, inputs)
    out = adapter.run(inputs)
    assert expected.kv_indices.shape[0] == 4 and expected.num_real_rows == 3
    assert out.kv_indices.shape[0] == out.kv_num_blocks.shape[0] == 3
    assert judge("vllm", PADDED).ok and judge("triton", PADDED).ok


def test_fidelity_page_0_is_the_null_block():
    """Unreserved, request 2 of MIXED owns page 0 and vLLM's builder drops it from
    every query block (unique_static_unsorted(ignored_val=0)): its attention would
    lose a page. The oracle says so; the target's inputs reserve the null page."""
    inputs = ref.make_inputs(runs_here(MIXED))
    raw = build_common_metadata(MIXED.config, MIXED.batch)
    assert raw.block_table[2, 2] == 0  # page 0 owned by request 2 (seq_len 14, 7 pages)
    unreserved = dataclasses.replace(
        inputs,
        block_table=torch.as_tensor(raw.block_table),
        num_pages=raw.num_blocks,
        common=raw,
    )
    expected = ref.reference(MIXED, unreserved)
    got = adapter.run(unreserved)
    mismatches = get_target(TARGET).compare(MIXED, unreserved, expected, got)
    assert [m.check for m in mismatches][:1] == ["mask.missing"], mismatches
    assert "missing [0]" in mismatches[0].got
    assert judge("vllm", MIXED).ok  # reserved: no real request owns page 0


@pytest.mark.parametrize("q_block_log2", [0, 2, 4])
def test_vllm_and_triton_agree_on_a_step_past_max_model_len(q_block_log2):
    """16 tokens in an engine of max_model_len 8: the pre-fix tables overflow."""
    case = case_of(
        (1, 7, 8), (3, 0, 0), q_block_log2, max_model_len=8, max_num_batched_tokens=16,
        block_size=1,
    )  # fmt: skip
    assert trigger_capacity(case) and trigger_upstream_capacity(case)
    runs_here(case)
    assert judge("vllm", case).ok and judge("triton", case).ok
    assert judge(UPSTREAM, case).key == "exception:RuntimeError"


# -- the consumer, emulated: the oracle's conditions are what the attention output needs --


def flex_attention_output(
    inputs: ref.FlexBlockMaskInputs, kv_indices: torch.Tensor, kv_num_blocks: torch.Tensor
) -> np.ndarray:
    """Per real token, what vLLM's flex_attention computes from the mask: it walks
    ``kv_indices[g, :kv_num_blocks[g]]`` (duplicates walked twice) and keeps slot
    ``s`` of page ``p`` where vLLM 0.33.0's paged mask function does: ``p`` at logical
    index ``i`` of the row's request (the largest, as ``physical_to_logical_mapping``
    takes; page 0 never), ``i * bs + s`` below ``seq_len`` and at most ``pos``.
    One head, keys and values drawn per cache slot."""
    bs, q = inputs.block_size, inputs.q_block_size
    qsl = inputs.query_start_loc.cpu().numpy()
    seq_lens = inputs.seq_lens.cpu().numpy()
    table = inputs.block_table.cpu().numpy()
    walked_rows = kv_indices.cpu().numpy()
    counts = kv_num_blocks.cpu().numpy()
    rng = np.random.default_rng(0)
    slots = inputs.num_pages * bs
    keys, values = rng.normal(size=(slots, 4)), rng.normal(size=(slots, 4))
    queries = rng.normal(size=(int(qsl[inputs.num_reqs]), 4))
    out = np.zeros_like(queries)
    for r in range(inputs.num_reqs):
        n_pages = -(-int(seq_lens[r]) // bs)
        logical = {int(p): i for i, p in enumerate(table[r, :n_pages]) if p != 0}
        for t in range(int(qsl[r]), int(qsl[r + 1])):
            pos = int(seq_lens[r]) - int(qsl[r + 1] - qsl[r]) + t - int(qsl[r])
            seen = []
            g = t // q
            for p in walked_rows[g, : counts[g]].tolist():
                i = logical.get(p, -1)
                seen += [p * bs + s for s in range(bs) if i >= 0 and i * bs + s <= pos]
            if not seen:  # a row that sees nothing: flex_attention writes zeros
                continue
            scores = keys[seen] @ queries[t]
            weights = np.exp(scores - scores.max())
            out[t] = weights @ values[seen] / weights.sum()
    return out


def reference_output(inputs: ref.FlexBlockMaskInputs) -> np.ndarray:
    """The same attention over exactly the causal keys of each token, walked in order."""
    expected = ref.reference(None, inputs)
    rows = torch.as_tensor(expected.kv_indices)
    return flex_attention_output(inputs, rows, torch.as_tensor(expected.kv_num_blocks))


CONSUMER_CASES = [
    MIXED,
    PADDED,
    case_of((1, 1, 14), (9, 3, 0), 2, seed=11),
    case_of((1, 3, 9), (2, 0, 5), 4),  # query blocks of 16 rows: every release builds it
]


@pytest.mark.parametrize("case", CONSUMER_CASES, ids=["mixed", "padded", "q4", "q16"])
def test_vllm_s_mask_gives_the_reference_attention(case):
    inputs = ref.make_inputs(runs_here(case))
    out = adapter.run(inputs)
    np.testing.assert_allclose(
        flex_attention_output(inputs, out.kv_indices, out.kv_num_blocks), reference_output(inputs)
    )


def _walk(inputs, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    table = torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int32)
    return table, torch.tensor([len(r) for r in rows], dtype=torch.int32)


@pytest.mark.parametrize(
    "edit, check",
    [
        # the null block and a page of request 2 in every row: the output stays
        (lambda rows, foreign: [r + [p for p in (0, foreign) if p not in r] for r in rows], None),
        (lambda rows, foreign: [r[1:] for r in rows], "mask.missing"),
        (lambda rows, foreign: [r + r[:1] for r in rows], "mask.duplicate"),
    ],
    ids=["superset", "missing", "duplicate"],
)
def test_the_oracle_fails_exactly_when_the_consumer_s_output_moves(edit, check):
    """Walked pages edited on the reference's mask of MIXED: where the emulated
    attention output stays the reference's the oracle passes, where it moves the
    oracle names why."""
    inputs = ref.make_inputs(MIXED)
    expected = ref.reference(MIXED, inputs)
    heads = [
        row[:n].tolist() for row, n in zip(expected.kv_indices, expected.kv_num_blocks, strict=True)
    ]
    foreign = int(inputs.block_table[2, 0])
    rows = edit(heads, foreign)
    kv_indices, kv_num_blocks = _walk(inputs, rows)
    same = np.allclose(
        flex_attention_output(inputs, kv_indices, kv_num_blocks), reference_output(inputs)
    )
    assert same == (check is None)
    # The same heads in the persistent memory, as an implementation returns them.
    width = expected.kv_indices.shape[1]
    view = inputs.persistent_kv_indices[: len(rows) * width].view(len(rows), width)
    counts = inputs.persistent_kv_num_blocks[: len(rows)]
    view[:, : kv_indices.shape[1]] = kv_indices[:, :width]
    counts.copy_(kv_num_blocks)
    got = ref.FlexBlockMaskOutputs(view, counts)
    checks = {m.check for m in get_target(TARGET).compare(MIXED, inputs, expected, got)}
    assert checks == (set() if check is None else {check}), checks


def test_a_release_without_the_q_block_size_knob_declines_other_sizes():
    """Where ``AttentionConfig`` has no ``flex_attn_q_block_size`` (0.21.0), the builder
    picks ``q_block_size`` itself: the cases of that size are judged, the others are
    declined in one line naming it, never drawn, and refused when replayed. Where the
    knob exists, nothing is declined."""
    from attnfuzz.adapters.vllm import compat
    from attnfuzz.harness.target import InvalidCase
    from hypothesis import given, settings

    target = get_target(TARGET)
    vllm = target.resolve("vllm")
    sizes = {log2: vllm.declines(case_of((1, 3), (2, 0), log2)) for log2 in range(5)}
    if compat.has(compat.FLEX_Q_BLOCK_SIZE):
        assert set(sizes.values()) == {None}
        return
    own = adapter._own_q_block_size(MIXED.config)
    assert [2**log2 for log2, reason in sizes.items() if reason is None] == [own]
    assert f"fixes q_block_size at {own}" in (sizes[0] or "")
    with pytest.raises(InvalidCase, match="fixes q_block_size"):
        judge("vllm", MIXED)

    @settings(max_examples=30, database=None, derandomize=True)
    @given(target.cases(impl=vllm))
    def drawn(case):
        assert ref.q_block_size(case) == own

    drawn()
