"""vLLM 0.33.0's V1 runner of a hybrid Mamba2 model with prefix caching on
(``vllm-v1-mamba2-align``): ``mamba_cache_mode`` align, so that the runner's own
``preprocess_mamba`` copies each request's running state into the block of its last
token; the state each request's kernels read is held to the one it left; the scheduler's
align-mode steps alone are judged; a mutant of the copy caught. With drafts
(``vllm-v1-hybrid-align``), the scheduler's speculative blocks and the fused pre- and
post-copies of a hybrid model's spec decode."""

from __future__ import annotations

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

CONFIG = EngineConfig(
    max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, block_size=16,
    cudagraph_capture_sizes=(2, 4), cudagraph_mode="FULL_AND_PIECEWISE",
    cg_support="UNIFORM_BATCH", runner="v1",
)  # fmt: skip


def adapter():
    from attnfuzz.adapters.vllm import runner_step_mamba_align

    return runner_step_mamba_align


def eager(out: ref.RunnerStepOutputs) -> dict[str, np.ndarray]:
    (build,) = own(out, "eager")
    return {f.name: f.values for f in build.fields}


def crossing() -> Trace:
    """Two requests crossing into new blocks (``two_requests_crossing``)."""
    from attnfuzz.adapters.vllm.runner_step_mamba_align import two_requests_crossing

    return two_requests_crossing(CONFIG)


@pytest.mark.parametrize(
    "engine, layer, states",
    [("run", "mamba2", "state_by_request"), ("run_gdn", "gdn", "non_spec_state_indices_tensor")],
)
def test_states_follow_their_requests_across_blocks(monkeypatch, engine, layer, states):
    """Each step that moves a request into a new block copies its state there through
    ``batch_memcpy`` (request 0's from its first block to its second, request 1's from
    its hit block to its own), on a Mamba2 layer and on a GDN one; every request reads
    the state it left, and every property holds on every step."""
    a = adapter()  # before vLLM
    import vllm.v1.worker.mamba_utils as mamba_utils

    copies = []
    original = mamba_utils.batch_memcpy

    def counted(src, dst, sizes):
        copies.append(len(src))
        return original(src, dst, sizes)

    monkeypatch.setattr(mamba_utils, "batch_memcpy", counted)
    outs = run_trace(crossing(), getattr(a, engine))
    for out in outs:
        assert ref.violations(out) == []
    # Step 1, on each of the engines with a history (padded, eager) and the fresh one:
    # two requests, each two state caches (conv, SSM).
    assert copies and set(copies) == {4}
    second, third = eager(outs[1]), eager(outs[2])
    # The decode (request 0) first, then request 1's prefill after its hit.
    assert second[f"{layer}.state_left"].tolist() == [a.tag(0, 16), a.tag(1, 16)]
    assert second[f"{layer}.temporal_found"].tolist() == second[f"{layer}.state_left"].tolist()
    assert third[f"{layer}.conv_found"].tolist() == [a.tag(0, 17), a.tag(1, 20)]
    # Each reads its state in the block of its last token: its second block.
    assert len(set(second[f"{layer}.{states}"][:2].tolist())) == 2


def test_the_mutant_is_caught_on_its_smallest_trace():
    """Without the copy, the decode in the request's second block reads a block that
    holds no state; the installed engine passes the same trace."""
    a = adapter()
    trace = a.smallest_copy_skipped()
    assert a.trigger_copy_skipped(trace) and a.reach_align(trace)
    assert all(ref.violations(out) == [] for out in run_trace(trace, a.run))
    last = run_trace(trace, a.run_copy_skipped)[-1]
    found = {(v.prop, v.field) for v in ref.violations(last)}
    assert ("agreement within a build", "mamba2.temporal_found") in found
    assert ("agreement within a build", "mamba2.conv_found") in found


def test_only_the_steps_of_align_mode_are_judged():
    """A prefill chunk short of its prompt ends on a block boundary in align mode, and a
    prefix hit is whole blocks: the implementation declines other steps."""
    a = adapter()
    mid_block = Batch((0,), (10,), req_ids=(0,), pages=((1,),), new_pages=(1,),
                      prompt_lens=(20,))  # fmt: skip
    assert "_mamba_block_aligned_split" in a.declines(Case(CONFIG, mid_block))
    boundary = Batch((0,), (16,), req_ids=(0,), pages=((1,),), new_pages=(1,),
                     prompt_lens=(20,))  # fmt: skip
    assert a.declines(Case(CONFIG, boundary)) is None
    last_chunk = Batch((16,), (4,), req_ids=(0,), pages=((1, 2),), new_pages=(1,),
                       prompt_lens=(20,))  # fmt: skip
    assert a.declines_align(CONFIG, last_chunk) is None
    partial_hit = Batch((8,), (4,), req_ids=(0,), pages=((1,),), new_pages=(1,))
    assert "find_longest_cache_hit" in a.declines(Case(CONFIG, partial_hit))


def test_the_scheduler_keeps_speculative_blocks_past_the_running_one():
    """``MambaManager.allocate_new_blocks`` with two speculative blocks: a chunk that
    jumps two blocks moves the speculative block it leaves behind to the end of the
    list (the runner's row keeps it where it was: its table is append-only), and the
    next step frees the blocks before the one of the last computed token
    (``remove_skipped_blocks``)."""
    from types import SimpleNamespace

    a = adapter()
    config = EngineConfig(max_model_len=64, max_num_seqs=1, max_num_batched_tokens=32,
                          block_size=16, num_spec=2, runner="v1")  # fmt: skip
    sched = a.AlignScheduler(config)
    b0, b1, b2, b3, b4 = list(sched.free)[:5]
    null = a.NULL_BLOCK_ID

    def step(computed: int, q: int, new: bool) -> None:
        sched.step(SimpleNamespace(req_ids=(0,), is_new=(new,), num_computed_tokens=(computed,),
                                   query_lens=(q,)))  # fmt: skip

    step(0, 16, True)  # the running block, then two speculative ones
    assert sched.blocks["0"] == [b0, b1, b2] and sched.gained["0"] == [b0, b1, b2]
    step(16, 32, False)  # into block 2: b1 now lies before it, moved to the end
    assert sched.blocks["0"] == [b0, null, b2, b1, b3]
    assert sched.sent["0"] == [b0, b1, b2, b1, b3] and sched.gained["0"] == [b1, b3]
    # Into block 3 (b1, a speculative block till now): the blocks before block 2 (the
    # one of the last computed token) freed, b0; one new speculative block.
    step(48, 1, False)
    assert sched.blocks["0"] == [null, null, b2, b1, b3, b4] and b0 in sched.free
    assert sched.last_state["0"] == 2  # b2, freed at the next step


def test_a_spec_decode_moving_into_a_new_block_reads_the_accepted_drafts_state(monkeypatch):
    """With drafts (``vllm-v1-hybrid-align``) a request that accepted one of its two
    drafts, then decodes into its second block, reads there the state after the draft
    it accepted: the runner's fused pre-copy moved it from that draft's column, and its
    fused post-copy ran after each step's sampling. The mutant that hands the pre-copy
    a token bias of 0 is caught on the same trace, which the installed engine passes."""
    a = adapter()  # before vLLM
    from vllm.v1.worker.mamba_utils import MambaSpecDecodeGPUContext

    calls = Calls(monkeypatch)
    calls.count(MambaSpecDecodeGPUContext, "run_fused_precopy", "run_fused_postprocess")
    trace = a.smallest_precopy_unbiased()
    assert a.trigger_precopy_unbiased(trace) and a.reach_align_drafts(trace)
    outs = run_trace(trace, a.run_gdn)
    assert all(ref.violations(out) == [] for out in outs)
    assert calls["run_fused_precopy"] and calls["run_fused_postprocess"]
    last = eager(outs[-1])
    assert last["gdn.state_left"].tolist() == [a.tag(0, 14)]
    assert last["gdn.conv_found"].tolist() == last["gdn.temporal_found"].tolist() == [a.tag(0, 14)]
    found = {
        (v.prop, v.field) for v in ref.violations(run_trace(trace, a.run_precopy_unbiased)[-1])
    }
    assert ("agreement within a build", "gdn.temporal_found") in found
    assert ("agreement within a build", "gdn.conv_found") in found
