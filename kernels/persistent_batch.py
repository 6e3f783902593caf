"""The model runner's persistent batch: request rows kept across steps, and one Triton kernel.

:class:`PersistentBatch` is one engine's persistent request state (vLLM V1's
``InputBatch`` and ``BlockTable``, Model Runner V2's ``RequestState`` and
``BlockTables``): buffers allocated once at the engine's limits, a request's
row for its life, its pages appended to the row as the scheduler hands them
on, its computed tokens taken from the scheduler each step. Each step the
host updates the rows, then one kernel (a program per request) writes the
request's length, its block-table row and its tokens' slots into the step's
buffers, and the host writes the padding. ``new_engine()`` drops everything
kept across steps.

The mutants are the same class with one step of an engine's life changed
(:class:`WorkspaceFirstStep`, :class:`StalePaddingRows`,
:class:`RowReusePageCount`, :class:`DraftRollback`): each bug needs an earlier
step, so on a step of a new engine each mutant computes what the fixed class
does.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.persistent_batch import (
    PAD_PAGE,
    PAD_SLOT_ID,
    PersistentBatchInputs,
    PersistentBatchOutputs,
    table_width,
)


@triton.jit
def _step_kernel(
    idx_mapping_ptr, query_start_loc_ptr, num_computed_ptr, num_pages_ptr,
    table_ptr, table_stride, width,
    seq_lens_ptr, step_table_ptr, step_table_stride, slot_mapping_ptr,
    PAGE: tl.constexpr, PAGES_BLOCK: tl.constexpr, TOKENS_BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)  # the request's place in the batch
    row = tl.load(idx_mapping_ptr + r).to(tl.int64)  # its row of the persistent state
    start = tl.load(query_start_loc_ptr + r)
    end = tl.load(query_start_loc_ptr + r + 1)
    computed = tl.load(num_computed_ptr + row)

    # 1. Its length: the tokens computed before and those of this step.
    tl.store(seq_lens_ptr + r, computed + end - start)

    # 2. Its pages: the row's first num_pages entries, into row r of the step's table.
    num_pages = tl.minimum(tl.load(num_pages_ptr + row), width)
    for i in range(0, num_pages, PAGES_BLOCK):
        offs = i + tl.arange(0, PAGES_BLOCK)
        mask = offs < num_pages
        pages = tl.load(table_ptr + row * table_stride + offs, mask=mask)
        tl.store(step_table_ptr + r * step_table_stride + offs, pages, mask=mask)

    # 3. Its tokens' slots: token j sits at position computed + j.
    for i in range(start, end, TOKENS_BLOCK):
        offs = i + tl.arange(0, TOKENS_BLOCK)
        mask = offs < end
        pos = (computed + offs - start).to(tl.int64)
        idx = pos // PAGE
        page = tl.load(table_ptr + row * table_stride + idx, mask=mask & (idx < width), other=0).to(
            tl.int64
        )
        tl.store(slot_mapping_ptr + offs, page * PAGE + pos % PAGE, mask=mask)


class PersistentBatch:
    """Fixed: one engine's persistent request state; call it with each step in turn."""

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        """A new engine instance: drop every state kept across steps (buffers included)."""
        self._engine: tuple | None = None  # (config, device) the buffers were allocated for
        self.rows: dict[int, int] = {}  # req_id -> its row
        self.free_rows: list[int] = []
        self.num_pages: list[int] = []  # per row: pages in the row's block table
        self.num_computed: list[int] = []  # per row
        self.last_query_len: list[int] = []  # per row: tokens of its last step
        self.buffers: dict[str, torch.Tensor] = {}

    # -- one engine's buffers -----------------------------------------------------------

    def _sizes(self, inp: PersistentBatchInputs) -> tuple[int, int]:
        """Rows and tokens the buffers hold: the engine's limits."""
        return inp.config.max_num_seqs, inp.config.max_num_batched_tokens

    def _start(self, inp: PersistentBatchInputs) -> None:
        """Allocate the buffers on an engine's first step (another config is another engine)."""
        if self._engine == (inp.config, inp.device):
            return
        self.new_engine()
        self._engine = (inp.config, inp.device)
        rows, tokens = self._sizes(inp)
        width, dev = table_width(inp.config), inp.device

        def zeros(*shape: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=dev)

        self.buffers = {
            # the requests' state, by row
            "table": zeros(rows, width),
            "num_pages": zeros(rows),
            "num_computed": zeros(rows),
            # the step's, by request: what attention reads
            "idx_mapping": zeros(rows),
            "query_start_loc": zeros(rows + 1),
            "seq_lens": zeros(rows),
            "block_table": zeros(rows, width),
            "slot_mapping": zeros(tokens, dtype=torch.int64),
        }
        self.free_rows = list(range(rows))
        self.num_pages = [0] * rows
        self.num_computed = [0] * rows
        self.last_query_len = [0] * rows

    def _check_room(self, inp: PersistentBatchInputs) -> None:
        """The step fits in the buffers (never launch a kernel past them)."""
        rows = self.buffers["seq_lens"].shape[0]
        tokens = self.buffers["slot_mapping"].shape[0]
        if inp.num_reqs_padded > rows or inp.num_slot_tokens > tokens:
            raise RuntimeError(
                f"a step of {inp.num_reqs_padded} requests and {inp.num_slot_tokens} slots "
                f"does not fit buffers of {rows} rows and {tokens} tokens"
            )

    # -- a request's row --------------------------------------------------------------------

    def _add_row(self, row: int) -> None:
        """A new request takes ``row``: it holds no page yet."""
        self.num_pages[row] = 0

    def _append_row(self, row: int, pages: tuple[int, ...]) -> None:
        """The pages a request gained, after those its row holds."""
        start, width = self.num_pages[row], self.buffers["table"].shape[1]
        if start + len(pages) > width:
            raise RuntimeError(f"row {row}: {start} + {len(pages)} pages past the table's {width}")
        if pages:
            new = torch.tensor(pages, dtype=torch.int32)
            self.buffers["table"][row, start : start + len(pages)] = new.to(self._engine[1])
        self.num_pages[row] = start + len(pages)

    def _set_num_computed(self, row: int, new: bool, computed: int, query_len: int) -> None:
        """The scheduler's count, rejected drafts of the last step rolled back."""
        self.num_computed[row] = computed
        self.last_query_len[row] = query_len

    def _pad(self, R: int, R_pad: int, T: int) -> None:
        """Padding requests: ``seq_len`` 0, ``query_start_loc`` T, the null page; padded
        tokens (to the end of the buffer): slot -1."""
        self.buffers["seq_lens"][R:R_pad] = 0
        self.buffers["query_start_loc"][R + 1 : R_pad + 1] = T
        self.buffers["block_table"][R:R_pad] = PAD_PAGE
        self.buffers["slot_mapping"][T:] = PAD_SLOT_ID

    # -- a step -----------------------------------------------------------------------------

    def __call__(self, inp: PersistentBatchInputs) -> PersistentBatchOutputs:
        self._start(inp)
        self._check_room(inp)
        R, T, R_pad = inp.num_reqs, inp.num_tokens, inp.num_reqs_padded
        # 1. Requests that left (absent from the step), or came back new: their rows are free.
        staying = {rid for rid, new in zip(inp.req_ids, inp.is_new, strict=True) if not new}
        for rid in [rid for rid in self.rows if rid not in staying]:
            self.free_rows.append(self.rows.pop(rid))
        # 2. A new request takes the lowest free row; the row's pages are reset.
        rows = []
        for rid, new in zip(inp.req_ids, inp.is_new, strict=True):
            if new:
                row = min(self.free_rows)
                self.free_rows.remove(row)
                self.rows[rid] = row
                self._add_row(row)
            rows.append(self.rows[rid])
        # 3. Each request's new pages, appended to its row; its computed tokens.
        for r, row in enumerate(rows):
            self._append_row(row, inp.new_block_ids[r])
            self._set_num_computed(
                row, inp.is_new[r], inp.num_computed_tokens[r], inp.query_lens[r]
            )
        # 4. The state to the device, then one program per request.
        b, dev = self.buffers, inp.device
        b["num_pages"].copy_(torch.tensor(self.num_pages, dtype=torch.int32))
        b["num_computed"].copy_(torch.tensor(self.num_computed, dtype=torch.int32))
        b["idx_mapping"][:R] = torch.tensor(rows, dtype=torch.int32).to(dev)
        q = torch.tensor(inp.query_lens, dtype=torch.int32)
        b["query_start_loc"][0] = 0
        b["query_start_loc"][1 : R + 1] = torch.cumsum(q, 0).to(torch.int32).to(dev)
        table, step_table = b["table"], b["block_table"]
        _step_kernel[(R,)](
            b["idx_mapping"], b["query_start_loc"], b["num_computed"], b["num_pages"],
            table, table.stride(0), table.shape[1],
            b["seq_lens"], step_table, step_table.stride(0), b["slot_mapping"],
            PAGE=inp.config.block_size, PAGES_BLOCK=block(table.shape[1]),
            TOKENS_BLOCK=block(max(inp.query_lens), cuda_cap=1024),
        )  # fmt: skip
        # 5. Padding, then views at the start of the buffers.
        self._pad(R, R_pad, T)
        return PersistentBatchOutputs(
            query_start_loc=b["query_start_loc"][: R_pad + 1],
            seq_lens=b["seq_lens"][:R_pad],
            block_table=step_table[:R_pad],
            slot_mapping=b["slot_mapping"][: inp.num_slot_tokens],
            buffers={
                name: b[name]
                for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
            },
        )


class WorkspaceFirstStep(PersistentBatch):
    """Buffers sized by the engine's first step (its padded requests and slots), not
    by the engine's limits, and kept: a later, larger step does not fit."""

    def _sizes(self, inp: PersistentBatchInputs) -> tuple[int, int]:
        return inp.num_reqs_padded, inp.num_slot_tokens


class StalePaddingRows(PersistentBatch):
    """Padding rows' ``seq_lens`` are not written: a smaller padded step hands on the
    lengths an earlier, larger step left in rows ``R .. R_pad``."""

    def _pad(self, R: int, R_pad: int, T: int) -> None:
        self.buffers["query_start_loc"][R + 1 : R_pad + 1] = T
        self.buffers["block_table"][R:R_pad] = PAD_PAGE
        self.buffers["slot_mapping"][T:] = PAD_SLOT_ID


class RowReusePageCount(PersistentBatch):
    """A new request's row keeps its page count: its pages are appended after those
    of the row's previous occupant."""

    def _add_row(self, row: int) -> None:
        pass


class DraftRollback(PersistentBatch):
    """A running request's computed tokens advance by its last step's tokens (every
    draft taken as accepted), not taken from the scheduler: rejected drafts are
    never rolled back."""

    def _set_num_computed(self, row: int, new: bool, computed: int, query_len: int) -> None:
        if new:
            self.num_computed[row] = computed
        else:
            self.num_computed[row] += self.last_query_len[row]
        self.last_query_len[row] = query_len


persistent_batch = PersistentBatch()
mutant_workspace_first_step = WorkspaceFirstStep()
mutant_stale_padding_rows = StalePaddingRows()
mutant_row_reuse_page_count = RowReusePageCount()
mutant_draft_rollback = DraftRollback()
