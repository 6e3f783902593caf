"""vLLM's model runner V1 step of a sparse-attention MLA model on FlashInfer's sparse MLA
backends, as the implementations ``vllm-v1-flashinfer-mla-sparse`` (the SM100 TRT-LLM
backend) and ``vllm-v1-flashinfer-mla-sparse-sm120`` of ``runner-step``.

The engine of :mod:`.runner_step_sparse_mla`, its MLA layer (and the MTP draft layer) on
one of the two FlashInfer sparse MLA backends of
``vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py``:

- ``FLASHINFER_MLA_SPARSE`` (``FlashInferMLASparseTRTLLMBackend``, an sm100 GPU's):
  ``FlashInferMLASparseTRTLLMMetadataBuilder``, whose ``__init__`` enables the drafter's
  in-place decode update (``supports_draft_decode_metadata_update``: no DCP, no PCP, no
  HiSparse; the V2 runner's speculator calls it, the V1 drafter rebuilds) and sizes the
  TRT-LLM workspace under DCP (not here: one rank);
- ``FLASHINFER_MLA_SPARSE_SM120`` (``FlashInferMLASparseSM120Backend``):
  ``FlashInferMLASparseMetadataBuilder`` itself.

Both are ``SparseMLACommonMetadataBuilder`` with the reorder threshold of the head
count (``FlashInferMLASparseMetadataBuilder.__init__``: 128 for 8 to 32 heads, 256 for
64, 1024 otherwise, speculative decodes as decodes) and FULL graphs of uniform batches
(``AttentionCGSupport.UNIFORM_BATCH``), so the metadata is the FlashMLA sparse engine's
(``sparse.*``: each token's request, the decodes' ``seq_lens`` and block table, the
prefills' query offsets), read by the same kernels' contract
(``FlashInferMLASparseImpl.forward_mqa`` converts a token's top-k positions to slots
through its request's block-table row, ``triton_convert_req_index_to_global_index``).
Nothing is stood in: neither builder calls FlashInfer.

The model is the FlashMLA sparse engine's (its KV cache bf16), made one each backend
accepts (``supports_combination``): ``qk_nope_head_dim`` 128 (the TRT-LLM kernel's
128 or 192) and the sparse engine's ``index_topk`` 64; for SM120 ``index_topk`` 2048,
its only one. The model's 2 heads a rank give the threshold 1024 (the table's value
for a count it does not list); a DeepSeek-V3.2 rank's 16 give 128, the same split on
every step of fewer than 128 tokens (the default scale's steps).

Declined: the FlashMLA sparse engine's cases, with the backend's own page sizes:
multiples of 32 for the TRT-LLM backend, of 64 for SM120
(``get_supported_kernel_block_sizes``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any

from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_sparse_mla as sparse
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

_FLASHINFER_SPARSE = "vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py"
QK_NOPE_HEAD_DIM = 128  # DeepSeek-V3.2's, one the TRT-LLM sparse kernel takes


def prepare() -> None:
    """Import vLLM's V1 runner and both FlashInfer sparse MLA backends before a judge
    forks."""
    sparse.prepare()
    _trtllm()
    _sm120()


@functools.cache
def _trtllm() -> type:
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import (
        FlashInferMLASparseTRTLLMBackend,
    )

    return FlashInferMLASparseTRTLLMBackend


@functools.cache
def _sm120() -> type:
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse import (
        FlashInferMLASparseSM120Backend,
    )

    return FlashInferMLASparseSM120Backend


def _declines_pages(config: EngineConfig, page: int, backend: str) -> str | None:
    if config.runner == "v1" and not config.varlen_decode and config.block_size % page:
        return (
            f"block_size {config.block_size}: {backend}'s pages are multiples of {page} "
            f"({_FLASHINFER_SPARSE} {backend}.get_supported_kernel_block_sizes)"
        )
    return None


def declines(case: Case) -> str | None:
    """Why the TRT-LLM engine does not run ``case``: the FlashMLA sparse engine's cases
    (whose pages, multiples of 64, are multiples of this backend's 32)."""
    return declines_config(case.config) or mla.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    return _declines_pages(config, 32, "FlashInferMLASparseTRTLLMBackend") or (
        mla.declines_config(config)
    )


def declines_sm120(case: Case) -> str | None:
    """Why the SM120 engine does not run ``case``: its pages are multiples of 64."""
    return declines_config_sm120(case.config) or mla.declines(case)


def declines_config_sm120(config: EngineConfig) -> str | None:
    """:func:`declines_sm120` of an engine of ``config`` alone."""
    return _declines_pages(config, 64, "FlashInferMLASparseSM120Backend") or (
        mla.declines_config(config)
    )


class _TRTLLMEngine(sparse._SparseMLAEngine):
    """A V1 runner of a sparse-attention MLA model on FlashInfer's TRT-LLM sparse MLA."""

    backend = staticmethod(_trtllm)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # neither builder reads the GPU

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        # FlashInferMLASparseTRTLLMBackend.supports_combination: a RoPE model's
        # qk_nope_head_dim is 128 or 192 (DeepSeek's 128), on this engine's copy.
        vc.model_config = copy.copy(vc.model_config)
        vc.model_config.hf_text_config = copy.copy(vc.model_config.hf_text_config)
        vc.model_config.hf_text_config.qk_nope_head_dim = QK_NOPE_HEAD_DIM
        return super().attention_group()


class TRTLLMRunnerStepEngine(sparse.SparseMLARunnerStepEngine):
    """``vllm-v1-flashmla-sparse``'s three engines, on FlashInfer's TRT-LLM sparse MLA."""

    engine_type = _TRTLLMEngine


class _SM120Engine(_TRTLLMEngine):
    """A V1 runner of a sparse-attention MLA model on FlashInfer's SM120 sparse MLA."""

    backend = staticmethod(_sm120)
    # FlashInferMLASparseSM120Backend.supports_combination: index_topk 2048 only (which
    # sizes the builder's chunked-prefill workspace and makes every prefill of this
    # engine's sizes a dense-MHA one: _use_dense_mha_prefill).
    index_topk = 2048


class SM120RunnerStepEngine(sparse.SparseMLARunnerStepEngine):
    """``vllm-v1-flashmla-sparse``'s three engines, on FlashInfer's SM120 sparse MLA."""

    engine_type = _SM120Engine


ENGINE = TRTLLMRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashinfer-mla-sparse`` of ``runner-step``."""
SM120 = SM120RunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashinfer-mla-sparse-sm120``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashinfer-mla-sparse`` of ``runner-step``: the step
    on :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


def run_sm120(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashinfer-mla-sparse-sm120`` of ``runner-step``: the
    step on :data:`SM120`, kept across calls; ``run_sm120.new_engine()`` drops it."""
    return SM120(inputs)


run_sm120.new_engine = SM120.new_engine  # type: ignore[attr-defined]
