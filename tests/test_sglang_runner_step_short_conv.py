"""SGLang's decode graph runner step of a short-conv hybrid model (runner-step's
``sglang-hybrid-short-conv``): the conv layers' handle in each build, the graph's slot
buffer refilled in place, and its mutant caught by *replay equals eager*."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang, scheduled
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_short_conv.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_short_conv

    return life(getattr(runner_step_short_conv, name), trace)


def _arrive_chunk_decode() -> Trace:
    """Two requests arrive (the second's prompt in two chunks); they run on together, then
    decode in the graph of four, twice (one request finished before the second).
    Pages of one token."""
    config = EngineConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=16,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2, 4))  # fmt: skip
    return Trace(
        config,
        (
            scheduled((0, 0), (3, 2), (0, 1), ((1, 2, 3), (6, 7)), (3, 2)),
            scheduled((3, 2), (1, 2), (0, 1), ((1, 2, 3, 4), (6, 7, 8, 9)), (1, 2)),
            scheduled((4, 4), (1, 1), (0, 1), ((1, 2, 3, 4, 5), (6, 7, 8, 9, 10)), (1, 1)),
            scheduled((5,), (1,), (1,), ((6, 7, 8, 9, 10, 11),), (1,)),
        ),
    )


def test_the_conv_handle_of_an_extend_and_of_decodes_in_the_graph():
    first, second, decode, alone = _life(_arrive_chunk_decode())
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
