"""Which SGLang is installed, and which adapters bind to it.

As for vLLM (:mod:`attnfuzz.adapters.binding`): each adapter names the APIs it
calls (:data:`REQUIRES`), and each is found by looking for it, never decided
from the version number. Where releases offer one computation under two names
(the DSA backend was ``nsa_backend`` before it was ``dsa_backend``; the
CUDA-graph capture and replay pair became ``init_forward_metadata_out_graph``),
an adapter asks :func:`has` which one it meets.

The version is read for two things only: the supported range, and the hint
naming a release that has what a missing API's adapter calls.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
from pathlib import Path

from attnfuzz.adapters import binding
from attnfuzz.adapters.binding import Api, has  # noqa: F401  - the adapters' vocabulary
from attnfuzz.harness.engines import release_key

OLDEST = "0.5.9"
NEWEST = "0.5.23"
"""The supported releases: every release from OLDEST to NEWEST."""
ANY_RELEASE = "ATTNFUZZ_SGLANG_ANY_RELEASE"
"""Set to 1 to bind a release outside the range (a fork, main) by feature detection alone."""
INSTALL_SCRIPT = Path(__file__).with_name("install.sh")
"""Installs a release with the pinned list into any venv (package data)."""


def _configure() -> None:
    from attnfuzz.adapters.sglang import _engine

    _engine.configure_environment()


binding.before_import("sglang", _configure)


def installed_version() -> str | None:
    """The installed SGLang's version, or None (looked up without importing it)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def install_line(release: str) -> str:
    """How to install ``release`` into attnfuzz's venv (a checkout) or any venv."""
    script = shlex.quote(str(INSTALL_SCRIPT))
    return f"ATTNFUZZ_SGLANG={release} ./setup.sh (or {script} VENV {release})"


def range_problem(version: str) -> str | None:
    """Why ``version`` is outside the supported range, or None."""
    if os.environ.get(ANY_RELEASE) == "1":
        return None
    if release_key(OLDEST) <= release_key(version) <= release_key(NEWEST) + (1 << 30,):
        return None
    return (
        f"SGLang {version} is installed; attnfuzz's SGLang adapters support releases "
        f"{OLDEST} to {NEWEST} ({ANY_RELEASE}=1 binds any release by feature detection)"
    )


# -- what the adapters call ----------------------------------------------------------
# adapter module, or "module.function" -> the APIs it calls. Filled by each adapter.
_DECODE_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
_EAGLE_DRAFT_RUNNER = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"
_EAGLE_DRAFT_EXTEND_RUNNER = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"
_FA3 = "sglang.srt.layers.attention.flashattention_backend"
_FLASHINFER = "sglang.srt.layers.attention.flashinfer_backend"
REQUIRES: dict[str, tuple[Api, ...]] = {
    "graph_runner": (
        Api("sglang.srt.model_executor.runner_utils.buffers", "DecodeInputBuffers.create"),
        Api("sglang.srt.model_executor.cuda_graph_buffer_registry", "build_decode_registry"),
        Api(
            "sglang.srt.model_executor.cuda_graph_buffer_registry",
            "CudaGraphBufferRegistry.fill_from",
        ),
        Api("sglang.srt.model_executor.cuda_graph_buffer_registry", "PaddingPolicy.FOREACH_COPY"),
        Api(
            "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
            "build_replay_fb_view",
            keyword="seq_len_fill_value",
        ),
    ),
    "runner_step": (
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
        Api(
            "sglang.srt.layers.attention.triton_backend",
            "TritonAttnBackend.init_forward_metadata_out_graph",
        ),
        Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_fa3": (
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
        Api(_FA3, "FlashAttentionBackend.init_forward_metadata"),
        Api(_FA3, "FlashAttentionBackend.init_cuda_graph_state"),
        Api(_FA3, "FlashAttentionBackend.init_forward_metadata_out_graph", keyword="in_capture"),
        Api(_FA3, "FlashAttentionBackend._apply_cuda_graph_metadata"),
        Api(_FA3, "FlashAttentionBackend._compute_scheduler_metadata"),
        Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_fa3_tree": (
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
        Api(_FA3, "FlashAttentionBackend.init_forward_metadata"),
        Api(_FA3, "FlashAttentionBackend.init_cuda_graph_state"),
        Api(_FA3, "FlashAttentionBackend._apply_cuda_graph_metadata"),
        Api(_FA3, "FlashAttentionBackend._bind_metadata_buffers"),
        Api("sglang.srt.speculative.eagle_info", "EagleVerifyInput"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_fa3_draft": (
        Api(_EAGLE_DRAFT_RUNNER, "EAGLEDraftCudaGraphRunner.capture_one_shape"),
        Api(_EAGLE_DRAFT_RUNNER, "EAGLEDraftCudaGraphRunner.execute"),
        Api(_EAGLE_DRAFT_RUNNER, "resolve_decode_backend"),
        Api(_FA3, "FlashAttentionMultiStepBackend.init_forward_metadata_out_graph"),
        Api(_FA3, "FlashAttentionBackend._spec_read_seq_len_delta"),
        Api(_FA3, "FlashAttentionBackend._set_decode_page_metadata"),
        Api("sglang.kernels.ops.speculative.cache_locs", "assign_draft_cache_locs_contiguous_func"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_fa3_draft_extend": (
        Api(_EAGLE_DRAFT_EXTEND_RUNNER, "EAGLEDraftExtendCudaGraphRunner.execute"),
        Api(_FA3, "FlashAttentionBackend.init_forward_metadata"),
        Api(_FA3, "FlashAttentionBackend._apply_cuda_graph_metadata"),
        Api(_FA3, "FlashAttentionBackend._bind_metadata_buffers"),
        Api("sglang.srt.speculative.eagle_info", "EagleDraftExtendInput"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_flashinfer": (
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
        Api(_FLASHINFER, "FlashInferAttnBackend.init_forward_metadata"),
        Api(_FLASHINFER, "FlashInferAttnBackend.init_cuda_graph_state"),
        Api(
            _FLASHINFER,
            "FlashInferAttnBackend.init_forward_metadata_out_graph",
            keyword="in_capture",
        ),
        Api(_FLASHINFER, "FlashInferAttnBackend._create_decode_wrappers"),
        Api(_FLASHINFER, "FlashInferIndicesUpdaterDecode.call_begin_forward", keyword="plan"),
        Api(_FLASHINFER, "FlashInferIndicesUpdaterPrefill.call_begin_forward", keyword="plan"),
        Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_draft": (
        Api(_EAGLE_DRAFT_RUNNER, "EAGLEDraftCudaGraphRunner.capture_one_shape"),
        Api(_EAGLE_DRAFT_RUNNER, "EAGLEDraftCudaGraphRunner.execute"),
        Api(_EAGLE_DRAFT_RUNNER, "resolve_decode_backend"),
        Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._capture"),
        Api(
            "sglang.srt.layers.attention.triton_backend",
            "TritonMultiStepDraftBackend.init_forward_metadata_out_graph",
        ),
        Api(
            "sglang.kernels.ops.speculative.cache_locs",
            "assign_draft_cache_locs_contiguous_func",
        ),
        Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_own_plan"),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
    "runner_step_draft_extend": (
        Api(_EAGLE_DRAFT_EXTEND_RUNNER, "EAGLEDraftExtendCudaGraphRunner.execute"),
        Api(_EAGLE_DRAFT_EXTEND_RUNNER, "resolve_decode_backend"),
        Api(
            "sglang.srt.layers.attention.triton_backend",
            "TritonAttnBackend._update_draft_extend_buffers",
        ),
        Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    ),
}
_FROZEN_RUNNER = "sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner"
_FROZEN_WORKER = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"
_FROZEN_UTILS = "sglang.srt.speculative.frozen_kv_mtp_utils"
REQUIRES["runner_step_frozen_kv_mtp"] = (
    Api(_FROZEN_RUNNER, "FrozenKVMTPCudaGraphRunner.capture_one_shape"),
    Api(_FROZEN_RUNNER, "FrozenKVMTPCudaGraphRunner.execute"),
    Api(_FROZEN_RUNNER, "resolve_decode_backend"),
    Api(_FROZEN_WORKER, "FrozenKVMTPDraftWorker._init_frozen_kv_metadata"),
    Api(_FROZEN_WORKER, "FrozenKVMTPDraftWorker._init_frozen_kv_metadata_replay_cuda_graph"),
    Api(_FROZEN_UTILS, "set_frozen_kv_positions"),
    Api(_FROZEN_UTILS, "expand_for_topk_draft"),
    Api("sglang.srt.speculative.frozen_kv_mtp_info", "FrozenKVMTPContext"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._capture"),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_own_plan"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_MULTI_LAYER_EAGLE_RUNNER = (
    "sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner"
)
REQUIRES["runner_step_multi_layer_eagle"] = (
    Api(_MULTI_LAYER_EAGLE_RUNNER, "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner.prepare"),
    Api(_MULTI_LAYER_EAGLE_RUNNER, "MultiLayerEagleMultiStepDraftExtendCudaGraphRunner.replay"),
    Api(_MULTI_LAYER_EAGLE_RUNNER, "MultiLayerEagleDraftExtendCudaGraphRunner.capture_one_shape"),
    Api(_MULTI_LAYER_EAGLE_RUNNER, "resolve_decode_backend"),
    Api(_MULTI_LAYER_EAGLE_RUNNER, "get_available_gpu_memory"),
    Api("sglang.srt.speculative.multi_layer_eagle_utils", "rotate_input_ids"),
    Api(
        "sglang.srt.layers.attention.triton_backend",
        "TritonAttnBackend._update_draft_extend_buffers",
    ),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_TRTLLM_MHA = "sglang.srt.layers.attention.trtllm_mha_backend"
REQUIRES["runner_step_trtllm_mha"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._run_in_graph_metadata_prep"),
    Api(_TRTLLM_MHA, "TRTLLMHAAttnBackend.init_forward_metadata"),
    Api(_TRTLLM_MHA, "TRTLLMHAAttnBackend.init_cuda_graph_state"),
    Api(_TRTLLM_MHA, "TRTLLMHAAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_TRTLLM_MHA, "TRTLLMHAAttnBackend._apply_cuda_graph_metadata"),
    Api(
        "sglang.kernels.ops.attention.trtllm_mha_graph_metadata",
        "update_trtllm_mha_graph_metadata",
    ),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_HPC_OPS = "sglang.srt.layers.attention.hpc_ops_backend"
REQUIRES["runner_step_hpc_ops"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._run_in_graph_metadata_prep"),
    Api(_HPC_OPS, "HPCOpsAttnBackend.init_forward_metadata"),
    Api(_HPC_OPS, "HPCOpsAttnBackend.init_cuda_graph_state"),
    Api(_HPC_OPS, "HPCOpsAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_HPC_OPS, "HPCOpsAttnBackend.init_forward_metadata_in_graph"),
    Api(_HPC_OPS, "HPCOpsAttnBackend._assign_decode_tasks"),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_AITER = "sglang.srt.layers.attention.aiter_backend"
# runner_step_aiter: runner_step's engine on the AITER backend (MHA), the names its try:
# block binds where aiter imports bound by the adapter (unified_attention_3d_mtp needs
# aiter to import, so it is not probed here).
REQUIRES["runner_step_aiter"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
    Api(_AITER, "AiterAttnBackend.init_forward_metadata"),
    Api(_AITER, "AiterAttnBackend.init_cuda_graph_state"),
    Api(_AITER, "AiterAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_AITER, "AiterAttnBackend._apply_cuda_graph_metadata", keyword="verify_tokens_per_req"),
    Api(_AITER, "AiterIndicesUpdaterPrefill.update_single_wrapper"),
    Api("sglang.kernels.ops.attention.kv_indices", "create_flashinfer_kv_indices_triton"),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
# runner_step_aiter_mla: runner_step_aiter's engine on an MLA model (no persistent kernel).
REQUIRES["runner_step_aiter_mla"] = REQUIRES["runner_step_aiter"] + (
    Api(_AITER, "AiterMlaIndicesUpdaterPrefill.update_single_wrapper"),
    Api(_AITER, "_use_mla_ps_kernel"),
)
# runner_step_aiter_unified: runner_step_aiter's engine with SGLANG_USE_AITER_UNIFIED_ATTN=1:
# the page-table decode, and the extend's unified forward (its page table built there).
REQUIRES["runner_step_aiter_unified"] = REQUIRES["runner_step_aiter"] + (
    Api(_AITER, "AiterAttnBackend.forward_extend", keyword="save_kv_cache"),
    Api(_AITER, "AiterAttnBackend._forward_extend_unified"),
    Api(_AITER, "AiterAttnBackend._build_extend_unified_page_table"),
    Api("sglang.kernels.ops.attention.kv_indices", "create_flashmla_kv_indices_triton"),
    Api(
        "sglang.kernels.ops.attention.aiter_unified_page_table",
        "scatter_req_to_token_to_page_table_kernel",
    ),
)
_WAVE = "sglang.srt.layers.attention.wave_backend"
# runner_step_wave: runner_step's engine on the Wave backend (ROCm), its device's compute
# units stood in (wave_ops imports wave_lang, stood in by the adapter: not probed here).
REQUIRES["runner_step_wave"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
    Api("sglang.srt.layers.attention.attention_registry", "create_wave_backend"),
    Api(_WAVE, "WaveAttnBackend.init_forward_metadata"),
    Api(_WAVE, "WaveAttnBackend.init_cuda_graph_state"),
    Api(_WAVE, "WaveAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_WAVE, "WaveAttnBackend._apply_cuda_graph_metadata", keyword="seq_lens"),
    Api(_WAVE, "WaveAttnBackend._build_cuda_graph_forward_metadata"),
    Api(_WAVE, "get_device_core_count"),
    Api("sglang.kernels.ops.attention.kv_indices", "create_flashinfer_kv_indices_triton"),
    Api("sglang.kernels.ops.attention.metadata", "get_num_kv_splits_triton"),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_own_plan"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_QSA = "sglang.srt.layers.attention.qwen_sparse_attn_backend"
# runner_step_qwen_sparse: runner_step's engine on the QSA backend (a Qwen4-Exp profile,
# its QSA pool), the replay through the graph-metadata kernels a CUDA GPU runs.
REQUIRES["runner_step_qwen_sparse"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
    Api("sglang.srt.layers.attention.attention_registry", "create_qsa_backend"),
    Api(_QSA, "QwenSparseAttnBackend.init_forward_metadata"),
    Api(_QSA, "QwenSparseAttnBackend.init_cuda_graph_state"),
    Api(_QSA, "QwenSparseAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_QSA, "QwenSparseAttnBackend._replay_cuda_graph_metadata", keyword="num_padding"),
    Api(_QSA, "QwenSparseAttnBackend._can_replay_with_gpu_kernels"),
    Api(_QSA, "QwenSparseAttnBackend._update_qsa_cuda_graph_metadata"),
    Api("sglang.srt.layers.attention.qsa.graph_metadata", "launch_graph_metadata"),
    Api("sglang.srt.layers.attention.qsa.graph_metadata", "supports_graph_metadata_kernels"),
    Api("sglang.srt.mem_cache.qsa_kv_pool", "QSATokenToKVPool"),
    Api(
        "sglang.srt.mem_cache.allocation_sizing",
        "get_req_to_token_extra_context_len",
    ),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_own_plan"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_MINIMAX = "sglang.srt.layers.attention.minimax_sparse_backend"
# runner_step_minimax_sparse: runner_step's engine on a MiniMax-M3 model (Triton beside its
# sparse backend, on ROCm), a verify's rows built in the graph.
REQUIRES["runner_step_minimax_sparse"] = REQUIRES["runner_step"] + (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._run_in_graph_metadata_prep"),
    Api("sglang.srt.layers.attention.attention_registry", "attn_backend_wrapper"),
    Api(_MINIMAX, "MiniMaxHybridAttnBackend.init_forward_metadata_in_graph"),
    Api(_MINIMAX, "MiniMaxSparseAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_MINIMAX, "MiniMaxSparseAttnBackend._init_rocm_linear_verify_metadata"),
    Api(_MINIMAX, "MiniMaxSparseAttnBackend._resolve_extend_meta"),
    Api(_MINIMAX, "is_gfx95_supported"),
    Api("sglang.srt.mem_cache.memory_pool", "MiniMaxSparseKVPool"),
    Api("sglang.srt.mem_cache.memory_pool", "get_minimax_sparse_index_dtype"),
)
_MINICPM = "sglang.srt.layers.attention.minicpm"
# runner_step_minicpm_sparse: runner_step_fa3's engine, the MiniCPM sparse backend layered on
# it (a MiniCPM-SALA profile), its compressed cache reserved from SGLang's allocator.
# runner_step_fa3_local: sglang-fa3's engine on a model with chunked (local) attention.
_LOCAL = "sglang.srt.layers.attention.local_attention"
REQUIRES["runner_step_fa3_local"] = REQUIRES["runner_step_fa3"] + (
    Api(_FA3, "FlashAttentionBackend._maybe_init_local_attn_builder"),
    Api(_LOCAL, "LocalAttentionMetadataBuilder.build_for_capture"),
    Api(_LOCAL, "LocalAttentionMetadataBuilder.update_for_replay"),
    Api(_LOCAL, "make_local_attention_virtual_batches"),
)
# runner_step_flashinfer_mla: the decode graph runner over FlashInfer's MLA backend.
_FLASHINFER_MLA = "sglang.srt.layers.attention.flashinfer_mla_backend"
REQUIRES["runner_step_flashinfer_mla"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_FLASHINFER_MLA, "FlashInferMLAAttnBackend.init_forward_metadata"),
    Api(_FLASHINFER_MLA, "FlashInferMLAAttnBackend._apply_cuda_graph_metadata"),
    Api(
        _FLASHINFER_MLA,
        "FlashInferMLAAttnBackend.init_forward_metadata_out_graph",
        keyword="in_capture",
    ),
    Api(_FLASHINFER_MLA, "FlashInferMLAIndicesUpdaterDecode.call_begin_forward", keyword="plan"),
    Api(_FLASHINFER_MLA, "FlashInferMLAIndicesUpdaterPrefill.call_begin_forward", keyword="plan"),
    Api(_FLASHINFER_MLA, "fast_mla_decode_plan"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
# runner_step_dots: sglang-fa3's engine on a hybrid sliding-window pool, Dots' wrapper on it.
_DOTS = "sglang.srt.layers.attention.dots_hybrid_backend"
REQUIRES["runner_step_dots"] = REQUIRES["runner_step_fa3"] + (
    Api(_DOTS, "wrap_dots_attention_backend"),
    Api(_DOTS, "DotsSWAMLAAttnBackend._init_prefill_metadata"),
    Api(_DOTS, "torch"),
    Api(_FA3, "FlashAttentionBackend._get_swa_write_locations"),
    Api("sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool.translate_loc_from_full_to_swa"),
    Api("sglang.srt.mem_cache.allocator.swa", "SWATokenToKVPoolAllocator.set_full_to_swa_mapping"),
)
# runner_step_fa3_tree.run_swa: the tree verify's merged window keys.
REQUIRES["runner_step_fa3_tree.run_swa"] = (
    Api(_FA3, "FlashAttentionBackend._init_sliding_window_attn_spec_metadata"),
    Api(f"{_FA3}", "prepare_swa_spec_page_table_triton"),
)
REQUIRES["runner_step_minicpm_sparse"] = REQUIRES["runner_step_fa3"] + (
    Api("sglang.srt.layers.attention.attention_registry", "create_minicpm_flashattn_backend"),
    Api(f"{_MINICPM}.backend", "MiniCPMSparseBackend.init_forward_metadata"),
    Api(f"{_MINICPM}.backend", "MiniCPMSparseBackend.init_cuda_graph_state"),
    Api(
        f"{_MINICPM}.backend",
        "MiniCPMSparseBackend.init_forward_metadata_out_graph",
        keyword="in_capture",
    ),
    Api(f"{_MINICPM}.backend", "MiniCPMSparseBackend._replay_sparse_graph_metadata"),
    Api(f"{_MINICPM}.sparse_utils", "MiniCPMSparseMetadata"),
    Api(f"{_MINICPM}.cache", "MiniCPMCompressedCache.alloc_to_lengths"),
    Api("sglang.srt.configs.minicpm", "MiniCPMHybridConfig"),
    Api("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_aux_to_lengths"),
    Api(
        "sglang.srt.mem_cache.allocation_sizing",
        "get_req_to_token_extra_context_len",
    ),
)
_DSV4 = "sglang.srt.layers.attention.deepseek_v4_backend"
_DSV4_KERNELS = "sglang.kernels.ops.attention.dsv4"
# runner_step_deepseek_v4: runner_step's engine on the DeepSeek-V4 backend (its pool and
# SWA allocator), the full metadata built in the graph; the CUDA-only JIT planners stood in.
REQUIRES["runner_step_deepseek_v4"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._run_in_graph_metadata_prep"),
    Api("sglang.srt.layers.attention.attention_registry", "create_dsv4_backend"),
    Api(_DSV4, "DeepseekV4AttnBackend.init_forward_metadata"),
    Api(_DSV4, "DeepseekV4AttnBackend.init_forward_metadata_in_graph"),
    Api(_DSV4, "DeepseekV4AttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_DSV4, "DeepseekV4AttnBackend.replay_cuda_graph_metadata_from", keyword="temp_metadata"),
    Api(_DSV4, "DeepseekV4AttnBackend.make_core_attn_metadata"),
    Api(_DSV4, "DSV4RawDecodeMetadata"),
    Api(_DSV4, "_is_cuda"),
    Api(f"{_DSV4_KERNELS}.attn_metadata_kernels", "_inputs_on_cuda"),
    Api(f"{_DSV4_KERNELS}.compress", "_jit_compress_plan_module"),
    Api(f"{_DSV4_KERNELS}.attn", "_jit_metadata_module"),
    Api(f"{_DSV4_KERNELS}.topk", "_jit_topk_v2_module"),
    Api("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4TokenToKVPool"),
    Api("sglang.srt.mem_cache.allocator.swa", "SWATokenToKVPoolAllocator.set_full_to_swa_mapping"),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_own_plan"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
)
_DSV4 = "sglang.srt.layers.attention.deepseek_v4_backend"
_DSV4_FACTORY = "sglang.srt.layers.attention.deepseek_v4_trtllm_backend"
# runner_step_deepseek_v4_draft: runner_step_deepseek_v4's engine, runner_step_draft's EAGLE
# draft runner, on the CUDA multi-step backend the factory makes.
REQUIRES["runner_step_deepseek_v4_draft"] = (
    REQUIRES["runner_step_deepseek_v4"]
    + REQUIRES["runner_step_draft"]
    + (
        Api(_DSV4_FACTORY, "create_deepseek_v4_multistep_backend"),
        Api(_DSV4_FACTORY, "create_deepseek_v4_attn_backend"),
        Api(_DSV4, "DeepseekV4MultiStepBackend.init_forward_metadata_out_graph"),
        Api(_DSV4, "DeepseekV4MultiStepBackend.init_forward_metadata_in_graph"),
        Api(_DSV4, "_GraphBucket.DECODE_OR_IDLE"),
        Api(
            "sglang.srt.mem_cache.deepseek_v4_memory_pool",
            "DeepSeekV4TokenToKVPool.register_mapping",
        ),
    )
)
_DSV4_HIP = "sglang.srt.layers.attention.deepseek_v4_backend_hip_radix"
# runner_step_deepseek_v4_hip: runner_step_deepseek_v4's engine, the backend ROCm's (HIP
# radix): the platform queries it makes answered as an MI300X, its raw decode copy
# recompiled; its EAGLE draft runner_step_draft's, on the HIP multi-step backend.
REQUIRES["runner_step_deepseek_v4_hip"] = (
    REQUIRES["runner_step_deepseek_v4"]
    + REQUIRES["runner_step_draft"]
    + (
        Api("sglang.srt.layers.attention.attention_registry", "_is_hip"),
        Api(_DSV4_HIP, "DeepseekV4HipRadixBackend.init_forward_metadata"),
        Api(_DSV4_HIP, "DeepseekV4HipRadixBackend.init_forward_metadata_in_graph"),
        Api(
            _DSV4_HIP,
            "DeepseekV4HipRadixBackend.init_forward_metadata_out_graph",
            keyword="in_capture",
        ),
        Api(_DSV4_HIP, "DeepseekV4HipRadixBackend._move_to_device"),
        Api(_DSV4_HIP, "DSV4RawDecodeMetadata.copy_"),
        Api(_DSV4_HIP, "DeepseekV4MultiStepBackend.init_forward_metadata_out_graph"),
        Api(_DSV4_HIP, "DeepseekV4MultiStepBackend.init_forward_metadata_in_graph"),
        Api(_DSV4_HIP, "_GraphBucket.DECODE_OR_IDLE"),
        Api(_DSV4_HIP, "torch"),
        Api("sglang.srt.layers.attention.dsv4.metadata", "is_hip"),
        Api("sglang.srt.layers.attention.dsv4.unified_kv_gate", "is_hip"),
        Api("sglang.srt.layers.attention.dsv4.compressor_v2", "_is_hip"),
        Api("sglang.srt.mem_cache.deepseek_v4_memory_pool", "_is_hip"),
        Api(
            "sglang.srt.mem_cache.deepseek_v4_memory_pool",
            "DeepSeekV4TokenToKVPool.register_mapping",
        ),
        Api("sglang.srt.utils", "is_hip"),
    )
)
_XPU = "sglang.srt.layers.attention.xpu_backend"
# runner_step_xpu: runner_step_fa3's engine (its FA3 metadata), the backend Intel XPU's.
REQUIRES["runner_step_xpu"] = (
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner.load_batch"),
    Api(_DECODE_RUNNER, "DecodeCudaGraphRunner._init_replay_attn_metadata_from_view"),
    Api("sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_runner_slots"),
    Api("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool.alloc_rows"),
    Api(_XPU, "XPUAttentionBackend.init_forward_metadata"),
    Api(_XPU, "XPUAttentionBackend.init_cuda_graph_state"),
    Api(_XPU, "XPUAttentionBackend.init_forward_metadata_out_graph", keyword="in_capture"),
)
_HYBRID_LINEAR = "sglang.srt.layers.attention.hybrid_linear_attn_backend"
# What runner_step_hybrid's engine calls whichever its linear backend: the hybrid
# backend's out-of-graph fan-out, the base class's metadata, the pool's state slots.
_HYBRID_ENGINE = REQUIRES["runner_step"] + (
    Api(_HYBRID_LINEAR, "HybridLinearAttnBackend.init_forward_metadata_out_graph"),
    Api(_HYBRID_LINEAR, "MambaAttnBackendBase._replay_metadata", keyword="num_padding"),
    Api(_HYBRID_LINEAR, "MambaAttnBackendBase._forward_metadata"),
    Api("sglang.srt.mem_cache.memory_pool", "HybridReqToTokenPool.free_mamba_cache"),
)
REQUIRES["runner_step_hybrid"] = _HYBRID_ENGINE + (
    Api("sglang.srt.layers.attention.linear.gdn_backend", "GDNAttnBackend.init_cuda_graph_state"),
    Api(
        "sglang.srt.layers.attention.linear.utils",
        "select_verify_intermediate_state_indices",
    ),
)
_LIGHTNING = "sglang.srt.layers.attention.linear.lightning_backend"
# runner_step_lightning: runner_step_hybrid's engine, the linear layers Bailing's lightning.
REQUIRES["runner_step_lightning"] = _HYBRID_ENGINE + (
    Api(_LIGHTNING, "LightningAttentionBackend.init_forward_metadata"),
    Api(_LIGHTNING, "LightningAttentionBackend.init_forward_metadata_out_graph"),
    Api(
        "sglang.srt.layers.attention.linear.linear_metadata",
        "BailingLinearMetadata.prepare_mixed",
    ),
)
_SHORT_CONV = "sglang.srt.layers.attention.linear.short_conv_backend"
# runner_step_short_conv: runner_step_hybrid's engine, the linear layers short convolutions.
REQUIRES["runner_step_short_conv"] = _HYBRID_ENGINE + (
    Api(_HYBRID_LINEAR, "ShortConvHybridAttnBackend.conv_state_metadata"),
    Api(_SHORT_CONV, "ShortConvAttnBackend.init_forward_metadata"),
    Api(_SHORT_CONV, "ShortConvAttnBackend.init_forward_metadata_out_graph", keyword="in_capture"),
    Api(_SHORT_CONV, "ShortConvAttnBackend._refresh_cache_indices"),
    Api(_SHORT_CONV, "ShortConvAttnBackend.conv_state_metadata"),
)
_INKLING = "sglang.srt.layers.attention.linear.inkling_sconv_backend"
# runner_step_inkling_sconv: runner_step_short_conv's engine, Inkling's conv-state backend
# (its metadata written in the graph), the mamba extra buffer and its Triton kernels.
REQUIRES["runner_step_inkling_sconv"] = REQUIRES["runner_step_short_conv"] + (
    Api(_INKLING, "InklingShortConvHybridAttnBackend.init_forward_metadata_in_graph"),
    Api(_INKLING, "InklingShortConvAttnBackend._prepare_slot_indices"),
    Api(_INKLING, "InklingShortConvAttnBackend._refresh_track_conv_indices"),
    Api(_INKLING, "InklingShortConvAttnBackend.conv_state_metadata"),
    Api("sglang.srt.configs.inkling", "InklingConvCacheParams"),
    Api("sglang.srt.models.inkling_common.kernels.sconv", "fused_extend_sconv_metadata"),
    Api("sglang.kernels.ops.mamba.sconv_tracking", "fill_track_conv_indices"),
    Api("sglang.srt.runtime_context", "mamba_checkpoint_grid"),
)
# runner_step_mamba2: runner_step_hybrid's engine, the linear layers Mamba2's.
REQUIRES["runner_step_mamba2"] = _HYBRID_ENGINE + (
    Api(_HYBRID_LINEAR, "Mamba2AttnBackend.init_forward_metadata"),
    Api(_HYBRID_LINEAR, "Mamba2AttnBackend.init_forward_metadata_out_graph"),
    Api("sglang.srt.layers.attention.mamba.mamba2_metadata", "Mamba2Metadata.prepare_mixed"),
)
# runner_step_kda: runner_step_hybrid's engine, the linear layers Kimi Delta Attention.
REQUIRES["runner_step_kda"] = REQUIRES["runner_step_hybrid"] + (
    Api("sglang.srt.layers.attention.linear.kda_backend", "KDAAttnBackend.init_forward_metadata"),
)
_PREFILL_RUNNER = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
REQUIRES["runner_step_prefill_graph"] = REQUIRES["runner_step"] + (
    Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner.load_batch"),
    Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner.can_run_graph"),
    Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner._prepare_forward_metadata_for_replay"),
    Api(_PREFILL_RUNNER, "resolve_prefill_backend"),
    Api(_PREFILL_RUNNER, "graph_capture"),
    Api(_PREFILL_RUNNER, "get_or_create_global_graph_capture_stream"),
    Api(
        "sglang.srt.model_executor.cuda_graph_buffer_registry",
        "CudaGraphBufferRegistry.fill_from",
        keyword="padded_num_tokens",
    ),
    Api(
        "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend",
        "BreakableCudaGraphBackend",
    ),
)
# runner_step_fa3_prefill_graph.py: the prefill runner's FULL graph and chunked-prefix
# capture on FA3 (an MLA model), the decode steps as runner_step_fa3.
REQUIRES["runner_step_fa3_prefill_graph"] = (
    REQUIRES["runner_step_prefill_graph"]
    + REQUIRES["runner_step_fa3"]
    + (
        Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner._populate_chunked_prefix_buffers"),
        Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner._prepare_chunked_prefix_replay"),
        Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner.capture_prepare"),
        Api(_PREFILL_RUNNER, "PrefillCudaGraphRunner.execute"),
        Api(_FA3, "FlashAttentionBackend._init_full_cg_prefill_metadata"),
        Api(_FA3, "FlashAttentionBackend.supports_full_cuda_graph_chunked_prefix"),
        Api(
            "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend",
            "FullCudaGraphBackend",
        ),
        Api(
            "sglang.srt.model_executor.model_runner_components.misc_utils",
            "maybe_disable_chunked_prefix_cache",
        ),
    )
)
# runner_step_backends.py runs the Triton, FA3, FlashInfer, TRT-LLM MHA and AITER runner
# steps side by side.
REQUIRES["runner_step_backends"] = (
    REQUIRES["runner_step"]
    + REQUIRES["runner_step_fa3"]
    + REQUIRES["runner_step_flashinfer"]
    + REQUIRES["runner_step_trtllm_mha"]
    + REQUIRES["runner_step_aiter"]
)
# runner_step_prefill_decode.py: the Triton and FA3 engines' backends, under the wrapper
# SGLang builds when the prefill and decode backends differ.
_HYBRID_ATTN = "sglang.srt.layers.attention.hybrid_attn_backend"
REQUIRES["runner_step_prefill_decode"] = (
    REQUIRES["runner_step"]
    + REQUIRES["runner_step_fa3"]
    + (
        Api(_HYBRID_ATTN, "HybridAttnBackend._select_backend"),
        Api(_HYBRID_ATTN, "HybridAttnBackend.init_forward_metadata"),
        Api(_HYBRID_ATTN, "HybridAttnBackend.init_cuda_graph_state"),
        Api(
            _HYBRID_ATTN,
            "HybridAttnBackend.init_forward_metadata_out_graph",
            keyword="in_capture",
        ),
        Api(_HYBRID_ATTN, "HybridAttnBackend.__init__", keyword="prefill_backend"),
    )
)
# runner_step_cpu.py: the Triton engine, and the CPU backends' eager metadata beside it.
REQUIRES["runner_step_cpu"] = REQUIRES["runner_step"] + (
    Api(
        "sglang.srt.layers.attention.intel_amx_backend", "IntelAMXAttnBackend.init_forward_metadata"
    ),
    Api(
        "sglang.srt.layers.attention.intel_amx_backend",
        "IntelAMXAttnBackend._build_extend_metadata",
    ),
    Api(
        "sglang.srt.layers.attention.intel_amx_backend",
        "IntelAMXAttnBackend.get_cpu_graph_seq_len_fill_value",
    ),
    Api(
        "sglang.srt.layers.attention.torch_native_backend",
        "TorchNativeAttnBackend.init_forward_metadata",
    ),
    Api(
        "sglang.srt.layers.attention.torch_flex_backend",
        "TorchFlexAttnBackend.init_forward_metadata",
    ),
)
# runner_step_tbo.py: the Triton engine under two-batch overlap, split as the scheduler does.
_TBO = "sglang.srt.batch_overlap.two_batch_overlap"
_TBO_BACKEND = "sglang.srt.layers.attention.tbo_backend"
REQUIRES["runner_step_tbo"] = REQUIRES["runner_step"] + (
    Api(_TBO, "TboDPAttentionPreparer.prepare_all_gather"),
    Api(_TBO, "TboDPAttentionPreparer.compute_output"),
    Api(_TBO, "TboForwardBatchPreparer.prepare"),
    Api(_TBO, "TboForwardBatchPreparer.derive_fields_related_to_seq_len_for_two_chunk"),
    Api(_TBO, "compute_split_indices_for_cuda_graph_replay"),
    Api(_TBO, "_is_two_chunk_split_enabled"),
    Api(_TBO, "_update_device_and_sum_field_from_cpu_field"),
    Api(_TBO_BACKEND, "TboAttnBackend.init_new"),
    Api(_TBO_BACKEND, "TboAttnBackend._dispatch_children_from_replay_view"),
    Api("sglang.srt.layers.moe.utils", "initialize_moe_config"),
    Api("sglang.srt.model_executor.forward_context", "forward_context"),
    Api("sglang.srt.managers.scheduler_components.dp_attn", "_local_decode_cuda_graph_vote"),
)
# runner_step_eagle_worker.py drives the EAGLE v2 worker over the target decode, draft and
# draft-extend graph runners, as the three adapters before it build them.
_EAGLE_WORKER = "sglang.srt.speculative.eagle_worker_v2"
_EAGLE_COMMON = "sglang.srt.speculative.eagle_worker_common"
REQUIRES["runner_step_eagle_worker"] = (
    REQUIRES["runner_step"]
    + REQUIRES["runner_step_draft"]
    + REQUIRES["runner_step_draft_extend"]
    + (
        Api(_EAGLE_WORKER, "EAGLEWorkerV2.forward_batch_generation"),
        Api(_EAGLE_WORKER, "EAGLEWorkerV2._forward_prefill_batch"),
        Api(_EAGLE_WORKER, "EAGLEWorkerV2.verify"),
        Api("sglang.srt.configs.draft_parallel", "DraftParallelLayout"),
        Api(_EAGLE_WORKER, "EagleDraftWorker.draft"),
        Api(_EAGLE_WORKER, "EagleDraftWorker.draft_forward"),
        Api(_EAGLE_WORKER, "EagleDraftWorker._draft_extend_for_decode"),
        Api(_EAGLE_WORKER, "EagleDraftWorker._draft_extend_for_prefill"),
        Api(_EAGLE_WORKER, "EagleDraftWorker._rebuild_topk1_chain_buffers"),
        Api(_EAGLE_COMMON, "run_eagle_verify", keyword="metadata_ready_pre_pad"),
        Api(_EAGLE_COMMON, "run_eagle_verify", keyword="finalize_tree_path"),
        Api("sglang.srt.speculative.eagle_utils", "eagle_sample"),
        # The Triton paths of the tree build, greedy verify and verify slots (XPU's).
        Api("sglang.kernels.ops.speculative.spec_tree", "_is_xpu"),
        Api("sglang.kernels.ops.speculative.cache_locs", "_is_xpu"),
    )
)
_MULTI_LAYER_WORKER = "sglang.srt.speculative.multi_layer_eagle_worker_v2"
REQUIRES["runner_step_multi_layer_eagle_worker"] = (
    REQUIRES["runner_step"]
    + REQUIRES["runner_step_multi_layer_eagle"]
    + (
        Api(_MULTI_LAYER_WORKER, "MultiLayerEagleWorkerV2.forward_batch_generation"),
        Api(_MULTI_LAYER_WORKER, "MultiLayerEagleWorkerV2.verify"),
        Api("sglang.srt.configs.draft_parallel", "DraftParallelLayout"),
        Api(_MULTI_LAYER_WORKER, "MultiLayerEagleDraftWorker.draft"),
        Api(_MULTI_LAYER_WORKER, "MultiLayerEagleDraftWorker._draft_extend_plan_for_decode"),
        Api(
            _MULTI_LAYER_WORKER,
            "MultiLayerEagleDraftWorker._draft_extend_for_decode",
            keyword="staged",
        ),
        Api(_MULTI_LAYER_WORKER, "MultiLayerEagleDraftWorker._draft_extend_for_prefill"),
        Api(_MULTI_LAYER_WORKER, "MultiLayerEagleDraftWorker._rebuild_topk1_chain_buffers"),
        Api(_EAGLE_COMMON, "run_eagle_verify", keyword="finalize_tree_path"),
        Api("sglang.kernels.ops.speculative.spec_tree", "_is_xpu"),
        Api("sglang.kernels.ops.speculative.cache_locs", "_is_xpu"),
    )
)

# adapters/sglang/triton_backend.py
_TRITON = "sglang.srt.layers.attention.triton_backend"
TRITON_BACKEND = Api(_TRITON, "TritonAttnBackend.init_forward_metadata")
TRITON_GRAPH = Api(_TRITON, "TritonAttnBackend.init_forward_metadata_out_graph")
TRITON_GRAPH_IN = Api(_TRITON, "TritonAttnBackend.init_forward_metadata_in_graph")
TRITON_DRAFT_EXTEND_BUFFERS = Api(
    _TRITON, "TritonAttnBackend._update_draft_extend_buffers", since="0.5.13"
)  # #27545's fix came with it: before, the bug is the release's own line (no fix to revert)
TRITON_DRAFT_EXTEND_BUFFERS_PLAN = Api(
    _TRITON, "TritonAttnBackend._update_draft_extend_buffers", keyword="plan"
)
# The pair before init_forward_metadata_out_graph (0.5.12 and older).
TRITON_CAPTURE_OLD = Api(_TRITON, "TritonAttnBackend.init_forward_metadata_capture_cuda_graph")
TRITON_REPLAY_OLD = Api(_TRITON, "TritonAttnBackend.init_forward_metadata_replay_cuda_graph")
KV_INDEX_TRANSLATOR = Api(
    "sglang.srt.mem_cache.kv_index_translator", "KVIndexTranslator.bind_own_plan"
)
EAGLE_INPUTS = Api("sglang.srt.speculative.eagle_info", "EagleDraftExtendInput")
REPLAY_FB_VIEW = Api(
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner", "build_replay_fb_view"
)
REPLAY_FB_VIEW_GLOBAL = Api(REPLAY_FB_VIEW.module, REPLAY_FB_VIEW.attr, "global_num_tokens_cpu")
OLD_REPLAY_FB_VIEW = Api("sglang.srt.model_executor.cuda_graph_runner", "build_replay_fb_view")
DRAFT_EXTEND_FILL = Api(
    "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
    "resolve_draft_extend_seq_len_fill_value",
)
REQUIRES.update(
    {
        # The graph pair and the translator are bound in either form (ALTERNATIVES).
        "triton_backend": (TRITON_BACKEND, EAGLE_INPUTS),
        "triton_backend.upstream_pr27545_draft_extend_stride": (TRITON_DRAFT_EXTEND_BUFFERS,),
    }
)


# adapters/sglang/dsa_backend.py
_DSA = "sglang.srt.layers.attention.dsa_backend"
DSA_BACKEND = Api(_DSA, "DeepseekSparseAttnBackend.init_forward_metadata")
DSA_GRAPH = Api(_DSA, "DeepseekSparseAttnBackend.init_forward_metadata_out_graph")
DSA_APPLY = Api(_DSA, "DeepseekSparseAttnBackend._apply_cuda_graph_metadata")
DSA_FUSED = Api("sglang.kernels.ops.attention.dsa.metadata", "fused_dsa_target_verify_metadata")
DSA_EXPAND = Api("sglang.kernels.ops.attention.pad", "seqlens_expand_triton")
# 0.5.9 and 0.5.10: the backend was nsa_backend.py's NativeSparseAttnBackend (its
# metadata's fields and the server arguments nsa_*), the graph metadata the pair
# init_forward_metadata_capture_cuda_graph / _replay_cuda_graph.
_NSA = "sglang.srt.layers.attention.nsa_backend"
NSA_BACKEND = Api(_NSA, "NativeSparseAttnBackend.init_forward_metadata")
NSA_CAPTURE = Api(_NSA, "NativeSparseAttnBackend.init_forward_metadata_capture_cuda_graph")
NSA_REPLAY = Api(
    _NSA, "NativeSparseAttnBackend.init_forward_metadata_replay_cuda_graph", "seq_lens_cpu"
)
DSA_SERVER_ARGS = Api("sglang.srt.server_args", "ServerArgs.dsa_decode_backend")
REQUIRES["dsa_backend"] = ()  # either form (ALTERNATIVES)
REQUIRES["dsa_backend.run_fused"] = (DSA_FUSED,)
REQUIRES["dsa_backend.upstream_pr19016_context_len_table"] = (DSA_FUSED,)


# adapters/sglang/trtllm_mla.py
_TRTLLM_MLA = "sglang.srt.layers.attention.trtllm_mla_backend"
TRTLLM_MLA_BACKEND = Api(_TRTLLM_MLA, "TRTLLMMLABackend.init_forward_metadata")
TRTLLM_MLA_GRAPH = Api(_TRTLLM_MLA, "TRTLLMMLABackend.init_forward_metadata_out_graph")
KV_INDICES_KERNELS = (
    Api("sglang.kernels.ops.attention.kv_indices", "create_flashmla_kv_indices_triton"),
    Api("sglang.kernels.ops.attention.kv_indices", "get_num_kv_index_blocks_flashmla"),
)
# 0.5.9 and 0.5.10 (#21987 shipped in 0.5.9, fixed in 0.5.10): the graph metadata is the
# pair init_forward_metadata_capture_cuda_graph / _replay_cuda_graph, the backend reads
# model_runner.server_args, and a draft extend's spec_info is EagleDraftInput carrying
# the verify's accept counts as accept_length.
TRTLLM_MLA_CAPTURE_OLD = Api(
    _TRTLLM_MLA, "TRTLLMMLABackend.init_forward_metadata_capture_cuda_graph"
)
TRTLLM_MLA_REPLAY_OLD = Api(
    _TRTLLM_MLA, "TRTLLMMLABackend.init_forward_metadata_replay_cuda_graph", "seq_lens_cpu"
)
EAGLE_DRAFT_ACCEPT_LENGTH = Api(
    "sglang.srt.speculative.eagle_info", "EagleDraftInput.accept_length"
)
REQUIRES["trtllm_mla"] = (TRTLLM_MLA_BACKEND,)  # the graph pair in either form (ALTERNATIVES)
# #21987 reverted is re-created in init_forward_metadata_out_graph's replay: where the
# release has the old pair (0.5.9 ships the bug, 0.5.10 the fix), it refuses.
REQUIRES["trtllm_mla.upstream_pr21987_accept_length_layout"] = (
    Api(TRTLLM_MLA_GRAPH.module, TRTLLM_MLA_GRAPH.attr, since="0.5.23"),
    *KV_INDICES_KERNELS,
)
TRTLLM_MLA_FORMS = (
    (  # 0.5.2x
        TRTLLM_MLA_GRAPH,
        Api(_TRTLLM_MLA, "TRTLLMMLABackend._apply_cuda_graph_metadata"),
        Api(_TRTLLM_MLA, "_jit_fixup_module"),  # stood in while the backend is built
        *KV_INDICES_KERNELS,
        KV_INDEX_TRANSLATOR,
        EAGLE_INPUTS,
        REPLAY_FB_VIEW_GLOBAL,
        DRAFT_EXTEND_FILL,
    ),
    (TRTLLM_MLA_CAPTURE_OLD, TRTLLM_MLA_REPLAY_OLD, EAGLE_DRAFT_ACCEPT_LENGTH),  # 0.5.9, 0.5.10
)

# adapters/sglang/flashmla.py: trtllm_mla.py's runner and steps (its 0.5.2x form) over
# FlashMLA's graph metadata, called as 0.5.2x's runners call it.
_FLASHMLA = "sglang.srt.layers.attention.flashmla_backend"
_FLASH_MLA_WHEEL = "attnfuzz.adapters.sglang.flashmla:vendor"  # the wheel, or its stand-in
REQUIRES["flashmla"] = (
    *(
        Api(_FLASHMLA, f"FlashMLABackend.{name}", keyword=keyword, within=_FLASH_MLA_WHEEL)
        for name, keyword in (
            ("init_forward_metadata", ""),
            ("init_cuda_graph_state", ""),
            ("init_forward_metadata_out_graph", "in_capture"),
            ("_apply_decode_target_verify_metadata", ""),
        )
    ),
    *TRTLLM_MLA_FORMS[0][2:],
)


# adapter module -> forms it binds, one of which must be there in full (the first
# is the newest; the adapter asks has() which it meets).
# adapters/sglang/graph_runner.py, 0.5.11 and 0.5.12: no buffer registry, the runner's
# DecodeInputBuffers (cuda_graph_runner.py) filled by populate_from_forward_batch.
DECODE_REGISTRY = Api(
    "sglang.srt.model_executor.cuda_graph_buffer_registry", "build_decode_registry"
)
_OLD_RUNNER = "sglang.srt.model_executor.cuda_graph_runner"
DECODE_POPULATE = Api(_OLD_RUNNER, "DecodeInputBuffers.populate_from_forward_batch")
DECODE_BUFFERS_SWA = Api(_OLD_RUNNER, "DecodeInputBuffers.create", "is_hybrid_swa")
GRAPH_RUNNER_REGISTRY = REQUIRES.pop("graph_runner")  # 0.5.14 on, one of three
# 0.5.13: the registry, over the buffers cuda_graph_runner.py's _allocate_decode_buffers
# makes, and that module's build_replay_fb_view.
GRAPH_RUNNER_REGISTRY_0_5_13 = (
    Api(_OLD_RUNNER, "_allocate_decode_buffers"),
    *GRAPH_RUNNER_REGISTRY[1:4],
    Api(_OLD_RUNNER, "build_replay_fb_view", keyword="seq_len_fill_value"),
)
# #24743 reverted is re-created in the registry's fill: where the runner populates its
# own buffers (0.5.11 ships the bug, 0.5.12 the fix), it refuses.
REQUIRES["graph_runner.upstream_stale_swa_slots"] = GRAPH_RUNNER_REGISTRY

ALTERNATIVES: dict[str, tuple[tuple[Api, ...], ...]] = {
    "graph_runner": (
        GRAPH_RUNNER_REGISTRY,
        GRAPH_RUNNER_REGISTRY_0_5_13,
        (DECODE_POPULATE, DECODE_BUFFERS_SWA),  # 0.5.11, 0.5.12
    ),
    "dsa_backend": (
        (DSA_BACKEND, DSA_GRAPH, DSA_APPLY, DSA_EXPAND, REPLAY_FB_VIEW),  # 0.5.2x
        (NSA_BACKEND, NSA_CAPTURE, NSA_REPLAY),  # 0.5.9, 0.5.10
    ),
    "trtllm_mla": TRTLLM_MLA_FORMS,
    "triton_backend": (
        (TRITON_GRAPH, TRITON_GRAPH_IN, REPLAY_FB_VIEW),  # 0.5.2x
        (TRITON_GRAPH, TRITON_GRAPH_IN, OLD_REPLAY_FB_VIEW),  # 0.5.13
        (TRITON_CAPTURE_OLD, TRITON_REPLAY_OLD),  # 0.5.12 and older
    ),
}


def requirements(module: str, attr: str) -> tuple[Api, ...]:
    return REQUIRES.get(module, ()) + REQUIRES.get(f"{module}.{attr}", ())


def alternatives_problem(module: str) -> str | None:
    """Why none of ``module``'s forms (:data:`ALTERNATIVES`) is there in full, or None."""
    forms = ALTERNATIVES.get(module, ())
    whys = [next((w for a in form if (w := a.missing()) is not None), None) for form in forms]
    if not forms or any(why is None for why in whys):
        return None
    return whys[0]


def binding_problem(module: str, attr: str, version: str) -> str | None:
    """Why ``adapters.sglang.<module>.<attr>`` cannot bind to the installed SGLang
    (``version``), in one line naming the missing API and a release that has
    all it calls; None when it binds."""
    problem = range_problem(version)
    if problem is not None:
        return problem
    apis = requirements(module, attr)
    for api in apis:
        why = api.missing()
        if why is not None:
            hint = binding.install_hint("SGLang", apis, version, why, install_line)
            return f"SGLang {version}: {why}{hint}"
    why = alternatives_problem(module)
    if isinstance(why, binding.ImportFailed):
        return f"SGLang {version}: {why}"
    if why is not None:
        return f"SGLang {version}: {why} (nor any older form of it)"
    return None
