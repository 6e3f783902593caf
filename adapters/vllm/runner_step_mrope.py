"""vLLM's model runner V2 step with an M-RoPE model (Qwen2-VL's family), as the
implementation ``vllm-mrope`` of ``runner-step``.

The engines of :mod:`.runner_step` (implementation ``vllm``), their model config
declaring M-RoPE (``rope_parameters["mrope_section"]``: ``ModelConfig.uses_mrope``), so
that vLLM 0.33.0's default model state keeps a ``RopeState``
(``v1/worker/gpu/mm/rope.py``, ``get_rope_state``): each request's prompt positions
from the model's ``get_mrope_input_positions`` (``init_prefill_positions``, staged when
``add_request`` adds it), each step's rows written by ``prepare_positions``' Triton
kernel (``_prepare_rope_positions_kernel``: a prefill's from the staged rows, a
decode's its position plus the request's delta), which ``DefaultModelState
.prepare_inputs`` hands the model in place of the 1-D positions; the dummy runs and the
captures read the same buffer (``prepare_dummy_inputs``).

Judged: each channel's row as a field of its own (``mrope.positions[c]``), by every
property of ``vllm``'s fields, and against the 1-D positions of the same tokens
(``Field.agrees_with``): vLLM's own contract for text (``RopeState``: "For text-only
inputs, each dimension has identical position IDs"). The tokens here are text.

Stood in: the model's ``get_mrope_input_positions``
(:func:`.runner_step_v1_mrope.text_positions`), and what :mod:`.runner_step` stands in.
Declined: drafts (the speculators' M-RoPE positions are not driven here).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step as rs
from attnfuzz.adapters.vllm import runner_step_v1_mrope as v1_mrope
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = rs.prepare


def declines(case: Case) -> str | None:
    """``vllm``'s declines, and engines with drafts."""
    if case.config.num_spec > 0:
        return "drafts: the speculator's M-RoPE positions are not driven by this adapter"
    return rs.declines(case)


class _MRoPEModel(v1_mrope.TextMRoPE, rs._Model):
    """``vllm``'s stand-in model, of an M-RoPE architecture."""

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> torch.Tensor:
        self.recorder.forward(positions)
        return torch.zeros(positions.shape[-1], 1)


class _MRoPERecorder(rs._Recorder):
    """Where an M-RoPE model reports what it read: the runner's 1-D positions of the
    forward's tokens (``flat``, a view of its input buffer), the channels beside them."""

    flat: Callable[[int], torch.Tensor] | None = None

    def handed(self, positions: torch.Tensor, layer: str = rs._LAYER) -> rs._Seen:
        if positions.ndim == 1 or self.flat is None:
            return super().handed(positions, layer)
        seen = super().handed(self.flat(int(positions.shape[-1])), layer)
        seen.channels = positions
        return seen


class _MRoPEEngine(rs._StartUpEngine):
    """A V2 engine of an M-RoPE model."""

    recorder_type = _MRoPERecorder

    def configure(self, vc: Any) -> Any:
        return v1_mrope.with_mrope(super().configure(vc))

    def target_model(self) -> rs._Model:
        recorder = self.recorder
        assert isinstance(recorder, _MRoPERecorder)
        recorder.flat = lambda n: self.runner.input_buffers.positions[:n]
        return _MRoPEModel(recorder)

    def step_seen(self, state: Any) -> rs._Seen:
        seen = super().step_seen(state)
        rope = self.runner.model_state.rope_state
        seen.channels = rope.get_positions(int(seen.positions.shape[0]))
        return seen

    def fields(self, seen: rs._Seen, *, history: bool = True) -> tuple[Field, ...]:
        """``vllm``'s fields, and each channel's row (:func:`.runner_step_v1_mrope.channels`)."""
        assert seen.channels is not None
        rows = v1_mrope.channels(seen.channels, self.vllm_config)
        return super().fields(seen, history=history) + rows


class MRoPERunnerStepEngine(rs.RunnerStepEngine):
    """``vllm``'s three engines, of an M-RoPE model."""

    engine_type = _MRoPEEngine


ENGINE = MRoPERunnerStepEngine()
"""The engine of the implementation ``vllm-mrope`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-mrope`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _computed_one_short() -> Iterator[None]:
    """The defect: ``RopeState.prepare_positions`` hands its kernel each request's
    computed tokens one short, as if counted before the step's last sampled token: every
    channel of a decode token (and of a later prefill chunk) one below its position."""
    from vllm.v1.worker.gpu.mm.rope import RopeState

    original = RopeState.prepare_positions

    def one_short(self: Any, idx_mapping: Any, query_start_loc: Any, prefill_lens: Any,
                  num_computed_tokens: Any) -> None:  # fmt: skip
        original(self, idx_mapping, query_start_loc, prefill_lens,
                 (num_computed_tokens - 1).clamp(min=0))  # fmt: skip

    with mock.patch.object(RopeState, "prepare_positions", one_short):
        yield


def run_computed_one_short(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-mrope-computed-one-short``: ``vllm-mrope`` with
    :func:`_computed_one_short` in force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(MRoPERunnerStepEngine(), _computed_one_short)
run_computed_one_short.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


reach_mrope = rs.reach_without_drafts
"""An engine ``vllm-mrope`` runs: V2, no drafts."""


def trigger_computed_one_short(trace: Trace | Case) -> bool:
    """A step of a request with tokens computed before it: its positions start past 0."""
    return reach_mrope(trace) and any(
        computed > 0 for b in as_trace(trace).steps for computed in b.num_computed_tokens
    )


def smallest_computed_one_short() -> Trace:
    """One request prefills 3 tokens, then decodes its 4th (V2): the decode token's
    channels 2 where its position is 3."""
    trace = v1_mrope.smallest_completion_from_tokens()
    return Trace(dataclasses.replace(trace.config, runner="v2"), trace.steps)
