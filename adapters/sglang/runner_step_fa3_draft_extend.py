"""SGLang's EAGLE draft-extend graph runner on the FlashAttention 3 backend, as the
implementation ``sglang-fa3-eagle-draft-extend`` of ``runner-step``.

The draft extend of :mod:`~attnfuzz.adapters.sglang.runner_step_draft_extend`
(``sglang-eagle-draft-extend``: its driver, batch, worker and graph stand-ins, the
draft extend over each verify's window, the draft model's extend after any other
step), on the engine started with ``--attention-backend fa3``: the draft model's
backend is ``FlashAttentionBackend(draft_model_runner, skip_prefill=False)``
(``speculative/draft_utils.py:DraftBackendFactory._create_fa3_prefill_backend``).
What runs besides (SGLang 0.5.23, ``layers/attention/flashattention_backend.py:
FlashAttentionBackend``): ``init_forward_metadata`` of a ``DRAFT_EXTEND_V2`` batch
(``cache_seqlens`` the post-write length, ``cu_seqlens_q`` from the window,
``max_seq_len_q``); ``init_cuda_graph_state``'s ``draft_extend_metadata``; the
capture (``_init_full_cg_decode_metadata``, ``_bind_metadata_buffers``' draft-extend
views, the baked ``max_seq_len_q``) and the replay (``_apply_cuda_graph_metadata``'s
draft-extend branch: ``cu_seqlens_q`` from the window, the page table from the
``strided_indices`` of ``max_context_len``).

Stand-ins: those of ``sglang-eagle-draft-extend`` and of ``sglang-fa3``
(``sgl_kernel.flash_attn`` where it does not import).

Fields: ``sglang-fa3``'s (the runner's ``seq_lens``, ``req_pool_indices``,
``out_cache_loc``, ``positions``; ``cache_seqlens_int32``, ``page_table``,
``cu_seqlens_q``, ``cu_seqlens_k``; ``kv_len``, ``kv_slots``).

The graph's body (``run_once``) runs at capture and at each replay
(:class:`_InGraphExtendGraph`), so the
replay's metadata is what the in-graph preparation
(``init_forward_metadata_in_graph``: ``kernels/ops/attention/metadata.py:
draft_extend_set_metadata``, a Triton kernel) writes after the out-of-graph one, as on
a GPU.

Mutant: ``sglang-fa3-eagle-draft-extend-window-forgotten`` (the in-graph preparation's
``cu_seqlens_q`` of one token a request, the window's ``num_tokens_per_req``
forgotten): padding invariance and replay equals eager on a replayed draft extend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from attnfuzz.adapters.sglang import fa3_backend
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_draft_extend as extend
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

_WHERE = {
    "eager": "flashattention_backend.py:FlashAttentionBackend.init_forward_metadata "
    "(DRAFT_EXTEND_V2)",
    "fresh": "flashattention_backend.py:FlashAttentionBackend.init_forward_metadata "
    "(DRAFT_EXTEND_V2, a new engine)",
    "padded": "eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner.execute "
    "(buffers; FlashAttentionBackend._apply_cuda_graph_metadata's forward_metadata)",
    "replay": "eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner.execute "
    "(what the graph reads: FlashAttentionBackend._bind_metadata_buffers' views)",
    "capture": "eagle_draft_extend_cuda_graph_runner.py:EAGLEDraftExtendCudaGraphRunner."
    "capture_one_shape (FlashAttentionBackend._init_full_cg_decode_metadata, in_capture)",
}


def prepare() -> None:
    extend.prepare()
    fa3.prepare()


def declines(case: Case) -> str | None:
    """Why SGLang runs no EAGLE draft extend for ``case``'s config (``sglang-eagle-draft-
    extend``'s reasons), else None."""
    return extend.declines(case)


def _at(build: StepBuild) -> StepBuild:
    return dataclasses.replace(build, where=_WHERE[build.how])


class _InGraphExtendGraph(extend._ExtendGraph):
    """The draft-extend graph whose body runs at capture and replay: FA3 writes the draft
    extend's metadata in the graph (``init_forward_metadata_in_graph``)."""

    RUNS_BODY = True


class FA3ExtendEngine(extend._ExtendEngine):
    """One EAGLE engine's draft extend on FlashAttention 3: the target's rows on an
    :class:`~attnfuzz.adapters.sglang.runner_step_fa3.FA3Engine` whose backend is the
    draft model's ``FlashAttentionBackend``, and the draft-extend graph runner."""

    GRAPH = _InGraphExtendGraph

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        self.config, self.device = config, device
        self.captures: list[StepBuild] = []
        self.engine = fa3.FA3Engine(config, device, graphs=False)
        self.runner = self.engine.runner
        self.runner.is_draft_worker = True
        self.runner.model_config.is_draft_model = True
        self.runner.model_config.spec_hidden_size = self.runner.model_config.hidden_size
        self.runner.model_config.model_is_mrope = False  # a text model's positions
        self.runner.model = extend.draft_model()
        with decode._server_args(config, "fa3"), fa3_backend.flash_attn_module():
            # DraftBackendFactory._create_fa3_prefill_backend: the draft extend's.
            self.backend = self.make_backend()
        with decode._server_args(config, "fa3"):
            self.runner.attn_backend = self.backend
            self.engine.backend = self.backend  # the draft model's extend, after an extend
            self.graph_runner: Any = self._graph_runner() if graphs else None
        self.captures = [_at(b) for b in self.captures]

    def make_backend(self) -> Any:
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

        return FlashAttentionBackend(self.runner, skip_prefill=False)

    def eager(self, inputs: RunnerStepInputs, how: str = "eager") -> StepBuild:
        return _at(super().eager(inputs, how))


class FA3DraftExtendLife(extend.DraftExtendLife):
    """The draft extend of ``sglang-fa3-eagle-draft-extend`` across one engine's steps."""

    engine_class: type[FA3ExtendEngine] = FA3ExtendEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> FA3ExtendEngine:
        return self.engine_class(config, device, graphs=graphs)

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return decode._server_args(config, "fa3")

    def persistent(self, engine: FA3ExtendEngine) -> Any:
        """The FA3 backend's ``forward_metadata``, its graph buffers after a replay's
        preparation."""
        return engine.backend.forward_metadata

    @staticmethod
    def at(build: StepBuild) -> StepBuild:
        return _at(build)


ENGINE = FA3DraftExtendLife()
"""The engine of the implementation ``sglang-fa3-eagle-draft-extend`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3-eagle-draft-extend`` of ``runner-step``: the step's
    draft extend on :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant: the replay's query window forgotten --------------------------------------------


class _WindowForgotten(FA3ExtendEngine):
    """The replay's ``cu_seqlens_q`` of one token a request: the graph's in-graph
    draft-extend metadata (``init_forward_metadata_in_graph``'s ``draft_extend_set_metadata``,
    which writes last at every replay) taking the accepted tokens' length (1) for the fixed
    window of ``num_tokens_per_req``."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        in_graph = backend.init_forward_metadata_in_graph

        def one_a_request(forward_batch: Any) -> None:
            in_graph(forward_batch)
            if forward_batch.forward_mode.is_draft_extend_v2():
                q = backend.draft_extend_metadata[forward_batch.batch_size].cu_seqlens_q
                q[1:].copy_(torch.arange(1, q.numel(), dtype=q.dtype))

        backend.init_forward_metadata_in_graph = one_a_request
        return backend


class _MutantLife(FA3DraftExtendLife):
    engine_class = _WindowForgotten


WINDOW_FORGOTTEN = _MutantLife()


def run_window_forgotten(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-fa3-eagle-draft-extend-window-forgotten``."""
    return WINDOW_FORGOTTEN(inputs)


run_window_forgotten.new_engine = WINDOW_FORGOTTEN.new_engine  # type: ignore[attr-defined]


def reach_draft_extend_replay(trace: Trace | Case) -> bool:
    """A draft extend the draft-extend graph replays: after a replayed verify."""
    return decode.reach_verify_replay(trace)


def smallest_window_forgotten() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 and the draft extend over
    it, in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8, block_size=1,
                          num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)
