"""vLLM's model runner V2 step with prompt embeddings (``--enable-prompt-embeds``), as
the implementation ``vllm-prompt-embeds`` of ``runner-step``.

The engines of :mod:`.runner_step` (implementation ``vllm``), their model config
enabling prompt embeddings (``ModelConfig.enable_prompt_embeds``), so that vLLM 0.33.0's
default model state keeps a ``PromptEmbedsState``
(``v1/worker/gpu/model_states/prompt_embeds.py``): each request's embeddings copied
once when ``add_request`` adds it, a table of their addresses and lengths, and each
step ``DefaultModelState.prepare_inputs_embeds``: the token embeddings of the step's
tokens (``embed_input_ids``) written into the persistent ``inputs_embeds`` buffer, then
``PromptEmbedsState.apply``'s Triton kernel (``_apply_prompt_embeds_kernel``) laying
each request's prompt rows over its tokens (its query from ``query_start_loc``, its
rows from the request's computed tokens, up to the embeddings' length, skipping the
positions its ``prompt_is_token_ids`` mask marks as token ids). The model is handed
that buffer in place of the token ids, eager, in a piecewise graph and in a FULL
graph's replay (``dummy_inputs_embeds``: the same buffer at capture).

Requests, by their id (so that the search meets each kind beside the others): an
even id arrives with prompt embeddings, a multiple of 4 only those (no token ids, as
vLLM's ``Request`` makes an embeddings-only prompt: placeholder ids of 0), the others
of the even ones with token ids too and the mask of a mixed prompt (every third
position a token id); an odd id with token ids alone. A request's embeddings cover its
prompt as the step says it (``RunnerStepInputs.prompt_lens``; not said: the tokens
known at the end of its query), so that they are a function of the step alone (the
fresh engine of *history invariance* makes the same); its tokens past them, which a
step's query reaches where the prompt is shorter than what the request holds, are
token ids. Its embedding
row at position ``p`` is a tag of the request and ``p`` (:func:`tag`), exact in the
model's dtype; a token id's embedding is zeros.

Judged: each token's row of ``inputs_embeds`` as the field ``prompt_embeds.tag`` (the
tag its row holds, -1 for a token embedding), by every property of ``vllm``'s fields,
and, where the build has the runner's input batch, against ``prompt_embeds.expected``
(*agreement within a build*): the tag of the token's request (the request the build's
``query_start_loc`` puts it in) at the token's position (the build's ``positions``)
where that position lies inside the request's embeddings and is not a token id, else
-1. That is the contract of ``PromptEmbedsState``: the embedding a prompt position was
given is that position's input.

Stood in: the model's ``embed_input_ids`` (zeros), and what :mod:`.runner_step` stands
in. Declined: drafts (a speculator's inputs of a prompt-embeddings request are not
driven here), and what ``vllm`` declines.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step as rs
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = rs.prepare

_SCALE = 64  # a tag's parts, each under 256: exact in bfloat16
_TAG_COLUMNS = 4  # marker, request, position // _SCALE, position % _SCALE


def declines(case: Case) -> str | None:
    """``vllm``'s declines, and engines with drafts."""
    if case.config.num_spec > 0:
        return "drafts: a speculator's inputs of a prompt-embeddings request are not driven"
    return rs.declines(case)


def has_embeds(req_id: int) -> bool:
    """Whether request ``req_id`` arrives with prompt embeddings (an even id)."""
    return req_id % 2 == 0


def is_mixed(req_id: int) -> bool:
    """Whether its prompt mixes token ids with its embeddings (even, not a multiple of 4)."""
    return req_id % 4 == 2


def is_token_id(position: int) -> bool:
    """Whether a mixed prompt's position holds a token id (every third)."""
    return position % 3 == 0


def tag(req_id: int, position: int) -> int:
    """The tag of request ``req_id``'s embedding row at ``position``."""
    return (req_id % 200 + 1) * (1 << 20) + position


def _embeddings(req_id: int, length: int, hidden_size: int) -> torch.Tensor:
    """Request ``req_id``'s prompt embeddings: row ``p`` a marker 1, the request's code,
    then ``p`` in two parts, each exact in the model's dtype (:func:`_decode`)."""
    rows = torch.zeros(length, hidden_size)
    p = torch.arange(length)
    rows[:, 0] = 1
    rows[:, 1] = req_id % 200 + 1
    rows[:, 2] = torch.div(p, _SCALE, rounding_mode="floor")
    rows[:, 3] = p % _SCALE
    return rows


def _decode(embeds: torch.Tensor) -> np.ndarray:
    """The tag each row of ``embeds`` holds (:func:`_embeddings`), -1 for a row that is not
    a prompt embedding (a token's: zeros)."""
    parts = embeds[:, :_TAG_COLUMNS].to(torch.float32).round().to(torch.int64).numpy()
    tags = parts[:, 1] * (1 << 20) + parts[:, 2] * _SCALE + parts[:, 3]
    return np.where(parts[:, 0] == 1, tags, -1)


@dataclasses.dataclass(frozen=True)
class _Prompt:
    """What a request's embeddings cover: their rows, and a mixed prompt's mask."""

    length: int
    mixed: bool


class _EmbedsModel(rs._Model):
    """``vllm``'s stand-in model, taking ``inputs_embeds``: reports them beside the rest."""

    def __init__(self, recorder: rs._Recorder, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__(recorder)
        self.hidden_size, self.dtype = hidden_size, dtype

    def embed_input_ids(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.hidden_size, dtype=self.dtype)

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> torch.Tensor:
        assert isinstance(self.recorder, _EmbedsRecorder)
        self.recorder.embeds = kwargs.get("inputs_embeds")
        return super().forward(input_ids, positions, **kwargs)


class _EmbedsRecorder(rs._Recorder):
    """Where the model reports what it read, the embeddings it was handed too."""

    embeds: torch.Tensor | None = None

    def handed(self, positions: torch.Tensor, layer: str = rs._LAYER) -> rs._Seen:
        seen = super().handed(positions, layer)
        seen.embeds = self.embeds
        return seen


class _EmbedsEngine(rs._StartUpEngine):
    """A V2 engine with prompt embeddings enabled."""

    recorder_type = _EmbedsRecorder

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.prompts: dict[str, _Prompt] = {}
        super().__init__(*args, **kwargs)

    def configure(self, vc: Any) -> Any:
        vc = super().configure(vc)
        vc.model_config.enable_prompt_embeds = True  # --enable-prompt-embeds
        return vc

    def target_model(self) -> rs._Model:
        mc = self.vllm_config.model_config
        return _EmbedsModel(self.recorder, mc.get_hidden_size(), mc.dtype)

    def output(self, inputs: RunnerStepInputs, held: set[str]) -> Any:
        """``vllm``'s scheduler output, each new request of an even id with its prompt
        embeddings (and a mixed prompt's mask), as vLLM's ``Request`` hands them."""
        out = super().output(inputs, held)
        hidden_size = self.vllm_config.model_config.get_hidden_size()
        said = dict(zip(map(str, inputs.req_ids), inputs.prompt_lens, strict=False))
        for new in out.scheduled_new_reqs:
            rid = int(new.req_id)
            if not has_embeds(rid):
                self.prompts.pop(new.req_id, None)
                continue
            # The embeddings cover the prompt the step says; what the request holds past
            # it is token ids (prefill_token_ids), as vLLM's Request keeps its outputs.
            known = len(new.prefill_token_ids)
            length = min(said.get(new.req_id) or known, known)
            new.prompt_embeds = _embeddings(rid, length, hidden_size)
            if is_mixed(rid):
                new.prompt_token_ids = [0] * length
                new.prompt_is_token_ids = [is_token_id(p) for p in range(length)]
            else:
                new.prompt_token_ids = None  # Request: an embeddings-only prompt
            self.prompts[new.req_id] = _Prompt(length, is_mixed(rid))
        return out

    def step_seen(self, state: Any) -> rs._Seen:
        seen = super().step_seen(state)
        buffer = self.runner.model_state.inputs_embeds
        seen.embeds = buffer[: int(seen.positions.shape[0])]
        return seen

    def fields(self, seen: rs._Seen, *, history: bool = True) -> tuple[Field, ...]:
        """``vllm``'s fields, each token's embedding tag and, where the build has the
        input batch, the tag its position was given (:func:`expected_tags`)."""
        out = super().fields(seen, history=history)
        if seen.embeds is None:
            return out  # a forward handed token ids (none here: every forward has embeds)
        tags = _decode(seen.embeds)
        if seen.batch is None:
            return (*out, Field("prompt_embeds.tag", "tokens", tags))
        expected = expected_tags(seen.batch, rs._np(seen.positions), self.prompts)
        return (
            *out,
            # The model's input row of each token: a prompt embedding's tag or -1.
            Field("prompt_embeds.tag", "tokens", tags, agrees_with="prompt_embeds.expected"),
            Field("prompt_embeds.expected", "tokens", expected),
        )


def expected_tags(batch: Any, positions: np.ndarray, prompts: dict[str, _Prompt]) -> np.ndarray:
    """Each real token's tag as its request's prompt gave it (:func:`tag`; -1: a token
    id's embedding), the token's request the one ``query_start_loc`` puts it in."""
    out = np.full(len(positions), -1, dtype=np.int64)
    qsl = batch.query_start_loc_np
    for i, req_id in enumerate(batch.req_ids):
        prompt = prompts.get(req_id)
        if prompt is None:
            continue
        for t in range(int(qsl[i]), int(qsl[i + 1])):
            p = int(positions[t])
            if p < prompt.length and not (prompt.mixed and is_token_id(p)):
                out[t] = tag(int(req_id), p)
    return out


class EmbedsRunnerStepEngine(rs.RunnerStepEngine):
    """``vllm``'s three engines, prompt embeddings enabled."""

    engine_type = _EmbedsEngine


ENGINE = EmbedsRunnerStepEngine()
"""The engine of the implementation ``vllm-prompt-embeds`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-prompt-embeds`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _computed_one_short() -> Iterator[None]:
    """The defect: ``PromptEmbedsState.apply`` hands its kernel each request's computed
    tokens one short: a prompt chunk after the request's first step takes the rows one
    position early, and its first decode the prompt's last row."""
    from vllm.v1.worker.gpu.model_states.prompt_embeds import PromptEmbedsState

    original = PromptEmbedsState.apply

    def one_short(
        self: Any, input_batch: Any, num_computed_tokens: Any, inputs_embeds: Any
    ) -> None:
        original(self, input_batch, (num_computed_tokens - 1).clamp(min=0), inputs_embeds)

    with mock.patch.object(PromptEmbedsState, "apply", one_short):
        yield


def run_computed_one_short(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-prompt-embeds-computed-one-short``: ``vllm-prompt-embeds`` with
    :func:`_computed_one_short` in force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(EmbedsRunnerStepEngine(), _computed_one_short)
run_computed_one_short.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


reach_prompt_embeds = rs.reach_without_drafts
"""An engine ``vllm-prompt-embeds`` runs: V2, no drafts."""


def trigger_computed_one_short(trace: Trace | Case) -> bool:
    """A step of a request with prompt embeddings and tokens computed before it."""
    return reach_prompt_embeds(trace) and any(
        computed > 0 and has_embeds(rid)
        for b in as_trace(trace).steps
        for rid, computed in zip(b.request_ids, b.num_computed_tokens, strict=True)
    )


def smallest_computed_one_short() -> Trace:
    """Request 4 (embeddings only) prefills its 3-token prompt, then decodes its 4th
    token on a FULL graph of 2 tokens: the decode token, past the prompt, takes the
    prompt's last row under the defect."""
    return Trace(
        rs.smallest_config(),
        (
            Batch((0,), (3,), req_ids=(4,), pages=((1,),), new_pages=(1,)),
            Batch((3,), (1,), req_ids=(4,), pages=((1,),), new_pages=(0,)),
        ),
    )
