"""vLLM 0.33.0's V2 runner of an MLA model with prefill context parallelism
(``vllm-pcp``): each of two ranks is a runner of its own whose ``PCPManager`` cuts the
step; every segment a rank runs is held, as a micro-batch, to the unpartitioned step,
and the ranks' segments together to each of its tokens once; a mutant of the partition
caught."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm, run_trace
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

CONFIG = EngineConfig(
    max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32, block_size=16,
    num_spec=0, cudagraph_capture_sizes=(4, 8), cudagraph_mode="FULL_AND_PIECEWISE",
    runner="v2",
)  # fmt: skip


def adapter():
    from attnfuzz.adapters.vllm import runner_step_pcp

    return runner_step_pcp


def prefills_then_decodes() -> Trace:
    """Two requests prefill 9 and 3 tokens, then both decode (a FULL decode graph on
    each rank), then a third arrives and prefills 5 beside their decodes."""
    return Trace(
        CONFIG,
        (
            Batch((0, 0), (9, 3), req_ids=(1, 2), pages=((1,), (2,)), new_pages=(1, 1)),
            Batch((9, 3), (1, 1), req_ids=(1, 2), pages=((1,), (2,)), new_pages=(0, 0)),
            Batch((10, 4, 0), (1, 1, 5), req_ids=(1, 2, 3), pages=((1,), (2,), (3,)),
                  new_pages=(0, 0, 1)),
        ),
    )  # fmt: skip


def segments(out: ref.RunnerStepOutputs) -> list[tuple[int, int]]:
    return sorted((b.first_token, b.num_tokens) for b in out.of("microbatch") if b.num_tokens)


def test_the_ranks_segments_tile_the_step(monkeypatch):
    """Each rank's runner partitions every step itself (``partition_batch`` once a rank
    and step, beside the kernel warm-up's); the prefills are cut in four chunks, rank 0
    holding the first and the last, each decode runs on one rank; the segments of both
    ranks, one partition, tile the step and every property holds."""
    a = adapter()  # before vLLM
    import vllm.v1.worker.gpu.pcp_manager as pm

    calls = Calls(monkeypatch)
    calls.count(pm.PCPManager, "partition_batch", "restore_for_sampling")
    outs = run_trace(prefills_then_decodes(), a.run)
    for out in outs:
        assert ref.violations(out) == []
    # The kernel warm-up's steps of each rank run through it too.
    assert calls["partition_batch"] >= 2 * 3 and calls["restore_for_sampling"] >= 2 * 2
    # Step 0 in the runner's order: request 2 (tokens 0-2), then request 1 (3-11). Rank
    # 0: request 2's first token, request 1's first chunk of three; rank 1 the middle.
    assert segments(outs[0]) == [(0, 1), (1, 1), (2, 1), (3, 3), (6, 3), (9, 3)]
    # Step 1: two decodes, one on each rank.
    assert segments(outs[1]) == [(0, 1), (1, 1)]
    assert {b.partition for b in outs[1].of("microbatch")} == {"pcp"}
    wholes = [b for b in outs[1].of("microbatch") if not b.num_tokens]
    assert len(wholes) == 2 and all(b.first_token == 2 for b in wholes)


def test_the_mutant_is_caught_on_its_smallest_trace():
    """Chunks rounded down leave the last token of a 5-token prefill on no rank: only
    the tiling of the micro-batches sees it; the installed engine passes the trace."""
    a = adapter()
    trace = a.smallest_chunks_rounded_down()
    assert a.trigger_chunks_rounded_down(trace) and a.reach_pcp(trace)
    assert all(ref.violations(out) == [] for out in run_trace(trace, a.run))
    (v,) = ref.violations(run_trace(trace, a.run_chunks_rounded_down)[-1])
    assert (v.prop, v.detail) == ("micro-batch agreement", "tokens [4, 5) of eager in none "
                                  "of its micro-batches")  # fmt: skip


def test_a_prefill_whose_length_divides_does_not_trigger():
    """A query of 8 tokens is cut in four whole chunks: the mutant's rounding changes
    nothing, and its trigger says so; a decode never triggers."""
    a = adapter()
    even = Trace(CONFIG, (Batch((0,), (8,), req_ids=(1,), pages=((1,),), new_pages=(1,)),))
    assert not a.trigger_chunks_rounded_down(even)
    assert all(ref.violations(out) == [] for out in run_trace(even, a.run_chunks_rounded_down))


@pytest.mark.parametrize("mode", ["FULL"])
def test_full_graphs_are_declined(mode):
    """PCP takes full graphs of decode-only routines only (``validate_config``)."""
    a = adapter()
    config = EngineConfig(**{**CONFIG.__dict__, "cudagraph_mode": mode})
    step = Batch((0,), (4,), req_ids=(1,), pages=((1,),), new_pages=(1,))
    assert "validate_config" in a.declines(Case(config, step))


def test_a_step_no_rank_runs_is_reported_not_raised():
    """Under the mutant a 3-token prefill is cut in chunks of no token: every rank has
    nothing to run and its runner returns before any forward (``execute_model``: no
    rank has a token); the step's tokens are then in no micro-batch."""
    a = adapter()
    trace = Trace(CONFIG, (Batch((0,), (3,), req_ids=(1,), pages=((1,),), new_pages=(1,)),))
    (out,) = run_trace(trace, a.run_chunks_rounded_down)
    assert not [b for b in out.of("microbatch") if b.num_tokens]
    (v,) = ref.violations(out)
    assert v.detail == "tokens [0, 3) of eager in none of its micro-batches"
