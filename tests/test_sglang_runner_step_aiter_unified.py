"""SGLang's decode graph runner step on AITER with ``SGLANG_USE_AITER_UNIFIED_ATTN=1``
(``sglang-aiter-unified-page-size-one``): its page-table fields, its ranges shown failing
on a broken build, its declines, and SGLang's own finding at page size 1."""

from __future__ import annotations

import os
from typing import Any

from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang

DEFECT = {
    ("padding invariance", "padded", "kv_indices"),
    ("padding invariance", "padded", "kv_slots"),
    ("replay equals eager", "replay", "kv_indices"),
    ("replay equals eager", "replay", "kv_slots"),
}
"""What the finding fails on a decode the graph replays at page size 1."""


def _life(trace: Trace) -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_aiter_unified.run``."""
    from attnfuzz.adapters.sglang import runner_step_aiter_unified

    return life(runner_step_aiter_unified.run, trace)


def _backend_class() -> Any:
    """``AiterAttnBackend``, imported as the adapter imports it (SGLang set up first)."""
    from attnfuzz.adapters.sglang import runner_step_aiter_unified

    runner_step_aiter_unified.prepare()
    from sglang.srt.layers.attention.aiter_backend import AiterAttnBackend

    return AiterAttnBackend


def _found(out: ref.RunnerStepOutputs) -> set[tuple[str, str, str]]:
    return {(v.prop, v.build, v.field) for v in ref.violations(out)}


def _one_request(page: int, computed: int) -> Trace:
    """One request of ``computed`` tokens arrives, then decodes in the graph of one."""
    from attnfuzz.adapters.sglang.runner_step import arrive_then_step

    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=page, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, computed)


def test_a_decode_of_three_requests_replays_the_graphs_page_table():
    """Pages of 4 tokens: the extend's unified forward hands its own page table (each row
    read up to cdiv(seq_len, 4) pages); the decode replays the graph of four, whose page
    table ``_apply_cuda_graph_metadata`` writes (``page_size > 1``): no property fails."""
    arrive, decode = _life(_arrive_then_decode(num_spec=0))
    assert [b.how for b in arrive.builds if b.how != "capture"] == ["eager", "fresh"]
    assert "_forward_extend_unified" in next(arrive.of("eager")).where
    assert _values(arrive, "eager", "qo_indptr") == [0, 5, 8, 9]
    assert _values(arrive, "eager", "max_q_len") == [5, 5, 5]
    assert _values(arrive, "eager", "kv_len") == [5, 3, 1]
    # _build_extend_unified_page_table: pages, max_blocks = cdiv(max_kv_len, 4) wide.
    assert _values(arrive, "eager", "kv_indices") == [[1, 2], [3, 0], [5, 0]]
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    # create_flashmla_kv_indices_triton's token table, cut to pages: column k * 4.
    assert _values(decode, "eager", "kv_indices") == [[1, 2], [3, 0], [5, 0]]
    assert _values(decode, "eager", "qo_indptr") == [0, 1, 2, 3]  # qo_indptr_unified_decode
    for how in ("padded", "replay"):
        assert _values(decode, how, "seq_lens") == [6, 4, 2, 1], how
        assert _values(decode, how, "qo_indptr") == [0, 1, 2, 3, 4], how
        assert [row[:2] for row in _values(decode, how, "kv_indices")[:3]] == [
            [1, 2],
            [3, 0],
            [5, 0],
        ], how
        assert _values(decode, how, "kv_slots")[0][:6] == [4, 5, 6, 7, 8, 9], how
    assert ref.violations(arrive) == [] and ref.violations(decode) == []


def test_the_variable_is_set_only_while_the_backend_is_built():
    from attnfuzz.adapters.sglang import runner_step_aiter_unified as unified

    before = os.environ.get("SGLANG_USE_AITER_UNIFIED_ATTN")
    unified.run.new_engine()
    unified.run(ref.make_inputs(_one_request(1, 1).case(0)))
    backend = unified.ENGINE.engine.backend
    assert backend.use_triton_unified_attention and backend.decode_uses_page_table
    assert not backend.use_sliding_window_kv_pool
    assert os.environ.get("SGLANG_USE_AITER_UNIFIED_ATTN") == before


def test_drafts_are_declined():
    """The target verify's unified metadata is not judged: every config of drafts."""
    from attnfuzz.adapters.sglang import runner_step_aiter_unified as unified

    trace = _arrive_then_decode(num_spec=1)
    assert "_build_verify_unified_metadata" in unified.declines_config(trace.config)
    assert unified.declines(trace.case(0)) is not None
    assert unified.declines(_one_request(1, 1).case(0)) is None


# -- SGLang's finding: the graph's page table is never written at page size 1 ---------------------


def test_page_size_one_replays_an_unwritten_page_table():
    """The smallest witness: one request of one token, then its decode in the graph of
    one, pages of 1. The eager decode reads slots 1 and 2; the graph's page table
    (``cuda_graph_page_table``, which ``_apply_cuda_graph_metadata`` never writes at page
    size 1) holds zeros: replay equals eager and padding invariance fail on the page
    table and the slots read, nothing else."""
    from attnfuzz.adapters.sglang import runner_step_aiter_unified as unified

    trace = unified.smallest_page_size_one()
    assert unified.reach_decode_replay(trace) and unified.trigger_page_size_one(trace)
    arrive, out = _life(trace)
    assert ref.violations(arrive) == []
    assert _values(out, "eager", "kv_indices") == [[1, 2]]
    assert _values(out, "eager", "kv_slots")[0][:2] == [1, 2]
    for how in ("padded", "replay"):
        assert _values(out, how, "seq_lens") == [2], how
        assert _values(out, how, "kv_indices")[0] == [0] * 8, how  # never written
        assert _values(out, how, "kv_slots")[0][:2] == [0, 0], how
    assert _found(out) == DEFECT


def test_with_a_padding_request_its_write_lands_on_the_slot_the_replay_reads():
    """One request decoding in the graph of two, pages of 1: the padding request's token
    writes slot 0 (``out_cache_loc``'s padding, SGLang's padding slot), the very slot
    the unwritten page table has the real request read for every key."""
    from attnfuzz.adapters.sglang.runner_step import arrive_then_step

    config = EngineConfig(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2,))  # fmt: skip
    _, out = _life(arrive_then_step(config, 1))
    for how in ("padded", "replay"):
        assert _values(out, how, "out_cache_loc") == [2, 0], how
    assert _found(out) == DEFECT | {
        ("padding writes no real KV", "padded", "out_cache_loc"),
        ("padding writes no real KV", "replay", "out_cache_loc"),
    }


def test_at_a_page_size_above_one_the_same_decode_passes():
    """Where SGLang copies the rows (``elif self.page_size > 1``) the implementation is
    silent: the same life at pages of 2 and of 4 fails no property."""
    from attnfuzz.adapters.sglang import runner_step_aiter_unified as unified

    for page in (2, 4):
        trace = _one_request(page, 1)
        assert unified.reach_decode_replay(trace) and not unified.trigger_page_size_one(trace)
        for out in _life(trace):
            assert ref.violations(out) == [], page


def test_beside_triton_its_keys_agree():
    """The step's eager build as a ``backend`` build beside the Triton engine: its
    ``kv_len`` and ``kv_slots``, read through its page table, agree with Triton's, for
    an extend and a decode (the finding is the graph's alone)."""
    from attnfuzz.adapters.sglang import runner_step as decode
    from attnfuzz.adapters.sglang import runner_step_aiter_unified as unified
    from attnfuzz.adapters.sglang.runner_step_backends import BackendsLife

    both = BackendsLife(decode.EngineLife(), unified.UnifiedLife())
    for trace in (_arrive_then_decode(num_spec=0), _one_request(1, 1)):
        for out in life(both, trace):
            (backend,) = out.of("backend")
            assert "aiter_backend" in backend.where
            assert ref.violations(out) == []


# -- each range shown failing on a build broken by hand -------------------------------------------


def _broken_graph(monkeypatch: Any, after: Any) -> None:
    """``AiterAttnBackend._apply_cuda_graph_metadata`` followed by ``after(backend)``: the
    graph's metadata broken where SGLang writes it, at capture and at every replay."""
    backend_class = _backend_class()
    apply = backend_class._apply_cuda_graph_metadata

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        apply(self, *args, **kwargs)
        after(self)

    monkeypatch.setattr(backend_class, "_apply_cuda_graph_metadata", broken)


def test_a_page_past_the_kv_buffer_fails_safe_padding(monkeypatch):
    """``unified_attention`` reads page ``block_table[i, j // page_size]`` of
    ``k.view(-1, page_size, H, D)``: a page id past the layer's buffer fails the range."""

    def past_the_buffer(backend: Any) -> None:
        size = backend.token_to_kv_pool.size + backend.page_size
        backend.cuda_graph_page_table.fill_(size // backend.page_size)

    _broken_graph(monkeypatch, past_the_buffer)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    found = _found(decode)
    for how in ("padded", "replay"):
        assert ("safe padding", how, "kv_indices") in found, how


def test_query_offsets_past_the_tokens_fail_safe_padding(monkeypatch):
    """``cu_seqlens_q`` offsets into the forward's query rows: offsets past them fail."""

    def shifted(backend: Any) -> None:
        backend.forward_metadata.qo_indptr = backend.forward_metadata.qo_indptr + 1

    _broken_graph(monkeypatch, shifted)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    found = _found(decode)
    for how in ("padded", "replay"):
        assert ("safe padding", how, "qo_indptr") in found, how
    assert ("replay equals eager", "replay", "qo_indptr") in found


def test_a_query_window_of_none_fails_its_range(monkeypatch):
    """``max_seqlen_q`` sizes the kernel's query blocks: 0 rows a request is outside it."""

    def no_window(backend: Any) -> None:
        backend.forward_metadata.max_q_len = 0

    _broken_graph(monkeypatch, no_window)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    found = _found(decode)
    for how in ("padded", "replay"):
        assert ("safe padding", how, "max_q_len") in found, how


def test_a_page_past_a_rows_read_entries_is_not_compared(monkeypatch):
    """Each page-table row is read up to cdiv(seq_len, page_size) pages: an entry past
    them (a stale page of an earlier replay) is compared by no build."""

    def stale_tail(backend: Any) -> None:
        backend.cuda_graph_page_table[:, 3:] = 1

    _broken_graph(monkeypatch, stale_tail)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    assert ref.violations(decode) == []
