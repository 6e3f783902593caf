"""vLLM's model runner V1 step of DeepSeek-V4.1's attention layers, as the implementation
``vllm-v1-deepseek-v41`` of ``runner-step``.

The engine of :mod:`.runner_step_sparse_swa` (vLLM 0.33.0's V1 runner, whole), its model
a two-layer DeepSeek-V4.1 whose every cache is made as ``DeepseekV4FlashMLAAttention.
__init__`` (``vllm/models/deepseek_v41/nvidia/flashmla.py``, the CUDA FlashMLA layer)
makes it, each by its own constructor, on an SM100 GPU:

- layer 0, compress ratio 1 (the kv, index and candidate source): its compressed-KV
  cache (the layer's own ``get_kv_cache_spec``, ``DeepseekV4Attention.get_kv_cache_spec``:
  an ``MLAAttentionSpec`` of 128-token pages holding 128 states), its indexer K cache
  (``DeepseekV4IndexerCache``, MXFP4), its SWA cache (``DeepseekV4SWACache``, 32-token
  pages, window 64);
- layer 1, compress ratio 2 (a kv and index source that consumes the candidates): the
  same caches at 64 states a page, and its compressor's ring (``CompressorStateCache``,
  a ``CircularBufferSpec`` of 8 rows, one block a request);
- the MTP draft layer (ratio 0: pure sliding window) where the config drafts: its SWA
  cache, which the V1 ``EagleProposer`` builds for itself.

The runner's own ``get_kv_cache_spec`` reads the specs; vLLM's planner
(``resolve_kv_cache_layout``, ``v1/core/kv_cache_planning.py get_kv_cache_groups``) groups
them (the compressed and indexer caches in one group of 128-token pages, each SWA cache
a group of its own, the ring a group of its own); the runner's ``initialize_attn_backend``
gives each group its attention groups and ``initialize_metadata_builders`` their
builders, so that every step, capture run and draft build runs:

- ``DeepseekV4SparseMLAMetadataBuilder`` (``models/deepseek_v41/sparse_mla.py``, through
  ``DeepseekV4FlashMLAMetadataBuilder``) of each compressed cache: its request of each
  token, and at ratio 2 the compressed slot of each group's last token
  (``get_compressed_slot_mapping``);
- ``DeepseekV41SparseIndexerMetadataBuilder`` (``v1/attention/backends/mla/
  sparse_indexer.py``, ``attention_config.indexer_sparse_logits``) of each indexer cache,
  over ``DeepseekV32IndexerMetadataBuilder`` on its SM100 varlen path: the compressed
  slots, the decode rows (``_indexer_decode_metadata_kernel``), the prefill chunks
  (``_BUILD_PREFILL_CHUNK_METADATA_KERNEL``), the DeepGEMM schedule, and the sparse-logits
  rows of each;
- ``DeepseekV41SparseSWAMetadataBuilder`` (``sparse_mla.py``, through the FlashMLA
  layer's ``DeepseekSparseSWAFlashMLAMetadataBuilder``) of each SWA cache: V4.1's
  tile-scheduler plans (ratios 0, 1, 2) over ``DeepseekSparseSWAMetadataBuilder``;
- ``CompressorMetadataBuilder`` (``models/deepseek_v41/compressor.py``) of the ring: each
  token's ring slot (``_ring_slot_mapping_kernel``).

Every builder keeps its FULL graphs (``AttentionCGSupport.ALWAYS``: the indexer's on
SM100 varlen). Its Triton kernels run under the Triton interpreter, with the boolean
masks a compiled kernel has (:func:`.sglang._engine.interpreter_bool_masks`).

The scheduler's pages are the trace's, of 32 tokens: each SWA group's block table is
them; the 128-token group's pages are a request's every fourth (the first of each
128 tokens: distinct among live requests, as the trace's pages are); the ring's block
is a request's first page, given when it is new to the engine (a fresh engine's
placeholder the null block). Each group's ids name its own pages of the packed blocks.

Stood in, as a CUDA build on an SM100 GPU has them, where the modules read them:
``current_platform`` (CUDA, capability family 100: the MXFP8 V4.1 records, 128-token
kernel pages, the indexer's varlen decode, FlashMLA's plans); DeepGEMM's presence and
its paged-MQA schedule (``get_paged_mqa_logits_metadata``, :func:`paged_mqa_schedule`:
a function of the lengths it is handed, so that a stale copy shows), the SM count (a
B200's 148); DeepSelect's presence and its stride alignment (1024 B, 32 B, as
``check_deep_select_layout`` gives them); FlashMLA's ``get_mla_metadata``
(``vllm-v1-sparse-swa``'s). The DeepSeek-V4.1 attention layer itself (its projections
need a tensor-parallel group and weights) is its KV-cache spec and backend alone.

Fields (each consumer's range from its code): ``vllm-v1-sparse-swa``'s of layer 0's SWA
metadata (``swa.*``; a draft forward's of the draft layer's), with V4.1's chunk plan of
the layer's ratio (``swa.prefill.compressed_room``: ``dequantize_and_gather_k_cache``'s
compressed keys in their chunk's first columns) and layer 1's plan and tile plan
(``swa.l1.*``); by compressed cache ``mla{r}.*`` (the compressed slot each token writes,
the block table); by indexer cache ``idx{r}.*`` (its K slots; the decode rows' context,
pages and request, the schedule's staleness; each prefill token's chunk, K range and
request bounds in its chunk's workspace, each chunk's gather; and on the candidate
consumer the sparse rows ``idx2.sparse.*`` and whether two row sets share scratch), read
only when ``DeepseekV4Indexer.forward`` runs the indexer (context past ``index_topk``);
the ring ``ring.*``; ``kv_len``/``kv_slots`` of the SWA window.

Not driven: prefill context parallelism (``_link_pcp_chunks``, the PCP slices), the
ROCm and FlashInfer subclasses, DSpark, V2's ``update_draft_decode_metadata``, bounded
replay.

Declined: ``vllm-v1``'s cases, and pages other than 32 tokens (the SWA cache's,
``DeepseekV4Attention.__init__``).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import functools
import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang._engine import interpreter_bool_masks
from attnfuzz.adapters.standins import function_tree, recompiled
from attnfuzz.adapters.vllm import _engine
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_flashmla as flashmla
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_sparse_swa as swa
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import _vllm_config, num_blocks
from attnfuzz.adapters.vllm.slot_mapping import host_memory
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

WINDOW = swa.WINDOW
"""The model config's ``sliding_window`` on the engine's copy (``vllm-v1-sparse-swa``'s)."""
BLOCK_SIZE = 32
"""The SWA cache's pages (``DeepseekV4Attention.__init__``: ``block_size=32``): the trace's."""
CACHE_BLOCK = 128
"""The compressed and indexer caches' pages (``cache_config.block_size``): the SM100 kernel
pages of ``DeepseekV4SparseMLABackend`` and ``DeepseekV41IndexerBackend``
(``get_supported_kernel_block_sizes``), a multiple of the sparse block (16)."""
RATIOS = (1, 2)
"""Each target layer's compress ratio (``compress_ratios``); the MTP layer's is 0."""
TOPK = 8
"""``index_topk``: a multiple of 8 (``check_deep_select_layout``: 32-byte int32 rows)."""
CANDIDATE_BLOCK = 32
CANDIDATE_TOPK_BLOCKS = 16
"""The candidate blocks: 32 positions (two sparse blocks of 16, ``pick_sparse_block_kv``),
16 of them, 512 sparse columns a row (``check_deep_select_layout``: 1024-byte rows)."""
INDEX_HEAD_DIM = 128  # DeepSeek-V4.1's index_head_dim (the MXFP4 K row: 68 bytes)
SMS = 148  # a B200's SMs
DEEP_SELECT_ALIGNMENT = (1024, 32)  # check_deep_select_layout: "1024B / 32B on SM100"
CANDIDATE_SOURCE = 0
NULL_BLOCK_ID = 0  # vllm/v1/attention/backends/utils.py


def layer(i: int) -> str:
    """Target layer ``i``'s attention prefix, as the model names it."""
    return f"model.layers.{i}.self_attn"


SWA_LAYER = f"{layer(0)}.swa_cache"
RING_LAYER = f"{layer(RATIOS.index(2))}.compressor.state_cache"


def prepare() -> None:
    """Import vLLM's V1 runner and DeepSeek-V4.1's modules before a judge forks."""
    interpreter_bool_masks()
    v1.prepare()
    _modules()


@functools.cache
def _modules() -> SimpleNamespace:
    from vllm.model_executor.kernels.attention.dsa import sparse_mqa_logits
    from vllm.models.deepseek_v41 import attention, compressor, sparse_mla
    from vllm.models.deepseek_v41.nvidia import flashmla as v41_flashmla
    from vllm.v1.attention.backends.mla import indexer, sparse_indexer, sparse_swa

    return SimpleNamespace(
        attention=attention, compressor=compressor, sparse_mla=sparse_mla,
        flashmla=v41_flashmla, indexer=indexer, sparse_indexer=sparse_indexer,
        sparse_swa=sparse_swa, sparse_mqa_logits=sparse_mqa_logits,
    )  # fmt: skip


class _Sm100:
    """``current_platform`` as the DeepSeek-V4.1 modules ask it on an SM100 CUDA build:
    CUDA, not ROCm, XPU nor CPU, of the capability family 100; anything else the
    platform's."""

    def __init__(self, platform: Any) -> None:
        self._platform = platform

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_device_capability_family(self, family: int, device_id: int = 0) -> bool:
        return family == 100

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


def paged_mqa_schedule(
    context_lens: torch.Tensor, block_size: int, num_sms: int, indices: Any = None
) -> torch.Tensor:
    """``utils/deep_gemm.py get_paged_mqa_logits_metadata`` on SM100 (DeepGEMM's
    ``get_paged_mqa_logits_metadata``): ``[num_sms + 1, 2]`` int32, the (row, block) at
    which each SM starts, the rows' ``cdiv(context, block_size)`` blocks shared evenly;
    only ``fp8_fp4_paged_mqa_logits`` reads it. Its values are attnfuzz's, a function of
    the lengths it is handed (``idx{r}.decode.schedule_stale``)."""
    lens = context_lens.reshape(-1).to(torch.int64).cpu().tolist()
    blocks = [-(-int(n) // block_size) for n in lens]
    total = sum(blocks)
    starts = []
    for s in range(num_sms + 1):
        unit, row = -(-total * s // num_sms), 0
        while row < len(blocks) and unit >= blocks[row] and blocks[row] > 0:
            unit -= blocks[row]
            row += 1
        starts.append((row, unit if row < len(blocks) else 0))
    return torch.tensor(starts, dtype=torch.int32, device=context_lens.device)


@contextlib.contextmanager
def sm100() -> Iterator[None]:
    """The DeepSeek-V4.1 modules as they run on an SM100 GPU (module docstring)."""
    m = _modules()

    def on_sm100(module: Any) -> _Sm100:
        return _Sm100(module.current_platform)

    with contextlib.ExitStack() as stack:
        for module in (m.attention, m.sparse_mla, m.sparse_indexer):
            stack.enter_context(mock.patch.object(module, "current_platform", on_sm100(module)))
        stack.enter_context(mock.patch.multiple(
            m.sparse_swa, current_platform=on_sm100(m.sparse_swa),
            get_mla_metadata=flashmla.get_mla_metadata,
        ))  # fmt: skip
        stack.enter_context(mock.patch.multiple(
            m.indexer, current_platform=on_sm100(m.indexer), has_deep_gemm=lambda: True,
            num_compute_units=lambda *a, **k: SMS,
            get_paged_mqa_logits_metadata=paged_mqa_schedule,
        ))  # fmt: skip
        stack.enter_context(mock.patch.multiple(
            m.sparse_indexer, has_deep_gemm_sparse_mqa=lambda: True, has_deep_select=lambda: True,
        ))  # fmt: skip
        stack.enter_context(mock.patch.object(
            m.sparse_mqa_logits, "get_deep_select_stride_requirement",
            lambda: DEEP_SELECT_ALIGNMENT,
        ))  # fmt: skip
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, pages other than the
    SWA cache's, and a FULL mixed graph replayed with another split than its capture's,
    or on its capture's prefill rows (:func:`full_split_differs`;
    ``vllm-v1-deepseek-v41-full-split-captured``'s: a finding kept apart,
    docs/findings.md)."""
    if full_split_differs(case.config, case.batch):
        return (
            "a FULL mixed graph replay (the step's, or the idle rank's dummy run's) that "
            "is not decodes alone on a capture of decodes alone: forward_mqa's "
            "decode/prefill split and the prefill chunk plan are fixed at capture (kept "
            "apart as vllm-v1-deepseek-v41-full-split-captured)"
        )
    return declines_engine(case)


def declines_engine(case: Case) -> str | None:
    """:func:`declines` less the split of a FULL mixed graph (the finding's own entry)."""
    return declines_config(case.config) or v1.declines(case)


def full_split_differs(config: EngineConfig, batch: Batch) -> bool:
    """The V1 runner replays a FULL graph of mode ``FULL``, where decodes and mixed steps
    share the graphs of one size (``CUDAGraphMode.separate_routine`` is false), for the
    step (beside its data-parallel peer) or for the idle rank's dummy run beside a peer
    that runs the step, and that replay is not decodes alone on a capture of decodes
    alone. ``DeepseekV4FlashMLAAttention.forward_mqa``
    (``models/deepseek_v41/nvidia/flashmla.py``) picks ``_forward_prefill`` and
    ``_forward_decode`` and their token slices from ``num_decode_tokens`` and
    ``num_prefill_tokens`` in Python, and the prefill path's chunk plan
    (``get_prefill_chunk_plan``) is host values too: a replay runs the capture's. A
    capture that holds a prefill runs the prefill path on the replay's padding rows too,
    with prefill gather lengths no build of the replayed step wrote (the SWA builder
    writes them only ``if num_prefills > 0``).

    The capture: ``GPUModelRunner._dummy_run(P, uniform_decode=False)`` gives
    ``R = min(P, max_num_seqs)`` requests of ``P // R`` tokens, the last ``P % R``
    more; the step: the runner orders its decodes first (the sparse MLA builder's
    reorder threshold, ``1 + num_spec``); the dummy run (``execute_dummy_batch``): one
    request of ``1 + num_spec`` tokens, padded across the ranks. Each is split by
    ``split_decodes_and_prefills`` at the SWA builder's threshold
    (``max_decode_query_len``: ``1 + num_spec``)."""
    from attnfuzz.adapters.vllm.runner_step import with_peer
    from attnfuzz.reference.runner import step_plan

    if config.runner != "v1" or config.cudagraph_mode != "FULL":
        return False
    next_n = config.next_n
    dummy = Batch(
        (0,), (next_n,), 0, True, dp_peer_tokens=sum(batch.q_lens),
        dp_peer_uniform=all(q == next_n for q in batch.q_lens),
    )  # fmt: skip
    for q_lens, plan in (
        (batch.q_lens, step_plan(config, with_peer(config, batch))),
        (dummy.q_lens, step_plan(config, dummy)),
    ):
        if plan.mode != "FULL":
            continue
        size = plan.num_tokens_padded
        reqs = min(size, config.max_num_seqs)  # the capture's requests
        captured = [size // reqs] * reqs
        captured[-1] += size % reqs
        if not (all(q <= next_n for q in q_lens) and all(q <= next_n for q in captured)):
            return True
    return False


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read); a FULL
    capture size past a block-table row's reach is the dummy-past-row family's (a finding
    kept apart, docs/findings.md): V1's ``_dummy_run`` gives each dummy request of a
    mixed FULL capture ``seq_len = max_query_len = num_tokens``, and the SWA builder keeps
    it (Triton's capture build sets 1, so ``vllm-v1`` never meets it)."""
    from attnfuzz.adapters.vllm.plugin import capture_past_row

    if config.runner == "v1" and not config.varlen_decode and config.block_size != BLOCK_SIZE:
        return (
            f"block_size {config.block_size}: DeepSeek-V4.1's SWA cache has pages of "
            f"{BLOCK_SIZE} tokens (models/deepseek_v41/attention.py DeepseekV4Attention.__init__)"
        )
    if config.runner == "v1" and config.cudagraph_mode == "FULL" and capture_past_row(config):
        return (
            "a FULL capture size past a block-table row's reach: each dummy request's "
            "seq_len is the capture's token count, past its row (kept apart with "
            "vllm-dummy-past-row)"
        )
    return v1.declines_config(config)


# -- the model -----------------------------------------------------------------------------


def _configure(vc: Any) -> None:
    """The engine's copies of the configs a DeepSeek-V4.1 model and its flags make: the
    topology of :data:`RATIOS` (``compress_ratios``, the source layers, the candidate
    blocks), the window, ``index_topk``; the MXFP4 indexer cache with sparse logits
    (``AttentionConfig``); 128-token compressed pages."""
    model = vc.model_config = copy.copy(vc.model_config)
    hf = model.hf_config = copy.copy(model.hf_config)
    model.hf_text_config = hf  # a text model's is its config (get_hf_text_config)
    hf.sliding_window = WINDOW
    hf.compress_ratios = [*RATIOS, 0]
    hf.kv_source_layer_ids = list(range(len(RATIOS)))
    hf.index_source_layer_ids = list(range(len(RATIOS)))
    hf.candidate_source_layer_id = CANDIDATE_SOURCE
    hf.candidate_block_size = CANDIDATE_BLOCK
    hf.candidate_topk_blocks = CANDIDATE_TOPK_BLOCKS
    hf.index_topk = TOPK
    hf.index_head_dim = INDEX_HEAD_DIM
    vc.attention_config = copy.copy(vc.attention_config)
    vc.attention_config.indexer_kv_dtype = "mxfp4"
    vc.attention_config.indexer_sparse_logits = True
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.block_size = CACHE_BLOCK


@functools.cache
def _attention_layer_cls() -> type:
    """``DeepseekV4FlashMLAAttention`` as the runner finds it in the static forward
    context: its backend (``backend_cls``) and its own ``get_kv_cache_spec``
    (``DeepseekV4Attention``'s) over the attributes ``__init__`` sets."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    m = _modules()

    class DeepseekV41Attention(AttentionLayerBase):
        get_kv_cache_spec = m.attention.DeepseekV4Attention.get_kv_cache_spec

        def __init__(self, **attributes: Any) -> None:
            vars(self).update(attributes)

        def get_attn_backend(self) -> type:
            return m.flashmla.DeepseekV4FlashMLAAttention.backend_cls

    return DeepseekV41Attention


def _attention_layer(vc: Any, layer_id: int, prefix: str) -> None:
    """Layer ``layer_id``'s caches, registered under ``prefix``, as
    ``DeepseekV4Attention.__init__`` makes them for the FlashMLA layer: its compressed
    cache's spec, its indexer K cache and its compressor's ring (a kv source), its SWA
    cache (every layer; the MTP layer's under the draft layer's name, which the drafter
    builds)."""
    m = _modules()
    hf, cache_config = vc.model_config.hf_config, vc.cache_config
    layer_cls = m.flashmla.DeepseekV4FlashMLAAttention
    ratio = int(hf.compress_ratios[layer_id]) if layer_id < len(hf.compress_ratios) else 0
    context = vc.compilation_config.static_forward_context
    kv_cache_dtype, torch_dtype = m.attention._resolve_dsv4_kv_cache_dtype(
        layer_cls.use_fp8_ds_mla_layout, cache_config.cache_dtype, cache_config, "fp8_ds_mla"
    )
    # DeepseekV4Attention.__init__: the V4.1 MXFP8 record on SM100, its page alignment.
    kv_mxfp8 = m.attention._use_v41_mxfp8_kv_record()
    record = 528 if kv_mxfp8 else 584
    alignment = 512 if kv_mxfp8 else 576
    if layer_id < hf.num_hidden_layers and layer_id in hf.kv_source_layer_ids:
        context.pop(prefix, None)
        context[prefix] = _attention_layer_cls()(
            is_kv_source=True, kv_cache_dtype=kv_cache_dtype, head_dim=512,
            kv_cache_torch_dtype=torch_dtype, compress_ratio=ratio,
            kv_page_alignment=alignment, compressed_bytes_per_token=record,
        )  # fmt: skip
        m.attention.DeepseekV4IndexerCache(
            head_dim=m.attention._indexer_k_cache_head_dim(
                hf.index_head_dim, m.indexer.dsa_indexer_uses_fp4(vc)
            ),
            dtype=torch.uint8, prefix=f"{prefix}.indexer.k_cache", cache_config=cache_config,
            compress_ratio=ratio,
        )  # fmt: skip
        if ratio > 1:  # DeepseekCompressor.__init__
            m.compressor.CompressorStateCache(
                state_dim=2 * 512, dtype=torch.float32, prefix=f"{prefix}.compressor.state_cache"
            )
    swa_prefix = f"{prefix}.swa_cache" if layer_id < hf.num_hidden_layers else prefix
    context.pop(swa_prefix, None)  # the draft layer's stand-in (runner_step_drafter)
    m.sparse_swa.DeepseekV4SWACache(
        head_dim=512, window_size=hf.sliding_window, dtype=torch_dtype, prefix=swa_prefix,
        cache_config=cache_config, backend_cls=layer_cls.swa_backend_cls,
        block_size=BLOCK_SIZE, packed_bytes_per_token=record,
        packed_page_alignment=alignment,
        packed_block_stride_alignment=math.lcm(record, record) if kv_mxfp8 else None,
        bounded_replay=False,
    )  # fmt: skip


# -- what the consumers read ---------------------------------------------------------------


class _Recorder(v1._Recorder):
    """``vllm-v1``'s recorder, reporting every layer's metadata of a forward: the forward
    context's whole ``attn_metadata`` and slot mappings, the SWA cache's slot mapping
    the forward's own."""

    def handed(self, positions: torch.Tensor, layer: str = v1._LAYER) -> v1._Seen:
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        metadata = context.attn_metadata
        slots = context.slot_mapping if isinstance(context.slot_mapping, dict) else {}
        own = drafting.DRAFT_LAYER if layer == drafting.DRAFT_LAYER else SWA_LAYER
        meta = SimpleNamespace(layers=dict(metadata)) if metadata else None
        return v1._Seen(meta, slots.get(own), positions, None, self.freeze)


def _np(t: torch.Tensor | None) -> np.ndarray:
    return np.zeros(0, dtype=np.int64) if t is None else v1._np(t).astype(np.int64)


def _freeze_swa(meta: Any, ratio: int) -> SimpleNamespace:
    """``vllm-v1-sparse-swa``'s copy of an SWA metadata, its chunk plan and tile plan
    those of a layer of ``ratio`` (``DeepseekV4FlashMLAAttention._forward_prefill``:
    V4.1's chunk size, ``has_compressed`` for every ratio past 0; ``_forward_decode``:
    the plan of the layer's type)."""
    attention = _modules().attention.DeepseekV4Attention
    out = swa._freeze(meta)
    out.chunk_plan = meta.get_prefill_chunk_plan(
        compress_ratio=ratio, prefill_chunk_size=attention.PREFILL_CHUNK_SIZE,
        has_compressed=ratio > 0,
    )  # fmt: skip
    out.ratio = ratio
    if meta.num_decode_tokens:
        plan = {0: meta.tile_sched_swaonly, 1: meta.tile_sched_c1a, 2: meta.tile_sched_c2a}
        out.tile_sched_fresh = plan[ratio] is not None and not getattr(
            plan[ratio], "have_initialized", False
        )
    return out


def _freeze_indexer(meta: Any, ratio: int) -> SimpleNamespace:
    """What ``SparseAttnIndexer``/``SparseMQAIndexer`` and ``DeepseekV4Indexer`` read of
    an indexer metadata now (the builder's buffers change after the forward)."""
    out = SimpleNamespace(
        ratio=ratio, max_seq_len=int(meta.max_seq_len), slot_mapping=_np(meta.slot_mapping),
        num_decode_tokens=meta.num_decode_tokens, num_prefill_tokens=meta.num_prefill_tokens,
        decode=None, chunks=[], sparse_decode=None,
        sparse_prefill=[], scratch=[],
    )  # fmt: skip
    d = meta.decode
    if d is not None:
        lens = d.seq_lens.reshape(-1)
        schedule = paged_mqa_schedule(lens, CACHE_BLOCK // ratio, SMS, d.indices)
        handed = d.schedule_metadata
        same = handed.shape == schedule.shape
        stale = int((handed != schedule).sum()) if same else max(handed.numel(), schedule.numel())
        out.decode = SimpleNamespace(
            seq_lens=_np(lens), block_table=_np(d.block_table), indices=_np(d.indices),
            schedule_stale=stale,
        )  # fmt: skip
    if meta.prefill is not None:
        out.chunks = [
            SimpleNamespace(
                start=c.token_start, end=c.token_end, ks=_np(c.cu_seqlen_ks),
                ke=_np(c.cu_seqlen_ke), cu=_np(c.local_cu_seq_lens),
                block_table=_np(c.block_table), num_reqs=c.num_reqs,
                skip=c.skip_kv_gather, rows=c.max_local_total_seq_lens,
            )
            for c in meta.prefill.chunks
        ]  # fmt: skip
    s = meta.sparse_decode
    if s is not None:
        out.sparse_decode = SimpleNamespace(
            row_ks=_np(s.row_ks), row_ke=_np(s.row_ke), block_table=_np(s.block_table),
            row_indices=_np(s.row_indices),
        )  # fmt: skip
        out.scratch.append((0, s.row_ke.shape[0], _scratch_rows(s)))
    chunks = meta.prefill.chunks if meta.prefill is not None else []
    for c, rows in zip(chunks, meta.sparse_prefill or [], strict=True):
        out.sparse_prefill.append(
            SimpleNamespace(start=c.token_start, ks=_np(rows.row_ks), ke=_np(rows.row_ke))
        )
        out.scratch.append((c.token_start, c.token_end, _scratch_rows(rows)))
    return out


def _scratch_rows(rows: Any) -> list[np.ndarray]:
    """The builder-buffer rows a row set's scratch (``sparse_indices``, ``end``,
    ``col_indices``) occupies, each as row numbers of its buffer."""
    out = []
    for t in (rows.sparse_indices, rows.end, rows.col_indices):
        first = t.storage_offset() // (t.stride(0) or 1)
        out.append(np.arange(first, first + t.shape[0]))
    return out


def _freeze(meta: Any) -> SimpleNamespace:
    """Every layer's metadata of one forward as its consumers read it now: the SWA
    cache's of layer 0 (a draft forward's: the draft layer's) and of layer 1, each
    compressed cache's, each indexer cache's, the ring's."""
    layers = meta.layers
    if SWA_LAYER not in layers:  # the drafter's forward: its SWA cache alone
        return SimpleNamespace(swa=_freeze_swa(layers[drafting.DRAFT_LAYER], 0), target=False)
    out = SimpleNamespace(swa=_freeze_swa(layers[SWA_LAYER], RATIOS[0]), target=True)
    out.swa_l1 = _freeze_swa(layers[f"{layer(1)}.swa_cache"], RATIOS[1])
    out.mla, out.idx = {}, {}
    for i, ratio in enumerate(RATIOS):
        m = layers[layer(i)]
        out.mla[ratio] = SimpleNamespace(
            slot_mapping=_np(m.slot_mapping), block_table=_np(m.block_table)
        )
        out.idx[ratio] = _freeze_indexer(layers[f"{layer(i)}.indexer.k_cache"], ratio)
    ring = layers[RING_LAYER]
    out.ring = SimpleNamespace(
        slot_mapping=_np(ring.slot_mapping), token_to_req=_np(ring.token_to_req_indices),
        query_start_loc=_np(ring.query_start_loc),
    )  # fmt: skip
    return out


# -- fields --------------------------------------------------------------------------------


def _swa_extra(config: EngineConfig, m: SimpleNamespace, name: str) -> list[Field]:
    """V4.1's chunk plan of a layer with a compressed cache: each prefill's room for its
    compressed keys in its chunk's workspace (``dequantize_and_gather_k_cache`` writes
    ``seq_lens[i] // ratio`` of them from column 0, the SWA keys from ``chunk_N``; the
    plan's bound of ``chunk_N``: ``cdiv(max_model_len, ratio)``)."""
    if m.prefill_seq_lens is None or m.ratio == 0:
        return []
    seq = _np(m.prefill_seq_lens)
    room = np.zeros(len(seq), dtype=np.int64)
    for start, end, n, _ in m.chunk_plan:
        room[start:end] = n - seq[start:end] // m.ratio
    bound = -(-config.max_model_len // m.ratio)
    return [Field(f"{name}.prefill.compressed_room", "requests", room, (0, bound))]


def _layer1_swa(config: EngineConfig, seen: v1._Seen) -> list[Field]:
    """Layer 1's SWA metadata, what its own layer reads beside layer 0's: its chunk plan
    at ratio 2 and its tile plan (``tile_sched_c2a``)."""
    m = seen.meta.swa_l1
    out = []
    if m.prefill_seq_lens is not None:
        out.append(Field("swa.l1.prefill.gather_room", "requests", swa._prefill_room(m),
                         (0, config.max_num_batched_tokens + WINDOW - 1)))  # fmt: skip
    out += _swa_extra(config, m, "swa.l1")
    if m.tile_sched_fresh is not None:
        fresh = np.full(m.num_decode_tokens, int(m.tile_sched_fresh), dtype=np.int64)
        out.append(Field("swa.l1.tile_sched_fresh", "tokens", fresh, (1, 1)))
    return out


def _mla_fields(
    config: EngineConfig, f: SimpleNamespace, ratio: int, seq_lens: np.ndarray
) -> list[Field]:
    """``mla{r}.*``: what ``DeepseekV4FlashMLAAttention`` reads of a compressed cache's
    metadata (``DeepseekV4FlashMLAMetadata``)."""
    pool = num_blocks(config)
    states = CACHE_BLOCK // ratio
    return [
        # DeepseekCompressor.insert_cache -> rope_quant_insert(..., kv_cache,
        # slot_mapping): a group's last token writes its compressed row at slot
        # (page slot // CACHE_BLOCK, row slot % CACHE_BLOCK) of the kv_cache's pages of
        # `states` rows; -1 writes none.
        Field(f"mla{ratio}.slot_mapping", "tokens", f.slot_mapping, (-1, pool * states - 1)),
        # _forward_decode: compute_global_topk_indices_and_lens maps a token's local
        # index j to block_table[req, j // states]; _forward_prefill:
        # dequantize_and_gather_k_cache reads seq_lens[i] // ratio rows through it.
        Field(f"mla{ratio}.block_table", "requests", f.block_table, (0, pool - 1),
              row_lengths=-(-(seq_lens // ratio) // states)),
    ]  # fmt: skip


def _indexer_reads(f: SimpleNamespace) -> bool:
    """``DeepseekV4Indexer.forward`` runs the indexer op (else every candidate is
    selected, ``_fill_short_context_topk_indices``): the context past ``index_topk``."""
    return f.max_seq_len // f.ratio > TOPK


def _indexer_fields(
    config: EngineConfig,
    f: SimpleNamespace,
    token_to_req: np.ndarray,
    seq_lens: np.ndarray,
    shape: tuple[int, int],
    buffer: int,
) -> list[Field]:
    """``idx{r}.*``: what the indexer reads of its metadata (``SparseAttnIndexer`` on the
    candidate source, ``SparseMQAIndexer`` on a consumer, both in
    ``model_executor/layers``); ``buffer`` the K-gather workspace's rows
    (``DeepseekV4Indexer.max_total_seq_len``)."""
    r = f.ratio
    name = f"idx{r}"
    tokens = shape[1]
    pool = num_blocks(config)
    states = CACHE_BLOCK // r
    # DeepseekV4Indexer._produce_k -> indexer_k_norm_rope_store(..., kv_cache,
    # slot_mapping): a group's last token writes its index key; -1 writes none.
    out = [Field(f"{name}.slot_mapping", "tokens", f.slot_mapping, (-1, pool * states - 1))]
    if not _indexer_reads(f):
        return out
    sparse = r != RATIOS[CANDIDATE_SOURCE]
    d = f.decode
    if d is not None and not sparse:
        width = d.block_table.shape[1]
        out += [
            # fp8_fp4_paged_mqa_logits(context_lens=seq_lens, block_table): row t scores
            # its first seq_lens[t] compressed keys through its block-table row.
            Field(f"{name}.decode.seq_lens", "tokens", d.seq_lens, (0, width * states)),
            Field(f"{name}.decode.block_table", "tokens", d.block_table, (0, pool - 1),
                  row_lengths=-(-d.seq_lens // states)),
            # ... indices: each row's request, which DeepGEMM pairs rows by (only the
            # schedule depends on it): real rows compared, any value.
            Field(f"{name}.decode.indices", "tokens", d.indices),
            # ... schedule_metadata: DeepGEMM's schedule of the context_lens it is
            # handed; entries that are another's: 0.
            Field(f"{name}.decode.schedule_stale", "tokens",
                  np.full(len(d.seq_lens), d.schedule_stale, dtype=np.int64), (0, 0)),
        ]  # fmt: skip
    if f.chunks:
        keyless = _keyless(token_to_req, seq_lens // r, tokens)
        out += _chunk_fields(f, name, token_to_req, keyless, shape, buffer, pool, states)
    s = f.sparse_decode
    if sparse and s is not None:
        width = s.block_table.shape[1]
        out += [
            # sparse_mqa_logits_paged_decode(context_lens=row_ke, block_table,
            # row_indices, row_ks=...): each row's compressed context through its
            # block-table row; row_ks "zeros (paged blocks are context-relative)".
            Field(f"{name}.sparse.decode.row_ke", "tokens", s.row_ke, (0, width * states)),
            Field(f"{name}.sparse.decode.row_ks", "tokens", s.row_ks, (0, 0)),
            Field(f"{name}.sparse.decode.block_table", "tokens", s.block_table, (0, pool - 1),
                  row_lengths=-(-s.row_ke // states)),
            Field(f"{name}.sparse.decode.row_indices", "tokens", s.row_indices),
        ]  # fmt: skip
    if sparse and f.sparse_prefill:
        ks, ke = np.zeros(tokens, dtype=np.int64), np.zeros(tokens, dtype=np.int64)
        for rows in f.sparse_prefill:
            ks[rows.start : rows.start + len(rows.ks)] = rows.ks
            ke[rows.start : rows.start + len(rows.ke)] = rows.ke
        # sparse_mqa_logits_prefill_chunk(cu_seqlen_ks=row_ks, cu_seqlen_ke=row_ke):
        # the chunk's K bounds, as the chunk's own (idx{r}.prefill.*).
        out += [Field(f"{name}.sparse.prefill.ks", "tokens", ks, (0, buffer)),
                Field(f"{name}.sparse.prefill.ke", "tokens", ke, (0, buffer))]  # fmt: skip
    if sparse and f.scratch:
        out.append(_scratch_shared(f, name, tokens))
    return out


def _keyless(token_to_req: np.ndarray, compressed: np.ndarray, tokens: int) -> np.ndarray:
    """Each token whose request has no compressed key yet (``seq_lens // ratio`` is 0):
    ``build_prefill_chunk_metadata`` makes no chunk of such requests alone ("Skip when
    total_seq_lens is 0"), and the indexers' forwards (``SparseAttnIndexer``,
    ``SparseMQAIndexer``) fill every token's top-k with -1 before the chunks, so such a
    token may be in no chunk: it selects no key, as it has none. A request the step does
    not hold (a replay's capture) is not keyless."""
    rows = token_to_req[:tokens]
    known = (rows >= 0) & (rows < len(compressed))
    out = np.zeros(tokens, dtype=bool)
    out[: len(rows)] = known & (compressed[np.where(known, rows, 0)] == 0)
    return out


def _chunk_fields(
    f: SimpleNamespace,
    name: str,
    token_to_req: np.ndarray,
    keyless: np.ndarray,
    shape: tuple[int, int],
    buffer: int,
    pool: int,
    states: int,
) -> list[Field]:
    """The prefill chunks: a chunk gathers each of its requests' compressed keys
    (``cp_gather_indexer_k_quant_cache(kv_cache, k_quant[:max_local_total_seq_lens],
    ..., block_table, local_cu_seq_lens)``: request i's into rows ``cu[i]`` to
    ``cu[i + 1]``, through its block-table row), then scores each token ``t`` of
    ``token_start`` to ``token_end`` on the rows ``cu_seqlen_ks[t]`` to
    ``cu_seqlen_ke[t]`` (``fp8_fp4_mqa_logits``)."""
    requests, tokens = shape
    # Chunks holding each token, less one for a prefill token (in exactly one: 0); a
    # keyless token (:func:`_keyless`) may be in none.
    cover = np.zeros(tokens, dtype=np.int64)
    prefill = np.zeros(tokens, dtype=bool)
    prefill[f.num_decode_tokens : f.num_decode_tokens + f.num_prefill_tokens] = True
    cover[prefill & ~keyless] = -1
    ks, before, past = (np.zeros(tokens, dtype=np.int64) for _ in range(3))
    # A replay's chunks are its capture's (host values), its token_to_req the step's: a
    # chunk's requests may then run past the step's.
    firsts = [int(token_to_req[c.start]) for c in f.chunks]
    ends = [first + c.num_reqs for first, c in zip(firsts, f.chunks, strict=True)]
    requests = max([requests, *ends])
    gathered = np.zeros(requests, dtype=np.int64)
    room = np.zeros(requests, dtype=np.int64)
    tables: dict[int, np.ndarray] = {}
    for c, first in zip(f.chunks, firsts, strict=True):
        rows = np.arange(c.start, c.end)
        cover[rows] += 1
        ks[rows] = c.ks
        # A token's request, and that request's rows of the chunk's workspace; a token
        # whose request is none of the chunk's has no rows there (-1: out of range).
        own = token_to_req[rows] - first
        among = (own >= 0) & (own < len(c.cu) - 1)
        own = np.where(among, own, 0)
        before[rows] = np.where(among, c.ks - c.cu[own], -1)
        past[rows] = np.where(among, c.cu[own + 1] - c.ke, -1)
        if not c.skip:
            for i in range(c.num_reqs):
                gathered[first + i] = c.cu[i + 1] - c.cu[i]
                room[first + i] = c.rows - c.cu[i + 1]
                tables[first + i] = c.block_table[i]
    # A keyless token in a chunk beside keyed requests is in it once too.
    cover[prefill & keyless] = np.maximum(cover[prefill & keyless] - 1, 0)
    width = max([len(t) for t in tables.values()], default=1)
    table = np.zeros((len(gathered), width), dtype=np.int64)
    for i, row in tables.items():
        table[i, : len(row)] = row
    return [
        Field(f"{name}.prefill.cover", "tokens", cover, (0, 0)),
        Field(f"{name}.prefill.ks", "tokens", ks, (0, buffer)),
        # A token's K range lies in its own request's gathered rows.
        Field(f"{name}.prefill.k_before_request", "tokens", before, (0, buffer)),
        Field(f"{name}.prefill.k_past_request", "tokens", past, (0, buffer)),
        Field(f"{name}.prefill.gather_lens", "requests", gathered, (0, width * states)),
        # ... into the chunk's max_local_total_seq_lens rows of the workspace.
        Field(f"{name}.prefill.gather_room", "requests", room, (0, buffer)),
        Field(f"{name}.prefill.block_table", "requests", table, (0, pool - 1),
              row_lengths=-(-gathered // states)),
    ]  # fmt: skip


def _scratch_shared(f: SimpleNamespace, name: str, tokens: int) -> Field:
    """``SparseMQAIndexer.forward``: the first consumer layer of a step fills each row
    set's ``sparse_indices``/``end`` (and ``kernel_metadata``), which later consumer
    layers reuse (``SparseMQARowsMetadata``; ``kernel_metadata``: "sparse_indices/end
    are assumed to be up to date"): no two row sets of a step may share a scratch row.
    By token: how many other row sets share its row set's scratch rows."""
    shared = np.zeros(tokens, dtype=np.int64)
    for i, (start, end, rows) in enumerate(f.scratch):
        for j, (_, _, others) in enumerate(f.scratch):
            if i != j and any(np.intersect1d(a, b).size for a, b in zip(rows, others, strict=True)):
                shared[start:end] += 1
    return Field(f"{name}.sparse.scratch_shared", "tokens", shared, (0, 0))


def _ring_fields(
    config: EngineConfig, f: SimpleNamespace, tokens_pad: int, capacity: int
) -> list[Field]:
    """``ring.*``: what ``fused_save_compress_norm`` (``DeepseekCompressor.forward``) reads
    of the ring's metadata (``CompressorMetadata``); ``capacity`` the ring's rows (its
    ``CircularBufferSpec.block_size``: the state cache's ``shape[1]``)."""
    rows = max(len(f.query_start_loc) - 1, 1)
    return [
        # A request's chunk reads the ring row before its first token at block
        # slot // capacity and stores its last rows at slot; -1 neither.
        Field("ring.slot_mapping", "tokens", f.slot_mapping,
              (-1, num_blocks(config) * capacity - 1)),
        # ... a token's request: query_start_loc[req_ids[t]] (num_reqs + 1 entries).
        Field("ring.token_to_req_indices", "tokens", f.token_to_req, (0, rows - 1)),
        Field("ring.query_start_loc", "offsets", f.query_start_loc, (0, tokens_pad)),
    ]  # fmt: skip


class _Engine(swa._SWAEngine):
    """A V1 runner of DeepSeek-V4.1's attention layers (module docstring)."""

    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return sm100()

    def resolves_to(self, mode: Any) -> Any:
        # Every builder keeps every graph (AttentionCGSupport.ALWAYS).
        return mode

    def kernel_block_size(self) -> int:
        """The SWA cache's pages: the unit of ``kv_slots`` and the forward's slot mapping."""
        return BLOCK_SIZE

    def _build(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        """``vllm-v1``'s engine, its layers DeepSeek-V4.1's and its KV-cache groups and
        attention groups vLLM's own (``get_kv_cache_spec``, the planner,
        ``initialize_attn_backend``)."""
        import vllm.v1.worker.gpu_model_runner as gmr
        from vllm.config import CUDAGraphMode, set_current_vllm_config
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )
        from vllm.v1.core.kv_cache_planning import get_kv_cache_groups
        from vllm.v1.kv_cache_interface import KVCacheConfig
        from vllm.v1.worker.utils import prepare_kernel_block_sizes

        interpreter_bool_masks()
        self.recorder = _Recorder()
        self.recorder.freeze = self.freeze
        self.pages: dict[str, int] = {}  # each request's pages this engine was told of
        vc = self.vllm_config = _vllm_config(config, mode, self.speculator)
        vc.scheduler_config.async_scheduling = self.async_scheduling
        if vc.speculative_config is not None:
            vc.speculative_config = drafting.speculative_config(
                vc.speculative_config, config, self.padded_drafts
            )
        _configure(vc)
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
            for i in range(len(RATIOS)):
                _attention_layer(vc, i, layer(i))
            if r.speculative_config is not None:
                self.install_drafter()
                _attention_layer(vc, len(RATIOS), drafting.DRAFT_LAYER)
            # initialize_kv_cache: the layers' specs, grouped by the engine core's planner
            # (the layout it resolves from the backends first).
            specs = r.get_kv_cache_spec()
            context = vc.compilation_config.static_forward_context
            backends = {context[name].get_attn_backend() for name in specs}
            layouts = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
            resolve_kv_cache_layout(vc, [layouts], specs.values())
            kv = KVCacheConfig(
                num_blocks=self.pool_size(), kv_cache_tensors=[],
                kv_cache_groups=get_kv_cache_groups(vc, specs),
            )  # fmt: skip
            r.kv_cache_config = kv
            r.initialize_attn_backend(kv)
            resolved = vc.compilation_config.cudagraph_mode
            if resolved != self.resolves_to(CUDAGraphMode[mode]):
                raise RuntimeError(f"attnfuzz: vLLM resolved cudagraph_mode {mode} to {resolved}")
            r.initialize_metadata_builders(kv, prepare_kernel_block_sizes(kv, r.attn_groups))
            r.may_reinitialize_input_batch(kv)
            r.model = self.load(resolved)
        self.held: set[str] = set()
        self.prompts: dict[str, int] = {}
        self.tokens: dict[str, int] = {}
        self.capture()

    def output(self, inputs: RunnerStepInputs) -> Any:
        """``vllm-v1``'s scheduler output, each request's pages given to every KV-cache
        group (module docstring): an SWA group all of them, the 128-token group the first
        of every 128 tokens, the ring the first page of a request new to the engine."""
        out = super().output(inputs)
        for new in out.scheduled_new_reqs:
            new.block_ids = self._groups(new.req_id, list(new.block_ids[0]), 0)
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            ids = cached.new_block_ids[i]
            if ids is not None:
                held = 0 if rid in cached.resumed_req_ids else self.pages.get(rid, 0)
                cached.new_block_ids[i] = self._groups(rid, list(ids[0]), held)
        return out

    def _groups(self, rid: str, pages: list[int], held: int) -> tuple[list[int], ...]:
        """Each KV-cache group's block ids of the pages ``pages`` a request gains, after
        the ``held`` it has."""
        from vllm.v1.kv_cache_interface import CircularBufferSpec

        self.pages[rid] = held + len(pages)
        out = []
        for group in self.runner.kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if isinstance(getattr(spec, "first_spec", spec), CircularBufferSpec):
                out.append([] if held else pages[:1] or [NULL_BLOCK_ID])
            else:
                every = spec.block_size // BLOCK_SIZE
                out.append([p for j, p in enumerate(pages, start=held) if j % every == 0])
        return tuple(out)

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        if seen.meta is None:
            return v1._fields(self.config, seen)
        m = seen.meta
        own = v1._Seen(m.swa, seen.slot_mapping, seen.positions, draft=seen.draft)
        out = list(swa._SWAEngine.fields(self, own)) + _swa_extra(self.config, m.swa, "swa")
        if not m.target:
            return tuple(out)
        out += _layer1_swa(self.config, seen)
        seq_lens = _np(m.swa.seq_lens)
        token_to_req = _np(m.swa.token_to_req_indices)
        tokens = int(seen.positions.shape[0])
        for ratio in RATIOS:
            out += _mla_fields(self.config, m.mla[ratio], ratio, seq_lens)
            buffer = self._prefill_buffer(ratio)
            shape = (len(seq_lens), tokens)
            out += _indexer_fields(self.config, m.idx[ratio], token_to_req, seq_lens, shape, buffer)
        out += _ring_fields(self.config, m.ring, tokens, self._ring_capacity())
        return tuple(out)

    def _ring_capacity(self) -> int:
        from vllm.v1.kv_cache_interface import CircularBufferSpec

        for group in self.runner.kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if isinstance(getattr(spec, "first_spec", spec), CircularBufferSpec):
                return int(spec.block_size)
        raise RuntimeError("attnfuzz: the engine has no compressor ring")

    def _prefill_buffer(self, ratio: int) -> int:
        """``DeepseekV4Indexer.max_total_seq_len``: the K-gather workspace's rows."""
        return _modules().indexer.get_max_prefill_buffer_size(self.vllm_config) // ratio


class DeepseekV41RunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of DeepSeek-V4.1's attention layers."""

    engine_type = _Engine

    # The compressed caches' builder's reorder_batch_threshold makes the runner reorder
    # its batch, as MLA's does: the fresh engine's warm-up adds each running request as a
    # first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = DeepseekV41RunnerStepEngine()
"""The engine of the implementation ``vllm-v1-deepseek-v41`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-deepseek-v41`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: DeepseekV41SparseIndexerMetadataBuilder.build with its prefill rows rebased ----


_SPARSE_BUILDER = "DeepseekV41SparseIndexerMetadataBuilder"


class _PrefillRowsRebased(ast.NodeTransformer):
    """``self._rows(chunk.token_start, chunk.token_end, ...)`` with both bounds less
    ``base.num_decode_tokens``: a chunk's scratch rows counted from the first prefill
    token, not from the batch's first token."""

    changed = False

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if ast.unparse(node) == "super()":
            # Outside its class the method's zero-argument super() has no __class__
            # cell: the same call, its class and instance named.
            return ast.parse(f"super({_SPARSE_BUILDER}, self)", mode="eval").body
        bounds = [ast.unparse(a) for a in node.args[:2]]
        if ast.unparse(node.func) == "self._rows" and bounds == [
            "chunk.token_start",
            "chunk.token_end",
        ]:
            self.changed = True
            decodes = ast.parse("base.num_decode_tokens", mode="eval").body
            node.args[:2] = [ast.BinOp(a, ast.Sub(), decodes) for a in node.args[:2]]
        return node


@functools.cache
def _rebased_build() -> Any:
    builder = _modules().sparse_indexer.DeepseekV41SparseIndexerMetadataBuilder
    change = _PrefillRowsRebased()
    definition = change.visit(function_tree(builder.build))
    if not change.changed:
        raise RuntimeError(
            "attnfuzz: DeepseekV41SparseIndexerMetadataBuilder.build no longer slices the "
            "prefill chunks' rows by token"
        )
    return recompiled(builder.build, definition)


@contextlib.contextmanager
def _prefill_rows_rebased() -> Iterator[None]:
    """``DeepseekV41SparseIndexerMetadataBuilder.build`` gives each prefill chunk the
    scratch rows of its tokens counted from the first prefill token: in a step with
    decodes, the first chunk's rows are the decode rows' (``sparse_indices``, ``end``,
    ``col_indices``), which a later consumer layer reuses as its own."""
    builder = _modules().sparse_indexer.DeepseekV41SparseIndexerMetadataBuilder
    with mock.patch.object(builder, "build", _rebased_build()):
        yield


_REBASED = v1.Mutated(DeepseekV41RunnerStepEngine(), _prefill_rows_rebased)


def sparse_rows_shared(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-deepseek-v41-sparse-rows-shared``: a step of decodes and prefills whose
    candidate consumer runs gives its first prefill chunk the decode rows' scratch
    (``idx2.sparse.scratch_shared``)."""
    return _REBASED(inputs)


sparse_rows_shared.new_engine = _REBASED.engine.new_engine  # type: ignore[attr-defined]


def reach_v41(trace: Trace | Case) -> bool:
    """A V1 engine of 32-token pages: every step runs every builder."""
    return declines_config(trace.config) is None


def trigger_sparse_decodes_and_prefills(trace: Trace | Case) -> bool:
    """A step of decodes and prefills (a request of at most ``1 + num_spec`` query
    tokens, which the split takes as a decode, beside a longer one) whose candidate
    consumer runs its indexer (a sequence of more than ``2 * index_topk + 1`` tokens:
    ``DeepseekV4Indexer.forward``'s short-context test at ratio 2)."""
    next_n = trace.config.num_spec + 1
    return reach_v41(trace) and any(
        min(b.q_lens) <= next_n < max(b.q_lens)
        and max(c + q for c, q in zip(b.num_computed_tokens, b.q_lens, strict=True))
        // RATIOS[1] > TOPK
        for b in hybrid._batches(trace)
    )  # fmt: skip


def smallest_sparse_decodes_and_prefills() -> Trace:
    """Request 0 a prompt of one token (a decode row: one query token) beside request 1's
    prompt of 18 (a prefill past ``2 * index_topk`` tokens, so that the consumer's
    indexer runs), on an engine without graphs: the prefill chunk's scratch row 0 is the
    decode row's."""
    config = EngineConfig(
        max_model_len=BLOCK_SIZE, max_num_seqs=2, max_num_batched_tokens=BLOCK_SIZE,
        block_size=BLOCK_SIZE, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    step = Batch(
        (0, 0), (1, 2 * TOPK + 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1),
        prompt_lens=(1, 2 * TOPK + 2),
    )  # fmt: skip
    return Trace(config, (step,))


def trigger_full_split(trace: Trace | Case) -> bool:
    """A step a FULL mixed graph replays with another split than its capture's
    (:func:`full_split_differs`)."""
    return reach_v41(trace) and any(
        full_split_differs(trace.config, b) for b in hybrid._batches(trace)
    )


def reach_full_mixed(trace: Trace | Case) -> bool:
    """A V1 engine of 32-token pages whose mode is ``FULL``: mixed steps replay graphs."""
    c = trace.config
    return reach_v41(trace) and c.runner == "v1" and c.cudagraph_mode == "FULL"


def smallest_full_split() -> Trace:
    """Seed 0's minimized witness (the search of
    ``vllm-v1-deepseek-v41-full-split-captured``): one request prefills a prompt of 2
    tokens beside a data-parallel peer's prefill of 2 (one token more, capped by
    ``max_num_batched_tokens``), on an engine of mode ``FULL`` whose graphs hold 1 and
    2 tokens. The graph of 2 was captured on two one-token dummy requests (two
    decodes); the step's build splits its 2 tokens as a prefill and writes the prefill
    rows, and the replay runs the decode path on decode rows this build did not write."""
    config = EngineConfig(
        max_model_len=8, max_num_seqs=2, max_num_batched_tokens=2, block_size=BLOCK_SIZE,
        num_spec=0, cudagraph_capture_sizes=(1, 2), cudagraph_mode="FULL",
        cg_support="ALWAYS", runner="v1",
    )  # fmt: skip
    step = Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(2,))
    return Trace(config, (step,))
