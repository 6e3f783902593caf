"""vLLM's model runner V2 step with a standalone draft model, as the implementation
``vllm-standalone-ar`` of ``runner-step``.

The step of :mod:`.runner_step` (implementation ``vllm``), its speculative config's
method ``draft_model`` with a separate draft model (a tiny Llama,
:data:`.runner_step_speculator.TINY_LLAMA`: no MTP layers, so vLLM keeps the method), so
that ``init_speculator`` makes vLLM 0.33.0's ``StandaloneARSpeculator``
(``vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py``). After each step the
runner's own ``sample_tokens`` runs its ``propose``, unchanged: ``_prefill`` (the Triton
``_prepare_prefill_inputs_kernel`` expanding each request's query by its correction
token, ``BlockTables.compute_slot_mappings``, ``DraftModelSpeculator._build_attn_metadata``
into the Triton builder) and ``_multi_step_decode`` (its positions and seq_lens advanced
each draft step, ``_build_uniform_attn_metadata``), each forward of the draft model a
build with ``draft`` set (the draft prefill 0, then each decode), judged by the step's
properties. The speculator captures no graph (``init_cudagraph_manager`` and ``capture``
are no-ops in 0.33.0): its builds are the eager, padded and fresh engines'.

Stood in: the draft model (``load_draft_model``: the stand-in of
:mod:`.runner_step_speculator`, its attention layer in the target's KV-cache group),
and what :mod:`.runner_step` stands in.

Declined: what ``vllm`` declines, engines without drafts, and steps that leave no room
for the drafter's slot a request, which vLLM's ``Scheduler.schedule`` keeps out of
``max_num_batched_tokens`` (:func:`.limits.draft_slots_declines`; drawn inside it,
``limits.draft_model_step_admits``).

One rank: the graph engine has no data-parallel peer (nor the idle rank's dummy runs
that come with one). With one (a MoE target and a data-parallel size of 2),
``propose`` hands the draft forwards the target's ``num_tokens_across_dp``, and
``set_forward_context``'s ``DPMetadata.make`` asserts it equals the draft forward's own
token count (the expanded prefill's ``num_tokens + num_reqs``): the drafter fails there,
in vLLM, from the first idle rank's dummy run on (the test of this module shows it).
"""

from __future__ import annotations

from attnfuzz.adapters.vllm import runner_step
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm.limits import draft_model_declines
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs


def prepare() -> None:
    """Import vLLM's runner and the speculator before a judge forks."""
    runner_step.prepare()
    import vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator  # noqa: F401


def declines(case: Case) -> str | None:
    """What :func:`.runner_step.declines` declines, engines with no draft to run, and
    steps without room for the drafting slots vLLM's scheduler keeps
    (:func:`.limits.draft_model_declines`)."""
    return draft_model_declines(case) or runner_step.declines(case)


class StandaloneAREngine(runner_step.RunnerStepEngine):
    """:class:`.runner_step.RunnerStepEngine` with the standalone draft model, one rank."""

    speculator = speculating.STANDALONE_AR
    data_parallel = False


ENGINE = StandaloneAREngine()
"""The engine of the implementation ``vllm-standalone-ar`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-standalone-ar``: the step on :data:`ENGINE`, kept across
    calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
