"""SGLang's step with a FULL prefill CUDA graph on FA3 and its chunked-prefix cache
(runner-step's ``sglang-fa3-prefill-graph``): an extend with a cached prefix replayed
in the rounded-up chunk variant, one without a prefix in the suffix-only graph, one
past every capture size run eagerly, the chunk ranges shown failing on a broken
population, the declines, and the mutant."""

from __future__ import annotations

from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang, scheduled
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _module() -> Any:
    from attnfuzz.adapters.sglang import runner_step_fa3_prefill_graph

    return runner_step_fa3_prefill_graph


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_fa3_prefill_graph.<name>``."""
    return life(getattr(_module(), name), trace)


def _found(out: ref.RunnerStepOutputs) -> set[tuple[str, str, str]]:
    return {(v.prop, v.build, v.field) for v in ref.violations(out)}


def _prefix_then_decode_then_fresh() -> Trace:
    """Three request slots, pages of two tokens (a chunk: a page a slot). Request 0
    arrives with a cached prefix of 5 tokens and 2 new ones, request 1 with one token:
    3 tokens in the graph of 4, the prefix's 3 chunks in the variant of 4. Both decode
    in the decode graph; then request 2 arrives alone with 3 tokens and no prefix: the
    graph of 4 without chunks. Last, request 3 arrives with 9: past every capture size."""
    config = EngineConfig(max_model_len=16, max_num_seqs=3, max_num_batched_tokens=16,
                          block_size=2, cudagraph_capture_sizes=(4, 8))  # fmt: skip
    return Trace(
        config,
        (
            scheduled((5, 0), (2, 1), (0, 1), ((1, 2, 3, 4), (5,)), (4, 1)),
            scheduled((7, 1), (1, 1), (0, 1), ((1, 2, 3, 4), (5,)), (0, 0)),
            scheduled((0,), (3,), (2,), ((6, 7),), (2,)),
            scheduled((0,), (9,), (3,), ((8, 9, 10, 11, 12),), (5,)),
        ),
    )


def test_a_cached_prefix_replays_the_rounded_up_chunk_variant():
    arrive, decode, suffix, past = _life(_prefix_then_decode_then_fresh())
    graphs = _module().ENGINE.engine.prefill_graphs
    # SGLang's resolution: chunks of a page a slot, the variants that the context needs.
    assert graphs._is_full_backend and graphs._capture_chunked_prefix
    assert (graphs._capture_req_slots, graphs._prefix_chunk_len) == (3, 2)
    assert graphs._prefix_capture_variants == (1, 2, 4, 8)
    # Captures, largest token count first, each followed by its chunk variants; then the
    # decode graph of three requests.
    captures = [(len(b.field("positions").values), b.field("prefix_chunk_kv_lens"))
                for b in arrive.of("capture")]  # fmt: skip
    chunks = [None if f is None else f.values.shape[1] for _, f in captures]
    assert [n for n, _ in captures] == [8] * 5 + [4] * 5 + [3]
    assert chunks == [None, 1, 2, 4, 8] * 2 + [None]
    assert [b.how for b in arrive.builds if b.how != "capture"] == [
        "eager", "padded", "replay", "fresh"]  # fmt: skip
    for how in ("padded", "replay"):
        # Request 0's prefix of 5 keys: 2, 2 and 1 in chunks 0 to 2; chunk 3 (rounded up)
        # and the padding slot none.
        assert _values(arrive, how, "prefix_chunk_kv_lens") == [
            [2, 2, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], how  # fmt: skip
        assert _values(arrive, how, "prefix_chunk_cu_seq_lens")[-1] == [2, 2, 1, 0], how
        # Each chunk's indices: request 0's slots of pages 1, 2 and 3, then slot 0.
        indices = _values(arrive, how, "prefix_chunk_kv_indices")
        assert [list(col) for col in zip(*indices, strict=True)] == [
            [2, 3, 0, 0, 0, 0], [4, 5, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0], [0] * 6]  # fmt: skip
        assert _values(arrive, how, "seq_lens") == [7, 1, 0], how
        assert _values(arrive, how, "out_cache_loc") == [7, 8, 10, 0], how
        assert _values(arrive, how, "cu_seqlens_q") == [0, 2, 3, 3], how
    # The keys the chunked attention reads: the prefix chunk by chunk, then its own.
    assert _values(arrive, "replay", "kv_len") == [7, 1, 0]
    assert _values(arrive, "replay", "kv_slots")[0][:7] == [2, 3, 4, 5, 6, 7, 8]
    assert _values(arrive, "eager", "kv_slots")[0][:7] == [2, 3, 4, 5, 6, 7, 8]
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    # No prefix: the graph of 4 of no chunk variant, nothing chunked in what it reads.
    (replay,) = suffix.of("replay")
    assert replay.field("prefix_chunk_cu_seq_lens") is None
    assert _values(suffix, "replay", "seq_lens") == [3, 0, 0]
    # Nine tokens: past the largest prefill graph (can_replay_locally), run eagerly.
    assert [b.how for b in past.builds] == ["eager", "fresh"]
    assert all(ref.violations(out) == [] for out in (arrive, decode, suffix, past))


def test_a_prefix_past_the_largest_variant_runs_eagerly():
    """Pages of one token in one slot: a chunk is one key, 16 chunks the largest
    variant; a prefix of 17 has none (_has_uncapturable_chunked_prefix)."""
    m = _module()
    config = EngineConfig(max_model_len=24, max_num_seqs=1, max_num_batched_tokens=24,
                          block_size=1, cudagraph_capture_sizes=(1,))  # fmt: skip
    arrive = scheduled((17,), (1,), (0,), (tuple(range(1, 19)),), (18,))
    (out,) = _life(Trace(config, (arrive,)))
    assert m.chunk_variants(config) == (1, 2, 4, 8, 16)
    assert m.replayed_variant(ref.make_inputs(Case(config, arrive))) is None
    assert [b.how for b in out.builds if b.how != "capture"] == ["eager", "fresh"]
    assert ref.violations(out) == []


def test_speculative_decoding_is_declined():
    config = _prefix_then_decode_then_fresh().config
    step = scheduled((0,), (3,), (0,), ((1, 2),), (2,))
    m = _module()
    assert m.declines(Case(config, step)) is None
    spec = EngineConfig(**{**config.to_dict(), "num_spec": 1, "cudagraph_capture_sizes": (4, 8)})
    assert "can_replay_locally" in m.declines(Case(spec, step))


# -- each chunk range shown failing on a population broken by hand ------------------------------


def _broken_population(monkeypatch: Any, after: Any) -> None:
    """``_populate_chunked_prefix_buffers`` followed by ``after(buffers, capacity)``: the
    chunk buffers broken where the runner writes them, at every capture and replay."""
    _module().prepare()
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
        PrefillCudaGraphRunner,
    )

    populate = PrefillCudaGraphRunner._populate_chunked_prefix_buffers

    def broken(self: Any, **kwargs: Any) -> None:
        populate(self, **kwargs)
        after(self._prefix_capture_buffers, self._prefix_chunk_capacity)

    monkeypatch.setattr(PrefillCudaGraphRunner, "_populate_chunked_prefix_buffers", broken)


@pytest.mark.parametrize(
    "field, after",
    [
        # An offset past the chunk's keys (and a slot's length past the chunk's bound).
        ("prefix_chunk_cu_seq_lens", lambda b, capacity: b.cu_seq_lens[:, -1].fill_(capacity + 1)),
        # An index past the pool's rows, in the chunk's unread tail.
        ("prefix_chunk_kv_indices", lambda b, capacity: b.kv_indices[:, -1].fill_(1 << 20)),
    ],
)
def test_a_chunk_buffer_out_of_its_consumers_range_fails_safe_padding(monkeypatch, field, after):
    _broken_population(monkeypatch, after)
    (arrive, *_) = _life(_prefix_then_decode_then_fresh())
    found = _found(arrive)
    assert {("safe padding", build, field) for build in ("capture", "padded", "replay")} <= found


# -- the mutant --------------------------------------------------------------------------------


def test_the_mutant_fails_its_smallest_trace_where_the_engine_passes():
    """Three chunks of one key in the graph of 4: the mutant leaves chunk 3's length as
    the last capture left it (one key), over zeroed indices; the request reads a key of
    slot 0 it never wrote, as the padded buffers and the graph's replay both show."""
    m = _module()
    trace = m.smallest_stale_rounded_chunks()
    assert m.declines(trace.cases()[0]) is None
    assert m.reach_chunked_prefix(trace) and m.trigger_stale_rounded_chunks(trace)
    (bad,) = _life(trace, "run_stale_rounded_chunks")
    assert _found(bad) == {
        ("padding invariance", "padded", "kv_len"),
        ("padding invariance", "padded", "kv_slots"),
        ("replay equals eager", "replay", "kv_len"),
        ("replay equals eager", "replay", "kv_slots"),
    }
    assert _values(bad, "replay", "prefix_chunk_kv_lens") == [[1, 1, 1, 1]]
    (sound,) = _life(trace)
    assert _values(sound, "replay", "prefix_chunk_kv_lens") == [[1, 1, 1, 0]]
    assert ref.violations(sound) == []


def test_a_prefix_filling_its_variant_leaves_the_mutant_unseen():
    """Four chunks in the graph of 4: nothing rounded up, no trigger, no failure."""
    m = _module()
    smallest = m.smallest_stale_rounded_chunks()
    arrive = scheduled((4,), (1,), (0,), ((1, 2, 3, 4, 5),), (5,))
    trace = Trace(smallest.config, (arrive,))
    assert m.reach_chunked_prefix(trace) and not m.trigger_stale_rounded_chunks(trace)
    (out,) = _life(trace, "run_stale_rounded_chunks")
    assert ref.violations(out) == []


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
