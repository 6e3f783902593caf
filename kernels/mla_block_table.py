"""The MLA paged-decode metadata of a speculative step, written by one Triton kernel.

One program per request the kernel runs (real, then a graph's padding ones): it
writes its query rows, its KV length and its pages of the block table. The KV
length follows the form SGLang's backends write it in,
``seq_len + extra - seq_lens_q + max_seq_len_q`` (``extra = N`` in target
verify), which with the uniform layout (every ``seq_lens_q = N = max_seq_len_q``)
is ``seq_len + extra``. The query layout's prefix sums are taken on the host.

The host side pads a replayed step as the runner does (requests of forward
``seq_len`` 1 on the reserved row 0, accept count ``N``) and, replayed, writes
the block table into the graph's buffer, sized at capture as wide as the
request-to-token table. The mutant (#21987) derives the replay's layout from the
accept counts instead of the uniform ``N``.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.batch import cdiv
from attnfuzz.reference.mla_block_table import (
    PAD_ROW,
    SEQ_LEN_FILL,
    TARGET_VERIFY,
    MlaBlockTableInputs,
    MlaBlockTableOutputs,
)


@triton.jit
def _mla_block_table_kernel(
    rows_ptr, seq_lens_ptr, q_lens_ptr, table_ptr, table_stride,
    seq_lens_k_ptr, seq_lens_q_ptr, blocks_ptr, blocks_stride, blocks_width,
    EXTRA: tl.constexpr, MAX_Q: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r)
    seq_len = tl.load(seq_lens_ptr + r).to(tl.int32)
    q_len = tl.load(q_lens_ptr + r).to(tl.int32)
    kv_len = seq_len + EXTRA - q_len + MAX_Q
    tl.store(seq_lens_k_ptr + r, kv_len)
    tl.store(seq_lens_q_ptr + r, q_len)
    # Page j of the request: the page of its token j * PAGE, as far as its KV reaches.
    num_pages = (tl.maximum(kv_len, 0) + PAGE - 1) // PAGE
    for first in range(0, num_pages, BLOCK):
        j = first + tl.arange(0, BLOCK)
        keep = (j < num_pages) & (j < blocks_width)
        slot = tl.load(table_ptr + row * table_stride + j * PAGE, mask=keep, other=0)
        tl.store(blocks_ptr + r.to(tl.int64) * blocks_stride + j, slot // PAGE, mask=keep)


def _prefix(values: torch.Tensor) -> torch.Tensor:
    """``[0, v0, v0 + v1, ...]`` as int32."""
    out = torch.zeros(values.shape[0] + 1, dtype=torch.int32, device=values.device)
    out[1:] = torch.cumsum(values, 0)
    return out


def write_mla_block_table(
    inp: MlaBlockTableInputs, *, accept_layout: bool = False
) -> MlaBlockTableOutputs:
    """The metadata of the step. ``accept_layout``: a replayed draft extend lays its
    queries out by the accept counts, ``accept + 1`` rows, with ``max_seq_len_q``
    1 (the knob the mutant turns)."""
    table = inp.req_to_token
    if table.dtype != torch.int32 or table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(
            f"req_to_token: int32 [rows, W] with unit column stride, got {table.dtype}"
        )
    device, N, R, page = table.device, inp.next_n, inp.num_reqs, inp.page_size
    rows = inp.req_pool_indices.to(torch.int64)
    seq_lens = inp.seq_lens.to(torch.int64)
    accept = inp.accept_lens.to(torch.int64)
    bs = R if inp.graph_bs is None else inp.graph_bs
    if bs > R:  # the runner's padding requests

        def pad(x: torch.Tensor, value: int) -> torch.Tensor:
            fill = torch.full((bs - R,), value, dtype=torch.int64, device=device)
            return torch.cat([x, fill])

        rows, seq_lens, accept = pad(rows, PAD_ROW), pad(seq_lens, SEQ_LEN_FILL), pad(accept, N)
    extra = N if inp.phase == TARGET_VERIFY else 0
    replayed_draft_extend = inp.graph_bs is not None and inp.phase != TARGET_VERIFY
    if accept_layout and replayed_draft_extend:
        q_lens, max_q = accept + 1, 1
    else:
        q_lens, max_q = torch.full_like(seq_lens, N), N
    longest = int((seq_lens + extra - q_lens + max_q).max()) if bs else 0
    if inp.graph_bs is None:  # eager: a fresh table of the step's size
        width = cdiv(max(longest, 0), page)
    else:  # replayed: the graph's buffer, as wide as the request-to-token table
        width = cdiv(table.shape[1], page)
    blocks = torch.full((bs, width), -1, dtype=torch.int32, device=device)
    seq_lens_k = torch.empty(bs, dtype=torch.int32, device=device)
    seq_lens_q = torch.empty(bs, dtype=torch.int32, device=device)
    if bs:
        _mla_block_table_kernel[(bs,)](
            rows, seq_lens, q_lens, table, table.stride(0),
            seq_lens_k, seq_lens_q, blocks, max(width, 1), width,
            EXTRA=extra, MAX_Q=max_q, PAGE=page, BLOCK=block(cdiv(max(longest, 1), page)),
        )  # fmt: skip
    return MlaBlockTableOutputs(
        seq_lens_k=seq_lens_k,
        block_kv_indices=blocks,
        cu_seqlens_q=_prefix(seq_lens_q),
        seq_lens_q=seq_lens_q,
        max_seq_len_q=max_q,
    )


def mla_block_table(inp: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """Fixed: every request ``N`` query rows, whatever its accept count."""
    return write_mla_block_table(inp)


def mutant_accept_length_layout(inp: MlaBlockTableInputs) -> MlaBlockTableOutputs:
    """#21987: a replayed draft extend (spec v2) lays its queries out by the accept
    counts, ``accept + 1`` rows each and ``max_seq_len_q = 1``, and shortens each
    KV to ``seq_len - accept``, while spec v2 re-runs the whole window of ``N``
    rows over the forward's ``seq_len`` keys."""
    return write_mla_block_table(inp, accept_layout=True)
