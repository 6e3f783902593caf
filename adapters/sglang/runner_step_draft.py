"""SGLang's EAGLE draft graph runner on the Triton multi-step draft backend, as the
implementation ``sglang-eagle-draft`` of ``runner-step``.

The draft runs after every target step of an EAGLE engine. After a verify, the
draft of the next round decodes over the running requests; after an extend (a
prefill, or a step SGLang's decode runner does not serve), the draft model runs
the same extend. attnfuzz drives the draft of each drawn step.

What runs, unchanged (SGLang 0.5.23):

- ``speculative/eagle_draft_cuda_graph_runner.py``: ``EAGLEDraftCudaGraphRunner``
  whole: ``__init__`` (its capture sizes from ``get_batch_sizes_to_capture``, its
  ``EagleDraftInputBuffers``, the backend's ``init_cuda_graph_state``), ``capture``
  (``DecodeCudaGraphRunner._capture``, and its own ``capture_one_shape``: the
  backend's ``init_forward_metadata_out_graph(in_capture=True)`` for every capture
  batch size), ``can_run_graph``, and ``execute`` (the padding to the bucket, the
  buffers' copy, the backend's replay ``init_forward_metadata_out_graph``);
- ``layers/attention/triton_backend.py``: ``TritonMultiStepDraftBackend`` (its
  eager ``init_forward_metadata``, ``init_cuda_graph_state``, the graph's
  ``init_forward_metadata_out_graph``, ``common_template`` over the Triton kernel
  ``generate_draft_decode_kv_indices``) and the ``TritonAttnBackend`` of each
  draft step; for an extend, the draft model's ``TritonAttnBackend``;
- ``kernels/ops/speculative/cache_locs.py``: ``assign_draft_cache_locs_contiguous_func``,
  the draft's write slots, as ``eagle_worker_common.py:prepare_for_draft`` calls it;
- ``mem_cache/memory_pool.py``: ``ReqToTokenPool``, rows kept across the steps of
  one engine (shared by target and draft, as in SGLang).

Stand-ins: the draft model runner (:func:`runner_step._model_runner`'s, marked a
draft worker), a KV pool whose buffers are never read, the EAGLE worker (its
``draft_forward`` returns zeros of the output's shape; no graph stand-in calls
it), and the graph (:class:`runner_step._Graph`: a capture records the per-step
metadata each draft step's attention reads, a replay does nothing), with the
capture stream none.

The draft of the next round after a verify is the draft of a verify that accepted
none of its drafts: each request's committed prefix is ``num_computed + 1`` (its
root token), and the draft writes its ``num_steps`` tokens in the slots the verify
held for its drafts (``req_to_token[row, seq_len:seq_len + num_steps]``, as
``assign_draft_cache_locs_contiguous`` reads them): slots the request holds.

Builds: ``capture`` (each capture batch size's buffers and per-step metadata at
capture), ``eager`` (``TritonMultiStepDraftBackend.init_forward_metadata``, no
graph; the draft's extend for an extend step), ``padded`` (the runner's buffers
and the backend's persistent per-step buffers after ``execute``), ``replay``
(the same buffers through the views each draft step's graph captured), ``fresh``
(the eager draft on a new engine holding only the step's requests).

Fields: ``seq_lens``, ``req_pool_indices``, ``positions`` (one draft token a
request: topk 1) and ``out_cache_loc`` (a table: the request's ``num_steps``
write slots) by request; for each draft step ``s`` whose attention runs
(``0 .. num_steps - 2``), ``kv_indptr.s`` as offsets and ``kv_indices.s`` as a
table by request (row ``i``: ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``); and
``kv_len`` and ``kv_slots``, the last attending step's row lengths and ``kv_indices``:
the keys of the draft as a whole (the earlier steps read a prefix of them), which
*padding writes no real KV* holds the padding rows' ``out_cache_loc`` to.
An extend's fields are those of :mod:`attnfuzz.adapters.sglang.runner_step`.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)

EAGLE_TOPK = 1
"""The draft's branches a request: the chain draft, whose verify holds ``num_steps + 1``
tokens a request (``arg_groups/speculative_hook.py:_handle_eagle_family`` sets
``speculative_num_draft_tokens = speculative_num_steps + 1`` when topk is 1): the
verify width ``next_n`` of a trace. (``EngineConfig.topk`` is the sparse indexer's K.)"""

MIN_DRAFT_STEPS = 2
"""``speculative/draft_utils.py:DraftBackendFactory.create_decode_backend`` builds no
multi-step draft backend, and ``eagle_worker_v2.py:_capture_cuda_graphs`` no draft
graph runner, for ``speculative_num_steps <= 1``: the draft only samples."""


def prepare() -> None:
    """Import SGLang's draft runner and backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.speculative import eagle_draft_cuda_graph_runner  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no draft decode for ``case``'s config, else None."""
    num_steps = case.config.num_spec
    if num_steps < MIN_DRAFT_STEPS:
        return (
            f"num_spec {num_steps}: SGLang builds no EAGLE draft runner or multi-step "
            "draft backend for speculative_num_steps <= 1 (draft_utils.py:"
            "DraftBackendFactory.create_decode_backend, eagle_worker_v2.py:"
            "_capture_cuda_graphs)"
        )
    return None


# -- the graph and worker stand-ins --------------------------------------------------------------


def _draft_output(bs: int, num_steps: int, num_draft_tokens: int) -> tuple:
    """``EagleWorkerV2.draft_forward``'s output for ``bs`` requests, zeros: ``parent_list``,
    ``top_scores_index``, ``draft_tokens``, ``draft_probs`` (no rejection sampling)."""
    parents = torch.zeros((bs, EAGLE_TOPK * (num_steps - 1) + 1), dtype=torch.int64)
    chosen = torch.zeros((bs, num_draft_tokens - 1), dtype=torch.int64)
    return parents, chosen, chosen.clone(), None


def _read_through(view: torch.Tensor, draft: Any) -> torch.Tensor:
    """What a captured kernel reads of ``view``: its pointer, not its length. Each step's
    ``kv_indices`` is captured as ``cuda_graph_kv_indices[s][:used_len]``, the length of
    the capture's own sequences (``common_template``: ``draft_kv_indices_used_len``); a
    replay's kernel reads ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]`` through the same
    pointer, up to the end of the step's row of the persistent buffer. A view of any
    other buffer is what it is."""
    buf = draft.cuda_graph_kv_indices
    if view.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
        return view
    width = buf.shape[1]
    column = (view.storage_offset() - buf.storage_offset()) % width
    return torch.as_strided(view, (width - column,), (1,), view.storage_offset())


class _DraftGraph(decode._Graph):
    """The draft runner's graph: a capture records the metadata of each draft step's
    attention (the views the graph reads); a replay hands back the draft's output."""

    def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
        draft = self.runner.draft_attn_backend
        self.graphs[shape_key] = [
            decode._engine.StandIn(
                kv_indptr=b.forward_metadata.kv_indptr,
                kv_indices=_read_through(b.forward_metadata.kv_indices, draft),
            )
            for b in draft.attn_backends
        ]

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        worker = self.runner.eagle_worker
        return worker.draft_forward_output(shape_key.size)


# -- one engine ---------------------------------------------------------------------------------


class _DraftEngine:
    """One EAGLE engine's draft: the target's request rows (``runner_step._Engine``, no
    decode graph runner: its draft model runner), the multi-step draft backend and the
    draft graph runner, built with the engine."""

    GRAPH: type[_DraftGraph] = _DraftGraph
    """The graph stand-in the draft graph runner captures into and replays."""
    WHERE = None  # the module's _WHERE; a draft on another backend names its own

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        self.config, self.device = config, device
        self.num_steps = config.num_spec
        self.captures: list[StepBuild] = []
        self.engine = self.make_target(config, device)
        self.runner = self.engine.runner
        self.runner.is_draft_worker = True
        self.runner.model_config.is_draft_model = True
        # The hidden state the draft carries between rounds (eagle_utils.py:
        # get_draft_recurrent_hidden_state_spec): the draft model's hidden size.
        self.runner.model_config.spec_hidden_size = self.runner.model_config.hidden_size
        self.runner.model_config.model_is_mrope = False  # a text model's positions
        with decode._server_args(config, self.engine.ATTENTION_BACKEND):
            self.draft_backend = self.make_draft_backend()
            self.runner.draft_attn_backend = self.draft_backend
            self.graph_runner: Any = self._graph_runner() if graphs else None

    def make_target(self, config: EngineConfig, device: torch.device) -> Any:
        """The engine whose model runner the draft's is (its attention backend: the
        draft model's extend's), no decode graph runner."""
        return decode._Engine(config, device, graphs=False)

    def make_draft_backend(self) -> Any:
        """``TritonMultiStepDraftBackend(model_runner, topk, num_steps)``."""
        from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend

        return TritonMultiStepDraftBackend(self.runner, EAGLE_TOPK, self.num_steps)

    def _worker(self) -> Any:
        """The EAGLE worker the draft runner reads: its draft model runner, steps, and a
        ``draft_forward`` (the model) that returns zeros of its output's shape."""
        steps, tokens = self.num_steps, self.config.next_n

        def draft_forward(forward_batch: Any) -> tuple:
            return _draft_output(forward_batch.batch_size, steps, tokens)

        return decode._engine.StandIn(
            draft_runner=self.runner,
            speculative_num_steps=steps,
            topk=EAGLE_TOPK,
            draft_forward=draft_forward,
            draft_forward_output=lambda bs: _draft_output(bs, steps, tokens),
            dsa_seed_topk_width=None,
            seed_dsa_topk_from_draft_extend=False,
        )

    def _graph_runner(self) -> Any:
        """``EAGLEDraftCudaGraphRunner(eagle_worker)``: its buffers, and a capture of every
        capture batch size, each recorded as its graph would read it."""
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import (
            EAGLEDraftCudaGraphRunner,
        )

        engine = self

        class _Recording(self.GRAPH):  # type: ignore[name-defined,misc]
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                # The capture's batch of shape_key.size requests, at the buffers'
                # capture values: no real rows.
                build = engine._graph_build(
                    "capture", self.runner, shape_key.size, 0, 0, self.graphs[shape_key]
                )
                engine.captures.append(build)

        worker = self._worker()
        # The capture's progress bar (tqdm, on rank 0) is not attnfuzz's output.
        from sglang.srt.speculative import eagle_draft_cuda_graph_runner as module

        with decode._no_cuda_graphs(_Recording, module), contextlib.redirect_stderr(io.StringIO()):
            runner = EAGLEDraftCudaGraphRunner(worker)
        worker.runner = runner
        return runner

    # -- the draft's ForwardBatch ---------------------------------------------------------------

    def draft_batch(self, inputs: RunnerStepInputs) -> Any:
        """The draft of the next round after the verify ``inputs``, as
        ``eagle_worker_common.py:prepare_for_draft`` builds it: the committed prefix
        (``num_computed + 1``: no draft accepted), its write slots by SGLang's
        ``assign_draft_cache_locs_contiguous_func``, the draft positions ``seq_lens``."""
        from sglang.kernels.ops.speculative.cache_locs import (
            assign_draft_cache_locs_contiguous_func,
        )
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        dev, R = self.device, inputs.num_reqs
        rows = [self.engine.requests[i].row for i in inputs.req_ids]
        req_pool_indices = torch.tensor(rows, dtype=torch.int64, device=dev)
        seq_lens = torch.tensor([c + 1 for c in inputs.num_computed_tokens], device=dev)
        out_cache_loc = torch.empty(R * EAGLE_TOPK * self.num_steps, dtype=torch.int64)
        assign_draft_cache_locs_contiguous_func(
            req_pool_indices,
            self.runner.req_to_token_pool.req_to_token,
            seq_lens,
            out_cache_loc,
            EAGLE_TOPK,
            self.num_steps,
        )
        hidden = self.runner.model_config.hidden_size
        spec_info = EagleDraftInput(
            topk_p=torch.zeros((R, EAGLE_TOPK), dtype=torch.float32, device=dev),
            topk_index=torch.zeros((R, EAGLE_TOPK), dtype=torch.int64, device=dev),
            hidden_states=torch.zeros((R, hidden), dtype=torch.float32, device=dev),
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )
        spec_info.num_tokens_per_req = EAGLE_TOPK
        spec_info.num_tokens_for_logprob_per_req = EAGLE_TOPK
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=R,
            input_ids=None,
            req_pool_indices=req_pool_indices,
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens.cpu(),
            seq_lens_sum=int(seq_lens.sum()),
            out_cache_loc=out_cache_loc,
            positions=seq_lens.repeat_interleave(EAGLE_TOPK, dim=0),
            spec_algorithm=SpeculativeAlgorithm.EAGLE,
            spec_info=spec_info,
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )
        self.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    # -- builds ---------------------------------------------------------------------------------

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code."""
        acc = self.engine.accepts()
        width = self.runner.req_to_token_pool.req_to_token.shape[1]
        # cache_locs.py:generate_draft_decode_kv_indices reads req_to_token[row, :seq_len]
        # and the draft's own entries past it, seq_len + topk_id * num_steps + j for
        # j <= step: a length whose entries the row holds.
        acc["seq_lens"] = (acc["seq_lens"][0], width - EAGLE_TOPK * self.num_steps)
        return acc

    def _fields(
        self, rows: int, inputs_of: dict[str, torch.Tensor], steps: list[Any]
    ) -> tuple[Field, ...]:
        """The fields of a build of ``rows`` requests (padding included), copied now: the
        draft's inputs, and each draft step's metadata ``steps``."""

        def host(t: torch.Tensor) -> np.ndarray:
            return t.detach().cpu().numpy().astype(np.int64)  # a copy

        acc = self.accepts()
        per_req = EAGLE_TOPK * self.num_steps
        out = [
            Field("seq_lens", "requests", host(inputs_of["seq_lens"][:rows]), acc["seq_lens"]),
            # The draft's tokens, topk to a request: by request.
            Field(
                "positions",
                "requests",
                host(inputs_of["positions"][: rows * EAGLE_TOPK]).reshape(rows, EAGLE_TOPK),
                acc["positions"],
            ),
            # Each draft step s writes its tokens' KV (per_step_draft_out_cache_loc):
            # the request's num_steps slots, a row of the table.
            Field(
                "out_cache_loc",
                "requests",
                host(inputs_of["out_cache_loc"][: rows * per_req]).reshape(rows, per_req),
                acc["out_cache_loc"],
                writes_kv=True,
            ),
        ]
        if "req_pool_indices" in inputs_of:
            pool_rows = host(inputs_of["req_pool_indices"][:rows])
            out.append(Field("req_pool_indices", "requests", pool_rows, acc["req_pool_indices"]))
        for s, metadata in enumerate(steps):
            indptr, flat = host(metadata.kv_indptr[: rows + 1]), host(metadata.kv_indices)
            # The decode kernel reads kv_indices[kv_indptr[i] : kv_indptr[i + 1]] for row i.
            spans = [flat[max(a, 0) : max(b, 0)] for a, b in zip(indptr, indptr[1:], strict=False)]
            table = np.zeros((rows, max((len(x) for x in spans), default=0)), dtype=np.int64)
            for r, entries in enumerate(spans):
                table[r, : len(entries)] = entries
            out.append(Field(f"kv_indptr.{s}", "offsets", indptr, (0, flat.size)))
            out.append(Field(f"kv_indices.{s}", "requests", table, acc["kv_indices"]))
        if steps:
            # The last attending step reads every key the earlier ones read, and more: the
            # keys of the draft as a whole, which padding writes no real KV reads.
            lens = np.array([len(x) for x in spans], dtype=np.int64)
            out.append(Field("kv_len", "requests", lens))
            out.append(Field("kv_slots", "requests", table, row_lengths=lens))
        return tuple(out)

    def _graph_build(
        self, how: str, graph_runner: Any, bs: int, num_reqs: int, num_tokens: int, steps: Any
    ) -> StepBuild:
        """A build read from the draft runner's buffers and ``steps``' metadata (copied now)."""
        b = graph_runner.buffers
        inputs_of = {
            "seq_lens": b.seq_lens,
            "req_pool_indices": b.req_pool_indices,
            "out_cache_loc": b.out_cache_loc,
            "positions": b.positions,
        }
        fields = self._fields(bs, inputs_of, steps)
        return StepBuild(how, num_reqs, num_tokens, fields, (self.WHERE or _WHERE)[how])

    def eager(self, inputs: RunnerStepInputs, how: str = "eager") -> StepBuild:
        """``TritonMultiStepDraftBackend.init_forward_metadata`` of the draft, no graph:
        each draft step's backend metadata, copied as it is built (``common_template``
        hands each step's backend its own slices, then the next step's)."""
        fb = self.draft_batch(inputs)
        steps: list[Any] = []
        backends = self.draft_backend.attn_backends
        for backend in backends:
            own = backend.init_forward_metadata

            def recorded(forward_batch: Any, own: Any = own, backend: Any = backend) -> None:
                own(forward_batch)
                m = backend.forward_metadata
                steps.append(
                    decode._engine.StandIn(
                        kv_indptr=m.kv_indptr.clone(), kv_indices=m.kv_indices.clone()
                    )
                )

            backend.init_forward_metadata = recorded
        try:
            self.draft_backend.init_forward_metadata(fb)
        finally:
            for backend in backends:
                del backend.init_forward_metadata
        inputs_of = {"seq_lens": fb.seq_lens, "out_cache_loc": fb.out_cache_loc}
        inputs_of["positions"] = fb.positions
        if how != "fresh":  # a new engine's rows are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        return StepBuild(how, R, T, self._fields(R, inputs_of, steps), (self.WHERE or _WHERE)[how])


_WHERE = {
    "eager": "triton_backend.py:TritonMultiStepDraftBackend.init_forward_metadata",
    "fresh": "triton_backend.py:TritonMultiStepDraftBackend.init_forward_metadata (a new engine)",
    "padded": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.execute (buffers, "
    "backend's)",
    "replay": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.execute (what each "
    "draft step's graph reads)",
    "capture": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.capture_one_shape",
}


class DraftLife(decode.EngineLife):
    """SGLang's EAGLE draft across the steps of one engine: called with each scheduler
    output of the target. A verify is followed by the draft of the next round; any
    other step (SGLang runs it as an extend, ``decode.step_mode``) by the draft
    model's extend, eagerly."""

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> _DraftEngine:
        return _DraftEngine(config, device, graphs=graphs)

    def core(self, engine: _DraftEngine) -> Any:
        return engine.engine

    def eager(
        self, engine: _DraftEngine, inputs: RunnerStepInputs, mode: str, how: str
    ) -> StepBuild:
        if mode == "verify":
            return engine.eager(inputs, how=how)
        return engine.engine.eager(inputs, mode, how=how)

    def graph_read(self, engine: _DraftEngine) -> list[Any]:
        return [engine.draft_backend, *engine.draft_backend.attn_backends]

    def graph_builds(
        self, engine: _DraftEngine, inputs: RunnerStepInputs, mode: str
    ) -> list[StepBuild]:
        graphs = engine.graph_runner
        if mode != "verify" or graphs is None:
            return []
        fb = engine.draft_batch(inputs)
        if not graphs.can_run_graph(fb):
            return []
        graphs.execute(fb)  # padding, buffers, the backend's replay metadata
        R, T, bs = inputs.num_reqs, inputs.num_tokens, graphs.bs
        baked = graphs.backend.graphs[graphs._make_graph_key(bs)]
        return [
            engine._graph_build("padded", graphs, bs, R, T, self.persistent(engine)),
            engine._graph_build("replay", graphs, bs, R, T, baked),
        ]

    def persistent(self, engine: _DraftEngine) -> list[Any]:
        """Each draft step's metadata as the multi-step backend's persistent buffers hold
        it after a replay's preparation."""
        backend = engine.draft_backend
        return [
            decode._engine.StandIn(
                kv_indptr=backend.kv_indptr[s],
                kv_indices=backend.cuda_graph_kv_indices[s],
            )
            for s in range(len(backend.attn_backends))
        ]


ENGINE = DraftLife()
"""The engine of the implementation ``sglang-eagle-draft`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-eagle-draft`` of ``runner-step``: the step's draft on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
