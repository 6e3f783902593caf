"""SGLang's decode graph runner step of a hybrid model on Bailing's lightning attention
(runner-step's ``sglang-hybrid-lightning``): the linear metadata in each build, and its
mutant caught by *padding writes no real state* alone."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang.testing import arrive_chunk_decode, life, requires_sglang
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_lightning.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_lightning

    return life(getattr(runner_step_lightning, name), trace)


def test_the_linear_metadata_of_an_extend_and_a_padded_decode():
    first, second, decode, alone = _life(arrive_chunk_decode())
    # Arriving: two extends, no state to start from (prepare_mixed: extend_prefix_lens > 0).
    assert _values(first, "eager", "lightning.query_start_loc") == [0, 3, 5]
    assert _values(first, "eager", "lightning.has_initial_states") == [0, 0]
    assert _values(first, "eager", "lightning.q_lengths") == [3, 2]
    slots = _values(first, "eager", "lightning.mamba_cache_indices")
    # Running on: both start from their states.
    assert _values(second, "eager", "lightning.has_initial_states") == [1, 1]
    assert _values(second, "eager", "lightning.mamba_cache_indices") == slots
    # The decode of two in the graph of two, then nothing padded; each build agrees.
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    # The second request alone in the graph of two: its padding row PAD_SLOT_ID.
    for how in ("padded", "replay"):
        assert _values(alone, how, "lightning.mamba_cache_indices") == [slots[1], -1], how
    for out in (first, second, decode, alone):
        assert ref.violations(out) == []


def test_a_padded_decode_s_padding_rows_name_no_state_slot():
    """One request decodes in the graph of two: its padding row's slot is PAD_SLOT_ID."""
    from attnfuzz.adapters.sglang import runner_step_lightning as lightning

    trace = lightning.smallest_padding_repeats_last()
    assert lightning.trigger_padding_repeats_last(trace)
    _, step = _life(trace)
    (slot,) = _values(step, "eager", "lightning.mamba_cache_indices")
    for how in ("padded", "replay"):
        assert _values(step, how, "lightning.mamba_cache_indices") == [slot, -1], how
    assert ref.violations(step) == []


@pytest.mark.parametrize("name", ["run", "run_padding_repeats_last"])
def test_padding_repeating_the_last_row_fails_padding_writes_no_real_state_alone(name):
    from attnfuzz.adapters.sglang import runner_step_lightning as lightning

    found = {
        (v.prop, v.field, v.build)
        for out in _life(lightning.smallest_padding_repeats_last(), name)
        for v in ref.violations(out)
    }
    if name == "run":
        assert found == set()
    else:
        assert found == {
            ("padding writes no real state", "lightning.mamba_cache_indices", build)
            for build in ("padded", "replay")
        }
