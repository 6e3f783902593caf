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

Some later steps are steady (:data:`CHANGES`): the same requests as the step
before, one quantity changed (the decode length, the order of the same decode
lengths, the real token count under the same padded size), as a scheduler's
steady state runs them; a defect that needs an earlier step of another shape on
the same engine meets it there.

Rollbacks are weighted onto page boundaries (:data:`PAGE_ODDS`): prompts that end
just short of a page, so that the first decode's drafts cross it, rejections that
roll back onto the boundary, and a single-token step of the request after it.

Most lives of two steps or more settle into decode steps (:data:`DECODE_ODDS`):
from a drawn step on, no request arrives or leaves by chance, every prefill
takes its whole rest and every decode its full ``next_n`` (the step before
settles: its prefills whole), as a scheduler runs its running requests once
their prefills are done. These are the steps every engine replays in its decode
graph; SGLang's runners (decode, EAGLE draft and draft extend) replay only them.

Every choice shrinks towards the simpler life: fewer steps first (the step
count is drawn first), decode steps from the second step, no steady step, no
request leaving, no arrivals past the first step, full decodes (``next_n``
tokens: the steps graphs pad), no draft rejected, whole prefills. A failure that
needs an earlier step to happen shrinks to the few steps it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from attnfuzz.reference.batch import Batch, EngineConfig, cdiv
from attnfuzz.reference.runner import step_plan
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.batches import (
    SMALL,
    SUPPORT_CHOICES,
    Scale,
    engine_configs,
    request_count,
)
from hypothesis import strategies as st

MAX_STEPS = 6
"""Steps of a drawn trace, at most: a life's bugs need a step to set the state and
one to meet it; six leave room for a request to finish and its row to be reused."""


# One quantity a steady step changes from the step before it, on the same requests
# in the same rows (see ``_Scheduler.step``), as a scheduler's steady state does:
# - "length": the longest decodes take another length (the decode length L);
# - "order": the same decode lengths, rotated over the rows;
# - "tokens": one decode a token more or fewer, the step's padded size the same.
CHANGES = ("length", "order", "tokens")
STEADY_ODDS = 3  # one later step in three is steady
DECODE_ODDS = 4  # three lives in four (of two steps or more) settle into decode steps
# Rollbacks onto page boundaries, where a rollback meets the block table and the slot
# mapping: one new prompt in PAGE_ODDS (with drafts, a page within reach) ends a few
# tokens short of a page, so that its first decode's drafts cross it; one rejection in
# PAGE_ODDS where a draft lies on a page after the real token's rolls back onto that
# page's boundary; the request's next step is then a single token two times in three
# (shrinking to it), or one time in two where it is a decode step (shrinking away);
# steady steps keep their lengths.
PAGE_ODDS = 2


# The other data-parallel rank a vLLM runner step runs beside (``runner-step``'s ``vllm``
# and ``vllm-v1``): not drawn, but chosen from the step's own sizes, so that steps meet
# each about equally often, and a shrunk step keeps the peer its failure needed only
# where its sizes do:
# - "none": one rank;
# - "idle": a rank with nothing to run that still joins the step (its dummy batch);
# - "uniform decode": a full uniform decode, which pads this step to the peer's graph;
# - "prefill": a prefill one token longer than this step, so neither rank runs a graph.
PEERS = ("none", "idle", "uniform decode", "prefill")


def data_parallel_peer(query_lens: Sequence[int], num_computed_tokens: Sequence[int]) -> str:
    """Which of :data:`PEERS` a step of these requests runs beside."""
    return PEERS[(sum(query_lens) + sum(num_computed_tokens) + len(query_lens)) % 4]


def held_through_dummy(steps: Sequence[Batch]) -> bool:
    """Whether a request of one step runs in the next, not new to it: an engine holds it
    through whatever dummy run it makes between the two (a data-parallel rank's)."""
    from attnfuzz.reference.persistent_batch import new_to_engine

    return any(
        set(prev.request_ids)
        & {r for r, new in zip(step.request_ids, new_to_engine(step), strict=True) if not new}
        for prev, step in zip(steps, steps[1:], strict=False)
    )


def step_change(config: EngineConfig, prev: Batch, step: Batch) -> str | None:
    """Which one of :data:`CHANGES` ``step`` makes from ``prev``, if it changes exactly
    one quantity of the same requests in the same rows (None otherwise, or if none)."""
    if not step.req_ids or prev.req_ids != step.req_ids or prev.q_lens == step.q_lens:
        return None
    if sorted(prev.q_lens) == sorted(step.q_lens):
        return "order"
    changed = [(a, b) for a, b in zip(prev.q_lens, step.q_lens, strict=True) if a != b]
    if len(set(changed)) != 1:
        return None  # rows changed in more ways than one
    (a, b), tokens = changed[0], (sum(prev.q_lens), sum(step.q_lens))
    if len(changed) == 1 and abs(a - b) == 1:
        pads = [step_plan(config, s).num_tokens_padded for s in (prev, step)]
        if pads[0] == pads[1] and pads[0] > max(tokens):
            return "tokens"
    return "length" if max(a, b) <= config.threshold else None


def page_rollbacks(config: EngineConfig, prev: Batch, step: Batch) -> set[int]:
    """The requests of ``step`` whose drafts rejected after ``prev`` held a page boundary:
    a position ``k * block_size`` among those rolled back, a page the accepted tokens do
    not reach (where a rollback meets the block table and the slot mapping)."""
    was = dict(zip(prev.req_ids, prev.seq_lens, strict=True))
    now = dict(zip(step.req_ids, step.num_computed_tokens, strict=True))
    bs = config.block_size
    return {r for r, c in now.items() if r in was and c < was[r] and cdiv(c, bs) * bs < was[r]}


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

    def __init__(self, config: EngineConfig, lookahead: int = 0):
        self.config = config
        self.lookahead = lookahead  # slots reserved past each request's scheduled tokens
        self.running: list[_Request] = []
        self.preempted: list[_Request] = []  # may come back
        self.waiting: list[_Request] = []  # preempted before the coming step: not in it
        self.rejected: dict[int, int] = {}  # drafts of the last step to roll back, by request
        self.page_rolled: set[int] = set()  # requests whose rollback lands on a page boundary
        self.finished: list[int] = []  # requests finished since the last step
        self.last_ids: set[int] = set()  # the last step's requests
        self.last_q: dict[int, int] = {}  # the last step's query lengths, by request
        self.last_cudagraph = True  # whether the last step ran in a graph
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

    def _changed(self, draw: st.DrawFn, change: str) -> dict[int, int]:
        """The last step's lengths of the running requests, ``change`` made to its
        decodes (those now decoding that decoded then; prefill chunks stay as they were).
        Where the change cannot be made (one decode length, no two lengths to rotate, no
        token to move under the same padded size), the lengths are the last step's."""
        config, next_n = self.config, self.config.next_n
        wanted = {r.req_id: self.last_q[r.req_id] for r in self.running}
        decodes = [r.req_id for r in self.running if not r.prefilling]
        lens = [wanted[i] for i in decodes]
        if not lens:
            return wanted
        if change == "order" and len(set(lens)) == 1:
            change = "length"  # one length: no order to change
        if change == "length" and next_n > 1:
            longest = max(lens)
            other = 1 + (longest + draw(st.integers(0, next_n - 2))) % next_n  # != longest
            new = [other if q == longest else q for q in lens]
        elif change == "order":
            new = lens[1:] + lens[:1]
        elif change == "tokens":
            new = lens
            computed = [r.computed for r in self.running]
            base = [wanted[r.req_id] for r in self.running]
            pad = self._padded(computed, base)
            for delta in (-1, 1):  # the last decode a token fewer, else one more
                q = lens[-1] + delta
                if not 1 <= q <= min(next_n, config.threshold):
                    continue
                trial = [q if r.req_id == decodes[-1] else wanted[r.req_id] for r in self.running]
                if pad is not None and self._padded(computed, trial) == pad:
                    new = lens[:-1] + [q]
                    break
        else:
            new = lens
        wanted.update(zip(decodes, new, strict=True))
        return wanted

    def _padded(self, computed: list[int], q_lens: list[int]) -> int | None:
        """The padded token count of a step of these lengths in a graph, if it pads."""
        if sum(q_lens) > self.config.max_num_batched_tokens:
            return None
        if any(c + q > self.config.max_model_len for c, q in zip(computed, q_lens, strict=True)):
            return None
        plan = step_plan(self.config, Batch(tuple(computed), tuple(q_lens)))
        return plan.num_tokens_padded if plan.num_tokens_padded > plan.num_tokens else None

    def prompt_len(self, draw: st.DrawFn, most: int) -> int:
        """A new request's prompt of at most ``most`` tokens (all of them, shrunk); or, one
        time in :data:`PAGE_ODDS` with drafts and a page within reach, one to
        ``next_n - 1`` tokens short of a page boundary, so that its first decode's drafts
        cross it (and :meth:`_rejected` may roll back onto it)."""
        bs, n = self.config.block_size, self.config.next_n
        if n > 1 and 1 < bs <= most and draw(st.integers(0, PAGE_ODDS - 1)) == PAGE_ODDS - 1:
            boundary = bs * draw(st.integers(1, most // bs))
            return boundary - draw(st.integers(1, min(n - 1, boundary - 1)))
        return draw(st.integers(1, most))

    def _rejected(self, draw: st.DrawFn, req: _Request, q: int) -> int:
        """How many of ``req``'s drafts (its ``q - 1`` tokens after the real one) are
        rejected: none, shrunk; or, one time in :data:`PAGE_ODDS` where a draft lies on a
        page after the real token's, so many that the accepted tokens end at that page's
        first position or the one before (the rolled-back page held drafts only)."""
        end, bs = req.computed + q, self.config.block_size
        boundary = (end - 1) // bs * bs  # the first position of the last draft's page
        if boundary > req.computed and draw(st.integers(0, PAGE_ODDS - 1)) == PAGE_ODDS - 1:
            land = boundary - draw(st.integers(0, 1 if boundary - 1 > req.computed else 0))
            self.page_rolled.add(req.req_id)
            return end - land
        return draw(st.integers(0, q - 1))

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
            # Back, it recomputes every token it had (vLLM's Scheduler._preempt_request
            # resets num_computed_tokens; SGLang's retract keeps origin_input_ids and
            # output_ids): a decode its computed tokens, a prefill cut short its whole
            # prompt still.
            req.prompt_len, req.computed = max(req.prompt_len, req.computed), 0
            self.waiting.append(req)
        else:
            self.finished.append(req.req_id)

    @property
    def tokens_wanted(self) -> int:
        """The tokens of a step of the running requests' whole prefills and full decodes."""
        n = self.config.next_n
        return sum(r.prompt_len - r.computed if r.prefilling else n for r in self.running)

    def make_room_to_decode(self) -> None:
        """Before a decode step: a decode that cannot take its full ``next_n`` within the
        model's length finishes; past the token budget, the last requests are preempted
        (SGLang's ``retract_decode``), so that every prefill is whole and every decode full."""
        config, n = self.config, self.config.next_n
        for req in list(self.running):
            if not req.prefilling and req.computed + n > config.max_model_len:
                self.leave(req, preempted=False)
        while self.running and self.tokens_wanted > config.max_num_batched_tokens:
            self.leave(self.running[-1], preempted=True)

    def arrive(self, prompt_len: int, resume: bool) -> None:
        """A new request (or the longest-waiting preempted one) joins the running ones."""
        if resume and self.preempted:
            self.running.append(self.preempted.pop(0))
        else:
            self.running.append(_Request(self.next_id, prompt_len))
            self.next_id += 1

    def steady(self) -> bool:
        """Whether the coming step can be a steady one: every running request ran last,
        as a decode that decodes again or a prefill that goes on."""
        config, last = self.config, self.last_q
        limit = min(config.next_n, config.threshold)

        def keeps(r: _Request) -> bool:  # its length of the last step fits it again
            if r.req_id not in last:
                return False
            if r.prefilling:
                return last[r.req_id] <= r.prompt_len - r.computed
            return last[r.req_id] <= limit

        return all(keeps(r) for r in self.running) and any(not r.prefilling for r in self.running)

    def step(
        self,
        draw: st.DrawFn,
        change: str | None = None,
        settle: bool = False,
        whole: bool = False,
        full: bool = False,
    ) -> Batch:
        """Schedule every running request (decodes and short chunks first, a token each
        at least): a prefill chunk (the whole rest, shrunk) or the real token and drafts
        (all ``num_spec``, shrunk); then draw how many drafts are rejected.

        ``change`` (one of :data:`CHANGES`, for a step whose requests all ran in the
        last one): the step repeats the last one's lengths (prefill chunks and decodes
        alike, in the same padding mode) but for that one quantity. ``settle``: the step
        before such a one; prefill chunks take at most half their rest. ``whole``: every
        prefill chunk takes its whole rest (the budget permitting); ``full`` too, and every
        decode its full ``next_n`` (a decode step)."""
        config, max_len = self.config, self.config.max_model_len
        self.preempted += self.waiting  # preempted before this step: back at a later one
        self.waiting = []
        budget = config.max_num_batched_tokens
        wanted: dict[int, int] = {}
        drafts: dict[int, int] = {}
        if change is not None:
            wanted = self._changed(draw, change)
        for i, req in enumerate(self.running):
            later = len(self.running) - i - 1
            top = min(budget - later, max_len - req.computed)
            if req.req_id in wanted:
                q = max(1, min(top, wanted[req.req_id]))
                if req.prefilling:
                    q = min(q, req.prompt_len - req.computed)
                drafts[req.req_id] = 0 if req.prefilling else q - 1
            elif req.prefilling:
                left = req.prompt_len - req.computed
                # Settling: a chunk of at most half the rest, so that the next step
                # can take the same chunk again (a whole prefill settles by itself).
                most = left // 2 if settle and left > 1 and not whole else left
                if not (whole or full):
                    most -= draw(st.integers(0, most - 1))  # whole, shrunk
                q = max(1, min(top, most))
                drafts[req.req_id] = 0
            elif full:
                q = max(1, min(top, config.next_n))
                if q > 1 and req.req_id in self.page_rolled and draw(st.booleans()):
                    q = 1  # after a rollback onto a page boundary: another shape
                drafts[req.req_id] = q - 1
            else:
                d = config.num_spec - draw(st.integers(0, config.num_spec))  # full, shrunk
                if d and req.req_id in self.page_rolled and draw(st.integers(0, 2)) != 2:
                    d = 0  # after a rollback onto a page boundary: another shape (shrunk to)
                q = max(1, min(top, 1 + d))
                drafts[req.req_id] = q - 1
            wanted[req.req_id] = q
            budget -= q
        # Stable: rows keep their order within decodes and within prefills.
        order = sorted(self.running, key=lambda r: wanted[r.req_id] > config.threshold)
        ids, computed, q_lens, pages, new_pages, prompts = [], [], [], [], [], []
        for req in order:
            q = wanted[req.req_id]
            # Its pages hold the step's tokens and the lookahead (the engine's
            # scheduler reserves it for the drafter's positions after the step's).
            gained = self.take_pages(req, min(req.computed + q + self.lookahead, max_len))
            ids.append(req.req_id)
            computed.append(req.computed)
            q_lens.append(q)
            pages.append(tuple(req.pages))
            new_pages.append(gained if req.req_id in self.last_ids else len(req.pages))
            prompts.append(req.prompt_len)
        seed = draw(st.integers(0, 2**32 - 1))
        if change is None:
            use_cudagraph = draw(st.integers(0, 7)) != 7  # shrinks towards True
        else:
            use_cudagraph = self.last_cudagraph
        self.last_q, self.last_cudagraph = dict(wanted), use_cudagraph
        # The step runs: some drafts are rejected (none, shrunk), which the step records.
        self.page_rolled = set()
        for req in self.running:
            if drafts[req.req_id]:
                self.rejected[req.req_id] = self._rejected(draw, req, wanted[req.req_id])
        rejected = tuple(self.rejected.get(rid, 0) for rid in ids)
        batch = Batch(
            tuple(computed),
            tuple(q_lens),
            seed=seed,
            use_cudagraph=use_cudagraph,
            req_ids=tuple(ids),
            pages=tuple(pages),
            new_pages=tuple(new_pages),
            finished=tuple(self.finished),
            rejected=rejected if any(rejected) else (),
            prompt_lens=tuple(prompts),
        )
        self.last_ids = set(ids)
        self.finished = []
        for req in self.running:  # the step ran: its tokens are computed
            req.computed += wanted[req.req_id]
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
    lookahead: Callable[[EngineConfig], int] | None = None,
    chunked_prefill: bool = True,
) -> Trace:
    """An engine config, the steps one engine of it runs, and the target's parameters
    (``params``, ``fixes``, ``supports``, ``varlen``: as :func:`~attnfuzz.strategies.
    batches.cases`). Every step is a batch the engine can produce, decodes first.
    ``lookahead``: of the config, the KV slots the engine's scheduler reserves past each
    request's scheduled tokens (:attr:`~attnfuzz.harness.implementation.Implementation.
    lookahead`; none by default), whose pages each request holds too.
    ``chunked_prefill`` False: an engine that prefills a prompt whole, in one step (an
    encoder-decoder model's): every arrival's prompt fits the budget left to it and
    every prefill takes its whole rest; True draws exactly what it always drew."""
    config = draw(engine_configs(scale, fixes, supports, varlen))
    num_steps = draw(st.integers(1, max_steps))
    sched = _Scheduler(config, lookahead(config) if lookahead is not None else 0)
    max_len = config.max_model_len
    steps: list[Batch] = []
    pending: str | None = None  # the change a settling step left to the next
    # The first decode step (shrinks to one, the earliest; one life in DECODE_ODDS has
    # none): from it on, the running requests decode (see make_room_to_decode), the
    # step before it settles. Decode steps are what the other choices shrink to too.
    decode_from = num_steps
    if num_steps > 1 and draw(st.integers(0, DECODE_ODDS - 1)) != DECODE_ODDS - 1:
        decode_from = draw(st.integers(1, num_steps - 1))
    for k in range(num_steps):
        # Between steps: rejected drafts roll back; requests finish (those at the
        # model's length always) or are preempted; new ones arrive, or preempted return.
        sched.roll_back()
        decoding, before_decoding = k >= decode_from, k == decode_from - 1
        whole = before_decoding or not chunked_prefill  # every prefill whole
        # A steady step (one later step in STEADY_ODDS; shrinks to 0, not steady): the
        # same requests as the last step, one quantity changed (see CHANGES). Where
        # the requests are not yet steady (prefills in the last step), this step
        # settles them (no one leaves or arrives) and the next one makes the change.
        change, settle = None, False
        if any(req.computed >= max_len for req in sched.running):
            pending = None  # a request finishes: not the same requests
        elif pending is not None:
            change, pending = (pending, None) if sched.steady() else (None, None)
        elif (
            k > 0
            and k not in (decode_from - 1, decode_from)  # settles, or the first decode step
            and sched.running
            and draw(st.integers(0, STEADY_ODDS - 1)) == STEADY_ODDS - 1
        ):
            wanted = draw(st.sampled_from(CHANGES))
            if sched.steady():
                change = wanted
            else:
                pending, settle = wanted, True
        if change is not None:
            steps.append(sched.step(draw, change))
            continue
        if decoding:
            sched.make_room_to_decode()
            if sched.running:  # else every request finished: new ones arrive
                steps.append(sched.step(draw, full=True))
                continue
        for req in list(sched.running):
            if req.computed >= max_len or (k > 0 and not settle and draw(st.integers(0, 3)) == 3):
                sched.leave(req, preempted=req.computed < max_len and draw(st.booleans()))
        if settle:
            steps.append(sched.step(draw, settle=True, whole=not chunked_prefill))
            continue
        if before_decoding:  # the step before the decode steps: its prefills whole
            sched.make_room_to_decode()
        least = 0 if sched.running else 1
        room = sched.room
        arrivals = request_count(draw, least, max(least, room)) if k == 0 or room else least
        for i in range(min(arrivals, room)):
            # Before the decode steps, every prompt fits the budget whole (one token
            # left to each arrival after it).
            most = max_len - 1
            if whole:
                left = config.max_num_batched_tokens - sched.tokens_wanted
                most = min(most, left - (min(arrivals, room) - i - 1))
                if most < 1:
                    break
            back = sched.preempted and (not whole or sched.preempted[0].prompt_len <= most)
            resume = bool(back) and draw(st.booleans())
            prompt = 1 if resume or most < 1 else sched.prompt_len(draw, most)
            sched.arrive(prompt, resume)
        steps.append(sched.step(draw, whole=whole))
    drawn = tuple((name, draw(strategy)) for name, strategy in sorted((params or {}).items()))
    return Trace(config, tuple(steps), drawn)
