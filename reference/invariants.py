"""Every invariant of the common metadata (docs/domain.md section 6), checked by reading.

``violations`` returns human-readable strings, one per broken invariant; an
empty list means the case is a batch the engine can produce. The strategies
must only generate such batches, and the oracle refuses to judge any other.
"""

from __future__ import annotations

import numpy as np
from attnfuzz.reference.batch import (
    PAD_PAGE,
    Batch,
    CommonMetadata,
    EngineConfig,
    cdiv,
    kv_cache_pages,
)
from attnfuzz.reference.runner import mode_problem, step_plan


def config_violations(config: EngineConfig) -> list[str]:
    out = []
    for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(config, name) < 1:
            out.append(f"{name} must be >= 1, got {getattr(config, name)}")
    if config.num_spec < 0:
        out.append(f"num_spec must be >= 0, got {config.num_spec}")
    if config.threshold < 1:
        out.append(f"decode_threshold must be >= 1, got {config.threshold}")
    if config.topk < 1 or config.num_heads < 1 or config.head_dim < 1:
        out.append("topk, num_heads and head_dim must be >= 1")
    sizes = config.cudagraph_capture_sizes
    if list(sizes) != sorted(set(sizes)):
        out.append(f"cudagraph_capture_sizes must be strictly increasing, got {list(sizes)}")
    for s in sizes:
        if s < 1 or s % config.next_n or s > config.max_num_batched_tokens:
            out.append(
                f"capture size {s} must be a positive multiple of next_n={config.next_n} "
                f"and <= max_num_batched_tokens={config.max_num_batched_tokens}"
            )
    problem = mode_problem(config.cudagraph_mode, config.cg_support, config.next_n)
    if problem:
        out.append(problem)
    if config.runner not in ("v1", "v2"):
        out.append(f"runner must be 'v1' or 'v2', got {config.runner!r}")
    if config.varlen_decode and config.runner != "v2":
        out.append("varlen_decode graphs are Model Runner V2's (runner 'v2')")
    return out


def batch_violations(config: EngineConfig, batch: Batch) -> list[str]:
    out = []
    if len(batch.q_lens) != len(batch.num_computed_tokens):
        return ["q_lens and num_computed_tokens differ in length"]
    if not 1 <= batch.num_reqs <= config.max_num_seqs:
        out.append(f"num_reqs={batch.num_reqs} not in [1, max_num_seqs={config.max_num_seqs}]")
    if any(q < 1 for q in batch.q_lens) or any(c < 0 for c in batch.num_computed_tokens):
        out.append("every scheduled request needs q_len >= 1 and num_computed_tokens >= 0")
    total = sum(batch.q_lens)
    if total > config.max_num_batched_tokens:
        out.append(f"{total} tokens exceed max_num_batched_tokens={config.max_num_batched_tokens}")
    if max(batch.seq_lens, default=0) > config.max_model_len:
        out.append(f"a seq_len exceeds max_model_len={config.max_model_len}")
    is_decode = [q <= config.threshold for q in batch.q_lens]
    if any(not a and b for a, b in zip(is_decode, is_decode[1:], strict=False)):
        out.append(f"decodes must come first: q_lens={list(batch.q_lens)}")
    out += scheduler_violations(config, batch)
    if not 0 <= batch.seed < 2**63:
        out.append("seed must be a non-negative 64-bit integer")
    if not 0 <= batch.dp_peer_tokens <= config.max_num_batched_tokens:
        out.append(
            f"dp_peer_tokens={batch.dp_peer_tokens} not in [0, max_num_batched_tokens="
            f"{config.max_num_batched_tokens}]"
        )
    elif batch.dp_peer_uniform and (
        batch.dp_peer_tokens % config.next_n
        or batch.dp_peer_tokens // config.next_n > config.max_num_seqs
    ):
        out.append(
            f"a uniform decode peer has a multiple of next_n={config.next_n} tokens, "
            f"at most max_num_seqs={config.max_num_seqs} requests"
        )
    return out


def scheduler_violations(config: EngineConfig, batch: Batch) -> list[str]:
    """A trace step's view of its requests (``req_ids``, ``pages``, ``new_pages``):
    all three or none, one entry per request, distinct ids, distinct pages that
    cover each ``seq_len`` within the block table's width; ``prompt_lens``, where
    said, one per request that no prefill chunk runs past."""
    fields = (batch.req_ids, batch.pages, batch.new_pages)
    if not any(fields):
        return []
    R = batch.num_reqs
    if any(len(f) != R for f in fields):
        return [f"req_ids, pages and new_pages need one entry per request ({R})"]
    out = []
    if len(set(batch.req_ids)) != R or min(batch.req_ids) < 0:
        out.append(f"req_ids must be distinct and >= 0: {list(batch.req_ids)}")
    held: list[int] = [p for row in batch.pages for p in row]
    if len(set(held)) != len(held) or any(p < 0 for p in held):
        out.append("requests' pages must be distinct and >= 0")
    if held and max(held) >= kv_cache_pages(config):
        out.append(
            f"page {max(held)} past the KV cache's {kv_cache_pages(config)} pages "
            f"(max_num_seqs={config.max_num_seqs} requests of {config.max_blocks_per_seq})"
        )
    for r, (row, new, seq_len) in enumerate(
        zip(batch.pages, batch.new_pages, batch.seq_lens, strict=True)
    ):
        if not cdiv(seq_len, config.block_size) <= len(row) <= config.max_blocks_per_seq:
            out.append(
                f"request {r} holds {len(row)} pages: seq_len {seq_len} needs "
                f"{cdiv(seq_len, config.block_size)}, the table has {config.max_blocks_per_seq}"
            )
        if not 0 <= new <= len(row):
            out.append(f"request {r}: new_pages={new} outside [0, {len(row)}]")
    if set(batch.finished) & set(batch.req_ids):
        out.append(
            f"a finished request is scheduled: {sorted(set(batch.finished) & set(batch.req_ids))}"
        )
    if batch.rejected and (
        len(batch.rejected) != R
        or any(not 0 <= x < q for x, q in zip(batch.rejected, batch.q_lens, strict=True))
    ):
        out.append(
            f"rejected needs one count per request, each below its query: {list(batch.rejected)}"
        )
    if batch.prompt_lens:
        lives = zip(batch.prompt_lens, batch.num_computed_tokens, batch.q_lens, strict=False)
        # A prefill chunk ends within its prompt: a decode starts only after it.
        if len(batch.prompt_lens) != R or any(p < 1 or c < p < c + q for p, c, q in lives):
            out.append(
                "prompt_lens needs one length >= 1 per request, no chunk running past its "
                f"prompt: {list(batch.prompt_lens)}"
            )
    return out


def metadata_violations(config: EngineConfig, batch: Batch, meta: CommonMetadata) -> list[str]:
    """Invariants of the built metadata, padded or not."""
    out = []
    R, T = meta.num_reqs, meta.num_actual_tokens
    step = step_plan(config, batch)
    qsl, seq_lens, table, slots = (
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_table,
        meta.slot_mapping,
    )
    for name, arr, dtype, shape in (
        ("query_start_loc", qsl, np.int32, (R + 1,)),
        ("seq_lens", seq_lens, np.int32, (R,)),
        ("slot_mapping", slots, np.int64, (T,)),
    ):
        if arr.dtype != dtype or arr.shape != shape:
            out.append(f"{name}: expected {np.dtype(dtype)} {shape}, got {arr.dtype} {arr.shape}")
    if table.dtype != np.int32 or table.ndim != 2 or table.shape[0] != R:
        out.append(f"block_table: expected int32 [{R}, W], got {table.dtype} {table.shape}")
    if out:
        return out

    q_lens = np.diff(qsl)
    if qsl[0] != 0 or (q_lens < 0).any():
        out.append(f"query_start_loc must start at 0 and not decrease: {qsl.tolist()}")
    if qsl[-1] != meta.num_real_tokens:
        out.append(f"query_start_loc[-1]={qsl[-1]} != real tokens {meta.num_real_tokens}")
    if R > config.max_num_seqs or T > config.max_num_batched_tokens:
        out.append(f"R={R}, T={T} exceed max_num_seqs / max_num_batched_tokens")
    if meta.max_query_len != int(q_lens.max(initial=0)):
        out.append(f"max_query_len={meta.max_query_len} != max(q_len)={q_lens.max(initial=0)}")
    real = meta.num_real_reqs
    top = int(seq_lens[:real].max(initial=0))
    if not top <= meta.max_seq_len <= config.max_model_len:
        out.append(
            f"max_seq_len={meta.max_seq_len} outside [max(seq_lens)={top}, "
            f"max_model_len={config.max_model_len}]"
        )
    if (seq_lens < q_lens).any():
        out.append("seq_len < q_len for some request")

    bs = config.block_size
    owned: set[int] = set()
    for r in range(real):
        need = cdiv(int(seq_lens[r]), bs)
        if table.shape[1] < need:
            out.append(f"block_table width {table.shape[1]} < {need} pages of request {r}")
            continue
        pages = table[r, :need].tolist()
        if any(not 0 <= p < meta.num_blocks for p in pages) or owned & set(pages):
            out.append(f"request {r} has out-of-range or shared pages {pages}")
        owned |= set(pages)
        for j in range(int(q_lens[r])):
            pos = int(seq_lens[r] - q_lens[r]) + j
            want = int(table[r, pos // bs]) * bs + pos % bs
            if slots[qsl[r] + j] != want:
                out.append(f"slot_mapping[{qsl[r] + j}]={slots[qsl[r] + j]} != {want}")
    if (slots[meta.num_real_tokens :] != -1).any():
        out.append("padded tokens must map to slot -1")

    # Padding: only trailing zero-length, zero-seq_len requests with pad rows.
    if meta.slot_mapping_tokens != max(step.slot_mapping_tokens, T):
        out.append(
            f"slot mapping of {meta.slot_mapping_tokens} tokens, the runner computes "
            f"{step.slot_mapping_tokens}"
        )
    if meta.mode != step.mode or meta.padded != step.padded:
        out.append(f"metadata of a {meta.mode} step, the runner runs a {step.mode} step")
    if meta.padded:
        if (T, R) != (step.num_tokens_padded, step.num_reqs_padded):
            out.append(
                f"padded to T={T}, R={R}; the runner pads to "
                f"{step.num_tokens_padded}, {step.num_reqs_padded}"
            )
        if (q_lens[real:] != 0).any() or (seq_lens[real:] != 0).any():
            out.append("padding requests must have q_len = 0 and seq_len = 0")
        if (table[real:] != PAD_PAGE).any():
            out.append("padding rows of the block table must hold the pad value")
    elif R != real or T != meta.num_real_tokens:
        out.append("unpadded metadata must have the real sizes")
    return out


def violations(config: EngineConfig, batch: Batch, meta: CommonMetadata | None = None) -> list[str]:
    """All violations of one case; builds the metadata if not given."""
    from attnfuzz.reference.batch import build_common_metadata

    out = config_violations(config) + batch_violations(config, batch)
    if out:
        return out
    if meta is None:
        meta = build_common_metadata(config, batch)
    return metadata_violations(config, batch, meta)
