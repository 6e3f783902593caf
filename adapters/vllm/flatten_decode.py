"""vLLM's flattened indexer decode metadata, as the implementation ``vllm`` of ``flatten-decode``.

``run`` calls the installed release's ``vllm/v1/attention/backends/mla/indexer.py``
``DeepseekV32IndexerMetadataBuilder.build`` unchanged, on vLLM's
``CommonAttentionMetadata`` of the step; with ``use_flattening`` it reaches
``_prepare_decode_tensors(use_native=False)``: the uniform branch (a
``@triton.jit`` kernel run under the Triton interpreter here:
``_prepare_uniform_decode_kernel``, from 0.30.0 ``_PREPARE_UNIFORM_DECODE_KERNEL``)
when every decode has the same length and the graph pads no token, else the
variable-length branch (``torch.repeat_interleave``). Every supported release
(0.21.0 to 0.33.0) has both.

``use_flattening``. The builder flattens where the paged logits kernel has no
native layout for the step: on this CPU platform for ``next_n > 2`` (0.33.0
``_use_flattening`` / ``_supports_native_decode``; 0.21.0 to 0.27.1 for
``next_n`` outside ``[1, 2]``), on CUDA also under adaptive verification
(SM90) or without a native kernel for that ``next_n``. The target judges the
flattening path for every ``next_n``, so where the platform's answer is False
the adapter sets the builder's ``use_flattening`` attribute, which is all
``build`` reads of that decision (the split rule and ``use_native``); the code
that runs after it is the same code. (On 0.21.0 ``__init__`` also sizes a
buffer by it: see :func:`._indexer_builder.flattening_class`.)

The expanded block table's width is the release's: from 0.27.0 (#50302) the
runner's 128-token-aligned width handed to ``__init__``; before, the builder's
own ``cdiv(max_model_len, block_size)``, narrower than the runner's table it
is handed (#46074, the bug #50302 fixed): on 0.21.0 to 0.26.0 ``run`` is the
shipped bug, and the target finds it.

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
from attnfuzz.adapters.vllm import _engine, _indexer_builder, compat
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.flatten_decode import (
    DecodeBuffers,
    FlattenDecodeInputs,
    FlattenDecodeOutputs,
    describe,
)


def prepare() -> None:
    """Import the indexer backend (and with it vLLM) and validate the base config."""
    import vllm.v1.attention.backends.mla.indexer  # noqa: F401

    _engine.prepare()


@lru_cache(maxsize=4)  # a few engine shapes at a time: every draw brings its own
def _builder(
    config: EngineConfig, device: str, upstream: str | None = None
) -> tuple[Any, Any, torch.Tensor]:
    """The engine's ``VllmConfig`` for ``config``, its indexer metadata builder
    (``upstream``: the class of an upstream mutant instead of the release's) and
    the buffer of per-request decode lengths (:func:`_per_request_lens`).

    From 0.27.0 ``block_table_width`` is what ``AttentionGroup.create_metadata_builders``
    (``vllm/v1/worker/utils.py``) passes: ``get_block_table_width`` of the spec's
    ``max_num_blocks_per_req``. Before, the builder sizes its table itself
    (:mod:`._indexer_builder`), and the runner's table it is handed is
    ``MultiGroupBlockTable``'s (0.26.0 ``v1/worker/block_table.py``: 128 tokens
    aligned), the width the case's table already has.
    """
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    vc = _engine.vllm_config(config)
    spec = MLAAttentionSpec(
        block_size=config.block_size, num_kv_heads=1, head_size=16, dtype=torch.uint8
    )
    width = 0  # unused where the builder takes no width
    if compat.has(compat.BUILDER_TABLE_WIDTH):
        from vllm.v1.worker.block_table import get_block_table_width

        width = get_block_table_width(
            spec.max_num_blocks_per_req(vc, vc.model_config.max_model_len), spec.block_size
        )
    cls = DeepseekV32IndexerMetadataBuilder if upstream is None else _upstream_classes()[upstream]
    builder = _indexer_builder.make(
        _indexer_builder.flattening_class(cls), spec, ["l0"], vc, width, torch.device(device)
    )
    if not builder.use_flattening:  # see the module docstring
        builder.use_flattening = True
    return vc, builder, _per_request_lens(builder)


def _per_request_lens(builder: Any) -> torch.Tensor:
    """The builder's ``per_req_decode_lens_buffer`` (0.30.0 on), or before that a
    buffer of the adapter's that records the same values as the release computes them.

    0.30.0 ``build`` keeps each decode's length in ``per_req_decode_lens_buffer
    [:num_decodes]``, a copy of ``decode_lens_buffer[:num_decodes]`` (``torch.diff``
    of ``query_start_loc``) made before flattening overwrites those rows with 1.
    Earlier releases compute the same ``decode_lens`` and hand it to
    ``_prepare_decode_tensors`` but keep no copy: the adapter copies that argument
    as the call receives it, then runs the release's method unchanged. So the
    per-request lengths judged on those releases are the release's own values; the
    buffer around them is the adapter's.
    """
    if hasattr(builder, "per_req_decode_lens_buffer"):
        return builder.per_req_decode_lens_buffer
    recorded = torch.zeros_like(builder.decode_lens_buffer)
    prepare = builder._prepare_decode_tensors

    def recording(*, decode_lens: torch.Tensor, num_decodes: int, **kwargs: Any) -> Any:
        recorded[:num_decodes].copy_(decode_lens[:num_decodes])
        return prepare(decode_lens=decode_lens, num_decodes=num_decodes, **kwargs)

    builder._prepare_decode_tensors = recording
    return recorded


def _buffers(builder: Any, per_request: torch.Tensor) -> DecodeBuffers:
    return DecodeBuffers(
        context_lens=builder.decode_seq_lens_buffer,
        block_table=builder.expanded_block_table_buffer,
        decode_lens=builder.decode_lens_buffer,
        per_req_decode_lens=per_request,
    )


def _run(inputs: FlattenDecodeInputs, upstream: str | None = None) -> FlattenDecodeOutputs:
    from vllm.config import set_current_vllm_config

    device = str(inputs.seq_lens.device)
    vc, builder, per_request = _builder(inputs.config, device, upstream)
    buffers = _buffers(builder, per_request)
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
        # 0.30.0 on: the metadata's view; before, the recorded lengths' (see above).
        per_req_decode_lens=getattr(decode, "per_req_decode_lens", None)
        if hasattr(builder, "per_req_decode_lens_buffer")
        else per_request[: metadata.num_decodes],
        requires_padding=decode.requires_padding,
        buffers=buffers,
    )


def declines(case: Case) -> str | None:
    """Why the installed release does not flatten ``case``'s step, else None.

    Before 0.28.0, ``_prepare_decode_tensors`` flattens only where ``not use_native
    and max_decode_len > 1`` (0.27.1 ``indexer.py``): a step whose decodes are one
    token each takes its plain branch and hands on the step's own ``seq_lens[:B]``
    and block-table rows (the runner's persistent buffers) with ``next_n == 1``,
    which is :mod:`.mtp_seq_lens`'s computation and is judged there. From 0.28.0
    (the release that also brought ``_supports_native_decode``) the flattening
    branch takes every decode step.
    """
    if compat.has(compat.NATIVE_DECODE):
        return None
    split = describe(case)[1]
    if split.num_decodes == 0 or max(split.decode_lens) > 1:
        return None
    return (
        f"vLLM {compat.installed_version()} flattens no step whose decodes are one token "
        "each (_prepare_decode_tensors: max_decode_len > 1; from 0.28.0 it does): "
        "its plain branch is judged by mtp-seq-lens"
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
        ``cdiv(max_model_len, block_size * get_kv_cache_shard_count())`` columns,
        while the runner's block table is aligned to 128 tokens.

        The lines that differ from the installed release (0.27.0 on): it allocates
        ``expanded_block_table_buffer`` with the ``block_table_width`` the runner
        passes; the last release before the fix (0.26.0 ``v1/attention/backends/
        mla/indexer.py:DeepseekV32IndexerMetadataBuilder.__init__``) took no such
        argument and allocated

            max_num_blocks_per_req = cdiv(
                self.vllm_config.model_config.max_model_len,
                self.kv_cache_spec.block_size * get_kv_cache_shard_count(),
            )
            self.expanded_block_table_buffer = torch.zeros(
                (
                    scheduler_config.max_num_batched_tokens,
                    max_num_blocks_per_req,
                ),
                dtype=torch.int32,
                device=self.device,
            )

        (0.21.0 to 0.25.1: ``get_total_cp_world_size()``). Here there is no context
        parallelism, so the divisor is the block size. Everything else is the
        installed release's code. On a release before the fix there is nothing to
        revert: ``run`` is the pre-fix code itself, and this mutant is unavailable.
        """

        def __init__(self, *args: Any, block_table_width: int, **kwargs: Any) -> None:
            super().__init__(*args, block_table_width=block_table_width, **kwargs)
            max_num_blocks_per_req = cdiv(
                self.vllm_config.model_config.max_model_len,
                self.kv_cache_spec.block_size * 1,  # get_kv_cache_shard_count() without CP
            )
            self.expanded_block_table_buffer = torch.zeros(
                (self.vllm_config.scheduler_config.max_num_batched_tokens, max_num_blocks_per_req),
                dtype=torch.int32,
                device=self.device,
            )

    return {"pr50302": PreFix50302Builder}


def upstream_unaligned_width(inputs: FlattenDecodeInputs) -> FlattenDecodeOutputs:
    """The installed vLLM (0.27.0 on) with #50302 reverted: the expanded block table one alignment
    narrower than the runner's table. Ragged decodes raise in the variable
    branch (``The expanded size of the tensor (W) must match the existing size
    (W_aligned)``), uniform ones return a table of the wrong width."""
    return _run(inputs, "pr50302")
