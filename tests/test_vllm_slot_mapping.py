"""vLLM's own slot mapping (V2 and V1 model runners) against the reference."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case

pytestmark = requires_vllm

TARGET = "slot-mapping"


@pytest.mark.parametrize("impl", ["vllm", "vllm-v1"])
def test_vllm_passes(impl):
    assert_passes(TARGET, impl, max_examples=150)


@pytest.mark.parametrize("impl", ["vllm", "vllm-v1"])
def test_vllm_pads_every_slot_past_the_real_tokens(impl):
    """A padded graph step (6 tokens in the graph of 8): the engine writes -1 from the
    real token count to the end of its buffer, over stale valid-looking slots."""
    target = get_target(TARGET)
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = target.make_inputs(case, "cpu")
    assert (inputs.slot_mapping_buffer >= 0).all()
    got = target.implementations[impl].fn(inputs)
    assert got.slot_mapping.tolist()[6:] == [-1, -1]
    assert (got.buffer[6:] == -1).all()
    assert target.compare(case, inputs, target.reference(case, inputs), got) == []


@pytest.mark.parametrize("mutant", ["stale-padding", "position-off-by-one", "page-width"])
def test_vllm_passes_each_mutants_smallest_case(mutant):
    target = get_target(TARGET)
    case = target.resolve(mutant).smallest()
    for impl in ("vllm", "vllm-v1"):
        assert target.judge(target.resolve(impl), case).ok, impl


UPSTREAM = "upstream-pr36580-stale-padding"


def test_upstream_pr36580_leaves_the_padded_tokens_stale_slots():
    """6 tokens in the graph of 8: the pre-fix kernel pads from positions.shape[0] = 8,
    so slots 6 and 7 keep the valid-looking ids an earlier step left there."""
    target = get_target(TARGET)
    case = hand_case((2, 2, 2), (3, 5, 1))
    inputs = target.make_inputs(case, "cpu")
    stale = inputs.slot_mapping_buffer[6:8].tolist()
    got = target.implementations[UPSTREAM].fn(inputs)
    assert got.slot_mapping[6:].tolist() == stale and min(stale) >= 0
    assert (got.buffer[8:] == -1).all()
    verdict = target.judge(target.resolve(UPSTREAM), case)
    assert verdict.key == "values" and "slot_mapping[6]" in verdict.mismatches[0].where


def test_upstream_mutant_is_detected():
    assert_detected(TARGET, UPSTREAM)
