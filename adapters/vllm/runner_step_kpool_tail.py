"""vLLM's model runner V1 step of a model whose kpool indexer keeps its in-progress pool
in a per-request ring (GLM-5.3-Flash's), as the implementation ``vllm-v1-kpool-tail`` of
``runner-step``.

The engine of :mod:`.runner_step_v1`, whose indexer also keeps the tail cache of
``Glm5NextTailCache`` (``vllm/models/glm5next/common/attention.py``): a
``CircularBufferSpec`` of ``kpool * next_power_of_2(cdiv(kpool + num_spec, kpool))``
rows, two head slots (raw K, gate score), one block a request, a KV-cache group of its own
on ``KpoolTailBackend`` (``v1/attention/backends/mla/indexer.py``). The spec is made here
as that ``get_kv_cache_spec`` makes it: its module does not import on this machine
(transformers' ``Glm5NextTextConfig`` needs torchvision). The pool is 4 tokens
(``index_kpool``, attnfuzz's choice).

``KpoolTailMetadataBuilder.build`` builds that group's metadata on every step, capture
run and draft build: the decode/prefill split and each token's slot in its request's
ring (``compute_kpool_tail_slot_mapping``: the request's one block times the ring plus
the position modulo the ring, -1 where the request's block is the null block; the
tokens past the step's keep the runner's slot, -1). A CUDA tensor takes the function's
Triton kernel (``_kpool_tail_slot_mapping_kernel``), a CPU one its torch path: here the
torch path runs. Its graphs: ``AttentionCGSupport.ALWAYS``.

The consumer is the kpool indexer's tail store (``SparseAttnIndexerKpool``): each
token's raw K and gate score at its slot. Fields, beside ``vllm-v1``'s:
``kpool.slot_mapping`` (a slot of the ring's blocks or -1; a padding token's no real
token's, ``writes_state``) and ``kpool.ring_block``, the ring block each request's tokens
store into (the null block where none: a padding request's is no real one's).

Kept apart, ``vllm-v1-kpool-tail-dummy-held-rows``: the same engine with its dummy runs
between steps judged against the requests it holds. V1's ``_dummy_run`` builds the
metadata from the persistent batch's block-table rows, so the dummy request of row 0
takes the held request's ring block, and the slot mapping function stores the dummy
tokens there (its Triton kernel's comment: "the runners give dummy and padding requests
the null block, which must never be written"), as ``vllm-v1-hybrid-dummy-held-rows``
finds for a GDN layer's state.

The ring's block is a request's first page (:class:`.runner_step_qsa.RingBlocks`).

Declined: ``vllm-v1``'s cases, and pages the ring does not divide
(``Glm5NextTailCache.get_kv_cache_spec`` asserts it).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import held_between_steps, num_blocks, prefill_then_decode
from attnfuzz.adapters.vllm.runner_step_qsa import RingBlocks, ring_block_field, ring_declines
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_TAIL = "vllm/models/glm5next/common/attention.py"
KPOOL = 4  # the indexer's pool (index_kpool)
TAIL_LAYER = "model.layers.0.self_attn.indexer.tail_cache"
TAIL_HEAD_DIM = 16  # sizes the ring's rows, reaches no metadata


def prepare() -> None:
    """Import vLLM's V1 runner and the kpool tail backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.indexer import KpoolTailBackend

    return KpoolTailBackend


def ring_rows(config: EngineConfig) -> int:
    """``Glm5NextTailCache.get_kv_cache_spec``: the pool plus the drafts, in a power of
    two of pools."""
    pools = -(-(KPOOL + config.num_spec) // KPOOL)
    return KPOOL * (1 << (pools - 1).bit_length())


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and pages the ring
    does not divide."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    return ring_declines(
        config, ring_rows(config), "kpool tail", f"{_TAIL} Glm5NextTailCache.get_kv_cache_spec"
    )


class _KpoolTailEngine(RingBlocks):
    """A V1 runner whose indexer keeps a kpool tail ring."""

    def more_groups(self) -> list[tuple[type, str, Any]]:
        from vllm.v1.kv_cache_interface import CircularBufferSpec

        self.recorder.linear_layer = TAIL_LAYER
        spec = CircularBufferSpec(
            block_size=ring_rows(self.config), num_kv_heads=2, head_size=TAIL_HEAD_DIM,
            head_size_v=0, dtype=torch.bfloat16, dcp_sharded=False,
        )  # fmt: skip
        return [(_backend(), TAIL_LAYER, spec)]

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        m = seen.linear
        if seen.meta is None or m is None:
            return out
        pool, ring = num_blocks(self.config), ring_rows(self.config)
        slots = v1._np(m.slot_mapping).astype(np.int64)
        # SparseAttnIndexerKpool stores each token's raw K and gate score at its slot
        # (-1: none); a padding token's names no real token's.
        tail = Field("kpool.slot_mapping", "tokens", slots, (-1, pool * ring - 1),
                     writes_state=True, null_slot=-1)  # fmt: skip
        # The ring block each request's tokens store into (the null block: none).
        starts = v1._np(seen.meta.query_start_loc)
        return (*out, tail, ring_block_field("kpool.ring_block", slots, starts, ring, pool))


class KpoolTailRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of a model with a kpool tail ring."""

    engine_type = _KpoolTailEngine
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = KpoolTailRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-kpool-tail`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-kpool-tail`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: V1's dummy run stores into a held request's tail ring
# (docs/findings.md).


dummy_held_rows = v1.judging_held(
    KpoolTailRunnerStepEngine,
    "``vllm-v1-kpool-tail-dummy-held-rows``: ``vllm-v1-kpool-tail`` with its dummy runs between "
    "steps judged against the requests it holds.",
)


def trigger_dummy_held_rows(found: Trace | Case) -> bool:
    """A V1 engine, a request of one step that the next runs on: the engine holds it,
    and its ring, through the dummy run between them."""
    return found.config.runner == "v1" and held_between_steps(found)


def smallest_dummy_held_rows() -> Trace:
    """One request prefills 5 tokens, then decodes one: the dummy run between the two
    stores into the request's ring (block 1)."""
    return prefill_then_decode("v1", 0)
