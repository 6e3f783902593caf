"""vLLM's model runner V1 step of an Inkling model, whose short convolutions keep their
state in a sliding-window KV cache, as the implementations ``vllm-v1-inkling`` (CUDA)
and ``vllm-v1-inkling-rocm`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, whose decoder layer also owns an
``InklingConvState`` (``vllm/models/inkling/{nvidia,amd}/sconv_swa_attn.py``, made by
its own constructor as the model's decoder layer makes it, one tensor-parallel rank):
the layer's four short-convolution streams packed into one ``SlidingWindowSpec`` whose
block and window are the convolution's kernel size (4 tokens), a KV-cache group of its
own on ``InklingSconvBackend``. ``InklingSconvMetadataBuilder`` builds that group's
metadata on every step, capture run and draft build: the group's block table and slot
mapping (the runner's, of 4-token blocks) and, by ``sconv_seq_metadata`` (a Triton
kernel, run here under Triton's interpreter), each token's request (``seq_idx``) and
its request's first row (``query_start``), the padded tokens' zero ("Padded rows are
filled with zero and must have ``slot_mapping == -1``"). Its graphs are
``UNIFORM_BATCH`` (a FULL mode becomes FULL_AND_PIECEWISE).

The consumer is the fused short-convolution kernel (``ops/sconv.py``): a token's taps
of earlier tokens of the same forward are read from the rows its ``query_start`` and
``seq_idx`` name, the others from the cache through its request's block-table row; it
stores each token's state at its slot (-1: none). Fields, beside ``vllm-v1``'s:
``sconv.seq_idx`` (a row of the step's requests), ``sconv.query_start`` (a token row),
``sconv.slot_mapping`` (a slot of the group's blocks, or -1; a padding token's no real
token's, ``writes_state``) and ``sconv.block_table`` (a block of the pool, the first
``cdiv(seq_len, 4)`` of a row read).

The scheduler's pages are the trace's (16 tokens and up): the group's blocks of 4 tokens
are each page's four quarters, ids ``4 * page`` to ``4 * page + 3`` of a pool four times
the attention's, given with the page. vLLM's sliding-window manager also frees the blocks
a window has passed (``remove_skipped_blocks``, the null block in their place): not
modelled; the kernel reads none of them.

Declined: ``vllm-v1``'s cases, and pages that are not whole blocks of 4.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any
from unittest import mock

import numpy as np
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_SCONV = "vllm/models/inkling/{}/sconv_swa_attn.py"
KERNEL_SIZE = 4  # the short convolution's taps (sconv_kernel_size): its block and window
CONV_LAYER = "model.layers.0.conv_state"
NUM_KV_HEADS, HEAD_DIM, HIDDEN_SIZE = 1, 8, 16  # size the packed state, reach no metadata


def prepare() -> None:
    """Import vLLM's V1 runner and both Inkling short-convolution backends before a
    judge forks."""
    v1.prepare()
    _module("nvidia")
    _module("amd")


@functools.cache
def _module(platform: str) -> ModuleType:
    return importlib.import_module(f"vllm.models.inkling.{platform}.sconv_swa_attn")


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and pages that are
    not whole convolution blocks."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % KERNEL_SIZE:
        return (
            f"block_size {config.block_size}: a page must hold whole convolution blocks of "
            f"{KERNEL_SIZE} tokens (attnfuzz gives each page's quarters to the sconv group)"
        )
    return v1.declines_config(config)


def quarters(pages: list[int]) -> list[int]:
    """The convolution group's blocks of ``pages``: each page's four quarters."""
    return [4 * p + j for p in pages for j in range(4)]


class _InklingEngine(v1._Engine):
    """A V1 runner whose decoder layer owns an Inkling short-convolution state."""

    platform_name = "nvidia"

    def more_groups(self) -> list[tuple[type, str, Any]]:
        module = _module(self.platform_name)
        self.recorder.linear_layer = CONV_LAYER
        # One tensor-parallel rank (the constructor asks the group's size).
        with mock.patch.object(module, "get_tensor_model_parallel_world_size", lambda: 1):
            state = module.InklingConvState(
                num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, hidden_size=HIDDEN_SIZE,
                kernel_size=KERNEL_SIZE, prefix=CONV_LAYER,
            )  # fmt: skip
        return [(module.InklingSconvBackend, CONV_LAYER, state.get_kv_cache_spec(self.vllm_config))]

    def pool_size(self) -> int:
        return 4 * num_blocks(self.config)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # InklingSconvMetadataBuilder's UNIFORM_BATCH: FULL becomes FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def output(self, inputs: RunnerStepInputs) -> Any:
        """``vllm-v1``'s scheduler output, each page's quarters given to the convolution
        group with it."""
        out = super().output(inputs)
        for new in out.scheduled_new_reqs:
            new.block_ids = (*new.block_ids, quarters(list(new.block_ids[0])))
        cached = out.scheduled_cached_reqs
        for i, ids in enumerate(cached.new_block_ids):
            if ids is not None:
                cached.new_block_ids[i] = (*ids, quarters(list(ids[0])))
        return out

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        m = seen.linear
        if seen.meta is None or m is None:
            return out
        rows = max(len(v1._np(seen.meta.query_start_loc)) - 1, 1)
        tokens_pad = int(seen.positions.shape[0])
        pool = self.pool_size()
        seq_lens = v1._np(seen.meta.seq_lens).astype(np.int64)
        table = v1._np(m.block_table)
        return (
            *out,
            # ops/sconv.py: a token's taps in this forward are rows query_start.. of its
            # request seq_idx (a row of the step's requests) ...
            Field("sconv.seq_idx", "tokens", v1._np(m.seq_idx), (0, rows - 1)),
            Field("sconv.query_start", "tokens", v1._np(m.query_start), (0, tokens_pad)),
            # ... the others are read through its request's block-table row, a block of
            # the pool; the first cdiv(seq_len, 4) of a row are read ...
            Field("sconv.block_table", "requests", table, (0, pool - 1),
                  row_lengths=-(-seq_lens[: len(table)] // KERNEL_SIZE)),
            # ... and its state is stored at its slot (-1: none); a padding token's is no
            # real token's.
            Field("sconv.slot_mapping", "tokens", v1._np(m.slot_mapping),
                  (-1, pool * KERNEL_SIZE - 1), writes_state=True, null_slot=-1),
        )  # fmt: skip


class _RocmInklingEngine(_InklingEngine):
    """The same, on ROCm's builder (``models/inkling/amd``)."""

    platform_name = "amd"


class InklingRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of an Inkling model."""

    engine_type: type[v1._Engine] = _InklingEngine
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


class RocmInklingRunnerStepEngine(InklingRunnerStepEngine):
    """``vllm-v1``'s three engines, of an Inkling model on ROCm."""

    engine_type = _RocmInklingEngine


ENGINE = InklingRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-inkling`` of ``runner-step``."""
ROCM = RocmInklingRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-inkling-rocm``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-inkling`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


def run_rocm(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-inkling-rocm`` of ``runner-step``: the step on
    :data:`ROCM`, kept across calls; ``run_rocm.new_engine()`` drops it."""
    return ROCM(inputs)


run_rocm.new_engine = ROCM.new_engine  # type: ignore[attr-defined]
