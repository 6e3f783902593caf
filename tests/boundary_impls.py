"""Implementations wrong only where the search used to look rarely, as a user's code
can be (issue 40): the fixed Triton path otherwise, so that the fault is the only
finding.

- ``boundary_impls:decode_len_cache``: keeps the decode length ``L`` of its first
  call per step shape (the real and padded request counts and the prefill chunks) and
  reuses it: wrong only after an earlier step of that very shape with another ``L``
  (a scheduler's steady state), right on any step run first in a new process.
- ``boundary_impls:last_page_slots`` (persistent-batch): a decode fast path that
  gives a request's single token a slot on the page its row last wrote to, unless
  the token starts a page: wrong only after rejected drafts that reached a later page
  were rolled back to inside an earlier one, and the request's next step is a single
  token.
- ``boundary_impls:real_rows_tile`` (max-seq-len): sizes its consumer's row tile by
  the real request count: wrong only where a graph pads a step past a tile boundary
  its real count is under.
"""

from __future__ import annotations

import dataclasses

from attnfuzz.kernels.max_seq_len import max_seq_len_metadata
from attnfuzz.kernels.persistent_batch import PersistentBatch
from attnfuzz.reference.max_seq_len import MaxSeqLenInputs, MaxSeqLenOutputs
from attnfuzz.reference.persistent_batch import PersistentBatchInputs, PersistentBatchOutputs

_DECODE_LEN: dict[tuple, int] = {}  # by step shape: the decode length of the first call


def decode_len_cache(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    got = max_seq_len_metadata(inputs)
    split = inputs.split
    if not split.num_decodes:
        return got
    common = inputs.common
    q_lens = (
        common.query_start_loc[1 : common.num_real_reqs + 1]
        - common.query_start_loc[: common.num_real_reqs]
    )
    prefills = tuple(int(q) for q in q_lens[split.num_decodes :])
    key = (common.num_real_reqs, common.num_reqs, prefills)
    length = split.max_decode_len
    cached = _DECODE_LEN.setdefault(key, length)
    if cached != length:
        out = got.out.clone()
        out[:, 0] += 1.0  # the cached length's metadata where this step's is needed
        return dataclasses.replace(got, out=out)
    return got


decode_len_cache.new_engine = _DECODE_LEN.clear  # type: ignore[attr-defined]


class LastPageSlots(PersistentBatch):
    """The fixed persistent batch, then the fast path: a running request's single token
    inside a page is written to the page its row's last token went to (no block-table
    read). Right while tokens only advance, or roll back within a page."""

    def new_engine(self) -> None:
        super().new_engine()
        self.last_page: dict[int, int] = {}  # row -> the page its last token was written to

    def __call__(self, inp: PersistentBatchInputs) -> PersistentBatchOutputs:
        out = super().__call__(inp)
        bs, start = inp.config.block_size, 0
        for r, rid in enumerate(inp.req_ids):
            row, q = self.rows[rid], inp.query_lens[r]
            last = inp.num_computed_tokens[r] + q - 1  # the position of its last token
            if q == 1 and not inp.is_new[r] and last % bs and row in self.last_page:
                out.slot_mapping[start] = self.last_page[row] * bs + last % bs
            self.last_page[row] = int(self.buffers["table"][row, last // bs])
            start += q
        return out


last_page_slots = LastPageSlots()


def _row_tile(rows: int) -> int:
    """A tile of rows as attnfuzz's kernels size one (``kernels._triton.block``)."""
    return max(16, 1 << max(rows - 1, 0).bit_length())


def real_rows_tile(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """Launches its consumer with one tile sized by the real request count, not the
    padded one: the rows of a graph's padding past that tile are never written (left
    as ``torch.empty`` leaves them; NaN here). Wrong only where a graph pads a step
    past a tile boundary its real count is under (16 or fewer requests padded to 17
    or more), right on every other step."""
    got = max_seq_len_metadata(inputs)
    tile = _row_tile(inputs.num_real_reqs)
    if got.out.shape[1] <= tile:
        return got
    out = got.out.clone()
    out[:, tile:] = float("nan")
    return dataclasses.replace(got, out=out)
