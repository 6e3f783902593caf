"""SGLang's multi-layer EAGLE draft extend (runner-step's ``sglang-multi-layer-eagle``):
hand traces, its mutant's smallest trace and its declines."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang  # the sglang mark, and the skip where SGLang is absent


def _step(computed, q_lens, req_ids, pages, new_pages) -> Batch:
    return Batch(computed, q_lens, 0, True, req_ids=req_ids, pages=pages, new_pages=new_pages)


def _arrive_then_verify(num_spec: int = 2) -> Trace:
    """Three requests arrive (an extend), then verify together: the draft extend of
    three requests in the graph of four."""
    config = spec_config(num_spec=num_spec, max_num_seqs=4, cudagraph_capture_sizes=(3, 6, 12))
    w = config.next_n
    pages = ((1, 2), (3, 4), (5, 6))
    return Trace(
        config,
        (
            _step((0, 0, 0), (5, 3, 1), (0, 1, 2), pages, (2, 2, 2)),
            _step((5, 3, 1), (w, w, w), (0, 1, 2), pages, (0, 0, 0)),
        ),
    )


def _life(trace: Trace, mutant: bool = False) -> list[ref.RunnerStepOutputs]:
    from attnfuzz.adapters.sglang import runner_step_multi_layer_eagle as m

    run = m.run_accept_length_layout if mutant else m.run
    run.new_engine()
    return [run(ref.make_inputs(case)) for case in trace.cases()]


def _values(build: ref.StepBuild, name: str) -> list:
    f = build.field(name)
    assert f is not None, name
    return f.values.tolist()


def test_each_draft_layer_replays_the_graph_of_four_for_three_requests():
    """Two draft layers, each its own backend and graphs: the padded replay of each
    agrees with its layer's eager build, the padding request row 0 at the fill 1."""
    first, second = _life(_arrive_then_verify(num_spec=2))
    w = 3
    assert sorted((b.draft or 0, len(_values(b, "seq_lens"))) for b in first.of("capture")) == [
        (0, 1), (0, 2), (0, 4), (1, 1), (1, 2), (1, 4)
    ]  # fmt: skip
    names = [b.name for b in second.builds]
    # The first layer's builds are the step's own; the second layer's its sub-step 1.
    assert names == ["eager", "eager.draft1", "padded", "replay",
                     "padded.draft1", "replay.draft1", "fresh", "fresh.draft1"]  # fmt: skip
    for b in list(second.of("padded")) + list(second.of("replay")):
        assert (b.num_reqs, b.num_tokens) == (3, 3 * w)
        # The post-write length num_computed + next_n; the padding request: the fill 1.
        assert _values(b, "seq_lens") == [5 + w, 3 + w, 1 + w, 1], b.name
        assert _values(b, "req_pool_indices")[3] == 0, b.name
        assert _values(b, "qo_indptr") == [0, w, 2 * w, 3 * w, 4 * w], b.name
        assert _values(b, "kv_indptr") == [0, 5, 8, 9, 9], b.name
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_a_batch_past_the_capture_sizes_runs_every_layer_eagerly():
    """Three requests, graphs of one request only: no replay, each layer's eager build."""
    trace = _arrive_then_verify(num_spec=2)
    config = dataclasses.replace(trace.config, cudagraph_capture_sizes=(3,))
    _, second = _life(Trace(config, trace.steps))
    assert [b.name for b in second.builds] == [
        "eager", "eager.draft1", "fresh", "fresh.draft1"
    ]  # fmt: skip
    assert ref.violations(second) == []


def test_the_accept_length_layout_is_caught_on_its_smallest_trace():
    from attnfuzz.adapters.sglang import runner_step_multi_layer_eagle as m

    trace = m.smallest_accept_length_layout()
    assert m.trigger_accept_length_layout(trace)
    assert all(ref.violations(o) == [] for o in _life(trace))
    found = {(v.prop, v.field, v.build) for o in _life(trace, mutant=True)
             for v in ref.violations(o)}  # fmt: skip
    assert ("padding invariance", "kv_indptr", "padded") in found
    assert ("replay equals eager", "kv_slots", "replay") in found


def test_a_config_without_drafts_is_declined():
    from attnfuzz.adapters.sglang.runner_step_multi_layer_eagle import declines

    config = spec_config(num_spec=0, max_num_seqs=8, cudagraph_capture_sizes=(2, 4))
    why = declines(Case(config, Batch((5,), (1,), seed=1)))
    assert why is not None and "no draft extend" in why
    assert declines(Case(_arrive_then_verify(1).config, Batch((5,), (2,), seed=1))) is None


@pytest.mark.slow
def test_a_derandomized_search_passes():
    from attnfuzz.harness.registry import get_target
    from hypothesis import HealthCheck, given, settings

    target = get_target("runner-step")
    impl = target.resolve("sglang-multi-layer-eagle")

    @settings(max_examples=5, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(target.traces(impl=impl))
    def search(trace: Trace) -> None:
        verdict = target.judge_trace(impl, trace)
        assert verdict.ok, verdict

    search()
