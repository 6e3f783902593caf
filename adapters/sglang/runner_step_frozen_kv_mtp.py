"""SGLang's Frozen-KV MTP draft graph runner, as the implementation
``sglang-frozen-kv-mtp`` of ``runner-step``.

Frozen-KV MTP (``--speculative-algorithm FROZEN_KV_MTP``, Gemma 4's assistant model)
drafts without a KV cache of its own: every draft step attends to the target's
committed prefix, read through the target's pool, and writes no key. Its draft loop
runs in its own graph, ``FrozenKVMTPCudaGraphRunner``, after every verify. attnfuzz
drives the draft of each drawn verify.

What runs, unchanged (SGLang 0.5.23):

- ``speculative/frozen_kv_mtp_cuda_graph_runner.py``: ``FrozenKVMTPCudaGraphRunner``
  whole: ``__init__`` (its capture sizes from ``get_batch_sizes_to_capture`` at the
  draft's width, its ``FrozenKVMTPInputBuffers``, the backend's
  ``init_cuda_graph_state``), ``capture`` (``DecodeCudaGraphRunner._capture`` and its
  own ``capture_one_shape``: the target pool swapped in, the worker's capture
  metadata, for every capture batch size), ``can_run_graph`` and ``execute`` (the
  padding to the bucket, the padding rows' fill, the buffers' copy, the worker's
  replay metadata over its ``SimpleNamespace`` view);
- ``speculative/frozen_kv_mtp_worker_v2.py``: ``FrozenKVMTPDraftWorker``'s metadata
  methods, the real class's (``_init_frozen_kv_metadata``, the eager build that
  ``draft_forward`` makes; ``_init_frozen_kv_metadata_capture_cuda_graph``;
  ``_init_frozen_kv_metadata_replay_cuda_graph``; ``_frozen_kv_target_view``) and
  ``speculative/frozen_kv_mtp_utils.py`` (``frozen_kv_target_view``: the spec info
  dropped and the target's pool swapped in while the metadata is built;
  ``set_frozen_kv_positions``; ``expand_for_topk_draft``);
- ``layers/attention/triton_backend.py``: the draft model runner's
  ``TritonAttnBackend`` (``_init_draft_attn_backend``: at topk 1 the runner's own),
  its decode ``init_forward_metadata`` and graph ``init_forward_metadata_out_graph``.

Stand-ins: the draft model runner (:func:`runner_step._model_runner`'s, marked a
draft worker of ``FROZEN_KV_MTP``, its model a hidden size), the worker's
``__init__`` (the class's own methods run on an instance given the attributes they
read: its runner, backend, topk, steps and ``FrozenKVMTPContext`` over the target's
pool) and ``draft_forward`` (the model's loop: zeros of its output's shape; the
graph stand-in never calls it), and the graph (:class:`runner_step._Graph`: a
capture records the backend's metadata the graph reads, a replay returns the
draft's output).

The draft after a verify, as ``FrozenKVMTPDraftWorker.draft`` builds it: the
committed prefix ``seq_lens`` (``num_computed + 1``: the verify's root token, no
draft accepted), positions ``seq_lens - 1`` (``set_frozen_kv_positions``: the rope
phase of the last written target slot), no ``out_cache_loc`` (the draft writes no
KV). An extend step has no frozen draft (the target's extend; the assistant's seed
runs in the next draft): only its ``fresh``/``eager`` builds of the target, as
``sglang``'s.

Builds: ``capture``, ``eager`` (``_init_frozen_kv_metadata``), ``padded`` (the
runner's buffers and the backend's persistent buffers after ``execute``),
``replay`` (the metadata the graph captured), ``fresh`` (the eager draft on a new
engine holding only the step's requests). Fields: ``seq_lens``,
``req_pool_indices`` and ``positions`` by request, the backend's ``kv_indptr`` and
``kv_indices``, and ``kv_len``/``kv_slots``: the target keys each draft row reads.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step_draft import DraftLife
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild

FROZEN_TOPK = 1
"""``--speculative-eagle-topk``: 1, the chain draft, whose draft backend is the draft
model runner's own (``FrozenKVMTPDraftWorker._init_draft_attn_backend``)."""

_MODULE = "sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner"


def prepare() -> None:
    """Import SGLang's frozen-KV draft runner and worker before a judge forks its child."""
    decode.prepare()
    from sglang.srt.speculative import (  # noqa: F401
        frozen_kv_mtp_cuda_graph_runner,
        frozen_kv_mtp_worker_v2,
    )


def declines(case: Case) -> str | None:
    """Why SGLang runs no frozen-KV draft for ``case``'s config, else None."""
    if case.config.num_spec < 1:
        return "num_spec 0: no speculative decoding, no Frozen-KV MTP draft"
    return None


def _draft_output(bs: int, num_steps: int, num_draft_tokens: int) -> tuple:
    """``FrozenKVMTPDraftWorker.draft_forward``'s output for ``bs`` requests, zeros:
    ``organize_draft_results``' ``parent_list``, ``top_scores_index``, ``draft_tokens``."""
    parents = torch.zeros((bs, FROZEN_TOPK * (num_steps - 1) + 1), dtype=torch.int64)
    chosen = torch.zeros((bs, num_draft_tokens - 1), dtype=torch.int64)
    return parents, chosen, chosen.clone()


class _FrozenGraph(decode._Graph):
    """The frozen draft's graph: a capture records the backend's metadata (the views the
    graph reads); a replay hands back the draft's output."""

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        worker = self.runner.frozen_kv_mtp_worker
        return _draft_output(
            shape_key.size, worker.speculative_num_steps, worker.speculative_num_draft_tokens
        )


class _FrozenEngine:
    """One Frozen-KV MTP engine: the target's request rows and pool
    (``runner_step._Engine``, no decode graph runner), the draft model runner over
    them with its backend, the worker and its graph runner, built with the engine."""

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.config, self.device = config, device
        self.num_steps = config.num_spec
        self.captures: list[StepBuild] = []
        self.engine = decode._Engine(config, device, graphs=False)
        self.runner = self.engine.runner
        self.backend = self.engine.backend  # topk 1: the draft model runner's own
        self.runner.is_draft_worker = True
        self.runner.model_config.is_draft_model = True
        self.runner.spec_algorithm = SpeculativeAlgorithm.FROZEN_KV_MTP
        # FrozenKVMTPDraftWorker._recurrent_hidden_size: the assistant's backbone width.
        self.runner.model.backbone_hidden_size = self.runner.model_config.hidden_size
        with FrozenLife.server_args(config, self.engine.ATTENTION_BACKEND):
            self.worker = self._worker()
            self.graph_runner: Any = self._graph_runner() if graphs else None

    def _worker(self) -> Any:
        """A ``FrozenKVMTPDraftWorker`` whose ``__init__`` (model loading, pools) is not
        run: the attributes its metadata methods and the graph runner read."""
        from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPContext
        from sglang.srt.speculative.frozen_kv_mtp_worker_v2 import FrozenKVMTPDraftWorker

        worker = object.__new__(FrozenKVMTPDraftWorker)
        worker._model_runner = self.runner
        worker.draft_attn_backend = self.backend
        worker.topk = FROZEN_TOPK
        worker.speculative_num_steps = self.num_steps
        worker.speculative_num_draft_tokens = self.config.next_n
        # The target's pool, which the draft reads (FrozenKVMTPDraftWorker._bind_kv_context).
        worker.kv_context = FrozenKVMTPContext(
            target_token_to_kv_pool=self.runner.token_to_kv_pool, physical_layer_ids={0: 0}
        )
        steps, tokens = self.num_steps, self.config.next_n
        worker.draft_forward = lambda fb: _draft_output(fb.batch_size, steps, tokens)
        return worker

    def _graph_runner(self) -> Any:
        """``FrozenKVMTPCudaGraphRunner(worker)``: its buffers, and a capture of every
        capture batch size, each recorded as its graph would read it."""
        import importlib

        from sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner import (
            FrozenKVMTPCudaGraphRunner,
        )

        engine = self

        class _Recording(_FrozenGraph):
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                # The capture's batch of shape_key.size requests at the buffers' capture
                # values: no real rows.
                metadata = self.graphs[shape_key]
                engine.captures.append(
                    engine.build("capture", self.runner.buffers, shape_key.size, 0, 0, metadata)
                )

        module = importlib.import_module(_MODULE)
        # The capture's progress bar (tqdm, on rank 0) is not attnfuzz's output.
        with decode._no_cuda_graphs(_Recording, module), contextlib.redirect_stderr(io.StringIO()):
            return FrozenKVMTPCudaGraphRunner(self.worker)

    # -- the draft's ForwardBatch ---------------------------------------------------------------

    def draft_batch(self, inputs: RunnerStepInputs) -> Any:
        """The draft after the verify ``inputs``, as ``FrozenKVMTPDraftWorker.draft`` builds
        it: the committed prefix, the request's rows, its positions by SGLang's own
        ``set_frozen_kv_positions`` and ``expand_for_topk_draft``, no ``out_cache_loc``."""
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )
        from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput
        from sglang.srt.speculative.frozen_kv_mtp_utils import (
            expand_for_topk_draft,
            set_frozen_kv_positions,
        )

        dev, R = self.device, inputs.num_reqs
        rows = [self.engine.requests[i].row for i in inputs.req_ids]
        seq_lens = torch.tensor([c + 1 for c in inputs.num_computed_tokens], device=dev)
        hidden = self.runner.model_config.hidden_size
        # FrozenKVMTPDraftWorker._build_seed_draft_input: the bonus token and the target's
        # hidden state seed the draft; its topk fields are the seed iteration's.
        spec_info = FrozenKVMTPDraftInput(
            topk_p=torch.zeros((R, FROZEN_TOPK), dtype=torch.float32, device=dev),
            topk_index=torch.zeros((R, FROZEN_TOPK), dtype=torch.int64, device=dev),
            hidden_states=torch.zeros((R, hidden), dtype=torch.float32, device=dev),
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )
        spec_info.bonus_tokens = torch.zeros(R, dtype=torch.int64, device=dev)
        spec_info.num_tokens_per_req = FROZEN_TOPK
        spec_info.num_tokens_for_logprob_per_req = FROZEN_TOPK
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=R,
            input_ids=None,
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens.cpu(),
            seq_lens_sum=int(seq_lens.sum()),
            out_cache_loc=None,  # the frozen draft writes no KV
            positions=None,
            spec_algorithm=self.runner.spec_algorithm,
            spec_info=spec_info,
            capture_hidden_mode=CaptureHiddenMode.LAST,
        )
        set_frozen_kv_positions(fb, FROZEN_TOPK)
        expand_for_topk_draft(fb, FROZEN_TOPK)
        self.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    # -- builds ---------------------------------------------------------------------------------

    def build(
        self, how: str, inputs_of: Any, rows: int, num_reqs: int, num_tokens: int, metadata: Any
    ) -> StepBuild:
        """A build of ``rows`` draft rows (padding included) read from ``inputs_of``
        (a ForwardBatch or the runner's buffers) and the backend's ``metadata``, copied now."""
        acc = self.engine.accepts()
        out = [
            Field("seq_lens", "requests", decode.host(inputs_of.seq_lens[:rows]), acc["seq_lens"]),
            Field(
                "positions", "requests", decode.host(inputs_of.positions[:rows]), acc["positions"]
            ),
        ]
        if how != "fresh":  # a new engine's rows are its own: history picks them
            pool_rows = decode.host(inputs_of.req_pool_indices[:rows])
            out.append(Field("req_pool_indices", "requests", pool_rows, acc["req_pool_indices"]))
        fields = tuple(out) + self.engine.metadata_fields(rows, rows, metadata)
        fields += self.engine.kv_fields(fields, metadata)
        return StepBuild(how, num_reqs, num_tokens, fields, where=_WHERE[how])

    def eager(self, inputs: RunnerStepInputs, how: str = "eager") -> StepBuild:
        """``FrozenKVMTPDraftWorker._init_frozen_kv_metadata`` of the draft, no graph: what
        ``draft_forward`` builds before its seed iteration."""
        fb = self.draft_batch(inputs)
        self.worker._init_frozen_kv_metadata(fb)
        metadata = self.backend.forward_metadata
        return self.build(how, fb, inputs.num_reqs, inputs.num_reqs, inputs.num_tokens, metadata)


_WHERE = {
    "eager": "frozen_kv_mtp_worker_v2.py:FrozenKVMTPDraftWorker._init_frozen_kv_metadata",
    "fresh": "frozen_kv_mtp_worker_v2.py:FrozenKVMTPDraftWorker._init_frozen_kv_metadata "
    "(a new engine)",
    "padded": "frozen_kv_mtp_cuda_graph_runner.py:FrozenKVMTPCudaGraphRunner.execute (buffers, "
    "backend's)",
    "replay": "frozen_kv_mtp_cuda_graph_runner.py:FrozenKVMTPCudaGraphRunner.execute (what the "
    "graph captured)",
    "capture": "frozen_kv_mtp_cuda_graph_runner.py:FrozenKVMTPCudaGraphRunner.capture_one_shape",
}


class FrozenLife(DraftLife):
    """SGLang's Frozen-KV MTP draft across the steps of one engine: called with each
    scheduler output of the target. A verify is followed by the draft of the next
    round; any other step is the target's, eagerly (``sglang``'s builds): as
    ``sglang-eagle-draft``'s life, over the frozen draft's engine and graph runner."""

    @staticmethod
    def server_args(config: EngineConfig, attention_backend: str) -> Any:
        return decode._server_args(config, attention_backend, algorithm="FROZEN_KV_MTP")

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> Any:
        return _FrozenEngine(config, device, graphs=graphs)

    def graph_read(self, engine: _FrozenEngine) -> list[Any]:
        return [engine.backend]

    def graph_builds(
        self, engine: _FrozenEngine, inputs: RunnerStepInputs, mode: str
    ) -> list[StepBuild]:
        graphs = engine.graph_runner
        if mode != "verify" or graphs is None:
            return []
        fb = engine.draft_batch(inputs)
        if not graphs.can_run_graph(fb):
            return []
        graphs.execute(fb)  # padding, buffers, the worker's replay metadata
        R, T, bs = inputs.num_reqs, inputs.num_tokens, graphs.bs
        persistent = engine.engine.persistent_metadata("decode")
        baked = graphs.backend.graphs[graphs._make_graph_key(bs)]
        return [
            engine.build("padded", graphs.buffers, bs, R, T, persistent),
            engine.build("replay", graphs.buffers, bs, R, T, baked),
        ]


ENGINE = FrozenLife()
"""The engine of the implementation ``sglang-frozen-kv-mtp`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-frozen-kv-mtp`` of ``runner-step``: the step's draft on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
