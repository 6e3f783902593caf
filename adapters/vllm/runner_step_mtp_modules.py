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
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace


def prepare() -> None:
    """Import vLLM's runner and the speculator before a judge forks."""
    runner_step.prepare()
    import vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator  # noqa: F401


def declines(case: Case) -> str | None:
    """What :func:`declines_engine` declines, and a step whose rejections re-prefill
    before a request's first token (:func:`reprefill_before_prompt`: a finding of vLLM's
    own, kept apart as ``vllm-mtp-modules-reprefill-before-prompt``), so that the
    searches of ``vllm-mtp-modules`` judge the rest."""
    if reprefill_before_prompt(case.batch):
        return (
            "a request rejects more drafts than its tokens before the query and one: the "
            "draft pass re-prefills before position 0 (kept apart as "
            "vllm-mtp-modules-reprefill-before-prompt)"
        )
    return declines_engine(case)


def declines_engine(case: Case) -> str | None:
    """What :func:`.runner_step.declines` declines, and engines of fewer than two drafts
    (vLLM makes one module an ``MTPSpeculator``: ``vllm``'s)."""
    if case.config.num_spec < 2:
        return "fewer than two drafts: one MTP module, the MTPSpeculator of vllm"
    return runner_step.declines(case)


def reprefill_before_prompt(batch: Batch) -> bool:
    """A request of ``batch`` rejects more drafts than one past the tokens computed
    before its query. After the step, ``_prepare_input_buffers_kernel`` re-prefills the
    request's ``num_rejected - 1`` tokens before the query's first, at positions
    ``first_position - num_reprefill_tokens + i`` (``first_position``: the tokens
    computed before the query), bounded by nothing else: the first falls below 0."""
    return any(
        x - 1 > computed
        for x, computed in zip(batch.rejected, batch.num_computed_tokens, strict=False)
    )


def reach_reprefill(trace: Trace | Case) -> bool:
    """A step rejects two drafts or more of a request: the draft pass after it
    re-prefills (``num_reprefill_tokens = num_rejected - 1``)."""
    steps = as_trace(trace).steps
    return trace.config.runner == "v2" and any(x >= 2 for b in steps for x in b.rejected)


def trigger_reprefill_before_prompt(trace: Trace | Case) -> bool:
    steps = as_trace(trace).steps
    return trace.config.runner == "v2" and any(reprefill_before_prompt(b) for b in steps)


def smallest_reprefill_before_prompt() -> Trace:
    """Three MTP modules (``num_spec = 3``): one request of a one-token prompt
    prefills, then decodes its token and three drafts, and the step rejects all three:
    the draft pass after it re-prefills two tokens before the query's first (position
    1), the first at position -1. Its builds are judged at step 2, the request's next
    token. A prompt of one token is the shortest vLLM takes (``InputProcessor.
    _validate_prompt_len`` refuses an empty one); three drafts are the fewest that
    reach below 0 after it."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=8, block_size=16, num_spec=3,
        cudagraph_capture_sizes=(4,), topk=1, num_heads=1, head_dim=1, cudagraph_mode="NONE",
        cg_support="UNIFORM_SINGLE_TOKEN_DECODE", runner="v2",
    )  # fmt: skip
    pages = ((1,),)
    steps = (
        Batch((0,), (1,), seed=0, req_ids=(0,), pages=pages, new_pages=(1,)),
        Batch((1,), (4,), seed=0, req_ids=(0,), pages=pages, new_pages=(0,), rejected=(3,)),
        Batch((2,), (1,), seed=0, req_ids=(0,), pages=pages, new_pages=(0,)),
    )
    return Trace(config, steps)


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
