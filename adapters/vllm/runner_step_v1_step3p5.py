"""vLLM's model runner V1 step with a Step3.5 model's MTP layers a draft, as the
implementation ``vllm-v1-step3p5-mtp`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` (implementation ``vllm-v1``), their speculative
config's MTP draft model a tiny Step3.5 config
(:data:`.runner_step_speculator.TINY_STEP3P5`, which ``SpeculativeConfig`` makes a
``step3p5_mtp`` draft: ``use_step3p5_mtp``), so that ``GPUModelRunner.__init__`` makes
vLLM 0.33.0's ``Step3p5MTPProposer`` (``vllm/v1/spec_decode/step3p5.py``). After each
step the runner's own ``sample_tokens`` proposes with it, unchanged: the runner hands
it each KV-cache group's block table and slot mapping (``set_per_group_attn_metadata``,
in ``_build_attention_metadata``), and its own ``initialize_attn_backend``,
``build_per_group_and_layer_attn_metadata``, ``_get_slot_mapping``,
``_update_positions_dependent_metadata`` and ``propose`` (the first pass over the
step's tokens, then one forward a draft, each MTP layer its own) run; its dummy runs
in the capture and the idle rank's. Each draft forward is a build with ``draft`` its
sub-step, judged as ``vllm-v1``'s are.

Stood in: the draft model (every MTP layer alike), and what :mod:`.runner_step_v1`
stands in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = v1.prepare


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines, and an engine with no drafter (``vllm-v1`` runs it)."""
    if case.config.num_spec == 0:
        return "no speculative config: the step is vllm-v1's"
    return v1.declines(case)


class _Step3p5Engine(v1._Engine):
    """A V1 engine whose drafter is a ``Step3p5MTPProposer``."""

    speculator = speculating.STEP3P5_MTP

    def install_drafter(self) -> None:
        super().install_drafter()
        # Each draft step names its MTP layer (spec_step_idx): every one stood in alike.
        drafter = self.runner.drafter
        model = speculating._ModuleDraftModel(
            self.recorder.draft_forward, drafter.hidden_size, drafter.model_returns_tuple()
        )
        drafter.model = model


class Step3p5RunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, with the Step3.5 MTP drafter."""

    engine_type = _Step3p5Engine


ENGINE = Step3p5RunnerStepEngine()
"""The engine of the implementation ``vllm-v1-step3p5-mtp`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-step3p5-mtp`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _padding_slots_stale() -> Iterator[None]:
    """The defect: the draft step's slot-mapping update
    (``eagle_step_update_slot_mapping_and_metadata``, which ``Step3p5MTPProposer
    ._update_positions_dependent_metadata`` runs before each draft step) not giving the
    rows past the batch, up to the padded token count, the padding slot: they keep the
    first pass's slots, and the padded draft forward writes its padding tokens' K/V
    there."""
    import vllm.v1.spec_decode.llm_base_proposer as base

    update = base.eagle_step_update_slot_mapping_and_metadata

    def unpadded(*args: Any, **kwargs: Any) -> None:
        out, batch_size = kwargs["out_slot_mapping"], kwargs["positions_1d"].shape[0]
        before = out.clone()
        update(*args, **kwargs)
        out[batch_size:] = before[batch_size:]

    with mock.patch.object(base, "eagle_step_update_slot_mapping_and_metadata", unpadded):
        yield


def run_padding_slots_stale(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-step3p5-mtp-padding-slots-stale``: ``vllm-v1-step3p5-mtp``
    with :func:`_padding_slots_stale` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(Step3p5RunnerStepEngine(), _padding_slots_stale)
run_padding_slots_stale.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_step3p5(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-step3p5-mtp`` runs: V1, drafts, pages of multiples of 16."""
    c = trace.config
    return c.runner == "v1" and c.num_spec > 0 and not c.varlen_decode and c.block_size % 16 == 0


def trigger_padding_slots_stale(trace: Trace | Case) -> bool:
    """A draft step padded for the drafter's piecewise graph: two drafts or more, and a
    step whose requests are no capture size (rounded up to whole decode queries,
    ``adjust_cudagraph_sizes_for_spec_decode``) but below a larger one, so that the
    draft step's padding rows hold the first pass's slots."""
    c = trace.config
    if not reach_step3p5(trace) or c.num_spec < 2 or c.cudagraph_mode == "NONE":
        return False
    steps = as_trace(trace).steps
    per_req = c.num_spec + 1
    top = max(c.cudagraph_capture_sizes, default=0)
    sizes = {-(-s // per_req) * per_req for s in c.cudagraph_capture_sizes}
    sizes = {s for s in sizes if s <= top}
    return any(len(b.q_lens) not in sizes and any(s > len(b.q_lens) for s in sizes) for b in steps)


def smallest_padding_slots_stale() -> Trace:
    """Three requests prefill 2, 3 and 4 tokens; then request 8 is left out and 7 and 9
    decode with both drafts: the draft step's 2 rows are padded to the capture size 9,
    and its padding rows keep the first pass's slots (rows 2 to 5: requests 7's and
    9's keys, which their draft step reads)."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=2, cudagraph_capture_sizes=(3, 9), runner="v1",
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0, 0, 0), (2, 3, 4), req_ids=(7, 8, 9), pages=((1,), (2,), (3,)),
                  new_pages=(1, 1, 1)),
            Batch((2, 4), (3, 3), req_ids=(7, 9), pages=((1,), (3,)), new_pages=(0, 0)),
        ),
    )  # fmt: skip
