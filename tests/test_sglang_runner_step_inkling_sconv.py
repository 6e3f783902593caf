"""SGLang's decode graph runner step of an Inkling model (runner-step's
``sglang-inkling-sconv``): the conv-state metadata of an extend, of decodes and of a
verify written inside the graph, padding rows on the pool's dummy slot, and its mutant
caught by *safe padding*."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang.testing import (
    arrive_chunk_decode,
    arrive_then_decode,
    life,
    requires_sglang,
)
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_inkling_sconv.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_inkling_sconv

    return life(getattr(runner_step_inkling_sconv, name), trace)


def test_an_extend_then_decodes_in_the_graph_padding_on_the_dummy_slot():
    first, second, decode, alone = _life(arrive_chunk_decode())
    # Arriving: two extends of 3 and 2 tokens, no state to start from; each a working
    # slot and a ping-pong track slot of its own, never the dummy slot 0.
    assert _values(first, "eager", "sconv.query_start_loc") == [0, 3, 5]
    assert _values(first, "eager", "sconv.si") == [0, 0, 0, 1, 1]
    assert _values(first, "eager", "sconv.has_initial_state") == [0, 0]
    assert _values(first, "eager", "sconv.cache_mask") == [0, 0]
    slots = _values(first, "eager", "sconv.cache_indices")
    tracks = _values(first, "eager", "sconv.track_cache_indices")
    assert len(set(slots + tracks)) == 4 and 0 not in slots + tracks
    assert _values(first, "eager", "sconv.safe_idx") == slots
    # Too short to track: each window clamped into the step's tokens.
    assert _values(first, "eager", "sconv.track_conv_indices") == [[0, 0, 0], [0, 0, 0]]
    # Running on: both start from their states, in their slots.
    assert _values(second, "eager", "sconv.has_initial_state") == [1, 1]
    assert _values(second, "eager", "sconv.cache_indices") == slots
    # The decode of two in the graph of two, its metadata written in the graph.
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "padded", "replay"):
        assert _values(decode, how, "sconv.cache_indices") == slots, how
        assert _values(decode, how, "sconv.track_cache_indices") == tracks, how
    # The second request alone in the graph of two: its padding row gathers request row
    # 0's slot, the pool's dummy (no PAD sentinel: fused_replay_state_indices).
    for how in ("padded", "replay"):
        assert _values(alone, how, "sconv.cache_indices") == [slots[1], 0], how
        assert _values(alone, how, "sconv.safe_idx") == [slots[1], 0], how
        assert _values(alone, how, "sconv.track_cache_indices") == [tracks[1], 0], how
    # A new engine picks its own slots: no slot field in the fresh build.
    fresh = next(alone.of("fresh"))
    assert fresh.field("sconv.cache_indices") is None and fresh.field("sconv.safe_idx") is None
    for out in (first, second, decode, alone):
        assert ref.violations(out) == []


def test_a_verify_in_the_graph():
    arrive, verify = _life(arrive_then_decode(num_spec=1))
    slots = _values(arrive, "eager", "sconv.cache_indices")
    # Three requests of next_n 2 in the graph of four: the padding request on slot 0.
    assert _values(verify, "eager", "sconv.query_start_loc") == [0, 2, 4, 6]
    for how in ("padded", "replay"):
        assert _values(verify, how, "sconv.cache_indices") == slots + [0], how
        assert _values(verify, how, "sconv.si") == [0, 0, 1, 1, 2, 2, 3, 3], how
    # The decode graph keeps no track buffer under speculation.
    assert _values(verify, "eager", "sconv.has_initial_state") == [1, 1, 1]
    assert next(verify.of("eager")).field("sconv.track_cache_indices") is None
    for out in (arrive, verify):
        assert ref.violations(out) == []


@pytest.mark.parametrize("name", ["run", "run_track_unclamped"])
def test_track_windows_unclamped_fail_safe_padding(name):
    from attnfuzz.adapters.sglang import runner_step_inkling_sconv as inkling

    trace = inkling.smallest_track_unclamped()
    assert inkling.trigger_track_unclamped(trace)
    found = {(v.prop, v.field, v.build) for out in _life(trace, name) for v in ref.violations(out)}
    if name == "run":
        assert found == set()
    else:
        # One token's window reaches three tokens before it, on every engine.
        assert found == {
            ("safe padding", "sconv.track_conv_indices", "eager"),
            ("safe padding", "sconv.track_conv_indices", "fresh"),
        }
