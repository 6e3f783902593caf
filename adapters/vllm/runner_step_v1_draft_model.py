"""vLLM's model runner V1 step with a separate draft model, as the implementation
``vllm-v1-draft-model`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` (implementation ``vllm-v1``), their speculative
config's method ``draft_model`` with a tiny Llama draft
(:data:`.runner_step_speculator.TINY_LLAMA`, as ``vllm-standalone-ar``), so that
``GPUModelRunner.__init__`` makes vLLM 0.33.0's ``DraftModelProposer``
(``vllm/v1/spec_decode/draft_model.py``). A draft model's input keeps one more slot a
request than the step's query (``max_num_new_slots_for_drafting`` 1: the bonus token
is appended, nothing is shifted out), so ``SpecDecodeBaseProposer.set_inputs_first_pass``
takes its path for extra input slots, which EAGLE and MTP never take: the Triton
``copy_and_expand_eagle_inputs_kernel`` (each request's query copied one row further
on per earlier request, its bonus token and position appended, rejected drafts
flagged), ``compute_new_slot_mapping`` (each row's slot from its new position; a
rejected draft's row the padding slot) and ``extend_all_queries_by_N``
(``query_start_loc`` and ``seq_lens`` one a request longer). After each step the
runner's own ``sample_tokens`` proposes with it, unchanged; the first draft forward
and each later draft decode are builds judged by the step's properties, as
``vllm-v1``'s are.

Stood in: the draft model (the EAGLE/MTP drafter's stand-in of
:mod:`.runner_step_drafter`) and what :mod:`.runner_step_v1` stands in.

Declined: what ``vllm-v1`` declines, engines without drafts, and steps that leave no
room for the drafter's slot: vLLM's ``Scheduler.schedule`` charges each request it
schedules its tokens plus ``max_num_new_slots_for_drafting`` against
``max_num_batched_tokens`` (the ``input_budget``), which the trace's scheduler does not
(:func:`.limits.draft_slots_declines`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm import runner_step_v1_dflash as dflash
from attnfuzz.adapters.vllm.limits import DRAFT_SLOTS, draft_model_declines
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = v1.prepare


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines, an engine with no drafter, and a step without room for
    the drafting slots (:func:`.limits.draft_model_declines`)."""
    return draft_model_declines(case) or v1.declines(case)


class _DraftModelEngine(v1._Engine):
    """A V1 engine whose drafter is a ``DraftModelProposer``."""

    speculator = speculating.STANDALONE_AR

    def first_pass_tokens(self, out: Any, taken: dict[str, int]) -> int:
        """The real tokens of the first draft forward: the step's (less the rejected
        drafts where the drafter's batch is not padded) and the bonus token's slot of
        each request."""
        num_reqs = self.runner.input_batch.num_reqs
        return super().first_pass_tokens(out, taken) + DRAFT_SLOTS * num_reqs


class DraftModelRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, with the draft-model drafter."""

    engine_type = _DraftModelEngine


ENGINE = DraftModelRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-draft-model`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-draft-model`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


def run_padding_slots_stale(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-draft-model-padding-slots-stale``: ``vllm-v1-draft-model``
    with ``SpecDecodeBaseProposer._get_slot_mapping`` not giving the rows past the
    query the padding slot (:func:`.runner_step_v1_dflash._padding_slots_stale`, the
    same base-class code under the draft model's expanded query)."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(DraftModelRunnerStepEngine(), dflash._padding_slots_stale)
run_padding_slots_stale.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


@contextlib.contextmanager
def _seq_lens_unextended() -> Iterator[None]:
    """The defect: ``extend_all_queries_by_N`` lengthening each request's query by the
    drafting slot but not its ``seq_lens``: the bonus token's row writes its key at the
    request's next position, and the draft forward's attention reads the request's
    keys only up to the one before (and each draft decode after it one short)."""
    from vllm.v1.spec_decode import llm_base_proposer

    original = llm_base_proposer.extend_all_queries_by_N

    def unextended(cad: Any, N: int, arange: Any, new_slot_mapping: Any) -> Any:
        new = original(cad, N, arange, new_slot_mapping)
        return new.replace(seq_lens=cad.seq_lens, max_seq_len=cad.max_seq_len)

    with mock.patch.object(llm_base_proposer, "extend_all_queries_by_N", unextended):
        yield


def run_seq_lens_unextended(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-draft-model-seq-lens-unextended``: ``vllm-v1-draft-model``
    with :func:`_seq_lens_unextended` in force."""
    return _UNEXTENDED(inputs)


_UNEXTENDED = v1.Mutated(DraftModelRunnerStepEngine(), _seq_lens_unextended)
run_seq_lens_unextended.new_engine = _UNEXTENDED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_v1_draft_model(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-draft-model`` runs: V1, drafts, pages of multiples of 16."""
    return dflash.reach_v1_dflash(trace)


def trigger_padding_slots_stale(trace: Trace | Case) -> bool:
    """A first draft forward padded for the drafter's piecewise graph after a larger
    one: a step whose expanded query (its tokens and one slot a request) is fewer rows
    than an earlier step's, no capture size, and held by a larger one. A necessary
    condition: the sizes counted either as declared or rounded up to whole queries."""
    c = trace.config
    if not reach_v1_draft_model(trace) or c.cudagraph_mode == "NONE":
        return False
    per_req = c.num_spec + 1
    declared = set(c.cudagraph_capture_sizes)
    rounded = {-(-s // per_req) * per_req for s in declared}
    exact = declared & rounded
    top = max(declared | rounded, default=0)
    most = 0
    for b in as_trace(trace).steps:
        rows = sum(b.q_lens) + DRAFT_SLOTS * len(b.q_lens)
        if rows < most and rows not in exact and rows < top:
            return True
        most = max(most, rows)
    return False


smallest_padding_slots_stale = dflash.smallest_padding_slots_stale
"""The smallest trace of the mutant: ``vllm-v1-dflash``'s (three requests prefill, two
of them then decode with both drafts; the second proposal, 8 rows, padded to 9)."""


def trigger_seq_lens_unextended(trace: Trace | Case) -> bool:
    """Any proposal: every step of a drafting engine ends in one, whose first forward
    extends each request's query."""
    return reach_v1_draft_model(trace)


def smallest_seq_lens_unextended() -> Trace:
    """One request prefills 2 tokens; the proposal after it extends the query to 3
    rows, the bonus token's key at position 2 and ``seq_lens`` 2."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=1, max_num_batched_tokens=16, block_size=16,
        num_spec=1, cudagraph_capture_sizes=(2,), runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (2,), req_ids=(1,), pages=((1,),), new_pages=(1,)),))
