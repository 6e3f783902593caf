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

Kept apart, ``vllm-v1-kpool-tail-padding-last-request``: a FULL graph's padding tokens
where the step already has ``max_num_seqs`` requests. The dispatcher pads the requests to
``min(padded tokens, max_num_seqs)`` (``cudagraph_dispatcher.py``
``_create_padded_batch_descriptor``), so no padding request takes the padding tokens;
the builder hands ``compute_kpool_tail_slot_mapping`` the padded ``num_actual_tokens``,
and the function maps the tokens past the last request's boundary to that request (its
kernel's comment: "Tokens past the last request's boundary (if any) also map to it"):
they store into a real request's ring.

Declined: ``vllm-v1``'s cases, pages the ring does not divide
(``Glm5NextTailCache.get_kv_cache_spec`` asserts it), and the steps of that finding
(:func:`pads_past_the_last_request`).
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
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

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
    """Why this engine does not run ``case``: :func:`declines_engine`'s, and a step whose
    graph padding the last request takes (kept apart)."""
    if pads_past_the_last_request(case):
        return (
            "a FULL graph pads the step's tokens while it holds max_num_seqs requests: "
            "compute_kpool_tail_slot_mapping maps the padding tokens to the last request's "
            "ring (kept apart as vllm-v1-kpool-tail-padding-last-request)"
        )
    return declines_engine(case)


def declines_engine(case: Case) -> str | None:
    """Why the engine runs ``case`` through other code: ``vllm-v1``'s cases, and pages
    the ring does not divide."""
    return declines_config(case.config) or v1.declines(case)


def pads_past_the_last_request(case: Case) -> bool:
    """Whether ``case``'s step may run in a FULL graph padded past its tokens while it
    holds ``max_num_seqs`` requests (so no padding request is added). Conservative: any
    graph step of that many requests whose token count (or a data-parallel peer's) is
    not itself a capture size."""
    config, batch = case.config, case.batch
    if config.runner != "v1" or "FULL" not in config.cudagraph_mode or not batch.use_cudagraph:
        return False
    if len(batch.q_lens) < config.max_num_seqs or not config.cudagraph_capture_sizes:
        return False
    tokens = max(sum(batch.q_lens), batch.dp_peer_tokens)
    return tokens <= max(config.cudagraph_capture_sizes) and (
        tokens not in config.cudagraph_capture_sizes
    )


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


# -- a finding kept apart: a FULL graph's padding tokens stored into the last request's ring --


def reach_full_graph_padding(found: Trace | Case) -> bool:
    """A V1 engine of ``vllm-v1-kpool-tail``'s that runs steps in FULL graphs."""
    c = found.config
    return c.runner == "v1" and "FULL" in c.cudagraph_mode and declines_config(c) is None


def trigger_padding_last_request(found: Trace | Case) -> bool:
    """A step of :func:`pads_past_the_last_request`."""
    return reach_full_graph_padding(found) and any(
        pads_past_the_last_request(c) for c in as_trace(found).cases()
    )


def smallest_padding_last_request() -> Trace:
    """One request at a time prefills one token, in the FULL graph of 2: the padding
    token stores into the request's ring at position 0's row (slot 4 of block 1)."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2,), cudagraph_mode="FULL", cg_support="ALWAYS",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,)),))
