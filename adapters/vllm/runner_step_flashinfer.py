"""vLLM's model runner V1 step on the FlashInfer backend, as the implementation
``vllm-v1-flashinfer`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
vLLM's ``FLASHINFER`` backend (``vllm/v1/attention/backends/flashinfer.py``):
``FlashInferMetadataBuilder`` builds every step (eager, padded for the graph, replayed,
afresh, the drafter's sub-steps) and ``build_for_cudagraph_capture`` in the capture
runs, a decode wrapper for each graph's batch size (``_get_decode_wrapper``), planned
through vLLM's ``fast_plan_decode``.

Run as on an Ampere GPU (sm80, an A100): ``current_platform``'s capability, where
``flashinfer.py`` and ``vllm/utils/flashinfer.py`` look it up, is 8.0, and
``has_nvidia_artifactory`` (a network probe) answers True, so that the capability alone
decides. On sm80 ``supports_trtllm_attention`` is False: ``can_use_trtllm_attention``
and ``use_trtllm_attention`` turn TRT-LLM and XQA off, decode and prefill run
FlashInfer's native wrappers, decode the fa2 backend (``_use_fa2_native_decode``), which
plans a uniform speculative decode per request (``q_len_per_req``), and FULL graphs hold
uniform batches (``get_cudagraph_support``: ``UNIFORM_BATCH``).

``flashinfer`` is :mod:`.flashinfer_stand_in` (where it does not import): the wrappers'
``plan`` and ``fast_decode_plan`` check FlashInfer's contract and keep the arrays vLLM
computed (``_compute_flashinfer_kv_metadata``: ``paged_kv_indptr``,
``paged_kv_indices``, ``paged_kv_last_page_len``; ``qo_indptr``); nothing vLLM computes
is stood in for. The model's attention is 1 KV head of 128, bf16.

Every array a FlashInfer kernel reads is reported (``fi.*``), the decode wrapper's
rows followed by the prefill wrapper's, as the step's requests: ``paged_kv_indptr``
(a graph wrapper's persistent buffer, its padding rows included), each row's pages of
``paged_kv_indices``, ``paged_kv_last_page_len``, each row's query length as the
wrapper plans it, and whether the row is planned as a decode (``num_decodes`` rows
first, then ``num_prefills``); beside ``vllm-v1``'s fields of the step, and ``kv_len``
/ ``kv_slots`` by request (:meth:`_FlashInferEngine.kv_read`), which
``vllm-v1-backends`` can hold to ``vllm-v1``'s.

Declined: ``vllm-v1``'s cases, the block sizes the backend has no kernel block size for
(``FlashInferBackend.get_supported_kernel_block_sizes``: 16, 32 and 64 off the
trtllm-gen path; ``supports_block_size`` takes a multiple of one, split into kernel
blocks).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import flashinfer_stand_in as stand_in
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_FI = "vllm/v1/attention/backends/flashinfer.py"
HEAD_SIZE = 128
"""The model's head size: one FlashInfer runs (``get_supported_head_sizes``)."""
CAPABILITY = (8, 0)
"""The GPU the engine runs as: Ampere, sm80."""


def prepare() -> None:
    """Import vLLM's V1 runner and the FlashInfer backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    with stand_in.installed():
        from vllm.v1.attention.backends.flashinfer import FlashInferBackend
    return FlashInferBackend


@contextlib.contextmanager
def ampere() -> Iterator[None]:
    """``flashinfer.py`` and ``vllm/utils/flashinfer.py`` as on an sm80 GPU (module
    docstring)."""
    _backend()
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.utils import flashinfer as fi_utils
    from vllm.v1.attention.backends import flashinfer

    def capability(cls: type, device_id: int = 0) -> DeviceCapability:
        return DeviceCapability(*CAPABILITY)

    # The platform's capability queries (has_/is_device_capability, ..._family) all ask it.
    sm80 = type(
        "Sm80Platform",
        (type(current_platform),),
        {"get_device_capability": classmethod(capability)},
    )()
    with (
        mock.patch.object(flashinfer, "current_platform", sm80),
        mock.patch.object(fi_utils, "current_platform", sm80),
        mock.patch.object(fi_utils, "has_nvidia_artifactory", lambda: True),
        mock.patch.dict(os.environ, {"VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": WORKSPACE_BYTES}),
    ):
        yield


WORKSPACE_BYTES = str(1 << 20)
"""The FlashInfer workspace each builder allocates (``_get_workspace_buffer``): the
kernels' scratch memory, which only the stand-in wrappers hold and no metadata reads.
vLLM's default of 394 MiB, zero-filled on the CPU for each builder of each engine (a
fresh one every step, freed only when the garbage collector breaks its cycles), ran a
search's process out of memory."""


def declines(case: Case, warm_up: bool = True) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s runner cases, block sizes
    the FlashInfer backend has no kernel block size for, and (``warm_up``) engines whose
    start-up warm-up overruns the builder's page indices (:func:`warm_up_past_page_indices`)."""
    return declines_config(case.config, warm_up) or v1.step_declines(case)


def declines_but_warm_up(case: Case) -> str | None:
    """:func:`declines` but for the warm-up's page indices:
    ``vllm-v1-flashinfer-warmup-page-indices``, the finding kept apart, judges those."""
    return declines(case, warm_up=False)


def declines_config(config: EngineConfig, warm_up: bool = True) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    with ampere():
        supported = _backend().supports_block_size(config.block_size)
    if config.runner == "v1" and not config.varlen_decode and not supported:
        return (
            f"block_size {config.block_size}: the FlashInfer backend's kernel block "
            f"sizes are 16, 32 and 64 off the trtllm-gen path, the block size a multiple "
            f"of one ({_FI} FlashInferBackend.get_supported_kernel_block_sizes)"
        )
    past = warm_up_past_page_indices(config) if warm_up else None
    if config.runner == "v1" and past is not None:
        return past
    return v1.declines_config(config)


def warm_up_pages(config: EngineConfig) -> tuple[int, int]:
    """The pages the start-up's FlashInfer attention warm-up hands the builder, and the
    entries of the builder's page-index buffer. The warm-up
    (``model_executor/warmup/attention_warmup.py`` ``mixed_batch_attention_warmup``)
    runs ``_dummy_run(num_tokens, create_mixed_batch=True)`` of ``min(16,
    max_num_batched_tokens, max_model_len)`` tokens: ``min(max_num_seqs - 1, num_tokens
    // 2)`` one-token decodes of one key each, then one prefill of the rest with one key
    more than its tokens (``gpu_model_runner.py`` ``_dummy_run``'s mixed ``seq_lens``).
    ``FlashInferMetadataBuilder.__init__`` sizes ``paged_kv_indices`` by ``max_num_seqs *
    cdiv(max_model_len, page_size)``."""
    num_tokens = min(16, config.max_num_batched_tokens, config.max_model_len)
    num_decodes = min(config.max_num_seqs - 1, num_tokens // 2)
    prefill_keys = num_tokens - num_decodes + 1
    pages = num_decodes + -(-prefill_keys // config.block_size)
    return pages, config.max_num_seqs * -(-config.max_model_len // config.block_size)


def warm_up_past_page_indices(config: EngineConfig) -> str | None:
    """Where the warm-up's pages (:func:`warm_up_pages`) outnumber the builder's
    page-index buffer: ``_compute_flashinfer_kv_metadata`` slices the buffer to the pages
    (a shorter view) and its ``_copy_page_indices_kernel`` stores every page id from the
    buffer's start, past its end; FlashInfer's plan is handed an indptr reaching past
    the indices it is given (the stand-in's plan refuses it). Reachable with one
    request at a time and a model of 16 tokens or fewer in whole pages; kept apart as
    ``vllm-v1-flashinfer-warmup-page-indices`` (docs/findings.md)."""
    pages, entries = warm_up_pages(config)
    if pages <= entries:
        return None
    return (
        f"the start-up's FlashInfer warm-up hands the builder {pages} pages, past its "
        f"page-index buffer of {entries} (model_executor/warmup/attention_warmup.py "
        f"mixed_batch_attention_warmup; flashinfer.py FlashInferMetadataBuilder "
        f"paged_kv_indices): kept apart as vllm-v1-flashinfer-warmup-page-indices"
    )


def trigger_warm_up_page_indices(trace: Trace) -> bool:
    """An engine whose warm-up pages outnumber the builder's page-index buffer."""
    return reach_warm_up(trace) and warm_up_past_page_indices(trace.config) is not None


def reach_warm_up(trace: Trace) -> bool:
    """The V1 worker warms FlashInfer's attention up when every attention group is
    FlashInfer's (``kernel_warmup``), as on this engine."""
    return trace.config.runner == "v1"


def smallest_warm_up_page_indices() -> Trace:
    """The one engine of the warm-up's overrun FlashInfer's page sizes allow: a model of
    16 tokens in one page of 16, one request at a time; the warm-up's prefill of 16
    tokens has 17 keys, 2 pages, for a buffer of 1. Its first step, a decode padded to
    the FULL graph, is never reached."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(1,), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v1",
    )  # fmt: skip
    step = Batch((0,), (3,), req_ids=(7,), pages=((1,),), new_pages=(1,))
    return Trace(config, (step,))


# -- the engine -----------------------------------------------------------------------------


def _layer(vllm_config: Any) -> Any:
    """An attention layer of the model (the target's, or the MTP draft layer of
    :mod:`.runner_step_drafter`), its backend FlashInfer: the builder reads each layer's
    hyperparameters off its ``FlashInferImpl`` (``get_per_layer_parameters``): no
    sliding window, no soft cap, no sinks, the scale of a head of ``HEAD_SIZE``."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backends.flashinfer import FlashInferImpl

    impl = FlashInferImpl.__new__(FlashInferImpl)  # its kernels' state: none runs here
    impl.num_heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)
    impl.scale = HEAD_SIZE**-0.5
    impl.sliding_window = None
    impl.logits_soft_cap = None
    impl.sinks = None

    class Layer(AttentionLayerBase):
        num_heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)

        def get_attn_backend(self) -> type:
            return _backend()

        def get_kv_cache_spec(self, vllm_config: Any) -> None:
            return None  # the engine's KV-cache group holds the layer

    layer = Layer()
    layer.impl = impl
    return layer


def _wrapper_arrays(wrapper: Any, decode: bool) -> SimpleNamespace:
    """What a wrapper's kernels read now: its buffers (a graph wrapper's persistent
    ones, its padding rows included; an eager wrapper's planned arrays), and each row's
    query length as planned."""
    indptr = wrapper._paged_kv_indptr_buf.detach().clone()
    last = wrapper._paged_kv_last_page_len_buf.detach().clone()
    rows = len(last)
    if decode:
        q_len = int(wrapper.plans[-1].options.get("q_len_per_req", 1))
        q_lens = np.full(rows, q_len, dtype=np.int64)
    else:
        q_lens = np.diff(v1._np(wrapper._qo_indptr_buf).astype(np.int64))
    return SimpleNamespace(
        indptr=indptr,
        indices=wrapper._paged_kv_indices_buf.detach().clone(),
        last_page_len=last,
        q_lens=q_lens,
    )


def _freeze(meta: Any) -> SimpleNamespace:
    """What FlashInfer's kernels read of ``meta`` now (the persistent buffers change
    after the forward): the decode wrapper's rows, then the prefill wrapper's."""
    parts = []
    if meta.decode is not None:
        parts.append(_wrapper_arrays(meta.decode.wrapper, True))
    if meta.prefill is not None:
        parts.append(_wrapper_arrays(meta.prefill.wrapper, False))
    return SimpleNamespace(parts=parts, num_decodes=meta.num_decodes)


def _rows(meta: SimpleNamespace) -> SimpleNamespace:
    """The step's rows as the wrappers read them: indptr (absolute, into the indices
    buffer both wrappers share), last_page_len, query lengths, decode flag."""
    indptr = [np.zeros(1, dtype=np.int64)]
    last, q_lens, decode = [], [], []
    indices = np.zeros(0, dtype=np.int64)
    for i, part in enumerate(meta.parts):
        ptr = v1._np(part.indptr).astype(np.int64)
        indptr.append(ptr[1:])
        if i == 0:
            indptr[0] = ptr[:1]
        last.append(v1._np(part.last_page_len).astype(np.int64))
        q_lens.append(part.q_lens)
        decode.append(np.full(len(ptr) - 1, int(i == 0 and meta.num_decodes > 0)))
        if len(part.indices) > len(indices):
            indices = v1._np(part.indices).astype(np.int64)
    return SimpleNamespace(
        indptr=np.concatenate(indptr),
        last_page_len=np.concatenate(last) if last else np.zeros(0, dtype=np.int64),
        q_lens=np.concatenate(q_lens) if q_lens else np.zeros(0, dtype=np.int64),
        decode=np.concatenate(decode) if decode else np.zeros(0, dtype=np.int64),
        indices=indices,
    )


def _fi_fields(config: EngineConfig, seen: v1._Seen, page_size: int) -> list[Field]:
    """Every array FlashInfer's kernels read, with what they accept: the wrappers'
    ``run`` reads the paged cache by ``paged_kv_indptr`` / ``paged_kv_indices`` /
    ``paged_kv_last_page_len`` (``paged_kv_t``) and the query by ``qo_indptr``."""
    r = _rows(seen.meta)
    tokens_pad = int(seen.positions.shape[0])
    pages = np.diff(r.indptr)
    width = max([-(-config.max_model_len // page_size)] + [int(p) for p in pages])
    table = np.zeros((len(pages), width), dtype=np.int64)
    for i, p in enumerate(pages):
        table[i, :p] = r.indices[r.indptr[i] : r.indptr[i + 1]]
    return [
        # paged_kv_indptr: row i's pages are paged_kv_indices[indptr[i] : [i + 1]], within
        # the indices buffer the wrapper was handed.
        Field("fi.paged_kv_indptr", "offsets", r.indptr, (0, len(r.indices))),
        # paged_kv_indices: a page of the KV cache (KVCacheConfig.num_blocks).
        Field("fi.paged_kv_indices", "requests", table, (0, num_blocks(config) - 1),
              row_lengths=pages),
        # paged_kv_last_page_len: "1 <= kv_last_page_len <= page_size" for a row of
        # pages; a row of none reads no key of it (paged_kv_t::get_length).
        Field("fi.paged_kv_last_page_len", "requests", r.last_page_len, (0, page_size)),
        # The query rows each row's plan takes (decode: q_len_per_req; prefill:
        # qo_indptr's differences), within the step's padded tokens.
        Field("fi.query_len", "requests", r.q_lens, (0, tokens_pad)),
        # split_decodes_and_prefills: num_decodes rows on the decode wrapper first.
        Field("fi.decode", "requests", r.decode, (0, 1)),
    ]  # fmt: skip


class _FlashInferEngine(v1._Engine):
    """A V1 runner whose attention layer is on the FlashInfer backend, as on sm80."""

    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return ampere()  # FlashInfer as on sm80

    def attention_group(self) -> tuple[type, Any]:
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        layers = self.vllm_config.compilation_config.static_forward_context
        layers[v1._LAYER] = _layer(self.vllm_config)
        # The engine core's resolve_kv_cache_layout: the backend's preferred layout.
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

        layouts = _backend().supported_kv_cache_layouts()
        names = [[layout.name for layout in layouts]] if layouts else [["NHD"]]
        resolve_kv_cache_layout(self.vllm_config, names)
        if drafting.DRAFT_LAYER in layers:
            layers[drafting.DRAFT_LAYER] = _layer(self.vllm_config)
        spec = FullAttentionSpec(
            block_size=self.config.block_size, num_kv_heads=1, head_size=HEAD_SIZE,
            dtype=torch.bfloat16,
        )  # fmt: skip
        return _backend(), spec

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # FlashInferMetadataBuilder.get_cudagraph_support on sm80 (fa2 decode):
        # UNIFORM_BATCH, so _check_and_update_cudagraph_mode turns FULL into
        # FULL_AND_PIECEWISE (FULL graphs for uniform decodes, piecewise otherwise).
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        fi: list[Field] = []
        if seen.meta is not None:
            fi = _fi_fields(self.config, seen, self.kernel_block_size())
        return v1._fields(self.config, no_meta) + tuple(fi) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots as FlashInfer reads them
        (``paged_kv_t``): row ``i`` has ``(indptr[i + 1] - indptr[i] - 1) * page_size +
        last_page_len[i]`` keys (0 for a row of no pages), key ``j`` in page
        ``paged_kv_indices[indptr[i] + j // page_size]`` at ``j % page_size``."""
        r = _rows(seen.meta)
        bs = self.kernel_block_size()
        pages = np.diff(r.indptr)
        lengths = np.where(pages > 0, (pages - 1) * bs + r.last_page_len, 0).astype(np.int64)
        slots = [
            v1.page_slots(r.indices[r.indptr[i] : r.indptr[i + 1]], int(n), bs)
            for i, n in enumerate(lengths)
        ]
        return lengths, slots


class FlashInferRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the FlashInfer backend."""

    engine_type = _FlashInferEngine

    # The builder's reorder_batch_threshold (1, or 1 + num_spec: fa2 decodes speculative
    # queries) makes the runner reorder its batch, as MLA's and GDN's do: the fresh
    # engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = FlashInferRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashinfer`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashinfer`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: _compute_flashinfer_kv_metadata with one line dropped.


@contextlib.contextmanager
def _last_page_len_on_host() -> Iterator[None]:
    """``_compute_flashinfer_kv_metadata`` stages ``paged_kv_last_page_len`` on the host
    and never copies it to the device buffer: an eager wrapper is planned with the host
    array (right), a graph wrapper's kernels read the device buffer, which holds what
    its first plan (the capture's) copied."""
    _backend()  # vLLM's module imports flashinfer: the stand-in's, where it is not installed
    from vllm.v1.attention.backends.flashinfer import FlashInferMetadataBuilder

    original = FlashInferMetadataBuilder._compute_flashinfer_kv_metadata

    def compute(self: Any, *args: Any) -> torch.Tensor:
        with mock.patch.object(self.paged_kv_last_page_len, "copy_to_gpu", lambda *a: None):
            return original(self, *args)

    with mock.patch.object(FlashInferMetadataBuilder, "_compute_flashinfer_kv_metadata", compute):
        yield


_MUTANT = v1.Mutated(FlashInferRunnerStepEngine(), _last_page_len_on_host)


def last_page_len_on_host(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-flashinfer-last-page-len-on-host``: a FULL decode graph's wrapper reads
    the capture's last page lengths (replay equals eager, padding invariance)."""
    return _MUTANT(inputs)


last_page_len_on_host.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


def trigger_stale_last_page(trace: Trace | Case) -> bool:
    """An engine of FULL decode graphs (their wrappers read the device buffers)."""
    return hybrid.reach_full_graphs(trace)


def smallest_stale_last_page() -> Trace:
    """The FULL decode graph of 2 requests: one request prefills 3 tokens, then decodes
    its 4th, padded to the graph (the capture planned other lengths)."""
    return hybrid.smallest_full_decode()
