"""vLLM's own slot mapping (V2 and V1 model runners) against the reference."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import hand_case

pytestmark = requires_vllm

TARGET = "slot-mapping"


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


@pytest.mark.parametrize("impl", ["vllm", "vllm-v1", UPSTREAM])
def test_binds_to_every_supported_release(impl):
    """Every release from 0.21.0 has what each implementation calls (before 0.24.0
    without buffer_utils._load_ptr, which nothing here imports): where the generic
    test skips an implementation that cannot run, this one fails."""
    assert get_target(TARGET).resolve(impl).why_unavailable() is None


def test_upstream_pr36580_reverts_only_the_fix_in_the_installed_kernel():
    """The mutant's kernel is the installed release's ``_compute_slot_mappings_kernel``
    with #36580's lines replaced, nothing else, and it calls what the release's kernel
    calls (its ``_load_ptr``: block_table.py's own before 0.24.0, buffer_utils' after)."""
    import difflib
    import inspect

    from attnfuzz.adapters.vllm import slot_mapping as adapter
    from vllm.v1.worker.gpu import block_table

    fixed = inspect.getsource(block_table._compute_slot_mappings_kernel.fn).splitlines()
    reverted = adapter.pr36580_source().splitlines()
    changed = [
        line
        for line in difflib.unified_diff(fixed, reverted, lineterm="", n=0)
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    assert changed == [
        "+    num_tokens,",
        "-        # Start from actual token count (not padded) to cover the gap",
        "-        # between actual tokens and padded tokens that can contain stale",
        "-        # valid slot IDs from previous chunks during chunked prefill.",
        "-        actual_num_tokens = tl.load(query_start_loc + batch_idx)",
        "-        for i in range(actual_num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):",
        "+        for i in range(num_tokens, max_num_tokens, TRITON_BLOCK_SIZE):",
    ]
    kernel = adapter._pre_pr36580_kernel()
    assert kernel.fn.__globals__["_load_ptr"] is block_table._load_ptr
    assert list(inspect.signature(kernel.fn).parameters)[:2] == ["num_tokens", "max_num_tokens"]
