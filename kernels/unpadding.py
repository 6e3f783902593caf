"""CUDA-graph padding of the common metadata into persistent buffers, and unpadding, as torch glue.

``pad_and_unpad`` writes the step into the persistent buffers the way the
model runner does (``docs/domain.md``, section 4), hands on views of the
graph's sizes, and unpads them by slicing, as
``CommonAttentionMetadata.unpadded`` does. The mutants each leave out or
change one of these steps.
"""

from __future__ import annotations

import torch
from attnfuzz.reference.batch import PAD_PAGE
from attnfuzz.reference.unpadding import StepMetadata, UnpaddingInputs, UnpaddingOutputs


def _pad(
    inp: UnpaddingInputs,
    *,
    pad_query_start_loc: bool = True,
    pad_seq_lens: bool = True,
    pad_table_rows: bool = True,
    pad_slots: bool = True,
) -> StepMetadata:
    R, T, R_pad, T_pad = inp.num_reqs, inp.num_tokens, inp.num_reqs_padded, inp.num_tokens_padded
    dev = inp.seq_lens_buffer.device
    q = torch.as_tensor(inp.query_lens, dtype=torch.int32, device=dev)
    computed = torch.as_tensor(inp.num_computed_tokens, dtype=torch.int32, device=dev)
    qsl, seq, table, slots = (
        inp.query_start_loc_buffer,
        inp.seq_lens_buffer,
        inp.block_table_buffer,
        inp.slot_mapping_buffer,
    )
    qsl[0] = 0
    qsl[1 : R + 1] = torch.cumsum(q, 0)
    if pad_query_start_loc:  # zero-length padding requests: non-decreasing
        qsl[R + 1 : R_pad + 1] = T
    seq[:R] = computed + q
    if pad_seq_lens:
        seq[R:R_pad] = 0
    for r in range(R):  # each request's own pages; the rest of a reused row stays as it was
        n = int(inp.num_pages[r])
        table[r, :n] = torch.as_tensor(inp.block_table[r, :n], device=dev)
    if pad_table_rows:
        table[R:R_pad] = PAD_PAGE
    req = torch.repeat_interleave(torch.arange(R, device=dev), q.long())
    pos = torch.arange(T, device=dev) - qsl[req].long() + computed[req].long()
    bs = inp.block_size
    slots[:T] = table[req, pos // bs].long() * bs + pos % bs
    if pad_slots:
        slots[T:T_pad] = -1
    return StepMetadata(
        qsl[: R_pad + 1], seq[:R_pad], table[:R_pad], slots[:T_pad], R_pad, T_pad, int(q.max())
    )


def _unpad(
    padded: StepMetadata, T: int, R: int, *, slice_table: bool = True, copy: bool = False
) -> StepMetadata:
    out = StepMetadata(
        padded.query_start_loc[: R + 1],
        padded.seq_lens[:R],
        padded.block_table[:R] if slice_table else padded.block_table,
        padded.slot_mapping[:T],
        R,
        T,
        padded.max_query_len,
    )
    if copy:
        for name in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
            setattr(out, name, getattr(out, name).clone())
    return out


def _buffers(inp: UnpaddingInputs) -> dict[str, torch.Tensor]:
    return {
        "query_start_loc": inp.query_start_loc_buffer,
        "seq_lens": inp.seq_lens_buffer,
        "block_table": inp.block_table_buffer,
        "slot_mapping": inp.slot_mapping_buffer,
    }


def _run(inp: UnpaddingInputs, unpad: dict | None = None, **pad: bool) -> UnpaddingOutputs:
    padded = _pad(inp, **pad)
    unpadded = _unpad(padded, inp.num_tokens, inp.num_reqs, **(unpad or {}))
    return UnpaddingOutputs(padded, unpadded, _buffers(inp))


def pad_and_unpad(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """Fixed: pad in the persistent buffers, unpad by slicing (views)."""
    return _run(inp)


def mutant_stale_slots(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """Padded tokens ``T .. T_pad`` keep the slots of an earlier step: the graph writes
    their keys into pages other requests own."""
    return _run(inp, pad_slots=False)


def mutant_stale_table_rows(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """Padding requests keep a reused row's stale page ids instead of the null page."""
    return _run(inp, pad_table_rows=False)


def mutant_stale_seq_lens(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """Padding requests keep an earlier step's lengths instead of 0."""
    return _run(inp, pad_seq_lens=False)


def mutant_stale_query_start_loc(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """``query_start_loc`` past the real requests keeps stale offsets (not non-decreasing)."""
    return _run(inp, pad_query_start_loc=False)


def mutant_unpadded_table(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """Unpadding forgets the block table: ``R`` requests with ``R_pad`` table rows (the
    shape of #43982's drafter bug)."""
    return _run(inp, unpad={"slice_table": False})


def mutant_unpadded_copy(inp: UnpaddingInputs) -> UnpaddingOutputs:
    """Unpadding copies: right values, but allocations every step and writes through
    the unpadded metadata no longer reach the persistent buffers."""
    return _run(inp, unpad={"copy": True})
