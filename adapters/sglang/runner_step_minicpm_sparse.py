"""SGLang's decode graph runner step on the MiniCPM sparse-attention backend, as the
implementation ``sglang-minicpm-sparse`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same request rows, decode
graph runner and graph stand-in), on the engine of a MiniCPM-SALA model: its attention
backend made by ``attention_registry.py:create_minicpm_flashattn_backend``
(``--attention-backend minicpm_flashattn``, what ``arg_groups/model_overrides/minicpm.py``
picks on a GPU other than Blackwell), over the model's sparse profile
(``configs/minicpm.py:MiniCPMHybridConfig``'s ``sparse_config``), on pages of one token
(``minicpm/cache.py``: "MiniCPM sparse attention requires page_size=1"). What runs,
unchanged (SGLang 0.5.23):

- ``layers/attention/minicpm/backend.py``: ``MiniCPMSparseBackend``: ``__init__`` (its
  profile's checks, ``attach_compressed_cache``); ``init_forward_metadata`` (eager: a
  decode, an extend; ``update_batch_for_sparse``, ``_copy_dense_page_tables``);
  ``init_cuda_graph_state``; ``init_forward_metadata_out_graph`` with ``in_capture=True``
  for every capture batch size (``_bind_sparse_graph_metadata``) and, from
  ``load_batch``, the replay's (``_replay_sparse_graph_metadata``,
  ``_build_sparse_decode_replay_metadata``); ``get_cuda_graph_seq_len_fill_value``;
- ``minicpm/sparse_utils.py``: ``_build_k1_k2_compression_metadata``,
  ``_compute_single_compression_metadata``, ``_plan_sparse_decode``,
  ``_plan_sparse_prefill``, ``_get_sparse_cache_lens``;
- ``minicpm/cache.py``: ``MiniCPMCompressedCache`` (the reservation of the compressed
  keys' slots, ``alloc_to_lengths`` as ``mem_cache/allocation.py`` calls it through
  ``ReqToTokenPool.alloc_aux_to_lengths`` after each step's rows are written, ``free``
  with a request's row), over SGLang's ``TokenToKVPoolAllocator``;
- ``flashattention_backend.py:FlashAttentionBackend`` (``fa_impl_ver`` 3), the base
  metadata the sparse backend layers on (as ``sglang-fa3`` runs it), with
  ``kernels/ops/attention/metadata.py``'s Triton replay kernel under Triton's interpreter;
- ``minicpm/attention_adapter.py:MiniCPMFlashAttentionAdapter.prepare_forward``.

None of these computes metadata in a Triton kernel of its own: the sparse backend's
metadata is torch on the host and the device. Stand-ins, besides the step's:
FlashAttention 3's module where it does not import (:mod:`.fa3_backend`); the vendor
kernels ``sgl_kernel``'s ``infllmv2_attn_stage1`` and ``max_pooling_1d_varlen`` (imported
at load, called by a forward only) and the JIT ``minicpm_sala/get_block_table.cuh``: the
graph stand-in never runs a forward. The KV pool's buffers are never read.

The model's profile is MiniCPM-SALA's shape scaled down to the contexts a case holds
(:data:`SPARSE_CONFIG`: its ratios, ``kernel_size = 2 * kernel_stride``, 16 query heads a
KV head, two head groups), so that requests of a few dozen tokens reach the compressed
keys, the sparse rows and the truncated top-k budget. Its ``context_len`` is the
engine's ``max_model_len`` raised to the profile's floor and rounded up to whole
strides (:func:`served_context_len`: the finding below stays apart).

Slots: the trace's KV slots are taken from SGLang's allocator before the backend
reserves the compressed cache's (``MiniCPMCompressedCache.reset_allocator``), so that the
reservation lies past every slot a request is handed, as on a server, where it is made
first and the requests' slots come after it: the two sets are disjoint either way.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``: the backend's ``forward_metadata`` after ``load_batch``, ``replay``: the
metadata the graph of that batch size captured, its views of the graph buffers as the
replay left them, ``fresh``).

Fields (:meth:`MiniCPMSparseEngine.metadata_fields`), each with the range its consumer
accepts (:meth:`MiniCPMSparseEngine.accepts`): the runner's ``seq_lens``,
``req_pool_indices``, ``out_cache_loc`` and ``positions``; the base FlashAttention
metadata the sparse path reads (``cache_seqlens_int32``, ``page_table``,
``cu_seqlens_q``, and ``cu_seqlens_k``, which the compression metadata is built from);
the sparse attention's (``flash_attn_with_kvcache`` over one row a request and head
group, or, for a sparse request of an extend, a row a query token and head group), by
request: ``sparse_cu_seqlens_q`` and ``sparse_cache_seqlens`` (each request's rows),
``sparse_page_table_g<g>`` (the row of head group ``g``; read where the row is dense: a
sparse row's is written by the forward from the top-k, ``get_block_table``) and
``dense_request``; the top-k selection's (``infllmv2_attn_stage1``,
``max_pooling_1d_varlen``, ``get_block_table``), each put back on its request (the eager
build compacts them over the sparse requests): ``topk_request``, ``topk_cache_lens``,
``topk_query_rows`` and, for an extend, ``topk_seq_lens``, ``topk_token_positions``; and
the compression of each level ``k1`` and ``k2`` (``compress_k_complete_kernel_new``):
``<k>_cu_seqlens``, ``<k>_history``, ``<k>_cu_new_token_nums``, ``<k>_cu_total``,
``<k>_table`` and ``<k>_state_slots`` (the compressed slots a row reads and writes: a
padding row touches no real request's). And ``kv_len`` and ``kv_slots``
(:meth:`MiniCPMSparseEngine.kv_read`).
A new engine's compressed slots are its own: the ``fresh`` build holds none of the
fields naming them (:attr:`MiniCPMSparseEngine.HISTORY`). Not judged:
``sparse_cu_seqlens_k`` (``flash_attn_with_kvcache``'s ``cu_seqlens_k_new``, read only
where new keys are handed: none are), and the host integers the graph bakes at capture
(``max_seq_len_k``, ``max_seqlen_q_adjusted``, the levels' ``cu_seqlens_cpu``).

Finding of SGLang's own, kept apart (:func:`table_widths_differ`): the replay copies
``req_to_sparse_k<n>_token[req_pool_indices]`` into the graph's ``k<n>.table``, whose
columns ``init_cuda_graph_state`` counts from the model's ``context_len`` while the
pool's come from the request-to-token table's width (``context_len + 4``,
``attach_compressed_cache``): where the four columns of headroom add a compressed key
(``(context_len - kernel_size) % kernel_stride >= kernel_stride - 4``; MiniCPM-SALA's
k1: a context of 12 to 15 mod 16), every replay raises on the copy.

Mutant (a re-created defect of the graph metadata): ``sglang-minicpm-sparse-table-rebound``
(the replay rebinds the level's ``table`` to the pool's rows instead of copying them into
the graph's buffer: the backend's ``forward_metadata`` is right, the graph reads the
capture's table; replay equals eager).

Not driven: ``minicpm_flashinfer`` (the FlashInfer adapter's wrappers), the fused
top-k (``SGLANG_MINICPM_FUSE_TOPK``, TileLang), ``SGLANG_MINICPM_DENSE_AS_SPARSE``, the
lightning layers of a hybrid profile (``HybridLinearAttnBackend``'s other side: this
profile's layers are all sparse), the idle batch (``real_bs == 0``: DP attention, which
MiniCPM refuses); the backend refuses a target verify and a draft extend.
"""

from __future__ import annotations

import ast
import dataclasses
import warnings
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import fa3_backend
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step, replayed
from attnfuzz.adapters.standins import function_tree, recompiled
from attnfuzz.reference.batch import Case, EngineConfig, cdiv
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)
from attnfuzz.reference.trace import Trace

DTYPE = torch.bfloat16
"""The model's and the KV cache's dtype (FlashAttention 3 runs fp16, bf16 and fp8; the
KV buffers are never read)."""

HEAD_GROUPS = 2
"""The model's KV heads: ``head_group_num`` (MiniCPM-SALA's two)."""

HEADS_PER_GROUP = 16
"""``MiniCPMSparseBackend.__init__``: "MiniCPM sparse attention requires 16 query heads
per KV head"."""

HEAD_DIM = 4
"""The heads' width: the metadata does not depend on it."""

SPARSE_CONFIG = dict(
    kernel_size=16,
    kernel_stride=8,
    block_size=32,
    window_size=32,
    topk=1,
    init_blocks=1,
    dense_len=48,
)
"""The model's ``sparse_config``: MiniCPM-SALA's ratios (a compression window of two
strides, blocks of four, a local window of whole blocks) at a scale a case reaches: k1
keys from 16 tokens on, k2 (four times the window and stride) from 64, a request sparse
from ``dense_len`` 48 tokens, a top-k budget of ``(topk + window / block) * block`` = 64
keys. The stride exceeds the request-to-token table's headroom of 4 columns, as
MiniCPM-SALA's 16 does (the finding of :func:`table_widths_differ`)."""

SPARSE_CAPACITY = SPARSE_CONFIG["block_size"] * (
    SPARSE_CONFIG["topk"] + SPARSE_CONFIG["window_size"] // SPARSE_CONFIG["block_size"]
)
"""``num_sparse_topk_tokens``: the keys a sparse row reads at most."""

LEVELS = ("k1", "k2")
"""The compression levels: ``k2``'s window and stride four times ``k1``'s."""

PAGE_SIZE = 1
"""``MiniCPMCompressedCache.reset_allocator``: the sparse cache runs on pages of one token."""


def prepare() -> None:
    """Import SGLang's runner and the MiniCPM backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention.minicpm import backend  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang never runs the MiniCPM sparse backend on ``case``'s step, else None.
    Pages other than one token are the fixed ``block_size``'s (``Implementation.fixes``)."""
    if case.config.num_spec:
        return (
            "speculative decoding: MiniCPMSparseBackend.init_forward_metadata raises "
            "NotImplementedError for a target verify ('MiniCPM backend does not support "
            "speculative decoding')"
        )
    return None


def served_context_len(config: EngineConfig) -> int:
    """The model's ``context_len`` of ``sglang-minicpm-sparse``: ``max_model_len`` raised
    to what the backend requires (``__init__``: at least ``dense_len`` and the top-k
    budget) and rounded up to whole strides of ``k2`` (four of ``k1``), so that the
    request-to-token table's headroom adds no compressed key (:func:`table_widths_differ`)."""
    floor = max(config.max_model_len, SPARSE_CONFIG["dense_len"], SPARSE_CAPACITY)
    stride = 4 * SPARSE_CONFIG["kernel_stride"]
    return cdiv(floor, stride) * stride


def level_len(length: int, level: str) -> int:
    """The compressed keys of ``length`` tokens at ``level`` (``_sparse_len``)."""
    scale = 1 if level == "k1" else 4
    size, stride = SPARSE_CONFIG["kernel_size"] * scale, SPARSE_CONFIG["kernel_stride"] * scale
    return 0 if length < size else (length - size) // stride + 1


def table_widths_differ(context_len: int, extra: int = decode.EXTRA_CONTEXT) -> bool:
    """Whether the pool's compressed tables (``attach_compressed_cache``: from the
    request-to-token table's ``context_len + extra`` columns) are wider than the graph's
    (``init_cuda_graph_state``: from ``context_len``) at a level: the replay's ``copy_``
    then raises."""
    return any(level_len(context_len + extra, k) != level_len(context_len, k) for k in LEVELS)


# -- the engine ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Layout:
    """A build's sparse-attention rows: each request's first row and how many it has
    (``n`` of them: one a head group, or one a query token and head group), and whether
    the forward reads the metadata's page-table rows (dense) or writes them (sparse)."""

    start: np.ndarray
    count: np.ndarray
    dense: np.ndarray


class MiniCPMSparseEngine(decode._Engine):
    """One SGLang engine of a MiniCPM-SALA model: its attention backend
    ``MiniCPMSparseBackend`` over FlashAttention 3, its compressed cache."""

    ATTENTION_BACKEND = "minicpm_flashattn"
    WHERE = {
        "eager": "minicpm/backend.py:MiniCPMSparseBackend.init_forward_metadata",
        "fresh": "minicpm/backend.py:MiniCPMSparseBackend.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "MiniCPMSparseBackend._replay_sparse_graph_metadata's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: MiniCPMSparseBackend._bind_sparse_graph_metadata's views of "
        "its graph buffers, as the replay left them)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(MiniCPMSparseBackend._bind_sparse_graph_metadata, in_capture)",
    }
    HISTORY = tuple(f"{k}_{name}" for k in LEVELS for name in ("table", "state_slots"))
    """Fields that name compressed slots: ``alloc_to_lengths`` hands them in the order
    the engine's requests grew, a new engine's are its own: history picks them."""

    def context_len(self) -> int:
        """The model's ``context_len`` (``--context-length``)."""
        return served_context_len(self.config)

    def make_backend(self) -> Any:
        """``create_minicpm_flashattn_backend(model_runner)``, on a MiniCPM-SALA model
        config, a request-to-token table of the served context, and an allocator whose
        slots past the trace's the compressed cache reserves."""
        from sglang.srt.configs.minicpm import MiniCPMHybridConfig
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        runner, config, context_len = self.runner, self.config, self.context_len()
        heads = HEADS_PER_GROUP * HEAD_GROUPS
        with warnings.catch_warnings():  # transformers' notice of its own rope fields
            warnings.simplefilter("ignore", FutureWarning)
            hf_config = MiniCPMHybridConfig(
                num_attention_heads=heads,
                num_key_value_heads=HEAD_GROUPS,
                head_dim=HEAD_DIM,
                hidden_size=heads * HEAD_DIM,
                num_hidden_layers=1,
                mixer_types=["minicpm4"],
                max_position_embeddings=context_len,
                sparse_config=dict(SPARSE_CONFIG),
            )
        model = runner.model_config
        model.hf_config = model.hf_text_config = hf_config
        model.num_attention_heads = heads
        model.get_num_kv_heads = lambda tp_size, dcp_size=1: HEAD_GROUPS // tp_size
        model.get_max_num_attention_heads = lambda: heads
        model.head_dim = model.v_head_dim = model.swa_v_head_dim = HEAD_DIM
        model.hidden_size = heads * HEAD_DIM
        model.context_len = context_len
        model.is_local_attention_model = False
        runner.dtype = runner.kv_cache_dtype = model.dtype = DTYPE
        runner.kv_cache_dtype_str = "auto"
        # kv_cache_configurator's ReqToTokenPool: the model's context and the row headroom.
        pool = ReqToTokenPool(
            size=config.max_num_seqs,
            max_context_len=context_len + get_req_to_token_extra_context_len(),
            device=str(self.device),
            enable_memory_saver=False,
        )
        # The trace's slots (page size 1: its pages), then room for the compressed cache:
        # reset_allocator reserves 5 / (4 * stride + 5) of what is free, which holds every
        # request's k1 and k2 keys at the context's length.
        dense = runner.token_to_kv_pool.size
        stride = SPARSE_CONFIG["kernel_stride"]
        keys = config.max_num_seqs * sum(level_len(context_len, k) for k in LEVELS)
        spare = cdiv(keys * (4 * stride + 5), 5) + 4 * stride + 5
        kv_pool = runner.token_to_kv_pool
        kv_pool.size = dense + spare
        allocator = TokenToKVPoolAllocator(
            size=kv_pool.size,
            dtype=DTYPE,
            device=str(self.device),
            kvcache=kv_pool,
            need_sort=False,
        )
        allocator.alloc(dense)  # the trace's slots 1 .. dense: requests hold them
        runner.req_to_token_pool, runner.token_to_kv_pool_allocator = pool, allocator
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=pool.req_to_token,
            token_to_kv_pool_allocator=None,
            token_to_kv_pool=kv_pool,
            page_size=PAGE_SIZE,
            device=str(self.device),
        )
        with fa3_backend.flash_attn_module():
            return ATTENTION_BACKENDS[self.ATTENTION_BACKEND](runner)

    def write_rows(self, inputs: RunnerStepInputs) -> None:
        """The step's request-to-token rows, then each request's compressed slots up to
        its new length (``allocation.py``: ``alloc_for_extend`` and ``alloc_for_decode``
        call ``req_to_token_pool.alloc_aux_to_lengths`` after writing the rows)."""
        super().write_rows(inputs)
        rows = [self.requests[i].row for i in inputs.req_ids]
        lengths = [
            c + q for c, q in zip(inputs.num_computed_tokens, inputs.query_lens, strict=True)
        ]
        self.runner.req_to_token_pool.alloc_aux_to_lengths(
            req_pool_indices_cpu=torch.tensor(rows, dtype=torch.int64),
            target_seq_lens_cpu=torch.tensor(lengths, dtype=torch.int64),
        )

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay preparation left as its metadata."""
        return self.backend.forward_metadata

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        """The step's eager build; a new engine's without the fields of its own slots."""
        build = super().eager(inputs, mode, how=how)
        if how != "fresh":
            return build
        kept = tuple(f for f in build.fields if f.name not in self.HISTORY)
        return dataclasses.replace(build, fields=kept)

    # -- what the consumers accept -------------------------------------------------------------

    def kv_rows(self) -> int:
        """The KV cache's rows: the pool's slots and the padding slot 0
        (``get_paged_mha_kv_cache`` views ``size + page_size`` of them)."""
        return self.runner.token_to_kv_pool.size + PAGE_SIZE

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`), and the sparse path's."""
        acc = decode._Engine.accepts(self)
        kv_rows, context = self.kv_rows(), self.backend.max_context_len
        # compress_k_complete_kernel_new loads key_cache[token_table[b, y]] (the base page
        # table) and loads and stores key_cache[compressed_k_table[b, c]] (a level's
        # table); get_block_table reads G * block_table[...] + g: rows of the KV pool.
        acc["page_table"] = (0, kv_rows - 1)
        acc["compressed_slots"] = (0, kv_rows - 1)
        # flash_attn_with_kvcache (MiniCPMFlashAttentionAdapter.forward) reads the KV cache
        # that get_paged_mha_kv_cache(head_group_num=G) views as G pseudo-pages a slot:
        # sparse_page_table entries slot * G + g (_copy_dense_page_table, get_block_table).
        acc["sparse_page_table"] = (0, kv_rows * HEAD_GROUPS - 1)
        # max_pooling_1d_varlen: (query index + cache_len) / block_size, the query's block:
        # a position of the context.
        acc["topk_cache_lens"] = (0, context - 1)
        acc["dense_request"] = (0, 1)
        return acc

    # -- the fields ----------------------------------------------------------------------------

    def _graph_buffers(self, metadata: Any) -> dict[str, torch.Tensor] | None:
        """The graph's buffers where ``metadata`` views them (a capture's or a replay's),
        else None (an eager build)."""
        buffers = getattr(self.backend, "decode_cuda_graph_metadata", None)
        if not buffers or "sparse_page_table" not in buffers:
            return None
        mine = metadata.sparse_page_table.untyped_storage().data_ptr()
        ours = buffers["sparse_page_table"].untyped_storage().data_ptr()
        return buffers if mine == ours else None

    def _layout(self, rows: int, metadata: Any, graph: bool) -> _Layout:
        """Each request's sparse rows (``_plan_sparse_decode``: a head group each, request
        by request; ``_plan_sparse_prefill``: a sparse request's query tokens each a row a
        head group, a dense one's a row a head group), and which the forward takes from
        the metadata. The graph's forward (``forward_decode``) selects the top-k rows of
        every request whose ``cache_seqlens >= dense_len``; an eager one writes those of
        ``sparse_bs_list``."""
        base, sparse = metadata.base, set(metadata.sparse_bs_list or ())
        if graph:
            lens = decode.host(base.cache_seqlens_int32[:rows])
            dense = lens < self.backend.dense_len
        else:
            dense = np.array([b not in sparse for b in range(rows)], dtype=bool)
        q = np.diff(decode.host(base.cu_seqlens_q[: rows + 1]))
        extend = metadata.token_pos_in_bs is not None
        count = np.where(~dense & extend, q * HEAD_GROUPS, HEAD_GROUPS)
        start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        return _Layout(start, count.astype(np.int64), dense)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the consumers read of ``MiniCPMSparseMetadata`` ``metadata`` for ``rows``
        requests and ``tokens`` tokens (padding included), copied now."""
        acc, base = self.accepts(), metadata.base
        buffers = self._graph_buffers(metadata)
        layout = self._layout(rows, metadata, buffers is not None)
        table = decode.host(base.page_table[:rows])
        lens = decode.host(base.cache_seqlens_int32[:rows])
        out = [
            # get_block_table bounds its reads of block_table[b] by seqlen_q[b] (these
            # lengths): at most the table's width; forward_decode compares them with
            # dense_len.
            Field("cache_seqlens_int32", "requests", lens, (0, table.shape[1])),
            Field("page_table", "requests", table, acc["page_table"], row_lengths=lens),
            # The top-k's queries (compressed_attention's cu_seqlens_q): the step's tokens.
            Field(
                "cu_seqlens_q", "offsets", decode.host(base.cu_seqlens_q[: rows + 1]), (0, tokens)
            ),
            # _build_k1_k2_compression_metadata's token counts: no kernel reads it.
            Field("cu_seqlens_k", "offsets", decode.host(base.cu_seqlens_k[: rows + 1])),
        ]
        out += self._sparse_attention_fields(rows, tokens, metadata, layout)
        out += self._topk_fields(rows, tokens, metadata, layout, buffers is not None)
        for level in LEVELS:
            out += self._compression_fields(level, rows, metadata, buffers)
        return tuple(out)

    def _sparse_attention_fields(
        self, rows: int, tokens: int, metadata: Any, layout: _Layout
    ) -> list[Field]:
        """``MiniCPMFlashAttentionAdapter.forward``'s ``flash_attn_with_kvcache``: each
        request's rows of ``sparse_cu_seqlens_q``, ``sparse_cache_seqlens_int32`` and
        ``sparse_page_table``."""
        acc = self.accepts()
        cu_q = decode.host(metadata.sparse_cu_seqlens_q)
        lens = decode.host(metadata.sparse_cache_seqlens_int32)
        table = decode.host(metadata.sparse_page_table)
        width = int(layout.count.max(initial=1))
        starts = np.zeros((rows, width + 1), dtype=np.int64)
        kv = np.zeros((rows, width), dtype=np.int64)
        for b, (s, n) in enumerate(zip(layout.start, layout.count, strict=True)):
            starts[b, : n + 1] = cu_q[s : s + n + 1]
            kv[b, :n] = lens[s : s + n]
        out = [
            # The kernel reads q[cu_seqlens_q[r] : cu_seqlens_q[r + 1]] of the queries by
            # head group (the step's tokens, G rows each).
            Field(
                "sparse_cu_seqlens_q",
                "requests",
                starts,
                (0, tokens * HEAD_GROUPS),
                row_lengths=layout.count + 1,
            ),
            # A paged KV's seqlen_k is at most page_table.size(1) * page_size (mha_fwd).
            Field(
                "sparse_cache_seqlens",
                "requests",
                kv,
                (0, table.shape[1]),
                row_lengths=layout.count,
            ),
            # Which rows the forward reads from the metadata (dense) or writes from the
            # top-k (forward_decode, forward_extend: get_block_table).
            Field("dense_request", "requests", layout.dense.astype(np.int64), acc["dense_request"]),
        ]
        for g in range(HEAD_GROUPS):
            # A dense request's row of head group g (_copy_dense_page_table): its
            # cache_seqlens entries read; a sparse request's the forward writes.
            group = table[layout.start + g] if len(table) else np.zeros((rows, 0), np.int64)
            read = np.where(layout.dense, kv[:, g], 0)
            out.append(
                Field(
                    f"sparse_page_table_g{g}",
                    "requests",
                    group,
                    acc["sparse_page_table"],
                    row_lengths=read,
                )
            )
        return out

    def _topk_fields(
        self, rows: int, tokens: int, metadata: Any, layout: _Layout, graph: bool
    ) -> list[Field]:
        """The top-k selection's inputs, each on its request (or query token): the eager
        build compacts them over ``sparse_bs_list``, the graph's hold every request."""
        acc = self.accepts()
        sparse = list(range(rows)) if graph else list(metadata.sparse_bs_list)
        read = (~layout.dense).astype(np.int64)
        extend = metadata.token_pos_in_bs is not None
        block_table = decode.host(metadata.token_to_bs)
        q_rows = np.diff(decode.host(metadata.cu_seqlens_q_adjusted))
        request = np.zeros((rows, 1), dtype=np.int64)
        queries = np.zeros((rows, 1), dtype=np.int64)
        cache = np.zeros((rows, 1), dtype=np.int64)
        if extend:
            on_tokens = np.zeros((tokens, 1), dtype=np.int64)
            positions = np.zeros((tokens, 1), dtype=np.int64)
            token_read = np.zeros(tokens, dtype=np.int64)
            seq_lens = np.zeros((rows, 1), dtype=np.int64)
            q = np.diff(decode.host(metadata.base.cu_seqlens_q[: rows + 1]))
            first = np.concatenate([[0], np.cumsum(q)]).astype(np.int64)
            if sparse:  # the top-k's offsets exist where a request is sparse
                seq_k = decode.host(metadata.seqlen_k_sparse_bs_tensor)
                seq_q = np.diff(decode.host(metadata.topk_cu_seqlens_q))
                own = np.diff(decode.host(metadata.topk_cu_seqlens_k))
            pos, compact = decode.host(metadata.token_pos_in_bs), 0
            for j, b in enumerate(sparse):
                seq_lens[b, 0] = seq_k[j]
                queries[b, 0] = q_rows[j]
                # sparse_get_topk_impl: cache_lens = seq_lens_k - seq_lens_q (the prefix).
                cache[b, 0] = own[j] - seq_q[j]
                for t in range(first[b], first[b + 1]):
                    # get_block_table reads block_table[token_to_bs[t]] (of the sparse
                    # requests' rows) for each of their query tokens, in order.
                    on_tokens[t, 0] = self._request_of(block_table[compact], sparse)
                    positions[t, 0] = pos[compact]
                    token_read[t] = 1
                    compact += 1
            width = metadata.base.page_table.shape[1]
            return [
                Field("topk_request", "tokens", on_tokens, (0, rows - 1), row_lengths=token_read),
                # get_block_table reads block_table[b, i] for i < min(seq, position).
                Field(
                    "topk_token_positions", "tokens", positions, (0, width), row_lengths=token_read
                ),
                Field("topk_seq_lens", "requests", seq_lens, (0, width), row_lengths=read),
                Field("topk_query_rows", "requests", queries, row_lengths=read),
                Field(
                    "topk_cache_lens", "requests", cache, acc["topk_cache_lens"], row_lengths=read
                ),
            ]
        stage1 = decode.host(metadata.cache_seqlens_int32_stage1)
        for j, b in enumerate(sparse):
            request[b, 0] = self._request_of(block_table[j], sparse)
            queries[b, 0] = q_rows[j]
            cache[b, 0] = stage1[j]
        return [
            # get_block_table's block_table[token_to_bs[j]] (forward_decode: the page table
            # of the sparse requests eagerly, the whole graph's in the graph), as a request.
            Field("topk_request", "requests", request, (0, rows - 1), row_lengths=read),
            # infllmv2_attn_stage1's cu_seqlens_q_adjusted: each request's query rows.
            Field("topk_query_rows", "requests", queries, row_lengths=read),
            Field("topk_cache_lens", "requests", cache, acc["topk_cache_lens"], row_lengths=read),
        ]

    @staticmethod
    def _request_of(index: int, sparse: list[int]) -> int:
        """The request of row ``index`` of the top-k's block table; an index past it as is
        (its range says so)."""
        return sparse[index] if 0 <= index < len(sparse) else int(index)

    def _compression_fields(
        self, level: str, rows: int, metadata: Any, buffers: dict[str, torch.Tensor] | None
    ) -> list[Field]:
        """``compress_k_complete_kernel_new`` of ``level`` (``get_compress_k_v2``): per row
        ``b``, ``history[b]`` compressed keys copied from ``table[b, c]`` and the new ones
        its ``cu_new_token_nums`` tokens complete, mean-pooled into ``table[b, c]``; both
        written to the step's compressed keys at ``cu_total[b] + c``, which the top-k reads
        by ``cu_seqlens``."""
        acc = self.accepts()
        meta = getattr(metadata, level)
        scale = 1 if level == "k1" else 4
        size, stride = SPARSE_CONFIG["kernel_size"] * scale, SPARSE_CONFIG["kernel_stride"] * scale
        history = decode.host(meta.history_compress_token_nums[:rows])
        cu_new = decode.host(meta.cu_new_token_nums[: rows + 1])
        new_tokens = np.diff(cu_new)
        new = np.where(new_tokens >= size, (new_tokens - size) // stride + 1, 0)
        table = decode.host(meta.table[:rows])
        touched = np.minimum(history + new, table.shape[1])  # the kernel's own guard
        held = np.zeros((rows, max(1, int(touched.max(initial=0)))), dtype=np.int64)
        for b in range(rows):
            held[b, : max(touched[b], 0)] = table[b, : max(touched[b], 0)]
        # The step's compressed keys: the eager build's tensor of cu_seqlens_cpu[-1] rows
        # (allocate_and_compress_keys, _compress_decode_keys), the graph's compress buffer.
        keys = buffers[f"compress_{level}"].shape[0] if buffers else meta.cu_seqlens_cpu[-1]
        return [
            Field(
                f"{level}_cu_seqlens",
                "offsets",
                decode.host(meta.cu_seqlens[: rows + 1]),
                (0, keys),
            ),
            # history_compress_token_nums[b] columns of table[b] read, unguarded.
            Field(f"{level}_history", "requests", history, (0, table.shape[1])),
            Field(f"{level}_cu_new_token_nums", "offsets", cu_new),
            Field(
                f"{level}_cu_total",
                "offsets",
                decode.host(meta.cu_total_compress_token_nums[: rows + 1]),
                (0, keys),
            ),
            Field(
                f"{level}_table", "requests", table, acc["compressed_slots"], row_lengths=touched
            ),
            # The compressed slots a row's compression reads (its history) and stores its
            # new keys to (key_cache): a real request's are its state, which no padding
            # row may touch.
            Field(
                f"{level}_state_slots",
                "requests",
                held,
                acc["compressed_slots"],
                row_lengths=touched,
                writes_state=True,
                null_slot=0,
            ),
        ]

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as its attention reads them: a dense
        request's ``sparse_cache_seqlens`` keys of its head group 0 row
        (``sparse_page_table`` entries ``slot * G``); a sparse request's top-k selects
        among its ``cache_seqlens_int32`` keys at ``page_table[b]`` (``get_block_table``)."""
        dense = values["dense_request"].astype(bool)
        lengths = np.where(
            dense, values["sparse_cache_seqlens"][:, 0], values["cache_seqlens_int32"]
        )
        slots = []
        for b, n in enumerate(lengths):
            if dense[b]:
                slots.append(values["sparse_page_table_g0"][b, : max(n, 0)] // HEAD_GROUPS)
            else:
                slots.append(values["page_table"][b, : max(n, 0)])
        return lengths, slots


class MiniCPMSparseLife(decode.EngineLife):
    """The engine of ``sglang-minicpm-sparse``: :class:`MiniCPMSparseEngine`, kept across a
    life's steps."""

    engine_class: type[MiniCPMSparseEngine] = MiniCPMSparseEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> MiniCPMSparseEngine:
        return self.engine_class(config, device, graphs=graphs)


ENGINE = MiniCPMSparseLife()
"""The engine of the implementation ``sglang-minicpm-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-minicpm-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


class _Life(MiniCPMSparseLife):
    def __init__(self, engine: type[MiniCPMSparseEngine]) -> None:
        self.engine_class = engine
        super().__init__()


# -- mutant: a defect of the backend's graph metadata, re-created ------------------------------


class _CopyToRebind(ast.NodeTransformer):
    """``dst.table.copy_(rows)`` -> ``dst.table = rows``: the pool's rows bound to the
    metadata, the graph's buffer left as it was."""

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        call = node.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "copy_"
            and ast.unparse(call.func.value) == "dst.table"
        ):
            target = ast.Attribute(ast.Name("dst", ast.Load()), "table", ast.Store())
            return ast.copy_location(ast.Assign([target], call.args[0]), node)
        return node


def rebound_replay() -> Any:
    """``MiniCPMSparseBackend._replay_sparse_graph_metadata`` recompiled from its own
    source with the level table's copy into the graph buffer a rebinding (every other line
    unchanged)."""
    from sglang.srt.layers.attention.minicpm.backend import MiniCPMSparseBackend

    fn = MiniCPMSparseBackend._replay_sparse_graph_metadata
    definition = _CopyToRebind().visit(function_tree(fn))
    assert "dst.table = " in ast.unparse(definition), "the replay's table copy moved"
    return recompiled(fn, definition)


class _TableRebound(MiniCPMSparseEngine):
    """The replay's ``k<n>.table`` rebound to ``req_to_sparse[req_pool_indices]`` (a new
    tensor the metadata the backend holds then names) instead of copied into the graph's
    ``<k>.table`` buffer, which the graph captured and no replay writes again."""

    def make_backend(self) -> Any:
        import types

        backend = super().make_backend()
        backend._replay_sparse_graph_metadata = types.MethodType(rebound_replay(), backend)
        return backend


TABLE_REBOUND = _Life(_TableRebound)


def run_table_rebound(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-minicpm-sparse-table-rebound``: :class:`_TableRebound`."""
    return TABLE_REBOUND(inputs)


run_table_rebound.new_engine = TABLE_REBOUND.new_engine  # type: ignore[attr-defined]


def reach_replay(trace: Trace) -> bool:
    """A decode the decode graph replays."""
    return bool(replayed(trace))


def trigger_table_rebound(trace: Trace) -> bool:
    """A replayed decode of a request with a compressed key at least (``k1``: the
    compression window's tokens): the graph's table row is then read."""
    return any(
        level_len(c + q, "k1") > 0
        for s in replayed(trace)
        for c, q in zip(s.num_computed_tokens, s.query_lens, strict=True)
    )


def smallest_table_rebound() -> Trace:
    """One request of 15 tokens, then its decode (the 16th key: its first k1 key) in the
    graph of one."""
    config = EngineConfig(max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, SPARSE_CONFIG["kernel_size"] - 1)
