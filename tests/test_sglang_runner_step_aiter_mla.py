"""SGLang's decode graph runner step on the AITER backend of an MLA model (runner-step's
``sglang-aiter-mla``): what it builds, and its properties shown failing on builds broken
by hand."""

from __future__ import annotations

from typing import Any

import pytest
from attnfuzz.adapters.sglang.testing import arrive_then_decode, life, requires_sglang
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref

pytestmark = requires_sglang


def _m() -> Any:
    from attnfuzz.adapters.sglang import runner_step_aiter_mla

    runner_step_aiter_mla.prepare()  # SGLang imported as the adapter imports it
    return runner_step_aiter_mla


@pytest.mark.parametrize("num_spec", [0, 2])
def test_the_mla_branches_read_each_requests_keys_and_every_property_holds(num_spec):
    """An MLA model of 16 heads on a bf16 cache: the backend turns aiter's persistent
    MLA kernel off (no scheduler plans). Three requests arrive (an extend with no
    prefix: the step's own keys), then decode (a query a request, one key past the
    prefix) or verify (the prefix and the drafts' keys), eager, padded and replayed;
    every property holds."""
    m = _m()
    from sglang.srt.layers.attention import aiter_backend

    extend, step = life(m.run, arrive_then_decode(num_spec))
    backend = m.ENGINE.engine.backend
    assert backend.use_mla and aiter_backend._use_mla_ps_kernel is False
    assert [b.how for b in step.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(extend, "eager", "kv_len") == [5, 3, 1]
    w = num_spec + 1
    want = [5 + w, 3 + w, 1 + w]
    assert _values(step, "eager", "kv_len") == want
    assert _values(step, "eager", "qo_indptr") == [0, w, 2 * w, 3 * w]
    for how in ("padded", "replay"):
        assert _values(step, how, "kv_len")[:3] == want, how
    assert ref.violations(extend) == [] and ref.violations(step) == []


def test_a_graph_table_one_slot_off_fails_replay_equals_eager(monkeypatch):
    """The graph's ``kv_indices`` (``cuda_graph_kv_indices``) written one slot off at
    capture and at each ``load_batch``: in range, and the padded and replayed builds
    agree with each other; the eager build tells."""
    m = _m()
    from sglang.srt.layers.attention import aiter_backend

    kernel = aiter_backend.create_flashinfer_kv_indices_triton
    own = aiter_backend.AiterAttnBackend.init_cuda_graph_state
    graph_tables: list[Any] = []

    def kept(self: Any, *args: Any, **kwargs: Any) -> Any:
        own(self, *args, **kwargs)
        graph_tables.append(self.cuda_graph_kv_indices)

    class _OneOff:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> Any:
                kernel[grid](*args, **kwargs)
                if any(args[5] is t for t in graph_tables):  # the kernel's kv_indices out
                    args[5].add_(1)

            return launch

    monkeypatch.setattr(aiter_backend.AiterAttnBackend, "init_cuda_graph_state", kept)
    monkeypatch.setattr(aiter_backend, "create_flashinfer_kv_indices_triton", _OneOff())
    _, step = life(m.run, arrive_then_decode(0))
    found = {(v.prop, v.field, v.build) for v in ref.violations(step)}
    assert ("replay equals eager", "kv_indices", "replay") in found, found
    assert ("padding invariance", "kv_indices", "padded") in found, found
    assert not {f for f in found if f[0] == "replay equals eager" and f[2] == "padded"}


def test_a_graph_last_page_of_no_key_fails_safe_padding(monkeypatch):
    """The graph's ``cuda_graph_kv_last_page_len`` left zero (``mla_decode_fwd`` reads
    each request's last page's keys): out of ``[1, page_size]`` in every graph build."""
    m = _m()
    from sglang.srt.layers.attention.aiter_backend import AiterAttnBackend

    own = AiterAttnBackend.init_cuda_graph_state

    def zeroed(self: Any, *args: Any, **kwargs: Any) -> Any:
        own(self, *args, **kwargs)
        self.cuda_graph_kv_last_page_len.zero_()

    monkeypatch.setattr(AiterAttnBackend, "init_cuda_graph_state", zeroed)
    _, step = life(m.run, arrive_then_decode(0))
    found = {(v.field, v.build) for v in ref.violations(step)}
    assert {("kv_last_page_len", "padded"), ("kv_last_page_len", "replay")} <= found, found


# -- sglang-aiter-mla-persist: aiter's persistent MLA kernel and its scheduler's plan ---------


@pytest.mark.parametrize("num_spec", [0, 2])
def test_the_persistent_kernel_is_planned_for_each_build_s_own_offsets(num_spec):
    """32 heads a rank: the backend keeps aiter's persistent MLA kernel on, and every
    decode or verify build (eager, padded, replayed, fresh) hands the kernel a plan made
    for its own offsets (``schedule_stale`` 0); the module's globals are put back after
    each engine's calls; every property holds."""
    m = _m()
    from sglang.srt.layers.attention import aiter_backend

    before = {name: getattr(aiter_backend, name) for name in m.AT_IMPORT}
    extend, step = life(m.run_persist, arrive_then_decode(num_spec))
    engine = m.PERSIST.engine
    assert engine.backend.use_mla and engine.module_state["_use_mla_ps_kernel"] is True
    assert {name: getattr(aiter_backend, name) for name in m.AT_IMPORT} == before
    assert [b.how for b in step.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("eager", "padded", "replay", "fresh"):
        assert _values(step, how, "schedule_stale") == [0] * len(_values(step, how, "kv_len"))
    w = num_spec + 1
    assert _values(step, "eager", "kv_len") == [5 + w, 3 + w, 1 + w]
    assert ref.violations(extend) == [] and ref.violations(step) == []


def test_a_graph_plan_left_at_the_capture_s_offsets_fails_replay(monkeypatch):
    """The graph's plan made once, at capture, and never again at replay (the replay's
    ``make_mla_meta_data`` skipped): the replayed kernel walks a plan of the capture's
    offsets; ``schedule_stale`` tells, where every offset is right."""
    m = _m()
    from sglang.srt.layers.attention.aiter_backend import AiterAttnBackend

    own = AiterAttnBackend.make_mla_meta_data

    def capture_only(self: Any, *args: Any, **kwargs: Any) -> Any:
        work = args[3]
        if work is getattr(self, "work_metadata", None) and hasattr(work, "attnfuzz_scheduled"):
            return None  # the persistent buffers, planned once already
        return own(self, *args, **kwargs)

    monkeypatch.setattr(AiterAttnBackend, "make_mla_meta_data", capture_only)
    _, step = life(m.run_persist, arrive_then_decode(0))
    found = {(v.prop, v.field, v.build) for v in ref.violations(step)}
    assert any(f == "schedule_stale" and b == "replay" for _, f, b in found), found
    assert not any(f == "schedule_stale" and b == "eager" for _, f, b in found), found
