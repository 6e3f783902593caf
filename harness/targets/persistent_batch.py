"""Target ``persistent-batch``: the model runner's request rows kept across steps.

One engine is judged over a trace of steps (:class:`~attnfuzz.reference.trace.Trace`):
the implementation remembers each request's row, pages and computed tokens from
one scheduler output to the next, and each step hands on the metadata attention
reads. The oracle checks each step against that step's common metadata
(:mod:`attnfuzz.reference.persistent_batch`): the fields' shapes, dtypes and
values (of a real request's block-table row, its own pages only; padding rows
whole), and that each field is a view at the start of a persistent buffer.

The mutants' bugs live in an engine's life: each needs an earlier step to set
the state a later one meets, so their ``reach``, ``trigger`` and ``smallest``
take and give traces (a case is taken as a trace of one step: it meets none of
them), and only a search of traces (``Target.traces``, ``Target.judge_trace``)
finds them: judged as steps on their own, each by a new engine, they pass.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from attnfuzz.harness.oracle import Check, Mismatch, expect_equal, expect_meta, expect_view_of
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.reference import persistent_batch as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig, cdiv
from attnfuzz.reference.trace import Trace, as_trace

DTYPES = {
    "query_start_loc": torch.int32,
    "seq_lens": torch.int32,
    "block_table": torch.int32,
    "slot_mapping": torch.int64,
}


def _expect_pages(got: torch.Tensor, expected: ref.PersistentBatchExpected) -> list[Mismatch]:
    """Each row's first ``num_pages`` entries exactly (the rest of a real row is stale):
    the first wrong row only."""
    for r, n in enumerate(expected.num_pages.tolist()):
        at = np.s_[r, :n]
        wrong = expect_equal("block_table", got[at], expected.block_table[at], at=at)
        if wrong:
            return wrong
    return []


def compare(
    case: Case,
    inputs: ref.PersistentBatchInputs,
    expected: ref.PersistentBatchExpected,
    got: ref.PersistentBatchOutputs,
) -> list[Mismatch]:
    out: list[Mismatch] = []
    for field in ref.FIELDS:
        want = getattr(expected, field)
        out += expect_meta(field, getattr(got, field, None), want.shape, DTYPES[field])
    if out:
        return out
    for field in ref.FIELDS:
        if field == "block_table":
            out += _expect_pages(got.block_table, expected)
        else:
            out += expect_equal(field, getattr(got, field), getattr(expected, field))
    buffers = getattr(got, "buffers", None) or {}
    for field in ref.FIELDS:
        buffer = buffers.get(field)
        if not isinstance(buffer, torch.Tensor):
            out.append(Mismatch(Check.VIEW, f"buffers.{field}", "the persistent buffer", "none"))
        else:  # a graph replays on fixed addresses: every step's fields start the buffers
            out += expect_view_of(field, getattr(got, field), buffer)
    out += _expect_slot_tail(buffers.get("slot_mapping"), inputs.num_slot_tokens)
    return out


def _expect_slot_tail(buffer: object, T_slots: int) -> list[Mismatch]:
    """The slot buffer past ``T_slots`` holds -1 to its end: a kernel bounded by the
    buffer reads there (vLLM's ``_compute_slot_mappings_kernel`` pads it so)."""
    if not isinstance(buffer, torch.Tensor) or buffer.ndim != 1 or buffer.shape[0] < T_slots:
        return []  # a missing or short buffer is the view check's
    at = np.s_[T_slots:]
    tail = np.full(buffer.shape[0] - T_slots, ref.PAD_SLOT_ID, dtype=np.int64)
    return expect_equal("buffers.slot_mapping", buffer[at], tail, at=at)


class ReferenceEngine:
    """The reference's model of an engine as an implementation (a self-check of the
    harness): each running request's pages in a list by its id, no rows; each step's
    fields by plain loops, written into buffers allocated at the engine's limits."""

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        self.engine: tuple | None = None
        self.pages: dict[int, list[int]] = {}
        self.buffers: dict[str, torch.Tensor] = {}

    def __call__(self, inp: ref.PersistentBatchInputs) -> ref.PersistentBatchOutputs:
        config = inp.config
        if self.engine != (config, inp.device):
            self.new_engine()
            self.engine = (config, inp.device)
            S, N, W = config.max_num_seqs, config.max_num_batched_tokens, ref.table_width(config)
            self.buffers = {
                "query_start_loc": torch.zeros(S + 1, dtype=torch.int32, device=inp.device),
                "seq_lens": torch.zeros(S, dtype=torch.int32, device=inp.device),
                "block_table": torch.zeros(S, W, dtype=torch.int32, device=inp.device),
                "slot_mapping": torch.zeros(N, dtype=torch.int64, device=inp.device),
            }
        # The running requests' pages: those that left or came back new start over.
        staying = {i for i, new in zip(inp.req_ids, inp.is_new, strict=True) if not new}
        self.pages = {i: p for i, p in self.pages.items() if i in staying}
        for i, gained in zip(inp.req_ids, inp.new_block_ids, strict=True):
            self.pages[i] = self.pages.get(i, []) + list(gained)
        R, T, R_pad, bs = inp.num_reqs, inp.num_tokens, inp.num_reqs_padded, config.block_size
        query_start_loc, seq_lens, slots = [0], [], []
        for i, computed, q in zip(
            inp.req_ids, inp.num_computed_tokens, inp.query_lens, strict=True
        ):
            query_start_loc.append(query_start_loc[-1] + q)
            seq_lens.append(computed + q)
            for pos in range(computed, computed + q):
                slots.append(self.pages[i][pos // bs] * bs + pos % bs)
        query_start_loc += [T] * (R_pad - R)
        seq_lens += [0] * (R_pad - R)
        b = self.buffers
        slots += [ref.PAD_SLOT_ID] * (b["slot_mapping"].shape[0] - T)  # to the end of the buffer
        b["query_start_loc"][: R_pad + 1] = torch.tensor(query_start_loc, dtype=torch.int32)
        b["seq_lens"][:R_pad] = torch.tensor(seq_lens, dtype=torch.int32)
        b["slot_mapping"][:] = torch.tensor(slots, dtype=torch.int64)
        for r, i in enumerate(inp.req_ids):
            pages = self.pages[i]
            b["block_table"][r, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        b["block_table"][R:R_pad] = ref.PAD_PAGE
        return ref.PersistentBatchOutputs(
            query_start_loc=b["query_start_loc"][: R_pad + 1],
            seq_lens=b["seq_lens"][:R_pad],
            block_table=b["block_table"][:R_pad],
            slot_mapping=b["slot_mapping"][: inp.num_slot_tokens],
            buffers=dict(b),
        )


reference_impl = ReferenceEngine()

# -- the zoo's metadata of each mutant, over traces ----------------------------------------------
#
# Each takes a trace (a case is a trace of one step) and is exact: it computes
# from the steps alone whether the mutant's outputs differ from the reference's.


def _scheduler_outputs(trace: Trace) -> list[ref.PersistentBatchInputs]:
    return [ref.make_inputs(case) for case in trace.cases()]


def reach_later_step(trace: Trace | Case) -> bool:
    """A step after the first: it runs in buffers an earlier step found allocated."""
    return len(as_trace(trace).steps) > 1


def trigger_workspace_first_step(trace: Trace | Case) -> bool:
    """A later step hands on more rows or slots than the first one did."""
    first, *later = _scheduler_outputs(as_trace(trace))
    return any(
        s.num_reqs_padded > first.num_reqs_padded or s.num_slot_tokens > first.num_slot_tokens
        for s in later
    )


def reach_padding_after_a_step(trace: Trace | Case) -> bool:
    """A step after the first has padding rows (``R < R_pad``)."""
    steps = _scheduler_outputs(as_trace(trace))
    return any(s.num_reqs < s.num_reqs_padded for s in steps[1:])


def trigger_stale_padding_rows(trace: Trace | Case) -> bool:
    """A padding row ``i`` (``R <= i < R_pad``) that an earlier step's real request
    wrote (``i < R`` of that step): left unwritten, it keeps that length (never 0)."""
    most = 0  # rows an earlier step's real requests wrote: 0 .. most - 1
    for s in _scheduler_outputs(as_trace(trace)):
        if s.num_reqs < min(s.num_reqs_padded, most):
            return True
        most = max(most, s.num_reqs)
    return False


class _RowsSeen(NamedTuple):
    reused: bool  # a new request took a row an earlier request held
    wrong: bool  # some request's row disagrees with its pages, or overflows
    overflow: bool  # some row overflows the table: the append raises


def rows_seen(trace: Trace, reset_page_count: bool, read: bool = False) -> _RowsSeen:
    """The engine's rows in plain Python, with or without a new request's page count
    reset. With ``read``, a row is compared only on the pages its consumers read, the
    first ``cdiv(seq_len, block_size)`` (a step's slots lie in them too)."""
    config = trace.config
    W = ref.table_width(config)
    rows: dict[int, int] = {}  # req_id -> row
    table: dict[int, list[int]] = {}  # row -> its entries
    count: dict[int, int] = {}  # row -> pages it holds
    reused = wrong = False
    for batch in trace.steps:
        inp = ref.make_inputs(Case(config, batch))
        staying = {i for i, new in zip(inp.req_ids, inp.is_new, strict=True) if not new}
        rows = {i: row for i, row in rows.items() if i in staying}
        for i, new, gained in zip(inp.req_ids, inp.is_new, inp.new_block_ids, strict=True):
            if new:
                rows[i] = min(set(range(config.max_num_seqs)) - set(rows.values()))
                reused |= rows[i] in table
                if reset_page_count:
                    count[rows[i]] = 0
            row = rows[i]
            start = count.get(row, 0)
            if start + len(gained) > W:
                return _RowsSeen(reused, True, True)
            entries = table.setdefault(row, [0] * W)
            entries[start : start + len(gained)] = gained
            count[row] = start + len(gained)
        for i, pages, seq_len in zip(
            inp.req_ids, ref.owned_pages(config, batch), batch.seq_lens, strict=True
        ):
            n = min(len(pages), cdiv(seq_len, config.block_size)) if read else len(pages)
            wrong |= tuple(table[rows[i]][:n]) != pages[:n]
    return _RowsSeen(reused, wrong, False)


def reach_row_reuse(trace: Trace | Case) -> bool:
    """A new request takes a row an earlier request held (lowest free row first)."""
    return rows_seen(as_trace(trace), reset_page_count=True).reused


def trigger_row_reuse_page_count(trace: Trace | Case) -> bool:
    """With the old page count kept, some request's row disagrees with its pages: its
    first pages are the previous occupant's (unless the scheduler gave it the very
    pages the occupant held, in order), or the row overflows."""
    return rows_seen(as_trace(trace), reset_page_count=False).wrong


def _continuing(trace: Trace) -> list[tuple[int, int]]:
    """``(num_computed_tokens, previous seq_len)`` of each request that runs on from
    the step before (not new to the engine)."""
    out = []
    for prev, batch in zip(trace.steps, trace.steps[1:], strict=False):
        before = dict(zip(prev.request_ids, prev.seq_lens, strict=True))
        for i, new, computed in zip(
            batch.request_ids, ref.new_to_engine(batch), batch.num_computed_tokens, strict=True
        ):
            if not new and i in before:
                out.append((computed, before[i]))
    return out


def reach_running_request(trace: Trace | Case) -> bool:
    """A request runs on from one step to the next (its computed tokens are updated)."""
    return bool(_continuing(as_trace(trace)))


def trigger_draft_rollback(trace: Trace | Case) -> bool:
    """A running request's computed tokens fall short of its last ``seq_len``: drafts
    were rejected, and taking them all as accepted overcounts its length."""
    return any(computed != seq_len for computed, seq_len in _continuing(as_trace(trace)))


def _step(
    computed: tuple[int, ...],
    q_lens: tuple[int, ...],
    req_ids: tuple[int, ...],
    pages: tuple[tuple[int, ...], ...],
    new_pages: tuple[int, ...],
) -> Batch:
    return Batch(computed, q_lens, 0, True, req_ids=req_ids, pages=pages, new_pages=new_pages)


def _spec_config(**overrides: int) -> EngineConfig:
    from attnfuzz.harness.testing import spec_config

    return spec_config(**overrides)


def smallest_workspace_first_step() -> Trace:
    """The example engine (next_n = 2, block size 4): one request prefills its first token
    (a slot mapping of 2 slots, the smallest capture size), then a chunk of 3 tokens
    (4 slots): the second step needs more slots than the first. One step never does; one
    request of one page is the least a step holds."""
    steps = (
        _step((0,), (1,), (0,), ((1,),), (1,)),
        _step((1,), (3,), (0,), ((1,),), (0,)),
    )
    return Trace(_spec_config(), steps)


def smallest_stale_padding_rows() -> Trace:
    """next_n = 1 (capture sizes 2, 4, ...): two requests decode a token each (2 rows),
    then one is gone and the other decodes alone, padded to the graph of 2: padding
    row 1 keeps the length of the request that left. A padding row needs a step
    with fewer requests than the graph has rows (here 1 of 2), and a stale one a step
    before it with more requests than that: two steps, two requests, then one."""
    steps = (
        _step((0, 0), (1, 1), (0, 1), ((1,), (2,)), (1, 1)),
        _step((1,), (1,), (0,), ((1,),), (0,)),
    )
    return Trace(_spec_config(num_spec=0), steps)


def smallest_row_reuse_page_count() -> Trace:
    """Request 0 runs a token on page 1 in row 0 and finishes; request 1 arrives, takes
    row 0 and page 2 (a never-used page first, as vLLM's free-block queue hands them
    out): with row 0's count kept at 1, page 2 lands in column 1 and column 0 still
    says page 1. A reused row needs two requests, one after the other: two steps."""
    steps = (
        _step((0,), (1,), (0,), ((1,),), (1,)),
        _step((0,), (1,), (1,), ((2,),), (1,)),
    )
    return Trace(_spec_config(), steps)


def smallest_draft_rollback() -> Trace:
    """The example engine (next_n = 2): a request prefills 1 token, decodes its token
    and a draft (seq_len 3), the draft is rejected, and it decodes again from 2 computed
    tokens: the mutant counts 3. A rejected draft needs a decode step after the request's
    prefill, and the rollback a step after that: three steps, the fewest."""
    steps = (
        _step((0,), (1,), (0,), ((1,),), (1,)),
        Batch((1,), (2,), 0, True, req_ids=(0,), pages=((1,),), new_pages=(0,), rejected=(1,)),
        _step((2,), (2,), (0,), ((1,),), (0,)),
    )
    return Trace(_spec_config(), steps)


def build() -> Target:
    from attnfuzz.kernels import persistent_batch as k

    # Every implementation lives across steps (traced): its reach, trigger and smallest
    # take and give traces.
    return Target(
        runs_in="runner",
        name="persistent-batch",
        summary="the model runner's request rows across an engine's steps: block-table rows, "
        "computed tokens and the step's metadata handed to attention",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        # Stale padding rows need a padded step with padding requests.
        guided=("padding_requests",),
        implementations=(
            Implementation(
                "triton",
                k.persistent_batch,
                Kind.FIXED,
                "rows kept, one Triton kernel",
                traced=True,
            ),
            Implementation(
                "reference", reference_impl, Kind.REFERENCE, "pages by id, plain loops", traced=True
            ),
            Implementation.mutant(
                "workspace-first-step",
                k.mutant_workspace_first_step,
                "buffers sized by the first step's padded counts: a larger step does not fit",
                reach=reach_later_step,
                trigger=trigger_workspace_first_step,
                smallest=smallest_workspace_first_step,
                traced=True,
            ),
            Implementation.mutant(
                "stale-padding-rows",
                k.mutant_stale_padding_rows,
                "padding rows' seq_lens not written: an earlier step's lengths handed on",
                reach=reach_padding_after_a_step,
                trigger=trigger_stale_padding_rows,
                smallest=smallest_stale_padding_rows,
                traced=True,
            ),
            Implementation.mutant(
                "row-reuse-page-count",
                k.mutant_row_reuse_page_count,
                "a reused row's page count not reset: pages appended after the last occupant's",
                reach=reach_row_reuse,
                trigger=trigger_row_reuse_page_count,
                smallest=smallest_row_reuse_page_count,
                traced=True,
            ),
            Implementation.mutant(
                "draft-rollback",
                k.mutant_draft_rollback,
                "computed tokens advanced by the last step's tokens: rejected drafts kept",
                reach=reach_running_request,
                trigger=trigger_draft_rollback,
                smallest=smallest_draft_rollback,
                traced=True,
            ),
        ),
    )
