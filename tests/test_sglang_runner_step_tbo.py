"""SGLang's decode graph runner step under two-batch overlap (runner-step's
``sglang-tbo``): the scheduler's split, the two micro-batches' metadata eager and at
replay, each held to the step cut to its tokens, and the two-chunk split's mutant."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import arrive_then_decode, life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref


def _builds(out, how: str) -> list[dict]:
    return [
        {"first": b.first_token, "reqs": b.num_reqs, "tokens": b.num_tokens,
         **{f.name: f.values.tolist() for f in b.fields}}
        for b in out.builds if b.how == how
    ]  # fmt: skip


@_sglang
def test_an_uneven_extend_is_split_inside_a_request_and_each_half_reads_its_keys():
    """Three requests arrive with 5, 3 and 1 tokens: the balanced split (5 | 4) is too
    uneven, so SGLang cuts the first request's query at the half (4 tokens): the first
    micro-batch holds its first 4 tokens, the second its 5th (after a prefix of 4) and
    the two other requests."""
    from attnfuzz.adapters.sglang import runner_step_tbo

    arrive, _ = life(runner_step_tbo.run, arrive_then_decode(num_spec=0))
    first, second = _builds(arrive, "microbatch")
    assert (first["first"], first["reqs"], first["tokens"]) == (0, 1, 4)
    assert first["kv_len"] == [4] and first["query_start_loc"] == [0, 4]
    assert (second["first"], second["reqs"], second["tokens"]) == (4, 3, 5)
    assert second["kv_len"] == [5, 3, 1] and second["query_start_loc"] == [0, 1, 4, 5]
    assert second["kv_slots"][0][:5] == _builds(arrive, "eager")[0]["kv_slots"][0][:5]
    assert ref.violations(arrive) == []


@_sglang
def test_a_replay_splits_the_padded_batch_at_its_half_padding_row_included():
    """Three requests decode in the graph of four: the replay splits the padded batch
    two and two (compute_split_indices_for_cuda_graph_replay), the second micro-batch
    holding the last request and the padding row; eagerly the split is one and two."""
    from attnfuzz.adapters.sglang import runner_step_tbo

    _, step = life(runner_step_tbo.run, arrive_then_decode(num_spec=0))
    assert [b.how for b in step.builds] == [
        "eager", "microbatch", "microbatch", "padded", "replay", "microbatch", "microbatch",
        "fresh",
    ]  # fmt: skip
    eager_a, eager_b, padded_a, padded_b = _builds(step, "microbatch")
    assert (eager_a["reqs"], eager_b["reqs"]) == (1, 2)
    assert (padded_a["first"], padded_a["reqs"], padded_a["kv_len"]) == (0, 2, [6, 4])
    assert (padded_b["first"], padded_b["reqs"], padded_b["seq_lens"]) == (2, 1, [2, 1])
    assert ref.violations(step) == []


@_sglang
def test_a_verify_replays_under_the_scheduler_s_decode_vote():
    """At the scheduler a verify is a decode: its vote lets the graph replay it, split
    two and two, each request's window in its micro-batch."""
    from attnfuzz.adapters.sglang import runner_step_tbo

    _, verify = life(runner_step_tbo.run, arrive_then_decode(num_spec=1))
    assert "replay" in [b.how for b in verify.builds]
    *_, padded_a, padded_b = _builds(verify, "microbatch")
    assert padded_a["kv_len"] == [7, 5] and padded_a["query_start_loc"] == [0, 2, 4]
    assert (padded_b["first"], padded_b["reqs"], padded_b["tokens"]) == (4, 1, 2)
    assert ref.violations(verify) == []


@_sglang
def test_the_two_chunk_prefix_forgotten_fails_micro_batch_agreement():
    from attnfuzz.adapters.sglang import runner_step_tbo

    trace = runner_step_tbo.smallest_two_chunk_prefix_forgotten()
    assert runner_step_tbo.reach_extend(trace)
    assert runner_step_tbo.trigger_two_chunk_prefix_forgotten(trace)
    assert all(ref.violations(out) == [] for out in life(runner_step_tbo.run, trace))
    (out,) = life(runner_step_tbo.run_two_chunk_prefix_forgotten, trace)
    found = {(v.prop, v.field) for v in ref.violations(out)}
    assert found == {("micro-batch agreement", "kv_len"), ("micro-batch agreement", "kv_slots")}


@_sglang
def test_the_moe_flags_are_put_back_after_a_step():
    """Two-batch overlap's MoE flags are the process's: another engine here runs
    without them after a step under them."""
    from attnfuzz.adapters.sglang import runner_step_tbo

    runner_step_tbo.prepare()
    from sglang.srt.layers.moe.utils import is_tbo_enabled

    before = is_tbo_enabled()
    life(runner_step_tbo.run, arrive_then_decode(num_spec=0))
    assert is_tbo_enabled() == before is False


def test_configs_whose_decode_graphs_two_batch_overlap_cannot_capture_are_declined():
    """No even decode graph batch size up to max_running_requests rounded up to even:
    get_batch_sizes_to_capture asserts. One above max_num_seqs (an odd bound rounded
    up): the capture overflows the Triton backend's buffers (not yet triaged)."""
    from attnfuzz.adapters.sglang import runner_step_tbo
    from attnfuzz.adapters.sglang.runner_step import graph_batch_sizes
    from attnfuzz.harness.testing import spec_config
    from attnfuzz.reference.batch import Batch, Case

    def case(**config) -> Case:
        return Case(spec_config(**config), Batch((0,), (1,), 0, True))

    none_left = case(num_spec=0, max_num_seqs=1, cudagraph_capture_sizes=(1,))
    assert graph_batch_sizes(none_left.config, alignment=2) == []
    assert "get_batch_sizes_to_capture" in runner_step_tbo.declines(none_left)
    rounded_up = case(num_spec=0, max_num_seqs=3, cudagraph_capture_sizes=(2, 8))
    assert graph_batch_sizes(rounded_up.config, alignment=2) == [2, 4]
    assert "overflows" in runner_step_tbo.declines(rounded_up)
    assert runner_step_tbo.declines(case(num_spec=1, max_num_seqs=4,
                                         cudagraph_capture_sizes=(4, 16))) is None  # fmt: skip
    eager = case(num_spec=0, max_num_seqs=1, cudagraph_capture_sizes=(1,),
                 cudagraph_mode="NONE")  # fmt: skip
    assert runner_step_tbo.declines(eager) is None


@_sglang
def test_a_capture_above_the_request_pool_overflows_the_triton_backend():
    """What the second refusal above stands on: a graph of 4 requests over a pool of 3
    (max_num_seqs 3, a capture size of 8 asked) fails its capture in the Triton backend."""
    import pytest
    from attnfuzz.adapters.sglang import runner_step_tbo
    from attnfuzz.reference.batch import Batch, EngineConfig
    from attnfuzz.reference.trace import Trace

    config = EngineConfig(max_model_len=4, max_num_seqs=3, max_num_batched_tokens=4,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2, 8))  # fmt: skip
    arrive = Batch((0,), (3,), 0, True, req_ids=(0,), pages=((1, 2, 3),), new_pages=(3,))
    with pytest.raises(Exception, match="must match the existing size"):
        life(runner_step_tbo.run, Trace(config, (arrive,)))


@_sglang
def test_a_two_chunk_cut_on_a_request_boundary_leaves_an_empty_row_that_reads_nothing():
    """Two requests of 2 and 3 tokens: the cut at the half (2 tokens) lands on their
    boundary; SGLang's first micro-batch still holds the second request, with no token
    and a length of 0: not a real row (it computes nothing), and in range for an
    extend's kernels."""
    from attnfuzz.adapters.sglang import runner_step_tbo
    from attnfuzz.reference.batch import Batch, EngineConfig
    from attnfuzz.reference.trace import Trace

    config = EngineConfig(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16,
                          block_size=16, num_spec=0, cudagraph_capture_sizes=(2, 4, 8))  # fmt: skip
    arrive = Batch((0, 0), (2, 3), 0, True, req_ids=(1, 2), pages=((1,), (2,)),
                   new_pages=(1, 1))  # fmt: skip
    (out,) = life(runner_step_tbo.run, Trace(config, (arrive,)))
    first, second = _builds(out, "microbatch")
    assert first["reqs"] == 1 and first["seq_lens"] == [2, 0]
    assert first["query_start_loc"] == [0, 2, 2]
    assert (second["first"], second["reqs"], second["kv_len"]) == (2, 1, [3])
    assert ref.violations(out) == []
