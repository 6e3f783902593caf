"""Target ``max-seq-len``: reference by hand, kernels, the checks, mutants end to end."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import max_seq_len as target_module
from attnfuzz.harness.testing import (
    assert_detected,
    assert_passes,
    hand_case,
    implementation_params,
    spec_config,
)
from attnfuzz.kernels import max_seq_len as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import max_seq_len as ref
from attnfuzz.reference.batch import Case, CommonMetadata, cdiv, split_decodes_and_prefills
from attnfuzz.reference.invariants import violations

TARGET = "max-seq-len"
MUTANTS = [m.name for m in get_target(TARGET).mutants if not m.engine]  # attnfuzz's own
NAN = float("nan")
DEVICE = device()  # where the kernels run: tensors handed to them live there


def hand_inputs(capturing: bool = False, num_spec_steps: int = 2) -> ref.MaxSeqLenInputs:
    """Two requests and one padding row; pages of 2 slots, D = 1, max_model_len 8 (W = 4).

    Request 0: seq_len 3 in pages [2, 0]; entry 2 is stale (poisoned page 4),
    entry 3 garbage (9 >= num_blocks 5). Request 1: seq_len 1 in page 3;
    entry 1 garbage (7), entry 2 poisoned page 1, entry 3 request 0's page 0.
    Row 2 pads the graph (seq_len 0, pad page 0). Pages 1 and 4 belong to no
    request: their keys are NaN. Upper bounds: 4 and 1 for the requests (4 is
    one above seq_len 3: a draft counted as accepted), 0 for the padding row.
    The step's description (``config``, ``common``, ``split``: one token each) is
    not read by the kernels or the reference.
    """
    i32 = dict(dtype=torch.int32, device=DEVICE)
    config = spec_config(max_model_len=8, block_size=2, num_spec=num_spec_steps, head_dim=1)
    table = [[2, 0, 4, 9], [3, 7, 1, 0], [0, 0, 0, 0]]
    common = CommonMetadata(
        query_start_loc=np.array([0, 1, 2, 2], np.int32),
        seq_lens=np.array([3, 1, 0], np.int32),
        block_table=np.array(table, np.int32),
        slot_mapping=np.array([4, 6], np.int64),
        num_reqs=3,
        num_actual_tokens=2,
        max_query_len=1,
        max_seq_len=3,
        num_real_reqs=2,
        num_real_tokens=2,
        num_blocks=5,
        padded=True,
    )
    return ref.MaxSeqLenInputs(
        config=config,
        common=common,
        split=split_decodes_and_prefills(common, config.threshold),
        seq_lens_cpu_upper_bound=torch.tensor([4, 1, 0], dtype=torch.int32),
        seq_lens=torch.tensor([3, 1, 0], **i32),
        block_table=torch.tensor(table, **i32),
        kv_cache=torch.tensor(
            [[[1.0], [-2.0]], [[NAN], [NAN]], [[2.0], [1.0]], [[-1.0], [2.0]], [[NAN], [NAN]]],
            device=DEVICE,
        ),
        num_reqs=3,
        num_real_reqs=2,
        capturing=capturing,
        num_spec_steps=num_spec_steps,
        max_model_len=8,
    )


def test_reference_by_hand():
    e = ref.reference(None, hand_inputs())
    # model state: max(4, 1) = 4 -> 2 entries; draft: min(4 + 2, 8) = 6 -> 3 entries
    assert (e.max_seq_len, e.draft_max_seq_len, e.lower, e.upper_max) == (4, 6, 3, 4)
    # request 0: 1*2 + 2*1 (page 2) + 3*1 (page 0); request 1: 1*-1 (page 3)
    np.testing.assert_array_equal(e.out[:, :, 0], [[7, -1, 0], [7, -1, 0]])
    assert e.pages_walked.tolist() == [[2, 2, 2], [3, 3, 3]]
    assert e.pages_needed.tolist() == [[2, 1, 0], [2, 1, 0]]
    # request 1 reads garbage id 7 on both paths; the draft's third entry is poison, not garbage
    assert e.oob_pages.tolist() == [[0, 1, 0], [0, 1, 0]]


def test_reference_bounds_at_capture_and_without_a_draft():
    e = ref.reference(None, hand_inputs(capturing=True))
    assert (e.max_seq_len, e.draft_max_seq_len) == (8, 8)
    assert e.pages_walked.tolist() == [[4, 4, 4], [4, 4, 4]]
    assert e.oob_pages.tolist() == [[1, 1, 0], [1, 1, 0]]  # garbage 9 and 7
    assert e.pages_needed.tolist() == [[2, 1, 0], [2, 1, 0]]  # the walk adds no needed page
    np.testing.assert_array_equal(e.out[:, :, 0], [[7, -1, 0], [7, -1, 0]])
    for num_spec_steps in (0, 1):  # no drafter, or one that builds no metadata of its own
        e = ref.reference(None, hand_inputs(num_spec_steps=num_spec_steps))
        assert (e.max_seq_len, e.draft_max_seq_len) == (4, None)
        assert e.pages_walked[1].tolist() == [0, 0, 0] and not e.out[1].any()


def test_draft_bound_is_clamped_at_the_model_limit():
    upper = np.array([7, 2], dtype=np.int32)
    assert ref.max_seq_lens(upper, 2, False, 3, 8) == (7, 8)
    assert ref.max_seq_lens(upper, 2, False, 2, 10) == (7, 9)
    assert ref.max_seq_lens(upper, 1, False, 0, 8) == (7, None)
    assert ref.max_seq_lens(upper, 2, True, 0, 8) == (8, None)


def test_the_draft_bound_needs_the_drafters_decode_steps():
    """With one speculative token the drafter runs only its prefill, on the model
    state's metadata: no draft bound (vLLM 0.33.0 ``TargetDependentARSpeculator.propose``
    returns when ``num_speculative_tokens <= 1``)."""
    upper = np.array([7, 2], dtype=np.int32)
    assert ref.max_seq_lens(upper, 2, False, 1, 8) == (7, None)
    assert ref.max_seq_lens(upper, 2, True, 1, 8) == (8, None)
    assert not ref.has_draft(1) and ref.has_draft(2)


@pytest.mark.parametrize("capturing", [False, True])
@pytest.mark.parametrize("num_spec_steps", [0, 1, 2])
def test_triton_matches_the_hand_case(capturing, num_spec_steps):
    inputs = hand_inputs(capturing, num_spec_steps)
    expected = ref.reference(None, inputs)
    got = kernels.max_seq_len_metadata(inputs)
    assert target_module.compare(None, inputs, expected, got) == []
    assert int(got.max_seq_len) == expected.max_seq_len
    torch.testing.assert_close(got.out.cpu(), torch.as_tensor(expected.out))


def test_batch_max_seq_lens_reduces_only_the_rows_it_is_given():
    upper = torch.tensor([3, 9, 4, 12, 1], dtype=torch.int32, device=DEVICE)
    assert kernels.batch_max_seq_lens(upper, 3, 2, 10).tolist() == [9, 10]
    assert kernels.batch_max_seq_lens(upper, 1, 2, 10).tolist() == [3, 5]
    assert kernels.batch_max_seq_lens(upper, 5, 0, 16).tolist() == [12, 12]


def head(values: list, n: int) -> torch.Tensor:
    """The first ``n`` entries of ``values`` (int32): what follows them in memory is the rest."""
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)[:n]


def test_batch_max_seq_lens_refuses_more_rows_than_the_bounds_hold():
    """4 rows of 3 upper bounds: the 4th would be read past them (it holds a poison 99)."""
    with pytest.raises(ValueError, match="seq_lens_upper_bound must be .* at least 4 entries"):
        kernels.batch_max_seq_lens(head([3, 9, 4, 99], 3), 4, 2, 10)
    expanded = head([3, 99, 99], 1).expand(3)  # 3 rows in 1 element of memory
    with pytest.raises(ValueError, match="seq_lens_upper_bound must be a contiguous"):
        kernels.batch_max_seq_lens(expanded, 3, 2, 10)


def test_paged_walk_refuses_fewer_lengths_or_bounds_than_it_reads():
    """3 table rows and 2 seq_lens, or 1 bound for 2 paths: each refused, not read past
    (poisoned lengths and bounds follow them in memory)."""
    inputs = hand_inputs()
    walk = (inputs.kv_cache, inputs.block_table)
    bounds = head([4, 5], 2)
    with pytest.raises(ValueError, match="seq_lens must be .* at least 3 entries"):
        kernels.paged_walk(*walk, head([3, 1, 10**6], 2), bounds)
    with pytest.raises(ValueError, match="bounds must be .* at least 2 entries"):
        kernels.paged_walk(*walk, inputs.seq_lens, head([4, 10**6], 1))


def test_paged_walk_stays_in_its_rows_and_the_cache_whatever_the_bounds_say():
    """Bounds and lengths far past the table's width walk its 4 entries and no further;
    the garbage ids 9 and 7 (>= 5 pages) are counted, never loaded."""
    inputs = hand_inputs()
    huge = head([2**30, 2**30], 2)
    seq_lens = head([2**30, 2**30, 0], 3)
    out, walked, needed, oob = kernels.paged_walk(
        inputs.kv_cache, inputs.block_table, seq_lens, huge
    )
    assert walked.tolist() == [[4, 4, 4]] * 2 and oob.tolist() == [[1, 1, 0]] * 2
    assert needed.tolist() == [[3, 3, 0]] * 2  # every in-cache page of rows 0 and 1
    assert out.shape == (2, 3, 1)


def with_params(case: Case, capturing: int = 0) -> Case:
    return dataclasses.replace(case, params=(("capturing", capturing),))


def test_inputs_hold_fresh_bounds_stale_pages_and_poison():
    """The bounds are the engine's fresh host tensor (``GPUModelRunner.prepare_inputs``):
    one row per request the kernels see, 0 for padding requests; the block table
    still holds stale ids past each request's pages."""
    case = with_params(hand_case((2, 2, 2), (3, 9, 0), num_spec=1, block_size=2))
    meta = ref.describe(case)
    assert (meta.num_real_reqs, meta.num_reqs) == (3, 4)  # 6 tokens padded to 8
    inputs = ref.make_inputs(case)  # on the CPU
    upper = inputs.seq_lens_cpu_upper_bound
    assert upper.device.type == "cpu" and upper.dtype == torch.int32
    assert upper.shape == (meta.num_reqs,)
    upper = upper.numpy()
    np.testing.assert_array_equal(upper, ref.upper_bounds(case))
    seq_lens = np.asarray(case.batch.seq_lens)
    assert (upper[:3] >= seq_lens).all() and (upper[:3] <= seq_lens + 1).all()
    assert upper[3] == 0  # the padding request's row
    assert inputs.common.num_reqs == 4 and inputs.common.num_real_reqs == 3
    assert inputs.split.num_decodes == 4 and inputs.config == case.config
    table, kv = inputs.block_table.numpy(), inputs.kv_cache.numpy()
    num_blocks = kv.shape[0]
    owned = set()
    for r, s in enumerate(seq_lens):
        need = cdiv(int(s), 2)
        np.testing.assert_array_equal(table[r, :need], meta.block_table[r, :need])
        owned |= set(table[r, :need].tolist())
    stale = np.concatenate([table[r, cdiv(int(s), 2) :] for r, s in enumerate(seq_lens)])
    assert (stale >= num_blocks).any() and (stale < num_blocks).any()  # garbage and stale pages
    assert (stale < 2 * num_blocks).all() and (stale >= 0).all()
    assert not np.isnan(kv[sorted(owned)]).any()
    unowned = sorted(set(range(num_blocks)) - owned)
    assert unowned and np.isnan(kv[unowned]).all()


def judge(impl, case: Case) -> Verdict:
    target = get_target(TARGET)
    if isinstance(impl, str):
        impl = target.resolve(impl)
    return target.judge(impl, case)


def checks(verdict: Verdict) -> set[str]:
    return {m.check for m in verdict.mismatches}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_smallest_trigger_fails_the_bound_walk_and_page_bounds_only(mutant):
    target = get_target(TARGET)
    impl = target.resolve(mutant)
    case = impl.smallest()
    assert violations(case.config, case.batch) == [] and target.param_violations(case) == []
    assert impl.reach(case) and impl.trigger(case)
    assert judge("triton", case).ok and judge("reference", case).ok
    verdict = judge(mutant, case)
    assert verdict.key == "max_seq_len"
    # The over-walk reads stale ids (garbage among them); the masked values do not change.
    assert checks(verdict) == {"max_seq_len", "walk", "page_bounds"}, verdict


def test_smallest_cases_are_the_smallest_engines():
    target = get_target(TARGET)
    cases = {m.name: m.smallest() for m in target.mutants}
    model = cases["pr43991-model-len"]
    assert model.config.next_n == 1 and model.batch.seq_lens == (1,)
    draft = cases["pr43991-draft-model-len"]
    assert draft.config.next_n == 3 and draft.batch.seq_lens == (3,)


def test_the_over_walk_is_counted_and_changes_no_value():
    """The statistic of the smallest model-len trigger: 1 page needed, 1 vs 8 walked."""
    case = get_target(TARGET).resolve("pr43991-model-len").smallest()
    inputs = ref.make_inputs(case, DEVICE)
    fixed = kernels.max_seq_len_metadata(inputs)
    assert target_module.walk_statistic(fixed) == {"pages_walked": 1, "pages_needed": 1}
    buggy = kernels.mutant_model_len(inputs)
    assert target_module.walk_statistic(buggy) == {"pages_walked": 8, "pages_needed": 1}
    torch.testing.assert_close(buggy.out, fixed.out)


@pytest.mark.parametrize("impl", implementation_params(TARGET))
def test_mutants_agree_with_the_fix_at_capture(impl):
    """At capture every bound is max_model_len: no mutant can differ from the fix there."""
    case = with_params(hand_case((2, 2, 2), (3, 9, 0), num_spec=1), capturing=1)
    assert judge(impl, case).ok


def test_a_bound_over_the_padded_rows_is_the_fix():
    """Padding rows of the bounds are 0, so the maximum over the ``R_pad`` rows a full
    graph sees (vLLM's ``DefaultModelState.prepare_attn`` takes it) is the maximum
    over the real rows: the former mutant ``pr43991-padded-rows`` (stale padded
    rows) described a state the engine never builds."""
    case = with_params(hand_case((2, 2, 2), (3, 9, 0), num_spec=1))  # R = 3, R_pad = 4
    inputs = ref.make_inputs(case, DEVICE)
    over_padded = kernels._run(inputs, kernels._bounds(inputs, inputs.num_reqs))
    assert target_module.compare(case, inputs, ref.reference(case, inputs), over_padded) == []


# Broken implementations that no mutant covers: each shows a check failing on its own.


def unclamped_draft(inp: ref.MaxSeqLenInputs) -> ref.MaxSeqLenOutputs:
    """The draft's bound without ``min(..., max_model_len)``."""
    got = kernels.max_seq_len_metadata(inp)
    top = int(inp.seq_lens_cpu_upper_bound[: inp.num_real_reqs].max())
    return dataclasses.replace(got, draft_max_seq_len=top + inp.num_spec_steps)


def decodes_only(inp: ref.MaxSeqLenInputs) -> ref.MaxSeqLenOutputs:
    """Both bounds from the decodes' rows only (``split.num_decodes``), as if prefills
    never outgrew them."""
    return kernels._run(inp, kernels._bounds(inp, inp.split.num_decodes))


def full_width_walk(inp: ref.MaxSeqLenInputs) -> ref.MaxSeqLenOutputs:
    """Right bounds, but the consumer walks the whole block-table row."""
    got = kernels.max_seq_len_metadata(inp)
    bounds = torch.full((2,), inp.max_model_len, dtype=torch.int32, device=DEVICE)
    out, walked, needed, oob = kernels.paged_walk(
        inp.kv_cache, inp.block_table, inp.seq_lens, bounds
    )
    return dataclasses.replace(got, pages_walked=walked, pages_needed=needed, oob_pages=oob)


def page_granular(inp: ref.MaxSeqLenInputs) -> ref.MaxSeqLenOutputs:
    """Right bounds, but whole pages loaded and weighted by 0 past seq_len (0 * NaN = NaN)."""
    got = kernels.max_seq_len_metadata(inp)
    num_blocks, bs, D = inp.kv_cache.shape
    out = torch.zeros_like(got.out)
    for path, bound in enumerate([got.max_seq_len, got.draft_max_seq_len or 0]):
        for r in range(inp.num_reqs):
            for i in range(cdiv(int(bound), bs)):
                page = int(inp.block_table[r, i])
                if 0 <= page < num_blocks:
                    pos = torch.arange(i * bs, (i + 1) * bs, device=DEVICE)
                    weight = (pos + 1) * (pos < inp.seq_lens[r])
                    out[path, r] += weight.to(torch.float32) @ inp.kv_cache[page]
    return dataclasses.replace(got, out=out)


def test_invariant_check_catches_a_bound_past_the_model_limit():
    target = get_target(TARGET)
    inputs = hand_inputs(num_spec_steps=5)  # 4 + 5 > 8
    got = unclamped_draft(inputs)
    found = target.compare(None, inputs, ref.reference(None, inputs), got)
    assert [m.check for m in found][:2] == ["invariant", "max_seq_len"], found
    assert "max_model_len=8" in found[0].expected and found[0].got == "9"


def test_a_bound_over_the_decodes_only_is_caught():
    """Two decodes of 2 tokens (seq_lens 5, 4), then a 9-token prefill at seq_len 20:
    the decodes' bound (at most 6) walks too few pages of the prefill's row."""
    case = with_params(hand_case((2, 2, 9), (3, 2, 11), use_cudagraph=False))
    inputs = ref.make_inputs(case, DEVICE)
    assert inputs.split.num_decodes == 2 and inputs.num_real_reqs == 3
    found = get_target(TARGET).compare(
        case, inputs, ref.reference(case, inputs), decodes_only(inputs)
    )
    checks_found = {m.check for m in found}
    assert {"invariant", "max_seq_len", "walk", "values"} <= checks_found, found


def test_walk_check_catches_a_consumer_that_ignores_the_bound():
    target = get_target(TARGET)
    inputs = hand_inputs()
    found = target.compare(None, inputs, ref.reference(None, inputs), full_width_walk(inputs))
    assert {m.check for m in found} == {"walk", "page_bounds"}, found
    assert found[0].where == "pages_walked[0, 0] (model state)"


def test_values_check_catches_the_poison_of_an_unmasked_load():
    """The tight draft walk covers request 0's stale entry 2: poisoned page 4."""
    target = get_target(TARGET)
    inputs = hand_inputs()
    found = target.compare(None, inputs, ref.reference(None, inputs), page_granular(inputs))
    assert [m.check for m in found] == ["values"], found
    assert found[0].where == "out[1, 0, 0] (draft)"


def test_a_non_integer_bound_is_a_type_mismatch():
    inputs = hand_inputs()
    got = dataclasses.replace(kernels.max_seq_len_metadata(inputs), max_seq_len=4.0)
    found = target_module.compare(None, inputs, ref.reference(None, inputs), got)
    assert [m.check for m in found] == ["type"]
    got = dataclasses.replace(kernels.max_seq_len_metadata(inputs), draft_max_seq_len=None)
    found = target_module.compare(None, inputs, ref.reference(None, inputs), got)
    assert [(m.check, m.where) for m in found] == [("max_seq_len", "draft_max_seq_len")]


# A derandomized search draws the same cases for each of attnfuzz's implementations that
# pass it (same seed, same guiding statistics): the reference's (NumPy) in CI, Triton's nightly.
@pytest.mark.parametrize(
    "impl", [pytest.param("triton", marks=[pytest.mark.slow, pytest.mark.nightly]), "reference"]
)
def test_the_search_draws_padded_and_speculative_steps(impl):
    result = assert_passes(TARGET, impl)  # the generic test's run (tests/test_entries.py)
    assert result.labels["padding_requests"] > 0 and result.labels["next_n>1"] > 0


@pytest.mark.parametrize("mutant", MUTANTS)
def test_each_mutant_is_found_outside_capture_on_its_bound(mutant):
    result = assert_detected(TARGET, mutant)  # the generic test's run
    assert result.verdict.key == "max_seq_len"
    assert result.case.param("capturing") == 0
    assert {"walk", "max_seq_len"} <= checks(result.verdict)


def test_pages_walked_vs_needed_is_reported_per_run():
    from attnfuzz.harness.runner import fuzz

    target = get_target(TARGET)
    fixed = fuzz(target, target.resolve("triton"), max_examples=30, rng_seed=0, database=None)
    assert fixed.statistics["pages_walked"] >= fixed.statistics["pages_needed"] > 0
    smallest = target.resolve("pr43991-model-len").smallest()
    verdict = target.judge(target.resolve("pr43991-model-len"), smallest)
    fixed_verdict = target.judge(target.resolve("triton"), smallest)
    assert not verdict.ok and fixed_verdict.ok
    walked, needed = verdict.statistics["pages_walked"], verdict.statistics["pages_needed"]
    assert needed == fixed_verdict.statistics["pages_needed"]
    assert walked > fixed_verdict.statistics["pages_walked"] == needed  # the over-walk, counted
