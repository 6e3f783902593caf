"""SGLang's decode graph runner step on the AITER backend (ROCm) of an MLA model, as the
implementation ``sglang-aiter-mla`` of ``runner-step``.

``sglang-aiter``'s engine (:mod:`~attnfuzz.adapters.sglang.runner_step_aiter`: the same
step, ``aiter`` stood in, an MI300X), its model a DeepSeek MLA profile of 16 query heads
a rank (DeepSeek-V3's 128 over tensor-parallel 8) and a bf16 KV cache. For that shape
``AiterAttnBackend.__init__`` turns aiter's persistent MLA kernel off
(``_use_mla_ps_kernel``: 16 heads without zero padding, KV not fp8), so no metadata call
plans with aiter's MLA schedulers (``get_mla_metadata_v1``: the stand-in's refuse, as in
``sglang-aiter``). What runs besides ``sglang-aiter``'s, unchanged (SGLang 0.5.23):

- ``AiterAttnBackend.__init__``'s MLA set-up (``qo_indptr_``, the head padding mode, the
  persistent-kernel choice); ``init_forward_metadata``'s MLA branches: a decode (its
  ``qo_indptr`` from ``kv_last_page_len``), a target verify (``kv_indptr`` over the
  committed prefix and its drafts, ``qo_indptr`` of ``draft_num`` rows a request), an
  extend through ``AiterMlaIndicesUpdaterPrefill.update_single_wrapper``;
- ``init_cuda_graph_state``'s MLA buffers (``cuda_graph_kv_last_page_len``) and
  ``_apply_cuda_graph_metadata``'s MLA branches at capture and replay.

Fields: ``sglang-aiter``'s inputs, and what ``mla_decode_fwd`` (a decode, a verify) and
an extend's kernels read of ``ForwardMetadata``: ``kv_indptr`` and ``qo_indptr`` as
offsets, ``kv_indices`` by request, ``kv_last_page_len`` (the page size 1: ones) and
``max_q_len``; ``kv_len`` and ``kv_slots`` (:meth:`AiterMLAEngine.kv_read`).

``sglang-aiter-mla-persist`` (:class:`AiterMLAPersistEngine`): the same step on 32 query
heads a rank (DeepSeek-V3's 128 over tensor-parallel 4), for which ``__init__`` keeps
aiter's persistent MLA decode kernel on (``_use_mla_ps_kernel``, its default, with
``fast_mode``). What runs besides: ``make_mla_decode_meta_data_buffer`` (the work
buffers, sized by ``get_mla_metadata_info_v1``) and ``make_mla_meta_data``
(``get_mla_metadata_v1``'s plan) for an eager decode and verify, ``init_cuda_graph_state``'s
persistent work buffers, and the plan ``_apply_cuda_graph_metadata`` makes into them at
capture and replay. AITER's two schedulers are :mod:`attnfuzz.adapters.aiter_schedule`'s
stand-ins (vLLM's AITER MLA engine shares them); the field ``schedule_stale`` is how many
of the offsets the kernel is handed differ from those its plan was made for (0 the only
value accepted), and whether the plan was made for the kernel's ``max_q_len``.

The backend decides the kernel once per process: ``__init__`` rewrites three globals of
``aiter_backend.py`` (``_use_mla_ps_kernel``, ``fast_mode``, ``intra_batch_mode``), which
a server's one model sets once. Many engines live in one process here, so each engine
starts from the values the module has at import (the default environment) and keeps the
values its ``__init__`` left, in place while it is built and steps
(:meth:`AiterMLAPersistEngine.stepping`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters import aiter_schedule
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_aiter as aiter
from attnfuzz.adapters.sglang.runner_step_flashinfer import _OnDevice, _patched
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

HEADS = 16
"""Query heads a rank: DeepSeek-V3's 128 over tensor-parallel 8."""


def prepare() -> None:
    aiter.prepare()


@dataclass
class _Built:
    """``ForwardMetadata`` and the mode it was built for (a decode's and a verify's MLA
    metadata name their mode by no field)."""

    mode: str
    metadata: Any


class AiterMLAEngine(aiter.AiterEngine):
    """One SGLang engine of an MLA model whose attention backend is AITER."""

    WHERE = {how: f"{where} (an MLA model)" for how, where in aiter.AiterEngine.WHERE.items()}
    HEADS = HEADS

    def make_backend(self) -> Any:
        """``AiterAttnBackend(model_runner)`` on a DeepSeek MLA profile of
        :attr:`HEADS` query heads a rank."""
        decode.mla_profile(self.runner)
        model = self.runner.model_config
        model.num_attention_heads = self.HEADS
        model.get_num_kv_heads = lambda tp_size, dcp_size=1: 1
        model.v_head_dim = decode.KV_LORA_RANK
        return super().make_backend()

    def accepts(self) -> dict[str, tuple[int, int]]:
        """``sglang-aiter``'s ranges, less the bound of its MHA decode kernel's partitions:
        ``mla_decode_fwd`` has none. ``create_flashinfer_kv_indices_triton`` reads
        ``req_to_token[req_pool_indices[i], :seq_lens[i]]`` (the table's width), and every
        request holds a key (a decode's own, a verify's committed prefix)."""
        acc = super().accepts()
        acc["seq_lens"] = (1, self.runner.req_to_token_pool.req_to_token.shape[1])
        return acc

    def forward_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        self.mode = mode
        return super().forward_batch(inputs, mode)

    def eager_metadata(self, forward_batch: Any) -> _Built:
        return _Built(self.mode, self.backend.forward_metadata)

    def persistent_metadata(self, mode: str) -> _Built:
        return _Built(mode, self.backend.forward_metadata)

    def _built(self, metadata: Any) -> _Built:
        """A graph's metadata: a verify's on a speculative engine, else a decode's."""
        if isinstance(metadata, _Built):
            return metadata
        return _Built("verify" if self.config.num_spec else "decode", metadata)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the MLA kernels read of ``ForwardMetadata`` for ``rows`` requests and
        ``tokens`` tokens (padding included), copied now."""
        built = self._built(metadata)
        m = built.metadata
        # mla_decode_fwd (a decode, a verify) and the extend's gather
        # (torch.index_select(K_Buffer, 0, kv_indices) over kv_indptr) read row i's
        # kv_indices[kv_indptr[i] : kv_indptr[i + 1]], queries qo_indptr[i] :
        # qo_indptr[i + 1]: the Triton step's fields and ranges.
        view = decode._engine.StandIn(
            kv_indptr=m.kv_indptr, kv_indices=m.kv_indices, qo_indptr=m.qo_indptr
        )
        out = list(decode._Engine.metadata_fields(self, rows, tokens, view))
        # mla_decode_fwd's kv_last_page_len: the last page's keys of each request, at
        # page size 1 a key (1 <= kv_last_page_len <= page_size).
        last = decode.host(m.kv_last_page_len[:rows])
        out.append(Field("kv_last_page_len", "requests", last, (1, 1)))
        # The kernels' grid covers max_q_len (max_seqlen_q) query rows of a request.
        out.append(Field("max_q_len", "requests", np.full(rows, int(m.max_q_len)), (1, tokens)))
        return tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots: ``mla_decode_fwd``'s (a decode, a
        verify) and a prefixed extend's (``forward_extend`` gathers them through
        ``kv_indices``), row ``i``'s ``kv_indices[kv_indptr[i] : kv_indptr[i + 1]]`` from
        the cache; an extend with no prefix (``forward_extend``: ``extend_no_prefix``,
        every request's keys its queries) the step's own ``k``, its tokens
        ``qo_indptr[i] : qo_indptr[i + 1]``."""
        cached = np.diff(values["kv_indptr"])
        slots = [values["kv_indices"][r, : max(n, 0)] for r, n in enumerate(cached)]
        queries = np.diff(values["qo_indptr"])
        if self._built(metadata).mode != "extend" or not (cached == queries).all():
            return cached, slots
        none = np.zeros_like(cached)
        empty = [s[:0] for s in slots]
        return decode.with_step_keys(none, empty, values["qo_indptr"], values["out_cache_loc"])


AT_IMPORT = {"_use_mla_ps_kernel": True, "fast_mode": False, "intra_batch_mode": True}
"""``aiter_backend.py``'s globals as its import sets them in the default environment
(``SGLANG_AITER_MLA_PERSIST`` unset: the persistent kernel on)."""


class AiterMLAPersistEngine(AiterMLAEngine):
    """One SGLang engine of an MLA model of 32 heads a rank on AITER, whose decode and
    verify run aiter's persistent MLA kernel on a plan of ``get_mla_metadata_v1``'s."""

    HEADS = 32

    def make_backend(self) -> Any:
        self.module_state = dict(AT_IMPORT)
        backend = super().make_backend()
        if not self.module_state["_use_mla_ps_kernel"]:
            raise RuntimeError("attnfuzz: AiterAttnBackend turned the persistent kernel off")
        return backend

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """``aiter`` stood in; the module's globals this engine's ``__init__`` left (the
        import's before it ran), put back after; without CUDA, the backend's
        ``device="cuda"`` work buffers on the engine's device."""
        from sglang.srt.layers.attention import aiter_backend

        saved = {name: getattr(aiter_backend, name) for name in self.module_state}
        vars(aiter_backend).update(self.module_state)
        try:
            with aiter.aiter(), contextlib.ExitStack() as stack:
                if not torch.cuda.is_available():
                    on_device = _OnDevice(self.device)
                    stack.enter_context(_patched(aiter_backend, "torch", on_device))
                yield
        finally:
            self.module_state = {name: getattr(aiter_backend, name) for name in saved}
            vars(aiter_backend).update(saved)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """:class:`AiterMLAEngine`'s, and for a decode or a verify planned for the
        persistent kernel, how far its offsets are from those of its plan."""
        out = super().metadata_fields(rows, tokens, metadata)
        m = self._built(metadata).metadata
        plan = aiter_schedule.scheduled(getattr(m, "work_metadata", None))
        if plan is None:
            return out
        # mla_decode_fwd walks work_metadata's plan: the keys kv_indptr[i] to
        # kv_indptr[i + 1] and queries qo_indptr[i] to qo_indptr[i + 1] it split for
        # request i, over max_seqlen_qo query rows a request.
        stale = aiter_schedule.schedule_stale(m.qo_indptr, m.kv_indptr, plan)
        stale += int(plan.max_seqlen_qo != int(m.max_q_len))
        return (*out, Field("schedule_stale", "requests", np.full(rows, stale), (0, 0)))


class AiterMLALife(aiter.AiterLife):
    """The engine of ``sglang-aiter-mla``: :class:`AiterMLAEngine`."""

    engine_class = AiterMLAEngine


ENGINE = AiterMLALife()
"""The engine of the implementation ``sglang-aiter-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-aiter-mla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


class AiterMLAPersistLife(aiter.AiterLife):
    """The engine of ``sglang-aiter-mla-persist``: :class:`AiterMLAPersistEngine`."""

    engine_class = AiterMLAPersistEngine


PERSIST = AiterMLAPersistLife()
"""The engine of the implementation ``sglang-aiter-mla-persist`` of ``runner-step``."""


def run_persist(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-aiter-mla-persist`` of ``runner-step``: the step on
    :data:`PERSIST`, kept across calls; ``run_persist.new_engine()`` drops it."""
    return PERSIST(inputs)


run_persist.new_engine = PERSIST.new_engine  # type: ignore[attr-defined]
