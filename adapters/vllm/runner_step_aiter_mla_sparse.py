"""vLLM's model runner V1 step of a sparse-attention MLA model on ROCm's AITER MLA sparse
backend, as the implementation ``vllm-v1-aiter-mla-sparse`` of ``runner-step``.

The engine of :mod:`.runner_step_sparse_mla` (DeepSeek-V3.2's attention, the indexer's
top-k of ``index_topk`` 64 keys per query token, its KV cache bf16), its MLA layer (and
the MTP draft layer) on vLLM's ``ROCM_AITER_MLA_SPARSE`` backend
(``vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py``) as an MI300X (gfx942)
runs it: ``ROCMAiterMLASparseMetadataBuilder`` builds every step (eager, padded for the
graph, replayed, afresh, the drafter's sub-steps) and the capture runs. Beside
``SparseMLACommonMetadataBuilder.build`` (which ``vllm-v1-flashmla-sparse`` drives), what
it builds for AITER's decode kernel, which treats each query token as a batch entry of
one query row:

- ``req_id_per_token`` in a buffer of its own, its tail past the step's tokens zeroed
  where the step shrank;
- ``paged_kv_indptr``: each token's keys, ``min(context + position + 1, topk)``
  (vLLM's Triton kernel ``generate_sparse_seqlen_kernel``), summed into a persistent
  buffer whose tail repeats the last offset; ``qo_indptr`` (one row a token) and
  ``paged_kv_last_page_len`` (1), persistent;
- the decode schedule, asked of AITER (``get_mla_metadata_v1``) when a fingerprint of
  the step's clamped lengths changes, into work buffers made at ``__init__``.

Stood in, beyond ``vllm-v1-aiter-mla``'s (the gfx942 architecture, the ``aiter``
package's ``dtypes`` and metadata calls): ``current_platform.num_compute_units()``,
an MI300X's 304 CUs (the split cap of the schedule), and the CUDA stream the builder
synchronizes after asking for a schedule (``torch.cuda.current_stream``). The MLA
layer's ``impl`` says no attention sinks and no AITER sparse-MLA Triton kernel, as
DeepSeek-V3.2's has none: the builder asks for the persistent schedule.

Fields: ``vllm-v1-flashmla-sparse``'s (``sparse.*``: ``req_id_per_token`` now this
builder's, the split's ``seq_lens`` and block table, the prefills' offsets; the forward
context's slot mapping, the positions) and of the AITER decode (``aiter_sparse.*``),
with the range ``mla_decode_fwd`` accepts (``ROCMAiterMLASparseImpl._forward_mla``):
``paged_kv_len``, each token's keys (``paged_kv_indptr[t + 1] - paged_kv_indptr[t]``:
``triton_convert_req_index_to_global_index`` writes at most ``topk`` indices for a
token), ``qo_end`` (``qo_indptr[t + 1]``, the query rows), ``paged_kv_last_page_len``
and ``schedule_stale`` (:func:`.runner_step_aiter_mla.schedule_stale`). No
``kv_len``/``kv_slots``: the keys are the indexer's choice.

Declined: ``vllm-v1-mla``'s cases, and block sizes the backend has no kernel block size
for (``ROCMAiterMLASparseBackend.get_supported_kernel_block_sizes``: 1 and multiples of
16; the Triton backend's runner takes multiples of 16).
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
from attnfuzz.adapters.vllm import runner_step_aiter_mla as aiter_mla
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_sparse_mla as sparse
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import _LAYER
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_AITER_SPARSE = "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py"
CUS = 304
"""An MI300X's compute units (``num_compute_units``)."""


def prepare() -> None:
    """Import vLLM's V1 runner, the ROCm platform and the AITER MLA sparse backend
    before a judge forks (outside :func:`.runner_step_aiter_mla.aiter`)."""
    sparse.prepare()
    aiter_mla._rocm_platform()
    _backend()


@functools.cache
def _backend() -> type:
    aiter_mla._rocm_platform()
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import ROCMAiterMLASparseBackend

    return ROCMAiterMLASparseBackend


@contextlib.contextmanager
def mi300x() -> Iterator[None]:
    """AITER importable, an MI300X's CUs, and a CUDA stream to synchronize."""
    from vllm.platforms import current_platform

    with (
        aiter_mla.aiter(),
        mock.patch.object(type(current_platform), "num_compute_units", lambda *a, **k: CUS),
        mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: v1._Stream()),
    ):
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-mla``'s cases (the Triton
    backend's block sizes, multiples of 16, all of which this backend takes)."""
    return mla.declines(case)


declines_config = mla.declines_config
""":func:`declines` of an engine of ``config`` alone (its step not read)."""


def _freeze(meta: Any) -> SimpleNamespace:
    """``vllm-v1-flashmla-sparse``'s view of ``meta``, and the AITER decode's offsets as
    the kernel reads them now; how far they are from those its schedule was made for."""
    out = sparse._freeze(meta)
    indptr = meta.paged_kv_indptr.clone()
    out.aiter = SimpleNamespace(
        qo_indptr=meta.qo_indptr.clone(), paged_kv_indptr=indptr,
        last_page_len=meta.paged_kv_last_page_len.clone(), topk=int(meta.topk_tokens),
        capacity=int(meta.paged_kv_indices.shape[0]), schedule_stale=None,
    )  # fmt: skip
    scheduled = aiter_mla._scheduled(meta)
    if scheduled is not None:
        stale = aiter_mla.schedule_stale(meta.qo_indptr, indptr, scheduled)
        out.aiter.schedule_stale = stale + int(scheduled.max_seqlen_qo != 1)
    return out


def _aiter_fields(seen: v1._Seen) -> list[Field]:
    """The AITER sparse decode's tensors, with what ``mla_decode_fwd`` accepts of them
    (one query row a token, a token's keys the indices the conversion kernel wrote)."""
    a = seen.meta.aiter
    tokens_pad = int(seen.positions.shape[0])
    indptr = v1._np(a.paged_kv_indptr).astype(np.int64)
    out = [
        # Token t's keys: paged_kv_indices[paged_kv_indptr[t] : paged_kv_indptr[t + 1]],
        # of which triton_convert_req_index_to_global_index writes at most topk.
        Field("aiter_sparse.paged_kv_len", "tokens", np.diff(indptr), (0, a.topk)),
        # ... their end, inside the builder's buffer of indices.
        Field("aiter_sparse.paged_kv_end", "tokens", indptr[1:], (0, a.capacity)),
        # Token t's query row: q[qo_indptr[t] : qo_indptr[t + 1]], one row.
        Field("aiter_sparse.qo_end", "tokens", v1._np(a.qo_indptr)[1:], (1, tokens_pad)),
        Field("aiter_sparse.paged_kv_last_page_len", "tokens", v1._np(a.last_page_len), (1, 1)),
    ]
    if a.schedule_stale is not None:
        stale = np.full(len(indptr) - 1, a.schedule_stale, dtype=np.int64)
        out.append(Field("aiter_sparse.schedule_stale", "tokens", stale, (0, 0)))
    return out


class _AiterMLASparseEngine(sparse._SparseMLAEngine):
    """A V1 runner of a sparse-attention MLA model on the AITER MLA sparse backend."""

    backend = staticmethod(_backend)
    freeze = staticmethod(_freeze)

    def __init__(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        aiter_mla._rocm_platform()
        super().__init__(config, device, mode)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(super().platform())
        stack.enter_context(mi300x())
        return stack

    def attention_group(self) -> tuple[type, Any]:
        made = super().attention_group()
        # What the builder reads of each layer's impl: DeepSeek-V3.2 has no attention
        # sinks and runs AITER's decode kernel (ROCMAiterMLASparseImpl.__init__).
        layers = self.vllm_config.compilation_config.static_forward_context
        for name in (_LAYER, drafting.DRAFT_LAYER):
            if name in layers:
                layers[name].impl = SimpleNamespace(sinks=None, use_aiter_sparse_mla=False)
        return made

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        return out if seen.meta is None else (*out, *_aiter_fields(seen))


class AiterMLASparseRunnerStepEngine(sparse.SparseMLARunnerStepEngine):
    """``vllm-v1``'s three engines, of a sparse-attention MLA model on AITER MLA sparse."""

    engine_type = _AiterMLASparseEngine


ENGINE = AiterMLASparseRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-aiter-mla-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-aiter-mla-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: ROCMAiterMLASparseMetadataBuilder.build with one line dropped -----------------


@contextlib.contextmanager
def _indptr_tail_kept() -> Iterator[None]:
    """``build`` leaves ``paged_kv_indptr`` past the step's tokens as the build before
    left it (the ``indptr_tail.copy_`` of the last offset dropped): a FULL graph's
    padding tokens read an earlier build's offsets (a larger step's, or the capture
    run's), which can run backwards into the real tokens' keys, where the index
    conversion then writes."""
    from vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse import (
        ROCMAiterMLASparseMetadataBuilder as Builder,
    )

    original = Builder.build

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.paged_kv_indptr.clone()
        meta = original(self, *args, **kwargs)
        covered = meta.paged_kv_indptr.numel()
        self.paged_kv_indptr[covered:] = before[covered:]
        return meta

    with mock.patch.object(Builder, "build", build):
        yield


_TAIL_KEPT = v1.Mutated(AiterMLASparseRunnerStepEngine(), _indptr_tail_kept)


def indptr_tail_kept(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-aiter-mla-sparse-indptr-tail-kept``: a FULL graph's padding tokens read
    the offsets an earlier build left (``aiter_sparse.paged_kv_len``)."""
    return _TAIL_KEPT(inputs)


indptr_tail_kept.new_engine = _TAIL_KEPT.engine.new_engine  # type: ignore[attr-defined]


def reach_full_graphs(trace: Trace | Case) -> bool:
    """A V1 engine with FULL graphs and pages the Triton backend's runner takes."""
    return hybrid.reach_full_graphs(trace)


def trigger_padded_replay(trace: Trace | Case) -> bool:
    """A FULL graph replays a decode step of fewer tokens than the largest graph holds:
    the graph's padding tokens read the offsets an earlier build left past the step's
    (the graph's own capture run, at least, wrote them)."""
    c = trace.config
    largest = max(c.cudagraph_capture_sizes, default=0)
    return reach_full_graphs(trace) and any(
        all(q == c.next_n for q in b.q_lens) and sum(b.q_lens) < largest
        for b in hybrid._batches(trace)
    )


def smallest_shrunk_replay() -> Trace:
    """Two requests prefill 1 and 5 tokens, verify 2 tokens each (their keys 2, 3, 6, 7:
    offsets 0, 2, 5, 11, 18), then the second verifies 2 more alone, padded to the FULL
    graph of 4 tokens: its keys end at 17, past the 11 the first padding token's stale
    offset says."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, block_size=16,
        num_spec=1, cudagraph_capture_sizes=(4,), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (
        Batch((0, 0), (1, 5), req_ids=(1, 0), pages=((2,), (1,)), new_pages=(1, 1)),
        Batch((1, 5), (2, 2), req_ids=(1, 0), pages=((2,), (1,)), new_pages=(0, 0)),
        Batch((7,), (2,), req_ids=(0,), pages=((1,),), new_pages=(0,), finished=(1,)),
    ))  # fmt: skip
