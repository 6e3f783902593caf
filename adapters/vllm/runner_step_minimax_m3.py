"""vLLM's model runner V1 step of MiniMax M3's block-sparse attention, as the
implementation ``vllm-v1-minimax-m3-sparse`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer, a
sparse layer as ``MiniMaxM3MTP``'s is) a MiniMax M3 sparse attention layer wired as
``MiniMaxM3SparseAttention.__init__`` wires it (``vllm/models/minimax_m3/nvidia/
model.py``): its main backend and impl chosen by ``select_main_backend_and_impl_cls``,
its paged K/V cache the ``FullAttentionSpec`` its ``get_kv_cache_spec`` makes (one
128-wide head a KV head, the model's dtype), and its lightning indexer a
``MiniMaxM3Indexer`` made by its own constructor (``common/indexer.py``), which picks
its impl (``select_indexer_impl_cls``) and makes the index-key side cache
``MiniMaxM3IndexerCache`` (``<layer>.index_cache``, its spec its own
``get_kv_cache_spec``: an ``MLAAttentionSpec`` of the ``INDEXER`` role). vLLM's own
``get_kv_cache_groups`` puts the caches (two a sparse layer) in one KV-cache group (of
``UniformTypeKVCacheSpecs``: every layer full attention), and the runner's own
``initialize_attn_backend`` splits it by backend into the attention groups whose
builders run on every step: eager, padded for the graph, replayed, afresh, the
drafter's sub-steps, and the capture runs. The model's config (the engine's copy) has
the ``sparse_attention_config`` the layer and the builders read: top-k 8 blocks of 128
tokens, one index head a KV head, an index key of 128.

As an sm100 (Blackwell) GPU runs the model with a bf16 cache and that top-k, the main
backend is ``MiniMaxM3SparseMSABackend`` (``nvidia/sparse_attention_msa.py``) and the
indexer's impl the Triton one (``fmha_sm100``'s top-k takes 16 blocks only), so that:

- ``MiniMaxM3SparseMSAMetadataBuilder`` (``__init__``, ``build``) builds the main
  metadata through ``MiniMaxM3SparseMetadataBuilder`` (``common/sparse_attention.py``;
  ``AttentionCGSupport.UNIFORM_BATCH``: FULL becomes FULL_AND_PIECEWISE): the split
  with ``require_uniform`` at ``1 + num_spec`` (the runner reorders the batch decode
  first), the context lengths in the builder's buffer, the decodes' seq_lens, block
  table and uniform query length, the prefills' query offsets (rebased to the first
  prefill token), cumulative KV lengths, seq_lens, context lengths, block table and
  the KV blocks the MSA prefill's CSR holds (``total_kv_blocks``, from the host upper
  bound of the seq_lens); the CUTLASS decode plan is asked for no shape here (the
  model's decode backend is Triton, ``should_prepare_decode_metadata``);
- ``MiniMaxM3IndexerTritonMetadataBuilder`` (on ``MiniMaxM3IndexerMetadataBuilder``'s
  ``__init__``) builds the indexer's: the same split, the decodes' seq_lens, block
  table, ``max_seq_len`` and query lengths, the prefills' query offsets, seq_lens,
  context lengths and block table.

Stood in, where the MiniMax M3 modules read them: ``current_platform`` as a CUDA build
on an sm100 GPU (``common/sparse_attention.py``, ``common/indexer.py``,
``nvidia/msa_cutlass_sparse_decode.py``: CUDA, of the family 100, fp8 supported, not
ROCm), and the tensor-parallel world size the indexer's builder asks (one rank: no
process group is made here). The model package's ``__init__`` is not run: it
re-exports the model classes, whose vision tower imports ``torchvision`` (absent here);
the metadata modules are imported on their own (:func:`_modules`).

Fields: ``vllm-v1``'s slot mapping (the main cache's) and positions, and every field
the kernels read of the two metadata, with the range each consumer accepts:

- the main attend's (``MiniMaxM3SparseMSAImpl.forward``; ``m3.*``): of the decodes
  (the Triton split-K ``minimax_m3_sparse_attn_decode``), seq_lens, the block table
  (read to ``cdiv(seq_len, 128)`` pages) and each token's keys (``kv_len``, through its
  request ``t // decode_query_len``); of the prefills (``fmha_sm100``'s
  ``build_k2q_csr`` and ``sparse_atten_func``), the query offsets (within the
  ``num_prefill_tokens`` rows of ``q[nd:]``), query lengths (at most
  ``max_query_len``), seq_lens, the block table, the KV lengths of ``cu_seqlens_k``
  (within ``max_seq_len``'s KV blocks) and the CSR rows they end at (within
  ``total_kv_blocks``). The MSA attend reads no context length (sm90's Triton one
  does);
- the indexer's (``MiniMaxM3IndexerTritonImpl.forward``: ``minimax_m3_index_decode``,
  ``minimax_m3_index_score``, ``minimax_m3_index_topk`` in ``common/ops/
  index_topk.py``; ``m3.index.*``): the index cache's slot mapping (the fused insert's),
  each token's scored keys (``kv_len``); of the decodes, seq_lens, the block table,
  each token's KV blocks (within ``cdiv(max_seq_len, 128)``, the score row the split-K
  top-k covers) and query length (at most ``max_decode_query_len``); of the prefills,
  the query offsets and lengths, seq_lens (within the score row), the block table and
  the context lengths;
- ``kv_len``/``kv_slots``: the keys each request's tokens may attend to (the indexer
  picks blocks among them).

Not driven: the CUTLASS decode plan (``prepare_decode_metadata``: an fp8 cache, top-k
16 and 16 decodes at least, ``fmha_sm100_plan``), the AITER page-16 slot mapping
(ROCm), the MSA indexer (top-k 16) and its builder, the model's dense layers.

Declined: ``vllm-v1``'s cases, and pages of other than 128 tokens (both backends'
``get_supported_kernel_block_sizes``: one sparse block a page).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.standins import function_tree, recompiled
from attnfuzz.adapters.vllm import _engine
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import _LAYER, num_blocks
from attnfuzz.adapters.vllm.slot_mapping import host_memory
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_PACKAGE = "vllm.models.minimax_m3"
_SPARSE = "vllm/models/minimax_m3/common/sparse_attention.py"
BLOCK_SIZE = 128
"""Both backends' only kernel block size: a page is one sparse block (``SPARSE_BLOCK_SIZE``)."""
HEAD_DIM = 128  # MiniMaxM3SparseBackend.get_supported_head_sizes
INDEX_DIM = 128  # MiniMaxM3IndexerBackend.get_supported_head_sizes
TOPK_BLOCKS = 8
"""The model config's ``sparse_topk_blocks``: an MSA width (4, 8, 16, 32) that is not
``fmha_sm100``'s top-k's (16), so the indexer's impl is the Triton one."""
SPARSE_ATTENTION_CONFIG = {
    "sparse_topk_blocks": TOPK_BLOCKS,
    "sparse_block_size": BLOCK_SIZE,
    "sparse_index_dim": INDEX_DIM,
    "sparse_init_block": 1,
    "sparse_local_block": 1,
    "sparse_score_type": "max",
}
"""The model config's ``sparse_attention_config`` (the engine's copy; its index heads
the KV heads, as MiniMax M3's are)."""


def index_layer(layer: str) -> str:
    """The index cache of the sparse layer ``layer`` (``MiniMaxM3IndexerImpl``)."""
    return f"{layer}.index_cache"


@functools.cache
def _modules() -> SimpleNamespace:
    """MiniMax M3's metadata modules, imported without the model package's ``__init__``
    (it re-exports the model classes, whose vision tower imports ``torchvision``): the
    package stands as an empty one while they import, then is taken out again, so that
    an ``import vllm.models.minimax_m3`` elsewhere runs the real ``__init__``."""
    names = ("common.sparse_attention", "common.indexer", "nvidia.sparse_attention_msa",
             "nvidia.msa_cutlass_sparse_decode")  # fmt: skip
    if _PACKAGE in sys.modules:
        return SimpleNamespace(
            **{n.split(".")[1]: importlib.import_module(f"{_PACKAGE}.{n}") for n in names}
        )
    spec = importlib.util.find_spec(_PACKAGE)
    assert spec is not None and spec.submodule_search_locations is not None
    package = types.ModuleType(_PACKAGE)
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules[_PACKAGE] = package
    try:
        return SimpleNamespace(
            **{n.split(".")[1]: importlib.import_module(f"{_PACKAGE}.{n}") for n in names}
        )
    finally:
        if sys.modules.get(_PACKAGE) is package:
            del sys.modules[_PACKAGE]


def prepare() -> None:
    """Import vLLM's V1 runner and MiniMax M3's metadata modules before a judge forks."""
    v1.prepare()
    _modules()


class _Sm100:
    """``current_platform`` as the MiniMax M3 modules ask it on an sm100 CUDA build: CUDA,
    of the family 100 (capability 10.0), fp8 supported, not ROCm; anything else the
    platform's."""

    def __init__(self, platform: Any) -> None:
        self._platform = platform

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def supports_fp8(self) -> bool:
        return True

    def is_device_capability_family(self, family: int, device_id: int = 0) -> bool:
        return family == 100

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        return capability in ((10, 0), 100)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


@contextlib.contextmanager
def sm100() -> Iterator[None]:
    """The MiniMax M3 modules as they run on an sm100 GPU, with one tensor-parallel rank
    (module docstring)."""
    m = _modules()
    with contextlib.ExitStack() as stack:
        for module in (m.sparse_attention, m.indexer, m.msa_cutlass_sparse_decode):
            stack.enter_context(
                mock.patch.object(module, "current_platform", _Sm100(module.current_platform))
            )
        stack.enter_context(
            mock.patch.object(m.indexer, "get_tensor_model_parallel_world_size", lambda: 1)
        )
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and pages of other
    than 128 tokens."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size != BLOCK_SIZE:
        return (
            f"block_size {config.block_size}: MiniMax M3's pages are one sparse block of "
            f"{BLOCK_SIZE} tokens ({_SPARSE} "
            "MiniMaxM3SparseBackend.get_supported_kernel_block_sizes)"
        )
    return v1.declines_config(config)


# -- the layers ----------------------------------------------------------------------------


def _sparse_layer(vllm_config: Any, name: str) -> Any:
    """A sparse attention layer as ``MiniMaxM3SparseAttention.__init__`` wires it (its
    projections, norms and rotary embedding left out: no metadata reads them): the
    main backend and impl it selects, its indexer made by ``MiniMaxM3Indexer``'s own
    constructor (whose index cache registers itself), the layer registered under
    ``name`` in the static forward context."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

    m = _modules()
    config = vllm_config.model_config.hf_text_config
    sparse = config.sparse_attention_config
    num_heads = config.num_attention_heads  # one tensor-parallel rank
    num_kv_heads = config.num_key_value_heads
    kv_cache_dtype = vllm_config.cache_config.cache_dtype
    scale = HEAD_DIM**-0.5
    backend, impl_cls = m.sparse_attention.select_main_backend_and_impl_cls(
        topk_blocks=sparse["sparse_topk_blocks"], kv_cache_dtype=kv_cache_dtype,
        num_kv_heads=num_kv_heads,
    )  # fmt: skip
    impl = impl_cls(
        num_heads, HEAD_DIM, scale, num_kv_heads, kv_cache_dtype=kv_cache_dtype,
        topk_blocks=sparse["sparse_topk_blocks"], sparse_block_size=sparse["sparse_block_size"],
        msa_decode_backend=vllm_config.attention_config.minimax_m3_msa_decode_backend,
    )  # fmt: skip
    context = vllm_config.compilation_config.static_forward_context
    context.pop(index_layer(name), None)
    indexer = m.indexer.MiniMaxM3Indexer(
        num_kv_heads=num_kv_heads, scale=scale, topk_blocks=sparse["sparse_topk_blocks"],
        sparse_block_size=sparse["sparse_block_size"], num_index_heads=num_kv_heads,
        index_head_dim=sparse["sparse_index_dim"], prefix=name,
        init_blocks=sparse.get("sparse_init_block", 0),
        local_blocks=sparse.get("sparse_local_block", 0),
        score_type=sparse.get("sparse_score_type", "max"),
        cache_config=vllm_config.cache_config,
        indexer_kv_dtype=vllm_config.attention_config.resolve_indexer_kv_dtype("bf16"),
    )  # fmt: skip
    torch_dtype = kv_cache_dtype_str_to_dtype(kv_cache_dtype, vllm_config.model_config)

    class SparseLayer(AttentionLayerBase):
        """The layer's attention wiring: backend, impl, indexer, KV-cache spec."""

        layer_name = name

        def __init__(self) -> None:
            self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, HEAD_DIM
            self.attn_backend, self.impl, self.indexer = backend, impl, indexer
            self.kv_cache_dtype = kv_cache_dtype

        def get_attn_backend(self) -> type:
            return self.attn_backend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            # MiniMaxM3SparseAttention.get_kv_cache_spec: the main GQA K/V cache.
            return FullAttentionSpec(
                block_size=vllm_config.cache_config.block_size, num_kv_heads=self.num_kv_heads,
                head_size=self.head_dim, head_size_v=self.head_dim, dtype=torch_dtype,
                kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),
            )  # fmt: skip

    layer = SparseLayer()
    context[name] = layer
    return layer


# -- what a forward reads ------------------------------------------------------------------


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _freeze_side(meta: Any) -> SimpleNamespace:
    """What the kernels read of one metadata (the main attend's or the indexer's) now:
    the builders' buffers change after the forward."""
    d, p = meta.decode, meta.prefill
    out = SimpleNamespace(
        num_decodes=meta.num_decodes, num_prefills=meta.num_prefills,
        num_decode_tokens=meta.num_decode_tokens, num_prefill_tokens=meta.num_prefill_tokens,
        num_actual_tokens=meta.num_actual_tokens, seq_lens=meta.seq_lens.clone(),
        decode=None, prefill=None,
    )  # fmt: skip
    if d is not None:
        out.decode = SimpleNamespace(
            seq_lens=d.seq_lens.clone(), block_table=d.block_table.clone(),
            query_len=d.decode_query_len, max_seq_len=getattr(d, "max_seq_len", None),
            max_query_len=getattr(d, "max_decode_query_len", None),
        )  # fmt: skip
    if p is not None:
        out.prefill = SimpleNamespace(
            query_start_loc=p.cu_seqlens_q.clone(), seq_lens=p.seq_lens.clone(),
            context_lens=p.context_lens.clone(), block_table=p.block_table.clone(),
            max_query_len=p.max_query_len, max_seq_len=p.max_seq_len,
            kv_start_loc=_clone(getattr(p, "cu_seqlens_k", None)),
            total_kv_blocks=getattr(p, "total_kv_blocks", None),
        )  # fmt: skip
    return out


def _freeze(pair: SimpleNamespace) -> SimpleNamespace:
    """What the consumers read of a sparse layer's two metadata and its index cache's
    slot mapping now."""
    return SimpleNamespace(
        main=_freeze_side(pair.main), index=_freeze_side(pair.index),
        index_slot_mapping=_clone(pair.index_slot_mapping),
        block_table=torch.cat([
            t.block_table for t in (pair.main.decode, pair.main.prefill) if t is not None
        ]).clone(),
    )  # fmt: skip


def _cdiv(a: np.ndarray | int, b: int) -> Any:
    return -(-np.asarray(a, dtype=np.int64) // b)


def _decode_kv_len(side: SimpleNamespace) -> np.ndarray:
    """Each decode token's keys, as the decode kernels count them
    (``_gqa_sparse_decode_kernel``, ``_decode_index_score_kernel``,
    ``_topk_index_partial_kernel``): token ``t`` of request ``t // q`` at
    ``seq_len - q + t % q``, its keys ``max(that + 1, 0)`` (a padding row's none)."""
    d = side.decode
    q = d.query_len
    seq_lens = v1._np(d.seq_lens).astype(np.int64)
    # build asserts num_decode_tokens == num_decodes * decode_query_len.
    t = np.arange(side.num_decode_tokens)
    return np.maximum(seq_lens[t // q] - q + t % q + 1, 0)


def _prefill_rows(side: SimpleNamespace) -> list[tuple[int, int, int]]:
    """Each prefill's query rows within the prefill's tokens (``q[nd:]``) as its offsets
    say, clipped to those tokens: (prefill, first row, end row)."""
    offsets = v1._np(side.prefill.query_start_loc).astype(np.int64)
    n = side.num_prefill_tokens
    return [
        (i, int(min(max(a, 0), n)), int(min(max(b, 0), n)))
        for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True))
    ]


def _index_kv_len(side: SimpleNamespace) -> np.ndarray:
    """Each token's keys as the indexer scores them: a decode token's
    (:func:`_decode_kv_len`); prefill ``i``'s query row ``j`` at ``context_lens[i] + j``
    (``_index_block_score_kernel``'s causal mask, ``_topk_index_kernel``'s valid
    blocks), its keys ``context_lens[i] + j + 1``; a row no offset covers, none."""
    out = np.zeros(side.num_actual_tokens, dtype=np.int64)
    nd = side.num_decode_tokens
    if side.decode is not None:
        out[:nd] = _decode_kv_len(side)
    if side.prefill is not None:
        context = v1._np(side.prefill.context_lens).astype(np.int64)
        for i, a, b in _prefill_rows(side):
            out[nd + a : nd + b] = context[i] + np.arange(b - a) + 1
    return out


def _table(
    name: str, block_table: torch.Tensor, seq_lens: np.ndarray, pages: int, bs: int
) -> Field:
    """A block table as a kernel reads it: a request's first ``cdiv(seq_len, 128)`` pages."""
    return Field(name, "requests", v1._np(block_table), (0, pages - 1),
                 row_lengths=_cdiv(seq_lens, bs))  # fmt: skip


def _main_fields(m: SimpleNamespace, reach: int, pages: int, bs: int) -> list[Field]:
    """Every field of the main metadata ``MiniMaxM3SparseMSAImpl.forward`` reads."""
    out = []
    if m.decode is not None:
        d = m.decode
        seq_lens = v1._np(d.seq_lens).astype(np.int64)
        out += [
            # minimax_m3_sparse_attn_decode (_gqa_sparse_decode_kernel): a decode's keys
            # below seq_lens[i], block blk of them in page block_table[i, blk] ...
            Field("m3.decode.seq_lens", "requests", seq_lens, (0, reach)),
            _table("m3.decode.block_table", d.block_table, seq_lens, pages, bs),
            # ... token t of request t // decode_query_len: its keys.
            Field("m3.decode.kv_len", "tokens", _decode_kv_len(m), (0, reach)),
        ]  # fmt: skip
    if m.prefill is not None:
        p = m.prefill
        offsets = v1._np(p.query_start_loc).astype(np.int64)
        seq_lens = v1._np(p.seq_lens).astype(np.int64)
        k_lens = np.diff(v1._np(p.kv_start_loc).astype(np.int64))
        max_kv_blocks = int(_cdiv(max(p.max_seq_len, BLOCK_SIZE), BLOCK_SIZE))
        out += [
            # MiniMaxM3SparseMSAImpl.forward hands the prefills' queries q[nd:] (its
            # num_prefill_tokens rows) to build_k2q_csr and sparse_atten_func with
            # cu_seqlens_q: prefill i's rows q[nd:][offsets[i] : offsets[i + 1]] ...
            Field("m3.prefill.query_start_loc", "offsets", offsets, (0, m.num_prefill_tokens)),
            # ... at most max_seqlen_q (max_query_len) of them (the schedule's bound).
            Field("m3.prefill.query_lens", "requests", np.diff(offsets), (0, p.max_query_len)),
            # sparse_atten_func: prefill i's keys below seqused_k (seq_lens[i]) through
            # page_table (its block-table row).
            Field("m3.prefill.seq_lens", "requests", seq_lens, (0, reach)),
            _table("m3.prefill.block_table", p.block_table, seq_lens, pages, bs),
            # build_k2q_csr: prefill i's keys cu_seqlens_k[i] to cu_seqlens_k[i + 1], in
            # KV blocks below max_kv_blocks (cdiv(max(max_seqlen_k, 128), 128): a later
            # block's edges dropped) ...
            Field("m3.prefill.k_lens", "requests", k_lens, (0, BLOCK_SIZE * max_kv_blocks)),
            # ... each block a CSR row of total_rows (total_kv_blocks): a row past it dropped.
            Field("m3.prefill.kv_row_end", "requests", np.cumsum(_cdiv(k_lens, BLOCK_SIZE)),
                  (0, p.total_kv_blocks)),
        ]  # fmt: skip
    return out


def _index_fields(m: SimpleNamespace, reach: int, pages: int, bs: int) -> list[Field]:
    """Every field of the indexer's metadata ``MiniMaxM3IndexerTritonImpl.forward`` reads."""
    out = [
        # Each token's keys as the indexer scores them (the causal extent of its row).
        Field("m3.index.kv_len", "tokens", _index_kv_len(m), (0, reach)),
    ]
    if m.decode is not None:
        d = m.decode
        seq_lens = v1._np(d.seq_lens).astype(np.int64)
        blocks = _cdiv(_decode_kv_len(m), BLOCK_SIZE)
        out += [
            # minimax_m3_index_decode: _decode_index_score_kernel reads request i's index
            # keys below seq_lens[i] through block_table[i] ...
            Field("m3.index.decode.seq_lens", "requests", seq_lens, (0, reach)),
            _table("m3.index.decode.block_table", d.block_table, seq_lens, pages, bs),
            # ... into a score row of cdiv(max_seq_len, 128) blocks, which the split-K
            # top-k (chunk_blocks * num_topk_chunks) covers: a token's blocks no more.
            Field("m3.index.decode.kv_blocks", "tokens", blocks,
                  (0, int(_cdiv(d.max_seq_len, BLOCK_SIZE)))),
            # minimax_m3_index_decode_score: decode_query_len <= max_decode_query_len
            # (its query tile, BLOCK_SIZE_Q).
            Field("m3.index.decode.query_len", "tokens",
                  np.full(m.num_decode_tokens, d.query_len, dtype=np.int64),
                  (1, d.max_query_len)),
        ]  # fmt: skip
    if m.prefill is not None:
        p = m.prefill
        offsets = v1._np(p.query_start_loc).astype(np.int64)
        seq_lens = v1._np(p.seq_lens).astype(np.int64)
        width = int(-(-_cdiv(p.max_seq_len, BLOCK_SIZE) // 16) * 16)
        out += [
            # minimax_m3_index_score / minimax_m3_index_topk: the prefills' index queries
            # iq[nd:] (num_prefill_tokens rows), prefill i's rows offsets[i] to
            # offsets[i + 1] ...
            Field("m3.index.prefill.query_start_loc", "offsets", offsets,
                  (0, m.num_prefill_tokens)),
            # ... in cdiv(max_query_len, 64) query tiles (score) and max_query_len rows
            # (top-k): no more rows than max_query_len ...
            Field("m3.index.prefill.query_lens", "requests", np.diff(offsets),
                  (0, p.max_query_len)),
            # ... its index keys below seq_lens[i] through block_table[i], scored into a
            # row of round_up(cdiv(max_seq_len, 128), 16) blocks.
            Field("m3.index.prefill.seq_lens", "requests", seq_lens,
                  (0, min(reach, BLOCK_SIZE * width))),
            _table("m3.index.prefill.block_table", p.block_table, seq_lens, pages, bs),
            Field("m3.index.prefill.context_lens", "requests",
                  v1._np(p.context_lens).astype(np.int64), (0, reach)),
        ]  # fmt: skip
    return out


class _M3Engine(v1._Engine):
    """A V1 runner whose attention layers are MiniMax M3 sparse layers."""

    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return sm100()

    def _build(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        """``vllm-v1``'s engine, its KV-cache groups and attention groups vLLM's own:
        ``get_kv_cache_groups`` of the layers' specs, ``initialize_attn_backend``."""
        import vllm.v1.worker.gpu_model_runner as gmr
        from vllm.config import CUDAGraphMode, set_current_vllm_config
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
        from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig
        from vllm.v1.worker.utils import customize_attention_spec, prepare_kernel_block_sizes

        self.config, self.device = config, device
        self.recorder = v1._Recorder()
        self.recorder.freeze = self.freeze
        self.recorder.handed = self._handed  # type: ignore[method-assign]
        vc = self.vllm_config = v1._vllm_config(config, mode, self.speculator)
        vc.scheduler_config.async_scheduling = self.async_scheduling
        if vc.speculative_config is not None:
            vc.speculative_config = drafting.speculative_config(
                vc.speculative_config, config, self.padded_drafts
            )
        # The model's sparse attention config (the engine's copy), which the layer and
        # the builders read.
        model = vc.model_config = copy.copy(vc.model_config)
        text = model.hf_text_config = model.hf_config = copy.copy(model.hf_config)
        text.sparse_attention_config = {
            **SPARSE_ATTENTION_CONFIG,
            "sparse_num_index_heads": text.num_key_value_heads,
        }
        with (
            host_memory(device),
            _engine.worker_workspace(device),
            set_current_vllm_config(vc),
            mock.patch.object(gmr, "get_pp_group", v1._one_rank),
            mock.patch("torch.cuda.Stream", lambda *a, **k: v1._Stream()),
            mock.patch("torch.Event", lambda *a, **k: v1._Event()),
            mock.patch("torch.cuda.Event", lambda *a, **k: v1._Event()),
        ):
            r = self.runner = gmr.GPUModelRunner(vc, device)
            layers = [_LAYER]
            if r.speculative_config is not None:
                self.install_drafter()
                # The MTP block's attention is a sparse layer too (force_sparse_attn).
                layers.append(drafting.DRAFT_LAYER)
                r.drafter._draft_attn_layer_names = {
                    drafting.DRAFT_LAYER,
                    index_layer(drafting.DRAFT_LAYER),
                }
            # GPUModelRunner.get_kv_cache_spec: each layer's spec, as its backend
            # customizes it (in the order the model makes the layers).
            context = vc.compilation_config.static_forward_context
            specs = {}
            for name in layers:
                _sparse_layer(vc, name)
                for cache in (name, index_layer(name)):
                    spec = context[cache].get_kv_cache_spec(vc)
                    if isinstance(spec, AttentionSpec):
                        spec = customize_attention_spec(context[cache].get_attn_backend(), spec)
                    specs[cache] = spec
            groups = get_kv_cache_groups(vc, specs)
            kv = KVCacheConfig(
                num_blocks=self.pool_size(), kv_cache_tensors=[], kv_cache_groups=groups
            )
            r.kv_cache_config = kv
            r.initialize_attn_backend(kv)
            resolved = vc.compilation_config.cudagraph_mode
            if resolved != self.resolves_to(CUDAGraphMode[mode]):
                raise RuntimeError(f"attnfuzz: vLLM resolved cudagraph_mode {mode} to {resolved}")
            r.initialize_metadata_builders(kv, prepare_kernel_block_sizes(kv, r.attn_groups))
            r.may_reinitialize_input_batch(kv)
            r.model = self.load(resolved)
        self.held = set()
        self.prompts = {}
        self.tokens = {}
        self.capture()

    def _handed(self, positions: torch.Tensor, layer: str = _LAYER) -> v1._Seen:
        """What a forward hands ``layer``: its main metadata and its index cache's, the
        index cache's slot mapping beside the layer's."""
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        metadata, slots = context.attn_metadata, context.slot_mapping
        slots = slots if isinstance(slots, dict) else {}
        pair = None
        if metadata:
            pair = SimpleNamespace(
                main=metadata[layer], index=metadata[index_layer(layer)],
                index_slot_mapping=slots.get(index_layer(layer)),
            )  # fmt: skip
        return v1._Seen(pair, slots.get(layer), positions, None, self.freeze)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # Both builders' UNIFORM_BATCH support.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        out = list(v1._fields(self.config, no_meta))
        if seen.meta is None:
            return tuple(out)
        m = seen.meta
        bs = self.kernel_block_size()
        pages = num_blocks(self.config) * (self.config.block_size // bs)
        reach = int(m.block_table.shape[1]) * bs
        if m.index_slot_mapping is not None:
            # fused_minimax_m3_qknorm_rope_kv_insert: token t's index key goes to slot
            # index_slot_mapping[t] of the index cache; negative: none.
            out.append(Field("m3.index.slot_mapping", "tokens", v1._np(m.index_slot_mapping),
                             (v1.PAD_SLOT_ID, pages * bs - 1), writes_kv=True))  # fmt: skip
        out += _main_fields(m.main, reach, pages, bs)
        out += _index_fields(m.index, reach, pages, bs)
        return tuple(out) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their slots, those its tokens may attend to (the
        indexer's top-k picks blocks among them): the first ``seq_lens[i]`` through its
        block-table row (the decode kernel's ``kv_len`` of its last token, the prefill's
        ``seqused_k``)."""
        m = seen.meta
        return v1.paged_keys(
            v1._np(m.main.seq_lens), v1._np(m.block_table), self.kernel_block_size()
        )


class MiniMaxM3RunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of MiniMax M3's sparse attention layers."""

    engine_type = _M3Engine

    # Both builders' reorder_batch_threshold makes the runner reorder its batch, as
    # MLA's does: the fresh engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = MiniMaxM3RunnerStepEngine()
"""The engine of the implementation ``vllm-v1-minimax-m3-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-minimax-m3-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: MiniMaxM3SparseMetadataBuilder.build with its prefill offsets not rebased ------


class _Unrebased(ast.NodeTransformer):
    """``query_start_loc[num_decodes:] - num_decode_tokens`` without its subtraction."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if (
            isinstance(node.op, ast.Sub)
            and ast.unparse(node.left) == "query_start_loc[num_decodes:]"
            and ast.unparse(node.right) == "num_decode_tokens"
        ):
            self.changed = True
            return node.left
        return node


@functools.cache
def _unrebased_build() -> Any:
    builder = _modules().sparse_attention.MiniMaxM3SparseMetadataBuilder
    change = _Unrebased()
    change.changed = False
    definition = change.visit(function_tree(builder.build))
    if not change.changed:
        raise RuntimeError("attnfuzz: MiniMaxM3SparseMetadataBuilder.build no longer rebases")
    return recompiled(builder.build, definition)


@contextlib.contextmanager
def _offsets_unrebased() -> Iterator[None]:
    """``MiniMaxM3SparseMetadataBuilder.build`` hands the prefills the batch's query
    offsets from the first prefill on, not rebased to it: a step of decodes before its
    prefills gives the prefill attend (``q[nd:]``) offsets past its rows."""
    builder = _modules().sparse_attention.MiniMaxM3SparseMetadataBuilder
    with mock.patch.object(builder, "build", _unrebased_build()):
        yield


_UNREBASED = v1.Mutated(MiniMaxM3RunnerStepEngine(), _offsets_unrebased)


def offsets_unrebased(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-minimax-m3-sparse-prefill-offsets-unrebased``: a step with decodes and
    prefills reads the prefills' queries past their rows (``m3.prefill.query_start_loc``)."""
    return _UNREBASED(inputs)


offsets_unrebased.new_engine = _UNREBASED.engine.new_engine  # type: ignore[attr-defined]


def reach_m3(trace: Trace | Case) -> bool:
    """A V1 engine of 128-token pages: every step runs both builders."""
    return declines_config(trace.config) is None


def _decodes_and_prefills(batch: Batch, threshold: int) -> bool:
    """Whether the split can give ``batch`` decodes and prefills. The runner's reorder
    (``reorder_batch_to_split_decodes_and_prefills``) puts the requests with computed
    tokens and at most ``threshold`` query tokens first, then those with more, then
    first chunks; ``split_decodes_and_prefills`` (``require_uniform``) makes the first
    request a decode if its query is at most ``threshold``, and a prefill of every
    request whose query differs from it. Which request of its region comes first is the
    engine's history: any of them may."""
    regions = [
        2 if c == 0 else int(q > threshold)
        for c, q in zip(batch.num_computed_tokens, batch.q_lens, strict=True)
    ]
    first = min(regions)
    return len(set(batch.q_lens)) > 1 and any(
        q <= threshold for r, q in zip(regions, batch.q_lens, strict=True) if r == first
    )


def trigger_decodes_and_prefills(trace: Trace | Case) -> bool:
    """A step the split gives decodes and prefills (:func:`_decodes_and_prefills`)."""
    return reach_m3(trace) and any(
        _decodes_and_prefills(b, trace.config.next_n) for b in hybrid._batches(trace)
    )


def smallest_decodes_and_prefills() -> Trace:
    """Request 0 prefills 2 tokens, then decodes beside request 1's prefill of 2, on an
    engine without graphs (none is needed, and vLLM refuses graph mode without capture
    sizes): the prefill's offsets [1, 3] where its rows are 2."""
    config = EngineConfig(
        max_model_len=BLOCK_SIZE, max_num_seqs=2, max_num_batched_tokens=8,
        block_size=BLOCK_SIZE, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    steps = (
        Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(2,)),
        Batch((2, 0), (1, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 1)),
    )  # fmt: skip
    return Trace(config, steps)
