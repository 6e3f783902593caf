"""Which vLLM is installed, and which adapters bind to it: the one compatibility layer.

The adapters call vLLM's internals, and those move between releases. Nothing
here decides what a release offers from its version number: each adapter
names the APIs it calls (:data:`REQUIRES`), and each API is found by looking
(:class:`Api`: a module that imports, an attribute, a keyword a signature
takes). Where releases offer one computation in two forms, the adapter asks
:func:`has` which one it meets, and names both as alternatives here.

The version is read for three things only: the supported range (a release
outside it is refused, whatever it offers: the adapters were never run on it),
the hint that names the first release with a missing API, so that
``attnfuzz list`` can say which release to install, and what a configuration
allows in each range of releases (:data:`PCP_RELEASES`): a validation in the
engine's config, which no API's presence tells, read from each release's source.

The CPU platform on every release is :mod:`attnfuzz.adapters.vllm_platform`, a
vLLM platform plugin (its own module: vLLM imports it whenever it starts).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shlex
from pathlib import Path

from attnfuzz.adapters import binding
from attnfuzz.adapters.binding import Api, _missing, has  # noqa: F401  - compat.Api, as before
from attnfuzz.harness.callers import Releases
from attnfuzz.harness.engines import release_key  # noqa: F401  - compat.release_key, as before

OLDEST = "0.21.0"
NEWEST = "0.33.0"
"""The supported releases: every release from OLDEST to NEWEST's minor series."""
ANY_RELEASE = "ATTNFUZZ_VLLM_ANY_RELEASE"
"""Set to 1 to bind a release outside the range (a fork, main) by feature detection alone."""


def installed_version() -> str | None:
    """The installed vLLM's version, or None (looked up without importing it)."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


INSTALL_SCRIPT = Path(__file__).with_name("install.sh")
"""Installs a release with its range's pinned list into any venv (package data)."""


def install_line(release: str) -> str:
    """How to install ``release`` into attnfuzz's venv (a checkout) or any venv."""
    script = shlex.quote(str(INSTALL_SCRIPT))
    return f"ATTNFUZZ_VLLM={release} ./setup.sh (or {script} VENV {release})"


def range_problem(version: str) -> str | None:
    """Why ``version`` is outside the supported range, or None."""
    if os.environ.get(ANY_RELEASE) == "1":
        return None
    key = release_key(version)
    if release_key(OLDEST) <= key < release_key(NEWEST)[:2] + (1 << 30,):
        return None
    return (
        f"vLLM {version} is installed; attnfuzz's vLLM adapters support releases "
        f"{OLDEST} to {NEWEST} ({ANY_RELEASE}=1 binds any release by feature detection)"
    )


def _configure() -> None:
    from attnfuzz.adapters.vllm import _engine

    _engine.configure_environment()


binding.before_import("vllm", _configure)


# -- what the adapters call ----------------------------------------------------------

# slot_mapping, unpadding: the V2 runner's block tables and step inputs, and the forms
# they bind: the kernel-block-size keywords (V1 0.21.0 to 0.31.0, V2 0.22.0 to 0.31.0),
# vLLM's own buffers without UVA (else a host stand-in for UvaBuffer), the host-to-device
# copy with out= (0.30.0) and with pin_memory= (0.21.0 to 0.23.0).
SLOT_MAPPINGS_KERNEL = Api("vllm.v1.worker.gpu.block_table", "_compute_slot_mappings_kernel")
V2_KERNEL_BLOCK_SIZES = Api(
    "vllm.v1.worker.gpu.block_table", "BlockTables.__init__", keyword="kernel_block_sizes"
)
V1_KERNEL_BLOCK_SIZE = Api(
    "vllm.v1.worker.block_table", "BlockTable.__init__", keyword="kernel_block_size"
)
NON_UVA_BUFFER = Api("vllm.v1.worker.gpu.buffer_utils", "NonUvaBuffer", since="0.30.0")
INPUT_BUFFERS = Api("vllm.v1.worker.gpu.input_batch", "InputBuffers")
PREPARE_POS_SEQ_LENS = Api("vllm.v1.worker.gpu.input_batch", "prepare_pos_seq_lens")
UNPADDED = Api("vllm.v1.attention.backend", "CommonAttentionMetadata.unpadded")
H2D_OUT = Api("vllm.utils.torch_utils", "async_tensor_h2d", keyword="out", since="0.30.0")
H2D_PIN_MEMORY = Api("vllm.utils.torch_utils", "async_tensor_h2d", keyword="pin_memory")
GPU_BLOCK_TABLES = Api("vllm.v1.worker.gpu.block_table", "BlockTables")
# persistent_batch: the V2 runner's request state and the methods that update it per step.
REQUEST_STATE = Api("vllm.v1.worker.gpu.states", "RequestState")
POST_UPDATE = Api("vllm.v1.worker.gpu.input_batch", "post_update")
V2_RUNNER_STEP = Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.update_requests")
V2_RUNNER_POSTPROCESS = Api(
    "vllm.v1.worker.gpu.model_runner",
    "GPUModelRunner.postprocess_sampled",
    keyword="num_rejected",
)
V2_RUNNER_GATHER = Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.gather_batch_req_state")
V2_RUNNER_PREPARE = Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.prepare_inputs")
V1_BLOCK_TABLE = Api("vllm.v1.worker.block_table", "BlockTable")
SPLIT = Api("vllm.v1.attention.backends.utils", "split_decodes_and_prefills")
SPLIT_EXTENDS = Api("vllm.v1.attention.backends.utils", "split_decodes_prefills_and_extends")
INDEXER_BUILDER = Api("vllm.v1.attention.backends.mla.indexer", "DeepseekV32IndexerMetadataBuilder")
BUILDER_TABLE_WIDTH = Api(
    "vllm.v1.attention.backends.mla.indexer",
    "DeepseekV32IndexerMetadataBuilder.__init__",
    keyword="block_table_width",
    since="0.27.0",
)
TABLE_WIDTH = Api("vllm.v1.worker.block_table", "get_block_table_width", since="0.27.0")
NATIVE_DECODE = Api(
    "vllm.v1.attention.backends.mla.indexer", "_supports_native_decode", since="0.28.0"
)
VARLEN_LOGITS = Api(
    "vllm.v1.attention.backends.mla.indexer",
    "_supports_varlen_paged_mqa_logits",
    since="0.28.0",
)
MAX_BLOCKS_PER_REQ = Api(
    "vllm.v1.kv_cache_interface", "KVCacheSpec.max_num_blocks_per_req", since="0.26.0"
)
GEMMA4_PROPOSER = Api("vllm.v1.spec_decode.gemma4", "Gemma4Proposer", since="0.21.0")
# draft_block_tables: the alternatives it binds (MAX_BLOCKS_PER_REQ or TOTAL_CP_WORLD_SIZE
# sizes a group's table; the two keywords are MultiGroupBlockTable's older parameters).
TOTAL_CP_WORLD_SIZE = Api("vllm.v1.worker.cp_utils", "get_total_cp_world_size")
TABLE_MAX_MODEL_LEN = Api(
    "vllm.v1.worker.block_table", "MultiGroupBlockTable.__init__", keyword="max_model_len"
)
TABLE_KERNEL_BLOCK_SIZES = Api(
    "vllm.v1.worker.block_table", "MultiGroupBlockTable.__init__", keyword="kernel_block_sizes"
)
DRAFTING_METADATA = Api(
    "vllm.v1.worker.utils", "AttentionGroup.build_metadata_for_drafting", since="0.32.0"
)
FLEX = Api("vllm.v1.attention.backends.flex_attention", "FlexAttentionMetadataBuilder")
# 0.21.0's builder fixes q_block_size at 16 (128 before torch 2.9); the target draws
# it from 1 to 16 and the adapter sets it through this knob, first in 0.22.0 (without
# it, flex_block_mask declines the cases of another q_block_size).
FLEX_Q_BLOCK_SIZE = Api(
    "vllm.config.attention", "AttentionConfig.flex_attn_q_block_size", since="0.22.0"
)
SPARSE_INDEXER = Api("vllm.model_executor.layers.sparse_attn_indexer", "sparse_attn_indexer")
ROCM_INDEXER = Api("vllm.v1.attention.ops.rocm_aiter_mla_sparse", "rocm_aiter_sparse_attn_indexer")
# The gfx942 glue lives in that module from 0.33.0 (0.30.0 to 0.32.0 have no
# models/deepseek_v41/amd/ops/sparse_indexer.py); the CPU glue and its builder from 0.30.0.
V41_GFX942_INDEXER = Api(
    "vllm.models.deepseek_v41.amd.ops.sparse_indexer", "gfx942_sparse_attn_indexer", since="0.33.0"
)
CPU_INDEXER_BUILDER = Api(
    "vllm.models.deepseek_v4.cpu.cpu_mla", "DeepseekV4CPUIndexerMetadataBuilder", since="0.30.0"
)
FORWARD_CPU = Api(
    "vllm.model_executor.layers.sparse_attn_indexer",
    "SparseAttnIndexer.forward_cpu",
    since="0.30.0",
)
DEFAULT_MODEL_STATE = Api("vllm.v1.worker.gpu.model_states.default", "DefaultModelState")
MAMBA_HYBRID = Api("vllm.v1.worker.gpu.model_states.mamba_hybrid", since="0.21.0")
# max_seq_len: the V2 drafter's forms (max_seq_len_drafters.py). DraftModelSpeculator,
# with its draft_max_seq_len (#43991's draft half), else 0.21.0's EagleSpeculator; its
# decode builder _build_uniform_attn_metadata, else _build_draft_attn_metadata (step=).
_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.speculator"
DRAFT_MODEL_SPECULATOR = Api(_SPECULATOR, "DraftModelSpeculator", since="0.23.0")
EAGLE_DRAFT_METADATA = Api(
    "vllm.v1.worker.gpu.spec_decode.eagle.speculator",
    "EagleSpeculator._build_draft_attn_metadata",
)
DRAFT_UNIFORM_METADATA = Api(
    _SPECULATOR, "DraftModelSpeculator._build_uniform_attn_metadata", since="0.30.0"
)
DRAFT_BUILD_ATTN_METADATA = Api(_SPECULATOR, "DraftModelSpeculator._build_attn_metadata")
DRAFT_METADATA_STEP = Api(
    _SPECULATOR, "DraftModelSpeculator._build_draft_attn_metadata", keyword="step"
)
DRAFT_MAX_MODEL_LEN_PROPERTY = Api(_SPECULATOR, "DraftModelSpeculator.max_model_len")
INIT_SPECULATOR = Api("vllm.v1.worker.gpu.spec_decode", "init_speculator")
INIT_SPECULATOR_REQ_STATES = Api(
    "vllm.v1.worker.gpu.spec_decode", "init_speculator", keyword="req_states"
)
V1_DEVICE_PROPERTIES = Api(
    "vllm.v1.worker.gpu_model_runner", "GPUModelRunner._init_device_properties"
)
GPU_MODEL_RUNNER = Api("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
# runner_modes: the runners' own step planning, which reachability drives. Every supported
# release has what REQUIRES lists; the rest is bound where found, else the release's older
# form: the resolution's keywords (RESOLVE_MODES, RESOLVE_V2_RUNNER); adaptive verification
# (ADAPTIVE_MODE, else V2_VARLEN_DECODE with the runner's inline FULL_AND_PIECEWISE, else
# none: refused); V2's uniform count (UNIFORM_DECODE_ELIGIBLE, UNIFORM_HAS_PREFILL, else
# V2_UNIFORM_TOKENS); what CudaGraphManager.__init__ sets (V2_LORA_CASES, V2_BREAKABLE); the
# keywords of dispatch_cg_and_sync_dp and of V1's batch decision, and V1's SP padding.
_COMPILATION = "vllm.config.compilation"
_V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
_V2_GRAPHS = "vllm.v1.worker.gpu.cudagraph_utils"
_V2_DP = "vllm.v1.worker.gpu.dp_utils"
RESOLVE_MODE = Api(_COMPILATION, "CompilationConfig.resolve_cudagraph_mode_and_sizes")
RESOLVE_MODES = Api(
    _COMPILATION,
    "CompilationConfig.resolve_cudagraph_mode_and_sizes",
    keyword="piecewise_capture_available",
    since="0.30.0",
)
RESOLVE_V2_RUNNER = Api(
    _COMPILATION,
    "CompilationConfig.resolve_cudagraph_mode_and_sizes",
    keyword="use_v2_model_runner",
    since="0.25.0",
)
ADAPTIVE_MODE = Api(
    "vllm.v1.worker.gpu.spec_decode.adaptive_verification",
    "resolve_adaptive_cudagraph_mode",
    since="0.30.0",
)
V2_VARLEN_DECODE = Api(
    _V2_GRAPHS, "CudaGraphManager.__init__", keyword="varlen_decode", since="0.28.0"
)
UNIFORM_DECODE_ELIGIBLE = Api(
    "vllm.v1.worker.utils",
    "get_uniform_decode_token_count",
    keyword="decode_graph_eligible",
    since="0.31.0",
)
UNIFORM_HAS_PREFILL = Api(
    "vllm.v1.worker.utils", "get_uniform_decode_token_count", keyword="has_prefill", since="0.28.0"
)
V2_UNIFORM_TOKENS = Api(_V2_GRAPHS, "get_uniform_token_count")
V1_DISPATCHER = Api("vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher")
V1_BATCH_DECISION = Api(_V1_RUNNER, "GPUModelRunner._determine_batch_execution_and_padding")
V1_CASCADE_ATTN = Api(
    _V1_RUNNER, "GPUModelRunner._determine_batch_execution_and_padding", keyword="use_cascade_attn"
)
V1_SP_PADDING = Api(_V1_RUNNER, "GPUModelRunner._pad_for_sequence_parallelism")
V2_GRAPHS = Api(_V2_GRAPHS, "CudaGraphManager")
V2_LORA_CASES = Api(_V2_GRAPHS, "CudaGraphManager._build_lora_dispatch_map", since="0.24.0")
V2_BREAKABLE = Api(_V2_GRAPHS, "is_breakable_cudagraph_enabled", since="0.23.0")
V2_DP_SYNC = Api(_V2_DP, "dispatch_cg_and_sync_dp")
V2_DP_LORAS = Api(_V2_DP, "dispatch_cg_and_sync_dp", keyword="num_active_loras", since="0.24.0")
V2_DP_QUERY_LEN = Api(_V2_DP, "dispatch_cg_and_sync_dp", keyword="max_query_len", since="0.28.0")
V2_DP_UBATCHING = Api(_V2_DP, "dispatch_cg_and_sync_dp", keyword="allow_ubatching", since="0.30.0")

# -- what a configuration allows, per release ----------------------------------------

_PCP_MANAGER = "vllm/v1/worker/gpu/pcp_manager.py"
_V2_ONLY = (
    f"PCP's runtime (the batch split across PCP ranks: {_PCP_MANAGER}: "
    "maybe_build_pcp_manager, PCPManager.partition_batch) is built by the V2 runner only "
    "(vllm/v1/worker/gpu/model_runner.py: GPUModelRunner); "
)
_PIECEWISE_ONLY = (
    f"{_PCP_MANAGER}: PCPManager.validate_config refuses FULL graphs ('MRV2 PCP supports "
    "PIECEWISE CUDA graphs only', a sparse MLA model NONE only); "
    "PCPManager.partition_batch pads no request (num_reqs_after_padding = num_local_reqs)"
)
PCP_RELEASES = (
    Releases(
        "0.26.0",
        "0.29.0",
        runners=("v2",),
        modes=("NONE", "PIECEWISE"),
        pads_requests=False,
        source=_V2_ONLY + "the V1 runner (vllm/v1/worker/gpu_model_runner.py) reads no "
        "prefill_context_parallel_size and is not refused by the config yet; " + _PIECEWISE_ONLY,
    ),
    Releases(
        "0.29.0",
        "0.30.0",
        runners=("v2",),
        modes=("NONE", "PIECEWISE"),
        pads_requests=False,
        source=_V2_ONLY + "vllm/config/vllm.py: VllmConfig._validate_v1_model_runner "
        "refuses it on V1 (_get_v1_model_runner_unsupported_features: 'prefill context "
        "parallel'); " + _PIECEWISE_ONLY,
    ),
    Releases(
        "0.30.0",
        runners=("v2",),
        modes=("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"),
        pads_requests=True,
        source=_V2_ONLY + "vllm/config/vllm.py: VllmConfig._validate_v1_model_runner "
        f"refuses it on V1; {_PCP_MANAGER}: PCPManager.validate_config keeps full graphs "
        "for decode-only routines only (FULL refused: 'MRV2 PCP supports full CUDA graphs "
        "for decode-only routines'; a sparse MLA model without DCP: NONE only in 0.30.0 "
        "to 0.32.0); a FULL step's request count is padded to the graph's "
        "(padded_num_reqs = batch_desc.num_reqs: maybe_partition_pcp_batch in 0.30.0, "
        "PCPManager.partition_batch from 0.31.0), PCPManager._resolve_num_reqs_after_padding "
        "refusing a FULL step with a prefill (read in 0.30.0 to 0.33.0)",
    ),
)
"""What ``--prefill-context-parallel-size > 1`` allows, per range of releases: the
runner it runs on, the cudagraph modes accepted with it, whether its FULL steps pad the
request count. Before 0.26.0 no MLA builder passes ``not self.use_pcp`` to
``split_decodes_and_prefills``; no range is declared there."""

# Adapter module (or "module.function" where one function needs more) -> the APIs it
# calls. A function's entry adds to its module's.
# runner_step_linear's builders besides runner_step_hybrid's engine (its "runner_step_hybrid"
# entry, less GDN's): the mamba builders' staging and the runner's spec-decode arguments.
_LINEAR = (
    Api("vllm.v1.attention.backends.mamba_attn", "BaseMambaAttentionMetadataBuilder"
        "._update_metadata_for_cudagraph_capture"),
    Api("vllm.v1.kv_cache_interface", "MambaSpec", keyword="num_speculative_blocks"),
)  # fmt: skip
_LINEAR_MAMBA2 = (
    *_LINEAR,
    Api("vllm.v1.attention.backends.mamba2_attn", "Mamba2AttentionMetadataBuilder"),
    Api("vllm.v1.attention.backends.mamba2_attn", "Mamba2AttentionBackend"),
    Api("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum.MAMBA2"),
)
_LINEAR_MAMBA1 = (
    *_LINEAR,
    Api("vllm.v1.attention.backends.mamba1_attn", "Mamba1AttentionMetadataBuilder.build"),
    Api("vllm.v1.attention.backends.mamba1_attn", "Mamba1AttentionBackend"),
    Api("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum.MAMBA1"),
)
_LINEAR_PLE = (
    *_LINEAR,
    Api("vllm.v1.attention.backends.short_conv_attn", "PleShortConvAttentionMetadataBuilder"),
    Api("vllm.v1.attention.backends.short_conv_attn", "PleShortConvAttentionBackend"),
    Api("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum.SHORT_CONV"),
)


REQUIRES: dict[str, tuple[Api, ...]] = {
    "decode_split": (SPLIT, SPLIT_EXTENDS),
    "draft_block_tables": (GEMMA4_PROPOSER, V1_BLOCK_TABLE),
    "flatten_decode": (INDEXER_BUILDER,),
    "flatten_decode.upstream_unaligned_width": (TABLE_WIDTH, BUILDER_TABLE_WIDTH),
    "flex_block_mask": (FLEX,),
    "indexer_decode": (SPARSE_INDEXER, INDEXER_BUILDER),
    "indexer_decode.run_rocm": (ROCM_INDEXER,),
    "indexer_decode.run_cpu": (CPU_INDEXER_BUILDER, FORWARD_CPU),
    "indexer_decode.run_deepseek_v41_amd": (V41_GFX942_INDEXER, ROCM_INDEXER),
    "max_seq_len": (DEFAULT_MODEL_STATE, INIT_SPECULATOR),
    "max_seq_len.run_mamba_hybrid": (MAMBA_HYBRID,),
    "max_seq_len.upstream_model_len": (MAMBA_HYBRID, DRAFT_MODEL_SPECULATOR),
    "max_seq_len.upstream_draft_model_len": (DRAFT_MODEL_SPECULATOR,),
    "max_seq_len.run_v1": (GPU_MODEL_RUNNER,),
    "mtp_seq_lens": (INDEXER_BUILDER,),
    "persistent_batch": (
        GPU_BLOCK_TABLES,
        SLOT_MAPPINGS_KERNEL,
        INPUT_BUFFERS,
        PREPARE_POS_SEQ_LENS,
        REQUEST_STATE,
        POST_UPDATE,
        V2_RUNNER_STEP,
        V2_RUNNER_POSTPROCESS,
        V2_RUNNER_GATHER,
        V2_RUNNER_PREPARE,
        H2D_OUT,
    ),
    # runner_step: execute_model whole, in 0.33.0's forms (the DP vote on skipping drafts).
    "runner_step": (
        V2_RUNNER_GATHER,
        V2_RUNNER_PREPARE,
        Api(_V2_DP, "dispatch_cg_and_sync_dp", keyword="allow_skip_drafts"),
        Api(_V2_GRAPHS, "ModelCudaGraphManager"),
        # its speculator, made and run as the runner does
        Api("vllm.v1.worker.gpu.spec_decode", "init_speculator"),
        Api("vllm.v1.worker.gpu.spec_decode.utils", "get_drafter_hidden_states"),
        # sample_tokens between two steps, on the samplers load_model makes
        Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens"),
        Api("vllm.v1.worker.gpu.sample.sampler", "Sampler"),
        Api("vllm.v1.worker.gpu.spec_decode.rejection_sampler", "RejectionSampler"),
        Api("vllm.v1.worker.gpu.spec_decode.utils", "DraftTokensHandler"),
        # the runner built by its own __init__, load_model, initialize_kv_cache and
        # capture_model, with what they call that is stood in
        Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.initialize_kv_cache"),
        Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model"),
        Api("vllm.v1.worker.gpu.model_runner", "get_model_loader"),
        Api("vllm.v1.worker.gpu.model_runner", "init_kv_cache"),
        Api("vllm.v1.worker.gpu.model_runner", "lock_workspace"),
        Api("vllm.v1.worker.gpu.model_runner", "RequestState"),
    ),
    # runner_step_v1: the V1 execute_model whole, its capture and its model's graph
    # wrapper, in 0.33.0's forms (the slot mappings built apart from the metadata).
    "runner_step_v1": (
        V1_DISPATCHER,
        V1_BATCH_DECISION,
        Api(_V1_RUNNER, "GPUModelRunner._get_slot_mappings"),
        Api(_V1_RUNNER, "GPUModelRunner._capture_cudagraphs"),
        Api("vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher.get_capture_descs"),
        Api("vllm.v1.worker.utils", "prepare_kernel_block_sizes"),
        Api("vllm.compilation.cuda_graph", "CUDAGraphWrapper"),
        # its drafter's propose, on the padded drafter batch
        Api("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.propose"),
        Api("vllm.v1.spec_decode.eagle", "EagleProposer"),
        Api("vllm.config", "SpeculativeConfig._maybe_override_draft_max_model_len"),
    ),
    # runner_step_dbo: runner_step_v1's engine with dual-batch overlap: the ranks'
    # micro-batch decision, the slices, the per-micro-batch metadata and the wrapper.
    "runner_step_dbo": (
        V1_DISPATCHER,
        V1_BATCH_DECISION,
        Api(_V1_RUNNER, "GPUModelRunner._allow_microbatching"),
        Api(_V1_RUNNER, "GPUModelRunner._get_slot_mappings"),
        Api(_V1_RUNNER, "GPUModelRunner._capture_cudagraphs"),
        Api("vllm.v1.worker.dp_utils", "coordinate_batch_across_dp"),
        Api("vllm.v1.worker.ubatch_utils", "maybe_create_ubatch_slices"),
        Api("vllm.v1.worker.ubatch_utils", "split_attn_metadata"),
        Api("vllm.v1.worker.ubatch_utils", "slice_query_start_locs"),
        Api("vllm.v1.worker.ubatching", "make_ubatch_contexts"),
        Api("vllm.v1.worker.gpu_ubatch_wrapper", "UBatchWrapper._make_ubatch_metadata"),
        Api("vllm.v1.worker.gpu_ubatch_wrapper", "CUDAGraphMetaData"),
        Api("vllm.compilation.cuda_graph", "CUDAGraphWrapper"),
    ),
    # runner_step_v2_dbo: runner_step's engine with dual-batch overlap: the ranks'
    # micro-batch decision, the micro-batched graphs, the slices and their metadata.
    "runner_step_v2_dbo": (
        V2_RUNNER_GATHER,
        V2_RUNNER_PREPARE,
        Api(_V2_DP, "sync_cudagraph_and_dp_padding", keyword="allow_ubatching"),
        Api(_V2_GRAPHS, "CudaGraphManager._maybe_ubatch_twin"),
        Api("vllm.v1.worker.gpu.ubatch_utils", "UBatchRunner.begin_capturable_run"),
        Api("vllm.v1.worker.gpu.ubatch_utils", "_slice_query_start_loc"),
        Api("vllm.v1.worker.gpu.ubatch_utils", "make_ubatch_contexts"),
        Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.initialize_kv_cache"),
        Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.capture_model"),
    ),
    # runner_step_unpadded_drafts: runner_step_v1's engine, its drafter batch unpadded.
    "runner_step_unpadded_drafts": (
        V1_DISPATCHER,
        V1_BATCH_DECISION,
        Api(_V1_RUNNER, "GPUModelRunner._get_slot_mappings"),
        Api(_V1_RUNNER, "GPUModelRunner._capture_cudagraphs"),
        Api("vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher.get_capture_descs"),
        Api("vllm.v1.worker.utils", "prepare_kernel_block_sizes"),
        Api("vllm.compilation.cuda_graph", "CUDAGraphWrapper"),
        Api("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.propose"),
        Api("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.prepare_inputs"),
        Api(
            "vllm.v1.spec_decode.llm_base_proposer",
            "SpecDecodeBaseProposer.prepare_next_token_ids_cpu",
        ),
        Api("vllm.v1.spec_decode.eagle", "EagleProposer"),
        Api("vllm.config", "SpeculativeConfig", keyword="disable_padded_drafter_batch"),
        Api("vllm.config", "SpeculativeConfig._maybe_override_draft_max_model_len"),
    ),
    # runner_step_hybrid: runner_step_v1's engine with a GDN layer's KV-cache group.
    "runner_step_hybrid": (
        V1_DISPATCHER,
        V1_BATCH_DECISION,
        Api(_V1_RUNNER, "GPUModelRunner._get_slot_mappings"),
        Api(_V1_RUNNER, "GPUModelRunner._capture_cudagraphs"),
        Api("vllm.v1.cudagraph_dispatcher", "CudagraphDispatcher.get_capture_descs"),
        Api("vllm.v1.worker.utils", "prepare_kernel_block_sizes"),
        Api("vllm.compilation.cuda_graph", "CUDAGraphWrapper"),
        Api("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.propose"),
        Api("vllm.v1.spec_decode.eagle", "EagleProposer"),
        Api("vllm.config", "SpeculativeConfig._maybe_override_draft_max_model_len"),
        Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadataBuilder"),
        Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionBackend"),
        Api("vllm.v1.kv_cache_interface", "MambaSpec", keyword="num_speculative_blocks"),
        Api("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum.GDN_ATTN"),
    ),
    # runner_step_linear: runner_step_hybrid's engine (its entry, below) with a Mamba1,
    # Mamba2 or PLE short-conv layer.
    "runner_step_linear.run_mamba1": _LINEAR_MAMBA1,
    "runner_step_linear.run_mamba2": _LINEAR_MAMBA2,
    "runner_step_linear.mamba2_pad_slot_states": _LINEAR_MAMBA2,
    "runner_step_linear.run_ple_short_conv": _LINEAR_PLE,
    "runner_step_linear.ple_short_conv_pad_slot_states": _LINEAR_PLE,
    "runner_modes": (RESOLVE_MODE, V1_DISPATCHER, V1_BATCH_DECISION, V2_GRAPHS, V2_DP_SYNC),
    "slot_mapping.run": (GPU_BLOCK_TABLES,),
    "slot_mapping.run_v1": (V1_BLOCK_TABLE,),
    "slot_mapping.upstream_stale_padding": (GPU_BLOCK_TABLES, SLOT_MAPPINGS_KERNEL),
    "unpadding": (
        GPU_BLOCK_TABLES,
        SLOT_MAPPINGS_KERNEL,
        INPUT_BUFFERS,
        PREPARE_POS_SEQ_LENS,
        UNPADDED,
    ),
}
REQUIRES["runner_step_linear"] = REQUIRES["runner_step_hybrid"]
# runner_step_mamba_align: runner_step_linear's Mamba2 engine with prefix caching on, the
# runner's align-mode state copies and the model's copy functions.
REQUIRES["runner_step_mamba_align"] = REQUIRES["runner_step_linear"] + (
    Api("vllm.v1.worker.mamba_utils", "preprocess_mamba"),
    Api("vllm.v1.worker.mamba_utils", "collect_mamba_copy_meta"),
    Api("vllm.model_executor.layers.mamba.mamba_utils",
        "MambaStateCopyFuncCalculator.mamba2_state_copy_func"),
)  # fmt: skip
# runner_step_pcp: runner_step's engine of an MLA model, and one a PCP rank.
REQUIRES["runner_step_pcp"] = (
    V2_RUNNER_GATHER,
    V2_RUNNER_PREPARE,
    Api("vllm.v1.worker.gpu.pcp_manager", "maybe_build_pcp_manager"),
    Api("vllm.v1.worker.gpu.pcp_manager", "PCPManager.partition_batch"),
    Api("vllm.v1.worker.gpu.pcp_manager", "PCPManager._iter_rank_chunks"),
    Api("vllm.v1.worker.gpu.pcp_manager", "PCPManager.restore_for_sampling"),
    Api("vllm.v1.attention.backends.mla.triton_mla", "TritonMLABackend"),
    Api("vllm.v1.kv_cache_interface", "MLAAttentionSpec"),
)
# runner_step_kda: runner_step_hybrid's engine, its linear layer's backend Kimi K3's KDA.
REQUIRES["runner_step_kda"] = REQUIRES["runner_step_hybrid"] + (
    Api("vllm.models.kimi_k3.nvidia.kda_metadata", "KimiK3KDAAttentionBackend"),
    Api("vllm.models.kimi_k3.nvidia.kda_metadata", "KimiK3KDAMetadataBuilder.build"),
)  # fmt: skip
# runner_step_kda_rocm: runner_step_hybrid's engine, its linear layer's backend Kimi K3's
# ROCm KDA; the device chunk metadata held to GDN's host one of the same arguments.
REQUIRES["runner_step_kda_rocm"] = REQUIRES["runner_step_hybrid"] + (
    Api("vllm.models.kimi_k3.amd.kda_metadata", "KimiK3ROCmKDABackend"),
    Api("vllm.models.kimi_k3.amd.kda_metadata", "KimiK3ROCmKDAMetadataBuilder.build"),
    Api("vllm.models.kimi_k3.amd.kda_metadata",
        "KimiK3ROCmKDAMetadataBuilder._build_chunk_metadata",
        keyword="prefill_query_start_loc_cpu"),
    Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadataBuilder._build_chunk_metadata",
        keyword="prefill_query_start_loc_cpu"),
    Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadata.chunk_indices"),
    Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadata.chunk_offsets"),
    Api("vllm.models.kimi_k3.amd.kda_metadata", "prepare_chunk_metadata_device"),
    Api("vllm.third_party.flash_linear_attention.ops.utils", "FLA_CHUNK_SIZE"),
)  # fmt: skip
# runner_step_mamba_hybrid: runner_step's engine of a hybrid model: the model state
# init_model_state picks for it and a GDN layer's KV-cache group.
REQUIRES["runner_step_mamba_hybrid"] = REQUIRES["runner_step"] + (
    MAMBA_HYBRID,
    Api("vllm.v1.worker.gpu.model_states.mamba_hybrid", "MambaHybridModelState.preprocess_state"),
    Api("vllm.v1.worker.gpu.model_states", "resolve_model_state_cls"),
    Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadataBuilder"),
    Api("vllm.v1.attention.backends.gdn_attn", "GDNAttentionBackend"),
    Api("vllm.v1.kv_cache_interface", "MambaSpec", keyword="num_speculative_blocks"),
    Api("vllm.v1.attention.backends.registry", "MambaAttentionBackendEnum.GDN_ATTN"),
)
# runner_step_encoder_decoder: runner_step's engine of an encoder-decoder model: the model
# state init_model_state picks for it, its encoder runner, the cross-attention backend.
REQUIRES["runner_step_encoder_decoder"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.model_states.encoder_decoder",
        "EncoderDecoderModelState._get_encoder_seq_lens"),
    Api("vllm.v1.worker.gpu.model_states", "resolve_model_state_cls"),
    Api("vllm.v1.worker.gpu.mm.encoder_runner", "EncoderRunner.execute_mm_encoder"),
    Api("vllm.model_executor.layers.attention.cross_attention",
        "create_cross_attention_backend"),
    Api("vllm.model_executor.layers.attention.cross_attention", "_get_cross_slot_mapping"),
    Api("vllm.model_executor.layers.attention", "CrossAttention"),
    Api("vllm.v1.kv_cache_interface", "CrossAttentionSpec"),
    Api("vllm.multimodal.inputs", "MultiModalFeatureSpec"),
)  # fmt: skip
# runner_step_v2_align: runner_step_mamba_hybrid's engine with prefix caching on, the model
# state's align path (the fused state copies) and the GDN layer's copy functions.
REQUIRES["runner_step_v2_align"] = REQUIRES["runner_step_mamba_hybrid"] + (
    Api("vllm.v1.worker.gpu.model_states.mamba_hybrid", "MambaHybridModelState.add_request"),
    Api("vllm.v1.worker.gpu.model_states.mamba_hybrid",
        "MambaHybridModelState.initialize_kv_cache"),
    Api("vllm.v1.worker.mamba_utils", "MambaSpecDecodeGPUContext.run_fused_precopy"),
    Api("vllm.v1.worker.mamba_utils", "MambaSpecDecodeGPUContext.run_fused_postprocess_align"),
    Api("vllm.model_executor.layers.mamba.mamba_utils",
        "MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func"),
)  # fmt: skip
# runner_step_mamba_hybrid.dummy_stale_rows: besides its module's, the dummy runs' block
# tables it replaces by the last step's rows (0.26.0's get_dummy_block_tables).
REQUIRES["runner_step_mamba_hybrid.dummy_stale_rows"] = (
    Api("vllm.v1.worker.gpu.block_table", "BlockTables.get_dummy_block_tables"),
)
# runner_step_standalone_ar: runner_step's engine, its speculative config's draft_model
# method making the standalone autoregressive speculator.
REQUIRES["runner_step_standalone_ar"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator",
        "StandaloneARSpeculator._multi_step_decode"),
)  # fmt: skip
# runner_step_mtp_modules: runner_step's engine, its MTP draft model of one module a draft
# making the multi-module MTP speculator.
REQUIRES["runner_step_mtp_modules"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator",
        "MultiModuleMTPSpeculator._generate_drafts"),
    Api("vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator",
        "pad_trailing_draft_slots"),
)  # fmt: skip
# runner_step_dflash: runner_step's engine, its speculative config's dflash method making
# the DFlash speculator.
REQUIRES["runner_step_dflash"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.spec_decode.dflash.speculator", "DFlashSpeculator.propose"),
    Api("vllm.v1.worker.gpu.spec_decode.dflash.speculator", "prepare_dflash_inputs"),
)  # fmt: skip
# runner_step_profile: runner_step's engine, its start-up graph-memory profiling (which
# runner_step runs where the release has it) with the capture's dummy block tables mutated.
REQUIRES["runner_step_profile"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.profile_cudagraph_memory"),
    Api(_V2_GRAPHS, "_init_minimal_kv_cache_for_profiling"),
    Api(_V2_GRAPHS, "_teardown_profiling_state"),
    Api("vllm.v1.worker.gpu.block_table", "BlockTables.get_dummy_block_tables"),
    Api("vllm.v1.attention.backends.utils", "resolve_kv_cache_layout"),
)  # fmt: skip
# runner_step_v1.run_drafter_dummy: besides its module's, the drafter's dummy run that a
# dummy step hands its slot mappings.
REQUIRES["runner_step_v1.run_drafter_dummy"] = (
    Api("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer.dummy_run",
        keyword="slot_mappings"),
)  # fmt: skip
# runner_step_v1_dflash: runner_step_v1's engine, its speculative config's dflash method
# making the DFlash proposer.
REQUIRES["runner_step_v1_dflash"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.spec_decode.dflash", "DFlashProposer.set_inputs_first_pass"),
    Api("vllm.v1.spec_decode.dflash", "DFlashProposer.build_model_inputs_first_pass"),
)  # fmt: skip
# runner_step_v1_draft_model: runner_step_v1's engine, its speculative config's
# draft_model method making the draft-model proposer, whose first pass takes the path for
# extra input slots.
REQUIRES["runner_step_v1_draft_model"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.spec_decode.draft_model", "DraftModelProposer"),
    Api("vllm.v1.spec_decode.llm_base_proposer", "SpecDecodeBaseProposer._get_slot_mapping"),
    Api("vllm.v1.spec_decode.llm_base_proposer", "extend_all_queries_by_N"),
    Api("vllm.v1.spec_decode.llm_base_proposer", "compute_new_slot_mapping"),
    Api("vllm.config.speculative", "SpeculativeConfig.max_num_new_slots_for_drafting"),
)  # fmt: skip
# runner_step_chunked_local: runner_step_v1's engine with a chunked local attention
# layer, a second KV-cache group on the backend made of Triton's.
REQUIRES["runner_step_chunked_local"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.model_executor.layers.attention.chunked_local_attention",
        "create_chunked_local_attention_backend"),
    Api("vllm.model_executor.layers.attention.chunked_local_attention",
        "make_local_attention_virtual_batches"),
    Api("vllm.v1.kv_cache_interface", "ChunkedLocalAttentionSpec"),
)  # fmt: skip
# runner_step_v1_async: runner_step_v1's engine scheduled asynchronously, the runner
# correcting the scheduler's optimistic counts itself.
REQUIRES["runner_step_v1_async"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.spec_decode.utils", "update_num_computed_tokens_for_batch_change"),
    Api(_V1_RUNNER, "GPUModelRunner._prepare_input_ids"),
    Api(_V1_RUNNER, "AsyncGPUModelRunnerOutput"),
)  # fmt: skip
# runner_step_v1_step3p5: runner_step_v1's engine, its speculative config's step3p5_mtp
# draft making the Step3.5 MTP proposer.
REQUIRES["runner_step_v1_step3p5"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer.propose"),
    Api("vllm.v1.spec_decode.step3p5", "Step3p5MTPProposer.set_per_group_attn_metadata"),
)  # fmt: skip
# runner_step_v1_mrope: runner_step_v1's engine of an M-RoPE model: the runner's own
# mrope_positions, and the rotary embedding whose completion positions it computes.
REQUIRES["runner_step_v1_mrope"] = REQUIRES["runner_step_v1"] + (
    Api(_V1_RUNNER, "GPUModelRunner._calc_mrope_positions"),
    Api(_V1_RUNNER, "GPUModelRunner._init_mrope_positions"),
    Api(
        "vllm.model_executor.layers.rotary_embedding",
        "MRotaryEmbedding.get_next_input_positions_tensor",
    ),
)  # fmt: skip
# runner_step_mrope: runner_step's engine of an M-RoPE model: the default model state's
# RopeState.
REQUIRES["runner_step_mrope"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.mm.rope", "RopeState.prepare_positions"),
    Api("vllm.v1.worker.gpu.mm.rope", "get_rope_state"),
)  # fmt: skip
# runner_step_prompt_embeds: runner_step's engine with prompt embeddings: the default
# model state's PromptEmbedsState and its overlay kernel.
REQUIRES["runner_step_prompt_embeds"] = REQUIRES["runner_step"] + (
    Api("vllm.v1.worker.gpu.model_states.prompt_embeds", "PromptEmbedsState.apply"),
    Api("vllm.v1.worker.gpu.model_states.prompt_embeds", "_apply_prompt_embeds_kernel"),
    Api("vllm.v1.worker.gpu.model_states.default", "DefaultModelState.prepare_inputs_embeds"),
    Api("vllm.v1.core.sched.output", "NewRequestData", keyword="prompt_is_token_ids"),
)  # fmt: skip
# runner_step_prompt_logprobs: runner_step's engine with prompt and sampled logprobs: the
# sampler's PromptLogprobsWorker and its token-id kernel, and its per-request token ids.
_PROMPT_LOGPROB = "vllm.v1.worker.gpu.sample.prompt_logprob"
_SAMPLED_LOGPROB = "vllm.v1.worker.gpu.sample.logprob"
REQUIRES["runner_step_prompt_logprobs"] = REQUIRES["runner_step"] + (
    Api(_PROMPT_LOGPROB, "PromptLogprobsWorker.compute_prompt_logprobs"),
    Api(_PROMPT_LOGPROB, "PromptLogprobsWorker.compute_prompt_token_id_logprobs"),
    Api(_PROMPT_LOGPROB, "_prompt_logprobs_token_ids_kernel"),
    # The sampled tokens' logprobs, per-request token ids among them.
    Api(_SAMPLED_LOGPROB, "compute_topk_scores", keyword="logprob_token_ids_state"),
    Api(_SAMPLED_LOGPROB, "_fill_logprob_token_ids_kernel"),
    Api(_SAMPLED_LOGPROB, "LogprobTokenIdsState.add_request"),
    # What the requests ask for: their own sampled and prompt rows' token ids.
    Api("vllm.sampling_params", "SamplingParams", keyword="logprob_token_ids"),
    Api("vllm.sampling_params", "SamplingParams", keyword="prompt_logprob_token_ids"),
    Api("vllm.sampling_params", "SamplingParams", keyword="prompt_logprob_start"),
)  # fmt: skip
# runner_step_v1_prompt_logprobs: runner_step_v1's engine with prompt logprobs: the
# runner's own prompt-logprobs pass and the tensors it fills chunk by chunk.
REQUIRES["runner_step_v1_prompt_logprobs"] = REQUIRES["runner_step_v1"] + (
    Api(_V1_RUNNER, "GPUModelRunner._get_prompt_logprobs_dict"),
    Api("vllm.v1.outputs", "LogprobsTensors.empty_cpu"),
)  # fmt: skip
# runner_step_v1_ngram: runner_step_v1's engine, its speculative config's ngram_gpu drafter
# (whose kernel also finds the tokens that make its drafts) and the runner's invalid-draft
# trim; the trimmed copy of the scheduler output the runner keeps until sample_tokens.
REQUIRES["runner_step_v1_ngram"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.config.speculative", "SpeculativeConfig.use_ngram_gpu"),
    Api("vllm.v1.spec_decode.ngram_proposer_gpu", "NgramProposerGPU.propose"),
    Api("vllm.v1.spec_decode.ngram_proposer_gpu", "NgramGPUKernel.forward"),
    Api("vllm.v1.spec_decode.ngram_proposer_gpu", "update_scheduler_for_invalid_drafts"),
    Api("vllm.v1.spec_decode.ngram_proposer_gpu", "update_ngram_gpu_tensors_incremental"),
    Api(_V1_RUNNER, "GPUModelRunner.take_draft_token_ids"),
    Api(_V1_RUNNER, "ExecuteModelState"),
)  # fmt: skip
# runner_step_mla: runner_step_v1's engine with its attention layer an MLA layer on the
# Triton MLA backend, whose builder is MLACommonMetadataBuilder; the prefill backend is
# vLLM's own choice for the platform.
REQUIRES["runner_step_mla"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.mla.triton_mla", "TritonMLABackend"),
    Api("vllm.model_executor.layers.attention.mla_attention", "MLACommonMetadataBuilder"
        "._build_decode"),
    Api("vllm.v1.attention.backends.mla.prefill.selector", "get_mla_prefill_backend"),
    Api("vllm.v1.kv_cache_interface", "MLAAttentionSpec"),
    Api("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
)  # fmt: skip
# runner_step_flash_attn: runner_step_v1's engine on the FlashAttention backend, its
# version and ahead-of-time scheduler metadata looked up in flash_attn.py.
REQUIRES["runner_step_flash_attn"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.flash_attn", "FlashAttentionBackend"),
    Api("vllm.v1.attention.backends.flash_attn", "FlashAttentionMetadataBuilder"),
    Api("vllm.v1.attention.backends.flash_attn", "get_flash_attn_version"),
    Api("vllm.v1.attention.backend", "AttentionCGSupport"),
    Api("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
)  # fmt: skip
# runner_step_triton_flash_attn: runner_step_flash_attn's engine on the composite of the
# Triton and FlashAttention backends, routed by MMPrefixAttentionRouting.
REQUIRES["runner_step_triton_flash_attn"] = REQUIRES["runner_step_flash_attn"] + (
    Api("vllm.v1.attention.backends.triton_flash_attn", "TritonFlashAttentionBackend"),
    Api("vllm.v1.attention.backends.composite", "MMPrefixAttentionRouting.capture_variant"),
)  # fmt: skip
# runner_step_flashmla: runner_step_mla's engine on the FlashMLA backend, its KV cache
# fp8; the SM count and FlashMLA's schedule calls looked up in flashmla.py.
REQUIRES["runner_step_flashmla"] = REQUIRES["runner_step_mla"] + (
    Api("vllm.v1.attention.backends.mla.flashmla", "FlashMLABackend"),
    Api("vllm.v1.attention.backends.mla.flashmla", "FlashMLAMetadataBuilder._build_decode"),
    Api("vllm.v1.attention.backends.mla.flashmla", "num_compute_units"),
    Api("vllm.v1.attention.backends.mla.flashmla", "get_mla_metadata"),
    Api("vllm.v1.attention.backends.mla.flashmla", "get_mla_metadata_dense_fp8"),
    Api("vllm.v1.attention.ops.flashmla", "FlashMLASchedMeta"),
)  # fmt: skip
# runner_step_flashinfer: runner_step_v1's engine on the FlashInfer backend, the platform
# and TRT-LLM queries looked up in flashinfer.py and vllm.utils.flashinfer. flashinfer.py
# imports the flashinfer package at load, which a probe here does not stand in for: the
# backend is probed by the registry's name of it (the adapter imports it under its
# stand-in, where its builder's methods are looked up).
REQUIRES["runner_step_flashinfer"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.registry", "AttentionBackendEnum.FLASHINFER"),
    Api("vllm.v1.attention.backends.utils", "resolve_kv_cache_layout"),
    Api("vllm.v1.attention.backends.utils", "get_per_layer_parameters"),
    Api("vllm.utils.flashinfer", "current_platform"),
    Api("vllm.utils.flashinfer", "has_nvidia_artifactory"),
    Api("vllm.utils.flashinfer", "can_use_trtllm_attention"),
    Api("vllm.platforms.interface", "DeviceCapability"),
    Api("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
)  # fmt: skip
# runner_step_aiter_fa: runner_step_v1's engine on ROCm's AITER FlashAttention backend,
# its three-way split and the module's torch (pinned host memory) looked up there.
REQUIRES["runner_step_aiter_fa"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.rocm_aiter_fa", "AiterFlashAttentionBackend"),
    Api("vllm.v1.attention.backends.rocm_aiter_fa", "AiterFlashAttentionMetadataBuilder"
        ".build_for_drafting"),
    Api("vllm.v1.attention.backends.rocm_aiter_fa", "split_decodes_prefills_and_extends"),
    Api("vllm.v1.attention.backends.rocm_aiter_fa", "torch"),
    Api("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
)  # fmt: skip
# runner_step_cpu: runner_step_v1's engine as the CPU worker makes it (CPUModelRunner),
# on the CPU attention backend, whose C++ scheduler is looked up in _custom_ops.
REQUIRES["runner_step_cpu"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.worker.cpu_model_runner", "CPUModelRunner._postprocess_tensors"),
    Api("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackend"),
    Api("vllm.v1.attention.backends.cpu_attn", "CPUAttentionMetadataBuilder.build"),
    Api("vllm._custom_ops", "cpu_attn_get_scheduler_metadata"),
)  # fmt: skip
# runner_step_flex: runner_step_v1's engine on the FlexAttention backend.
REQUIRES["runner_step_flex"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.flex_attention", "FlexAttentionBackend"),
    Api("vllm.v1.attention.backends.flex_attention", "FlexAttentionMetadataBuilder.build"),
    Api("vllm.v1.attention.backend", "CommonAttentionMetadata.compute_num_computed_tokens"),
)  # fmt: skip

# runner_step_amx_mla: runner_step_mla's engine as the CPU worker makes it, on AMX MLA,
# the CPU's thread count looked up in amx_mla.py.
REQUIRES["runner_step_amx_mla"] = REQUIRES["runner_step_mla"] + REQUIRES["runner_step_cpu"] + (
    Api("vllm.v1.attention.backends.mla.amx_mla", "AMXMLABackend"),
    Api("vllm.v1.attention.backends.mla.amx_mla", "AMXMLAMetadataBuilder.build"),
    Api("vllm.v1.attention.backends.mla.amx_mla", "current_platform"),
)  # fmt: skip
# runner_step_tokenspeed_mla: runner_step_mla's engine on the Tokenspeed MLA backend, its
# spec as the runner customizes it.
REQUIRES["runner_step_tokenspeed_mla"] = REQUIRES["runner_step_mla"] + (
    Api("vllm.v1.attention.backends.mla.tokenspeed_mla", "TokenspeedMLABackend"),
    Api("vllm.v1.attention.backends.mla.tokenspeed_mla", "TokenspeedMLAMetadataBuilder"),
    Api("vllm.v1.worker.utils", "customize_attention_spec"),
)  # fmt: skip
# runner_step_b12x: runner_step_v1's engine on the b12x backend, its spec as the runner
# customizes it.
REQUIRES["runner_step_b12x"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.b12x", "B12xPagedAttentionBackend"),
    Api("vllm.v1.attention.backends.b12x", "B12xPagedMetadataBuilder.build"),
    Api("vllm.v1.worker.utils", "customize_attention_spec"),
)  # fmt: skip
# runner_step_hpc: runner_step_v1's engine on the HPC backend, hpc-ops' scheduler stood in.
REQUIRES["runner_step_hpc"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.hpc_attn", "HpcAttentionBackend"),
    Api("vllm.v1.attention.backends.hpc_attn", "HpcAttnMetadataBuilder.build"),
)  # fmt: skip
# runner_step_qsa: runner_step_v1's engine with QSA's two side caches and their builder.
REQUIRES["runner_step_qsa"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.models.qwen4_exp.common.qsa_cache", "QSAMetadataBuilder.build"),
    Api("vllm.models.qwen4_exp.common.qsa_cache", "QSAKeyStateCache.get_kv_cache_spec"),
    Api("vllm.models.qwen4_exp.common.qsa_cache", "QSACompressedKeyCache.get_kv_cache_spec"),
    Api("vllm.models.qwen4_exp.nvidia.indexer_qsa", "QSAIndexer._metadata"),
)  # fmt: skip
# runner_step_inkling: runner_step_v1's engine with Inkling's short-convolution state group.
REQUIRES["runner_step_inkling"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.models.inkling.nvidia.sconv_swa_attn", "InklingSconvMetadataBuilder.build"),
    Api("vllm.models.inkling.nvidia.sconv_swa_attn", "InklingConvState.get_kv_cache_spec"),
    Api("vllm.models.inkling.amd.sconv_swa_attn", "InklingSconvMetadataBuilder.build"),
)  # fmt: skip
# runner_step_kpool_tail: runner_step_v1's engine with a kpool tail ring group.
REQUIRES["runner_step_kpool_tail"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.mla.indexer", "KpoolTailBackend"),
    Api("vllm.v1.attention.backends.mla.indexer", "KpoolTailMetadataBuilder.build"),
    Api("vllm.v1.kv_cache_interface", "CircularBufferSpec", keyword="dcp_sharded"),
)  # fmt: skip
# runner_step_triton_diffkv: runner_step_v1's engine on the DiffKV Triton backend.
REQUIRES["runner_step_triton_diffkv"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.triton_attn_diffkv", "TritonAttentionDiffKVBackend"
        ".set_head_size_v"),
    Api("vllm.v1.kv_cache_interface", "FullAttentionSpec", keyword="head_size_v"),
)  # fmt: skip
# runner_step_rocm: runner_step_v1's engine on ROCm's attention and Octave backends.
REQUIRES["runner_step_rocm"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.rocm_attn", "RocmAttentionBackend"),
    Api("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
)  # fmt: skip
REQUIRES["runner_step_rocm.run_segmented"] = (
    Api("vllm.v1.attention.backends.rocm_segmented_attn", "RocmSegmentedAttentionBackend"),
    Api("vllm.v1.attention.backends.rocm_segmented_attn", "RocmSegmentedAttentionMetadataBuilder"),
)  # fmt: skip
REQUIRES["runner_step_rocm.run_octave"] = (
    Api("vllm.v1.attention.backends.rocm_octave_attn", "RocmOctaveAttentionBackend"),
    Api("vllm.v1.attention.backends.rocm_octave_attn", "RocmOctaveMetadataBuilder"
        "._fill_query_maps"),
)  # fmt: skip
# runner_step_turboquant: runner_step_v1's engine (and runner_step_v1_async's) on the
# TurboQuant backend, whose host copies the CommonAttentionMetadata's upper bound.
REQUIRES["runner_step_turboquant"] = REQUIRES["runner_step_v1_async"] + (
    Api("vllm.v1.attention.backends.turboquant_attn", "TurboQuantAttentionBackend"),
    Api("vllm.v1.attention.backend", "CommonAttentionMetadata.seq_lens_cpu_upper_bound"),
    Api("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
)  # fmt: skip
# runner_step_sparse_mla: runner_step_mla's engine on the FlashMLA sparse backend, the SM
# count looked up in flashmla_sparse.py.
REQUIRES["runner_step_sparse_mla"] = REQUIRES["runner_step_mla"] + (
    Api("vllm.v1.attention.backends.mla.flashmla_sparse", "FlashMLASparseBackend"),
    Api("vllm.v1.attention.backends.mla.flashmla_sparse", "num_compute_units"),
    Api("vllm.model_executor.layers.attention.sparse_mla_attention",
        "SparseMLACommonMetadataBuilder._build_req_id_per_token"),
)  # fmt: skip
# runner_step_xpu_mla_sparse: runner_step_sparse_mla's engine (its attention group) on the
# XPU sparse MLA backend, whose builder is driven as it is (NEVER graph support).
REQUIRES["runner_step_xpu_mla_sparse"] = REQUIRES["runner_step_mla"] + (
    Api("vllm.v1.attention.backends.mla.xpu_mla_sparse", "XPUMLASparseBackend"),
    Api("vllm.v1.attention.backends.mla.xpu_mla_sparse", "XPUMLASparseBackend"
        ".get_supported_head_sizes"),
    Api("vllm.v1.attention.backends.mla.xpu_mla_sparse", "XPUMLASparseMetadataBuilder.build"),
    Api("vllm.v1.attention.backends.mla.xpu_mla_sparse", "XPUMLASparseMetadata"
        ".num_decode_tokens"),
    Api("vllm.v1.attention.backend", "AttentionBackend.supports_block_size"),
    Api("vllm.v1.attention.backend", "AttentionBackend.supports_head_size"),
    Api("vllm.config", "CUDAGraphMode.decode_mode"),
)  # fmt: skip
# runner_step_flashinfer_mla_sparse: runner_step_sparse_mla's engine on FlashInfer's
# TRT-LLM and SM120 sparse MLA backends.
REQUIRES["runner_step_flashinfer_mla_sparse"] = REQUIRES["runner_step_sparse_mla"] + (
    Api("vllm.v1.attention.backends.mla.flashinfer_mla_sparse",
        "FlashInferMLASparseTRTLLMBackend"),
    Api("vllm.v1.attention.backends.mla.flashinfer_mla_sparse",
        "FlashInferMLASparseTRTLLMMetadataBuilder"),
)  # fmt: skip
REQUIRES["runner_step_flashinfer_mla_sparse.run_sm120"] = (
    Api("vllm.v1.attention.backends.mla.flashinfer_mla_sparse",
        "FlashInferMLASparseSM120Backend"),
    Api("vllm.v1.attention.backends.mla.flashinfer_mla_sparse",
        "FlashInferMLASparseMetadataBuilder"),
)  # fmt: skip
# runner_step_flashattn_mla_sparse: runner_step_sparse_mla's engine on FlashAttention's
# sparse MLA backend.
# runner_step_step5_dsa: runner_step_flash_attn's engine on Step5's DSA backend, whose
# package imports torchvision at load (stood in for that import, as the adapter does).
_NO_TORCHVISION = "attnfuzz.adapters.vllm.runner_step_step5_dsa:torchvision_stood_in"
REQUIRES["runner_step_step5_dsa"] = REQUIRES["runner_step_flash_attn"] + (
    Api("vllm.models.step5.nvidia.sparse_attention", "Step5DSAAttentionBackend",
        within=_NO_TORCHVISION),
    Api("vllm.models.step5.nvidia.sparse_attention", "Step5DSAMetadataBuilder.build",
        within=_NO_TORCHVISION),
    Api("vllm.models.step5.nvidia.csa_tail_ring", "Step5CSATailRing.get_kv_cache_spec",
        within=_NO_TORCHVISION),
    Api("vllm.models.step5.nvidia.csa_tail_ring", "Step5CSATailRing.bind_kv_cache",
        within=_NO_TORCHVISION),
    Api("vllm.models.step5.nvidia.csa_tail_ring", "Step5CSATailRingMetadataBuilder.build",
        within=_NO_TORCHVISION),
    Api("vllm.v1.kv_cache_interface", "CircularBufferSpec"),
)  # fmt: skip
# The backend's module is imported with vllm.vllm_flash_attn's package stood in (its
# __init__ raises without the CUDA extensions), as the adapter imports it.
_FA_PACKAGE = "attnfuzz.adapters.vllm.runner_step_flashattn_mla_sparse:fa_package"
REQUIRES["runner_step_flashattn_mla_sparse"] = REQUIRES["runner_step_sparse_mla"] + (
    Api("vllm.v1.attention.backends.mla.flashattn_mla_sparse", "FlashAttnMLASparseBackend",
        within=_FA_PACKAGE),
    Api("vllm.v1.attention.backends.mla.flashattn_mla_sparse",
        "FlashAttnMLASparseMetadataBuilder", within=_FA_PACKAGE),
)  # fmt: skip

# runner_step_aiter_mla: runner_step_mla's engine on ROCm's AITER MLA backend, the GPU's
# architecture read at import of vllm.platforms.rocm (which needs one), AITER's metadata
# calls imported by the builder from the aiter package.
REQUIRES["runner_step_aiter_mla"] = REQUIRES["runner_step_mla"] + (
    Api("vllm.v1.attention.backends.mla.rocm_aiter_mla", "AiterMLABackend"),
    Api("vllm.v1.attention.backends.mla.rocm_aiter_mla", "AiterMLAMetadataBuilder._build_decode"),
    Api("vllm.v1.attention.backends.mla.rocm_aiter_mla", "_expand_page_indices_kernel"),
)  # fmt: skip

# runner_step_aiter_mla_sparse: runner_step_sparse_mla's engine on ROCm's AITER MLA
# sparse backend, with runner_step_aiter_mla's stand-ins and the platform's CU count.
REQUIRES["runner_step_aiter_mla_sparse"] = REQUIRES["runner_step_sparse_mla"] + (
    Api("vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse", "ROCMAiterMLASparseBackend"),
    Api("vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse",
        "ROCMAiterMLASparseMetadataBuilder.build"),
    Api("vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse", "generate_sparse_seqlen_triton"),
    Api("vllm.platforms.interface", "Platform.num_compute_units"),
)  # fmt: skip

# runner_step_sparse_swa: runner_step_v1's engine with its attention layer DeepSeek-V4's
# SWA cache on the sparse SWA backend, the platform and FlashMLA's planner looked up in
# sparse_swa.py; the prefill chunk plan as DeepseekV4Attention's chunk size cuts it.
REQUIRES["runner_step_sparse_swa"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.mla.sparse_swa", "DeepseekSparseSWABackend"),
    Api("vllm.v1.attention.backends.mla.sparse_swa", "DeepseekV4SWACache"),
    Api("vllm.v1.attention.backends.mla.sparse_swa", "DeepseekSparseSWAMetadataBuilder.build"),
    Api("vllm.v1.attention.backends.mla.sparse_swa",
        "DeepseekSparseSWAMetadata.get_prefill_chunk_plan"),
    Api("vllm.v1.attention.backends.mla.sparse_swa", "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL"),
    Api("vllm.v1.attention.backends.mla.sparse_swa", "current_platform"),
    Api("vllm.v1.attention.backends.mla.sparse_swa", "get_mla_metadata"),
    Api("vllm.models.deepseek_v4.attention", "DeepseekV4Attention.PREFILL_CHUNK_SIZE"),
)  # fmt: skip

# runner_step_sparse_swa_cpu: runner_step_sparse_swa's engine as the CPU worker makes it,
# the CPU platform's builder of the SWA cache, the plans' layer types looked up in
# sparse_swa.py.
REQUIRES["runner_step_sparse_swa_cpu"] = (
    REQUIRES["runner_step_sparse_swa"] + REQUIRES["runner_step_cpu"] + (
        Api("vllm.models.deepseek_v4.cpu.cpu_mla",
            "DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler"),
        Api("vllm.v1.attention.backends.mla.sparse_swa", "_LAYER_TYPE_SWAONLY"),
    )
)  # fmt: skip

# runner_step_minimax_m3: runner_step_v1's engine with MiniMax M3's sparse layers, its
# KV-cache and attention groups vLLM's own. The MiniMax M3 modules themselves are not
# named here: their package's __init__ imports the model's vision tower (torchvision,
# absent from the CPU install), so the adapter imports them without it (_modules) and
# a probe here could not; the backend registry's entry says the release has them.
REQUIRES["runner_step_minimax_m3"] = REQUIRES["runner_step_v1"] + (
    Api("vllm.v1.attention.backends.registry", "AttentionBackendEnum.MINIMAX_M3_SPARSE"),
    Api("vllm.config.attention", "AttentionConfig.resolve_indexer_kv_dtype"),
    Api("vllm.config.attention", "MiniMaxM3MSADecodeBackend"),
    Api("vllm.v1.core.kv_cache_planning", "get_kv_cache_groups"),
    Api("vllm.v1.kv_cache_interface", "SparseCacheRole"),
    Api("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_attn_backend"),
    Api("vllm.v1.worker.utils", "customize_attention_spec"),
)  # fmt: skip

# runner_step_deepseek_v41: runner_step_sparse_swa's engine (its SWA fields) with
# DeepSeek-V4.1's caches made by their constructors, grouped by vLLM's planner; the
# platform, DeepGEMM's and DeepSelect's queries and DeepGEMM's schedule looked up where
# the modules read them; the builder the mutant recompiles.
REQUIRES["runner_step_deepseek_v41"] = REQUIRES["runner_step_sparse_swa"] + (
    Api("vllm.models.deepseek_v41.attention", "DeepseekV4Attention.get_kv_cache_spec"),
    Api("vllm.models.deepseek_v41.attention", "DeepseekV4Attention.PREFILL_CHUNK_SIZE"),
    Api("vllm.models.deepseek_v41.attention", "DeepseekV4IndexerCache"),
    Api("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype"),
    Api("vllm.models.deepseek_v41.attention", "_use_v41_mxfp8_kv_record"),
    Api("vllm.models.deepseek_v41.attention", "_indexer_k_cache_head_dim"),
    Api("vllm.models.deepseek_v41.attention", "current_platform"),
    Api("vllm.models.deepseek_v41.nvidia.flashmla", "DeepseekV4FlashMLAAttention.backend_cls"),
    Api("vllm.models.deepseek_v41.nvidia.flashmla",
        "DeepseekV4FlashMLAAttention.swa_backend_cls"),
    Api("vllm.models.deepseek_v41.compressor", "CompressorStateCache"),
    Api("vllm.models.deepseek_v41.compressor", "CompressorMetadataBuilder.build"),
    Api("vllm.models.deepseek_v41.sparse_mla", "DeepseekV4SparseMLAMetadataBuilder.build"),
    Api("vllm.models.deepseek_v41.sparse_mla", "DeepseekV41SparseSWAMetadataBuilder.build"),
    Api("vllm.models.deepseek_v41.sparse_mla", "current_platform"),
    Api("vllm.v1.attention.backends.mla.sparse_indexer",
        "DeepseekV41SparseIndexerMetadataBuilder.build"),
    Api("vllm.v1.attention.backends.mla.sparse_indexer", "current_platform"),
    Api("vllm.v1.attention.backends.mla.sparse_indexer", "has_deep_gemm_sparse_mqa"),
    Api("vllm.v1.attention.backends.mla.sparse_indexer", "has_deep_select"),
    Api("vllm.v1.attention.backends.mla.indexer", "current_platform"),
    Api("vllm.v1.attention.backends.mla.indexer", "has_deep_gemm"),
    Api("vllm.v1.attention.backends.mla.indexer", "num_compute_units"),
    Api("vllm.v1.attention.backends.mla.indexer", "get_paged_mqa_logits_metadata"),
    Api("vllm.v1.attention.backends.mla.indexer", "get_max_prefill_buffer_size"),
    Api("vllm.v1.attention.backends.mla.indexer", "dsa_indexer_uses_fp4"),
    Api("vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits",
        "get_deep_select_stride_requirement"),
    Api("vllm.v1.attention.backends.utils", "get_supported_kv_cache_layouts"),
    Api("vllm.v1.attention.backends.utils", "resolve_kv_cache_layout"),
    Api("vllm.v1.core.kv_cache_planning", "get_kv_cache_groups"),
    Api("vllm.v1.kv_cache_interface", "CircularBufferSpec"),
    Api("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.initialize_attn_backend"),
    Api("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.get_kv_cache_spec"),
)  # fmt: skip

# runner_step_sparse_mla_fp8: runner_step_sparse_mla's engine, its cache fp8_ds_mla:
# FlashMLA's schedule call and torch looked up in flashmla_sparse.py.
REQUIRES["runner_step_sparse_mla_fp8"] = REQUIRES["runner_step_sparse_mla"] + (
    Api("vllm.v1.attention.backends.mla.flashmla_sparse",
        "FlashMLASparseMetadataBuilder._build_fp8_separate_prefill_decode"),
    Api("vllm.v1.attention.backends.mla.flashmla_sparse", "get_mla_metadata"),
    Api("vllm.v1.attention.backends.mla.flashmla_sparse", "torch"),
    Api("vllm.v1.attention.ops.flashmla", "FlashMLASchedMeta"),
)  # fmt: skip

# runner_step_backends: runner_step_v1's engine beside runner_step_flash_attn's,
# runner_step_flashinfer's, runner_step_mla's, runner_step_flashmla's,
# runner_step_aiter_fa's and runner_step_aiter_mla's (their entries: every API each
# calls), the MLA and AITER engines' rows put back in the Triton engine's order.
REQUIRES["runner_step_backends"] = tuple(
    dict.fromkeys(
        REQUIRES["runner_step_flash_attn"]
        + REQUIRES["runner_step_flashinfer"]
        + REQUIRES["runner_step_mla"]
        + REQUIRES["runner_step_flashmla"]
        + REQUIRES["runner_step_aiter_fa"]
        + REQUIRES["runner_step_aiter_mla"]
    )
)


def requirements(module: str, attr: str) -> tuple[Api, ...]:
    return REQUIRES.get(module, ()) + REQUIRES.get(f"{module}.{attr}", ())


def binding_problem(module: str, attr: str, version: str) -> str | None:
    """Why ``adapters.vllm.<module>.<attr>`` cannot bind to the installed vLLM
    (``version``), in one line naming the missing API and a release that has all
    it calls; None when it binds."""
    problem = range_problem(version)
    if problem is not None:
        return problem
    apis = requirements(module, attr)
    for api in apis:
        why = api.missing()
        if why is not None:
            hint = binding.install_hint("vLLM", apis, version, why, install_line)
            return f"vLLM {version}: {why}{hint}"
    return None
