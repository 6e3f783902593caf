"""vLLM's own builder as the implementation ``vllm`` of ``mtp-seq-lens``, and bug B upstream.

:func:`run` builds vLLM 0.33.0's ``DeepseekV32IndexerMetadataBuilder``
(``vllm/v1/attention/backends/mla/indexer.py``) for the case's engine, with the
persistent buffers its ``__init__`` allocates, calls its ``build`` unchanged on
the step's ``CommonAttentionMetadata``, and returns the decode metadata's
per-token context lengths (``decode.seq_lens``) with the buffer they live in
and the path vLLM took:

- the builder is cached per engine (as an engine keeps one per KV-cache
  group), so its ``decode_seq_lens_buffer`` is persistent across steps; before
  each step it is loaded with the step's stale ``workspace[:n]``, which is how
  the target checks that the step writes nothing but the lengths
  (``reference/mtp_seq_lens.py``, :class:`MtpSeqLensOutputs`);
- the step's ``seq_lens`` handed to vLLM is the inputs' own tensor (the model
  runner's persistent buffer): with ``next_n == 1`` vLLM passes a view of it
  through as the lengths;
- on the CPU platform vLLM takes the native path for ``next_n`` in ``(1, 2)``
  and flattens beyond (``_supports_native_decode``); :func:`run` reports the
  path with vLLM's own ``use_native`` expression.

What runs interpreted: ``build`` is called whole, so its ``@triton.jit`` kernels
run under the Triton interpreter: the prefill chunks' metadata
(``BuildPrefillChunkMetadataKernel``, steps with prefills) and the flattening
path's uniform decodes (``_PREPARE_UNIFORM_DECODE_KERNEL``); they take most of
a case's time. The native path itself is torch ops only.

The upstream mutants (:func:`upstream_strided`, :func:`upstream_copy`) are the
same builder with #42135 reverted, subclassed so that only the reverted lines
differ from 0.33.0 (see each class).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from functools import cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401 - TRITON_INTERPRET=1 before vLLM imports Triton
import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.mtp_seq_lens import (
    FLATTENING,
    NATIVE,
    MtpSeqLensInputs,
    MtpSeqLensOutputs,
)

# A builder allocates O(max_num_batched_tokens * block-table width) of buffers:
# keep the few engines a run is drawing from, not every one it ever drew.
_CACHE_SIZE = 16
_builders: OrderedDict[tuple[type, EngineConfig, str], Any] = OrderedDict()


def prepare() -> None:
    """Import vLLM's indexer and build one builder, before any judge forks."""
    _engine.prepare()
    warm = EngineConfig(max_model_len=64, max_num_seqs=4, max_num_batched_tokens=8, block_size=4)
    _builder(_builder_class(), warm, torch.device("cpu"))


def _builder_class() -> type:
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

    return DeepseekV32IndexerMetadataBuilder


def _builder(cls: type, config: EngineConfig, device: torch.device) -> Any:
    """The builder of ``cls`` for ``config``, made once (its buffers are persistent)."""
    key = (cls, config, str(device))
    builder = _builders.get(key)
    if builder is None:
        from vllm.config import set_current_vllm_config
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        vllm_config = _engine.vllm_config(config)
        # The indexer's KV cache: one head of uint8 (fp8 keys and their scales).
        spec = MLAAttentionSpec(
            block_size=config.block_size, num_kv_heads=1, head_size=16, dtype=torch.uint8
        )
        with set_current_vllm_config(vllm_config):
            builder = cls(
                spec,
                ["model.layers.0.self_attn.indexer.k_cache"],
                vllm_config,
                device,
                block_table_width=config.max_blocks_per_seq,
            )
        _builders[key] = builder
        while len(_builders) > _CACHE_SIZE:
            _builders.popitem(last=False)
    else:
        _builders.move_to_end(key)
    return builder


def takes_native_path(config: EngineConfig) -> bool:
    """Whether vLLM, on this platform, builds the native ``[B, L]`` table for steps of
    ``config`` (``indexer.py``: ``build``'s ``use_native`` for ``max_decode_len <= next_n``)."""
    from vllm.v1.attention.backends.mla import indexer

    vllm_config = _engine.vllm_config(config)
    return not (indexer._use_flattening(vllm_config) or indexer._supports_varlen_paged_mqa_logits())


def _path(builder: Any, max_decode_len: int) -> str:
    """The path ``build`` took: its own ``use_native`` expression (vLLM 0.33.0)."""
    from vllm.v1.attention.backends.mla.indexer import _supports_native_decode

    next_n = 1 + builder.num_speculative_tokens
    use_native = (
        not (builder.use_flattening or builder.supports_varlen)
        and max_decode_len <= next_n
        and (max_decode_len <= 1 or _supports_native_decode(max_decode_len))
    )
    return NATIVE if use_native else FLATTENING


def _run(cls: type, inputs: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    device = inputs.workspace.device
    builder = _builder(cls, inputs.config, device)
    buffer = builder.decode_seq_lens_buffer
    # Stale content of earlier steps: the step's workspace, as the target's contract says.
    buffer.view(-1).copy_(inputs.workspace[: buffer.numel()])
    common = dataclasses.replace(
        _engine.common_attn_metadata(inputs.common, device), seq_lens=inputs.seq_lens
    )
    metadata = builder.build(0, common)
    if metadata.decode is None:  # no decodes: no table (the empty [0, 0] one)
        return MtpSeqLensOutputs(buffer.view(-1)[:0].view(0, 0), buffer)
    lens = metadata.decode.seq_lens
    return MtpSeqLensOutputs(lens, buffer, _path(builder, metadata.decode.write_max_decode_len))


def run(inputs: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """vLLM 0.33.0's ``DeepseekV32IndexerMetadataBuilder.build``, unchanged."""
    return _run(_builder_class(), inputs)


# -- upstream #42135 ------------------------------------------------------------------
#
# Before #42135 the native path kept its lengths in a [max_num_seqs, next_n] table
# and handed on the slice [:B, :L]: not contiguous when B >= 2 and L < next_n, and
# DeepGEMM's paged MQA logits metadata asserted ``context_lens.is_contiguous()``.
# The pre-fix lines below are copied from vllm-project/vllm's indexer.py as it read
# before the merge (``__init__``'s "Native MTP: 2D buffer for per-token seq_lens" and
# ``_prepare_decode_tensors``'s ``dim() == 2`` branch), which #42135's description
# names ("used to slice the 2D decode_seq_lens_buffer as [:, :max_decode_len]"). The
# clamp at 0 of 0.33.0 came after #42135 (the merged flat view had none) and is
# kept, so that each mutant differs from 0.33.0 in #42135's lines only.


@cache
def _strided_class() -> type:
    @under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
    class PrefixStridedBuilder(_builder_class()):  # type: ignore[misc]
        """0.33.0's builder with the pre-#42135 2-D table. Differs from 0.33.0 in
        ``__init__``'s allocation of ``decode_seq_lens_buffer`` (``[max_num_seqs,
        next_n]`` on the native MTP path) and, in ``_prepare_decode_tensors``'s native
        ``next_n > 1`` branch, in the ``dim() == 2`` assert, the write into
        ``[:num_decodes, :max_decode_len]`` and that slice handed on."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            scheduler_config = self.vllm_config.scheduler_config
            next_n = self.num_speculative_tokens + 1
            if not self.use_flattening and next_n > 1:
                # Native MTP: 2D buffer for per-token seq_lens. (pre-#42135)
                self.decode_seq_lens_buffer = torch.zeros(
                    (scheduler_config.max_num_seqs, next_n),
                    dtype=torch.int32,
                    device=self.device,
                )

        def _prepare_decode_tensors(
            self,
            seq_lens: torch.Tensor,
            block_table: torch.Tensor,
            decode_lens: torch.Tensor,
            decode_lens_cpu: torch.Tensor,
            query_start_loc: torch.Tensor,
            num_decodes: int,
            num_decode_tokens: int,
            use_native: bool,
            next_n: int,
            max_decode_len: int,
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, bool]:
            if not (use_native and next_n > 1):  # every other path: 0.33.0's own
                return super()._prepare_decode_tensors(
                    seq_lens, block_table, decode_lens, decode_lens_cpu, query_start_loc,
                    num_decodes, num_decode_tokens, use_native, next_n, max_decode_len,
                )  # fmt: skip
            # 0.33.0's native branch, its #42135 lines reverted:
            min_decode_len = int(decode_lens_cpu.min().item())
            requires_padding = min_decode_len != max_decode_len
            assert self.decode_seq_lens_buffer.dim() == 2  # pre-#42135
            self.decode_seq_lens_buffer[:num_decodes, :max_decode_len] = (  # pre-#42135
                seq_lens.unsqueeze(1) - max_decode_len + 1 + self.offsets_buffer[:max_decode_len]
            ).clamp_(min=0)
            seq_lens = self.decode_seq_lens_buffer[:num_decodes, :max_decode_len]  # pre-#42135
            return seq_lens, block_table, decode_lens, num_decodes, requires_padding

    return PrefixStridedBuilder


@cache
def _copy_class() -> type:
    @under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
    class FirstFixCopyBuilder(_strided_class()):  # type: ignore[misc]
        """#42135's first commit on top of the 2-D table: ``seq_lens =
        seq_lens.contiguous()`` on what ``_prepare_decode_tensors`` returned (the
        review noted that a copy per step cannot be captured in a graph, and the flat
        buffer was merged instead). That commit placed the line in ``build``, under
        ``if current_platform.is_cuda() and has_deep_gemm():`` before
        ``get_paged_mqa_logits_metadata``, a branch the CPU platform never enters;
        here it runs right after ``_prepare_decode_tensors``, which every platform
        reaches. Between the two places ``build`` changes nothing a step of this
        target has (no DCP, no KV compression; a 1-D plain-decode result is only
        unsqueezed, which keeps it contiguous), so the metadata gets the same tensor."""

        def _prepare_decode_tensors(
            self, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, bool]:
            seq_lens, *rest = super()._prepare_decode_tensors(*args, **kwargs)
            return (seq_lens.contiguous(), *rest)  # #42135's first fix

    return FirstFixCopyBuilder


def upstream_strided(inputs: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """vLLM 0.33.0's builder before #42135: the 2-D table's slice ``[:B, :L]``."""
    return _run(_strided_class(), inputs)


def upstream_copy(inputs: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """#42135's first fix: that slice made ``.contiguous()``, new storage every step."""
    return _run(_copy_class(), inputs)
