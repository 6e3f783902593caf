"""The extend-attention indices of a speculative step, written by one Triton kernel.

One program per request the kernel runs (real, then a graph's padding ones):
it sums the KV lengths before it for its offsets, writes its entries of the
three index pointers and copies its row of the request-to-token table into
``kv_indices``. The host side pads a replayed step as the runner does
(requests of ``seq_len`` 1 on the reserved row 0) and, replayed, writes into
buffers sized for the largest captured graph. The mutant differs in one
constant: the query stride of a replayed draft extend.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import add, block, tl, triton
from attnfuzz.reference.spec_indptr import (
    PAD_ROW,
    SEQ_LEN_FILL,
    TARGET_VERIFY,
    SpecIndptrInputs,
    SpecIndptrOutputs,
)


@triton.jit
def _spec_indptr_kernel(
    rows_ptr, kv_lens_ptr, table_ptr, table_stride, qo_ptr, kv_ptr, mask_ptr, indices_ptr,
    num_reqs, Q_STRIDE: tl.constexpr, Q_LEN: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    before = tl.arange(0, BLOCK_R)
    lens = tl.load(kv_lens_ptr + before, mask=before < r, other=0)
    kv_start = tl.reduce(lens, 0, add)
    # Tree-mask blocks of the requests before: Q_LEN * (kv_len + Q_LEN) each.
    mask_start = Q_LEN * kv_start + r * Q_LEN * Q_LEN
    kv_len = tl.load(kv_lens_ptr + r)
    if r == 0:
        tl.store(qo_ptr, 0)
        tl.store(kv_ptr, 0)
        if HAS_MASK:
            tl.store(mask_ptr, 0)
    tl.store(qo_ptr + r + 1, (r + 1) * Q_STRIDE)
    tl.store(kv_ptr + r + 1, (kv_start + kv_len).to(tl.int32))
    if HAS_MASK:
        tl.store(mask_ptr + r + 1, mask_start + Q_LEN * (kv_len + Q_LEN))
    row = tl.load(rows_ptr + r)
    for i in range(0, kv_len, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        keep = offs < kv_len
        slot = tl.load(table_ptr + row * table_stride + offs, mask=keep, other=0)
        tl.store(indices_ptr + kv_start + offs, slot.to(tl.int64), mask=keep)


def write_spec_indptr(
    inp: SpecIndptrInputs, *, replay_q_stride: int | None = None
) -> SpecIndptrOutputs:
    """The indices of the step; ``replay_q_stride`` (default ``N``) is the query
    stride of a replayed draft extend, the knob the mutant turns."""
    table = inp.req_to_token
    if table.dtype != torch.int32 or table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(
            f"req_to_token: int32 [rows, W] with unit column stride, got {table.dtype}"
        )
    device, N, R = table.device, inp.spec.num_draft_tokens, inp.num_reqs
    verify = inp.phase == TARGET_VERIFY
    kv_lens = inp.seq_lens.to(torch.int64)
    rows = inp.req_pool_indices.to(torch.int64)
    q_stride = N
    if inp.graph_bs is None:  # eager: fresh tensors of the step's size
        bs = R
        qo = torch.empty(bs + 1, dtype=torch.int64, device=device)
        kv = torch.empty(bs + 1, dtype=torch.int32, device=device)
        mask = torch.empty(bs + 1, dtype=torch.int64, device=device)
        indices = torch.empty(int(kv_lens.sum()), dtype=torch.int64, device=device)
    else:  # replayed: the runner's padding, persistent buffers of the largest graph
        bs, max_bs = inp.graph_bs, max(inp.capture_bs)
        pad_len = SEQ_LEN_FILL if verify else max(SEQ_LEN_FILL - N, 0)
        rows = torch.cat([rows, torch.full((bs - R,), PAD_ROW, dtype=torch.int64, device=device)])
        kv_lens = torch.cat(
            [kv_lens, torch.full((bs - R,), pad_len, dtype=torch.int64, device=device)]
        )
        qo = torch.zeros(max_bs + 1, dtype=torch.int64, device=device)
        kv = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        mask = torch.zeros(max_bs + 1, dtype=torch.int64, device=device)
        indices = torch.zeros(max_bs * table.shape[1], dtype=torch.int64, device=device)
        if not verify and replay_q_stride is not None:
            q_stride = replay_q_stride
    if bs:
        _spec_indptr_kernel[(bs,)](
            rows, kv_lens, table, table.stride(0), qo, kv, mask, indices, bs,
            Q_STRIDE=q_stride, Q_LEN=N, HAS_MASK=verify, BLOCK_R=block(bs, cuda_cap=1024),
            BLOCK=block(int(kv_lens.max()), cuda_cap=256),
        )  # fmt: skip
    else:
        qo[0], kv[0], mask[0] = 0, 0, 0
    return SpecIndptrOutputs(
        qo_indptr=qo[: bs + 1],
        kv_indptr=kv[: bs + 1],
        kv_indices=indices,
        mask_indptr=mask[: bs + 1] if verify else None,
        max_extend_len=N,
    )


def spec_indptr(inp: SpecIndptrInputs) -> SpecIndptrOutputs:
    """Fixed: ``N`` query rows per request, eager and replayed."""
    return write_spec_indptr(inp)


def mutant_draft_extend_stride(inp: SpecIndptrInputs) -> SpecIndptrOutputs:
    """#27545: a replayed draft extend strides its queries ``num_steps + 1`` apart
    while the runner lays out ``N`` rows per request (different when ``topk > 1``)."""
    return write_spec_indptr(inp, replay_q_stride=inp.spec.num_steps + 1)
