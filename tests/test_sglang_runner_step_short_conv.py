"""SGLang's decode graph runner step of a short-conv hybrid model (runner-step's
``sglang-hybrid-short-conv``): the conv layers' handle in each build, the graph's slot
buffer refilled in place, and its mutant caught by *replay equals eager*."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang.testing import arrive_chunk_decode, life, requires_sglang
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_short_conv.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_short_conv

    return life(getattr(runner_step_short_conv, name), trace)


def test_the_conv_handle_of_an_extend_and_of_decodes_in_the_graph():
    first, second, decode, alone = _life(arrive_chunk_decode())
    # Arriving: two extends of 3 and 2 tokens, no state to start from.
    assert _values(first, "eager", "short_conv.query_start_loc") == [0, 3, 5]
    assert _values(first, "eager", "short_conv.has_initial_state") == [0, 0]
    slots = _values(first, "eager", "short_conv.cache_indices")
    assert len(set(slots)) == 2 and 0 not in slots  # slot 0 is the pool's dummy
    # Running on: both start from their states, in their slots.
    assert _values(second, "eager", "short_conv.has_initial_state") == [1, 1]
    assert _values(second, "eager", "short_conv.cache_indices") == slots
    # The decode of two in the graph of two; a decode has no initial-state flags.
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "padded", "replay"):
        assert _values(decode, how, "short_conv.cache_indices") == slots, how
    # The second request alone in the graph of two: the buffer refilled in place, its
    # padding row PAD_SLOT_ID.
    for how in ("padded", "replay"):
        assert _values(alone, how, "short_conv.cache_indices") == [slots[1], -1], how
    for out in (first, second, decode, alone):
        assert ref.violations(out) == []


@pytest.mark.parametrize("name", ["run", "run_fresh_indices"])
def test_indices_not_refilled_into_the_graph_s_buffer_fail_replay_equals_eager(name):
    from attnfuzz.adapters.sglang import runner_step_short_conv as short_conv

    trace = short_conv.smallest_fresh_indices()
    assert short_conv.trigger_fresh_indices(trace)
    found = {(v.prop, v.field, v.build) for out in _life(trace, name) for v in ref.violations(out)}
    if name == "run":
        assert found == set()
    else:
        # The graph reads the capture's slots (the dummy's): only the replay differs.
        assert found == {("replay equals eager", "short_conv.cache_indices", "replay")}
