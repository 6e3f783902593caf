"""SGLang's decode graph runner step on its attention backends side by side, as
the implementation ``sglang-backends`` of ``runner-step``.

Each step of a trace runs on the Triton engine of ``sglang``
(:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`: its capture, eager,
padded, replay and fresh builds, all reported) and on an engine of each other
backend of SGLang 0.5.23, FlashAttention 3 (``sglang-fa3``'s), FlashInfer
(``sglang-flashinfer``'s), FlashInfer's MLA backend on an MLA model
(``sglang-flashinfer-mla``'s), on pages of 16 tokens or more TRT-LLM MHA
(``sglang-trtllm-mha``'s; SGLang runs it on no smaller page) and ROCm's AITER
(``sglang-aiter``'s, MHA on gfx942; ``sglang-aiter-mla``'s, an MLA model), each
keeping its own requests' rows across the trace.
Of those, the step's eager build alone is reported, as a ``backend`` build (its
``where`` naming the backend's function): their engines run no graph (the graph
builds of each backend are its own implementation's to judge) and make no fresh
engine. A ``backend`` build holds what every backend states alike
(:data:`SHARED`): the step's inputs, and ``kv_len`` and ``kv_slots``, which each
backend's engine derives from its own metadata as its kernels read it
(``kv_read`` of :class:`~attnfuzz.adapters.sglang.runner_step._Engine`, of
:class:`~attnfuzz.adapters.sglang.runner_step_fa3.FA3Engine`, of
:class:`~attnfuzz.adapters.sglang.runner_step_flashinfer.FlashInferEngine`, of
:class:`~attnfuzz.adapters.sglang.runner_step_flashinfer_mla.FlashInferMLAEngine`, of
:class:`~attnfuzz.adapters.sglang.runner_step_trtllm_mha.TRTLLMMHAEngine`, of
:class:`~attnfuzz.adapters.sglang.runner_step_aiter.AiterEngine`, of
:class:`~attnfuzz.adapters.sglang.runner_step_aiter_mla.AiterMLAEngine`). The
property *agreement across backends* holds them to the Triton eager build's; a
field one backend names its own way (``kv_indptr`` is the prefix for Triton's
verify, the prefix and its window for FlashInfer's) is left out.

Mutant (a re-created defect only that property catches):
``sglang-backends-flashinfer-decode-kv-short``, a FlashInfer backend whose decode
plans every request's KV one key short, in every build it makes (eager, capture,
replay, a new engine's alike): its builds agree with one another and stay inside
what FlashInfer accepts; only another backend's KV length tells.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import (
    runner_step_aiter,
    runner_step_aiter_mla,
    runner_step_fa3,
    runner_step_flashinfer,
    runner_step_flashinfer_mla,
    runner_step_trtllm_mha,
)
from attnfuzz.adapters.sglang.runner_step import EngineLife, arrive_then_step, step_mode
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import (
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    make_inputs,
)
from attnfuzz.reference.trace import Trace, as_trace

SHARED = (
    "seq_lens",
    "req_pool_indices",
    "out_cache_loc",
    "positions",
    "kv_len",
    "kv_slots",
)
"""The fields every backend's build states alike: the runner's inputs of the step and
what each backend derives from its own metadata."""


def prepare() -> None:
    """Import SGLang's runner and its backends before a judge forks its child."""
    runner_step_fa3.prepare()
    runner_step_flashinfer.prepare()
    runner_step_flashinfer_mla.prepare()
    runner_step_trtllm_mha.prepare()
    runner_step_aiter.prepare()


class EagerLife:
    """Another backend's engine across a life's steps (``life``'s engine, made anew for
    another config, with no graph runner), for the eager build of each step; none for a
    config SGLang never runs the backend with (``declines``: why, else None)."""

    def __init__(
        self,
        life: EngineLife,
        declines: Callable[[EngineConfig], str | None] | None = None,
        shared: tuple[str, ...] | None = SHARED,
    ) -> None:
        # shared: the fields its backend build keeps (None: all, where no field of it
        # shares a name with a Triton field of another meaning).
        self.life, self.declines, self.shared = life, declines, shared

    def __call__(self, inputs: RunnerStepInputs) -> StepBuild | None:
        if self.declines is not None and self.declines(inputs.config) is not None:
            return None
        life = self.life
        engine = life.engine_for(inputs, graphs=False)
        core = life.core(engine)
        with decode._server_args(inputs.config, core.ATTENTION_BACKEND):
            core.admit(inputs)
            core.write_rows(inputs)
            return life.eager(engine, inputs, step_mode(inputs), "eager")


class BackendsLife:
    """The Triton engine's life, and beside it each of ``others``' eager builds."""

    def __init__(self, triton: EngineLife, *others: EngineLife | EagerLife) -> None:
        self.triton = triton
        self.others = [o if isinstance(o, EagerLife) else EagerLife(o) for o in others]

    def new_engine(self) -> None:
        self.triton.new_engine()
        for other in self.others:
            other.life.new_engine()

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        out = self.triton(inputs)
        backends = []
        for other in self.others:
            b = other(inputs)
            if b is None:
                continue
            keep = other.shared
            shared = tuple(f for f in b.fields if keep is None or f.name in keep)
            backends.append(dataclasses.replace(b, how="backend", fields=shared))
        return RunnerStepOutputs(out.builds + tuple(backends))


ENGINES = BackendsLife(
    decode.EngineLife(),
    runner_step_fa3.FA3Life(),
    runner_step_flashinfer.FlashInferLife(),
    runner_step_flashinfer_mla.FlashInferMLALife(),
    EagerLife(runner_step_trtllm_mha.TRTLLMMHALife(), runner_step_trtllm_mha.declines_config),
    runner_step_aiter.AiterLife(),
    runner_step_aiter_mla.AiterMLALife(),
)
"""The engines of the implementation ``sglang-backends`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-backends`` of ``runner-step``: the step on
    :data:`ENGINES`, kept across calls; ``run.new_engine()`` drops them."""
    return ENGINES(inputs)


run.new_engine = ENGINES.new_engine  # type: ignore[attr-defined]


# -- the mutant: a FlashInfer decode one key short in every build ----------------------------


class _DecodeKvShort(runner_step_flashinfer.FlashInferEngine):
    """The decode updater plans each request's KV one key short (its ``seq_lens``
    taken as the KV before the step's token, as if that token's key were not in the
    cache yet): ``call_begin_forward`` of every wrapper, eager and graph alike, is
    handed ``paged_kernel_lens - 1``. Its offsets and indices stay consistent and in
    range (a padding row's fill length 1 becomes an empty row, which FlashInfer
    reads as no key)."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        updater = backend.indices_updater_decode
        begin = updater.call_begin_forward

        def one_short(wrapper: Any, lens: Any, total: Any, kv_indptr: Any, start: Any,
                      spec_info: Any, lens_cpu: Any, *rest: Any, **kwargs: Any) -> Any:  # fmt: skip
            cpu = None if lens_cpu is None else lens_cpu - 1
            return begin(wrapper, lens - 1, total - len(lens), kv_indptr, start, spec_info,
                         cpu, *rest, **kwargs)  # fmt: skip

        updater.call_begin_forward = one_short
        return backend


class _KvShortLife(runner_step_flashinfer.FlashInferLife):
    engine_class = _DecodeKvShort


FLASHINFER_KV_SHORT = _KvShortLife()
"""The FlashInfer engine of the mutant, across a life's steps."""
KV_SHORT = BackendsLife(decode.EngineLife(), runner_step_fa3.FA3Life(), FLASHINFER_KV_SHORT)


def run_flashinfer_decode_kv_short(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-backends-flashinfer-decode-kv-short``: :data:`ENGINES` with
    :class:`_DecodeKvShort` for FlashInfer."""
    return KV_SHORT(inputs)


run_flashinfer_decode_kv_short.new_engine = KV_SHORT.new_engine  # type: ignore[attr-defined]


def reach_decode(trace: Trace | Case) -> bool:
    """A decode (no drafts) of running requests: the backends run it as a decode
    (``runner_step.step_mode``), FlashInfer's eagerly through its decode updater."""
    trace = as_trace(trace)
    return any(step_mode(make_inputs(case)) == "decode" for case in trace.cases())


def smallest_flashinfer_decode_kv_short() -> Trace:
    """One request of one token, then its decode: a running request's decode is the
    least step a decode updater plans."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 1)
