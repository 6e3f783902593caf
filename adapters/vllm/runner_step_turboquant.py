"""vLLM's model runner V1 step on the TurboQuant attention backend, as the implementation
``vllm-v1-turboquant`` of ``runner-step``, and a finding of vLLM's own under async
scheduling, kept apart as ``vllm-v1-turboquant-async-verify-past-rejection``.

The engines of :mod:`.runner_step_v1`, their attention layer (and the MTP draft layer)
on ``TURBOQUANT`` (``vllm/v1/attention/backends/turboquant_attn.py``,
``--kv-cache-dtype turboquant_k8v4``: the cache config's dtype; the packed slot changes
a page's bytes, not the metadata), 1 KV head of 128, bf16. ``TurboQuantMetadataBuilder``
builds every step (``build``; ``build_for_cudagraph_capture``, which fills the runner's
``seq_lens`` with 1): the runner's tensors, the split by ``split_decodes_and_prefills``
at the reorder threshold 1 (``supports_spec_as_decode=False``: a verify of drafts is
not a decode), ``is_prefill`` (``max_query_len > 1``), and the host copies
``query_start_loc_cpu`` and ``seq_lens_cpu``, the latter the runner's
``seq_lens_cpu_upper_bound`` (``optimistic_seq_lens_cpu``: "optimistic for async-spec
decode rows (assumes every draft was accepted). Not safe for kernels that need exact
per-row context lengths on decode rows", ``CommonAttentionMetadata``). Its graphs are
``AttentionCGSupport.UNIFORM_BATCH`` (FULL becomes FULL_AND_PIECEWISE). Nothing is
stood in beyond ``vllm-v1``: the builder is plain torch.

Every field a kernel reads is reported: ``vllm-v1``'s (query offsets, ``seq_lens``,
block table, the forward context's slot mapping, positions) and, of the requests past
the decodes (the prefill path, ``TurboQuantAttentionImpl._prefill_attention``),
``tq.prefill.seq_lens_cpu``: each one's context length as that path reads it, and
``kv_len``/``kv_slots`` as the kernels read them (:meth:`_TurboQuantEngine.kv_read`).

``vllm-v1-turboquant`` runs the engine as ``vllm-v1`` does, scheduled synchronously
(the CPU platform's; ``--no-async-scheduling`` on a GPU), where the upper bound is
exact. Scheduled asynchronously (:mod:`.runner_step_v1_async`, as ``VllmConfig``
leaves a V1 engine with an MTP or EAGLE drafter), a request that rejected drafts in
the step before and verifies again (a query of more than one token, so the prefill
path) has its host upper bound past its sequence: the path reads that many keys
(``cached_len = seq_len - q_len``), past the last the device's ``seq_lens`` counts.
That engine is ``vllm-v1-turboquant-async-verify-past-rejection``, a mutant-kind
entry of vLLM's unchanged code (trigger :func:`trigger_verify_past_rejection`).

Declined: ``vllm-v1``'s cases, and block sizes the backend has no kernel block size
for (``get_supported_kernel_block_sizes``: 16, 32, 64, 128).
"""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm import runner_step_v1_async as v1_async
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_TQ = "vllm/v1/attention/backends/turboquant_attn.py"
HEAD_SIZE = 128


def prepare() -> None:
    """Import vLLM's V1 runner and the TurboQuant backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend

    return TurboQuantAttentionBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and block sizes the
    backend has no kernel block size for."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not _backend().supports_block_size(config.block_size):
        return (
            f"block_size {config.block_size}: the TurboQuant backend's kernel block sizes "
            f"are 16, 32, 64 and 128 ({_TQ} TurboQuantAttentionBackend."
            "get_supported_kernel_block_sizes)"
        )
    return None


def _freeze(meta: Any) -> SimpleNamespace:
    """What the kernels read of ``meta`` now: the runner's tensors, the split and the
    host copies."""
    return SimpleNamespace(
        query_start_loc=meta.query_start_loc.clone(), seq_lens=meta.seq_lens.clone(),
        block_table=meta.block_table.clone(), is_prefill=meta.is_prefill,
        num_decodes=meta.num_decodes, num_decode_tokens=meta.num_decode_tokens,
        query_start_loc_cpu=None if meta.query_start_loc_cpu is None
        else meta.query_start_loc_cpu.clone(),
        seq_lens_cpu=None if meta.seq_lens_cpu is None else meta.seq_lens_cpu.clone(),
    )  # fmt: skip


class _TurboQuantEngine(v1._Engine):
    """A V1 runner whose attention layer is on TurboQuant."""

    freeze = staticmethod(_freeze)

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.cache_dtype = "turboquant_k8v4"
        return v1.bf16_attention_group(vc, self.config, _backend(), HEAD_SIZE)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # AttentionCGSupport.UNIFORM_BATCH: FULL becomes FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = list(v1._fields(self.config, seen))
        m = seen.meta
        if m is not None and m.is_prefill and m.seq_lens_cpu is not None:
            reach = int(m.block_table.shape[1]) * self.kernel_block_size()
            # _prefill_attention: a request past the decodes attends to the first
            # seq_lens_cpu[i] keys of its sequence (its cached ones, cached_len =
            # seq_len - q_len, then its own), read through its block-table row.
            prefill = v1._np(m.seq_lens_cpu)[m.num_decodes :]
            out.append(Field("tq.prefill.seq_lens_cpu", "requests", prefill, (0, reach)))
        return tuple(out) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots as ``TurboQuantAttentionImpl.forward``
        reads them (the step's own keys are in the cache first: ``do_kv_cache_update``):

        - a step with no query over one token (``is_prefill`` False), and the decodes
          (rows to ``num_decodes``) of any other: ``_decode_attention`` reads the first
          ``seq_lens[i]`` keys through ``block_table[i]``;
        - every request past the decodes (``_prefill_attention``, per request from the
          host copies): one whose ``seq_lens_cpu`` equals its query reads its own keys
          (at the slots the forward context's slot mapping writes them to); any other
          reads the first ``seq_lens_cpu[i]`` keys through ``block_table[i]`` (its
          cached ones, then its own: the continuation's synthetic decode lengths run
          to ``seq_len``, ``_continuation_prefill`` reads ``cached_len`` then its
          chunk)."""
        m = seen.meta
        bs = self.kernel_block_size()
        seq_lens, table = v1._np(m.seq_lens), v1._np(m.block_table)
        if not m.is_prefill:
            return v1.paged_keys(seq_lens, table, bs)
        nd = m.num_decodes
        lengths, slots = v1.paged_keys(seq_lens[:nd], table[:nd], bs)
        keys = list(slots)
        query = v1._np(m.query_start_loc_cpu).astype(np.int64)
        upper = v1._np(m.seq_lens_cpu).astype(np.int64)
        written = None if seen.slot_mapping is None else v1._np(seen.slot_mapping)
        for i in range(nd, len(query) - 1):
            q_len, seq_len = int(query[i + 1] - query[i]), int(upper[i])
            if q_len <= 0:
                keys.append(np.zeros(0, dtype=np.int64))
            elif q_len == seq_len:
                if written is None:
                    raise RuntimeError("attnfuzz: a TurboQuant prefill with no slot mapping")
                keys.append(written[query[i] : query[i + 1]].astype(np.int64))
            else:
                keys.append(v1.page_slots(table[i], seq_len, bs))
        return np.array([len(k) for k in keys], dtype=np.int64), keys


class TurboQuantRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on TurboQuant."""

    engine_type = _TurboQuantEngine

    # The builder's reorder_batch_threshold makes the runner reorder its batch, as MLA's
    # does: the fresh engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


class _AsyncTurboQuantEngine(v1_async._AsyncEngine, _TurboQuantEngine):
    """A V1 runner scheduled asynchronously whose attention layer is on TurboQuant."""


class AsyncTurboQuantRunnerStepEngine(v1_async.AsyncRunnerStepEngine):
    """``vllm-v1-async``'s three engines, on TurboQuant."""

    engine_type = _AsyncTurboQuantEngine
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = TurboQuantRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-turboquant`` of ``runner-step``."""
ASYNC = AsyncTurboQuantRunnerStepEngine()
"""The engine of ``vllm-v1-turboquant-async-verify-past-rejection``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-turboquant`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


def run_async(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-turboquant-async-verify-past-rejection``: the step on :data:`ASYNC`
    (vLLM's own code, scheduled asynchronously), kept across calls."""
    return ASYNC(inputs)


run_async.new_engine = ASYNC.new_engine  # type: ignore[attr-defined]


# -- the finding kept apart: a verify after a rejection reads past its sequence -------------


def reach_verify_after_drafts(trace: Trace | Case) -> bool:
    """A request verifies drafts in one step and runs on in the next with a query of
    more than one token (TurboQuant's prefill path, which reads the host upper bound):
    :func:`.runner_step_v1_async.drafted_then_ran`."""
    return any(query > 1 for _, query in v1_async.drafted_then_ran(trace))


def trigger_verify_past_rejection(trace: Trace | Case) -> bool:
    """Such a request rejected a draft in the step before: the upper bound is then past
    its sequence."""
    return any(back > 0 and query > 1 for back, query in v1_async.drafted_then_ran(trace))


def smallest_verify_past_rejection() -> Trace:
    """One request of a one-token prompt, then a verify of its token and one draft, which
    the step rejects; the request runs on from 2 computed tokens with one more draft,
    where the scheduler counts 3: TurboQuant's prefill path reads 5 keys of its 4."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=8, block_size=16, num_spec=1,
        cudagraph_capture_sizes=(2,), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    pages = ((1,),)
    return Trace(
        config,
        (
            Batch((0,), (1,), req_ids=(0,), pages=pages, new_pages=(1,)),
            Batch((1,), (2,), req_ids=(0,), pages=pages, new_pages=(0,), rejected=(1,)),
            Batch((2,), (2,), req_ids=(0,), pages=pages, new_pages=(0,)),
        ),
    )
