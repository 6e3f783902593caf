"""attnfuzz's own model runner step: persistent buffers, graph dispatch, capture runs, replay.

A runner keeps, for the life of its engine, buffers sized once by its config:

- the request rows and the step's buffers of
  :class:`~attnfuzz.kernels.persistent_batch.PersistentBatch` (each request's
  row, pages and computed tokens; the step's ``query_start_loc [S + 1]``,
  ``seq_lens [S]``, ``block_table [S, W]``, ``slot_mapping [N]``), and a
  ``positions [N]`` buffer beside them;
- the *graph's* buffers: the same five again, the static inputs a captured
  graph reads on every replay.

``S`` is ``max_num_seqs``, ``W`` the runner's block-table width
(:func:`~attnfuzz.reference.persistent_batch.table_width`), ``N`` the most
tokens a step or a graph holds. Each call is one scheduler output, and the
runner records every build of the step it makes
(:mod:`attnfuzz.reference.runner_step`), in order:

1. ``capture``: on an engine's first step, its capture runs first: one dummy
   step per FULL graph, largest first, written into the graph's buffers;
2. ``eager``: the rows updated and the step's fields written by
   persistent-batch's kernel (the step's block-table rows cleared to the null
   page first, so that a row's columns past its pages hold nothing an earlier
   step left), and the tokens' positions;
3. ``replay``: on a step the runner dispatches to a FULL graph
   (:func:`~attnfuzz.reference.runner_step.runner_plan`), the replay
   preparation: the step's real rows copied into the graph's buffers, then the
   padding rows written there, by graph-input-padding's kernel;
4. ``padded``: on a graph step, the step's own buffers padded in place to the
   graph's sizes (attention metadata on FULL steps only; the slot mapping and
   positions to the tokens the graph runs);
5. ``fresh``: the same step on a new engine that never saw an earlier step:
   every request new, with all its pages (the scheduler's view the runner keeps
   of each request, as vLLM's ``CachedRequestState.block_ids``).

Padding values: ``query_start_loc`` repeats the real token count, ``seq_lens``
0, block-table rows the null page, slots -1, positions 0. ``new_engine()``
drops everything kept across steps.

The mutants are this class with one step of the runner changed, each a defect
that exactly one property of the step catches: the padded count in a real
offset (:class:`PaddedCountOffsets`), a replay that copies the previous step's
row count (:class:`StaleReplayRows`), a reused row's page count kept
(:class:`ReusedRowPages`) and the slot id as a padding page
(:class:`SlotIdAsPaddingPage`).
"""

from __future__ import annotations

import dataclasses

import torch
from attnfuzz.kernels._triton import block
from attnfuzz.kernels.graph_input_padding import _fill_padded_kernel
from attnfuzz.kernels.persistent_batch import PersistentBatch, RowReusePageCount
from attnfuzz.reference.persistent_batch import PersistentBatchInputs, table_width
from attnfuzz.reference.runner import StepPlan
from attnfuzz.reference.runner_step import (
    FIELD_ROWS,
    PAD_PAGE,
    PAD_SLOT_ID,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    capture_steps,
    dummy_values,
    runner_build,
    runner_plan,
)

WHERE = "attnfuzz.kernels.runner_step.RunnerStep"


def token_capacity(config) -> int:  # noqa: ANN001 (an EngineConfig)
    """Tokens the token buffers hold: a step's most, or the largest graph's."""
    return max(config.max_num_batched_tokens, *config.cudagraph_capture_sizes, 1)


def fill(dst: torch.Tensor, src: torch.Tensor, raw_n: int, padded_n: int, pad: int) -> None:
    """graph-input-padding's kernel over flat memory: ``dst[:raw_n] = src[:raw_n]``, then
    ``pad`` up to ``padded_n`` (``src`` may be ``dst``: padding in place)."""
    if padded_n <= 0 or (dst.data_ptr() == src.data_ptr() and raw_n >= padded_n):
        return  # nothing to copy, nothing to pad
    _fill_padded_kernel[(1,)](
        dst, src, raw_n, padded_n, pad, WRITE_PAD=True, BLOCK=block(padded_n, cuda_cap=1024)
    )


class _GraphSized:
    """Request rows whose token buffers hold the largest graph too (padded in place)."""

    def _sizes(self, inp: PersistentBatchInputs) -> tuple[int, int]:
        return inp.config.max_num_seqs, token_capacity(inp.config)


class Rows(_GraphSized, PersistentBatch):
    """The runner's request rows: persistent-batch's, sized for the largest graph."""


class RunnerStep:
    """Fixed: one engine's runner; call it with each scheduler output in turn."""

    ROWS: type[PersistentBatch] = Rows  # the request rows' class
    PAD_BLOCK = PAD_PAGE  # what a padding row of the block table holds

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        """A new engine instance: drop every state kept across steps (buffers included)."""
        self._engine: tuple | None = None  # (config, device) the buffers were allocated for
        self.rows = self.ROWS()
        self.pages: dict[int, list[int]] = {}  # each running request's pages, by id
        self.positions = torch.zeros(0, dtype=torch.int64)
        self.graph: dict[str, torch.Tensor] = {}
        self.prepared = 0  # requests the graph's buffers were last prepared with

    # -- the engine's start -------------------------------------------------------------

    def _start(self, inp: RunnerStepInputs) -> bool:
        """Allocate the buffers on an engine's first step; True when this is one."""
        if self._engine == (inp.config, inp.device):
            return False
        self.new_engine()
        self._engine = (inp.config, inp.device)
        S, N, W = inp.config.max_num_seqs, token_capacity(inp.config), table_width(inp.config)

        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=inp.device)

        self.positions = zeros(N, dtype=torch.int64)
        self.graph = {
            "query_start_loc": zeros(S + 1),
            "seq_lens": zeros(S),
            "block_table": zeros(S, W),
            "slot_mapping": zeros(N, dtype=torch.int64),
            "positions": zeros(N, dtype=torch.int64),
        }
        return True

    def _capture(self, inp: RunnerStepInputs) -> list[StepBuild]:
        """The capture runs: each FULL graph's dummy step written into the graph's buffers."""
        builds = []
        for _, q_lens in capture_steps(inp.config):
            values = dummy_values(inp.config, q_lens)
            for name, array in values.items():
                self.graph[name][: len(array)] = torch.from_numpy(array).to(inp.device)
            self.prepared = len(q_lens)
            builds.append(runner_build("capture", inp.config, (0, 0), values, f"{WHERE}._capture"))
        return builds

    # -- the step's builds --------------------------------------------------------------

    def _eager(self, inp: RunnerStepInputs) -> StepBuild:
        """The step's rows and fields with no graph padding."""
        R, T, dev = inp.num_reqs, inp.num_tokens, inp.device
        # 1. The scheduler's view of each running request's pages.
        staying = {i for i, new in zip(inp.req_ids, inp.is_new, strict=True) if not new}
        self.pages = {i: p for i, p in self.pages.items() if i in staying}
        for i, gained in zip(inp.req_ids, inp.new_block_ids, strict=True):
            self.pages[i] = self.pages.get(i, []) + list(gained)
        # 2. The step's block-table rows cleared to the null page; then the rows updated
        #    and one program per request writes its length, pages and slots.
        if self.rows.buffers:
            self.rows.buffers["block_table"][:R] = PAD_PAGE
        step = self.rows(
            PersistentBatchInputs(
                config=inp.config,
                req_ids=inp.req_ids,
                is_new=inp.is_new,
                num_computed_tokens=inp.num_computed_tokens,
                query_lens=inp.query_lens,
                new_block_ids=inp.new_block_ids,
                num_reqs_padded=R,
                num_slot_tokens=T,
                device=dev,
            )
        )
        # 3. Each token's position: its request's computed tokens, then its place.
        q = torch.tensor(inp.query_lens, device=dev)
        first = torch.tensor(inp.num_computed_tokens, device=dev) - step.query_start_loc[:-1]
        self.positions[:T] = torch.repeat_interleave(first, q) + torch.arange(T, device=dev)
        values = {
            "query_start_loc": step.query_start_loc,
            "seq_lens": step.seq_lens,
            "block_table": step.block_table,
            "slot_mapping": step.slot_mapping,
            "positions": self.positions[:T],
        }
        return self._build("eager", inp, values, "_eager")

    def _replay(self, inp: RunnerStepInputs, plan: StepPlan) -> StepBuild:
        """The replay preparation: the step's real rows into the graph's buffers, then
        padding rows there up to the graph's sizes."""
        R, T = inp.num_reqs, inp.num_tokens
        R_pad, T_pad = plan.num_reqs_padded, plan.num_tokens_padded
        b, g = self.rows.buffers, self.graph
        W = g["block_table"].shape[1]
        fill(g["query_start_loc"], b["query_start_loc"], R + 1, R_pad + 1, T)
        copied = self._replay_rows(R)
        fill(g["seq_lens"], b["seq_lens"], copied, copied, 0)
        fill(g["seq_lens"][R:], g["seq_lens"][R:], 0, R_pad - R, 0)
        fill(g["block_table"], b["block_table"], R * W, R_pad * W, self.PAD_BLOCK)
        fill(g["slot_mapping"], b["slot_mapping"], T, T_pad, PAD_SLOT_ID)
        fill(g["positions"], self.positions, T, T_pad, 0)
        self.prepared = R
        views = {name: g[name][: self._rows_of(name, R_pad, T_pad)] for name in FIELD_ROWS}
        return self._build("replay", inp, views, "_replay")

    def _pad(self, inp: RunnerStepInputs, plan: StepPlan) -> StepBuild:
        """The step's own buffers padded in place to the graph's sizes."""
        R, T = inp.num_reqs, inp.num_tokens
        R_pad, T_pad, T_slots = (
            plan.num_reqs_padded,
            plan.num_tokens_padded,
            plan.slot_mapping_tokens,
        )
        b = self.rows.buffers
        if plan.pad_attn:  # attention metadata at the graph's sizes: FULL steps only
            W = b["block_table"].shape[1]
            self._pad_offsets(b["query_start_loc"], R, R_pad, T, T_pad)
            fill(b["seq_lens"], b["seq_lens"], R, R_pad, 0)
            fill(b["block_table"], b["block_table"], R * W, R_pad * W, self.PAD_BLOCK)
        fill(b["slot_mapping"], b["slot_mapping"], T, T_slots, PAD_SLOT_ID)
        fill(self.positions, self.positions, T, T_pad, 0)
        values = {
            "query_start_loc": b["query_start_loc"][: R_pad + 1],
            "seq_lens": b["seq_lens"][:R_pad],
            "block_table": b["block_table"][:R_pad],
            "slot_mapping": b["slot_mapping"][:T_slots],
            "positions": self.positions[:T_pad],
        }
        return self._build("padded", inp, values, "_pad")

    def _fresh(self, inp: RunnerStepInputs) -> StepBuild:
        """The step on a new engine: every request new, with all its pages (its capture
        runs left out: they write only the graph's buffers, which no eager step reads)."""
        engine = type(self)()
        engine._start(inp)
        every_page = tuple(tuple(self.pages[i]) for i in inp.req_ids)
        new = dataclasses.replace(inp, is_new=(True,) * inp.num_reqs, new_block_ids=every_page)
        return dataclasses.replace(engine._eager(new), how="fresh")

    def __call__(self, inp: RunnerStepInputs) -> RunnerStepOutputs:
        builds = self._capture(inp) if self._start(inp) else []
        builds.append(self._eager(inp))
        plan = runner_plan(inp)
        if plan.mode == "FULL":
            builds.append(self._replay(inp, plan))
        if plan.mode != "NONE":
            builds.append(self._pad(inp, plan))
        builds.append(self._fresh(inp))
        return RunnerStepOutputs(tuple(builds))

    # -- what the mutants change ----------------------------------------------------------

    def _pad_offsets(self, qsl: torch.Tensor, R: int, R_pad: int, T: int, T_pad: int) -> None:
        """Padding requests start and end at the real token count: empty queries."""
        fill(qsl, qsl, R + 1, R_pad + 1, T)

    def _replay_rows(self, R: int) -> int:
        """Requests whose rows the replay preparation copies: all the step's."""
        return R

    # -- helpers ------------------------------------------------------------------------

    @staticmethod
    def _rows_of(name: str, R: int, T: int) -> int:
        return {"offsets": R + 1, "requests": R, "tokens": T}[FIELD_ROWS[name]]

    def _build(self, how: str, inp: RunnerStepInputs, values: dict, where: str) -> StepBuild:
        host = {name: t.cpu().numpy() for name, t in values.items()}
        return runner_build(
            how, inp.config, (inp.num_reqs, inp.num_tokens), host, f"{WHERE}.{where}"
        )


class PaddedCountOffsets(RunnerStep):
    """The padding of ``query_start_loc`` starts at the last real entry and writes the
    padded token count: the last real request's query ends at ``T_pad`` and spans the
    padding tokens (a real row computed from the padded count)."""

    def _pad_offsets(self, qsl: torch.Tensor, R: int, R_pad: int, T: int, T_pad: int) -> None:
        fill(qsl, qsl, R, R_pad + 1, T_pad)


class StaleReplayRows(RunnerStep):
    """The replay preparation copies ``seq_lens`` for as many requests as the graph's
    buffers were last prepared with: a step of more requests replays with the lengths
    an earlier step (or capture run) left in its last rows."""

    def _replay_rows(self, R: int) -> int:
        return min(R, self.prepared)


class _ReusedRows(_GraphSized, RowReusePageCount):
    """persistent-batch's row-reuse-page-count rows: a new request's row keeps its count."""


class ReusedRowPages(RunnerStep):
    """A row a finished request freed keeps its page count: the next request's pages
    are appended after the old ones, its block-table row shows them, and its slots are
    read from them (its keys and values land in the old request's pages)."""

    ROWS = _ReusedRows


class SlotIdAsPaddingPage(RunnerStep):
    """Padding rows of the block table written with the slot mapping's null id (-1), not
    the null page: a kernel that reads a padding row's first page reads page -1."""

    PAD_BLOCK = PAD_SLOT_ID


runner_step = RunnerStep()
mutant_padded_count_offsets = PaddedCountOffsets()
mutant_stale_replay_rows = StaleReplayRows()
mutant_reused_row_pages = ReusedRowPages()
mutant_slot_id_as_padding_page = SlotIdAsPaddingPage()
