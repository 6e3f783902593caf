"""SGLang's EAGLE draft graph runner on the FlashAttention 3 multi-step draft backend
(runner-step's ``sglang-fa3-eagle-draft``): each draft step's FA3 metadata, eager,
padded and replayed, and its mutant."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace


def _draft():
    from attnfuzz.adapters.sglang import runner_step_fa3_draft

    return runner_step_fa3_draft


@_sglang
def test_the_draft_after_a_verify_of_three_requests_replays_the_graph_of_five():
    trace = _arrive_then_decode(num_spec=2)
    first, verify = life(_draft().run, trace)
    assert ref.violations(first) == [] and ref.violations(verify) == []
    assert [b.how for b in verify.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "padded", "replay"):
        # The committed prefix and the root (num_computed + 1), the draft's write slots
        # (the first two of the verify's window), and the one attending step's KV: the
        # prefix and the first draft token written.
        assert _values(verify, how, "seq_lens")[:3] == [6, 4, 2], how
        assert _values(verify, how, "out_cache_loc")[:3] == [[10, 11], [16, 17], [22, 23]], how
        assert _values(verify, how, "cache_seqlens_int32.0")[:3] == [7, 5, 3], how
        assert [row[:2] for row in _values(verify, how, "page_table.0")[:3]] == [
            [1, 2],
            [3, 4],
            [5, 0],
        ], how
        assert _values(verify, how, "kv_slots.0")[0][:8] == [4, 5, 6, 7, 8, 9, 10, 0], how
    # The padding requests: the fill length 1 and its step's draft token, on the
    # reserved row 0 (the padding page 0); their writes go to slot 0.
    assert _values(verify, "replay", "cache_seqlens_int32.0")[3:] == [2, 2]
    assert _values(verify, "replay", "out_cache_loc")[3:] == [[0, 0], [0, 0]]
    assert _values(verify, "replay", "cu_seqlens_q.0") == [0, 1, 2, 3, 4, 5]


@_sglang
def test_the_mutant_fails_its_properties_on_its_smallest_trace():
    """The correct engine holds every property on the trace; the mutant's graph reads the
    second draft step's KV one token short: its cache_seqlens differ from the eager ones."""
    draft = _draft()
    trace = draft.smallest_step_not_advanced()
    assert draft.trigger_step_not_advanced(trace)
    assert all(ref.violations(out) == [] for out in life(draft.run, trace))
    *_, out = life(draft.run_step_not_advanced, trace)
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    assert {
        ("padding invariance", "padded", "cache_seqlens_int32.1"),
        ("replay equals eager", "replay", "cache_seqlens_int32.1"),
        ("replay equals eager", "replay", "kv_slots.1"),
    } <= found
    assert not any(v.field.endswith(".0") for v in ref.violations(out))  # the first step's


def test_where_the_mutant_reaches_and_what_is_declined():
    draft = _draft()
    trace = draft.smallest_step_not_advanced()
    assert draft.reach_draft_replay(trace) and draft.trigger_step_not_advanced(trace)
    two = Trace(dataclasses.replace(trace.config, num_spec=2), trace.steps)
    assert not draft.trigger_step_not_advanced(two)  # one attending step
    one = Case(dataclasses.replace(trace.config, num_spec=1), ())
    assert "speculative_num_steps <= 1" in draft.declines(one)
