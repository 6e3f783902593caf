"""vLLM's model runner V2 step with prompt logprobs, as the implementation
``vllm-prompt-logprobs`` of ``runner-step``.

The engines of :mod:`.runner_step` (implementation ``vllm``), some of their requests
asking for prompt logprobs (``SamplingParams.prompt_logprobs``), so that vLLM 0.33.0's
``sample_tokens`` runs ``PromptLogprobsWorker.compute_prompt_logprobs``
(``v1/worker/gpu/sample/prompt_logprob.py``): the Triton
``_prompt_logprobs_token_ids_kernel`` reads each token's next prompt token from the
request's token ids (at its computed tokens plus one, its query from
``query_start_loc``), ``compute_prompt_logprobs_with_chunking`` scores them, and each
request's rows of the step (its query rows, less the last where the prompt ends) are
kept across the chunks of a chunked prompt and handed out, concatenated, at the step
its prompt ends (``in_progress_prompt_logprobs``).

A request may ask for its prompt rows' scores of given token ids too
(``SamplingParams.prompt_logprob_token_ids`` from ``prompt_logprob_start``):
``compute_prompt_token_id_logprobs`` takes each chunk's rows of the hidden states at
the request's ``query_start_loc`` offset less its computed prefill tokens, scores
the ids, and hands the rows out at the step the prompt ends.

Its sampled tokens' logprobs too: requests that ask for them make the sampler run
``compute_topk_scores`` (``v1/worker/gpu/sample/logprob.py``), where a request's own
token ids (``SamplingParams.logprob_token_ids``, kept by slot in
``LogprobTokenIdsState``) take the columns after its sampled token's, filled by
``_fill_logprob_token_ids_kernel`` through ``expanded_idx_mapping`` (batch row to
request slot), beside the top-k columns of the requests that ask for those.

Requests: one of an id divisible by 3 that arrives with no computed tokens asks for
prompt logprobs (top 1), as vLLM's scheduler can only hand it: a request that asks
reads no prefix cache (``SamplingParams.skip_reading_prefix_cache``). Its prompt is the
tokens known when it arrives (:func:`.runner_step._scheduler_output`), each a token id
of its request and position (:func:`prompt_token`); odd ones among them score rows by
token id (:func:`prompt_token_id_rows`). Ids 1 mod 3 ask for the logprobs of
one to three token ids of their own (:func:`own_token_ids`), ids 2 mod 6 for the top
logprob of each sampled token.

Judged: each step is sampled as soon as it ran (no drafts: the sampler's verdict needs
nothing of the next step), on the engine with the config's graphs and the eager one.
Their step's builds gain, by request, ``prompt_logprobs.rows`` (the rows handed out for
the request at this step) and ``prompt_logprobs.tokens`` (how many of them, in order,
score the prompt's next token: column 0 of ``logprob_token_ids``), each held to
``prompt_logprobs.expected`` (*agreement within a build*: the prompt's length less one
for a request that asked and whose prompt ends at this step, else 0), and both by
*padding invariance* to each other's; and ``sampled_logprobs.own_token_ids`` (1 where
the request's row holds its own token ids after its sampled token, the rest of the row
empty), held to ``sampled_logprobs.asked_own`` (1 for a request that asked for them);
and ``prompt_token_id_logprobs.rows``, held to ``prompt_token_id_logprobs.expected`` (the
rows asked at the step the prompt ends, else 0). The eager build, whose model ran the
step (a graph's replay here runs none), gains what the model predicted: the stand-in
model's hidden state of a token is its id and a prompt row's logits put the next prompt
token first, so ``prompt_logprobs.predicted`` (rows whose top token is the target) and
``prompt_token_id_logprobs.scored`` (rows that score the next token near 0 and the
other id far below) count the rows taken from their own token's hidden state, held to
the same expected counts: a row taken at a wrong offset predicts another token.
The fresh engine's step is not judged on them: it is sampled later, and its requests
arrive with the tokens they had computed, which one that asks for prompt logprobs never
does.

Stood in: the model's hidden states (a token's id) and the logits the prompt rows are
scored with (the next prompt token's 100, every other 0), and what :mod:`.runner_step`
stands in.
Declined: drafts, and what ``vllm`` declines.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
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


def declines(case: Case) -> str | None:
    """``vllm``'s declines, and engines with drafts."""
    if case.config.num_spec > 0:
        return "drafts: the step is sampled before the next one says what was accepted"
    return rs.declines(case)


def asks(req_id: int, computed: int) -> bool:
    """Whether request ``req_id``, arriving with ``computed`` tokens, asks for prompt
    logprobs: an id divisible by 3, with none computed (one that asks reads no prefix
    cache)."""
    return req_id % 3 == 0 and computed == 0


def own_token_ids(req_id: int, vocab_size: int) -> list[int] | None:
    """The token ids whose logprobs request ``req_id`` asks of each token it samples
    (``SamplingParams.logprob_token_ids``): one to three ids of the request, for ids 1
    mod 3; None for the others."""
    if req_id % 3 != 1:
        return None
    return [1 + (req_id * 13 + k) % (vocab_size - 1) for k in range(1 + (req_id // 3) % 3)]


def asks_top_logprob(req_id: int) -> bool:
    """Whether request ``req_id`` asks for its sampled tokens' top logprob
    (``SamplingParams.logprobs`` 1): even ids 2 mod 3, beside the others' own ids."""
    return req_id % 6 == 2


def prompt_token(req_id: int, position: int, vocab_size: int) -> int:
    """The token id at ``position`` of request ``req_id``'s prompt (never 0: the other
    requests' placeholder)."""
    return 1 + (req_id * 31 + position * 7) % (vocab_size - 1)


def next_prompt_token(token: int, vocab_size: int) -> int:
    """The token after ``token`` in any prompt of :func:`prompt_token`: the same step
    along the vocabulary whatever the request."""
    return 1 + (token - 1 + 7) % (vocab_size - 1)


def prompt_token_id_rows(
    req_id: int, length: int, vocab_size: int
) -> tuple[int, np.ndarray] | None:
    """What request ``req_id``, asking for prompt logprobs with a prompt of ``length``
    tokens, asks of its prompt rows by token id (``SamplingParams.prompt_logprob_token_ids``
    from ``prompt_logprob_start``), None where it asks nothing: odd ids, from row 0 to 2
    (at most the prompt's last row but one), each row two ids, the prompt's next token
    and another, the other -1 (a pad) every third row."""
    if req_id % 2 == 0 or length < 2:
        return None
    start = min((req_id // 6) % 3, length - 2)
    rows = np.zeros((length - 1 - start, 2), dtype=np.int32)
    for i in range(rows.shape[0]):
        rows[i, 0] = prompt_token(req_id, start + i + 1, vocab_size)
        rows[i, 1] = -1 if i % 3 == 2 else next_prompt_token(int(rows[i, 0]), vocab_size)
    return start, rows


class _TokenModel(rs._Model):
    """``vllm``'s stand-in model, whose hidden state of a token is its token id: the row
    a prompt's scores are taken from says which token it was."""

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> torch.Tensor:
        hidden = super().forward(input_ids=input_ids, positions=positions, **kwargs)
        if input_ids is None:
            return hidden
        return input_ids.to(torch.float32).view(-1, 1)  # exact below 2**24


class _LogprobsEngine(rs._StartUpEngine):
    """A V2 engine whose requests of ids divisible by 3 ask for prompt logprobs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.asked: dict[str, int] = {}  # each asking request's prompt length
        self.rows_asked: dict[str, int] = {}  # the prompt rows each scores by token id
        super().__init__(*args, **kwargs)

    def target_model(self) -> rs._Model:
        return _TokenModel(self.recorder)

    def output(self, inputs: RunnerStepInputs, held: set[str]) -> Any:
        from vllm import SamplingParams

        out = super().output(inputs, held)
        for rid in inputs.finished_req_ids:
            self.asked.pop(str(rid), None)
            self.rows_asked.pop(str(rid), None)
        vocab_size = self.runner.vocab_size
        for new in out.scheduled_new_reqs:
            rid = int(new.req_id)
            self.asked.pop(new.req_id, None)
            self.rows_asked.pop(new.req_id, None)
            own = own_token_ids(rid, vocab_size)
            if own is not None:
                new.sampling_params = SamplingParams(temperature=0.0, logprob_token_ids=own)
            elif asks_top_logprob(rid):
                new.sampling_params = SamplingParams(temperature=0.0, logprobs=1)
            if not asks(rid, new.num_computed_tokens):
                continue
            tokens = [prompt_token(rid, p, vocab_size) for p in range(len(new.prompt_token_ids))]
            new.prompt_token_ids, new.prefill_token_ids = tokens, list(tokens)
            by_id = prompt_token_id_rows(rid, len(tokens), vocab_size)
            start, rows = (None, None) if by_id is None else by_id
            new.sampling_params = SamplingParams(
                temperature=0.0, prompt_logprobs=1, prompt_logprob_token_ids=rows,
                prompt_logprob_start=start,
            )  # fmt: skip
            self.asked[new.req_id] = len(tokens)
            if rows is not None:
                self.rows_asked[new.req_id] = rows.shape[0]
        return out


@contextlib.contextmanager
def _predicted_prompt_logits(vocab_size: Callable[[], int]) -> Iterator[None]:
    """The logits the prompt rows are scored with, where the runner hands the worker its
    model's ``compute_logits`` (the stand-in's holds the sampler's alone): each row's
    the next prompt token of the token its hidden state names (:class:`_TokenModel`),
    its logit 100 and every other 0, so its log-probability is about 0 and any other
    about -100. A graph's replay here runs no model: its rows name stale tokens, which
    still index the vocabulary."""
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    def predicted(hidden_states: torch.Tensor) -> torch.Tensor:
        size = vocab_size()
        tokens = hidden_states[:, 0].to(torch.int64).remainder(size).tolist()
        logits = torch.zeros(len(tokens), size)
        for row, token in enumerate(tokens):
            logits[row, next_prompt_token(token, size)] = 100.0
        return logits.to(hidden_states.device)

    originals = {
        name: getattr(PromptLogprobsWorker, name)
        for name in ("compute_prompt_logprobs", "compute_prompt_token_id_logprobs")
    }

    def scored(name: str) -> Any:
        def call(self: Any, logits_fn: Any, *args: Any) -> Any:
            return originals[name](self, predicted, *args)

        return call

    with contextlib.ExitStack() as stack:
        for name in originals:
            stack.enter_context(mock.patch.object(PromptLogprobsWorker, name, scored(name)))
        yield


@dataclasses.dataclass(frozen=True)
class Sampled:
    """What ``sample_tokens`` handed out for one step: its requests in batch order, the
    prompt logprobs by request, and the token ids of the sampled tokens' logprobs, a
    row a request in batch order (None where no request asked for them)."""

    req_ids: list[str]
    prompt_logprobs: dict[str, Any]
    logprob_token_ids: np.ndarray | None
    prompt_token_id_logprobs: dict[str, Any] = dataclasses.field(default_factory=dict)


def sample_now(engine: rs._Engine) -> Sampled:
    """``sample_tokens`` of the step the engine just ran (no drafts: every request keeps
    its tokens, one logits row each)."""
    last = engine.last
    if last is None:
        return Sampled([], {}, None)
    req_ids = list(last.state.input_batch.req_ids)
    r = engine.runner
    got: dict[str, Any] = {}
    original = r.sample_tokens

    def keep(grammar: Any) -> Any:
        got["out"] = original(grammar)
        return got["out"]

    with mock.patch.object(r, "sample_tokens", keep):
        rs._sample(engine, {})
    out = got["out"]
    output = getattr(out, "model_runner_output", out)
    # The sampler's own output, which the async output copies to the host
    # (model_runner_output.logprobs is filled from it when the caller asks).
    sampler_output = getattr(out, "sampler_output", None)
    tensors = None if sampler_output is None else sampler_output.logprobs_tensors
    ids = None if tensors is None else tensors.logprob_token_ids.cpu().numpy()
    by_id = dict(output.prompt_token_id_logprobs_dict or {})
    return Sampled(req_ids, dict(output.prompt_logprobs_dict or {}), ids, by_id)


def logprob_fields(
    engine: _LogprobsEngine, inputs: RunnerStepInputs, sampled: Sampled, predictions: bool
) -> tuple[Field, ...]:
    """The step's logprobs fields by request, in batch order (module docstring); those
    of the model's predictions where ``predictions`` (the model ran the step)."""
    step = {
        str(rid): (c, q)
        for rid, c, q in zip(
            inputs.req_ids, inputs.num_computed_tokens, inputs.query_lens, strict=True
        )
    }
    vocab_size = engine.runner.vocab_size
    names = ("rows", "tokens", "predicted", "expected", "id_rows", "id_scored", "id_expected",
             "own", "asked_own")  # fmt: skip
    v: dict[str, list[int]] = {name: [] for name in names}
    for row, req_id in enumerate(sampled.req_ids):
        got = sampled.prompt_logprobs.get(req_id)
        pairs = [] if got is None else got.logprob_token_ids[:, :2].tolist()
        v["rows"].append(len(pairs))
        v["tokens"].append(
            sum(t == prompt_token(int(req_id), i + 1, vocab_size) for i, (t, _) in enumerate(pairs))
        )
        v["predicted"].append(sum(top == t for t, top in pairs))
        length = engine.asked.get(req_id)
        computed, q = step[req_id]
        # The step that ends the prompt hands the whole prompt's logprobs, one row per
        # prompt token after the first (earlier chunks' rows held until then); others none.
        ends_prompt = length is not None and computed < length <= computed + q
        v["expected"].append(length - 1 if length is not None and ends_prompt else 0)
        # The rows scored by token id, handed out at the same step: the prompt's next
        # token about 0 (its row's own prediction), the other id or pad far below.
        scores = sampled.prompt_token_id_logprobs.get(req_id)
        table = [] if scores is None else scores.float().cpu().tolist()
        v["id_rows"].append(len(table))
        v["id_scored"].append(sum(first > -1.0 and second < -50.0 for first, second in table))
        v["id_expected"].append(engine.rows_asked.get(req_id, 0) if ends_prompt else 0)
        # Its own token ids in the columns after the sampled token's, the rest empty.
        want = own_token_ids(int(req_id), vocab_size)
        v["asked_own"].append(int(want is not None))
        ids = sampled.logprob_token_ids
        after = [] if ids is None else ids[row, 1:].tolist()
        padded = want is not None and want + [0] * (len(after) - len(want))
        v["own"].append(int(want is not None and after == padded))

    def field(name: str, key: str, agrees_with: str | None = None) -> Field:
        values = np.asarray(v[key], dtype=np.int64)
        return Field(name, "requests", values, agrees_with=agrees_with)

    fields = [
        field("prompt_logprobs.rows", "rows", "prompt_logprobs.expected"),
        field("prompt_logprobs.tokens", "tokens", "prompt_logprobs.expected"),
        field("prompt_logprobs.expected", "expected"),
        field("prompt_token_id_logprobs.rows", "id_rows", "prompt_token_id_logprobs.expected"),
        field("prompt_token_id_logprobs.expected", "id_expected"),
        field("sampled_logprobs.own_token_ids", "own", "sampled_logprobs.asked_own"),
        field("sampled_logprobs.asked_own", "asked_own"),
    ]
    if predictions:
        fields += [
            field("prompt_logprobs.predicted", "predicted", "prompt_logprobs.expected"),
            field(
                "prompt_token_id_logprobs.scored", "id_scored", "prompt_token_id_logprobs.expected"
            ),
        ]
    return tuple(fields)


class LogprobsRunnerStepEngine(rs.RunnerStepEngine):
    """``vllm``'s three engines, some requests asking for prompt logprobs; each step of
    the eager and the graph engine sampled as soon as it ran."""

    engine_type = _LogprobsEngine

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        def vocab_size() -> int:
            assert self.eager is not None
            return int(self.eager.runner.vocab_size)

        extra: dict[str, tuple[Field, ...]] = {}
        with _predicted_prompt_logits(vocab_size):  # the fresh engine samples its step later
            out = super().__call__(inputs)
            for how, engine in (("eager", self.eager), ("padded", self.graphs)):
                assert isinstance(engine, _LogprobsEngine)
                # A graph's replay here runs no model (runner_step._Graph): only the
                # eager engine's hidden states are the step's own.
                sampled = sample_now(engine)
                extra[how] = logprob_fields(engine, inputs, sampled, predictions=how == "eager")
        return with_step_fields(out, extra)


def with_step_fields(
    out: RunnerStepOutputs, extra: dict[str, tuple[Field, ...]]
) -> RunnerStepOutputs:
    """``out`` with ``extra[how]`` added to the fields of the step's own build of each
    ``how`` (not a draft's)."""
    builds = tuple(
        dataclasses.replace(b, fields=b.fields + extra[b.how])
        if b.how in extra and b.draft is None
        else b
        for b in out.builds
    )
    return RunnerStepOutputs(builds)


ENGINE = LogprobsRunnerStepEngine()
"""The engine of the implementation ``vllm-prompt-logprobs`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-prompt-logprobs`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


@contextlib.contextmanager
def _chunks_dropped() -> Iterator[None]:
    """The defect: the rows of a chunk before the prompt's last are not kept
    (``in_progress_prompt_logprobs`` cleared as each step ends), so a chunked prompt
    hands out its last chunk's rows alone."""
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    original = PromptLogprobsWorker.compute_prompt_logprobs

    def forgetful(self: Any, *args: Any) -> Any:
        out = original(self, *args)
        for kept in self.in_progress_prompt_logprobs.values():
            kept.clear()
        return out

    with mock.patch.object(PromptLogprobsWorker, "compute_prompt_logprobs", forgetful):
        yield


def run_chunks_dropped(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-prompt-logprobs-chunks-dropped``: ``vllm-prompt-logprobs`` with
    :func:`_chunks_dropped` in force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(LogprobsRunnerStepEngine(), _chunks_dropped)
run_chunks_dropped.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


reach_prompt_logprobs = rs.reach_without_drafts
"""An engine ``vllm-prompt-logprobs`` runs: V2, no drafts."""


def trigger_chunks_dropped(trace: Trace | Case) -> bool:
    """A request that asks prefills a chunk of its prompt that does not end it (each row
    of such a chunk is kept: none is the prompt's last), and a later step of it."""
    steps = as_trace(trace).steps
    if not reach_prompt_logprobs(trace):
        return False
    for k, b in enumerate(steps[:-1]):
        prompts = b.prompt_lens or (0,) * b.num_reqs
        for rid, c, q, p in zip(b.request_ids, b.num_computed_tokens, b.q_lens, prompts,
                                strict=True):  # fmt: skip
            if asks(rid, c) and c + q < p:
                if any(rid in later.request_ids for later in steps[k + 1 :]):
                    return True
    return False


def smallest_chunks_dropped() -> Trace:
    """Request 3 prefills its 5-token prompt in chunks of 3 and 2 (a FULL graph of 2
    tokens beside): its 4 rows are handed out at the second step, the first chunk's 3
    with them; the defect hands out 1."""
    return Trace(
        rs.smallest_config(),
        (
            Batch((0,), (3,), req_ids=(3,), pages=((1,),), new_pages=(1,), prompt_lens=(5,)),
            Batch((3,), (2,), req_ids=(3,), pages=((1,),), new_pages=(0,), prompt_lens=(5,)),
        ),
    )
