"""vLLM's model runner V1 step of an MLA model on the Tokenspeed MLA backend, as the
implementation ``vllm-v1-tokenspeed-mla`` of ``runner-step``.

The engine of :mod:`.runner_step_mla`, its MLA layer (and the MTP draft layer) on vLLM's
``TOKENSPEED_MLA`` backend (``vllm/v1/attention/backends/mla/tokenspeed_mla.py``, an sm100
GPU's CuTe DSL MLA kernel), with ``--kv-cache-dtype fp8`` (the backend's only cache
dtypes: ``supported_kv_cache_dtypes``) and DeepSeek-R1's MLA dimensions, the only ones
its kernel is specialized for (``TokenspeedMLABackend.supports_combination``:
``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128), set on the
engine's copy of the model config. ``TokenspeedMLAMetadataBuilder`` is
``MLACommonMetadataBuilder`` with uniform multi-token decodes
(``QueryLenSupport.UNIFORM``), varlen decodes under DCP and FULL graphs of uniform
batches (``UNIFORM_BATCH``: a FULL mode becomes FULL_AND_PIECEWISE), so the fields are
``vllm-v1-mla``'s (``mla.*``, ``kv_len``/``kv_slots``) over an fp8 latent cache. Its
spec is the one the runner's ``get_kv_cache_spec`` makes (``customize_attention_spec``:
the block stride aligned to the largest kernel page, 64). Nothing is stood in: the
builder calls no Tokenspeed code.

Declined: ``vllm-v1-mla``'s cases, and pages the backend has no kernel block for (its
kernel pages are 32 or 64 tokens, ``get_supported_kernel_block_sizes``: a page must be
a multiple of 32).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

_TOKENSPEED = "vllm/v1/attention/backends/mla/tokenspeed_mla.py"
QK_NOPE_HEAD_DIM, V_HEAD_DIM = 128, 128  # DeepSeek-R1's (qk_rope_head_dim: the MLA engine's 64)


def prepare() -> None:
    """Import vLLM's V1 runner and the Tokenspeed MLA backend before a judge forks."""
    mla.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.tokenspeed_mla import TokenspeedMLABackend

    return TokenspeedMLABackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-mla``'s cases, and pages that are
    not a multiple of the backend's smallest kernel page (32)."""
    return declines_config(case.config) or mla.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % 32:
        return (
            f"block_size {config.block_size}: Tokenspeed MLA's kernel pages are 32 or 64 "
            f"tokens ({_TOKENSPEED} TokenspeedMLABackend.get_supported_kernel_block_sizes)"
        )
    return mla.declines_config(config)


class _TokenspeedEngine(mla._MLAEngine):
    """A V1 runner of an MLA model on the Tokenspeed MLA backend, its KV cache fp8."""

    backend = staticmethod(_backend)
    kv_cache_dtype = "fp8"

    def attention_group(self) -> tuple[type, Any]:
        from vllm.v1.worker.utils import customize_attention_spec

        vc = self.vllm_config
        vc.model_config = copy.copy(vc.model_config)
        hf = vc.model_config.hf_text_config = copy.copy(vc.model_config.hf_text_config)
        hf.qk_nope_head_dim, hf.v_head_dim = QK_NOPE_HEAD_DIM, V_HEAD_DIM
        backend, spec = super().attention_group()
        return backend, customize_attention_spec(backend, spec)


class TokenspeedRunnerStepEngine(mla.MLARunnerStepEngine):
    """``vllm-v1-mla``'s three engines, on the Tokenspeed MLA backend."""

    engine_type = _TokenspeedEngine


ENGINE = TokenspeedRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-tokenspeed-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-tokenspeed-mla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
