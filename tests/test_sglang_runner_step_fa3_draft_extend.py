"""SGLang's EAGLE draft-extend graph runner on the FlashAttention 3 backend (runner-step's
``sglang-fa3-eagle-draft-extend``): the draft extend's FA3 metadata, eager, padded and
replayed, and its mutant."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref


def _extend():
    from attnfuzz.adapters.sglang import runner_step_fa3_draft_extend

    return runner_step_fa3_draft_extend


@_sglang
def test_the_draft_extend_after_a_verify_of_three_requests_replays_the_graph_of_four():
    first, verify = life(_extend().run, _arrive_then_decode(num_spec=1))
    assert ref.violations(first) == [] and ref.violations(verify) == []
    assert [b.how for b in verify.builds] == ["eager", "padded", "replay", "fresh"]
    assert verify.builds[2].where.startswith("eagle_draft_extend_cuda_graph_runner.py")
    for how in ("eager", "padded", "replay"):
        # The post-write lengths (the prefix and the verify's window of 2), each
        # request's window of queries, the window's slots written.
        assert _values(verify, how, "cache_seqlens_int32")[:3] == [7, 5, 3], how
        assert _values(verify, how, "cu_seqlens_q")[:4] == [0, 2, 4, 6], how
        assert _values(verify, how, "out_cache_loc")[:6] == [9, 10, 15, 16, 21, 22], how
        assert _values(verify, how, "kv_len")[:3] == [7, 5, 3], how
    # The padding request: the fill length 1, a window of queries, its writes to slot 0.
    assert _values(verify, "replay", "cache_seqlens_int32")[3:] == [1]
    assert _values(verify, "replay", "cu_seqlens_q")[4:] == [8]
    assert _values(verify, "replay", "out_cache_loc")[6:] == [0, 0]


@_sglang
def test_the_mutant_fails_its_properties_on_its_smallest_trace():
    """The correct engine holds every property on the trace; the mutant's replay hands
    the kernel one query a request: its cu_seqlens_q differ from the eager ones."""
    extend = _extend()
    trace = extend.smallest_window_forgotten()
    assert extend.reach_draft_extend_replay(trace)
    assert all(ref.violations(out) == [] for out in life(extend.run, trace))
    *_, out = life(extend.run_window_forgotten, trace)
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    assert found == {
        ("padding invariance", "padded", "cu_seqlens_q"),
        ("replay equals eager", "replay", "cu_seqlens_q"),
    }


@_sglang
def test_the_graph_s_in_graph_metadata_runs_at_capture_and_at_each_replay(monkeypatch):
    """FA3 writes a draft extend's metadata in the graph (init_forward_metadata_in_graph):
    the graph stand-in runs that body at each capture and again at each replay."""
    extend = _extend()
    extend.prepare()
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

    calls = []
    real = FlashAttentionBackend.init_forward_metadata_in_graph

    def counted(self, forward_batch):
        calls.append(forward_batch.forward_mode.is_draft_extend_v2())
        return real(self, forward_batch)

    monkeypatch.setattr(FlashAttentionBackend, "init_forward_metadata_in_graph", counted)
    first, verify = life(extend.run, _arrive_then_decode(num_spec=1))
    captures = sum(b.how == "capture" for b in first.builds)
    assert captures > 0 and calls[:captures] == [True] * captures
    assert len(calls) == captures + 1  # the verify's draft extend, replayed once
    assert ref.violations(verify) == []


@_sglang
def test_an_engine_s_capture_reads_its_own_width_after_another_engine_s():
    """SGLang shares graph runners' input buffers process-wide by name and size
    (share_input_buffer), which one server's runners may; an engine of another config,
    here one of a wider draft window made first in this process, is another server:
    the later engine's capture reads its own window (2), not the earlier one's (4)."""
    from attnfuzz.reference.batch import Batch, EngineConfig
    from attnfuzz.reference.trace import Trace

    def arrive(num_spec: int) -> Trace:
        config = EngineConfig(max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16,
                              block_size=16, num_spec=num_spec,
                              cudagraph_capture_sizes=(num_spec + 1,))  # fmt: skip
        step = Batch((0,), (1,), 0, True, req_ids=(0,), pages=((1,),), new_pages=(1,))
        return Trace(config, (step,))

    extend = _extend()
    (wide,) = life(extend.run, arrive(3))
    (narrow,) = life(extend.run, arrive(1))
    assert _values(wide, "capture", "cu_seqlens_q") == [0, 4]
    assert _values(narrow, "capture", "cu_seqlens_q") == [0, 2]
    assert ref.violations(narrow) == []
