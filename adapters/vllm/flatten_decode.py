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

from functools import cache, lru_cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401  - sets TRITON_INTERPRET before vLLM is imported
import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.harness.blame import under_test
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


@lru_cache(maxsize=4)  # a few engine shapes at a time: every draw brings its own
def _builder(config: EngineConfig, device: str, upstream: str | None = None) -> tuple[Any, Any]:
    """The engine's ``VllmConfig`` for ``config`` and its indexer metadata builder
    (``upstream``: the class of an upstream mutant instead of 0.33.0's).

    ``block_table_width`` is what ``AttentionGroup.create_metadata_builders``
    (``vllm/v1/worker/utils.py``) passes: ``get_block_table_width`` of the
    spec's ``max_num_blocks_per_req``.
    """
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    from vllm.v1.worker.block_table import get_block_table_width

    vc = _engine.vllm_config(config)
    spec = MLAAttentionSpec(
        block_size=config.block_size, num_kv_heads=1, head_size=16, dtype=torch.uint8
    )
    width = get_block_table_width(
        spec.max_num_blocks_per_req(vc, vc.model_config.max_model_len), spec.block_size
    )
    cls = DeepseekV32IndexerMetadataBuilder if upstream is None else _upstream_classes()[upstream]
    with set_current_vllm_config(vc):
        builder = cls(spec, ["l0"], vc, torch.device(device), block_table_width=width)
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


def _run(inputs: FlattenDecodeInputs, upstream: str | None = None) -> FlattenDecodeOutputs:
    from vllm.config import set_current_vllm_config

    device = str(inputs.seq_lens.device)
    vc, builder = _builder(inputs.config, device, upstream)
    buffers = _buffers(builder)
    for own, stale in zip(buffers.tensors(), inputs.buffers.tensors(), strict=True):
        if own.shape == stale.shape:  # an upstream mutant's buffer of another shape stays as is
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


def run(inputs: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """``DeepseekV32IndexerMetadataBuilder.build`` with flattening, unchanged."""
    return _run(inputs)


@cache
def _upstream_classes() -> dict[str, type]:
    from vllm.utils.math_utils import cdiv
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

    @under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
    class PreFix50302Builder(DeepseekV32IndexerMetadataBuilder):
        """The builder before #50302 ("Universally align block table width to 128
        tokens", fixes #46074): the indexer sized its expanded block table itself,
        ``cdiv(max_model_len, block_size * get_total_cp_world_size())`` columns,
        while the runner's block table is aligned to 128 tokens.

        The lines that differ from 0.33.0: 0.33.0 allocates
        ``expanded_block_table_buffer`` with the ``block_table_width`` the runner
        passes; before the fix ``__init__`` took no such argument and allocated

            max_num_blocks_per_req = cdiv(
                self.vllm_config.model_config.max_model_len,
                self.kv_cache_spec.block_size * get_total_cp_world_size(),
            )
            self.expanded_block_table_buffer = torch.zeros(
                (scheduler_config.max_num_batched_tokens, max_num_blocks_per_req),
                dtype=torch.int32, device=self.device)

        Reconstructed, not copied from the pre-fix file: the formula is quoted in
        the descriptions of the superseded fixes #48404 and #50050 and in a
        third-party incident report of the same crash; no copy of the pre-fix
        ``indexer.py`` was found in the stored sources. Here CP is 1, so the
        divisor is the block size. Everything else is 0.33.0's code.
        """

        def __init__(self, *args: Any, block_table_width: int, **kwargs: Any) -> None:
            super().__init__(*args, block_table_width=block_table_width, **kwargs)
            max_num_blocks_per_req = cdiv(
                self.vllm_config.model_config.max_model_len,
                self.kv_cache_spec.block_size * 1,  # get_total_cp_world_size() without CP
            )
            self.expanded_block_table_buffer = torch.zeros(
                (self.vllm_config.scheduler_config.max_num_batched_tokens, max_num_blocks_per_req),
                dtype=torch.int32,
                device=self.device,
            )

    return {"pr50302": PreFix50302Builder}


def upstream_unaligned_width(inputs: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """vLLM 0.33.0 with #50302 reverted: the expanded block table one alignment
    narrower than the runner's table. Ragged decodes raise in the variable
    branch (``The expanded size of the tensor (W) must match the existing size
    (W_aligned)``), uniform ones return a table of the wrong width."""
    return _run(inputs, "pr50302")
