"""vLLM's model runner V1 step of a hybrid model whose linear layer is Kimi K3's KDA, as
the implementation ``vllm-v1-kimi-k3-kda`` of ``runner-step``.

The engine of :mod:`.runner_step_hybrid` (an attention layer on Triton, a second
KV-cache group of one linear layer, ``1 + num_spec`` state blocks a request above the
attention pages), its linear layer Kimi K3's ``KimiK3DeltaAttention``, a
``GatedDeltaNetAttention`` (``mamba_type`` GDN_ATTN) whose backend is
``KimiK3KDAAttentionBackend`` (``vllm/models/kimi_k3/nvidia/kda.py``,
``kda_metadata.py``). So the runner's ``_build_attention_metadata`` runs
``KimiK3KDAMetadataBuilder.build`` on every step and ``build_for_cudagraph_capture`` in
the capture runs: its own split of speculative decodes, decodes and prefills (a first
chunk a prefill, ``no_prior_state``; trailing padding requests left out of the counts),
its staging of the speculative rows in the graph's buffers
(``stage_spec_decode_metadata``, a Triton kernel, under the interpreter here) and of
the decodes' state indices, the null block past them; the staging function asserts
its tensors are on CUDA, and runs here without that line (:func:`on_the_cpu`). Kimi
K3's defaults: no
RecoverSSM (``CacheConfig.use_kda_recoverssm``), the Triton prefill (no
``kda_prefill_backend`` in the additional config).

The builder's metadata is GDN's (``KimiK3KDAMetadata`` subclasses
``GDNAttentionMetadata``): every field of it the layer's kernels read is reported as
``vllm-v1-hybrid`` reports GDN's (``gdn.*``), with the range each accepts, beside the
attention layer's. Unlike GDN's, this builder supports every graph
(``AttentionCGSupport.ALWAYS``: "one k+1 graph replays any 1..k+1 mix"), so a FULL mode
stays FULL.

Declined beyond ``vllm-v1``: what ``vllm-v1-hybrid`` declines, a first chunk in a
uniform batch a FULL graph replays. This builder keeps it a prefill too (``build``:
``no_prior_state`` when the whole sequence is the query and the request is
prefilling), and stages the decodes' state indices in the graph's buffer only when the
step has no prefill (``num_prefills == 0``), so the replay reads the buffer's stale
indices, as GDN's: the same state, kept apart as ``vllm-v1-hybrid``'s finding
``vllm-v1-hybrid-prefill-in-decode-graph``.

Declined too, kept apart and not triaged: the graph mode FULL. There (and there only:
FULL_AND_PIECEWISE replays mixed batches piecewise, the layer outside the graph) the
V1 runner keeps every batch within the capture sizes on a FULL graph
(``CudagraphDispatcher.dispatch``), and ``build_for_cudagraph_capture`` (GDN's) builds
every capture row as a speculative decode of ``num_accepted_tokens`` = its query
length. What was observed, no more: a step whose request is built as a prefill
replays a graph captured on the speculative path, its buffers as the last staging
left them; and a mixed capture of more tokens than requests (``_dummy_run``: the
remainder on the last request) stages ``num_accepted_tokens`` above ``1 + num_spec``
in rows whose state index is the null block, which ``causal_conv1d_update`` skips
(``_causal_conv1d_update_kernel``: ``null_block_id``) and the state update may not.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any
from unittest import mock

from attnfuzz.adapters.standins import without_cuda_asserts
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

_KDA = "vllm/models/kimi_k3/nvidia/kda_metadata.py"


@functools.cache
def _backend() -> type:
    from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAAttentionBackend

    return KimiK3KDAAttentionBackend


def prepare() -> None:
    """Import vLLM's V1 runner and Kimi K3's KDA backend before a judge forks (the
    model's module needs the real ``torch.cuda.Stream`` at import, which the engine's
    construction stands in)."""
    hybrid.prepare()
    _backend()


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1-hybrid``; and the graph mode
    FULL (module docstring)."""
    if case.config.cudagraph_mode == "FULL":
        return (
            "cudagraph_mode FULL: KDA's ALWAYS support keeps every batch within the "
            "capture sizes on a FULL graph, its capture built as speculative decodes "
            "only (kept apart, untriaged)"
        )
    return hybrid.declines(case)


@functools.cache
def _staging() -> Any:
    from vllm.models.kimi_k3.nvidia import kda_metadata

    return without_cuda_asserts(kda_metadata.stage_spec_decode_metadata)


@contextlib.contextmanager
def on_the_cpu(staging: Any = None) -> Iterator[None]:
    """``kda_metadata.stage_spec_decode_metadata`` without its ``assert
    state_indices.is_cuda``: every other line unchanged, its Triton kernel under the
    interpreter (:func:`~attnfuzz.adapters.standins.without_cuda_asserts`); or
    ``staging`` in its place (a mutant's)."""
    from vllm.models.kimi_k3.nvidia import kda_metadata

    stripped = _staging()  # of vLLM's function: recompiled before any stand-in is patched in
    with mock.patch.object(kda_metadata, "stage_spec_decode_metadata", staging or stripped):
        yield


class _KDAEngine(hybrid._HybridEngine):
    """A V1 runner whose model has an attention layer and a Kimi K3 KDA layer."""

    staging: Any = None  # a mutant's stage_spec_decode_metadata; None: vLLM's

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return on_the_cpu(self.staging)

    def linear_group(self) -> tuple[type, Any]:
        # KimiK3DeltaAttention is a GDN layer (mamba_type GDN_ATTN); its state shapes
        # (kda_state_shape) reach no metadata: GDN's spec, KDA's backend.
        _, spec = super().linear_group()
        return _backend(), spec

    def resolves_to(self, mode: Any) -> Any:
        # KimiK3KDAMetadataBuilder._cudagraph_support is ALWAYS, as Triton's: the mode
        # is kept (no FULL_AND_PIECEWISE downgrade).
        return mode


class KDARunnerStepEngine(hybrid.HybridRunnerStepEngine):
    """``vllm-v1-hybrid``'s three engines, their linear layer Kimi K3's KDA."""

    engine_type = _KDAEngine


ENGINE = KDARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-kimi-k3-kda`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-kimi-k3-kda`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the staging call one request short (the last speculative decode staged as
# padding: its state the null block's, neither read nor written by the graph).


def _one_short(*args: Any, num_spec_decodes: int, **kwargs: Any) -> None:
    _staging()(*args, num_spec_decodes=num_spec_decodes - 1, **kwargs)


class _OneShortEngine(_KDAEngine):
    staging = staticmethod(_one_short)


class _OneShortRunnerStepEngine(KDARunnerStepEngine):
    engine_type = _OneShortEngine


_ONE_SHORT = _OneShortRunnerStepEngine()


def staging_one_short(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-kimi-k3-kda-staging-one-short``: ``build`` stages
    ``num_spec_decodes - 1`` requests in the FULL graph's buffers (replay equals
    eager, padding invariance)."""
    return _ONE_SHORT(inputs)


staging_one_short.new_engine = _ONE_SHORT.new_engine  # type: ignore[attr-defined]
