"""Which model runner the installed vLLM serves, read from its code (:attr:`Engine.runners`).

vLLM has two model runners: V1 (``vllm/v1/worker/gpu_model_runner.py``) and V2
(``vllm/v1/worker/gpu/model_runner.py``). ``VLLM_USE_V2_MODEL_RUNNER`` picks one;
releases differ in what it means unset. In 0.33.0 it is ``None`` unset
(``envs.py``), and ``VllmConfig.use_v2_model_runner`` then serves V2 unless the
platform has no Triton or the config uses a feature V2 lacks
(``_get_v2_model_runner_unsupported_features``). A release whose variable is
``False`` unset serves V1 unless it is set.
"""

from __future__ import annotations

import inspect
import os
from unittest import mock

from attnfuzz.harness.engines import DEFAULT_RUNNER

VARIABLE = "VLLM_USE_V2_MODEL_RUNNER"


def runner_choice() -> dict[str, str]:
    """Runner (``v1``, ``v2``) -> the configuration under which the installed vLLM
    serves it, :data:`DEFAULT_RUNNER` for the one it serves with nothing set; empty
    where the release's choice is not one this reading knows."""
    import vllm.envs as envs
    from vllm.config import VllmConfig

    variables = getattr(envs, "environment_variables", None)
    if not isinstance(variables, dict):  # not the table this reading knows
        return {}
    read = variables.get(VARIABLE)
    if read is None:  # no variable: the V1 runner alone
        return {"v1": DEFAULT_RUNNER}
    with mock.patch.dict(os.environ):
        os.environ.pop(VARIABLE, None)
        unset = read()
    if unset is None:  # V2 unless the config or platform asks for V1
        decides = getattr(VllmConfig, "use_v2_model_runner", None)
        source = inspect.getsource(decides.fget) if isinstance(decides, property) else ""
        why = [f"{VARIABLE}=0"]
        if "HAS_TRITON" in source:
            why.append("a platform without Triton")
        if "_get_v2_model_runner_unsupported_features" in source:
            why.append(
                "a feature the V2 runner lacks "
                "(VllmConfig._get_v2_model_runner_unsupported_features)"
            )
        return {"v1": ", or ".join(why), "v2": DEFAULT_RUNNER}
    if unset:
        return {"v1": f"{VARIABLE}=0", "v2": DEFAULT_RUNNER}
    return {"v1": DEFAULT_RUNNER, "v2": f"{VARIABLE}=1"}
