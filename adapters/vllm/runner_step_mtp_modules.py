"""vLLM's model runner V2 step with one MTP module a draft, as the implementation
``vllm-mtp-modules`` of ``runner-step``.

The step of :mod:`.runner_step` (implementation ``vllm``), its speculative config's MTP
draft model the tiny DeepSeek model with ``num_nextn_predict_layers`` equal to the
drafts (``SpeculativeConfig.use_multi_module_mtp``), so that ``init_speculator`` makes
vLLM 0.33.0's ``MultiModuleMTPSpeculator``
(``vllm/v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py``). After each step
the runner's own ``sample_tokens`` runs its ``propose``, unchanged:
``prepare_input_buffers`` (the Triton ``_prepare_input_buffers_kernel``: the accepted
tokens shifted, the last decode's trailing inputs re-prefilled before the query),
``prepare_input_hidden_states_and_embeddings``, ``dispatch_cg_and_sync_dp`` with its
``SpeculatorCudaGraphManager``, ``compute_slot_mappings`` and
``pad_trailing_draft_slots``, ``_build_attn_metadata``, then ``_generate_drafts``
(``cache_inputs``, each MTP module's forward over the step's query, ``update_draft_inputs``)
eagerly or in its captured FULL graph. Each module's forward is a build with ``draft``
set (module ``i``, draft ``i``), its query the step's, its real rows each request's
query less the trailing slot a rejection leaves
(:func:`.runner_step_speculator.unreal_rows`).

Stood in: the draft model (every module alike, reporting each forward), and what
:mod:`.runner_step` stands in.
"""

from __future__ import annotations

from attnfuzz.adapters.vllm import runner_step
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs


def prepare() -> None:
    """Import vLLM's runner and the speculator before a judge forks."""
    runner_step.prepare()
    import vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator  # noqa: F401


def declines(case: Case) -> str | None:
    """What :func:`.runner_step.declines` declines, and engines of fewer than two drafts
    (vLLM makes one module an ``MTPSpeculator``: ``vllm``'s)."""
    if case.config.num_spec < 2:
        return "fewer than two drafts: one MTP module, the MTPSpeculator of vllm"
    return runner_step.declines(case)


class MTPModulesEngine(runner_step.RunnerStepEngine):
    """:class:`.runner_step.RunnerStepEngine` with an MTP module a draft."""

    speculator = speculating.MTP_MODULES


ENGINE = MTPModulesEngine()
"""The engine of the implementation ``vllm-mtp-modules`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-mtp-modules``: the step on :data:`ENGINE`, kept across
    calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
