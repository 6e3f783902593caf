"""SGLang's EAGLE draft-extend graph runner on the Triton attention backend, as the
implementation ``sglang-eagle-draft-extend`` of ``runner-step``.

After every verify of an EAGLE engine (spec v2), the draft model extends over the
verify's window (``eagle_worker_v2.py:EagleDraftWorker._draft_extend_for_decode``):
each request's committed prefix, then the ``num_draft_tokens`` tokens the verify
wrote, in the verify's slots, as one ``DRAFT_EXTEND_V2`` batch of a fixed width a
request, replayed in the draft-extend graph when its batch size fits. After an
extend (a prefill, or a step SGLang's decode runner does not serve) the draft model
runs the same extend, eagerly (``_draft_extend_for_prefill``).

What runs, unchanged (SGLang 0.5.23):

- ``speculative/eagle_draft_extend_cuda_graph_runner.py``:
  ``EAGLEDraftExtendCudaGraphRunner`` whole: ``__init__`` (its capture sizes from
  ``get_batch_sizes_to_capture``, its ``EagleDraftExtendInputBuffers``, the fill
  ``resolve_draft_extend_seq_len_fill_value``, the backend's
  ``init_cuda_graph_state``), ``capture`` (``DecodeCudaGraphRunner._capture``, and
  its own ``capture_one_shape``: the backend's
  ``init_forward_metadata_out_graph(in_capture=True)`` for every capture batch
  size), ``can_run_graph``, and ``execute`` (the padding to the bucket, the
  buffers' copy, the replay view, the backend's replay
  ``init_forward_metadata_out_graph``);
- ``layers/attention/triton_backend.py``: the draft model's ``TritonAttnBackend``
  (``DraftBackendFactory._create_triton_prefill_backend``): its eager
  ``init_forward_metadata`` of the draft extend (``prepare_for_draft_extend``'s,
  when the graph cannot run), and ``_update_draft_extend_buffers`` for the graph;
- ``mem_cache/memory_pool.py``: ``ReqToTokenPool``, rows kept across the steps of
  one engine (shared by target and draft, as in SGLang).

Stand-ins: the draft model runner (:func:`runner_step._model_runner`'s, marked a
draft worker), a KV pool whose buffers are never read, the EAGLE draft worker (the
names the runner reads), and the graph (:class:`runner_step._Graph`: a capture
records the backend's metadata, which the Triton backend builds outside the graph;
a replay hands back the runner's logits and hidden-state buffers), with the capture
stream none.

The draft extend after a verify is that of a verify that accepted none of its drafts
(as :mod:`~attnfuzz.adapters.sglang.runner_step_draft`'s draft): one accepted token a
request (``num_accept_tokens`` 1), which attention does not read; its batch is
``prepare_for_draft_extend``'s: prefix ``num_computed``, ``seq_lens`` the post-write
length ``num_computed + num_draft_tokens``, the verify's positions and slots.

Builds: ``capture`` (each capture batch size's buffers and metadata at capture),
``eager`` (``init_forward_metadata`` of the draft extend, no graph; the draft's
extend for an extend step), ``padded`` (the runner's buffers and the backend's
persistent buffers after ``execute``), ``replay`` (the same buffers through the
tensors the graph of that batch size captured), ``fresh`` (the eager draft extend on
a new engine holding only the step's requests).

Fields: those of :mod:`~attnfuzz.adapters.sglang.runner_step`: ``seq_lens``,
``req_pool_indices``, ``kv_indices`` (the prefix a request's extend reads: row ``i``
holds ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``) by request; ``out_cache_loc``
and ``positions`` by token; ``kv_indptr`` and ``qo_indptr`` as offsets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs, StepBuild

ACCEPTED = 1
"""Tokens a request's verify accepted (its own token, no draft): ``num_accept_tokens``."""


def prepare() -> None:
    """Import SGLang's draft-extend runner and backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no EAGLE draft extend for ``case``'s config, else None."""
    if case.config.num_spec < 1:
        return (
            "num_spec 0: no speculative decoding, no EAGLE draft worker "
            "(eagle_worker_v2.py:EagleDraftWorker) and no draft extend"
        )
    return None


# -- the graph and worker stand-ins --------------------------------------------------------------


class _ExtendGraph(decode._Graph):
    """The draft-extend runner's graph: a capture records the backend's metadata; a
    replay hands back the runner's logits and hidden-state buffers, unwritten. With
    :attr:`RUNS_BODY`, a capture also runs ``run_once`` (the backend's in-graph metadata
    preparation, ``init_forward_metadata_in_graph``, then a draft model forward that
    computes nothing), as the warmup before a CUDA graph's capture does, and a replay
    runs it again, as the graph's recorded kernels run again on the buffers they
    captured: for a backend whose in-graph preparation writes metadata (FA3's); the
    Triton backend's is the base class's no-op."""

    RUNS_BODY = False

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self.bodies: dict[Any, Any] = {}

    def capture_one(
        self, shape_key: Any, forward_fn: Any, capture_inputs: Any = None,
        post_warmup_hook: Any = None,
    ) -> None:  # fmt: skip
        if self.RUNS_BODY:
            forward_fn()
            self.bodies[shape_key] = forward_fn
        super().capture_one(shape_key, forward_fn, capture_inputs, post_warmup_hook)

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        if self.RUNS_BODY:
            self.bodies[shape_key]()
        b = self.runner.buffers
        return LogitsProcessorOutput(
            next_token_logits=b.next_token_logits_buffer, hidden_states=b.hidden_states
        )

    def cleanup(self) -> None:
        self.bodies.clear()
        super().cleanup()


def draft_model() -> Any:
    """The draft model the graph's body runs: its forward computes nothing (its
    attention layers read the metadata the in-graph preparation wrote, never write it)."""
    return decode._engine.StandIn(shared_experts_config=None, forward=lambda *a, **k: None)


# -- one engine ---------------------------------------------------------------------------------


class _ExtendEngine:
    """One EAGLE engine's draft extend: the target's request rows (``runner_step._Engine``,
    no decode graph runner: its draft model runner), the draft model's Triton backend,
    and the draft-extend graph runner, built with the engine."""

    GRAPH: type[_ExtendGraph] = _ExtendGraph
    """The graph stand-in the draft-extend runner captures into and replays."""

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        self.config, self.device = config, device
        self.captures: list[StepBuild] = []
        self.engine = decode._Engine(config, device, graphs=False)
        self.runner = self.engine.runner
        self.runner.is_draft_worker = True
        self.runner.model_config.is_draft_model = True
        # The hidden state the draft extend reads (eagle_utils.py:
        # get_draft_input_from_target_hidden_dim): the draft model's hidden size.
        self.runner.model_config.spec_hidden_size = self.runner.model_config.hidden_size
        self.runner.model_config.model_is_mrope = False  # a text model's positions
        with decode._server_args(config):
            # DraftBackendFactory._create_triton_prefill_backend: the draft extend's.
            self.backend = TritonAttnBackend(self.runner, skip_prefill=False)
            self.runner.attn_backend = self.backend
            self.engine.backend = self.backend  # the draft model's extend, after an extend
            self.graph_runner: Any = self._graph_runner() if graphs else None

    def _worker(self) -> Any:
        """The EAGLE draft worker the runner reads: its draft model runner and backend."""
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        return decode._engine.StandIn(
            draft_runner=self.runner,
            draft_extend_attn_backend=self.backend,
            speculative_algorithm=SpeculativeAlgorithm.EAGLE,
            hot_token_id=None,
            dsa_seed_topk_width=None,
            seed_dsa_topk_from_draft_extend=False,
        )

    def _graph_runner(self) -> Any:
        """``EAGLEDraftExtendCudaGraphRunner(eagle_worker)``: its buffers, and a capture of
        every capture batch size, each recorded as its graph would read it."""
        from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import (
            EAGLEDraftExtendCudaGraphRunner,
        )

        engine = self

        class _Recording(self.GRAPH):  # type: ignore[name-defined,misc]
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                # The capture's batch of shape_key.size requests, at the buffers'
                # capture values: no real rows.
                build = engine.engine._graph_build(
                    "capture", self.runner, shape_key.size, 0, 0, self.graphs[shape_key]
                )
                engine.captures.append(_at(build))

        # The capture's progress bar (tqdm, on rank 0) is not attnfuzz's output.
        from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as module

        with decode._no_cuda_graphs(_Recording, module), contextlib.redirect_stderr(io.StringIO()):
            return EAGLEDraftExtendCudaGraphRunner(self._worker())

    # -- the draft extend's ForwardBatch --------------------------------------------------------

    def extend_batch(self, inputs: RunnerStepInputs) -> tuple[Any, torch.Tensor]:
        """The draft extend after the verify ``inputs`` and its ``select_index``, as
        ``_draft_extend_for_decode`` and ``eagle_worker_common.py:prepare_for_draft_extend``
        build them: the verify's window of ``num_draft_tokens`` over the committed
        prefix, the post-write ``seq_lens``."""
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )
        from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

        dev, R, N = self.device, inputs.num_reqs, self.config.next_n
        requests = self.engine.requests
        rows = [requests[i].row for i in inputs.req_ids]
        computed = list(inputs.num_computed_tokens)
        slots = [s for i, c in zip(inputs.req_ids, computed, strict=True) for s in
                 self.engine.slots(i, c, c + N)]  # fmt: skip
        positions = [p for c in computed for p in range(c, c + N)]
        accepted = torch.full((R,), ACCEPTED, dtype=torch.int32, device=dev)
        hidden = self.runner.model_config.hidden_size
        spec_info = EagleDraftExtendInput(
            hidden_states=torch.zeros((R * N, hidden), dtype=torch.float32, device=dev),
            num_correct_drafts=accepted - 1,
            num_accept_tokens=accepted,
            num_tokens_per_req=N,
            num_tokens_for_logprob_per_req=N,
        )
        seq_lens = torch.tensor([c + N for c in computed], dtype=torch.int64, device=dev)
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2,
            batch_size=R,
            input_ids=torch.zeros(R * N, dtype=torch.int64, device=dev),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens.cpu(),
            seq_lens_sum=int(seq_lens.sum()),
            out_cache_loc=torch.tensor(slots, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            extend_num_tokens=R * N,
            extend_seq_lens=torch.full((R,), N, dtype=torch.int32, device=dev),
            extend_seq_lens_cpu=[N] * R,
            extend_prefix_lens=torch.tensor(computed, dtype=torch.int32, device=dev),
            extend_prefix_lens_cpu=computed,
            extend_start_loc=torch.arange(0, R * N, N, dtype=torch.int32, device=dev),
            spec_info=spec_info,
            capture_hidden_mode=CaptureHiddenMode.FULL,
        )
        self.runner.kv_index_translator.bind_own_plan(fb)
        # _draft_extend_for_decode: each request's last accepted token's row.
        select_index = torch.arange(0, R * N, N, device=dev) + accepted - 1
        return fb, select_index

    # -- builds ---------------------------------------------------------------------------------

    def eager(self, inputs: RunnerStepInputs, how: str = "eager") -> StepBuild:
        """``init_forward_metadata`` of the draft extend, no graph (copied now)."""
        fb, _ = self.extend_batch(inputs)
        self.backend.init_forward_metadata(fb)
        inputs_of = {
            "seq_lens": fb.seq_lens,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        if how != "fresh":  # a new engine's rows are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        fields = self.engine._fields(R, T, inputs_of, self.backend.forward_metadata)
        return StepBuild(how, R, T, fields, where=_WHERE[how])


_WHERE = {
    "eager": "triton_backend.py:TritonAttnBackend.init_forward_metadata (DRAFT_EXTEND_V2)",
    "fresh": "triton_backend.py:TritonAttnBackend.init_forward_metadata (DRAFT_EXTEND_V2, "
    "a new engine)",
    "padded": "eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner.execute "
    "(buffers, backend's)",
    "replay": "eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner.execute "
    "(what the graph reads)",
    "capture": "eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner."
    "capture_one_shape",
}


def _at(build: StepBuild) -> StepBuild:
    """``build`` (read by the decode runner's field reader) named at this runner."""
    return dataclasses.replace(build, where=_WHERE[build.how])


class DraftExtendLife(decode.EngineLife):
    """SGLang's EAGLE draft extend across the steps of one engine: called with each
    scheduler output of the target. A verify is followed by the draft extend over its
    window; any other step (an extend, ``decode.step_mode``) by the draft model's
    extend, eagerly."""

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> _ExtendEngine:
        return _ExtendEngine(config, device, graphs=graphs)

    def core(self, engine: _ExtendEngine) -> Any:
        return engine.engine

    def eager(
        self, engine: _ExtendEngine, inputs: RunnerStepInputs, mode: str, how: str
    ) -> StepBuild:
        if mode == "verify":
            return engine.eager(inputs, how=how)
        return engine.engine.eager(inputs, mode, how=how)

    def graph_builds(
        self, engine: _ExtendEngine, inputs: RunnerStepInputs, mode: str
    ) -> list[StepBuild]:
        graphs = engine.graph_runner
        if mode != "verify" or graphs is None:
            return []
        fb, select_index = engine.extend_batch(inputs)
        if not graphs.can_run_graph(fb):
            return []
        graphs.execute(fb, select_index)  # padding, buffers, replay metadata
        R, T, bs = inputs.num_reqs, inputs.num_tokens, graphs.bs
        baked = graphs.backend.graphs[graphs._make_graph_key(bs)]
        at = self.at
        return [
            at(engine.engine._graph_build("padded", graphs, bs, R, T, self.persistent(engine))),
            at(engine.engine._graph_build("replay", graphs, bs, R, T, baked)),
        ]

    def persistent(self, engine: _ExtendEngine) -> Any:
        """The backend's metadata as its persistent buffers hold it after a replay's
        preparation."""
        backend = engine.backend
        return decode._engine.StandIn(
            kv_indptr=backend.kv_indptr,
            kv_indices=backend.cuda_graph_kv_indices,
            qo_indptr=backend.qo_indptr,
        )

    @staticmethod
    def at(build: StepBuild) -> StepBuild:
        """``build`` named at this runner's sites."""
        return _at(build)


ENGINE = DraftExtendLife()
"""The engine of the implementation ``sglang-eagle-draft-extend`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-eagle-draft-extend`` of ``runner-step``: the step's
    draft extend on :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
