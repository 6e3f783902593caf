"""SGLang's decode graph runner step on FlashInfer's MLA backend (runner-step's
``sglang-flashinfer-mla``): the stand-in for FlashInfer's MLA wrapper by its contract,
what the engine builds, and its properties shown failing on builds broken by hand."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from attnfuzz.adapters.sglang import flashinfer_mla_stand_in as mla
from attnfuzz.adapters.sglang.flashinfer_stand_in import PlanContractError
from attnfuzz.adapters.sglang.testing import arrive_then_decode, life, sglang_test
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.reference import runner_step as ref

# -- the stand-in for flashinfer's MLA wrapper: FlashInfer's contract ---------------------------

WORKSPACE = torch.empty(16, dtype=torch.uint8)
PLAN_REST = (2, 32, 8, 1, False, 1.0, torch.bfloat16, torch.bfloat16)


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _graph(batch_size: int = 2, indices: int = 8) -> mla.BatchMLAPagedAttentionWrapper:
    return mla.BatchMLAPagedAttentionWrapper(
        WORKSPACE,
        use_cuda_graph=True,
        qo_indptr=torch.zeros(batch_size + 1, dtype=torch.int32),
        kv_indptr=torch.zeros(batch_size + 1, dtype=torch.int32),
        kv_indices=torch.zeros(indices, dtype=torch.int32),
        kv_len_arr=torch.zeros(batch_size, dtype=torch.int32),
    )


def test_an_eager_plan_keeps_the_arrays_and_writes_their_schedule():
    w = mla.BatchMLAPagedAttentionWrapper(WORKSPACE)
    qo, kv, indices, lens = _i32([0, 1, 2]), _i32([0, 3, 5]), _i32([7, 8, 9, 4, 5]), _i32([3, 2])
    w.plan(qo, kv, indices, lens, *PLAN_REST)
    assert w._kv_indices_buf is indices and w._kv_indptr_buf is kv
    kv[1] = 1  # the schedule is the plan's own, of the arrays as handed
    s = mla.schedule(w)
    assert (s.qo_indptr.tolist(), s.kv_indptr.tolist(), s.kv_len_arr.tolist()) == (
        [0, 1, 2], [0, 3, 5], [3, 2],
    )  # fmt: skip


def test_a_graph_plan_copies_into_the_buffers_and_the_module_plan_copies_nothing():
    """``plan`` copies into a graph wrapper's buffers; SGLang's ``fast_mla_decode_plan``
    calls ``_cached_module.plan`` alone, which rewrites the schedule and no buffer."""
    w = _graph()
    w.plan(_i32([0, 1, 2]), _i32([0, 3, 5]), _i32([7, 8, 9, 4, 5]), _i32([3, 2]), *PLAN_REST)
    assert w._kv_indptr_buf.tolist() == [0, 3, 5]
    assert w._kv_indices_buf[:5].tolist() == [7, 8, 9, 4, 5]
    assert w._cached_module is not None
    w._cached_module.plan(WORKSPACE, w._int_workspace_buffer, w._pin_memory_int_workspace_buffer,
                          _i32([0, 1, 2]), _i32([0, 1, 2]), _i32([1, 1]), 2, 32, False)  # fmt: skip
    assert w._kv_indptr_buf.tolist() == [0, 3, 5]
    assert mla.schedule(w).kv_len_arr.tolist() == [1, 1]


@pytest.mark.parametrize(
    "qo, kv, indices, lens, match",
    [
        ([0, 1, 2, 3], [0, 1, 2, 3], [1, 2, 3], [1, 1, 1], "batch size is fixed"),
        ([0, 1, 2], [0, 5, 9], list(range(9)), [5, 4], "past its graph buffer"),
        ([0, 1, 2], [0, 3, 5], [1, 2, 3], [3, 2], r"kv_indptr\[-1\]"),
        ([0, 1, 2], [0, 3, 5], [1, 2, 3, 4, 5], [3], "kv_len_arr must be int32 of shape"),
        ([0, 2, 1], [0, 3, 5], [1, 2, 3, 4, 5], [3, 2], "must rise from 0"),
    ],
)
def test_a_plan_refuses_what_flashinfer_excludes(qo, kv, indices, lens, match):
    with pytest.raises(PlanContractError, match=match):
        _graph().plan(_i32(qo), _i32(kv), _i32(indices), _i32(lens), *PLAN_REST)


def test_a_graph_wrapper_needs_every_buffer():
    with pytest.raises(PlanContractError, match="kv_len_arr should be a torch.Tensor"):
        mla.BatchMLAPagedAttentionWrapper(
            WORKSPACE, use_cuda_graph=True, qo_indptr=_i32([0]), kv_indptr=_i32([0]),
            kv_indices=_i32([0]),
        )  # fmt: skip


# -- the engine -------------------------------------------------------------------------------


def _m() -> Any:
    from attnfuzz.adapters.sglang import runner_step_flashinfer_mla

    runner_step_flashinfer_mla.prepare()  # SGLang imported as the adapter imports it
    return runner_step_flashinfer_mla


@sglang_test
@pytest.mark.parametrize("num_spec", [0, 2])
def test_each_build_reads_the_requests_keys_and_every_property_holds(num_spec):
    """Three requests arrive (a ragged extend: no prefix), then decode or verify in the
    graph of four: the MLA kernel's schedule reads each request's committed keys (and a
    verify's window), eager, at ``load_batch`` and in the replayed wrapper alike; the
    padding row reads its fill length, one key; every property holds."""
    m = _m()
    from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

    extend, step = life(m.run, arrive_then_decode(num_spec))
    assert type(m.ENGINE.engine.backend) is FlashInferMLAAttnBackend
    assert [b.how for b in step.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(extend, "eager", "kv_len") == [5, 3, 1]  # the ragged kernel's own keys
    w = num_spec + 1
    seq = [5, 3, 1] if num_spec else [6, 4, 2]
    want = [s + w for s in seq] if num_spec else seq
    assert _values(step, "eager", "kv_len_arr") == want
    fill = 1 + (w if num_spec else 0)  # the padding rows' seq_lens fill, and a verify's window
    for how in ("padded", "replay"):
        got = _values(step, how, "kv_len_arr")
        assert len(got) > 3 and got == want + [fill] * (len(got) - 3), how
    assert ref.violations(extend) == [] and ref.violations(step) == []


@sglang_test
def test_a_replayed_decode_planned_on_the_capture_lengths_fails(monkeypatch):
    """The decode replay's fast plan handed one key a request (the capture's lengths)
    in place of the host lengths ``load_batch`` built: the replayed schedule reads one
    key a request, so replay equals eager fails on ``kv_len_arr`` and the keys read; the
    padded build, what the backend handed on, holds."""
    m = _m()
    from sglang.srt.layers.attention import flashinfer_mla_backend as module

    own = module.FlashInferMLAIndicesUpdaterDecode.call_begin_forward

    def stale(self: Any, *args: Any, **kwargs: Any) -> Any:
        if "kv_len_arr_cpu" in kwargs:
            kwargs["kv_len_arr_cpu"] = torch.ones_like(kwargs["kv_len_arr_cpu"])
        return own(self, *args, **kwargs)

    monkeypatch.setattr(module.FlashInferMLAIndicesUpdaterDecode, "call_begin_forward", stale)
    _, step = life(m.run, arrive_then_decode(0))
    found = {(v.prop, v.field, v.build) for v in ref.violations(step)}
    assert found == {("replay equals eager", f, "replay")
                     for f in ("kv_len_arr", "kv_read_end", "kv_len", "kv_slots")}  # fmt: skip


@sglang_test
def test_a_verify_replay_without_the_draft_window_fails(monkeypatch):
    """The verify replay's host lengths without the draft window (``seq_lens`` alone):
    the replayed verify reads none of its drafts' keys, so replay equals eager fails."""
    m = _m()
    from sglang.srt.layers.attention import flashinfer_mla_backend as module

    trace = arrive_then_decode(2)
    own = module.FlashInferMLAIndicesUpdaterPrefill.update

    def short(self: Any, *args: Any, kv_len_arr_cpu: Any = None, **kwargs: Any) -> Any:
        if kv_len_arr_cpu is not None:
            kv_len_arr_cpu = kv_len_arr_cpu - trace.config.next_n
        return own(self, *args, kv_len_arr_cpu=kv_len_arr_cpu, **kwargs)

    monkeypatch.setattr(module.FlashInferMLAIndicesUpdaterPrefill, "update", short)
    _, step = life(m.run, trace)
    found = {(v.prop, v.field, v.build) for v in ref.violations(step)}
    assert ("replay equals eager", "kv_len_arr", "replay") in found, found
