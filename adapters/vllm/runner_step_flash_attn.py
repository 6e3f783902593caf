"""vLLM's model runner V1 step on the FlashAttention backend, as the implementation
``vllm-v1-flash-attn`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
vLLM's ``FLASH_ATTN`` backend (``vllm/v1/attention/backends/flash_attn.py``), run as on
a Hopper GPU, FlashAttention 3: ``FlashAttentionMetadataBuilder`` builds every step
(eager, padded for the graph, replayed, afresh; ``build_for_drafting`` for the
drafter's sub-steps) and ``build_for_cudagraph_capture`` in the capture runs. With FA3
the builder schedules ahead of time (``aot_schedule``): ``_get_scheduler_metadata``
calls the vendor's ``get_scheduler_metadata``, and an engine with FULL graphs copies
its result into a persistent graph buffer whose tail it zeroes
(``_store_scheduler_metadata``), and caps the splits of a step a graph may hold
(``max_num_splits``, the attention config's ``flash_attn_max_num_splits_for_cuda_graph``).

Stood in beyond ``vllm-v1``, as a CUDA build on an sm90 GPU has them:

- ``get_flash_attn_version`` where ``flash_attn.py`` looks it up: 3;
- ``FlashAttentionMetadataBuilder._cudagraph_support``, which the class body evaluates
  once at import from that version: ``AttentionCGSupport.ALWAYS`` (FA3's);
- ``get_scheduler_metadata`` (``vllm.vllm_flash_attn``, imported by ``flash_attn.py``
  only where the kernels are built), by its contract, read from vLLM's FlashAttention
  fork (``hopper/flash_api.cpp: mha_fwd_get_scheduler_metadata``): it refuses what that
  function's checks refuse (a ``qkv_dtype`` other than fp16, bf16 or fp8 e4m3, query
  heads not a multiple of the KV heads, a ``cache_seqlens`` not int32 of ``batch_size``
  entries, a ``cu_seqlens_q`` not int32 of ``batch_size + 1``), and returns int32 of
  ``1 + round_up(batch_size, 4) * vectors`` entries on an sm90 GPU: the vectors (each
  ``round_up(batch_size, 4)`` long) of each request's dynamic splits, its query
  blocks, the batches' sorted order and, where the kernel is causal or local, the
  heads kept in L2, then the tile-count semaphore (zero). Their values are the
  vendor's schedule, never vLLM's: the model takes no split (1) and no query block
  (0), the batches in their order, a schedule every kernel launch accepts. The
  kernel is causal unless ``max_seqlen_q == 1`` with no window and a head size of at
  most 64 or above 128 (the special case of ``mha_fwd_get_scheduler_metadata``).

The model's attention is 1 KV head of 128, bf16 (``FlashAttentionBackend.
supported_dtypes``: fp16 and bf16; ``supports_head_size``: multiples of 8 up to 256).

Every field of ``FlashAttentionMetadata`` a kernel reads is reported (``fa.*``) with the
range its consumer accepts (``FlashAttentionImpl.forward`` hands them to
``flash_attn_varlen_func``): the query offsets (``cu_seqlens_q``), the sequence lengths
(``seqused_k``), the block table (``block_table``), the scheduler metadata the kernel is
handed, the bounds of every row's query and keys (``max_seqlen_q``, ``max_seqlen_k``,
each at least every row's length), and, in an engine of FULL graphs, the graph buffer
past the schedule (which ``_store_scheduler_metadata`` zeroes: "some thread blocks may
use the invalid scheduler metadata"); of a forward a FULL graph holds, the graph's
query bound (the capture's, which the replayed rows must fit under: ``mha_fwd`` and its
combine kernel's grid read it) and splits (at least 1: 0 is "FA3's heuristics, not CG
compatible"), judged by safety alone (an eager build has neither); beside
``vllm-v1``'s fields of the step (the forward context's slot mapping, which
``do_kv_cache_update`` writes the cache by, and the positions). The metadata's own
``slot_mapping`` is read by no kernel here (``forward_includes_kv_cache_update`` is
False), and there is no cascade attention in this backend. Every build also states
``kv_len`` and ``kv_slots`` by request, the keys FA3 reads of the cache
(:meth:`_FlashAttnEngine.kv_read`), which ``vllm-v1-backends`` holds to ``vllm-v1``'s.

Declined: ``vllm-v1``'s cases, the block sizes the backend has no kernel block size for
(``FlashAttentionBackend.get_supported_kernel_block_sizes``: multiples of 16 on sm90
for this head size and dtype).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang.fa3_backend import QKV_DTYPES
from attnfuzz.adapters.standins import VendorContractError
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_FA = "vllm/v1/attention/backends/flash_attn.py"
HEAD_SIZE = 128
"""The model's head size: one FA3 runs (``supports_head_size``)."""
FA_VERSION = 3
"""The FlashAttention version of an sm90 GPU (``fa_utils.get_flash_attn_version``)."""


def prepare() -> None:
    """Import vLLM's V1 runner and the FlashAttention backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    return FlashAttentionBackend


# -- FlashAttention 3, as an sm90 GPU has it ------------------------------------------------


def get_scheduler_metadata(
    batch_size: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    num_heads_q: int,
    num_heads_kv: int,
    headdim: int,
    cache_seqlens: torch.Tensor,
    qkv_dtype: torch.dtype = torch.bfloat16,
    headdim_v: int | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k_new: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    page_size: int | None = None,
    max_seqlen_k_new: int = 0,
    causal: bool = False,
    window_size: tuple[int, int] | None = (-1, -1),
    has_softcap: bool = False,
    num_splits: int = 0,
    pack_gqa: bool | None = None,
    sm_margin: int = 0,
) -> torch.Tensor:
    """``vllm.vllm_flash_attn.get_scheduler_metadata`` on an sm90 GPU, by its contract
    (module docstring)."""
    if qkv_dtype not in QKV_DTYPES:
        raise VendorContractError(
            f"FlashAttention only supports fp16, bf16, and fp8_e4m3 data type, got {qkv_dtype}"
        )
    if num_heads_q % num_heads_kv:
        raise VendorContractError(
            f"Number of heads in key/value ({num_heads_kv}) must divide number of heads in "
            f"query ({num_heads_q})"
        )
    for name, t, entries in (("cache_seqlens", cache_seqlens, batch_size),
                             ("cu_seqlens_q", cu_seqlens_q, batch_size + 1)):  # fmt: skip
        if t is not None and (t.dtype != torch.int32 or tuple(t.shape) != (entries,)):
            raise VendorContractError(
                f"{name} must be int32 of shape ({entries},), got {t.dtype} {tuple(t.shape)}"
            )
    left, right = window_size or (-1, -1)
    if max_seqlen_q == 1 and (left, right) == (-1, -1):
        if headdim <= 64 or headdim > 128 or page_size is None:
            causal = False  # causal is the same as non-causal for one query row
    if causal:
        right = 0
    is_causal = left < 0 and right == 0
    is_local = (left >= 0 or right >= 0) and not is_causal
    rounded = -(-batch_size // 4) * 4
    vectors = 2 + (not is_local) + (is_causal or is_local)
    out = torch.zeros(1 + rounded * vectors, dtype=torch.int32, device=cache_seqlens.device)
    out[:batch_size] = 1  # each request's splits: none
    if not is_local:  # the batches' sorted order: as they come
        out[2 * rounded : 2 * rounded + batch_size] = torch.arange(batch_size)
    return out


@contextlib.contextmanager
def fa3() -> Iterator[None]:
    """``flash_attn.py`` as it runs on an sm90 GPU's CUDA build (module docstring)."""
    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.attention.backends import flash_attn

    with (
        mock.patch.object(flash_attn, "get_flash_attn_version", lambda *a, **k: FA_VERSION),
        mock.patch.object(
            flash_attn, "get_scheduler_metadata", get_scheduler_metadata, create=True
        ),
        mock.patch.object(
            flash_attn.FlashAttentionMetadataBuilder,
            "_cudagraph_support",
            AttentionCGSupport.ALWAYS,
        ),
    ):
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s runner cases, and block sizes
    the FlashAttention backend has no kernel block size for."""
    return declines_config(case.config) or v1.step_declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    with fa3():
        supported = _backend().supports_block_size(config.block_size)
    if config.runner == "v1" and not config.varlen_decode and not supported:
        return (
            f"block_size {config.block_size}: the FlashAttention backend's kernel block "
            f"sizes are multiples of 16 ({_FA} FlashAttentionBackend."
            "get_supported_kernel_block_sizes)"
        )
    return v1.declines_config(config)


# -- the engine -----------------------------------------------------------------------------


def _freeze(meta: Any) -> SimpleNamespace:
    """What the kernel reads of ``meta`` now (the persistent buffers change after the
    forward), and whether a FULL graph holds the forward (the forward context's mode:
    a FULL capture, a FULL replay, the step handed to a FULL graph)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context

    scheduled = meta.scheduler_metadata
    # _store_scheduler_metadata hands the kernel a view of the builder's graph buffer.
    buffer = None if scheduled is None else scheduled._base
    tail = None
    if buffer is not None:
        tail = buffer.reshape(-1)[scheduled.storage_offset() + scheduled.shape[0] :].clone()
    full = get_forward_context().cudagraph_runtime_mode == CUDAGraphMode.FULL
    return SimpleNamespace(
        query_start_loc=meta.query_start_loc.clone(),
        seq_lens=meta.seq_lens.clone(),
        block_table=meta.block_table.clone(),
        scheduler_metadata=None if scheduled is None else scheduled.clone(),
        tail=tail,
        max_num_splits=meta.max_num_splits,
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        full_graph=full,
    )


def _fa_fields(config: EngineConfig, seen: v1._Seen, split_cap: int) -> list[Field]:
    """Every field of the FlashAttention metadata a kernel reads, with what it accepts:
    ``FlashAttentionImpl.forward`` hands them to ``flash_attn_varlen_func`` (FA3's
    ``mha_fwd``, ``hopper/flash_api.cpp``)."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    bs = config.block_size
    reach = int(m.block_table.shape[1]) * bs
    seq_lens = v1._np(m.seq_lens)
    rows = len(seq_lens)
    out = [
        # cu_seqlens_q: request i's query rows are q[query_start_loc[i] : [i + 1]].
        Field("fa.query_start_loc", "offsets", v1._np(m.query_start_loc), (0, tokens_pad)),
        # seqused_k: its keys are the first seq_lens[i] of its pages, no more than the
        # block-table row reaches.
        Field("fa.seq_lens", "requests", seq_lens, (0, reach)),
        # block_table[i, j]: a page of the KV cache (KVCacheConfig.num_blocks); the
        # kernel reads a row's first cdiv(seq_lens[i], page size) pages.
        Field("fa.block_table", "requests", v1._np(m.block_table), (0, num_blocks(config) - 1),
              row_lengths=-(-seq_lens.astype(np.int64) // bs)),
    ]  # fmt: skip
    if m.scheduler_metadata is not None:
        # scheduler_metadata: the vendor's schedule of the step, its first entries each
        # request's splits; its values are the vendor's (no range of vLLM's).
        out.append(Field("fa.scheduler_metadata", "requests", v1._np(m.scheduler_metadata)))
    if m.tail is not None:
        # _store_scheduler_metadata: the graph buffer past the step's schedule is zeroed,
        # "otherwise, some thread blocks may use the invalid scheduler metadata".
        out.append(Field("fa.scheduler_metadata.tail", "requests", v1._np(m.tail), (0, 0)))
    q_lens = np.diff(v1._np(m.query_start_loc).astype(np.int64))
    longest_query = int(q_lens.max(initial=0))
    if not m.full_graph:
        # max_seqlen_q, max_seqlen_k: bounds of every row's query and keys (mha_fwd's
        # grid and get_scheduler_metadata's). In a FULL graph the kernel's are the
        # capture's (below); the keys' bound is read by get_scheduler_metadata alone,
        # at build (a paged mha_fwd takes the block table's reach).
        out += [
            Field("fa.max_query_len", "requests", np.full(rows, m.max_query_len),
                  (longest_query, tokens_pad)),
            Field("fa.max_seq_len", "requests", np.full(rows, m.max_seq_len),
                  (int(seq_lens.max(initial=0)), reach)),
        ]  # fmt: skip
    else:
        # The graph's max_seqlen_q (the capture's): run_mha_fwd_combine's grid covers
        # max_seqlen_q rows of each request, and a single-row bound makes mha_fwd
        # non-causal; every row the graph replays must fit under it.
        out.append(Field("fa.full_graph.max_query_len", "requests",
                         np.full(rows, m.max_query_len), (longest_query, tokens_pad)))  # fmt: skip
    if m.full_graph:
        # A FULL graph's splits: FA3 sizes its split buffers by them at capture; 0 is
        # "FA3's heuristics, not CG compatible" (build), the cap the config's.
        splits = np.full(rows, m.max_num_splits, dtype=np.int64)
        out.append(Field("fa.full_graph.max_num_splits", "requests", splits, (1, split_cap)))
    return out


class _FlashAttnEngine(v1._Engine):
    """A V1 runner whose attention layer is on the FlashAttention backend, FA3."""

    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return fa3()  # FA3 on sm90

    def attention_group(self) -> tuple[type, Any]:
        return v1.bf16_attention_group(self.vllm_config, self.config, _backend(), HEAD_SIZE)

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        fa: list[Field] = []
        if seen.meta is not None:
            cap = self.vllm_config.attention_config.flash_attn_max_num_splits_for_cuda_graph
            fa = _fa_fields(self.config, seen, cap)
        return v1._fields(self.config, no_meta) + tuple(fa) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots as FA3 reads them:
        ``FlashAttentionImpl.forward`` hands ``flash_attn_varlen_func`` the paged cache
        with ``seqused_k=seq_lens`` and ``block_table`` (no cascade here), so request
        ``i`` reads its first ``fa.seq_lens[i]`` keys (the step's own included:
        ``do_kv_cache_update`` writes them first), key ``j`` in page
        ``fa.block_table[i, j // block_size]`` at ``j % block_size``."""
        m = seen.meta
        return v1.paged_keys(v1._np(m.seq_lens), v1._np(m.block_table), self.kernel_block_size())


class FlashAttnRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the FlashAttention backend."""

    engine_type = _FlashAttnEngine


ENGINE = FlashAttnRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flash-attn`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flash-attn`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: FlashAttentionMetadataBuilder._store_scheduler_metadata with one line dropped.


@contextlib.contextmanager
def _tail_kept() -> Iterator[None]:
    """``_store_scheduler_metadata`` copies the step's schedule into the graph buffer
    without zeroing the rest: a smaller batch after a larger one leaves the larger
    one's schedule past its own."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder

    def store(self: Any, scheduler_metadata: torch.Tensor | None) -> torch.Tensor | None:
        if self.use_full_cuda_graph and scheduler_metadata is not None:
            n = scheduler_metadata.shape[0]
            self.scheduler_metadata[:n] = scheduler_metadata
            return self.scheduler_metadata[:n]
        return scheduler_metadata

    with mock.patch.object(FlashAttentionMetadataBuilder, "_store_scheduler_metadata", store):
        yield


_MUTANT = v1.Mutated(FlashAttnRunnerStepEngine(), _tail_kept)


def scheduler_tail_kept(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-flash-attn-scheduler-tail-kept``: the graph buffer keeps a larger
    batch's schedule past a smaller one's (safe padding)."""
    return _MUTANT(inputs)


scheduler_tail_kept.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


def trigger_tail(trace: Trace | Case) -> bool:
    """An engine of FULL graphs whose builds schedule batches of more than 4 requests and
    fewer (a schedule's length is ``1 + round_up(batch, 4) * vectors``): FULL graphs of
    such sizes are captured, largest first."""
    c = trace.config
    if not hybrid.reach_full_graphs(trace):
        return False
    reqs = {min(size // c.next_n, c.max_num_seqs) for size in c.cudagraph_capture_sizes}
    return max(reqs, default=0) > 4 and min(reqs, default=0) <= 4


def smallest_tail() -> Trace:
    """The FULL decode graphs of 8 and 2 tokens (one request each token): captured largest
    first, the graph of 2 requests schedules after that of 8; one request prefills 3
    tokens."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=8, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2, 8), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (3,), req_ids=(7,), pages=((1,),), new_pages=(1,)),))
