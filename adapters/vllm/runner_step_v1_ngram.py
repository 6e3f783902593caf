"""vLLM's model runner V1 step with the GPU n-gram drafter, as the implementation
``vllm-v1-ngram-gpu`` of ``runner-step``.

The engines of :mod:`.runner_step_v1` (implementation ``vllm-v1``), their speculative
config's method ``ngram_gpu`` (:data:`.runner_step_speculator.NGRAM_GPU`: n-grams of one
token), so that ``GPUModelRunner.__init__`` makes vLLM 0.33.0's ``NgramProposerGPU``
(``vllm/v1/spec_decode/ngram_proposer_gpu.py``) and its token tensors. What runs
unchanged, besides ``vllm-v1``'s step:

- ``GPUModelRunner.execute_model``'s copy of the scheduler output, and in
  ``_update_states`` the invalid-draft trim (``update_scheduler_for_invalid_drafts``:
  each running request's scheduled drafts cut to the valid ones the last proposal
  counted, its scheduled tokens and the step's total with them), from which
  ``_prepare_inputs`` builds the step's query offsets, positions, sequence lengths and
  slot mapping; and ``update_ngram_gpu_tensors_incremental`` (under synchronous
  scheduling no step sets ``prev_req_id_to_index``: every step takes its first-run
  branch, each row's tokens and length copied from the host);
- ``sample_tokens``' n-gram branch: ``propose_draft_token_ids`` with the drafter's
  ``update_token_ids_ngram`` and ``propose`` (``NgramGPUKernel``, its matcher; eager:
  the CPU platform compiles nothing), ``copy_num_valid_draft_tokens``, and
  ``take_draft_token_ids``, whose drafts (``-1`` past the valid ones) the scheduler
  schedules next (``update_draft_token_ids``; none for a prefill chunk).

The drafter needs no model: it matches each request's own tokens. The tokens the
engine holds are chosen so that the runner reaches the trace's steps, as vLLM's
scheduler and runner would:

- a new request's prompt (:func:`prompt_tokens`): its first two and last
  ``num_spec + 1`` tokens distinct, the rest its first;
- the token each request samples after its accepted drafts (the recovered or bonus
  token: the target's argmax, the model's to choose), chosen once the next step is
  known: the model's logits of a step are written when the next step is given, and its
  ``sample_tokens`` runs then, before anything else the worker would run (the graphs
  engine's dummy run between steps included). For a request the next step decodes with
  ``d`` drafts, a token after which the matcher proposes exactly ``d`` valid drafts
  (the drafter's own kernel asked of every candidate), while the scheduler schedules
  as many drafts as the request holds (``Scheduler.schedule``: ``num_spec``, within the
  request's pages, ``max_model_len`` less the sampled token, and the token budget the
  step leaves): the runner trims the invalid ones. Where no token gives exactly ``d``,
  one that gives ``d`` or more, and the scheduler schedules ``d`` (as ``vllm-v1``
  takes a step's drafts). A request the next step leaves out gets a token that gives
  as many as a later return may schedule (one not in the batch then is not trimmed).

Every forward is judged as ``vllm-v1``'s; a build's sizes are those the runner ran (its
copy of the scheduler output, trimmed), which the oracle holds to the trace's: a runner
that trims other than its tokens say runs another step than the trace's.

Stood in: what :mod:`.runner_step_v1` stands in (the model, CUDA graphs, streams and
events: the valid-draft counts' copy stream and event too); pinned host memory
(``pin_memory=True`` buffers and ``Tensor.pin_memory``, which CPU-only torch refuses);
the peer rank's drafter dispatch (none: the n-gram drafter runs no forward). The
KV-cache group lists the draft layer ``vllm-v1`` gives every drafter, which no forward
reads.

Declined: what ``vllm-v1`` declines (with no lookahead: the n-gram drafter writes no
KV), engines without drafts, a running request's drafts its tokens cannot give
(:func:`drafts_declines`), and a step after which the drafter does not propose
(:func:`fits_declines`). Left out: asynchronous scheduling (the scheduler's placeholder
drafts, the runner's optimistic counts) and the unpadded drafter batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters import standins
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.persistent_batch import new_to_engine
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

_SAMPLE = "gpu_model_runner.py: GPUModelRunner.sample_tokens"


def prepare() -> None:
    """Import vLLM's V1 runner and the n-gram drafter before a judge forks."""
    v1.prepare()
    import vllm.v1.spec_decode.ngram_proposer_gpu  # noqa: F401


def no_lookahead(config: EngineConfig) -> int:
    """``VllmConfig.num_lookahead_tokens`` of the n-gram drafter: none (it writes no KV)."""
    return 0


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines (the n-gram drafter reserves no lookahead), an engine with
    no drafter, pages past the engine's KV cache, and what the n-gram drafter cannot
    propose."""
    if case.config.num_spec == 0:
        return "no speculative config: the step is vllm-v1's"
    return v1.declines(case, no_lookahead) or drafts_declines(case) or fits_declines(case)


def drafts_declines(case: Case) -> str | None:
    """A running request decoding as many drafts as it has computed tokens: the
    matcher's drafts are the tokens after the first earlier occurrence of the request's
    last token (``_find_first_and_extract_all_n_parallel``), at most the tokens before
    that last one (its computed tokens), as many only where its first token is the last
    sampled, which a rejected draft of that value forbids. One fewer the engine's tokens
    always give: a request's first two tokens differ, and one of them is not the
    rejected draft."""
    c, b = case.config, case.batch
    prompts = b.prompt_lens or (0,) * b.num_reqs
    steps = zip(b.request_ids, new_to_engine(b), b.num_computed_tokens,
                b.q_lens, prompts, strict=True)  # fmt: skip
    for rid, new, computed, q, prompt in steps:
        if not new and 1 < q <= 1 + c.num_spec and computed >= prompt and q > computed:
            return (
                f"request {rid} decodes {q - 1} drafts after {computed} computed tokens: "
                "the n-gram drafter's tokens give at most one fewer"
            )
    return None


def fits_declines(case: Case) -> str | None:
    """A step after which the drafter does not propose (``GPUModelRunner.
    _input_fits_in_drafter``: the step's longest sequence and ``num_spec`` past the
    model length): the scheduler is handed zero drafts, which the next step trims by
    the valid-draft counts of an earlier proposal, not of these tokens."""
    c, b = case.config, case.batch
    longest = max(x + q for x, q in zip(b.num_computed_tokens, b.q_lens, strict=True))
    if longest + c.num_spec > c.max_model_len:
        return (
            f"a sequence of {longest} tokens and {c.num_spec} drafts pass max_model_len "
            f"{c.max_model_len}: the n-gram drafter does not propose after the step"
        )
    return None


PROMPT_STRIDE = 37
"""How far apart two requests' prompt tokens start (prime to the tiny model's 128 tokens):
requests of neighbouring ids share few tokens, so that one request's drafts do not
follow from another's tokens."""


def prompt_tokens(n: int, num_spec: int, req_id: int, vocab: int) -> list[int]:
    """Request ``req_id``'s ``n`` prompt tokens: its first two and its last ``num_spec +
    1`` distinct (each its first occurrence: the matcher can end a match on any of them),
    consecutive from ``req_id * PROMPT_STRIDE`` (modulo ``vocab``), the others its first
    token's."""
    distinct = sorted({0, 1, *range(n - num_spec - 1, n)} & set(range(n)))
    tokens = [0] * n
    for value, at in enumerate(distinct):
        tokens[at] = (req_id * PROMPT_STRIDE + value) % vocab
    for at in set(range(n)) - set(distinct):
        tokens[at] = tokens[0]
    return tokens


@contextlib.contextmanager
def _unpinned_host(device: torch.device) -> Iterator[None]:
    """Host memory for the runner's pinned buffers (``_ngram_pinned_idx_buf``,
    ``_ngram_pinned_val_buf``: ``torch.zeros(..., pin_memory=True)``) and the n-gram
    tensors' staging copies (``Tensor.pin_memory``): CPU-only torch has no pinned
    allocator; the same tensors, copied alike."""
    import vllm.v1.worker.gpu_model_runner as gmr

    if device.type != "cpu":
        yield
        return
    with (
        standins.unpinned(gmr, device),
        mock.patch.object(torch.Tensor, "pin_memory", lambda self, *a, **k: self),
    ):
        yield


def _no_peer_columns(*args: Any, **kwargs: Any) -> None:
    """The peer's drafter dispatch: the n-gram drafter runs no forward, so it reaches no
    all-reduce (``sample_tokens`` syncs ranks only for drafters with a forward)."""


class _NgramEngine(v1._Engine):
    """A V1 engine whose drafter is a ``NgramProposerGPU``; its steps' sampling runs when
    the next step is known (:meth:`finish`)."""

    speculator = speculating.NGRAM_GPU

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return _unpinned_host(self.device)

    def _context(self) -> Any:
        stack = super()._context()
        stack.enter_context(mock.patch.object(drafting, "peer_columns", _no_peer_columns))
        return stack

    def _build(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        # The scheduler's side: each request's drafts from the last proposal (-1 past the
        # valid ones), and the drafts it schedules a request the next step.
        self.spec: dict[str, list[int]] = {}
        self.scheduled: dict[str, int] = {}
        self.accepted: dict[str, int] = {}  # the step's accepted drafts by request
        self.pending = False  # a step whose sample_tokens waits for the next step
        self.logits: torch.Tensor | None = None
        super()._build(config, device, mode)
        # The worker's calls, this engine's: the runner's own methods (its class's, looked
        # up at each call) run inside them.
        self.runner.sample_tokens, self.runner.execute_model = self._defer, self._execute

    def install_drafter(self) -> None:
        """``load_model``: ``NgramProposerGPU.load_model`` loads no model."""

    def load(self, resolved: Any) -> Any:
        handed = super().load(resolved)
        handed.compute_logits = self._logits_to_come
        return handed

    def _logits_to_come(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The model's logits of the step's sampled rows: written once the next step is
        known (:meth:`finish`), before ``sample_tokens`` reads them."""
        rows, vocab = hidden_states.shape[0], self.runner.input_batch.vocab_size
        self.logits = torch.zeros(rows, vocab, device=hidden_states.device)
        return self.logits

    def _execute(self, scheduler_output: Any, intermediate_tensors: Any = None) -> Any:
        """``execute_model``; the step's tokens after it those the runner ran (its own
        copy of the scheduler output, the invalid drafts trimmed), as its builds' sizes."""
        r = self.runner
        result = type(r).execute_model(r, scheduler_output, intermediate_tensors)
        ran = r.execute_model_state.scheduler_output
        scheduler_output.total_num_scheduled_tokens = ran.total_num_scheduled_tokens
        return result

    def _defer(self, grammar_output: Any) -> None:
        """The worker's ``sample_tokens``, run by :meth:`finish`."""
        self.pending = True

    # -- the sampling of a step, once the next is known ------------------------------------

    def finish(self, upcoming: RunnerStepInputs) -> None:
        """The last step's ``sample_tokens``, the model's logits chosen for ``upcoming``
        (the next step), then ``take_draft_token_ids`` as the engine core calls it."""
        if not self.pending:
            return
        self.pending = False
        r = self.runner
        ran = r.execute_model_state.scheduler_output
        plan = self._plan(upcoming)
        self.scheduled = {}
        picks: list[int] = []
        sampled: set[str] = set()
        for rid in r.input_batch.req_ids:
            state = r.requests[rid]
            drafts = list(ran.scheduled_spec_decode_tokens.get(rid, ()))
            # A prefill chunk samples nothing (_prepare_inputs: discard_request_mask).
            if state.num_computed_tokens + ran.num_scheduled_tokens[rid] < state.num_tokens:
                picks.append(0)
                continue
            sampled.add(rid)
            accepted = min(self.accepted.get(rid, 0), len(drafts))
            history = [*state.prompt_token_ids, *state.output_token_ids, *drafts[:accepted]]
            rejected = drafts[accepted] if accepted < len(drafts) else None
            if rid in plan:
                d, most = plan[rid]
                token = self._choose(history, rejected, d, exact=True) if most > d else None
                if token is None:
                    token, most = self._choose(history, rejected, d), d
                self.scheduled[rid] = most
            else:
                # Left out next: as many valid drafts as a later return may schedule.
                bound = min(r.num_spec_tokens, len(history) - 1)
                token = self._choose(history, rejected, bound)
            assert token is not None
            picks += drafts[:accepted] + [token] * (len(drafts) + 1 - accepted)
        logits = self.logits
        if logits is None or logits.shape[0] != len(picks):
            rows = None if logits is None else logits.shape[0]
            raise RuntimeError(f"attnfuzz: {rows} sampled rows, the drafts make {len(picks)}")
        with torch.inference_mode():  # the runner's tensor, made in its inference mode
            logits.zero_()
            logits[torch.arange(len(picks)), torch.tensor(picks, dtype=torch.long)] = 1.0
        taken = dict(self.accepted)
        # One rank: sample_tokens' n-gram branch meets no collective (no draft forward).
        with (
            v1._running(self, "step", _SAMPLE, v1._data_parallel(r, self.recorder, None)),
            v1._sampling(self, ran, taken),
        ):
            type(r).sample_tokens(r, None)
        proposed = r.take_draft_token_ids()
        if proposed is not None:
            # Scheduler.update_draft_token_ids: a prefill chunk's drafts are dropped.
            for rid, ids in zip(proposed.req_ids, proposed.draft_token_ids, strict=True):
                self.spec[rid] = list(ids) if rid in sampled else []

    def _plan(self, upcoming: RunnerStepInputs) -> dict[str, tuple[int, int]]:
        """Each request of the runner's batch that ``upcoming`` decodes (the runner trims
        its drafts): its drafts ``d`` there, and the most the scheduler can schedule it
        (``Scheduler.schedule``: ``num_spec`` at most, within the pages it holds after the
        step, ``max_model_len - 1`` tokens, and the budget the step's tokens leave, given
        in the step's order)."""
        c, r = upcoming.config, self.runner
        budget = c.max_num_batched_tokens - upcoming.num_tokens
        prompts = upcoming.prompt_lens or (0,) * upcoming.num_reqs
        plan = {}
        steps = zip(upcoming.req_ids, upcoming.is_new, upcoming.num_computed_tokens,
                    upcoming.query_lens, upcoming.new_block_ids, prompts, strict=True)  # fmt: skip
        for rid, new, computed, q, gained, prompt in steps:
            req_id = str(rid)
            if new or req_id not in r.input_batch.req_id_to_index:
                continue  # new, resumed or back after a step out: not trimmed
            if computed < prompt or q > 1 + c.num_spec:
                continue  # a prefill chunk
            d = q - 1
            held = len(r.requests[req_id].block_ids[0]) + len(gained)
            room = min(
                c.num_spec, held * c.block_size - computed - 1, c.max_model_len - computed - 2
            )
            extra = max(0, min(room - d, budget))
            budget -= extra
            plan[req_id] = (d, d + extra)
        return plan

    def _choose(
        self, history: list[int], rejected: int | None, drafts: int, exact: bool = False
    ) -> int | None:
        """The token to sample after ``history`` for which the drafter's matcher proposes
        exactly ``drafts`` valid drafts (``exact``), else at least as many, the fewest
        first; never ``rejected`` (the rejected draft: its row's argmax differs); None
        where no token gives exactly ``drafts``."""
        r = self.runner
        vocab = r.input_batch.vocab_size
        rows = torch.tensor(history, dtype=torch.int32).expand(vocab, -1)
        tokens = torch.cat([rows, torch.arange(vocab, dtype=torch.int32)[:, None]], dim=1)
        lengths = torch.full((vocab,), tokens.shape[1], dtype=torch.int32)
        _, valid = r.drafter.kernel.forward(lengths, tokens, torch.ones(vocab, dtype=torch.bool))
        ok = valid == drafts if exact else valid >= drafts
        if rejected is not None and 0 <= rejected < vocab:
            ok[rejected] = False
        if not bool(ok.any()):
            if exact:
                return None
            raise RuntimeError(
                f"attnfuzz: no token after {len(history)} tokens gives {drafts} n-gram drafts"
            )
        # The fewest valid drafts, then the lowest token.
        key = torch.where(ok, valid.to(torch.int64) * vocab + torch.arange(vocab), 1 << 40)
        return int(key.argmin())

    # -- the scheduler output ---------------------------------------------------------------

    def output(self, inputs: RunnerStepInputs) -> Any:
        """The last step's sampling first (:meth:`finish`), then ``vllm-v1``'s scheduler
        output with this engine's tokens: new requests' prompts (:func:`prompt_tokens`),
        and each running request's drafts the last proposal's, as many as the scheduler
        schedules (:meth:`_plan`; the trace's where the runner trims none), its scheduled
        tokens and the step's total with them."""
        self.finish(inputs)
        out = super().output(inputs)
        k, vocab = inputs.config.num_spec, self.runner.input_batch.vocab_size
        for new in out.scheduled_new_reqs:
            tokens = prompt_tokens(len(new.prompt_token_ids), k, int(new.req_id), vocab)
            new.prompt_token_ids = new.prefill_token_ids = tokens
            self.spec.pop(new.req_id, None)
        cached = out.scheduled_cached_reqs
        drafts = out.scheduled_spec_decode_tokens
        self.accepted = {}
        rejected = dict(zip(map(str, inputs.req_ids), inputs.num_rejected or (0,) * inputs.num_reqs,
                            strict=True))  # fmt: skip
        for rid in cached.req_ids:
            spec = self.spec.pop(rid, [])  # Scheduler.schedule: scheduled, spent
            if rid in cached.resumed_req_ids:
                continue  # preempted: its drafts were dropped (_preempt_request)
            if not spec:
                # No proposal to schedule: a request the trace resumed after preempting
                # it in its prefill, its prompt the tokens it had then, still prefills
                # its own here (the runner keeps the whole prompt); its query is the
                # trace's, without drafts (vllm-v1's are past its tokens).
                drafts.pop(rid, None)
            d = len(drafts.get(rid, ()))
            most = self.scheduled.get(rid, d)
            self.accepted[rid] = d - min(rejected[rid], d)
            if most == 0:
                continue
            if len(spec) < most:
                raise RuntimeError(
                    f"attnfuzz: request {rid} holds {len(spec)} drafts, the step decodes {d} "
                    f"of {most} scheduled"
                )
            drafts[rid] = spec[:most]
            out.num_scheduled_tokens[rid] += most - d
            out.total_num_scheduled_tokens += most - d
        for rid in out.finished_req_ids:
            self.spec.pop(rid, None)
        self.scheduled = {}
        return out


class NgramRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, with the GPU n-gram drafter."""

    engine_type = _NgramEngine

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        # The worker samples the last step before this rank's dummy run.
        if self.graphs is not None and self.key == (inputs.config, inputs.device):
            assert isinstance(self.graphs, _NgramEngine)
            self.graphs.finish(inputs)
        return super().__call__(inputs)


ENGINE = NgramRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-ngram-gpu`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-ngram-gpu`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ---------------------------------------------------------------------------


def _new_rows_only() -> Any:
    """``update_ngram_gpu_tensors_incremental`` recompiled with its first-run branch (no
    previous batch) copying the rows of the step's new requests only, as its later
    branch does: on an engine's first step every request is new, but under synchronous
    scheduling no step sets ``prev_req_id_to_index``, so every step is a first run."""
    import ast

    import vllm.v1.spec_decode.ngram_proposer_gpu as proposer

    fn = proposer.update_ngram_gpu_tensors_incremental
    definition = standins.function_tree(fn)
    (first_run,) = [
        node for node in ast.walk(definition)
        if isinstance(node, ast.For) and ast.unparse(node.iter) == "active_indices"
    ]  # fmt: skip
    first_run.iter = ast.parse(
        "[curr_req_id_to_index[i] for i in new_req_ids if i in curr_req_id_to_index]",
        mode="eval",
    ).body
    return standins.recompiled(fn, definition)


@contextlib.contextmanager
def _moved_rows_stale() -> Iterator[None]:
    """The defect: the runner's n-gram token rows refreshed for new requests only, so a
    request ``condense`` moved into a row a finished (or left out) request held keeps
    that request's tokens on the device; the drafter matches its last token there, and
    the next step's trim cuts its drafts by that proposal's count."""
    import vllm.v1.worker.gpu_model_runner as gmr

    with mock.patch.object(gmr, "update_ngram_gpu_tensors_incremental", _new_rows_only()):
        yield


def run_moved_rows_stale(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-ngram-gpu-moved-rows-stale``: ``vllm-v1-ngram-gpu`` with
    :func:`_moved_rows_stale` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(NgramRunnerStepEngine(), _moved_rows_stale)
run_moved_rows_stale.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_ngram(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-ngram-gpu`` runs: V1, drafts, pages of multiples of 16."""
    c = trace.config
    return c.runner == "v1" and c.num_spec > 0 and not c.varlen_decode and c.block_size % 16 == 0


def trigger_moved_rows_stale(trace: Trace | Case) -> bool:
    """A request that leaves after a step while another request of that step runs the
    next two (condense may move it into the row the first held, and the proposal after
    the first of them is trimmed by the second)."""
    if not reach_ngram(trace):
        return False
    steps = as_trace(trace).steps
    for before, now, after in zip(steps, steps[1:], steps[2:], strict=False):
        ran, stay = set(before.request_ids), set(now.request_ids) & set(after.request_ids)
        if ran - set(now.request_ids) and ran & stay:
            return True
    return False


def smallest_moved_rows_stale() -> Trace:
    """Request 0 prefills 8 tokens (:func:`prompt_tokens`: 0 1 0 0 0 2 3 4), request 1 four
    (37 38 39 40) and samples a token of its own (0); request 0 finishes and
    ``condense`` moves request 1 into row 0, where it decodes that token alone, and
    samples it again (0: its first occurrence four tokens back, one valid draft); then it
    decodes that draft, two scheduled. On the device, row 0 still holds request 0's
    tokens (a 0 at position 0): the matcher proposes two valid drafts, the runner trims
    none and runs 3 tokens where the trace (and a fresh engine) runs 2."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=2, cudagraph_capture_sizes=(3, 9), runner="v1",
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0, 0), (8, 4), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
            Batch((4,), (1,), req_ids=(1,), pages=((2,),), new_pages=(0,), finished=(0,)),
            Batch((5,), (2,), req_ids=(1,), pages=((2,),), new_pages=(0,)),
        ),
    )  # fmt: skip
