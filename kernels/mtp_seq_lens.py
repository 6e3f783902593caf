"""Per-token context lengths of native MTP, written by a Triton kernel into the workspace.

``mtp_context_lens`` is the accepted fix of upstream #42135 (one flat int32
table viewed as ``[B, L]``). The mutants re-create the bug, its first fix and
a missing clamp; each differs from the fixed path where the bug lived.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.mtp_seq_lens import MtpSeqLensInputs, MtpSeqLensOutputs


@triton.jit
def _context_lens_kernel(
    seq_lens_ptr, out_ptr, num_rows, L, out_row_stride,
    CLAMP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    # Element (b, j) of the [B, L] table, right-aligned on the sequence end.
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < num_rows * L
    b, j = idx // L, idx % L
    seq_len = tl.load(seq_lens_ptr + b, mask=mask, other=0)
    ctx = seq_len - L + 1 + j
    if CLAMP:  # padding requests have seq_len 0, short sequences fewer than L keys
        ctx = tl.maximum(ctx, 0)
    tl.store(out_ptr + b * out_row_stride + j, ctx.to(tl.int32), mask=mask)


def write_context_lens(seq_lens: torch.Tensor, out: torch.Tensor, clamp: bool = True) -> None:
    """Fill the ``[B, L]`` view ``out`` (any row stride, unit column stride)."""
    B, L = out.shape
    if B * L == 0:
        return
    assert out.stride(1) == 1 and out.dtype == torch.int32
    tile = block(B * L, cuda_cap=256)
    grid = (triton.cdiv(B * L, tile),)
    _context_lens_kernel[grid](seq_lens, out, B, L, out.stride(0), CLAMP=clamp, BLOCK=tile)


def _flat_view(inp: MtpSeqLensInputs, capacity: int) -> torch.Tensor:
    B, L = inp.num_decodes, inp.max_decode_len
    return inp.workspace[:capacity][: B * L].view(B, L)


def _table_2d(inp: MtpSeqLensInputs) -> torch.Tensor:
    """The ``[max_num_seqs, next_n]`` table the bug kept, also preallocated."""
    start = inp.flat_capacity
    size = inp.max_num_seqs * inp.next_n
    return inp.workspace[start : start + size].view(inp.max_num_seqs, inp.next_n)


def mtp_context_lens(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """Fixed: the first ``B * L`` elements of one flat table, viewed as ``[B, L]``."""
    out = _flat_view(inp, inp.flat_capacity)
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out)


def mutant_strided(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """#42135: a 2-D ``[max_num_seqs, next_n]`` table sliced ``[:B, :L]`` (strided)."""
    out = _table_2d(inp)[: inp.num_decodes, : inp.max_decode_len]
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out)


def mutant_copy(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """#42135's first fix: ``.contiguous()`` per step: right values, allocates."""
    out = _table_2d(inp)[: inp.num_decodes, : inp.max_decode_len]
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out.contiguous())


def mutant_noclamp(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """No clamp at 0: padding requests (and short sequences) get negative lengths."""
    out = _flat_view(inp, inp.flat_capacity)
    write_context_lens(inp.seq_lens, out, clamp=False)
    return MtpSeqLensOutputs(out)


def mutant_flat_capacity(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """The flat table sized ``max_num_batched_tokens``: too small when ``B * L`` exceeds it."""
    out = _flat_view(inp, inp.max_num_batched_tokens)
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out)
