"""vLLM's model runner V1 step with a DFlash draft model, as the implementation
``vllm-v1-dflash`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` (implementation ``vllm-v1``), their speculative
config's method ``dflash`` with a DFlash draft model (the tiny Qwen3
``DFlashDraftModel`` of :data:`.runner_step_speculator.TINY_DFLASH`), so that
``GPUModelRunner.__init__`` makes vLLM 0.33.0's ``DFlashProposer``
(``vllm/v1/spec_decode/dflash.py``) and sets ``use_aux_hidden_state_outputs``. After each
step the runner's own ``sample_tokens`` proposes with it, unchanged:
``propose_draft_token_ids`` (``prepare_inputs_padded``, the target's auxiliary hidden
states concatenated), then ``SpecDecodeBaseProposer.propose`` with DFlash's
``set_inputs_first_pass`` (the Triton ``_copy_and_expand_dflash_inputs_kernel``: each
request's context positions and slots, up to its last valid token, and its query of
``1 + num_spec`` rows, the bonus token then a mask token a draft: ``query_start_loc`` a
multiple of the query, ``seq_lens`` the valid context and the query), its
``build_model_inputs_first_pass`` (the context K/V stored through the draft model) and
``build_per_group_and_layer_attn_metadata``, and the one query forward (parallel
drafting: no draft loop); ``dummy_run`` in the capture and the idle rank's dummy runs.

The query forward is a build with ``draft`` 0, its real rows the requests' queries
(``1 + num_spec`` each), judged as ``vllm-v1``'s draft builds are (``kv_len`` and
``kv_slots`` included).

Stood in: the target model returns its hidden states and one auxiliary layer's
(``use_aux_hidden_state_outputs``: DFlash reads the target's auxiliary hidden states),
zeros; the draft model's context K/V store and the combination of those hidden states
compute nothing; what :mod:`.runner_step_v1` stands in.

Declined: what ``vllm-v1`` declines, engines without drafts, budgets that hold fewer
DFlash queries than ``max_num_seqs`` (as ``vllm-dflash``), and steps whose requests hold
fewer pages than vLLM's scheduler reserves for DFlash's lookahead
(:func:`.runner_step_dflash.declines`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.lookahead import dflash_num_lookahead_tokens
from attnfuzz.adapters.vllm.runner_step_dflash import budget_declines
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = v1.prepare


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines, an engine with no drafter, and what DFlash's query asks of
    the budget and of the step's pages."""
    if case.config.num_spec == 0:
        return "no speculative config: no drafter to run"
    return budget_declines(case) or v1.declines(case, dflash_num_lookahead_tokens)


class _AuxModel(v1._Model):
    """The target model with auxiliary hidden states: its hidden states and one
    auxiliary layer's, zeros (``use_aux_hidden_state_outputs``)."""

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        hidden = super().forward(input_ids=input_ids, positions=positions, **kwargs)
        return hidden, [hidden.clone()]


def _draft_model(seen: Any, hidden_size: int) -> torch.nn.Module:
    """The DFlash draft model: a ``DFlashQwen3ForCausalLM`` (``propose`` checks the
    class) built by none of its own code; its query forward reports as the EAGLE/MTP
    drafter's does (:class:`.runner_step_drafter.DraftModel`), its context K/V store and
    hidden-state combination compute nothing."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    class DFlashDraftModel(DFlashQwen3ForCausalLM):
        def __init__(self) -> None:
            torch.nn.Module.__init__(self)
            self.stand_in = drafting.DraftModel(seen, hidden_size, False)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.stand_in(*args, **kwargs)

        def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return self.stand_in.compute_logits(hidden_states)

        def precompute_and_store_context_kv(
            self, hidden_states: torch.Tensor, positions: torch.Tensor, context_slots: Any = None
        ) -> None:
            pass

        def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return torch.zeros(hidden_states.shape[0], hidden_size)

    return DFlashDraftModel()


class _DFlashEngine(v1._Engine):
    """A V1 engine whose drafter is a ``DFlashProposer``."""

    speculator = speculating.DFLASH

    def target_model(self) -> torch.nn.Module:
        return _AuxModel(self.recorder)

    def install_drafter(self) -> None:
        super().install_drafter()
        drafter = self.runner.drafter
        drafter.model = _draft_model(self.recorder.draft_forward, drafter.hidden_size)

    def first_pass_tokens(self, out: Any, taken: dict[str, int]) -> int:
        """The query forward's real tokens: ``1 + num_spec`` a request."""
        return self.runner.input_batch.num_reqs * (1 + self.config.num_spec)


class DFlashRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, with the DFlash drafter."""

    engine_type = _DFlashEngine


ENGINE = DFlashRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-dflash`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-dflash`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _padding_slots_stale() -> Iterator[None]:
    """The defect: ``SpecDecodeBaseProposer._get_slot_mapping`` copying the query's slot
    mapping into its buffer without giving the rows past it, up to the padded token
    count, the padding slot: they keep an earlier proposal's query slots, and the padded
    draft forward writes its padding tokens' K/V there."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    def unpadded(
        self: Any, num_tokens: int, slot_mapping: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        if slot_mapping is not None:
            self._slot_mapping_buffer[: slot_mapping.shape[0]].copy_(slot_mapping)
        view = self._slot_mapping_buffer[:num_tokens]
        return {name: view for name in self._draft_attn_layer_names}

    with mock.patch.object(SpecDecodeBaseProposer, "_get_slot_mapping", unpadded):
        yield


def run_padding_slots_stale(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-dflash-padding-slots-stale``: ``vllm-v1-dflash`` with
    :func:`_padding_slots_stale` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(DFlashRunnerStepEngine(), _padding_slots_stale)
run_padding_slots_stale.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_v1_dflash(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-dflash`` runs: V1, drafts, pages of multiples of 16."""
    c = trace.config
    return c.runner == "v1" and c.num_spec > 0 and not c.varlen_decode and c.block_size % 16 == 0


def trigger_padding_slots_stale(trace: Trace | Case) -> bool:
    """A proposal padded for the drafter's piecewise graph after one of more requests:
    a step of fewer requests than an earlier one, whose query rows are no capture size
    but a larger one holds them (the sizes rounded up to whole queries,
    ``adjust_cudagraph_sizes_for_spec_decode``), so that the padding rows held the
    earlier proposal's query slots."""
    if not reach_v1_dflash(trace) or trace.config.cudagraph_mode == "NONE":
        return False
    steps = as_trace(trace).steps
    per_req = trace.config.num_spec + 1
    top = max(trace.config.cudagraph_capture_sizes, default=0)
    sizes = {-(-s // per_req) * per_req for s in trace.config.cudagraph_capture_sizes}
    sizes = {s for s in sizes if s <= top}
    most = 0
    for b in steps:
        rows = len(b.q_lens) * per_req
        if len(b.q_lens) < most and rows not in sizes and any(s > rows for s in sizes):
            return True
        most = max(most, len(b.q_lens))
    return False


def smallest_padding_slots_stale() -> Trace:
    """Three requests prefill 2, 3 and 4 tokens (9 query rows, request 9's the last
    three); then request 8 is left out and 7 and 9 decode with both drafts: the
    proposal's 6 query rows are padded to the capture size 9, and the three padding
    rows keep request 9's earlier query slots, keys request 9 now reads."""
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
