"""A decode graph's input buffers filled by a Triton kernel: the step's rows, then padding.

One launch per device buffer writes its first ``padded_n`` rows: the step's
values below ``raw_n``, the field's padding value from there (or nothing,
where the padded rows are not part of the contract). The host mirror of
``seq_lens`` is written on the host. The mutants leave one field's padded
rows as an earlier step left them.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.graph_input_padding import (
    HOST_FIELDS,
    REQUEST_FIELDS,
    GraphInputPaddingInputs,
    GraphInputPaddingOutputs,
    pad_value,
)


@triton.jit
def _fill_padded_kernel(
    dst_ptr, src_ptr, raw_n, padded_n, pad, WRITE_PAD: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    for i in range(0, padded_n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        real = offs < raw_n
        values = tl.load(src_ptr + offs, mask=real, other=0)
        if WRITE_PAD:
            values = tl.where(real, values, pad)
            tl.store(dst_ptr + offs, values, mask=offs < padded_n)
        else:
            tl.store(dst_ptr + offs, values, mask=real)


def fill_buffers(
    inp: GraphInputPaddingInputs, *, stale: tuple[str, ...] = ()
) -> GraphInputPaddingOutputs:
    """Fill every buffer for the step; the fields in ``stale`` keep their padded rows."""
    graph: dict[str, torch.Tensor] = {}
    for name, src in inp.step.items():
        buf = inp.buffers[name]
        if buf.dtype != torch.int64 or buf.dim() != 1 or buf.stride(0) != 1:
            raise ValueError(f"{name} buffer: contiguous int64 [N], got {buf.dtype} {buf.stride()}")
        raw_n = src.shape[0]
        padded_n = inp.bs if name in REQUEST_FIELDS else inp.num_tokens
        pad = pad_value(name, inp.seq_len_fill_value)
        write_pad = pad is not None and name not in stale
        if name in HOST_FIELDS:  # the host mirror: written where it lives
            buf[:raw_n].copy_(src)
            if write_pad:
                buf[raw_n:padded_n].fill_(pad)
        else:
            _fill_padded_kernel[(1,)](
                buf, src.contiguous(), raw_n, padded_n, 0 if pad is None else pad,
                WRITE_PAD=write_pad, BLOCK=block(padded_n, cuda_cap=1024),
            )  # fmt: skip
        graph[name] = buf[:padded_n]
    padding = inp.bs - inp.raw_bs
    return GraphInputPaddingOutputs(
        graph=graph,
        buffers=inp.buffers,
        batch_size=inp.bs,
        num_padding=padding,
        seq_lens_sum=inp.seq_lens_sum + padding * inp.seq_len_fill_value,
    )


def graph_input_padding(inp: GraphInputPaddingInputs) -> GraphInputPaddingOutputs:
    """Fixed: every field's padded rows written with its padding value."""
    return fill_buffers(inp)


def mutant_stale_swa_slots(inp: GraphInputPaddingInputs) -> GraphInputPaddingOutputs:
    """#24743's defect: on a padded step the sliding-window slots of the padded tokens are
    left as an earlier step wrote them; the graph writes their keys into live slots."""
    return fill_buffers(inp, stale=("out_cache_loc_swa",))


def mutant_stale_positions(inp: GraphInputPaddingInputs) -> GraphInputPaddingOutputs:
    """Positions of padded tokens left stale (before the runner zeroed them): a backend
    planning over the padded positions reads out of range."""
    return fill_buffers(inp, stale=("positions",))
