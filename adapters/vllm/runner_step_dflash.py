"""vLLM's model runner V2 step with a DFlash draft model, as the implementation
``vllm-dflash`` of ``runner-step``.

The step of :mod:`.runner_step` (implementation ``vllm``), its speculative config's
method ``dflash`` with a DFlash draft model (a tiny Qwen3 ``DFlashDraftModel``,
:data:`.runner_step_speculator.TINY_DFLASH`, its mask token in its ``dflash_config``), so
that ``init_speculator`` makes vLLM 0.33.0's ``DFlashSpeculator``
(``vllm/v1/worker/gpu/spec_decode/dflash/speculator.py``). After each step the runner's
own ``sample_tokens`` runs its ``propose``, unchanged: ``prepare_dflash_inputs`` (the
Triton ``_prepare_dflash_inputs_kernel``: each request's context positions and slots, up
to its last accepted token, and its query of ``1 + num_spec`` rows, the bonus token then
a mask token a draft, at the positions after it: ``query_start_loc`` a multiple of the
query, ``seq_lens`` the context and the query, the rows past the batch padded with the
padding slot), ``dispatch_cg_and_sync_dp`` with its ``DFlashCudaGraphManager`` (FULL
graphs of the uniform query, their ``_prepare_graph_forward`` and
``_prepare_graph_replay``), ``_store_hidden_states``, ``_build_uniform_attn_metadata``,
and ``_generate_draft`` (the one query forward, the drafts sampled at the mask tokens),
eager or in its captured FULL graph. The query forward is a build with ``draft`` 0, its
real rows the requests' queries (``1 + num_spec`` each, all real: the query is the
drafter's own, not the step's tokens), judged by the step's properties.

Stood in: the draft model (the query forward reporting as the other speculators' does;
its context K/V store, ``precompute_and_store_context_kv``, computes nothing), the
target model's auxiliary hidden states (the runner asks for them with DFlash: the model
takes the EAGLE-3 interface and returns one layer's, zeros; the draft config names no
``target_layer_ids``, so the speculator stages none for its graphs), and what
:mod:`.runner_step` stands in.

Declined: what :mod:`.runner_step` declines, engines without drafts, pages the Triton
drafter takes no kernel block size for (the speculator is not made), steps whose
requests hold fewer pages than vLLM's scheduler reserves for DFlash's lookahead
(``num_spec + 1`` tokens past the step's, the query's K/V), and budgets where a DFlash
query per request does not fit: ``VllmConfig`` refuses ``max_num_batched_tokens``
not past the lookahead (``num_spec + 1``), and lowers ``max_num_active_seqs`` below
``max_num_seqs`` where the budget holds fewer queries than that, which the trace's
scheduler does not (so the config is declined).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any
from unittest import mock

from attnfuzz.adapters.vllm import runner_step
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm.lookahead import dflash_num_lookahead_tokens
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace


def prepare() -> None:
    """Import vLLM's runner and the speculator before a judge forks."""
    runner_step.prepare()
    import vllm.v1.worker.gpu.spec_decode.dflash.speculator  # noqa: F401


def declines(case: Case) -> str | None:
    """What :func:`.runner_step.declines` declines, engines with no draft, pages Triton's
    drafter kernels do not take, and what DFlash's query asks of the budget and of the
    step's pages (:func:`budget_declines`; DFlash's lookahead,
    :func:`.lookahead.dflash_num_lookahead_tokens`)."""
    c = case.config
    if c.num_spec == 0:
        return "no speculative config: no speculator to run"
    if c.block_size % 16:
        return (
            f"block_size {c.block_size}: the DFlash drafter's Triton attention takes kernel "
            "block sizes of multiples of 16 (no speculator is made)"
        )
    return budget_declines(case) or runner_step.declines(case, dflash_num_lookahead_tokens)


def budget_declines(case: Case) -> str | None:
    """A budget that holds fewer DFlash queries than ``max_num_seqs``: ``VllmConfig``
    refuses ``max_num_batched_tokens`` not past the lookahead (``num_spec + 1``), and
    lowers ``max_num_active_seqs`` below ``max_num_seqs`` where the budget holds fewer
    queries than that, which the trace's scheduler does not."""
    c = case.config
    lookahead = dflash_num_lookahead_tokens(c)
    if c.max_num_batched_tokens <= lookahead:
        return (
            f"max_num_batched_tokens {c.max_num_batched_tokens} not past the DFlash "
            f"lookahead {lookahead}: VllmConfig refuses it"
        )
    if c.max_num_batched_tokens // lookahead < c.max_num_seqs:
        return (
            f"{c.max_num_batched_tokens // lookahead} DFlash queries fit the budget, fewer "
            f"than max_num_seqs {c.max_num_seqs}: VllmConfig lowers max_num_active_seqs, "
            "which the trace's scheduler does not"
        )
    return None


def _aux_model(recorder: Any) -> runner_step._Model:
    """The target model with the EAGLE-3 interface (``load_model`` sets its auxiliary
    layers: the runner asks for them with DFlash, ``requires_aux_hidden_states``),
    returning its hidden states and one auxiliary layer's, zeros."""
    from vllm.model_executor.models.interfaces import SupportsEagle3

    class AuxModel(runner_step._Model, SupportsEagle3):
        def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
            self.aux_layers = layers

        def get_eagle3_default_aux_hidden_state_layers(self) -> tuple[int, ...]:
            return (1,)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            hidden = super().forward(*args, **kwargs)
            return hidden, [hidden.clone()]

    return AuxModel(recorder)


class _DFlashEngine(runner_step._Engine):
    """A V2 engine whose target returns auxiliary hidden states (:func:`_aux_model`)."""

    def target_model(self) -> runner_step._Model:
        return _aux_model(self.recorder)


class DFlashEngine(runner_step.RunnerStepEngine):
    """:class:`.runner_step.RunnerStepEngine` with the DFlash draft model."""

    speculator = speculating.DFLASH
    engine_type = _DFlashEngine


ENGINE = DFlashEngine()
"""The engine of the implementation ``vllm-dflash`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-dflash``: the step on :data:`ENGINE`, kept across calls;
    ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _query_slots_unpadded() -> Iterator[None]:
    """The defect: ``_prepare_dflash_inputs_kernel`` without its last loop's padding of
    the query slot mapping past the batch's queries, so those rows keep what the shared
    slot-mapping buffer held (the target step's slots): a FULL graph replayed over more
    rows than the queries writes the draft's K/V there."""
    import vllm.v1.worker.gpu.spec_decode.dflash.speculator as dflash

    prepare_inputs = dflash.prepare_dflash_inputs
    signature = inspect.signature(prepare_inputs)

    def unpadded(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs).arguments
        slots = bound["query_slot_mapping"]
        before = slots.clone()
        prepare_inputs(*args, **kwargs)
        num_reqs = bound.get("num_reqs_override") or bound["input_batch"].num_reqs
        start = num_reqs * bound["num_query_per_req"]
        slots[start:] = before[start:]

    with mock.patch.object(dflash, "prepare_dflash_inputs", unpadded):
        yield


def run_query_slots_unpadded(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-dflash-query-slots-unpadded``: ``vllm-dflash`` with
    :func:`_query_slots_unpadded` in force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(DFlashEngine(), _query_slots_unpadded)
run_query_slots_unpadded.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def _full_decode(config: EngineConfig) -> bool:
    """Whether the config's graphs hold FULL decode graphs (the DFlash query's)."""
    return config.cudagraph_mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def reach_dflash(trace: Trace | Case) -> bool:
    """An engine ``vllm-dflash`` runs: V2, drafts, pages of multiples of 16."""
    c = trace.config
    return c.runner == "v2" and c.num_spec > 0 and not c.varlen_decode and c.block_size % 16 == 0


def _captured_requests(config: EngineConfig) -> set[int]:
    """The request counts of the DFlash query's FULL graphs: each capture size rounded up
    to whole queries, none past the largest capture size or ``max_num_seqs``
    (``CudaGraphManager._init_candidates``' uniform decode descriptors)."""
    per_req = config.num_spec + 1
    top = max(config.cudagraph_capture_sizes, default=0)
    out = set()
    for size in config.cudagraph_capture_sizes:
        reqs = -(-size // per_req)
        if reqs * per_req <= top and reqs <= config.max_num_seqs:
            out.add(reqs)
    return out


def trigger_query_slots_unpadded(trace: Trace | Case) -> bool:
    """A proposal replayed in a FULL graph over more rows than its queries: a step
    before the last (its proposal is judged in the next step) of a request count no
    graph has, which a larger one holds."""
    if not (reach_dflash(trace) and _full_decode(trace.config)):
        return False
    steps = as_trace(trace).steps
    counts = _captured_requests(trace.config)
    return any(
        len(b.q_lens) not in counts and any(n > len(b.q_lens) for n in counts) for b in steps[:-1]
    )


def smallest_query_slots_unpadded() -> Trace:
    """Two requests prefill 6 and 4 tokens (no data-parallel peer), then decode with
    both drafts: the proposal after the prefill (6 query rows) replays the FULL graph of
    3 queries (the capture size 9), whose last three rows the defect leaves at the
    prefill's slots, which the slot-mapping buffer still holds."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=2, cudagraph_capture_sizes=(3, 9), runner="v2",
    )  # fmt: skip
    pages = ((1,), (2,))
    return Trace(
        config,
        (
            Batch((0, 0), (6, 4), req_ids=(7, 8), pages=pages, new_pages=(1, 1)),
            Batch((6, 4), (3, 3), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
        ),
    )
