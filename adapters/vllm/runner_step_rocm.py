"""vLLM's model runner V1 step on three more ROCm attention backends, as the
implementations ``vllm-v1-rocm-attn``, ``vllm-v1-rocm-segmented`` and
``vllm-v1-rocm-octave`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on:

- ``ROCM_ATTN`` (``vllm/v1/attention/backends/rocm_attn.py``): ``RocmAttentionMetadataBuilder``
  hands the kernels the step's own tensors (query offsets, ``seq_lens``, block table,
  as the Triton backend's builder does, so the fields are ``vllm-v1``'s, of the same
  meaning: ``chunked_prefill_paged_decode`` and unified attention read request ``i``'s
  first ``seq_lens[i]`` keys through its block-table row). Its graphs are
  ``AttentionCGSupport.ALWAYS``; its ``build_for_cudagraph_capture`` fills the runner's
  ``seq_lens`` with 1 and zeroes its ``query_start_loc`` (persistent buffers both), so
  the capture runs and what the runner writes over them before a replay are what this
  implementation adds to ``vllm-v1``'s. The model's attention is 1 KV head of 128,
  bf16.
- ``ROCM_SEGMENTED_ATTN`` (``vllm/v1/attention/backends/rocm_segmented_attn.py``), the
  token-major ROCm backend for segmented prefill: ``RocmSegmentedAttentionMetadataBuilder``
  is ``ROCM_ATTN``'s builder (it adds the head counts and size its kernel is sized by),
  and ``RocmSegmentedAttentionImpl.forward`` reads the same metadata (query offsets,
  ``seq_lens``, block table, their bounds), so the fields are ``vllm-v1-rocm-attn``'s.
- ``ROCM_OCTAVE`` (``vllm/v1/attention/backends/rocm_octave_attn.py``):
  ``RocmOctaveMetadataBuilder`` adds, per query token, its request and its causal K
  length (``q_to_req``, ``q_to_klen``: persistent buffers of ``max_num_batched_tokens``
  the builder owns, filled on the device by ``_fill_query_maps``, a token past the last
  request given K length 0), which the split-KV decode kernel
  (``RocmOctaveAttentionImpl._decode``: every query of a step whose ``max_query_len``
  is at most 128) reads in place of ``seq_lens``; the split by
  ``split_decodes_and_prefills`` (threshold 1). Its graphs are
  ``AttentionCGSupport.UNIFORM_BATCH`` (FULL becomes FULL_AND_PIECEWISE). The model's
  attention is 1 KV head of 256 (``get_supported_head_sizes``), bf16, its cache
  ``octave_k3v4`` (the cache config's dtype; the packed slot changes a page's bytes,
  not the metadata).

Nothing is stood in beyond ``vllm-v1``: both builders are plain torch.

Declined: ``vllm-v1``'s cases (both backends' kernel block sizes are multiples of 16).
``vllm-v1-rocm-octave`` also declines a step whose longest query is over 128 tokens
(none the default strategies draw): its prefill kernel reads ``seq_lens`` as
``vllm-v1``'s fields already state it.
"""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_ROCM_ATTN = "vllm/v1/attention/backends/rocm_attn.py"
_OCTAVE = "vllm/v1/attention/backends/rocm_octave_attn.py"
DECODE_MAX_QUERY_LEN = 128
"""``rocm_octave_attn._DECODE_MAX_QUERY_LEN``: a step of longer queries prefills."""


def prepare() -> None:
    """Import vLLM's V1 runner and the three backends before a judge forks."""
    v1.prepare()
    _rocm_attn()
    _segmented()
    _octave()


@functools.cache
def _rocm_attn() -> type:
    from vllm.v1.attention.backends.rocm_attn import RocmAttentionBackend

    return RocmAttentionBackend


@functools.cache
def _segmented() -> type:
    from vllm.v1.attention.backends.rocm_segmented_attn import RocmSegmentedAttentionBackend

    return RocmSegmentedAttentionBackend


@functools.cache
def _octave() -> type:
    from vllm.v1.attention.backends.rocm_octave_attn import RocmOctaveAttentionBackend

    return RocmOctaveAttentionBackend


def declines(case: Case) -> str | None:
    """Why ``vllm-v1-rocm-attn`` does not run ``case``: ``vllm-v1``'s cases (the
    backend's kernel block sizes are multiples of 16, as Triton's)."""
    return v1.declines(case)


def declines_octave(case: Case) -> str | None:
    """Why ``vllm-v1-rocm-octave`` does not run ``case``: ``vllm-v1``'s cases, and a step
    whose longest query takes the prefill kernel."""
    longest = max(case.batch.q_lens, default=0)
    if longest > DECODE_MAX_QUERY_LEN:
        return (
            f"a query of {longest} tokens: over {DECODE_MAX_QUERY_LEN} the step prefills "
            f"({_OCTAVE} RocmOctaveAttentionImpl.forward), reading seq_lens as vllm-v1 states it"
        )
    return v1.declines(case)


class _RocmAttnEngine(v1._Engine):
    """A V1 runner whose attention layer is on the ROCm attention backend."""

    backend = staticmethod(_rocm_attn)
    head_size = 128

    def attention_group(self) -> tuple[type, Any]:
        return v1.bf16_attention_group(
            self.vllm_config, self.config, self.backend(), self.head_size
        )


class RocmAttnRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the ROCm attention backend."""

    engine_type = _RocmAttnEngine


class _SegmentedEngine(_RocmAttnEngine):
    """A V1 runner whose attention layer is on the ROCm segmented-prefill backend."""

    backend = staticmethod(_segmented)


class SegmentedRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the ROCm segmented-prefill backend."""

    engine_type = _SegmentedEngine


# -- Octave -----------------------------------------------------------------------------------


def _freeze(meta: Any) -> SimpleNamespace:
    """What the kernels read of ``meta`` now (the builder's buffers change after the
    forward): the step's tensors and the query maps."""
    return SimpleNamespace(
        query_start_loc=meta.query_start_loc.clone(), seq_lens=meta.seq_lens.clone(),
        block_table=meta.block_table.clone(), q_to_req=meta.q_to_req.clone(),
        q_to_klen=meta.q_to_klen.clone(), max_query_len=meta.max_query_len,
    )  # fmt: skip


class _OctaveEngine(_RocmAttnEngine):
    """A V1 runner whose attention layer is on the ROCm Octave backend."""

    backend = staticmethod(_octave)
    head_size = 256  # _KERNEL_HEAD_SIZE: the only one
    freeze = staticmethod(_freeze)

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.cache_dtype = "octave_k3v4"
        return super().attention_group()

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # AttentionCGSupport.UNIFORM_BATCH: FULL becomes FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = list(v1._fields(self.config, seen))
        m = seen.meta
        if m is not None:
            rows = len(v1._np(m.seq_lens))
            reach = int(m.block_table.shape[1]) * self.kernel_block_size()
            out += [
                # octave_decode: query token t reads request q_to_req[t]'s block-table
                # row (a token past the last request: K length 0, no key read) ...
                Field("octave.q_to_req", "tokens", v1._np(m.q_to_req), (0, rows)),
                # ... its first q_to_klen[t] keys, causally: no more than the row reaches.
                Field("octave.q_to_klen", "tokens", v1._np(m.q_to_klen), (0, reach)),
            ]
        return tuple(out) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots as ``octave_decode`` reads them for its
        last query token (every step it runs is a decode-kernel step): the first
        ``q_to_klen[t]`` keys through block-table row ``q_to_req[t]``, ``t`` the
        request's last token (``query_start_loc[i + 1] - 1``); a request of no query
        token reads none."""
        m = seen.meta
        bs = self.kernel_block_size()
        table = v1._np(m.block_table)
        query = v1._np(m.query_start_loc).astype(np.int64)
        req, klen = v1._np(m.q_to_req).astype(np.int64), v1._np(m.q_to_klen).astype(np.int64)
        lengths, slots = [], []
        for i in range(len(query) - 1):
            if query[i + 1] <= query[i]:
                lengths.append(0)
                slots.append(np.zeros(0, dtype=np.int64))
                continue
            t = query[i + 1] - 1
            row = table[req[t]] if 0 <= req[t] < len(table) else np.zeros(0, dtype=np.int64)
            keys = v1.page_slots(row, int(klen[t]), bs)
            lengths.append(int(klen[t]))
            slots.append(keys)
        return np.array(lengths, dtype=np.int64), slots


class OctaveRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the ROCm Octave backend."""

    engine_type = _OctaveEngine

    # The builder's reorder_batch_threshold makes the runner reorder its batch, as MLA's
    # does: the fresh engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = RocmAttnRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-rocm-attn`` of ``runner-step``."""
SEGMENTED = SegmentedRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-rocm-segmented`` of ``runner-step``."""
OCTAVE = OctaveRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-rocm-octave`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-rocm-attn`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


def run_segmented(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-rocm-segmented`` of ``runner-step``: the step on
    :data:`SEGMENTED`, kept across calls; ``run_segmented.new_engine()`` drops it."""
    return SEGMENTED(inputs)


run_segmented.new_engine = SEGMENTED.new_engine  # type: ignore[attr-defined]


def run_octave(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-rocm-octave`` of ``runner-step``: the step on
    :data:`OCTAVE`, kept across calls; ``run_octave.new_engine()`` drops it."""
    return OCTAVE(inputs)


run_octave.new_engine = OCTAVE.new_engine  # type: ignore[attr-defined]
