"""SGLang's decode graph runner step on the FlashInfer backend (runner-step's
``sglang-flashinfer``), its stand-in for FlashInfer's planning wrappers, and its mutants."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from attnfuzz.adapters.sglang import flashinfer_stand_in as fi
from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.harness.errors import ContractError
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

# -- the stand-in for flashinfer's wrappers: FlashInfer's contract ------------------------------

WORKSPACE = torch.empty(16, dtype=torch.uint8)


def _i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _graph_decode(batch_size: int = 2, indices: int = 8) -> fi.BatchDecodeWithPagedKVCacheWrapper:
    return fi.BatchDecodeWithPagedKVCacheWrapper(
        WORKSPACE,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.zeros(batch_size + 1, dtype=torch.int32),
        paged_kv_indices_buffer=torch.zeros(indices, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.ones(batch_size, dtype=torch.int32),
    )


def _graph_prefill(batch_size: int = 2) -> fi.BatchPrefillWithPagedKVCacheWrapper:
    return fi.BatchPrefillWithPagedKVCacheWrapper(
        WORKSPACE,
        "NHD",
        use_cuda_graph=True,
        qo_indptr_buf=torch.zeros(batch_size + 1, dtype=torch.int32),
        paged_kv_indptr_buf=torch.zeros(batch_size + 1, dtype=torch.int32),
        paged_kv_indices_buf=torch.zeros(16, dtype=torch.int32),
        paged_kv_last_page_len_buf=torch.ones(batch_size, dtype=torch.int32),
    )


def test_an_eager_plan_keeps_the_arrays_it_was_given_and_records_a_copy():
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    indptr, indices, last = _i32([0, 2, 3]), _i32([7, 8, 9, 0]), _i32([1, 1])
    w.plan(indptr, indices, last, 2, 1, 64, 1)
    assert w._paged_kv_indptr_buf is indptr and w._paged_kv_indices_buf is indices
    (plan,) = w.plans
    indptr[1] = 1  # the record is a copy, of the indices the offsets reach
    assert plan.kv_indptr.tolist() == [0, 2, 3] and plan.kv_indices.tolist() == [7, 8, 9]


def test_a_graph_plan_copies_into_the_buffers_and_fast_decode_plan_copies_nothing():
    w = _graph_decode()
    w.plan(_i32([0, 2, 3]), _i32([7, 8, 9]), _i32([1, 1]), 2, 1, 64, 1)
    assert w._paged_kv_indptr_buf.tolist() == [0, 2, 3]
    assert w._paged_kv_indices_buf[:3].tolist() == [7, 8, 9]
    fi.fast_decode_plan(w, _i32([0, 1, 2]), _i32([5, 6]), _i32([1, 1]), 2, 1, 64, 1)
    assert w._paged_kv_indptr_buf.tolist() == [0, 2, 3]  # the caller writes the buffers
    assert [p.kind for p in w.plans] == ["plan", "fast_decode_plan"]


def test_a_graph_prefill_latches_its_query_rows_at_its_first_plan():
    w = _graph_prefill()
    args = (_i32([0, 2, 3]), _i32([7, 8, 9]), _i32([1, 1]), 2, 1, 64, 1)
    w.plan(_i32([0, 2, 4]), *args)
    assert w._qo_indptr_buf.tolist() == [0, 2, 4]
    w.plan(_i32([0, 1, 3]), *args)
    with pytest.raises(fi.PlanContractError, match="total number of rows"):
        w.plan(_i32([0, 3, 6]), *args)


@pytest.mark.parametrize(
    "indptr, indices, last, why",
    [
        ([0, 2, 3, 4], [7, 8, 9, 1], [1, 1, 1], "batch size should be fixed"),
        ([0, 2, 3], list(range(9)), [1, 1], "allocated buffer"),
        ([0, 3, 2], [7, 8, 9], [1, 1], "rise from 0"),
        ([1, 2, 3], [7, 8, 9], [1, 1], "rise from 0"),
        ([0, 2, 4], [7, 8, 9], [1, 1], "past the 3 entries"),
        ([0, 2, 3], [7, 8, 9], [1, 0], "kv_last_page_len"),
        ([0, 2, 3], [7, 8, 9], [1, 2], "kv_last_page_len"),
    ],
)
def test_a_graph_decode_plan_refuses_what_flashinfer_refuses(indptr, indices, last, why):
    with pytest.raises(fi.PlanContractError, match=why):
        _graph_decode().plan(_i32(indptr), _i32(indices), _i32(last), 2, 1, 64, 1)


def test_the_refusals_are_findings_and_the_graph_buffers_are_checked_when_built():
    assert issubclass(fi.PlanContractError, ContractError)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    with pytest.raises(fi.PlanContractError, match="multiple"):
        w.plan(_i32([0, 1]), _i32([3]), _i32([1]), 3, 2, 64, 1)
    with pytest.raises(fi.PlanContractError, match="int32"):
        w.plan(_i32([0, 1]).long(), _i32([3]), _i32([1]), 2, 1, 64, 1)
    with pytest.raises(fi.PlanContractError, match="batch_size \\+ 1"):
        fi.BatchDecodeWithPagedKVCacheWrapper(
            WORKSPACE,
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(2, dtype=torch.int32),
            paged_kv_indices_buffer=torch.zeros(4, dtype=torch.int32),
            paged_kv_last_page_len_buffer=torch.ones(2, dtype=torch.int32),
        )
    with pytest.raises(fi.PlanContractError, match="torch.Tensor"):
        fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, use_cuda_graph=True)
    with pytest.raises(RuntimeError, match="stand-in"):
        w.run(None, None)


def test_the_stand_in_is_bound_only_while_the_backend_plans():
    module = types.ModuleType("backend")
    before = sys.modules.get("flashinfer")
    with fi.bound(module):
        if not fi.vendor_imports():
            assert (
                module.BatchDecodeWithPagedKVCacheWrapper is fi.BatchDecodeWithPagedKVCacheWrapper
            )
            assert sys.modules["flashinfer"].fast_decode_plan is fi.fast_decode_plan
    assert sys.modules.get("flashinfer") is before
    assert not hasattr(module, "BatchDecodeWithPagedKVCacheWrapper") or fi.vendor_imports()


# -- the engine's step -----------------------------------------------------------------------


def _life(trace: Trace, name: str = "run") -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_flashinfer.<name>``."""
    from attnfuzz.adapters.sglang import runner_step_flashinfer

    run = getattr(runner_step_flashinfer, name)
    return life(run, trace)


@_sglang
def test_a_decode_of_three_requests_replays_the_graph_of_four():
    from attnfuzz.adapters.sglang.runner_step_flashinfer import ENGINE

    arrival, second = _life(_arrive_then_decode(num_spec=0))
    # The arrival: an extend over the ragged wrapper, its paged part the prefixes (none).
    assert _values(arrival, "eager", "kv_indptr") == [0, 0, 0, 0]
    assert _values(arrival, "eager", "qo_indptr") == [0, 5, 8, 9]
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    # Pages of 4 tokens, planned as pages of one: kv_indices are token slots.
    assert _values(second, "eager", "kv_indices") == [
        [4, 5, 6, 7, 8, 9],
        [12, 13, 14, 15, 0, 0],
        [20, 21, 0, 0, 0, 0],
    ]
    for how in ("padded", "replay"):
        # The padding request: the fill length 1, the reserved row 0, its slot 0.
        assert _values(second, how, "kv_indptr") == [0, 6, 10, 12, 13], how
        assert _values(second, how, "kv_indices")[3] == [0, 0, 0, 0, 0, 0], how
        assert _values(second, how, "kv_last_page_len") == [1, 1, 1, 1], how
    assert ref.violations(arrival) == [] and ref.violations(second) == []
    # The graph of four was captured by plan and replayed by fast_decode_plan.
    (wrapper,) = ENGINE.engine.backend.decode_cuda_graph_metadata[4]
    if isinstance(wrapper, fi._Wrapper):  # stood in (no flashinfer here)
        assert [p.kind for p in wrapper.plans] == ["plan", "fast_decode_plan"]


@_sglang
def test_a_verify_reads_its_drafts_in_the_graph_as_eagerly():
    _, verify = _life(_arrive_then_decode(num_spec=1))
    # Each request's committed prefix and its next_n 2 tokens; the padding request's
    # the fill 1 and its window.
    assert _values(verify, "eager", "kv_indptr") == [0, 7, 12, 15]
    assert _values(verify, "replay", "kv_indptr") == [0, 7, 12, 15, 18]
    assert _values(verify, "replay", "qo_indptr") == [0, 2, 4, 6, 8]
    assert ref.violations(verify) == []


@_sglang
@pytest.mark.parametrize(
    "smallest, mutant",
    [
        ("smallest_indptr_off_buffer", "run_indptr_off_buffer"),
        ("smallest_window_forgotten", "run_window_forgotten"),
    ],
)
def test_each_mutant_fails_its_property_on_its_smallest_trace(smallest, mutant):
    """The correct engine holds every property on the trace; each mutant's graph reads
    other offsets than its eager build."""
    from attnfuzz.adapters.sglang import runner_step_flashinfer

    trace = getattr(runner_step_flashinfer, smallest)()
    assert all(ref.violations(out) == [] for out in _life(trace))
    *_, out = _life(trace, mutant)
    found = {(v.prop, v.build, v.field) for v in ref.violations(out)}
    assert found >= {
        ("padding invariance", "padded", "kv_indptr"),
        ("replay equals eager", "replay", "kv_indptr"),
    }


@_sglang
def test_where_the_mutants_reach():
    from attnfuzz.adapters.sglang import runner_step_flashinfer as fi_step

    decode, verify = fi_step.smallest_indptr_off_buffer(), fi_step.smallest_window_forgotten()
    assert fi_step.reach_decode_replay(decode) and not fi_step.reach_decode_replay(verify)
    assert fi_step.reach_verify_replay(verify) and not fi_step.reach_verify_replay(decode)
    arrival = Trace(decode.config, decode.steps[:1])  # an extend alone: nothing replayed
    assert not fi_step.reach_decode_replay(arrival)


# The derandomized searches (each mutant found, the engine passing) are test_entries.py's,
# over every implementation of runner-step: not repeated here.
