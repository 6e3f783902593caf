"""vLLM's model runner V1 step of an MLA model on ROCm's AITER MLA backend, as the
implementation ``vllm-v1-aiter-mla`` of ``runner-step``.

The engine of :mod:`.runner_step_mla`, its MLA layer (and the MTP draft layer) on vLLM's
``ROCM_AITER_MLA`` backend (``vllm/v1/attention/backends/mla/rocm_aiter_mla.py``) as an
MI300X (gfx942) runs it: ``AiterMLAMetadataBuilder`` builds every step (eager, padded
for the graph, replayed, afresh, the drafter's sub-steps) and
``build_for_cudagraph_capture`` the capture runs. The prefills are
``MLACommonMetadataBuilder``'s (``vllm-v1-mla`` drives them on Triton MLA); what this
builder adds is its own decode metadata (``_build_decode``), as the AITER decode kernel
reads it through a flat view of the latent cache, one token a page:

- the kernel's ``seq_lens``: the decodes' own, except that in a padded uniform
  multi-token decode (a FULL graph's verify, ``_uniform_padded_mtp_qo_len``) a padding
  request (query length 0) is given ``max_qo_len`` keys, so the kernel's uniform query
  blocks each have keys to attend;
- ``paged_kv_indptr``, their running sum, and ``paged_kv_indices``, each key's flat
  slot, expanded from the block table by vLLM's Triton kernel
  ``_expand_page_indices_kernel`` into a buffer the builder owns (``fill_(-1)`` first in
  an engine of FULL graphs); ``qo_indptr``, the decodes' query offsets (uniform ones for
  a padded verify); with FULL graphs all three copied into persistent buffers whose
  tails repeat the last offset;
- the decode schedule, asked of AITER (``get_mla_metadata_v1``) from ``qo_indptr`` and
  ``paged_kv_indptr`` into work buffers made at ``__init__`` (their sizes asked of
  ``get_mla_metadata_info_v1``), which ``mla_decode_fwd`` reads beside them.

Stood in, as a gfx942 GPU with AITER has them (nothing of the builder's own code):

- the GPU's architecture: ``vllm.platforms.rocm`` reads it once at import
  (``_get_gcn_arch``: ``amdsmi``, else ``torch.cuda.get_device_properties``), here
  ``gfx942``; the platform vLLM runs on stays the CPU's;
- the ``aiter`` package (:data:`AITER`, in ``sys.modules`` while the engine builds and
  steps):
  ``aiter.dtypes`` (``fp8`` is gfx942's ``float8_e4m3fnuz``), ``get_mla_metadata_info_v1``
  (AITER's ``mla.py``: it refuses a query head count not a multiple of 8; the buffers'
  sizes are the vendor's, here one entry each, no kernel of this engine reading them)
  and ``get_mla_metadata_v1``, whose work buffers hold a schedule only AITER's kernel
  reads: the stand-in keeps, on the work buffer, the query and key offsets it scheduled,
  which is what attnfuzz judges of it (both from :mod:`attnfuzz.adapters.aiter_schedule`,
  which SGLang's AITER MLA engine shares).

Fields: ``vllm-v1-mla``'s (the prefills' ``mla.prefill.*``, ``mla.decode.seq_lens``
the kernel's, ``mla.decode.block_table``; the forward context's slot mapping, the
positions), and of the AITER decode (``aiter_mla.*``), with the range its consumer
accepts (``AiterMLAImpl.forward_mqa`` -> ``rocm_aiter_ops.mla_decode_fwd``):
``qo_indptr`` (the decode query rows ``q[: num_decode_tokens]``), ``paged_kv_indptr``,
``paged_kv_indices`` by request (row ``i``: the entries ``paged_kv_indptr[i]`` to
``paged_kv_indptr[i + 1]``, slots of the latent cache), ``paged_kv_last_page_len`` (1:
one token a page) and ``schedule_stale``: how many offsets differ between those the
kernel is handed and those its schedule was made for, over the batch entries the
schedule covers (:func:`schedule_stale`; 0 the only value it accepts).
``kv_len`` and ``kv_slots`` by request are read as the kernels read them (the decodes'
from ``paged_kv_indices``), held to Triton's by ``vllm-v1-backends``.

Declined: ``vllm-v1``'s cases but the block size (``AiterMLABackend.
get_supported_kernel_block_sizes``: any, ``MultipleOf(1)``).

Not driven: adaptive varlen verify (``enable_adaptive_verification``), decode context
parallelism and its verify routes, the fp8 prefill (gfx950 only), the Gluon decode
(gfx950 only).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.aiter_schedule import (
    get_mla_metadata_info_v1,
    get_mla_metadata_v1,
    schedule_stale,
    scheduled,
)
from attnfuzz.adapters.standins import in_sys_modules
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_AITER_MLA = "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
GCN_ARCH = "gfx942:sramecc+:xnack-"
"""An MI300X's architecture, as ``torch.cuda.get_device_properties`` names it on ROCm."""


# -- AITER, as a gfx942 GPU has it ----------------------------------------------------------


AITER = types.ModuleType("aiter")
"""The ``aiter`` package the builder imports (module docstring)."""
AITER.dtypes = SimpleNamespace(  # type: ignore[attr-defined]
    fp8=torch.float8_e4m3fnuz, fp16=torch.float16, bf16=torch.bfloat16,
    d_dtypes={"fp8": torch.float8_e4m3fnuz, "fp16": torch.float16, "bf16": torch.bfloat16},
)  # fmt: skip
AITER.get_mla_metadata_info_v1 = get_mla_metadata_info_v1  # type: ignore[attr-defined]
AITER.get_mla_metadata_v1 = get_mla_metadata_v1  # type: ignore[attr-defined]


@contextlib.contextmanager
def aiter() -> Iterator[None]:
    """AITER importable as the builder imports it (``from aiter import ...``)."""
    with in_sys_modules({"aiter": AITER}):
        yield


def _rocm_platform() -> None:
    """Import ``vllm.platforms.rocm`` as on a gfx942 GPU (its architecture read once)."""
    if "vllm.platforms.rocm" in sys.modules:
        return
    arch = SimpleNamespace(gcnArchName=GCN_ARCH)
    with mock.patch.object(torch.cuda, "get_device_properties", lambda *_: arch):
        import vllm.platforms.rocm  # noqa: F401


def prepare() -> None:
    """Import vLLM's V1 runner, the ROCm platform and the AITER MLA backend before a
    judge forks (outside :func:`aiter`: vLLM asks ``find_spec("aiter")`` at import)."""
    mla.prepare()
    _rocm_platform()
    _backend()


@functools.cache
def _backend() -> type:
    _rocm_platform()
    from vllm.v1.attention.backends.mla.rocm_aiter_mla import AiterMLABackend

    return AiterMLABackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: its config's, then ``vllm-v1``'s step."""
    return declines_config(case.config) or v1.step_declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read): the V1
    runner's, any block size (``AiterMLABackend.get_supported_kernel_block_sizes``)."""
    if config.runner != "v1" or config.varlen_decode:
        return v1.declines_config(config)
    return None


# -- the engine -----------------------------------------------------------------------------


def _scheduled(meta: Any) -> SimpleNamespace | None:
    """What the decode schedule the kernel reads was made for (None: no schedule)."""
    return scheduled(getattr(meta, "work_meta_data", None))


def _freeze(meta: Any) -> SimpleNamespace:
    """``vllm-v1-mla``'s view of ``meta``, and the AITER decode tensors as the kernel
    reads them now; how far their offsets are from those their schedule was made for."""
    out = mla._freeze(meta)
    d = meta.decode
    out.aiter = None
    if d is None:
        return out
    indptr = d.paged_kv_indptr.clone()
    total = int(indptr[-1]) if indptr.numel() else 0
    out.aiter = SimpleNamespace(
        qo_indptr=d.qo_indptr.clone(), paged_kv_indptr=indptr,
        paged_kv_indices=None if d.paged_kv_indices is None else d.paged_kv_indices[:total].clone(),
        capacity=0 if d.paged_kv_indices is None else int(d.paged_kv_indices.shape[0]),
        last_page_len=d.paged_kv_last_page_len.clone(), max_qo_len=int(d.max_qo_len),
        schedule_stale=None,
    )  # fmt: skip
    plan = _scheduled(meta) if d.has_persistent_metadata else None
    if plan is not None:
        stale = schedule_stale(d.qo_indptr, d.paged_kv_indptr, plan)
        out.aiter.schedule_stale = stale + int(plan.max_seqlen_qo != d.max_qo_len)
    return out


def _by_request(flat: np.ndarray, indptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Request ``i``'s entries ``flat[indptr[i] : indptr[i + 1]]``, as rows padded with 0,
    and each row's length."""
    lengths = np.diff(indptr).astype(np.int64)
    width = max(int(lengths.max()) if len(lengths) else 0, 1)
    rows = np.zeros((len(lengths), width), dtype=np.int64)
    for i, n in enumerate(lengths.tolist()):
        if n > 0:
            rows[i, :n] = flat[indptr[i] : indptr[i] + n]
    return rows, lengths


def _aiter_fields(config: EngineConfig, seen: v1._Seen) -> list[Field]:
    """The AITER decode's tensors, with what ``mla_decode_fwd`` accepts of them
    (``AiterMLAImpl.forward_mqa``: the first ``num_decode_tokens`` query rows, the
    latent cache viewed a token a page)."""
    m = seen.meta
    a = m.aiter
    if a is None:
        return []
    slots = (0, num_blocks(config) * config.block_size - 1)
    indptr = v1._np(a.paged_kv_indptr).astype(np.int64)
    out = [
        # Decode request i's query rows q[qo_indptr[i] : qo_indptr[i + 1]].
        Field("aiter_mla.qo_indptr", "offsets", v1._np(a.qo_indptr), (0, m.num_decode_tokens)),
        # Its keys: paged_kv_indices[paged_kv_indptr[i] : paged_kv_indptr[i + 1]].
        Field("aiter_mla.paged_kv_indptr", "offsets", indptr, (0, a.capacity)),
        # One token a page: the last page of every request holds 1.
        Field("aiter_mla.paged_kv_last_page_len", "requests", v1._np(a.last_page_len), (1, 1)),
    ]
    if a.paged_kv_indices is not None:
        rows, lengths = _by_request(v1._np(a.paged_kv_indices).astype(np.int64), indptr)
        # Each key's slot of the latent cache (the flat view: one slot a page).
        out.append(Field("aiter_mla.paged_kv_indices", "requests", rows, slots,
                         row_lengths=lengths))  # fmt: skip
    if a.schedule_stale is not None:
        # mla_decode_fwd reads the work buffers beside the offsets: a schedule made for
        # other offsets splits the wrong keys.
        stale = np.full(len(indptr) - 1, a.schedule_stale, dtype=np.int64)
        out.append(Field("aiter_mla.schedule_stale", "requests", stale, (0, 0)))
    return out


class _AiterMLAEngine(mla._MLAEngine):
    """A V1 runner of an MLA model on the AITER MLA backend."""

    backend = staticmethod(_backend)
    freeze = staticmethod(_freeze)

    def __init__(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        _rocm_platform()
        super().__init__(config, device, mode)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return aiter()  # the aiter package

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        return out if seen.meta is None else (*out, *_aiter_fields(self.config, seen))

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their latent-cache slots as the kernels read them,
        decodes first: a decode's ``paged_kv_indices[paged_kv_indptr[i] :
        paged_kv_indptr[i + 1]]`` (``mla_decode_fwd`` on the flat view of the cache, a
        token a page); a prefill's as ``vllm-v1-mla``'s (``MLACommonImpl``'s prefill)."""
        m = seen.meta
        lengths, slots = mla._MLAEngine.kv_read(self, seen)
        a = m.aiter
        if a is None or a.paged_kv_indices is None:
            return lengths, slots
        rows, counts = _by_request(
            v1._np(a.paged_kv_indices).astype(np.int64),
            v1._np(a.paged_kv_indptr).astype(np.int64),
        )
        decodes = len(counts)
        lengths = np.concatenate([counts, lengths[decodes:]]).astype(np.int64)
        slots = [rows[i, : counts[i]] for i in range(decodes)] + slots[decodes:]
        return lengths, slots


class AiterMLARunnerStepEngine(mla.MLARunnerStepEngine):
    """``vllm-v1``'s three engines, of an MLA model on AITER MLA."""

    engine_type = _AiterMLAEngine


ENGINE = AiterMLARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-aiter-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-aiter-mla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutants: AiterMLAMetadataBuilder._build_decode with one thing changed ------------------


@contextlib.contextmanager
def _offsets_not_persistent() -> Iterator[None]:
    """``_build_decode`` hands the kernel the offsets and key indices it just made, not
    their copies in the builder's graph buffers (the ``has_full_cudagraphs`` blocks
    dropped): a FULL graph holds the capture's, and its replay reads them against the
    step's schedule and lengths."""
    from vllm.v1.attention.backends.mla.rocm_aiter_mla import AiterMLAMetadataBuilder

    original = AiterMLAMetadataBuilder._build_decode

    def build_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        mode = self.compilation_config.cudagraph_mode
        with mock.patch.object(type(mode), "has_full_cudagraphs", lambda _: False):
            return original(self, *args, **kwargs)

    with mock.patch.object(AiterMLAMetadataBuilder, "_build_decode", build_decode):
        yield


@contextlib.contextmanager
def _schedule_kept_per_shape() -> Iterator[None]:
    """``_build_decode`` asks AITER for a new schedule only when the decodes' shape (their
    count, the query length) changes, as a builder caching it by shape would: a decode
    whose keys grew reads the schedule of the lengths before."""
    from vllm.v1.attention.backends.mla.rocm_aiter_mla import AiterMLAMetadataBuilder

    original = AiterMLAMetadataBuilder._build_decode

    def build_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        def schedule(qo_indptr: torch.Tensor, *rest: Any, **kw: Any) -> None:
            shape = (int(qo_indptr.shape[0]), kw.get("max_seqlen_qo"))
            if getattr(self, "_attnfuzz_shape", None) != shape:
                self._attnfuzz_shape = shape
                get_mla_metadata_v1(qo_indptr, *rest, **kw)

        with mock.patch.object(AITER, "get_mla_metadata_v1", schedule):
            return original(self, *args, **kwargs)

    with mock.patch.object(AiterMLAMetadataBuilder, "_build_decode", build_decode):
        yield


_NOT_PERSISTENT = v1.Mutated(AiterMLARunnerStepEngine(), _offsets_not_persistent)
_KEPT_PER_SHAPE = v1.Mutated(AiterMLARunnerStepEngine(), _schedule_kept_per_shape)


def offsets_not_persistent(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-aiter-mla-offsets-not-persistent``: a FULL graph's replay reads the
    capture's decode offsets and key indices (replay equals eager, the schedule)."""
    return _NOT_PERSISTENT(inputs)


offsets_not_persistent.new_engine = _NOT_PERSISTENT.engine.new_engine  # type: ignore[attr-defined]


def schedule_kept_per_shape(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-aiter-mla-schedule-kept-per-shape``: a decode reads a schedule made for
    the lengths of an earlier step of its shape (``aiter_mla.schedule_stale``)."""
    return _KEPT_PER_SHAPE(inputs)


schedule_kept_per_shape.new_engine = _KEPT_PER_SHAPE.engine.new_engine  # type: ignore[attr-defined]


def reach_full_graphs(trace: Trace | Case) -> bool:
    """A V1 engine with FULL graphs (AITER MLA runs any block size)."""
    c = trace.config
    return c.runner == "v1" and not c.varlen_decode and c.cudagraph_mode in hybrid._FULL_MODES


def trigger_full_decode(trace: Trace | Case) -> bool:
    """A step every request of which has ``next_n`` query tokens, within the largest
    capture size, on an engine of FULL graphs (any block size): the graph replays it,
    its padded build of a capture's shape with other lengths. A request new to the engine
    counts too (a fresh engine's warm-up runs the tokens it has computed first)."""
    c = trace.config
    largest = max(c.cudagraph_capture_sizes, default=0)
    return reach_full_graphs(trace) and any(
        all(q == c.next_n for q in b.q_lens) and sum(b.q_lens) <= largest
        for b in hybrid._batches(trace)
    )


smallest_full_decode = hybrid.smallest_full_decode
