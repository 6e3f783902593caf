"""vLLM's own persistent request state (model runner V2) as the implementation ``vllm`` of
``persistent-batch``.

One :class:`PersistentBatchEngine` is one engine: it holds the objects vLLM 0.33.0's
``GPUModelRunner`` (``vllm/v1/worker/gpu/model_runner.py``, the default runner) keeps for
its whole life, made by their own ``__init__`` as ``GPUModelRunner.__init__`` and
``initialize_kv_cache`` make them, and drives them from one scheduler output to the next
with the runner's own methods, in the runner's order:

- ``vllm/v1/worker/gpu/states.py`` ``RequestState``: a request's row
  (``req_id_to_index``, ``free_indices``), its ``num_computed_tokens`` (a staged
  device tensor and its host mirror);
- ``vllm/v1/worker/gpu/block_table.py`` ``BlockTables``: the rows' pages
  (``append_block_ids``, ``apply_staged_writes``), and per step
  ``gather_block_tables`` and ``compute_slot_mappings``;
- ``vllm/v1/worker/gpu/input_batch.py`` ``InputBuffers`` (the step's
  ``query_start_loc``, ``positions``, ``seq_lens``) and ``prepare_pos_seq_lens``.

Per step (``GPUModelRunner.sample_tokens`` of the last step, then ``execute_model``):

1. ``postprocess_sampled`` of the last step: vLLM's ``post_update`` advances each
   request's device ``num_computed_tokens`` by its query length less its rejected
   drafts. The runner's sampler counts them; here they are what the scheduler's
   counts say (a request's computed tokens now, against its length last step).
2. ``finish_requests``: requests absent from the step have left (finished or
   preempted: ``RequestState.remove_request`` frees their rows).
3. ``add_requests``: new requests (arrivals, and preempted ones resumed: the V2
   runner's scheduler hands those on as new, ``vllm/v1/core/sched/scheduler.py``
   ``Scheduler.schedule``) take a free row (``RequestState.add_request``), their pages
   written over the row (``append_block_ids(overwrite=True)``); ``apply_staged_writes``.
4. ``update_requests``: running requests' host ``num_computed_tokens`` and the pages
   they gained, appended (``append_block_ids(overwrite=False)``).
5. ``block_tables.apply_staged_writes()`` (``execute_model``).
6. ``gather_batch_req_state``: the step's ``BatchReqState``, the host state of the
   batch's requests (``idx_mapping_np``: batch order -> row, prefill progress), in the
   runner's batch order (``sort_batch_req_ids``), then put in the inputs' order (below).
7. ``prepare_inputs``: the step's ``InputBatch`` in the runner's ``InputBuffers``: the
   device ``idx_mapping``, the host ``query_start_loc`` with its padding
   (``query_start_loc_np[num_reqs + 1:] = num_tokens``) copied into the persistent
   buffer, the prefill tokens, ``prepare_pos_seq_lens`` (positions, ``seq_lens``), the
   sampled and draft tokens and logits indices (``combine_sampled_and_draft_tokens``).
8. ``prepare_attn``: ``gather_block_tables`` and ``compute_slot_mappings``.

What runs unchanged: ``GPUModelRunner``'s ``finish_requests``, ``_remove_request``,
``add_requests``, ``update_requests``, ``postprocess_sampled``,
``gather_batch_req_state``, ``prepare_inputs`` and ``prepare_attn`` (taken from the
class, bound to :class:`_Runner`, which holds the real objects above), and everything
they call. Every field the target compares comes out of them: ``query_start_loc`` and
``seq_lens`` are ``prepare_inputs``' views of ``InputBuffers``, the block table and slot
mapping ``prepare_attn``'s of ``BlockTables``' buffers, padding rows included. The
adapter's glue, where the runner needs a model, a sampler or a device, or where the
target states what the runner would decide:

- the ``SchedulerOutput`` of the step (vLLM's own dataclasses, ``vllm/v1/core/sched/output.py``),
  built from the inputs: only ``req_ids``, computed tokens, query lengths and new pages
  (no draft token ids: ``scheduled_spec_decode_tokens`` is empty, so ``prepare_inputs``
  takes its branch of one logit a request; the drafts' count is the scheduler's, in
  the computed tokens);
- the collaborators these methods also reach, none of which reaches the attention
  metadata: ``model_state`` and ``lora_state`` as no-ops (``model_state`` answers
  ``num_new_sampled_tokens_per_step`` 1, the ``ModelState`` interface's default, and
  ``decode_query_len`` is ``load_model``'s, the drafts plus that 1); of ``model_config``,
  ``rswa_window`` None; the sampler, pooling, encoder cache, pipeline parallelism, PCP,
  the fast-prefill helper and adaptive verification: none;
- the sampler's result: ``num_rejected`` as above, ``num_sampled`` 0 (``post_update``
  then writes no token: the token bookkeeping is not attention metadata, and the count
  it keeps, ``query_len - num_rejected``, does not depend on it);
- the batch order: ``gather_batch_req_state`` sorts the batch (``sort_batch_req_ids``:
  queries of ``decode_query_len`` tokens first, then the shortest), and the order is an
  input of the target, the batch order the reference judges; so its ``BatchReqState``
  is taken in the inputs' order, each request's entries with it (:func:`_in_batch_order`;
  nothing when the runner's order is already the inputs');
- the padding decision: ``execute_model``'s ``dispatch_cg_and_sync_dp`` needs a
  ``CudaGraphManager`` (a CUDA graph pool, a pipeline-parallel group), and the padded
  sizes are inputs of the target (``num_reqs_padded``, ``num_slot_tokens``, the
  reference's step plan; vLLM's own decision is run by the planner adapter,
  ``adapters/vllm/runner_modes.py``, and held to that plan by its tests), so the step's
  ``BatchExecutionDescriptor`` is vLLM's own dataclass of those two (:func:`_batch_desc`),
  and the LoRA count is what ``execute_model`` passes without LoRA, 0.

A step's padding is vLLM's: ``prepare_inputs`` repeats the token count in
``query_start_loc`` past the real requests, ``prepare_pos_seq_lens`` writes ``seq_lens``
0 there, ``gather_block_tables`` zeroes the padding rows (the null block 0), and
``compute_slot_mappings`` writes ``PAD_SLOT_ID`` from the real token count to the end of
its buffer.

Releases: the adapter binds from 0.30.0 (``compat.REQUIRES``), and 0.30.0 to 0.33.0 have
``gather_batch_req_state``, ``BatchReqState`` and ``prepare_inputs`` in these forms;
``prepare_inputs`` takes the step's LoRA count from 0.31.0 (0.30.0 takes none).

The block table's width is the runner's own: ``initialize_kv_cache`` sizes each group's
row with ``get_block_table_width(spec.max_num_blocks_per_req(...), block_size,
token_alignment=spec.block_table_token_alignment)``, whole 128-token spans for an
attention spec (:func:`runner_width`), and the reference hands on the same width
(``attnfuzz.reference.persistent_batch.table_width``): the columns past a request's
pages are never compared, and are zero in padding rows.

The V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``) keeps its requests in other objects
(``vllm/v1/worker/gpu_input_batch.py`` ``InputBatch``, ``block_table.py``
``MultiGroupBlockTable``): an engine config of ``runner="v1"`` is declined (:func:`declines`).

The kernels run under the Triton interpreter here; the objects' host buffers are
those CPU-only torch can allocate (:func:`attnfuzz.adapters.vllm.slot_mapping.host_memory`).
``new_engine()`` drops every object; another engine config (or device) is another engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  (TRITON_INTERPRET before vLLM's kernels are defined)
import numpy as np
import torch
from attnfuzz.adapters.vllm import _engine, compat
from attnfuzz.adapters.vllm.slot_mapping import host_memory, new_block_tables
from attnfuzz.reference.batch import Case, EngineConfig, cdiv
from attnfuzz.reference.persistent_batch import PersistentBatchInputs, PersistentBatchOutputs


def prepare() -> None:
    """Import vLLM's runner (and with it vLLM) before a judge forks."""
    _engine.prepare()
    _runner_class()


# -- the runner: vLLM's methods, the engine's objects ----------------------------------------


class _Standin:
    """What a runner method reads of an object the adapter stands in for: the attributes
    set, and nothing else. A read of any other raises here, in attnfuzz (an adapter that
    misses what a release reads is attnfuzz's error, not a finding)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"{type(self).__name__} (attnfuzz's stand-in in adapters/vllm/persistent_batch.py) "
            f"has no {name!r}: the installed vLLM's runner reads what the adapter does not model"
        )


class _NoState(_Standin):
    """A per-request state the runner keeps beside the request's row that attention does
    not read (``model_state``: M-RoPE, Mamba, multimodal; ``lora_state``): no-ops."""

    def add_request(self, *args: Any) -> None:
        pass

    def remove_request(self, *args: Any) -> None:
        pass

    def apply_staged_writes(self) -> None:
        pass

    def postprocess_state(self, *args: Any) -> None:
        pass


@cache
def _runner_class() -> type:
    """:class:`_Runner`: ``GPUModelRunner``'s methods of a step's request state, unchanged,
    on an object that holds the engine's ``RequestState``, ``BlockTables`` and
    ``InputBuffers``."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    class _Runner(_Standin):
        _remove_request = GPUModelRunner._remove_request
        finish_requests = GPUModelRunner.finish_requests
        add_requests = GPUModelRunner.add_requests
        update_requests = GPUModelRunner.update_requests
        postprocess_sampled = GPUModelRunner.postprocess_sampled
        gather_batch_req_state = GPUModelRunner.gather_batch_req_state
        prepare_inputs = GPUModelRunner.prepare_inputs
        prepare_attn = GPUModelRunner.prepare_attn

    return _Runner


class _ModelState(_NoState):
    """``model_state`` (``vllm/v1/worker/gpu/model_states/``): no-ops, and the one number
    ``prepare_inputs`` and the runner's ``decode_query_len`` read of it, the interface's
    default (``ModelState.num_new_sampled_tokens_per_step``, 1: one token sampled per
    request and step, as the default and every attention-only model state)."""

    num_new_sampled_tokens_per_step = 1


class _ModelConfig(_Standin):
    """The ``ModelConfig`` field ``prepare_inputs`` reads: ``rswa_window``, the window of
    an R-SWA model (for which it gathers the prompt lengths), None for any other."""

    rswa_window = None


# The step's LoRA count, a parameter of prepare_inputs from 0.31.0 (0.30.0 takes none).
_PREPARE_INPUTS_LORAS = compat.Api(
    "vllm.v1.worker.gpu.model_runner",
    "GPUModelRunner.prepare_inputs",
    keyword="num_active_loras",
    since="0.31.0",
)


def declines(case: Case) -> str | None:
    """Why this adapter does not run ``case``'s engine, else None: a V1-runner config."""
    if case.config.runner == "v2":
        return None
    return (
        "the V1 model runner keeps its persistent batch in gpu_input_batch.py:InputBatch and "
        "block_table.py:MultiGroupBlockTable, not the V2 objects this adapter drives"
    )


def target_width(config: EngineConfig) -> int:
    """The target's block-table width, ``cdiv(max_model_len, block_size)``."""
    return config.max_blocks_per_seq


def runner_width(config: EngineConfig) -> int:
    """The runner's block-table width (``GPUModelRunner.initialize_kv_cache``) for an
    attention spec of ``config``'s block size: ``AttentionSpec.max_num_blocks_per_req``
    (``cdiv(max_model_len, block_size)`` without decode context parallelism), aligned by
    ``get_block_table_width`` to ``KVCacheSpec.block_table_token_alignment`` (128)."""
    from vllm.v1.worker.block_table import get_block_table_width

    bs = config.block_size
    return get_block_table_width(cdiv(config.max_model_len, bs), bs, token_alignment=128)


def _new_runner(config: EngineConfig, device: torch.device, width: int) -> Any:
    """The runner's persistent objects for one engine, made as ``GPUModelRunner.__init__``
    (``RequestState``, ``InputBuffers``) and ``initialize_kv_cache`` (``BlockTables``: one
    KV-cache group of ``config.block_size`` pages) make them."""
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.states import RequestState

    runner = _runner_class()()
    runner.device = device
    runner.max_num_reqs = config.max_num_seqs
    with host_memory(device):
        runner.req_states = RequestState(
            max_num_reqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
            num_speculative_steps=config.num_spec,
            vocab_size=1,  # sizes nothing RequestState allocates
            device=device,
        )
        runner.input_buffers = InputBuffers(
            config.max_num_seqs, config.max_num_batched_tokens, device
        )
    runner.block_tables = new_block_tables(
        config.block_size,
        config.max_num_seqs,
        config.max_num_batched_tokens,
        width,
        device,
    )
    # What the methods above also reach: none here (a single GPU, no pipeline or context
    # parallelism, no sampler, pooling, encoder cache or adaptive verification).
    runner.model_state = _ModelState()
    runner.lora_state = _NoState()
    runner.model_config = _ModelConfig()
    for name in (
        "pooling_runner", "pp_handler", "encoder_cache", "prompt_logprobs_worker",
        "adaptive_verification", "sampler", "pcp_manager", "kv_block_zeroer", "fast_prefill",
    ):  # fmt: skip
        setattr(runner, name, None)
    runner.is_last_pp_rank = False  # gates the sampler's and prompt logprobs' bookkeeping
    runner.use_pp = False
    # load_model: the query of a decode, its drafts and the tokens it samples.
    runner.decode_query_len = config.num_spec + runner.model_state.num_new_sampled_tokens_per_step
    return runner


# -- one engine ---------------------------------------------------------------------------------


@dataclass
class _Step:
    """What the next step needs of the last one: its sampler's post-processing."""

    req_ids: tuple[str, ...]
    seq_lens: tuple[int, ...]
    idx_mapping: torch.Tensor
    query_start_loc: torch.Tensor


def _in_batch_order(state: Any, req_ids: list[str]) -> Any:
    """``gather_batch_req_state``'s ``BatchReqState`` in the inputs' batch order: its
    requests taken in the order of ``req_ids``, every per-request array with them (the
    rest, counts and flags of the whole batch, do not depend on the order). The runner
    orders a batch by ``sort_batch_req_ids`` (drafts and decodes first, then by query
    length); the target states the order, as the reference judges it."""
    if list(state.req_ids) == req_ids:
        return state
    at = {rid: i for i, rid in enumerate(state.req_ids)}
    order = np.fromiter(map(at.__getitem__, req_ids), dtype=np.intp, count=len(req_ids))
    fields: dict[str, Any] = {"req_ids": list(req_ids)}
    for name, value in state._asdict().items():
        if isinstance(value, np.ndarray):
            if value.shape[:1] != order.shape:  # a field not per request: unknown here
                raise TypeError(
                    f"BatchReqState.{name} of shape {value.shape} is not one entry a request: "
                    "attnfuzz's adapters/vllm/persistent_batch.py cannot put it in batch order"
                )
            fields[name] = value[order]
    return state._replace(**fields)


def _batch_desc(inputs: PersistentBatchInputs) -> Any:
    """The step's ``BatchExecutionDescriptor`` (``vllm/v1/worker/gpu/cudagraph_utils.py``)
    of the padded sizes the inputs state: ``num_tokens`` the slots (``T_slots``),
    ``num_reqs`` the rows (``R_pad``). ``prepare_inputs`` reads those two; its mode
    reaches only the fast-prefill helper and PCP's partition (both off), and is FULL for
    padded rows, PIECEWISE for padded tokens alone, else NONE."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    R, T = inputs.num_reqs, inputs.num_tokens
    R_pad, T_slots = inputs.num_reqs_padded, inputs.num_slot_tokens
    if R_pad > R:
        mode = CUDAGraphMode.FULL
    elif T_slots > T:
        mode = CUDAGraphMode.PIECEWISE
    else:
        mode = CUDAGraphMode.NONE
    return BatchExecutionDescriptor(cg_mode=mode, num_tokens=T_slots, num_reqs=R_pad)


def _scheduler_output(inputs: PersistentBatchInputs, held: set[str]) -> Any:
    """The step's ``SchedulerOutput`` for the V2 runner: new requests (with all the pages
    they hold) in ``scheduled_new_reqs``, running ones in ``scheduled_cached_reqs`` (the
    pages they gained, None for none, as ``Scheduler._make_cached_request_data`` sends
    them), and the requests the engine holds that the step has not as finished."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    max_len = inputs.config.max_model_len
    new, cached = [], CachedRequestData.make_empty()
    scheduled: dict[str, int] = {}
    steps = zip(
        inputs.req_ids, inputs.is_new, inputs.num_computed_tokens, inputs.query_lens,
        inputs.new_block_ids, strict=True,
    )  # fmt: skip
    for rid, is_new, computed, q, pages in steps:
        req_id = str(rid)
        scheduled[req_id] = q
        if is_new:
            # The tokens known to it: at least those up to the end of the step's query
            # (a resumed request's outputs count as prompt, prefill_token_ids).
            known = min(max(computed + q, 1), max_len)
            new.append(
                NewRequestData(
                    req_id=req_id,
                    prompt_token_ids=[0] * known,
                    mm_features=[],
                    sampling_params=None,
                    pooling_params=None,
                    block_ids=(list(pages),),
                    num_computed_tokens=computed,
                    lora_request=None,
                    prefill_token_ids=[0] * known,
                )
            )
        else:
            cached.req_ids.append(req_id)
            cached.new_block_ids.append((list(pages),) if pages else None)
            cached.num_computed_tokens.append(computed)
            cached.num_output_tokens.append(0)
    return SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        finished_req_ids=held - set(scheduled),
        free_encoder_mm_hashes=[],
        preempted_req_ids=set(),
    )


class PersistentBatchEngine:
    """One vLLM engine's persistent request state: call it with each step in turn."""

    def __init__(self, width: Callable[[EngineConfig], int] = runner_width) -> None:
        self.width = width  # the block table's columns, of the engine config
        self.new_engine()

    def new_engine(self) -> None:
        """A new engine instance: drop the runner's objects and the last step."""
        self.engine: tuple[EngineConfig, torch.device] | None = None
        self.runner: Any = None
        self.last: _Step | None = None

    def _start(self, inputs: PersistentBatchInputs) -> Any:
        """The runner's objects, made on an engine's first step (another config or
        device is another engine)."""
        if self.engine != (inputs.config, inputs.device):
            self.new_engine()
            self.engine = (inputs.config, inputs.device)
            width = self.width(inputs.config)
            self.runner = _new_runner(inputs.config, inputs.device, width)
        return self.runner

    def _sample_last_step(self, inputs: PersistentBatchInputs) -> None:
        """``GPUModelRunner.sample_tokens`` of the last step, ``postprocess_sampled``: each
        request's rejected drafts, as the scheduler has since counted them (its length
        then, less its computed tokens now); none for one that has left."""
        last, runner = self.last, self.runner
        if last is None:
            return
        now = {
            str(rid): computed
            for rid, is_new, computed in zip(
                inputs.req_ids, inputs.is_new, inputs.num_computed_tokens, strict=True
            )
            if not is_new
        }
        rejected = [s - now.get(rid, s) for rid, s in zip(last.req_ids, last.seq_lens, strict=True)]
        n = len(last.req_ids)
        dev = last.idx_mapping.device
        runner.postprocess_sampled(
            last.idx_mapping,
            torch.zeros(
                n, runner.req_states.num_speculative_steps + 1, dtype=torch.int64, device=dev
            ),  # sampled_tokens
            torch.zeros(n, dtype=torch.int32, device=dev),  # num_sampled
            torch.tensor(rejected, dtype=torch.int32, device=dev),  # num_rejected
            last.query_start_loc,
        )

    def __call__(self, inputs: PersistentBatchInputs) -> PersistentBatchOutputs:
        runner = self._start(inputs)
        tables, buffers = runner.block_tables, runner.input_buffers
        req_ids = [str(rid) for rid in inputs.req_ids]
        with host_memory(inputs.device):
            self._sample_last_step(inputs)
            # execute_model: the request states, then the staged block-table writes.
            out = _scheduler_output(inputs, set(runner.req_states.req_id_to_index))
            runner.finish_requests(out)
            runner.add_requests(out)
            runner.update_requests(out)
            tables.apply_staged_writes()
            # execute_model: the batch's request state, in the inputs' batch order; the
            # padded sizes the inputs state; then the inputs and attention's tables.
            batch_req_state, _ = runner.gather_batch_req_state(out, dummy_run=False)
            batch_req_state = _in_batch_order(batch_req_state, req_ids)
            loras = {"num_active_loras": 0} if compat.has(_PREPARE_INPUTS_LORAS) else {}
            batch = runner.prepare_inputs(out, batch_req_state, _batch_desc(inputs), **loras)
            block_tables, slot_mappings = runner.prepare_attn(batch)

        self.last = _Step(
            tuple(req_ids),
            tuple(
                c + q for c, q in zip(inputs.num_computed_tokens, inputs.query_lens, strict=True)
            ),
            batch.idx_mapping,
            batch.query_start_loc,
        )
        return PersistentBatchOutputs(
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_table=block_tables[0],
            slot_mapping=slot_mappings[0],
            buffers={
                "query_start_loc": buffers.query_start_loc,
                "seq_lens": buffers.seq_lens,
                "block_table": tables.input_block_tables[0],
                "slot_mapping": tables.slot_mappings[0],
            },
        )


ENGINE = PersistentBatchEngine()
"""The engine of the implementation ``vllm`` of ``persistent-batch``."""


def run(inputs: PersistentBatchInputs) -> PersistentBatchOutputs:
    """The implementation ``vllm`` of ``persistent-batch``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` (what the harness calls through the engine
    plugin's ``EngineCall``) drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
