"""vLLM's flattened indexer decode metadata, as the implementation ``vllm`` of ``flatten-decode``.

``run`` calls ``vllm/v1/attention/backends/mla/indexer.py``
``DeepseekV32IndexerMetadataBuilder.build`` unchanged, on vLLM's
``CommonAttentionMetadata`` of the step; with ``use_flattening`` it reaches
``_prepare_decode_tensors(use_native=False)``: the uniform branch
(``_PREPARE_UNIFORM_DECODE_KERNEL``, a ``@triton.jit`` kernel run under the
Triton interpreter here) when every decode has the same length and the graph
pads no token, else the variable-length branch (``torch.repeat_interleave``).

``use_flattening``. ``_use_flattening`` is true where the paged logits kernel
has no native layout for the step: on this CPU platform for ``next_n > 2``
(``_supports_native_decode``), on CUDA also for other ``next_n`` under
adaptive verification (SM90) or without a native kernel for that ``next_n``.
The target judges the flattening path for every ``next_n``, so where the
platform's answer is False the adapter sets the builder's ``use_flattening``
attribute, which is all ``build`` reads of that decision (the split rule and
``use_native``); the code that runs after it is the same code.

One builder per engine config, as the engine keeps one per layer group for its
life; before every step its four persistent decode buffers are filled with
what the case says they hold (stale content of earlier steps), and the
outputs are the views ``build`` returns with those buffers.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  - sets TRITON_INTERPRET before vLLM is imported
import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.flatten_decode import (
    DecodeBuffers,
    FlattenDecodeInputs,
    FlattenDecodeOutputs,
)


def prepare() -> None:
    """Import the indexer backend (and with it vLLM) and validate the base config."""
    import vllm.v1.attention.backends.mla.indexer  # noqa: F401

    _engine.prepare()


@cache
def _builder(config: EngineConfig, device: str) -> tuple[Any, Any]:
    """The engine's ``VllmConfig`` for ``config`` and its indexer metadata builder."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    vc = _engine.vllm_config(config)
    spec = MLAAttentionSpec(
        block_size=config.block_size, num_kv_heads=1, head_size=16, dtype=torch.uint8
    )
    with set_current_vllm_config(vc):
        builder = DeepseekV32IndexerMetadataBuilder(
            spec, ["l0"], vc, torch.device(device), block_table_width=config.max_blocks_per_seq
        )
    if not builder.use_flattening:  # see the module docstring
        builder.use_flattening = True
    return vc, builder


def _buffers(builder: Any) -> DecodeBuffers:
    return DecodeBuffers(
        context_lens=builder.decode_seq_lens_buffer,
        block_table=builder.expanded_block_table_buffer,
        decode_lens=builder.decode_lens_buffer,
        per_req_decode_lens=builder.per_req_decode_lens_buffer,
    )


def run(inputs: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """``DeepseekV32IndexerMetadataBuilder.build`` with flattening, unchanged."""
    from vllm.config import set_current_vllm_config

    device = str(inputs.seq_lens.device)
    vc, builder = _builder(inputs.config, device)
    buffers = _buffers(builder)
    for own, stale in zip(buffers.tensors(), inputs.buffers.tensors(), strict=True):
        own.copy_(stale)  # the persistent buffers as the step finds them
    common = _engine.common_attn_metadata(inputs.common, device)
    with set_current_vllm_config(vc):
        metadata = builder.build(0, common)
    decode = metadata.decode
    if decode is None:
        return FlattenDecodeOutputs(None, None, None, None, False, buffers)
    return FlattenDecodeOutputs(
        context_lens=decode.seq_lens,
        block_table=decode.block_table,
        decode_lens=decode.decode_lens,
        per_req_decode_lens=decode.per_req_decode_lens,
        requires_padding=decode.requires_padding,
        buffers=buffers,
    )
