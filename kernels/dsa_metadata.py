"""The DSA metadata of a step, written by one Triton kernel.

One program per request the kernels run (real, then a graph's padding ones):
it writes its KV length, the visible keys of each of its query rows (clamped
at 0) and their top-k clamp, its rows of the page table (one per query row, or
one per request in an extend) and of the paged table, and in an extend the
indexer's key window of each token. The offsets of a request's rows and keys
are prefix sums over the requests, taken on the host before the launch; the
top-k lengths' prefix sums after it.

The host side pads a replayed step as the runner does (requests of forward
``seq_len`` 1 on the reserved row 0) and, replayed, writes the page tables
into the graph's buffers, sized at capture for the largest graph and as wide
as the request-to-token table. The mutant differs in that width.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels._triton import block, tl, triton
from attnfuzz.reference.batch import cdiv
from attnfuzz.reference.dsa_metadata import (
    DECODE,
    EXTEND,
    PAD_ROW,
    SEQ_LEN_FILL,
    TARGET_VERIFY,
    DsaMetadataInputs,
    DsaMetadataOutputs,
)


@triton.jit
def _dsa_metadata_kernel(
    rows_ptr, kv_lens_ptr, q_lens_ptr, q_start_ptr, kv_start_ptr, table_ptr, table_stride,
    cache_ptr, expanded_ptr, dsa_ptr, page_ptr, page_stride, page_width,
    real_ptr, real_stride, real_width, ks_ptr, ke_ptr, owner_ptr,
    TOPK: tl.constexpr, PAGE: tl.constexpr, ROW_PER_QUERY: tl.constexpr,
    INDEXER: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    row = tl.load(rows_ptr + r)
    kv_len = tl.load(kv_lens_ptr + r).to(tl.int32)
    q_len = tl.load(q_lens_ptr + r).to(tl.int32)
    q_start = tl.load(q_start_ptr + r)
    tl.store(cache_ptr + r, kv_len)
    # Row j of the request sees kv_len - q_len + 1 + j keys, never fewer than 0.
    j = tl.arange(0, BLOCK_Q)
    in_q = j < q_len
    visible = tl.maximum(kv_len - q_len + 1 + j, 0)
    tl.store(expanded_ptr + q_start + j, visible, mask=in_q)
    tl.store(dsa_ptr + q_start + j, tl.minimum(visible, TOPK), mask=in_q)
    if INDEXER:
        ks = tl.load(kv_start_ptr + r).to(tl.int32)
        tl.store(ks_ptr + q_start + j, tl.full((BLOCK_Q,), 0, tl.int32) + ks, mask=in_q)
        tl.store(ke_ptr + q_start + j, ks + visible, mask=in_q)
        tl.store(owner_ptr + q_start + j, tl.full((BLOCK_Q,), 0, tl.int32) + r, mask=in_q)
    # The request's table row, as far as its KV reaches (and the buffers hold).
    first = r
    num_rows = 1
    if ROW_PER_QUERY:
        first = q_start
        num_rows = q_len
    for i in range(0, kv_len, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        keep = offs < kv_len
        slot = tl.load(table_ptr + row * table_stride + offs, mask=keep, other=0)
        is_page = keep & (offs % PAGE == 0) & (offs // PAGE < real_width)
        for t in range(0, num_rows):
            out = (first + t).to(tl.int64)
            tl.store(page_ptr + out * page_stride + offs, slot, mask=keep & (offs < page_width))
            tl.store(real_ptr + out * real_stride + offs // PAGE, slot // PAGE, mask=is_page)


def _prefix(values: torch.Tensor) -> torch.Tensor:
    """``[0, v0, v0 + v1, ...]`` as int32."""
    out = torch.zeros(values.shape[0] + 1, dtype=torch.int32, device=values.device)
    out[1:] = torch.cumsum(values, 0)
    return out


def write_dsa_metadata(
    inp: DsaMetadataInputs, *, graph_width: int | None = None
) -> DsaMetadataOutputs:
    """The metadata of the step; ``graph_width`` (default: the table's width) is
    the column count of a replayed graph's page-table buffer, the knob the mutant turns."""
    table = inp.req_to_token
    if table.dtype != torch.int32 or table.dim() != 2 or table.stride(1) != 1:
        raise ValueError(
            f"req_to_token: int32 [rows, W] with unit column stride, got {table.dtype}"
        )
    device, N, R, page = table.device, inp.next_n, inp.num_reqs, inp.page_size
    extend = inp.phase == EXTEND
    rows = inp.req_pool_indices.to(torch.int64)
    seq_lens = inp.seq_lens.to(torch.int64)
    q_lens = inp.extend_seq_lens.to(torch.int64)
    bs = R if inp.graph_bs is None else inp.graph_bs
    if bs > R:  # the runner's padding requests
        pad = bs - R
        rows = torch.cat([rows, torch.full((pad,), PAD_ROW, dtype=torch.int64, device=device)])
        seq_lens = torch.cat(
            [seq_lens, torch.full((pad,), SEQ_LEN_FILL, dtype=torch.int64, device=device)]
        )
        q_pad = 1 if inp.phase == DECODE else N
        q_lens = torch.cat([q_lens, torch.full((pad,), q_pad, dtype=torch.int64, device=device)])
    kv_lens = seq_lens + N if inp.phase == TARGET_VERIFY else seq_lens
    q_start = _prefix(q_lens)
    cu_seqlens_k = _prefix(kv_lens)
    num_q = int(q_start[-1])
    table_rows = bs if extend else num_q
    longest = int(kv_lens.max()) if bs else 0
    if inp.graph_bs is None:  # eager: fresh tensors of the step's size
        width = longest
    else:  # replayed: the graph's buffers, as wide as the table (or the mutant's width)
        width = table.shape[1] if graph_width is None else graph_width
    real_width = cdiv(width, page)
    page_table = torch.zeros(table_rows, width, dtype=torch.int32, device=device)
    real_table = torch.zeros(table_rows, real_width, dtype=torch.int32, device=device)
    cache = torch.empty(bs, dtype=torch.int32, device=device)
    expanded = torch.empty(num_q, dtype=torch.int32, device=device)
    dsa = torch.empty(num_q, dtype=torch.int32, device=device)
    ks, ke, owner = (torch.empty(num_q, dtype=torch.int32, device=device) for _ in range(3))
    if bs:
        _dsa_metadata_kernel[(bs,)](
            rows, kv_lens, q_lens, q_start, cu_seqlens_k, table, table.stride(0),
            cache, expanded, dsa, page_table, max(width, 1), width,
            real_table, max(real_width, 1), real_width, ks, ke, owner,
            TOPK=inp.index_topk, PAGE=page, ROW_PER_QUERY=not extend, INDEXER=extend,
            BLOCK_Q=block(int(q_lens.max()), cuda_cap=64), BLOCK=block(longest, cuda_cap=256),
        )  # fmt: skip
    # Every query row its own sparse sequence, but in an extend.
    rows_as_sequences = torch.arange(num_q + 1, dtype=torch.int32, device=device)
    return DsaMetadataOutputs(
        cache_seqlens=cache,
        cu_seqlens_k=cu_seqlens_k,
        cu_seqlens_q=q_start if extend else rows_as_sequences,
        seqlens_expanded=expanded,
        dsa_cache_seqlens=dsa,
        dsa_cu_seqlens_k=_prefix(dsa),
        page_table_1=page_table,
        real_page_table=real_table,
        indexer_ks=ks if extend else None,
        indexer_ke=ke if extend else None,
        token_to_batch_idx=owner if extend else None,
    )


def dsa_metadata(inp: DsaMetadataInputs) -> DsaMetadataOutputs:
    """Fixed: a replayed graph's page tables are as wide as the request-to-token table."""
    return write_dsa_metadata(inp)


def mutant_context_len_table(inp: DsaMetadataInputs) -> DsaMetadataOutputs:
    """#19016: a graph's page tables sized by the model's context length, while a
    speculative step's KV reaches ``N`` tokens past it (the table has the headroom)."""
    return write_dsa_metadata(inp, graph_width=inp.context_len)
