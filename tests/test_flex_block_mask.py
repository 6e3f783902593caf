"""Target ``flex-block-mask``: reference by hand, size arithmetic, kernel, oracle, mutant."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from attnfuzz.harness.engine import fuzz_settings
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.targets.flex_block_mask import reach_capacity, trigger_capacity
from attnfuzz.harness.testing import assert_detected, assert_passes
from attnfuzz.kernels import flex_block_mask as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import flex_block_mask as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig, build_common_metadata
from attnfuzz.reference.invariants import violations
from hypothesis import given

TARGET = "flex-block-mask"
MUTANT = "pr39353-capacity"
STALE = 99
DEV = device()  # where the kernels run: tensors handed to them live there


def hand_inputs(q_block: int) -> ref.FlexBlockMaskInputs:
    """Two requests and a padding request; 4 real token rows padded to 6; pages of 2 slots.

    Pages 0..9, page 0 the null block (the padding request's row).
    Request 0: 1 new token after 2 cached (seq_len 3), pages [7, 4], stale 9 after.
    Request 1: 3 new tokens (seq_len 3), pages [2, 5], stale 9 after.
    Row 0 (request 0, position 2) attends pages {7, 4}; rows 1, 2, 3 (request 1,
    positions 0, 1, 2) attend {2}, {2}, {2, 5}; padding rows 4, 5 attend nothing.
    Tensors on ``DEV``.
    """
    n_indices, n_counts = ref.reserved_elements(8, 16, 2, q_block)
    i32 = dict(dtype=torch.int32, device=DEV)
    return ref.FlexBlockMaskInputs(
        query_start_loc=torch.tensor([0, 1, 4, 4], **i32),
        seq_lens=torch.tensor([3, 3, 0], **i32),
        block_table=torch.tensor([[7, 4] + [9] * 6, [2, 5] + [9] * 6, [0] * 8], **i32),
        persistent_kv_indices=torch.full((n_indices,), STALE, **i32),
        persistent_kv_num_blocks=torch.full((n_counts,), STALE, **i32),
        num_reqs=3,
        num_tokens=6,
        max_seq_len=3,
        block_size=2,
        q_block_size=q_block,
        max_model_len=16,
        max_num_batched_tokens=8,
        num_pages=10,
    )


# Per q_block_size: each query block's pages in ascending order, -1 to the row's
# q_block_size * cdiv(3, 2) = 2 * q_block_size page slots.
HAND = {
    1: [[4, 7], [2, -1], [2, -1], [2, 5], [-1, -1], [-1, -1]],
    2: [[2, 4, 7, -1], [2, 5, -1, -1], [-1, -1, -1, -1]],
    4: [[2, 4, 5, 7, -1, -1, -1, -1], [-1] * 8],
    8: [[2, 4, 5, 7] + [-1] * 12],
}


@pytest.mark.parametrize("q_block", sorted(HAND))
def test_reference_by_hand(q_block):
    inputs = hand_inputs(q_block)
    expected = ref.reference(None, inputs)
    assert expected.kv_indices.tolist() == HAND[q_block]
    counts = [sum(p != -1 for p in row) for row in HAND[q_block]]
    assert expected.kv_num_blocks.tolist() == counts
    assert (expected.kv_indices_before == STALE).all()


@pytest.mark.parametrize("q_block", sorted(HAND))
def test_triton_matches_the_hand_case(q_block):
    inputs = hand_inputs(q_block)
    expected = ref.reference(None, inputs)
    got = kernels.flex_block_mask(inputs)
    assert get_target(TARGET).compare(None, inputs, expected, got) == []
    # Built in place: the heads of the persistent memory, the rest still stale.
    rows, cols = expected.kv_indices.shape
    assert got.kv_indices.data_ptr() == inputs.persistent_kv_indices.data_ptr()
    assert (inputs.persistent_kv_indices[rows * cols :] == STALE).all()
    assert (inputs.persistent_kv_num_blocks[rows:] == STALE).all()


# -- inconsistent metadata: refused from shapes (graph-safe), or never read past --------

POISON = 1234  # what follows a narrowed tensor in memory: read, it shows up in the mask


def i32(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=DEV)


def build(inputs: ref.FlexBlockMaskInputs, **edits) -> tuple[list, list]:
    """``build_block_mask`` on ``inputs`` with ``edits``, into fresh tables of the step's
    shape: each row's pages sorted (any order is valid), and the counts."""
    inputs = dataclasses.replace(inputs, **edits)
    rows, cols = ref.mask_shape(
        inputs.num_tokens, inputs.max_seq_len, inputs.block_size, inputs.q_block_size
    )
    kv_indices = torch.full((rows, cols), STALE, dtype=torch.int32, device=DEV)
    kv_num_blocks = torch.full((rows,), STALE, dtype=torch.int32, device=DEV)
    kernels.build_block_mask(
        inputs.query_start_loc, inputs.seq_lens, inputs.block_table, inputs.num_reqs,
        inputs.num_tokens, inputs.block_size, inputs.q_block_size, kv_indices, kv_num_blocks,
    )  # fmt: skip
    counts = kv_num_blocks.tolist()
    return [sorted(r[:n]) + r[n:] for r, n in zip(kv_indices.tolist(), counts, strict=True)], counts


@pytest.mark.parametrize(
    "seq_lens, want",
    [
        # request 0 claims 5 tokens (3 pages) with 2 in its row: the row's 2 pages, no more
        ([5, 3, 0], HAND[2]),
        ([2**30, 3, 0], HAND[2]),
        # a negative length holds no page; request 1 keeps its own
        ([-100, 3, 0], [[2, -1, -1, -1], [2, 5, -1, -1], [-1] * 4]),
    ],
    ids=["one-page-past", "far-past", "negative"],
)
def test_pages_never_come_from_past_a_request_s_table_row(seq_lens, want):
    """Rows of 2 entries, narrowed from rows whose next entries hold POISON."""
    table = i32([[7, 4, POISON, POISON], [2, 5, POISON, POISON], [0, 0, 0, 0]])[:, :2]
    got, counts = build(hand_inputs(2), seq_lens=i32(seq_lens), block_table=table)
    assert got == want and counts == [sum(p != -1 for p in row) for row in want]


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(query_start_loc=i32([0, 1, 4, POISON])[:3]), "query_start_loc must be .* at least 4"),
        (dict(seq_lens=i32([3, 3, POISON])[:2]), "seq_lens must be .* at least 3"),
        (dict(seq_lens=i32([3, POISON, POISON])[:1].expand(3)), "seq_lens must be a contiguous"),
        (dict(block_table=i32([[7, 4], [2, 5], [POISON] * 2])[:2]), "a row per request"),
    ],
    ids=["short-query_start_loc", "short-seq_lens", "expanded-seq_lens", "short-block_table"],
)
def test_metadata_shorter_than_num_reqs_is_refused(edit, message):
    """Refused from shapes alone (no host sync in this graph-safe path)."""
    with pytest.raises(ValueError, match=message):
        build(hand_inputs(2), **edit)


def test_counts_shorter_than_the_mask_rows_are_refused_and_not_written_past():
    inputs = hand_inputs(2)
    memory = torch.full((5,), STALE, dtype=torch.int32, device=DEV)
    kv_indices = torch.full((3, 4), STALE, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="kv_num_blocks must be .* at least 3"):
        kernels.build_block_mask(
            inputs.query_start_loc, inputs.seq_lens, inputs.block_table, 3, 6, 2, 2,
            kv_indices, memory[:2],
        )  # fmt: skip
    assert (memory == STALE).all() and (kv_indices == STALE).all()


def test_size_arithmetic_of_the_production_crash():
    """max_model_len 4096, bs 16, q block 16, 16384 batched tokens (docs/domain.md, bug E)."""
    assert ref.mask_shape(16384, 4096, 16, 16) == (1024, 4096)  # a full step
    assert ref.persistent_shape(16384, 4096, 16, 16) == (1024, 4096)  # the fix
    assert ref.model_len_shape(4096, 16) == (4096, 256)  # before the fix
    assert 1024 * 4096 > 4096 * 256  # so it cannot be re-strided


def test_production_crash_message():
    """Four 4096-token prefills fill the 16384-token budget: the upstream start-up failure.

    Only the mutant runs (it fails before any kernel); the fixed path at this
    size is for a GPU, not the interpreter.
    """
    config = EngineConfig(
        max_model_len=4096, max_num_seqs=4, max_num_batched_tokens=16384, block_size=16
    )
    case = Case(config, Batch((0,) * 4, (4096,) * 4), ((ref.Q_BLOCK_PARAM, 4),))
    assert violations(case.config, case.batch) == [] and trigger_capacity(case)
    inputs = ref.make_inputs(case, DEV)
    with pytest.raises(RuntimeError) as err:
        kernels.mutant_capacity(inputs)
    assert str(err.value) == (
        "Fail to re-stride a persistent tensor of shape [4096, 256] "
        "for a tensor of shape [1024, 4096]"
    )


def case_of(q_lens, computed, q_block_log2: int, **config) -> Case:
    """A case on a small engine (no speculative decoding); refuses an invalid one."""
    base = dict(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=32, block_size=2)
    base.update(config)
    case = Case(
        EngineConfig(**base), Batch(tuple(computed), tuple(q_lens), seed=5),
        ((ref.Q_BLOCK_PARAM, q_block_log2),),
    )  # fmt: skip
    assert violations(case.config, case.batch) == []
    assert get_target(TARGET).param_violations(case) == []
    return case


def judge(impl: str | Implementation, case: Case):
    target = get_target(TARGET)
    return target.judge(impl if isinstance(impl, Implementation) else target.resolve(impl), case)


def test_smallest_trigger_is_valid_and_fails_only_the_mutant():
    case = get_target(TARGET).implementations[MUTANT].smallest()
    assert violations(case.config, case.batch) == []
    assert get_target(TARGET).param_violations(case) == []
    assert trigger_capacity(case) and reach_capacity(case)
    assert judge("triton", case).ok and judge("reference", case).ok
    verdict = judge(MUTANT, case)
    assert verdict.key == "exception:RuntimeError"
    assert "shape [8, 1] for a tensor of shape [1, 16]" in verdict.mismatches[0].got


def test_nine_tokens_outgrow_max_model_len_8_and_eight_fit():
    """q_block_size 1: the rows of the mask are the step's tokens, the pre-fix table has 8."""
    nine = case_of((1, 8), (0, 0), 0, max_model_len=8, max_num_batched_tokens=9, block_size=1)
    assert trigger_capacity(nine)
    assert judge("triton", nine).ok and judge("reference", nine).ok
    verdict = judge(MUTANT, nine)
    assert verdict.key == "exception:RuntimeError"
    assert "shape [8, 8] for a tensor of shape [9, 8]" in verdict.mismatches[0].got
    eight = case_of((1, 7), (0, 1), 0, max_model_len=8, max_num_batched_tokens=9, block_size=1)
    assert reach_capacity(eight) and not trigger_capacity(eight)
    assert judge(MUTANT, eight).ok  # the bug hides while the step fits


def test_padded_uniform_decode_covers_padding_rows():
    """next_n = 2, 3 decodes -> 6 tokens padded to a graph of 8: the last block is padding."""
    case = case_of((2, 2, 2), (3, 5, 1), 1, num_spec=1, cudagraph_capture_sizes=(2, 4, 8))
    meta = build_common_metadata(case.config, case.batch)
    assert meta.padded and meta.num_actual_tokens == 8
    expected = ref.reference(case, ref.make_inputs(case))
    assert expected.kv_num_blocks.tolist()[-1] == 0 and (expected.kv_indices[-1] == -1).all()
    assert judge("triton", case).ok and judge("reference", case).ok


# -- every check of the oracle fails on what it guards, and passes on triton ----------

MIXED = dict(q_lens=(1, 3, 9), computed=(2, 0, 5), q_block_log2=1)  # blocks span requests


def tampered(edit) -> Implementation:
    """The fixed builder followed by ``edit(inputs, outputs)``: a broken implementation.

    The target is graph-safe, so the judge records what the call allocates: an
    edit tampers with device-side torch ops in place (no host round trip, no
    fresh tensor) unless allocating is the point (``_copy``).
    """

    def fn(inputs):
        out = kernels.flex_block_mask(inputs)
        return edit(inputs, out) or out

    return Implementation("tampered", fn, "user")


def _swap_a_page(inp, out):
    out.kv_indices[0, 0] = inp.block_table[2, 0]  # a page of a request the block lacks


def reverse_heads(case: Case):
    """An edit reversing the head of every row of ``case``'s mask: any order is valid.

    Each row's own count decides its head, on the device: a gather from index
    ``n - 1 - i`` where ``i < n``. The scratch it stages in is allocated here,
    before the judged call, as an engine preallocates its buffers, sized by the
    persistent table and re-strided to the step's mask inside the call.
    """
    config = case.config
    p_rows, p_cols = ref.persistent_shape(
        config.max_num_batched_tokens, config.max_model_len, config.block_size,
        ref.q_block_size(case),
    )  # fmt: skip
    one_up = torch.arange(1, p_cols + 1, device=DEV)  # i + 1 at column i
    source = torch.empty(p_rows * p_cols, dtype=torch.int64, device=DEV)
    head = torch.empty(p_rows * p_cols, dtype=torch.bool, device=DEV)
    moved = torch.empty(p_rows * p_cols, dtype=torch.int32, device=DEV)

    def edit(inp, out):
        rows, cols = out.kv_indices.shape
        n, i1 = out.kv_num_blocks[:, None], one_up[:cols]
        src, inside, values = (t[: rows * cols].view(rows, cols) for t in (source, head, moved))
        torch.sub(n, i1, out=src).clamp_(min=0)  # n - 1 - i (0 past the head: masked below)
        torch.gather(out.kv_indices, 1, src, out=values)
        torch.le(i1, n, out=inside)
        torch.where(inside, values, out.kv_indices, out=values)
        out.kv_indices.copy_(values)

    return edit


def _miscount(inp, out):
    out.kv_num_blocks[1] += 1


def _write_past_the_view(inp, out):
    inp.persistent_kv_indices[-1] += 1  # far past this step's mask


def _copy(inp, out):
    return ref.FlexBlockMaskOutputs(out.kv_indices.clone(), out.kv_num_blocks)


def _slice_after_the_fact(inp, out):
    """The step's mask moved into ``table[:rows, :cols]`` of the 2-D persistent table
    after it was built contiguous: the strided layout is vLLM's and fine, but the
    elements the contiguous build wrote outside the slice stay changed."""
    rows, cols = out.kv_indices.shape
    table = persistent_table(inp)
    view = table[:rows, :cols]
    # Both start at the head of the persistent memory, and element (r, c) moves
    # from r * cols + c up to r * p_cols + c: moved element by element from the
    # last, each is read before anything is written over it.
    for r in reversed(range(rows)):
        for c in reversed(range(cols)):
            view[r, c] = out.kv_indices[r, c]
    return ref.FlexBlockMaskOutputs(view, out.kv_num_blocks)


def persistent_table(inp: ref.FlexBlockMaskInputs) -> torch.Tensor:
    """The 2-D persistent ``kv_indices`` table of the fix, at the head of the memory."""
    p_rows, p_cols = ref.persistent_shape(
        inp.max_num_batched_tokens, inp.max_model_len, inp.block_size, inp.q_block_size
    )
    return inp.persistent_kv_indices[: p_rows * p_cols].view(p_rows, p_cols)


def _walk_twice(inp, out):
    out.kv_num_blocks[0] += 1
    out.kv_indices[0, out.kv_num_blocks[0] - 1] = out.kv_indices[0, 0]


def _walk_outside_the_cache(inp, out):
    out.kv_num_blocks[0] += 1
    out.kv_indices[0, out.kv_num_blocks[0] - 1] = inp.num_pages


def _count_past_the_row(inp, out):
    out.kv_num_blocks[0] = out.kv_indices.shape[1] + 1


@pytest.mark.parametrize(
    "edit, check",
    [
        (_swap_a_page, "mask.missing"),
        (_miscount, "mask.invalid"),  # the head now ends in a -1
        (_walk_twice, "mask.duplicate"),
        (_walk_outside_the_cache, "mask.invalid"),
        (_count_past_the_row, "count"),
        (_write_past_the_view, "unchanged"),
        (_copy, "view"),
        (_slice_after_the_fact, "unchanged"),
    ],
)
def test_each_check_catches_what_it_guards(edit, check):
    case = case_of(**MIXED)
    assert judge("triton", case).ok and judge("reference", case).ok
    verdict = judge(tampered(edit), case)
    assert check in {m.check for m in verdict.mismatches}, str(verdict)


def test_the_order_of_a_row_is_free():
    case = case_of(**MIXED)
    assert judge(tampered(reverse_heads(case)), case).ok


# -- the consumer's contract (reference/flex_block_mask.py): what vLLM 0.33.0 does -----


def _walk_more(inp, out):
    """Every row of real tokens also walks the null block and a page of another
    request: the mask function hides their slots, the output stays the reference's."""
    foreign = int(inp.block_table[inp.num_reqs - 1, 0])
    for g in range(out.kv_indices.shape[0]):
        n = int(out.kv_num_blocks[g])
        extra = [p for p in (0, foreign) if p not in out.kv_indices[g, :n].tolist()]
        out.kv_indices[g, n : n + len(extra)] = torch.tensor(extra, dtype=torch.int32)
        out.kv_num_blocks[g] = n + len(extra)


def _stale_tail(inp, out):
    """Entries after each row's head hold garbage: the kernel never reads them."""
    n = out.kv_num_blocks[:, None]
    cols = torch.arange(out.kv_indices.shape[1], device=out.kv_indices.device)[None, :]
    out.kv_indices.masked_fill_(cols >= n, 12345)


def _strided_slice(inp):
    """vLLM's layout: the reference copied into ``table[:rows, :cols]`` of the 2-D
    persistent table (vLLM 0.33.0 ``copy_to_persistent``), rows of the real tokens
    only; nothing else written."""
    expected = ref.reference(None, inp)
    rows = expected.num_real_rows
    view = persistent_table(inp)[:rows, : expected.kv_indices.shape[1]]
    view.copy_(torch.from_numpy(expected.kv_indices[:rows]))
    counts = inp.persistent_kv_num_blocks[:rows]
    counts.copy_(torch.from_numpy(expected.kv_num_blocks[:rows]))
    return ref.FlexBlockMaskOutputs(view, counts)


def strided_slice_impl() -> Implementation:
    return Implementation("strided-slice", _strided_slice, "user")


@pytest.mark.parametrize("edit", [_walk_more, _stale_tail])
def test_supersets_and_unread_tails_are_what_the_consumer_computes_alike(edit):
    case = case_of(**MIXED)
    verdict = judge(tampered(edit), case)
    assert verdict.ok, str(verdict)


def test_vllm_s_strided_slice_of_the_real_rows_passes_and_the_mutant_is_still_caught():
    """The old oracle demanded a contiguous re-stride with a row per query block of
    the padded step; vLLM's table is the strided slice of the real tokens' rows."""
    padded = case_of((2, 2, 2), (3, 5, 1), 1, num_spec=1, cudagraph_capture_sizes=(2, 4, 8))
    for case in (case_of(**MIXED), padded):
        verdict = judge(strided_slice_impl(), case)
        assert verdict.ok, str(verdict)
        out = _strided_slice(ref.make_inputs(case, DEV))
        assert not out.kv_indices.is_contiguous()  # what the old oracle refused
    expected = ref.reference(padded, ref.make_inputs(padded, DEV))
    assert expected.num_real_rows == 3 < expected.kv_indices.shape[0] == 4
    assert judge(MUTANT, get_target(TARGET).implementations[MUTANT].smallest()).key.startswith(
        "exception"
    )


def test_no_real_request_owns_the_null_page():
    """The common metadata hands out page 0; the target's inputs reserve it (vLLM's
    block pool never gives it to a request, and its builder drops it from the mask)."""
    case = case_of((1, 3, 9), (2, 0, 5), 1)  # MIXED: request 2 owns page 0 before the shift
    meta = build_common_metadata(case.config, case.batch)
    owned = [meta.block_table[r, : -(-int(s) // 2)] for r, s in enumerate(meta.seq_lens)]
    assert any(0 in pages for pages in owned)
    inputs = ref.make_inputs(case, DEV)
    table, seq_lens = inputs.block_table.cpu().numpy(), inputs.seq_lens.cpu().numpy()
    for r, s in enumerate(seq_lens):
        assert 0 not in table[r, : -(-int(s) // 2)]
    assert inputs.num_pages == meta.num_blocks + 1
    assert (inputs.common.slot_mapping == meta.slot_mapping + 2).all()  # one page further


# -- fuzzing ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_the_search_draws_steps_on_both_sides_of_max_model_len(impl):
    result = assert_passes(TARGET, impl)  # the generic test's run (tests/test_entries.py)
    for label in (
        "at_max_num_batched_tokens",
        "max_num_batched_tokens<max_model_len",
        "max_num_batched_tokens>=max_model_len",
    ):
        assert result.labels[label] > 0, label


def test_the_mutant_is_found_as_the_production_crash():
    result = assert_detected(TARGET, MUTANT)  # the generic test's run
    assert result.verdict.key == "exception:RuntimeError"
    assert "Fail to re-stride a persistent tensor" in result.verdict.mismatches[0].got


def test_default_strategies_reach_the_trigger():
    """Share of cases whose mask outgrows the pre-fix tables (measured: 14% of 1000)."""
    seen: Counter = Counter()

    @fuzz_settings(max_examples=300, derandomize=True, database=None)
    @given(get_target(TARGET).cases())
    def draw(case):
        seen["cases"] += 1
        if trigger_capacity(case):
            seen["trigger"] += 1
            meta = build_common_metadata(case.config, case.batch)
            seen["more_tokens_than_max_model_len"] += (
                meta.num_actual_tokens > case.config.max_model_len
            )
        seen["reach"] += reach_capacity(case)

    draw()
    assert seen["trigger"] >= 0.05 * seen["cases"], seen
    assert seen["more_tokens_than_max_model_len"] > 0.5 * seen["trigger"], seen
    assert seen["reach"] > seen["trigger"], seen
    assert seen["cases"] == 300
