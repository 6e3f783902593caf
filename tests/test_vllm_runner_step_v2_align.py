"""vLLM 0.33.0's V2 runner of a hybrid GDN model with prefix caching on
(``vllm-v2-hybrid-align``): ``MambaHybridModelState``'s align path moves each request's
running state with the fused kernels of ``mamba_utils`` (pre-copy before the step,
post-copy after the sample); the state each request's kernels read, eager, piecewise or
in a FULL graph's replay, is held to the one it left; a mutant of the seeding caught."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

CONFIG = EngineConfig(
    max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, block_size=16,
    cudagraph_capture_sizes=(2, 4), cudagraph_mode="FULL_AND_PIECEWISE", runner="v2",
)  # fmt: skip


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v2_align

    return runner_step_v2_align


def build(out: ref.RunnerStepOutputs, how: str) -> dict[str, np.ndarray]:
    (b,) = own(out, how)
    return {f.name: f.values for f in b.fields}


def crossing(mode: str = "FULL_AND_PIECEWISE") -> Trace:
    """V1's two requests crossing into new blocks (``two_requests_crossing``), on V2."""
    from attnfuzz.adapters.vllm.runner_step_mamba_align import two_requests_crossing

    return two_requests_crossing(dataclasses.replace(CONFIG, cudagraph_mode=mode))


@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "PIECEWISE", "NONE"])
def test_states_follow_their_requests_across_blocks(monkeypatch, mode):
    """The fused pre-copy moves request 0's state from its first block to its second and
    request 1's from its hit's block to its own; every request reads the state it left,
    in every build with a history, and every property holds on every step."""
    a = adapter()  # before vLLM
    from vllm.v1.worker import mamba_utils

    names = ("_populate_metadata", "run_fused_precopy", "run_fused_postprocess_align")
    calls = Calls(monkeypatch)
    calls.count(mamba_utils.MambaSpecDecodeGPUContext, *names)
    outs = run_trace(crossing(mode), a.run)
    for out in outs:
        assert ref.violations(out) == []
    assert all(calls[name] for name in names), calls
    second, third = build(outs[1], "eager"), build(outs[2], "padded")
    # The decode (request 0) first, then request 1's prefill after its hit.
    assert second["gdn.state_left"].tolist() == [a.align.tag(0, 16), a.align.tag(1, 16)]
    for cache in ("conv", "temporal"):
        assert second[f"gdn.{cache}_found"].tolist() == second["gdn.state_left"].tolist()
        assert third[f"gdn.{cache}_found"].tolist() == [a.align.tag(0, 17), a.align.tag(1, 20)]
    # Each reads its state in the block of its last token: its second block.
    assert len(set(second["gdn.non_spec_state_indices_tensor"][:2].tolist())) == 2
    if mode == "FULL_AND_PIECEWISE":  # the uniform decode replayed its FULL graph
        assert own(outs[2], "replay")


@pytest.mark.parametrize("mutant", ["seed_column_past", "decode_precopy_skipped"])
def test_the_mutants_are_caught_on_their_smallest_traces(mutant):
    """Seeded one block past, the prefix hit's request names its new block as its source;
    with the pre-copy skipped on a step of decodes, the decode that crosses into its
    second block runs there before its state is moved: either way no copy is made and the
    kernels read a block that holds no state. The installed engine passes the same
    trace."""
    a = adapter()
    trace = getattr(a, f"smallest_{mutant}")()
    assert getattr(a, f"trigger_{mutant}")(trace) and a.reach_align(trace)
    assert all(ref.violations(out) == [] for out in run_trace(trace, a.run))
    last = run_trace(trace, getattr(a, mutant))[-1]
    found = {(v.prop, v.field) for v in ref.violations(last)}
    assert ("agreement within a build", "gdn.temporal_found") in found
    assert ("agreement within a build", "gdn.conv_found") in found


def test_a_spec_decode_moving_into_a_new_block_reads_the_accepted_drafts_state(monkeypatch):
    """With drafts a request that accepted one of its two drafts, then decodes into its
    second block, reads there the state after the draft it accepted: the model state's
    fused pre-copy moved it from that draft's column (offset 1), and its post-copy ran
    after each sample. The mutant that hands the pre-copy a token bias of 0 is caught on
    the same trace, which the installed engine passes."""
    a = adapter()  # before vLLM
    from vllm.v1.worker import mamba_utils

    calls = Calls(monkeypatch)
    calls.count(mamba_utils.MambaSpecDecodeGPUContext, "run_fused_precopy")
    trace = a.smallest_precopy_unbiased()
    assert a.trigger_precopy_unbiased(trace) and a.reach_align_drafts(trace)
    outs = run_trace(trace, a.run)
    assert all(ref.violations(out) == [] for out in outs)
    assert calls["run_fused_precopy"]
    last = build(outs[-1], "eager")
    assert last["gdn.num_accepted_tokens"].tolist() == [1]  # reset by the pre-copy
    for cache in ("conv", "temporal"):
        assert last[f"gdn.{cache}_found"].tolist() == [a.align.tag(0, 14)]
    found = {(v.prop, v.field) for v in ref.violations(run_trace(trace, a.precopy_unbiased)[-1])}
    assert ("agreement within a build", "gdn.temporal_found") in found
    assert ("agreement within a build", "gdn.conv_found") in found


def test_the_fresh_engine_carries_no_state_fields():
    """History invariance's fresh engine has no history of states: its build has none."""
    a = adapter()
    outs = run_trace(crossing("NONE"), a.run)
    assert "gdn.state_left" not in build(outs[1], "fresh")
    assert "gdn.state_left" in build(outs[1], "padded")


def test_a_dummy_request_past_the_block_table_is_declined():
    """A mixed capture whose dummy request is longer than the block table's row (161
    tokens, one request, rows of 160 blocks), or a step whose idle data-parallel rank's
    dummy run is (7 tokens padded to 225), is declined with the reason; decode-only
    captures and dummies within the row run."""
    a = adapter()
    past = EngineConfig(
        max_model_len=160, max_num_seqs=1, max_num_batched_tokens=274, block_size=1,
        cudagraph_capture_sizes=(1, 161), cudagraph_mode="PIECEWISE", runner="v2",
    )  # fmt: skip
    assert "make_dummy" in a.declines_past_row(past)
    fine = a.declines_past_row
    assert fine(dataclasses.replace(past, cudagraph_mode="FULL_DECODE_ONLY")) is None
    assert fine(dataclasses.replace(past, cudagraph_capture_sizes=(1, 160))) is None
    assert fine(dataclasses.replace(past, max_num_seqs=2)) is None
    wide = dataclasses.replace(past, max_num_seqs=6, cudagraph_capture_sizes=(1, 6, 225))
    step = Batch((0,), (7,), req_ids=(0,), pages=((1, 2, 3, 4, 5, 6, 7),), new_pages=(7,))
    assert fine(wide) is None
    assert "225 tokens" in fine(wide, step)
    assert fine(dataclasses.replace(wide, cudagraph_mode="NONE"), step) is None
