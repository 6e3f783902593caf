"""SGLang's step with its prefill CUDA-graph runner on (runner-step's
``sglang-prefill-graph``): an extend padded to a captured token count, one past every
capture size run eagerly, a decode after them in the decode graph, the declines, and
the mutants."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang, scheduled
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_prefill_graph.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_prefill_graph

    return life(getattr(runner_step_prefill_graph, name), trace)


def _arrive_past_decode() -> Trace:
    """Two requests arrive with 3 and 2 tokens (an extend of 5, padded to the graph of
    8); they decode while a third arrives with 7 (an extend of 9, past every capture
    size: eager); then the three decode in the decode graph of four. Pages of one token."""
    config = EngineConfig(max_model_len=16, max_num_seqs=4, max_num_batched_tokens=16,
                          block_size=1, cudagraph_capture_sizes=(4, 8))  # fmt: skip
    third = tuple(range(8, 15))
    return Trace(
        config,
        (
            scheduled((0, 0), (3, 2), (0, 1), ((1, 2, 3), (4, 5)), (3, 2)),
            scheduled(
                (3, 2, 0), (1, 1, 7), (0, 1, 2), ((1, 2, 3, 6), (4, 5, 7), third), (1, 1, 7)
            ),  # fmt: skip
            scheduled(
                (4, 3, 7),
                (1, 1, 1),
                (0, 1, 2),
                ((1, 2, 3, 6, 15), (4, 5, 7, 16), (*third, 17)),
                (1, 1, 1),
            ),  # fmt: skip
        ),
    )


def test_an_extend_a_prefill_graph_covers_is_padded_to_its_token_count():
    first, past, decode = _life(_arrive_past_decode())
    # The engine's first step carries the captures: each prefill graph, largest first
    # (_capture_one_stream), then the decode graph of four requests.
    captures = [len(b.field("out_cache_loc").values) for b in first.of("capture")]
    assert captures == [8, 4, 4]
    assert [b.how for b in first.builds][3:] == ["eager", "padded", "replay", "fresh"]
    # Five tokens in the graph of eight: the padding tokens at slot 0 and position 0
    # (build_prefill_registry: ZERO), the query offsets the step's own.
    for how in ("padded", "replay"):
        assert _values(first, how, "out_cache_loc") == [1, 2, 3, 4, 5, 0, 0, 0], how
        assert _values(first, how, "positions") == [0, 1, 2, 0, 1, 0, 0, 0], how
        assert _values(first, how, "qo_indptr") == [0, 3, 5], how
        assert _values(first, how, "seq_lens") == [3, 2], how
    # Nine tokens: past the largest prefill graph (can_replay_locally), run eagerly.
    assert [b.how for b in past.builds] == ["eager", "fresh"]
    # Three decodes: the decode graph runner, as in sglang.
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(decode, "padded", "seq_lens")[:3] == [5, 4, 8]
    assert all(ref.violations(out) == [] for out in (first, past, decode))


def test_an_extend_padded_past_twice_its_tokens_runs_eagerly():
    """Three tokens and the graph of eight: more padding than
    _MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR allows."""
    trace = _arrive_past_decode()
    config = dataclasses.replace(trace.config, cudagraph_capture_sizes=(8,))
    arrive = scheduled((0,), (3,), (0,), ((1, 2, 3),), (3,))
    (out,) = _life(Trace(config, (arrive,)))
    assert [b.how for b in out.builds if b.how != "capture"] == ["eager", "fresh"]


@pytest.mark.parametrize("num_spec, declined", [(0, False), (1, True)])
def test_speculative_decoding_is_declined(num_spec, declined):
    from attnfuzz.adapters.sglang.runner_step_prefill_graph import declines

    trace = _arrive_past_decode()
    config = dataclasses.replace(trace.config, num_spec=num_spec)
    why = declines(Trace(config, trace.steps[:1]).cases()[0])
    assert (why is not None) == declined
    if declined:
        assert "can_replay_locally" in why


def test_the_mutant_fails_safe_padding_on_its_smallest_trace():
    """The padding token's KV slot -1: outside the pool's rows, in the padded build and
    in what the replay reads."""
    from attnfuzz.adapters.sglang import runner_step_prefill_graph as prefill

    trace = prefill.smallest_padding_slot_sentinel()
    assert prefill.declines(trace.cases()[0]) is None and prefill.reach_padded_prefill(trace)
    (out,) = _life(trace, "run_padding_slot_sentinel")
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    for build in ("padded", "replay"):
        assert ("safe padding", build, "out_cache_loc") in found
    (sound,) = _life(trace)
    assert ref.violations(sound) == []


def test_the_stale_slots_mutant_fails_padding_writes_no_real_kv_alone():
    """The padding tokens keep the first replay's slots 3 and 4, keys the extending
    request reads: in range (safe padding holds), yet the padded forward writes over
    them. Only *padding writes no real KV* fails; with it returning nothing this test
    fails."""
    from attnfuzz.adapters.sglang import runner_step_prefill_graph as prefill

    trace = prefill.smallest_stale_padding_slots()
    assert prefill.trigger_stale_padding_slots(trace)
    arrive, extend = _life(trace, "run_stale_padding_slots")
    assert ref.violations(arrive) == []
    found = {(v.prop, v.build, v.field) for v in ref.violations(extend)}
    assert found == {
        ("padding writes no real KV", build, "out_cache_loc") for build in ("padded", "replay")
    }
    assert _values(extend, "padded", "out_cache_loc")[2:] == [3, 4]
    assert all(ref.violations(out) == [] for out in _life(trace))


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
