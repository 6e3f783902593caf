"""``mtp-seq-lens`` on vLLM's own code: the builder passes, #42135 upstream is caught,
and each place the target's contract moved to vLLM 0.33.0's has a hand case.

On a release with one of the builder's own known bugs (0.21.0 keeps #42135's 2-D
table; releases before 0.28.0 do not clamp a padding request's lengths at 0) the
tests expect exactly that bug's checks where it shows (:func:`known_findings`),
read from the release's code, and nothing else.
"""

from __future__ import annotations

import inspect
from functools import cache

import pytest
import torch
from attnfuzz.adapters.vllm import compat
from attnfuzz.adapters.vllm.plugin import trigger_native_strided
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.graph import allocations
from attnfuzz.harness.oracle import expect_inside, expect_meta
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.targets.mtp_seq_lens import smallest_strided, trigger_noclamp
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case, spec_config
from attnfuzz.reference import mtp_seq_lens as ref
from attnfuzz.reference.batch import split_decodes_and_prefills
from hypothesis import HealthCheck, given, settings

pytestmark = requires_vllm

TARGET = "mtp-seq-lens"
UPSTREAM = {  # upstream mutant -> the re-created one and the checks both fail
    "upstream-pr42135-strided": ("pr42135-strided", ["contiguous", "stride", "consumer"]),
    "upstream-pr42135-copy": ("pr42135-copy", ["graph", "unchanged"]),
}


def judge(impl, case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl) if isinstance(impl, str) else impl, case)


def checks(verdict) -> list[str]:
    return [m.check for m in verdict.mismatches]


def adapter():
    from attnfuzz.adapters.vllm import mtp_seq_lens

    return mtp_seq_lens


def vllm_split(case, require_uniform: bool) -> tuple[int, int, int, int]:
    from attnfuzz.adapters.vllm import _engine
    from attnfuzz.reference.batch import build_common_metadata
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills as split

    common = _engine.common_attn_metadata(build_common_metadata(case.config, case.batch), "cpu")
    return split(common, decode_threshold=case.config.threshold, require_uniform=require_uniform)


# -- the installed release's own known bugs, read from its code --------------------------


@cache
def keeps_2d_table() -> bool:
    """#42135 unfixed: the builder's ``__init__`` allocates native MTP's
    ``decode_seq_lens_buffer`` as the ``[max_num_seqs, next_n]`` table (0.21.0)."""
    builder = adapter()._builder(adapter()._builder_class(), spec_config(), torch.device("cpu"))
    return builder.decode_seq_lens_buffer.dim() == 2


@cache
def clamps_at_0() -> bool:
    """``_prepare_decode_tensors``'s native branch clamps the lengths at 0 (0.28.0 on):
    the release's source says, not what the adapter under test returns."""
    source = inspect.getsource(adapter()._builder_class()._prepare_decode_tensors)
    return ".clamp_(min=0)" in source


def known_findings(case) -> list[str]:
    """The checks the installed builder's known bugs fail on ``case`` (in the oracle's
    order): none on a release with both fixes."""
    out = []
    if keeps_2d_table() and trigger_native_strided(case):
        out += UPSTREAM["upstream-pr42135-strided"][1]
    if not clamps_at_0() and adapter().takes_native_path(case.config) and trigger_noclamp(case):
        out += ["values"]  # a padding request's first slots: seq_len 0 - L + 1 + j < 0
    return out


def has_known_bug() -> bool:
    return keeps_2d_table() or not clamps_at_0()


# -- end to end ------------------------------------------------------------------------


def test_vllm_s_search_takes_both_paths_or_finds_the_releases_own_bug():
    if has_known_bug():  # the run finds the release's own bug, and only that
        t = get_target(TARGET)
        result = fuzz(t, t.resolve("vllm"), max_examples=150, rng_seed=0, database=None)
        assert result.failed and known_findings(result.case), result.case
        assert checks(result.verdict) == known_findings(result.case)
        return
    result = assert_passes(TARGET, "vllm")  # the generic test's run (tests/test_entries.py)
    assert result.statistics["native_path"] > 0 and result.statistics["flattening_path"] > 0
    for label in ("next_n>1", "padding_requests", "max_decode_len<next_n"):
        assert result.labels[label] > 0, label


@pytest.mark.parametrize("mutant", sorted(UPSTREAM))
def test_upstream_mutant_is_detected_with_a_minimized_trigger(mutant):
    if not clamps_at_0():
        # The mutant is the release with #42135 reverted: the release's own missing
        # clamp may be found first. Either finding, each with its own checks.
        t = get_target(TARGET)
        impl = t.resolve(mutant)
        assert checks(judge(impl, impl.smallest())) == UPSTREAM[mutant][1]
        result = fuzz(t, impl, max_examples=1000, rng_seed=0, database=None)
        assert result.failed
        if not impl.trigger(result.case):
            assert checks(result.verdict) == known_findings(result.case) == ["values"]
            return
    else:
        result = assert_detected(TARGET, mutant)  # the generic test's run
    assert result.verdict.key == UPSTREAM[mutant][1][0]
    _, split = ref.describe(result.case)
    assert result.case.config.next_n == 2 and split.decode_lens == (1, 1)


@pytest.mark.parametrize("mutant", sorted(UPSTREAM))
def test_upstream_mutant_fails_the_recreated_mutants_checks_on_its_smallest_trigger(mutant):
    impl = get_target(TARGET).resolve(mutant)
    case = impl.smallest()
    assert impl.reach(case) and impl.trigger(case)
    # Fixed releases pass it; 0.21.0 is the pre-#42135 code and fails it alike.
    assert checks(judge("vllm", case)) == known_findings(case)
    recreated, expected = UPSTREAM[mutant]
    assert checks(judge(mutant, case)) == checks(judge(recreated, case)) == expected


@pytest.mark.parametrize("mutant", sorted(UPSTREAM))
def test_upstream_mutants_pass_where_the_bug_cannot_show(mutant):
    """One decode (the row stride unused), L == next_n, a padded graph, and next_n = 3,
    which vLLM flattens on the CPU (the 2-D table is never made)."""
    for case in (
        hand_case((1,), (4,)),
        hand_case((2, 2, 5), (1, 2, 0)),
        hand_case((2, 2, 2), (3, 5, 1)),
        hand_case((1, 1), (4, 0), num_spec=2, cudagraph_capture_sizes=(3, 6)),
    ):
        assert not get_target(TARGET).resolve(mutant).trigger(case)
        assert checks(judge(mutant, case)) == known_findings(case), case


def test_the_upstream_mutants_differ_from_vllm_only_in_the_42135_lines():
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

    strided, copy = adapter()._strided_class(), adapter()._copy_class()
    assert strided.__bases__ == (DeepseekV32IndexerMetadataBuilder,)
    assert copy.__bases__ == (strided,)

    def methods(cls: type) -> set[str]:
        return {name for name, value in vars(cls).items() if callable(value)}

    assert methods(strided) == {"__init__", "_prepare_decode_tensors"}
    assert methods(copy) == {"_prepare_decode_tensors"}


def test_the_strided_mutant_reverts_only_where_the_release_has_the_fix():
    """With #42135's flat buffer the mutant keeps it for the release's own native
    branch and hands on the 2-D table's slice of the same values; a release before
    the fix (0.21.0) allocates that table itself: there the mutant is the release."""
    case = smallest_strided()
    config = case.config
    mutant = adapter()._builder(adapter()._strided_class(), config, torch.device("cpu"))
    got = adapter().upstream_strided(get_target(TARGET).make_inputs(case, "cpu"))
    ours = adapter().run(get_target(TARGET).make_inputs(case, "cpu"))
    assert got.context_lens.tolist() == ours.context_lens.tolist() == [[2], [2]]
    assert got.buffer is mutant.decode_seq_lens_buffer
    assert tuple(got.buffer.shape) == (config.max_num_seqs, config.next_n)
    assert got.context_lens.stride() == (config.next_n, 1)  # [:B, :L] of [S, next_n]
    if keeps_2d_table():
        assert mutant.flat_seq_lens_buffer is None
        assert ours.context_lens.stride() == got.context_lens.stride()
    else:
        assert mutant.flat_seq_lens_buffer.dim() == 1 and ours.context_lens.is_contiguous()


def test_the_builder_is_made_with_what_its_release_takes():
    """From 0.27.0 the runner hands ``block_table_width=``; before, ``__init__`` sizes
    its expanded block table itself: ``cdiv(max_model_len, block_size)`` on one rank,
    the width the adapter hands where the keyword exists."""
    config = spec_config()
    builder = adapter()._builder(adapter()._builder_class(), config, torch.device("cpu"))
    init = inspect.signature(adapter()._builder_class().__init__).parameters
    assert ("block_table_width" in init) == compat.has(compat.BUILDER_TABLE_WIDTH)
    assert builder.expanded_block_table_buffer.shape[1] == config.max_blocks_per_seq


def test_a_single_token_step_where_the_builder_flattens_takes_the_releases_own_path():
    """next_n = 3 flattens on the CPU; for a step of one-token decodes ``build`` from
    0.28.0 flattens too (``use_native`` false: ``[N_d, 1]`` in its buffer), while
    before ``_prepare_decode_tensors`` flattens only ``max_decode_len > 1`` and passes
    the step's seq_lens through (``[B, 1]``, a view of them). The target takes both."""
    case = hand_case((1, 1, 1), (4, 0, 9), num_spec=2, cudagraph_capture_sizes=(3, 6))
    assert not adapter().takes_native_path(case.config)
    inputs = get_target(TARGET).make_inputs(case, "cpu")
    got = adapter().run(inputs)
    assert got.context_lens.flatten().tolist() == [5, 1, 10]
    if compat.has(compat.NATIVE_DECODE):
        assert got.path == ref.FLATTENING
        assert got.context_lens.data_ptr() == got.buffer.data_ptr()
    else:
        assert got.path == ref.NATIVE
        assert got.context_lens.data_ptr() == inputs.seq_lens.data_ptr()
    assert judge("vllm", case).ok


# -- the split -------------------------------------------------------------------------


@settings(max_examples=300, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(get_target(TARGET).cases())
def test_describe_splits_as_vllm_does_on_each_path(case):
    """The native path's uniform split (padding requests of length 0 included) is
    vLLM's ``split_decodes_and_prefills(require_uniform=True)``; the rows of a
    flattened answer are its ragged split's decode tokens."""
    meta, split = ref.describe(case)
    ours = (split.num_decodes, split.num_prefills, split.num_decode_tokens)
    ours += (split.num_prefill_tokens,)
    assert vllm_split(case, require_uniform=True) == ours
    ragged = split_decodes_and_prefills(meta, case.config.threshold)
    assert vllm_split(case, require_uniform=False)[2] == ragged.num_decode_tokens


def test_a_padded_graph_counts_its_padding_requests_as_decodes_in_vllm_too():
    case = hand_case((2, 2, 2), (3, 5, 1))  # 6 tokens padded to 8: d = [2, 2, 2, 0]
    assert vllm_split(case, require_uniform=True) == (4, 0, 8, 0)
    assert ref.describe(case)[1].decode_lens == (2, 2, 2, 0)


# -- fidelity: graph safety is judged on the outputs -----------------------------------


def test_vllms_builder_computes_through_temporaries_into_its_persistent_buffer():
    """The old judgement ran the call under the allocation recorder and refused any
    new storage: vLLM's fixed ``_prepare_decode_tensors`` (``sub``/``add``
    temporaries, host reads of ``decode_lens_cpu``) failed it on a correct answer.
    The builder runs eagerly before a graph replays; its lengths are a view of the
    ``decode_seq_lens_buffer`` it allocated once, at the same address every step."""
    case = hand_case((2, 2, 2), (3, 5, 1))
    target = get_target(TARGET)
    inputs = target.make_inputs(case, "cpu")
    got, allocated = allocations(adapter().run, inputs)
    assert allocated, "the old graph check would pass vLLM: this test shows nothing"
    assert got.context_lens.data_ptr() == got.buffer.data_ptr()  # offset 0 of the buffer
    again = adapter().run(target.make_inputs(hand_case((1, 1), (4, 0)), "cpu"))
    assert again.buffer is got.buffer and again.context_lens.data_ptr() == got.buffer.data_ptr()
    assert checks(judge("vllm", case)) == known_findings(case)


def test_a_copy_is_new_storage_whoever_makes_it():
    """What the old recorder caught of ``.contiguous()``, the ``graph`` check catches on
    the outputs: re-created, upstream, or a fresh tensor of the right values."""
    case = hand_case((1, 1), (4, 0))
    for mutant in ("pr42135-copy", "upstream-pr42135-copy"):
        verdict = judge(mutant, case)
        assert verdict.key == "graph" and verdict.mismatches[0].got == "new storage"

    def fresh_copy_of_vllm(inputs):
        out = adapter().run(inputs)
        return ref.MtpSeqLensOutputs(out.context_lens.clone(), out.buffer)

    verdict = judge(Implementation("clone", fresh_copy_of_vllm, "user"), case)
    assert checks(verdict) == ["graph", "unchanged"]  # the buffer written, the copy handed on


def test_an_own_buffer_written_outside_the_lengths_is_caught():
    case = hand_case((2, 2, 2), (3, 5, 1))  # B * L = 8 elements of the buffer owned

    def scribbles(inputs):
        out = adapter().run(inputs)
        out.buffer.view(-1)[8] += 1  # flat: 0.21.0 keeps a 2-D buffer
        return out

    verdict = judge(Implementation("scribbles", scribbles, "user"), case)
    assert checks(verdict) == [*known_findings(case), "unchanged"]
    assert verdict.mismatches[-1].where == "buffer[8]"


# -- fidelity: next_n == 1 passes the step's seq_lens through ---------------------------


def test_plain_decode_lengths_are_a_view_of_the_steps_seq_lens():
    """With next_n == 1, ``build`` hands on ``seq_lens[:B].unsqueeze(-1)``: a view of
    the step's seq_lens, [B, 1], written by no one. The old oracle asked for a view of
    the workspace and failed it; the re-created mutants are still caught. The three
    decodes run in the graph of 4, padded with a request of ``q_len`` 0 and seq_len 0,
    which counts as a decode (``split_decodes_and_prefills``: ``max_query_len <=
    decode_threshold`` makes every request one), so B = 4."""
    case = hand_case((1, 1, 1), (4, 0, 9), num_spec=0, cudagraph_capture_sizes=(1, 2, 4))
    inputs = get_target(TARGET).make_inputs(case, "cpu")
    got = adapter().run(inputs)
    assert got.context_lens.tolist() == [[5], [1], [10], [0]] and got.path == ref.NATIVE
    assert got.context_lens.data_ptr() == inputs.seq_lens.data_ptr()
    assert [m.check for m in expect_inside("context_lens", got.context_lens, inputs.workspace)] == [
        "view"
    ]  # the old check
    assert judge("vllm", case).ok
    for mutant in ("pr42135-strided", "pr42135-copy", "pr42135-noclamp"):
        impl = get_target(TARGET).resolve(mutant)
        assert checks(judge(mutant, impl.smallest()))  # still caught


def test_writing_the_steps_seq_lens_is_caught():
    case = hand_case((1, 1), (4, 0), num_spec=0, cudagraph_capture_sizes=(1, 2, 4))

    def clamps_in_place(inputs):
        out = adapter().run(inputs)
        inputs.seq_lens[1:].clamp_(min=2)  # seq_len 1 -> 2, under the lengths' view
        return out

    verdict = judge(Implementation("clamps", clamps_in_place, "user"), case)
    assert checks(verdict) == ["values", "unchanged"]
    assert verdict.mismatches[1].where == "seq_lens[1]"


# -- fidelity: next_n > 2 flattens on the CPU platform ---------------------------------


def test_vllm_flattens_next_n_3_on_the_cpu_and_the_target_accepts_only_that_there():
    """``_supports_native_decode(3)`` is false without DeepGEMM: vLLM splits by the
    ragged rule and hands on one length per decode token, [N_d, 1]. The old oracle
    asked for the native [B, L] table; the target now accepts a flattened answer
    where the engine may flatten (next_n > 2), and nowhere else."""
    case = hand_case((3, 3), (0, 7), num_spec=2, cudagraph_capture_sizes=(3, 6))
    assert not adapter().takes_native_path(case.config)
    inputs = get_target(TARGET).make_inputs(case, "cpu")
    got = adapter().run(inputs)
    assert got.path == ref.FLATTENING and tuple(got.context_lens.shape) == (6, 1)
    assert got.context_lens.flatten().tolist() == [1, 2, 3, 8, 9, 10]
    assert expect_meta("context_lens", got.context_lens, (2, 3), torch.int32)  # the old check
    assert judge("vllm", case).ok
    assert judge("triton", case).ok  # the native path stays right for next_n = 3

    def claims_flattening(inputs):
        out = adapter().run(inputs)
        return ref.MtpSeqLensOutputs(out.context_lens, out.buffer, ref.FLATTENING)

    native_only = hand_case((2, 2), (3, 4))
    verdict = judge(Implementation("claims", claims_flattening, "user"), native_only)
    assert checks(verdict) == ["path"]
