"""vLLM's model runner V1 step with the unpadded drafter batch, as the implementation
``vllm-v1-unpadded-drafts`` of ``runner-step``.

The engines of :mod:`.runner_step_v1`, their speculative config's
``disable_padded_drafter_batch`` set: vLLM 0.33.0's V1 runner then proposes after
bookkeeping (``sample_tokens``), on each request's valid sampled tokens (none for a
partial prefill), and ``GPUModelRunner.propose_draft_token_ids`` takes the unpadded
path, unchanged: ``prepare_next_token_ids_cpu`` (a partial prefill's next token from its
request state) and, after a verify, ``SpecDecodeBaseProposer.prepare_inputs``
(``vllm/v1/spec_decode/llm_base_proposer.py``), which drops each request's rejected
drafts from the first pass: its query offsets, its sequence lengths (the upper bound less
the rejected), its token indices into the step's inputs, positions and slot mapping.
Then ``propose`` runs as in ``vllm-v1``, ``set_inputs_first_pass`` sampling each
request's last kept token (no ``token_indices_to_sample``) and the draft loop's lengths
not reduced by the rejected (there are none left).

Each draft forward is a build of the step with ``draft`` its sub-step, as in
``vllm-v1``; the first pass's real tokens are the step's less every rejected draft
(:func:`.runner_step_drafter.first_pass_tokens`, from the scheduler's drafts and the
accepted counts, not from the drafter).
"""

from __future__ import annotations

from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

prepare = v1.prepare


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines, and an engine with no drafter (``vllm-v1`` runs it)."""
    if case.config.num_spec == 0:
        return "no speculative config: the step is vllm-v1's"
    return v1.declines(case)


class _UnpaddedEngine(v1._Engine):
    """A V1 engine whose drafter batch is unpadded."""

    padded_drafts = False


class UnpaddedRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, with the unpadded drafter batch."""

    engine_type = _UnpaddedEngine


ENGINE = UnpaddedRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-unpadded-drafts`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-unpadded-drafts`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
