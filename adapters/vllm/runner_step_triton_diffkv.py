"""vLLM's model runner V1 step on the Triton backend of different K and V head sizes,
as the implementation ``vllm-v1-triton-diffkv`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
``TRITON_ATTN_DIFFKV`` (``vllm/v1/attention/backends/triton_attn_diffkv.py``), as a
MiMo-V2 model's attention makes it where FlashAttention's DiffKV backend cannot run
(``models/mimo_v2.py``: K heads of 192, V heads of 128, the backend told the V size by
``set_head_size_v`` before the layer is made). Its KV-cache group is a
``FullAttentionSpec`` of both sizes (``head_size_v``: K and V packed along one row).
``TritonAttentionDiffKVMetadataBuilder`` is the Triton builder whose per-segment softmax
buffer is sized by the V head, and ``TritonAttentionDiffKVImpl.forward`` reads the
Triton metadata (``unified_attention_diffkv``: query offsets, ``seq_lens``, block
table), so the fields are ``vllm-v1``'s; the cache is written by the forward context's
slot mapping (``do_kv_cache_update``), as ``vllm-v1``'s.

Nothing is stood in beyond ``vllm-v1``: the builder is plain torch.
Declined: ``vllm-v1``'s cases (Triton's kernel block sizes, multiples of 16).
"""

from __future__ import annotations

import functools
from typing import Any

from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

HEAD_SIZE, HEAD_SIZE_V = 192, 128
"""MiMo-V2's K and V head sizes (``head_dim``, ``v_head_dim``)."""


def prepare() -> None:
    """Import vLLM's V1 runner and the DiffKV Triton backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.triton_attn_diffkv import TritonAttentionDiffKVBackend

    return TritonAttentionDiffKVBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s."""
    return v1.declines(case)


declines_config = v1.declines_config
""":func:`declines` of an engine of ``config`` alone (its step not read)."""


class _DiffKVEngine(v1._Engine):
    """A V1 runner whose attention layer is on the DiffKV Triton backend."""

    def attention_group(self) -> tuple[type, Any]:
        backend = _backend()
        backend.set_head_size_v(HEAD_SIZE_V)  # as MiMoV2Attention.__init__ does
        return v1.bf16_attention_group(
            self.vllm_config, self.config, backend, HEAD_SIZE, head_size_v=HEAD_SIZE_V
        )


class DiffKVRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the DiffKV Triton backend."""

    engine_type = _DiffKVEngine


ENGINE = DiffKVRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-triton-diffkv`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-triton-diffkv`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
