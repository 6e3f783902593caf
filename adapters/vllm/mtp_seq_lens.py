"""vLLM's own builder as the implementation ``vllm`` of ``mtp-seq-lens``, and bug B upstream.

:func:`run` builds the installed release's ``DeepseekV32IndexerMetadataBuilder``
(``vllm/v1/attention/backends/mla/indexer.py``; every supported release has
it) for the case's engine, with the persistent buffers its ``__init__``
allocates, calls its ``build`` unchanged on the step's
``CommonAttentionMetadata``, and returns the decode metadata's per-token context
lengths (``decode.seq_lens``) with the buffer they live in and the path vLLM
took:

- the builder is cached per engine (as an engine keeps one per KV-cache
  group), so its ``decode_seq_lens_buffer`` is persistent across steps; before
  each step it is loaded with the step's stale ``workspace[:n]``, which is how
  the target checks that the step writes nothing but the lengths
  (``reference/mtp_seq_lens.py``, :class:`MtpSeqLensOutputs`);
- the step's ``seq_lens`` handed to vLLM is the inputs' own tensor (the model
  runner's persistent buffer): with ``next_n == 1`` vLLM passes a view of it
  through as the lengths;
- on the CPU platform vLLM takes the native path for ``next_n`` in ``(1, 2)``
  and flattens beyond; :func:`run` reports the path with the installed
  release's own ``use_native`` expression (:func:`_path`).

What differs between releases, bound by what the release offers:

- making the builder (:mod:`._indexer_builder`): from 0.27.0 the runner
  passes the block table's width, ``block_table_width=``; before, ``__init__``
  sizes its expanded block table itself, ``cdiv(max_model_len, block_size *
  cp world size)``: the same width, ``max_blocks_per_seq``, on one rank.
  Before 0.23.0 the CPU platform has no ``num_compute_units`` (it sizes a
  CUDA-only buffer): the later CPU platform's answer stands in;
- the path: from 0.28.0 ``build`` also asks ``_supports_native_decode`` of
  each step's ``max_decode_len``; before, ``use_native`` is ``not
  self.use_flattening and max_decode_len <= next_n`` and
  ``_prepare_decode_tensors`` flattens only steps with ``max_decode_len > 1``;
- the lengths themselves are whatever the release computes: 0.21.0 keeps them
  in the ``[max_num_seqs, next_n]`` table sliced ``[:B, :L]`` (#42135, fixed
  in 0.22.0), and releases before 0.28.0 do not clamp them at 0 (a padding
  request's first slots are negative): both are the release's findings.

What runs interpreted: ``build`` is called whole, so its ``@triton.jit`` kernels
run under the Triton interpreter: the prefill chunks' metadata (steps with
prefills) and the flattening path's uniform decodes; they take most of a
case's time. The native path itself is torch ops only.

The upstream mutants (:func:`upstream_strided`, :func:`upstream_copy`) are the
installed builder with #42135 reverted, subclassed so that only the reverted
lines differ from the release (see each class).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from functools import cache
from typing import Any

import attnfuzz.kernels._triton  # noqa: F401 - TRITON_INTERPRET=1 before vLLM imports Triton
import torch
from attnfuzz.adapters.vllm import _engine, _indexer_builder, compat
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


def _builder(cls: type, config: EngineConfig, device: torch.device | str) -> Any:
    """The builder of ``cls`` for ``config``, made once (its buffers are persistent)."""
    key = (cls, config, str(device))
    builder = _builders.get(key)
    if builder is None:
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        # The indexer's KV cache: one head of uint8 (fp8 keys and their scales).
        spec = MLAAttentionSpec(
            block_size=config.block_size, num_kv_heads=1, head_size=16, dtype=torch.uint8
        )
        # Made as the release's engine makes it (_indexer_builder: block_table_width=
        # from 0.27.0, the CPU platform's compute units before 0.23.0).
        builder = _indexer_builder.make(
            cls,
            spec,
            ["model.layers.0.self_attn.indexer.k_cache"],
            _engine.vllm_config(config),
            config.max_blocks_per_seq,
            torch.device(device),
        )
        _builders[key] = builder
        while len(_builders) > _CACHE_SIZE:
            _builders.popitem(last=False)
    else:
        _builders.move_to_end(key)
    return builder


def _flattens(builder: Any) -> bool:
    """Whether ``builder`` flattens every decode step: the attributes its ``__init__``
    sets and ``build`` reads, ``use_flattening`` and, where the release has the
    SM100 varlen logits kernel (0.28.0 on), ``supports_varlen``."""
    varlen = compat.has(compat.VARLEN_LOGITS) and builder.supports_varlen
    return bool(builder.use_flattening or varlen)


def takes_native_path(config: EngineConfig) -> bool:
    """Whether vLLM, on this platform, builds the native ``[B, L]`` table for steps of
    ``config`` with ``1 < max_decode_len <= next_n``: the installed builder's own
    decision (``indexer.py``, ``__init__``'s ``use_flattening``)."""
    return not _flattens(_builder(_builder_class(), config, torch.device("cpu")))


def _path(builder: Any, max_decode_len: int) -> str:
    """The path ``_prepare_decode_tensors`` took: ``build``'s own ``use_native``
    expression, as the installed release writes it (``indexer.py``)."""
    next_n = 1 + builder.num_speculative_tokens
    if compat.has(compat.NATIVE_DECODE):
        from vllm.v1.attention.backends.mla.indexer import _supports_native_decode

        # 0.28.0 on: legality per step, and every step without use_native flattens.
        use_native = (
            not _flattens(builder)
            and max_decode_len <= next_n
            and (max_decode_len <= 1 or _supports_native_decode(max_decode_len))
        )
        return NATIVE if use_native else FLATTENING
    # Before: ``use_native = not self.use_flattening and max_decode_len <= next_n``,
    # and ``_prepare_decode_tensors`` flattens only ``not use_native and
    # max_decode_len > 1``: a single-token step passes its seq_lens through.
    use_native = not builder.use_flattening and max_decode_len <= next_n
    return NATIVE if use_native or max_decode_len <= 1 else FLATTENING


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
    # ``build``'s own max_decode_len, the same line in every release (0.30.0 on
    # also keep it as ``decode.write_max_decode_len``).
    decode_lens_cpu = torch.diff(common.query_start_loc_cpu[: metadata.num_decodes + 1])
    max_decode_len = int(decode_lens_cpu.max().item())
    return MtpSeqLensOutputs(metadata.decode.seq_lens, buffer, _path(builder, max_decode_len))


def run(inputs: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """The installed vLLM's ``DeepseekV32IndexerMetadataBuilder.build``, unchanged."""
    return _run(_builder_class(), inputs)


# -- upstream #42135 ------------------------------------------------------------------
#
# Before #42135 the native path kept its lengths in a [max_num_seqs, next_n] table
# and handed on the slice [:B, :L]: not contiguous when B >= 2 and L < next_n, and
# DeepGEMM's paged MQA logits metadata asserted ``context_lens.is_contiguous()``.
# The pre-fix lines below are vllm-project/vllm's indexer.py as it read before the
# merge (0.21.0: ``__init__``'s "Native MTP: 2D buffer for per-token seq_lens" and
# ``_prepare_decode_tensors``'s write into and slice of that table), which #42135's
# description names ("used to slice the 2D decode_seq_lens_buffer as [:, :max_decode_len]").
# What the table holds is the installed release's own native branch's result,
# computed into the release's flat buffer: its expression, with the clamp at 0 where
# the release has one (0.28.0 on; it came after #42135), so that each mutant differs
# from the release in #42135's lines only. A release before #42135 allocates the
# 2-D table itself: there the strided mutant is the release, unchanged.


@cache
def _strided_class() -> type:
    @under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
    class PrefixStridedBuilder(_builder_class()):  # type: ignore[misc]
        """The installed builder with the pre-#42135 2-D table. Differs from the
        release in ``__init__``'s allocation of ``decode_seq_lens_buffer``
        (``[max_num_seqs, next_n]`` on the native MTP path; the release's flat
        buffer is kept for its own native branch) and, after that branch in
        ``_prepare_decode_tensors`` (native, ``next_n > 1``), in the write into
        ``[:num_decodes, :max_decode_len]`` of the table and that slice handed on."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            scheduler_config = self.vllm_config.scheduler_config
            next_n = self.num_speculative_tokens + 1
            # The release's flat buffer (#42135's fix); None where the release
            # allocated the 2-D table itself (before the fix: nothing to revert).
            self.flat_seq_lens_buffer: torch.Tensor | None = None
            if not self.use_flattening and next_n > 1 and self.decode_seq_lens_buffer.dim() == 1:
                self.flat_seq_lens_buffer = self.decode_seq_lens_buffer
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
            args = (
                seq_lens, block_table, decode_lens, decode_lens_cpu, query_start_loc,
                num_decodes, num_decode_tokens, use_native, next_n, max_decode_len,
            )  # fmt: skip
            flat = self.flat_seq_lens_buffer
            if flat is None or not (use_native and next_n > 1):  # the release's own
                return super()._prepare_decode_tensors(*args)
            # The release's native branch, on the flat buffer it asserts and views ...
            table, self.decode_seq_lens_buffer = self.decode_seq_lens_buffer, flat
            try:
                lens, *rest = super()._prepare_decode_tensors(*args)
            finally:
                self.decode_seq_lens_buffer = table
            # ... and its lengths in the 2-D table, sliced:
            self.decode_seq_lens_buffer[:num_decodes, :max_decode_len] = lens  # pre-#42135
            seq_lens = self.decode_seq_lens_buffer[:num_decodes, :max_decode_len]  # pre-#42135
            return (seq_lens, *rest)  # type: ignore[return-value]

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
    """The installed vLLM's builder before #42135: the 2-D table's slice ``[:B, :L]``."""
    return _run(_strided_class(), inputs)


def upstream_copy(inputs: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """#42135's first fix: that slice made ``.contiguous()``, new storage every step."""
    return _run(_copy_class(), inputs)
