"""vLLM's model runner V1 step with prompt logprobs, as the implementation
``vllm-v1-prompt-logprobs`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` (implementation ``vllm-v1``), some of their
requests asking for prompt logprobs (``SamplingParams.prompt_logprobs``), so that vLLM
0.33.0's ``GPUModelRunner`` keeps them in ``num_prompt_logprobs`` (``_update_states``)
and ``sample_tokens`` runs ``_get_prompt_logprobs_dict`` (from ``_bookkeeping_sync``):
for each asking request the step scheduled, the rows of its query that score a prompt
token (the hidden states at its ``query_start_loc`` offset, the target tokens its
prompt's from its computed tokens plus one) are copied into the request's
``in_progress_prompt_logprobs_cpu`` at its computed tokens, and the whole prompt's
rows are handed out at the step whose query passes the prompt's last token (a chunk
that ends exactly one token short of it defers them to the next step).

Requests: as :mod:`.runner_step_prompt_logprobs` (V2) draws them: one of an id divisible
by 3 that arrives with no computed tokens asks (top 1), its prompt the tokens known when
it arrives, each a token id of its request and position (:func:`.prompt_token`).

Judged: the step's eager and padded builds gain, by request in the batch's rows,
``prompt_logprobs.rows`` (the rows handed out at this step) and
``prompt_logprobs.tokens`` (how many of them, in order, score the prompt's next token:
column 0 of ``logprob_token_ids``), each held to ``prompt_logprobs.expected``
(*agreement within a build*: the prompt's length less one at the step whose query
reaches the prompt's end, else 0), and to each other's (*padding invariance*). V1
samples every step as it runs, so nothing waits for the next step. The fresh engine's
requests never ask (its warm-up adds them with the tokens they had computed, which one
that asks never does); its builds carry none of these fields.

Stood in: the logits the prompt rows are scored with (zeros over the vocabulary: the
scores are not judged, the rows and their tokens are), and what :mod:`.runner_step_v1`
stands in. Declined: drafts (``vllm-v1`` runs them), and what ``vllm-v1`` declines.
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
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step_prompt_logprobs import (
    asks,
    next_prompt_token,
    prompt_token,
    with_step_fields,
)
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)
from attnfuzz.reference.trace import Trace, as_trace

prepare = v1.prepare


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines, and engines with drafts."""
    if case.config.num_spec > 0:
        return "drafts: vllm-v1 runs them; this implementation judges the prompt's rows"
    return v1.declines(case)


class _TokenModel(v1._Model):
    """``vllm-v1``'s stand-in model, whose hidden state of a token is its token id: the
    row the runner takes for a prompt token says which token it was."""

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> torch.Tensor:
        hidden = super().forward(input_ids=input_ids, positions=positions, **kwargs)
        if input_ids is None:
            return hidden
        return input_ids.to(torch.float32).view(-1, 1)  # exact below 2**24


class _LogprobsEngine(v1._Engine):
    """A V1 engine whose arriving requests of ids divisible by 3 ask for prompt
    logprobs (where ``asking``), and which keeps what each step handed out."""

    asking = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.asked: dict[str, int] = {}  # each asking request's prompt length
        self.handed: dict[str, Any] = {}  # the last step's prompt logprobs, by request
        super().__init__(*args, **kwargs)

    def target_model(self) -> torch.nn.Module:
        return _TokenModel(self.recorder)

    def _build(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        super()._build(config, device, mode)
        runner = self.runner

        def predicted(hidden_states: torch.Tensor) -> torch.Tensor:
            # The prompt rows' logits: the next prompt token of the row's token, its
            # logit 1 and every other 0 (the model's prediction of the target).
            vocab_size = runner.input_batch.vocab_size
            tokens = hidden_states[:, 0].to(torch.int64).tolist()
            logits = torch.zeros(len(tokens), vocab_size)
            for row, token in enumerate(tokens):
                logits[row, next_prompt_token(token, vocab_size)] = 1.0
            return logits.to(hidden_states.device)

        def scored(hidden_states: torch.Tensor, num_scheduled_tokens: dict[str, int]) -> Any:
            with contextlib.ExitStack() as stack:
                stack.enter_context(mock.patch.object(runner.model, "compute_logits", predicted))
                if self.device.type == "cpu":
                    # Its copies to the host are synchronized with the device
                    # (_sync_device): on a CPU there is none, the copies made as issued.
                    stack.enter_context(
                        mock.patch("torch.accelerator.synchronize", lambda *a, **k: None)
                    )
                # The class's function as it is now (a mutant patches it).
                own = type(runner)._get_prompt_logprobs_dict
                handed = own(runner, hidden_states, num_scheduled_tokens)
            self.handed = dict(handed)
            return handed

        runner._get_prompt_logprobs_dict = scored

    def output(self, inputs: RunnerStepInputs) -> Any:
        from vllm import SamplingParams

        out = super().output(inputs)
        self.handed = {}
        for rid in inputs.finished_req_ids:
            self.asked.pop(str(rid), None)
        vocab_size = self.runner.input_batch.vocab_size
        for new in out.scheduled_new_reqs:
            rid = int(new.req_id)
            self.asked.pop(new.req_id, None)
            if not (self.asking and asks(rid, new.num_computed_tokens)):
                continue
            tokens = [prompt_token(rid, p, vocab_size) for p in range(len(new.prompt_token_ids))]
            new.prompt_token_ids, new.prefill_token_ids = tokens, list(tokens)
            new.sampling_params = SamplingParams(temperature=0.0, prompt_logprobs=1)
            self.asked[new.req_id] = len(tokens)
        return out


def logprob_fields(
    engine: _LogprobsEngine, inputs: RunnerStepInputs, predictions: bool
) -> tuple[Field, ...]:
    """The step's prompt-logprobs fields by request, in the batch's rows (module
    docstring); ``prompt_logprobs.predicted`` where ``predictions`` (the model ran)."""
    step = {
        str(rid): (c, q)
        for rid, c, q in zip(
            inputs.req_ids, inputs.num_computed_tokens, inputs.query_lens, strict=True
        )
    }
    vocab_size = engine.runner.input_batch.vocab_size
    rows, tokens, predicted, expected = [], [], [], []
    for req_id in engine.runner.input_batch.req_ids:
        got = engine.handed.get(req_id)
        pairs = [] if got is None else got.logprob_token_ids[:, :2].tolist()
        rows.append(len(pairs))
        tokens.append(
            sum(t == prompt_token(int(req_id), i + 1, vocab_size) for i, (t, _) in enumerate(pairs))
        )
        predicted.append(sum(top == t for t, top in pairs))
        length = engine.asked.get(req_id)
        computed, q = step[req_id]
        # The step whose query reaches the prompt's end hands the whole prompt's rows,
        # one per prompt token after the first; every other step none.
        ends_prompt = length is not None and computed < length <= computed + q
        expected.append(length - 1 if length is not None and ends_prompt else 0)

    def held(name: str, values: list[int]) -> Field:
        return Field(name, "requests", np.asarray(values, dtype=np.int64),
                     agrees_with="prompt_logprobs.expected")  # fmt: skip

    fields = [held("prompt_logprobs.rows", rows), held("prompt_logprobs.tokens", tokens)]
    if predictions:
        fields.append(held("prompt_logprobs.predicted", predicted))
    fields.append(
        Field("prompt_logprobs.expected", "requests", np.asarray(expected, dtype=np.int64))
    )
    return tuple(fields)


class LogprobsRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, some requests of the eager and the graph engine
    asking for prompt logprobs."""

    engine_type = _LogprobsEngine
    _making_fresh = False

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> v1._Engine:
        made = super().engine(config, device, mode)
        assert isinstance(made, _LogprobsEngine)
        made.asking = not self._making_fresh
        return made

    def _fresh(self, *args: Any, **kwargs: Any) -> list[StepBuild]:
        self._making_fresh = True
        try:
            return super()._fresh(*args, **kwargs)
        finally:
            self._making_fresh = False

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        out = super().__call__(inputs)
        extra: dict[str, tuple[Field, ...]] = {}
        # A graph's replay here runs no model (v1._Graph): only the eager engine's
        # hidden states are the step's own.
        for how, engine in (("eager", self.eager), ("padded", self.graphs)):
            assert isinstance(engine, _LogprobsEngine)
            extra[how] = logprob_fields(engine, inputs, predictions=how == "eager")
        return with_step_fields(out, extra)


ENGINE = LogprobsRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-prompt-logprobs`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-prompt-logprobs`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _handed_early() -> Iterator[None]:
    """The defect: ``_get_prompt_logprobs_dict`` takes a chunk for the prompt's last when
    its tokens reach the last prompt token to score (``num_tokens <
    num_remaining_tokens`` for ``<=``), so a chunk that ends one token short of the
    prompt hands its rows out a step early. Made by handing the runner's function one
    more scheduled token for such a request: the rows it scores are the same."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._get_prompt_logprobs_dict

    def early(self: Any, hidden_states: torch.Tensor, num_scheduled: dict[str, int]) -> Any:
        bumped = dict(num_scheduled)
        for req_id in self.num_prompt_logprobs:
            request, n = self.requests.get(req_id), num_scheduled.get(req_id)
            if request is None or n is None or request.prompt_token_ids is None:
                continue
            remaining = len(request.prompt_token_ids) - request.num_computed_tokens - 1
            if n == remaining:
                bumped[req_id] = n + 1
        return original(self, hidden_states, bumped)

    with mock.patch.object(GPUModelRunner, "_get_prompt_logprobs_dict", early):
        yield


def run_handed_early(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-prompt-logprobs-handed-early``: ``vllm-v1-prompt-logprobs``
    with :func:`_handed_early` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(LogprobsRunnerStepEngine(), _handed_early)
run_handed_early.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


def reach_prompt_logprobs(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-prompt-logprobs`` runs: V1, no drafts."""
    return trace.config.runner == "v1" and trace.config.num_spec == 0


def trigger_handed_early(trace: Trace | Case) -> bool:
    """A request that asks (it arrives with nothing computed) runs a step whose query
    ends one token short of its prompt's end: its prompt is what its first step says
    (``prompt_lens``), at least that step's query, at most the model's length."""
    if not reach_prompt_logprobs(trace):
        return False
    prompts: dict[int, int] = {}
    config = trace.config
    for b in as_trace(trace).steps:
        said = b.prompt_lens or (0,) * b.num_reqs
        for rid, c, q, p in zip(b.request_ids, b.num_computed_tokens, b.q_lens, said,
                                strict=True):  # fmt: skip
            if rid not in prompts:
                prompts[rid] = min(max(c + q, p, 1), config.max_model_len) if asks(rid, c) else 0
            length = prompts[rid]
            if length and c < length and c + q == length - 1:
                return True
    return False


def smallest_handed_early() -> Trace:
    """Request 3 prefills 4 tokens of its 5-token prompt: its rows are due at the step
    that runs its 5th; the defect hands its 4 out at this one."""
    config = dataclasses.replace(rs.smallest_config(), runner="v1")
    return Trace(
        config,
        (Batch((0,), (4,), req_ids=(3,), pages=((1,),), new_pages=(1,), prompt_lens=(5,)),),
    )
