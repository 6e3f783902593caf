"""SGLang's prefill CUDA-graph runner with a FULL prefill graph on FlashAttention 3 and
its chunked-prefix cache, as the implementation ``sglang-fa3-prefill-graph`` of
``runner-step``.

The engine as a user starts it: an MLA (DeepSeek) model on ``--attention-backend fa3``
with ``--cuda-graph-config '{"prefill": {"backend": "full", "bs": [...],
"full_prefill_max_req": R, "full_prefill_prefix_chunk_tokens": C}}'`` and the
chunked-prefix cache on (SGLang's default: ``model_runner_components/misc_utils.py:
maybe_disable_chunked_prefix_cache`` keeps it for an MLA model whose prefill backend
``fa3`` is in ``CHUNKED_PREFIX_CACHE_SUPPORTED_ATTENTION_BACKENDS``; any other model
turns it off, and with it the runner's chunked-prefix capture). The case's capture sizes
are the prefill graphs' token counts; ``R`` is a slot for every running request; ``C``
is one page of every request slot, so that a cached prefix of a few pages spans several
chunks. Because the FULL graph is captured with the chunked-prefix topology, an extend
with a cached prefix replays the graph of the smallest chunk variant (1, 2, 4, 8, 16
chunks) that covers it.

What runs, unchanged (SGLang 0.5.23), besides what ``sglang-prefill-graph`` and
``sglang-fa3`` run (the decode steps, as ``sglang-fa3``, on the same MLA profile):

- ``model_executor/runner/prefill_cuda_graph_runner.py``: ``PrefillCudaGraphRunner``
  with a FULL backend (``_is_full_backend``): ``__init__`` (the request slots,
  ``_capture_chunked_prefix``, ``_resolve_prefix_chunk_shape``,
  ``_max_addressable_prefix_len``, the variants, ``_create_chunked_prefix_buffers``),
  ``capture`` (``capture_one_shape`` of every token count, then of every chunk variant:
  ``capture_prepare``'s slot-padded dummy extend, ``_prepare_chunked_prefix_capture``,
  ``_populate_chunked_prefix_buffers`` with the Triton kernel
  ``create_chunked_prefix_cache_kv_indices``, interpreted), ``can_run_graph``
  (``can_replay_locally``: the request slots, ``_has_uncapturable_chunked_prefix``),
  and ``execute``: ``load_batch`` (the slot-padded static buffers and their sentinel
  tail, ``_shape_key``, ``_prepare_forward_metadata_for_replay``'s slot-padded view),
  ``_prepare_chunked_prefix_replay`` and ``_execute_body_capture``;
- ``layers/attention/flashattention_backend.py``: ``FlashAttentionBackend`` on an MLA
  model: ``init_forward_metadata_out_graph`` (``_init_full_cg_prefill_metadata``, at
  capture and replay), ``prepare_full_cuda_graph_chunked_prefix`` (the base class's:
  FA3 reads the runner's chunk buffers directly), the eager ``init_forward_metadata``.

Stand-ins: those of ``sglang-fa3`` (``sgl_kernel.flash_attn``) and of
``sglang-prefill-graph`` (the model runner, the capture stream), and the FULL graph
backend (``resolve_prefill_backend``): :class:`_FullPrefillGraph`, a
``FullCudaGraphBackend`` (the runner branches on that type) whose capture records the
capture's forward batch and the backend's metadata, and whose replay does nothing but
record what it replays. The model's forward is its transformer body alone (the layer
model's forward, which ``_execute_body_capture`` replaces with the graph's replay): the
logits tail is not run.

Builds of an extend a prefill graph covers: ``padded`` (the runner's persistent buffers
after ``execute``'s replay preparation: the static request buffers and token slots, the
backend's full-graph metadata, the chunk buffers of the replayed variant) and ``replay``
(the same read through what the graph of that shape captured: its capture batch's
tensors and chunk views, the metadata object it captured), beside ``eager`` and
``fresh``; the engine's first step carries every capture's ``capture`` build. Rows: the
request slots (``full_prefill_max_req``) and the capture's token count.

Fields, besides ``sglang-fa3``'s (``seq_lens``, ``req_pool_indices``, ``out_cache_loc``,
``positions``, ``cache_seqlens_int32``, ``page_table``, ``cu_seqlens_q``,
``cu_seqlens_k``), in a chunked-prefix build: ``prefix_chunk_cu_seq_lens`` (by request
slot, a column a chunk), ``prefix_chunk_kv_lens`` (each slot's keys in each chunk, as
FA3 reads them from those offsets) and ``prefix_chunk_kv_indices`` (every entry of each
chunk's index buffer, a column a chunk), each with its consumer's range; and
``kv_len``/``kv_slots`` as the chunked-prefix attention reads them: a request's prefix
keys chunk by chunk, then its own. An eager build reads the same keys through FA3's page
table, so *replay equals eager* holds the chunk buffers to the eager KV. Which
attention a DeepSeek layer captures (``attention_backend_handler.py:
handle_attention_fa3``: absorbed MLA over the page table below
``SGLANG_CHUNKED_PREFIX_CACHE_THRESHOLD`` keys of prefix, MHA otherwise) is the model's
choice, not judged here: the page-table fields serve the one, the chunk fields the other.

Mutant: ``sglang-fa3-prefill-graph-stale-rounded-chunks``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.adapters.sglang import runner_step_prefill_graph as prefill
from attnfuzz.adapters.standins import function_tree, no_collections, recompiled
from attnfuzz.reference.batch import Batch, Case, EngineConfig, cdiv
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    make_inputs,
)
from attnfuzz.reference.trace import Trace, as_trace

_RUNNER = "prefill_cuda_graph_runner.py:PrefillCudaGraphRunner"
_WHERE = {
    **fa3.FA3Engine.WHERE,
    "prefill-padded": f"{_RUNNER}.execute (buffers after load_batch and "
    "_prepare_chunked_prefix_replay; FlashAttentionBackend._init_full_cg_prefill_metadata)",
    "prefill-replay": f"{_RUNNER}.execute (what the FULL graph captured: its capture "
    "batch's tensors and chunk views, the metadata object)",
    "prefill-capture": f"{_RUNNER}.capture_one_shape (_prepare_chunked_prefix_capture)",
}

CHUNK_VARIANTS = (1, 2, 4, 8, 16)
"""``prefill_cuda_graph_runner.py:_CHUNKED_PREFIX_VARIANTS``: the chunk counts captured."""

PADDING_FACTOR = 2
"""``prefill_cuda_graph_runner.py:_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR``."""


def prepare() -> None:
    """Import SGLang's runners and FA3 backend before a judge forks its child."""
    fa3.prepare()
    prefill.prepare()


# -- the server arguments and what they resolve to --------------------------------------------


def request_slots(config: EngineConfig) -> int:
    """``full_prefill_max_req``: a slot for every running request (the user's setting;
    ``cuda_graph_setup.py:capture_prefill_graph`` clamps it to the request pool, which
    holds ``max_num_seqs`` rows)."""
    return config.max_num_seqs


def prefix_chunk_tokens(config: EngineConfig) -> int:
    """``full_prefill_prefix_chunk_tokens``: one page of every request slot."""
    return request_slots(config) * config.block_size


def prefill_sizes(config: EngineConfig) -> list[int]:
    """The FULL prefill graphs' token counts: the case's capture sizes that the request
    slots of the model's context hold (``cuda_graph_setup.py:capture_prefill_graph``:
    ``max_capture_requests * context_length``); none without CUDA graphs."""
    if config.cudagraph_mode == "NONE":
        return []
    most = request_slots(config) * config.max_model_len
    return sorted({s for s in config.cudagraph_capture_sizes if s <= most})


def prefix_chunk_len(config: EngineConfig) -> int:
    """``PrefillCudaGraphRunner._resolve_prefix_chunk_shape``: a request's keys in one
    chunk (the capacity, at most every slot's whole context, over the slots)."""
    slots = request_slots(config)
    capacity = min(prefix_chunk_tokens(config), config.max_model_len * slots)
    return max(capacity // slots, 1)


def chunk_variants(config: EngineConfig) -> tuple[int, ...]:
    """The chunk counts captured (``PrefillCudaGraphRunner.__init__``): each variant
    whose next-smaller one does not already cover the longest addressable prefix (the
    model's context: ``_max_addressable_prefix_len``)."""
    most = cdiv(config.max_model_len, prefix_chunk_len(config))
    return tuple(n for n in CHUNK_VARIANTS if n // 2 < most)


def replayed_variant(inputs: RunnerStepInputs) -> tuple[int, int] | None:
    """The FULL graph a step replays (``can_replay_locally``, ``_pad_to_bucket``,
    ``_shape_key``): its token count and chunk count (0: no cached prefix), else None."""
    config, T = inputs.config, inputs.num_tokens
    sizes = prefill_sizes(config)
    if config.num_spec or decode.step_mode(inputs) != "extend" or not T or not sizes:
        return None
    if inputs.num_reqs > request_slots(config) or T > sizes[-1]:
        return None
    bucket = min(s for s in sizes if s >= T)
    if bucket > PADDING_FACTOR * T:
        return None
    longest = max(inputs.num_computed_tokens, default=0)
    if not longest:
        return bucket, 0
    need = cdiv(longest, prefix_chunk_len(config))
    variant = next((n for n in chunk_variants(config) if n >= need), None)
    return None if variant is None else (bucket, variant)


def declines(case: Case) -> str | None:
    """Why SGLang captures no prefill graph for ``case``'s config, else None."""
    config = case.config
    if config.num_spec:
        return (
            "speculative decoding: the prefill graph runner never replays a target verify "
            "(prefill_cuda_graph_runner.py: PrefillCudaGraphRunner.can_replay_locally)"
        )
    if config.cudagraph_mode != "NONE" and not prefill_sizes(config):
        return (
            "no capture size the request slots hold (cuda_graph_setup.py: "
            "capture_prefill_graph disables the prefill graph)"
        )
    return None


@contextlib.contextmanager
def _server_args(config: EngineConfig, attention_backend: str = "fa3") -> Iterator[Any]:
    """The decode step's server arguments with a FULL prefill graph at the case's
    capture sizes (tokens), its request slots and prefix chunk."""
    from sglang.srt.model_executor import cuda_graph_config as graph_config

    default = graph_config.default_cuda_graph_config

    def with_prefill() -> Any:
        graphs = default()
        graphs.prefill.backend = graph_config.Backend.FULL
        graphs.prefill.bs = prefill_sizes(config) or None
        graphs.prefill.full_prefill_max_req = request_slots(config)
        graphs.prefill.full_prefill_prefix_chunk_tokens = prefix_chunk_tokens(config)
        return graphs

    with (
        mock.patch.object(graph_config, "default_cuda_graph_config", with_prefill),
        decode._server_args(config, attention_backend) as args,
    ):
        yield args


# -- the FULL graph stand-in ----------------------------------------------------------------


@dataclass
class _Captured:
    """What the FULL graph of one shape reads through the addresses it captured: the
    capture batch (its static buffer slices, token slots and chunk views) and the
    backend's metadata object."""

    forward_batch: Any
    metadata: Any


def _full_graph_class() -> type:
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import (
        FullCudaGraphBackend,
    )

    class _FullPrefillGraph(FullCudaGraphBackend):
        """The prefill runner's FULL graph backend where there is no CUDA: a capture
        records what the graph reads (:class:`_Captured`); a replay records its shape
        and does nothing (the body's output: none)."""

        def __init__(self, cuda_graph_runner: Any, **kwargs: Any) -> None:
            self._cuda_graph_runner = cuda_graph_runner
            self.graphs: dict[Any, _Captured] = {}
            self.replayed: Any = None

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
            runner = self._cuda_graph_runner
            # The two warmup runs' hook (FullCudaGraphBackend.capture_one), run as there.
            for _ in range(2):
                if post_warmup_hook is not None:
                    post_warmup_hook()
            captured = _Captured(
                runner.capture_batch, runner.model_runner.attn_backend.forward_metadata
            )
            self.graphs[shape_key] = captured
            self.on_capture(shape_key, captured)

        def on_capture(self, shape_key: Any, captured: _Captured) -> None:
            pass

        def can_run(self, forward_batch: Any, shape_key: Any) -> bool:
            return shape_key in self.graphs

        @contextlib.contextmanager
        def replay_session(self) -> Iterator[None]:
            yield

        def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
            self.replayed = shape_key
            return None

        def cleanup(self) -> None:
            self.graphs.clear()

    return _FullPrefillGraph


# -- the chunked prefix, as its consumers read it ------------------------------------------


@dataclass
class _Chunks:
    """One chunk variant's buffers as a graph reads them: ``cu_seq_lens`` (chunks, slots
    + 1), ``kv_indices`` (one tensor a chunk), ``max_seq_lens`` (the per-request bound
    each chunk's attention was captured with)."""

    cu_seq_lens: torch.Tensor
    kv_indices: list[torch.Tensor]
    max_seq_lens: list[int]


@dataclass
class _PrefillMetadata:
    """A FULL prefill build's metadata: the backend's, and the chunks of its variant
    (None: no cached prefix)."""

    fa3: Any
    chunks: _Chunks | None


def _chunks_of(forward_batch: Any) -> _Chunks | None:
    """The chunk views a capture batch hands the captured attention
    (``_prepare_chunked_prefix_capture``), None for a variant without a prefix."""
    n = forward_batch.num_prefix_chunks
    if not n:
        return None
    return _Chunks(
        forward_batch.prefix_chunk_cu_seq_lens[:n],
        list(forward_batch.prefix_chunk_kv_indices),
        list(forward_batch.prefix_chunk_max_seq_lens),
    )


class FA3PrefillGraphEngine(prefill.PrefillGraphEngine, fa3.FA3Engine):
    """An MLA model on FA3 with its FULL prefill graph runner (``prefill_graphs``) and
    its decode graph runner, as ``cuda_graph_setup.py`` builds both."""

    ATTENTION_BACKEND = "fa3"
    WHERE = _WHERE

    def make_backend(self) -> Any:
        """FA3's backend on a DeepSeek MLA model profile, with the chunked-prefix cache
        gate the model runner applies at load (it keeps the cache on: MLA on fa3)."""
        from sglang.srt.configs.model_config import AttentionArch
        from sglang.srt.model_executor.model_runner_components import misc_utils
        from transformers import DeepseekV3Config

        hf_config = DeepseekV3Config(
            num_attention_heads=2,
            num_key_value_heads=2,
            hidden_size=2 * decode.HEAD_DIM,
            num_hidden_layers=1,
            architectures=["DeepseekV3ForCausalLM"],
        )
        model = self.runner.model_config
        model.attention_arch = AttentionArch.MLA
        model.hf_config = model.hf_text_config = hf_config
        misc_utils.maybe_disable_chunked_prefix_cache(use_mla_backend=True, is_draft_worker=False)
        return super().make_backend()

    def _prefill_runner(self) -> Any:
        """``PrefillCudaGraphRunner(model_runner)`` on the FULL graph stand-in, every
        capture recorded (the capture batch: ``capture_prepare``'s, kept as the runner
        hands it to the capture)."""
        from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as module

        engine, graph = self, _full_graph_class()
        prepare_capture = module.PrefillCudaGraphRunner.capture_prepare

        def capture_prepare(runner: Any, num_tokens: int) -> Any:
            made = prepare_capture(runner, num_tokens)
            runner.capture_batch = made[0]
            return made

        class _Recording(graph):  # type: ignore[valid-type,misc]
            def on_capture(self, shape_key: Any, captured: _Captured) -> None:
                engine.captures.append(engine._capture_build(captured))

        @contextlib.contextmanager
        def graph_capture(stream: Any = None) -> Iterator[Any]:
            yield _engine.StandIn(stream=stream)

        group = _engine.StandIn(ca_comm=None, world_size=1, rank_in_group=0, barrier=lambda: None)
        self._prefill_model_runner()
        with (
            mock.patch.object(module, "resolve_prefill_backend", _Recording),
            mock.patch.object(module, "graph_capture", graph_capture),
            mock.patch.object(module, "get_or_create_global_graph_capture_stream", lambda: None),
            mock.patch.object(module.PrefillCudaGraphRunner, "capture_prepare", capture_prepare),
            module.get_parallel().override(tp_group=group),
            no_collections(),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            return module.PrefillCudaGraphRunner(self.runner)

    def _prefill_model_runner(self) -> None:
        """The breakable runner's model runner, and the model's forward: its transformer
        body alone (``_execute_body_capture`` replaces the layer model's forward with the
        graph's replay; the logits tail is not run), a KV pool of no layer transfers."""
        super()._prefill_model_runner()
        body = self.runner.model.model

        def forward(input_ids: Any, positions: Any, forward_batch: Any, **kwargs: Any) -> None:
            body.forward(input_ids, positions, forward_batch)

        self.runner.model.forward = forward
        self.runner.token_to_kv_pool.layer_transfer_counter = None

    # -- builds -------------------------------------------------------------------------------

    def _capture_build(self, captured: _Captured) -> StepBuild:
        """A capture's build: the capture batch's request slots and tokens, its metadata
        and chunk views."""
        fb = captured.forward_batch
        inputs_of = {
            "seq_lens": fb.seq_lens,
            "req_pool_indices": fb.req_pool_indices,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        metadata = _PrefillMetadata(captured.metadata, _chunks_of(fb))
        fields = self._fields(fb.batch_size, len(fb.positions), inputs_of, metadata)
        return StepBuild("capture", 0, 0, fields, where=self.WHERE["prefill-capture"])

    def prefill_builds(self, graphs: Any, R: int, T: int) -> list[StepBuild]:
        """The ``padded`` and ``replay`` builds of the step the FULL graph replayed."""
        key = graphs.backend.replayed
        slots, tokens = graphs._capture_req_slots, key.size
        static, registry = graphs._prefill_static_buffers, graphs.buffer_registry
        chunks = None
        if key.variant_label is not None:
            # The runner's shared chunk buffers, as many chunks as the variant has, each
            # with the bound its attention was captured with.
            capture = graphs._prefix_capture_batches[key]
            n, b = capture.num_prefix_chunks, graphs._prefix_capture_buffers
            chunks = _Chunks(b.cu_seq_lens[:n], list(b.kv_indices[:n].unbind(0)),
                             list(capture.prefix_chunk_max_seq_lens))  # fmt: skip
        padded = {
            "seq_lens": static["seq_lens"],
            "req_pool_indices": static["req_pool_indices"],
            "out_cache_loc": registry.get_slot("out_cache_loc").buffer,
            "positions": registry.get_slot("positions").buffer,
        }
        persistent = _PrefillMetadata(self.backend.full_cg_prefill_metadata, chunks)
        captured = graphs.backend.graphs[key]
        fb = captured.forward_batch
        baked = {
            "seq_lens": fb.seq_lens,
            "req_pool_indices": fb.req_pool_indices,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        read = _PrefillMetadata(captured.metadata, _chunks_of(fb))
        return [
            StepBuild("padded", R, T, self._fields(slots, tokens, padded, persistent),
                      where=self.WHERE["prefill-padded"]),
            StepBuild("replay", R, T, self._fields(slots, tokens, baked, read),
                      where=self.WHERE["prefill-replay"]),
        ]  # fmt: skip

    def _fields(
        self, rows: int, tokens: int, inputs_of: dict[str, torch.Tensor], metadata: Any
    ) -> tuple[Field, ...]:
        """The fields of a build; of a FULL prefill build, ``seq_lens`` from 0: the
        request slots past the batch are zero-length sentinels (``load_batch``,
        ``capture_prepare``), and their consumer, ``_init_full_cg_prefill_metadata``, hands
        FA3 ``cache_seqlens = seq_lens``, where 0 is a row of no key."""
        fields = super()._fields(rows, tokens, inputs_of, metadata)
        if not isinstance(metadata, _PrefillMetadata):
            return fields
        return tuple(
            dataclasses.replace(f, accepts=(0, f.accepts[1])) if f.name == "seq_lens" else f
            for f in fields
        )

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """FA3's fields (:meth:`fa3.FA3Engine.metadata_fields`); of a chunked-prefix
        build, its chunks' too."""
        if not isinstance(metadata, _PrefillMetadata):
            return super().metadata_fields(rows, tokens, metadata)
        out = super().metadata_fields(rows, tokens, metadata.fa3)
        if metadata.chunks is None:
            return out
        return out + self.chunk_fields(rows, metadata.chunks)

    def chunk_fields(self, rows: int, chunks: _Chunks) -> tuple[Field, ...]:
        """The chunk buffers of ``rows`` request slots, a column a chunk, with each
        consumer's range. No eager build holds them (an eager prefill chunks its prefix
        by its own batch size): they are judged by safe padding, and through ``kv_len``
        and ``kv_slots`` against the eager KV."""
        cu = decode.host(chunks.cu_seq_lens[:, : rows + 1]).T
        indices = np.stack([decode.host(t) for t in chunks.kv_indices], axis=1)
        kv_rows = self.runner.token_to_kv_pool.size + self.config.block_size
        bound = min(chunks.max_seq_lens)  # every chunk's: _prefix_chunk_len
        return (
            # forward_mha.py:_chunked_prefix_attn_mha hands FA3 the chunk's keys, one per
            # entry of its kv_indices (key_value_num_tokens=k.shape[0]);
            # FlashAttentionBackend.forward_extend (attn_attend_prefix_cache) reads request
            # b's as k[cu_seqlens_k[b] : cu_seqlens_k[b + 1]], cu_seqlens_k this chunk's
            # prefix_chunk_cu_seq_lens: an offset into those keys.
            Field("prefix_chunk_cu_seq_lens", "offsets", cu, (0, indices.shape[0])),
            # ... with max_seqlen_k the chunk's prefix_chunk_max_seq_lens (baked at capture):
            # a request's keys in a chunk from 0 to that bound.
            Field("prefix_chunk_kv_lens", "requests", np.diff(cu, axis=0), (0, bound)),
            # _get_mla_kv_buffer gathers every entry of the chunk's kv_indices
            # (memory_pool.py:MLATokenToKVPool.get_mla_kv_buffer, get_mla_kv_buffer_triton:
            # kv_buffer[loc]), whose rows are the pool's size + page_size. Its rows are the
            # chunks' key positions, no request's: safe padding alone judges it.
            Field("prefix_chunk_kv_indices", "tokens", indices, (0, kv_rows - 1)),
        )

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """A chunked-prefix build: each request's prefix keys as the chunked attention
        reads them (``_chunked_prefix_attn_mha``: chunk by chunk, request b's
        ``kv_indices[c][cu[c][b] : cu[c][b + 1]]``), then its own (the suffix attention's
        ``k``: the step's tokens ``cu_seqlens_q[b] : cu_seqlens_q[b + 1]``, the keys
        ``set_kv_buffer`` wrote at their ``out_cache_loc``). Any other: FA3's paged read."""
        if not isinstance(metadata, _PrefillMetadata) or metadata.chunks is None:
            return super().kv_read(values, getattr(metadata, "fa3", metadata))
        cu, indices = values["prefix_chunk_cu_seq_lens"], values["prefix_chunk_kv_indices"]
        rows = cu.shape[0] - 1
        prefix = [
            np.concatenate([indices[max(a, 0) : max(b, 0), c]
                            for c, (a, b) in enumerate(zip(cu[r], cu[r + 1], strict=True))])
            for r in range(rows)
        ]  # fmt: skip
        cached = np.array([len(p) for p in prefix], dtype=np.int64)
        return decode.with_step_keys(
            cached, prefix, values["cu_seqlens_q"], values["out_cache_loc"]
        )


class FA3PrefillGraphLife(prefill.PrefillGraphLife):
    """The engine of ``sglang-fa3-prefill-graph``: an extend a FULL prefill graph covers
    runs through ``PrefillCudaGraphRunner.execute``."""

    engine_class: type[FA3PrefillGraphEngine] = FA3PrefillGraphEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> Any:
        with _server_args(config):
            return self.engine_class(config, device, graphs=graphs)

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return _server_args(config, attention_backend)

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        if mode != "extend":
            return super().graph_builds(engine, inputs, mode)
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        graphs = engine.prefill_graphs
        fb = engine.forward_batch(inputs, mode)
        # ForwardBatch.init_new: a request that returns no hidden states captures none.
        fb.capture_hidden_mode = CaptureHiddenMode.NULL
        if graphs is None or not graphs.can_run_graph(fb):
            return []
        graphs.backend.replayed = None
        graphs.execute(fb)
        return engine.prefill_builds(graphs, inputs.num_reqs, inputs.num_tokens)


ENGINE = FA3PrefillGraphLife()
"""The engine of the implementation ``sglang-fa3-prefill-graph``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3-prefill-graph``: the step on :data:`ENGINE`."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the rounded-up chunks kept from the last population ----------------------------


class _OnlyReachedChunks(ast.NodeTransformer):
    """In the statements that compute and store the chunk lengths and offsets,
    ``captured_n`` -> ``real_n``: only the chunks the batch's prefix reaches refreshed."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        for stmt in node.body:
            if "seq_lens" in ast.unparse(stmt) and not isinstance(stmt, ast.For):
                for name in ast.walk(stmt):
                    if isinstance(name, ast.Name) and name.id == "captured_n":
                        name.id = "real_n"
        return node


def stale_rounded_chunks() -> Any:
    """``PrefillCudaGraphRunner._populate_chunked_prefix_buffers`` recompiled from its own
    source with the chunk lengths and offsets refreshed for the chunks the prefix reaches
    (``real_n``) instead of every chunk of the variant replayed (``captured_n``)."""
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import (
        PrefillCudaGraphRunner,
    )

    fn = PrefillCudaGraphRunner._populate_chunked_prefix_buffers
    definition = _OnlyReachedChunks().visit(function_tree(fn))
    assert "buffers.cu_seq_lens[:real_n].copy_" in ast.unparse(definition), "the copy moved"
    return recompiled(fn, definition)


class _StaleRoundedChunks(FA3PrefillGraphEngine):
    """The runner's chunk population refreshing the lengths and offsets of the chunks a
    batch's prefix reaches only: a batch rounded up to a larger variant (3 chunks in the
    graph of 4) leaves its last chunks' lengths as the previous population left them
    (the last capture's: a whole chunk a request slot), while their indices are zeroed,
    so each request reads keys of slot 0 it never wrote."""

    def _prefill_runner(self) -> Any:
        from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as module

        populate = stale_rounded_chunks()
        runner_class = module.PrefillCudaGraphRunner
        with mock.patch.object(runner_class, "_populate_chunked_prefix_buffers", populate):
            runner = super()._prefill_runner()  # its captures populate so too
        runner._populate_chunked_prefix_buffers = populate.__get__(runner)
        return runner


class _MutantLife(FA3PrefillGraphLife):
    def __init__(self, engine: type[FA3PrefillGraphEngine]) -> None:
        self.engine_class = engine
        super().__init__()


STALE_ROUNDED_CHUNKS = _MutantLife(_StaleRoundedChunks)


def run_stale_rounded_chunks(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-fa3-prefill-graph-stale-rounded-chunks``:
    :class:`_StaleRoundedChunks`."""
    return STALE_ROUNDED_CHUNKS(inputs)


run_stale_rounded_chunks.new_engine = STALE_ROUNDED_CHUNKS.new_engine  # type: ignore[attr-defined]


# -- where the mutant lives ------------------------------------------------------------------


def reach_chunked_prefix(trace: Trace | Case) -> bool:
    """A step of ``trace`` (a case: a trace of one step) a FULL prefill graph replays
    with a cached prefix (a chunk variant)."""
    trace = as_trace(trace)
    return not declines(trace.cases()[0]) and any(
        (v := replayed_variant(make_inputs(c))) is not None and v[1] > 0 for c in trace.cases()
    )


def trigger_stale_rounded_chunks(trace: Trace | Case) -> bool:
    """A chunked-prefix replay rounded up to a larger variant (its longest prefix reaches
    fewer chunks than the graph loops over) where a rounded-up chunk still holds, for a
    real request's slot, a length an earlier population left: the captures' (the last
    capture's prefix, ``min(chunk_len * variant, context)``, in every slot) or an
    earlier replay's, which refreshed only the chunks its own prefix reached."""
    trace = as_trace(trace)
    config = trace.config
    if declines(trace.cases()[0]) or not prefill_sizes(config):
        return False
    L, slots, variants = prefix_chunk_len(config), request_slots(config), chunk_variants(config)

    def chunk_lengths(prefix: list[int], reached: int) -> list[list[int]]:
        # _populate_chunked_prefix_buffers: (prefix_lens - starts).clamp(0, chunk_len)
        return [[min(max(p - c * L, 0), L) for p in prefix] for c in range(reached)]

    captured = min(L * variants[-1], config.max_model_len)  # _prepare_chunked_prefix_capture
    lengths = chunk_lengths([captured] * slots, cdiv(captured, L))
    lengths += [[0] * slots for _ in range(variants[-1] - len(lengths))]
    for case in trace.cases():
        inputs = make_inputs(case)
        v = replayed_variant(inputs)
        if v is None or not v[1]:
            continue
        prefix = [*inputs.num_computed_tokens, *[0] * (slots - inputs.num_reqs)]
        reached = cdiv(max(prefix), L)
        if any(lengths[c][b] for c in range(reached, v[1]) for b in range(inputs.num_reqs)):
            return True
        lengths[:reached] = chunk_lengths(prefix, reached)
    return False


def smallest_stale_rounded_chunks() -> Trace:
    """One request arrives with a cached prefix of 3 pages (a radix-cache hit) and one
    new token: 3 chunks of a page, replayed in the graph of 4 chunks (one token graph,
    one request slot)."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, cudagraph_capture_sizes=(1,))  # fmt: skip
    arrive = Batch((3,), (1,), 0, True, req_ids=(0,), pages=((1, 2, 3, 4),), new_pages=(4,))
    return Trace(config, (arrive,))
