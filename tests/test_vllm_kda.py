"""vllm-v1-kimi-k3-kda: Kimi K3's KDA builder on the V1 runner, its Triton staging run
on the CPU without its CUDA assert, and the one mutant of that staging."""

from __future__ import annotations

import ast
import dataclasses

import pytest
from attnfuzz.adapters import standins
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref

pytestmark = requires_vllm


def kda():
    from attnfuzz.adapters.vllm import runner_step_kda

    runner_step_kda.prepare()
    return runner_step_kda


def test_the_staging_loses_only_its_cuda_assert():
    kda()  # vLLM imported as the adapters import it (the CPU platform)
    from vllm.models.kimi_k3.nvidia import kda_metadata

    fn = kda_metadata.stage_spec_decode_metadata
    original = standins.function_tree(fn)
    assert not original.decorator_list, "a decorator would be dropped"
    before = [ast.unparse(s) for s in original.body]
    after = [ast.unparse(s) for s in standins.stripped_tree(fn).body]
    assert [s for s in before if s not in after] == ["assert state_indices.is_cuda"]
    assert [s for s in after if s not in before] == []


def test_the_graph_mode_full_is_declined():
    from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid

    case = next(iter(hybrid.smallest_full_spec_decode().cases()))
    assert kda().declines(case) is None
    full = dataclasses.replace(case, config=dataclasses.replace(case.config, cudagraph_mode="FULL"))
    assert "cudagraph_mode FULL" in kda().declines(full)


@pytest.mark.parametrize("mutant", [False, True], ids=["fixed", "staging-one-short"])
def test_the_staging_one_short_fails_and_the_fixed_builder_passes(mutant):
    """One request decodes its draft, padded to the FULL graph of 2 requests: the
    mutant stages it as padding (the null state), the replay no longer the eager
    build; the fixed builder's every build agrees."""
    from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid

    k = kda()
    run = k.staging_one_short if mutant else k.run
    run.new_engine()
    trace = hybrid.smallest_full_spec_decode()
    found = [v for case in trace.cases() for v in ref.violations(run(ref.make_inputs(case)))]
    assert bool(found) == mutant
    assert {v.field for v in found} <= {"gdn.spec_state_indices_tensor", "gdn.spec_query_start_loc"}
