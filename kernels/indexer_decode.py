"""The indexer's decode path, built from the Triton kernels in ``indexer_ops``.

``indexer_decode`` is the fixed path. The mutants below re-create bug A
(upstream #39542) and the corruption its fix left open; each differs from the
fixed path in the one line the bug lived in.
"""

from __future__ import annotations

import torch
from attnfuzz.kernels.indexer_ops import (
    decode_context_lens,
    pack_seq,
    paged_mqa_logits,
    top_k_per_row,
    unpack_seq,
    write_rows,
)
from attnfuzz.reference.indexer_decode import IndexerDecodeInputs, IndexerDecodeOutputs


def _packed_queries(inp: IndexerDecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries and weights as ``[B, L, ...]``: packed when decodes are ragged or padded."""
    B, L, N_d = inp.num_decodes, inp.max_decode_len, inp.num_decode_tokens
    qsl = inp.query_start_loc[: B + 1]
    if inp.requires_padding:
        return (
            pack_seq(inp.q[:N_d], qsl, inp.decode_lens, L),
            pack_seq(inp.weights[:N_d], qsl, inp.decode_lens, L),
        )
    # Uniform decodes: N_d == B * L, a free reshape.
    return inp.q[:N_d].view(B, L, *inp.q.shape[1:]), inp.weights[:N_d].view(B, L, -1)


def _scores(inp: IndexerDecodeInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[B*L, max_model_len]`` and the per-row context lengths ``[B, L]``."""
    B, L = inp.num_decodes, inp.max_decode_len
    q, w = _packed_queries(inp)
    context_lens = decode_context_lens(inp.seq_lens[:B], inp.decode_lens, L)
    logits = paged_mqa_logits(
        q, inp.kv_cache, w, context_lens, inp.block_table[:B], inp.max_model_len
    )
    return logits, context_lens


def _unpacked(inp: IndexerDecodeInputs, topk: torch.Tensor) -> torch.Tensor:
    """Per-row top-k ``[B*L, K]`` back to one row per real decode token."""
    B, L = inp.num_decodes, inp.max_decode_len
    if not inp.requires_padding:
        return topk
    num_tokens = int(inp.decode_lens.sum()) if B else 0
    return unpack_seq(
        topk.view(B, L, -1), inp.query_start_loc[: B + 1], inp.decode_lens, num_tokens
    )


def _empty(inp: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    # fp32 logits whatever the input dtype (bf16 queries on CUDA).
    return IndexerDecodeOutputs(inp.q.new_empty((0, inp.max_model_len), dtype=torch.float32))


def indexer_decode(inp: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """The fixed decode path: scratch top-k, write back exactly the real rows."""
    if inp.num_decodes == 0:
        return _empty(inp)
    logits, context_lens = _scores(inp)
    topk = top_k_per_row(logits, context_lens.view(-1), inp.topk)
    write_rows(inp.topk_indices_buffer, _unpacked(inp, topk))
    return IndexerDecodeOutputs(logits)


def mutant_writeback(inp: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """#39542 (2): writes ``buffer[:N_d]`` although the unpacked result has ``sum(d)`` rows."""
    if inp.num_decodes == 0:
        return _empty(inp)
    logits, context_lens = _scores(inp)
    topk = top_k_per_row(logits, context_lens.view(-1), inp.topk)
    unpacked = _unpacked(inp, topk)
    inp.topk_indices_buffer[: inp.num_decode_tokens, : unpacked.shape[-1]] = unpacked
    return IndexerDecodeOutputs(logits)


def mutant_lengths(inp: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """#39542 (1): on the padded path, top-k lengths from every request, not the B scored."""
    if inp.num_decodes == 0:
        return _empty(inp)
    logits, context_lens = _scores(inp)
    if inp.requires_padding:
        all_lens = torch.diff(inp.query_start_loc[: inp.num_reqs + 1]).to(torch.int32)
        lengths = decode_context_lens(inp.seq_lens, all_lens, inp.max_decode_len).view(-1)
    else:
        lengths = context_lens.view(-1)
    topk = top_k_per_row(logits, lengths, inp.topk)
    write_rows(inp.topk_indices_buffer, _unpacked(inp, topk))
    return IndexerDecodeOutputs(logits)


def mutant_overlap(inp: IndexerDecodeInputs) -> IndexerDecodeOutputs:
    """The fixed upstream code: top-k computed into the view ``buffer[:B*L]``.

    Where ``B*L > N_d`` that view covers rows past the decode tokens (prefill
    rows, when prefills follow) and leaves them overwritten.
    """
    if inp.num_decodes == 0:
        return _empty(inp)
    logits, context_lens = _scores(inp)
    rows = inp.num_decodes * inp.max_decode_len
    topk = top_k_per_row(
        logits, context_lens.view(-1), inp.topk, out=inp.topk_indices_buffer[:rows]
    )
    write_rows(inp.topk_indices_buffer, _unpacked(inp, topk).clone())
    return IndexerDecodeOutputs(logits)
