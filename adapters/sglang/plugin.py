"""The engine SGLang, declared to attnfuzz: the ``attnfuzz.engines`` entry point ``sglang``.

Each implementation names its adapter function by module and attribute
(:class:`attnfuzz.adapters.sglang.EngineCall`): importing an adapter imports
SGLang, which a plugin must not do when it loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attnfuzz.adapters import sglang
from attnfuzz.adapters.sglang import implementation as sglang_impl
from attnfuzz.adapters.sglang import standalone
from attnfuzz.adapters.sglang.shipped import SHIPPED_BUGS
from attnfuzz.harness.engines import Engine, Site
from attnfuzz.harness.target import Implementation

if TYPE_CHECKING:
    from attnfuzz.reference.trace import Trace


def _dsa_metadata() -> list[Implementation]:
    from attnfuzz.harness.targets import dsa_metadata as t

    backend = "installed SGLang: layers/attention/dsa_backend.py:DeepseekSparseAttnBackend"
    # 0.5.9 and 0.5.10 replay a draft extend by the accept counts, which no case carries.
    declines = sglang.EngineCall("dsa_backend", "declines")
    return [
        sglang_impl(
            "dsa_backend",
            "run",
            name="sglang-dsa",
            description=f"{backend}.init_forward_metadata (eager), init_cuda_graph_state and "
            "init_forward_metadata_out_graph (capture, padded replay by the torch fallback)",
            declines=declines,
        ),
        sglang_impl(
            "dsa_backend",
            "run_fused",
            name="sglang-dsa-fused",
            description=f"{backend}: as sglang-dsa, the replay by the fused Triton kernels "
            "(kernels/ops/attention/dsa/metadata.py), the path a CUDA GPU takes",
            declines=declines,
        ),
        sglang_impl(
            "dsa_backend",
            "upstream_pr19016_context_len_table",
            name="upstream-pr19016-context-len-table",
            kind="mutant",
            description="installed SGLang's DSA backend with #19016 reverted: the graph's "
            "page table context_len wide (0.5.9's allocation), fused replay",
            trigger=t.trigger_context_len_table,
            reach=t.reach_speculative_replay,
            smallest=t.smallest_context_len_table,
        ),
    ]


def _graph_input_padding() -> list[Implementation]:
    from attnfuzz.harness.targets import graph_input_padding as t

    return [
        sglang_impl(
            "graph_runner",
            "run",
            name="sglang",
            description="installed SGLang: runner_utils/buffers.py:DecodeInputBuffers, "
            "cuda_graph_buffer_registry.py:build_decode_registry + "
            "CudaGraphBufferRegistry.fill_from, "
            "runner/decode_cuda_graph_runner.py:build_replay_fb_view",
        ),
        sglang_impl(
            "graph_runner",
            "upstream_stale_swa_slots",
            name="upstream-pr24743-stale-swa-slots",
            kind="mutant",
            description="installed SGLang's decode buffer fill with #24743 reverted: padded "
            "tokens keep stale sliding-window slots",
            trigger=t.trigger_swa_padded,
            reach=t.reach_swa,
            smallest=t.smallest_stale_swa_slots,
        ),
    ]


def _spec_indptr() -> list[Implementation]:
    from attnfuzz.harness.targets import spec_indptr as t

    return [
        sglang_impl(
            "triton_backend",
            "run",
            name="sglang-triton",
            description="installed SGLang: layers/attention/triton_backend.py:TritonAttnBackend."
            "init_forward_metadata (eager), init_cuda_graph_state and "
            "init_forward_metadata_out_graph / _in_graph (capture, padded replay)",
        ),
        sglang_impl(
            "triton_backend",
            "upstream_pr27545_draft_extend_stride",
            name="upstream-pr27545-draft-extend-stride",
            kind="mutant",
            description="installed SGLang's TritonAttnBackend with #27545 reverted: replayed "
            "draft extend strides queries num_steps + 1 apart (0.5.12's line)",
            trigger=t.trigger_draft_extend_stride,
            reach=t.reach_draft_extend_replay,
            smallest=t.smallest_draft_extend_stride,
        ),
    ]


def _mla_block_table() -> list[Implementation]:
    from attnfuzz.adapters.sglang import limits
    from attnfuzz.harness.targets import mla_block_table as t

    backend = "installed SGLang: layers/attention/trtllm_mla_backend.py:TRTLLMMLABackend"
    # SGLang's own limits on the steps TRT-LLM MLA is given: pages of 32 or 64 tokens,
    # and no prefix past what its scheduler lets a request reach (limits.py).
    reachable = {
        "admits": limits.trtllm_mla_admits,
        "params": {"mla_page_log2": limits.TRTLLM_MLA_PAGE_LOG2},
    }
    return [
        sglang_impl(
            "trtllm_mla",
            "run",
            name="sglang-trtllm-mla",
            description=f"{backend}.init_forward_metadata (eager), init_cuda_graph_state and "
            "init_forward_metadata_out_graph (capture, padded replay); model context_len "
            "the request-to-token table's width (the context-len finding kept apart)",
            **reachable,
        ),
        sglang_impl(
            "trtllm_mla",
            "upstream_pr21987_accept_length_layout",
            name="upstream-pr21987-accept-length-layout",
            kind="mutant",
            description="installed SGLang's TRTLLMMLABackend with #21987 reverted: the "
            "draft-extend replay lays queries out by the accept counts (0.5.9's lines)",
            trigger=t.trigger_accept_length_layout,
            reach=t.reach_draft_extend_replay,
            smallest=t.smallest_accept_length_layout_trtllm,
            **reachable,
        ),
        sglang_impl(
            "trtllm_mla",
            "run_context_len",
            name="sglang-trtllm-mla-context-len",
            kind="mutant",
            description=f"{backend} as SGLang sizes it, context_len = max_model_len: the "
            "graph block table lacks the pages of a KV past the context (a live defect)",
            trigger=t.trigger_kv_past_context,
            reach=t.reach_speculative_replay,
            smallest=t.smallest_kv_past_context,
            fixes={"max_model_len": t.SGLANG_CONTEXT_LEN},
            standalone=standalone.trtllm_mla_context_len,
            **reachable,
        ),
        *_flashmla(t, limits),
    ]


def _flashmla(t: Any, limits: Any) -> list[Implementation]:
    """SGLang's FlashMLA backend on the same steps: pages of 64, the scheduler's limits."""
    backend = "installed SGLang: layers/attention/flashmla_backend.py:FlashMLABackend"
    reachable = {
        "admits": limits.flashmla_admits,
        "params": {"mla_page_log2": limits.FLASHMLA_PAGE_LOG2},
    }
    return [
        sglang_impl(
            "flashmla",
            "run",
            name="sglang-flashmla",
            description=f"{backend}.init_forward_metadata (eager), init_cuda_graph_state and "
            "init_forward_metadata_out_graph (capture, padded replay); model context_len "
            "the request-to-token table's width; flash_mla's schedule stood in",
            **reachable,
        ),
        sglang_impl(
            "flashmla",
            "run_context_len",
            name="sglang-flashmla-context-len",
            kind="mutant",
            description=f"{backend} as SGLang sizes it, context_len = max_model_len: the "
            "graph block table's (context_len + 64) // 64 pages a row lack the last page of "
            "a KV past them (a live defect, at contexts 61 to 63 past a multiple of 64)",
            trigger=t.trigger_kv_past_flashmla_table,
            reach=t.reach_speculative_replay,
            smallest=t.smallest_kv_past_flashmla_table,
            fixes={"max_model_len": t.FLASHMLA_CONTEXT_LEN},
            standalone=standalone.flashmla_context_len,
            **reachable,
        ),
    ]


def _fa3() -> Any:
    """The FA3 runner-step adapter, imported when a mutant's case is judged (it imports
    torch, never when the plugin loads)."""
    from attnfuzz.adapters.sglang import runner_step_fa3

    return runner_step_fa3


def _reach_fa3_verify_replay(trace: Trace) -> bool:
    return _fa3().reach_verify_replay(trace)


def _reach_fa3_graph(trace: Trace) -> bool:
    return _fa3().reach_graph(trace)


def _trigger_fa3_table_short_of_window(trace: Trace) -> bool:
    return _fa3().trigger_table_short_of_window(trace)


def _smallest_fa3_window_forgotten() -> Trace:
    return _fa3().smallest_window_forgotten()


def _smallest_fa3_table_short_of_window() -> Trace:
    return _fa3().smallest_table_short_of_window()


def _runner_step_fa3() -> list[Implementation]:
    """SGLang's decode graph runner step on the FlashAttention 3 backend, and two of its
    graph metadata's defects re-created."""
    backend = "layers/attention/flashattention_backend.py:FlashAttentionBackend"
    return [
        sglang_impl(
            "runner_step_fa3",
            "run",
            name="sglang-fa3",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (eager "
            "init_forward_metadata, init_cuda_graph_state, init_forward_metadata_out_graph "
            "at capture and replay); sgl_kernel.flash_attn's get_scheduler_metadata by its "
            "contract where the kernels are not built; a graph stand-in",
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3",
            "run_window_forgotten",
            name="sglang-fa3-verify-window-forgotten",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph verify metadata drops "
            "the draft window (_spec_read_seq_len_delta 0): cache_seqlens of the committed "
            "prefix alone",
            trigger=_reach_fa3_verify_replay,
            reach=_reach_fa3_verify_replay,
            smallest=_smallest_fa3_window_forgotten,
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3",
            "run_table_short_of_window",
            name="sglang-fa3-table-short-of-window",
            kind="mutant",
            description=f"installed SGLang's {backend} with its graph page table sized "
            "next_n tokens short of the model's context: a KV at the limit reads past it",
            trigger=_trigger_fa3_table_short_of_window,
            reach=_reach_fa3_graph,
            smallest=_smallest_fa3_table_short_of_window,
            traced=True,
        ),
    ]


def _xpu() -> Any:
    """The Intel XPU runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_xpu

    return runner_step_xpu


def _reach_xpu_graph(trace: Trace) -> bool:
    return _xpu().reach_graph(trace)


def _trigger_xpu_table_short_of_window(trace: Trace) -> bool:
    return _xpu().trigger_table_short_of_window(trace)


def _smallest_xpu_table_short_of_window() -> Trace:
    return _xpu().smallest_table_short_of_window()


def _runner_step_xpu() -> list[Implementation]:
    """SGLang's decode graph runner step on the Intel XPU attention backend, and its
    graph page table's defect re-created."""
    backend = "layers/attention/xpu_backend.py:XPUAttentionBackend"
    # Pages of 64 or 128 tokens only (arg_groups/overrides.py).
    declines = sglang.EngineCall("runner_step_xpu", "declines")
    return [
        sglang_impl(
            "runner_step_xpu",
            "run",
            name="sglang-xpu",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang-fa3) over {backend} (eager "
            "init_forward_metadata, init_cuda_graph_state, init_forward_metadata_out_graph "
            "at capture and replay: decode graphs as --cuda-graph-backend-decode full opts "
            "in on XPU); a graph stand-in",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_xpu",
            "run_table_short_of_window",
            name="sglang-xpu-table-short-of-window",
            kind="mutant",
            description=f"installed SGLang's {backend} with its graph page table sized "
            "next_n tokens short of the model's context: a KV at the limit reads past it",
            trigger=_trigger_xpu_table_short_of_window,
            reach=_reach_xpu_graph,
            smallest=_smallest_xpu_table_short_of_window,
            declines=declines,
            traced=True,
        ),
    ]


def _runner_step_prefill_decode() -> list[Implementation]:
    """SGLang's decode graph runner step with FA3 for prefill and Triton for decode: the
    wrapper SGLang builds when the two differ, under either speculative attention mode."""
    backend = "layers/attention/hybrid_attn_backend.py:HybridAttnBackend"
    return [
        sglang_impl(
            "runner_step_prefill_decode",
            "run",
            name="sglang-prefill-decode",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang) with --prefill-attention-backend fa3 "
            f"--decode-attention-backend triton: {backend} (init_forward_metadata, "
            "init_cuda_graph_state, init_forward_metadata_out_graph at capture and replay) "
            "handing each step to the backend it selects (a verify to FA3); a graph stand-in",
            traced=True,
        ),
        sglang_impl(
            "runner_step_prefill_decode",
            "run_verify_on_decode",
            name="sglang-prefill-decode-verify-on-decode",
            description="installed SGLang: sglang-prefill-decode's engine under "
            f"--speculative-attention-mode decode: {backend} hands a verify to the Triton "
            "decode backend, whose graph state alone is made; a graph stand-in",
            traced=True,
        ),
    ]


def _fa3_tree() -> Any:
    """The FA3 tree-verify runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_fa3_tree

    return runner_step_fa3_tree


def _trigger_fa3_tree_mask_unsorted(trace: Trace) -> bool:
    return _fa3_tree().trigger_mask_unsorted(trace)


def _reach_fa3_tree_verify_replay(trace: Trace) -> bool:
    return _fa3_tree().reach_tree_verify_replay(trace)


def _smallest_fa3_tree_mask_unsorted() -> Trace:
    return _fa3_tree().smallest_mask_unsorted()


def _runner_step_fa3_tree() -> list[Implementation]:
    """SGLang's decode graph runner step on the FlashAttention 3 backend under EAGLE's
    tree draft (topk > 1), and a defect of its graph's expanded page table re-created."""
    backend = "layers/attention/flashattention_backend.py:FlashAttentionBackend"
    declines = sglang.EngineCall("runner_step_fa3_tree", "declines")
    return [
        sglang_impl(
            "runner_step_fa3_tree",
            "run",
            name="sglang-fa3-tree",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner over {backend} with --speculative-eagle-topk = the "
            "config's topk (> 1): the target verify of a draft tree (its custom mask), "
            "eager, captured and replayed, the prefix's and the expanded metadata",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3_local",
            "run",
            name="sglang-fa3-local",
            description="installed SGLang: sglang-fa3's step on a model with chunked "
            "(local) attention layers (chunks of 4 tokens): layers/attention/"
            "local_attention.py:LocalAttentionMetadataBuilder (build, build_for_capture, "
            "update_for_replay), each query token's local keys held to its chunk's",
            declines=sglang.EngineCall("runner_step_fa3_local", "declines"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_dots",
            "run",
            name="sglang-dots-swa-mla",
            description="installed SGLang: sglang-fa3's step on a Dots3 model's hybrid "
            "sliding-window pool (mem_cache/swa_memory_pool.py:SWAKVPool, its "
            "SWATokenToKVPoolAllocator's mapping): FlashAttentionBackend's sliding-window "
            "pool paths (swa_page_table, swa_out_cache_loc; eager, captured, replayed) under "
            "layers/attention/dots_hybrid_backend.py:DotsSWAMLAAttnBackend (as "
            "wrap_dots_attention_backend makes it), an extend's SWA-MLA prefill metadata; "
            "each held to the allocator's mapping of the full layers' reads and writes",
            declines=sglang.EngineCall("runner_step_dots", "declines"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3_tree",
            "run_swa",
            name="sglang-fa3-tree-swa",
            description="installed SGLang: sglang-fa3-tree's step on a model with a sliding "
            f"window (no sliding-window pool): {backend}'s swa_spec_metadata of a tree "
            "verify (_init_sliding_window_attn_spec_metadata, prepare_swa_spec_page_table_"
            "triton interpreted), eager, captured and replayed, each draft token's window "
            "keys held to the cascade's; pages of one token",
            fixes={"block_size": 1},
            declines=sglang.EngineCall("runner_step_fa3_tree", "declines_swa"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3_tree",
            "run_mask_unsorted",
            name="sglang-fa3-tree-mask-unsorted",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph replay of a tree verify "
            "leaves the expanded page table in the draft columns' order (the mask's sort "
            "forgotten): a token reads its sibling's key",
            trigger=_trigger_fa3_tree_mask_unsorted,
            reach=_reach_fa3_tree_verify_replay,
            smallest=_smallest_fa3_tree_mask_unsorted,
            declines=declines,
            traced=True,
        ),
    ]


def _fa3_draft() -> Any:
    """The FA3 EAGLE draft runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_fa3_draft

    return runner_step_fa3_draft


def _trigger_fa3_draft_step_not_advanced(trace: Trace) -> bool:
    return _fa3_draft().trigger_step_not_advanced(trace)


def _reach_fa3_draft_replay(trace: Trace) -> bool:
    return _fa3_draft().reach_draft_replay(trace)


def _smallest_fa3_draft_step_not_advanced() -> Trace:
    return _fa3_draft().smallest_step_not_advanced()


def _runner_step_fa3_draft() -> list[Implementation]:
    """SGLang's EAGLE draft graph runner on the FlashAttention 3 multi-step backend, and a
    defect of its graph's per-step metadata re-created."""
    backend = "layers/attention/flashattention_backend.py:FlashAttentionMultiStepBackend"
    declines = sglang.EngineCall("runner_step_fa3_draft", "declines")
    return [
        sglang_impl(
            "runner_step_fa3_draft",
            "run",
            name="sglang-fa3-eagle-draft",
            description="installed SGLang: speculative/eagle_draft_cuda_graph_runner.py:"
            f"EAGLEDraftCudaGraphRunner (as sglang-eagle-draft) over {backend} (each draft "
            "step's FlashAttentionBackend: eager init_forward_metadata, "
            "init_cuda_graph_state, init_forward_metadata_out_graph at capture and replay); "
            "the draft model's FA3 extend",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3_draft",
            "run_step_not_advanced",
            name="sglang-fa3-eagle-draft-step-not-advanced",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph metadata reads every "
            "draft step's KV as the first step's (_spec_read_seq_len_delta 1): cache_seqlens "
            "not advanced per step",
            trigger=_trigger_fa3_draft_step_not_advanced,
            reach=_reach_fa3_draft_replay,
            smallest=_smallest_fa3_draft_step_not_advanced,
            declines=declines,
            traced=True,
        ),
    ]


def _fa3_draft_extend() -> Any:
    """The FA3 EAGLE draft-extend runner-step adapter, imported when a mutant's trace is
    judged."""
    from attnfuzz.adapters.sglang import runner_step_fa3_draft_extend

    return runner_step_fa3_draft_extend


def _reach_fa3_draft_extend_replay(trace: Trace) -> bool:
    return _fa3_draft_extend().reach_draft_extend_replay(trace)


def _smallest_fa3_draft_extend_window_forgotten() -> Trace:
    return _fa3_draft_extend().smallest_window_forgotten()


def _runner_step_fa3_draft_extend() -> list[Implementation]:
    """SGLang's EAGLE draft-extend graph runner on the FlashAttention 3 backend, and a
    defect of its graph's query offsets re-created."""
    backend = "layers/attention/flashattention_backend.py:FlashAttentionBackend"
    declines = sglang.EngineCall("runner_step_fa3_draft_extend", "declines")
    return [
        sglang_impl(
            "runner_step_fa3_draft_extend",
            "run",
            name="sglang-fa3-eagle-draft-extend",
            description="installed SGLang: speculative/eagle_draft_extend_cuda_graph_runner.py:"
            "EAGLEDraftExtendCudaGraphRunner (as sglang-eagle-draft-extend) over the draft "
            f"model's {backend} (DRAFT_EXTEND_V2: eager init_forward_metadata, "
            "init_cuda_graph_state, init_forward_metadata_out_graph at capture and replay)",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3_draft_extend",
            "run_window_forgotten",
            name="sglang-fa3-eagle-draft-extend-window-forgotten",
            kind="mutant",
            description=f"installed SGLang's {backend} whose in-graph draft-extend metadata "
            "(init_forward_metadata_in_graph, written last at each replay) takes one query "
            "token a request (the window forgotten): cu_seqlens_q",
            trigger=_reach_fa3_draft_extend_replay,
            reach=_reach_fa3_draft_extend_replay,
            smallest=_smallest_fa3_draft_extend_window_forgotten,
            declines=declines,
            traced=True,
        ),
    ]


def _trtllm_mha() -> Any:
    """The TRT-LLM MHA runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_trtllm_mha

    return runner_step_trtllm_mha


def _reach_trtllm_mha_verify_replay(trace: Trace) -> bool:
    return _trtllm_mha().reach_verify_replay(trace)


def _smallest_trtllm_mha_verify_offset_forgotten() -> Trace:
    return _trtllm_mha().smallest_verify_offset_forgotten()


def _runner_step_trtllm_mha() -> list[Implementation]:
    """SGLang's decode graph runner step on the TRT-LLM MHA backend, and a defect of its
    graph metadata re-created."""
    backend = "layers/attention/trtllm_mha_backend.py:TRTLLMHAAttnBackend"
    # Pages of 16, 32, 64 or 128 tokens only (arg_groups/overrides.py).
    declines = sglang.EngineCall("runner_step_trtllm_mha", "declines")
    return [
        sglang_impl(
            "runner_step_trtllm_mha",
            "run",
            name="sglang-trtllm-mha",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (eager "
            "init_forward_metadata, init_cuda_graph_state, init_forward_metadata_out_graph "
            "at capture and replay, init_forward_metadata_in_graph run by the graph "
            "stand-in at capture and at each replay; its Triton kernels interpreted); "
            "flashinfer's wrappers and device queries stood in where flashinfer is not "
            "built",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_trtllm_mha",
            "run_verify_offset_forgotten",
            name="sglang-trtllm-mha-verify-offset-forgotten",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph verify metadata takes "
            "seqlen_offset 0 (_apply_cuda_graph_metadata): cache_seqlens and cu_seqlens_k "
            "of the committed prefix alone",
            trigger=_reach_trtllm_mha_verify_replay,
            reach=_reach_trtllm_mha_verify_replay,
            smallest=_smallest_trtllm_mha_verify_offset_forgotten,
            declines=declines,
            traced=True,
        ),
    ]


def _runner_step_hpc_ops() -> list[Implementation]:
    """SGLang's decode graph runner step on the HPC-Ops backend."""
    backend = "layers/attention/hpc_ops_backend.py:HPCOpsAttnBackend"
    return [
        sglang_impl(
            "runner_step_hpc_ops",
            "run",
            name="sglang-hpc-ops",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (eager "
            "init_forward_metadata, init_cuda_graph_state, init_forward_metadata_out_graph "
            "at capture and replay, init_forward_metadata_in_graph run by the graph "
            "stand-in at capture and at each replay; its Triton kernels interpreted); "
            "hpc-ops' decode scheduler stood in, the GPU an sm90",
            # arg_groups/overrides.py makes any other page size 64; attention_registry.py:
            # create_hpc_ops_backend refuses speculative decoding.
            fixes={"block_size": 64, "next_n": 1},
            traced=True,
        ),
    ]


def _aiter() -> Any:
    """The AITER runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_aiter

    return runner_step_aiter


def _reach_aiter_decode_replay(trace: Trace) -> bool:
    return _aiter().reach_decode_replay(trace)


def _smallest_aiter_decode_indptr_off_buffer() -> Trace:
    return _aiter().smallest_decode_indptr_off_buffer()


def _aiter_unified() -> Any:
    """The AITER unified-attention runner-step adapter, imported when its trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_aiter_unified

    return runner_step_aiter_unified


def _reach_aiter_unified_decode_replay(trace: Trace) -> bool:
    return _aiter_unified().reach_decode_replay(trace)


def _trigger_aiter_unified_page_size_one(trace: Trace) -> bool:
    return _aiter_unified().trigger_page_size_one(trace)


def _smallest_aiter_unified_page_size_one() -> Trace:
    return _aiter_unified().smallest_page_size_one()


def _runner_step_aiter() -> list[Implementation]:
    """SGLang's decode graph runner step on the AITER backend (ROCm, MHA), and a defect
    of its graph metadata re-created."""
    backend = "layers/attention/aiter_backend.py:AiterAttnBackend"
    return [
        sglang_impl(
            "runner_step_aiter",
            "run",
            name="sglang-aiter",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend}, MHA on gfx942 (eager "
            "init_forward_metadata of decode, target verify and extend, "
            "init_cuda_graph_state, init_forward_metadata_out_graph at capture and replay: "
            "_apply_cuda_graph_metadata; create_flashinfer_kv_indices_triton interpreted); "
            "the aiter package stood in while the engine steps (its kernels refuse)",
            traced=True,
        ),
        sglang_impl(
            "runner_step_aiter_mla",
            "run",
            name="sglang-aiter-mla",
            description=f"installed SGLang: sglang-aiter's step on an MLA model of 16 heads "
            f"a rank and a bf16 cache: {backend}'s MLA branches (eager decode, target verify "
            "and extend through AiterMlaIndicesUpdaterPrefill; init_cuda_graph_state and "
            "_apply_cuda_graph_metadata at capture and replay), aiter's persistent MLA "
            "kernel off as the backend chooses for that shape (no scheduler plans)",
            traced=True,
        ),
        sglang_impl(
            "runner_step_aiter_mla",
            "run_persist",
            name="sglang-aiter-mla-persist",
            description=f"installed SGLang: sglang-aiter-mla's step on 32 heads a rank "
            f"(DeepSeek-V3 over tensor-parallel 4), where {backend} keeps aiter's "
            "persistent MLA kernel on: make_mla_decode_meta_data_buffer and "
            "make_mla_meta_data (aiter's scheduler stood in) for the eager decode and "
            "verify, the graph's persistent work buffers planned at capture and replay, "
            "schedule_stale held to 0",
            traced=True,
        ),
        sglang_impl(
            "runner_step_aiter",
            "run_decode_indptr_off_buffer",
            name="sglang-aiter-decode-indptr-off-buffer",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph decode writes kv_indptr "
            "to a new tensor (_apply_cuda_graph_metadata), not the persistent buffer the "
            "graph captured: the replay reads the capture's offsets",
            trigger=_reach_aiter_decode_replay,
            reach=_reach_aiter_decode_replay,
            smallest=_smallest_aiter_decode_indptr_off_buffer,
            traced=True,
        ),
        sglang_impl(
            "runner_step_aiter_unified",
            "run",
            name="sglang-aiter-unified-page-size-one",
            kind="mutant",
            declines=sglang.EngineCall("runner_step_aiter_unified", "declines"),
            description=f"installed SGLang's {backend} with SGLANG_USE_AITER_UNIFIED_ATTN=1 "
            "(a model without sliding window): at page size 1 its graph decode's page table "
            "(cuda_graph_page_table) is never written by _apply_cuda_graph_metadata, so every "
            "replayed decode's unified_attention reads slot 0 for every key (a finding of "
            "SGLang's own, kept apart; upstream PR #40410, open)",
            trigger=_trigger_aiter_unified_page_size_one,
            reach=_reach_aiter_unified_decode_replay,
            smallest=_smallest_aiter_unified_page_size_one,
            traced=True,
        ),
    ]


def _wave() -> Any:
    """The Wave runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_wave

    return runner_step_wave


def _reach_wave_verify_replay(trace: Trace) -> bool:
    return _wave().reach_verify_replay(trace)


def _smallest_wave_verify_prefix_with_drafts() -> Trace:
    return _wave().smallest_verify_prefix_with_drafts()


def _reach_wave_verify_graph(trace: Trace) -> bool:
    return _wave().reach_verify_graph(trace)


def _trigger_wave_verify_mask_overflow(trace: Trace) -> bool:
    return _wave().trigger_mask_overflow(trace)


def _smallest_wave_verify_mask_overflow() -> Trace:
    return _wave().smallest_mask_overflow()


def _runner_step_wave() -> list[Implementation]:
    """SGLang's decode graph runner step on the Wave backend (ROCm), and a defect of its
    graph metadata re-created."""
    backend = "layers/attention/wave_backend.py:WaveAttnBackend"
    return [
        sglang_impl(
            "runner_step_wave",
            "run",
            name="sglang-wave",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (create_wave_backend) on an "
            "MI300X's 304 compute units (eager init_forward_metadata of decode, target "
            "verify and extend, init_cuda_graph_state, init_forward_metadata_out_graph at "
            "capture and replay: _apply_cuda_graph_metadata; "
            "create_flashinfer_kv_indices_triton and get_num_kv_splits_triton "
            "interpreted); the wave_lang package stood in while the engine steps (its "
            "compiler and kernels refuse)",
            declines=sglang.EngineCall("runner_step_wave", "declines"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_wave",
            "run_verify_prefix_with_drafts",
            name="sglang-wave-verify-prefix-with-drafts",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph verify metadata "
            "(_apply_cuda_graph_metadata) counts the drafts into each request's cached "
            "prefix (seq_lens + num_draft_tokens, FlashInfer's verify kv_indptr): "
            "kv_indptr, kv_indices and mask_indptr",
            declines=sglang.EngineCall("runner_step_wave", "declines"),
            trigger=_reach_wave_verify_replay,
            reach=_reach_wave_verify_replay,
            smallest=_smallest_wave_verify_prefix_with_drafts,
            traced=True,
        ),
        sglang_impl(
            "runner_step_wave",
            "run_verify_mask_overflow",
            name="sglang-wave-verify-mask-overflow",
            kind="mutant",
            description=f"installed SGLang's {backend}, unmodified: init_cuda_graph_state "
            "sizes cuda_graph_custom_mask max_bs * max_context_len, and "
            "_apply_cuda_graph_metadata copies a verify's whole custom mask (N * (seq_len "
            "+ N) entries a request) into it, which raises once the batch's entries pass "
            "the buffer (at a replay) or N * (N + 1) passes the context (at capture) (a "
            "finding of SGLang's own, kept apart)",
            trigger=_trigger_wave_verify_mask_overflow,
            reach=_reach_wave_verify_graph,
            smallest=_smallest_wave_verify_mask_overflow,
            traced=True,
        ),
    ]


def _qwen_sparse() -> Any:
    """The QSA runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_qwen_sparse

    return runner_step_qwen_sparse


def _reach_qwen_sparse_replay(trace: Trace) -> bool:
    return _qwen_sparse().reach_replay(trace)


def _trigger_qwen_sparse_page_table_off_buffer(trace: Trace) -> bool:
    return _qwen_sparse().trigger_page_table_off_buffer(trace)


def _smallest_qwen_sparse_page_table_off_buffer() -> Trace:
    return _qwen_sparse().smallest_page_table_off_buffer()


def _runner_step_qwen_sparse() -> list[Implementation]:
    """SGLang's decode graph runner step on the Qwen sparse-attention (QSA) backend, and a
    defect of its graph metadata re-created."""
    backend = "layers/attention/qwen_sparse_attn_backend.py:QwenSparseAttnBackend"
    # Pages of 64 tokens (arg_groups/model_overrides/qwen4_exp.py); a verify no wider than
    # the compress ratio, an extend over whole compression groups (declines).
    pages = {
        "fixes": {"block_size": 64},
        "declines": sglang.EngineCall("runner_step_qwen_sparse", "declines"),
        "traced": True,
    }
    return [
        sglang_impl(
            "runner_step_qwen_sparse",
            "run",
            name="sglang-qwen-sparse",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (create_qsa_backend) on a "
            "Qwen4-Exp QSA profile and mem_cache/qsa_kv_pool.py:QSATokenToKVPool, pages of "
            "64 (eager init_forward_metadata of decode, target verify and extend with its "
            "compression write plan, init_cuda_graph_state, init_forward_metadata_out_graph "
            "at capture and replay: qsa/graph_metadata.py:launch_graph_metadata interpreted, "
            "the path a CUDA GPU takes); pinned host memory stood in",
            **pages,
        ),
        sglang_impl(
            "runner_step_qwen_sparse",
            "run_page_table_off_buffer",
            name="sglang-qwen-sparse-page-table-off-buffer",
            kind="mutant",
            description=f"installed SGLang's {backend} whose replay refreshes a copy of the "
            "graph's compressed page table (msgspec.structs.replace of the frozen metadata, "
            "then held as forward_metadata), not the buffer the graph captured: the replay "
            "reads the capture's table",
            trigger=_trigger_qwen_sparse_page_table_off_buffer,
            reach=_reach_qwen_sparse_replay,
            smallest=_smallest_qwen_sparse_page_table_off_buffer,
            **pages,
        ),
    ]


def _minimax_sparse() -> Any:
    """The MiniMax-M3 sparse runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_minimax_sparse

    return runner_step_minimax_sparse


def _reach_minimax_sparse_verify(trace: Trace) -> bool:
    return _minimax_sparse().reach_verify(trace)


def _trigger_minimax_sparse_verify_bound_without_drafts(trace: Trace) -> bool:
    return _minimax_sparse().trigger_verify_bound_without_drafts(trace)


def _smallest_minimax_sparse_verify_bound_without_drafts() -> Trace:
    return _minimax_sparse().smallest_verify_bound_without_drafts()


def _runner_step_minimax_sparse() -> list[Implementation]:
    """SGLang's decode graph runner step of a MiniMax-M3 sparse-attention model on ROCm, and
    a defect of its verify's score bound re-created."""
    backend = "layers/attention/minimax_sparse_backend.py:MiniMaxSparseAttnBackend"
    return [
        sglang_impl(
            "runner_step_minimax_sparse",
            "run",
            name="sglang-minimax-sparse",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang) over minimax_sparse_backend.py:"
            f"MiniMaxHybridAttnBackend with Triton and {backend} (attn_backend_wrapper, a "
            "MiniMax-M3 profile, mem_cache/memory_pool.py:MiniMaxSparseKVPool; eager "
            "init_forward_metadata and an extend's _resolve_extend_meta; "
            "init_forward_metadata_out_graph at capture and replay; ROCm's linear verify "
            "rows in init_forward_metadata_in_graph); the platform ROCm's (an MI300X)",
            traced=True,
        ),
        sglang_impl(
            "runner_step_minimax_sparse",
            "run_verify_bound_without_drafts",
            name="sglang-minimax-sparse-verify-bound-without-drafts",
            kind="mutant",
            description=f"installed SGLang's {backend} whose init_forward_metadata_out_graph "
            "leaves out ROCm's _max_seqlen_k += speculative_num_draft_tokens: a verify's "
            "score buffer sized for the committed prefix, its draft rows scoring past it",
            trigger=_trigger_minimax_sparse_verify_bound_without_drafts,
            reach=_reach_minimax_sparse_verify,
            smallest=_smallest_minimax_sparse_verify_bound_without_drafts,
            traced=True,
        ),
    ]


def _minicpm_sparse() -> Any:
    """The MiniCPM sparse runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_minicpm_sparse

    return runner_step_minicpm_sparse


def _reach_minicpm_sparse_replay(trace: Trace) -> bool:
    return _minicpm_sparse().reach_replay(trace)


def _trigger_minicpm_sparse_table_rebound(trace: Trace) -> bool:
    return _minicpm_sparse().trigger_table_rebound(trace)


def _smallest_minicpm_sparse_table_rebound() -> Trace:
    return _minicpm_sparse().smallest_table_rebound()


def _runner_step_minicpm_sparse() -> list[Implementation]:
    """SGLang's decode graph runner step on the MiniCPM sparse-attention backend, and a
    defect of its graph metadata re-created."""
    backend = "layers/attention/minicpm/backend.py:MiniCPMSparseBackend"
    # Pages of one token (minicpm/cache.py); no speculative decoding (declines).
    pages = {
        "fixes": {"block_size": 1},
        "declines": sglang.EngineCall("runner_step_minicpm_sparse", "declines"),
        "traced": True,
    }
    return [
        sglang_impl(
            "runner_step_minicpm_sparse",
            "run",
            name="sglang-minicpm-sparse",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang-fa3) over {backend} "
            "(create_minicpm_flashattn_backend) on a MiniCPM-SALA sparse profile and "
            "minicpm/cache.py:MiniCPMCompressedCache over TokenToKVPoolAllocator (eager "
            "init_forward_metadata of decode and extend: update_batch_for_sparse, "
            "sparse_utils' compression metadata and sparse plans; init_cuda_graph_state; "
            "init_forward_metadata_out_graph at capture and replay); FlashAttention 3's "
            "scheduler by its contract, the vendor top-k kernels never called",
            **pages,
        ),
        sglang_impl(
            "runner_step_minicpm_sparse",
            "run_table_rebound",
            name="sglang-minicpm-sparse-table-rebound",
            kind="mutant",
            description=f"installed SGLang's {backend} whose _replay_sparse_graph_metadata "
            "rebinds each compression level's table to the pool's rows instead of copying "
            "them into the graph's buffer: the backend's forward_metadata is right, the "
            "graph reads the capture's table",
            trigger=_trigger_minicpm_sparse_table_rebound,
            reach=_reach_minicpm_sparse_replay,
            smallest=_smallest_minicpm_sparse_table_rebound,
            **pages,
        ),
    ]


def _deepseek_v4() -> Any:
    """The DeepSeek-V4 runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4

    return runner_step_deepseek_v4


def _reach_deepseek_v4_past_window(trace: Trace) -> bool:
    return _deepseek_v4().reach_past_window(trace)


def _smallest_deepseek_v4_swa_lengths_unclamped() -> Trace:
    return _deepseek_v4().smallest_swa_lengths_unclamped()


def _runner_step_deepseek_v4() -> list[Implementation]:
    """SGLang's decode graph runner step on the DeepSeek-V4 backend, and a defect of its
    graph metadata re-created."""
    backend = "layers/attention/deepseek_v4_backend.py:DeepseekV4AttnBackend"
    # Pages of 256 tokens (arg_groups/model_overrides/deepseek_v4.py); any other declined.
    pages = {
        "fixes": {"block_size": 256},
        "declines": sglang.EngineCall("runner_step_deepseek_v4", "declines"),
        "traced": True,
    }
    return [
        sglang_impl(
            "runner_step_deepseek_v4",
            "run",
            name="sglang-deepseek-v4",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (create_dsv4_backend) on a "
            "DeepSeek-V4 model (compress ratios 0, 4, 128; window 128) and "
            "mem_cache/deepseek_v4_memory_pool.py:DeepSeekV4TokenToKVPool with its SWA "
            "allocator, pages of 256 (eager init_forward_metadata of decode, target verify "
            "and extend, init_cuda_graph_state, init_forward_metadata_out_graph at capture "
            "and replay, init_forward_metadata_in_graph run by the graph stand-in at capture "
            "and at each replay; its Triton metadata kernels interpreted, the path a CUDA "
            "GPU takes); FlashMLA, DeepGEMM and three CUDA-only JIT planners stood in by "
            "their contract",
            **pages,
        ),
        sglang_impl(
            "runner_step_deepseek_v4_draft",
            "run",
            name="sglang-deepseek-v4-draft",
            description="installed SGLang: the EAGLE draft after each target step of "
            "sglang-deepseek-v4's engine: speculative/eagle_draft_cuda_graph_runner.py:"
            "EAGLEDraftCudaGraphRunner (as sglang-eagle-draft) over deepseek_v4_backend.py:"
            "DeepseekV4MultiStepBackend as deepseek_v4_trtllm_backend.py's factory makes it "
            "(eager init_forward_metadata, init_cuda_graph_state, "
            "init_forward_metadata_out_graph at capture and replay, "
            "init_forward_metadata_in_graph of every draft step run by the graph stand-in; "
            "each step's slice of the shared out_cache_loc) on the draft's pool (one NextN "
            "layer, SWA only, over the target's full-to-SWA mapping); the draft model's "
            "extend on DeepseekV4AttnBackend; FlashMLA, DeepGEMM and the JIT planners "
            "stood in as for sglang-deepseek-v4",
            fixes={"block_size": 256},
            declines=sglang.EngineCall("runner_step_deepseek_v4_draft", "declines"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_deepseek_v4",
            "run_swa_lengths_unclamped",
            name="sglang-deepseek-v4-swa-lengths-unclamped",
            kind="mutant",
            description=f"installed SGLang's {backend} whose sliding-window lengths are not "
            "clamped to the window (_page_table_positions_kernel's minimum with swa_window "
            "dropped): past 128 keys swa_topk_lengths reaches past the 128 indices FlashMLA "
            "is handed, in every build",
            trigger=_reach_deepseek_v4_past_window,
            reach=_reach_deepseek_v4_past_window,
            smallest=_smallest_deepseek_v4_swa_lengths_unclamped,
            **pages,
        ),
    ]


def _deepseek_v4_hip() -> Any:
    """The DeepSeek-V4 HIP radix runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_deepseek_v4_hip

    return runner_step_deepseek_v4_hip


def _reach_deepseek_v4_hip_decode_replay(trace: Trace) -> bool:
    return _deepseek_v4_hip().reach_decode_replay(trace)


def _trigger_deepseek_v4_hip_out_loc_stale(trace: Trace) -> bool:
    return _deepseek_v4_hip().trigger_out_loc_stale(trace)


def _smallest_deepseek_v4_hip_out_loc_stale() -> Trace:
    return _deepseek_v4_hip().smallest_out_loc_stale()


def _runner_step_deepseek_v4_hip() -> list[Implementation]:
    """SGLang's decode graph runner step on DeepSeek-V4's HIP radix backend (ROCm), and a
    defect of its decode graph's raw metadata re-created."""
    backend = "layers/attention/deepseek_v4_backend_hip_radix.py:DeepseekV4HipRadixBackend"
    # Pages of 256 tokens, as on CUDA (DeepseekV4HipRadixBackend.__init__ asserts them).
    pages = {
        "fixes": {"block_size": 256},
        "declines": sglang.EngineCall("runner_step_deepseek_v4_hip", "declines"),
        "traced": True,
    }
    return [
        sglang_impl(
            "runner_step_deepseek_v4_hip",
            "run",
            name="sglang-deepseek-v4-hip-radix",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (create_dsv4_backend on "
            "ROCm) on the DeepSeek-V4 engine of sglang-deepseek-v4 (eager "
            "init_forward_metadata of decode, target verify and extend, "
            "init_cuda_graph_state, init_forward_metadata_out_graph at capture and replay: "
            "the decode's raw metadata, the verify's whole metadata copied into the "
            "captured one by DSV4Metadata.copy_; init_forward_metadata_in_graph run by the "
            "graph stand-in at capture and at each replay; its Triton metadata kernels "
            "interpreted); the platform an MI300X's (gfx942), three CUDA-only JIT "
            "planners stood in by their contract",
            **pages,
        ),
        sglang_impl(
            "runner_step_deepseek_v4_hip",
            "run_draft",
            name="sglang-deepseek-v4-hip-radix-draft",
            description="installed SGLang: the EAGLE draft after each target step of "
            "sglang-deepseek-v4-hip-radix's engine: speculative/"
            "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner (as "
            "sglang-eagle-draft) over deepseek_v4_backend_hip_radix.py:"
            "DeepseekV4MultiStepBackend (eager init_forward_metadata, init_cuda_graph_state, "
            "init_forward_metadata_out_graph at capture and replay, "
            "init_forward_metadata_in_graph of every draft step run by the graph stand-in) "
            "on the draft's pool (one NextN layer, SWA only, over the target's full-to-SWA "
            "mapping); the draft model's extend on DeepseekV4HipRadixBackend; the platform "
            "an MI300X's",
            fixes={"block_size": 256},
            declines=sglang.EngineCall("runner_step_deepseek_v4_hip", "declines_draft"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_deepseek_v4_hip",
            "run_out_loc_stale",
            name="sglang-deepseek-v4-hip-radix-out-loc-stale",
            kind="mutant",
            description=f"installed SGLang's {backend} whose DSV4RawDecodeMetadata.copy_ "
            "forgets out_cache_loc: the decode graph's recorded metadata derives every "
            "replay's c4_out_loc and c128_out_loc from the capture's zeros, the compressors "
            "writing a completed group into the padding page",
            trigger=_trigger_deepseek_v4_hip_out_loc_stale,
            reach=_reach_deepseek_v4_hip_decode_replay,
            smallest=_smallest_deepseek_v4_hip_out_loc_stale,
            **pages,
        ),
    ]


def _hybrid() -> Any:
    """The hybrid GDN runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_hybrid

    return runner_step_hybrid


def _trigger_hybrid_padding_by_fill(trace: Trace) -> bool:
    return _hybrid().trigger_padding_by_fill(trace)


def _reach_hybrid_verify_replay(trace: Trace) -> bool:
    return _hybrid().reach_verify_replay(trace)


def _smallest_hybrid_padding_by_fill() -> Trace:
    return _hybrid().smallest_padding_by_fill()


def _runner_step_hybrid() -> list[Implementation]:
    """SGLang's decode graph runner step of a hybrid GDN model, and a defect of its
    linear backend's graph metadata re-created."""
    backend = "layers/attention/hybrid_linear_attn_backend.py:HybridLinearAttnBackend"
    # Pages of one token only (arg_groups/mamba_hook.py: validate_mamba_no_buffer).
    declines = sglang.EngineCall("runner_step_hybrid", "declines")
    return [
        sglang_impl(
            "runner_step_hybrid",
            "run",
            name="sglang-hybrid-gdn",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (Triton full attention, "
            "linear/gdn_backend.py:GDNAttnBackend: eager _forward_metadata, "
            "init_cuda_graph_state, _replay_metadata at capture and replay), rows and "
            "state slots in mem_cache/memory_pool.py:HybridReqToTokenPool across steps",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_hybrid",
            "run_padding_by_fill",
            name="sglang-hybrid-gdn-padding-by-fill",
            kind="mutant",
            description=f"installed SGLang's {backend} whose GDN replay counts padding rows "
            "by the seq_lens fill value (_replay_metadata without the runner's "
            "num_padding): a verify's request of one committed token loses its state slot",
            trigger=_trigger_hybrid_padding_by_fill,
            reach=_reach_hybrid_verify_replay,
            smallest=_smallest_hybrid_padding_by_fill,
            declines=declines,
            traced=True,
        ),
    ]


def _lightning() -> Any:
    """The lightning runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_lightning

    return runner_step_lightning


def _reach_lightning_padded_replay(trace: Trace) -> bool:
    return _lightning().reach_padded_replay(trace)


def _trigger_lightning_padding_repeats_last(trace: Trace) -> bool:
    return _lightning().trigger_padding_repeats_last(trace)


def _smallest_lightning_padding_repeats_last() -> Trace:
    return _lightning().smallest_padding_repeats_last()


def _runner_step_lightning() -> list[Implementation]:
    """SGLang's decode graph runner step of a hybrid model whose linear layers are
    Bailing's lightning attention, and a padding defect of its replay re-created."""
    backend = "layers/attention/linear/lightning_backend.py:LightningAttentionBackend"
    # sglang-hybrid-gdn's engine: pages of one token only.
    declines = sglang.EngineCall("runner_step_lightning", "declines")
    return [
        sglang_impl(
            "runner_step_lightning",
            "run",
            name="sglang-hybrid-lightning",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang-hybrid-gdn) over layers/attention/"
            f"hybrid_linear_attn_backend.py:HybridLinearAttnBackend with {backend} (eager "
            "init_forward_metadata: linear/linear_metadata.py:BailingLinearMetadata."
            "prepare_mixed; init_forward_metadata_out_graph at capture and replay: "
            "prepare_decode)",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_lightning",
            "run_padding_repeats_last",
            name="sglang-hybrid-lightning-padding-repeats-last",
            kind="mutant",
            description=f"installed SGLang's {backend} whose replay pads by repeating the "
            "last real row: each padding row names that request's state slot",
            trigger=_trigger_lightning_padding_repeats_last,
            reach=_reach_lightning_padded_replay,
            smallest=_smallest_lightning_padding_repeats_last,
            declines=declines,
            traced=True,
        ),
    ]


def _short_conv() -> Any:
    """The short-conv runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_short_conv

    return runner_step_short_conv


def _reach_short_conv_replay(trace: Trace) -> bool:
    return _short_conv().reach_replay(trace)


def _trigger_short_conv_fresh_indices(trace: Trace) -> bool:
    return _short_conv().trigger_fresh_indices(trace)


def _smallest_short_conv_fresh_indices() -> Trace:
    return _short_conv().smallest_fresh_indices()


def _runner_step_short_conv() -> list[Implementation]:
    """SGLang's decode graph runner step of a short-conv hybrid model (LFM2's, ZAYA1's),
    and a defect of its graph buffer re-created."""
    backend = "layers/attention/linear/short_conv_backend.py:ShortConvAttnBackend"
    # sglang-hybrid-gdn's engine: pages of one token only.
    declines = sglang.EngineCall("runner_step_short_conv", "declines")
    return [
        sglang_impl(
            "runner_step_short_conv",
            "run",
            name="sglang-hybrid-short-conv",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang-hybrid-gdn) over layers/attention/"
            f"hybrid_linear_attn_backend.py:ShortConvHybridAttnBackend with {backend} "
            "(eager init_forward_metadata; init_forward_metadata_out_graph at capture and "
            "replay, _refresh_cache_indices into the graph's buffer; conv_state_metadata, "
            "what the model's conv layers read)",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_short_conv",
            "run_fresh_indices",
            name="sglang-hybrid-short-conv-fresh-indices",
            kind="mutant",
            description=f"installed SGLang's {backend} whose _refresh_cache_indices hands "
            "out a new tensor each step instead of refilling the graph's buffer: a replayed "
            "graph reads the capture's state slots",
            trigger=_trigger_short_conv_fresh_indices,
            reach=_reach_short_conv_replay,
            smallest=_smallest_short_conv_fresh_indices,
            declines=declines,
            traced=True,
        ),
    ]


def _runner_step_kda() -> list[Implementation]:
    """SGLang's decode graph runner step of a Kimi Linear (KDA) hybrid model."""
    return [
        sglang_impl(
            "runner_step_kda",
            "run",
            name="sglang-hybrid-kda",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang-hybrid-gdn) over layers/attention/"
            "hybrid_linear_attn_backend.py:HybridLinearAttnBackend with layers/attention/"
            "linear/kda_backend.py:KDAAttnBackend (__init__, eager init_forward_metadata, "
            "init_forward_metadata_out_graph at capture and replay)",
            # sglang-hybrid-gdn's engine: pages of one token only.
            declines=sglang.EngineCall("runner_step_kda", "declines"),
            traced=True,
        ),
    ]


def _inkling_sconv() -> Any:
    """The Inkling short-conv runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_inkling_sconv

    return runner_step_inkling_sconv


def _reach_inkling_sconv_extend(trace: Trace) -> bool:
    return _inkling_sconv().reach_extend(trace)


def _trigger_inkling_sconv_track_unclamped(trace: Trace) -> bool:
    return _inkling_sconv().trigger_track_unclamped(trace)


def _smallest_inkling_sconv_track_unclamped() -> Trace:
    return _inkling_sconv().smallest_track_unclamped()


def _runner_step_inkling_sconv() -> list[Implementation]:
    """SGLang's decode graph runner step of an Inkling model (its short-conv state
    backend beside full attention), and a defect of its track windows re-created."""
    backend = "layers/attention/linear/inkling_sconv_backend.py:InklingShortConvAttnBackend"
    # The mamba extra buffer Inkling requires: pages dividing the track interval.
    declines = sglang.EngineCall("runner_step_inkling_sconv", "declines")
    return [
        sglang_impl(
            "runner_step_inkling_sconv",
            "run",
            name="sglang-inkling-sconv",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang-hybrid-short-conv) over "
            "inkling_sconv_backend.py:InklingShortConvHybridAttnBackend with Triton and "
            f"{backend} on a HybridReqToTokenPool with the mamba extra buffer (eager "
            "init_forward_metadata; init_forward_metadata_in_graph at capture and replay: "
            "the fused slot gather, decode/verify sconv metadata, track indices; an "
            "extend's fill_track_conv_indices; Triton kernels under the interpreter)",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_inkling_sconv",
            "run_track_unclamped",
            name="sglang-inkling-sconv-track-unclamped",
            kind="mutant",
            description=f"installed SGLang's {backend} whose fill_track_conv_indices "
            "kernel leaves out its clamp to the step's tokens: an extend's untracked or "
            "short request snapshots a conv window at negative token indices",
            trigger=_trigger_inkling_sconv_track_unclamped,
            reach=_reach_inkling_sconv_extend,
            smallest=_smallest_inkling_sconv_track_unclamped,
            declines=declines,
            traced=True,
        ),
    ]


def _runner_step_mamba2() -> list[Implementation]:
    """SGLang's decode graph runner step of a Mamba2 hybrid model."""
    return [
        sglang_impl(
            "runner_step_mamba2",
            "run",
            name="sglang-hybrid-mamba2",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang-hybrid-gdn) over layers/attention/"
            "hybrid_linear_attn_backend.py:HybridLinearAttnBackend with Mamba2AttnBackend "
            "(eager init_forward_metadata: mamba/mamba2_metadata.py:Mamba2Metadata."
            "prepare_mixed; init_forward_metadata_out_graph at capture and replay: "
            "prepare_decode)",
            # sglang-hybrid-gdn's engine: pages of one token only.
            declines=sglang.EngineCall("runner_step_mamba2", "declines"),
            traced=True,
        ),
    ]


def _prefill_graph() -> Any:
    """The prefill-graph runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_prefill_graph

    return runner_step_prefill_graph


def _reach_padded_prefill(trace: Trace) -> bool:
    return _prefill_graph().reach_padded_prefill(trace)


def _smallest_prefill_padding_slot_sentinel() -> Trace:
    return _prefill_graph().smallest_padding_slot_sentinel()


def _trigger_stale_padding_slots(trace: Trace) -> bool:
    return _prefill_graph().trigger_stale_padding_slots(trace)


def _reach_stale_padding_slots(trace: Trace) -> bool:
    return _prefill_graph().reach_stale_padding_slots(trace)


def _smallest_stale_padding_slots() -> Trace:
    return _prefill_graph().smallest_stale_padding_slots()


def _runner_step_prefill_graph() -> list[Implementation]:
    """SGLang's step with its prefill CUDA-graph runner on, and a defect of its padding
    re-created."""
    runner = "runner/prefill_cuda_graph_runner.py:PrefillCudaGraphRunner"
    # No speculative decoding (can_replay_locally refuses a target verify).
    declines = sglang.EngineCall("runner_step_prefill_graph", "declines")
    return [
        sglang_impl(
            "runner_step_prefill_graph",
            "run",
            name="sglang-prefill-graph",
            description=f"installed SGLang: {runner} (__init__ and capture for every "
            "capture size, can_run_graph, load_batch: the token count padded to a capture "
            "size by CudaGraphBufferRegistry.fill_from, the Triton backend's "
            "init_forward_metadata of the step) for the extends it covers, the decode "
            "steps as sglang; a breakable graph stand-in",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_prefill_graph",
            "run_padding_slot_sentinel",
            name="sglang-prefill-graph-padding-slot-sentinel",
            kind="mutant",
            description=f"installed SGLang's {runner} whose buffer registry pads the "
            "padding tokens' out_cache_loc with -1 (vLLM's PAD_SLOT_ID) instead of slot 0: "
            "SGLang's KV write takes no sentinel, a padding token's key is stored off the pool",
            trigger=_reach_padded_prefill,
            reach=_reach_padded_prefill,
            smallest=_smallest_prefill_padding_slot_sentinel,
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_prefill_graph",
            "run_stale_padding_slots",
            name="sglang-prefill-graph-stale-padding-slots",
            kind="mutant",
            description=f"installed SGLang's {runner} whose buffer registry copies the "
            "out_cache_loc of the real tokens only, the padding tokens keeping the previous "
            "replay's slots (FOREACH_COPY instead of ZERO): the padded forward writes a "
            "padding token's key over a live request's cached one (vLLM #36580's class)",
            trigger=_trigger_stale_padding_slots,
            reach=_reach_stale_padding_slots,
            smallest=_smallest_stale_padding_slots,
            declines=declines,
            traced=True,
        ),
    ]


def _fa3_prefill_graph() -> Any:
    """The FA3 FULL prefill-graph runner-step adapter, imported when a mutant's trace is
    judged."""
    from attnfuzz.adapters.sglang import runner_step_fa3_prefill_graph

    return runner_step_fa3_prefill_graph


def _reach_fa3_chunked_prefix(trace: Trace) -> bool:
    return _fa3_prefill_graph().reach_chunked_prefix(trace)


def _trigger_fa3_stale_rounded_chunks(trace: Trace) -> bool:
    return _fa3_prefill_graph().trigger_stale_rounded_chunks(trace)


def _smallest_fa3_stale_rounded_chunks() -> Trace:
    return _fa3_prefill_graph().smallest_stale_rounded_chunks()


def _runner_step_fa3_prefill_graph() -> list[Implementation]:
    """SGLang's step with a FULL prefill CUDA graph on FA3 and its chunked-prefix cache,
    and a defect of the chunk buffers' population re-created."""
    runner = "runner/prefill_cuda_graph_runner.py:PrefillCudaGraphRunner"
    # No speculative decoding (can_replay_locally refuses a target verify).
    declines = sglang.EngineCall("runner_step_fa3_prefill_graph", "declines")
    return [
        sglang_impl(
            "runner_step_fa3_prefill_graph",
            "run",
            name="sglang-fa3-prefill-graph",
            description=f"installed SGLang: {runner} with a FULL graph on an MLA model over "
            "layers/attention/flashattention_backend.py:FlashAttentionBackend (__init__ and "
            "capture of every token count and chunked-prefix variant: "
            "_prepare_chunked_prefix_capture, _populate_chunked_prefix_buffers with the "
            "Triton kernel create_chunked_prefix_cache_kv_indices; can_run_graph; execute: "
            "load_batch's slot-padded buffers, _prepare_chunked_prefix_replay, "
            "_init_full_cg_prefill_metadata) for the extends it covers, the decode steps as "
            "sglang-fa3; a FULL graph stand-in",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_fa3_prefill_graph",
            "run_stale_rounded_chunks",
            name="sglang-fa3-prefill-graph-stale-rounded-chunks",
            kind="mutant",
            description=f"installed SGLang's {runner} whose _populate_chunked_prefix_buffers "
            "refreshes the chunk lengths and offsets of the chunks a batch's prefix reaches "
            "only: a replay rounded up to a larger chunk variant reads its last chunks' "
            "stale lengths over zeroed indices",
            trigger=_trigger_fa3_stale_rounded_chunks,
            reach=_reach_fa3_chunked_prefix,
            smallest=_smallest_fa3_stale_rounded_chunks,
            declines=declines,
            traced=True,
        ),
    ]


def _flashinfer() -> Any:
    """The FlashInfer runner-step adapter, imported when a mutant's case is judged (it
    imports torch, never when the plugin loads)."""
    from attnfuzz.adapters.sglang import runner_step_flashinfer

    return runner_step_flashinfer


def _reach_flashinfer_decode_replay(trace: Trace) -> bool:
    return _flashinfer().reach_decode_replay(trace)


def _reach_flashinfer_verify_replay(trace: Trace) -> bool:
    return _flashinfer().reach_verify_replay(trace)


def _smallest_flashinfer_indptr_off_buffer() -> Trace:
    return _flashinfer().smallest_indptr_off_buffer()


def _smallest_flashinfer_window_forgotten() -> Trace:
    return _flashinfer().smallest_window_forgotten()


def _runner_step_flashinfer() -> list[Implementation]:
    """SGLang's decode graph runner step on the FlashInfer backend, and two of its graph
    metadata's defects re-created."""
    backend = "layers/attention/flashinfer_backend.py:FlashInferAttnBackend"
    return [
        sglang_impl(
            "runner_step_flashinfer",
            "run",
            name="sglang-flashinfer",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} (eager "
            "init_forward_metadata, init_cuda_graph_state, init_forward_metadata_out_graph "
            "at capture and replay; FlashInferIndicesUpdaterDecode/Prefill); flashinfer's "
            "wrappers and fast_decode_plan by their contract where flashinfer is not "
            "built (a recording plan); a graph stand-in",
            traced=True,
        ),
        sglang_impl(
            "runner_step_flashinfer",
            "run_indptr_off_buffer",
            name="sglang-flashinfer-indptr-off-buffer",
            kind="mutant",
            description=f"installed SGLang's {backend} whose decode updater computes a "
            "graph wrapper's kv_indptr off the wrapper's buffer: fast_decode_plan copies "
            "nothing, the replay reads the capture's offsets",
            trigger=_reach_flashinfer_decode_replay,
            reach=_reach_flashinfer_decode_replay,
            smallest=_smallest_flashinfer_indptr_off_buffer,
            traced=True,
        ),
        sglang_impl(
            "runner_step_flashinfer",
            "run_window_forgotten",
            name="sglang-flashinfer-verify-window-forgotten",
            kind="mutant",
            description=f"installed SGLang's {backend} whose graph verify plans the "
            "committed prefix without the draft window (generate_attn_arg_prefill's kv "
            "lengths short by next_n)",
            trigger=_reach_flashinfer_verify_replay,
            reach=_reach_flashinfer_verify_replay,
            smallest=_smallest_flashinfer_window_forgotten,
            traced=True,
        ),
    ]


def _runner_step_flashinfer_mla() -> list[Implementation]:
    """SGLang's decode graph runner step on FlashInfer's MLA backend."""
    backend = "layers/attention/flashinfer_mla_backend.py:FlashInferMLAAttnBackend"
    return [
        sglang_impl(
            "runner_step_flashinfer_mla",
            "run",
            name="sglang-flashinfer-mla",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            f"DecodeCudaGraphRunner (as sglang) over {backend} on a DeepSeek MLA profile "
            "(eager init_forward_metadata: decode, verify, ragged and paged extend; "
            "init_forward_metadata_out_graph at capture and replay, fast_mla_decode_plan "
            "and fast_mla_prefill_plan; FlashInferMLAIndicesUpdaterDecode/Prefill); "
            "flashinfer's MLA and ragged wrappers by their contract where flashinfer is not "
            "built (the plan's schedule in its workspace); a graph stand-in",
            traced=True,
        ),
    ]


def _backends() -> Any:
    """The side-by-side runner-step adapter, imported when a mutant's case is judged."""
    from attnfuzz.adapters.sglang import runner_step_backends

    return runner_step_backends


def _reach_backends_decode(trace: Trace) -> bool:
    return _backends().reach_decode(trace)


def _smallest_backends_flashinfer_decode_kv_short() -> Trace:
    return _backends().smallest_flashinfer_decode_kv_short()


def _runner_step_backends() -> list[Implementation]:
    """SGLang's decode graph runner step on its Triton backend, with the step's eager
    build by its FA3, FlashInfer and TRT-LLM MHA backends beside it, and a defect only
    their agreement catches."""
    return [
        sglang_impl(
            "runner_step_backends",
            "run",
            name="sglang-backends",
            description="installed SGLang: each step as sglang runs it (Triton), and the "
            "step's eager init_forward_metadata on FlashAttentionBackend, "
            "FlashInferAttnBackend and (pages of 16 tokens or more) TRTLLMHAAttnBackend "
            "engines beside it (as sglang-fa3, sglang-flashinfer, sglang-trtllm-mha; no "
            "graph runner): each backend's kv_len and kv_slots, derived from its own "
            "metadata as its kernels read it, against Triton's",
            traced=True,
        ),
        sglang_impl(
            "runner_step_backends",
            "run_flashinfer_decode_kv_short",
            name="sglang-backends-flashinfer-decode-kv-short",
            kind="mutant",
            description="installed SGLang's FlashInferAttnBackend whose decode updater "
            "plans each request's KV one key short (seq_lens - 1) in every build, eager "
            "and graph alike: only another backend's KV length tells",
            trigger=_reach_backends_decode,
            reach=_reach_backends_decode,
            smallest=_smallest_backends_flashinfer_decode_kv_short,
            traced=True,
        ),
    ]


def _runner_step_cpu() -> list[Implementation]:
    """SGLang's attention backends of a CPU server (Intel AMX, torch's SDPA), each step's
    eager build beside the Triton engine's, held to it by agreement across backends."""
    return [
        sglang_impl(
            "runner_step_cpu",
            "run",
            name="sglang-cpu-backends",
            description="installed SGLang: each step as sglang runs it (Triton), and the "
            "step's eager init_forward_metadata on the backends of --device cpu beside it: "
            "layers/attention/intel_amx_backend.py:IntelAMXAttnBackend (its verify's and "
            "extend's extend metadata) and torch_native_backend.py:TorchNativeAttnBackend, "
            "and torch_flex_backend.py:TorchFlexAttnBackend (its block masks' sizes; the "
            "last two take no speculative configs: they have no verify); each backend's "
            "kv_len and kv_slots as its kernels read them, against Triton's",
            traced=True,
        ),
    ]


def _tbo() -> Any:
    """The two-batch overlap runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_tbo

    return runner_step_tbo


def _reach_tbo_extend(trace: Trace) -> bool:
    return _tbo().reach_extend(trace)


def _trigger_tbo_two_chunk_prefix_forgotten(trace: Trace) -> bool:
    return _tbo().trigger_two_chunk_prefix_forgotten(trace)


def _smallest_tbo_two_chunk_prefix_forgotten() -> Trace:
    return _tbo().smallest_two_chunk_prefix_forgotten()


def _runner_step_tbo() -> list[Implementation]:
    """SGLang's decode graph runner step under two-batch overlap (TboAttnBackend: a primary
    and a child backend per micro-batch), and a defect of its two-chunk split re-created."""
    backend = "layers/attention/tbo_backend.py:TboAttnBackend"
    # Decode graphs of an even batch size only (get_batch_sizes_to_capture).
    declines = sglang.EngineCall("runner_step_tbo", "declines")
    return [
        sglang_impl(
            "runner_step_tbo",
            "run",
            name="sglang-tbo",
            description="installed SGLang: runner/decode_cuda_graph_runner.py:"
            "DecodeCudaGraphRunner (as sglang) with --enable-two-batch-overlap "
            f"--moe-a2a-backend deepep: the scheduler's split (TboDPAttentionPreparer, one "
            "rank), batch_overlap/two_batch_overlap.py:TboForwardBatchPreparer's children, "
            f"and {backend} over three Triton backends (eager, capture, replay: "
            "_dispatch_children_from_replay_view); each micro-batch judged against the step "
            "cut to its tokens; a graph stand-in",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_tbo",
            "run_two_chunk_prefix_forgotten",
            name="sglang-tbo-two-chunk-prefix-forgotten",
            kind="mutant",
            description="installed SGLang's two-batch overlap whose two-chunk split leaves the "
            "second micro-batch's first request at its whole-batch prefix: it reads that "
            "request's keys short of the first micro-batch's share",
            trigger=_trigger_tbo_two_chunk_prefix_forgotten,
            reach=_reach_tbo_extend,
            smallest=_smallest_tbo_two_chunk_prefix_forgotten,
            declines=declines,
            traced=True,
        ),
    ]


def _runner_step() -> list[Implementation]:
    return [
        sglang_impl(
            "runner_step",
            "run",
            name="sglang",
            description="installed SGLang: "
            "runner/decode_cuda_graph_runner.py:DecodeCudaGraphRunner (__init__ "
            "and capture for every capture size, can_run_graph, execute / load_batch) "
            "over layers/attention/triton_backend.py:TritonAttnBackend (eager "
            "init_forward_metadata, graph init_forward_metadata_out_graph), rows kept in "
            "mem_cache/memory_pool.py:ReqToTokenPool across steps; a graph stand-in",
            traced=True,
        ),
        *_runner_step_fa3(),
        *_runner_step_xpu(),
        *_runner_step_prefill_decode(),
        *_runner_step_cpu(),
        *_runner_step_tbo(),
        *_runner_step_fa3_tree(),
        *_runner_step_fa3_draft(),
        *_runner_step_fa3_draft_extend(),
        *_runner_step_flashinfer(),
        *_runner_step_flashinfer_mla(),
        *_runner_step_trtllm_mha(),
        *_runner_step_hpc_ops(),
        *_runner_step_aiter(),
        *_runner_step_wave(),
        *_runner_step_qwen_sparse(),
        *_runner_step_minimax_sparse(),
        *_runner_step_minicpm_sparse(),
        *_runner_step_deepseek_v4(),
        *_runner_step_deepseek_v4_hip(),
        *_runner_step_hybrid(),
        *_runner_step_lightning(),
        *_runner_step_short_conv(),
        *_runner_step_inkling_sconv(),
        *_runner_step_mamba2(),
        *_runner_step_kda(),
        *_runner_step_prefill_graph(),
        *_runner_step_fa3_prefill_graph(),
        *_runner_step_backends(),
        sglang_impl(
            "runner_step_draft",
            "run",
            name="sglang-eagle-draft",
            description="installed SGLang: the EAGLE draft after each target step: "
            "speculative/eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner "
            "(__init__ and capture for every capture size, can_run_graph, execute) over "
            "layers/attention/triton_backend.py:TritonMultiStepDraftBackend (eager "
            "init_forward_metadata, graph init_forward_metadata_out_graph, one "
            "TritonAttnBackend a draft step), the draft model's extend after an extend; "
            "rows kept in ReqToTokenPool; a graph and draft-model stand-in",
            declines=sglang.EngineCall("runner_step_draft", "declines"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_draft_extend",
            "run",
            name="sglang-eagle-draft-extend",
            description="installed SGLang: the EAGLE draft extend after each verify: "
            "speculative/eagle_draft_extend_cuda_graph_runner.py:"
            "EAGLEDraftExtendCudaGraphRunner (__init__ and capture for every capture size, "
            "can_run_graph, execute) over the draft model's "
            "layers/attention/triton_backend.py:TritonAttnBackend (eager "
            "init_forward_metadata of DRAFT_EXTEND_V2, graph init_forward_metadata_out_graph), "
            "the draft model's extend after an extend; rows kept in ReqToTokenPool; a graph "
            "and draft-worker stand-in",
            declines=sglang.EngineCall("runner_step_draft_extend", "declines"),
            traced=True,
        ),
        sglang_impl(
            "runner_step_frozen_kv_mtp",
            "run",
            name="sglang-frozen-kv-mtp",
            description="installed SGLang: the Frozen-KV MTP draft after each verify: "
            "speculative/frozen_kv_mtp_cuda_graph_runner.py:FrozenKVMTPCudaGraphRunner "
            "(__init__ and capture for every capture size, can_run_graph, execute) over "
            "speculative/frozen_kv_mtp_worker_v2.py:FrozenKVMTPDraftWorker's metadata "
            "methods (eager _init_frozen_kv_metadata, the graph's capture and replay "
            "metadata, the target's pool through frozen_kv_target_view) and the draft "
            "model runner's layers/attention/triton_backend.py:TritonAttnBackend; the "
            "target's extend after an extend; rows kept in ReqToTokenPool; a graph, "
            "worker-construction and draft-model stand-in",
            declines=sglang.EngineCall("runner_step_frozen_kv_mtp", "declines"),
            traced=True,
        ),
        *_runner_step_multi_layer_eagle(),
        *_runner_step_eagle_worker(),
    ]


def _multi_layer_eagle() -> Any:
    """The multi-layer EAGLE runner-step adapter, imported when a mutant's case is
    judged (it imports torch, never when the plugin loads)."""
    from attnfuzz.adapters.sglang import runner_step_multi_layer_eagle

    return runner_step_multi_layer_eagle


def _trigger_multi_layer_eagle_accept_length_layout(trace: Trace) -> bool:
    return _multi_layer_eagle().trigger_accept_length_layout(trace)


def _reach_multi_layer_eagle_replay(trace: Trace) -> bool:
    return _multi_layer_eagle().reach_verify_replay(trace)


def _smallest_multi_layer_eagle_accept_length_layout() -> Trace:
    return _multi_layer_eagle().smallest_accept_length_layout()


def _runner_step_multi_layer_eagle() -> list[Implementation]:
    """SGLang's multi-layer EAGLE draft extend after each verify, and a defect of its
    padded replay re-created."""
    runner = (
        "speculative/multi_layer_eagle_draft_extend_cuda_graph_runner.py:"
        "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner"
    )
    declines = sglang.EngineCall("runner_step_multi_layer_eagle", "declines")
    return [
        sglang_impl(
            "runner_step_multi_layer_eagle",
            "run",
            name="sglang-multi-layer-eagle",
            description=f"installed SGLang: the multi-layer EAGLE (MTP) draft extend after "
            f"each verify: {runner} (__init__ and each draft layer's capture for every "
            "capture size, can_run_graph, prepare with fill_draft_extend_prepare_buffers, "
            "each layer's replay, rotate_input_ids between layers) over one "
            "layers/attention/triton_backend.py:TritonAttnBackend a draft layer (eager "
            "init_forward_metadata of DRAFT_EXTEND_V2, graph init_forward_metadata_out_graph); "
            "rows kept in ReqToTokenPool; a graph and draft-worker stand-in",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_multi_layer_eagle",
            "run_accept_length_layout",
            name="sglang-multi-layer-eagle-accept-length-layout",
            kind="mutant",
            description=f"installed SGLang's {runner} whose prepare hands every draft "
            "layer's replay the verify's accept counts as the window (pr21987's kind): the "
            "Triton backend's replay reads a prefix of seq_lens - accepted keys, the "
            "unaccepted drafts' slots too",
            trigger=_trigger_multi_layer_eagle_accept_length_layout,
            reach=_reach_multi_layer_eagle_replay,
            smallest=_smallest_multi_layer_eagle_accept_length_layout,
            declines=declines,
            traced=True,
        ),
    ]


def _eagle_worker() -> Any:
    """The EAGLE v2 worker runner-step adapter, imported when a mutant's trace is judged."""
    from attnfuzz.adapters.sglang import runner_step_eagle_worker

    return runner_step_eagle_worker


def _trigger_eagle_worker_stale_draft_slots(trace: Trace) -> bool:
    return _eagle_worker().trigger_stale_draft_slots(trace)


def _reach_eagle_worker_stale_draft_slots(trace: Trace) -> bool:
    return _eagle_worker().reach_stale_draft_slots(trace)


def _smallest_eagle_worker_stale_draft_slots() -> Trace:
    return _eagle_worker().smallest_stale_draft_slots()


def _trigger_eagle_worker_advanced_draft_extend(trace: Trace) -> bool:
    return _eagle_worker().trigger_advanced_draft_extend(trace)


def _smallest_eagle_worker_advanced_draft_extend() -> Trace:
    return _eagle_worker().smallest_advanced_draft_extend()


def _runner_step_eagle_worker() -> list[Implementation]:
    """SGLang's EAGLE v2 worker's own step (draft, verify, draft extend) over the target
    decode, draft and draft-extend graph runners, and a defect of its draft graph's
    padding re-created; the multi-layer worker's step likewise."""
    worker = "speculative/eagle_worker_v2.py:EagleDraftWorker"
    declines = sglang.EngineCall("runner_step_eagle_worker", "declines")
    return [
        sglang_impl(
            "runner_step_eagle_worker",
            "run",
            name="sglang-eagle-worker",
            description="installed SGLang: the EAGLE v2 worker's own step, "
            "speculative/eagle_worker_v2.py:EAGLEWorkerV2.forward_batch_generation of the "
            f"scheduler's batch: {worker}.draft "
            "(prepare_for_draft, draft_forward, build_eagle_verify_input), "
            "speculative/eagle_worker_common.py:run_eagle_verify (eagle_prepare_for_verify, "
            "eagle_sample's greedy verification) and _draft_extend_for_decode after a "
            "verify, _draft_extend_for_prefill after an extend; over the target's "
            "DecodeCudaGraphRunner, EAGLEDraftCudaGraphRunner and "
            "EAGLEDraftExtendCudaGraphRunner and their Triton backends (as sglang, "
            "sglang-eagle-draft, sglang-eagle-draft-extend), each sub-step its builds; a "
            "graph and model stand-in",
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_eagle_worker",
            "run_stale_draft_slots",
            name="sglang-eagle-worker-stale-draft-slots",
            kind="mutant",
            description="installed SGLang's EAGLE v2 worker whose draft graph runner's "
            "execute (speculative/eagle_draft_cuda_graph_runner.py:"
            "EAGLEDraftCudaGraphRunner) pads without buffers.out_cache_loc.zero_(): a "
            "padded replay's padding rows keep the previous replay's draft slots, and each "
            "draft step writes a padding token's key over a live request's",
            trigger=_trigger_eagle_worker_stale_draft_slots,
            reach=_reach_eagle_worker_stale_draft_slots,
            smallest=_smallest_eagle_worker_stale_draft_slots,
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_eagle_worker",
            "run_advanced_draft_extend",
            name="sglang-eagle-worker-advanced-draft-extend",
            kind="mutant",
            description="installed SGLang's EAGLE v2 worker whose own step "
            "(speculative/eagle_worker_v2.py:EAGLEWorkerV2.forward_batch_generation) sets "
            "the next round's batch.seq_lens = batch_output.new_seq_lens (the PP "
            "tail-draft's statement) before _draft_extend_for_decode: the draft extend "
            "counts the accepted tokens twice, and its graph reads keys past the verify's",
            trigger=_trigger_eagle_worker_advanced_draft_extend,
            reach=_trigger_eagle_worker_advanced_draft_extend,
            smallest=_smallest_eagle_worker_advanced_draft_extend,
            declines=declines,
            traced=True,
        ),
        sglang_impl(
            "runner_step_multi_layer_eagle_worker",
            "run",
            name="sglang-multi-layer-eagle-worker",
            description="installed SGLang: the multi-layer EAGLE v2 worker's own step, "
            "speculative/multi_layer_eagle_worker_v2.py:MultiLayerEagleWorkerV2."
            "forward_batch_generation of the scheduler's batch: "
            "MultiLayerEagleDraftWorker.draft "
            "(the chain), _draft_extend_plan_for_decode, run_eagle_verify as its verify "
            "calls it, and _draft_extend_for_decode (the composite draft-extend graph's "
            "prepare and each layer's replay, or each layer's eager forward) after a "
            "verify, _draft_extend_for_prefill after an extend; over the target's "
            "DecodeCudaGraphRunner and one Triton backend a draft layer (as "
            "sglang-multi-layer-eagle), each layer its sub-step's builds; a graph and "
            "model stand-in",
            declines=sglang.EngineCall("runner_step_multi_layer_eagle_worker", "declines"),
            traced=True,
        ),
    ]


def _sites(target: str, impl: str) -> tuple[Site, ...]:
    from attnfuzz.adapters.sglang.sites import sites

    return sites(target, impl)


IMPLEMENTATIONS: dict[str, list[Implementation]] = {
    "dsa-metadata": _dsa_metadata(),
    "graph-input-padding": _graph_input_padding(),
    "mla-block-table": _mla_block_table(),
    "runner-step": _runner_step(),
    "spec-indptr": _spec_indptr(),
}

SGLANG = Engine(
    name=sglang.ENGINE,
    install=sglang.INSTALL,
    installed_version=lambda: sglang.installed_version(),
    unavailable=lambda: sglang.unavailable(),
    status=lambda: sglang.status(),
    implementations=IMPLEMENTATIONS,
    planner=None,
    sites=lambda target, impl: _sites(target, impl),
    shipped_bugs=SHIPPED_BUGS,
)
"""The engine SGLang (the value of the entry point ``sglang``)."""
