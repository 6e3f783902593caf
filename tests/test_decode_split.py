"""Target ``decode-split``: the rules by hand, the oracle's checks, our implementation, mutants."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.engine import fuzz_settings
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import decode_split as target_module
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import decode_split as ref
from attnfuzz.reference.batch import (
    Batch,
    Case,
    CommonMetadata,
    build_common_metadata,
    split_decodes_and_prefills,
)

TARGET = "decode-split"


def case(
    q_lens: tuple[int, ...],
    computed: tuple[int, ...],
    *,
    threshold: int = 0,
    uniform: int = 0,
    short_as_prefills: int = 0,
    seed: int = 0,
) -> Case:
    params = (
        ("decode_threshold", threshold),
        ("require_uniform", uniform),
        ("short_extends_as_prefills", short_as_prefills),
    )
    return Case(spec_config(), Batch(computed, q_lens, seed=seed), params)


def expected(c: Case) -> ref.DecodeSplitOutputs:
    return ref.reference(c, ref.make_inputs(c))


# -- the rules, by hand (next_n = 2, threshold 2) --------------------------------------


def test_padded_uniform_decode_is_all_decodes_under_both_rules():
    """d = [2, 2, 2, 0] (6 tokens in the graph of 8): four decodes, N_d = 8 (padding included)."""
    for uniform in (0, 1):
        assert expected(case((2, 2, 2), (1, 1, 1), uniform=uniform)).split == (4, 0, 8, 0)


def test_uniform_rule_stops_at_the_first_other_length():
    assert expected(case((1, 2), (1, 1), uniform=1)).split == (1, 1, 1, 2)
    assert expected(case((1, 2), (1, 1))).split == (2, 0, 3, 0)  # ragged: both decodes


def test_a_prefill_first_means_no_decodes():
    for uniform in (0, 1):
        out = expected(case((5, 1), (0, 3), uniform=uniform))
        assert out.split == (0, 2, 0, 6)


def test_short_extends_as_prefills_stop_the_decodes():
    """With treat_short_extends_as_decodes=False, a short request still in its prompt is a
    prefill: the first one drawn prefilling ends the decodes."""
    c = case((1, 1, 1), (3, 3, 3), short_as_prefills=1, seed=5)
    inputs = ref.make_inputs(c)
    flags = inputs.is_prefilling.tolist()
    first = flags.index(True) if any(flags) else 3
    assert ref.split(inputs)[0] == first
    # a request with nothing cached is in its prompt, whatever the coin
    assert ref.make_inputs(case((1, 1), (0, 3), short_as_prefills=1)).is_prefilling[0]


def test_padding_requests_are_never_prefilling():
    inputs = ref.make_inputs(case((2, 2, 2), (0, 0, 0), short_as_prefills=1))
    assert inputs.is_prefilling.tolist() == [True, True, True, False]
    # short extends as prefills: the first real request already ends the decodes
    assert ref.split(inputs) == (0, 4, 0, 8)


def test_three_way_split_decodes_extends_prefills():
    """q = [1, 3, 4], computed [2, 5, 0]: one decode, one extend (context 5), one prefill."""
    assert expected(case((1, 3, 4), (2, 5, 0))).split_extends == (1, 1, 1, 1, 3, 4)
    assert expected(case((1, 3), (2, 5))).split_extends == (1, 1, 0, 1, 3, 0)
    assert expected(case((1, 1), (2, 5))).split_extends == (2, 0, 0, 2, 0, 0)


def test_builder_threshold_overrides_the_engines():
    """Threshold 1 with next_n = 2: a 2-token decode first is a prefill (no decodes)."""
    assert expected(case((2, 1), (3, 3), threshold=1)).split == (0, 2, 0, 3)


def test_batch_uniform_rule_skips_zero_length_requests_wherever_they_sit():
    """vLLM 0.33.0: ``is_prefill = (q != q[0]) & (q != 0)``; q = [2, 0, 3] has two decodes
    (the old rule of reference/batch.py stopped at the 0 and saw one)."""
    meta = CommonMetadata(
        query_start_loc=np.array([0, 2, 2, 5], np.int32),
        seq_lens=np.array([4, 0, 5], np.int32),
        block_table=np.zeros((3, 2), np.int32),
        slot_mapping=np.zeros(5, np.int64),
        num_reqs=3,
        num_actual_tokens=5,
        max_query_len=3,
        max_seq_len=5,
        num_real_reqs=3,
        num_real_tokens=5,
        num_blocks=4,
    )
    split = split_decodes_and_prefills(meta, 2, require_uniform=True)
    assert (split.num_decodes, split.num_decode_tokens) == (2, 2)
    inputs = ref.DecodeSplitInputs(meta, 2, True, True, np.zeros(3, bool), meta.seq_lens)
    assert ref.split(inputs) == (2, 1, 2, 3)


def test_batch_split_agrees_with_this_targets_rules_on_drawn_cases():
    from hypothesis import given

    @fuzz_settings(max_examples=200, database=None)
    @given(get_target(TARGET).cases())
    def check(c: Case) -> None:
        inputs = dataclasses.replace(ref.make_inputs(c), treat_short_extends_as_decodes=True)
        meta = build_common_metadata(c.config, c.batch)
        s = split_decodes_and_prefills(meta, inputs.decode_threshold, inputs.require_uniform)
        got = (s.num_decodes, s.num_prefills, s.num_decode_tokens, s.num_prefill_tokens)
        assert got == ref.split(inputs)

    check()


# -- the oracle ------------------------------------------------------------------------


def judge(impl, c: Case):
    t = get_target(TARGET)
    return t.judge(t.resolve(impl) if isinstance(impl, str) else impl, c)


def _impl(fn):
    from attnfuzz.harness.target import Implementation

    return Implementation("hand", fn, "user")


def test_counts_may_be_host_0d_integer_tensors_as_consumers_use_them():
    c = case((1, 3, 4), (2, 5, 0))

    def as_tensors(inputs):
        out = ref.reference(None, inputs)
        return ref.DecodeSplitOutputs(
            out.split, out.split_extends[:4] + tuple(torch.tensor(v) for v in out.split_extends[4:])
        )

    assert judge(_impl(as_tensors), c).ok


@pytest.mark.parametrize(
    "bad, check",
    [
        (lambda v: bool(v), "type"),
        (lambda v: float(v), "type"),
        (lambda v: torch.tensor([v]), "type"),
        (lambda v: torch.tensor(float(v)), "type"),
    ],
)
def test_counts_that_consumers_cannot_use_are_refused(bad, check):
    c = case((1, 3, 4), (2, 5, 0))

    def broken(inputs):
        out = ref.reference(None, inputs)
        return ref.DecodeSplitOutputs(tuple(bad(v) for v in out.split), out.split_extends)

    assert check in [m.check for m in judge(_impl(broken), c).mismatches]


def test_counts_that_do_not_add_up_break_the_invariant():
    c = case((1, 3, 4), (2, 5, 0))

    def off(inputs):
        out = ref.reference(None, inputs)
        return ref.DecodeSplitOutputs(
            (out.split[0], out.split[1] + 1) + out.split[2:], out.split_extends
        )

    checks = [m.check for m in judge(_impl(off), c).mismatches]
    assert checks == ["values", "invariant"]


# -- implementations ---------------------------------------------------------------------


def test_smallest_is_what_the_docstrings_say():
    assert expected(target_module.smallest_padding_as_prefills()).split == (4, 0, 8, 0)
    padded_mixed = target_module.smallest_padded_mixed()
    assert expected(padded_mixed).split == (1, 3, 1, 3)
    assert get_target(TARGET).resolve("padded-as-decode-graph").fn(
        ref.make_inputs(padded_mixed)
    ).split == (4, 0, 4, 0)
    assert expected(target_module.smallest_extends()).split_extends == (0, 1, 0, 0, 3, 0)


def test_padded_as_decode_graph_fails_exactly_on_padded_mixed_steps():
    """The mutant differs from the fixed split only on a padded step that its length
    rule makes mixed: on every other step, padded uniform decode graphs included, it
    passes. So only the padded mixed steps (FULL graphs of mixed batches) catch it."""
    from hypothesis import given, settings

    t = get_target(TARGET)
    seen = {True: 0, False: 0}

    @settings(max_examples=1000, derandomize=True, database=None, deadline=None)
    @given(t.cases())
    def check(c):
        fails = not judge("padded-as-decode-graph", c).ok
        assert fails == target_module.trigger_padded_mixed(c), c
        seen[fails] += 1

    check()
    assert seen[True] > 0 and seen[False] > 0
