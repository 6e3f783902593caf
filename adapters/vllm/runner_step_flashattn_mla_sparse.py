"""vLLM's model runner V1 step of a sparse-attention MLA model on FlashAttention's sparse
MLA backend, as the implementation ``vllm-v1-flashattn-mla-sparse`` of ``runner-step``.

The engine of :mod:`.runner_step_sparse_mla`, its MLA layer (and the MTP draft layer) on
``FLASH_ATTN_MLA_SPARSE`` (``FlashAttnMLASparseBackend`` of
``vllm/v1/attention/backends/mla/flashattn_mla_sparse.py``, an sm90 GPU's):
``FlashAttnMLASparseMetadataBuilder`` is ``SparseMLACommonMetadataBuilder`` with

- the reorder threshold of the head count (its ``__init__``: 128 for 16 or 32 heads,
  256 for 64, 128 and any other count, speculative decodes as decodes): the model's 2
  heads a rank give 256, a DeepSeek-V3.2 rank's 16 give 128, the same split on every
  step of fewer than 128 tokens (the default scale's steps);
- the drafter's in-place decode update enabled on one DCP rank
  (``supports_draft_decode_metadata_update``; only the V2 runner's speculator calls
  ``update_draft_decode_metadata``, the V1 drafter rebuilds);
- FULL graphs of uniform batches (``AttentionCGSupport.UNIFORM_BATCH``).

So the metadata is the FlashMLA sparse engine's (``sparse.*``), read by the same
contract: ``SparseMLACommonImpl`` turns a token's top-k positions into latent-cache rows
through its request's block-table row (``triton_convert_req_index_to_global_index``) and
``FlashAttnMLASparseImpl._forward_mqa_kernel`` hands those rows to FA3 as a one-token
block table.

Stood in: the package ``vllm.vllm_flash_attn`` for the backend module's import alone.
The module imports ``flash_attn_varlen_func`` from its ``flash_attn_interface``, and the
package's ``__init__`` raises ``ImportError`` where neither CUDA extension
(``_vllm_fa2_C``, ``_vllm_fa3_C``) is built, as on a CPU. The stand-in is the package
without that check; ``flash_attn_interface`` is vLLM's own (it imports here, its kernels
unavailable). Only the layer's ``impl``, never made here, calls the kernel; the builder
calls no FlashAttention function.

Declined: the FlashMLA sparse engine's cases, with the backend's pages, multiples of 64
(``get_supported_kernel_block_sizes``). Its ``supports_combination`` (bf16 cache, no
DCP, a model with ``index_topk``) holds for every engine here.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Iterator
from typing import Any

from attnfuzz.adapters.standins import in_sys_modules
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_sparse_mla as sparse
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

_FLASHATTN_SPARSE = "vllm/v1/attention/backends/mla/flashattn_mla_sparse.py"


def prepare() -> None:
    """Import vLLM's V1 runner and FlashAttention's sparse MLA backend before a judge
    forks."""
    sparse.prepare()
    _backend()


@contextlib.contextmanager
def fa_package() -> Iterator[None]:
    """``vllm.vllm_flash_attn`` importable without its CUDA extensions: the package
    (its submodules vLLM's own) without ``__init__``'s check that one is built."""
    import vllm

    package = types.ModuleType("vllm.vllm_flash_attn")
    package.__path__ = [f"{vllm.__path__[0]}/vllm_flash_attn"]
    with in_sys_modules({"vllm.vllm_flash_attn": package}):
        yield


@functools.cache
def _backend() -> type:
    with fa_package():
        from vllm.v1.attention.backends.mla.flashattn_mla_sparse import (
            FlashAttnMLASparseBackend,
        )

    return FlashAttnMLASparseBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: the FlashMLA sparse engine's cases."""
    return declines_config(case.config) or mla.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % 64:
        return (
            f"block_size {config.block_size}: FlashAttnMLASparseBackend's pages are "
            f"multiples of 64 ({_FLASHATTN_SPARSE} get_supported_kernel_block_sizes)"
        )
    return mla.declines_config(config)


class _FlashAttnEngine(sparse._SparseMLAEngine):
    """A V1 runner of a sparse-attention MLA model on FlashAttention's sparse MLA."""

    backend = staticmethod(_backend)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the builder reads nothing of the GPU


class FlashAttnRunnerStepEngine(sparse.SparseMLARunnerStepEngine):
    """``vllm-v1-flashmla-sparse``'s three engines, on FlashAttention's sparse MLA."""

    engine_type = _FlashAttnEngine


ENGINE = FlashAttnRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashattn-mla-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashattn-mla-sparse`` of ``runner-step``: the step
    on :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
