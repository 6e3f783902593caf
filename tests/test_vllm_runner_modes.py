"""vLLM 0.33.0's own CUDA-graph mode and padding decisions against ``reference.runner``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner as ref
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.strategies.batches import batches, engine_configs
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = requires_vllm


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
    assert fields(engine_step_plan(config, batch)) == fields(ref.step_plan(config, batch))


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
    (``adjust_cudagraph_sizes_for_spec_decode``): (3, 4) becomes (4,), refused."""
    from attnfuzz.adapters.vllm.runner_modes import resolved_config

    config = replace(PINNED_CONFIG, cudagraph_capture_sizes=(3, 4), runner="v1")
    with pytest.raises(ValueError, match="adjust_cudagraph_sizes_for_spec_decode"):
        resolved_config(config)
    assert resolved_config(replace(config, runner="v2"))[1].name == config.cudagraph_mode
