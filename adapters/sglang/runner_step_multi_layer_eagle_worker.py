"""SGLang's multi-layer EAGLE v2 worker's own step (draft, verify, each draft layer's
extend), as the implementation ``sglang-multi-layer-eagle-worker`` of ``runner-step``.

``sglang-multi-layer-eagle`` drives the composite draft-extend graph runner with the
worker stood in; here the worker runs: its own step,
``multi_layer_eagle_worker_v2.py:MultiLayerEagleWorkerV2.forward_batch_generation``,
is handed the scheduler's batch of the step, built as
:mod:`~attnfuzz.adapters.sglang.runner_step_eagle_worker` builds it
(``--enable-multi-layer-eagle``, top-k 1, the Triton backends, no boundary-KV
fix: a model that is not hybrid). A decode batch: ``MultiLayerEagleDraftWorker.draft``
(``prepare_for_draft``; ``draft_forward``'s chain, which reads the previous round's
draft tokens and runs no attention; ``build_eagle_verify_input``),
``_draft_extend_plan_for_decode`` (no staging on Triton), ``run_eagle_verify`` as the
worker's ``verify`` calls it, then ``_draft_extend_for_decode``: the composite
graph's ``prepare`` and each layer's ``replay`` with ``rotate_input_ids`` between
layers, or each layer's eager ``init_forward_metadata`` and forward. An extend: the
target worker's extend (``ForwardBatch.init_new`` of the batch), then
``_draft_extend_for_prefill`` (each layer's forward over the prompt,
``rotate_input_ids`` between layers).

Built as :mod:`~attnfuzz.adapters.sglang.runner_step_eagle_worker` builds the target
and its verify, and as :mod:`~attnfuzz.adapters.sglang.runner_step_multi_layer_eagle`
builds the layers' backends and the composite graph runner. The worker's
``draft_runner_list``: one model runner a layer, each the draft's runner (its rows and
pools, SGLang's layers share them) with the layer's own backend and forward.

Builds: ``None`` the target verify (or extend); sub-step ``s`` draft layer ``s``'s
extend (eager, padded and replay where the graph runs it, fresh; ``capture``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_eagle_worker as eagle
from attnfuzz.adapters.sglang import runner_step_multi_layer_eagle as ml
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, StepBuild

_WORKER = "multi_layer_eagle_worker_v2.py:MultiLayerEagleDraftWorker"


def prepare() -> None:
    """Import SGLang's multi-layer worker, runners and backends before a judge forks."""
    eagle.prepare()
    ml.prepare()
    from sglang.srt.speculative import multi_layer_eagle_worker_v2  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no multi-layer EAGLE worker for ``case``'s config, else None."""
    return ml.declines(case)


class _LayerRunner:
    """Draft layer ``step``'s model runner: the draft's runner (read through), the
    layer's own attention backend, and a forward that plans where none was planned
    (``ModelRunner.forward_extend``) and records the layer's build."""

    def __init__(self, runner: Any, backend: Any, step: int, engine: Any) -> None:
        self.__dict__.update(_runner=runner, attn_backend=backend, step=step, _engine=engine)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def forward(self, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        fb, engine = forward_batch, self._engine
        if not fb.forward_metadata_ready:
            self.attn_backend.init_forward_metadata(fb)
        # What the layer's attention reads, copied now (its own backend's metadata).
        rows, tokens = fb.batch_size, int(fb.input_ids.shape[0])
        inputs_of = eagle._batch_inputs(fb, engine.how)
        metadata = self.attn_backend.forward_metadata
        engine.layers.append(
            (self.step, engine.draft.engine._fields(rows, tokens, inputs_of, metadata))
        )
        # The pruned logits: a request's selected token.
        hidden = self._runner.model_config.hidden_size
        return decode._engine.StandIn(
            logits_output=LogitsProcessorOutput(
                next_token_logits=torch.zeros((rows, eagle.VOCAB)),
                hidden_states=torch.zeros((rows, hidden)),
            ),
            can_run_graph=False,
        )


class _MultiLayerWorkerEngine(eagle._WorkerEngine):
    """One multi-layer EAGLE engine: the target (its decode graph runner serving the
    verify), the draft layers' backends and composite draft-extend graph runner
    (``sglang-multi-layer-eagle``'s), and SGLang's ``MultiLayerEagleDraftWorker``."""

    DRAFT_WIDTH = 0  # set per engine: the previous round's num_steps draft tokens

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
        from sglang.srt.speculative.multi_layer_eagle_worker_v2 import (
            MultiLayerEagleDraftWorker,
        )
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.config, self.device = config, device
        self.num_steps = self.DRAFT_WIDTH = config.num_spec
        self.target = decode._Engine(config, device, graphs)
        self.captures = self.target.captures
        self.target.captures = []
        self.draft = ml._MultiLayerEngine(config, device, graphs)
        # Each layer's capture: its sub-step (sglang-multi-layer-eagle names the first
        # layer's the step's own).
        self.captures += [dataclasses.replace(b, draft=b.draft or 0) for b in self.draft.captures]
        self.draft.captures = []
        runner = self.draft.runner
        for model_config in (runner.model_config, self.target.runner.model_config):
            model_config.requires_mm_token_modalities = False  # a text model
            model_config.model_is_mrope = False
        for r in (runner, self.target.runner):
            r.prefill_attention_backend_str = "triton"
            r.watermark_state = None  # no watermarking
        runner.model_config.hf_config.architectures = ["DeepseekV3ForCausalLMNextN"]
        self.layers: list[tuple[int, tuple[Any, ...]]] = []  # each layer's fields
        self.how = "eager"
        self.runners = [
            _LayerRunner(runner, backend, s, self) for s, backend in enumerate(self.draft.backends)
        ]
        self.target.runner.decode_cuda_graph_runner = self.target.graph_runner
        self.target_worker = eagle._TargetWorker(self.target)
        w = MultiLayerEagleDraftWorker.__new__(MultiLayerEagleDraftWorker)
        w.server_args = None
        w.device, w.topk = str(device), 1
        w.speculative_num_steps = self.num_steps
        w.speculative_num_draft_tokens = config.next_n
        w.speculative_algorithm = SpeculativeAlgorithm.EAGLE
        w.use_rejection_sampling = False
        w.target_worker = self.target_worker
        w.model_config = decode._engine.StandIn(vocab_size=eagle.VOCAB)
        w.draft_runner_list = self.runners
        w.draft_runner = self.runners[0]
        w.req_to_token_pool = runner.req_to_token_pool
        w.token_to_kv_pool_allocator = eagle._engine_allocator(config)
        w.draft_extend_attn_backend_list = list(self.draft.backends)
        w.chain_mtp_hidden_states = False
        w.tree_mask_mode = default_tree_mask_mode()
        w.plan_stream, w.plan_stream_ctx = None, contextlib.nullcontext()
        # _init_boundary_kv_fix_state of a model that is not hybrid: no front rows.
        w.draft_extend_num_front_tokens = w.draft_extend_num_warmup_tokens = 0
        w.boundary_kv_stash_tokens = w.boundary_kv_stash_hiddens = None
        w.boundary_kv_stash_valid_lens = None
        w.cuda_graph_runner = None  # the chain draft runs no model
        w.cuda_graph_runner_for_draft_extend = self.draft.graph_runner
        w._rebuild_topk1_chain_buffers()
        self.worker = w
        self.spec_worker = self._spec_worker(config)
        self.graph_runners = (self.target.graph_runner, self.draft.graph_runner)

    def _spec_worker(self, config: EngineConfig) -> Any:
        """SGLang's ``MultiLayerEagleWorkerV2`` over the target and draft workers, as its
        ``__init__`` sets it up (the plan stream: none; ``resolve_draft_parallel_layout``'s
        layout of one TP group), with the pools ``alloc_memory_pool`` hands it."""
        from sglang.srt.configs.draft_parallel import DraftParallelLayout
        from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
        from sglang.srt.speculative.multi_layer_eagle_worker_v2 import (
            MultiLayerEagleWorkerV2,
        )

        w = self.worker
        spec = MultiLayerEagleWorkerV2.__new__(MultiLayerEagleWorkerV2)
        BaseSpecWorker.__init__(spec)
        spec.server_args = None
        spec.topk, spec.device = w.topk, w.device
        spec.speculative_num_steps = w.speculative_num_steps
        spec.speculative_num_draft_tokens = w.speculative_num_draft_tokens
        spec.speculative_algorithm = w.speculative_algorithm
        spec.page_size = config.block_size
        spec._target_worker, spec._draft_worker = self.target_worker, w
        spec.draft_parallel_layout = DraftParallelLayout(tp_group=None, attn_tp_size=1)
        spec.plan_stream, spec.plan_stream_ctx = None, contextlib.nullcontext()
        spec.req_to_token_pool = self.target.runner.req_to_token_pool
        spec.token_to_kv_pool_allocator = w.token_to_kv_pool_allocator
        return spec

    def graph_read(self) -> list[Any]:
        return [self.target.backend, *self.draft.backends]

    @contextlib.contextmanager
    def graphs_off(self) -> Iterator[None]:
        w, t = self.worker, self.target
        saved = t.graph_runner, w.cuda_graph_runner_for_draft_extend
        t.runner.decode_cuda_graph_runner = w.cuda_graph_runner_for_draft_extend = None
        try:
            yield
        finally:
            t.runner.decode_cuda_graph_runner, w.cuda_graph_runner_for_draft_extend = saved


def _layer_builds(engine: _MultiLayerWorkerEngine, R: int, T: int, how: str) -> list[StepBuild]:
    """Each draft layer's eager build, from what its forward recorded."""
    builds = []
    for step, fields in engine.layers:
        where = f"{_WORKER} (draft layer {step}'s forward)"
        builds.append(StepBuild(how, R, T, fields, where=where, draft=step))
    return builds


def verify_round(
    engine: _MultiLayerWorkerEngine, inputs: RunnerStepInputs, how: str
) -> list[StepBuild]:
    """``MultiLayerEagleWorkerV2.forward_batch_generation`` of the scheduler's decode
    batch: the worker's own step, which runs ``draft``, ``_draft_extend_plan_for_decode``,
    ``verify`` and ``_draft_extend_for_decode``; the builds of each, recorded as it
    returns."""
    w, spec, R, T = engine.worker, engine.spec_worker, inputs.num_reqs, inputs.num_tokens
    batch = engine.schedule_batch(inputs, "verify")
    engine.how = how
    builds: list[StepBuild] = []
    own_verify, own_extend = spec.verify, w._draft_extend_for_decode

    def verified(batch: Any, **kwargs: Any) -> Any:
        engine.target_worker.accepted = eagle.accepted_drafts(inputs)
        result = own_verify(batch, **kwargs)
        builds.extend(eagle._verify_builds(engine, inputs, result, how))
        return result

    def extended(batch: Any, result: Any, **kwargs: Any) -> None:
        engine.layers = []
        own_extend(batch, result, **kwargs)
        builds.extend(_extend_builds(engine, R, T, how))

    spec.verify, w._draft_extend_for_decode = verified, extended
    try:
        spec.forward_batch_generation(batch)
    finally:
        del spec.verify, w._draft_extend_for_decode
    return builds


def _extend_builds(engine: _MultiLayerWorkerEngine, R: int, T: int, how: str) -> list[StepBuild]:
    """The draft layers' extend builds: each layer's eager forward, or the composite
    graph's padded and replay of each layer."""
    if engine.layers:  # eager: each layer's forward ran
        return _layer_builds(engine, R, T, how)
    builds = []
    cgr = engine.worker.cuda_graph_runner_for_draft_extend
    for step, backend in enumerate(engine.draft.backends):
        layer = cgr.get_runner(step)
        persistent = decode._engine.StandIn(
            kv_indptr=backend.kv_indptr,
            kv_indices=backend.cuda_graph_kv_indices,
            qo_indptr=backend.qo_indptr,
        )
        baked = layer.backend.graphs[layer._make_graph_key(cgr.bs)]
        for name, metadata in (("padded", persistent), ("replay", baked)):
            build = engine.draft.engine._graph_build(name, cgr, cgr.bs, R, T, metadata)
            builds.append(dataclasses.replace(build, where=ml._where(name, step), draft=step))
    return builds


def prefill_round(
    engine: _MultiLayerWorkerEngine, inputs: RunnerStepInputs, how: str
) -> list[StepBuild]:
    """``forward_batch_generation`` of the scheduler's extend batch: the target worker's
    extend (``ForwardBatch.init_new`` of the batch, eager), then
    ``_draft_extend_for_prefill`` with its hidden states and next tokens."""
    R, T = inputs.num_reqs, inputs.num_tokens
    batch = engine.schedule_batch(inputs, "extend")
    engine.layers, engine.how = [], how
    engine.spec_worker.forward_batch_generation(batch)
    target, fb = engine.target, engine.target_worker.forward_batch
    fields = target._fields(R, T, eagle._batch_inputs(fb, how), target.backend.forward_metadata)
    return [StepBuild(how, R, T, fields, where=decode._WHERE[how])] + _layer_builds(
        engine, R, T, how
    )


class MultiLayerWorkerLife(eagle.WorkerLife):
    """SGLang's multi-layer EAGLE v2 worker across the steps of one engine."""

    def prepare(self) -> None:
        prepare()

    def make(
        self, config: EngineConfig, device: torch.device, graphs: bool
    ) -> _MultiLayerWorkerEngine:
        with ml._multi_layer_args(config):
            return _MultiLayerWorkerEngine(config, device, graphs)

    def step(
        self, engine: Any, inputs: RunnerStepInputs, mode: str, how: str, graphs: bool
    ) -> list[StepBuild]:
        with ml._multi_layer_args(inputs.config), eagle._triton_fallbacks():
            if mode == "verify":
                return verify_round(engine, inputs, how)
            return prefill_round(engine, inputs, how)


ENGINE = MultiLayerWorkerLife()
"""The engine of the implementation ``sglang-multi-layer-eagle-worker``."""


def run(inputs: RunnerStepInputs) -> Any:
    """The implementation ``sglang-multi-layer-eagle-worker`` of ``runner-step``: the step
    on :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
