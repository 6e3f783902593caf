"""SGLang's decode graph runner step on the MiniCPM sparse-attention backend (runner-step's
``sglang-minicpm-sparse``), its ranges shown failing on a broken build, its mutant, and
the finding it keeps apart."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from attnfuzz.adapters.sglang.runner_step import pool_pages
from attnfuzz.adapters.sglang.testing import calls_counted, life, requires_sglang, scheduled
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.testing import assert_passes
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang

IMPL = "sglang-minicpm-sparse"
MUTANT = "sglang-minicpm-sparse-table-rebound"


def _minicpm() -> Any:
    from attnfuzz.adapters.sglang import runner_step_minicpm_sparse

    return runner_step_minicpm_sparse


def _backend_class() -> Any:
    """``MiniCPMSparseBackend``, imported as the adapter imports it (SGLang set up first)."""
    _minicpm().prepare()
    from sglang.srt.layers.attention.minicpm.backend import MiniCPMSparseBackend

    return MiniCPMSparseBackend


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_minicpm_sparse.<name>``."""
    return life(getattr(_minicpm(), name), trace)


def _found(out: ref.RunnerStepOutputs) -> set[tuple[str, str, str]]:
    return {(v.prop, v.build, v.field) for v in ref.violations(out)}


def _pages(first: int, n: int) -> tuple[int, ...]:
    return tuple(range(first, first + n))


def _sparse_dense_and_short() -> Trace:
    """Three requests arrive (70 tokens: sparse, past the top-k budget of 64; 20: dense,
    two k1 keys; 5: no compressed key), decode together in the graph of four, then the
    second decodes alone in the graph of one."""
    config = EngineConfig(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=96,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1, 2, 4))  # fmt: skip
    a, b, c = 70, 20, 5
    return Trace(
        config,
        (
            scheduled(
                (0, 0, 0),
                (a, b, c),
                (0, 1, 2),
                (_pages(1, a), _pages(101, b), _pages(201, c)),
                (a, b, c),
            ),
            scheduled(
                (a, b, c),
                (1, 1, 1),
                (0, 1, 2),
                (_pages(1, a + 1), _pages(101, b + 1), _pages(201, c + 1)),
                (1, 1, 1),
            ),
            scheduled((b + 1,), (1,), (1,), (_pages(101, b + 2),), (1,)),
        ),
    )


@cache
def _three_steps() -> tuple[ref.RunnerStepOutputs, ...]:
    return tuple(_life(_sparse_dense_and_short()))


def test_an_extend_plans_a_row_a_query_token_for_its_sparse_request():
    """The arrival: request 0 (70 tokens, at least ``dense_len`` 48) gets a row a query
    token and head group, each its own length (``_get_sparse_cache_lens``: the token's
    position + 1 up to the budget of 64, then 64 - 32 + position % 32); the dense ones a
    row a head group, whose page table ``_copy_dense_page_table`` fills with ``slot * 2 +
    g``. Compression: k1 keys from 16 tokens, k2 from 64, each in its own reserved slot."""
    arrive = _three_steps()[0]
    assert [b.how for b in arrive.builds if b.how != "capture"] == ["eager", "fresh"]
    assert _values(arrive, "eager", "dense_request") == [0, 1, 1]
    lengths = _values(arrive, "eager", "sparse_cache_seqlens")
    assert lengths[0][:4] == [1, 1, 2, 2]
    assert lengths[0][124:140:2] == [63, 64, 33, 34, 35, 36, 37, 38]
    assert lengths[1][:2] == [20, 20] and lengths[2][:2] == [5, 5]
    assert _values(arrive, "eager", "sparse_page_table_g1")[1][:3] == [203, 205, 207]
    assert _values(arrive, "eager", "k1_cu_seqlens") == [0, 7, 8, 8]
    assert _values(arrive, "eager", "k2_cu_seqlens") == [0, 1, 1, 1]
    (eager,) = arrive.of("eager")
    written = eager.field("k1_state_slots")
    assert written.row_lengths.tolist() == [7, 1, 0]
    # The reserved slots lie past every slot the trace's requests may hold.
    assert written.values[0, 0] >= pool_pages(_sparse_dense_and_short().config)
    assert ref.violations(arrive) == []


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The decode's graph buffers after ``_replay_sparse_graph_metadata``: the real rows
    the eager build's (request 0 sparse, its 71 keys cut to 39; the top-k's inputs of every
    row, compacted eagerly); the padding request dense, of no key, writing no compressed
    slot."""
    decode = _three_steps()[1]
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("padded", "replay"):
        assert _values(decode, how, "seq_lens") == [71, 21, 6, 1], how
        assert _values(decode, how, "dense_request") == [0, 1, 1, 1], how
        assert [r[:2] for r in _values(decode, how, "sparse_cache_seqlens")] == [
            [39, 39], [21, 21], [6, 6], [0, 0]]  # fmt: skip
        assert _values(decode, how, "k1_history") == [7, 1, 0, 0], how
        assert _values(decode, how, "k1_cu_total") == [0, 7, 8, 8, 8], how
        assert _values(decode, how, "topk_cache_lens") == [[70], [20], [5], [0]], how
    assert _values(decode, "eager", "topk_request") == [[0], [0], [0]]
    assert _values(decode, "replay", "topk_request") == [[0], [1], [2], [3]]
    assert ref.violations(decode) == []


def test_the_graph_path_is_sglangs_own():
    """Each capture binds the graph buffers in capture; each replay refills them
    (``_replay_sparse_graph_metadata``, over ``_plan_sparse_decode`` and the compression
    metadata), with the base FlashAttention metadata's replay before it."""
    backend = _backend_class()
    watched = [(backend, "_bind_sparse_graph_metadata"),
               (backend, "_replay_sparse_graph_metadata"),
               (backend, "_build_sparse_decode_replay_metadata")]  # fmt: skip
    with calls_counted(watched) as calls:
        outs = _life(_sparse_dense_and_short())
    # Three captures, two replays (a bind each), as many replay plans.
    assert calls == {
        "MiniCPMSparseBackend._bind_sparse_graph_metadata": 5,
        "MiniCPMSparseBackend._replay_sparse_graph_metadata": 2,
        "MiniCPMSparseBackend._build_sparse_decode_replay_metadata": 2,
    }
    assert all(ref.violations(out) == [] for out in outs)


def test_declines_speculative_decoding():
    """``init_forward_metadata`` refuses a target verify."""
    config = EngineConfig(max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    arrive = scheduled((0,), (3,), (0,), ((1, 2, 3),), (3,))
    assert "verify" in _minicpm().declines(Case(config, arrive))
    plain = EngineConfig(max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16,
                         block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    assert _minicpm().declines(Case(plain, arrive)) is None


# -- each range shown failing on a build broken by hand -------------------------------------------


def _broken_replay(monkeypatch: Any, after: Any) -> None:
    """``MiniCPMSparseBackend._replay_sparse_graph_metadata`` followed by ``after(metadata)``:
    the graph's buffers broken where SGLang writes them, at every replay."""
    backend_class = _backend_class()
    replay = backend_class._replay_sparse_graph_metadata

    def broken(self: Any, forward_batch: Any, metadata: Any) -> None:
        replay(self, forward_batch, metadata)
        after(metadata)

    monkeypatch.setattr(backend_class, "_replay_sparse_graph_metadata", broken)


def test_a_padding_row_storing_a_real_compressed_key_fails_padding_writes_no_real_state(
    monkeypatch,
):
    """A padding row whose table is request 0's and whose new tokens complete a k1 key
    stores it in request 0's first compressed slot."""

    def into_request_0(metadata: Any) -> None:
        k1 = metadata.k1
        k1.table[-1] = k1.table[0]
        k1.cu_new_token_nums[-1] = k1.cu_new_token_nums[-2] + 16

    _broken_replay(monkeypatch, into_request_0)
    decode = _life(_sparse_dense_and_short())[1]
    found = _found(decode)
    assert ("padding writes no real state", "replay", "k1_state_slots") in found


def test_a_history_past_the_table_fails_safe_padding(monkeypatch):
    """The compression reads ``history`` columns of a row's table, unguarded."""

    def past_the_table(metadata: Any) -> None:
        metadata.k1.history_compress_token_nums[-1] = 10_000

    _broken_replay(monkeypatch, past_the_table)
    decode = _life(_sparse_dense_and_short())[1]
    assert ("safe padding", "replay", "k1_history") in _found(decode)


# -- the mutant ------------------------------------------------------------------------------------


def test_the_mutant_fails_replay_equals_eager_on_its_smallest_trace():
    """The graph reads the capture's k1 table (zeros: slot 0) where the request's first
    compressed key lies in its reserved slot; the backend's own forward_metadata (padded)
    names the right one."""
    m = _minicpm()
    trace = m.smallest_table_rebound()
    assert m.reach_replay(trace) and m.trigger_table_rebound(trace)
    assert m.declines(trace.case(0)) is None
    *_, fixed = _life(trace)
    assert ref.violations(fixed) == []
    *_, out = _life(trace, "run_table_rebound")
    assert _found(out) == {
        ("replay equals eager", "replay", "k1_table"),
        ("replay equals eager", "replay", "k1_state_slots"),
    }
    assert _values(out, "replay", "k1_table")[0][0] == 0
    assert _values(out, "padded", "k1_table")[0][0] == _values(out, "eager", "k1_table")[0][0]
    assert _values(out, "eager", "k1_table")[0][0] > 0


def test_a_short_derandomized_search_passes_the_engine_and_finds_the_mutant():
    """Every mutant's smallest trace the engine takes and a few generated traces pass; a
    search of as few finds the mutant, on a trace that meets its trigger."""
    assert_passes("runner-step", IMPL, max_examples=6)
    target = get_target("runner-step")
    result = fuzz(
        target,
        target.resolve(MUTANT),
        max_examples=20,
        rng_seed=0,
        database=None,
        traced=True,
        shrink=False,
    )
    assert result.case is not None, "the mutant was not found"
    assert _minicpm().trigger_table_rebound(result.case)
    assert {m.where.split(".")[0] for m in result.verdict.mismatches} == {"replay"}


# -- the finding of SGLang's own, kept apart -------------------------------------------------------


def test_a_context_whose_headroom_adds_a_compressed_key_breaks_every_replay():
    """``attach_compressed_cache`` sizes the pool's k1 table from the request-to-token
    table's ``context_len + 4`` columns, ``init_cuda_graph_state`` the graph's from
    ``context_len``: at a context of 68 (``(68 - 16) % 8 = 4``) the pool's rows hold 8 k1
    keys, the graph's 7, and the replay's ``dst.table.copy_`` raises. The served context
    (whole k2 strides) holds."""
    m = _minicpm()
    assert m.table_widths_differ(68) and not m.table_widths_differ(96)
    assert not any(m.table_widths_differ(m.served_context_len(_config(n))) for n in range(8, 300))

    class _Unaligned(m.MiniCPMSparseEngine):
        def context_len(self) -> int:
            return 68

    trace = m.smallest_table_rebound()
    unaligned = m._Life(_Unaligned)
    with pytest.raises(RuntimeError, match="must match the size"):
        life(unaligned, trace)


def _config(max_model_len: int) -> EngineConfig:
    return EngineConfig(max_model_len=max_model_len, max_num_seqs=1,
                        max_num_batched_tokens=max_model_len, block_size=1, num_spec=0,
                        cudagraph_capture_sizes=(1,))  # fmt: skip
