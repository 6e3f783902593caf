"""vLLM's model runner V1 step on its attention backends side by side, as the
implementation ``vllm-v1-backends`` of ``runner-step``.

Each step of a trace runs on the engines of ``vllm-v1`` (the Triton backend,
:class:`~attnfuzz.adapters.vllm.runner_step_v1.RunnerStepEngine`: its capture, eager,
padded, replay, fresh and draft builds, all reported) and, beside them, on an engine of
cudagraph mode NONE of each other backend of vLLM 0.33.0's V1 runner that attnfuzz
drives: FlashAttention as FA3 runs it (``vllm-v1-flash-attn``'s engine), FlashInfer's
native wrappers as an sm80 GPU runs them (``vllm-v1-flashinfer``'s), the Triton
MLA backend of an MLA model (``vllm-v1-mla``'s), FlashMLA with an fp8 cache
(``vllm-v1-flashmla``'s), ROCm's AITER FlashAttention (``vllm-v1-aiter-fa``'s) and
AITER MLA (``vllm-v1-aiter-mla``'s), each keeping its own requests' rows across the
trace. Of those, the step's own eager build alone is reported, as a
``backend`` build (its ``where`` naming the backend's builder): their graphs, fresh
engines and drafter sub-steps are their own implementations' to judge. A ``backend``
build holds what every backend states alike (:data:`SHARED`): the step's inputs to
the model (the forward context's slot mapping, the positions), and ``kv_len`` and
``kv_slots``, which each backend's engine derives from its own metadata as its kernels
read it (``kv_read`` of :class:`~attnfuzz.adapters.vllm.runner_step_v1._Engine`, of
:class:`~attnfuzz.adapters.vllm.runner_step_flash_attn._FlashAttnEngine`, of
:class:`~attnfuzz.adapters.vllm.runner_step_flashinfer._FlashInferEngine`, of
:class:`~attnfuzz.adapters.vllm.runner_step_mla._MLAEngine`, of
:class:`~attnfuzz.adapters.vllm.runner_step_aiter_fa._AiterFAEngine`, of
:class:`~attnfuzz.adapters.vllm.runner_step_aiter_mla._AiterMLAEngine`). The property
*agreement across backends* holds them to the Triton eager build's; the backends'
metadata fields themselves (``fa.*``, ``fi.*``, ``mla.*``, ``aiter.*``, ``aiter_mla.*``)
differ in name and meaning and are left out.

The MLA and AITER builders reorder the persistent batch, decodes first
(``reorder_batch_to_split_decodes_and_prefills``), so their rows are not the Triton
engine's: a ``backend`` build's rows (and each request's tokens) are put in the Triton
eager engine's row order, by request id, before it is reported.

A backend may decline a config (``declines`` of its module): that backend is then left
out of the trace, the others kept. On vLLM 0.33.0 FlashAttention (FA3, head size 128,
bf16) and Triton MLA accept the block sizes the Triton backend does, multiples of 16
(``get_supported_kernel_block_sizes``), which ``vllm-v1`` declines otherwise; FlashMLA
takes pages of 64 only, and is left out of a trace of any other; AITER FlashAttention
takes multiples of 16 (kernel blocks of 16 and 32), AITER MLA any block size.

Mutants (re-created defects only that property catches):
``vllm-v1-backends-aiter-fa-extends-as-prefills``, an AITER FlashAttention builder that
splits the step two ways, as ``split_decodes_and_prefills`` does (every request past the
decodes a prefill): an extend's context is never gathered, its kernel reads its new keys
alone, and its builds agree with one another; and
``vllm-v1-backends-flash-attn-kv-short``, a FlashAttention builder that hands the
kernel each request's ``seq_lens`` one key short, from a buffer of its own, in every
build it makes (eager, capture, padded, replay, drafting, a new engine's alike): its
builds agree with one another and stay inside what FA3 accepts; only another backend's
KV length tells.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_aiter_fa as aiter_fa
from attnfuzz.adapters.vllm import runner_step_aiter_mla as aiter_mla
from attnfuzz.adapters.vllm import runner_step_flash_attn as flash_attn
from attnfuzz.adapters.vllm import runner_step_flashinfer as flashinfer
from attnfuzz.adapters.vllm import runner_step_flashmla as flashmla
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import (
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)
from attnfuzz.reference.trace import Trace

SHARED = ("slot_mapping", "positions", "kv_len", "kv_slots")
"""The fields every backend's build states alike: the runner's inputs to the model and
what each backend derives from its own metadata."""


def prepare() -> None:
    """Import vLLM's V1 runner and the other backends before a judge forks its child."""
    flash_attn.prepare()
    flashinfer.prepare()
    mla.prepare()
    flashmla.prepare()
    aiter_fa.prepare()
    aiter_mla.prepare()


def declines(case: Case) -> str | None:
    """Why this implementation does not run ``case``: ``vllm-v1``'s declines (a backend
    that declines a config it runs is left out, :class:`EagerBackend`)."""
    return v1.declines(case)


class EagerBackend:
    """Another backend's V1 engine of cudagraph mode NONE across a life's steps, for the
    step's eager build; none for a config the backend declines (``declines``: why, of an
    engine config, else None; the step's own declines are ``vllm-v1``'s, already applied)."""

    def __init__(
        self,
        engine: v1.RunnerStepEngine,
        declines: Callable[[EngineConfig], str | None],
        where: str,
    ) -> None:
        self.runner_step, self.declines, self.where = engine, declines, where
        self.new_engine()

    def new_engine(self) -> None:
        self.key: tuple[EngineConfig, torch.device] | None = None
        self.engine: v1._Engine | None = None

    def __call__(self, inputs: RunnerStepInputs) -> tuple[StepBuild, list[str]] | None:
        """The step's eager build and the engine's rows (request ids), None if declined."""
        if self.declines(inputs.config) is not None:
            return None
        if self.key != (inputs.config, inputs.device):
            self.key = (inputs.config, inputs.device)
            self.engine = self.runner_step.engine(inputs.config, inputs.device, "NONE")
        engine = self.engine
        assert engine is not None
        builds = v1._step(engine, inputs, engine.output(inputs), "eager")
        (step,) = [b for b in builds if b.how == "eager" and b.draft is None]
        rows = list(engine.runner.input_batch.req_ids)[: step.num_reqs]
        return dataclasses.replace(step, how="backend", where=self.where), rows


def in_rows(
    build: StepBuild, rows: list[str], to: list[str], query_lens: dict[str, int]
) -> StepBuild:
    """``build``'s fields of :data:`SHARED`, its real rows put from the order ``rows``
    (request ids) to ``to``: a request's row and its tokens (``query_lens`` each, laid
    out row after row)."""
    order = np.array([rows.index(r) for r in to], dtype=np.int64)
    starts = np.cumsum([0] + [query_lens[r] for r in rows])
    tokens = np.concatenate(
        [np.arange(starts[i], starts[i + 1]) for i in order] + [np.zeros(0, np.int64)]
    ).astype(np.int64)
    fields = []
    for f in build.fields:
        if f.name not in SHARED:
            continue
        take = {"requests": order, "tokens": tokens}[f.rows]
        rest = np.arange(len(take), len(f.values))
        index = np.concatenate([take, rest])
        lengths = None if f.row_lengths is None else f.row_lengths[index]
        fields.append(dataclasses.replace(f, values=f.values[index], row_lengths=lengths))
    return dataclasses.replace(build, fields=tuple(fields))


class BackendsLife:
    """``vllm-v1``'s engines, and beside them each of ``others``' eager builds."""

    def __init__(self, triton: v1.RunnerStepEngine, *others: EagerBackend) -> None:
        self.triton, self.others = triton, list(others)

    def new_engine(self) -> None:
        self.triton.new_engine()
        for other in self.others:
            other.new_engine()

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        out = self.triton(inputs)
        eager = self.triton.eager
        assert eager is not None
        query_lens = {str(r): q for r, q in zip(inputs.req_ids, inputs.query_lens, strict=True)}
        backends = []
        for other in self.others:
            made = other(inputs)
            if made is None:
                continue
            build, rows = made
            to = list(eager.runner.input_batch.req_ids)[: build.num_reqs]
            backends.append(in_rows(build, rows, to, query_lens))
        return RunnerStepOutputs(out.builds + tuple(backends))


_FA_WHERE = "vllm/v1/attention/backends/flash_attn.py: FlashAttentionMetadataBuilder.build"
_MLA_WHERE = f"{mla._MLA}: MLACommonMetadataBuilder.build (triton_mla.py)"
_FI_WHERE = f"{flashinfer._FI}: FlashInferMetadataBuilder.build"
_FLASHMLA_WHERE = f"{flashmla._FLASHMLA}: FlashMLAMetadataBuilder (MLACommonMetadataBuilder.build)"
_AITER_FA_WHERE = f"{aiter_fa._AITER_FA}: AiterFlashAttentionMetadataBuilder.build"
_AITER_MLA_WHERE = f"{aiter_mla._AITER_MLA}: AiterMLAMetadataBuilder.build"


def _aiter_fa() -> EagerBackend:
    return EagerBackend(
        aiter_fa.AiterFARunnerStepEngine(), aiter_fa.declines_config, _AITER_FA_WHERE
    )


def _backends(fa: v1.RunnerStepEngine) -> BackendsLife:
    return BackendsLife(
        v1.RunnerStepEngine(),
        EagerBackend(fa, flash_attn.declines_config, _FA_WHERE),
        EagerBackend(
            flashinfer.FlashInferRunnerStepEngine(), flashinfer.declines_config, _FI_WHERE
        ),
        EagerBackend(mla.MLARunnerStepEngine(), mla.declines_config, _MLA_WHERE),
        EagerBackend(
            flashmla.FlashMLARunnerStepEngine(), flashmla.declines_config, _FLASHMLA_WHERE
        ),
        _aiter_fa(),
        EagerBackend(
            aiter_mla.AiterMLARunnerStepEngine(), aiter_mla.declines_config, _AITER_MLA_WHERE
        ),
    )


ENGINES = _backends(flash_attn.FlashAttnRunnerStepEngine())
"""The engines of the implementation ``vllm-v1-backends`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-backends`` of ``runner-step``: the step on
    :data:`ENGINES`, kept across calls; ``run.new_engine()`` drops them."""
    return ENGINES(inputs)


run.new_engine = ENGINES.new_engine  # type: ignore[attr-defined]


# -- the mutant: a FlashAttention builder one key short in every build ---------------------


@contextlib.contextmanager
def _kv_short() -> Iterator[None]:
    """``FlashAttentionMetadataBuilder.build`` hands the kernel ``seq_lens - 1`` (never
    below 0), as if the step's last key were not in the cache yet, from a buffer the
    builder keeps (as the runner's own ``seq_lens`` is one): a FULL graph captures a
    view of it, and each later build, the replayed step's included, writes it anew.
    Every build (capture, eager, padded, drafting) goes through ``build``."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder

    original = FlashAttentionMetadataBuilder.build
    if getattr(original, "kv_short", False):  # patched already: one key short, not two
        yield
        return

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> Any:  # fmt: skip
        meta = original(self, common_prefix_len, common_attn_metadata, fast_build)
        short = getattr(self, "_kv_short", None)
        if short is None:
            size = self.vllm_config.scheduler_config.max_num_seqs
            short = self._kv_short = torch.zeros(size, dtype=meta.seq_lens.dtype,
                                                 device=meta.seq_lens.device)  # fmt: skip
        n = meta.seq_lens.shape[0]
        torch.clamp(meta.seq_lens - 1, min=0, out=short[:n])
        meta.seq_lens = short[:n]
        return meta

    build.kv_short = True  # type: ignore[attr-defined]

    with mock.patch.object(FlashAttentionMetadataBuilder, "build", build):
        yield


class KvShortFlashAttn(flash_attn.FlashAttnRunnerStepEngine):
    """``vllm-v1-flash-attn``'s engines, their builder :func:`_kv_short`."""

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        with _kv_short():
            return super().__call__(inputs)

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> v1._Engine:
        with _kv_short():  # its capture runs, at construction
            return super().engine(config, device, mode)


class _KvShortBackend(EagerBackend):
    def __call__(self, inputs: RunnerStepInputs) -> tuple[StepBuild, list[str]] | None:
        with _kv_short():
            return super().__call__(inputs)


FLASH_ATTN_KV_SHORT = KvShortFlashAttn()
"""The FlashAttention engines of the mutant, alone, across a life's steps."""
KV_SHORT = BackendsLife(
    v1.RunnerStepEngine(),
    _KvShortBackend(FLASH_ATTN_KV_SHORT, flash_attn.declines_config, _FA_WHERE),
    EagerBackend(mla.MLARunnerStepEngine(), mla.declines_config, _MLA_WHERE),
)


def run_flash_attn_kv_short(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-backends-flash-attn-kv-short``: :data:`ENGINES` with
    FlashAttention's builder one key short (:func:`_kv_short`)."""
    return KV_SHORT(inputs)


run_flash_attn_kv_short.new_engine = KV_SHORT.new_engine  # type: ignore[attr-defined]


def reach_flash_attn(trace: Trace | Case) -> bool:
    """A V1 trace FlashAttention runs beside Triton (block sizes of multiples of 16, no
    varlen decode graphs): each of its steps reads some request's keys."""
    c = trace.config
    return c.runner == "v1" and not c.varlen_decode and c.block_size % 16 == 0


def smallest_flash_attn_kv_short() -> Trace:
    """One request arrives with one token: the least step whose keys a backend reads."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(1,), runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (1,), req_ids=(0,), pages=((0,),), new_pages=(1,)),))


# -- the mutant: an AITER FlashAttention builder that counts its extends as prefills -------


class _Patched(EagerBackend):
    """An eager backend whose every call (its engines' construction and capture runs
    included) runs under ``patch``."""

    def __init__(self, patch: Callable[[], Any], backend: EagerBackend) -> None:
        self.patch = patch
        super().__init__(backend.runner_step, backend.declines, backend.where)

    def __call__(self, inputs: RunnerStepInputs) -> tuple[StepBuild, list[str]] | None:
        with self.patch():
            return super().__call__(inputs)


EXTENDS_AS_PREFILLS = BackendsLife(
    v1.RunnerStepEngine(), _Patched(aiter_fa.extends_as_prefills, _aiter_fa())
)


def run_aiter_fa_extends_as_prefills(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-backends-aiter-fa-extends-as-prefills``: Triton's step beside
    an AITER FlashAttention builder that splits two ways
    (:func:`~attnfuzz.adapters.vllm.runner_step_aiter_fa.extends_as_prefills`)."""
    return EXTENDS_AS_PREFILLS(inputs)


run_aiter_fa_extends_as_prefills.new_engine = EXTENDS_AS_PREFILLS.new_engine  # type: ignore[attr-defined]

reach_aiter_extend = aiter_fa.reach_extend


def smallest_aiter_extend() -> Trace:
    """One request arrives with a first chunk of one token, then prefills 2 more: an
    extend (context 1, query 2 past the reorder threshold of 1)."""
    config = EngineConfig(
        max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(1,), runner="v1",
    )  # fmt: skip
    return Trace(config, (
        Batch((0,), (1,), req_ids=(0,), pages=((0,),), new_pages=(1,)),
        Batch((1,), (2,), req_ids=(0,), pages=((0,),), new_pages=(0,)),
    ))  # fmt: skip
