"""Target ``persistent-batch``: the reference by hand, the engine's life, the mutants' triggers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import persistent_batch as target_module
from attnfuzz.harness.testing import hand_case
from attnfuzz.kernels._triton import device
from attnfuzz.reference import persistent_batch as ref
from attnfuzz.reference.batch import PAD_PAGE, Batch, Case, runner_table_width
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.traces import traces
from hypothesis import HealthCheck, Phase, given, settings

TARGET = "persistent-batch"
MUTANTS = ("workspace-first-step", "stale-padding-rows", "row-reuse-page-count", "draft-rollback")
FIXED = ("triton", "reference")
SEARCH = settings(
    max_examples=30, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def target():
    return get_target(TARGET)


def one_step_traces():
    t = target()
    return traces(supports=t.cg_supports, varlen=t.varlen_decode, max_steps=1)


# -- the reference: the step's common metadata ---------------------------------------------------


def test_a_step_on_its_own_is_new_requests_with_all_their_pages_padded_to_the_graph():
    """next_n = 2: three decodes (6 tokens) replayed in the graph of 8 (R_pad = 4)."""
    case = hand_case((2, 2, 2), (1, 3, 5))
    inputs = ref.make_inputs(case)
    assert inputs.req_ids == (0, 1, 2) and inputs.is_new == (True, True, True)
    assert [len(p) for p in inputs.new_block_ids] == [1, 2, 2]  # cdiv(3, 4), cdiv(5, 4), ...
    assert (inputs.num_reqs_padded, inputs.num_slot_tokens) == (4, 8)
    want = ref.reference(case, inputs)
    assert want.query_start_loc.tolist() == [0, 2, 4, 6, 6]
    assert want.seq_lens.tolist() == [3, 5, 7, 0]
    # The runner's width, whole 128-token spans; the padding row is compared whole.
    assert want.block_table.shape == (4, ref.table_width(case.config))
    assert ref.table_width(case.config) == runner_table_width(case.config.max_model_len, 4)
    assert want.num_pages.tolist() == [1, 2, 2, ref.table_width(case.config)]
    assert (want.block_table[3] == PAD_PAGE).all()
    for r, pages in enumerate(inputs.new_block_ids):
        assert tuple(want.block_table[r, : len(pages)]) == pages
    assert (want.block_table[3] == ref.PAD_PAGE).all()
    assert want.slot_mapping[6:].tolist() == [-1, -1]
    first = inputs.new_block_ids[0][0]  # request 0's tokens at positions 1 and 2 of its page
    assert want.slot_mapping[:2].tolist() == [4 * first + 1, 4 * first + 2]


def test_a_trace_step_hands_on_only_the_pages_gained_and_who_is_new():
    """Step 2 of the draft-rollback trace: request 0 runs on with no new page; a step
    where it gains one hands on that one only."""
    trace = target_module.smallest_draft_rollback()
    inputs = ref.make_inputs(trace.case(2))
    assert inputs.is_new == (False,) and inputs.new_block_ids == ((),)
    want = ref.reference(trace.case(2), inputs)
    assert want.query_start_loc.tolist() == [0, 2]
    assert want.seq_lens.tolist() == [4]  # 2 computed (the draft rolled back) + 2
    assert want.slot_mapping.tolist() == [1 * 4 + 2, 1 * 4 + 3]  # page 1, positions 2 and 3
    assert want.num_pages.tolist() == [1]
    grown = Batch((2,), (3,), req_ids=(0,), pages=((1, 7),), new_pages=(1,))  # a second page
    case = Case(trace.config, grown)
    inputs = ref.make_inputs(case)
    assert inputs.is_new == (False,) and inputs.new_block_ids == ((7,),)
    assert ref.reference(case, inputs).slot_mapping[:3].tolist() == [6, 7, 7 * 4 + 0]


def test_a_request_that_gains_all_its_pages_is_new_to_the_engine():
    """Preempted and resumed between two steps: present in both, yet new (fresh pages)."""
    resumed = Batch((0,), (1,), req_ids=(0,), pages=((5,),), new_pages=(1,))
    running = Batch((1,), (1,), req_ids=(0,), pages=((5,),), new_pages=(0,))
    assert ref.new_to_engine(resumed) == (True,) and ref.new_to_engine(running) == (False,)


# -- the fixed implementations over an engine's life ---------------------------------------------


@pytest.mark.parametrize("impl", FIXED)
def test_fixed_implementations_pass_drawn_traces(impl):
    t = target()
    i = t.implementations[impl]

    @SEARCH
    @given(t.traces())
    def check(trace):
        verdict = t.judge_trace(i, trace)
        assert verdict.ok, (trace, str(verdict))

    check()


def test_a_finished_requests_row_goes_to_the_next_arrival_and_the_buffers_stay():
    t = target()
    impl = t.implementations["triton"]
    trace = target_module.smallest_row_reuse_page_count()
    impl.fn.new_engine()
    first = impl.fn(ref.make_inputs(trace.case(0), device()))
    assert impl.fn.rows == {0: 0}
    second = impl.fn(ref.make_inputs(trace.case(1), device()))
    assert impl.fn.rows == {1: 0} and impl.fn.num_pages[0] == 1  # row 0 reused, reset
    for field in ref.FIELDS:  # every step's fields start the same persistent buffers
        a, b = getattr(first, field), getattr(second, field)
        assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert t.judge_trace(impl, trace).ok


def test_a_copy_instead_of_a_view_is_a_view_finding():
    import dataclasses

    from attnfuzz.harness.target import Implementation

    t = target()
    fixed = t.implementations["triton"].fn

    class Copying:
        def new_engine(self):
            fixed.new_engine()

        def __call__(self, inputs):
            out = fixed(inputs)
            return dataclasses.replace(out, seq_lens=out.seq_lens.clone())

    verdict = t.judge(Implementation("copy", Copying(), "user"), hand_case((2, 2, 2), (1, 3, 5)))
    assert [m.check for m in verdict.mismatches] == ["view"]


def test_stale_columns_past_a_requests_pages_are_not_compared():
    t = target()
    fixed = t.implementations["triton"].fn
    case = hand_case((2, 2, 2), (1, 3, 5))

    def stale_tail(inputs):
        out = fixed(inputs)
        out.block_table[0, 1:] = 12345  # past request 0's one page
        return out

    from attnfuzz.harness.target import Implementation

    assert t.judge(Implementation("tail", stale_tail, "user"), case).ok

    def wrong_page(inputs):
        out = fixed(inputs)
        out.block_table[1, 1] += 1  # request 1's second page
        return out

    verdict = t.judge(Implementation("page", wrong_page, "user"), case)
    assert [m.where for m in verdict.mismatches] == ["block_table[1, 1]"]


def test_the_slot_buffer_past_the_steps_slots_is_compared_to_its_end():
    """A slot an earlier, longer step left past ``T_slots`` fails (a kernel bounded by
    the buffer writes keys there); the reference and the Triton runner pad to the end."""
    from attnfuzz.harness.target import Implementation

    t = target()
    fixed = t.implementations["triton"].fn
    case = hand_case((2, 2, 2), (1, 3, 5))
    T_slots = ref.make_inputs(case, device()).num_slot_tokens

    def stale_slot(inputs):
        out = fixed(inputs)
        out.buffers["slot_mapping"][T_slots + 1] = 7  # a slot an earlier step left
        return out

    verdict = t.judge(Implementation("stale-slot", stale_slot, "user"), case)
    assert [(m.check, m.where) for m in verdict.mismatches] == [
        ("values", f"buffers.slot_mapping[{T_slots + 1}]")
    ], verdict
    for name in ("triton", "reference"):
        assert t.judge(t.implementations[name], case).ok


# -- the mutants: bugs of the engine's life ------------------------------------------------------


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_fails_its_smallest_trace_which_meets_its_trigger(mutant):
    t = target()
    impl = t.implementations[mutant]
    trace = impl.smallest()
    assert isinstance(trace, Trace) and 2 <= len(trace.steps) <= 3
    assert impl.reach(trace) and impl.trigger(trace)
    verdict = t.judge_trace(impl, trace)
    assert not verdict.ok and verdict.step == len(trace.steps) - 1, str(verdict)
    for fixed in FIXED:
        assert t.judge_trace(t.implementations[fixed], trace).ok, fixed
    # the trace without its last step meets nothing, and the mutant passes it
    shorter = trace.prefix(len(trace.steps) - 1)
    assert not impl.trigger(shorter) and t.judge_trace(impl, shorter).ok


def test_what_each_mutant_hands_on_at_its_smallest_trace():
    t = target()
    expected = {
        "workspace-first-step": "does not fit buffers of 1 rows and 2 tokens",
        "stale-padding-rows": "seq_lens[1]: expected 0, got 1",
        "row-reuse-page-count": "block_table[0, 0]: expected 2, got 1",
        "draft-rollback": "seq_lens[0]: expected 4, got 5",
    }
    for mutant, text in expected.items():
        impl = t.implementations[mutant]
        verdict = t.judge_trace(impl, impl.smallest())
        assert text in str(verdict), (mutant, str(verdict))


@pytest.mark.parametrize("mutant", MUTANTS)
def test_on_a_trace_of_one_step_each_mutant_is_the_fixed_implementation(mutant):
    """The bugs need history: a new engine's first step is right, and meets no trigger."""
    t = target()
    impl = t.implementations[mutant]

    @SEARCH
    @given(one_step_traces())
    def check(trace):
        assert not impl.reach(trace) and not impl.trigger(trace)
        assert not impl.trigger(trace.case(0))  # a case is a trace of one step
        verdict = t.judge_trace(impl, trace)
        assert verdict.ok, (trace, str(verdict))
        assert t.judge(impl, trace.case(0)).ok  # a step on its own: a new engine

    check()


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_trigger_is_exact_on_drawn_traces_and_implies_its_reach(mutant):
    t = target()
    impl = t.implementations[mutant]

    @SEARCH
    @given(t.traces())
    def check(trace):
        triggered = impl.trigger(trace)
        assert impl.reach(trace) or not triggered
        verdict = t.judge_trace(impl, trace)
        assert verdict.ok != triggered, (trace, str(verdict))

    check()


def test_row_reuse_is_hidden_when_the_new_request_gets_the_old_pages_in_order():
    """The trigger is exact, not "a row was reused": with the previous occupant's very
    pages, the kept page count writes past them and the pages read are right."""
    trace = target_module.smallest_row_reuse_page_count()
    same = Batch((0,), (1,), req_ids=(1,), pages=((1,),), new_pages=(1,))
    trace = Trace(trace.config, (trace.steps[0], same))
    t = target()
    impl = t.implementations["row-reuse-page-count"]
    assert impl.reach(trace) and not impl.trigger(trace)
    assert t.judge_trace(impl, trace).ok


@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_short_search_of_traces_finds_each_mutant(mutant):
    """A derandomized search over traces meets each bug within a few hundred traces,
    the stale padding rows included (a padded step with fewer requests than an
    earlier one); not shrunk here (the search is the point)."""
    t = target()
    impl = t.implementations[mutant]
    judged = [0]

    @settings(
        max_examples=300, database=None, deadline=None, derandomize=True,
        phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow],
    )  # fmt: skip
    @given(t.traces())
    def search(trace):
        judged[0] += 1
        assert t.judge_trace(impl, trace).ok

    with pytest.raises(AssertionError):
        search()
    assert judged[0] <= 300


def test_case_buffers_start_zeroed_so_a_first_step_leaves_no_stale_length():
    """Why stale-padding-rows needs an earlier step: the buffers of a new engine are zero."""
    t = target()
    fn = t.implementations["stale-padding-rows"].fn
    fn.new_engine()
    out = fn(ref.make_inputs(hand_case((2, 2, 2), (1, 3, 5)), device()))
    assert out.seq_lens.tolist()[3] == 0
    assert np.array_equal(out.buffers["seq_lens"][4:].cpu().numpy(), np.zeros(60, np.int32))
    assert out.seq_lens.dtype == torch.int32
