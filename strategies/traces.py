"""Hypothesis strategy for traces: one engine's life over several scheduler steps.

A small scheduler, driven by draws, hands one engine its steps
(:class:`~attnfuzz.reference.trace.Trace`): before each step requests
finish or are preempted (their rows and pages go back, to be taken by the
next arrivals) and new ones arrive (a preempted one returns under its id, to
recompute); then every running request is scheduled: a prefill chunk, or a
decode of the real token and up to ``num_spec`` drafts, of which a drawn
number are rejected after the step, rolling ``num_computed_tokens`` back. The
engine config, the padding mode (forced eager or not) and the data seed of
each step are drawn as single steps draw them
(:mod:`attnfuzz.strategies.batches`).

Every choice shrinks towards the simpler life: fewer steps first (the step
count is drawn first), no request leaving, no arrivals past the first step,
full decodes (``next_n`` tokens: the steps graphs pad), no draft rejected,
whole prefills. A failure that needs an earlier step to happen shrinks to the
few steps it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from attnfuzz.reference.batch import Batch, EngineConfig, cdiv
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.batches import SMALL, SUPPORT_CHOICES, Scale, engine_configs
from hypothesis import strategies as st

MAX_STEPS = 6
"""Steps of a drawn trace, at most: a life's bugs need a step to set the state and
one to meet it; six leave room for a request to finish and its row to be reused."""


@dataclass
class _Request:
    """What the scheduler knows of one request."""

    req_id: int
    prompt_len: int  # tokens to prefill (a preempted request recomputes what it had)
    computed: int = 0
    pages: list[int] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len


class _Scheduler:
    """Rows are the engine's business; the scheduler holds requests, pages and ids."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.running: list[_Request] = []
        self.preempted: list[_Request] = []  # may come back
        self.waiting: list[_Request] = []  # preempted before the coming step: not in it
        self.rejected: dict[int, int] = {}  # drafts of the last step to roll back, by request
        self.last_ids: set[int] = set()  # the last step's requests
        self.free_pages: list[int] = []
        self.next_page = 1  # page 0 is the null page of padding rows
        self.next_id = 0

    def take_pages(self, req: _Request, seq_len: int) -> int:
        """Give ``req`` the pages ``seq_len`` needs; how many it gained."""
        gained = 0
        while len(req.pages) < cdiv(seq_len, self.config.block_size):
            if self.free_pages:  # the most recently freed first: reuse comes soon
                req.pages.append(self.free_pages.pop())
            else:
                req.pages.append(self.next_page)
                self.next_page += 1
            gained += 1
        return gained

    def release(self, req: _Request) -> None:
        self.free_pages.extend(reversed(req.pages))
        req.pages = []

    @property
    def room(self) -> int:
        """Requests that may still arrive: every running one is scheduled, a token each."""
        limit = min(self.config.max_num_seqs, self.config.max_num_batched_tokens)
        return limit - len(self.running)

    def roll_back(self) -> None:
        """After a step: its rejected drafts are no longer computed."""
        for req in self.running:
            req.computed -= self.rejected.get(req.req_id, 0)
        self.rejected = {}

    def leave(self, req: _Request, preempted: bool) -> None:
        """``req`` finishes, or is preempted (back at a later step, to recompute)."""
        self.running.remove(req)
        self.release(req)
        if preempted:
            req.prompt_len, req.computed = req.computed, 0
            self.waiting.append(req)

    def arrive(self, prompt_len: int, resume: bool) -> None:
        """A new request (or the longest-waiting preempted one) joins the running ones."""
        if resume and self.preempted:
            self.running.append(self.preempted.pop(0))
        else:
            self.running.append(_Request(self.next_id, prompt_len))
            self.next_id += 1

    def step(self, draw: st.DrawFn) -> Batch:
        """Schedule every running request (decodes and short chunks first, a token each
        at least): a prefill chunk (the whole rest, shrunk) or the real token and drafts
        (all ``num_spec``, shrunk); then draw how many drafts are rejected."""
        config, max_len = self.config, self.config.max_model_len
        self.preempted += self.waiting  # preempted before this step: back at a later one
        self.waiting = []
        budget = config.max_num_batched_tokens
        wanted: dict[int, int] = {}
        drafts: dict[int, int] = {}
        for i, req in enumerate(self.running):
            later = len(self.running) - i - 1
            top = min(budget - later, max_len - req.computed)
            if req.prefilling:
                left = req.prompt_len - req.computed
                q = max(1, min(top, left - draw(st.integers(0, left - 1))))  # whole, shrunk
                drafts[req.req_id] = 0
            else:
                d = config.num_spec - draw(st.integers(0, config.num_spec))  # full, shrunk
                q = max(1, min(top, 1 + d))
                drafts[req.req_id] = q - 1
            wanted[req.req_id] = q
            budget -= q
        # Stable: rows keep their order within decodes and within prefills.
        order = sorted(self.running, key=lambda r: wanted[r.req_id] > config.threshold)
        ids, computed, q_lens, pages, new_pages = [], [], [], [], []
        for req in order:
            q = wanted[req.req_id]
            gained = self.take_pages(req, req.computed + q)
            ids.append(req.req_id)
            computed.append(req.computed)
            q_lens.append(q)
            pages.append(tuple(req.pages))
            new_pages.append(gained if req.req_id in self.last_ids else len(req.pages))
        seed = draw(st.integers(0, 2**32 - 1))
        use_cudagraph = draw(st.integers(0, 7)) != 7  # shrinks towards True
        batch = Batch(
            tuple(computed),
            tuple(q_lens),
            seed=seed,
            use_cudagraph=use_cudagraph,
            req_ids=tuple(ids),
            pages=tuple(pages),
            new_pages=tuple(new_pages),
        )
        self.last_ids = set(ids)
        # The step ran: its tokens are computed; some drafts are rejected (none, shrunk).
        for req in self.running:
            req.computed += wanted[req.req_id]
            if drafts[req.req_id]:
                self.rejected[req.req_id] = draw(st.integers(0, drafts[req.req_id]))
        return batch


@st.composite
def traces(
    draw: st.DrawFn,
    scale: Scale = SMALL,
    params: Mapping[str, st.SearchStrategy[int]] | None = None,
    fixes: Mapping[str, int | str] | None = None,
    supports: tuple[str, ...] = SUPPORT_CHOICES,
    varlen: bool = True,
    max_steps: int = MAX_STEPS,
) -> Trace:
    """An engine config, the steps one engine of it runs, and the target's parameters
    (``params``, ``fixes``, ``supports``, ``varlen``: as :func:`~attnfuzz.strategies.
    batches.cases`). Every step is a batch the engine can produce, decodes first."""
    config = draw(engine_configs(scale, fixes, supports, varlen))
    num_steps = draw(st.integers(1, max_steps))
    sched = _Scheduler(config)
    max_len = config.max_model_len
    steps: list[Batch] = []
    for k in range(num_steps):
        # Between steps: rejected drafts roll back; requests finish (those at the
        # model's length always) or are preempted; new ones arrive, or preempted return.
        sched.roll_back()
        for req in list(sched.running):
            if req.computed >= max_len or (k > 0 and draw(st.integers(0, 3)) == 3):
                sched.leave(req, preempted=req.computed < max_len and draw(st.booleans()))
        least = 0 if sched.running else 1
        room = sched.room
        arrivals = draw(st.integers(least, max(least, room))) if k == 0 or room else least
        for _ in range(min(arrivals, room)):
            resume = bool(sched.preempted) and draw(st.booleans())
            prompt = 1 if resume or max_len == 1 else draw(st.integers(1, max_len - 1))
            sched.arrive(prompt, resume)
        steps.append(sched.step(draw))
    drawn = tuple((name, draw(strategy)) for name, strategy in sorted((params or {}).items()))
    return Trace(config, tuple(steps), drawn)
