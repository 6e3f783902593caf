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
