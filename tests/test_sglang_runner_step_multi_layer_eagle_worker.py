"""SGLang's multi-layer EAGLE v2 worker's own step (runner-step's
``sglang-multi-layer-eagle-worker``): a hand trace with every layer's builds and the
verify's acceptance, and a wrong slot in a layer's replay caught."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import eagle_worker_life, requires_sglang
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang  # the sglang mark, and the skip where SGLang is absent
WORKER = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
TRITON = "sglang.srt.layers.attention.triton_backend"


def _arrive_then_verify() -> Trace:
    """Three requests arrive (an extend), then verify together, rejecting 1, 0 and 2 of
    their drafts: three requests in the graphs of four, two draft layers."""
    config = spec_config(num_spec=2, max_num_seqs=4, cudagraph_capture_sizes=(3, 6, 12))
    w = config.next_n
    pages, ids = ((1, 2), (3, 4), (5, 6)), (0, 1, 2)
    arrive = Batch((0, 0, 0), (5, 3, 1), 0, True, req_ids=ids, pages=pages, new_pages=(2, 2, 2))
    verify = Batch((5, 3, 1), (w, w, w), 0, True, req_ids=ids, pages=pages,
                   new_pages=(0, 0, 0), rejected=(1, 0, 2))  # fmt: skip
    return Trace(config, (arrive, verify))


def _life(trace: Trace, monkeypatch):
    """Every step of ``trace`` on one new engine: the outputs, each verify's accept
    lengths, and the modes of the batches the worker's step was handed."""
    import importlib

    from attnfuzz.adapters.sglang import runner_step_multi_layer_eagle_worker as m

    m.prepare()
    worker = importlib.import_module(WORKER).MultiLayerEagleWorkerV2
    return eagle_worker_life(m.run, worker, trace, monkeypatch)


def test_each_draft_layer_of_the_worker_s_step_is_built_and_the_verify_accepts(monkeypatch):
    """The extend: the target's and each layer's draft extend for prefill; the verify:
    the target verify and each layer's draft extend, eager, padded and replayed in the
    graph of four, and fresh. The verify accepts the drafts the step does not reject."""
    (first, second), accepted, modes = _life(_arrive_then_verify(), monkeypatch)
    assert [b.name for b in first.builds if b.how != "capture"] == [
        "eager", "eager.draft0", "eager.draft1", "fresh", "fresh.draft0", "fresh.draft1"
    ]  # fmt: skip
    assert {b.name for b in first.of("capture")} == {"capture", "capture.draft0",
                                                     "capture.draft1"}  # fmt: skip
    assert [b.name for b in second.builds] == [
        "eager", "eager.draft0", "eager.draft1", "padded", "replay",
        "padded.draft0", "replay.draft0", "padded.draft1", "replay.draft1",
        "fresh", "fresh.draft0", "fresh.draft1",
    ]  # fmt: skip
    for name in ("padded.draft1", "replay.draft1"):
        b = next(b for b in second.builds if b.name == name)
        # The post-write length num_computed + next_n; the padding request: the fill 1.
        assert b.field("seq_lens").values.tolist() == [8, 6, 4, 1], name
    assert accepted == [[2, 3, 1]] * 3  # 3 - rejected, the bonus token in
    # MultiLayerEagleWorkerV2.forward_batch_generation ran each: the scheduler's extend
    # batch on both engines, then its decode batch on the three passes.
    assert modes == ["EXTEND"] * 2 + ["DECODE"] * 3
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_a_wrong_slot_in_a_layer_s_replay_is_caught(monkeypatch):
    """A slot planted in the persistent kv_indices after each layer's draft-extend
    replay preparation: each layer's replay and padded build differ from its eager one."""
    import importlib

    from attnfuzz.adapters.sglang import runner_step_multi_layer_eagle_worker as m

    m.prepare()
    TritonAttnBackend = importlib.import_module(TRITON).TritonAttnBackend
    own = TritonAttnBackend.init_forward_metadata_out_graph

    def planted(self, forward_batch, in_capture=False):
        own(self, forward_batch, in_capture=in_capture)
        if not in_capture and forward_batch.forward_mode.is_draft_extend_v2():
            self.cuda_graph_kv_indices[1] += 1  # request 0's second prefix slot

    monkeypatch.setattr(TritonAttnBackend, "init_forward_metadata_out_graph", planted)
    _, second = _life(_arrive_then_verify(), monkeypatch)[0]
    found = {(v.prop, v.field, v.build) for v in ref.violations(second)}
    assert found == {
        (prop, field, f"{how}.draft{layer}")
        for prop, how in (("padding invariance", "padded"), ("replay equals eager", "replay"))
        for field in ("kv_indices", "kv_slots")
        for layer in (0, 1)
    }
