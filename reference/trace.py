"""A trace: one engine instance's life over several scheduler steps.

An engine is one long-lived object: its persistent buffers, block-table rows
and request states outlive a step. A :class:`Trace` is an engine config, the
target's parameters and the steps the scheduler hands that one engine, in
order. Each step is a :class:`~attnfuzz.reference.batch.Batch` that also says
what the scheduler knows across steps (``req_ids``, ``pages``, ``new_pages``):
requests arrive and take a free row and pages, prefill in chunks, decode with
speculative tokens whose rejected drafts roll ``num_computed_tokens`` back,
finish (their rows and pages go to later requests) or are preempted (they
leave, and return later to recompute).

The reference stays stateless: step ``k`` is judged from its own
:class:`~attnfuzz.reference.batch.Case` (:meth:`Trace.case`), the scheduler's
view of that step. Only the implementation under test lives across the steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnfuzz.reference.batch import (
    Batch,
    Case,
    EngineConfig,
    params_and_dtype_from_dict,
    params_and_dtype_to_dict,
)


@dataclass(frozen=True)
class Trace:
    """An engine config, the target's parameters, and the steps of one engine's life."""

    config: EngineConfig
    steps: tuple[Batch, ...]
    params: tuple[tuple[str, int], ...] = ()
    # As Case.dtype: the float dtype it was found in, a setting of the replay.
    dtype: str | None = field(default=None, compare=False)

    def case(self, k: int) -> Case:
        """Step ``k`` as a case on its own: what the reference judges it from."""
        return Case(self.config, self.steps[k], self.params, self.dtype)

    def cases(self) -> list[Case]:
        return [self.case(k) for k in range(len(self.steps))]

    def prefix(self, n: int) -> Trace:
        """The first ``n`` steps."""
        return Trace(self.config, self.steps[:n], self.params, self.dtype)

    def to_dict(self) -> dict:
        d = {"config": self.config.to_dict(), "steps": [step.to_dict() for step in self.steps]}
        return d | params_and_dtype_to_dict(self.params, self.dtype)

    @classmethod
    def from_dict(cls, d: dict) -> Trace:
        steps = d["steps"]
        if not isinstance(steps, list) or not steps:
            raise ValueError("a trace needs at least one step")
        return cls(
            EngineConfig.from_dict(d["config"]),
            tuple(Batch.from_dict(s) for s in steps),
            *params_and_dtype_from_dict(d),
        )

    @classmethod
    def of_case(cls, case: Case) -> Trace:
        """A case on its own as a trace of one step."""
        return cls(case.config, (case.batch,), case.params, case.dtype)

    @classmethod
    def of_cases(cls, cases: list[Case]) -> Trace:
        """Cases judged one after another (by one engine) as a trace: they must share
        their config and parameters, as the examples of one run's search need not."""
        first = cases[0]
        return cls(first.config, tuple(c.batch for c in cases), first.params, first.dtype)


def as_trace(example: Trace | Case) -> Trace:
    """An example as a trace: a trace as it is, a case as a trace of its one step (what a
    traced mutant's ``reach``, ``trigger`` and an engine's declines read either way)."""
    return example if isinstance(example, Trace) else Trace.of_case(example)


def step_summary(prev: Batch | None, step: Batch) -> str:
    """One line of what the scheduler did between ``prev`` and ``step``: requests that
    arrived, finished (or were preempted) and had drafts rejected, and the step's shape.
    A step without the scheduler's fields is a step on its own (a history's example):
    its requests are all new, whatever ids the step before used."""
    parts = [f"{step.num_reqs} requests, {sum(step.q_lens)} tokens, q_lens {list(step.q_lens)}"]
    if prev is not None and not step.req_ids:
        parts.append("a step on its own: every request new")
        prev = None
    ids = step.request_ids
    before = dict(zip(prev.request_ids, prev.seq_lens, strict=True)) if prev is not None else {}
    arrived = [
        i for i, n in zip(ids, step.new_pages or [1] * len(ids), strict=True) if i not in before
    ]
    gone = [i for i in before if i not in ids]
    rolled = [
        i
        for i, computed in zip(ids, step.num_computed_tokens, strict=True)
        if i in before and computed < before[i]
    ]
    if arrived and prev is not None:
        parts.append(f"arrived {arrived}")
    if gone:
        parts.append(f"left {gone}")
    if rolled:
        parts.append(f"drafts rejected {rolled}")
    if not step.use_cudagraph:
        parts.append("forced eager")
    return "; ".join(parts)


def trace_violations(trace: Trace) -> list[str]:
    """What makes ``trace`` a life no engine could have (each step's own invariants
    are :func:`~attnfuzz.reference.invariants.violations`'): a request that stays
    from one step to the next keeps its pages, gaining ``new_pages`` at the end,
    and runs on from the tokens the step before left computed (its computed tokens
    and query, less the drafts it rejected: as ``rejected`` says, or, where the step
    does not say, fewer than its query); a request new to the engine gains all its
    pages and rejects no draft (drafts are proposed by a step the request ran in). A
    step without the scheduler's fields (``req_ids``) is a step on its own: its
    requests are new."""
    out = []
    prev: dict[int, _Held] = {}
    for k, step in enumerate(trace.steps):
        out += [f"step {k}: {v}" for v in _held_violations(prev, step)]
        held = {}
        if step.pages:
            rejected = step.rejected or (0,) * step.num_reqs
            lives = zip(
                step.request_ids, step.pages, step.num_computed_tokens, step.q_lens, rejected,
                strict=True,
            )  # fmt: skip
            for req, pages, c, q, x in lives:
                # Unsaid: up to its drafts, at most its query less its token.
                unsaid = 0 if step.rejected or req not in prev else q - 1
                held[req] = _Held(pages, c + q - x, unsaid)
        prev = held
    return out


def first_step_violations(step: Batch) -> list[str]:
    """What makes ``step`` no first step of an engine, as :func:`trace_violations`
    says it of a trace's step 0: every request is new, gains all its pages and
    rejects no draft. A case on its own is judged by a new engine: it is that
    engine's first step."""
    return _held_violations({}, step)


@dataclass(frozen=True)
class _Held:
    """What a request holds after a step: its pages, its computed tokens once the
    step's rejected drafts are rolled back, and how many more drafts it may have
    rejected where the step does not say (0: it says, or the request was new)."""

    pages: tuple[int, ...]
    computed: int
    unsaid: int


def _held_violations(prev: dict[int, _Held], step: Batch) -> list[str]:
    """What ``step`` says of its requests that ``prev`` (what each request held after
    the step before, by id) contradicts."""
    out = []
    for r, req in enumerate(step.request_ids):
        if not step.pages:
            break
        pages, new = step.pages[r], step.new_pages[r]
        rejected = step.rejected[r] if step.rejected else 0
        before = prev.get(req)
        if before is None:
            if new != len(pages):
                out.append(f"request {req} is new, yet gains {new} of {len(pages)} pages")
            if rejected:
                out.append(f"request {req} is new, yet rejects {rejected} drafts")
            continue
        if pages[: len(before.pages)] != before.pages or len(pages) - len(before.pages) != new:
            out.append(
                f"request {req} held pages {list(before.pages)}, now {list(pages)} with {new} new"
            )
        computed = step.num_computed_tokens[r]
        if not before.computed - before.unsaid <= computed <= before.computed:
            more = f" less up to {before.unsaid} rejected drafts" if before.unsaid else ""
            out.append(
                f"request {req} left the step before with {before.computed} computed "
                f"tokens{more}, yet runs on from {computed}"
            )
    return out
