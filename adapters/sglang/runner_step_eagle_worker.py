"""SGLang's EAGLE v2 worker's own step (draft, verify, draft extend), as the
implementation ``sglang-eagle-worker`` of ``runner-step``, and its mutants
``sglang-eagle-worker-stale-draft-slots`` (the draft graph's padding rows keep an
earlier replay's slots) and ``sglang-eagle-worker-advanced-draft-extend`` (the step
hands the draft extend the next round's ``seq_lens``).

``sglang-eagle-draft`` and ``sglang-eagle-draft-extend`` drive the draft's graph
runners with the worker stood in; here the worker itself runs:
``eagle_worker_v2.py:EAGLEWorkerV2.forward_batch_generation`` is handed the
scheduler's ``ScheduleBatch`` of the step and decides the order and inputs of its
sub-steps. A decode batch (``seq_lens`` the committed prefixes, spec v2's convention;
``spec_info`` the previous round's ``EagleDraftInput``): the draft, ``verify`` (the
target verify), then the draft extend with the verify input's KV location plan. An
extend batch (``prefix_lens``, ``extend_lens``, ``out_cache_loc`` of the step's
tokens, no ``spec_info``): ``_forward_prefill_batch``, the target worker's extend
(``capture_hidden_mode`` FULL), then ``_draft_extend_for_prefill`` with its hidden
states and next tokens. The batch's fields are those
``managers/schedule_batch.py:ScheduleBatch.prepare_for_extend`` and (spec v2)
``prepare_for_decode`` leave for the worker. ``EAGLEWorkerV2`` is set up as its
``__init__`` sets it (no adaptive controller, no data-parallel spec prefill
coordination, this rank hosting the draft, ``resolve_draft_parallel_layout``'s layout
of one TP group), with the pools ``alloc_memory_pool`` hands it.

What runs, unchanged (SGLang 0.5.23):

- ``speculative/eagle_worker_v2.py``: ``EAGLEWorkerV2.forward_batch_generation``,
  ``_forward_prefill_batch`` and ``verify``;
- ``speculative/eagle_worker_v2.py``: ``EagleDraftWorker.draft`` (the draft's
  batch by ``eagle_worker_common.py:prepare_for_draft``, the graph's ``execute`` or
  the multi-step backend's eager ``init_forward_metadata``, the verify input by
  ``build_eagle_verify_input``), ``draft_forward`` (``per_step_draft_out_cache_loc``,
  ``spec_utils.py:select_top_k_tokens``, each draft step's forward with its slots
  and positions), ``_draft_extend_for_decode`` (``prepare_for_draft_extend``, the
  draft-extend graph's ``execute`` or the eager backend, the selected rows' top-1)
  and ``_draft_extend_for_prefill``; ``_rebuild_topk1_chain_buffers``;
- ``speculative/eagle_worker_common.py``: ``run_eagle_verify``
  (``eagle_utils.py:eagle_prepare_for_verify``, with the target decode graph
  runner's ``load_batch`` where it serves the verify, then the target forward's
  ``execute`` as ``ModelRunner._forward_raw`` calls it, whose ``load_batch`` finds
  the metadata planned; ``eagle_sample``'s greedy verification; the accepted
  lengths, bonus tokens and next draft input);
- the graph runners ``DecodeCudaGraphRunner`` (the target verify),
  ``EAGLEDraftCudaGraphRunner`` and ``EAGLEDraftExtendCudaGraphRunner``, and the
  Triton backends, as :mod:`~attnfuzz.adapters.sglang.runner_step`,
  :mod:`~attnfuzz.adapters.sglang.runner_step_draft` and
  :mod:`~attnfuzz.adapters.sglang.runner_step_draft_extend` build them, here built
  with the worker; a draft graph's replay runs the function it captured
  (``run_once``: the worker's ``draft_forward`` over the runner's buffers);
- ``managers/schedule_batch.py``: ``ScheduleBatch`` (the fields the worker reads)
  and ``ForwardBatch.init_new`` of every sub-step.

SGLang's vendor kernels without a path here are taken by the Triton fallbacks
SGLang itself ships: ``spec_tree.py``'s ``sgl_build_tree_kernel_triton`` and
``verify_tree_greedy_triton`` and ``cache_locs.py``'s Triton
``assign_extend_cache_locs_uniform`` (the XPU path: the module's ``_is_xpu`` is
set for the step).

Stand-ins: the models (the target's forward returns logits whose argmax accepts
the drafts chosen below; the draft model's returns logits and hidden states of
their shapes, and records what each draft step's attention reads), the graphs
(:class:`runner_step._Graph`'s; a draft graph's replay re-runs what it captured),
the tensor-parallel group and the plan stream (none). The draft and draft-extend
model runners hold their own ``ReqToTokenPool``, written row for row as the
target's (SGLang shares one).

The verify accepts, of request ``i``'s ``next_n - 1`` drafts, all but the step's
``num_rejected[i]`` (all where the step names none): the trace's scheduler decided
them, and the next step's computed tokens roll back by as many. The target model
stand-in's logits are chosen so that ``eagle_sample``'s greedy verification accepts
exactly those.

Builds (each of a sub-step, ``StepBuild.draft``): ``None`` the target verify (or
the target's extend), ``0`` the draft (each draft step's metadata, the slots and
positions each draft step's forward is handed: ``out_cache_loc.step<s>``,
``positions.step<s>``, and ``kv_len`` and ``kv_slots``, the keys the last attending
draft step reads, against which padding writes no real KV judges the draft's slots),
``1`` the draft extend (for decode, or for prefill). ``eager``:
the worker without graph runners (``--disable-cuda-graph``); ``padded`` and
``replay``: with them, where a graph runs the sub-step; ``fresh``: the eager
worker on a new engine holding only the step's requests; ``capture``: each
runner's capture.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_draft as draft_mod
from attnfuzz.adapters.sglang import runner_step_draft_extend as extend_mod
from attnfuzz.adapters.standins import function_tree
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)
from attnfuzz.reference.trace import Trace, as_trace

VOCAB = 2
"""The stand-in models' vocabulary: two tokens, enough for a verify to reject."""

DRAFT, EXTEND = 0, 1
"""The sub-steps of ``StepBuild.draft``: the draft, the draft extend."""


def prepare() -> None:
    """Import SGLang's worker, runners and backends before a judge forks its child."""
    draft_mod.prepare()
    extend_mod.prepare()
    from sglang.srt.speculative import eagle_worker_v2  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no EAGLE v2 worker's draft loop for ``case``'s config, else None."""
    return draft_mod.declines(case)


def accepted_drafts(inputs: RunnerStepInputs) -> list[int]:
    """The drafts each request's verify accepts: its ``next_n - 1`` drafts less those the
    step rejects (``num_rejected``; empty: none)."""
    drafts = inputs.config.next_n - 1
    rejected = inputs.num_rejected or (0,) * inputs.num_reqs
    return [drafts - n for n in rejected]


# -- the graph stand-ins ---------------------------------------------------------------------


class _ReplayingDraftGraph(draft_mod._DraftGraph):
    """The draft graph: a capture records each draft step's metadata and the function
    it captured; a replay re-runs that function over the runner's buffers."""

    def capture_one(self, shape_key: Any, forward_fn: Any = None, *args: Any, **kw: Any) -> None:
        super().capture_one(shape_key, forward_fn, *args, **kw)
        self.captured = getattr(self, "captured", {})
        self.captured[shape_key] = forward_fn

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        return self.captured[shape_key]()


# -- the models -------------------------------------------------------------------------------


class _DraftModel:
    """The draft model runner's forward: logits and hidden states of their shapes; each
    draft step's call records what its attention reads (the forward context's
    backend's metadata) and its inputs (slots, positions), copied now."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.calls: list[dict[str, Any]] = []
        self.batches: list[Any] = []

    def forward(self, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        fb = forward_batch
        if not fb.forward_mode.is_decode():  # an extend, a draft extend
            # ModelRunner.forward_extend: the plan, where none was made before.
            if not fb.forward_metadata_ready:
                self.runner.attn_backend.init_forward_metadata(fb)
            self.batches.append(fb)
            rows = int(fb.input_ids.shape[0])
        else:
            rows = fb.batch_size
            self.calls.append(
                dict(
                    out_cache_loc=decode.host(fb.out_cache_loc), positions=decode.host(fb.positions)
                )
            )
        if fb.capture_hidden_mode == CaptureHiddenMode.LAST:
            rows = fb.batch_size  # the last token's logits and hidden state a request
        return decode._engine.StandIn(
            logits_output=LogitsProcessorOutput(
                next_token_logits=torch.zeros((rows, VOCAB)),
                hidden_states=torch.zeros((rows, self.runner.model_config.hidden_size)),
            ),
            can_run_graph=False,
        )


class _TargetWorker:
    """The target ``TpModelWorker`` the verify reads: its model runner (the target
    engine's), and a forward whose logits accept ``accepted_drafts`` of each
    request's drafts; it records the verify's attention metadata as the model's
    attention would read it (built now where no graph's ``load_batch`` built it)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model_runner = engine.runner
        self.accepted: list[int] = []
        self.forward_batch: Any = None

    def forward_batch_generation(
        self, batch: Any = None, forward_batch: Any = None, **kwargs: Any
    ) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        if forward_batch is None:  # the prefill: TpModelWorker's batch of the scheduler's
            forward_batch = ForwardBatch.init_new(
                batch,
                self.model_runner,
                capture_hidden_mode=kwargs.get("capture_hidden_mode"),
                return_hidden_states_before_norm=False,
            )
        self.forward_batch = forward_batch
        if batch is None and self._replayed(forward_batch):
            pass  # the verify ran in the decode graph: its buffers hold what it read
        elif not forward_batch.forward_metadata_ready:  # ModelRunner.forward_extend's plan
            self.engine.backend.init_forward_metadata(forward_batch)
        if batch is not None:
            return self._prefilled(forward_batch)
        spec = forward_batch.spec_info
        N = spec.draft_token_num
        drafts = spec.draft_token.reshape(-1, N)
        # Row j of a request predicts the token after its j-th: the next draft where
        # accepted, another token at the first rejected one.
        predict = torch.zeros_like(drafts)
        for r, a in enumerate(self.accepted):
            predict[r, :a] = drafts[r, 1 : a + 1]
            predict[r, a:] = (drafts[r, a + 1] + 1) % VOCAB if a + 1 < N else 0
        logits = torch.nn.functional.one_hot(predict.reshape(-1), VOCAB).float()
        hidden = torch.zeros((logits.shape[0], self.model_runner.model_config.hidden_size))
        return decode._engine.StandIn(
            logits_output=LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden),
            routed_experts_output=None,
            indexer_topk_output=None,
            can_run_cuda_graph=False,
        )

    def _replayed(self, fb: Any) -> bool:
        """``ModelRunner._forward_raw`` of a verify: the decode graph runner's ``execute``
        where it can run the batch (``can_run_graph``; a CUDA engine's mode check,
        ``is_cuda_graph``), whose ``load_batch`` finds the metadata that
        ``eagle_prepare_for_verify`` planned and copies the replay's inputs; the graph
        stand-in's replay, whose output the logits below stand for."""
        runner = self.model_runner.decode_cuda_graph_runner
        if runner is None or not fb.forward_mode.is_cuda_graph() or not runner.can_run_graph(fb):
            return False
        runner.execute(fb)
        return True

    def _prefilled(self, fb: Any) -> Any:
        """The target's extend: every token's hidden state, each request's next token,
        no KV location plan (``_draft_extend_for_prefill`` then computes its own)."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        tokens, hidden = int(fb.input_ids.shape[0]), self.model_runner.model_config.hidden_size
        return decode._engine.StandIn(
            logits_output=LogitsProcessorOutput(
                next_token_logits=torch.zeros((fb.batch_size, VOCAB)),
                hidden_states=torch.zeros((tokens, hidden)),
                mm_input_embeds=None,
            ),
            next_token_ids=torch.zeros(fb.batch_size, dtype=torch.int64),
            kv_loc_plan=None,
            can_run_cuda_graph=False,
        )


# -- one engine -------------------------------------------------------------------------------


@contextlib.contextmanager
def _triton_fallbacks() -> Iterator[None]:
    """SGLang's Triton paths of its speculative kernels (those it takes on XPU): the
    tree build and greedy verify (``spec_tree.py``) and the verify's write slots
    (``cache_locs.py:assign_extend_cache_locs_uniform_func``); no CUDA op runs here."""
    from sglang.kernels.ops.speculative import cache_locs, spec_tree

    with (
        mock.patch.object(spec_tree, "_is_xpu", True),
        mock.patch.object(cache_locs, "_is_xpu", True),
    ):
        yield


class _WorkerEngine:
    """One EAGLE engine: the target (``runner_step._Engine``, its decode graph runner
    serving the verify), the draft model runner with its multi-step draft backend and
    draft-extend backend, and SGLang's ``EagleDraftWorker`` over them with its two graph
    runners, built with the engine."""

    DRAFT_WIDTH = 1
    """The previous round's draft input's tokens a request (``topk_index``'s width)."""

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        from sglang.srt.configs.draft_parallel import DraftParallelLayout
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
        from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
        from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.config, self.device = config, device
        self.num_steps = config.num_spec
        self.captures: list[StepBuild] = []
        self.target = decode._Engine(config, device, graphs)
        self.captures += self.target.captures
        self.target.captures = []
        self.draft = draft_mod._DraftEngine(config, device, graphs=False)
        runner = self.draft.runner
        self.model = _DraftModel(runner)
        runner.forward = self.model.forward
        for model_config in (runner.model_config, self.target.runner.model_config):
            model_config.requires_mm_token_modalities = False  # a text model
            model_config.model_is_mrope = False
        for r in (runner, self.target.runner):
            r.prefill_attention_backend_str = "triton"
            r.watermark_state = None  # no watermarking
        runner.model_config.hf_config.architectures = ["LlamaForCausalLMEagle"]
        with decode._server_args(config):
            # DraftBackendFactory._create_triton_prefill_backend: the draft extend's.
            self.extend_backend = TritonAttnBackend(runner, skip_prefill=False)
        runner.attn_backend = self.extend_backend
        self.draft.engine.backend = self.extend_backend
        self.target.runner.decode_cuda_graph_runner = self.target.graph_runner
        self.target_worker = _TargetWorker(self.target)
        w = EagleDraftWorker.__new__(EagleDraftWorker)
        w.server_args = None
        w.topk, w.device = draft_mod.EAGLE_TOPK, str(device)
        w.speculative_num_steps = self.num_steps
        w.speculative_num_draft_tokens = config.next_n
        w.speculative_algorithm = SpeculativeAlgorithm.EAGLE
        w.target_worker = self.target_worker
        w.draft_runner = w.model_runner = runner
        w.req_to_token_pool = runner.req_to_token_pool
        w.token_to_kv_pool_allocator = _engine_allocator(config)
        w.draft_attn_backend = self.draft.draft_backend
        w.draft_extend_attn_backend = self.extend_backend
        w.hot_token_id = None
        w.tree_mask_mode = default_tree_mask_mode()
        w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
        w.seed_dsa_topk_from_draft_extend = False
        w.index_share_for_mtp_iteration = False
        w.dsa_seed_topk_width = None
        w.dsa_extend_topk_buf = None
        w.cuda_graph_runner = w.cuda_graph_runner_for_draft_extend = None
        # resolve_draft_parallel_layout's layout of one TP group without attention DP.
        w.parallel_layout = DraftParallelLayout(tp_group=None, attn_tp_size=1)
        self.worker = w
        self.spec_worker = self._spec_worker(config)
        with decode._server_args(config):
            w._rebuild_topk1_chain_buffers()
            if graphs:
                w.cuda_graph_runner = self._draft_graph_runner()
                w.cuda_graph_runner_for_draft_extend = self._extend_graph_runner()
        self.draft.graph_runner = w.cuda_graph_runner
        self.graph_runners = (
            self.target.graph_runner,
            w.cuda_graph_runner,
            w.cuda_graph_runner_for_draft_extend,
        )

    def _spec_worker(self, config: EngineConfig) -> Any:
        """SGLang's ``EAGLEWorkerV2`` over the target and draft workers, as its
        ``__init__`` sets it up (top-k, steps, draft tokens, the plan stream: none; no
        adaptive controller, no data-parallel prefill coordination; this rank hosts the
        draft), with the pools ``alloc_memory_pool`` hands it: the target's."""
        from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        w = self.worker
        spec = EAGLEWorkerV2.__new__(EAGLEWorkerV2)
        BaseSpecWorker.__init__(spec)
        spec.server_args = None
        spec.topk, spec.device = w.topk, w.device
        spec.speculative_num_steps = w.speculative_num_steps
        spec.speculative_num_draft_tokens = w.speculative_num_draft_tokens
        spec.speculative_algorithm = w.speculative_algorithm
        spec.page_size = config.block_size
        spec.enable_dp_spec_prefill_coordination = False
        spec._target_worker, spec._hosts_draft, spec._draft_worker = self.target_worker, True, w
        spec.adaptive_controller = None
        spec.plan_stream, spec.plan_stream_ctx = None, contextlib.nullcontext()
        spec.req_to_token_pool = self.target.runner.req_to_token_pool
        spec.token_to_kv_pool_allocator = w.token_to_kv_pool_allocator
        return spec

    def _draft_graph_runner(self) -> Any:
        from sglang.srt.speculative import eagle_draft_cuda_graph_runner as module

        engine = self

        class _Recording(_ReplayingDraftGraph):
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                build = engine.draft._graph_build(
                    "capture", self.runner, shape_key.size, 0, 0, self.graphs[shape_key]
                )
                engine.captures.append(dataclasses.replace(build, draft=DRAFT))

        with decode._no_cuda_graphs(_Recording, module), contextlib.redirect_stderr(io.StringIO()):
            return module.EAGLEDraftCudaGraphRunner(self.worker)

    def _extend_graph_runner(self) -> Any:
        from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as module

        engine = self

        class _Recording(extend_mod._ExtendGraph):
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                build = engine.draft.engine._graph_build(
                    "capture", self.runner, shape_key.size, 0, 0, self.graphs[shape_key]
                )
                engine.captures.append(_named(build, EXTEND))

        with decode._no_cuda_graphs(_Recording, module), contextlib.redirect_stderr(io.StringIO()):
            return module.EAGLEDraftExtendCudaGraphRunner(self.worker)

    def graph_read(self) -> list[Any]:
        """The backends whose persistent buffers the graph runners read."""
        draft = self.draft.draft_backend
        return [self.target.backend, self.extend_backend, draft, *draft.attn_backends]

    # -- the scheduler output -----------------------------------------------------------------

    def admit(self, inputs: RunnerStepInputs) -> None:
        """The step's requests on the target's rows, and on the draft's, alike."""
        for engine in (self.target, self.draft.engine):
            engine.admit(inputs)
            engine.write_rows(inputs)

    @contextlib.contextmanager
    def graphs_off(self) -> Iterator[None]:
        """The worker and the target without graph runners (``--disable-cuda-graph``)."""
        w, t = self.worker, self.target
        saved = t.graph_runner, w.cuda_graph_runner, w.cuda_graph_runner_for_draft_extend
        t.runner.decode_cuda_graph_runner = None
        w.cuda_graph_runner = w.cuda_graph_runner_for_draft_extend = None
        try:
            yield
        finally:
            t.runner.decode_cuda_graph_runner = saved[0]
            w.cuda_graph_runner, w.cuda_graph_runner_for_draft_extend = saved[1:]

    def schedule_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        """The scheduler's batch of the step, as the worker reads it: a decode batch of
        the committed prefixes (spec v2: ``seq_lens`` before the step's tokens) with the
        previous round's draft input, or an extend batch."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        dev, R = self.device, inputs.num_reqs
        requests = self.target.requests
        rows = torch.tensor([requests[i].row for i in inputs.req_ids], dtype=torch.int64)
        computed = list(inputs.num_computed_tokens)
        q = list(inputs.query_lens)
        hidden = self.draft.runner.model_config.hidden_size
        reqs = [
            decode._engine.StandIn(
                rid=str(i),
                token_type_ids=None,
                lora_id=None,
                grammar=None,
                bootstrap_room=None,
                extend_end=c + n,
                full_untruncated_fill_ids=range(c + n),
            )
            for i, c, n in zip(inputs.req_ids, computed, q, strict=True)
        ]
        b = ScheduleBatch(reqs=reqs)
        b.req_to_token_pool = self.target.runner.req_to_token_pool
        b.token_to_kv_pool_allocator = self.worker.token_to_kv_pool_allocator
        b.model_config = decode._engine.StandIn(vocab_size=VOCAB)
        b.spec_algorithm = SpeculativeAlgorithm.EAGLE
        b.device = str(dev)
        b.req_pool_indices = rows
        b.sampling_info = SamplingBatchInfo(
            temperatures=torch.ones((R, 1)),
            top_ps=torch.ones(R),
            top_ks=torch.ones(R, dtype=torch.int32),
            min_ps=torch.zeros(R),
            is_all_greedy=True,
            is_any_greedy=True,
            need_top_p_sampling=False,
            need_top_k_sampling=False,
            need_min_p_sampling=False,
            vocab_size=VOCAB,
        )
        if mode == "verify":
            seq = torch.tensor(computed, dtype=torch.int64)
            b.forward_mode = ForwardMode.DECODE
            b.spec_info = EagleDraftInput(
                topk_p=torch.ones((R, self.DRAFT_WIDTH)),
                topk_index=torch.zeros((R, self.DRAFT_WIDTH), dtype=torch.int64),
                hidden_states=torch.zeros((R, hidden)),
                bonus_tokens=torch.zeros(R, dtype=torch.int64),
                capture_hidden_mode=CaptureHiddenMode.LAST,
            )
        else:
            seq = torch.tensor([c + n for c, n in zip(computed, q, strict=True)])
            b.forward_mode = ForwardMode.EXTEND
            b.input_ids = torch.zeros(sum(q), dtype=torch.int64)
            b.prefix_lens, b.extend_lens = computed, q
            b.extend_num_tokens = sum(q)
            b.extend_logprob_start_lens = [0] * R
            b.out_cache_loc = torch.tensor(
                [
                    s
                    for i, c, n in zip(inputs.req_ids, computed, q, strict=True)
                    for s in self.target.slots(i, c, c + n)
                ],
                dtype=torch.int64,
            )
        b.seq_lens, b.seq_lens_cpu = seq, seq.clone()
        b.orig_seq_lens = seq.to(torch.int32)
        b.seq_lens_sum = int(seq.sum())
        return b


def _engine_allocator(config: EngineConfig) -> Any:
    """The KV allocator the worker reads: its page size and a KV cache with no
    ``clear_unaccepted_c128_draft_states`` (an MHA cache's)."""
    return decode._engine.StandIn(page_size=config.block_size, get_kvcache=lambda: object())


def _named(build: StepBuild, sub: int | None, width: int = 0) -> StepBuild:
    """``build`` as sub-step ``sub``'s; a draft's with the keys its draft steps read
    (:func:`_draft_kv_read`, rows ``width`` wide: the request-to-token table's)."""
    where = {DRAFT: draft_mod._WHERE, EXTEND: extend_mod._WHERE}.get(sub, decode._WHERE)
    if sub == DRAFT and width:
        build = dataclasses.replace(build, fields=build.fields + _draft_kv_read(build, width))
    return dataclasses.replace(build, where=where.get(build.how, build.where), draft=sub)


def _draft_kv_read(build: StepBuild, width: int) -> tuple[Field, ...]:
    """``kv_len`` and ``kv_slots`` of a draft build: the keys its last draft step's
    forward reads (``kv_indices.s`` between ``kv_indptr.s``), the committed prefix and
    the request's drafts so far, of which every earlier step's reads are a prefix.
    Derived from the build's own fields, as ``runner_step``'s are: so that padding
    writes no real KV judges the draft's slots (``out_cache_loc``) against them."""
    last = max((int(f.name.rsplit(".", 1)[1]) for f in build.fields
                if f.name.startswith("kv_indptr.")), default=None)  # fmt: skip
    if last is None:  # one draft step: no forward reads the KV
        return ()
    indptr = build.field(f"kv_indptr.{last}")
    indices = build.field(f"kv_indices.{last}")
    assert indptr is not None and indices is not None
    lengths = np.diff(indptr.values).clip(min=0)
    table = np.zeros((len(lengths), width), dtype=np.int64)
    cols = min(width, indices.values.shape[1])
    table[:, :cols] = indices.values[:, :cols]
    return (
        Field("kv_len", "requests", lengths),
        Field("kv_slots", "requests", table, row_lengths=lengths),
    )


# -- the worker's step ------------------------------------------------------------------------


def _draft_step_fields(calls: list[dict[str, Any]], rows: int, acc: dict) -> list[Field]:
    """What each draft step's forward is handed (``draft_forward``: the step's column of
    ``per_step_draft_out_cache_loc``, the positions it advances), by request."""
    out = []
    for s, call in enumerate(calls):
        out.append(
            Field(
                f"out_cache_loc.step{s}",
                "requests",
                call["out_cache_loc"][:rows],
                acc["out_cache_loc"],
                writes_kv=True,
            )
        )
        out.append(
            Field(f"positions.step{s}", "requests", call["positions"][:rows], acc["positions"])
        )
    return out


def _batch_inputs(fb: Any, how: str) -> dict[str, torch.Tensor]:
    inputs_of = {
        "seq_lens": fb.seq_lens,
        "out_cache_loc": fb.out_cache_loc,
        "positions": fb.positions,
    }
    if how != "fresh":  # a new engine's rows are its own: history picks them
        inputs_of["req_pool_indices"] = fb.req_pool_indices
    return inputs_of


def verify_round(
    engine: _WorkerEngine, inputs: RunnerStepInputs, how: str, graphs: bool
) -> list[StepBuild]:
    """``EAGLEWorkerV2.forward_batch_generation`` of the scheduler's decode batch: the
    worker's own step, which drafts (``draft``), verifies (``verify``:
    ``run_eagle_verify``) and extends the draft (``_draft_extend_for_decode``, with the
    verify input's KV location plan); its builds, each recorded as its sub-step returns
    (``how``: the eager pass's name; ``graphs``: where a graph runs a sub-step, its
    padded and replay)."""
    w, spec = engine.worker, engine.spec_worker
    builds: list[StepBuild] = []
    batch = engine.schedule_batch(inputs, "verify")
    own_draft, own_verify, own_extend = w.draft, spec.verify, w._draft_extend_for_decode

    def drafted(batch: Any, **kwargs: Any) -> Any:
        verify_input, drafts = _draft(
            engine, inputs, how, graphs, lambda: own_draft(batch, **kwargs)
        )
        builds.extend(drafts)
        return verify_input

    def verified(batch: Any, **kwargs: Any) -> Any:
        engine.target_worker.accepted = accepted_drafts(inputs)
        result = own_verify(batch, **kwargs)
        builds.extend(_verify_builds(engine, inputs, result, how))
        return result

    def extended(batch: Any, result: Any, **kwargs: Any) -> None:
        engine.model.calls, engine.model.batches = [], []
        own_extend(batch, result, **kwargs)
        builds.extend(_extend_builds(engine, inputs, how))

    w.draft, spec.verify, w._draft_extend_for_decode = drafted, verified, extended
    try:
        spec.forward_batch_generation(batch)
    finally:
        del w.draft, spec.verify, w._draft_extend_for_decode
    return builds


def _draft(
    engine: _WorkerEngine, inputs: RunnerStepInputs, how: str, graphs: bool, draft: Any
) -> tuple[Any, list[StepBuild]]:
    """The worker's ``draft`` (``draft()``) and its builds: the multi-step backend's
    metadata of each draft step as built (eager), or the draft graph's padded and
    replay; with what each draft step's forward is handed."""
    w, R, T = engine.worker, inputs.num_reqs, inputs.num_tokens
    builds: list[StepBuild] = []
    steps: list[Any] = []
    seen: dict[str, Any] = {}
    backends = engine.draft.draft_backend.attn_backends
    outer = engine.draft.draft_backend.init_forward_metadata

    def planned(fb: Any) -> None:
        seen["fb"] = {k: v.clone() for k, v in _batch_inputs(fb, how).items()}
        outer(fb)

    for backend in backends:
        own = backend.init_forward_metadata

        def recorded(fb: Any, own: Any = own, backend: Any = backend) -> None:
            own(fb)
            m = backend.forward_metadata
            steps.append(
                decode._engine.StandIn(
                    kv_indptr=m.kv_indptr.clone(), kv_indices=m.kv_indices.clone()
                )
            )

        backend.init_forward_metadata = recorded
    engine.draft.draft_backend.init_forward_metadata = planned
    engine.model.calls = []
    try:
        verify_input = draft()
    finally:
        for backend in backends:
            del backend.init_forward_metadata
        del engine.draft.draft_backend.init_forward_metadata
    acc = engine.draft.accepts()
    width = engine.draft.runner.req_to_token_pool.req_to_token.shape[1]
    if "fb" in seen:  # the eager draft
        fields = engine.draft._fields(R, seen["fb"], steps)
        fields += tuple(_draft_step_fields(engine.model.calls, R, acc))
        builds.append(_named(StepBuild(how, R, T, fields), DRAFT, width))
    elif graphs and w.cuda_graph_runner is not None:
        g = w.cuda_graph_runner
        bs, backend = g.bs, engine.draft.draft_backend
        persistent = [
            decode._engine.StandIn(
                kv_indptr=backend.kv_indptr[s], kv_indices=backend.cuda_graph_kv_indices[s]
            )
            for s in range(len(backend.attn_backends))
        ]
        baked = g.backend.graphs[g._make_graph_key(bs)]
        replay = engine.draft._graph_build("replay", g, bs, R, T, baked)
        replay = dataclasses.replace(
            replay, fields=replay.fields + tuple(_draft_step_fields(engine.model.calls, bs, acc))
        )
        builds += [
            _named(engine.draft._graph_build("padded", g, bs, R, T, persistent), DRAFT, width),
            _named(replay, DRAFT, width),
        ]
    return verify_input, builds


def _extend_builds(engine: _WorkerEngine, inputs: RunnerStepInputs, how: str) -> list[StepBuild]:
    """The draft extend's builds: eager (the draft model's forward ran), or the
    draft-extend graph's padded and replay."""
    R, T = inputs.num_reqs, inputs.num_tokens
    g = engine.worker.cuda_graph_runner_for_draft_extend
    if engine.model.batches:  # eager: the draft model's forward ran
        fb = engine.model.batches[-1]
        fields = engine.draft.engine._fields(
            R, T, _batch_inputs(fb, how), engine.extend_backend.forward_metadata
        )
        return [_named(StepBuild(how, R, T, fields), EXTEND)]
    if g is None:
        return []
    bs, backend = g.bs, engine.extend_backend
    persistent = decode._engine.StandIn(
        kv_indptr=backend.kv_indptr,
        kv_indices=backend.cuda_graph_kv_indices,
        qo_indptr=backend.qo_indptr,
    )
    baked = g.backend.graphs[g._make_graph_key(bs)]
    return [
        _named(engine.draft.engine._graph_build("padded", g, bs, R, T, persistent), EXTEND),
        _named(engine.draft.engine._graph_build("replay", g, bs, R, T, baked), EXTEND),
    ]


def _verify_builds(
    engine: _WorkerEngine, inputs: RunnerStepInputs, result: Any, how: str
) -> list[StepBuild]:
    """The target verify's builds: the decode graph's padded and replay where it ran
    the verify, else the eager forward's metadata."""
    R, T, target = inputs.num_reqs, inputs.num_tokens, engine.target
    g = target.runner.decode_cuda_graph_runner
    if result.can_run_cuda_graph:
        bs = g.bs
        baked = g.backend.graphs[g._replay_graph_key]
        return [
            target._graph_build("padded", g, bs, R, T, target.persistent_metadata("verify")),
            target._graph_build("replay", g, bs, R, T, baked),
        ]
    fb = engine.target_worker.forward_batch
    fields = target._fields(R, T, _batch_inputs(fb, how), target.backend.forward_metadata)
    return [StepBuild(how, R, T, fields, where=decode._WHERE[how])]


def prefill_round(engine: _WorkerEngine, inputs: RunnerStepInputs, how: str) -> list[StepBuild]:
    """``EAGLEWorkerV2.forward_batch_generation`` of the scheduler's extend batch
    (``_forward_prefill_batch``): the target worker's extend (its forward batch by
    ``ForwardBatch.init_new``, eager), then ``_draft_extend_for_prefill`` with the
    target's hidden states and next tokens."""
    R, T = inputs.num_reqs, inputs.num_tokens
    batch = engine.schedule_batch(inputs, "extend")
    engine.model.calls, engine.model.batches = [], []
    engine.spec_worker.forward_batch_generation(batch)
    target, fb = engine.target, engine.target_worker.forward_batch
    fields = target._fields(R, T, _batch_inputs(fb, how), target.backend.forward_metadata)
    builds = [StepBuild(how, R, T, fields, where=decode._WHERE[how])]
    fb = engine.model.batches[-1]
    fields = engine.draft.engine._fields(
        R, T, _batch_inputs(fb, how), engine.extend_backend.forward_metadata
    )
    builds.append(_named(StepBuild(how, R, T, fields), EXTEND))
    return builds


class WorkerLife(decode.EngineLife):
    """SGLang's EAGLE v2 worker across the steps of one engine: a verify step runs the
    worker's draft, verify and draft extend; any other step (an extend) the target's
    extend and the draft extend for prefill."""

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> _WorkerEngine:
        with decode._server_args(config):
            return _WorkerEngine(config, device, graphs)

    def core(self, engine: _WorkerEngine) -> Any:
        return engine.target

    def step(
        self, engine: _WorkerEngine, inputs: RunnerStepInputs, mode: str, how: str, graphs: bool
    ) -> list[StepBuild]:
        with decode._server_args(inputs.config), _triton_fallbacks():
            if mode == "verify":
                return verify_round(engine, inputs, how, graphs)
            return prefill_round(engine, inputs, how)

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        engine = self.engine_for(inputs, inputs.config.cudagraph_mode != "NONE")
        mode = decode.step_mode(inputs)
        builds, engine.captures = engine.captures, []
        engine.admit(inputs)
        graphs = any(g is not None for g in engine.graph_runners)
        if graphs and mode == "verify":
            with decode._as_left(*engine.graph_read()), engine.graphs_off():
                builds += self.step(engine, inputs, mode, "eager", False)
            builds += self.step(engine, inputs, mode, "eager", True)
        else:
            builds += self.step(engine, inputs, mode, "eager", False)
        fresh = self.make(engine.config, engine.device, False)
        # The fresh engine's verify accepts as many drafts as the step's.
        arrived = dataclasses.replace(
            decode.arrived_anew(engine.target.requests, inputs), num_rejected=inputs.num_rejected
        )
        fresh.admit(arrived)
        builds += self.step(fresh, arrived, mode, "fresh", False)
        return RunnerStepOutputs(tuple(builds))


ENGINE = WorkerLife()
"""The engine of the implementation ``sglang-eagle-worker`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-eagle-worker`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the draft graph's padding rows keep an earlier replay's slots ---------------------

_ZERO_SLOTS = "buffers.out_cache_loc.zero_()"
"""The statement of ``EAGLEDraftCudaGraphRunner.execute`` that resets a padded replay's
draft slots to SGLang's padding slot 0."""


class _DropStatement(ast.NodeTransformer):
    def __init__(self, source: str) -> None:
        self.source, self.dropped = source, 0

    def visit_Expr(self, node: ast.Expr) -> ast.Expr | None:
        if ast.unparse(node) == self.source:
            self.dropped += 1
            return None
        return node


def _without(fn: Any, statement: str) -> Any:
    """``fn`` recompiled from SGLang's own source without ``statement`` (every other
    line unchanged, at SGLang's file and line numbers)."""
    definition = function_tree(fn)
    definition.decorator_list = []
    dropper = _DropStatement(statement)
    dropper.visit(definition)
    assert dropper.dropped == 1, f"{fn.__qualname__} has no single {statement}"
    module = ast.fix_missing_locations(ast.Module(body=[definition], type_ignores=[]))
    namespace: dict[str, Any] = {}
    exec(compile(module, fn.__code__.co_filename, "exec"), fn.__globals__, namespace)  # noqa: S102
    return namespace[fn.__name__]


class _StaleDraftSlotsEngine(_WorkerEngine):
    """The draft graph runner's ``execute`` without ``buffers.out_cache_loc.zero_()``: a
    padded replay copies the real requests' draft slots and leaves the padding rows'
    as the previous replay wrote them, real requests' slots in range. Each draft step's
    forward writes a padding row's draft token's KV there (no slot is skipped), over a
    key a request of the step may read: the class of SGLang #24743 and vLLM #36580."""

    def _draft_graph_runner(self) -> Any:
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import (
            EAGLEDraftCudaGraphRunner,
        )

        runner = super()._draft_graph_runner()
        execute = _without(EAGLEDraftCudaGraphRunner.execute, _ZERO_SLOTS)
        runner.execute = execute.__get__(runner)
        return runner


class _StaleDraftSlotsLife(WorkerLife):
    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> _WorkerEngine:
        with decode._server_args(config):
            return _StaleDraftSlotsEngine(config, device, graphs)


STALE_DRAFT_SLOTS = _StaleDraftSlotsLife()


def run_stale_draft_slots(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-eagle-worker-stale-draft-slots``: :class:`_StaleDraftSlotsEngine`."""
    return STALE_DRAFT_SLOTS(inputs)


run_stale_draft_slots.new_engine = STALE_DRAFT_SLOTS.new_engine  # type: ignore[attr-defined]


def draft_replays(inputs: RunnerStepInputs) -> int:
    """The batch size the draft graph replays the step's draft at, else 0: a verify
    (:func:`runner_step.step_mode`) of at most the largest graph's requests, padded to
    the smallest graph that holds them (``_pad_to_bucket``)."""
    if inputs.config.num_spec < draft_mod.MIN_DRAFT_STEPS or decode.step_mode(inputs) != "verify":
        return 0
    sizes = decode.graph_batch_sizes(inputs.config)
    return min((s for s in sizes if s >= inputs.num_reqs), default=0)


def _draft_slots(trace: Trace | Case) -> Iterator[tuple[int, int, list[list[int]], set[int]]]:
    """Each draft the draft graph replays: its batch size, its requests, each request's
    draft slots (``per_step_draft_out_cache_loc``: keys ``c .. c + num_steps - 1`` of a
    request of ``c`` committed), and the slots the step's requests read (the last
    attending draft step's: keys ``0 .. c + num_steps - 2``)."""
    trace = as_trace(trace)
    steps, pages = trace.config.num_spec, {}
    for case in trace.cases():
        inputs = decode.make_inputs(case)
        for r, new, gained in zip(inputs.req_ids, inputs.is_new, inputs.new_block_ids,
                                  strict=True):  # fmt: skip
            pages[r] = [*([] if new else pages.get(r, [])), *gained]
        bs = draft_replays(inputs)
        if not bs:
            continue
        block = inputs.config.block_size
        computed = zip(inputs.req_ids, inputs.num_computed_tokens, strict=True)
        held = [(np.asarray(pages[r], dtype=np.int64), c) for r, c in computed]
        written = [decode.page_slots(p, c + steps, block)[c:].tolist() for p, c in held]
        read = {int(s) for p, c in held for s in decode.page_slots(p, c + steps - 1, block)}
        yield bs, inputs.num_reqs, written, read


def trigger_stale_draft_slots(trace: Trace | Case) -> bool:
    """A padded draft replay whose padding rows' slots, as the earlier draft replays left
    the buffer (slot 0 before any), include one a real request of the step reads."""
    left: list[list[int]] = []  # the draft buffer's rows, as the last replay left them
    for bs, R, written, read in _draft_slots(trace):
        if R < bs and read & {s for row in left[R:bs] for s in row}:
            return True
        left = written + left[R:]
    return False


def reach_stale_draft_slots(trace: Trace | Case) -> bool:
    """A padded draft replay after an earlier one of more requests (whose slots the
    padding rows could keep)."""
    most = 0
    for bs, R, _, _ in _draft_slots(trace):
        if R < bs and most > R:
            return True
        most = max(most, R)
    return False


def smallest_stale_draft_slots() -> Trace:
    """Two requests of one token arrive and verify together (the draft graph of two),
    then request 1 verifies alone with its two drafts accepted: the graph of two again,
    its padding row keeping request 1's earlier draft slots 6 and 7, keys it reads."""
    config = EngineConfig(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=6,
                          block_size=1, num_spec=2, cudagraph_capture_sizes=(6,))  # fmt: skip
    a, b = (1, 2, 3, 4), (5, 6, 7, 8, 9, 10, 11)

    def step(computed: tuple[int, ...], q: tuple[int, ...], ids: tuple[int, ...],
             pages: tuple[tuple[int, ...], ...], new: tuple[int, ...]) -> Batch:  # fmt: skip
        return Batch(computed, q, 0, True, req_ids=ids, pages=pages, new_pages=new)

    return Trace(config, (
        step((0, 0), (1, 1), (0, 1), (a[:1], b[:1]), (1, 1)),
        step((1, 1), (3, 3), (0, 1), (a, b[:4]), (3, 3)),
        step((4,), (3,), (1,), (b,), (3,)),
    ))  # fmt: skip


# -- mutant: the draft extend reads the next round's seq_lens -------------------------------

_ADVANCE = "batch.seq_lens = batch_output.new_seq_lens"
"""The PP tail-draft's statement of ``EAGLEWorkerV2.forward_batch_generation`` that sets
up the next round's head state (the committed lengths after the verify)."""


class _AdvanceBeforeDraftExtend(ast.NodeTransformer):
    """Inserts :data:`_ADVANCE` before the ``with`` block that runs
    ``_draft_extend_for_decode``."""

    def __init__(self) -> None:
        self.inserted = 0

    def visit_With(self, node: ast.With) -> Any:
        self.generic_visit(node)
        if "_draft_extend_for_decode" not in ast.unparse(node):
            return node
        self.inserted += 1
        return [ast.parse(_ADVANCE).body[0], node]


def _advanced_first(fn: Any) -> Any:
    """``fn`` recompiled from SGLang's own source with :data:`_ADVANCE` run before the
    draft extend (every other line unchanged, at SGLang's file and line numbers)."""
    definition = function_tree(fn)
    definition.decorator_list = []
    inserter = _AdvanceBeforeDraftExtend()
    inserter.visit(definition)
    assert inserter.inserted == 1, f"{fn.__qualname__} has no single draft extend block"
    module = ast.fix_missing_locations(ast.Module(body=[definition], type_ignores=[]))
    namespace: dict[str, Any] = {}
    exec(compile(module, fn.__code__.co_filename, "exec"), fn.__globals__, namespace)  # noqa: S102
    return namespace[fn.__name__]


class _AdvancedDraftExtendEngine(_WorkerEngine):
    """The worker's step with the next round's head state set before the draft extend
    (the PP tail-draft's ``batch.seq_lens = batch_output.new_seq_lens`` hoisted above
    ``_draft_extend_for_decode``): the draft extend takes the committed lengths after
    the verify for those before it, and counts the accepted tokens twice: its window
    sits past the tokens the verify wrote."""

    def _spec_worker(self, config: EngineConfig) -> Any:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        spec = super()._spec_worker(config)
        step = _advanced_first(EAGLEWorkerV2.forward_batch_generation)
        spec.forward_batch_generation = step.__get__(spec)
        return spec


class _AdvancedDraftExtendLife(WorkerLife):
    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> _WorkerEngine:
        with decode._server_args(config):
            return _AdvancedDraftExtendEngine(config, device, graphs)


ADVANCED_DRAFT_EXTEND = _AdvancedDraftExtendLife()


def run_advanced_draft_extend(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-eagle-worker-advanced-draft-extend``:
    :class:`_AdvancedDraftExtendEngine`."""
    return ADVANCED_DRAFT_EXTEND(inputs)


run_advanced_draft_extend.new_engine = ADVANCED_DRAFT_EXTEND.new_engine  # type: ignore[attr-defined]


def trigger_advanced_draft_extend(trace: Trace | Case) -> bool:
    """A verify the draft-extend graph replays (a draft graph holds its requests): its
    window's reads, planned from ``seq_lens``, run past the verify's tokens (each
    request accepts at least its bonus token), which the eager backend's do not."""
    trace = as_trace(trace)
    return any(draft_replays(decode.make_inputs(case)) for case in trace.cases())


def smallest_advanced_draft_extend() -> Trace:
    """One request of one token arrives, then verifies its two drafts alone, in the
    graphs of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=3,
                          block_size=1, num_spec=2, cudagraph_capture_sizes=(3,))  # fmt: skip
    pages = (1, 2, 3, 4)
    return Trace(config, (
        Batch((0,), (1,), 0, True, req_ids=(0,), pages=(pages[:1],), new_pages=(1,)),
        Batch((1,), (3,), 0, True, req_ids=(0,), pages=(pages,), new_pages=(3,)),
    ))  # fmt: skip
