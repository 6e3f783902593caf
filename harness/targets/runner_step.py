"""Target ``runner-step``: an engine runner's whole step, judged by properties with no
hand-written expected value (:mod:`attnfuzz.reference.runner_step`).

An implementation is a runner: it takes one scheduler output at a time, decides
its padding and graph dispatch itself, and returns every *build* of the step it
made (eager, padded for a graph, what a replay leaves in the graph's buffers, its
capture runs, the same step on a new engine), each field as its consumer reads it.
The reference states only the step's real sizes. The oracle checks:

- ``values``: every build but a capture run or a micro-batch (another backend's too) reports
  the step's real sizes (``<build>.num_reqs``, ``.num_tokens``; a draft's ``.draft<k>``);
- ``type``: the outputs are :class:`~attnfuzz.reference.runner_step.RunnerStepOutputs`
  with an eager build, the one four properties compare with (without it they
  would hold by having nothing to compare), and one of each draft sub-step built;
- one check per property of :mod:`attnfuzz.reference.runner_step` (:class:`OwnCheck`,
  named as they are), at ``<build>.<field>``.

Implementations live across steps (``traced``): history invariance needs earlier
steps, so a search draws traces (a case on its own is a trace of one step), and
the mutants' ``reach``, ``trigger`` and ``smallest`` read and give traces.

The ``reference`` implementation is the runner's rules in plain loops over the
scheduler's view (each request's pages by id, no rows, no buffers): its builds agree
by construction, a self-check that a correct runner holds every property (and what
the generic tests judge the guided statistics with), not a reference of values.

The step is the model runner's own preparation (``runs_in="runner"``), done before a
graph replays and allocating as it likes (a new engine for the fresh build): it is
not ``graph_safe``.
"""

from __future__ import annotations

import dataclasses
from enum import StrEnum

import numpy as np
from attnfuzz.harness.oracle import Check, Mismatch
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.harness.targets import persistent_batch
from attnfuzz.reference import persistent_batch as rows
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import (
    Batch,
    Case,
    CommonMetadata,
    DecodeSplit,
    EngineConfig,
    build_common_metadata,
    split_decodes_and_prefills,
)
from attnfuzz.reference.runner import StepPlan
from attnfuzz.reference.trace import Trace, as_trace


class OwnCheck(StrEnum):
    """runner-step's own checks: one per property of the step."""

    PADDING_INVARIANCE = "padding-invariance"  # a padded build's real rows are the eager's
    REPLAY_EQUALS_EAGER = "replay-equals-eager"  # so are a replay's
    HISTORY_INVARIANCE = "history-invariance"  # so are the step's on a new engine
    AGREEMENT = "agreement-across-backends"  # so are the step's on another backend
    SAFE_PADDING = "safe-padding"  # every value of every build, one its consumer accepts
    PADDING_WRITES = "padding-writes-no-real-kv"  # no padding token writes a real read slot
    PADDING_STATE = "padding-writes-no-real-state"  # no padding row names a real state slot
    MICROBATCH = "microbatch-agreement"  # a micro-batch's real rows are its cut of the eager's
    DUMMY_WRITES = "dummy-run-writes-nothing-live"  # no dummy row names a held KV or state slot
    WITHIN = "agreement-within-a-build"  # a field's real rows are those of the field it names
    OWN_KEY = "queries-read-their-own-keys"  # a query attends to the key it writes


_CHECKS = {
    "padding invariance": (OwnCheck.PADDING_INVARIANCE, "the eager build's real rows"),
    "replay equals eager": (OwnCheck.REPLAY_EQUALS_EAGER, "the eager build's real rows"),
    "history invariance": (OwnCheck.HISTORY_INVARIANCE, "the eager build's real rows"),
    "agreement across backends": (OwnCheck.AGREEMENT, "the eager build's real rows"),
    "safe padding": (OwnCheck.SAFE_PADDING, "values its consumer accepts"),
    "padding writes no real KV": (OwnCheck.PADDING_WRITES, "no real request's read slots"),
    "padding writes no real state": (OwnCheck.PADDING_STATE, "no real request's state slot"),
    "micro-batch agreement": (OwnCheck.MICROBATCH, "the eager build's rows of its tokens"),
    "a dummy run writes nothing live": (OwnCheck.DUMMY_WRITES, "no slot of a held request"),
    "agreement within a build": (OwnCheck.WITHIN, "the real rows of the field it names"),
    "queries read their own keys": (OwnCheck.OWN_KEY, "each slot among those its query reads"),
}


def compare(
    case: Case,
    inputs: ref.RunnerStepInputs,
    expected: ref.RunnerStepExpected,
    got: ref.RunnerStepOutputs,
) -> list[Mismatch]:
    if not isinstance(got, ref.RunnerStepOutputs):
        return [Mismatch(Check.TYPE, "outputs", "RunnerStepOutputs", type(got).__name__)]
    out = []
    eager = {b.draft for b in got.of("eager")}
    if None not in eager:
        made = ", ".join(b.name for b in got.builds) or "none"
        out.append(Mismatch(Check.TYPE, "builds", "an eager build", f"builds: {made}"))
    # A drafter's sub-step is compared with the eager build of the same sub-step.
    drafts = {b.draft for b in got.builds if b.how not in ref.NO_REAL_ROWS} - eager - {None}
    if drafts:
        want = "an eager build of each draft sub-step"
        out.append(Mismatch(Check.TYPE, "builds", want, f"none of {sorted(drafts)}"))
    first = {b.draft: b for b in reversed(tuple(got.of("eager")))}
    for b in got.builds:
        if b.how in (*ref.NO_REAL_ROWS, "microbatch"):  # a dummy step; a micro-batch's own sizes
            continue  # (no real rows; judged by micro-batch agreement)
        for size, what in (("num_reqs", "requests"), ("num_tokens", "tokens")):
            want, label = getattr(expected, size), f"the step's {what}"
            if b.draft is not None and size == "num_tokens":
                continue  # a draft sub-step's tokens are its own (judged as its eager's)
            if b.draft is not None and b.proposed_before:
                # The previous step's proposal holds that step's requests (unknown here):
                # each build of the sub-step holds as many as its eager build does.
                if first.get(b.draft) is None or first[b.draft] is b:
                    continue
                want, label = first[b.draft].num_reqs, f"{first[b.draft].name}'s requests"
            if (have := getattr(b, size)) != want:
                out.append(
                    Mismatch(Check.VALUES, f"{b.name}.{size}", f"{want} ({label})", str(have))
                )
    for v in ref.violations(got):
        check, wanted = _CHECKS[v.prop]
        where = v.build if v.field == "-" else f"{v.build}.{v.field}"
        out.append(Mismatch(check, where, wanted, v.detail))
    return out


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    """The step as the runner runs it: dispatched on its own (a scheduler output says
    nothing of forcing a step eager, and the runner is one data-parallel rank)."""
    batch = dataclasses.replace(
        case.batch, use_cudagraph=True, dp_peer_tokens=0, dp_peer_uniform=False
    )
    meta = build_common_metadata(case.config, batch)
    return meta, split_decodes_and_prefills(meta, case.config.threshold)


class ReferenceRunner:
    """The runner's rules in plain loops, as an implementation: each running request's
    pages by id, each build from them (its fresh build is the same loops again: it
    keeps nothing a new engine would not be given)."""

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        self.engine: tuple | None = None
        self.pages: dict[int, list[int]] = {}

    def _values(self, inp: ref.RunnerStepInputs) -> dict[str, np.ndarray]:
        config, bs = inp.config, inp.config.block_size
        table = np.full((inp.num_reqs, rows.table_width(config)), rows.PAD_PAGE, np.int32)
        qsl, seq_lens, slots, positions = [0], [], [], []
        steps = zip(inp.req_ids, inp.num_computed_tokens, inp.query_lens, strict=True)
        for r, (i, computed, q) in enumerate(steps):
            pages = self.pages[i]
            qsl.append(qsl[-1] + q)
            seq_lens.append(computed + q)
            table[r, : len(pages)] = pages
            for pos in range(computed, computed + q):
                slots.append(pages[pos // bs] * bs + pos % bs)
                positions.append(pos)
        return {
            "query_start_loc": np.array(qsl, np.int32),
            "seq_lens": np.array(seq_lens, np.int32),
            "block_table": table,
            "slot_mapping": np.array(slots, np.int64),
            "positions": np.array(positions, np.int64),
        }

    @staticmethod
    def _padded(values: dict[str, np.ndarray], plan: StepPlan) -> dict[str, np.ndarray]:
        """Padding requests: empty queries at ``T``, ``seq_len`` 0, the null page (FULL
        steps); padded tokens: slot -1, position 0."""
        R, T = plan.num_reqs, plan.num_tokens
        extra = plan.num_reqs_padded - R if plan.pad_attn else 0
        width = values["block_table"].shape[1]

        def grow(a: np.ndarray, n: int, pad: int) -> np.ndarray:
            return np.concatenate([a, np.full((n, *a.shape[1:]), pad, a.dtype)])

        return {
            "query_start_loc": grow(values["query_start_loc"], extra, T),
            "seq_lens": grow(values["seq_lens"], extra, 0),
            "block_table": grow(values["block_table"].reshape(R, width), extra, rows.PAD_PAGE),
            "slot_mapping": grow(values["slot_mapping"], plan.slot_mapping_tokens - T, -1),
            "positions": grow(values["positions"], plan.num_tokens_padded - T, 0),
        }

    def __call__(self, inp: ref.RunnerStepInputs) -> ref.RunnerStepOutputs:
        config, sizes = inp.config, (inp.num_reqs, inp.num_tokens)
        builds = []
        if self.engine != (config, inp.device):
            self.new_engine()
            self.engine = (config, inp.device)
            for _, q_lens in ref.capture_steps(config):
                builds.append(
                    ref.runner_build("capture", config, (0, 0), ref.dummy_values(config, q_lens))
                )
        staying = {i for i, new in zip(inp.req_ids, inp.is_new, strict=True) if not new}
        self.pages = {i: p for i, p in self.pages.items() if i in staying}
        for i, gained in zip(inp.req_ids, inp.new_block_ids, strict=True):
            self.pages[i] = self.pages.get(i, []) + list(gained)
        eager = self._values(inp)
        builds.append(ref.runner_build("eager", config, sizes, eager))
        plan = ref.runner_plan(inp)
        if plan.mode == "FULL":
            builds.append(ref.runner_build("replay", config, sizes, self._padded(eager, plan)))
        if plan.mode != "NONE":
            builds.append(ref.runner_build("padded", config, sizes, self._padded(eager, plan)))
        builds.append(ref.runner_build("fresh", config, sizes, self._values(inp)))
        return ref.RunnerStepOutputs(tuple(builds))


reference_impl = ReferenceRunner()

# -- the zoo's metadata of each mutant, over traces ----------------------------------------------
#
# Each takes a trace (a case is a trace of one step) and is exact: it computes from the
# steps alone whether the mutant's builds break its property.


def _plans(trace: Trace) -> list[tuple[ref.RunnerStepInputs, StepPlan]]:
    """Each step's scheduler output and how the runner runs it."""
    inputs = [ref.make_inputs(case) for case in trace.cases()]
    return [(inp, ref.runner_plan(inp)) for inp in inputs]


def reach_full_step(trace: Trace | Case) -> bool:
    """A step the runner replays as a FULL graph: it pads the attention metadata and
    prepares the graph's buffers."""
    return any(plan.mode == "FULL" for _, plan in _plans(as_trace(trace)))


def trigger_padded_tokens(trace: Trace | Case) -> bool:
    """A FULL step with padded tokens (``T_pad > T``): the last real offset moves."""
    plans = _plans(as_trace(trace))
    return any(p.mode == "FULL" and p.num_tokens_padded > p.num_tokens for _, p in plans)


def trigger_padding_requests(trace: Trace | Case) -> bool:
    """A FULL step with padding requests (``R_pad > R``): padding block-table rows."""
    plans = _plans(as_trace(trace))
    return any(p.mode == "FULL" and p.num_reqs_padded > p.num_reqs for _, p in plans)


def trigger_stale_replay_rows(trace: Trace | Case) -> bool:
    """Some FULL step has more requests than the graph's buffers were last prepared
    with (by the last replay, or the last capture run), and a row past those holds a
    length other than its request's: the graph's ``seq_lens`` followed in plain Python."""
    trace = as_trace(trace)
    seq_lens = [0] * trace.config.max_num_seqs
    prepared = 0
    for _, q_lens in ref.capture_steps(trace.config):
        dummy = ref.dummy_values(trace.config, q_lens)["seq_lens"]
        seq_lens[: len(dummy)] = dummy.tolist()
        prepared = len(dummy)
    for inp, plan in _plans(trace):
        if plan.mode != "FULL":
            continue
        real = [c + q for c, q in zip(inp.num_computed_tokens, inp.query_lens, strict=True)]
        R = len(real)
        copied = min(R, prepared)
        if seq_lens[copied:R] != real[copied:]:
            return True
        seq_lens[:R] = real
        seq_lens[R : plan.num_reqs_padded] = [0] * (plan.num_reqs_padded - R)
        prepared = R
    return False


def reach_later_arrival(trace: Trace | Case) -> bool:
    """A request new to the engine after its first step: it takes a row then."""
    return any(any(rows.new_to_engine(step)) for step in as_trace(trace).steps[1:])


def trigger_reused_row(trace: Trace | Case) -> bool:
    """A new request takes a row an earlier one held, and the row's old pages, kept
    before the new ones, differ from its own where its consumers read them (the first
    ``cdiv(seq_len, block_size)``); or the row overflows the table (the append raises).
    A new request the scheduler gave the very pages the old one held in front reads
    nothing wrong."""
    return persistent_batch.rows_seen(as_trace(trace), reset_page_count=False, read=True).wrong


def overflows_row(trace: Trace | Case) -> bool:
    """With a reused row's page count kept, some row overflows the table."""
    return persistent_batch.rows_seen(as_trace(trace), reset_page_count=False).overflow


def _step(
    computed: tuple[int, ...],
    q_lens: tuple[int, ...],
    req_ids: tuple[int, ...],
    pages: tuple[tuple[int, ...], ...],
) -> Batch:
    """A step whose requests are all new to the engine (they gain all their pages)."""
    new = tuple(len(p) for p in pages)
    return Batch(computed, q_lens, 0, True, req_ids=req_ids, pages=pages, new_pages=new)


def _spec_config(**overrides: object) -> EngineConfig:
    from attnfuzz.harness.testing import spec_config

    return spec_config(**overrides)


def smallest_padded_decode() -> Trace:
    """next_n = 1 (capture sizes 2, 4, ...): one request decodes one token, replayed in
    the decode graph of 2 tokens and 2 requests: a padded token and a padding request.
    One request of one token is the least a step holds, and any graph pads it."""
    return Trace(_spec_config(num_spec=0), (_step((0,), (1,), (0,), ((1,),)),))


def smallest_stale_replay_rows() -> Trace:
    """next_n = 1, capture sizes 1 and 2: the graphs are captured largest first, so the
    buffers were last prepared with 1 request; two decodes (seq_len 2 each) replay the
    graph of 2 and row 1 keeps the capture's length 1. A step needs more requests than
    the smallest graph holds (2), and a length the capture did not leave (past 1)."""
    config = _spec_config(num_spec=0, cudagraph_capture_sizes=(1, 2))
    return Trace(config, (_step((1, 1), (1, 1), (0, 1), ((1,), (2,))),))


def smallest_reused_row() -> Trace:
    """persistent-batch's: request 0 runs a token on page 1 in row 0 and finishes;
    request 1 arrives, takes row 0 and page 2, appended after page 1. A reused row
    needs two requests, one after the other: two steps."""
    return persistent_batch.smallest_row_reuse_page_count()


def build() -> Target:
    from attnfuzz.kernels import runner_step as k

    # Every implementation lives across steps (traced); padded steps are the conditions
    # of two mutants (padded tokens, padding requests), measured on the step itself.
    return Target(
        runs_in="runner",
        name="runner-step",
        summary="an engine runner's whole step (padding, graph dispatch, capture, replay, "
        "history), judged by properties with no hand-written expected value",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        checks=OwnCheck,
        describe=describe,
        guided=("padded_tokens", "padding_requests"),
        implementations=(
            Implementation(
                "triton",
                k.runner_step,
                Kind.FIXED,
                "persistent buffers, persistent-batch's and graph-input-padding's kernels",
                traced=True,
            ),
            Implementation(
                "reference", reference_impl, Kind.REFERENCE, "pages by id, plain loops", traced=True
            ),
            Implementation.mutant(
                "padded-count-offsets",
                k.mutant_padded_count_offsets,
                "query_start_loc padded from the last real entry with T_pad: the last "
                "request's query spans the padding tokens",
                reach=reach_full_step,
                trigger=trigger_padded_tokens,
                smallest=smallest_padded_decode,
                traced=True,
            ),
            Implementation.mutant(
                "stale-replay-rows",
                k.mutant_stale_replay_rows,
                "replay copies seq_lens for the previous step's request count: a real row "
                "keeps an earlier length",
                reach=reach_full_step,
                trigger=trigger_stale_replay_rows,
                smallest=smallest_stale_replay_rows,
                traced=True,
            ),
            Implementation.mutant(
                "reused-row-pages",
                k.mutant_reused_row_pages,
                "a reused row keeps its page count: the new request's pages and slots "
                "follow the old request's pages",
                reach=reach_later_arrival,
                trigger=trigger_reused_row,
                smallest=smallest_reused_row,
                traced=True,
            ),
            Implementation.mutant(
                "slot-id-as-padding-page",
                k.mutant_slot_id_as_padding_page,
                "padding block-table rows hold -1 (the null slot), not the null page",
                reach=reach_full_step,
                trigger=trigger_padding_requests,
                smallest=smallest_padded_decode,
                traced=True,
            ),
        ),
    )
