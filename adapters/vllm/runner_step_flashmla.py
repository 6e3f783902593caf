"""vLLM's model runner V1 step of an MLA model on the FlashMLA backend, its KV cache in
fp8, as the implementation ``vllm-v1-flashmla`` of ``runner-step``.

The engine of :mod:`.runner_step_mla`, its MLA layer (and the MTP draft layer) on vLLM's
``FLASHMLA`` backend (``vllm/v1/attention/backends/mla/flashmla.py``) as a Hopper GPU
runs it, with ``--kv-cache-dtype fp8``: ``FlashMLAMetadataBuilder`` builds every step
(eager, padded for the graph, replayed, afresh, the drafter's sub-steps) and
``build_for_cudagraph_capture`` the capture runs. Beside ``MLACommonMetadataBuilder``
(which ``vllm-v1-mla`` drives on Triton MLA), what this backend's builder does:

- its reorder threshold is 128 (``reorder_batch_threshold``: "process small prefills
  with decode pathway"), not ``1 + num_spec``: every uniform run of queries up to 128
  tokens is a decode (``split_decodes_and_prefills`` with ``require_uniform``), a
  prefill's first chunk too;
- ``_build_decode`` asks FlashMLA for the decode schedule (``get_mla_metadata``, and
  with an fp8 cache ``get_mla_metadata_dense_fp8``, from the step's decode seq_lens and
  ``max_query_len * num_heads`` query tokens a KV head), and in an engine of FULL
  graphs copies the fp8 schedule (its tile metadata, its split offsets) into
  persistent buffers made at ``__init__`` (``cg_buf_tile_scheduler_metadata``, as
  many rows as the GPU has SMs; ``cg_buf_num_splits``), whose views the graph holds.

Stood in, as a CUDA build on an sm90 GPU has them, where ``flashmla.py`` looks them up
(its kernels are not built here, so ``vllm.v1.attention.ops.flashmla`` leaves each
raising "FlashMLA is not available"):

- ``num_compute_units``: 132, an H100's or H200's SMs;
- ``get_mla_metadata`` (FlashMLA's ``flash_mla_interface.py``): its contract is an
  empty ``FlashMLASchedMeta``, the schedule made at the kernel's first call;
- ``get_mla_metadata_dense_fp8`` (``torch.ops._flashmla_extension_C.
  get_mla_decoding_metadata_dense_fp8``, FlashMLA's ``get_mla_decoding_metadata``) by
  its contract (:func:`decoding_schedule`): it refuses ``seqlens_k`` not int32 of one
  dimension; it returns the tile metadata, int32 ``(num_sm_parts, 8)`` with
  ``num_sm_parts = SMs // num_heads_k // cdiv(num_q_tokens_per_head_k, 64)``, each
  part's first and last request and block and its first split, and the split offsets,
  int32 of ``batch_size + 1`` (``num_splits[i]``: the splits of the requests before
  ``i``), by the schedule FlashMLA's ``get_mla_metadata_kernel`` makes: each request
  ``max(seq_len - 1, 0) // 64 + 1`` blocks of 64 keys plus an overhead of 5, dealt to
  the parts in equal payloads, a request split where a payload ends inside it.

The model's latent cache is fp8 (``CacheConfig.cache_dtype``, one byte a value in the
KV-cache spec); ``FlashMLABackend`` takes pages of 64 tokens only
(``get_supported_kernel_block_sizes``), so the implementation draws that block size.

Fields: ``vllm-v1-mla``'s (every MLA tensor a kernel reads, ``kv_len`` and ``kv_slots``,
the forward context's slot mapping, the positions) and ``flashmla.schedule_stale``: of
the schedule the decode kernel is handed (``flash_mla_with_kvcache_fp8`` reads
``tile_scheduler_metadata`` and ``num_splits`` beside ``decode.seq_lens``), how many
entries differ from FlashMLA's schedule of the seq_lens it is handed at that moment,
0 the only value it accepts: a graph that replays a capture's schedule against the
step's lengths, or a copy that leaves part of an earlier one, reads a schedule made for
other lengths. Its values are the vendor's, so no other property compares them:
padding requests change the schedule of the real ones (each adds its overhead).

Declined: ``vllm-v1-mla``'s cases, and a block size but 64.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.standins import VendorContractError
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_FLASHMLA = "vllm/v1/attention/backends/mla/flashmla.py"
SMS = 132
"""The SMs of an H100 SXM or an H200 (``num_compute_units``)."""
BLOCK_SIZE = 64
"""``FlashMLABackend.get_supported_kernel_block_sizes``: pages of 64 tokens."""
# FlashMLA's decoding schedule (get_mla_decoding_metadata, get_mla_metadata_kernel).
_BLOCK_M, _BLOCK_N, _OVERHEAD, _TILE_ENTRIES = 64, 64, 5, 8


def prepare() -> None:
    """Import vLLM's V1 runner and the FlashMLA backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.flashmla import FlashMLABackend

    return FlashMLABackend


# -- FlashMLA, as an sm90 GPU has it --------------------------------------------------------


def decoding_schedule(
    seqlens_k: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int, sms: int = SMS
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's decoding schedule of ``seqlens_k`` (module docstring): the tile
    metadata and the split offsets."""
    if seqlens_k.dtype != torch.int32 or seqlens_k.dim() != 1:
        raise VendorContractError(
            f"seqlens_k must be int32 of one dimension, got {seqlens_k.dtype} "
            f"{tuple(seqlens_k.shape)}"
        )
    parts = sms // num_heads_k // -(-num_q_tokens_per_head_k // _BLOCK_M)
    lengths = seqlens_k.tolist()
    blocks = [max(s - 1, 0) // _BLOCK_N + 1 for s in lengths]
    total = sum(b + _OVERHEAD for b in blocks)
    payload = -(-total // max(parts, 1)) + _OVERHEAD
    tiles = torch.zeros(parts, _TILE_ENTRIES, dtype=torch.int32)
    splits = [0]
    now, block, split = 0, 0, 0  # the request, its block and its split the next part starts at
    for part in range(parts):
        first = (now, block, split)
        left = payload
        while now < len(lengths):
            if left >= blocks[now] - block + _OVERHEAD:  # the rest of the request fits
                left -= blocks[now] - block + _OVERHEAD
                splits.append(splits[-1] + split + 1)
                now, block, split = now + 1, 0, 0
            else:  # the part ends inside the request: it is split there
                if left > _OVERHEAD:
                    block, split = block + left - _OVERHEAD, split + 1
                break
        if block > 0:
            last = (now, block)
        else:
            last = (now - 1, 0 if now == 0 or lengths[now - 1] == 0 else blocks[now - 1])
        tiles[part, :5] = torch.tensor([first[0], first[1], last[0], last[1], first[2]])
    if now != len(lengths):
        raise VendorContractError("FlashMLA's schedule leaves requests unscheduled")
    return tiles.to(seqlens_k.device), torch.tensor(splits, dtype=torch.int32).to(seqlens_k.device)


def get_mla_metadata(
    cache_seqlens: Any = None,
    num_q_tokens_per_head_k: int | None = None,
    num_heads_k: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """``flash_mla_interface.get_mla_metadata``: an empty schedule, made by the kernel.
    It also keeps what it was asked (``heads``: the KV heads and the query tokens a KV
    head), attnfuzz's record, from which ``_freeze`` asks FlashMLA's schedule again."""
    from vllm.v1.attention.ops.flashmla import FlashMLASchedMeta

    meta = FlashMLASchedMeta()
    meta.heads = (num_heads_k, num_q_tokens_per_head_k)
    return meta, None


def get_mla_metadata_dense_fp8(
    cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``vllm.v1.attention.ops.flashmla.get_mla_metadata_dense_fp8`` on an sm90 GPU."""
    return decoding_schedule(cache_seqlens, num_q_tokens_per_head_k, num_heads_k)


@contextlib.contextmanager
def flashmla() -> Iterator[None]:
    """``flashmla.py`` as it runs on an sm90 GPU's CUDA build (module docstring)."""
    from vllm.v1.attention.backends.mla import flashmla as module

    with mock.patch.multiple(
        module,
        num_compute_units=lambda *a, **k: SMS,
        get_mla_metadata=get_mla_metadata,
        get_mla_metadata_dense_fp8=get_mla_metadata_dense_fp8,
    ):
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-mla``'s cases, and a block size
    the FlashMLA backend has no kernel block size for."""
    return declines_config(case.config) or mla.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size != BLOCK_SIZE:
        return (
            f"block_size {config.block_size}: the FlashMLA backend's pages are 64 tokens "
            f"({_FLASHMLA} FlashMLABackend.get_supported_kernel_block_sizes)"
        )
    return mla.declines_config(config)


# -- the engine -----------------------------------------------------------------------------


def _differing(got: torch.Tensor, want: torch.Tensor) -> int:
    """How many entries of ``got`` are not ``want``'s (all of them, shapes apart)."""
    return int((got != want).sum()) if got.shape == want.shape else got.numel()


def _freeze(meta: Any) -> Any:
    """``vllm-v1-mla``'s view of ``meta``, and how far the decode schedule the kernel
    reads now is from FlashMLA's schedule of the decode lengths it reads now."""
    out = mla._freeze(meta)
    out.schedule_stale = None
    scheduled = None if meta.decode is None else meta.decode.scheduler_metadata
    tiles = getattr(scheduled, "tile_scheduler_metadata", None)
    if tiles is not None:
        heads_k, per_head = scheduled.heads
        want_tiles, want_splits = decoding_schedule(meta.decode.seq_lens, per_head, heads_k)
        stale = _differing(tiles, want_tiles) + _differing(scheduled.num_splits, want_splits)
        out.schedule_stale = stale
    return out


class _FlashMLAEngine(mla._MLAEngine):
    """A V1 runner of an MLA model on the FlashMLA backend, its KV cache fp8."""

    backend = staticmethod(_backend)
    kv_cache_dtype = "fp8"
    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return flashmla()  # the flash_mla kernels' schedulers

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        m = seen.meta
        if m is None or m.schedule_stale is None:
            return out
        rows = len(m.decode.seq_lens)
        # flash_mla_with_kvcache_fp8 reads the schedule beside decode.seq_lens: it must
        # be FlashMLA's schedule of those lengths (no entry stale).
        stale = Field("flashmla.schedule_stale", "requests",
                      np.full(rows, m.schedule_stale, dtype=np.int64), (0, 0))  # fmt: skip
        return (*out, stale)


class FlashMLARunnerStepEngine(mla.MLARunnerStepEngine):
    """``vllm-v1``'s three engines, of an MLA model on FlashMLA."""

    engine_type = _FlashMLAEngine


ENGINE = FlashMLARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashmla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashmla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: FlashMLAMetadataBuilder._build_decode with the graph buffers' copies dropped.


@contextlib.contextmanager
def _schedule_not_persistent() -> Iterator[None]:
    """``_build_decode`` hands the decode kernel the fp8 schedule FlashMLA just made, not
    its copy in the builder's graph buffers (the ``has_full_cudagraphs`` block
    dropped): a FULL graph holds the capture's schedule, and its replay reads it
    against the step's lengths."""
    from vllm.v1.attention.backends.mla.flashmla import FlashMLAMetadataBuilder

    original = FlashMLAMetadataBuilder._build_decode

    def build_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        mode = self.compilation_config.cudagraph_mode
        with mock.patch.object(type(mode), "has_full_cudagraphs", lambda _: False):
            return original(self, *args, **kwargs)

    with mock.patch.object(FlashMLAMetadataBuilder, "_build_decode", build_decode):
        yield


_MUTANT = v1.Mutated(FlashMLARunnerStepEngine(), _schedule_not_persistent)


def schedule_not_persistent(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-flashmla-schedule-not-persistent``: a FULL graph's replay reads the
    capture's decode schedule (``flashmla.schedule_stale``)."""
    return _MUTANT(inputs)


schedule_not_persistent.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


def reach_full_graphs(trace: Trace | Case) -> bool:
    """A V1 engine with FULL graphs and the pages FlashMLA runs."""
    c = trace.config
    return (
        c.runner == "v1" and c.cudagraph_mode in hybrid._FULL_MODES and c.block_size == BLOCK_SIZE
    )


def trigger_full_decode(trace: Trace | Case) -> bool:
    """A decode a FULL graph replays (:func:`.runner_step_hybrid.trigger_full_decode`),
    on the pages FlashMLA runs."""
    return reach_full_graphs(trace) and hybrid.trigger_full_decode(trace)


def smallest_full_decode() -> Trace:
    """One request prefills 3 tokens, then decodes one, padded to the FULL decode graph
    of 2 tokens (2 requests), on pages of 64 tokens."""
    trace = hybrid.smallest_full_decode()
    return Trace(dataclasses.replace(trace.config, block_size=BLOCK_SIZE), trace.steps)
