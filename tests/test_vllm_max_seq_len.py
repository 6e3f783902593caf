"""Target ``max-seq-len`` on the installed vLLM's own model states and drafter: on a
release with #43991 (0.23.0 on) both pass and #43991 reverted is caught; on one
before it (0.21.0 to 0.22.1) the engine's own code is the bug, and it is found; the
inputs are the engine's (the fidelity change)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect

import numpy as np
import pytest
import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import assert_detected, assert_passes, hand_case
from attnfuzz.reference import max_seq_len as ref
from attnfuzz.reference.batch import Case

pytestmark = requires_vllm

TARGET = "max-seq-len"
ENGINES = ["vllm", "vllm-mamba-hybrid"]
UPSTREAM = {
    "upstream-pr43991-model-len": "pr43991-model-len",
    "upstream-pr43991-draft-model-len": "pr43991-draft-model-len",
}


def adapter():
    from attnfuzz.adapters.vllm import max_seq_len

    return max_seq_len


def drafters():
    from attnfuzz.adapters.vllm import max_seq_len_drafters

    return max_seq_len_drafters


def has_fix() -> bool:
    """The release carries #43991: its drafter is ``DraftModelSpeculator`` (0.23.0 on,
    the release #43991 is first in); before, ``EagleSpeculator`` and the model
    state's ``max_model_len`` are the pre-fix code."""
    from attnfuzz.adapters.vllm import unavailable

    return unavailable() is None and drafters().has_draft_max_seq_len()


FIXED = has_fix()
with_fix = pytest.mark.skipif(
    not FIXED, reason="this vLLM predates #43991: there is no fix to revert or to pass"
)
without_fix = pytest.mark.skipif(FIXED, reason="this vLLM carries #43991's fix")


def with_params(case: Case, capturing: int = 0) -> Case:
    return dataclasses.replace(case, params=(("capturing", capturing),))


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


@with_fix
@pytest.mark.parametrize("impl", ENGINES)
def test_vllm_s_search_draws_padded_and_speculative_steps(impl):
    result = assert_passes(TARGET, impl)  # the generic test's run (tests/test_entries.py)
    assert result.labels["padding_requests"] > 0 and result.labels["next_n>1"] > 0


@with_fix
@pytest.mark.parametrize("upstream", UPSTREAM)
def test_upstream_mutant_is_found_outside_capture_on_its_bound(upstream):
    result = assert_detected(TARGET, upstream)  # the generic test's run
    assert result.verdict.key == "max_seq_len"
    assert result.case.param("capturing") == 0


@with_fix
@pytest.mark.parametrize("upstream", UPSTREAM)
def test_upstream_mutant_fails_the_smallest_trigger_of_its_recreation(upstream):
    target = get_target(TARGET)
    impl, recreated = target.resolve(upstream), target.resolve(UPSTREAM[upstream])
    case = impl.smallest()
    assert impl.trigger(case) and case == recreated.smallest()
    for engine in ENGINES:
        assert judge(engine, case).ok
    verdict = judge(upstream, case)
    assert {m.check for m in verdict.mismatches} == {"max_seq_len", "walk", "page_bounds"}
    assert not judge(UPSTREAM[upstream], case).ok


@without_fix
def test_before_43991_vllms_own_code_is_the_bug():
    """Before #43991 ``MambaHybridModelState.prepare_attn`` passes ``max_model_len``
    outside capture, and so does the drafter (``EagleSpeculator._build_draft_attn_metadata``):
    each fails the smallest trigger of its re-created mutant, on that bound alone.
    ``DefaultModelState`` (fixed by #40654) and V1's runner take the tight bound."""
    from attnfuzz.harness.targets import max_seq_len as t

    model_case, draft_case = t.smallest_model_len(), t.smallest_draft_model_len()
    bad = [(m.check, m.where) for m in judge("vllm-mamba-hybrid", model_case).mismatches]
    assert ("max_seq_len", "max_seq_len") in bad
    assert judge("vllm", model_case).ok and judge("vllm-v1", model_case).ok
    for engine in ("vllm", "vllm-v1"):
        bad = [(m.check, m.where) for m in judge(engine, draft_case).mismatches]
        assert ("max_seq_len", "draft_max_seq_len") in bad
        assert ("max_seq_len", "max_seq_len") not in bad


@without_fix
def test_before_43991_the_upstream_mutants_are_unavailable():
    """There is no fix to revert: each says so, naming the fixed drafter's module."""
    target = get_target(TARGET)
    for upstream in UPSTREAM:
        reason = target.implementations[upstream].why_unavailable()
        assert reason is not None and "spec_decode.speculator" in reason


def test_the_drafter_is_the_one_the_runners_init_speculator_builds():
    """MTP's drafter where the release has it (``MTPSpeculator`` on
    ``DraftModelSpeculator``), else ``EagleSpeculator`` (whose ``use_eagle()``
    covers "mtp")."""
    case = spec2_case()
    engine = adapter()._engine_for(case.config, torch.device("cpu"), "default", False)
    expected = "MTPSpeculator" if FIXED else "EagleSpeculator"
    assert type(engine.speculator).__name__ == expected


def spec2_case(capturing: int = 0) -> Case:
    """next_n = 3: three decodes of 3 tokens (seq_lens 6, 12, 3), 9 tokens padded to a
    graph of 12, so R = 3 and R_pad = 4."""
    case = hand_case((3, 3, 3), (3, 9, 0), num_spec=2, cudagraph_capture_sizes=(3, 6, 12, 24))
    return with_params(case, capturing)


def test_the_bounds_are_vllms_by_hand():
    """vLLM takes ``max(upper[:R_pad])`` (a full graph) for the model state and
    ``min(max + 2, 64)`` for the draft; at capture both are ``max_model_len``.
    Before #43991 the drafter and ``MambaHybridModelState`` take ``max_model_len``
    always (``DefaultModelState`` was fixed before, by #40654)."""
    inputs = ref.make_inputs(spec2_case())
    upper = inputs.seq_lens_cpu_upper_bound.tolist()
    assert len(upper) == 4 and upper[3] == 0 and 12 <= upper[1] <= 14
    draft = max(upper) + 2 if FIXED else 64
    got = adapter().run(inputs)
    assert (got.max_seq_len, got.draft_max_seq_len) == (max(upper), draft)
    got = adapter().run_mamba_hybrid(inputs)
    assert (got.max_seq_len, got.draft_max_seq_len) == (max(upper) if FIXED else 64, draft)
    for run in (adapter().run, adapter().run_mamba_hybrid):
        got = run(ref.make_inputs(spec2_case(capturing=1)))
        assert (got.max_seq_len, got.draft_max_seq_len) == (64, 64)


def test_one_speculative_token_builds_no_draft_metadata():
    """Fidelity: with next_n = 2 vLLM's drafter runs only its prefill, on the model
    state's metadata (``TargetDependentARSpeculator.propose`` returns when
    ``num_speculative_tokens <= 1``): there is no draft bound. The old rule (a draft
    bound whenever ``num_spec > 0``) called that a bug; the re-created draft mutant
    is still caught where the draft's decode steps run."""
    target = get_target(TARGET)
    case = with_params(hand_case((2, 2, 2), (3, 9, 0)))  # num_spec = 1
    inputs = ref.make_inputs(case)
    got = adapter().run(inputs)
    assert got.draft_max_seq_len is None and not got.pages_walked[1].any()
    expected = ref.reference(case, inputs)
    top = expected.upper_max
    old = dataclasses.replace(expected, draft_max_seq_len=min(top + 1, 64))
    found = target.compare(case, inputs, old, got)
    assert ("max_seq_len", "draft_max_seq_len") in [(m.check, m.where) for m in found]
    assert judge("vllm", case).ok
    assert not judge("pr43991-draft-model-len", spec2_case()).ok
    assert judge("vllm", spec2_case()).ok == FIXED  # before #43991: the draft's bug


def test_without_a_drafter_there_is_no_draft_bound():
    case = with_params(hand_case((1, 5), (4, 0), num_spec=0, cudagraph_capture_sizes=(1, 2, 4)))
    got = adapter().run(ref.make_inputs(case))
    assert got.max_seq_len == 5 and got.draft_max_seq_len is None


def test_more_drafts_than_one_reach_the_clamp_at_the_model_limit():
    """num_spec = 3: 62 + 3 is past max_model_len 64, so the draft's bound is clamped."""
    case = with_params(hand_case((4, 4), (58, 10), num_spec=3, cudagraph_capture_sizes=(4, 8, 16)))
    inputs = ref.make_inputs(case)
    top = int(inputs.seq_lens_cpu_upper_bound.max())
    got = adapter().run(inputs)
    assert got.max_seq_len == top and got.draft_max_seq_len == min(top + 3, 64) == 64
    assert get_target(TARGET).judge(get_target(TARGET).resolve("vllm"), case).ok


# ---------------------------------------------------------------------------
# Fidelity: the bounds are a fresh [R_pad] host tensor, padding rows 0
# ---------------------------------------------------------------------------


def _old_inputs(case: Case) -> ref.MaxSeqLenInputs:
    """The inputs as the model had them before: a persistent ``[max_num_seqs]`` buffer
    whose rows past ``R`` are stale (here ``max_model_len``, the largest a stale row
    could hold)."""
    inputs = ref.make_inputs(case)
    R = inputs.num_real_reqs
    old = torch.full((case.config.max_num_seqs,), case.config.max_model_len, dtype=torch.int32)
    old[:R] = inputs.seq_lens_cpu_upper_bound[:R]
    return dataclasses.replace(inputs, seq_lens_cpu_upper_bound=old)


def test_old_stale_padded_rows_made_the_oracle_fail_vllms_correct_full_graph():
    """vLLM 0.33.0's ``DefaultModelState.prepare_attn`` takes ``max(upper[:num_reqs])``
    with ``num_reqs = num_reqs_after_padding`` in a full graph: correct, because
    ``GPUModelRunner.prepare_inputs`` builds the bounds afresh with 0 in the padding
    rows. On the old model's stale rows the same correct code read a stale bound, and
    the oracle (max over the real rows) called it a bug. With the engine's real
    bounds vLLM passes and the re-created mutants are still caught."""
    target = get_target(TARGET)
    case = spec2_case()  # R = 3, R_pad = 4
    old = _old_inputs(case)
    got = adapter().run(old)
    assert got.max_seq_len == 64  # the stale padding row
    found = target.compare(case, old, ref.reference(case, old), got)
    wheres = [m.where for m in found if m.check == "max_seq_len"]
    # Before #43991 the drafter's bound is max_model_len whatever the rows hold.
    assert wheres == (["max_seq_len"] if FIXED else ["max_seq_len", "draft_max_seq_len"])

    assert judge("vllm", case).ok == FIXED and judge("vllm-mamba-hybrid", case).ok == FIXED
    for recreated in ("pr43991-model-len", "pr43991-draft-model-len"):
        assert not judge(recreated, case).ok


def test_vllm_reads_the_padded_rows_only_in_a_full_graph():
    """A padded step (FULL) reads ``R_pad`` rows, any other step ``R``: a poison past
    them is never read (the bounds are sliced, not scanned to their end)."""
    case = with_params(hand_case((2, 2, 2), (3, 9, 0)))  # R = 3, R_pad = 4
    inputs = ref.make_inputs(case)
    upper = inputs.seq_lens_cpu_upper_bound
    poisoned = torch.cat([upper, torch.tensor([10**6], dtype=torch.int32)])
    got = adapter().run(dataclasses.replace(inputs, seq_lens_cpu_upper_bound=poisoned))
    assert got.max_seq_len == int(upper.max())
    padding = upper.clone()
    padding[3] = 63  # not what the engine builds: proof that vLLM reads row 3 in a full graph
    got = adapter().run(dataclasses.replace(inputs, seq_lens_cpu_upper_bound=padding))
    assert got.max_seq_len == 63


# ---------------------------------------------------------------------------
# The reverts differ from vLLM 0.33.0 in the lines #43991 changed, nothing else
# ---------------------------------------------------------------------------


def _changed_lines(
    cls: type, name: str, edits: list[tuple[str, str]], follow_on: frozenset[str] = frozenset()
) -> list[str]:
    fixed = inspect.getsource(getattr(cls, name))
    reverted = fixed
    for old, new in edits:
        assert fixed.count(old) == 1 or (old in follow_on and fixed.count(old) == 0)
        reverted = reverted.replace(old, new)
    diff = difflib.unified_diff(fixed.splitlines(), reverted.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@with_fix
def test_the_reverted_model_state_changes_only_the_bound():
    """The bound block and the call's argument; where the release passes
    ``seq_lens_cpu_upper_bound=`` (0.25.0 on), that argument re-pointed too."""
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    edits, follow_on = adapter()._PRE_FIX_MODEL_STATE, adapter()._FOLLOW_ON
    lines = _changed_lines(MambaHybridModelState, "prepare_attn", edits, follow_on)
    passed = inspect.getsource(MambaHybridModelState.prepare_attn).count(edits[2][0]) == 1
    assert lines == [
        "-        seq_lens_cpu_upper_bound = input_batch.seq_lens_cpu_upper_bound",
        "-        if for_capture:",
        "-            # Capture with worst-case max_seq_len so the graph is valid at any replay.",
        "-            max_seq_len = self.max_model_len",
        "-        else:",
        "-            max_seq_len = seq_lens_cpu_upper_bound[:num_reqs].max().item()",
        "-            max_seq_len=max_seq_len,",
        "+            max_seq_len=self.max_model_len,",
    ] + (
        [
            "-            seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound,",
            "+            seq_lens_cpu_upper_bound=input_batch.seq_lens_cpu_upper_bound,",
        ]
        if passed
        else []
    )


@with_fix
def test_the_reverted_draft_changes_one_line():
    """The decode builder's ``max_seq_len=`` line, whichever form the release has."""
    owner, name, edits = drafters().pre_fix_draft()
    lines = _changed_lines(owner, name, edits)
    assert len(lines) == 2 and "self.draft_max_seq_len" in lines[0]
    assert lines[0].startswith("-            max_seq_len=")
    assert lines[1] == "+            max_seq_len=self.max_model_len,"


def test_a_vllm_whose_lines_moved_is_refused_loudly():
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    with pytest.raises(RuntimeError, match="expected the line"):
        adapter()._reverted(DefaultModelState, "prepare_attn", [("no such line\n", "")])


def test_a_follow_on_edit_may_be_absent_a_required_one_may_not():
    """A follow-on edit (a use of a name the revert removes) applies where the
    release has its line, and only there; any other edit must match once."""
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    edits = [("        if for_capture:\n", "        if not for_capture:\n"), ("gone\n", "")]
    adapter()._reverted(DefaultModelState, "prepare_attn", edits, {"gone\n"})
    with pytest.raises(RuntimeError, match="expected the line"):
        adapter()._reverted(DefaultModelState, "prepare_attn", edits)


def test_upper_bounds_are_the_engines_shape_on_every_drawn_case():
    """Every case the strategies draw: ``[R_pad]`` rows, 0 from ``R`` on, ``[:R]`` within
    ``num_spec`` above ``seq_len`` and at most ``max_model_len``."""
    from attnfuzz.harness.runner import fuzz

    target = get_target(TARGET)
    seen = []

    def check(inputs: ref.MaxSeqLenInputs) -> ref.MaxSeqLenOutputs:
        upper = inputs.seq_lens_cpu_upper_bound.numpy()
        seq_lens = inputs.common.seq_lens
        R, config = inputs.num_real_reqs, inputs.config
        assert upper.shape == (inputs.common.num_reqs,) and not upper[R:].any()
        assert (upper[:R] >= seq_lens[:R]).all()
        assert (upper[:R] <= np.minimum(seq_lens[:R] + config.num_spec, config.max_model_len)).all()
        seen.append(R)
        got = adapter().run(inputs)  # vLLM builds its bounds from these inputs
        # Before #43991 the drafter's bound is the bug (found elsewhere): the
        # inputs, not the bounds, are under test here.
        return got if FIXED else reference_impl(inputs)

    from attnfuzz.harness.target import Implementation
    from attnfuzz.harness.targets.max_seq_len import reference_impl

    result = fuzz(target, Implementation("check", check, "user"), max_examples=60, rng_seed=3,
                  database=None)  # fmt: skip
    assert not result.failed and len(seen) >= 60


# ---------------------------------------------------------------------------
# The V1 model runner (gpu_model_runner.py), also in vLLM 0.33.0
# ---------------------------------------------------------------------------


@with_fix
def test_vllm_v1_s_search_draws_padded_and_speculative_steps():
    result = assert_passes(TARGET, "vllm-v1")  # the generic test's run
    assert result.labels["padding_requests"] > 0 and result.labels["next_n>1"] > 0


def test_the_v1_bound_is_read_from_the_runners_optimistic_seq_lens(monkeypatch):
    """The model state's bound comes from V1's ``_build_attention_metadata``: a value
    planted in ``optimistic_seq_lens_cpu`` just before it runs is what comes back,
    and at capture the runner's own ``max_model_len``."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    build = GPUModelRunner._build_attention_metadata
    calls = []

    def planted(self, *args, **kwargs):
        calls.append(kwargs["for_cudagraph_capture"])
        self.optimistic_seq_lens_cpu[1] = 37  # row 1 of R = 3
        return build(self, *args, **kwargs)

    monkeypatch.setattr(GPUModelRunner, "_build_attention_metadata", planted)
    inputs = ref.make_inputs(spec2_case())
    assert adapter().run_v1(inputs).max_seq_len == 37
    runner = adapter()._v1_runner(inputs.config, inputs.kv_cache.device)
    monkeypatch.setattr(runner, "max_model_len", 41)
    assert adapter().run_v1(ref.make_inputs(spec2_case(capturing=1))).max_seq_len == 41
    assert calls == [False, True]


def test_the_v1_runner_zeroes_the_rows_of_an_earlier_larger_step():
    """The runner is cached per engine config, so its persistent buffer holds the
    previous step's rows; ``_prepare_inputs``' zeroing past ``num_reqs`` keeps them
    out of a smaller step's bound (max over ``[:R]``) and its padded rows."""
    big = with_params(hand_case((1, 1, 1), (40, 50, 60), num_spec=0, cudagraph_capture_sizes=(4,)))
    small = with_params(hand_case((1,), (3,), num_spec=0, cudagraph_capture_sizes=(4,)))
    assert big.config == small.config
    assert adapter().run_v1(ref.make_inputs(big)).max_seq_len == 61
    inputs = ref.make_inputs(small)
    assert adapter().run_v1(inputs).max_seq_len == 4
    runner = adapter()._v1_runner(inputs.config, inputs.kv_cache.device)
    assert not runner.optimistic_seq_lens_cpu[1:].any()
    assert judge("vllm-v1", small).ok


@pytest.mark.parametrize("num_spec", [1, 2, 3])
def test_v1s_drafter_raises_its_bound_by_one_per_decode_step(num_spec):
    """V1's EAGLE/MTP drafter (``SpecDecodeBaseProposer._update_positions_dependent_metadata``)
    has ``min(max + k, max_model_len)`` at decode step ``k < num_spec``, none with
    one speculative token; the V2 drafter one bound, ``min(max + num_spec,
    max_model_len)``, for all its steps: V1's last step is one below it (both
    cover the draft's longest sequence, ``max + num_spec - 1``)."""
    case = with_params(
        hand_case(
            (num_spec + 1,) * 2,
            (20, 10),
            num_spec=num_spec,
            cudagraph_capture_sizes=(2 * (num_spec + 1),),
        )
    )
    inputs = ref.make_inputs(case)
    top = int(inputs.seq_lens_cpu_upper_bound.max())
    steps = adapter().v1_draft_bounds(inputs)
    assert steps == [min(top + k, 64) for k in range(1, num_spec)]
    v2 = adapter().run(inputs).draft_max_seq_len
    draft = min(top + num_spec, 64) if FIXED else 64  # before #43991: max_model_len
    assert v2 == (draft if num_spec >= 2 else None)
