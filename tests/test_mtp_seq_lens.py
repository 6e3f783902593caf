"""Target ``mtp-seq-lens``: reference by hand, the kernel, each oracle check, end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.engine import fuzz_settings
from attnfuzz.harness.graph import allocations
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import (
    assert_detected,
    assert_passes,
    hand_case,
    implementation_params,
)
from attnfuzz.kernels import mtp_seq_lens as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import mtp_seq_lens as ref
from attnfuzz.reference.batch import Case, split_decodes_and_prefills
from attnfuzz.reference.invariants import violations
from hypothesis import given

TARGET = "mtp-seq-lens"
MUTANTS = [m.name for m in get_target(TARGET).mutants if not m.engine]  # attnfuzz's own
DEV = device()  # where the kernels run: the CPU under the interpreter


def judge(impl, case: Case):
    target = get_target(TARGET)
    return target.judge(impl if not isinstance(impl, str) else target.resolve(impl), case)


def checks(verdict) -> list[str]:
    return [m.check for m in verdict.mismatches]


# -- the reference, by hand ---------------------------------------------------------


def test_reference_smallest_trigger_two_decodes_of_one_token():
    """next_n = 2, d = [1, 1]: B = 2, L = 1, each slot sees its whole sequence."""
    case = hand_case((1, 1), (4, 0))
    inputs = ref.make_inputs(case)
    assert (inputs.num_decodes, inputs.max_decode_len, inputs.next_n) == (2, 1, 2)
    assert ref.reference(case, inputs).context_lens.tolist() == [[5], [1]]


def test_reference_padded_graph_clamps_padding_requests_at_zero():
    """3 requests x 2 tokens = 6 padded to 8: the padding request (seq_len 0) gets [0, 0]."""
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case)
    assert inputs.seq_lens.tolist() == [5, 7, 3, 0]
    assert (inputs.num_decodes, inputs.max_decode_len) == (4, 2)
    expected = ref.reference(case, inputs)
    # seq_len - L + 1 + j: [4, 5], [6, 7], [2, 3], and max(-1, 0), max(0, 0)
    assert expected.context_lens.tolist() == [[4, 5], [6, 7], [2, 3], [0, 0]]
    assert expected.context_lens.dtype == np.int32
    np.testing.assert_array_equal(expected.workspace_before, inputs.workspace.numpy())


def test_reference_is_right_aligned_on_the_sequence_end():
    case = hand_case((3, 3), (0, 7), num_spec=2, cudagraph_capture_sizes=(3, 6))
    inputs = ref.make_inputs(case)
    assert ref.reference(case, inputs).context_lens.tolist() == [[1, 2, 3], [8, 9, 10]]


@pytest.mark.parametrize("impl", implementation_params(TARGET))
def test_native_path_splits_by_the_uniform_rule(impl):
    """A decode of another length than the first is a prefill of the native path,
    and a prefill first means no decodes at all."""
    case = hand_case((1, 1, 2, 5), (3, 3, 3, 0))
    meta, split = ref.describe(case)
    assert (split.num_decodes, split.max_decode_len, split.num_decode_tokens) == (2, 1, 2)
    assert split_decodes_and_prefills(meta, 2).num_decodes == 3  # the ragged rule differs
    case = hand_case((5, 5), (0, 0), use_cudagraph=False)
    assert ref.describe(case)[1].num_decodes == 0
    inputs = ref.make_inputs(case)
    assert ref.reference(case, inputs).context_lens.shape == (0, 0)
    assert judge(impl, case).ok


@fuzz_settings(max_examples=300, database=None)
@given(get_target(TARGET).cases())
def test_flat_table_of_max_num_batched_tokens_holds_every_step(case):
    """Under the uniform rule ``B * L == N_d``, which the token budget bounds."""
    _, split = ref.describe(case)
    rows = split.num_decodes * split.max_decode_len
    assert rows == split.num_decode_tokens <= case.config.max_num_batched_tokens


# -- the kernel ----------------------------------------------------------------------


def test_kernel_writes_a_strided_view_and_nothing_else():
    table = torch.full((3, 4), 77, dtype=torch.int32, device=DEV)
    seq_lens = torch.tensor([5, 1, 9], dtype=torch.int32, device=DEV)
    kernels.write_context_lens(seq_lens, table[:2, :3])
    assert table.tolist() == [[3, 4, 5, 77], [0, 0, 1, 77], [77, 77, 77, 77]]
    kernels.write_context_lens(seq_lens, table[:2, :3], clamp=False)
    assert table[1].tolist() == [-1, 0, 1, 77]


def test_kernel_on_an_empty_table_and_its_contract():
    kernels.write_context_lens(
        torch.zeros(0, dtype=torch.int32, device=DEV),
        torch.empty(0, 0, dtype=torch.int32, device=DEV),
    )
    lens = torch.ones(2, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="int32"):
        kernels.write_context_lens(lens, torch.zeros(2, 2, device=DEV))  # fp32
    with pytest.raises(ValueError, match="unit column stride"):
        out = torch.zeros(2, 4, dtype=torch.int32, device=DEV)[:, ::2]
        kernels.write_context_lens(lens, out)


@pytest.mark.parametrize(
    "view",
    [
        lambda lens: lens[:2],  # 2 lengths for 3 rows
        lambda lens: lens[:1].expand(3),  # 3 lengths in 1 element of memory
        lambda lens: lens[::2][:3],  # strided: read contiguously, lens[1] and lens[2]
    ],
    ids=["short", "expanded", "strided"],
)
def test_kernel_refuses_lengths_it_would_read_past(view):
    """Fewer lengths than rows (as the metadata holds them) are refused before the launch,
    from shapes alone (graph-safe), and nothing is written; the memory after the lengths
    holds a poison the kernel would otherwise have read."""
    lens = torch.tensor([5, 1, 9, 1000, 1000, 1000], dtype=torch.int32, device=DEV)
    table = torch.full((3, 2), 77, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match=r"seq_lens: 3 contiguous lengths for a \[3, 2\] table"):
        kernels.write_context_lens(view(lens), table)
    assert (table == 77).all()


def test_triton_returns_the_head_of_the_flat_table():
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case, DEV)
    expected = ref.reference(case, inputs)
    got = kernels.mtp_context_lens(inputs).context_lens
    assert got.data_ptr() == inputs.workspace.data_ptr() and got.is_contiguous()
    assert got.tolist() == expected.context_lens.tolist()
    assert get_target(TARGET).compare(case, inputs, expected, ref.MtpSeqLensOutputs(got)) == []


# -- each oracle check fails on its mutant, on the mutant's smallest trigger ------------

MUTANT_CHECKS = {
    "pr42135-strided": ["contiguous", "stride", "consumer"],
    "pr42135-copy": ["graph", "unchanged"],
    "pr42135-noclamp": ["values"],
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_smallest_trigger_meets_the_trigger_and_fails_exactly_the_mutants_checks(mutant):
    impl = get_target(TARGET).resolve(mutant)
    case = impl.smallest()
    assert violations(case.config, case.batch) == []
    assert impl.reach(case) and impl.trigger(case)
    assert judge("triton", case).ok and judge("reference", case).ok
    assert checks(judge(mutant, case)) == MUTANT_CHECKS[mutant]


def test_strided_mutant_shows_the_upstream_assertion():
    verdict = judge("pr42135-strided", hand_case((1, 1), (4, 0)))
    assert verdict.key == "contiguous"
    assert "strides (2, 1)" in verdict.mismatches[0].got
    assert "context_lens must be contiguous" in verdict.mismatches[2].got


def test_copy_mutant_hands_on_new_storage_and_leaves_the_2d_table_written():
    verdict = judge("pr42135-copy", hand_case((1, 1), (4, 0)))
    graph, unchanged = verdict.mismatches
    assert graph.got == "new storage" and "persistent buffer" in graph.expected
    assert unchanged.where.startswith("workspace[256]")  # the 2-D table after the flat one


def test_noclamp_mutant_gives_the_padding_request_a_negative_length():
    verdict = judge("pr42135-noclamp", hand_case((2, 2, 2), (3, 5, 1)))
    (m,) = verdict.mismatches
    assert (m.where, m.expected) == ("context_lens[3, 0]", "0")
    assert m.got == (
        "-1; Mismatched elements: 1 / 8 (12.5%); "
        "Greatest absolute difference: 1 at index (3, 0) (up to 0 allowed)"
    )


@pytest.mark.parametrize("mutant", MUTANTS)
def test_tidy_steps_do_not_trigger_any_mutant(mutant):
    """Prefills only, one decode, uniform full decodes at a capture size (padded by 0)."""
    impl = get_target(TARGET).resolve(mutant)
    for case in (
        hand_case((7, 3), (0, 1)),
        hand_case((1,), (4,)),
        hand_case((2, 2), (1, 2)),
        hand_case((2, 2, 2, 2), (1, 2, 3, 4)),
    ):
        assert not impl.trigger(case)
        assert judge(mutant, case).ok, case


@pytest.mark.parametrize(
    "mutant, case",
    [
        ("pr42135-strided", hand_case((1,), (4,))),  # B = 1: the row stride is never used
        ("pr42135-copy", hand_case((1,), (4,))),
        ("pr42135-strided", hand_case((2, 2, 5), (1, 2, 0))),  # L == next_n
        ("pr42135-noclamp", hand_case((2, 2), (1, 2))),  # a graph of 4: no padding request
    ],
)
def test_reached_but_not_triggered_passes(mutant, case):
    """The mutant runs its buggy code on these cases, and the bug cannot show."""
    impl = get_target(TARGET).resolve(mutant)
    assert impl.reach(case) and not impl.trigger(case)
    assert judge(mutant, case).ok


# -- each check on hand-made wrong implementations ----------------------------------


def _fill(inputs: ref.MtpSeqLensInputs, out: torch.Tensor) -> ref.MtpSeqLensOutputs:
    kernels.write_context_lens(inputs.seq_lens, out)
    return ref.MtpSeqLensOutputs(out)


def _fresh(inputs):
    shape, dev = (inputs.num_decodes, inputs.max_decode_len), inputs.workspace.device
    return _fill(inputs, torch.empty(shape, dtype=torch.int32, device=dev))


def _scribbles(inputs):
    inputs.workspace[-1] += 1  # one element of the workspace it does not own
    return kernels.mtp_context_lens(inputs)


def _int64(inputs):
    return ref.MtpSeqLensOutputs(kernels.mtp_context_lens(inputs).context_lens.long())


@pytest.mark.parametrize(
    "fn, expected",
    [
        (_fresh, ["graph"]),
        (_scribbles, ["unchanged"]),
        (_int64, ["graph", "dtype"]),
    ],
)
def test_oracle_catches_hand_made_wrong_implementations(fn, expected):
    from attnfuzz.harness.target import Implementation

    case = hand_case((2, 2, 2), (3, 5, 1))  # B = 4, L = 2
    assert checks(judge(Implementation(fn.__name__, fn, "user"), case)) == expected


def test_graph_recorder_sees_a_contiguous_copy_and_a_fresh_empty_not_views():
    inputs = ref.make_inputs(hand_case((1, 1), (4, 0)), DEV)
    _, allocated = allocations(lambda: inputs.table_2d[:2, :1].contiguous())
    assert len(allocated) == 1 and "[2, 1] torch.int32" in allocated[0]
    _, allocated = allocations(lambda: torch.empty(2, 1, dtype=torch.int32, device=DEV))
    assert len(allocated) == 1
    _, allocated = allocations(lambda: inputs.flat_table[:2].view(2, 1).contiguous())
    assert allocated == []  # already contiguous: the same view back
    _, allocated = allocations(kernels.mtp_context_lens, inputs)
    assert allocated == []


# -- where the lengths may live, and which path (vLLM 0.33.0's contract) -----------------


def _through_temporaries(inputs):
    """vLLM's fixed ``_prepare_decode_tensors``: ``sub``/``add`` temporaries on the host's
    view of the step, copied into the head of the flat table."""
    B, L = inputs.num_decodes, inputs.max_decode_len
    out = inputs.flat_table[: B * L].view(B, L)
    offsets = torch.arange(L, dtype=torch.int32, device=out.device)
    out[:] = (inputs.seq_lens[:B].unsqueeze(1) - L + 1 + offsets).clamp_(min=0)
    return ref.MtpSeqLensOutputs(out)


def test_temporaries_inside_the_call_are_not_a_finding_a_copy_handed_on_is():
    """The builder runs eagerly, before a graph replays: only what it hands on must be
    persistent. The allocation recorder sees the temporaries; the verdict does not."""
    from attnfuzz.harness.target import Implementation

    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = ref.make_inputs(case, DEV)
    _, allocated = allocations(_through_temporaries, inputs)
    assert allocated  # what the old graph-safe judgement refused
    assert judge(Implementation("temporaries", _through_temporaries, "user"), case).ok
    smallest = get_target(TARGET).resolve("pr42135-copy").smallest()
    assert checks(judge("pr42135-copy", smallest)) == ["graph", "unchanged"]


def _seq_lens_view(inputs):
    """Plain decode as vLLM's ``build`` does it: ``seq_lens[:B].unsqueeze(-1)``."""
    return ref.MtpSeqLensOutputs(inputs.seq_lens[: inputs.num_decodes].unsqueeze(-1))


def test_plain_decode_may_hand_on_a_view_of_the_steps_seq_lens():
    from attnfuzz.harness.target import Implementation

    plain = hand_case((1, 1, 1), (4, 0, 9), num_spec=0, cudagraph_capture_sizes=(1, 2, 4))
    assert judge(Implementation("seq_lens", _seq_lens_view, "user"), plain).ok
    spec = hand_case((2, 2), (3, 4))  # next_n = 2: seq_lens is not the table there
    verdict = judge(Implementation("seq_lens", _seq_lens_view, "user"), spec)
    assert checks(verdict) == ["shape"]


def _flattened(inputs):
    """The flattening path's answer: one length per decode token of the ragged split
    (the causal end of each token), [N_d, 1], at the head of the flat table."""
    meta = inputs.common
    split = split_decodes_and_prefills(meta, inputs.config.threshold)
    lens = [
        int(meta.seq_lens[b]) - d + j + 1 for b, d in enumerate(split.decode_lens) for j in range(d)
    ]
    lens += [0] * (split.num_decode_tokens - len(lens))
    out = inputs.flat_table[: split.num_decode_tokens].view(-1, 1)
    out.copy_(torch.tensor(lens, dtype=torch.int32).view(-1, 1))
    return ref.MtpSeqLensOutputs(out, path=ref.FLATTENING)


def test_a_flattened_answer_is_accepted_only_where_the_engine_may_flatten():
    from attnfuzz.harness.target import Implementation

    impl = Implementation("flattened", _flattened, "user")
    flattens = hand_case((3, 1), (0, 7), num_spec=2, cudagraph_capture_sizes=(3, 6))
    assert ref.engine_paths(flattens.config) == (ref.NATIVE, ref.FLATTENING)
    assert judge(impl, flattens).ok and judge("triton", flattens).ok
    verdict = judge(impl, hand_case((2, 1), (3, 3)))  # next_n = 2: native on every platform
    assert checks(verdict) == ["path"] and verdict.mismatches[0].expected == "native"


def test_the_steps_seq_lens_are_left_as_they_were():
    from attnfuzz.harness.target import Implementation

    def clamps_seq_lens(inputs):
        inputs.seq_lens.clamp_(min=3)
        return kernels.mtp_context_lens(inputs)

    verdict = judge(Implementation("clamps", clamps_seq_lens, "user"), hand_case((1, 1), (4, 0)))
    assert (
        checks(verdict) == ["values", "unchanged"] and verdict.mismatches[1].where == "seq_lens[1]"
    )


def test_an_own_buffer_stands_for_the_workspace_head_and_is_checked_as_it():
    from attnfuzz.harness.target import Implementation

    def own(inputs, scribble: bool):
        # stands for a buffer the implementation made at start-up (the oracle trusts that)
        buffer = inputs.workspace[: inputs.max_num_batched_tokens].clone()
        inputs = dataclasses.replace(inputs, workspace=buffer)  # the kernel writes there
        out = kernels.mtp_context_lens(inputs).context_lens
        if scribble:
            buffer[-1] += 1
        return ref.MtpSeqLensOutputs(out, buffer)

    case = hand_case((2, 2, 2), (3, 5, 1))
    assert judge(Implementation("own", lambda i: own(i, False), "user"), case).ok
    verdict = judge(Implementation("own", lambda i: own(i, True), "user"), case)
    assert checks(verdict) == ["unchanged"] and verdict.mismatches[0].where == "buffer[255]"


# -- end to end ------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_the_search_draws_short_padded_mtp_steps(impl):
    result = assert_passes(TARGET, impl)  # the generic test's run (tests/test_entries.py)
    for label in ("next_n>1", "padding_requests", "max_decode_len<next_n"):
        assert result.labels[label] > 0, label


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_minimized_case_is_no_bigger_than_the_smallest_trigger(mutant):
    result = assert_detected(TARGET, mutant)  # the generic test's run
    case, smallest = result.case, get_target(TARGET).resolve(mutant).smallest()
    assert result.verdict.key == MUTANT_CHECKS[mutant][0]
    _, split = ref.describe(case)
    assert case.config.next_n == 2  # the smallest next_n that can trigger it
    assert sum(case.batch.q_lens) <= sum(smallest.batch.q_lens)
    if mutant == "pr42135-noclamp":
        meta = ref.describe(case)[0]
        assert meta.num_reqs > meta.num_real_reqs and 0 in meta.seq_lens.tolist()
    else:
        assert split.decode_lens == (1, 1)


def test_case_files_derive_the_split_of_the_target_path():
    """Case files show the native path's uniform split, not the ragged one."""
    from attnfuzz.harness.casefile import case_document
    from attnfuzz.harness.oracle import Mismatch, Verdict

    case = hand_case((2, 1), (3, 3))  # ragged: two decodes; uniform: one, then a prefill
    verdict = Verdict([Mismatch("values", "x", "1", "2")])
    native = case_document("mtp-seq-lens", "triton", case, verdict)["derived"]
    assert (native["num_decodes"], native["requires_padding"]) == (1, False)
    ragged = split_decodes_and_prefills(ref.describe(case)[0], case.config.threshold)
    assert (ragged.num_decodes, ragged.requires_padding) == (2, True)
