"""vLLM's own CUDA-graph mode and padding decisions against ``reference.runner``.

On every supported release. The reference states vLLM 0.33.0's rules; three release
differences decide what a test expects, each found by looking (``compat``):

- adaptive verification (``varlen_decode``) exists from 0.28.0: before, such a
  configuration is refused; 0.28.0 and 0.29.0 (no ``resolve_adaptive_cudagraph_mode``)
  give it FULL_AND_PIECEWISE whatever was asked (:func:`refusal`);
- before 0.28.0 V2's uniform count knows no prefill, so a one-request peer of
  ``next_n`` tokens is a uniform decode to it (:func:`release_batch`);
- before 0.25.0 the resolution and V2's graph manager round V2's capture sizes too.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
from attnfuzz.adapters.vllm import compat
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.errors import PlannerRefuses
from attnfuzz.reference import runner as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.strategies.batches import batches, engine_configs
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = requires_vllm


def refusal(config: EngineConfig) -> str | None:
    """What the installed release's refusal of ``config`` says where 0.33.0 keeps it
    (a pattern), or None: only adaptive verification differs."""
    if config.runner != "v2" or not config.varlen_decode:
        return None
    if not compat.has(compat.V2_VARLEN_DECODE):
        return "has no adaptive verification"
    if not compat.has(compat.ADAPTIVE_MODE) and config.cudagraph_mode != "FULL_AND_PIECEWISE":
        return "GPUModelRunner.initialize_kv_cache"
    return None


def counts_prefills_as_uniform() -> bool:
    """V2's uniform count before 0.28.0 (``cudagraph_utils.get_uniform_token_count``):
    any step whose requests have one length, prefill or not."""
    return not (
        compat.has(compat.UNIFORM_DECODE_ELIGIBLE) or compat.has(compat.UNIFORM_HAS_PREFILL)
    )


def release_batch(config: EngineConfig, batch: Batch) -> Batch:
    """``batch`` as the release's V2 runner counts its peer: the reference's peer that
    is not a uniform decode (a prefill, no uniform count) is, before 0.28.0 and with
    ``next_n`` tokens, one request of ``next_n``: a uniform decode."""
    if (
        config.runner == "v2"
        and counts_prefills_as_uniform()
        and not batch.dp_peer_uniform
        and batch.dp_peer_tokens == config.next_n
    ):
        return replace(batch, dp_peer_uniform=True)
    return batch


def fields(plan: ref.StepPlan) -> tuple[str, int, int, int]:
    """What the two must agree on (``decided_by`` cites different lines)."""
    return plan.mode, plan.num_tokens_padded, plan.num_reqs_padded, plan.slot_mapping_tokens


@st.composite
def configs_and_steps(draw: st.DrawFn) -> tuple[EngineConfig, Batch]:
    # engine_configs draws the runner fields (runner, a mode the engine keeps
    # with the drawn cg_support, varlen_decode, separate_kv_update) and batches
    # the data-parallel peer (dp_peer_tokens, dp_peer_uniform).
    config = draw(engine_configs())
    return config, draw(batches(config))


@settings(max_examples=300, deadline=None, database=None, derandomize=True)
@given(configs_and_steps())
def test_engine_step_plan_matches_the_reference(drawn):
    from attnfuzz.adapters.vllm.runner_modes import engine_step_plan

    config, batch = drawn
    why = refusal(config)
    if why is not None:
        with pytest.raises(PlannerRefuses, match=why):
            engine_step_plan(config, batch)
        return
    expected = ref.step_plan(config, release_batch(config, batch))
    assert fields(engine_step_plan(config, batch)) == fields(expected)


# One decode of next_n = 2 tokens, a single graph of 4 tokens (2 requests).
PINNED_CONFIG = EngineConfig(
    max_model_len=8,
    max_num_seqs=2,
    max_num_batched_tokens=4,
    block_size=1,
    num_spec=1,
    cudagraph_capture_sizes=(4,),
)
PINNED_BATCH = Batch(num_computed_tokens=(0,), q_lens=(2,))
# (runtime mode, T_pad, R_pad), read off vLLM 0.33.0, the same for both runners:
# - NONE: no graphs, eager and unpadded.
# - PIECEWISE: the only key is the piecewise graph of 4 tokens (no request count);
#   the step runs in it, its attention unpadded (one request).
# - FULL_DECODE_ONLY, FULL_AND_PIECEWISE: the step is a uniform decode; the decode
#   graph of 4 tokens holds 4 // 2 = 2 requests (V1 _create_padded_batch_descriptor,
#   V2 _init_candidates' round_up(4, 2) // 2).
# - FULL: the mixed FULL graph of 4 tokens holds min(4, max_num_seqs) = 2 requests.
PINNED = {
    "NONE": ("NONE", 2, 1),
    "PIECEWISE": ("PIECEWISE", 4, 1),
    "FULL_DECODE_ONLY": ("FULL", 4, 2),
    "FULL_AND_PIECEWISE": ("FULL", 4, 2),
    "FULL": ("FULL", 4, 2),
}


def test_pinned_modes_are_those_allowed_with_always():
    assert tuple(PINNED) == ref.allowed_modes("ALWAYS", PINNED_CONFIG.next_n)


@pytest.mark.parametrize("runner", ref.RUNNERS)
@pytest.mark.parametrize("mode", list(PINNED))
def test_pinned_decode_step(runner, mode):
    from attnfuzz.adapters.vllm.runner_modes import engine_step_plan

    config = replace(PINNED_CONFIG, cudagraph_mode=mode, cg_support="ALWAYS", runner=runner)
    got = engine_step_plan(config, PINNED_BATCH)
    assert (got.mode, got.num_tokens_padded, got.num_reqs_padded) == PINNED[mode]
    assert fields(got) == fields(ref.step_plan(config, PINNED_BATCH))


@pytest.mark.parametrize("runner", ref.RUNNERS)
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("support", ref.CG_SUPPORTS)
@pytest.mark.parametrize("mode", ref.CUDAGRAPH_MODES)
def test_engine_keeps_exactly_the_modes_the_reference_allows(mode, support, next_n, runner):
    """``mode_problem`` is ``resolve_cudagraph_mode_and_sizes``: a mode it allows is
    kept, any other one is rewritten (or refused) and the adapter raises."""
    from attnfuzz.adapters.vllm.runner_modes import resolved_config

    config = replace(
        PINNED_CONFIG, num_spec=next_n - 1, cudagraph_mode=mode, cg_support=support, runner=runner
    )
    if ref.mode_problem(mode, support, next_n) is None:
        assert resolved_config(config)[1].name == mode
    else:
        with pytest.raises(ValueError, match="resolve_cudagraph_mode_and_sizes"):
            resolved_config(config)


def test_v1_refuses_capture_sizes_vllm_rounds():
    """V1 with FULL decode graphs rounds capture sizes up to multiples of next_n
    (``adjust_cudagraph_sizes_for_spec_decode``): (3, 4) becomes (4,), refused. From
    0.25.0 (``use_v2_model_runner``) V2 keeps them; before, the resolution rounds
    V2's as V1's."""
    from attnfuzz.adapters.vllm.runner_modes import resolved_config

    config = replace(PINNED_CONFIG, cudagraph_capture_sizes=(3, 4), runner="v1")
    with pytest.raises(ValueError, match="adjust_cudagraph_sizes_for_spec_decode"):
        resolved_config(config)
    if compat.has(compat.RESOLVE_V2_RUNNER):
        assert resolved_config(replace(config, runner="v2"))[1].name == config.cudagraph_mode
    else:
        with pytest.raises(ValueError, match="adjust_cudagraph_sizes_for_spec_decode"):
            resolved_config(replace(config, runner="v2"))


def test_v2_graph_manager_rounds_capture_sizes_in_any_mode_before_0_25():
    """Before 0.25.0 ``CudaGraphManager.__init__`` itself rounds the capture sizes to
    multiples of next_n, PIECEWISE too; from 0.25.0 it keeps them. A rewrite breaks
    attnfuzz's invariant (sizes are multiples of next_n): a ValueError, no refusal."""
    from attnfuzz.adapters.vllm.runner_modes import engine_step_plan

    config = replace(
        PINNED_CONFIG, cudagraph_capture_sizes=(3, 4), cudagraph_mode="PIECEWISE", runner="v2"
    )
    if compat.has(compat.RESOLVE_V2_RUNNER):
        got = engine_step_plan(config, PINNED_BATCH)
        assert (got.mode, got.num_tokens_padded) == ("PIECEWISE", 3)
        return
    with pytest.raises(ValueError, match="CudaGraphManager.__init__") as err:
        engine_step_plan(config, PINNED_BATCH)
    assert not isinstance(err.value, PlannerRefuses)


@pytest.mark.parametrize("runner", ref.RUNNERS)
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("support", ref.CG_SUPPORTS)
@pytest.mark.parametrize("mode", ref.CUDAGRAPH_MODES)
def test_the_mode_is_the_releases_own_resolution(mode, support, next_n, runner, monkeypatch):
    """The adapter calls the release's ``resolve_cudagraph_mode_and_sizes`` with exactly
    the keywords it takes (``piecewise_capture_available`` from 0.30.0,
    ``use_v2_model_runner`` from 0.25.0) and keeps a mode only where the same
    resolution, called with its defaults alone (as 0.21.0's V1 runner calls it), does."""
    from attnfuzz.adapters.vllm import _engine
    from attnfuzz.adapters.vllm.runner_modes import resolved_config
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    real = CompilationConfig.resolve_cudagraph_mode_and_sizes
    keywords: list[set[str]] = []

    def spy(self, *args, **kwargs):
        keywords.append(set(kwargs))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CompilationConfig, "resolve_cudagraph_mode_and_sizes", spy)
    config = replace(
        PINNED_CONFIG, num_spec=next_n - 1, cudagraph_mode=mode, cg_support=support, runner=runner
    )
    try:
        kept = resolved_config(config)[1].name
    except PlannerRefuses:
        kept = None
    (passed,) = keywords
    taken = set(inspect.signature(real).parameters)
    optional = {"piecewise_capture_available", "use_v2_model_runner"}
    assert passed & optional == taken & optional
    assert ("piecewise_capture_available" in passed) == compat.has(compat.RESOLVE_MODES)

    cc = _engine.vllm_config(config).compilation_config
    cc.mode = CompilationMode.VLLM_COMPILE
    cc.splitting_ops = list(CompilationConfig._attention_ops)
    cc.cudagraph_mode = CUDAGraphMode[mode]
    try:
        own = real(cc, AttentionCGSupport[support], "attnfuzz", next_n).name
    except ValueError:
        own = None
    assert kept == (mode if own == mode else None)


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_adaptive_verification_is_planned_where_the_release_has_it(mode):
    """0.30.0 on: ``resolve_adaptive_cudagraph_mode`` keeps both separate-routine modes;
    0.28.0, 0.29.0: the runner sets FULL_AND_PIECEWISE itself; before 0.28.0 there is
    no adaptive verification: refused, in one line naming what is missing."""
    from attnfuzz.adapters.vllm.runner_modes import engine_step_plan

    config = replace(PINNED_CONFIG, runner="v2", cudagraph_mode=mode, varlen_decode=True)
    why = refusal(config)
    if why is None:
        got = engine_step_plan(config, PINNED_BATCH)
        assert fields(got) == fields(ref.step_plan(config, PINNED_BATCH))
        return
    with pytest.raises(PlannerRefuses, match=why) as err:
        engine_step_plan(config, PINNED_BATCH)
    assert "\n" not in str(err.value)
    if not compat.has(compat.V2_VARLEN_DECODE):
        assert "varlen_decode=" in str(err.value) and "0.28.0" in str(err.value)


def test_a_one_request_peer_of_next_n_tokens_is_the_releases_uniform_count(monkeypatch):
    """V2's uniform count is the release's own: before 0.28.0
    ``cudagraph_utils.get_uniform_token_count`` makes a one-request peer of next_n
    tokens a uniform decode, so both ranks replay the FULL decode graph; from 0.28.0
    ``get_uniform_decode_token_count`` leaves out a step with a prefill (the peer that
    is not a uniform decode), and the ranks run eager."""
    import vllm.v1.worker.gpu.cudagraph_utils as graphs
    import vllm.v1.worker.utils as worker_utils
    from attnfuzz.adapters.vllm.runner_modes import engine_step_plan

    if counts_prefills_as_uniform():
        module, name = graphs, "get_uniform_token_count"
    else:
        module, name = worker_utils, "get_uniform_decode_token_count"
    real, calls = getattr(module, name), []

    def spy(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    config = replace(PINNED_CONFIG, cudagraph_mode="FULL_DECODE_ONLY", runner="v2")
    batch = replace(PINNED_BATCH, dp_peer_tokens=2, dp_peer_uniform=False)
    got = engine_step_plan(config, batch)
    assert [a[:2] for a in calls] == [(1, 2), (1, 2)]  # the peer's call, then this rank's
    want = ("FULL", 4, 2) if counts_prefills_as_uniform() else ("NONE", 2, 1)
    assert (got.mode, got.num_tokens_padded, got.num_reqs_padded) == want
    assert fields(got) == fields(ref.step_plan(config, release_batch(config, batch)))


def test_the_planner_binds_and_reachability_leaves_out_the_pairs_the_release_does_not_run():
    """Reachability is computed on every supported release: a varlen case's V2
    separate-routine pairs are left out where the release has no adaptive verification
    (or rewrites the mode), and the reason names them."""
    from attnfuzz.adapters import vllm
    from attnfuzz.harness.reachability import LATENT, reachability

    assert vllm.planner_problem() is None
    config = replace(PINNED_CONFIG, varlen_decode=True)
    r = reachability(
        Case(config, PINNED_BATCH), "builder", lambda c: False, lambda c: False, engine="vllm"
    )
    assert r.status == LATENT
    left_out = {
        ("v2", m)
        for m in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
        if refusal(replace(config, runner="v2", cudagraph_mode=m)) is not None
    }
    every = {(x, m) for x in ref.RUNNERS for m in ref.allowed_modes(config.cg_support, 2)}
    assert {(p.runner, p.cudagraph_mode) for p in r.pairs} == every - left_out
    for runner, mode in left_out:
        assert f"{runner} {mode} (" in r.reason
    assert ("the installed engine does not run" in r.reason) == bool(left_out)
