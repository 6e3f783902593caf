"""SGLang's decode graph runner step on the Qwen sparse-attention backend (runner-step's
``sglang-qwen-sparse``), its stand-ins, its ranges shown failing on a broken build, its
mutant, and the two findings it keeps apart."""

from __future__ import annotations

from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import calls_counted, life, requires_sglang, scheduled
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.testing import assert_passes
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang

IMPL = "sglang-qwen-sparse"
MUTANT = "sglang-qwen-sparse-page-table-off-buffer"


def _qsa() -> Any:
    from attnfuzz.adapters.sglang import runner_step_qwen_sparse

    return runner_step_qwen_sparse


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_qwen_sparse.<name>``."""
    return life(getattr(_qsa(), name), trace)


def _backend_class() -> Any:
    """``QwenSparseAttnBackend``, imported as the adapter imports it (SGLang set up first)."""
    _qsa().prepare()
    from sglang.srt.layers.attention.qwen_sparse_attn_backend import QwenSparseAttnBackend

    return QwenSparseAttnBackend


def _found(out: ref.RunnerStepOutputs) -> set[tuple[str, str, str]]:
    return {(v.prop, v.build, v.field) for v in ref.violations(out)}


def _arrive_then_run_on(num_spec: int) -> Trace:
    """Three requests arrive (an extend: 66 tokens over two pages, 3, 8), then decode (or
    verify) together: three requests in the graph of four, on pages of 64 tokens."""
    w = num_spec + 1
    config = EngineConfig(max_model_len=96, max_num_seqs=4, max_num_batched_tokens=96,
                          block_size=64, num_spec=num_spec,
                          cudagraph_capture_sizes=tuple(w * n for n in (1, 2, 4)))  # fmt: skip
    pages = ((1, 2), (3,), (4,))
    return Trace(
        config,
        (
            scheduled((0, 0, 0), (66, 3, 8), (0, 1, 2), pages, (2, 1, 1)),
            scheduled((66, 3, 8), (w, w, w), (0, 1, 2), pages, (0, 0, 0)),
        ),
    )


def test_an_extend_plans_each_completed_group_from_its_own_tokens():
    """The arrival compresses every whole group of four keys its chunk completes, from
    the chunk's token rows, into compressed slot ``full slot // 4``; a token past the
    last whole group goes to its request's pending ring (request row 4: slots 16 to 19),
    any other to the dump rows 0 to 3."""
    arrive, _ = _life(_arrive_then_run_on(num_spec=0))
    assert [b.how for b in arrive.builds if b.how != "capture"] == ["eager", "fresh"]
    assert _values(arrive, "eager", "sequence_lengths") == [66, 3, 8]
    (eager,) = arrive.of("eager")
    writes = eager.field("compress_write_locs")
    assert writes.row_lengths.tolist() == [16, 0, 2]
    assert writes.values[0].tolist() == list(range(16, 32))  # page 1's compressed slots
    assert writes.values[2, :2].tolist() == [64, 65]  # page 4's
    assert _values(arrive, "eager", "compress_member_rows")[2][:2] == [69, 73]
    ring = _values(arrive, "eager", "pending_ring_slots")
    assert ring[64:69] == [16, 17, 12, 13, 14] and set(ring[69:]) <= {0, 1, 2, 3}
    assert ref.violations(arrive) == []


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The decode's graph buffers, refreshed by ``launch_graph_metadata``'s kernel: the
    padding request of length 1 on the inert request row 0 (ring row 0, write slot 0);
    request 1's fourth key completes a group (compressed slot 48, page 3's first)."""
    _, decode = _life(_arrive_then_run_on(num_spec=0))
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("padded", "replay"):
        assert _values(decode, how, "sequence_lengths") == [67, 4, 9, 1], how
        assert _values(decode, how, "compressed_lengths") == [16, 1, 2, 0], how
        assert _values(decode, how, "compressed_page_table")[:3] == [[1, 2], [3, 0], [4, 0]]
        assert _values(decode, how, "compress_write_locs") == [[0], [48], [0], [0]], how
        assert _values(decode, how, "compress_ring_locs")[1] == [12, 13, 14, 15], how
        assert _values(decode, how, "pending_ring_rows") == [4, 3, 2, 0], how
    (replay,) = decode.of("replay")
    # Request 0's 16 compressed blocks lie in its first page: one page read of two.
    assert replay.field("compressed_page_table").row_lengths.tolist() == [1, 1, 1, 0]
    assert _values(decode, "eager", "compressed_page_table") == [[1, 2], [3, 0], [4, 0]]
    assert ref.violations(decode) == []


def test_a_verify_has_a_metadata_row_a_query_token():
    """A verify of ``next_n`` 3: each draft a row of its own, its length its position +
    1; the padding request's three rows of length 1 on row 0."""
    _, verify = _life(_arrive_then_run_on(num_spec=2))
    assert _values(verify, "eager", "sequence_lengths") == [67, 68, 69, 4, 5, 6, 9, 10, 11]
    assert _values(verify, "eager", "kv_len") == [69, 6, 11]
    for how in ("padded", "replay"):
        assert _values(verify, how, "sequence_lengths")[9:] == [1, 1, 1], how
        assert _values(verify, how, "row_req_pool_indices")[9:] == [0, 0, 0], how
        assert _values(verify, how, "pending_ring_rows")[9:] == [0, 0, 0], how
        # Request 0's row of length 68 and request 1's of length 4 complete a group.
        assert [r[0] for r in _values(verify, how, "compress_write_locs")][:4] == [0, 32, 0, 48]
    assert ref.violations(verify) == []


def test_the_replay_runs_the_kernels_a_cuda_gpu_runs_and_the_host_fallback_agrees():
    """The replay takes ``_replay_cuda_graph_metadata_gpu`` (``launch_graph_metadata``,
    interpreted), never the host fallback; the host-fallback engine the other way round,
    and on a step without padding both build the same rows."""
    backend = _backend_class()
    watched = [(backend, "_replay_cuda_graph_metadata_gpu"),
               (backend, "_update_qsa_cuda_graph_metadata")]  # fmt: skip
    config = EngineConfig(max_model_len=96, max_num_seqs=2, max_num_batched_tokens=96,
                          block_size=64, num_spec=1, cudagraph_capture_sizes=(4,))  # fmt: skip
    trace = Trace(
        config,
        (
            scheduled((0, 0), (7, 66), (0, 1), ((1,), (2, 3)), (1, 2)),
            scheduled((7, 66), (2, 2), (0, 1), ((1,), (2, 3)), (0, 0)),
        ),
    )
    with calls_counted(watched) as kernels:
        *_, cuda = _life(trace)
    with calls_counted(watched) as fallback:
        *_, host = _life(trace, "run_host_replay")
    assert kernels == {"QwenSparseAttnBackend._replay_cuda_graph_metadata_gpu": 1}
    assert fallback == {"QwenSparseAttnBackend._update_qsa_cuda_graph_metadata": 1}
    (a,), (b,) = cuda.of("replay"), host.of("replay")
    for f in a.fields:
        assert ref.real_rows(a, f).tolist() == ref.real_rows(b, b.field(f.name)).tolist(), f.name
    assert ref.violations(cuda) == [] and ref.violations(host) == []


def test_pinned_memory_is_plain_only_while_the_graph_runner_is_built():
    """``init_cuda_graph_state``'s staging buffers exist, unpinned; ``torch.zeros`` is
    torch's own again after."""
    import torch

    zeros = torch.zeros
    q = _qsa()
    q.run.new_engine()
    q.run(ref.make_inputs(_arrive_then_run_on(num_spec=1).case(0)))
    assert torch.zeros is zeros
    staged = q.ENGINE.engine.backend._graph_extend_lens_pin
    assert len(staged) == 2
    if not torch.cuda.is_available():  # a machine torch cannot pin on: plain, and still so
        assert not any(t.is_pinned() for t in staged)
        with pytest.raises(RuntimeError, match="pin"):
            torch.zeros(1, pin_memory=True)


def test_declines_what_sglang_never_runs():
    """A verify wider than the compress ratio (``_require_chain_speculation``), and an
    extend over a prefix of no whole groups (``_qsa_build_write_plan``'s assert);
    an aligned one is taken."""
    q = _qsa()
    wide = EngineConfig(max_model_len=96, max_num_seqs=1, max_num_batched_tokens=96,
                        block_size=64, num_spec=4, cudagraph_capture_sizes=(5,))  # fmt: skip
    arrive = scheduled((0,), (3,), (0,), ((1,),), (1,))
    assert "compress ratio" in q.declines(Case(wide, arrive))
    base = EngineConfig(max_model_len=96, max_num_seqs=2, max_num_batched_tokens=96,
                        block_size=64, num_spec=0, cudagraph_capture_sizes=(1, 2))  # fmt: skip
    for prefix, declined in ((6, True), (8, False)):
        chunk = scheduled((prefix,), (3,), (0,), ((1,),), (0,))
        assert (q.declines(Case(base, chunk)) is not None) == declined, prefix


# -- each range shown failing on a build broken by hand -------------------------------------------


def _broken_replay(monkeypatch: Any, after: Any) -> None:
    """``QwenSparseAttnBackend._replay_cuda_graph_metadata`` followed by ``after(metadata)``:
    the graph's buffers broken where SGLang writes them, at every replay."""
    backend_class = _backend_class()
    replay = backend_class._replay_cuda_graph_metadata

    def broken(self: Any, **kwargs: Any) -> None:
        replay(self, **kwargs)
        after(self.forward_metadata)

    monkeypatch.setattr(backend_class, "_replay_cuda_graph_metadata", broken)


def test_a_ring_slot_past_the_ring_fails_safe_padding(monkeypatch):
    """``pending_ring_slots`` index the pool's pending ring (request slots x ratio rows):
    a padding row's slot past it fails its range, and its ring row too."""

    def past_the_ring(metadata: Any) -> None:
        metadata.indexer_metadata.pending_ring_slots[-1] = 10_000

    _broken_replay(monkeypatch, past_the_ring)
    _, decode = _life(_arrive_then_run_on(num_spec=0))
    found = _found(decode)
    for how in ("padded", "replay"):
        assert ("safe padding", how, "pending_ring_slots") in found
        assert ("safe padding", how, "pending_ring_rows") in found


def test_a_padding_row_in_a_real_requests_ring_fails_padding_writes_no_real_state(monkeypatch):
    """A padding row whose index key goes to request 0's ring row (in range, unlike the
    above) writes the state of a real request."""

    def into_request_0(metadata: Any) -> None:
        ring = metadata.indexer_metadata.pending_ring_slots
        ring[-1] = ring[0]

    _broken_replay(monkeypatch, into_request_0)
    _, decode = _life(_arrive_then_run_on(num_spec=0))
    assert ("padding writes no real state", "replay", "pending_ring_rows") in _found(decode)


def test_a_padding_row_of_no_key_fails_safe_padding(monkeypatch):
    """The sparse attention takes a row's keys below ``sequence_lengths``: a padding row
    of length 0 would hand the paged decode a row of no key."""

    def no_key(metadata: Any) -> None:
        metadata.sequence_lengths[-1] = 0

    _broken_replay(monkeypatch, no_key)
    _, verify = _life(_arrive_then_run_on(num_spec=1))
    assert ("safe padding", "replay", "sequence_lengths") in _found(verify)


# -- the mutant ------------------------------------------------------------------------------------


def test_the_mutant_fails_replay_equals_eager_on_its_smallest_trace():
    """The graph's compressed page table of the capture (zeros: page 0) is what the
    replay reads, while the backend's own forward_metadata (padded) is right."""
    q = _qsa()
    trace = q.smallest_page_table_off_buffer()
    assert q.reach_replay(trace) and q.trigger_page_table_off_buffer(trace)
    *_, fixed = _life(trace)
    assert ref.violations(fixed) == []
    *_, out = _life(trace, "run_page_table_off_buffer")
    assert _found(out) == {("replay equals eager", "replay", "compressed_page_table")}
    assert _values(out, "replay", "compressed_page_table") == [[0]]
    assert _values(out, "padded", "compressed_page_table") == [[1]]


def test_a_short_derandomized_search_passes_the_engine_and_finds_the_mutant():
    """Every mutant's smallest trace the engine takes and a few generated traces pass; a
    search of as few finds the mutant, on a trace that meets its trigger."""
    assert_passes("runner-step", IMPL, max_examples=6)
    target = get_target("runner-step")
    result = fuzz(target, target.resolve(MUTANT), max_examples=20, rng_seed=0,
                  database=None, traced=True, shrink=False)  # fmt: skip
    assert result.case is not None, "the mutant was not found"
    assert _qsa().trigger_page_table_off_buffer(result.case)
    assert {m.where for m in result.verdict.mismatches} == {"replay.compressed_page_table"}


# -- findings of SGLang's own, kept apart ----------------------------------------------------------


def test_a_context_of_no_whole_pages_leaves_the_page_tables_last_column_unwritten():
    """With ``context_len`` the engine's ``max_model_len`` (8: a table of 12 columns),
    the replay writes ``12 // 64 = 0`` page columns (``_qsa_graph_row_metadata_kernel``'s
    ``row_width_pages``): a request's first compressed block reads page 0, where the
    eager ``compressed_decode_view`` reads its page 1. The served context (64) holds."""
    q = _qsa()
    trace = q.smallest_context_len_page_table()
    assert q.trigger_context_len_page_table(trace)
    *_, served = _life(trace)
    assert ref.violations(served) == []
    *_, out = _life(trace, "run_context_len_page_table")
    assert _found(out) == {
        ("padding invariance", "padded", "compressed_page_table"),
        ("replay equals eager", "replay", "compressed_page_table"),
    }
    assert _values(out, "eager", "compressed_page_table") == [[1]]
    assert _values(out, "replay", "compressed_page_table") == [[0]]


def test_the_host_fallback_stores_a_padded_verifys_padding_keys_in_a_real_ring():
    """Off CUDA (``_update_qsa_cuda_graph_metadata``) a padded verify's padding rows take
    ``req_pool_indices[0]`` (``_graph_speculative_layout``'s ``dummy_req``): request 0's
    ring row, where the kernel gives them row 0."""
    q = _qsa()
    trace = q.smallest_host_replay_padding()
    assert q.trigger_host_replay_padding(trace)
    *_, cuda = _life(trace)
    assert ref.violations(cuda) == []
    assert _values(cuda, "replay", "pending_ring_rows")[2:] == [0, 0]
    *_, host = _life(trace, "run_host_replay")
    assert _found(host) == {
        ("padding writes no real state", "padded", "pending_ring_rows"),
        ("padding writes no real state", "replay", "pending_ring_rows"),
    }
    rows = _values(host, "replay", "pending_ring_rows")
    assert rows[2:] == [rows[0]] * 2
