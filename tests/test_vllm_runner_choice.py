"""Which model runner the installed vLLM serves (``adapters/vllm/runner_choice.py``), held
to what its ``VllmConfig`` decides, and a V1-only finding's reachability naming it."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.engines import DEFAULT_RUNNER

pytestmark = requires_vllm


@pytest.mark.parametrize("variable", [None, "0", "1"])
def test_the_runner_served_is_the_one_vllm_config_serves(monkeypatch, variable):
    """With the variable unset, the runner read as the default is the one the tiny
    model's ``VllmConfig`` serves; set, it serves what it says, as the reading's
    configurations say."""
    from attnfuzz.adapters.vllm import _engine
    from attnfuzz.adapters.vllm.runner_choice import VARIABLE, runner_choice

    how = runner_choice()
    assert set(how) <= {"v1", "v2"} and list(how.values()).count(DEFAULT_RUNNER) == 1
    if variable is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, variable)
    served = "v2" if _engine._base_config(0).use_v2_model_runner else "v1"
    if variable is None:
        assert how[served] == DEFAULT_RUNNER
    elif how[served] != DEFAULT_RUNNER:
        assert f"{VARIABLE}={variable}" in how[served]


def test_a_v1_only_finding_of_vllm_names_how_its_release_serves_v1():
    """0.33.0 serves V2 unless told otherwise: a finding live on V1 alone says with what."""
    from attnfuzz.adapters.vllm.runner_choice import runner_choice
    from attnfuzz.harness.reachability import LIVE, reachability
    from attnfuzz.reference.batch import Batch, Case, EngineConfig

    if runner_choice().get("v2") != DEFAULT_RUNNER:
        pytest.skip("this vLLM release serves V1 unless told otherwise")
    config = EngineConfig(max_model_len=16, max_num_seqs=2, max_num_batched_tokens=8,
                          block_size=16)  # fmt: skip
    case = Case(config, Batch((0,), (2,)))
    r = reachability(case, "runner", lambda c: c.config.runner == "v1", lambda c: False, "vllm")
    assert r.status == LIVE
    assert "serves v1 only with VLLM_USE_V2_MODEL_RUNNER=0" in r.reason
    assert "attnfuzz.adapters.vllm.runner_choice.runner_choice" in r.decided_by


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # A release whose variable is False unset: V1 unless it is set.
        ({"VLLM_USE_V2_MODEL_RUNNER": lambda: False}, {"v1": DEFAULT_RUNNER,
                                                       "v2": "VLLM_USE_V2_MODEL_RUNNER=1"}),
        ({"VLLM_USE_V2_MODEL_RUNNER": lambda: True}, {"v1": "VLLM_USE_V2_MODEL_RUNNER=0",
                                                      "v2": DEFAULT_RUNNER}),
        ({}, {"v1": DEFAULT_RUNNER}),  # no variable: no V2 runner to choose
        (None, {}),  # no table this reading knows: nothing said
    ],
)  # fmt: skip
def test_what_the_variable_means_unset_decides_the_default(monkeypatch, table, expected):
    import vllm.envs as envs
    from attnfuzz.adapters.vllm.runner_choice import runner_choice

    monkeypatch.setattr(envs, "environment_variables", table)
    assert runner_choice() == expected
