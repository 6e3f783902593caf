"""Per-token context lengths of native MTP, written by a Triton kernel into the workspace.

``mtp_context_lens`` is the accepted fix of upstream #42135: the first
``B * L`` elements of one flat int32 table, viewed as ``[B, L]``. The mutants
re-create the bug, its first fix and a missing clamp; each differs from the
fixed path in the one place the bug lived.
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
    if CLAMP:  # padding requests (seq_len 0) would see a negative number of keys
        ctx = tl.maximum(ctx, 0)
    tl.store(out_ptr + b * out_row_stride + j, ctx.to(tl.int32), mask=mask)


def write_context_lens(seq_lens: torch.Tensor, out: torch.Tensor, clamp: bool = True) -> None:
    """Fill the int32 ``[B, L]`` view ``out`` (any row stride, unit column stride).

    ``seq_lens`` holds at least ``B`` int32 lengths, contiguous; one program
    covers the whole table under the interpreter, tiles of 256 slots when
    compiled. Too few lengths are refused (the kernel would read past them),
    from shapes alone: no host sync in this graph-safe path.
    """
    B, L = out.shape
    if B * L == 0:
        return
    if out.dtype != torch.int32 or (L > 1 and out.stride(1) != 1):
        raise ValueError(f"out: int32 with unit column stride, got {out.dtype} {out.stride()}")
    if seq_lens.dim() != 1 or seq_lens.shape[0] < B or (B > 1 and seq_lens.stride(0) != 1):
        raise ValueError(
            f"seq_lens: {B} contiguous lengths for a [{B}, {L}] table, got shape "
            f"{list(seq_lens.shape)} stride {list(seq_lens.stride())}"
        )
    tile = block(B * L, cuda_cap=256)
    grid = (triton.cdiv(B * L, tile),)
    _context_lens_kernel[grid](seq_lens, out, B, L, out.stride(0), CLAMP=clamp, BLOCK=tile)


def _flat_view(inp: MtpSeqLensInputs) -> torch.Tensor:
    B, L = inp.num_decodes, inp.max_decode_len
    return inp.flat_table[: B * L].view(B, L)


def mtp_context_lens(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """Fixed: the first ``B * L`` elements of the flat table, viewed as ``[B, L]``."""
    out = _flat_view(inp)
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out)


def mutant_strided(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """#42135: the ``[max_num_seqs, next_n]`` table sliced ``[:B, :L]``, strided when
    ``B >= 2`` and ``L < next_n``; the logits kernel refuses it."""
    out = inp.table_2d[: inp.num_decodes, : inp.max_decode_len]
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out)


def mutant_copy(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """#42135's first fix: ``.contiguous()`` of that slice: right values, but a
    copy allocated per step, which a captured graph cannot replay."""
    out = inp.table_2d[: inp.num_decodes, : inp.max_decode_len]
    write_context_lens(inp.seq_lens, out)
    return MtpSeqLensOutputs(out.contiguous())


def mutant_noclamp(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """No clamp at 0: the slots of padding requests get negative lengths."""
    out = _flat_view(inp)
    write_context_lens(inp.seq_lens, out, clamp=False)
    return MtpSeqLensOutputs(out)
