"""SGLang's own defects that shipped in supported releases (``Engine.shipped_bugs``).

Each triaged from the releases' wheels (docs/releases.md, "SGLang"):
``benchmarks/releases.py --engine sglang bugs`` measures them, and an engine
test that asks the implementation to pass is an expected failure on a release
that ships one. Kept apart from :mod:`.plugin` so that importing it imports
nothing of SGLang.
"""

from __future__ import annotations

from attnfuzz.harness.engines import ShippedBug

SHIPPED_BUGS = (
    ShippedBug("#19016", "dsa-metadata", "sglang-dsa", "0.5.9", "0.5.10",
        "NativeSparseAttnBackend.init_cuda_graph_state allocates the graph page table "
        "context_len wide; the replayed target verify copies req_to_token[:, :seq_len + N] "
        "into it: a shape error once a KV passes the context", checks=("exception",)),
    ShippedBug("#21987", "mla-block-table", "sglang-trtllm-mla", "0.5.9", "0.5.10",
        "TRTLLMMLABackend's replayed draft extend (v2) lays the queries out by "
        "spec_info.accept_length (accept + 1 rows, max_seq_len_q 1) and builds seq_lens_k "
        "and the block table for seq_len - accept keys, where the runner runs the whole "
        "window of speculative_num_draft_tokens rows per request",
        checks=("values", "max_seq_len_q")),
    ShippedBug("#24743", "graph-input-padding", "sglang", "0.5.11", "0.5.12",
        "decode CUDA-graph runner: populate_from_forward_batch leaves out_cache_loc_swa's "
        "padded rows stale when bs != raw_bs", first_buggy="0.5.11"),
    ShippedBug("#24401", "graph-input-padding", "sglang", "0.5.13", "0.5.14",
        "decode CUDA-graph runner: the padded rows of positions (and, before 0.5.13's "
        "buffer registry, of req_pool_indices) keep an earlier step's values when "
        "bs != raw_bs; 0.5.14's registry zeroes positions' padding (PaddingPolicy.ZERO)",
        checks=("padding",),
        note="fixed upstream in 0.5.14, before attnfuzz met it; attnfuzz re-finds it in "
        "the releases that ship it (0.5.11 to 0.5.13 bind); on 0.5.11 and 0.5.12 its "
        "stale positions are the first padding finding, so "
        "#24743's stale sliding-window slots stay hidden behind it there"),
    ShippedBug("#27545", "spec-indptr", "sglang-triton", "0.5.12", "0.5.13",
        "TritonAttnBackend's replayed draft extend (v2) strides queries "
        "speculative_num_steps + 1 apart, the runner lays out num_draft_tokens per "
        "request: wrong when topk > 1", first_buggy="0.5.10"),
    ShippedBug("draft-extend-kv", "spec-indptr", "sglang-triton", "0.5.12", "0.5.13",
        "TritonAttnBackend's replayed draft extend (v2) builds kv_indptr over the whole "
        "forward length (prefix + window), while the extend kernel takes the window's K/V "
        "separately: the window is read twice, at any topk",
        note="fixed upstream in 0.5.13, before attnfuzz met it; on 0.5.12 attnfuzz meets it "
        "before #27545's stride (it needs no topk > 1); 0.5.13's "
        "_update_draft_extend_buffers subtracts extend_seq_lens (`kv_lens = "
        "seq_lens - extend_seq_lens`) in the same rewrite"),
    ShippedBug("dsv4-draft-window", "runner-step", "sglang-deepseek-v4-draft", "0.5.23", None,
        "DeepseekV4AttnBackend.make_forward_metadata_from_raw_decode builds every EAGLE "
        "draft step's sliding window from the accepted prefix's seq_lens (no "
        "speculative_step_id + 1, which HIP's backend adds): draft step s writes its key "
        "at position seq_len + s and its window ends at seq_len - 1, so no draft step "
        "reads its own key or an earlier step's",
        checks=("queries-read-their-own-keys",), first_buggy="0.5.23",
        note="observed on 0.5.23 only (earlier releases and later ones not run); "
        "#24750 (closed unmerged) proposed mirroring FA3's draft-decode lengths here"),
)  # fmt: skip
"""SGLang's shipped defects, each with its last buggy and first fixed release (None: no
supported release has the fix)."""
