"""SGLang's decode graph runner step of a MiniMax-M3 sparse-attention model on a ROCm GPU,
as the implementation ``sglang-minimax-sparse`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner, request
rows and decode graph runner), on the backend ``attention_registry.py:
attn_backend_wrapper`` makes for a MiniMax-M3 model (``is_minimax_sparse``: its
architecture ``MiniMaxM3SparseForCausalLM``): ``layers/attention/minimax_sparse_backend.py``'s
``MiniMaxHybridAttnBackend`` over the Triton backend (what
``arg_groups/model_overrides/minimax_m3.py`` pins on ROCm) for the dense layers and
``MiniMaxSparseAttnBackend`` for the sparse ones, on the ``MiniMaxSparseKVPool``
``kv_cache_configurator.py:_build_minimax_sparse_kv_pool`` makes (a main pool of every
layer's keys and values, a key-only index pool of the sparse layers'). The model profile
(:data:`PROFILE`) is M3's shape at small sizes: a dense layer then a sparse one, top-k
blocks with one local block and no init block, a key-only indexer, blocks of
:data:`SPARSE_BLOCK` tokens. What runs, unchanged (SGLang 0.5.23):

- ``MiniMaxSparseAttnBackend``: ``__init__`` (its profile from the model config:
  ``configs/model_config.py``'s ``get_minimax_sparse_*``; the MSA kernel unavailable, as
  on every GPU but SM100), ``init_forward_metadata_out_graph`` (``_max_seqlen_q``,
  ``_max_seqlen_k``: at capture the context, else the batch's longest, a verify's drafts
  added on ROCm), ``init_forward_metadata_in_graph`` and
  ``_init_rocm_linear_verify_metadata`` (a verify's rows a query each: its own length and
  request row, built in the graph), ``init_cuda_graph_state``,
  ``get_cuda_graph_seq_len_fill_value``, and for an extend ``_resolve_extend_meta`` (what
  ``forward_extend`` builds first: ``cu_seqlens``, ``seq_lens``, ``prefix_lens``);
- ``MiniMaxHybridAttnBackend``: ``__init__``, ``init_forward_metadata``,
  ``init_forward_metadata_out_graph``, ``init_forward_metadata_in_graph``,
  ``init_cuda_graph_state``, ``get_cuda_graph_seq_len_fill_value``, ``shared_read_ends``;
- the Triton backend's metadata, as in ``sglang``.

Stand-ins, besides the step's: the platform, read by the backend's ``__init__`` only
(:func:`on_rocm`): ``is_hip()`` answers True and ``is_gfx95_supported()`` False (an
MI300X, gfx942: no index top-k cache, whose frequency only a gfx95 reads), so the backend
takes ROCm's linear-chain verify; the graph (:class:`_InGraphPrep`): the backend writes a
verify's query rows inside the graph (``capture_one_shape``'s ``run_once`` calls
``_run_in_graph_metadata_prep``), so a capture runs that body once, as the warmup does,
and keeps the rows it made; a replay runs it again and writes them into the captured
rows, as the recorded ops write their captured outputs. The model's forward computes
nothing. No vendor kernel is reached: the sparse kernels (``minimax_sparse_ops/
minimax_sparse.py``) run in a forward only. The KV cache is bf16; it is never read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``: what each
graph captured, ``eager``, ``padded``: the runner's buffers, Triton's persistent ones and
the sparse backend's state after ``load_batch`` and the replay's in-graph preparation,
``replay``: what the graph captured, its verify rows rewritten by the replay, ``fresh``).

Fields: the Triton engine's (the dense layers'), and what the sparse layers' kernels read,
prefixed ``sparse.``, each with the range its consumer accepts (:meth:`MiniMaxSparseEngine.
accepts`, :meth:`MiniMaxSparseEngine.metadata_fields`): ``seq_lens`` (a decode's and an
extend's by request, a verify's by query row: ``flash_decode_with_topk_idx``'s score
kernel writes a row's ``cdiv(seq_len, block)`` score columns of the
``cdiv(min(max_seqlen_k, width), block)`` it allocates, and reads the row's
``req_to_token`` below ``seq_len``; at least the graph's fill length,
``get_cuda_graph_seq_len_fill_value``); a verify's ``req_pool_indices`` by query row; an
extend's ``cu_seqlens`` (offsets), ``prefix_lens`` and ``extend_lens`` (by request: the
prefill kernels' grid covers ``max_seqlen_q`` query rows of each). And ``kv_len`` and
``kv_slots``, what every backend states alike: the keys a request's sparse layer scores
and may select, ``req_to_token[row, :seq_len]`` of its (last query) row
(:meth:`MiniMaxSparseEngine.kv_read`). A new engine's request rows are its own: the
``fresh`` build holds no ``sparse.req_pool_indices``.

Mutant (a re-created defect of the metadata): ``sglang-minimax-sparse-verify-bound-
without-drafts`` (``init_forward_metadata_out_graph`` without ROCm's ``_max_seqlen_k +=
speculative_num_draft_tokens``: a verify's score buffer sized for the committed prefix,
whose draft rows score past it; safe padding on the eager, padded and fresh verify).

Not driven: the MSA decode plan (``_prepare_msa_decode_meta``, ``msa.py:
update_msa_decode_cg_meta``: SM100 only, with ``fmha_sm100``), the NPU paths, the index
top-k cache (gfx95), HiSparse, and ``minimax_sparse_nvfp4_backend.py`` (SM100, the
``minimax-msa`` planners).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step, step_mode
from attnfuzz.adapters.standins import function_tree, recompiled
from attnfuzz.reference.batch import EngineConfig, cdiv
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    make_inputs,
)
from attnfuzz.reference.trace import Trace, as_trace

BACKEND_MODULE = "sglang.srt.layers.attention.minimax_sparse_backend"

DTYPE = torch.bfloat16
"""The KV cache's dtype (an MI300X serves the model's bf16; never read)."""

SPARSE_BLOCK = 4
"""``sparse_block_size``: the keys a top-k block holds (M3's 128, small here)."""

INDEX_DIM = 16
"""``sparse_index_dim``: the index heads' width."""

DENSE_LAYERS = [0]
SPARSE_LAYERS = [1]
"""The model's layers by ``sparse_attention_freq``: dense (0) first, then sparse."""

PROFILE = dict(
    sparse_attention_freq=[0, 1],
    sparse_block_size=SPARSE_BLOCK,
    sparse_topk_blocks=2,
    sparse_init_block=0,
    sparse_local_block=1,
    sparse_index_dim=INDEX_DIM,
    sparse_num_index_heads=2,
    sparse_disable_index_value=[0, 1],
    sparse_score_type="max",
)
"""The model config's ``sparse_attention_config`` (``get_minimax_sparse_attention_config``):
M3's shape (no init block, one local block, a key-only indexer on its sparse layers)."""


def prepare() -> None:
    """Import SGLang's runner and the MiniMax backend before a judge forks its child."""
    decode.prepare()
    importlib.import_module(BACKEND_MODULE)
    from sglang.srt.layers.attention import attention_registry  # noqa: F401


# -- what a CPU lacks -------------------------------------------------------------------------


@contextlib.contextmanager
def on_rocm() -> Iterator[None]:
    """The backend module's platform as an MI300X's (gfx942) answers it, while the backend
    is built (its ``__init__`` reads it once, into ``self.is_hip`` and the index cache's
    frequency): ``is_hip()`` True, ``is_gfx95_supported()`` False."""
    module = importlib.import_module(BACKEND_MODULE)
    with (
        mock.patch.object(module, "is_hip", lambda: True),
        mock.patch.object(module, "is_gfx95_supported", lambda: False),
    ):
        yield


# -- the graph --------------------------------------------------------------------------------


def _verify_rows(sparse: Any) -> dict[str, torch.Tensor]:
    """A verify's query rows as ``_init_rocm_linear_verify_metadata`` left them."""
    meta = sparse._linear_verify_meta
    return {"seq_lens": meta.seq_lens, "req_pool_indices": meta.req_pool_indices}


def rewrite(captured: dict[str, torch.Tensor], replayed: dict[str, torch.Tensor]) -> None:
    """``replayed``'s tensors written into ``captured``'s: what the graph's recorded ops do
    at a replay. The same shapes and dtypes, or this stand-in is wrong about the graph."""
    for name, t in captured.items():
        new = replayed[name]
        if new.shape != t.shape or new.dtype != t.dtype:
            raise RuntimeError(
                f"attnfuzz's graph stand-in: {name} of {tuple(new.shape)} {new.dtype} at "
                f"replay, {tuple(t.shape)} {t.dtype} at capture (a graph changes no shape)"
            )
        if new is not t:
            t.copy_(new)


def _computes_nothing(*args: Any, **kwargs: Any) -> None:
    """The model's forward inside the graph stand-in: its layers read the metadata, never
    write it; nothing to compute."""
    return None


def graph_metadata(backend: Any, buffers: Any, verify: bool) -> Any:
    """What a graph reads of the hybrid backend: Triton's metadata (``full``, over its
    persistent buffers) and the sparse layers' (``sparse``): the runner's ``seq_lens`` and
    ``req_pool_indices`` buffers (a decode's, handed on by ``forward_decode``), or a
    verify's query rows, and ``_max_seqlen_k`` as it was (a Python int: a graph keeps
    the value it captured)."""
    sparse = backend.sparse
    rows = (
        _verify_rows(sparse)
        if verify
        else {"seq_lens": buffers.seq_lens, "req_pool_indices": buffers.req_pool_indices}
    )
    return _engine.StandIn(
        full=backend.dense.forward_metadata,
        sparse=SparseView(
            "verify" if verify else "decode",
            int(sparse._max_seqlen_k),
            int(sparse._max_seqlen_q),
            rows,
        ),
    )


class _InGraphPrep(decode._Graph):
    """The decode runner's graph where there is no CUDA, for a backend that writes a
    verify's rows inside the graph (module docstring): a capture runs the body (the
    in-graph preparation, then a forward that computes nothing) and records what the
    graph reads; a replay runs it again and rewrites the captured verify rows."""

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self.bodies: dict[Any, Any] = {}

    def _verify(self) -> bool:
        return self.runner.capture_forward_mode.is_target_verify()

    def capture_one(
        self,
        shape_key: Any,
        forward_fn: Any,
        capture_inputs: Any = None,
        post_warmup_hook: Any = None,
    ) -> None:
        self._run(forward_fn)
        self.bodies[shape_key] = forward_fn
        self.graphs[shape_key] = graph_metadata(
            self.runner.attn_backend, self.runner.buffers, self._verify()
        )

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        self._run(self.bodies[shape_key])
        if self._verify():
            captured = self.graphs[shape_key].sparse.rows
            rewrite(captured, _verify_rows(self.runner.attn_backend.sparse))
        return super().replay(shape_key, static_forward_batch, **kwargs)

    def _run(self, body: Any) -> None:
        """``body`` run eagerly, as a warmup runs it: no stream is capturing (the runner's
        in-graph marker asks its device module)."""
        module = self.runner.device_module
        self.runner.device_module = _engine.StandIn(is_current_stream_capturing=lambda: False)
        try:
            body()
        finally:
            self.runner.device_module = module

    def cleanup(self) -> None:
        self.bodies.clear()
        super().cleanup()


# -- the engine -------------------------------------------------------------------------------


@dataclasses.dataclass
class SparseView:
    """What the sparse layers' kernels read of one forward: its mode, the backend's
    ``_max_seqlen_k`` and ``_max_seqlen_q``, and its rows (``seq_lens``,
    ``req_pool_indices``; an extend's ``cu_seqlens`` and ``prefix_lens`` besides)."""

    mode: str
    max_seqlen_k: int
    max_seqlen_q: int
    rows: dict[str, torch.Tensor]


class MiniMaxSparseEngine(decode._Engine):
    """One SGLang engine of a MiniMax-M3 model on ROCm: ``MiniMaxHybridAttnBackend`` over
    Triton and ``MiniMaxSparseAttnBackend``, its pool ``MiniMaxSparseKVPool``."""

    ATTENTION_BACKEND = "triton"
    GRAPH = _InGraphPrep
    WHERE = {
        "eager": "minimax_sparse_backend.py:MiniMaxHybridAttnBackend.init_forward_metadata "
        "(TritonAttnBackend's, MiniMaxSparseAttnBackend's; an extend's _resolve_extend_meta)",
        "fresh": "minimax_sparse_backend.py:MiniMaxHybridAttnBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (buffers, "
        "Triton's; MiniMaxSparseAttnBackend's _max_seqlen_k after load_batch and "
        "init_forward_metadata_in_graph's verify rows)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (what the "
        "graph captured, its verify rows rewritten by the recorded "
        "init_forward_metadata_in_graph)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(init_forward_metadata_out_graph in_capture, then init_forward_metadata_in_graph)",
    }
    HISTORY = ("sparse.req_pool_indices",)
    """Fields that name the engine's own request rows: a new engine's are its own."""
    out_graph: Callable[..., Any] | None = None  # a mutant's init_forward_metadata_out_graph

    def make_backend(self) -> Any:
        """``attn_backend_wrapper(model_runner, TritonAttnBackend(model_runner))`` on a
        MiniMax-M3 model config and the pool SGLang makes for it, on ROCm."""
        from sglang.srt.layers.attention.attention_registry import attn_backend_wrapper
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import (
            MiniMaxSparseKVPool,
            get_minimax_sparse_index_dtype,
        )
        from transformers import PretrainedConfig

        runner, config = self.runner, self.config
        hf_config = PretrainedConfig(
            architectures=["MiniMaxM3SparseForCausalLM"],
            sparse_attention_config=dict(PROFILE),
            num_hidden_layers=len(PROFILE["sparse_attention_freq"]),
        )
        model_config = runner.model_config
        model_config.hf_config = model_config.hf_text_config = hf_config
        model_config.quantization = None  # bf16 weights: no NVFP4 stack
        runner.use_mla_backend = False
        runner.dtype = runner.kv_cache_dtype = model_config.dtype = DTYPE
        # kv_cache_configurator.py:_build_minimax_sparse_kv_pool.
        pool = MiniMaxSparseKVPool(
            size=decode.pool_pages(config) * config.block_size,
            page_size=config.block_size,
            dtype=DTYPE,
            index_dtype=get_minimax_sparse_index_dtype(
                fp8_attn_gemm=False, kv_cache_dtype=DTYPE, model_dtype=DTYPE
            ),
            head_num=model_config.get_num_kv_heads(1),
            head_dim=decode.HEAD_DIM,
            idx_head_dim=INDEX_DIM,
            dense_layer_ids=DENSE_LAYERS,
            sparse_layer_ids=SPARSE_LAYERS,
            disable_value_sparse_layer_ids=SPARSE_LAYERS,
            device=str(self.device),
            enable_memory_saver=False,
            start_layer=0,
            end_layer=len(PROFILE["sparse_attention_freq"]),
            enable_hisparse=False,
        )
        runner.token_to_kv_pool = pool
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=runner.req_to_token_pool.req_to_token,
            token_to_kv_pool_allocator=None,
            token_to_kv_pool=pool,
            page_size=config.block_size,
            device=str(self.device),
        )
        with on_rocm():
            backend = attn_backend_wrapper(runner, TritonAttnBackend(runner))
        if self.out_graph is not None:
            sparse = backend.sparse
            sparse.init_forward_metadata_out_graph = types.MethodType(self.out_graph, sparse)
        return backend

    def _graph_runner(self) -> Any:
        # The graph stand-in runs the capture's forward, which computes nothing.
        self.runner.model = _engine.StandIn(
            shared_experts_config=None, forward=_computes_nothing, modules=lambda: iter(())
        )
        return super()._graph_runner()

    def persistent_metadata(self, mode: str) -> Any:
        """Triton's persistent buffers after the replay preparation, and the sparse
        backend's state: ``_max_seqlen_k`` as ``load_batch`` left it, the runner's buffers
        or the verify rows the replay's in-graph preparation made."""
        triton = self.backend.dense
        full = _engine.StandIn(
            kv_indptr=triton.kv_indptr,
            kv_indices=triton.cuda_graph_kv_indices,
            qo_indptr=triton.qo_indptr if mode == "verify" else None,
        )
        view = graph_metadata(self.backend, self.graph_runner.buffers, mode == "verify")
        return _engine.StandIn(full=full, sparse=view.sparse)

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        """``init_forward_metadata`` of the step's ForwardBatch, no graph (copied now); an
        extend's rows as ``forward_extend`` resolves them first (``_resolve_extend_meta``).
        A new engine's build without the fields of its own rows."""
        fb = self.forward_batch(inputs, mode)
        self.backend.init_forward_metadata(fb)
        sparse = self.backend.sparse
        if mode == "verify":
            rows = _verify_rows(sparse)
        elif mode == "decode":
            rows = {"seq_lens": fb.seq_lens, "req_pool_indices": fb.req_pool_indices}
        else:
            # The query is read on an NPU only (its verify's extend lengths).
            cu_seqlens, seq_lens, prefix_lens = sparse._resolve_extend_meta(fb, None)
            rows = {"seq_lens": seq_lens, "req_pool_indices": fb.req_pool_indices,
                    "cu_seqlens": cu_seqlens, "prefix_lens": prefix_lens}  # fmt: skip
        view = SparseView(mode, int(sparse._max_seqlen_k), int(sparse._max_seqlen_q), rows)
        metadata = _engine.StandIn(full=self.backend.dense.forward_metadata, sparse=view)
        inputs_of = {"seq_lens": fb.seq_lens, "out_cache_loc": fb.out_cache_loc,
                     "positions": fb.positions}  # fmt: skip
        if how != "fresh":  # a new engine's rows are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        fields = self._fields(R, T, inputs_of, metadata)
        if how == "fresh":
            fields = tuple(f for f in fields if f.name not in self.HISTORY)
        return StepBuild(how, R, T, fields, where=self.WHERE[how])

    # -- what the consumers accept -------------------------------------------------------------

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the Triton engine's
        (:meth:`runner_step._Engine.accepts`: the sparse layers' KV store,
        ``MiniMaxSparseKVPool.set_fused_kv_index_buffer``, writes the main and index pools'
        ``size + page_size`` rows at ``out_cache_loc``, as the dense layers' does), and the
        sparse kernels' request rows."""
        acc = decode._Engine.accepts(self)
        table = self.runner.req_to_token_pool.req_to_token
        # flash_decode_with_topk_idx's score kernels and flash_decode_with_gqa_share_sparse
        # read req_to_token[slot_ids[b], p] (the prefill kernels alike): a row of the table.
        acc["sparse.req_pool_indices"] = (0, table.shape[0] - 1)
        # A query's keys end at its position (prefix_lens[b] + i < seq_lens[b], the prefill
        # kernels' causal mask): a column of the table.
        acc["sparse.prefix_lens"] = (0, table.shape[1] - 1)
        return acc

    def seq_len_bound(self, view: SparseView) -> int:
        """The longest row the sparse kernels of ``view`` take: a decode's and a verify's
        score buffer (``flash_decode_with_topk_idx``) holds ``cdiv(min(max_seqlen,
        req_to_token width), block)`` columns, an extend's (``flash_prefill_with_topk_index``)
        ``cdiv(max_seqlen_k, block)``, and a row's score kernel writes its
        ``cdiv(seq_len, block)`` columns (masked by them alone) and reads its
        ``req_to_token`` row below ``seq_len``."""
        width = self.runner.req_to_token_pool.req_to_token.shape[1]
        k = view.max_seqlen_k if view.mode == "extend" else min(view.max_seqlen_k, width)
        return min(cdiv(k, SPARSE_BLOCK) * SPARSE_BLOCK, width)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The Triton backend's fields (the dense layers') and the sparse layers', for
        ``rows`` requests and ``tokens`` tokens (padding included), copied now."""
        acc, view = self.accepts(), metadata.sparse
        fill = self.backend.get_cuda_graph_seq_len_fill_value()
        # A verify's sparse rows are its query tokens (forward_extend hands forward_decode
        # one row a query: _linear_verify_meta), a decode's and an extend's its requests.
        per, n = ("tokens", tokens) if view.mode == "verify" else ("requests", rows)
        out = [
            Field(
                "sparse.seq_lens",
                per,
                decode.host(view.rows["seq_lens"][:n]),
                (fill, self.seq_len_bound(view)),
            )
        ]
        if view.mode == "verify":
            out.append(
                Field(
                    "sparse.req_pool_indices",
                    per,
                    decode.host(view.rows["req_pool_indices"][:n]),
                    acc["sparse.req_pool_indices"],
                )
            )
        if view.mode == "extend":
            cu = decode.host(view.rows["cu_seqlens"][: rows + 1])
            out += [
                # The prefill kernels read request b's queries cu_seqlens[b] to [b + 1].
                Field("sparse.cu_seqlens", "offsets", cu, (0, tokens)),
                Field(
                    "sparse.prefix_lens",
                    "requests",
                    decode.host(view.rows["prefix_lens"][:rows]),
                    acc["sparse.prefix_lens"],
                ),
                # Their grid (cdiv(max_seqlen_q, BLOCK_SIZE_Q) query tiles a request)
                # covers max_seqlen_q queries of each.
                Field("sparse.extend_lens", "requests", np.diff(cu), (0, view.max_seqlen_q)),
            ]
        return decode._Engine.metadata_fields(self, rows, tokens, metadata.full) + tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as the sparse layers read them: the
        indexer scores (and the sparse attention selects among) the positions ``p <
        seq_lens[r]`` of its row ``r`` at ``req_to_token[req_pool_indices[r], p]`` (the
        step's keys stored first by ``set_fused_kv_index_buffer``); a verify's request
        those of its last query row."""
        view = metadata.sparse
        lengths = values["sparse.seq_lens"]
        pool_rows = decode.host(view.rows["req_pool_indices"][: len(lengths)])
        if view.mode == "verify":
            w = self.config.next_n
            last = np.arange(w - 1, len(lengths), w)
            lengths, pool_rows = lengths[last], pool_rows[last]
        table = self.runner.req_to_token_pool.req_to_token
        # A row past the table reads no slot known here (its range fails).
        slots = [
            decode.host(table[int(r), : max(int(n), 0)])
            if 0 <= r < table.shape[0]
            else np.zeros(0, dtype=np.int64)
            for r, n in zip(pool_rows, lengths, strict=True)
        ]
        return lengths, slots


class MiniMaxSparseLife(decode.EngineLife):
    """The engine of ``sglang-minimax-sparse``: :class:`MiniMaxSparseEngine`, kept across
    a life's steps."""

    engine_class: type[MiniMaxSparseEngine] = MiniMaxSparseEngine

    def __init__(self, engine_class: type[MiniMaxSparseEngine] | None = None) -> None:
        """``engine_class``: another engine of this life's family (a mutant's)."""
        if engine_class is not None:
            self.engine_class = engine_class
        super().__init__()

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> MiniMaxSparseEngine:
        return self.engine_class(config, device, graphs=graphs)

    def graph_read(self, engine: Any) -> list[Any]:
        """Triton's persistent buffers, which the eager build writes and the graph reads."""
        return [engine.backend.dense]


ENGINE = MiniMaxSparseLife()
"""The engine of the implementation ``sglang-minimax-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-minimax-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the verify's score bound without its drafts, re-created ----------------------------


class _WithoutDraftBound(ast.NodeTransformer):
    """Leaves out ROCm's ``if self.is_hip and ...is_target_verify(): self._max_seqlen_k +=
    self.speculative_num_draft_tokens`` (one statement, counted)."""

    def __init__(self) -> None:
        self.removed = 0

    def visit_If(self, node: ast.If) -> ast.AST | None:
        self.generic_visit(node)
        adds = [s for s in node.body if isinstance(s, ast.AugAssign)]
        if any(getattr(s.target, "attr", None) == "_max_seqlen_k" for s in adds):
            self.removed += 1
            return None
        return node


@functools.cache
def out_graph_without_draft_bound() -> Callable[..., Any]:
    """``MiniMaxSparseAttnBackend.init_forward_metadata_out_graph`` recompiled from its own
    source without the verify's ``+= speculative_num_draft_tokens`` (every other line
    unchanged)."""
    backend = importlib.import_module(BACKEND_MODULE).MiniMaxSparseAttnBackend
    fn = backend.init_forward_metadata_out_graph
    changed = _WithoutDraftBound()
    definition = changed.visit(function_tree(fn))
    if changed.removed != 1:
        raise RuntimeError(f"the verify's draft bound found {changed.removed} times, not once")
    return recompiled(fn, definition)


class _VerifyBoundWithoutDrafts(MiniMaxSparseEngine):
    """A verify's ``_max_seqlen_k`` the committed prefix's longest only: the score buffer
    its draft rows (each one key longer) write past once they cross a block."""

    def make_backend(self) -> Any:
        self.out_graph = out_graph_without_draft_bound()
        return super().make_backend()


VERIFY_BOUND_WITHOUT_DRAFTS = MiniMaxSparseLife(_VerifyBoundWithoutDrafts)


def run_verify_bound_without_drafts(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-minimax-sparse-verify-bound-without-drafts``:
    :class:`_VerifyBoundWithoutDrafts`."""
    return VERIFY_BOUND_WITHOUT_DRAFTS(inputs)


run_verify_bound_without_drafts.new_engine = VERIFY_BOUND_WITHOUT_DRAFTS.new_engine  # type: ignore[attr-defined]


def _verifies(trace: Trace) -> list[RunnerStepInputs]:
    steps = [make_inputs(case) for case in as_trace(trace).cases()]
    return [s for s in steps if s.num_reqs and step_mode(s) == "verify"]


def reach_verify(trace: Trace) -> bool:
    """A target verify: every one is built eagerly, its ``_max_seqlen_k`` by
    ``init_forward_metadata_out_graph``."""
    return bool(_verifies(trace))


def trigger_verify_bound_without_drafts(trace: Trace) -> bool:
    """A verify whose longest committed prefix ``m`` and drafts (``next_n``) pass the
    score buffer sized for ``m`` alone: ``m + next_n > cdiv(m, block) * block``."""
    w = as_trace(trace).config.next_n
    for step in _verifies(trace):
        m = max(step.num_computed_tokens)
        if m + w > cdiv(m, SPARSE_BLOCK) * SPARSE_BLOCK:
            return True
    return False


def smallest_verify_bound_without_drafts() -> Trace:
    """One request of three tokens, then its verify of ``next_n`` 2 (keys 4 and 5: the
    second block) in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 3)
