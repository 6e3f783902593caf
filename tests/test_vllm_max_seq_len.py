"""Target ``max-seq-len`` on vLLM 0.33.0's own model states and MTP drafter: both pass,
#43991 reverted is caught, and the inputs are the engine's (the fidelity change)."""

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


def with_params(case: Case, capturing: int = 0) -> Case:
    return dataclasses.replace(case, params=(("capturing", capturing),))


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case)


@pytest.mark.parametrize("impl", ENGINES)
def test_vllm_passes(impl):
    result = assert_passes(TARGET, impl, max_examples=150)
    assert result.labels["padding_requests"] > 0 and result.labels["next_n>1"] > 0


@pytest.mark.parametrize("upstream", UPSTREAM)
def test_upstream_mutant_is_detected(upstream):
    result = assert_detected(TARGET, upstream)  # also asserts the trigger
    assert result.verdict.key == "max_seq_len"
    assert result.case.param("capturing") == 0


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


def spec2_case(capturing: int = 0) -> Case:
    """next_n = 3: three decodes of 3 tokens (seq_lens 6, 12, 3), 9 tokens padded to a
    graph of 12, so R = 3 and R_pad = 4."""
    case = hand_case((3, 3, 3), (3, 9, 0), num_spec=2, cudagraph_capture_sizes=(3, 6, 12, 24))
    return with_params(case, capturing)


def test_the_bounds_are_vllms_by_hand():
    """vLLM takes ``max(upper[:R_pad])`` (a full graph) for the model state and
    ``min(max + 2, 64)`` for the draft; at capture both are ``max_model_len``."""
    inputs = ref.make_inputs(spec2_case())
    upper = inputs.seq_lens_cpu_upper_bound.tolist()
    assert len(upper) == 4 and upper[3] == 0 and 12 <= upper[1] <= 14
    for run in (adapter().run, adapter().run_mamba_hybrid):
        got = run(inputs)
        assert (got.max_seq_len, got.draft_max_seq_len) == (max(upper), max(upper) + 2)
    got = adapter().run(ref.make_inputs(spec2_case(capturing=1)))
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
    assert judge("vllm", spec2_case()).ok


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
    assert [m.where for m in found if m.check == "max_seq_len"] == ["max_seq_len"]

    assert judge("vllm", case).ok and judge("vllm-mamba-hybrid", case).ok
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


def _changed_lines(cls: type, name: str, edits: list[tuple[str, str]]) -> list[str]:
    fixed = inspect.getsource(getattr(cls, name))
    reverted = fixed
    for old, new in edits:
        assert fixed.count(old) == 1
        reverted = reverted.replace(old, new)
    diff = difflib.unified_diff(fixed.splitlines(), reverted.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_the_reverted_model_state_changes_only_the_bound():
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    lines = _changed_lines(MambaHybridModelState, "prepare_attn", adapter()._PRE_FIX_MODEL_STATE)
    assert lines == [
        "-        seq_lens_cpu_upper_bound = input_batch.seq_lens_cpu_upper_bound",
        "-        if for_capture:",
        "-            # Capture with worst-case max_seq_len so the graph is valid at any replay.",
        "-            max_seq_len = self.max_model_len",
        "-        else:",
        "-            max_seq_len = seq_lens_cpu_upper_bound[:num_reqs].max().item()",
        "-            max_seq_len=max_seq_len,",
        "+            max_seq_len=self.max_model_len,",
        "-            seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound,",
        "+            seq_lens_cpu_upper_bound=input_batch.seq_lens_cpu_upper_bound,",
    ]


def test_the_reverted_draft_changes_one_line():
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    lines = _changed_lines(DraftModelSpeculator, "_build_attn_metadata", adapter()._PRE_FIX_DRAFT)
    assert lines == [
        "-            max_seq_len=min(self.draft_max_seq_len, self.max_model_len),",
        "+            max_seq_len=self.max_model_len,",
    ]


def test_a_vllm_whose_lines_moved_is_refused_loudly():
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    with pytest.raises(RuntimeError, match="expected the line"):
        adapter()._reverted(DraftModelSpeculator, "_build_attn_metadata", [("no such line\n", "")])


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
        return adapter().run(inputs)

    from attnfuzz.harness.target import Implementation

    result = fuzz(target, Implementation("check", check, "user"), max_examples=60, rng_seed=3,
                  database=None)  # fmt: skip
    assert not result.failed and len(seen) >= 60


# ---------------------------------------------------------------------------
# The V1 model runner (gpu_model_runner.py), also in vLLM 0.33.0
# ---------------------------------------------------------------------------


def test_vllm_v1_passes():
    result = assert_passes(TARGET, "vllm-v1", max_examples=150)
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
    assert v2 == (min(top + num_spec, 64) if num_spec >= 2 else None)
