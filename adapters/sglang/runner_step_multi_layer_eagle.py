"""SGLang's multi-layer EAGLE (MTP with one draft layer a step) draft extend on the
Triton attention backend, as the implementation ``sglang-multi-layer-eagle`` of
``runner-step``.

SGLang serves it with ``--speculative-algorithm EAGLE --enable-multi-layer-eagle``
(``spec_info.py:SpeculativeAlgorithm.create_worker``: ``MultiLayerEagleWorkerV2``),
``speculative_num_draft_tokens == speculative_num_steps + 1`` and top-k 1
(``multi_layer_eagle_worker_v2.py:MultiLayerEagleDraftWorker.__init__``). After every
verify, each draft layer ``step`` extends over the verify's window
(``_draft_extend_for_decode``) with its own model runner and Triton backend: the
composite graph runner fills one shared buffer set once, then replays each layer's
graph over it, the draft chain's ``input_ids`` rotated in place between layers.

What runs, unchanged (SGLang 0.5.23):

- ``speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py``:
  ``MultiLayerEagleMultiStepDraftExtendCudaGraphRunner`` (``__init__``: each layer's
  ``MultiLayerEagleDraftExtendCudaGraphRunner`` and its backend's
  ``init_cuda_graph_state``, ``_allocate_buffers``, each layer's
  ``init_buffers_and_capture``: ``capture_one_shape`` for every capture batch size;
  ``can_run_graph``; ``prepare``: the bucket and
  ``fill_draft_extend_prepare_buffers_triton``, the padding rows' fill; ``replay``
  of every layer: its replay view and the backend's ``init_forward_metadata_out_graph``);
- ``speculative/multi_layer_eagle_utils.py``: ``rotate_input_ids`` between layers
  (Triton kernels, interpreted where there is no GPU);
- ``layers/attention/triton_backend.py``: one ``TritonAttnBackend`` a draft layer, its
  eager ``init_forward_metadata`` of ``DRAFT_EXTEND_V2`` (the worker's path when the
  graph cannot run) and ``_update_draft_extend_buffers`` for each layer's graph.

Stand-ins: the draft model runner (one for all layers, as SGLang's layers share the
request rows), the draft worker (the names the runners read), and each layer's graph
(:class:`runner_step_draft_extend._ExtendGraph`: a capture records the layer's
backend metadata; a replay hands back the runner's buffers and a top-1 draft of
token 0, the draft model's forward never runs).

Builds, one a draft layer (``draft``: the layer; None for the first, the step's
own): ``eager`` (the layer's backend ``init_forward_metadata``), ``padded`` (the
shared buffers and the layer's backend persistent buffers after its replay),
``replay`` (the same through what the layer's graph of that batch size captured),
``fresh`` (eager, on a new engine); ``capture``: each layer's capture runs. After an
extend step, the draft model's extend, eagerly.
Fields: :mod:`~attnfuzz.adapters.sglang.runner_step_draft_extend`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_draft_extend as extend
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.adapters.sglang.runner_step import reach_verify_replay as reach_verify_replay
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

_RUNNER = "multi_layer_eagle_draft_extend_cuda_graph_runner.py"


def prepare() -> None:
    """Import SGLang's multi-layer runner and its kernels before a judge forks its child."""
    extend.prepare()
    from sglang.srt.speculative import multi_layer_eagle_draft_extend_cuda_graph_runner  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no multi-layer EAGLE draft extend for ``case``'s config, else None."""
    if case.config.num_spec < 1:
        return (
            "num_spec 0: no speculative decoding, no multi-layer EAGLE draft worker "
            "(multi_layer_eagle_worker_v2.py:MultiLayerEagleDraftWorker) and no draft extend"
        )
    return None


def _multi_layer_args(config: EngineConfig, attention_backend: str = "triton") -> Any:
    """``runner_step._server_args`` with ``--enable-multi-layer-eagle``."""
    return decode._server_args(config, attention_backend, enable_multi_layer_eagle=True)


class _LayerGraph(extend._ExtendGraph):
    """A draft layer's graph: a capture records its backend's metadata; a replay hands
    back the shared buffers and a top-1 draft (token 0, probability 1) a request."""

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        out = super().replay(shape_key, static_forward_batch, **kwargs)
        bs, device = shape_key.size, self.runner.device
        out.topk_p = torch.ones((bs, 1), dtype=torch.float32, device=device)
        out.topk_index = torch.zeros((bs, 1), dtype=torch.int64, device=device)
        return out


class _MultiLayerEngine(extend._ExtendEngine):
    """One multi-layer EAGLE engine's draft extend: the target's request rows, one
    Triton backend a draft layer, and the composite draft-extend graph runner."""

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        self.config, self.device = config, device
        self.captures: list[StepBuild] = []
        self.engine = decode._Engine(config, device, graphs=False)
        self.runner = self.engine.runner
        self.runner.is_draft_worker = True
        self.runner.model_config.is_draft_model = True
        self.runner.model_config.spec_hidden_size = self.runner.model_config.hidden_size
        self.runner.model_config.model_is_mrope = False
        with _multi_layer_args(config):
            # init_attention_backend: DraftBackendFactory.create_draft_extend_backend a layer.
            self.backends = [
                TritonAttnBackend(self.runner, skip_prefill=False) for _ in range(config.num_spec)
            ]
            self.backend = self.backends[0]
            self.runner.attn_backend = self.backend
            self.engine.backend = self.backend  # the draft model's extend, after an extend
            self.graph_runner: Any = self._graph_runner() if graphs else None

    def _worker(self) -> Any:
        """The multi-layer draft worker the runners read."""
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        runner = self.runner
        return decode._engine.StandIn(
            device=self.device,
            gpu_id=0,
            topk=1,
            speculative_num_steps=self.config.num_spec,
            draft_extend_attn_backend_list=self.backends,
            mtp_model_runner=lambda step: runner,
            draft_extend_num_front_tokens=0,  # the boundary-KV fix: hybrid models only
            chain_mtp_hidden_states=False,
            use_rejection_sampling=False,
            speculative_algorithm=SpeculativeAlgorithm.EAGLE,
        )

    def _graph_runner(self) -> Any:
        """``MultiLayerEagleMultiStepDraftExtendCudaGraphRunner(worker)``: the shared
        buffers, and each layer's capture of every capture batch size, recorded."""
        from sglang.srt.speculative import (
            multi_layer_eagle_draft_extend_cuda_graph_runner as module,
        )

        engine = self

        class _Recording(_LayerGraph):
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                build = engine.engine._graph_build(
                    "capture", self.runner, shape_key.size, 0, 0, self.graphs[shape_key]
                )
                engine.captures.append(_at(build, self.runner.step))

        # The capture's log of free device memory reads a GPU's: none here.
        with (
            decode._no_cuda_graphs(_Recording, module),
            mock.patch.object(module, "get_available_gpu_memory", lambda *_: 0.0),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            return module.MultiLayerEagleMultiStepDraftExtendCudaGraphRunner(self._worker())

    def eager_layers(self, inputs: RunnerStepInputs, how: str) -> list[StepBuild]:
        """Each layer's ``init_forward_metadata`` of the draft extend (the worker's path
        where the graph cannot run), copied now."""
        fb, _ = self.extend_batch(inputs)
        builds = []
        for step, backend in enumerate(self.backends):
            backend.init_forward_metadata(fb)
            inputs_of = {
                "seq_lens": fb.seq_lens,
                "out_cache_loc": fb.out_cache_loc,
                "positions": fb.positions,
            }
            if how != "fresh":  # a new engine's rows are its own: history picks them
                inputs_of["req_pool_indices"] = fb.req_pool_indices
            R, T = inputs.num_reqs, inputs.num_tokens
            fields = self.engine._fields(R, T, inputs_of, backend.forward_metadata)
            builds.append(StepBuild(how, R, T, fields, where=_where(how, step), draft=_draft(step)))
        return builds


def _where(how: str, step: int) -> str:
    where = {
        "eager": "triton_backend.py:TritonAttnBackend.init_forward_metadata (DRAFT_EXTEND_V2)",
        "fresh": "triton_backend.py:TritonAttnBackend.init_forward_metadata (DRAFT_EXTEND_V2, "
        "a new engine)",
        "padded": f"{_RUNNER}:MultiLayerEagleMultiStepDraftExtendCudaGraphRunner.prepare, "
        "replay (buffers, backend's)",
        "replay": f"{_RUNNER}:MultiLayerEagleMultiStepDraftExtendCudaGraphRunner.replay "
        "(what the graph reads)",
        "capture": f"{_RUNNER}:MultiLayerEagleDraftExtendCudaGraphRunner.capture_one_shape",
    }[how]
    return f"{where}, draft layer {step}"


def _draft(step: int) -> int | None:
    """A layer's sub-step: the first layer's builds are the step's own (``draft`` None),
    each later layer's its own sub-step."""
    return step or None


def _at(build: StepBuild, step: int) -> StepBuild:
    """``build`` named at this runner and its draft layer."""
    return dataclasses.replace(build, where=_where(build.how, step), draft=_draft(step))


class MultiLayerEagleLife(extend.DraftExtendLife):
    """SGLang's multi-layer EAGLE draft extend across the steps of one engine."""

    def prepare(self) -> None:
        prepare()

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return _multi_layer_args(config, attention_backend)

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> _MultiLayerEngine:
        return _MultiLayerEngine(config, device, graphs=graphs)

    def graph_read(self, engine: _MultiLayerEngine) -> list[Any]:
        return list(engine.backends)

    def eager(
        self, engine: _MultiLayerEngine, inputs: RunnerStepInputs, mode: str, how: str
    ) -> StepBuild | list[StepBuild]:
        if mode == "verify":
            return engine.eager_layers(inputs, how)
        return engine.engine.eager(inputs, mode, how=how)

    def graph_builds(
        self, engine: _MultiLayerEngine, inputs: RunnerStepInputs, mode: str
    ) -> list[StepBuild]:
        from sglang.srt.speculative.multi_layer_eagle_utils import rotate_input_ids

        cgr = engine.graph_runner
        if mode != "verify" or cgr is None:
            return []
        fb, _ = engine.extend_batch(inputs)
        # _draft_extend_for_decode: the verify's accept lengths on spec_info.
        if not cgr.can_run_graph(fb):
            return []
        cgr.prepare(fb)
        R, T = inputs.num_reqs, inputs.num_tokens
        builds = []
        for step, backend in enumerate(engine.backends):
            _, _, topk_index = cgr.replay(step)
            layer = cgr.get_runner(step)
            bs = cgr.bs
            persistent = decode._engine.StandIn(
                kv_indptr=backend.kv_indptr,
                kv_indices=backend.cuda_graph_kv_indices,
                qo_indptr=backend.qo_indptr,
            )
            baked = layer.backend.graphs[layer._make_graph_key(bs)]
            builds += [
                _at(engine.engine._graph_build("padded", cgr, bs, R, T, persistent), step),
                _at(engine.engine._graph_build("replay", cgr, bs, R, T, baked), step),
            ]
            if step < len(engine.backends) - 1:  # the worker advances the draft chain
                rotate_input_ids(
                    cgr.buffers.input_ids[: cgr.raw_num_tokens],
                    cgr.buffers.extend_start_loc[: cgr.raw_bs],
                    cgr.buffers.extend_seq_lens[: cgr.raw_bs],
                    topk_index,
                    cgr.buffers.select_index[: cgr.raw_bs],
                )
        return builds


ENGINE = MultiLayerEagleLife()
"""The engine of the implementation ``sglang-multi-layer-eagle`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-multi-layer-eagle`` of ``runner-step``: the step's
    draft extend of every layer on :data:`ENGINE`, kept across calls;
    ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a defect of the padded replay, re-created ------------------------------------------------


class _AcceptLengthLayout(MultiLayerEagleLife):
    """The replay's window laid out by the verify's accept counts (the kind of 0.5.9's
    draft-extend replay lines, pr21987): ``prepare`` hands every layer's replay
    ``extend_seq_lens_tensor`` as ``num_accept_tokens`` instead of the fixed window, so
    ``_update_draft_extend_buffers`` reads a prefix of ``seq_lens - accepted`` keys: the
    window's unaccepted drafts' slots too."""

    def graph_builds(
        self, engine: _MultiLayerEngine, inputs: RunnerStepInputs, mode: str
    ) -> list[StepBuild]:
        from sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner import (
            MultiLayerEagleMultiStepDraftExtendCudaGraphRunner as Composite,
        )

        own = Composite.prepare

        def by_accept_counts(self: Any, forward_batch: Any, *, staged: bool = False) -> None:
            own(self, forward_batch, staged=staged)
            spec_info = self._replay_spec_info
            spec_info.extend_seq_lens_tensor = self.buffers.num_accept_tokens[: self.bs]

        with mock.patch.object(Composite, "prepare", by_accept_counts):
            return super().graph_builds(engine, inputs, mode)


ACCEPT_LENGTH_LAYOUT = _AcceptLengthLayout()


def run_accept_length_layout(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-multi-layer-eagle-accept-length-layout``."""
    return ACCEPT_LENGTH_LAYOUT(inputs)


run_accept_length_layout.new_engine = ACCEPT_LENGTH_LAYOUT.new_engine  # type: ignore[attr-defined]


def trigger_accept_length_layout(trace: Trace | Case) -> bool:
    """A verify the draft-extend graphs replay: a window of ``next_n`` >= 2 tokens, one
    accepted, so the accept count is not the window."""
    return reach_verify_replay(trace)


def smallest_accept_length_layout() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)
