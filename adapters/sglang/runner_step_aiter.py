"""SGLang's decode graph runner step on the AITER backend (ROCm), as the implementation
``sglang-aiter`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows, decode graph runner and graph stand-in), on the engine started with
``--attention-backend aiter``: the MHA path (the engine's model is MHA, not MLA). What
runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/aiter_backend.py``: ``AiterAttnBackend``: ``__init__`` (its
  persistent ``kv_indptr``, ``qo_indptr``, ``mask_indptr``, its prefill updater);
  ``init_forward_metadata`` (eager: a decode, a target verify of ``topk`` 1 over
  SGLang's Triton extend kernel with a custom mask, an extend through
  ``AiterIndicesUpdaterPrefill.update_single_wrapper``); ``init_cuda_graph_state``;
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture
  batch size and, from ``load_batch``, the replay's (``_apply_cuda_graph_metadata``:
  the decode's and the verify's branches); ``get_cuda_graph_seq_len_fill_value``;
- the Triton kernel ``kernels/ops/attention/kv_indices.py:create_flashinfer_kv_indices_triton``
  (every ``kv_indices``), under Triton's interpreter;
- ``kernels/ops/attention/unified_attention_3d_mtp.py:reset_verify_attn_plan_cache``,
  which every metadata call makes first.

The GPU is an MI300X (gfx942): ``is_gfx95_supported`` is False (as SGLang finds it
without a HIP build), so no gfx950 path runs (no fp8 prefill, no paged asm prefill
view); no ``SGLANG_USE_AITER_UNIFIED_ATTN``, no sliding window, no SHUFFLE 5D KV
layout: the decode reads ``aiter.paged_attention_ragged``'s flat token table, the
verify SGLang's ``extend_attention_fwd``, the extend ``aiter.mha_batch_prefill_func``.
The backend's metadata is all written outside the graph (it has no
``init_forward_metadata_in_graph``): the graph stand-in is the Triton step's.

Stand-ins, besides the step's: the ``aiter`` package (:data:`AITER`), in ``sys.modules``
only while the engine is built or steps (:func:`aiter`), with the names
``aiter_backend.py`` binds in its ``try:`` block at import (where ``aiter`` is absent
it binds none, and every metadata call raises ``NameError`` on
``reset_verify_attn_plan_cache``) bound in its namespace for as long: SGLang's own
``unified_attention_3d_mtp`` (imported once, under the stand-in: it reads two of
aiter's names at import, ``make_kernel_repr`` and ``e4m3_dtype``), and aiter's kernels,
which refuse to run (the model's forward never runs). No metadata call of the MHA path
reaches ``aiter`` itself. The persistent MLA decode kernel's scheduler
(``get_mla_metadata_v1`` and its ``_info``) is :mod:`attnfuzz.adapters.aiter_schedule`'s
(an MLA engine's, :mod:`.runner_step_aiter_mla`); the fp8 MLA prefill's
(``get_ps_metadata_v1`` and its ``_info``, gfx950 only) refuses. The KV cache and queries
are bf16; the KV buffers are never read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``: the backend's ``forward_metadata`` after ``load_batch``, ``replay``: the
metadata the graph of that batch size captured, its views of the persistent buffers,
``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what the kernels read of ``ForwardMetadata``: ``kv_indices`` by
request (row ``i``: ``kv_indices[kv_indptr[i] : kv_indptr[i + 1]]``, token slots),
``kv_indptr`` as offsets; for a verify ``qo_indptr`` and ``mask_indptr`` as offsets and
``max_extend_len``; for an extend ``qo_indptr``, ``max_q_len`` and ``max_kv_len``. Each
with the range its consumer accepts (:meth:`AiterEngine.accepts`,
:meth:`AiterEngine.metadata_fields`). And ``kv_len`` and ``kv_slots``, what every
backend states alike (:meth:`AiterEngine.kv_read`).

Mutant (a re-created defect of the graph metadata):
``sglang-aiter-decode-indptr-off-buffer`` (the graph decode's ``kv_indptr`` written to
a new tensor in ``_apply_cuda_graph_metadata``, not to the persistent ``self.kv_indptr``
the graph captured a view of: each replay's ``forward_metadata`` is right, the graph
reads the capture's offsets; replay equals eager).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters import aiter_schedule
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step, replayed
from attnfuzz.adapters.sglang.runner_step_flashinfer import _patched
from attnfuzz.adapters.standins import in_sys_modules
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

DTYPE = torch.bfloat16
"""The KV cache's and the queries' dtype: one AITER's MHA kernels run (never read here)."""

PARTITION_SIZE = 256
"""``aiter_backend.py:_AITER_PARTITION_SIZE_ROCM``: the keys of one partition of
``paged_attention_ragged`` (``max_num_partitions`` of them a request)."""

MTP_MODULE = "sglang.kernels.ops.attention.unified_attention_3d_mtp"
"""SGLang's module whose names ``aiter_backend.py`` imports in its ``try:`` block."""

TRY_IMPORTS = {
    "aiter": (
        "flash_attn_varlen_fp8_pertensor_func",
        "flash_attn_varlen_func",
        "get_mla_metadata_info_v1",
        "get_mla_metadata_v1",
        "get_ps_metadata_info_v1",
        "get_ps_metadata_v1",
        "mha_batch_prefill_func",
        "mla_prefill_ps_asm_fwd",
        "mla_reduce_v1",
        "paged_attention_ragged",
    ),
    "aiter.mla": ("mla_decode_fwd", "mla_prefill_fwd"),
    "aiter.ops.triton.attention.unified_attention": ("unified_attention",),
    MTP_MODULE: (
        "asm_verify_attn_enabled",
        "reset_verify_attn_plan_cache",
        "unified_attention_3d_mtp_decode_func",
        "unified_attention_3d_mtp_func",
        "unified_attention_3d_mtp_ragged_func",
    ),
}
"""``aiter_backend.py``'s ``try:`` block at import: each module, the names it binds."""


def prepare() -> None:
    """Import SGLang's runner and AITER backend before a judge forks its child (outside
    :func:`aiter`: ``aiter_backend`` finds no ``aiter`` and binds none of its names)."""
    decode.prepare()
    from sglang.srt.layers.attention import aiter_backend  # noqa: F401


# -- AITER, as an MI300X (gfx942) has it --------------------------------------------------------


def _refused(name: str) -> Callable[..., Any]:
    """A kernel of aiter's: only a forward calls it, and no forward runs here."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is attnfuzz's stand-in; no forward runs here")

    kernel.__name__ = name.rsplit(".", 1)[-1]
    return kernel


def _gfx950_only(name: str) -> Callable[..., Any]:
    """The fp8 MLA prefill's scheduler: only a gfx950 GPU plans with it."""

    def scheduler(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name}: the fp8 MLA prefill's scheduler (gfx950 only)")

    scheduler.__name__ = name.rsplit(".", 1)[-1]
    return scheduler


def make_kernel_repr(
    base_name: str, config_keys: list[str], name_key: str | None = None
) -> Callable[[Any], str]:
    """``aiter/ops/triton/utils/_triton/kernel_repr.py:make_kernel_repr``: the name a
    compiled Triton kernel is given (its base name and its constexprs), which
    ``unified_attention_3d_mtp`` hands ``triton.jit(repr=...)`` at import; no metadata."""

    def _repr(specialization: Any) -> str:
        constants = specialization.constants
        name = str(constants.get(name_key) or base_name) if name_key else base_name
        parts = [f"{key}_{constants.get(key)}" for key in config_keys]
        return "_".join([name, *parts]) if parts else name

    return _repr


def _package(name: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]  # a package: its submodules import
    for attr, value in names.items():
        setattr(module, attr, value)
    return module


def _stand_in() -> dict[str, types.ModuleType]:
    """The ``aiter`` package as far as SGLang imports it here, by module name."""
    kernels = {n: _refused(f"aiter.{n}") for n in TRY_IMPORTS["aiter"]}
    for name in ("get_ps_metadata_info_v1", "get_ps_metadata_v1"):
        kernels[name] = _gfx950_only(f"aiter.{name}")
    kernels["get_mla_metadata_info_v1"] = aiter_schedule.get_mla_metadata_info_v1
    kernels["get_mla_metadata_v1"] = aiter_schedule.get_mla_metadata_v1
    unified = "aiter.ops.triton.attention.unified_attention"
    return {
        "aiter": _package("aiter", **kernels),
        "aiter.mla": _package(
            "aiter.mla", **{n: _refused(f"aiter.mla.{n}") for n in TRY_IMPORTS["aiter.mla"]}
        ),
        "aiter.ops": _package("aiter.ops"),
        "aiter.ops.triton": _package("aiter.ops.triton"),
        "aiter.ops.triton.attention": _package("aiter.ops.triton.attention"),
        unified: _package(unified, unified_attention=_refused(f"{unified}.unified_attention")),
        "aiter.ops.triton.utils": _package("aiter.ops.triton.utils"),
        "aiter.ops.triton.utils._triton": _package("aiter.ops.triton.utils._triton"),
        "aiter.ops.triton.utils._triton.kernel_repr": _package(
            "aiter.ops.triton.utils._triton.kernel_repr", make_kernel_repr=make_kernel_repr
        ),
        # aiter/ops/triton/utils/types.py:get_fp8_dtypes: gfx942 is no OCP-fp8 arch, its
        # fp8 the fnuz kinds.
        "aiter.ops.triton.utils.types": _package(
            "aiter.ops.triton.utils.types",
            e4m3_dtype=torch.float8_e4m3fnuz,
            e5m2_dtype=torch.float8_e5m2fnuz,
        ),
    }


AITER = _stand_in()
"""The stand-in ``aiter`` package and its submodules (module docstring)."""


@functools.cache
def _bound_names() -> dict[str, Any]:
    """What ``aiter_backend.py``'s ``try:`` block binds where ``aiter`` imports: aiter's
    names from :data:`AITER`, SGLang's from ``unified_attention_3d_mtp``, imported once
    under it (it reads aiter's names at import only) and kept here alone."""
    package, _, leaf = MTP_MODULE.rpartition(".")
    imported = MTP_MODULE in sys.modules
    with in_sys_modules(AITER):
        mtp = importlib.import_module(MTP_MODULE)
    if not imported:  # where aiter is absent it does not import: it stays so outside
        sys.modules.pop(MTP_MODULE, None)
        vars(sys.modules[package]).pop(leaf, None)
    modules = {**AITER, MTP_MODULE: mtp}
    return {n: getattr(modules[m], n) for m, names in TRY_IMPORTS.items() for n in names}


@contextlib.contextmanager
def aiter() -> Iterator[None]:
    """While the engine is built or steps: ``aiter`` importable (:data:`AITER`), and the
    names ``aiter_backend``'s ``try:`` block binds from it bound there; both undone
    after. Where its ``try:`` block bound them (the vendor's ``aiter`` imported), none."""
    from sglang.srt.layers.attention import aiter_backend

    if hasattr(aiter_backend, "reset_verify_attn_plan_cache"):  # aiter imported: a ROCm GPU
        yield
        return
    names = _bound_names()
    with in_sys_modules(AITER), mock.patch.multiple(aiter_backend, create=True, **names):
        yield


# -- the engine ---------------------------------------------------------------------------------


def _mode_of(metadata: Any) -> str:
    """What ``ForwardMetadata`` ``metadata`` was built for: a verify's holds its custom
    mask (``extend_attention_fwd``'s), an extend's its query offsets alone, a decode's
    neither (``paged_attention_ragged`` takes no query offsets)."""
    if metadata.custom_mask is not None:
        return "verify"
    return "decode" if metadata.qo_indptr is None else "extend"


class AiterEngine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is AITER (MHA)."""

    ATTENTION_BACKEND = "aiter"
    WHERE = {
        "eager": "aiter_backend.py:AiterAttnBackend.init_forward_metadata",
        "fresh": "aiter_backend.py:AiterAttnBackend.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "AiterAttnBackend._apply_cuda_graph_metadata's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: AiterAttnBackend._apply_cuda_graph_metadata's at capture, its "
        "views of kv_indptr, cuda_graph_kv_indices, qo_indptr, mask_indptr)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(AiterAttnBackend.init_forward_metadata_out_graph, in_capture)",
    }

    def make_backend(self) -> Any:
        """``AiterAttnBackend(model_runner)``, on what the backend reads of the model
        runner besides the Triton backend's."""
        from sglang.srt.layers.attention.aiter_backend import AiterAttnBackend

        runner, pool = self.runner, self.runner.token_to_kv_pool
        runner.kv_cache_dtype = DTYPE
        runner.dtype = DTYPE
        runner.model_config.dtype = DTYPE
        runner.model_config.is_multimodal = False
        runner.decode_attention_backend_str = "aiter"
        runner.prefill_attention_backend_str = "aiter"
        # _resolve_swa_kv_pool asks the allocator for its KV cache (not a sliding-window one).
        allocator = _engine.StandIn(get_kvcache=lambda: pool)
        with self.stepping(), _patched(runner, "token_to_kv_pool_allocator", allocator):
            return AiterAttnBackend(runner)

    def stepping(self) -> contextlib.AbstractContextManager[None]:
        """What the engine is built, captured and stepped under: ``aiter`` stood in."""
        return aiter()

    def _graph_runner(self) -> Any:
        with self.stepping():
            return super()._graph_runner()

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with self.stepping():
            return super().eager(inputs, mode, how=how)

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay preparation left as its metadata."""
        return self.backend.forward_metadata

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`), and AITER's."""
        acc = decode._Engine.accepts(self)
        width = self.runner.req_to_token_pool.req_to_token.shape[1]
        # The padding fill is no bound here (get_cuda_graph_seq_len_fill_value: a verify
        # engine's is num_draft_tokens, a verify's seq_lens its committed prefix):
        # create_flashinfer_kv_indices_triton reads req_to_token[req_pool_indices[i],
        # :seq_lens[i]] (the table's width), and paged_attention_ragged (a decode: kv_indptr
        # = cumsum(seq_lens)) takes seq_lens[i] keys, its reduce kernel
        # (paged_attention_ll4mi_reduce_kernel) reading partition cdiv(context_len, 256) - 1
        # of max_num_partitions: at least one key, at most max_num_partitions partitions.
        partitions = self.backend.max_num_partitions * PARTITION_SIZE
        acc["seq_lens"] = (1, min(width, partitions))
        # paged_attention_ragged reads k_cache.view(-1, 1, H, D)[kv_page_indices[...]],
        # mha_batch_prefill_func the 3-D k_cache (page size 1) and extend_attention_fwd
        # k_buffer[kv_indices]: the layer's KV buffer, size + page_size rows, as Triton's.
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the kernels read of ``ForwardMetadata`` ``metadata`` for ``rows`` requests
        and ``tokens`` tokens (padding included), copied now."""
        mode = _mode_of(metadata)
        # kv_indptr / kv_indices: paged_attention_ragged (a decode: kv_page_indices +
        # kv_indptr[seq], context_len = kv_indptr[seq + 1] - kv_indptr[seq] at page size 1),
        # extend_attention_fwd (a verify's prefix: kv_indices[kv_indptr[i] + j]) and
        # mha_batch_prefill_func (an extend) read row i as the Triton kernels do: the
        # Triton step's fields and ranges; a verify's and an extend's query offsets too.
        qo = metadata.qo_indptr if mode != "decode" else None
        view = _engine.StandIn(
            kv_indptr=metadata.kv_indptr, kv_indices=metadata.kv_indices, qo_indptr=qo
        )
        out = list(super().metadata_fields(rows, tokens, view))
        if mode == "verify":
            # extend_attention_fwd reads request i's mask at custom_mask[mask_indptr[i] +
            # r * (prefix + extend) + c] for its extend rows r and columns c: offsets into
            # the mask it is handed (the spec's, or the graph's cuda_graph_custom_mask).
            mask = decode.host(metadata.mask_indptr[: rows + 1])
            out.append(Field("mask_indptr", "offsets", mask, (0, metadata.custom_mask.numel())))
        if mode != "decode":
            # The kernel's grid covers max_len_extend (extend_attention_fwd) /
            # max_seqlen_q (mha_batch_prefill_func's tiles) query rows of each request:
            # a request's query is at most the forward's tokens.
            name = "max_extend_len" if mode == "verify" else "max_q_len"
            q = int(metadata.max_extend_len if mode == "verify" else metadata.max_q_len)
            out.append(Field(name, "requests", np.full(rows, q), (1, tokens)))
        if mode == "extend":
            # mha_batch_prefill (the CK batch prefill) reads max_seqlen_k only to clamp a
            # sliding window (mask_info::decode); no range binds it but its agreement.
            out.append(Field("max_kv_len", "requests", np.full(rows, int(metadata.max_kv_len))))
        return tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as AITER's kernels read them: a
        decode's (``paged_attention_ragged``) and an extend's (``mha_batch_prefill_func``,
        after ``set_kv_buffer`` wrote the step's keys) the ``kv_indices[kv_indptr[i] :
        kv_indptr[i + 1]]`` of row ``i``, all from the cache; a verify's
        (``extend_attention_fwd``) those (the committed prefix), then the step's own keys
        from ``k``, its tokens ``qo_indptr[i] : qo_indptr[i + 1]``."""
        cached = np.diff(values["kv_indptr"])
        slots = [values["kv_indices"][r, : max(n, 0)] for r, n in enumerate(cached)]
        if _mode_of(metadata) != "verify":
            return cached, slots
        return decode.with_step_keys(cached, slots, values["qo_indptr"], values["out_cache_loc"])


class AiterLife(decode.EngineLife):
    """The engine of ``sglang-aiter``: :class:`AiterEngine`, kept across a life's steps;
    its graph's replay prepared with ``aiter`` stood in."""

    engine_class: type[AiterEngine] = AiterEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> AiterEngine:
        return self.engine_class(config, device, graphs=graphs)

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with engine.stepping():
            return super().graph_builds(engine, inputs, mode)


ENGINE = AiterLife()
"""The engine of the implementation ``sglang-aiter`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-aiter`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the AITER backend's graph metadata, re-created -------------------------


class _DecodeIndptrOffBuffer(AiterEngine):
    """The graph decode's ``kv_indptr`` written to a new tensor in
    ``_apply_cuda_graph_metadata`` (``kv_indptr = self.kv_indptr.clone()``), not to the
    persistent buffer: the capture's metadata holds a view of the capture's tensor, which
    no replay writes again, while each replay's ``forward_metadata`` holds its own."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        apply = backend._apply_cuda_graph_metadata

        def off_buffer(*args: Any, **kwargs: Any) -> Any:
            mode = kwargs.get("forward_mode", args[4] if len(args) > 4 else None)
            if not mode.is_decode_or_idle():
                return apply(*args, **kwargs)
            persistent = backend.kv_indptr
            backend.kv_indptr = persistent.clone()
            try:
                return apply(*args, **kwargs)
            finally:
                backend.kv_indptr = persistent

        backend._apply_cuda_graph_metadata = off_buffer
        return backend


class _MutantLife(AiterLife):
    def __init__(self, engine: type[AiterEngine]) -> None:
        self.engine_class = engine
        super().__init__()


DECODE_INDPTR_OFF_BUFFER = _MutantLife(_DecodeIndptrOffBuffer)


def run_decode_indptr_off_buffer(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-aiter-decode-indptr-off-buffer``: :class:`_DecodeIndptrOffBuffer`."""
    return DECODE_INDPTR_OFF_BUFFER(inputs)


run_decode_indptr_off_buffer.new_engine = DECODE_INDPTR_OFF_BUFFER.new_engine  # type: ignore[attr-defined]


def reach_decode_replay(trace: Trace) -> bool:
    """A decode (no drafts) the decode graph replays: every such replay's requests hold
    at least 2 keys (a prefilled token and the step's), past the capture's fill length 1
    (the offsets the graph keeps)."""
    return trace.config.num_spec == 0 and bool(replayed(trace))


def smallest_decode_indptr_off_buffer() -> Trace:
    """One request of one token, then its decode in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 1)
