"""SGLang's decode graph runner step on the AITER backend (runner-step's ``sglang-aiter``),
its ``aiter`` stand-in, its ranges shown failing on a broken build, and its mutant."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_aiter.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_aiter

    return life(getattr(runner_step_aiter, name), trace)


def _backend_class() -> Any:
    """``AiterAttnBackend``, imported as the adapter imports it (SGLang set up first)."""
    from attnfuzz.adapters.sglang import runner_step_aiter

    runner_step_aiter.prepare()
    from sglang.srt.layers.attention.aiter_backend import AiterAttnBackend

    return AiterAttnBackend


def _found(out: ref.RunnerStepOutputs) -> set[tuple[str, str, str]]:
    return {(v.prop, v.build, v.field) for v in ref.violations(out)}


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The arrival is an extend (``mha_batch_prefill_func``'s metadata, every key from
    the cache); the decode replays the graph of four, its padding request the fill
    length 1 on the reserved row 0."""
    arrive, decode = _life(_arrive_then_decode(num_spec=0))
    assert [b.how for b in arrive.builds if b.how != "capture"] == ["eager", "fresh"]
    assert _values(arrive, "eager", "qo_indptr") == [0, 5, 8, 9]
    assert _values(arrive, "eager", "kv_indptr") == [0, 5, 8, 9]
    assert _values(arrive, "eager", "max_q_len") == [5, 5, 5]
    assert _values(arrive, "eager", "max_kv_len") == [5, 5, 5]
    assert _values(arrive, "eager", "kv_len") == [5, 3, 1]
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(decode, "eager", "kv_indptr") == [0, 6, 10, 12]
    assert decode.of("eager").__next__().field("qo_indptr") is None  # paged_attention_ragged's
    for how in ("padded", "replay"):
        assert _values(decode, how, "seq_lens") == [6, 4, 2, 1], how
        assert _values(decode, how, "kv_indptr") == [0, 6, 10, 12, 13], how
        # Pages of 4 tokens (spec_config): request 0's pages 1 and 2, token slots.
        assert _values(decode, how, "kv_slots")[0][:6] == [4, 5, 6, 7, 8, 9], how
    assert ref.violations(arrive) == [] and ref.violations(decode) == []


def test_a_verify_reads_its_prefix_from_the_cache_and_its_drafts_from_the_step():
    """A verify's ``kv_indptr`` spans the committed prefix (``extend_attention_fwd`` takes
    the step's keys from ``k``); its padding request holds the fill ``num_draft_tokens``."""
    _, verify = _life(_arrive_then_decode(num_spec=1))
    assert _values(verify, "eager", "kv_indptr") == [0, 5, 8, 9]
    assert _values(verify, "eager", "kv_len") == [7, 5, 3]
    # mask_indptr: draft_num * (prefix + draft_num) mask entries a request.
    assert _values(verify, "eager", "mask_indptr") == [0, 14, 24, 30]
    for how in ("padded", "replay"):
        assert _values(verify, how, "seq_lens") == [5, 3, 1, 2], how
        assert _values(verify, how, "qo_indptr") == [0, 2, 4, 6, 8], how
        assert _values(verify, how, "mask_indptr") == [0, 14, 24, 30, 38], how
        assert _values(verify, how, "max_extend_len") == [2, 2, 2, 2], how
    assert ref.violations(verify) == []


def test_aiter_is_in_sys_modules_only_while_the_engine_builds_or_steps():
    """The stand-in ``aiter`` and the names of ``aiter_backend``'s ``try:`` block are
    there while the engine runs SGLang's code, and gone after; its kernels refuse, as
    does the gfx950 fp8 prefill's scheduler; the MLA decode's scheduler is the shared
    stand-in."""
    from attnfuzz.adapters.sglang import runner_step_aiter

    runner_step_aiter.prepare()
    from sglang.srt.layers.attention import aiter_backend

    _life(_arrive_then_decode(num_spec=0))
    assert "aiter" not in sys.modules and runner_step_aiter.MTP_MODULE not in sys.modules
    assert not hasattr(aiter_backend, "reset_verify_attn_plan_cache")
    with runner_step_aiter.aiter():
        import aiter  # type: ignore[import-not-found]

        assert aiter_backend.paged_attention_ragged is aiter.paged_attention_ragged
        assert aiter_backend.reset_verify_attn_plan_cache.__module__ == (
            runner_step_aiter.MTP_MODULE
        )
        with pytest.raises(RuntimeError, match="no forward runs here"):
            aiter.paged_attention_ragged()
        with pytest.raises(RuntimeError, match="gfx950 only"):
            aiter.get_ps_metadata_v1()
        from attnfuzz.adapters import aiter_schedule

        assert aiter.get_mla_metadata_v1 is aiter_schedule.get_mla_metadata_v1
    assert "aiter" not in sys.modules


# -- each range shown failing on a build broken by hand -------------------------------------------


def _broken_graph(monkeypatch: Any, name: str, after: Any) -> None:
    """``AiterAttnBackend._apply_cuda_graph_metadata`` followed by ``after(backend)``: the
    graph's metadata broken where SGLang writes it, at capture and at every replay."""
    backend_class = _backend_class()
    apply = backend_class._apply_cuda_graph_metadata

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        apply(self, *args, **kwargs)
        after(self)

    monkeypatch.setattr(backend_class, name, broken)


def test_a_padding_fill_of_no_key_fails_safe_padding(monkeypatch):
    """A padding request of length 0 (the fill) would have paged_attention_ragged's reduce
    kernel read partition -1: ``seq_lens`` accepts 1 key at least."""
    monkeypatch.setattr(_backend_class(), "get_cuda_graph_seq_len_fill_value", lambda self: 0)
    _, decode = _life(_arrive_then_decode(num_spec=0))
    found = _found(decode)
    assert ("safe padding", "padded", "seq_lens") in found
    assert ("safe padding", "replay", "seq_lens") in found


def test_mask_offsets_past_the_graphs_mask_fail_safe_padding(monkeypatch):
    """``mask_indptr`` offsets into the mask ``extend_attention_fwd`` is handed, the
    graph's ``cuda_graph_custom_mask``: offsets past it fail its range (and agreement)."""

    def past_the_mask(backend: Any) -> None:
        backend.mask_indptr[1:] += backend.cuda_graph_custom_mask.numel()

    _broken_graph(monkeypatch, "_apply_cuda_graph_metadata", past_the_mask)
    _, verify = _life(_arrive_then_decode(num_spec=1))
    found = _found(verify)
    for how in ("padded", "replay"):
        assert ("safe padding", how, "mask_indptr") in found
        assert ("padding invariance" if how == "padded" else "replay equals eager", how,
                "mask_indptr") in found  # fmt: skip


def test_a_query_window_of_none_fails_its_range_and_padding_invariance(monkeypatch):
    """``max_extend_len`` sizes ``extend_attention_fwd``'s grid: 0 rows of a request's
    query would run, outside its range, and unlike the eager verify's."""

    def no_window(backend: Any) -> None:
        if backend.forward_metadata.max_extend_len is not None:
            backend.forward_metadata.max_extend_len = 0

    _broken_graph(monkeypatch, "_apply_cuda_graph_metadata", no_window)
    _, verify = _life(_arrive_then_decode(num_spec=1))
    found = _found(verify)
    assert ("safe padding", "padded", "max_extend_len") in found
    assert ("padding invariance", "padded", "max_extend_len") in found


# -- the mutant ------------------------------------------------------------------------------------


def test_the_mutant_fails_replay_equals_eager_on_its_smallest_trace():
    """The graph's offsets of the capture (each request the fill length 1): what the
    replay reads, while the backend's own forward_metadata (padded) is right."""
    from attnfuzz.adapters.sglang import runner_step_aiter as aiter

    trace = aiter.smallest_decode_indptr_off_buffer()
    assert aiter.reach_decode_replay(trace)
    *_, fixed = _life(trace)
    assert ref.violations(fixed) == []
    *_, out = _life(trace, "run_decode_indptr_off_buffer")
    found = _found(out)
    for field in ("kv_indptr", "kv_len", "kv_slots"):
        assert ("replay equals eager", "replay", field) in found
    assert not any(build == "padded" for _, build, _ in found)


def test_beside_triton_its_keys_agree():
    """The step's eager build on AITER, as a ``backend`` build beside the Triton engine
    (as ``sglang-backends`` runs FA3's, FlashInfer's and TRT-LLM MHA's): its ``kv_len`` and
    ``kv_slots``, read through its own ``kv_indptr`` and ``kv_indices``, agree with
    Triton's, for an extend, a decode and a verify."""
    from attnfuzz.adapters.sglang import runner_step as decode
    from attnfuzz.adapters.sglang import runner_step_aiter
    from attnfuzz.adapters.sglang.runner_step_backends import BackendsLife

    both = BackendsLife(decode.EngineLife(), runner_step_aiter.AiterLife())
    both.new_engine()
    for spec in (0, 1):
        for out in life(both, _arrive_then_decode(num_spec=spec)):
            (aiter,) = out.of("backend")
            assert "aiter_backend" in aiter.where
            assert aiter.field("kv_len") is not None and aiter.field("kv_slots") is not None
            assert ref.violations(out) == []


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
