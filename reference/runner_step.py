"""Properties of an engine runner's step: what must hold with no hand-written expected value.

The runner of a serving engine builds, per step, the tensors its attention
kernels read, in persistent buffers sized for its largest CUDA graph: the
step's real rows first, then *padding rows* up to the size of the graph it
replays. attnfuzz drives the engine's own step (its input preparation, its
padding and graph dispatch, its capture runs, its draft loop) and records each
*build* of the step: every field the consumers read, padding rows included.
Nothing here says what a field's values must be; the properties say which
builds must agree and what a padding row may hold:

- *padding invariance*: the real rows of a build padded for a graph equal the
  real rows of the same step built eagerly (``how="eager"``, no padding);
- *replay equals eager*: what a graph replay leaves in the persistent buffers
  (``how="replay"``) on the real rows equals the eager build's;
- *safe padding*: every value of every row, padding rows included, is one the
  field's consumer accepts (``Field.accepts``, read from the consumer's code:
  an index inside the allocated pages or slots, a length the block table
  reaches, the engine's null ids);
- *history invariance*: the same step after two different histories of the
  same engine (``how="eager"`` and ``how="fresh"``: the step's requests added to
  a new engine) gives the same real rows;
- *agreement across backends*: the step's eager build by another attention backend
  of the same engine (``how="backend"``, its ``where`` naming it) has the eager
  build's real rows on every field both hold: what each backend derives from the
  step (a request's KV length, the KV slots it reads) is the same in all;
- *padding writes no real KV*: in every build with padding tokens, no padding row
  of a field that names where a token's key and value are written
  (``Field.writes_kv``: vLLM's ``slot_mapping``, SGLang's ``out_cache_loc``) holds a
  KV slot a real request of the same step reads (the read entries of the real rows
  of the build's own ``kv_slots``, or, where it has none, of the first eager build
  of its sub-step; where neither has ``kv_slots`` the property says nothing; a
  capture run, of no step's requests, is not judged). A negative slot (vLLM's
  ``PAD_SLOT_ID``: write nothing) is never a real one. A slot in range passes safe
  padding, yet the padded forward writes the padding token's key over a live
  request's cached one.
- *padding writes no real state*: in every build with padding requests, no padding
  row of a field that names a request's recurrent state slot (``Field.writes_state``:
  a linear-attention layer's state index, which its kernels read and update in place)
  holds a slot a real row of the same field names (a capture run, of no step's
  requests, is not judged). A slot in range passes safe padding, yet the padded
  forward updates a live request's state with the padding row's tokens.
- *a dummy run writes nothing live*: a dummy run between two steps (``how="dummy"``:
  a forward of no step's requests while the engine holds running ones, as a
  data-parallel rank idle while its peers run a step makes) has no real rows; no
  row of it may write a KV slot or a state slot of a request the engine held while
  it ran: the two properties above, with the real rows those of the step's first
  eager build whose requests the engine held then (``StepBuild.live``; a request
  new to the step held nothing yet), on the fields by request (a field by token
  names no request's row).
- *micro-batch agreement*: a micro-batch of a split step (``how="microbatch"``: the
  step's tokens ``first_token`` to ``first_token + num_tokens``, run as a forward of
  its own, as vLLM's dual-batch overlap runs each half and a prefill context parallel
  rank each chunk of a query it holds) has the real rows of the first eager build of
  its sub-step cut to those tokens: its requests those whose query overlaps them, its
  token rows theirs, its offsets the eager ones less ``first_token``, clipped to its
  tokens. A request whose query runs past the micro-batch's last token reads its keys
  up to that token only: its ``kv_len`` is the eager one less the query tokens past
  it, its ``kv_slots`` the first of those, and its other request fields (each engine's
  own names for that length) are judged through those two alone. A micro-batch that
  starts past the step's last real token (a split at the middle of a count the padding
  doubled: vLLM's V2 runner runs it, its request clamped onto the last one with no
  query token) has no real row: only safety judges it. The micro-batches of one
  partition of a sub-step (``StepBuild.partition``: the segments a context-parallel
  split hands its ranks) together hold each of its tokens once: none left out, none
  run twice.

A field's rows are indexed by the step's requests (``rows="requests"``), its
tokens (``"tokens"``) or its request offsets (``"offsets"``: ``num_reqs + 1``
real entries, as ``query_start_loc``). Only the real rows are compared across
builds: what padding rows hold differs by design between a padded build and an
eager one, and is judged by safety alone. A drafter's forwards are builds too
(``draft``), each compared with the eager one of its sub-step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Batch, Case, EngineConfig, kv_cache_pages
from attnfuzz.reference.persistent_batch import (
    PAD_PAGE,
    PAD_SLOT_ID,
    new_to_engine,
    owned_pages,
    table_width,
)
from attnfuzz.reference.runner import StepPlan, capture_batches, step_plan

__all__ = [
    "BUILDS",
    "FIELD_ROWS",
    "NO_REAL_ROWS",
    "ROWS",
    "Field",
    "RunnerStepExpected",
    "RunnerStepInputs",
    "RunnerStepOutputs",
    "StepBuild",
    "Violation",
    "agreement_across_backends",
    "agreement_within_a_build",
    "capture_steps",
    "consumer_ranges",
    "dummy_values",
    "history_invariance",
    "kv_cache_pages",
    "make_inputs",
    "microbatch_agreement",
    "padding_invariance",
    "padding_writes_no_real_kv",
    "queries_read_their_own_keys",
    "real_rows",
    "reference",
    "replay_equals_eager",
    "runner_build",
    "runner_plan",
    "safe_padding",
    "violations",
]

ROWS = ("requests", "tokens", "offsets")
# "eager": the step with no graph padding; "padded": the step as the runner pads it
# for the graph it dispatched to; "replay": the persistent buffers after the
# runner's replay preparation; "capture": a capture run, or a dummy run before the
# engine serves (no real rows); "fresh": the eager step on a new engine that never saw
# the earlier steps; "backend": the eager step on another attention backend of the same
# engine; "microbatch": a micro-batch of the step (its tokens from StepBuild.first_token
# on), as the runner hands it to a forward of its own; "dummy": a dummy run between two
# steps, while the engine holds running requests (no real rows; StepBuild.live).
BUILDS = ("eager", "padded", "replay", "capture", "fresh", "backend", "microbatch", "dummy")
# The builds of no step's requests: no real rows, no sizes of the step.
NO_REAL_ROWS = ("capture", "dummy")


@dataclass
class RunnerStepInputs:
    """One scheduler output (host data, as vLLM's ``SchedulerOutput``): the runner
    decides the step's padding and graph itself, from ``config``."""

    config: EngineConfig  # the engine's limits, capture sizes and graph mode
    req_ids: tuple[int, ...]  # [R], batch order
    is_new: tuple[bool, ...]  # [R]: new to the engine (arrived, or resumed after preemption)
    num_computed_tokens: tuple[int, ...]  # [R], the scheduler's (rejected drafts rolled back)
    query_lens: tuple[int, ...]  # [R]: 1 + the request's drafts for a decode
    new_block_ids: tuple[tuple[int, ...], ...]  # [R]: the pages each request gained this step
    device: torch.device  # where the implementation's buffers live
    # The requests finished since the last step (the scheduler's finished request ids; one
    # left out and not finished was preempted).
    finished_req_ids: tuple[int, ...] = ()
    # [R]: the drafts each request rejects after the step (empty: none), as the sampler
    # decides them and the next step's computed tokens roll back.
    num_rejected: tuple[int, ...] = ()
    # [R]: the tokens each request prefills before it decodes (its prompt), as the
    # scheduler knows them (empty: not said; a new request's prompt ends with its query).
    prompt_lens: tuple[int, ...] = ()

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@dataclass(frozen=True)
class RunnerStepExpected:
    """All the reference states: the step's real sizes, every build's but a capture run's."""

    num_reqs: int
    num_tokens: int


def make_inputs(case: Case, device: torch.device | str = "cpu") -> RunnerStepInputs:
    """The scheduler output of ``case``'s step: each request's new pages are the last
    ``new_pages`` of its pages (all of them for a step on its own)."""
    config, batch = case.config, case.batch
    pages = owned_pages(config, batch)
    gained = batch.new_pages or tuple(len(p) for p in pages)
    return RunnerStepInputs(
        config=config,
        req_ids=batch.request_ids,
        is_new=new_to_engine(batch),
        num_computed_tokens=tuple(batch.num_computed_tokens),
        query_lens=tuple(batch.q_lens),
        new_block_ids=tuple(p[len(p) - n :] for p, n in zip(pages, gained, strict=True)),
        device=torch.device(device),
        finished_req_ids=batch.finished,
        num_rejected=batch.rejected,
        prompt_lens=batch.prompt_lens,
    )


def reference(case: Case, inputs: RunnerStepInputs) -> RunnerStepExpected:
    return RunnerStepExpected(num_reqs=inputs.num_reqs, num_tokens=inputs.num_tokens)


@dataclass(frozen=True)
class Field:
    """One tensor a consumer reads: ``values`` as the consumer sees it (the view of the
    persistent buffer it is handed, padding rows included; 2-D for a block table)."""

    name: str
    rows: str  # one of ROWS
    values: np.ndarray
    # The inclusive range of values its consumer accepts, read from the consumer's
    # code (the adapter cites the function); None: any value (a field no index reads).
    accepts: tuple[int, int] | None = None
    # For a 2-D field: how many leading entries of each row its consumer reads (a
    # block-table row: the request's ``cdiv(seq_len, block_size)`` pages), read from the
    # consumer's code; None: the whole row. Builds agree on those entries only: what a
    # row holds past them no consumer reads. Safety still holds every entry to accepts.
    row_lengths: np.ndarray | None = None
    # Whether the field names the KV slot each of its entries' key and value is written
    # to (the forward's KV write reads it, padding rows included), read from the
    # consumer's code: its padding rows must name no slot a real request reads.
    writes_kv: bool = False
    # Whether the field (by request; 2-D: a slot per token of the request's query)
    # names the recurrent state slot each request's kernels read and update in place (a
    # linear-attention layer's state index), read from the consumer's code: its padding
    # rows must name no slot a real row names.
    writes_state: bool = False
    # A slot that stands for no request (vLLM's null block, which the block pool never
    # hands out and the kernels skip; SGLang's dummy mamba slot), besides the negative
    # ones: a padding row naming it writes no request's state, whatever a real row holds.
    null_slot: int | None = None
    # Another field of the same build whose real rows this one's must equal, read from
    # the consumers' contract (an M-RoPE channel of a text token is its 1-D position:
    # ``MRotaryEmbedding`` positions of text, a delta of 0); None: no such relation.
    agrees_with: str | None = None
    # For a field that names the KV slot each row's query writes its key to: another
    # field of the same build, 2-D with a row per row of this one, whose read entries
    # (its ``row_lengths``) are the slots that query attends to, read from the consumers'
    # code; a causal query attends to its own key, so each real row's slot is among
    # them. None: no such relation.
    read_in: str | None = None


@dataclass(frozen=True)
class StepBuild:
    """One build of one step: its real sizes and every field it produced."""

    how: str  # one of BUILDS
    num_reqs: int
    num_tokens: int
    fields: tuple[Field, ...]
    where: str = ""  # the engine function that built it, for the message
    # The drafter's sub-step (0: its first pass; None: the step's own forward), agreeing
    # with the eager build of its sub-step; ``proposed_before``: of the proposal after
    # the previous step (made once this step told the sampler's verdict), of its requests.
    draft: int | None = None
    proposed_before: bool = False
    # A micro-batch's first token in its step: it holds the step's tokens first_token
    # to first_token + num_tokens (its num_reqs requests, those tokens' ones).
    first_token: int = 0
    # A micro-batch's partition of its step (None: none said): the micro-batches of one
    # partition of a sub-step (a context-parallel split's ranks' segments) together
    # hold each of its tokens once.
    partition: str | None = None
    # A dummy run's: the rows of the step's first eager build whose requests the engine
    # held while the dummy run ran (the step's requests not new to it).
    live: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.how if self.draft is None else f"{self.how}.draft{self.draft}"

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


@dataclass(frozen=True)
class RunnerStepOutputs:
    """Every build an engine's step produced, in the order the runner made them."""

    builds: tuple[StepBuild, ...]

    def of(self, how: str) -> Iterator[StepBuild]:
        return (b for b in self.builds if b.how == how)


@dataclass(frozen=True)
class Violation:
    """A property that does not hold: which, for which field of which build, where."""

    prop: str
    field: str
    build: str
    detail: str


def real_rows(build: StepBuild, f: Field) -> np.ndarray:
    """The rows of ``f`` that belong to the step's real requests or tokens."""
    n = {"requests": build.num_reqs, "tokens": build.num_tokens, "offsets": build.num_reqs + 1}
    return f.values[: n[f.rows]]


def _agree(prop: str, base: StepBuild, other: StepBuild) -> list[Violation]:
    """Every field both builds hold agrees on its real rows (same sizes first)."""
    if (base.num_reqs, base.num_tokens) != (other.num_reqs, other.num_tokens):
        sizes = f"{other.num_reqs} requests, {other.num_tokens} tokens"
        return [Violation(prop, "-", other.name, f"{sizes}; {base.name} has "
                          f"{base.num_reqs} requests, {base.num_tokens} tokens")]  # fmt: skip
    out = []
    for f in base.fields:
        g = other.field(f.name)
        if g is None:
            continue
        want, got = real_rows(base, f), real_rows(other, g)
        if want.shape[1:] != got.shape[1:] and want.ndim == 2:
            # A block table is as wide as its build's buffer: compare the columns both hold.
            width = min(want.shape[1], got.shape[1])
            want, got = want[:, :width], got[:, :width]
        if want.ndim == 2 and want.shape == got.shape:
            want, got = _read_entries(want, f, base), _read_entries(got, g, other)
        if want.shape != got.shape or not np.array_equal(want, got):
            out.append(Violation(prop, f.name, other.name, _difference(want, got, base.name)))
    return out


def _read_entries(values: np.ndarray, f: Field, build: StepBuild) -> np.ndarray:
    """``values`` (a 2-D field's real rows) with every entry its consumer does not
    read set to -2**31: a value no field holds, so two builds differ on an entry only
    where a consumer of one of them reads it."""
    if f.row_lengths is None:
        return values
    lengths = real_rows(build, Field(f.name, f.rows, f.row_lengths))
    out = values.astype(np.int64, copy=True)
    out[np.arange(out.shape[1])[None, :] >= lengths[:, None]] = -(2**31)
    return out


def _difference(want: np.ndarray, got: np.ndarray, base: str) -> str:
    if want.shape != got.shape:
        return f"shape {tuple(got.shape)}, {base} {tuple(want.shape)}"
    where = np.argwhere(want != got)
    first = tuple(int(i) for i in where[0])
    return (f"{len(where)} of {want.size} real values differ; first at {list(first)}: "
            f"{_shown(got[first])} where {base} has {_shown(want[first])}")  # fmt: skip


def _shown(v: np.ndarray) -> str:
    """An entry as a message shows it: -2**31 is one its build's consumer does not read."""
    return "no read entry" if v.item() == -(2**31) else str(v.item())


def _against_eager(prop: str, how: str, out: RunnerStepOutputs) -> list[Violation]:
    """Each build of ``how`` agrees with the first eager build of its own sub-step."""
    eager = {b.draft: b for b in reversed(tuple(out.of("eager")))}  # the first of each
    return [v for b in out.of(how) if b.draft in eager for v in _agree(prop, eager[b.draft], b)]


def padding_invariance(out: RunnerStepOutputs) -> list[Violation]:
    """The real rows of every padded build equal the eager build's."""
    return _against_eager("padding invariance", "padded", out)


def replay_equals_eager(out: RunnerStepOutputs) -> list[Violation]:
    """What a replay leaves in the persistent buffers equals the eager build's real rows."""
    return _against_eager("replay equals eager", "replay", out)


def history_invariance(out: RunnerStepOutputs) -> list[Violation]:
    """The step on an engine that never saw the earlier steps builds the same real rows."""
    return _against_eager("history invariance", "fresh", out)


def agreement_across_backends(out: RunnerStepOutputs) -> list[Violation]:
    """Another backend's eager build of the step agrees on every field both builds hold."""
    return _against_eager("agreement across backends", "backend", out)


def safe_padding(out: RunnerStepOutputs) -> list[Violation]:
    """Every value of every build (padding rows and capture runs included) lies in the
    range its consumer accepts."""
    found = []
    for b in out.builds:
        for f in b.fields:
            if f.accepts is None or f.values.size == 0:
                continue
            lo, hi = f.accepts
            bad = np.argwhere((f.values < lo) | (f.values > hi))
            if len(bad):
                first = tuple(int(i) for i in bad[0])
                row = "real" if first[0] < len(real_rows(b, f)) else "padding"
                detail = (f"{len(bad)} values outside [{lo}, {hi}]; first at {list(first)} "
                          f"({row} row): {f.values[first].item()}")  # fmt: skip
                found.append(Violation("safe padding", f.name, b.name, detail))
    return found


def _real_source(
    build: StepBuild, eager: dict[int | None, StepBuild], name: str
) -> StepBuild | None:
    """The build whose real rows of field ``name`` hold the slots ``build`` must not
    write: its own where it has that field and real rows, else the first eager build of
    its sub-step (a dummy run's always: it has no real rows of its own)."""
    if build.how != "dummy" and build.field(name) is not None:
        return build
    return eager.get(build.draft)


def _live(build: StepBuild, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` (request rows of the source build) ``build`` must not write
    over: all of them, but for a dummy run only those the engine held while it ran."""
    return np.isin(rows, build.live) if build.how == "dummy" else np.ones(len(rows), dtype=bool)


def _real_reads(build: StepBuild, eager: dict[int | None, StepBuild]) -> tuple[np.ndarray, str]:
    """The KV slots the real requests of ``build``'s step read (for a dummy run, those
    the engine held while it ran), each with the request (row) that reads it: the read
    entries of the real rows of the build's own ``kv_slots``, else of the first eager
    build of its sub-step; the build named."""
    source = _real_source(build, eager, "kv_slots")
    f = source.field("kv_slots") if source is not None else None
    if f is None or f.values.ndim != 2:
        return np.zeros((0, 2), dtype=np.int64), ""
    read = _read_entries(real_rows(source, f), f, source)
    rows, cols = np.nonzero(read >= 0)  # -2**31: not read; negative: no slot
    keep = _live(build, rows)
    rows, cols = rows[keep], cols[keep]
    return np.stack([read[rows, cols], rows]).T.astype(np.int64), source.name


def padding_writes_no_real_kv(out: RunnerStepOutputs) -> list[Violation]:
    """No padding row of a field that names where a token's KV is written
    (``Field.writes_kv``) holds a KV slot a real request of the same step reads; no row
    of a dummy run one a request the engine held while it ran reads."""
    eager = {b.draft: b for b in reversed(tuple(out.of("eager")))}  # the first of each
    found = []
    # A capture run is a dummy forward of no step's requests (an engine captures before
    # it serves any): no request of it reads the KV its tokens write.
    for b in (b for b in out.builds if b.how != "capture"):
        writes = [f for f in b.fields if f.writes_kv and len(f.values) > len(real_rows(b, f))]
        if not writes:
            continue
        reads, source = _real_reads(b, eager)
        if not len(reads):
            continue
        reader: dict[int, int] = {}  # each slot's first reader
        for slot, row in reads.tolist():
            reader.setdefault(slot, row)
        for f in writes:
            padding = f.values[len(real_rows(b, f)) :]
            bad = np.argwhere(np.isin(padding, reads[:, 0]))
            if len(bad):
                first = tuple(int(i) for i in bad[0])
                slot = int(padding[first])
                at = [first[0] + len(real_rows(b, f)), *first[1:]]
                whose = "a request held while it ran" if b.how == "dummy" else "a real request"
                detail = (f"{len(bad)} {_unreal(b)} values name a KV slot {whose} reads; "
                          f"first at {at}: slot {slot}, read by request {reader[slot]} "
                          f"(kv_slots of {source})")  # fmt: skip
                found.append(Violation(_writes_prop(b, "KV"), f.name, b.name, detail))
    return found


def padding_writes_no_real_state(out: RunnerStepOutputs) -> list[Violation]:
    """No padding row of a field that names a request's state slot
    (``Field.writes_state``) holds a slot a real row of the same field names; no row of
    a dummy run one the first eager build's real row of a request the engine held while
    it ran names."""
    eager = {b.draft: b for b in reversed(tuple(out.of("eager")))}  # the first of each
    found = []
    for b in (b for b in out.builds if b.how != "capture"):
        for f in (f for f in b.fields if f.writes_state and len(f.values) > len(real_rows(b, f))):
            real = real_rows(b, f)
            first_padding = len(real)
            padding = f.values[first_padding:]
            rows, whose = np.arange(len(real)), "a real request"
            if b.how == "dummy":
                source = _real_source(b, eager, f.name)
                held = source.field(f.name) if source is not None else None
                if held is None or f.rows != "requests":
                    continue  # no eager rows of it; a field by token names no request's
                real = real_rows(source, held)
                rows = np.flatnonzero(_live(b, np.arange(len(real))))
                real, whose = real[rows], f"a request held while it ran ({source.name})"
            # A negative slot (PAD_SLOT_ID) or the null slot: no request's state.
            owned = real[real >= 0]
            if f.null_slot is not None:
                owned = owned[owned != f.null_slot]
            hit = np.isin(padding, owned).reshape(len(padding), -1)
            bad = np.flatnonzero(hit.any(axis=1))
            if len(bad):
                row = int(bad[0])
                slot = int(padding.reshape(len(padding), -1)[row][hit[row]][0])
                owner = int(rows[np.argwhere(real == slot)[0][0]])
                detail = (
                    f"{len(bad)} {_unreal(b)} rows name a state slot {whose} holds; "
                    f"first at [{row + first_padding}]: slot {slot}, request {owner}'s"
                )
                found.append(Violation(_writes_prop(b, "state"), f.name, b.name, detail))
    return found


def _unreal(build: StepBuild) -> str:
    """What a build's rows past its real ones are, for a message."""
    return "dummy-run" if build.how == "dummy" else "padding"


def _writes_prop(build: StepBuild, what: str) -> str:
    """The property a write of ``build`` into a live ``what`` (KV or state) breaks."""
    if build.how == "dummy":
        return "a dummy run writes nothing live"
    return f"padding writes no real {what}"


def _lengths_read(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 2-D field's rows with every entry past its row's length set to -2**31."""
    out = values.astype(np.int64, copy=True)
    out[np.arange(out.shape[1])[None, :] >= np.asarray(lengths)[:, None]] = -(2**31)
    return out


def _microbatch_against(eager: StepBuild, mb: StepBuild) -> list[Violation]:
    """``mb`` against ``eager`` cut to the micro-batch's tokens (module docstring)."""
    prop = "micro-batch agreement"
    offsets = next((f for f in eager.fields if f.rows == "offsets"), None)
    start, stop = mb.first_token, mb.first_token + mb.num_tokens
    if offsets is not None and mb.num_reqs == mb.num_tokens == 0 <= eager.num_tokens <= start:
        return []  # wholly in the step's padding: no real row, judged by safety alone
    if offsets is None or not 0 <= start < stop <= eager.num_tokens:
        return [Violation(prop, "-", mb.name, f"tokens [{start}, {stop}) of a step of "
                          f"{eager.num_tokens} tokens ({eager.name})")]  # fmt: skip
    qsl = real_rows(eager, offsets).astype(np.int64)
    first = int(np.searchsorted(qsl, start, side="right")) - 1
    last = int(np.searchsorted(qsl, stop, side="left"))  # one past the last request
    if mb.num_reqs != last - first:
        return [Violation(prop, "-", mb.name, f"{mb.num_reqs} requests; tokens [{start}, "
                          f"{stop}) of {eager.name} are {last - first} requests'")]  # fmt: skip
    past = int(qsl[last]) - stop  # the last request's query tokens after the micro-batch
    out = []
    for f in eager.fields:
        g = mb.field(f.name)
        if g is None:
            continue
        want, lengths = real_rows(eager, f), None
        if f.row_lengths is not None:
            lengths = real_rows(eager, Field(f.name, f.rows, f.row_lengths))[first:last]
            lengths = lengths.astype(np.int64, copy=True)
        if f.rows == "tokens":
            want = want[start:stop]
        elif f.rows == "offsets":
            want = np.clip(want[first : last + 1].astype(np.int64) - start, 0, stop - start)
        else:
            want = want[first:last]
            if past and f.name == "kv_len":
                want = want.astype(np.int64, copy=True)
                want[-1] -= past
            elif past and f.name == "kv_slots" and lengths is not None:
                lengths[-1] -= past
        got = real_rows(mb, g)
        if past and f.rows == "requests" and f.name not in ("kv_len", "kv_slots"):
            want, got = want[:-1], got[:-1]  # judged through kv_len and kv_slots
            lengths = None if lengths is None else lengths[:-1]
        if want.ndim == 2 and got.ndim == 2 and want.shape[0] == got.shape[0]:
            width = min(want.shape[1], got.shape[1])
            want, got = want[:, :width], got[:, :width]
            if lengths is not None and g.row_lengths is not None:
                mine = real_rows(mb, Field(g.name, g.rows, g.row_lengths))[: len(got)]
                want, got = _lengths_read(want, lengths), _lengths_read(got, mine)
        if want.shape != got.shape or not np.array_equal(want, got):
            cut = f"{eager.name}[{start}:{stop}]"
            out.append(Violation(prop, f.name, mb.name, _difference(want, got, cut)))
    return out


def _related(out: RunnerStepOutputs, relation: str) -> Iterator[tuple[StepBuild, Field, Field]]:
    """Each build of the step's requests (a capture or dummy run has none), each field
    that names another of its build through ``relation`` (a ``Field`` attribute), and
    that other field."""
    for b in out.builds:
        if b.how in NO_REAL_ROWS:
            continue
        for f in b.fields:
            name = getattr(f, relation)
            other = b.field(name) if name is not None else None
            if other is not None:
                yield b, f, other


def agreement_within_a_build(out: RunnerStepOutputs) -> list[Violation]:
    """Every field that names another (``Field.agrees_with``) holds the same real rows as
    it in each build of the step's requests (a capture or dummy run has none)."""
    found = []
    for b, f, other in _related(out, "agrees_with"):
        want, got = real_rows(b, other), real_rows(b, f)
        if want.shape != got.shape or not np.array_equal(want, got):
            detail = _difference(want, got, other.name)
            found.append(Violation("agreement within a build", f.name, b.name, detail))
    return found


def queries_read_their_own_keys(out: RunnerStepOutputs) -> list[Violation]:
    """Every real row of a field that names where a query writes its key and the field
    that query reads (``Field.read_in``) reads that key: a causal query attends to
    itself, in each build of the step's requests (a capture or dummy run has none). A
    row whose slot is negative writes no key. Where the keys read are a request's
    (rows ``requests``) and the keys written a token's, each token is held to its
    request's keys, the request the build's ``query_start_loc`` puts it in."""
    found = []
    for b, f, reads in _related(out, "read_in"):
        written = real_rows(b, f)
        read = _read_entries(real_rows(b, reads), reads, b)
        if reads.rows == "requests" and f.rows == "tokens" and read.ndim == 2:
            owner = _token_requests(b, len(written))
            if owner is None:
                detail = f"{len(written)} real tokens beyond the build's query_start_loc"
                found.append(Violation("queries read their own keys", f.name, b.name, detail))
                continue
            read = read[owner]
        if read.ndim != 2 or len(read) != len(written):
            detail = f"{len(written)} real rows; {reads.name} {tuple(read.shape)}"
            found.append(Violation("queries read their own keys", f.name, b.name, detail))
            continue
        unread = np.flatnonzero((written >= 0) & ~(read == written[:, None]).any(axis=1))
        if len(unread):
            r = int(unread[0])
            seen = read[r][read[r] != -(2**31)]
            detail = (f"{len(unread)} of {len(written)} real rows write a key they do not "
                      f"read; first row {r} writes slot {int(written[r])}, reads "
                      f"{len(seen)} slots of {reads.name}"
                      f"{f' (last {int(seen[-1])})' if len(seen) else ''}")  # fmt: skip
            found.append(Violation("queries read their own keys", f.name, b.name, detail))
    return found


def _token_requests(build: StepBuild, tokens: int) -> np.ndarray | None:
    """The request of each of the first ``tokens`` rows, by the build's
    ``query_start_loc`` (None: it has none, or it does not hold them all)."""
    qsl = build.field("query_start_loc")
    if qsl is None:
        return None
    starts = real_rows(build, qsl).astype(np.int64)
    if len(starts) == 0 or starts[0] != 0 or starts[-1] < tokens:
        return None
    return np.searchsorted(starts, np.arange(tokens), side="right") - 1


def _tiling(eager: StepBuild, mbs: list[StepBuild]) -> list[Violation]:
    """The micro-batches of one sub-step hold each of its tokens once: their real token
    spans, in order, run from its first token to its last with no gap and no overlap."""
    at, out = 0, []
    spans = sorted((b.first_token, b.num_tokens, b.name) for b in mbs if b.num_tokens)
    for start, n, name in spans:
        if start != at:
            what = (
                f"tokens [{at}, {start}) in none"
                if start > at
                else (f"tokens [{start}, {min(at, start + n)}) in two")
            )
            out.append(Violation("micro-batch agreement", "-", name, f"{what} of the "
                                 f"micro-batches of {eager.name}"))  # fmt: skip
        at = max(at, start + n)
    if at < eager.num_tokens:
        out.append(Violation("micro-batch agreement", "-", mbs[-1].name,
                             f"tokens [{at}, {eager.num_tokens}) of {eager.name} in none of "
                             f"its micro-batches"))  # fmt: skip
    return out


def microbatch_agreement(out: RunnerStepOutputs) -> list[Violation]:
    """Every micro-batch build equals the first eager build of its sub-step cut to its
    tokens, and the micro-batches of one partition of a sub-step together hold each of
    its tokens once."""
    eager = {b.draft: b for b in reversed(tuple(out.of("eager")))}  # the first of each
    found = [v for b in out.of("microbatch") if b.draft in eager
             for v in _microbatch_against(eager[b.draft], b)]  # fmt: skip
    parts = {(b.draft, b.partition) for b in out.of("microbatch") if b.partition is not None}
    for draft, partition in sorted(parts, key=str):
        if draft in eager:
            mbs = [b for b in out.of("microbatch") if (b.draft, b.partition) == (draft, partition)]
            found += _tiling(eager[draft], mbs)
    return found


PROPERTIES = (padding_invariance, replay_equals_eager, history_invariance,
              agreement_across_backends, safe_padding, padding_writes_no_real_kv,
              padding_writes_no_real_state, microbatch_agreement,
              agreement_within_a_build, queries_read_their_own_keys)  # fmt: skip


def violations(out: RunnerStepOutputs) -> list[Violation]:
    """Every property, in the order above."""
    for b in out.builds:
        if b.how not in BUILDS or any(f.rows not in ROWS for f in b.fields):
            raise ValueError(f"a build of kind {b.how!r} or a field's rows is not among "
                             f"{BUILDS} / {ROWS}")  # fmt: skip
    return [v for prop in PROPERTIES for v in prop(out)]


# -- what a runner of attnfuzz's own builds from (its own implementation and the
# reference's): the pages of its KV cache, the ranges its consumers accept, its
# dispatch and its capture runs. An engine's adapter reads these from the engine.


def consumer_ranges(config: EngineConfig, tokens: int) -> dict[str, tuple[int, int]]:
    """The values attnfuzz's own consumers of each field accept, for a build that
    hands ``tokens`` tokens on (padding included): an offset into the step's tokens,
    a length up to the model's limit, a page or slot of the KV cache (slot -1: not
    written), a position inside the model's limit."""
    pages = kv_cache_pages(config)
    return {
        "query_start_loc": (0, tokens),
        "seq_lens": (0, config.max_model_len),
        "block_table": (0, pages - 1),
        "slot_mapping": (PAD_SLOT_ID, pages * config.block_size - 1),
        "positions": (0, config.max_model_len - 1),
    }


FIELD_ROWS = {
    "query_start_loc": "offsets",
    "seq_lens": "requests",
    "block_table": "requests",
    "slot_mapping": "tokens",
    "positions": "tokens",
}
"""The fields a runner of attnfuzz's own records in each build, and what their rows are."""


def runner_build(
    how: str,
    config: EngineConfig,
    sizes: tuple[int, int],
    values: dict[str, np.ndarray],
    where: str = "",
) -> StepBuild:
    """A build of ``how`` with real sizes ``sizes`` (requests, tokens) from each field's
    values as its consumer sees them (copies: the buffers change on the next step);
    each field accepts :func:`consumer_ranges` of the tokens the build hands on (its
    positions: one per token the model runs, padding included)."""
    ranges = consumer_ranges(config, len(values["positions"]))
    # A block-table row's consumer reads the request's pages: cdiv(seq_len, block_size).
    read = {"block_table": -(-np.asarray(values["seq_lens"], np.int64) // config.block_size)}
    # The KV write (reshape_and_cache) stores each token's key at its slot_mapping entry.
    fields = tuple(Field(n, rows, np.array(values[n], copy=True), ranges[n], read.get(n),
                         writes_kv=n == "slot_mapping")
                   for n, rows in FIELD_ROWS.items())  # fmt: skip
    return StepBuild(how, sizes[0], sizes[1], fields, where)


def runner_plan(inputs: RunnerStepInputs) -> StepPlan:
    """How a runner of ``inputs.config`` runs the step, deciding on its own
    (:func:`attnfuzz.reference.runner.step_plan`): any step may replay a graph (a
    scheduler output forces none eager), and there is one data-parallel rank."""
    batch = Batch(inputs.num_computed_tokens, inputs.query_lens, 0, True)
    return step_plan(inputs.config, batch)


def capture_steps(config: EngineConfig) -> list[tuple[int, tuple[int, ...]]]:
    """The dummy steps a runner of ``config`` captures its FULL graphs on, largest first
    (as vLLM's runners): each one's token count and its requests' query lengths."""
    steps = [(key.num_tokens, q_lens) for key, q_lens in capture_batches(config)]
    return steps[::-1]


def dummy_values(config: EngineConfig, q_lens: tuple[int, ...]) -> dict[str, np.ndarray]:
    """A capture run's fields: requests new to the engine (``seq_len = q_len``) that hold
    no KV (the null page, slot -1), never longer than the model's limit (a dummy of more
    tokens than ``max_model_len`` has its length and positions capped there)."""
    limit = config.max_model_len
    q = np.asarray(q_lens, dtype=np.int64)
    qsl = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in q_lens] or [np.zeros(0)])
    return {
        "query_start_loc": qsl,
        "seq_lens": np.minimum(q, limit).astype(np.int32),
        "block_table": np.full((len(q), table_width(config)), PAD_PAGE, dtype=np.int32),
        "slot_mapping": np.full(int(q.sum()), PAD_SLOT_ID, dtype=np.int64),
        "positions": np.minimum(positions, limit - 1).astype(np.int64),
    }
