"""SGLang's decode graph runner step on the FlashInfer MLA backend, as the implementation
``sglang-flashinfer-mla`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` on the engine started with
``--attention-backend flashinfer`` for an MLA (DeepSeek) model, which SGLang serves with
``FlashInferMLAAttnBackend``. What runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/flashinfer_mla_backend.py``: ``FlashInferMLAAttnBackend``:
  ``__init__`` (its ``kv_indptr``, ``qo_indptr``, ``q_indptr_decode`` and its eager
  wrappers); ``init_forward_metadata`` (eager: a decode, a target verify of ``topk`` 1,
  an extend, ragged where no request has a prefix, else paged); ``init_cuda_graph_state``;
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture batch
  size (a graph wrapper a batch size, ``fast_mla_decode_plan`` / ``fast_mla_prefill_plan``
  installed on it after its first plan) and, from ``load_batch``, the replay
  (``_apply_cuda_graph_metadata``, ``_build_fast_verify_plan_kwargs``);
- ``FlashInferMLAIndicesUpdaterDecode`` / ``...Prefill`` (``update``,
  ``call_begin_forward``): ``kv_indptr``, ``kv_indices`` (``KVIndexTranslator
  .pack_read_stream``), ``qo_indptr``, ``kv_len_arr``; for a verify, ``eagle_info.py``'s
  ``EagleVerifyInput.generate_attn_arg_prefill``.

Stand-ins, besides the step's: FlashInfer's MLA wrapper where ``flashinfer`` does not
import (:mod:`~attnfuzz.adapters.sglang.flashinfer_mla_stand_in`: its ``plan`` checks
the documented contract, copies into a graph's buffers as FlashInfer does, and writes
the schedule its kernel would run into its int workspace; no kernel runs) and the
ragged prefill wrapper (:mod:`~attnfuzz.adapters.sglang.flashinfer_stand_in`), bound in
``flashinfer_mla_backend``'s namespace while the backend is built or plans; without
CUDA, its ``device="cuda"`` allocations on the engine's device and its host buffers
unpinned. The model is a DeepSeek MLA profile (``kv_lora_rank``, the rope and nope head
dimensions); no KV buffer is read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step`: ``capture``, ``eager``,
``padded`` (the backend's host plan arrays and graph indices buffer after
``load_batch``: what it hands the graph wrapper's plan), ``replay`` (the schedule the
graph's wrapper holds and its indices buffer), ``fresh``.

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what the MLA kernel reads (:class:`_Read`): ``qo_indptr`` and
``kv_indptr`` as offsets, ``kv_len_arr`` by request, ``kv_read_end`` (the end of each
request's pages in the indices buffer) and ``kv_indices`` (each request's pages, from
``kv_indptr[i]``, ``kv_len_arr[i]`` of them: pages of one token, as SGLang plans). And
``kv_len`` and ``kv_slots``, what every backend states alike (:meth:`FlashInferMLAEngine
.kv_read`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import flashinfer_mla_stand_in
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_flashinfer as flashinfer
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

PAGE_SIZE = 1
"""The page size SGLang plans the MLA wrapper with (``call_begin_forward`` hands ``1``)."""


def prepare() -> None:
    """Import SGLang's runner and FlashInfer MLA backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import flashinfer_mla_backend  # noqa: F401


@dataclass
class _Read:
    """What the MLA kernel reads: the schedule a plan wrote (its host arrays) and the
    wrapper's page ids."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_len_arr: torch.Tensor
    kv_indices: torch.Tensor


def _wrapper_read(metadata: Any) -> _Read:
    """The read of the backend's ``DecodeMetadata`` or ``PrefillMetadata``: its wrapper's
    last schedule (:func:`~attnfuzz.adapters.sglang.flashinfer_mla_stand_in.schedule`)."""
    if isinstance(metadata, _Read):
        return metadata
    wrapper = getattr(metadata, "decode_wrapper", None) or metadata.prefill_wrapper
    plan = flashinfer_mla_stand_in.schedule(wrapper)
    return _Read(plan.qo_indptr, plan.kv_indptr, plan.kv_len_arr, wrapper._kv_indices_buf)


class FlashInferMLAEngine(flashinfer.FlashInferEngine):
    """One SGLang engine of an MLA model whose attention backend is FlashInfer MLA."""

    BACKEND_MODULE = "flashinfer_mla_backend"
    FLASHINFER_NAMES = ("BatchMLAPagedAttentionWrapper", "BatchPrefillWithRaggedKVCacheWrapper")
    WHERE = {
        "eager": "flashinfer_mla_backend.py:FlashInferMLAAttnBackend.init_forward_metadata",
        "fresh": "flashinfer_mla_backend.py:FlashInferMLAAttnBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (what "
        "FlashInferMLAAttnBackend._apply_cuda_graph_metadata hands the graph wrapper's plan)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the schedule "
        "and indices of the wrapper the graph captured)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(FlashInferMLAAttnBackend.init_forward_metadata_out_graph, in_capture)",
    }

    def make_backend(self) -> Any:
        """``FlashInferMLAAttnBackend(model_runner)`` on a DeepSeek MLA model profile."""
        from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAAttnBackend

        runner = self.runner
        runner.kv_cache_dtype = runner.dtype = flashinfer.DTYPE
        decode.mla_profile(runner)
        with self.planning():
            return FlashInferMLAAttnBackend(runner)

    def persistent_metadata(self, mode: str) -> _Read:
        """What ``_apply_cuda_graph_metadata`` handed the graph wrapper's plan at
        ``load_batch``: the host arrays it built, and the graph's indices buffer."""
        b = self.backend
        if mode == "verify":
            bs = self.graph_runner.bs
            qo, kv = b.fast_plan_qo_indptr_cpu[: bs + 1], b.fast_plan_kv_indptr_cpu[: bs + 1]
            return _Read(qo, kv, b.fast_plan_kv_len_arr_cpu[:bs], b.cuda_graph_kv_indices)
        kwargs = b.fast_decode_kwargs
        return _Read(kwargs["qo_indptr_cpu"], kwargs["kv_indptr_cpu"], kwargs["kv_len_arr_cpu"],
                     b.cuda_graph_kv_indices)  # fmt: skip

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the kernels read for ``rows`` requests and ``tokens`` tokens (padding
        included), copied now: the MLA kernel's arrays, or, for an extend the ragged
        wrapper runs alone (``PrefillMetadata.use_ragged``: no request has a prefix, so
        ``call_begin_forward`` plans the ragged wrapper and no paged one), its offsets."""
        if getattr(metadata, "use_ragged", False):
            plan = self.backend.prefill_wrapper_ragged.plans[-1]
            # forward_extend's ragged kernel: request i's queries q[qo_indptr[i] :
            # qo_indptr[i + 1]] over the step's own keys k[kv_indptr[i] : kv_indptr[i + 1]].
            return (
                Field("qo_indptr", "offsets", decode.host(plan.qo_indptr[: rows + 1]), (0, tokens)),
                Field("kv_indptr", "offsets", decode.host(plan.kv_indptr[: rows + 1]), (0, tokens)),
            )
        read = _wrapper_read(metadata)
        flat = decode.host(read.kv_indices)
        kv_indptr = decode.host(read.kv_indptr[: rows + 1])
        kv_len = decode.host(read.kv_len_arr[:rows])
        # The kernel reads request i's kv_len_arr[i] keys as pages from kv_indptr[i] of
        # the indices buffer (flashinfer/mla.py: run hands _kv_indices_buf and the plan's
        # schedule), pages of one token: in the buffer, or out of it.
        ends = kv_indptr[:-1] + -(-kv_len // PAGE_SIZE)
        table = np.zeros((rows, max(int(kv_len.max(initial=0)), 0)), dtype=np.int64)
        for r, (start, n) in enumerate(zip(kv_indptr[:-1], kv_len, strict=True)):
            entries = flat[max(start, 0) : max(start + n, 0)]
            table[r, : len(entries)] = entries
        acc = self.accepts()
        return (
            Field("qo_indptr", "offsets", decode.host(read.qo_indptr[: rows + 1]), (0, tokens)),
            Field("kv_indptr", "offsets", kv_indptr, (0, flat.size)),
            Field("kv_len_arr", "requests", kv_len, (0, flat.size)),
            Field("kv_read_end", "requests", ends, (0, flat.size)),
            Field("kv_indices", "requests", table, acc["kv_indices"], row_lengths=kv_len),
        )

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as the kernels read them: the MLA
        kernel's ``kv_len_arr[i]`` keys of request ``i`` (its pages in ``kv_indices``);
        the ragged kernel's, the step's own keys of request ``i`` (``kv_indptr``)."""
        if "kv_len_arr" not in values:
            none = np.zeros(len(values["kv_indptr"]) - 1, dtype=np.int64)
            empty = [np.zeros(0, dtype=np.int64) for _ in none]
            return decode.with_step_keys(none, empty, values["kv_indptr"], values["out_cache_loc"])
        cached = values["kv_len_arr"]
        return cached, [values["kv_indices"][r, : max(n, 0)] for r, n in enumerate(cached)]


class FlashInferMLALife(flashinfer.FlashInferLife):
    """The engine of ``sglang-flashinfer-mla``: :class:`FlashInferMLAEngine`."""

    engine_class = FlashInferMLAEngine

    def prepare(self) -> None:
        prepare()


ENGINE = FlashInferMLALife()
"""The engine of the implementation ``sglang-flashinfer-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-flashinfer-mla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
