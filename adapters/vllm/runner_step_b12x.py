"""vLLM's model runner V1 step on the b12x paged attention backend, as the implementation
``vllm-v1-b12x`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
vLLM's ``B12X`` backend (``vllm/v1/attention/backends/b12x.py``, an SM120 GPU's paged GQA
attention), 1 KV head of 128, bf16 (``supports_combination``: bf16 queries only). Its
KV-cache spec is the one the runner's ``get_kv_cache_spec`` makes of the layer's
(``customize_attention_spec``: ``B12xPagedAttentionBackend.customize_spec``'s separate K
and V planes, two head slots a token; the block stride aligned to 128 tokens).
``B12xPagedMetadataBuilder.build`` hands the kernels the runner's common metadata as it
is (query offsets, ``seq_lens``, block table, slot mapping, ``causal``), and its FULL
graphs are of uniform batches (``UNIFORM_BATCH``: a FULL mode becomes
FULL_AND_PIECEWISE), so the fields are ``vllm-v1``'s, of the same meaning:
``B12xPagedAttentionImpl.forward`` reads request ``i``'s first ``seq_lens[i]`` keys
through its block-table row. Nothing is stood in (the builder calls no b12x code).

Declined: ``vllm-v1``'s cases, and pages the backend has no kernel block for: its
kernel pages are 64 or 128 tokens (``_B12X_SUPPORTED_PAGE_SIZES``,
``get_supported_kernel_block_sizes``), so a page must be a multiple of 64
(``prepare_kernel_block_sizes`` splits a larger one into kernel blocks).
"""

from __future__ import annotations

import functools
from typing import Any

from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

_B12X = "vllm/v1/attention/backends/b12x.py"
HEAD_SIZE = 128  # one of B12xPagedAttentionBackend.get_supported_head_sizes


def prepare() -> None:
    """Import vLLM's V1 runner and the b12x backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.b12x import B12xPagedAttentionBackend

    return B12xPagedAttentionBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and pages that are not
    a multiple of the backend's smallest kernel page (64)."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % 64:
        return (
            f"block_size {config.block_size}: b12x's kernel pages are 64 or 128 tokens "
            f"({_B12X} B12xPagedAttentionBackend.get_supported_kernel_block_sizes)"
        )
    return v1.declines_config(config)


class _B12xEngine(v1._Engine):
    """A V1 runner whose attention layer is on the b12x backend."""

    def attention_group(self) -> tuple[type, Any]:
        from vllm.v1.worker.utils import customize_attention_spec

        backend, spec = v1.bf16_attention_group(
            self.vllm_config, self.config, _backend(), HEAD_SIZE
        )
        # The layer's spec as the runner's get_kv_cache_spec makes it: the backend's
        # (K and V in separate planes of the page), its block stride aligned to the
        # largest kernel page.
        return backend, customize_attention_spec(backend, spec)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # B12xPagedMetadataBuilder's UNIFORM_BATCH support:
        # _check_and_update_cudagraph_mode turns FULL into FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode


class B12xRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the b12x backend."""

    engine_type = _B12xEngine


ENGINE = B12xRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-b12x`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-b12x`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
