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

Stood in: ``torchvision`` for the backend module's import alone (the ``step5`` package
imports its vision model, whose processor imports ``torchvision`` at load; the CPU
install has none and the metadata code never calls it).

Fields: ``vllm-v1-flash-attn``'s, and ``step5.query_start_loc_cpu`` (the host offsets of
the first ``num_actual_reqs`` requests, each within the step's tokens).

Declined: ``vllm-v1-flash-attn``'s cases (pages of multiples of 16: the FlashAttention
backend's kernel block sizes, which Step5's backend inherits).
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Any

from attnfuzz.adapters.standins import packages_stood_in
from attnfuzz.adapters.vllm import runner_step_flash_attn as fa
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

HEAD_SIZE = 192  # Step5DSAAttentionBackend.supports_head_size


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


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-flash-attn``'s cases."""
    return fa.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    return fa.declines_config(config)


def _freeze(meta: Any) -> SimpleNamespace:
    """What the DSA forward reads of ``meta`` now: FlashAttention's metadata and the
    builder's host query offsets."""
    out = fa._freeze(meta)
    out.num_actual_reqs = meta.num_actual_reqs
    out.query_start_loc_cpu = meta.query_start_loc_cpu[: meta.num_actual_reqs + 1].clone()
    return out


class _Step5DSAEngine(fa._FlashAttnEngine):
    """A V1 runner whose attention layer is on Step5's DSA backend."""

    freeze = staticmethod(_freeze)

    def attention_group(self) -> tuple[type, Any]:
        return v1.bf16_attention_group(self.vllm_config, self.config, _backend(), HEAD_SIZE)

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
        return (*out, host)


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
