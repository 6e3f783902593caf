"""vLLM's model runner V1 step on the Triton/FlashAttention composite backend, as the
implementation ``vllm-v1-triton-flash-attn`` of ``runner-step``.

The engine of :mod:`.runner_step_flash_attn` (FA3 as on an sm90 GPU), its attention
layer (and the MTP draft layer) on vLLM's ``TRITON_FLASH_ATTN`` backend
(``vllm/v1/attention/backends/triton_flash_attn.py``): a composite that
``create_composite_attention_backend`` (``vllm/v1/attention/backends/composite.py``)
makes of the Triton backend (the "general" child, for steps whose queries see an
image's keys ahead of them) and FlashAttention (the "causal" child), routed by
``MMPrefixAttentionRouting``. Its ``CompositeAttentionMetadataBuilder`` holds both
children's builders (the reorder threshold the smaller of theirs), builds every step
by the child the routing selects (``_build``), tags the metadata with that child
(``_attention_backend_variant``, which ``CompositeAttentionImpl.get_impl_for_metadata``
reads to pick the kernel), and builds a capture run's metadata by the routing's
``capture_variant`` child. Its graph support is the least of the children's and the
routing's (``UNIFORM_SINGLE_TOKEN_DECODE``): ``_check_and_update_cudagraph_mode``
turns FULL into FULL_AND_PIECEWISE and, with drafts (a uniform decode of more than one
query), a FULL decode mode into PIECEWISE (``CompilationConfig.
resolve_cudagraph_mode_and_sizes``).

The model's attention is 1 KV head of 256, bf16: the composite's head sizes are 256 and
512 (``head_sizes``), of which FlashAttention takes 256.

No step attnfuzz draws holds an image (``CommonAttentionMetadata.mm_req_doc_ranges``
is empty), so every build is causal and goes to FlashAttention
(``requires_mm_prefix`` is False), as does every capture (``capture_variant`` 1): the
Triton child's builder is made and never builds. Fields: ``vllm-v1-flash-attn``'s
(``fa.*``, the FlashAttention metadata each build hands ``flash_attn_varlen_func``),
and ``composite.variant``, the child each build is tagged with, which must be the
causal one (1): a build tagged 0 runs the Triton kernel on FlashAttention's metadata,
or, in a capture, records a graph whose replays run the other child's.

Declined: ``vllm-v1-flash-attn``'s cases (kernel block sizes: the two children's
common ones, multiples of 16).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_flash_attn as fa
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

HEAD_SIZE = 256
"""The model's head size: one of the composite's (``head_sizes=(256, 512)``) that FA3
runs."""
CAUSAL = 1
"""The causal child's variant (FlashAttention): ``MMPrefixAttentionRouting.select`` of a
step without an image, and its ``capture_variant``."""


def prepare() -> None:
    """Import vLLM's V1 runner and the composite backend before a judge forks."""
    v1.prepare()
    with fa.fa3():
        _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.triton_flash_attn import TritonFlashAttentionBackend

    return TritonFlashAttentionBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-flash-attn``'s."""
    return fa.declines(case)


declines_config = fa.declines_config
""":func:`declines` of an engine of ``config`` alone (its step not read)."""


def _freeze(meta: Any) -> SimpleNamespace:
    """The child a build is tagged with, the keys either child's kernel reads (both take
    ``seq_lens`` and ``block_table``), and what FlashAttention's kernel reads of it
    (:func:`.runner_step_flash_attn._freeze`) where the child is FlashAttention's."""
    variant = getattr(meta, "_attention_backend_variant", None)
    return SimpleNamespace(
        variant=variant, seq_lens=meta.seq_lens.clone(), block_table=meta.block_table.clone(),
        fa=fa._freeze(meta) if variant == CAUSAL else None,
    )  # fmt: skip


class _TritonFlashAttnEngine(fa._FlashAttnEngine):
    """A V1 runner whose attention layer is on the Triton/FlashAttention composite."""

    freeze = staticmethod(_freeze)

    def attention_group(self) -> tuple[type, Any]:
        layers = self.vllm_config.compilation_config.static_forward_context
        # MMPrefixAttentionRouting.__init__ reads each layer of the group: the model's
        # attention layer, no sliding window (the target's layer of the backend).
        layers[v1._LAYER] = drafting.draft_layer(self.vllm_config, _backend())
        layers[v1._LAYER].sliding_window = None
        return v1.bf16_attention_group(self.vllm_config, self.config, _backend(), HEAD_SIZE)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # UNIFORM_SINGLE_TOKEN_DECODE (resolve_cudagraph_mode_and_sizes): no FULL mixed
        # graph; no FULL decode graph of more than one query a request.
        if mode.mixed_mode() == CUDAGraphMode.FULL:
            mode = CUDAGraphMode.FULL_AND_PIECEWISE
        if mode.decode_mode() == CUDAGraphMode.FULL and self.config.next_n > 1:
            mode = CUDAGraphMode.PIECEWISE
        return mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        out: list[Field] = []
        m = seen.meta
        if m is not None:
            rows = len(m.seq_lens)
            # CompositeAttentionImpl.get_impl_for_metadata runs the kernel of the child
            # the build is tagged with; without an image every query is causal.
            variant = -1 if m.variant is None else int(m.variant)
            out.append(Field("composite.variant", "requests",
                             np.full(rows, variant, dtype=np.int64), (CAUSAL, CAUSAL)))  # fmt: skip
            if m.fa is not None:
                cap = self.vllm_config.attention_config.flash_attn_max_num_splits_for_cuda_graph
                out += fa._fa_fields(self.config, v1._Seen(m.fa, seen.slot_mapping,
                                                           seen.positions), cap)  # fmt: skip
        return v1._fields(self.config, no_meta) + tuple(out) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots as either child's kernel reads them
        (``flash_attn_varlen_func``'s ``seqused_k`` and ``block_table``; the Triton
        kernel's ``seq_lens`` and ``block_table``): the first ``seq_lens[i]`` keys, key
        ``j`` in page ``block_table[i, j // block_size]`` at ``j % block_size``."""
        m = seen.meta
        return v1.paged_keys(v1._np(m.seq_lens), v1._np(m.block_table), self.kernel_block_size())


class TritonFlashAttnRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the Triton/FlashAttention composite."""

    engine_type = _TritonFlashAttnEngine


ENGINE = TritonFlashAttnRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-triton-flash-attn`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-triton-flash-attn`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a routing whose capture child is not the one its replays select ----------------


@contextlib.contextmanager
def _capture_general() -> Iterator[None]:
    """``MMPrefixAttentionRouting.capture_variant`` 0: a capture run builds the Triton
    child's metadata while every replay of a text step selects FlashAttention's."""
    from vllm.v1.attention.backends.composite import MMPrefixAttentionRouting

    with mock.patch.object(MMPrefixAttentionRouting, "capture_variant", 0):
        yield


_MUTANT = v1.Mutated(TritonFlashAttnRunnerStepEngine(), _capture_general)


def capture_variant_general(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-triton-flash-attn-capture-variant-general``: capture runs build the
    general (Triton) child's metadata."""
    return _MUTANT(inputs)


capture_variant_general.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


def trigger_capture(trace: Trace | Case) -> bool:
    """An engine that captures a FULL graph (no drafts: with them the composite keeps no
    FULL decode graph), whose capture runs build by the capture child."""
    return hybrid.reach_full_graphs(trace) and trace.config.next_n == 1


def smallest_capture() -> Trace:
    """A FULL decode graph of 1 token captured at the engine's start; one request
    prefills 3 tokens."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=1, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(1,), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (3,), req_ids=(7,), pages=((1,),), new_pages=(1,)),))
