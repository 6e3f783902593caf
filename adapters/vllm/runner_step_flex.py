"""vLLM's model runner V1 step on the FlexAttention backend, as the implementation
``vllm-v1-flex`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
``FLEX_ATTENTION`` (``vllm/v1/attention/backends/flex_attention.py``), so that
``FlexAttentionMetadataBuilder.build`` runs on every build (eager, padded for the graph,
replayed, afresh, the drafter's sub-steps, the capture runs): the runner's block table
inverted to ``physical_to_logical``, the persistent copies of the query offsets, seq_lens
and each request's computed tokens (``decode_offset``, from ``CommonAttentionMetadata.
compute_num_computed_tokens``), the block mask over them.

What the kernel makes of them (``FlexAttentionMetadata._convert_physical_to_logical``):
query token ``t`` of request ``r`` is at logical position ``t - query_start_loc[r] +
decode_offset[r]``; a key is visible where its logical position is at most that
(``causal_mask_mod``) and below ``seq_lens[r]``. So ``decode_offset`` must be
``seq_lens - query_lens`` of the same build (``flex.context_lens``, derived from the
offsets: *agreement within a build*), and ``kv_len``/``kv_slots`` are read as the
kernel's mask makes them: the keys the request's last query token sees, through its
block-table row.

The drafter's sub-steps after its first pass are judged on everything but that
agreement: vLLM 0.33.0's V1 drafter hands them its first pass's computed tokens (the
cache of ``compute_num_computed_tokens`` kept while ``propose`` rewrites the offsets),
a difference of vLLM's own kept apart as ``vllm-v1-flex-draft-offsets-stale``
(docs/findings.md).

Stood in: nothing beyond ``vllm-v1``'s. ``cache_config.num_gpu_blocks``, which the
builder asserts, is the engine's KV pool (the engine core sets it after profiling).

Fields: ``vllm-v1``'s (the metadata's query offsets, seq_lens, block table, the forward
context's slot mapping and positions), ``flex.decode_offset`` and ``flex.context_lens``
by request, and ``kv_len``/``kv_slots`` as above. The block mask itself is the
``flex-block-mask`` target's.

Declined: ``vllm-v1``'s cases, pages that are not a multiple of 16
(``FlexAttentionBackend.get_supported_kernel_block_sizes``), and FULL engines whose
capture's dummy requests outgrow the builder's persistent block-mask buffer (a
difference of vLLM's own kept apart as ``vllm-v1-flex-capture-past-model-len``).
"""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig, cdiv, runner_table_width
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

_FLEX = "vllm/v1/attention/backends/flex_attention.py"
HEAD_SIZE = 64
KERNEL_BLOCK = 16  # FlexAttentionBackend.get_supported_kernel_block_sizes: MultipleOf(16)


def prepare() -> None:
    """Import vLLM's V1 runner and the FlexAttention backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.flex_attention import FlexAttentionBackend

    return FlexAttentionBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: :func:`declines_engine`'s, and an engine
    whose capture raises in the builder (:func:`capture_past_model_len`, kept apart)."""
    if capture_past_model_len(case.config):
        return (
            "a FULL capture size past max_model_len's pages: each dummy request's seq_len "
            f"is the capture's token count, wider than {_FLEX} FlexAttentionMetadataBuilder's "
            "persistent_kv_indices (kept apart as vllm-v1-flex-capture-past-model-len)"
        )
    return declines_engine(case)


def declines_engine(case: Case) -> str | None:
    """Why the engine runs ``case`` through other code: ``vllm-v1``'s cases, and pages
    the backend takes no kernel block of."""
    return declines_config(case.config) or v1.declines(case)


def capture_past_model_len(config: EngineConfig) -> bool:
    """Whether an engine of ``config`` raises while it captures its graphs (vLLM 0.33.0,
    ``flex_attention.py``). A FULL engine captures every size as a mixed batch, and
    ``gpu_model_runner.py`` ``_dummy_run`` gives each dummy request ``seq_len =
    max_query_len = num_tokens``; ``build_for_cudagraph_capture`` keeps that
    ``max_seq_len``, so ``_build_block_mask_direct`` takes ``cdiv(max_seq_len,
    block_size)`` columns of the runner's block table (as many as it has: rows are whole
    128-token spans, ``runner_table_width``) per query block, and ``copy_to_persistent``
    copies them into ``persistent_kv_indices``, sized for ``cdiv(max_model_len,
    block_size)`` pages: wider, it raises (a shape mismatch)."""
    if config.runner != "v1" or config.cudagraph_mode != "FULL":
        return False
    size = max(config.cudagraph_capture_sizes, default=0)
    width = runner_table_width(config.max_model_len, config.block_size)
    columns = min(cdiv(size, config.block_size), width)
    return columns > cdiv(config.max_model_len, config.block_size)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and config.block_size % KERNEL_BLOCK:
        return (
            f"block_size {config.block_size}: the FlexAttention backend's pages are "
            f"multiples of {KERNEL_BLOCK} ({_FLEX} FlexAttentionBackend."
            "get_supported_kernel_block_sizes)"
        )
    return v1.declines_config(config)


def _freeze(meta: Any) -> SimpleNamespace:
    """What the kernel reads of ``meta`` now (its persistent buffers change after the
    forward): the rows of the build's ``num_reqs`` requests (padding ones included) of
    the offsets, seq_lens and computed tokens, which the metadata hands on at the
    buffers' full capacity ("Mask closures only index active requests")."""
    n = meta.num_reqs
    return SimpleNamespace(
        query_start_loc=meta.query_start_loc[: n + 1].clone(), seq_lens=meta.seq_lens[:n].clone(),
        block_table=meta.block_table.clone(), decode_offset=meta.decode_offset[:n].clone(),
    )  # fmt: skip


def _query_lens(m: SimpleNamespace) -> np.ndarray:
    return np.diff(v1._np(m.query_start_loc).astype(np.int64))


class _FlexEngine(v1._Engine):
    """A V1 runner whose attention layer is on the FlexAttention backend."""

    freeze = staticmethod(_freeze)

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.num_gpu_blocks = self.pool_size()
        return v1.bf16_attention_group(vc, self.config, _backend(), HEAD_SIZE)

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        if seen.meta is None:
            return out
        m = seen.meta
        seq_lens = v1._np(m.seq_lens).astype(np.int64)
        context = seq_lens - _query_lens(m)
        judged = self.offsets_judged(seen)
        # _convert_physical_to_logical: a query token's logical position is its index in
        # its request's query plus decode_offset[r], the request's computed tokens.
        return (
            *out,
            Field("flex.decode_offset", "requests", v1._np(m.decode_offset),
                  agrees_with="flex.context_lens" if judged else None),
            Field("flex.context_lens", "requests", context),
        )  # fmt: skip

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys as the mask makes them: its last query token, at logical
        position ``query_len - 1 + decode_offset[r]``, sees the keys at or before it and
        below ``seq_lens[r]``, key ``j`` at ``block_table[r, j // block_size] *
        block_size + j % block_size``."""
        m = seen.meta
        bs = self.kernel_block_size()
        seq_lens = v1._np(m.seq_lens).astype(np.int64)
        last = _query_lens(m) - 1 + v1._np(m.decode_offset).astype(np.int64)
        lengths = np.clip(np.minimum(last + 1, seq_lens), 0, None)
        table = v1._np(m.block_table)
        slots = [v1.page_slots(table[r], int(n), bs) for r, n in enumerate(lengths)]
        return np.array([len(s) for s in slots], dtype=np.int64), slots


class FlexRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the FlexAttention backend."""

    engine_type = _FlexEngine


ENGINE = FlexRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flex`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flex`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: the drafter's later sub-steps keep its first pass's offsets -----


draft_offsets_stale = v1.kept_apart(
    FlexRunnerStepEngine,
    "``vllm-v1-flex-draft-offsets-stale``: ``vllm-v1-flex`` with the drafter's "
    "sub-steps after its first pass held to their query offsets.",
    stale_drafts_judged=True,
)


def reach_drafts(trace: Trace | Case) -> bool:
    """An engine of ``vllm-v1-flex`` whose drafter runs a sub-step after its first pass
    (two drafts or more)."""
    c = trace.config
    return c.runner == "v1" and c.num_spec >= 2 and declines_config(c) is None


def trigger_draft_offsets_stale(trace: Trace | Case) -> bool:
    """Any step: a request's first-pass offset (its context before the step's tokens)
    is below its offset in the next sub-step (its context before the draft token)."""
    return reach_drafts(trace) and len(as_trace(trace).steps) > 0


def smallest_draft_offsets_stale() -> Trace:
    """One request prefills one token, two drafts: the second sub-step's draft token is
    at position 1, handed an offset of 0: it sees key 0 only."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=4, block_size=KERNEL_BLOCK,
        num_spec=2, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,)),))


# -- a finding kept apart: a FULL capture size past max_model_len's pages raises --------------


def reach_full_capture(trace: Trace | Case) -> bool:
    """An engine of ``vllm-v1-flex``'s that captures FULL graphs of mixed batches."""
    c = trace.config
    return c.runner == "v1" and c.cudagraph_mode == "FULL" and declines_config(c) is None


def trigger_capture_past_model_len(trace: Trace | Case) -> bool:
    """A capture size whose dummy requests take more block-table columns than
    ``max_model_len``'s pages (:func:`capture_past_model_len`)."""
    return reach_full_capture(trace) and capture_past_model_len(trace.config)


def smallest_capture_past_model_len() -> Trace:
    """One page of 16 tokens a request (``max_model_len`` 16) and a capture of 32 tokens:
    the dummy request's seq_len 32 takes two columns of its row of eight, the persistent
    buffer one. The step (a one-token prefill) is never reached."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=32, block_size=KERNEL_BLOCK,
        num_spec=0, cudagraph_capture_sizes=(32,), cudagraph_mode="FULL", cg_support="ALWAYS",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,)),))
