"""vLLM's model runner V1 step of a hybrid model whose linear layer is Kimi K3's KDA on
ROCm, as the implementation ``vllm-v1-kimi-k3-kda-rocm`` of ``runner-step``.

The engine of :mod:`.runner_step_hybrid` (an attention layer on Triton, a second
KV-cache group of one linear layer, ``1 + num_spec`` state blocks a request above the
attention pages), its linear layer's backend the ROCm Kimi K3 KDA's,
``KimiK3ROCmKDABackend`` (``vllm/models/kimi_k3/amd/kda_metadata.py``; the backend
``KimiK3DeltaAttention.get_attn_backend`` names in ``models/kimi_k3/amd/kda.py``). So
the runner's ``_build_attention_metadata`` runs ``KimiK3ROCmKDAMetadataBuilder.build``
on every step and GDN's ``build_for_cudagraph_capture`` in the capture runs. The builder
is GDN's (``GDNAttentionMetadataBuilder``, not the NVIDIA KDA builder): GDN's split of
speculative decodes, decodes and prefills, GDN's staging of the FULL graph's buffers,
and GDN's graph support (``AttentionCGSupport.UNIFORM_BATCH``: a FULL mode becomes
FULL_AND_PIECEWISE, as ``vllm-v1-hybrid``'s). What it changes:

- the FLA chunk metadata of a step with prefills (``_build_chunk_metadata``): built on
  the device by a Triton kernel (``prepare_chunk_metadata_device``,
  ``_chunk_metadata_kernel``; under the interpreter here, no line of it stood in: it
  holds no CUDA assert), not on the host by FLA's ``prepare_chunk_indices`` and
  ``prepare_chunk_offsets`` as GDN's builder does. The ROCm prefill backend is GDN's
  ``triton`` here, as on a ROCm GPU where AITER's FlyDSL prefill is not picked
  (``_resolve_gdn_prefill_backend``; ``_check_chunk_metadata_override`` refuses this
  builder with FlyDSL), so every prefill builds them;
- the checkpoint metadata, rebuilt on the prefill rows (``_build_checkpoint_metadata``):
  not reached, the group's cache mode is ``"none"`` (prefix caching off), for which
  ``MambaPrefillCheckpointBuilder.build`` builds none;
- ``uniform_spec_sequence_length`` dropped under adaptive verification
  (``_adaptive_verification_enabled``) and ``get_varlen_cudagraph_max_query_len``:
  not reached, adaptive verification is V2's (``vllm-v1`` declines ``varlen_decode``).

Judged: every field ``vllm-v1-hybrid`` reports of the GDN metadata (``gdn.*``) and the
device-built chunk metadata, where the builder built it (a step with prefills), with
the range its consumers accept (:func:`_chunk_fields`); and, beside it, GDN's own host
computation of the same metadata, vLLM's ``GDNAttentionMetadataBuilder._build_chunk_metadata``
called on the arguments the ROCm builder's was (the prefill query offsets, device and
host), which the device fields must equal (``Field.agrees_with``): the two builders of
the same step agree.

Declined: what ``vllm-v1-hybrid`` declines, a first chunk in a uniform batch a FULL
graph replays: the builder stages the graph's buffers as GDN's does (``build`` runs
GDN's ``_stage_spec_decode`` and ``_stage_decode``, which need no prefill), the same
state kept apart as ``vllm-v1-hybrid-prefill-in-decode-graph``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_ROCM_KDA = "vllm/models/kimi_k3/amd/kda_metadata.py"
HOST = "attnfuzz_gdn_chunk_metadata"
"""The attribute of a build's metadata holding GDN's host chunk metadata of the same
prefill query offsets (:func:`gdn_host_chunk_metadata`); no vLLM code reads it."""


@functools.cache
def _backend() -> type:
    from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDABackend

    return KimiK3ROCmKDABackend


@functools.cache
def _builder() -> type:
    from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder

    return KimiK3ROCmKDAMetadataBuilder


def prepare() -> None:
    """Import vLLM's V1 runner and the ROCm Kimi K3 KDA backend before a judge forks."""
    hybrid.prepare()
    _backend()


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1-hybrid`` (module docstring);
    what only the builder's adaptive verification reaches, ``vllm-v1`` declines."""
    return hybrid.declines(case)


@contextlib.contextmanager
def gdn_host_chunk_metadata() -> Iterator[None]:
    """``KimiK3ROCmKDAMetadataBuilder`` as vLLM's, each metadata its ``build`` returns
    also holding (attribute :data:`HOST`) what GDN's builder returns for the same chunk
    metadata: ``GDNAttentionMetadataBuilder._build_chunk_metadata`` (FLA's host
    ``prepare_chunk_indices`` and ``prepare_chunk_offsets``) called on copies of the
    arguments the ROCm builder's ``_build_chunk_metadata`` was called on (copies: FLA's
    ``tensor_cache`` answers a tensor it saw from its cache); None where it built none."""
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    builder = _builder()
    if getattr(builder.build, "records_host_chunks", False):
        yield  # already recording (an engine's context within another's)
        return
    device_build, device_chunks = builder.build, builder._build_chunk_metadata
    host: list[tuple[torch.Tensor, torch.Tensor]] = []

    def build_chunk_metadata(
        self: Any, qsl: torch.Tensor, qsl_cpu: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = device_chunks(self, qsl, qsl_cpu, device)
        host.append(GDNAttentionMetadataBuilder._build_chunk_metadata(
            self, qsl.clone(), qsl_cpu.clone(), device))  # fmt: skip
        return out

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        host.clear()
        meta = device_build(self, *args, **kwargs)
        setattr(meta, HOST, host[-1] if host else None)
        host.clear()
        return meta

    build.records_host_chunks = True  # type: ignore[attr-defined]
    with (
        mock.patch.object(builder, "build", build),
        mock.patch.object(builder, "_build_chunk_metadata", build_chunk_metadata),
    ):
        yield


def _chunk_fields(seen: v1._Seen) -> tuple[Field, ...]:
    """The FLA chunk metadata of the GDN metadata, where the builder built it (a step
    with prefills), with what its consumers accept, and GDN's host computation of it
    that it must equal.

    Its consumers are the chunked prefill's kernels, handed ``cu_seqlens`` = the
    metadata's ``prefill_query_start_loc`` (``KimiK3DeltaAttention._forward``,
    ``models/kimi_k3/amd/kda.py``: ``chunk_kda_prefill``; on its Triton path
    ``chunk_kda_with_fused_gate_fwd`` hands both on to vLLM's FLA kernels under
    ``third_party/flash_linear_attention/ops/``).

    ``chunk_indices`` is ``(num_chunks, 2)``, a row a chunk (no kind of rows is a
    chunk's), its two columns of different ranges (one ``Field.accepts`` a field): it is
    reported as its two columns, as the kernels read them (the pair at
    ``chunk_indices + i_t * 2``: the flat tensor's even and odd entries), each rows
    ``"tokens"``: every chunk holds at least one of the step's real tokens (a padding
    request has no query token, so no chunk), so there are no more chunks than real
    tokens and each column is compared whole, as ``vllm-v1-hybrid`` compares the split
    sub-batches' fields. A column's range holds every chunk to the widest a kernel
    accepts; the agreement with GDN's holds each to its own sequence."""
    m = seen.linear
    if m is None or not isinstance(getattr(m, "chunk_indices", None), torch.Tensor):
        return ()
    from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE

    qsl = v1._np(m.prefill_query_start_loc).astype(np.int64)
    num_seqs = len(qsl) - 1
    longest = int(np.diff(qsl).max(initial=0))
    indices, offsets = v1._np(m.chunk_indices), v1._np(m.chunk_offsets)
    # chunk_gated_delta_rule_fwd_h: NT = len(chunk_indices), the chunks of the batch.
    num_chunks = int(indices.shape[0]) if indices.ndim else 0
    pairs = indices.reshape(-1)
    host = getattr(m, HOST, None)
    sequence, chunk = "gdn.chunk_indices[:, 0]", "gdn.chunk_indices[:, 1]"
    out = [
        # cumsum.py chunk_local_cumsum_scalar_kernel (as chunk_o.py chunk_fwd_kernel_o,
        # chunk_scaled_dot_kkt.py, solve_tril.py, wy_fast.py): program i_t reads
        # i_n = chunk_indices[i_t, 0] and loads cu_seqlens[i_n], cu_seqlens[i_n + 1]:
        # a sequence of cu_seqlens, 0 <= i_n <= num_seqs - 1 ...
        Field(sequence, "tokens", pairs[0::2], (0, num_seqs - 1),
              agrees_with=f"host.{sequence}"),
        # ... and its chunk i_t = chunk_indices[i_t, 1], the tokens i_t * BT + [0, BT)
        # of that sequence (masked past its end: o_t < T): a chunk of the longest one,
        # 0 <= i_t <= cdiv(longest, FLA_CHUNK_SIZE) - 1 (below 0 reads before it).
        Field(chunk, "tokens", pairs[1::2], (0, -(-longest // FLA_CHUNK_SIZE) - 1),
              agrees_with=f"host.{chunk}"),
        # chunk_delta_h.py chunk_gated_delta_rule_fwd_kernel_h_blockdim64: sequence i_n
        # writes its cdiv(T, BT) chunk states from boh = chunk_offsets[i_n] on, into
        # h = k.new_empty(B, NT, ...) of NT = len(chunk_indices) chunks
        # (chunk_gated_delta_rule_fwd_h): 0 <= boh <= NT.
        Field("gdn.chunk_offsets", "offsets", offsets, (0, num_chunks),
              agrees_with="host.gdn.chunk_offsets"),
    ]  # fmt: skip
    if host is not None:
        # GDN's host chunk metadata of the same query offsets: the reference the device
        # fields agree with; no kernel of this build reads it (accepts: None).
        host_pairs, host_offsets = v1._np(host[0]).reshape(-1), v1._np(host[1])
        out += [
            Field(f"host.{sequence}", "tokens", host_pairs[0::2]),
            Field(f"host.{chunk}", "tokens", host_pairs[1::2]),
            Field("host.gdn.chunk_offsets", "offsets", host_offsets),
        ]
    return tuple(out)


class _ROCmKDAEngine(hybrid._HybridEngine):
    """A V1 runner whose model has an attention layer and a ROCm Kimi K3 KDA layer."""

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return gdn_host_chunk_metadata()

    def linear_group(self) -> tuple[type, Any]:
        # KimiK3DeltaAttention is a GDN layer (mamba_type GDN_ATTN); its state shapes
        # reach no metadata: GDN's spec, the ROCm KDA backend. Its builder's
        # _cudagraph_support is GDN's UNIFORM_BATCH: _HybridEngine.resolves_to holds.
        _, spec = super().linear_group()
        return _backend(), spec

    def linear_fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        return super().linear_fields(seen) + _chunk_fields(seen)


class ROCmKDARunnerStepEngine(hybrid.HybridRunnerStepEngine):
    """``vllm-v1-hybrid``'s three engines, their linear layer Kimi K3's KDA on ROCm."""

    engine_type = _ROCmKDAEngine


ENGINE = ROCmKDARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-kimi-k3-kda-rocm`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-kimi-k3-kda-rocm`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
