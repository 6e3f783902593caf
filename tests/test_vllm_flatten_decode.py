"""vLLM's flattened indexer decode metadata (both branches) against the reference.

On every supported release. Two release differences decide what a test expects,
each found by looking: before 0.27.0 (#50302) the builder sizes its expanded table
itself and ships #46074 (:func:`pre_fix`); before 0.28.0 ``_prepare_decode_tensors``
flattens steps whose longest decode has more than one token only, and serves a step
of single-token decodes on its plain-decode branch (:func:`flattens_single_tokens`),
which the implementation declines there (``mtp-seq-lens`` judges that branch).
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from attnfuzz.adapters.vllm import compat
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import InvalidCase
from attnfuzz.harness.testing import hand_case
from attnfuzz.reference import flatten_decode as ref
from hypothesis import given, settings

pytestmark = requires_vllm

TARGET = "flatten-decode"
UPSTREAM = "upstream-pr50302-unaligned-width"


def pre_fix() -> bool:
    """The builder takes no ``block_table_width`` (before #50302, 0.27.0)."""
    return not compat.has(compat.BUILDER_TABLE_WIDTH)


@cache
def flattens_single_tokens() -> bool:
    """Whether the release's builder flattens a step whose decodes have one token each
    (0.28.0 on: ``if not use_native``; before: ``if not use_native and max_decode_len >
    1``, else the plain-decode branch returns views of the step's own lengths)."""
    target = get_target(TARGET)
    inputs = target.make_inputs(hand_case((1, 1), (3, 4), num_spec=0), "cpu")
    got = target.implementations["vllm"].fn(inputs)
    return got.context_lens.data_ptr() == got.buffers.context_lens.data_ptr()


def skip_pre_fix() -> None:
    if pre_fix():
        pytest.skip(
            "this release sizes the expanded block table narrower than the runner's (#46074, "
            "fixed by #50302 in 0.27.0): test_pre_fix_release_ships_46074 pins it"
        )


@pytest.mark.parametrize("impl", ["vllm", UPSTREAM])
def test_declines_exactly_the_steps_the_release_does_not_flatten(impl):
    """The feature-detected ``declines`` agrees with what the release's code does: where
    a step of single-token decodes comes back on the plain branch (views of the step's
    own lengths, not of the flattening buffers), such steps are declined, naming the
    target that judges that branch, never drawn, and refused when replayed; where it
    flattens them, nothing is declined. Multi-token steps are never declined."""
    target = get_target(TARGET)
    if target.implementations[impl].why_unavailable() is not None:
        pytest.skip(target.implementations[impl].why_unavailable())
    chosen = target.resolve(impl)
    single, multi = hand_case((1, 1), (3, 4), num_spec=0), hand_case((2, 2), (3, 5))
    assert chosen.declines(multi) is None
    if flattens_single_tokens():
        assert chosen.declines(single) is None
        return
    assert "judged by mtp-seq-lens" in (chosen.declines(single) or "")
    with pytest.raises(InvalidCase, match="max_decode_len > 1"):
        target.judge(chosen, single, "cpu")

    @settings(max_examples=60, database=None, derandomize=True)
    @given(target.cases(impl=chosen))
    def drawn(case):
        split = ref.describe(case)[1]
        assert split.num_decodes == 0 or max(split.decode_lens) > 1

    drawn()


def test_multi_token_steps_pass_on_a_fixed_release():
    """Steps whose longest decode has two tokens or more take the flattening branches on
    every release; both branches, padded or not, agree with the reference."""
    skip_pre_fix()
    cases = [
        hand_case((2, 2), (3, 5)),
        hand_case((1, 2), (1, 1)),
        hand_case((2, 2, 2), (3, 5, 1)),
        hand_case((3, 3), (4, 9), num_spec=2, cudagraph_capture_sizes=(3, 6, 12)),
        hand_case((1, 3, 2), (4, 5, 6), num_spec=2, cudagraph_capture_sizes=(3, 6, 12)),
    ]
    target = get_target(TARGET)
    for case in cases:
        verdict = target.judge(target.resolve("vllm"), case, "cpu")
        assert verdict.ok, (case.batch, verdict)


def test_pre_fix_release_ships_46074():
    """Before #50302 the release's own builder is #46074: its expanded table has
    ``cdiv(max_model_len, block_size)`` = 16 columns, the runner's table 32 (128 tokens
    of pages of 4). Ragged decodes raise the reported error; uniform ones return a
    table of the wrong width; a step without decodes still finds the buffer narrow."""
    if not pre_fix():
        pytest.skip("this release has #50302: the builder takes the runner's block_table_width")
    target = get_target(TARGET)
    vllm = target.resolve("vllm")
    verdict = target.judge(vllm, hand_case((1, 2), (1, 1)), "cpu")
    assert verdict.key == "exception:RuntimeError"
    assert "must match the existing size (32)" in verdict.mismatches[0].got
    verdict = target.judge(vllm, hand_case((2, 2), (3, 5)), "cpu")
    assert verdict.key == "shape"
    assert "expected [256, 32], got [256, 16]" in str(verdict.mismatches[0])
    # Nothing to revert on this release: the mutant names the first release it binds to.
    assert "binds from vLLM 0.27.0" in (target.implementations[UPSTREAM].why_unavailable() or "")


def _run_counting_uniform_kernel(monkeypatch, case):
    """Run vLLM on ``case``; how often the uniform branch's kernel ran (0.30.0 on
    ``_PREPARE_UNIFORM_DECODE_KERNEL``, a callable; before, the ``@triton.jit``
    ``_prepare_uniform_decode_kernel``, launched as ``kernel[grid](...)``)."""
    import vllm.v1.attention.backends.mla.indexer as indexer

    calls = []
    if hasattr(indexer, "_PREPARE_UNIFORM_DECODE_KERNEL"):
        name = "_PREPARE_UNIFORM_DECODE_KERNEL"
        kernel = indexer._PREPARE_UNIFORM_DECODE_KERNEL

        def counted(*args, **kwargs):
            calls.append(args)
            return kernel(*args, **kwargs)

    else:
        name = "_prepare_uniform_decode_kernel"
        jit = indexer._prepare_uniform_decode_kernel

        class Counted:
            def __getitem__(self, grid):
                calls.append(grid)
                return jit[grid]

        counted = Counted()

    monkeypatch.setattr(indexer, name, counted)
    target = get_target(TARGET)
    verdict = target.judge(target.resolve("vllm"), case, "cpu")
    return verdict, len(calls)


@pytest.mark.parametrize(
    "q_lens, computed, uniform",
    [
        ((3, 3), (4, 9), True),  # d = [3, 3], 6 tokens captured as they are: the Triton kernel
        ((1, 3, 2), (4, 5, 6), False),  # ragged: repeat_interleave
        ((3, 3, 3), (1, 2, 3), False),  # 9 tokens padded to 12, d = [3, 3, 3, 0]
    ],
)
def test_vllm_agrees_on_both_branches(monkeypatch, q_lens, computed, uniform):
    skip_pre_fix()
    case = hand_case(q_lens, computed, num_spec=2, cudagraph_capture_sizes=(3, 6, 12))
    verdict, calls = _run_counting_uniform_kernel(monkeypatch, case)
    assert verdict.ok, verdict
    assert calls == (1 if uniform else 0)


def test_vllm_zeroes_the_tail_and_keeps_rows_past_the_step():
    """The padded step of next_n = 2 (flattening forced, see the adapter): context
    lengths zero from sum(d) = 6 to the end of the buffer, rows from N_d = 8 on as they were."""
    skip_pre_fix()
    target = get_target(TARGET)
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = target.make_inputs(case, "cpu")
    got = target.implementations["vllm"].fn(inputs)
    assert got.context_lens[:, 0].tolist() == [4, 5, 6, 7, 2, 3, 0, 0]
    assert (got.buffers.context_lens[6:] == 0).all()
    assert torch.equal(got.buffers.block_table[8:], inputs.buffers.block_table[8:])
    assert torch.equal(got.buffers.decode_lens[8:], inputs.buffers.decode_lens[8:])
    assert got.requires_padding is False


def test_vllm_block_table_has_the_runners_aligned_width():
    """Fidelity: the runner hands the builder a table 128-token aligned, and
    ``block_table_width`` to match (vllm/v1/worker/utils.py AttentionGroup,
    get_block_table_width); vLLM's expanded table has that width, 32 here, where
    ``max_blocks_per_seq`` is 16. An oracle of width 16 rejected vLLM's correct output."""
    skip_pre_fix()
    target = get_target(TARGET)
    case = hand_case((1, 2), (1, 1))
    assert case.config.max_blocks_per_seq == 16
    inputs = target.make_inputs(case, "cpu")
    got = target.implementations["vllm"].fn(inputs)
    assert tuple(got.block_table.shape) == (3, 32)
    assert tuple(got.buffers.block_table.shape) == (case.config.max_num_batched_tokens, 32)
    assert target.compare(case, inputs, target.reference(case, inputs), got) == []


def test_upstream_pr50302_raises_the_historical_error_on_ragged_decodes():
    """d = [1, 2]: the variable branch assigns [3, 32] rows into a [3, 16] slice."""
    skip_pre_fix()  # the mutant reverts #50302: unavailable where there is nothing to revert
    target = get_target(TARGET)
    verdict = target.judge(target.resolve(UPSTREAM), hand_case((1, 2), (1, 1)))
    assert verdict.key == "exception:RuntimeError"
    assert "must match the existing size (32)" in verdict.mismatches[0].got
