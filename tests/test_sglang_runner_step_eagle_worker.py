"""SGLang's EAGLE v2 worker's own step (runner-step's ``sglang-eagle-worker``): a hand
trace with every sub-step's builds, the verify's acceptance, and its mutant's smallest
trace."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang.testing import eagle_worker_life, requires_sglang
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang  # the sglang mark, and the skip where SGLang is absent
WORKER = "sglang.srt.speculative.eagle_worker_v2"
DECODE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"


def _step(computed, q_lens, req_ids, pages, new_pages, rejected=()) -> Batch:
    return Batch(computed, q_lens, 0, True, req_ids=req_ids, pages=pages, new_pages=new_pages,
                 rejected=rejected)  # fmt: skip


def _arrive_then_verify(rejected=()) -> Trace:
    """Three requests arrive (an extend), then verify together: three requests in the
    graphs of four, each draft of two steps."""
    config = spec_config(num_spec=2, max_num_seqs=4, cudagraph_capture_sizes=(3, 6, 12))
    w = config.next_n
    pages = ((1, 2), (3, 4), (5, 6))
    return Trace(
        config,
        (
            _step((0, 0, 0), (5, 3, 1), (0, 1, 2), pages, (2, 2, 2)),
            _step((5, 3, 1), (w, w, w), (0, 1, 2), pages, (0, 0, 0), rejected),
        ),
    )


def _life(trace: Trace, monkeypatch, mutant=None):
    """Every step of ``trace`` on one new engine (of ``mutant``, if given): the outputs,
    each verify's accept lengths, and the modes of the batches the worker's step was
    handed (:func:`eagle_worker_life`)."""
    import importlib

    from attnfuzz.adapters.sglang import runner_step_eagle_worker as m

    m.prepare()
    worker = importlib.import_module(WORKER).EAGLEWorkerV2
    run = mutant or m.run
    return eagle_worker_life(run, worker, trace, monkeypatch, recompiled=mutant is not None)


def test_the_worker_s_step_builds_every_sub_step_and_accepts_the_step_s_drafts(monkeypatch):
    """The extend: the target's and the draft extend for prefill; the verify: the draft,
    the target verify and the draft extend, each eager, padded and replayed in the
    graph of four, and fresh. The verify accepts each request's drafts less the ones
    the step rejects."""
    (first, second), accepted, modes = _life(_arrive_then_verify(rejected=(1, 0, 2)), monkeypatch)
    assert [b.name for b in first.builds if b.how != "capture"] == [
        "eager", "eager.draft1", "fresh", "fresh.draft1"
    ]  # fmt: skip
    assert {b.name for b in first.of("capture")} == {"capture", "capture.draft0",
                                                     "capture.draft1"}  # fmt: skip
    assert [b.name for b in second.builds] == [
        "eager.draft0", "eager", "eager.draft1",
        "padded.draft0", "replay.draft0", "padded", "replay", "padded.draft1", "replay.draft1",
        "fresh.draft0", "fresh", "fresh.draft1",
    ]  # fmt: skip
    replay = next(b for b in second.builds if b.name == "replay.draft0")
    # Page size 4: each draft writes keys c and c + 1; the padding row slot 0.
    assert replay.field("out_cache_loc").values.tolist() == [[9, 10], [15, 16], [21, 22], [0, 0]]
    # The last attending draft step reads the prefix and its first draft's key.
    assert replay.field("kv_len").values.tolist() == [6, 4, 2, 1]
    # The eager pass, the graphs' and the fresh engine's: 3 - rejected, the bonus token in.
    assert accepted == [[2, 3, 1]] * 3
    # EAGLEWorkerV2.forward_batch_generation ran each: the scheduler's extend batch on
    # both engines, then its decode batch on the three passes.
    assert modes == ["EXTEND"] * 2 + ["DECODE"] * 3
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_the_verify_runs_in_the_decode_graph_after_its_planned_load(monkeypatch):
    """``eagle_prepare_for_verify`` plans the verify through the decode graph runner's
    ``load_batch``; the target's forward (``ModelRunner._forward_raw``) then runs the
    runner's ``execute``, whose ``load_batch`` finds the metadata planned and copies
    the replay's inputs: in the graphs' pass only, load, then execute and its load."""
    import importlib

    from attnfuzz.adapters.sglang import runner_step_eagle_worker as m

    m.prepare()
    runner = importlib.import_module(DECODE).DecodeCudaGraphRunner
    calls = []
    for name in ("load_batch", "execute"):
        own = getattr(runner, name)

        def counted(self, fb, *args, _own=own, _name=name, **kwargs):
            if type(self) is runner:  # the target's, not a draft runner's
                calls.append((_name, fb.forward_metadata_ready))
            return _own(self, fb, *args, **kwargs)

        monkeypatch.setattr(runner, name, counted)
    (_, second), _, _ = _life(_arrive_then_verify(rejected=(1, 0, 2)), monkeypatch)
    assert calls == [("load_batch", False), ("execute", True), ("load_batch", True)]
    assert ref.violations(second) == []


def test_stale_draft_slots_in_padding_rows_are_caught(monkeypatch):
    """The mutant's smallest trace: request 1 verifies alone in the draft graph of two
    after both verified in it; the padding row keeps request 1's earlier draft slots,
    keys it reads. Without rejected drafts named, every verify accepts all."""
    from attnfuzz.adapters.sglang import runner_step_eagle_worker as m

    trace = m.smallest_stale_draft_slots()
    assert m.trigger_stale_draft_slots(trace) and m.reach_stale_draft_slots(trace)
    outs, accepted, _ = _life(trace, monkeypatch, mutant=m.run_stale_draft_slots)
    assert accepted == [[3, 3]] * 3 + [[3]] * 3
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {
        ("padding writes no real KV", "out_cache_loc", "padded.draft0"),
        ("padding writes no real KV", "out_cache_loc", "replay.draft0"),
        ("padding writes no real KV", "out_cache_loc.step0", "replay.draft0"),
    }


@pytest.mark.slow
def test_the_mutant_s_smallest_trace_passes_on_the_worker(monkeypatch):
    from attnfuzz.adapters.sglang import runner_step_eagle_worker as m

    outs, _, _ = _life(m.smallest_stale_draft_slots(), monkeypatch)
    assert [v for out in outs for v in ref.violations(out)] == []


def test_a_draft_extend_of_the_next_round_s_seq_lens_is_caught(monkeypatch):
    """The mutant's smallest trace: one request verifies alone in the graphs of one; the
    worker's step hands the draft extend the committed lengths after the verify, and
    the draft-extend graph's reads run past the verify's tokens (the eager backend's
    do not read seq_lens)."""
    from attnfuzz.adapters.sglang import runner_step_eagle_worker as m

    trace = m.smallest_advanced_draft_extend()
    assert m.trigger_advanced_draft_extend(trace)
    outs, accepted, _ = _life(trace, monkeypatch, mutant=m.run_advanced_draft_extend)
    assert accepted == [[3]] * 3
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {
        (prop, field, build)
        for prop, build in (("padding invariance", "padded.draft1"),
                            ("replay equals eager", "replay.draft1"))
        for field in ("kv_indptr", "kv_len", "kv_slots")
    }  # fmt: skip


@pytest.mark.slow
def test_the_advanced_mutant_s_smallest_trace_passes_on_the_worker(monkeypatch):
    from attnfuzz.adapters.sglang import runner_step_eagle_worker as m

    outs, _, _ = _life(m.smallest_advanced_draft_extend(), monkeypatch)
    assert [v for out in outs for v in ref.violations(out)] == []
