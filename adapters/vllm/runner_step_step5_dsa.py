"""vLLM's model runner V1 step of a Step5 model's DSA attention, as the implementation
``vllm-v1-step5-dsa`` of ``runner-step``.

The engine of :mod:`.runner_step_flash_attn` (FA3 on an sm90 GPU, its scheduler's
contract stood in as there), its attention layer (and the MTP draft layer) on Step5's
``STEP5_DSA`` backend (``Step5DSAAttentionBackend`` of
``vllm/models/step5/nvidia/sparse_attention.py``), 1 KV head of 192 (its one head size),
bf16. ``Step5DSAMetadataBuilder`` is ``FlashAttentionMetadataBuilder`` whose ``build``
adds what the DSA forward reads beside FlashAttention's metadata:

- ``num_actual_reqs``, the step's request count (``common_attn_metadata.num_reqs``): the
  forward takes the uniform decode kernels where ``num_actual_tokens == num_actual_reqs *
  max_query_len`` and the query is at most ``1 + num_speculative_tokens`` long, and the
  prefill plan reads the first ``num_actual_reqs`` rows of the block table;
- ``query_start_loc_cpu``, the host query offsets, whose first ``num_actual_reqs + 1``
  entries the prefill plan reads (``plan_prefill_step``);
- ``step5_runtime``, the prefill plan (``_plan_prefill``), made only where the layer's
  ``impl`` holds the model's sparse adapter and summary cache. The model is stood in
  here (no ``impl``), so the plan is never made: ``_plan_prefill`` returns at its first
  test, and the forward's fallback plan is not reached either.

Its graphs (``get_cudagraph_support``): ``UNIFORM_SINGLE_TOKEN_DECODE`` without drafts,
``UNIFORM_BATCH`` with them; a FULL mixed mode becomes FULL_AND_PIECEWISE.

Stood in: ``torchvision`` for the two modules' import alone (the ``step5`` package
imports its vision model, whose processor imports ``torchvision`` at load; the CPU
install has none and the metadata code never calls it).

The indexer keeps its open CSA region's raw rows in a ring
(``vllm/models/step5/nvidia/csa_tail_ring.py``): a ``Step5CSATailRing`` layer made by its
own constructor beside the attention layer, its ``CircularBufferSpec`` its own
``get_kv_cache_spec`` (the attention's page, ``7 + num_spec`` rows of 1 KB at least), a
KV-cache group of its own, one block a request (its first page,
:class:`.runner_step_qsa.RingBlocks`), its cache bound as ``bind_kv_cache_to_layers``
binds it (a contiguous cache: a block's ring is its page's rows). Its
``Step5CSATailRingMetadataBuilder.build`` runs ``_ring_metadata_kernel`` (under Triton's
interpreter) on every build: each token's ring base (its request's block times the rows a
block, -1 where the block is the null block or the token is not scheduled) and ring row
(``base + position % capacity`` for the positions a later step may replay, else -1).
Its graphs: ``AttentionCGSupport.ALWAYS``.

Fields: ``vllm-v1-flash-attn``'s, ``step5.query_start_loc_cpu`` (the host offsets of the
first ``num_actual_reqs`` requests, each within the step's tokens) and the ring's:
``step5.ring.slot_mapping`` (a padding token's row no real token's), ``step5.ring.base``
and ``step5.ring.block`` (each request's ring block, the null block where none).

Kept apart, ``vllm-v1-step5-dsa-dummy-held-rows``: the dummy runs between steps judged
against the requests the engine holds. V1's ``_dummy_run`` builds from the persistent
batch's block-table rows, so the dummy request of row 0 takes the held request's block,
and the kernel, which skips only the null block ("Dummy and capture batches map every
request to the shared null block 0 ... never write it"), stores the dummy token in that
request's ring: the mechanism of ``vllm-v1-kpool-tail-dummy-held-rows``.

Declined: ``vllm-v1-flash-attn``'s cases (pages of multiples of 16: the FlashAttention
backend's kernel block sizes, which Step5's backend inherits), and pages too small for
the ring (``get_kv_cache_spec`` raises ``ValueError``: "increase --block-size").
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.standins import packages_stood_in
from attnfuzz.adapters.vllm import runner_step_flash_attn as fa
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.adapters.vllm.runner_step_qsa import RingBlocks, ring_block_field
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_RING = "vllm/models/step5/nvidia/csa_tail_ring.py"
HEAD_SIZE = 192  # Step5DSAAttentionBackend.supports_head_size
RING_LAYER = "model.layers.0.self_attn.csa_tail_ring"
ROW_BYTES = 1024  # csa_tail_ring.py _ROW_BYTES: one bf16 [index_k | index_z] row


def prepare() -> None:
    """Import vLLM's V1 runner and Step5's DSA backend before a judge forks."""
    fa.prepare()
    _backend()


def torchvision_stood_in() -> contextlib.AbstractContextManager[None]:
    """``torchvision`` importable for the block, where it does not import."""
    return packages_stood_in("torchvision")


@functools.cache
def _backend() -> type:
    with torchvision_stood_in():
        from vllm.models.step5.nvidia.sparse_attention import Step5DSAAttentionBackend

    return Step5DSAAttentionBackend


@functools.cache
def _ring_layer_type() -> type:
    with torchvision_stood_in():
        from vllm.models.step5.nvidia.csa_tail_ring import Step5CSATailRing

    return Step5CSATailRing


def page_bytes(config: EngineConfig) -> int:
    """A page of the attention's KV cache: keys and values of 1 KV head of 192, bf16."""
    return config.block_size * 2 * HEAD_SIZE * torch.bfloat16.itemsize


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-flash-attn``'s cases, and pages
    too small for the ring."""
    return declines_config(case.config) or fa.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    page, needed = page_bytes(config), 7 + config.num_spec
    if config.runner == "v1" and not config.varlen_decode:
        if page % ROW_BYTES or page // ROW_BYTES < needed:
            return (
                f"block_size {config.block_size}: the CSA tail ring needs {needed} rows of "
                f"{ROW_BYTES} bytes in one {page}-byte KV page "
                f"({_RING} Step5CSATailRing.get_kv_cache_spec raises ValueError)"
            )
    return fa.declines_config(config)


def _freeze(meta: Any) -> SimpleNamespace:
    """What the DSA forward reads of ``meta`` now: FlashAttention's metadata and the
    builder's host query offsets."""
    out = fa._freeze(meta)
    out.num_actual_reqs = meta.num_actual_reqs
    out.query_start_loc_cpu = meta.query_start_loc_cpu[: meta.num_actual_reqs + 1].clone()
    return out


class _Step5DSAEngine(RingBlocks, fa._FlashAttnEngine):
    """A V1 runner whose attention layer is on Step5's DSA backend, its indexer's open
    region in a CSA tail ring."""

    freeze = staticmethod(_freeze)

    def attention_group(self) -> tuple[type, Any]:
        backend, self.main_spec = v1.bf16_attention_group(
            self.vllm_config, self.config, _backend(), HEAD_SIZE
        )
        return backend, self.main_spec

    def more_groups(self) -> list[tuple[type, str, Any]]:
        """The ring, a layer made by its own constructor beside the attention layer, its
        spec its own ``get_kv_cache_spec`` of the attention's, its cache bound as
        ``bind_kv_cache_to_layers`` binds it (a contiguous cache: a block's ring is its
        page's rows)."""
        main = SimpleNamespace(get_kv_cache_spec=lambda vllm_config: self.main_spec)
        ring = _ring_layer_type()(
            prefix=RING_LAYER, main_layer_name=v1._LAYER,
            num_speculative_tokens=self.config.num_spec,
            static_forward_context={v1._LAYER: main},
        )  # fmt: skip
        spec = ring.get_kv_cache_spec(self.vllm_config)
        ring.bind_kv_cache(
            torch.zeros(self.pool_size(), spec.page_size_bytes // 2, dtype=torch.bfloat16)
        )
        self.vllm_config.compilation_config.static_forward_context[RING_LAYER] = ring
        self.ring = ring
        self.recorder.linear_layer = RING_LAYER
        return [(ring.get_attn_backend(), RING_LAYER, spec)]

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # UNIFORM_SINGLE_TOKEN_DECODE, or UNIFORM_BATCH with drafts: no FULL mixed graph.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        if seen.meta is None:
            return out
        # plan_prefill_step: request i's query rows are starts[i] : starts[i + 1] of the
        # step's tokens, for the first num_actual_reqs requests.
        tokens_pad = int(seen.positions.shape[0])
        host = Field("step5.query_start_loc_cpu", "offsets",
                     v1._np(seen.meta.query_start_loc_cpu), (0, tokens_pad))  # fmt: skip
        out = (*out, host)
        m = seen.linear
        if m is None:
            return out
        rows, capacity = self.ring.rows_per_block, self.ring.capacity
        top = (num_blocks(self.config) - 1) * rows + capacity - 1
        slots = v1._np(m.slot_mapping).astype(np.int64)
        # The DSA layer stores each token's raw index row at its ring row (-1: none) and
        # replays the open region's rows from base; a padding token's names no real one's.
        ring = [
            Field("step5.ring.slot_mapping", "tokens", slots, (-1, top),
                  writes_state=True, null_slot=-1),
            Field("step5.ring.base", "tokens", v1._np(m.base).astype(np.int64),
                  (-1, top - capacity + 1)),
        ]  # fmt: skip
        # The ring block each request's tokens store into (the null block: none).
        starts = v1._np(seen.meta.query_start_loc)
        pool = num_blocks(self.config)
        ring.append(ring_block_field("step5.ring.block", slots, starts, rows, pool))
        return (*out, *ring)


class Step5DSARunnerStepEngine(fa.FlashAttnRunnerStepEngine):
    """``vllm-v1-flash-attn``'s three engines, on Step5's DSA backend."""

    engine_type = _Step5DSAEngine


ENGINE = Step5DSARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-step5-dsa`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-step5-dsa`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: V1's dummy run stores into a held request's CSA tail ring, as
# vllm-v1-kpool-tail-dummy-held-rows's into its kpool ring (docs/findings.md).


dummy_held_rows = v1.judging_held(
    Step5DSARunnerStepEngine,
    "``vllm-v1-step5-dsa-dummy-held-rows``: ``vllm-v1-step5-dsa`` with its dummy runs between "
    "steps judged against the requests it holds.",
)
