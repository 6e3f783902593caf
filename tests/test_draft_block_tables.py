"""Target ``draft-block-tables``: reference by hand, the kernel's checks, the mutant, end to end."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import (
    assert_detected,
    assert_passes,
    hand_case,
    implementation_params,
)
from attnfuzz.kernels import draft_block_tables as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import draft_block_tables as ref
from attnfuzz.reference.batch import (
    PAD_PAGE,
    Case,
    EngineConfig,
    build_common_metadata,
    runner_table_width,
)
from attnfuzz.reference.invariants import violations

TARGET = "draft-block-tables"
MUTANT = "pr43982-padded-table"
NAN = float("nan")


def with_params(case: Case, sliding_window: int = 4, swa_block_size_log2: int = 1) -> Case:
    params = {"sliding_window": sliding_window, "swa_block_size_log2": swa_block_size_log2}
    return dataclasses.replace(case, params=tuple(sorted(params.items())))


def cache(pages: list[list[float]]) -> torch.Tensor:
    """``[num_blocks, block_size, H = 1, D = 1]`` from page contents, where kernels run."""
    return torch.tensor(pages, dtype=torch.float32, device=device())[:, :, None, None]


def int32(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device=device())


def hand_inputs() -> ref.DraftBlockTablesInputs:
    """One request of seq_len 4 whose last 2 tokens are new, padded to a graph of 2 requests.

    H = D = 1, scale 1. Keys 0..3 are K = [1, 0, 2, -1], values V = [4, -2, 6, 8];
    the new tokens (positions 2 and 3) have queries 1 and 2. Group 0 (full
    attention, pages of 2) keeps keys 0, 1 in page 2 and keys 2, 3 in page 1.
    Group 1 (window 2, pages of 1) freed key 0's page (null page) and keeps
    keys 1, 2, 3 in pages 3, 1, 2. Null pages and unused slots hold NaN; the
    padding request's table rows hold the pad value.
    """
    full = ref.KVCacheGroup(
        block_table=int32([[2, 1, 2], [PAD_PAGE] * 3]),
        key_cache=cache([[NAN, NAN], [2, -1], [1, 0]]),
        value_cache=cache([[NAN, NAN], [6, 8], [4, -2]]),
        block_size=2,
        sliding_window=None,
    )
    swa = ref.KVCacheGroup(
        block_table=int32([[0, 3, 1, 2, 3, 0], [PAD_PAGE] * 6]),
        key_cache=cache([[NAN], [2], [-1], [0], [NAN]]),
        value_cache=cache([[NAN], [6], [8], [-2], [NAN]]),
        block_size=1,
        sliding_window=2,
    )
    return ref.DraftBlockTablesInputs(
        query_start_loc=int32([0, 2, 2]),
        seq_lens=int32([4, 0]),
        q=torch.tensor([1.0, 2.0, NAN, NAN], device=device())[:, None, None],
        groups=[full, swa],
        num_reqs=2,
        num_actual_tokens=4,
        num_real_reqs=1,
        num_real_tokens=2,
        max_seq_len=4,
        softmax_scale=1.0,
        # the engine the hand case could come from: 4 tokens is a capture size of next_n = 2
        config=EngineConfig(
            max_model_len=6,
            max_num_seqs=2,
            max_num_batched_tokens=4,
            block_size=2,
            num_spec=1,
            cudagraph_capture_sizes=(2, 4),
            num_heads=1,
            head_dim=1,
        ),
    )


def softmax_average(scores: list[float], values: list[float]) -> float:
    weights = [math.exp(s) for s in scores]
    return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)


def test_reference_by_hand():
    expected = ref.reference(None, hand_inputs())
    full, swa = expected.groups
    # position 2 sees keys 0..2 (scores 1*K), position 3 keys 0..3 (scores 2*K)
    want_full = [
        softmax_average([1, 0, 2], [4, -2, 6]),
        softmax_average([2, 0, 4, -2], [4, -2, 6, 8]),
    ]
    # window 2: position 2 sees keys 1, 2; position 3 keys 2, 3
    want_swa = [softmax_average([0, 2], [-2, 6]), softmax_average([4, -2], [6, 8])]
    np.testing.assert_allclose(full.out[:, 0, 0], want_full, rtol=1e-6)
    np.testing.assert_allclose(swa.out[:, 0, 0], want_swa, rtol=1e-6)
    assert full.out.dtype == np.float32 and full.out.shape == (2, 1, 1)
    # the metadata of the one real request: the padding request is sliced away
    assert full.query_start_loc.tolist() == [0, 2] and full.seq_lens.tolist() == [4]
    assert full.block_table.tolist() == [[2, 1, 2]] and swa.block_table.tolist() == [
        [0, 3, 1, 2, 3, 0]
    ]


def test_triton_matches_the_hand_case_and_the_mutant_refuses_it():
    inputs = hand_inputs()
    expected = ref.reference(None, inputs)
    got = kernels.draft_attention(inputs)
    for g in range(2):
        torch.testing.assert_close(got.out[g].cpu(), torch.as_tensor(expected.groups[g].out))
    assert get_target(TARGET).compare(None, inputs, expected, got) == []
    with pytest.raises(RuntimeError, match="batch_size must be equal to batch_size_k"):
        kernels.mutant_padded_table(inputs)


def test_kernel_checks_batch_sizes_like_flash_attention():
    inputs = hand_inputs()
    group = inputs.groups[0]
    q, qsl, seq_lens = inputs.q[:2], inputs.query_start_loc[:2], inputs.seq_lens[:1]
    args = (group.key_cache, group.value_cache)
    with pytest.raises(RuntimeError, match=r"batch_size 1; block_table has 2 rows"):
        kernels.flash_attn_varlen_paged(q, *args, qsl, seq_lens, group.block_table, 4, 1.0)
    with pytest.raises(RuntimeError, match="seqused_k must have shape"):
        kernels.flash_attn_varlen_paged(
            q, *args, qsl, inputs.seq_lens, group.block_table[:1], 4, 1.0
        )
    with pytest.raises(RuntimeError, match="int32"):
        kernels.flash_attn_varlen_paged(
            q, *args, qsl.long(), seq_lens, group.block_table[:1], 4, 1.0
        )
    out = kernels.flash_attn_varlen_paged(q, *args, qsl, seq_lens, group.block_table[:1], 4, 1.0)
    assert not out.isnan().any()  # null pages and unused slots were never read


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


def smallest() -> Case:
    impl = get_target(TARGET).implementations[MUTANT]
    assert impl.smallest is not None
    return impl.smallest()


def test_smallest_trigger_is_valid_and_padded_6_to_8():
    case = smallest()
    target, impl = get_target(TARGET), get_target(TARGET).implementations[MUTANT]
    assert violations(case.config, case.batch) == [] and target.param_violations(case) == []
    assert case.config.next_n == 2 and case.batch.q_lens == (2, 2, 2)
    assert impl.reach(case) and impl.trigger(case)
    meta = build_common_metadata(case.config, case.batch)
    assert (meta.num_actual_tokens, meta.num_reqs, meta.num_real_reqs) == (8, 4, 3)

    inputs = ref.make_inputs(case)
    full_bs, swa_bs = ref.group_block_sizes(case)
    assert [g.block_size for g in inputs.groups] == [full_bs, swa_bs] == [4, 1]
    for group in inputs.groups:  # stored at the padded size, the padding row holds the pad value
        width = runner_table_width(case.config.max_model_len, group.block_size)
        assert tuple(group.block_table.shape) == (4, width)
        assert (group.block_table[3] == PAD_PAGE).all()
    expected = ref.reference(case, inputs)
    # 16 and 64 pages per request, rounded up to 128 tokens: 32 pages of 4, 128 of 1
    assert [tuple(g.block_table.shape) for g in expected.groups] == [(3, 32), (3, 128)]
    assert [g.query_start_loc.tolist() for g in expected.groups] == [[0, 2, 4, 6]] * 2


def test_smallest_trigger_passes_triton_and_fails_the_mutant():
    case = smallest()
    assert judge("triton", case).ok and judge("reference", case).ok
    verdict = judge(MUTANT, case)
    assert verdict.key == "exception:RuntimeError"
    assert "batch_size must be equal to batch_size_k" in verdict.mismatches[0].got
    assert "batch_size 3; block_table has 4 rows" in verdict.mismatches[0].got


def test_shape_check_catches_the_padded_table_without_the_kernel():
    """The oracle's own check: a consumer that did not check would still be found."""
    case = smallest()
    target = get_target(TARGET)
    inputs = ref.make_inputs(case, device())
    expected = ref.reference(case, inputs)
    fixed = kernels.draft_attention(inputs)
    assert target.compare(case, inputs, expected, fixed) == []
    padded = [kernels.group_metadata(inputs, g.block_table) for g in inputs.groups]
    mismatches = target.compare(case, inputs, expected, dataclasses.replace(fixed, metadata=padded))
    assert [(m.check, m.where) for m in mismatches] == [
        ("shape", "group0.block_table"),
        ("shape", "group1.block_table"),
    ]
    assert (mismatches[0].expected, mismatches[0].got) == ("[3, 32]", "[4, 32]")


def test_oracle_catches_a_wrong_window_and_unsliced_lengths():
    """Values and metadata are compared, not only shapes."""
    case = with_params(hand_case((2, 2, 2), (5, 9, 0)), sliding_window=2, swa_block_size_log2=0)
    target = get_target(TARGET)
    inputs = ref.make_inputs(case, device())
    expected = ref.reference(case, inputs)
    got = kernels.draft_attention(inputs)
    assert target.compare(case, inputs, expected, got) == []
    wrong = dataclasses.replace(got, out=[got.out[0], got.out[0]])  # full attention for both
    found = target.compare(case, inputs, expected, wrong)
    assert [m.where for m in found] == ["group1.out[0, 0, 0]"]
    meta = got.metadata[0]
    stale = dataclasses.replace(meta, seq_lens=meta.seq_lens + 1)
    wrong = dataclasses.replace(got, metadata=[stale, got.metadata[1]])
    found = target.compare(case, inputs, expected, wrong)
    assert [(m.check, m.where) for m in found] == [("values", "group0.seq_lens[0]")]
    assert "; Mismatched elements: 3 / 3 (100.0%); " in found[0].got


@pytest.mark.parametrize(
    "q_lens, computed, use_cudagraph",
    [
        ((2, 2, 2, 2), (1, 2, 3, 4), True),  # 8 tokens: a capture size, R_pad == R
        ((2, 2, 2), (1, 2, 3), False),  # eager: never padded
        ((1, 2, 7), (4, 4, 0), True),  # ragged and mixed: graphs do not pad requests
    ],
)
@pytest.mark.parametrize("impl", implementation_params(TARGET))
def test_unpadded_steps_do_not_trigger_the_mutant(q_lens, computed, use_cudagraph, impl):
    case = with_params(hand_case(q_lens, computed, use_cudagraph))
    assert not get_target(TARGET).implementations[MUTANT].trigger(case)
    assert judge(impl, case).ok


# A derandomized search draws the same cases for each of attnfuzz's implementations that
# pass it (same seed, same guiding statistics): the reference's (NumPy) in CI, Triton's nightly.
@pytest.mark.slow
@pytest.mark.parametrize("impl", [pytest.param("triton", marks=pytest.mark.nightly), "reference"])
def test_the_search_draws_padded_and_mixed_steps(impl):
    """The generic search (tests/test_entries.py, the same run) covers the bug's steps."""
    result = assert_passes(TARGET, impl)
    assert result.labels["padding_requests"] > 0 and result.labels["mixed"] > 0


def test_the_minimized_case_is_a_padded_step_no_bigger_than_the_smallest_trigger():
    """The trigger is a stored table with rows of padding requests (R_pad != R), which
    needs no draft token: the search may end below the hand case's next_n = 2."""
    result = assert_detected(TARGET, MUTANT)  # the generic test's run
    case = result.case
    meta = build_common_metadata(case.config, case.batch)
    assert meta.padded and meta.num_reqs > meta.num_real_reqs
    assert get_target(TARGET).implementations[MUTANT].trigger(case)
    assert "batch_size must be equal to batch_size_k" in result.verdict.mismatches[0].got
    # the minimized case is no bigger than the hand-derived smallest trigger
    assert case.batch.num_reqs <= smallest().batch.num_reqs


# -- inconsistent metadata: refused with a message, or only the described rows computed --


def varlen(q, group, qsl, seq_lens, table) -> torch.Tensor:
    """The consumer on one group of the hand case, scale 1, max_seqlen_k 4."""
    return kernels.flash_attn_varlen_paged(
        q, group.key_cache, group.value_cache, qsl, seq_lens, table, 4, 1.0, group.sliding_window
    )


def ref_attention(q, group, qsl, seq_lens, table) -> np.ndarray:
    """The reference on the same arguments: rows outside ``qsl`` are 0."""
    host = [t.cpu().numpy() for t in (q, group.key_cache, group.value_cache, qsl, seq_lens, table)]
    return ref.attention(*host, group.sliding_window, 1.0)


@pytest.mark.parametrize("group", [0, 1])
@pytest.mark.parametrize(
    "q_rows, qsl",
    [
        ([1.0, 2.0, NAN, NAN], [0, 2]),  # q padded past cu_seqlens_q[-1] (the reported bug)
        ([NAN, 1.0, 2.0, NAN, NAN], [1, 3]),  # and rows before cu_seqlens_q[0]
    ],
)
def test_padded_queries_compute_only_the_rows_cu_seqlens_q_describes(group, q_rows, qsl):
    """Rows of q that no sequence owns are neither read nor written: they stay 0.

    Before the fix the extra rows were given sequence ``batch_size`` and loaded
    ``cu_seqlens_q[batch_size + 1]`` and ``cu_seqlens_k[batch_size + 1]``.
    """
    inputs = hand_inputs()
    g = inputs.groups[group]
    q = torch.tensor(q_rows, device=device())[:, None, None]
    args = (q, g, int32(qsl), inputs.seq_lens[:1], g.block_table[:1])
    for _ in range(2):  # deterministic: the same result every time
        got = varlen(*args).cpu()
        torch.testing.assert_close(got, torch.as_tensor(ref_attention(*args)))
    start, end = qsl
    assert got[start:end].isfinite().all() and (got[:start] == 0).all() and (got[end:] == 0).all()


def test_seqused_k_past_the_table_sees_only_the_pages_the_table_maps():
    """seqused_k 2**30 against a table row of 3 pages of 2: the sequence holds its 6 mapped
    keys, the queries are its last 2 (positions 4, 5): no read past the row, no huge loop."""
    inputs = hand_inputs()
    g = dataclasses.replace(
        inputs.groups[0],
        key_cache=cache([[NAN, NAN], [2, -1], [1, 0], [3, 1]]),
        value_cache=cache([[NAN, NAN], [6, 8], [4, -2], [1, 5]]),
    )
    table, qsl, q = int32([[2, 1, 3]]), int32([0, 2]), inputs.q[:2]
    got = varlen(q, g, qsl, int32([2**30]), table).cpu()
    want = ref_attention(q, g, qsl, int32([6]), table)
    torch.testing.assert_close(got, torch.as_tensor(want))
    assert got.isfinite().all()


@pytest.mark.parametrize("seq_len, want", [(1, [0.0, 4.0]), (-5, [0.0, 0.0])])
def test_seqused_k_shorter_than_the_queries_leaves_rows_without_keys_at_zero(seq_len, want):
    """2 queries of a sequence of 1 key: the first sits at position -1 and sees nothing.
    As in FlashAttention its output is 0, not 0 / 0; a negative length sees no key."""
    inputs = hand_inputs()
    g = inputs.groups[0]
    got = varlen(inputs.q[:2], g, int32([0, 2]), int32([seq_len]), g.block_table[:1])
    assert got.flatten().tolist() == want


@pytest.mark.parametrize("bad_page", [2**30, -(2**30), 3])
def test_page_ids_outside_the_cache_are_never_dereferenced(bad_page):
    """Keys 2, 3 mapped to a page past the cache (3 pages) or negative are not attended:
    the queries (positions 2, 3, scores q * K) see keys 0 and 1 only."""
    inputs = hand_inputs()
    g = inputs.groups[0]
    got = varlen(inputs.q[:2], g, int32([0, 2]), int32([4]), int32([[2, bad_page, 2]]))
    want = [softmax_average([1, 0], [4, -2]), softmax_average([2, 0], [4, -2])]
    np.testing.assert_allclose(got.flatten().cpu().numpy(), want, rtol=1e-6)


@pytest.mark.parametrize(
    "qsl, seq_lens, table, message",
    [
        # block table with fewer rows than requests
        ([0, 1, 2], [4, 4], [[2, 1, 2]], "batch_size 2; block_table has 1 rows"),
        # cu_seqlens_q and seqused_k (the keys' offsets) of different lengths
        ([0, 2], [4, 4], [[2, 1, 2]], r"seqused_k must have shape \(1,\)"),
        ([0, 1, 2], [4], [[2, 1, 2], [2, 1, 2]], r"seqused_k must have shape \(2,\)"),
        # no offsets at all
        ([], [], [], "cu_seqlens_q must be a contiguous 1-D tensor"),
    ],
    ids=["short-table", "long-cu_seqlens_q", "long-seqused_k", "no-offsets"],
)
def test_inconsistent_batch_sizes_are_refused_with_a_message(qsl, seq_lens, table, message):
    inputs = hand_inputs()
    g = inputs.groups[0]
    table = int32(table).view(-1, 3)
    with pytest.raises(RuntimeError, match=message):
        varlen(inputs.q[:2], g, int32(qsl), int32(seq_lens), table)


def test_strided_cu_seqlens_q_is_refused_not_read_as_if_contiguous():
    """A view every other element of [0, 9, 2, 9]: read contiguously it says [0, 9]."""
    inputs = hand_inputs()
    g = inputs.groups[0]
    qsl = int32([0, 9, 2, 9])[::2]
    with pytest.raises(RuntimeError, match="cu_seqlens_q must be a contiguous 1-D tensor"):
        varlen(inputs.q[:2], g, qsl, int32([4]), g.block_table[:1])


@pytest.mark.parametrize(
    "max_model_len, block_size, width",
    [(64, 4, 32), (64, 1, 128), (64, 16, 8), (200, 16, 16), (129, 1, 256), (1, 3, 128)],
)
def test_table_width_is_the_engines_128_token_aligned_width(max_model_len, block_size, width):
    """vLLM 0.33.0 ``get_block_table_width``: pages per request rounded up to a multiple of
    ``128 // gcd(128, block_size)`` (the whole row is handed on, not just the pages needed)."""
    assert runner_table_width(max_model_len, block_size) == width
