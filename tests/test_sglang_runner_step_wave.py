"""SGLang's decode graph runner step on the Wave backend (runner-step's ``sglang-wave``),
its ``wave_lang`` stand-in, its ranges shown failing on a broken build, its mutant, and
a defect of SGLang's own it meets (the graph verify's custom-mask buffer)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_wave.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_wave

    return life(getattr(runner_step_wave, name), trace)


def _backend_class() -> Any:
    """``WaveAttnBackend``, imported as the adapter imports it (SGLang set up first)."""
    from attnfuzz.adapters.sglang import runner_step_wave

    runner_step_wave.prepare()
    from sglang.srt.layers.attention.wave_backend import WaveAttnBackend

    return WaveAttnBackend


def _found(out: ref.RunnerStepOutputs) -> set[tuple[str, str, str]]:
    return {(v.prop, v.build, v.field) for v in ref.violations(out)}


def test_a_decode_of_three_requests_replays_the_graph_of_four():
    """The arrival is an extend (its prefix none: every key from the step); the decode
    replays the graph of four, its padding request the fill length 1 on the reserved
    row 0, its split counts scheduled for an MI300X's compute units."""
    from attnfuzz.adapters.sglang import runner_step_wave

    arrive, decode = _life(_arrive_then_decode(num_spec=0))
    assert runner_step_wave.ENGINE.engine.backend.device_core_count == 304
    assert [b.how for b in arrive.builds if b.how != "capture"] == ["eager", "fresh"]
    assert _values(arrive, "eager", "kv_indptr") == [0, 0, 0, 0]  # the cached prefix
    assert _values(arrive, "eager", "qo_indptr") == [0, 5, 8, 9]
    assert _values(arrive, "eager", "max_extend_len") == [5, 5, 5]
    assert _values(arrive, "eager", "kv_len") == [5, 3, 1]
    assert [b.how for b in decode.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(decode, "eager", "kv_indptr") == [0, 6, 10, 12]
    (eager,) = decode.of("eager")
    assert eager.field("qo_indptr") is None  # the paged decode takes no query offsets
    assert eager.field("num_kv_splits") is None  # a schedule: the graph's alone, by range
    for how in ("padded", "replay"):
        assert _values(decode, how, "seq_lens") == [6, 4, 2, 1], how
        assert _values(decode, how, "kv_indptr") == [0, 6, 10, 12, 13], how
        # get_num_kv_splits_triton over 304 units: a split a key here, not the static 8.
        assert _values(decode, how, "num_kv_splits") == [6, 4, 2, 1], how
        # Pages of 4 tokens (spec_config): request 0's pages 1 and 2, token slots.
        assert _values(decode, how, "kv_slots")[0][:6] == [4, 5, 6, 7, 8, 9], how
    assert ref.violations(arrive) == [] and ref.violations(decode) == []


def test_a_verify_reads_its_prefix_from_the_cache_and_its_drafts_from_the_step():
    """A verify's ``kv_indptr`` spans the committed prefix (``extend_attention_wave``
    takes the step's keys from ``k``); its padding request holds the fill 1."""
    _, verify = _life(_arrive_then_decode(num_spec=1))
    assert _values(verify, "eager", "kv_indptr") == [0, 5, 8, 9]
    assert _values(verify, "eager", "kv_len") == [7, 5, 3]
    # mask_indptr: draft_num * (prefix + draft_num) mask entries a request.
    assert _values(verify, "eager", "mask_indptr") == [0, 14, 24, 30]
    for how in ("padded", "replay"):
        assert _values(verify, how, "seq_lens") == [5, 3, 1, 1], how
        assert _values(verify, how, "qo_indptr") == [0, 2, 4, 6, 8], how
        assert _values(verify, how, "mask_indptr") == [0, 14, 24, 30, 36], how
        assert _values(verify, how, "max_extend_len") == [2, 2, 2, 2], how
    assert ref.violations(verify) == []


def test_wave_lang_is_in_sys_modules_only_while_the_engine_builds_or_steps():
    """The stand-in ``wave_lang`` and SGLang's ``wave_ops`` are there while the engine
    runs SGLang's code, and gone after; Wave's compiler refuses; the cache directory
    the backend moves is put back."""
    from attnfuzz.adapters.sglang import runner_step_wave

    _life(_arrive_then_decode(num_spec=0))
    assert "wave_lang" not in sys.modules
    assert not any(name in sys.modules for name in runner_step_wave.WAVE_OPS)
    with runner_step_wave.wave():
        import wave_lang.kernel.wave.cache as cache  # type: ignore[import-not-found]
        from sglang.srt.layers.attention.wave_ops import decode_attention

        assert cache.CACHE_BASE_DIR == runner_step_wave.CACHE_BASE_DIR
        shapes = decode_attention.decode_attention_intermediate_arrays_shapes(3, 16, 2, 8)
        assert shapes == ((8, 3, 2, 16), (8, 3, 2))
        with pytest.raises(RuntimeError, match="no forward runs here"):
            decode_attention.wave_compile()
    assert "wave_lang" not in sys.modules


# -- each range shown failing on a build broken by hand -------------------------------------------


def test_no_split_fails_safe_padding(monkeypatch):
    """``num_kv_splits`` of 0 would have the Triton fallback divide a request's keys by
    0 splits: every graph build fails its range (the eager ones hold none)."""
    monkeypatch.setattr(
        _backend_class(), "get_num_kv_splits", lambda self, splits, seq_lens: splits.fill_(0)
    )
    arrive, decode = _life(_arrive_then_decode(num_spec=0))
    assert ("safe padding", "capture", "num_kv_splits") in _found(arrive)
    found = _found(decode)
    for how in ("padded", "replay"):
        assert ("safe padding", how, "num_kv_splits") in found, how


def test_a_query_window_of_none_fails_its_range_and_replay_equals_eager(monkeypatch):
    """``max_extend_len`` sizes ``extend_attention_wave``'s grid: 0 rows of a request's
    query would run, outside its range, and unlike the eager verify's."""
    backend_class = _backend_class()
    build = backend_class._build_cuda_graph_forward_metadata

    def no_window(self: Any, *args: Any, **kwargs: Any) -> Any:
        metadata = build(self, *args, **kwargs)
        if metadata.max_extend_len is not None:
            metadata.max_extend_len = 0
        return metadata

    monkeypatch.setattr(backend_class, "_build_cuda_graph_forward_metadata", no_window)
    _, verify = _life(_arrive_then_decode(num_spec=1))
    found = _found(verify)
    assert ("safe padding", "replay", "max_extend_len") in found
    assert ("replay equals eager", "replay", "max_extend_len") in found
    assert not any(build == "padded" for _, build, _ in found)


# -- the mutant ------------------------------------------------------------------------------------


def test_the_mutant_fails_padding_invariance_on_its_smallest_trace():
    """The graph verify's prefix holds the drafts: the padded buffers and the graph's
    views read them twice, while the eager verify (and a new engine's) is SGLang's."""
    from attnfuzz.adapters.sglang import runner_step_wave as wave

    trace = wave.smallest_verify_prefix_with_drafts()
    assert wave.reach_verify_replay(trace)
    *_, fixed = _life(trace)
    assert ref.violations(fixed) == []
    *_, out = _life(trace, "run_verify_prefix_with_drafts")
    found = _found(out)
    for field in ("kv_indptr", "kv_len", "kv_slots"):
        assert ("padding invariance", "padded", field) in found
        assert ("replay equals eager", "replay", field) in found
    assert not any(prop == "history invariance" for prop, _, _ in found)


def test_beside_triton_its_keys_agree():
    """The step's eager build on Wave, as a ``backend`` build beside the Triton engine
    (as ``sglang-backends`` runs AITER's): its ``kv_len`` and ``kv_slots``, read through
    its own ``kv_indptr`` and ``kv_indices``, agree with Triton's, for an extend, a
    decode and a verify."""
    from attnfuzz.adapters.sglang import runner_step as decode
    from attnfuzz.adapters.sglang import runner_step_wave
    from attnfuzz.adapters.sglang.runner_step_backends import BackendsLife

    both = BackendsLife(decode.EngineLife(), runner_step_wave.WaveLife())
    both.new_engine()
    for spec in (0, 1):
        for out in life(both, _arrive_then_decode(num_spec=spec)):
            (wave,) = out.of("backend")
            assert "wave_backend" in wave.where
            assert wave.field("kv_len") is not None and wave.field("kv_slots") is not None
            assert ref.violations(out) == []


# -- a defect of SGLang's own --------------------------------------------------------------------


@pytest.mark.parametrize(
    "max_model_len, num_spec, computed, where",
    [(11, 1, 4, "replay"), (8, 2, 1, "capture")],
    ids=["replay", "capture"],
)
def test_a_verify_mask_past_the_graphs_mask_buffer_raises(max_model_len, num_spec, computed,
                                                          where):  # fmt: skip
    """SGLang 0.5.23's ``WaveAttnBackend.init_cuda_graph_state`` sizes
    ``cuda_graph_custom_mask`` ``max_bs * max_context_len``, while
    ``_apply_cuda_graph_metadata`` copies the whole verify mask into it:
    ``num_draft_tokens * (seq_len + num_draft_tokens)`` a request (FULL_MASK; Triton's
    ``tree_mask_numel`` sizes ``num_draft_tokens * (max_context_len + num_draft_tokens)``
    a request). A verify of one request whose mask passes the context raises at replay
    (2 * (4 + 2) = 12 > 11, ``load_batch``); at a context under ``N * (N + 1)`` the
    capture's mask (the runner's ``custom_mask``, ``(1 + N) * N`` a request) already does
    (3 * 4 = 12 > 8). Pinned here: where it passes, SGLang has fixed it."""
    from attnfuzz.adapters.sglang.runner_step import arrive_then_step

    config = EngineConfig(max_model_len=max_model_len, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=num_spec,
                          cudagraph_capture_sizes=(num_spec + 1,))  # fmt: skip
    match = "Capture cuda graph failed" if where == "capture" else "expanded size"
    with pytest.raises(Exception, match=match):
        _life(arrive_then_step(config, computed))


@pytest.mark.parametrize("max_model_len, num_spec, computed, graph",
                         [(8, 1, 2, 2), (8, 1, 3, 2), (9, 1, 3, 2), (11, 1, 4, 2), (12, 1, 4, 2),
                          (8, 2, 1, 3), (12, 2, 1, 3), (8, 1, 3, 0)])  # fmt: skip
def test_the_engine_declines_exactly_the_steps_whose_copy_raises(max_model_len, num_spec,
                                                                 computed, graph):  # fmt: skip
    """``sglang-wave`` declines a trace's steps exactly where the unmodified engine's
    mask copy raises (:func:`runner_step_wave.mask_overflow`): 2 * (2 + 2) = 8 entries
    fit a buffer of 1 * 8, 10 do not, 10 fit 1 * 9; the capture's 3 * 4 = 12 entries
    pass a context of 8, not of 12; without graphs nothing is copied. What it judges,
    SGLang's unmodified engine runs through."""
    from attnfuzz.adapters.sglang import runner_step_wave as wave
    from attnfuzz.adapters.sglang.runner_step import arrive_then_step

    graphs = {"cudagraph_capture_sizes": (graph,)} if graph else {"cudagraph_mode": "NONE"}
    config = EngineConfig(max_model_len=max_model_len, max_num_seqs=1,
                          max_num_batched_tokens=max_model_len, block_size=1,
                          num_spec=num_spec, **graphs)  # fmt: skip
    trace = arrive_then_step(config, computed)
    declined = [wave.declines(case) for case in trace.cases()]
    if not any(declined):
        assert not wave.trigger_mask_overflow(trace)
        assert all(ref.violations(out) == [] for out in _life(trace))
        return
    assert wave.trigger_mask_overflow(trace) and wave.reach_verify_graph(trace)
    assert all("sglang-wave-verify-mask-overflow" in why for why in declined if why)
    with pytest.raises(Exception, match="Capture cuda graph failed|expanded size"):
        _life(trace, "run_verify_mask_overflow")


@pytest.mark.parametrize("prefixes, raises", [((2, 2), False), ((3, 2), True)])
def test_the_entries_are_summed_over_the_batchs_requests(prefixes, raises):
    """Two requests verify in the graph of two (a buffer of 2 * 8): 2 * (2 + 2) each,
    16 in all, fit; 2 * (3 + 2) + 2 * (2 + 2) = 18 do not, though each request's fits."""
    from attnfuzz.adapters.sglang import runner_step_wave as wave
    from attnfuzz.adapters.sglang.testing import scheduled

    config = EngineConfig(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(4,))  # fmt: skip
    a, b = prefixes
    pages = (tuple(range(1, a + 3)), tuple(range(a + 3, a + b + 5)))
    trace = Trace(config, (
        scheduled((0, 0), prefixes, (0, 1), (pages[0][:a], pages[1][:b]), (a, b)),
        scheduled(prefixes, (2, 2), (0, 1), pages, (2, 2)),
    ))  # fmt: skip
    assert wave.trigger_mask_overflow(trace) is raises
    if not raises:
        assert all(ref.violations(out) == [] for out in _life(trace))
        return
    assert wave.declines(trace.cases()[0]) is None and wave.declines(trace.cases()[1])
    with pytest.raises(Exception, match="expanded size"):
        _life(trace, "run_verify_mask_overflow")


def test_the_finding_is_its_own_entry_and_the_mutants_are_apart():
    """``sglang-wave-verify-mask-overflow``: the unmodified engine, undeclined, its
    smallest trace meeting the finding (a replayed verify, inside SGLang's limits: a
    prompt of 4 under ``max_req_input_len`` 5, a prefix of 4 under ``context_len - 4``);
    ``sglang-wave`` declines its verify; the
    re-created mutant's smallest trace does not need the overflow."""
    from attnfuzz.adapters.sglang import runner_step_wave as wave
    from attnfuzz.harness.registry import get_target

    target = get_target("runner-step")
    finding = target.resolve("sglang-wave-verify-mask-overflow")
    assert finding.kind == "mutant" and finding.declines is None
    smallest = finding.smallest()
    assert smallest == wave.smallest_mask_overflow()
    assert finding.trigger(smallest) and finding.reach(smallest)
    assert wave.reach_verify_replay(smallest)  # at a replay, not at capture
    arrive, verify = smallest.cases()
    engine = target.resolve("sglang-wave")
    assert engine.declines(arrive) is None and "12 entries" in engine.declines(verify)
    prefix = target.resolve("sglang-wave-verify-prefix-with-drafts")
    drafts = prefix.smallest()
    assert prefix.trigger(drafts) and not finding.trigger(drafts)
    assert not any(prefix.declines(case) for case in drafts.cases())


# The derandomized search (the engine passing it, the mutant's smallest trace judged
# first) is test_entries.py's, over every implementation of runner-step: not repeated here.
