"""vLLM's own sparse-indexer glue as implementations of ``indexer-decode``, on every release.

Written against 0.33.0. Where an older release differs, the test finds out by looking
and says what it expects there: the CPU and gfx942 glue exist from 0.30.0 and 0.33.0
(their tests skip, with the implementation's own reason, where they are unavailable);
before 0.28.0 the builder hands graph-padding requests a negative per-row length
(:func:`unclamped_native_lengths`, a real engine bug the top-k stand-in refuses),
which fires before bug A does on a padded native step; 0.21.0's XPU decode top-k
fails on the lengths its glue hands it (:func:`test_0_21_0_xpu_decode_top_k_fails`).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import torch
from attnfuzz.adapters.vllm import indexer_decode as adapter
from attnfuzz.adapters.vllm import vendor_ops
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.oracle import expect_close
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import Implementation, InvalidCase
from attnfuzz.harness.targets.indexer_decode import SPEC3, smallest_writeback
from attnfuzz.harness.testing import assert_passes, hand_case
from attnfuzz.reference import indexer_decode as ref
from attnfuzz.reference.batch import Case

pytestmark = requires_vllm

TARGET = "indexer-decode"
UPSTREAM = "upstream-pr39542-decode"


def judge(impl: str, case: Case):
    target = get_target(TARGET)
    return target.judge(target.resolve(impl), case, "cpu")


def require(impl: str) -> None:
    """Skip where the installed release lacks the glue ``impl`` runs (its own reason)."""
    reason = get_target(TARGET).implementations[impl].why_unavailable()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def cpu_glue():
    require("vllm-cpu")


@pytest.fixture
def v41_glue():
    require(V41)


@cache
def unclamped_native_lengths() -> bool:
    """Whether the builder gives a graph-padding request (``seq_len = 0``) of a native
    MTP step a negative per-row length (``0 - 2 + 1 + 0 = -1``): 0.21.0 to 0.27.1
    ``indexer.py:_prepare_decode_tensors``; 0.28.0 on ``.clamp_(min=0)`` ("Downstream
    kernels read these as uint32, turning -1 into ~4e9")."""
    step = adapter._Step(ref.make_inputs(smallest_writeback()))
    return int(step.metadata.decode.seq_lens.min()) < 0


def assert_unclamped_length_found(verdict) -> None:
    """The finding of an unclamped release on a padded native step: the decode top-k
    refuses row 6, the padding request's first row, of length -1."""
    assert verdict.key == "exception:ContractError", verdict
    assert "row 6: [0, -1) outside the row" in verdict.mismatches[0].got


def xpu_top_k_of_0_21_0() -> bool:
    """0.21.0's XPU branches select with ``xpu_ops.top_k_per_row_*`` (``vllm/_xpu_ops.py``)."""
    from attnfuzz.adapters.vllm import _indexer_glue
    from vllm.model_executor.layers import sparse_attn_indexer as glue

    return _indexer_glue.calls(glue.sparse_attn_indexer, "xpu_ops")


def judge_unfixed(fn, case: Case):
    """``fn`` judged as a user implementation, without the registered one's ``fixes``:
    what the glue itself does on a case outside its domain."""
    return get_target(TARGET).judge(Implementation("unfixed", fn, "user"), case, "cpu")


@pytest.mark.parametrize("impl", ["vllm", "vllm-xpu"])
def test_the_search_draws_padded_steps(impl):
    if unclamped_native_lengths():
        pytest.skip("this release hands padding requests a negative per-row length (fixed in "
                    "0.28.0): test_unclamped_native_lengths_are_found pins it")  # fmt: skip
    result = assert_passes(TARGET, impl)  # the generic test's run (tests/test_entries.py)
    assert result.labels["requires_padding"] > 0


CASES = {
    "padded 6 -> 8": hand_case((2, 2, 2), (3, 5, 1)),
    "uniform, a capture size": hand_case((2, 2, 2, 2), (1, 2, 3, 4)),
    "native: uniform decode, prefills": hand_case((1, 2, 3), (4, 4, 0), use_cudagraph=False),
    "flattened (next_n 3): ragged decodes, a prefill": hand_case(
        (1, 2, 4), (4, 4, 0), use_cudagraph=False, **SPEC3
    ),
    "flattened (next_n 3): padded 6 -> 12": hand_case((3, 3), (2, 1), **SPEC3),
}


@pytest.mark.parametrize("impl", ["vllm", "vllm-xpu"])
@pytest.mark.parametrize("name", list(CASES))
def test_hand_cases_on_both_paths(impl, name):
    if impl == "vllm-xpu" and xpu_top_k_of_0_21_0():
        pytest.skip("0.21.0's XPU top-k fails: test_0_21_0_xpu_decode_top_k_fails pins it")
    verdict = judge(impl, CASES[name])
    if name == "padded 6 -> 8" and unclamped_native_lengths():
        assert_unclamped_length_found(verdict)
    else:
        assert verdict.ok, verdict


def test_unclamped_native_lengths_are_found():
    """Finding (0.21.0 to 0.27.1): a padded native MTP step (three decodes of 2 padded
    to a graph of 8) gives its padding request per-row lengths ``[-1, 0]``; the top-k
    stand-in refuses the negative one (the kernel reads it as uint32). From 0.28.0 the
    builder clamps it and the step passes."""
    verdict = judge("vllm", smallest_writeback())
    if unclamped_native_lengths():
        assert_unclamped_length_found(verdict)
    else:
        assert verdict.ok, verdict


def test_0_21_0_xpu_decode_top_k_fails():
    """Finding (0.21.0): ``sparse_attn_indexer``'s XPU branch hands ``xpu_ops.
    top_k_per_row_decode`` the builder's 2-D lengths (``[B, next_n]`` or ``[B, 1]``), and
    that code (``vllm/_xpu_ops.py``, run as the release ships it) indexes them as 1-D
    per-sequence lengths: every decode step fails to broadcast. 0.22.0 hands the XPU
    kernels ``seq_lens[:, -1]`` and selects with the shared top-k."""
    if not xpu_top_k_of_0_21_0():
        pytest.skip("the XPU branches of this release call torch.ops.vllm.xpu_fp8_*")
    for name in ["uniform, a capture size", "native: uniform decode, prefills"]:
        verdict = judge("vllm-xpu", CASES[name])
        assert verdict.key == "exception:RuntimeError", verdict
        assert "must match the" in verdict.mismatches[0].got
        assert judge("vllm", CASES[name]).ok


def test_upstream_mutant_crashes_as_in_production():
    """#39542 reverted: 6 unpacked rows into buffer[:8], the crash the issue reports."""
    case = smallest_writeback()
    if unclamped_native_lengths():  # the negative length is refused before the write-back
        assert_unclamped_length_found(judge(UPSTREAM, case))
        pytest.skip("this release refuses a padded native step before its write-back")
    assert judge("vllm", case).ok
    verdict = judge(UPSTREAM, case)
    assert verdict.key == "exception:RuntimeError"
    assert "(8) must match the existing size (6)" in verdict.mismatches[0].got
    # 49 requests x 2 tokens replaying the graph of 104, at K = 4.
    verdict = judge(UPSTREAM, hand_case((2,) * 49, (1,) * 49))
    assert "(104) must match the existing size (98)" in verdict.mismatches[0].got


def test_upstream_mutant_differs_from_0_33_0_in_the_two_reverted_lines_only():
    import inspect

    from vllm.model_executor.layers import sparse_attn_indexer as glue

    fixed = inspect.getsource(inspect.unwrap(glue.sparse_attn_indexer)).splitlines()
    if fixed[0] == adapter._DECORATOR.strip():  # 0.22.0 on
        fixed = fixed[1:]
    reverted = adapter.pr39542_source().splitlines()
    changed = [(a, b) for a, b in zip(fixed, reverted, strict=True) if a != b]
    assert changed == [(f.rstrip("\n"), p.rstrip("\n")) for f, p in adapter._PR39542_REVERTED]


def test_rocm_glue_still_has_bug_a():
    """Finding: vLLM 0.33.0's ``rocm_aiter_sparse_attn_indexer`` still writes back
    ``topk_indices_buffer[:num_decode_tokens]`` with ``sum(d)`` unpacked rows, the line
    #39542 fixed in ``sparse_attn_indexer``: a padded MTP step crashes on ROCm. (0.22.0
    to 0.27.1 refuse the step's negative length before; 0.21.0 selects with
    ``torch.topk``, which takes it, and crashes at the write-back.)"""
    verdict = judge("vllm-rocm", smallest_writeback())
    if verdict.key == "exception:ContractError":
        assert unclamped_native_lengths()
        assert_unclamped_length_found(verdict)
    else:
        assert verdict.key == "exception:RuntimeError"
        assert "(8) must match the existing size (6)" in verdict.mismatches[0].got
    assert judge("vllm-rocm", CASES["uniform, a capture size"]).ok
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    if not hasattr(rocm, "rocm_aiter_sparse_attn_indexer_native"):  # see the test below
        assert judge("vllm-rocm", CASES["native: uniform decode, prefills"]).ok


def test_rocm_glue_of_0_21_0_writes_chunk_columns_for_prefill_rows():
    """Finding (0.21.0): ``rocm_aiter_sparse_attn_indexer_native`` selects a prefill
    chunk's rows with ``_topk_indices_torch`` over ``[M, N]`` logits in the chunk's key
    columns, so a request after the first in the chunk gets indices offset by its start
    (request 2 below starts at key 6: its first token's only key, 0, comes back as 6),
    where the sparse attention reads request-local positions. 0.22.0 selects with
    ``top_k_per_row_prefill(logits, ks, ke, ...)``, relative to each row's start."""
    from vllm.v1.attention.ops import rocm_aiter_mla_sparse as rocm

    if not hasattr(rocm, "rocm_aiter_sparse_attn_indexer_native"):
        pytest.skip("this release's ROCm glue selects prefill rows relative to their start")
    case = CASES["native: uniform decode, prefills"]
    inputs = ref.make_inputs(case)
    adapter.run_rocm(inputs)
    assert inputs.topk_indices_buffer[3].tolist() == [6, -1, -1, -1]
    assert ref.reference(case, ref.make_inputs(case)).buffer[3].tolist() == [0, -1, -1, -1]


# -- fidelity: each change, a hand case where the old oracle was wrong on vLLM ---------


def test_prefill_rows_hold_the_prefill_branch_result():
    """The glue clears the step's rows and recomputes the prefill rows before its decode
    branch (``sparse_attn_indexer``): the old inputs' random prefill rows were judged
    "unchanged" against vLLM's correct recomputation. The re-created overlap mutant,
    which clobbers the first prefill row, is still caught."""
    case = CASES["native: uniform decode, prefills"]
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    prefill = slice(inputs.num_decode_tokens, int(inputs.query_start_loc[-1]))
    old = inputs.topk_indices_buffer.clone()
    old[prefill] = torch.randint(0, 64, old[prefill].shape, dtype=torch.int32)
    inputs.topk_indices_buffer.copy_(old)
    expected = ref.reference(case, inputs)
    mismatches = target.compare(case, inputs, expected, adapter.run(inputs))
    assert mismatches and all(m.check == "unchanged" for m in mismatches)
    assert judge("vllm", case).ok  # with the prefill branch's own rows
    overlap = hand_case((1, 2, 4), (4, 4, 0), use_cudagraph=False, **SPEC3)
    verdict = judge("pr39542-overlap", overlap)
    assert verdict.key == "unchanged" and judge("vllm", overlap).ok


def test_logits_past_a_row_context_are_not_judged():
    """DeepGEMM's paged logits leave columns past a row's context uncleaned
    (``utils/deep_gemm.py:fp8_fp4_paged_mqa_logits``); the old full-row comparison
    failed vLLM's correct output there. Visible columns are still compared exactly."""
    case = CASES["uniform, a capture size"]
    target = get_target(TARGET)
    inputs = ref.make_inputs(case)
    expected = ref.reference(case, inputs)
    got = adapter.run(inputs)
    assert (got.logits == vendor_ops.UNCLEANED).any()
    assert expect_close("logits", got.logits, expected.logits, rows=expected.logit_rows) != []
    assert target.compare(case, inputs, expected, got) == []
    wrong = got.logits.clone()
    row = int(np.flatnonzero(expected.logit_rows)[0])
    wrong[row, 0] += 1  # a visible column
    got.logits = wrong
    assert [m.check for m in target.compare(case, inputs, expected, got)] == ["values"]


# -- the CPU glue: K = 512, head dim 128, no native MTP -----------------------------------

# The CPU platform captures no graphs: its steps run as cudagraph_mode NONE.
WIDTHS = dict(topk=512, head_dim=128)
CPU = dict(cudagraph_mode="NONE", **WIDTHS)
ONE = dict(num_spec=0, cudagraph_capture_sizes=(1, 2, 4, 8), **CPU)


@pytest.mark.usefixtures("cpu_glue")
def test_cpu_glue_s_search_draws_mixed_and_all_decode_steps():
    result = assert_passes(TARGET, "vllm-cpu")  # the generic test's run
    assert result.labels["mixed"] > 0 and result.labels["all_decode"] > 0


@pytest.mark.usefixtures("cpu_glue")
def test_cpu_glue_declares_its_domain():
    impl = get_target(TARGET).resolve("vllm-cpu")
    assert impl.fixes == {"topk": 512, "head_dim": 128, "next_n": 1, "cudagraph_mode": "NONE"}
    assert impl.kind == "engine"


@pytest.mark.usefixtures("cpu_glue")
def test_cpu_glue_is_never_judged_on_a_padded_step():
    """A one-token decode padded to a graph of 2 (FULL_AND_PIECEWISE) is a step the CPU
    platform never builds (``CpuPlatform.check_and_update_config`` empties the capture
    sizes); ``forward_cpu`` asserts on it. So the implementation fixes NONE and the judge
    refuses the padded case, naming the rule."""
    padded = hand_case((1,), (0,), num_spec=0, cudagraph_capture_sizes=(2,), **WIDTHS)
    assert padded.config.cudagraph_mode == "FULL_AND_PIECEWISE"
    verdict = judge_unfixed(adapter.run_cpu, padded)
    assert verdict.key == "exception:AssertionError"
    assert "does not support speculative decoding" in verdict.mismatches[0].got
    with pytest.raises(InvalidCase, match="cudagraph_mode=FULL_AND_PIECEWISE"):
        judge("vllm-cpu", padded)
    eager = hand_case((1,), (0,), num_spec=0, cudagraph_capture_sizes=(2,), **CPU)
    assert judge("vllm-cpu", eager).ok


@pytest.mark.usefixtures("cpu_glue")
@pytest.mark.parametrize(
    "case",
    [
        hand_case((1, 1, 1), (3, 5, 1), **ONE),  # decodes in a graph (next_n 1: no padding)
        hand_case((1, 1, 5), (3, 5, 0), use_cudagraph=False, **ONE),  # decodes, a prefill
        hand_case((7, 2), (0, 3), use_cudagraph=False, **ONE),  # prefills only
    ],
)
def test_cpu_glue_passes_hand_cases(case):
    assert judge("vllm-cpu", case).ok


@pytest.mark.usefixtures("cpu_glue")
@pytest.mark.parametrize(
    "case",
    [
        hand_case((1, 2, 4), (4, 4, 0), use_cudagraph=False, **SPEC3, **CPU),
        hand_case((3, 3), (2, 1), **SPEC3, **CPU),
    ],
)
def test_cpu_glue_also_runs_flattened_decodes(case):
    """next_n = 3 is outside the declared domain, yet the glue runs it: the builder
    flattens every decode token to its own row, one query token per decode request."""
    assert judge_unfixed(adapter.run_cpu, case).ok


@pytest.mark.usefixtures("cpu_glue")
@pytest.mark.parametrize(
    "case, message",
    [
        (hand_case((2, 2, 2), (3, 5, 1), **WIDTHS), "does not support speculative decoding"),
        (hand_case((2, 2), (3, 5), use_cudagraph=False, **CPU), "exactly one query token"),
        (hand_case((1, 1), (3, 5), num_spec=0, cudagraph_capture_sizes=(1, 2)), "== 512"),
    ],
)
def test_cpu_glue_refuses_native_mtp_and_other_widths(case, message):
    """``forward_cpu`` asserts both itself: on the CPU platform the builder takes the native
    path for next_n = 2 (``indexer.py:_supports_native_decode``), which this glue refuses,
    padded (``requires_padding``) or not. Hence ``fixes``: the judge refuses such a case
    for the registered implementation before any code runs."""
    verdict = judge_unfixed(adapter.run_cpu, case)
    assert verdict.key == "exception:AssertionError" and message in verdict.mismatches[0].got
    with pytest.raises(InvalidCase, match="vllm-cpu"):
        judge("vllm-cpu", case)


@pytest.mark.usefixtures("cpu_glue")
def test_cpu_kernels_refuse_other_head_dims():
    """The CPU logits kernel is compiled for an indexer head dim of 128 only."""
    case = hand_case((1, 1), (3, 5), **ONE | dict(head_dim=64))
    verdict = judge_unfixed(adapter.run_cpu, case)
    assert verdict.key == "exception:ContractError" and "head_dim 64" in verdict.mismatches[0].got


@pytest.mark.usefixtures("cpu_glue")
def test_cpu_glue_uses_the_cpu_platform_builder(monkeypatch):
    """One prefill chunk whatever the logits budget (``forward_cpu`` asserts it), where the
    shared builder splits the step's prefills into chunks."""
    import vllm.envs
    from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUIndexerMetadataBuilder

    monkeypatch.setattr(vllm.envs, "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", 0)
    inputs = ref.make_inputs(hand_case((5, 6), (0, 2), use_cudagraph=False, **ONE))
    shared = adapter._Step(inputs).metadata
    step = adapter._Step(inputs, cpu=True)
    assert isinstance(step.builder, DeepseekV4CPUIndexerMetadataBuilder)
    assert len(shared.prefill.chunks) > 1 and len(step.metadata.prefill.chunks) == 1


# -- DeepSeek-V4.1's gfx942 indexer layer: bug A, live --------------------------------------


@pytest.mark.usefixtures("v41_glue")
def test_v41_gfx942_decode_step_still_has_bug_a():
    """Finding: ``models/deepseek_v41/amd/ops/sparse_indexer.py:_decode_step`` (vLLM 0.33.0)
    writes back ``topk_indices_buffer[:num_decode_tokens]`` with ``sum(d)`` unpacked rows,
    the line #39542 fixed in ``sparse_attn_indexer``: a padded MTP decode step crashes."""
    verdict = judge(V41, smallest_writeback())
    assert verdict.key == "exception:RuntimeError"
    assert "(8) must match the existing size (6)" in verdict.mismatches[0].got


V41 = "vllm-deepseek-v41-amd"
V41_CASES = {
    "uniform, a capture size": hand_case((2, 2, 2, 2), (1, 2, 3, 4)),
    "uniform, K = 512 (the gfx942 top-512)": hand_case((2, 2, 2, 2), (1, 2, 3, 4), topk=512),
    "mixed: vLLM's ROCm op": hand_case((1, 2, 3), (4, 4, 0), use_cudagraph=False),
    "flattened (next_n 3), padded 6 -> 12": hand_case((3, 3), (2, 1), **SPEC3),
    "flattened, K = 512": hand_case((3, 3), (2, 1), **SPEC3, topk=512),
}


@pytest.mark.usefixtures("v41_glue")
@pytest.mark.parametrize("name", list(V41_CASES))
def test_v41_gfx942_layer_passes_where_bug_a_does_not_trigger(name, monkeypatch):
    from vllm.models.deepseek_v41.amd.ops import sparse_indexer as gfx942

    calls = []
    decode_step = gfx942._decode_step
    monkeypatch.setattr(gfx942, "_decode_step", lambda *a: calls.append(a) or decode_step(*a))
    top512 = []
    ext = adapter._Gfx942Extension.top_k_per_row_decode_512
    monkeypatch.setattr(
        adapter._Gfx942Extension,
        "top_k_per_row_decode_512",
        staticmethod(lambda *a, **k: top512.append(a) or ext(*a, **k)),
    )
    case = V41_CASES[name]
    assert judge(V41, case).ok
    split = ref.describe(case)[1]
    assert bool(calls) == (split.num_prefills == 0)  # decode-only steps run _decode_step
    assert bool(top512) == (bool(calls) and case.config.topk == 512)


def _v41_on(next_n: int):
    from attnfuzz.adapters.vllm import implementation as vllm_impl

    return vllm_impl(
        "indexer_decode",
        "run_deepseek_v41_amd",
        name=f"{V41}-next_n-{next_n}",
        description="the gfx942 layer on one next_n",
        fixes={"next_n": next_n},
    )


@pytest.mark.usefixtures("v41_glue")
def test_v41_gfx942_layer_passes_derandomized_runs_where_nothing_is_unpacked():
    """Bug A needs the packed path: on flattened (``next_n = 3``) steps nothing is
    unpacked, and the rest of the layer's glue passes."""
    from attnfuzz.harness.runner import fuzz

    result = fuzz(get_target(TARGET), _v41_on(3), max_examples=100, rng_seed=0, database=None)
    assert not result.failed, f"{result.case}: {result.verdict}"
    assert result.examples >= 100 and result.labels["all_decode"] > 0


@pytest.mark.usefixtures("v41_glue")
def test_v41_gfx942_layer_fails_one_token_decodes_only_where_bug_a_triggers_and_latently():
    """``next_n = 1`` (no MTP at all): a one-token decode step padded to a graph gets
    zero-length padding requests, so the builder sets ``requires_padding`` and the layer
    packs and unpacks, and ``_decode_step``'s write-back of ``buffer[:N_d]`` fails there
    as well. What the run finds meets bug A's trigger, and is latent: only FULL steps
    pad, and their Python does not run."""
    from attnfuzz.harness.reachability import LATENT, finding_reachability
    from attnfuzz.harness.runner import fuzz
    from attnfuzz.harness.targets.indexer_decode import trigger_engine_writeback

    target, impl = get_target(TARGET), _v41_on(1)
    result = fuzz(target, impl, max_examples=100, rng_seed=0, database=None)
    assert result.failed and result.case.config.next_n == 1
    assert trigger_engine_writeback(result.case), result.case
    assert result.verdict.key == "exception:RuntimeError"
    r = finding_reachability(target, impl, result.case, lambda c: target.judge(impl, c, "cpu"))
    assert r.status == LATENT, r.lines()


@pytest.mark.usefixtures("v41_glue")
def test_v41_gfx942_decode_step_with_the_39542_fix_passes(monkeypatch):
    """The finding is exactly #39542's line: ``_decode_step`` with its write-back made
    ``buffer[: unpacked.shape[0]]`` (0.33.0's fix in ``sparse_attn_indexer``) passes
    the case that crashes it."""
    import inspect
    import types

    from vllm.models.deepseek_v41.amd.ops import sparse_indexer as gfx942

    source = inspect.getsource(gfx942._decode_step)
    line = "topk_indices_buffer[:num_decode_tokens, : unpacked.shape[-1]] = unpacked"
    assert source.count(line) == 1
    fixed_source = source.replace(line, line.replace(":num_decode_tokens", ": unpacked.shape[0]"))
    scratch: dict = {}
    exec(compile(fixed_source, "<_decode_step, #39542 applied>", "exec"), vars(gfx942), scratch)
    fixed = types.FunctionType(scratch["_decode_step"].__code__, vars(gfx942), "_decode_step")
    monkeypatch.setattr(gfx942, "_decode_step", fixed)
    assert judge(V41, smallest_writeback()).ok
    assert judge(V41, hand_case((2,) * 49, (1,) * 49)).ok
