"""vLLM's model runner V1 step with an M-RoPE model (Qwen2-VL's family), as the
implementation ``vllm-v1-mrope`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` (implementation ``vllm-v1``), their model config
declaring M-RoPE (``rope_parameters["mrope_section"]``: ``ModelConfig.uses_mrope``), so
that vLLM 0.33.0's ``GPUModelRunner`` keeps ``mrope_positions`` (one row a position
channel, ``mrope_num_dims``) and hands the model those instead of the 1-D positions: a
request's prompt positions from the model's ``get_mrope_input_positions``
(``_init_mrope_positions``, when ``_update_states`` adds it), each step's rows from
``_calc_mrope_positions`` (the prompt's part copied, the completion's from
``MRotaryEmbedding.get_next_input_positions_tensor``), copied row by row in
``_prepare_inputs``; the graph's padded tokens and the dummy runs read the same buffer.

Judged: each channel's row as a field of its own (``mrope.positions[c]``), by every
property of ``vllm-v1``'s fields, and against the 1-D positions the runner computed for
the same tokens (``Field.agrees_with``): vLLM's own contract for text ("For text-only
inputs, each dimension has identical position IDs, making M-RoPE functionally
equivalent to 1D-RoPE", ``GPUModelRunner.__init__``). The tokens here are text.

Drafts: the drafter is an M-RoPE model too (its own ``mrope_positions``, written by
``_set_positions`` and, between draft sub-steps, from its first channel) or a text one
(``_set_positions`` hands it the target's first channel), chosen from the config
(:func:`drafter_mrope`); a draft build's channels are judged against its first.

Stood in: the model's ``get_mrope_input_positions`` (text: every channel the token's
index, a delta of 0, as Qwen2-VL's is for a prompt with no image or video), and what
:mod:`.runner_step_v1` stands in.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = v1.prepare

MROPE_SECTION = (2, 1, 1)
"""The model's M-RoPE section: three channels (T, H, W), as Qwen2-VL's."""


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines (drafts are run: :func:`drafter_mrope`)."""
    return v1.declines(case)


def text_positions(input_tokens: list[int], mm_features: list[Any]) -> tuple[torch.Tensor, int]:
    """``SupportsMRoPE.get_mrope_input_positions`` of a prompt of text: every channel the
    token's index, a delta of 0."""
    n = len(input_tokens)
    return torch.arange(n, dtype=torch.int64).expand(len(MROPE_SECTION), n).clone(), 0


def mrope_model(model_config: Any) -> Any:
    """A copy of ``model_config`` declaring M-RoPE (:data:`MROPE_SECTION`): its HF
    config's ``rope_parameters`` name the section."""
    out = copy.copy(model_config)
    hf = out.hf_config = copy.deepcopy(model_config.hf_config)
    hf.rope_parameters = {"rope_type": "default", "mrope_section": list(MROPE_SECTION)}
    out.hf_text_config = hf.get_text_config()
    return out


def drafter_mrope(config: EngineConfig) -> bool:
    """Whether the engine's drafter is an M-RoPE model too (as a vision-language model's
    EAGLE-3 drafter is), else a text one that ``_set_positions`` hands the first channel:
    both are engines vLLM runs. Chosen from the config (half of them, by
    ``max_model_len``'s parity), not drawn, so that an engine keeps its drafter's kind
    over its life."""
    return config.num_spec > 0 and config.max_model_len % 2 == 1


def with_mrope(vc: Any, drafter: bool = False) -> Any:
    """``vc`` with its model config declaring M-RoPE (:func:`mrope_model`); ``drafter``:
    its draft model's too."""
    vc.model_config = mrope_model(vc.model_config)
    if drafter:
        sc = vc.speculative_config = copy.copy(vc.speculative_config)
        sc.draft_model_config = mrope_model(sc.draft_model_config)
    return vc


def channels(rows: torch.Tensor, vllm_config: Any) -> tuple[Field, ...]:
    """Each channel's row of the positions an M-RoPE model was handed, a field: the
    rotary cache's rows (``rotary_embedding/mrope.py`` ``MRotaryEmbedding``:
    ``cos_sin_cache[positions]``, a cache of ``max_position_embeddings`` rows times a
    factor of at least 1; the model builds it with its config's), and the 1-D positions
    of the same tokens (text)."""
    top = int(vllm_config.model_config.hf_text_config.max_position_embeddings) - 1
    return tuple(
        Field(f"mrope.positions[{c}]", "tokens", v1._np(row), (0, top), agrees_with="positions")
        for c, row in enumerate(rows)
    )


class TextMRoPE:
    """A stand-in model's M-RoPE interface (``SupportsMRoPE``): text positions
    (:func:`text_positions`)."""

    supports_mrope = True

    def get_mrope_input_positions(self, input_tokens: list[int], mm_features: list[Any]) -> Any:
        return text_positions(input_tokens, mm_features)


class _MRoPEModel(TextMRoPE, v1._Model):
    """``vllm-v1``'s stand-in model, of an M-RoPE architecture."""


class _MRoPEHanded(TextMRoPE, v1._Handed):
    """What the runner calls as its model (``get_model`` returns it): M-RoPE's too."""


class _MRoPEEngine(v1._Engine):
    """A V1 engine of an M-RoPE model."""

    def make_config(self, config: EngineConfig, mode: str) -> Any:
        return with_mrope(super().make_config(config, mode), drafter_mrope(config))

    def load(self, resolved: Any) -> Any:
        self.recorder.flat_positions = lambda n: self.runner.positions[:n]
        handed = super().load(resolved)
        return _MRoPEHanded(handed.inner, self.recorder)

    def target_model(self) -> torch.nn.Module:
        return _MRoPEModel(self.recorder)

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        """``vllm-v1``'s fields of the 1-D positions, and each channel's row
        (:func:`channels`)."""
        if seen.positions.dim() == 1:  # a text drafter's forward
            return super().fields(seen)
        # A drafter's M-RoPE forward has no 1-D positions beside: its first channel's.
        one = seen.positions[0] if seen.flat_positions is None else seen.flat_positions
        flat = dataclasses.replace(seen, positions=one, flat_positions=None)
        return super().fields(flat) + channels(seen.positions, self.vllm_config)


class MRoPERunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of an M-RoPE model."""

    engine_type = _MRoPEEngine


ENGINE = MRoPERunnerStepEngine()
"""The engine of the implementation ``vllm-v1-mrope`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-mrope`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _completion_from_tokens() -> Iterator[None]:
    """The defect: ``_calc_mrope_positions`` counts a completion's positions from the
    request's tokens (its last sampled token included) rather than from its computed
    tokens, one past each: the context it hands
    ``MRotaryEmbedding.get_next_input_positions_tensor`` one too long."""
    import vllm.v1.worker.gpu_model_runner as gmr

    rope = gmr.MRotaryEmbedding
    original = rope.get_next_input_positions_tensor

    def one_past(*args: Any, **kwargs: Any) -> Any:
        kwargs["context_len"] += 1
        return original(*args, **kwargs)

    with mock.patch.object(rope, "get_next_input_positions_tensor", one_past):
        yield


def run_completion_from_tokens(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-mrope-completion-one-past``: ``vllm-v1-mrope`` with
    :func:`_completion_from_tokens` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(MRoPERunnerStepEngine(), _completion_from_tokens)
run_completion_from_tokens.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


def reach_mrope(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-mrope`` runs: V1."""
    return trace.config.runner == "v1"


def trigger_completion_from_tokens(trace: Trace | Case) -> bool:
    """A step that runs a request past its prompt (a decode): its completion's positions
    come from ``get_next_input_positions_tensor``. A request's prompt is what its step
    says (``prompt_lens``), else where its first step ended."""
    return reach_mrope(trace) and runs_past_prompt(trace)


def runs_past_prompt(trace: Trace | Case) -> bool:
    """Whether a step runs a request past its prompt (what its step says,
    ``prompt_lens``, else where its first step ended)."""
    prompts: dict[int, int] = {}
    for b in as_trace(trace).steps:
        ids = b.req_ids or tuple(range(len(b.q_lens)))
        said = b.prompt_lens or (None,) * len(ids)
        for rid, computed, q, prompt in zip(ids, b.num_computed_tokens, b.q_lens, said,
                                            strict=True):  # fmt: skip
            end = prompts.setdefault(rid, prompt if prompt is not None else computed + q)
            if computed + q > end:
                return True
    return False


def smallest_completion_from_tokens() -> Trace:
    """One request prefills 3 tokens, then decodes its 4th (padded to the FULL graph of 2
    tokens): its position 3, which the defect makes 4 in every channel
    (:func:`.runner_step_hybrid.smallest_full_decode`)."""
    from attnfuzz.adapters.vllm.runner_step_hybrid import smallest_full_decode

    return smallest_full_decode()
