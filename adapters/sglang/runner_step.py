"""SGLang's decode graph runner step on the Triton attention backend, as the
implementation ``sglang`` of ``runner-step``.

What runs, unchanged (SGLang 0.5.23):

- ``model_executor/runner/decode_cuda_graph_runner.py``: ``DecodeCudaGraphRunner``
  whole: ``__init__`` (its capture sizes from ``base_cuda_graph_runner.py``'s
  ``get_batch_sizes_to_capture``, its buffers ``DecodeInputBuffers.create`` and
  ``build_decode_registry``, the backend's ``init_cuda_graph_state``), ``capture``
  (``_capture``, ``_capture_one_stream``, ``capture_one_shape``, ``capture_prepare``:
  the backend's ``init_forward_metadata_out_graph(in_capture=True)`` for every
  capture batch size), ``can_run_graph``, and ``load_batch`` (``_pad_to_bucket``,
  ``CudaGraphBufferRegistry.fill_from``, ``_init_replay_attn_metadata``,
  ``_init_replay_attn_metadata_from_view``, ``build_replay_fb_view``, the backend's
  replay ``init_forward_metadata_out_graph``), called by ``execute``;
- ``layers/attention/triton_backend.py``: ``TritonAttnBackend``, its eager
  ``init_forward_metadata`` and its graph preparation, over SGLang's
  ``KVIndexTranslator`` (``mem_cache/kv_index_translator.py``);
- ``mem_cache/memory_pool.py``: ``ReqToTokenPool``, the engine's request rows
  (``alloc_rows``, ``free_rows``), kept across the steps of one engine;
- ``model_executor/forward_batch_info.py``: ``ForwardBatch``, and for a verify
  step ``speculative/eagle_info.py``'s ``EagleVerifyInput``.

Stand-ins: the model runner (the objects the runner and backend read), a KV
pool of the right size whose buffers are never read, a model whose forward is
never called, and the graph: ``resolve_decode_backend``'s backend is
:class:`_Graph`, whose ``capture_one`` records the tensors the graph would read
(the backend's metadata at capture; the Triton backend has no in-graph
metadata step) and whose ``replay`` does nothing, and the capture stream
(``graph_capture``, ``get_or_create_global_graph_capture_stream``) is none:
there is no CUDA. Those names of ``decode_cuda_graph_runner`` are replaced while
the runner is built, and restored after; the tensor-parallel group is a group
of one (``patch_model`` is handed it, to compile).

A step is a decode or a target verify only when every request runs on (none new
to the engine: SGLang prefills a new request first) with one token each, or its
token and drafts (``next_n``): the batches the decode runner serves. Any other
step is an extend, never replayed in the decode graph: its eager Triton
metadata is built (``ForwardMode.EXTEND``), no graph build.

Builds: ``capture`` (each capture batch size's inputs and metadata, snapshot at
capture, no real rows: with the engine's first step), ``eager``
(``init_forward_metadata`` of the step, no graph), ``padded`` (the runner's input
buffers after ``load_batch``, and the backend's persistent buffers after its
replay preparation), ``replay`` (the same buffers through the tensors the graph
of that batch size captured), ``fresh`` (the eager step on a new engine holding
only the step's requests; without ``req_pool_indices``, a row history picks).

Fields: ``seq_lens``, ``req_pool_indices``, ``kv_indices`` (a table: row ``i``
holds ``kv_indices[kv_indptr[i]:kv_indptr[i + 1]]``, what the kernels read) by
request; ``out_cache_loc`` and ``positions`` by token; ``kv_indptr`` and
``qo_indptr`` (verify and extend) as offsets. Each with the range its consumer
accepts (:meth:`_Engine.accepts`). And what every backend states alike, each
derived from its own fields as its kernels read them (:meth:`_Engine.kv_read`):
``kv_len`` (the keys a request's attention reads) and ``kv_slots`` (the KV slot of
each, a row's first ``kv_len`` read), by request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import attnfuzz.kernels._triton  # noqa: F401  (TRITON_INTERPRET before SGLang is imported)
import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang.triton_backend import HEAD_DIM, _KVPool
from attnfuzz.adapters.standins import no_collections
from attnfuzz.reference.batch import Batch, Case, EngineConfig, cdiv
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    make_inputs,
)
from attnfuzz.reference.trace import Trace, as_trace

EXTRA_CONTEXT = 4
"""``kv_cache_configurator.py``: ``extra_max_context_len = 4`` (+ the draft tokens):
the request-to-token table's columns past the model's context."""


def prepare() -> None:
    """Import SGLang's runner and backend before a judge forks its child."""
    _engine.prepare()
    from sglang.srt.layers.attention import triton_backend  # noqa: F401
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner  # noqa: F401


# -- the graph stand-in -------------------------------------------------------------------------


class _Graph:
    """The decode runner's graph backend, where there is no CUDA: a capture records
    what the graph would read (the backend's metadata, built by the capture's
    ``init_forward_metadata_out_graph``); a replay does nothing. The model's forward
    (``run_once``) is never called."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.graphs: dict[Any, Any] = {}  # shape key -> the metadata the graph reads

    @contextlib.contextmanager
    def capture_session(self, stream: Any) -> Iterator[None]:
        yield

    def capture_one(
        self,
        shape_key: Any,
        forward_fn: Any,
        capture_inputs: Any = None,
        post_warmup_hook: Any = None,
    ) -> None:
        self.graphs[shape_key] = self.runner.attn_backend.forward_metadata

    def can_run(self, forward_batch: Any, shape_key: Any) -> bool:
        return shape_key in self.graphs

    @contextlib.contextmanager
    def replay_session(self) -> Iterator[None]:
        yield

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        """The graph's output, unwritten: the runner's logits buffer, as the graph hands it."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        return LogitsProcessorOutput(next_token_logits=self.runner.buffers.next_token_logits_buffer)

    def cleanup(self) -> None:
        self.graphs.clear()


@contextlib.contextmanager
def _no_cuda_graphs(graph: type[_Graph], also: Any = None) -> Iterator[None]:
    """While the runner is built: its graph backend is :class:`_Graph`, its capture
    stream none (``decode_cuda_graph_runner``'s own names, restored after); ``also``:
    a draft runner's module, whose own name ``resolve_decode_backend`` is the graph
    backend too. The capture's garbage collections are none
    (:func:`..standins.no_collections`)."""
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as module

    if also is not None:
        with mock.patch.object(also, "resolve_decode_backend", graph), _no_cuda_graphs(graph):
            yield
        return

    saved = {
        name: getattr(module, name)
        for name in (
            "resolve_decode_backend",
            "graph_capture",
            "get_or_create_global_graph_capture_stream",
        )
    }

    @contextlib.contextmanager
    def graph_capture(stream: Any = None) -> Iterator[Any]:
        yield _engine.StandIn(stream=stream)

    module.resolve_decode_backend = graph
    module.graph_capture = graph_capture
    module.get_or_create_global_graph_capture_stream = lambda: None
    # torch_compile_decoration.patch_model is handed the tensor-parallel group (it
    # reads it only to compile): the group of one process, never built here.
    group = _engine.StandIn(ca_comm=None, world_size=1, rank_in_group=0)
    try:
        with module.get_parallel().override(tp_group=group), no_collections():
            yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# -- the engine's objects -----------------------------------------------------------------------


def pool_pages(config: EngineConfig) -> int:
    """Pages of the KV pool: every page a case may hand a request (a step on its own
    draws ``sum(pages) + 2`` ids from 0; a trace's scheduler at most one per page its
    running requests hold), with SGLang's padding page beside them."""
    return config.max_num_seqs * cdiv(config.max_model_len, config.block_size) + 3


def _server_args(
    config: EngineConfig,
    attention_backend: str = "triton",
    eagle_topk: int = 1,
    algorithm: str = "EAGLE",
    **extra: Any,
) -> Any:
    from sglang.srt.model_executor.cuda_graph_config import default_cuda_graph_config

    w = config.next_n
    graphs = default_cuda_graph_config()
    # The case's capture sizes are tokens; SGLang's decode graphs are keyed by requests.
    graphs.decode.bs = sorted({s // w for s in config.cudagraph_capture_sizes if s >= w} or {1})
    spec = {}
    if config.num_spec:
        spec = dict(
            speculative_algorithm=algorithm,
            speculative_num_draft_tokens=w,
            speculative_num_steps=config.num_spec,
            speculative_eagle_topk=eagle_topk,
        )
    return _engine.server_args(
        attention_backend=attention_backend,
        cuda_graph_config=graphs,
        page_size=config.block_size,
        max_running_requests=config.max_num_seqs,
        **spec,
        **extra,
    )


def _model_runner(config: EngineConfig, device: torch.device, args: Any) -> Any:
    """A stand-in ``ModelRunner``: SGLang's request-to-token pool and translator,
    a small MHA model whose forward is never called."""
    from sglang.srt.configs.model_config import AttentionArch
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from transformers import LlamaConfig

    w = config.next_n
    width = config.max_model_len + EXTRA_CONTEXT + (w if config.num_spec else 0)
    pool = ReqToTokenPool(
        size=config.max_num_seqs,
        max_context_len=width,
        device=str(device),
        enable_memory_saver=False,
    )
    kv_pool = _KVPool()
    kv_pool.size = pool_pages(config) * config.block_size  # type: ignore[attr-defined]
    hf_config = LlamaConfig(
        num_attention_heads=2, num_key_value_heads=1, hidden_size=2 * HEAD_DIM, num_hidden_layers=1
    )
    model_config = _engine.StandIn(
        attention_arch=AttentionArch.MHA,
        hf_config=hf_config,
        hf_text_config=hf_config,
        context_len=config.max_model_len,
        head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        swa_v_head_dim=HEAD_DIM,
        hidden_size=2 * HEAD_DIM,
        vocab_size=1,
        dtype=torch.float32,
        is_encoder_decoder=False,
        is_draft_model=False,
        num_attention_heads=2,
        linear_attn_registry_result=None,
        get_max_num_attention_heads=lambda: 2,
        get_num_kv_heads=lambda tp_size, dcp_size=1: 1,
    )
    translator = KVIndexTranslator(
        req_to_token=pool.req_to_token,
        token_to_kv_pool_allocator=None,
        token_to_kv_pool=kv_pool,
        page_size=config.block_size,
        device=str(device),
    )
    algorithm = SpeculativeAlgorithm.EAGLE if config.num_spec else SpeculativeAlgorithm.NONE
    return _engine.StandIn(
        req_to_token_pool=pool,
        token_to_kv_pool=kv_pool,
        token_to_kv_pool_allocator=None,
        kv_index_translator=translator,
        sliding_window_size=None,
        page_size=config.block_size,
        model_config=model_config,
        decode_num_tokens_per_req=lambda num_draft_tokens=None: w,
        is_draft_worker=False,
        spec_algorithm=algorithm,
        device=str(device),
        gpu_id=0,
        dtype=torch.float32,
        kv_cache_dtype=torch.float32,
        server_args=args,
        hybrid_gdn_config=None,
        kimi_linear_config=None,
        linear_attn_model_spec=None,
        lora_manager=None,
        ngram_embedding_manager=_engine.StandIn(enabled=False),
        hisparse_coordinator=None,
        device_timer=None,
        canary_manager=None,
        capture_head_hooks=[],
        capture_tail_hooks=[],
        model=_engine.StandIn(shared_experts_config=None, forward=_never_called),
        graph_shared_output=_engine.StandIn(
            get_logits_buffer=lambda vocab_size, rows: torch.zeros((rows, vocab_size))
        ),
        attn_tp_sequence_sharded=lambda num_tokens: False,
        get_pp_proxy_topk_size=lambda: None,
        get_pp_proxy_residual_num_blocks=lambda: None,
        get_pp_proxy_dspark_hidden_size=lambda: None,
        get_aux_hidden_states_width=lambda: None,
    )


def _never_called(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("attnfuzz's stand-in model: the graph stand-in never runs a forward")


KV_LORA_RANK, QK_ROPE_HEAD_DIM, QK_NOPE_HEAD_DIM = 32, 8, 16
"""The dimensions of :func:`mla_profile`'s model: MLA plans are handed them, no metadata
value depends on them."""


def mla_profile(runner: Any) -> None:
    """The stand-in ``runner`` (:func:`_model_runner`) as one of a DeepSeek MLA model, what an
    MLA backend reads of it at construction: ``use_mla_backend``, the model config's
    attention architecture, its latent and rope/nope head dimensions and softmax scale."""
    from sglang.srt.configs.model_config import AttentionArch

    runner.use_mla_backend = True
    model = runner.model_config
    model.attention_arch = AttentionArch.MLA
    model.kv_lora_rank, model.qk_rope_head_dim = KV_LORA_RANK, QK_ROPE_HEAD_DIM
    model.qk_nope_head_dim = QK_NOPE_HEAD_DIM
    model.scaling = (QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM) ** -0.5


# -- one engine ---------------------------------------------------------------------------------


def host(t: torch.Tensor) -> np.ndarray:
    """``t`` as int64 on the host: a copy (the buffers change on the next step)."""
    return t.detach().cpu().numpy().astype(np.int64)


_WHERE = {
    "eager": "triton_backend.py:TritonAttnBackend.init_forward_metadata",
    "fresh": "triton_backend.py:TritonAttnBackend.init_forward_metadata (a new engine)",
    "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers, backend's)",
    "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (what the graph reads)",
    "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape",
}
"""Where each build of :class:`_Engine` is made (``how``), for the message."""


@dataclass
class _Request:
    row: int  # its row of the request-to-token table (ReqToTokenPool.alloc_rows)
    pages: list[int] = field(default_factory=list)


class _Engine:
    """One SGLang engine: the model runner's pools and backend, its decode graph runner
    (``graphs``: built with the engine, as ``ModelRunner.init_device_graphs`` builds it),
    and the running requests' rows and pages. A subclass names another attention
    backend (:attr:`ATTENTION_BACKEND`, :meth:`make_backend`) and reads its metadata
    (:meth:`metadata_fields`, :meth:`persistent_metadata`)."""

    ATTENTION_BACKEND = "triton"
    """``--attention-backend``: the server argument the engine runs with."""
    WHERE = _WHERE
    """The engine function that made each build (``how``), for the message."""
    GRAPH: type[_Graph] = _Graph
    """The graph stand-in the decode graph runner captures into and replays."""
    EAGLE_TOPK = 1
    """``--speculative-eagle-topk`` of a speculative engine: 1, the chain draft."""
    SERVER_ARGS: dict[str, Any] = {}
    """Further server arguments the engine is started with (e.g. a prefill backend)."""

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        self.config, self.device = config, device
        self.requests: dict[int, _Request] = {}
        self.captures: list[StepBuild] = []
        with _server_args(
            config, self.ATTENTION_BACKEND, self.EAGLE_TOPK, **self.SERVER_ARGS
        ) as args:
            self.runner = _model_runner(config, device, args)
            self.backend = self.make_backend()
            self.runner.attn_backend = self.backend
            self.graph_runner: Any = None
            if graphs:
                self.graph_runner = self._graph_runner()

    def make_backend(self) -> Any:
        """The model runner's attention backend: ``TritonAttnBackend(model_runner)``."""
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(self.runner)

    def persistent_metadata(self, mode: str) -> Any:
        """The backend's persistent buffers after the runner's replay preparation."""
        backend = self.backend
        return _engine.StandIn(
            kv_indptr=backend.kv_indptr,
            kv_indices=backend.cuda_graph_kv_indices,
            qo_indptr=backend.qo_indptr if mode == "verify" else None,
        )

    def _graph_runner(self) -> Any:
        """``DecodeCudaGraphRunner(model_runner)``: its buffers, and a capture of every
        capture batch size, each read by :class:`_Graph` as the graph would read it."""
        import io

        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
            DecodeCudaGraphRunner,
        )

        engine = self

        class _Recording(self.GRAPH):  # type: ignore[name-defined,misc]
            def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
                super().capture_one(shape_key, *args, **kwargs)
                # The capture's batch of shape_key.size requests, at the buffers' capture
                # values: no real rows.
                build = engine._graph_build(
                    "capture", self.runner, shape_key.size, 0, 0, self.graphs[shape_key]
                )
                engine.captures.append(build)

        # The capture's progress bar (tqdm, on tensor-parallel rank 0) is not attnfuzz's output.
        with _no_cuda_graphs(_Recording), contextlib.redirect_stderr(io.StringIO()):
            return DecodeCudaGraphRunner(self.runner)

    # -- the scheduler output -------------------------------------------------------------------

    def admit(self, inputs: RunnerStepInputs) -> None:
        """The requests of the step: those gone free their rows, new ones take one
        (``ReqToTokenPool.free_rows`` / ``alloc_rows``), each appends its new pages."""
        pool = self.runner.req_to_token_pool
        staying = {i for i, new in zip(inputs.req_ids, inputs.is_new, strict=True) if not new}
        for i in [i for i in self.requests if i not in staying]:
            pool.free_rows([self.requests.pop(i).row])
        for i, new, gained in zip(inputs.req_ids, inputs.is_new, inputs.new_block_ids, strict=True):
            if new:
                (row,) = pool.alloc_rows(1)
                self.requests[i] = _Request(row)
            self.requests[i].pages += list(gained)

    def slots(self, req_id: int, start: int, stop: int) -> list[int]:
        bs, pages = self.config.block_size, self.requests[req_id].pages
        return [pages[p // bs] * bs + p % bs for p in range(start, stop)]

    def write_rows(self, inputs: RunnerStepInputs) -> None:
        """The request-to-token rows the step reads: a new request's whole prefix (a
        prefix it matched, as the radix cache hands it), and every request's new tokens
        (the step's ``out_cache_loc``, as ``ScheduleBatch.prepare_for_decode`` writes it)."""
        table = self.runner.req_to_token_pool.req_to_token
        for i, new, computed, q in zip(
            inputs.req_ids,
            inputs.is_new,
            inputs.num_computed_tokens,
            inputs.query_lens,
            strict=True,
        ):
            start = 0 if new else computed
            row = self.requests[i].row
            table[row, start : computed + q] = torch.tensor(
                self.slots(i, start, computed + q), dtype=torch.int32
            )

    # -- the step's ForwardBatch ----------------------------------------------------------------

    def forward_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )

        dev = self.device
        R, T = inputs.num_reqs, inputs.num_tokens
        rows = [self.requests[i].row for i in inputs.req_ids]
        computed, q_lens = list(inputs.num_computed_tokens), list(inputs.query_lens)
        positions = [p for c, q in zip(computed, q_lens, strict=True) for p in range(c, c + q)]
        out_cache_loc = [
            s
            for i, c, q in zip(inputs.req_ids, computed, q_lens, strict=True)
            for s in self.slots(i, c, c + q)
        ]
        # A decode's seq_lens hold its new token; a verify's the committed prefix
        # (eagle_info.py: EagleVerifyInput.prepare_for_verify keeps batch.seq_lens).
        seq_lens = (
            [c + q for c, q in zip(computed, q_lens, strict=True)] if mode != "verify" else computed
        )
        seq = torch.tensor(seq_lens, dtype=torch.int64, device=dev)
        common = dict(
            batch_size=R,
            input_ids=torch.zeros(T, dtype=torch.int64, device=dev),
            req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=dev),
            seq_lens=seq,
            seq_lens_cpu=seq.cpu(),
            seq_lens_sum=int(sum(seq_lens)),
            out_cache_loc=torch.tensor(out_cache_loc, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
        )
        if mode == "decode":
            fb = ForwardBatch(
                forward_mode=ForwardMode.DECODE,
                capture_hidden_mode=CaptureHiddenMode.NULL,
                **common,
            )
        elif mode == "verify":
            spec_info = self._verify_input(seq)
            fb = ForwardBatch(
                forward_mode=ForwardMode.TARGET_VERIFY,
                spec_info=spec_info,
                capture_hidden_mode=spec_info.capture_hidden_mode,
                **common,
            )
        else:
            fb = ForwardBatch(
                forward_mode=ForwardMode.EXTEND,
                extend_num_tokens=T,
                extend_seq_lens=torch.tensor(q_lens, dtype=torch.int32, device=dev),
                extend_prefix_lens=torch.tensor(computed, dtype=torch.int32, device=dev),
                extend_start_loc=torch.tensor(
                    np.cumsum([0] + q_lens[:-1]), dtype=torch.int32, device=dev
                ),
                extend_seq_lens_cpu=q_lens,
                extend_prefix_lens_cpu=computed,
                **common,
            )
        self.runner.kv_index_translator.bind_own_plan(fb)
        return fb

    def _verify_input(self, seq_lens: torch.Tensor) -> Any:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        N = self.config.next_n
        mask = torch.ones(int((N * (seq_lens + N)).sum()), dtype=torch.bool, device=self.device)
        return EagleVerifyInput(
            draft_token=None,
            custom_mask=mask,
            positions=None,
            retrieve_index=None,
            retrieve_next_token=None,
            retrieve_next_sibling=None,
            retrieve_cum_len=None,
            spec_steps=self.config.num_spec,
            topk=1,
            draft_token_num=N,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=int(seq_lens.sum()),
            seq_lens_cpu=seq_lens.cpu(),
        )

    # -- builds ---------------------------------------------------------------------------------

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code."""
        table = self.runner.req_to_token_pool.req_to_token
        kv_rows = self.runner.token_to_kv_pool.size + self.config.block_size
        fill = self.seq_len_fill()
        return {
            # KVIndexTranslator.pack_read_stream (triton_backend.py:_fill_kv_indptr_and_indices)
            # reads req_to_token[req_pool_indices[i], :seq_lens[i]]: a row of the table...
            "req_pool_indices": (0, table.shape[0] - 1),
            # ...and a length at least the padding fill (decode_cuda_graph_runner.py:
            # seq_len_fill_value, get_cuda_graph_seq_len_fill_value) and at most its width.
            "seq_lens": (fill, table.shape[1]),
            # The KV write (triton_backend.py:_set_kv_buffer, set_kv_buffer) and the decode
            # and extend kernels (decode_attention.py, extend_attention.py: k_buffer[kv_indices])
            # index the pool's rows: size + page_size (the padding page 0 included).
            "out_cache_loc": (0, kv_rows - 1),
            "kv_indices": (0, kv_rows - 1),
            # RotaryEmbedding.forward reads cos_sin_cache[positions]: the model's context.
            "positions": (0, self.config.max_model_len - 1),
        }

    def seq_len_fill(self) -> int:
        """The least ``seq_lens`` entry the backend's kernels are handed: the graph
        runner's padding fill (``get_cuda_graph_seq_len_fill_value``)."""
        return self.backend.get_cuda_graph_seq_len_fill_value()

    def _fields(
        self, rows: int, tokens: int, inputs_of: dict[str, torch.Tensor], metadata: Any
    ) -> tuple[Field, ...]:
        """The fields of a build of ``rows`` requests and ``tokens`` tokens (padding
        included), copied now: the step's inputs, and the backend's ``metadata``."""
        acc = self.accepts()
        out = [
            Field("seq_lens", "requests", host(inputs_of["seq_lens"][:rows]), acc["seq_lens"]),
            # The forward's KV write (set_kv_buffer) stores every token's key at its
            # out_cache_loc, padding tokens' included: no slot skips it.
            Field(
                "out_cache_loc",
                "tokens",
                host(inputs_of["out_cache_loc"][:tokens]),
                acc["out_cache_loc"],
                writes_kv=True,
            ),
            Field("positions", "tokens", host(inputs_of["positions"][:tokens]), acc["positions"]),
        ]
        if "req_pool_indices" in inputs_of:
            pool_rows = host(inputs_of["req_pool_indices"][:rows])
            out.append(Field("req_pool_indices", "requests", pool_rows, acc["req_pool_indices"]))
        fields = tuple(out) + self.metadata_fields(rows, tokens, metadata)
        return fields + self.kv_fields(fields, metadata)

    def kv_fields(self, fields: tuple[Field, ...], metadata: Any) -> tuple[Field, Field]:
        """``kv_len`` and ``kv_slots`` by request, derived from the build's own ``fields``
        (:meth:`kv_read`): what every backend states alike. No range: each is a function
        of fields whose ranges are judged. A row of slots is as wide as the
        request-to-token table (the furthest a request's KV reaches), in every build."""
        lengths, slots = self.kv_read({f.name: f.values for f in fields}, metadata)
        table = np.zeros((len(lengths), self.runner.req_to_token_pool.req_to_token.shape[1]),
                         dtype=np.int64)  # fmt: skip
        for r, row in enumerate(slots):
            row = row[: table.shape[1]]
            table[r, : len(row)] = row
        return (
            Field("kv_len", "requests", lengths),
            Field("kv_slots", "requests", table, row_lengths=lengths),
        )

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The fields of the Triton backend's ``metadata`` for ``rows`` requests and
        ``tokens`` tokens (padding included), copied now."""
        acc = self.accepts()
        indptr, flat = host(metadata.kv_indptr[: rows + 1]), host(metadata.kv_indices)
        # The decode and extend kernels read kv_indices[kv_indptr[i] : kv_indptr[i + 1]]
        # for row i: each row's entries, as a table (past a row's length 0, never read).
        spans = [flat[max(a, 0) : max(b, 0)] for a, b in zip(indptr, indptr[1:], strict=False)]
        table = np.zeros((rows, max((len(x) for x in spans), default=0)), dtype=np.int64)
        for r, entries in enumerate(spans):
            table[r, : len(entries)] = entries
        out = [
            # kv_indptr's entries bound the reads of kv_indices (the buffer handed on).
            Field("kv_indptr", "offsets", indptr, (0, flat.size)),
            Field("kv_indices", "requests", table, acc["kv_indices"]),
        ]
        if metadata.qo_indptr is not None:  # the extend kernel's query offsets
            qo = host(metadata.qo_indptr[: rows + 1])
            out.append(Field("qo_indptr", "offsets", qo, (0, tokens)))
        return tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as the Triton kernels read them:
        ``decode_attention.py:decode_attention_fwd`` the ``kv_indices[kv_indptr[i] :
        kv_indptr[i + 1]]`` of row ``i``; ``extend_attention.py:extend_attention_fwd``
        (a verify, an extend: ``qo_indptr``) those (the prefix), then the step's own keys
        ``k_extend[qo_indptr[i] : qo_indptr[i + 1]]`` (:func:`with_step_keys`)."""
        cached = np.diff(values["kv_indptr"])
        slots = [values["kv_indices"][r, : max(n, 0)] for r, n in enumerate(cached)]
        if "qo_indptr" not in values:
            return cached, slots
        return with_step_keys(cached, slots, values["qo_indptr"], values["out_cache_loc"])

    def _graph_build(
        self, how: str, graph_runner: Any, bs: int, num_reqs: int, num_tokens: int, metadata: Any
    ) -> StepBuild:
        """A build read from the runner's input buffers and ``metadata`` (copied now)."""
        b = graph_runner.buffers
        inputs_of = {
            "seq_lens": b.seq_lens,
            "req_pool_indices": b.req_pool_indices,
            "out_cache_loc": b.out_cache_loc,
            "positions": b.positions,
        }
        fields = self._fields(bs, bs * self.config.next_n, inputs_of, metadata)
        return StepBuild(how, num_reqs, num_tokens, fields, where=self.WHERE[how])

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        """``init_forward_metadata`` of the step's ForwardBatch, no graph (copied now)."""
        fb = self.forward_batch(inputs, mode)
        self.backend.init_forward_metadata(fb)
        metadata = self.eager_metadata(fb)
        inputs_of = {
            "seq_lens": fb.seq_lens,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        if how != "fresh":  # a new engine's rows are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        fields = self._fields(R, T, inputs_of, metadata)
        return StepBuild(how, R, T, fields, where=self.WHERE[how])

    def eager_metadata(self, forward_batch: Any) -> Any:
        """The metadata ``init_forward_metadata`` left for the forward's layers."""
        return self.backend.forward_metadata


def with_step_keys(
    cached: np.ndarray, slots: list[np.ndarray], qo_indptr: np.ndarray, out_cache_loc: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray]]:
    """A request's keys read from the KV cache (``cached`` of them, at ``slots``), then the
    step's own keys, which a kernel takes from the forward's ``k`` (its tokens
    ``qo_indptr[i] : qo_indptr[i + 1]``): the keys ``set_kv_buffer`` wrote, before the
    attention, at those tokens' ``out_cache_loc``."""
    own = [
        out_cache_loc[max(a, 0) : max(b, 0)]
        for a, b in zip(qo_indptr[:-1], qo_indptr[1:], strict=True)
    ]
    rows = [np.concatenate([s, o]) for s, o in zip(slots, own, strict=True)]
    return cached + np.diff(qo_indptr), rows


def page_slots(pages: np.ndarray, length: int, page_size: int) -> np.ndarray:
    """The KV slots of a request's first ``length`` keys on its row of ``pages`` (page
    ids): key ``j`` at ``pages[j // page_size] * page_size + j % page_size``, as far as
    the row reaches."""
    j = np.arange(max(0, min(int(length), pages.size * page_size)))
    return pages[j // page_size] * page_size + j % page_size


def step_mode(inputs: RunnerStepInputs) -> str:
    """What SGLang runs the step as. A request new to the engine (arrived, or resumed)
    is prefilled first (``Scheduler.get_new_batch_prefill``: ``ForwardMode.EXTEND``,
    a prefix it matched included), so only a step of running requests, each of a token
    (``decode``) or of its token and drafts (``verify``: ``next_n``), is a decode
    batch (``ScheduleBatch.prepare_for_decode``), which the decode graph runner serves;
    any other is an ``extend``, run eagerly."""
    config = inputs.config
    running = inputs.num_reqs and not any(inputs.is_new)
    if running and all(q == config.next_n for q in inputs.query_lens):
        return "verify" if config.num_spec else "decode"
    return "extend"


def arrived_anew(requests: dict[int, Any], inputs: RunnerStepInputs) -> RunnerStepInputs:
    """The step's requests as a new engine meets them: each arriving with every page it
    holds in ``requests`` (the engine's own, by request id)."""
    return RunnerStepInputs(
        config=inputs.config,
        req_ids=inputs.req_ids,
        is_new=(True,) * inputs.num_reqs,
        num_computed_tokens=inputs.num_computed_tokens,
        query_lens=inputs.query_lens,
        new_block_ids=tuple(tuple(requests[i].pages) for i in inputs.req_ids),
        device=inputs.device,
    )


@contextlib.contextmanager
def _as_left(*backends: Any) -> Iterator[None]:
    """The backends' own tensors (their persistent buffers: ``kv_indptr``, ``qo_indptr``,
    ...) put back, after the block, to what they held before it. A step SGLang replays
    runs no eager ``init_forward_metadata`` (``EagerRunner`` does; the decode graph
    runner's ``execute`` replays instead), and the eager path writes buffers the graph
    reads (``triton_backend.py``: ``init_forward_metadata`` fills ``self.kv_indptr``,
    which the graph's metadata is built over): the eager build, made first for the
    comparison, must not write for the replay what the replay alone must write."""
    held = [
        t
        for backend in backends
        for v in vars(backend).values()
        for t in (v if isinstance(v, (list, tuple)) else [v])
        if torch.is_tensor(t)
    ]
    before = [(t, t.clone()) for t in held]
    try:
        yield
    finally:
        for t, saved in before:
            t.copy_(saved)


class SWAAllocated:
    """For an engine (:class:`_Engine`) whose KV pool is a hybrid sliding-window one:
    SGLang's ``mem_cache/allocator/swa.py:SWATokenToKVPoolAllocator`` over it, which owns
    the full-to-SWA slot mapping and registers it with the pool, and the request-to-token
    translator over both. Each full page a request gains is paired with a distinct SWA
    page (:meth:`swa_page`), as a real allocator that frees and reuses pages in another
    order makes them differ."""

    config: EngineConfig
    device: torch.device
    runner: Any

    def pages(self) -> int:
        """The KV pool's pages, the padding page 0 included."""
        return pool_pages(self.config)

    def swa_page(self, page: int) -> int:
        """The SWA page the allocator pairs with full page ``page``: never the same id
        but for the padding page 0."""
        return 0 if page == 0 else self.pages() - page

    def allocate_swa(self, pool: Any, dtype: torch.dtype) -> None:
        """The model runner's pool ``pool``, its allocator and translator."""
        from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

        page, runner = self.config.block_size, self.runner
        tokens = self.pages() * page
        self.allocator = SWATokenToKVPoolAllocator(
            tokens, tokens, page, dtype, str(self.device), pool, need_sort=False
        )
        runner.token_to_kv_pool = pool
        runner.token_to_kv_pool_allocator = self.allocator
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=runner.req_to_token_pool.req_to_token,
            token_to_kv_pool_allocator=self.allocator,
            token_to_kv_pool=pool,
            page_size=page,
            device=str(self.device),
        )

    def admit(self, inputs: RunnerStepInputs) -> None:
        """The step's requests (:meth:`_Engine.admit`), and the SWA page of each full
        page they gain, as the allocator maps it (``set_full_to_swa_mapping``)."""
        super().admit(inputs)  # type: ignore[misc]
        page = self.config.block_size
        for gained in inputs.new_block_ids:
            for p in gained:
                offsets = torch.arange(page)
                self.allocator.set_full_to_swa_mapping(
                    p * page + offsets, self.swa_page(p) * page + offsets
                )


class EngineLife:
    """One SGLang engine across the steps of one life, made anew for another config:
    the driver every SGLang implementation of ``runner-step`` shares. Per step, the
    capture runs made as the engine started (reported with its first step), the
    eager build, what the runner's graph builds where it runs the step, and the step
    on a new engine (no graph runner) whose requests are the step's, each arriving
    with every page it holds. A subclass says what its engine is and builds."""

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        """A new engine: drop the pools, the backends, the graph runner, the requests."""
        self.key: tuple[EngineConfig, torch.device] | None = None
        self.engine: Any = None

    def prepare(self) -> None:
        prepare()

    engine_class: type[_Engine] = _Engine
    """The engine a life makes (:meth:`make`)."""

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> Any:
        """A new :attr:`engine_class`; ``graphs``: with its graph runner, captured."""
        return self.engine_class(config, device, graphs=graphs)

    def core(self, engine: Any) -> _Engine:
        """The target model's engine of ``engine`` (its requests, pools and rows)."""
        return engine

    def eager(
        self, engine: Any, inputs: RunnerStepInputs, mode: str, how: str
    ) -> StepBuild | list[StepBuild]:
        """The step's eager build; a drafter of several layers: one a layer (``draft``)."""
        return engine.eager(inputs, mode, how=how)

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        """The server arguments a step runs under (a subclass adds its own)."""
        return _server_args(config, attention_backend)

    def graph_serves(self, engine: Any, mode: str) -> bool:
        """Whether a graph runner of ``engine`` may run a step of ``mode`` (an extend: none,
        SGLang prefills eagerly; a subclass with prefill graphs says otherwise)."""
        return mode != "extend" and engine.graph_runner is not None

    def graph_read(self, engine: Any) -> list[Any]:
        """The backends whose buffers both the eager build writes and the graph reads."""
        return [engine.backend]

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        """What the runner's graph builds for the step, where it runs it."""
        graphs = engine.graph_runner
        if mode == "extend" or graphs is None:
            return []
        fb = engine.forward_batch(inputs, mode)
        if not graphs.can_run_graph(fb):
            return []
        graphs.execute(fb)  # load_batch, then the graph stand-in's replay
        R, T = inputs.num_reqs, inputs.num_tokens
        bs, persistent = graphs.bs, engine.persistent_metadata(mode)
        baked = graphs.backend.graphs[graphs._replay_graph_key]
        return [
            engine._graph_build("padded", graphs, bs, R, T, persistent),
            engine._graph_build("replay", graphs, bs, R, T, baked),
        ]

    def engine_for(self, inputs: RunnerStepInputs, graphs: bool) -> Any:
        """The life's engine for ``inputs``' config: another config is another engine
        (``graphs``: with its graph runner, captured)."""
        self.prepare()
        if self.engine is None or self.key != (inputs.config, inputs.device):
            self.key = (inputs.config, inputs.device)
            _engine.new_process_buffers()  # another config: another server process
            self.engine = self.make(inputs.config, inputs.device, graphs)
        return self.engine

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        # cudagraph_mode NONE: SGLang's --disable-cuda-graph, no graph runner (SGLang's
        # graphs are whole: any other mode captures them).
        engine = self.engine_for(inputs, inputs.config.cudagraph_mode != "NONE")
        mode = step_mode(inputs)
        builds, engine.captures = engine.captures, []
        backend = self.core(engine).ATTENTION_BACKEND
        with self.server_args(inputs.config, backend):
            self.core(engine).admit(inputs)
            self.core(engine).write_rows(inputs)
            if not self.graph_serves(engine, mode):
                builds += _listed(self.eager(engine, inputs, mode, "eager"))
            else:
                with _as_left(*self.graph_read(engine)):
                    builds += _listed(self.eager(engine, inputs, mode, "eager"))
                builds += self.graph_builds(engine, inputs, mode)
        fresh = self.make(engine.config, engine.device, False)
        arrived = arrived_anew(self.core(engine).requests, inputs)
        with self.server_args(engine.config, backend):
            self.core(fresh).admit(arrived)
            self.core(fresh).write_rows(arrived)
            builds += _listed(self.eager(fresh, arrived, mode, "fresh"))
        return RunnerStepOutputs(tuple(builds))


def _listed(built: StepBuild | list[StepBuild]) -> list[StepBuild]:
    return built if isinstance(built, list) else [built]


# -- where a mutant of a backend lives: the steps the decode graph replays -----------------


def graph_batch_sizes(config: Any, alignment: int = 1) -> list[int]:
    """The decode graphs' batch sizes: the capture sizes over ``next_n``
    (``runner_step._server_args``) as ``base_cuda_graph_runner.py:
    get_batch_sizes_to_capture`` keeps them: multiples of ``alignment``
    (``get_cuda_graph_batch_size_alignment``: 2 under two-batch overlap) up to
    ``max_running_requests`` rounded up to one, that bound added where a larger size was
    asked for; none without CUDA graphs (``--disable-cuda-graph``)."""
    if config.cudagraph_mode == "NONE":
        return []
    w = config.next_n
    sizes = {s // w for s in config.cudagraph_capture_sizes if s >= w} or {1}
    bound = cdiv(config.max_num_seqs, alignment) * alignment
    if max(sizes) > bound:
        sizes.add(bound)
    return sorted(s for s in sizes if s % alignment == 0 and s <= bound)


def replayed(trace: Trace | Case) -> list[RunnerStepInputs]:
    """The steps of ``trace`` (a case: a trace of one step) the decode graph replays:
    decodes or verifies of running requests (``runner_step.step_mode``) of at most the
    largest graph's batch size."""
    trace = as_trace(trace)
    sizes = graph_batch_sizes(trace.config)
    steps = [make_inputs(case) for case in trace.cases()]
    return [s for s in steps if sizes and step_mode(s) != "extend" and s.num_reqs <= sizes[-1]]


def reach_verify_replay(trace: Trace | Case) -> bool:
    """A target verify (``num_spec`` >= 1) the decode graph replays."""
    return trace.config.num_spec >= 1 and bool(replayed(trace))


def arrive_then_step(config: EngineConfig, computed: int) -> Trace:
    """One request arrives with ``computed`` tokens (an extend), then decodes (or
    verifies) alone: the graph of one request."""
    w, bs = config.next_n, config.block_size
    held, after = cdiv(computed, bs), cdiv(computed + w, bs)
    pages = tuple(range(1, after + 1))
    arrive = Batch((0,), (computed,), 0, True, req_ids=(0,), pages=(pages[:held],),
                   new_pages=(held,))  # fmt: skip
    step = Batch((computed,), (w,), 0, True, req_ids=(0,), pages=(pages,),
                 new_pages=(after - held,))  # fmt: skip
    return Trace(config, (arrive, step))


ENGINE = EngineLife()
"""The engine of the implementation ``sglang`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang`` of ``runner-step``: the step on :data:`ENGINE`, kept
    across calls; ``run.new_engine()`` (what the harness calls through the engine
    plugin's ``EngineCall``) drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
