"""vLLM as an attnfuzz engine: the ``attnfuzz.engines`` entry point ``vllm``.

:data:`VLLM` declares what vLLM adds to attnfuzz's targets: its own code as an
implementation of each target (kind ``engine``), and its upstream mutants (the
real function with a fix reverted, kind ``mutant``) with the trigger, reach and
smallest case of the bug, which live with the target they belong to.

The adapter functions are named by module and attribute, imported on first call
(:class:`attnfuzz.adapters.vllm.EngineCall`): importing an adapter sets vLLM's
environment up, and some import vLLM itself, which every command but those that
run vLLM must not do. ``tests/test_engines.py`` checks that each name is a
function of its adapter module.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from attnfuzz.adapters import vllm
from attnfuzz.adapters.vllm import compat as vllm_compat
from attnfuzz.adapters.vllm import implementation as vllm_impl
from attnfuzz.adapters.vllm import limits, lookahead, standalone, standalone_reprefill
from attnfuzz.adapters.vllm.runner_choice import runner_choice
from attnfuzz.harness.callers import Argument, Callee, Condition
from attnfuzz.harness.engines import Engine, ShippedBug, StepPlanner
from attnfuzz.harness.errors import PlannerUnbound
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.targets import (
    decode_split,
    draft_block_tables,
    flatten_decode,
    flex_block_mask,
    indexer_decode,
    max_seq_len,
    mtp_seq_lens,
    slot_mapping,
    unpadding,
)
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.trace import Trace


def reach_native_table(case: Case) -> bool:
    """``mtp-seq-lens``'s ``reach_table``, where vLLM takes the native path on this
    platform (the upstream mutants live in it; vLLM on the CPU flattens ``next_n > 2``)."""
    from attnfuzz.adapters.vllm.mtp_seq_lens import takes_native_path

    return mtp_seq_lens.reach_table(case) and takes_native_path(case.config)


def trigger_native_strided(case: Case) -> bool:
    """``mtp-seq-lens``'s ``trigger_strided`` on vLLM's native path."""
    from attnfuzz.adapters.vllm.mtp_seq_lens import takes_native_path

    return mtp_seq_lens.trigger_strided(case) and takes_native_path(case.config)


def _decode_split() -> list[Implementation]:
    t = decode_split
    return [
        vllm_impl(
            "decode_split",
            "run",
            description="installed vLLM: v1/attention/backends/utils.py:"
            "split_decodes_and_prefills, split_decodes_prefills_and_extends",
        ),
        vllm_impl(
            "decode_split",
            "upstream_padding_as_prefills",
            name="upstream-pr29644-padding-as-prefills",
            kind="mutant",
            description="vLLM 0.33.0 split_decodes_and_prefills with #29644's uniform branch "
            "reverted: padding requests are prefills",
            trigger=t.trigger_padding_as_prefills,
            reach=t.reach_uniform,
            smallest=t.smallest_padding_as_prefills,
        ),
    ]


def _draft_block_tables() -> list[Implementation]:
    t = draft_block_tables
    return [
        vllm_impl(
            "draft_block_tables",
            "run",
            description="installed vLLM: vllm/v1/spec_decode/gemma4.py:"
            "Gemma4Proposer.build_per_group_and_layer_attn_metadata",
            admits=limits.drafter_admits,  # a drafter runs with speculative tokens only
        ),
        vllm_impl(
            "draft_block_tables",
            "upstream_pr43982_padded_table",
            name="upstream-pr43982-padded-table",
            kind="mutant",
            description="vLLM 0.33.0's Gemma4Proposer.build_per_group_and_layer_attn_metadata "
            "with #43982 reverted: each group's stored [R_pad, W_g] table handed on unsliced",
            trigger=t.trigger_padded_table,
            reach=t.reach_padded_table,
            smallest=t.smallest_padded_table,
            admits=limits.drafter_admits,
        ),
    ]


def _flatten_decode() -> list[Implementation]:
    t = flatten_decode
    return [
        vllm_impl(
            "flatten_decode",
            "run",
            declines="declines",
            description="installed vLLM: vllm/v1/attention/backends/mla/indexer.py:"
            "DeepseekV32IndexerMetadataBuilder.build (_prepare_decode_tensors, flattening)",
        ),
        vllm_impl(
            "flatten_decode",
            "upstream_unaligned_width",
            name="upstream-pr50302-unaligned-width",
            kind="mutant",
            declines="declines",
            description="installed vLLM with #50302 reverted: expanded block table of "
            "cdiv(max_model_len, block_size) columns, narrower than the runner's aligned table",
            trigger=t.trigger_unaligned_width,
            reach=t.reach_decodes,
            smallest=t.smallest_unaligned_width,
        ),
    ]


def _flex_block_mask() -> list[Implementation]:
    t = flex_block_mask
    return [
        vllm_impl(
            "flex_block_mask",
            "run",
            declines="declines",
            description="installed vLLM: vllm/v1/attention/backends/flex_attention.py:"
            "FlexAttentionMetadataBuilder.build",
        ),
        vllm_impl(
            "flex_block_mask",
            "upstream_capacity",
            name="upstream-pr39353-capacity",
            kind="mutant",
            declines="declines",
            description="vLLM 0.33.0's FlexAttentionMetadataBuilder with its persistent "
            "tables sized as before #39353: [max_model_len, cdiv(max_model_len, bs)] "
            "(reconstructed)",
            trigger=t.trigger_upstream_capacity,
            reach=t.reach_upstream_capacity,
            smallest=t.smallest_capacity,
        ),
    ]


def _indexer_decode() -> list[Implementation]:
    t = indexer_decode
    glue = "model_executor/layers/sparse_attn_indexer.py"
    # The ROCm glue and DeepSeek-V4.1's gfx942 --monokernel indexer layer (its own copy of
    # the ROCm decode branch, _decode_step) still write back buffer[:N_d] (#39542 was fixed
    # in sparse_attn_indexer only): shipped code with bug A, filed with the mutants (caught,
    # with #39542's trigger) until vLLM fixes it.
    bug_a = dict(
        trigger=t.trigger_engine_writeback,
        reach=t.reach_engine_padding,
        smallest=t.smallest_writeback,
    )
    return [
        vllm_impl(
            "indexer_decode",
            "run",
            description=f"installed vLLM: {glue}:sparse_attn_indexer "
            "(CUDA path, vendor ops stood in)",
        ),
        vllm_impl(
            "indexer_decode",
            "run_xpu",
            name="vllm-xpu",
            description=f"installed vLLM: {glue}:sparse_attn_indexer, its XPU branches "
            "(XPU kernels stood in)",
        ),
        vllm_impl(
            "indexer_decode",
            "run_rocm",
            name="vllm-rocm",
            kind="mutant",
            description="installed vLLM: v1/attention/ops/rocm_aiter_mla_sparse.py:"
            "rocm_aiter_sparse_attn_indexer (AITER kernels stood in); still has #39542's "
            "write-back of buffer[:N_d]",
            standalone=standalone.rocm_writeback,
            **bug_a,
        ),
        vllm_impl(
            "indexer_decode",
            "run_cpu",
            name="vllm-cpu",
            description=f"installed vLLM: {glue}:SparseAttnIndexer.forward_cpu with the CPU "
            "platform's own metadata builder (CPU kernels stood in); it takes index_topk 512, "
            "indexer head dim 128 and no native MTP only; the CPU platform captures no "
            "CUDA graphs, so its steps are never padded",
            # platforms/cpu.py:CpuPlatform.check_and_update_config empties the capture
            # sizes: no graph keys, every step dispatches to NONE.
            fixes={"topk": 512, "head_dim": 128, "next_n": 1, "cudagraph_mode": "NONE"},
        ),
        vllm_impl(
            "indexer_decode",
            "run_deepseek_v41_amd",
            name="vllm-deepseek-v41-amd",
            kind="mutant",
            description="installed vLLM: models/deepseek_v41/amd/ops/sparse_indexer.py:"
            "gfx942_sparse_attn_indexer (--monokernel on gfx942; gfx942 top-512, AITER and "
            "torch.ops._C kernels stood in); its _decode_step still has #39542's write-back "
            "of buffer[:N_d]",
            standalone=standalone.deepseek_v41_amd_writeback,
            **bug_a,
        ),
        vllm_impl(
            "indexer_decode",
            "upstream_pr39542",
            name="upstream-pr39542-decode",
            kind="mutant",
            description=f"#39542 reverted in {glue}:sparse_attn_indexer: unsliced seq_lens, "
            "write-back of buffer[:N_d]",
            **bug_a,
        ),
    ]


def _max_seq_len() -> list[Implementation]:
    t = max_seq_len
    # vLLM's own bounds; the consumer (the paged walk) stays attnfuzz's, run on them.
    draft = (
        "draft: the drafter init_speculator builds (spec_decode/speculator.py:"
        "DraftModelSpeculator from 0.23.0, spec_decode/eagle/speculator.py:"
        "EagleSpeculator._build_draft_attn_metadata before)"
    )
    out = [
        vllm_impl(
            "max_seq_len",
            attr,
            name=name,
            description=f"installed vLLM: model_states/{where}.prepare_attn; {draft}; "
            "attnfuzz's paged walk",
        )
        for attr, name, where in (
            ("run", "vllm", "default.py:DefaultModelState"),
            ("run_mamba_hybrid", "vllm-mamba-hybrid", "mamba_hybrid.py:MambaHybridModelState"),
        )
    ]
    return [
        *out,
        vllm_impl(
            "max_seq_len", "run_v1", name="vllm-v1",
            description="installed vLLM (V1 runner): gpu_model_runner.py:GPUModelRunner."
            f"_build_attention_metadata; {draft} (V1's drafter raises its bound per "
            "decode step); attnfuzz's paged walk",
        ),
        vllm_impl(
            "max_seq_len", "upstream_model_len", name="upstream-pr43991-model-len",
            kind="mutant",
            description="vLLM #43991 reverted: MambaHybridModelState.prepare_attn passes "
            "max_seq_len=self.max_model_len outside capture too",
            trigger=t.trigger_model_len, reach=t.reach_model_len, smallest=t.smallest_model_len,
        ),
        vllm_impl(
            "max_seq_len", "upstream_draft_model_len", name="upstream-pr43991-draft-model-len",
            kind="mutant",
            description="vLLM #43991 reverted: DraftModelSpeculator._build_attn_metadata passes "
            "max_seq_len=self.max_model_len",
            trigger=t.trigger_draft_model_len, reach=t.reach_draft_model_len,
            smallest=t.smallest_draft_model_len,
        ),
    ]  # fmt: skip


def _mtp_seq_lens() -> list[Implementation]:
    t = mtp_seq_lens
    native_strided = dict(
        trigger=trigger_native_strided, reach=reach_native_table, smallest=t.smallest_strided
    )
    return [
        vllm_impl(
            "mtp_seq_lens",
            "run",
            description="installed vLLM: vllm/v1/attention/backends/mla/indexer.py:"
            "DeepseekV32IndexerMetadataBuilder.build (decode.seq_lens)",
        ),
        vllm_impl(
            "mtp_seq_lens",
            "upstream_strided",
            name="upstream-pr42135-strided",
            kind="mutant",
            description="installed vLLM's builder with #42135 reverted: the [max_num_seqs, next_n] "
            "decode_seq_lens_buffer sliced [:B, :L]",
            **native_strided,
        ),
        vllm_impl(
            "mtp_seq_lens",
            "upstream_copy",
            name="upstream-pr42135-copy",
            kind="mutant",
            description="installed vLLM's builder with #42135's first fix: the 2-D slice made "
            ".contiguous(), a copy per step",
            **native_strided,
        ),
    ]


def _persistent_batch() -> list[Implementation]:
    return [
        vllm_impl(
            "persistent_batch",
            "run",
            description="installed vLLM (V2 runner): vllm/v1/worker/gpu/model_runner.py:"
            "GPUModelRunner's finish_requests, add_requests, update_requests, "
            "postprocess_sampled and prepare_attn on its RequestState, BlockTables and "
            "InputBuffers, kept across the steps",
            declines="declines",
            traced=True,
        ),
    ]


def capture_past_row(config: EngineConfig) -> bool:
    """Whether a capture size of ``config`` is longer than a block-table row reaches
    (``runner_table_width(max_model_len, block_size) * block_size``). vLLM 0.33.0 runs
    dummy requests of such a PIECEWISE size whose ``seq_len`` the attention kernel reads
    through a row holding fewer pages: the capture's (``min(num_tokens, max_num_seqs)``
    requests: one with ``max_num_seqs`` 1) and an idle data-parallel rank's
    (``execute_model``'s dummy branch: ``batch_desc.num_reqs or num_reqs`` = 1 request
    of all the tokens). ``--cuda-graph-sizes`` accepts such sizes
    (``VllmConfig._set_cudagraph_sizes`` caps them by ``max_num_batched_tokens`` only)."""
    from attnfuzz.reference.batch import runner_table_width

    reach = runner_table_width(config.max_model_len, config.block_size) * config.block_size
    return max(config.cudagraph_capture_sizes, default=0) > reach


def _reach_piecewise_capture(trace: Trace) -> bool:
    """The V2 runner captures PIECEWISE sizes (its dummy runs of every size)."""
    config = trace.config
    return config.runner == "v2" and config.cudagraph_mode in ("PIECEWISE", "FULL_AND_PIECEWISE")


def _trigger_dummy_past_row(trace: Trace) -> bool:
    return _reach_piecewise_capture(trace) and capture_past_row(trace.config)


def _smallest_dummy_past_row() -> Trace:
    """Seed 0's minimized witness: one request of one token on an engine of
    ``max_model_len`` 8 (a row of 128 pages of one token) with a capture size of 132; the
    request holds the pages vLLM's scheduler gives it, its token and the drafter's
    lookahead of three (``lookahead.num_lookahead_tokens``)."""
    config = EngineConfig(
        max_model_len=8, max_num_seqs=1, max_num_batched_tokens=164, block_size=1,
        num_spec=3, cudagraph_capture_sizes=(4, 132), cudagraph_mode="FULL_AND_PIECEWISE",
        cg_support="UNIFORM_BATCH", runner="v2",
    )  # fmt: skip
    step = Batch((0,), (1,), 0, True, req_ids=(0,), pages=((1, 2, 3, 4),), new_pages=(4,))
    return Trace(config, (step,))


def warm_up_without_requests(config: EngineConfig) -> bool:
    """Whether the V2 worker's kernel warm-up of an engine of ``config`` runs none of its
    requests and then decodes its request 0 anyway (``v1/worker/gpu/warmup.py``
    ``_warmup_kernels``: ``min(max_num_seqs, max_num_batched_tokens // (decode_query_len
    + 1))`` requests of ``decode_query_len + 1`` prompt tokens; under drafts a decode of
    ``[0]`` without drafts whatever that count): an IndexError at vLLM 0.33.0's start-up.
    ``decode_query_len`` is ``next_n``. vLLM's config checks let the one budget through
    (``limits.config_admits``): ``next_n`` = the drafter's lookahead plus one, for an
    EAGLE, MTP or draft-model drafter (DFlash reserves one slot more)."""
    return config.num_spec > 0 and config.max_num_batched_tokens < config.next_n + 1


def _reach_v2_drafts(trace: Trace) -> bool:
    """The V2 worker warms its kernels up with drafts (``kernel_config.enable_jit_warmup``,
    on by default)."""
    return trace.config.runner == "v2" and trace.config.num_spec > 0


def _trigger_warm_up_without_requests(trace: Trace) -> bool:
    return _reach_v2_drafts(trace) and warm_up_without_requests(trace.config)


def _smallest_warm_up_without_requests() -> Trace:
    """The smallest engine of the warm-up's IndexError: one draft (``next_n`` 2), a budget
    of 2 tokens (above the lookahead of one, so vLLM accepts it), one request at a time;
    its first step a one-token prefill, never reached."""
    config = EngineConfig(
        max_model_len=8, max_num_seqs=1, max_num_batched_tokens=2, block_size=1,
        num_spec=1, cudagraph_capture_sizes=(2,), cudagraph_mode="FULL_AND_PIECEWISE",
        cg_support="UNIFORM_BATCH", runner="v2",
    )  # fmt: skip
    step = Batch((0,), (1,), 0, True, req_ids=(0,), pages=((1, 2),), new_pages=(2,))
    return Trace(config, (step,))


def _lazy(module: str, name: str) -> Any:
    """The function ``name`` of the adapter module ``module`` (of this package), imported
    (with vLLM) when called: a mutant's trigger, reach and smallest trace are declared
    here, where vLLM is not imported."""

    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)(*args)

    call.__name__ = call.__qualname__ = name
    return call


_step_impl = functools.partial(
    vllm_impl,
    lookahead=lookahead.num_lookahead_tokens,
    admits=limits.step_admits,
    as_run=_lazy("runner_step", "with_peer"),
)
"""An implementation of ``runner-step``: vLLM's scheduler reserves its drafter's
lookahead, so a drawn trace's requests hold those pages too (``Implementation.lookahead``;
``lookahead.declines`` refuses a step without them), and keeps the model's last position
for the token a step samples (``limits.step_admits``); the runner decides each step's graph
mode beside the data-parallel peer the adapter puts there (``Implementation.as_run``)."""

_mamba_hybrid_hook = functools.partial(_lazy, "runner_step_mamba_hybrid")


_v1_hook = functools.partial(_lazy, "runner_step_v1")


_v1_draft_model_hook = functools.partial(_lazy, "runner_step_v1_draft_model")


_chunked_local_hook = functools.partial(_lazy, "runner_step_chunked_local")


_hybrid_hook = functools.partial(_lazy, "runner_step_hybrid")


_linear_hook = functools.partial(_lazy, "runner_step_linear")


_mtp_modules_hook = functools.partial(_lazy, "runner_step_mtp_modules")


_mamba_align_hook = functools.partial(_lazy, "runner_step_mamba_align")


def _runner_step_mamba_align() -> list[Implementation]:
    """``vllm-v1-mamba2``'s and ``vllm-v1-hybrid``'s steps with prefix caching on
    (``mamba_cache_mode`` align, vLLM's default for a hybrid model), and a mutant of the
    runner's state copy."""
    # No drafts for Mamba2: its state here has no speculative columns (GDN's has).
    fixes = {"next_n": 1}
    return [
        _step_impl(
            "runner_step_mamba_align", "run", name="vllm-v1-mamba2-align", fixes=fixes,
            description="installed vLLM (V1 runner) of a hybrid Mamba2 model with prefix "
            "caching on, as vLLM serves one by default (mamba_cache_mode align, "
            "mamba_block_size the block size): vllm-v1-mamba2's step, the runner's own "
            "preprocess_mamba (vllm/v1/worker/mamba_utils.py: each request's state block "
            "moved into the block of its last token, collect_mamba_copy_meta, "
            "do_mamba_copy_block's batch_memcpy kernel) over real state caches; the state "
            "each request's kernels read held to the one it left",
            declines="declines", traced=True,
        ),
        _step_impl(
            "runner_step_mamba_align", "run_gdn", name="vllm-v1-hybrid-align",
            description="installed vLLM (V1 runner) of a hybrid GDN model (Qwen3-Next's "
            "linear attention) with prefix caching on, as vLLM serves one by default: "
            "vllm-v1-hybrid's step in mamba_cache_mode align, as vllm-v1-mamba2-align "
            "(the runner's preprocess_mamba over real state caches, the model's "
            "gated_delta_net_state_copy_func; the state each request's kernels read held "
            "to the one it left); with drafts, MambaManager's speculative blocks, the "
            "fused pre-copy (precopy_mamba_align_fused_kernel) and the fused post-copy "
            "after sampling (postprocess_mamba_align_gpu) of a hybrid model's spec decode",
            declines="declines_gdn", traced=True,
        ),
        _step_impl(
            "runner_step_mamba_align", "run_copy_skipped",
            name="vllm-v1-mamba2-align-copy-skipped", kind="mutant", fixes=fixes,
            declines="declines",
            description="installed vLLM (V1 runner, hybrid Mamba2, align mode) with "
            "collect_mamba_copy_meta returning early on src_block_idx == dest_block_idx "
            "or accept_token_bias == 0: without drafts a request moving into a new block "
            "reads that block's stale state",
            trigger=_mamba_align_hook("trigger_copy_skipped"),
            reach=_mamba_align_hook("reach_align"),
            smallest=_mamba_align_hook("smallest_copy_skipped"), traced=True,
        ),
        _step_impl(
            "runner_step_mamba_align", "run_precopy_unbiased",
            name="vllm-v1-hybrid-align-precopy-unbiased", kind="mutant",
            declines="declines_gdn",
            description="installed vLLM (V1 runner, hybrid GDN, align mode, drafts) with "
            "the fused pre-copy of a spec decode (MambaSpecDecodeGPUContext."
            "run_fused_precopy) handed a token bias of 0: a request that accepted drafts "
            "and moves into a new block reads the state of its last step's first token",
            trigger=_mamba_align_hook("trigger_precopy_unbiased"),
            reach=_mamba_align_hook("reach_align_drafts"),
            smallest=_mamba_align_hook("smallest_precopy_unbiased"), traced=True,
        ),
    ]  # fmt: skip


_v2_align_hook = functools.partial(_lazy, "runner_step_v2_align")


def _runner_step_v2_align() -> list[Implementation]:
    """``vllm-v2-mamba-hybrid``'s step with prefix caching on (``mamba_cache_mode``
    align), the V2 runner's fused state copies driven, and a mutant of their seeding."""
    # The mutants' defects lie in steps without drafts.
    fixes = {"next_n": 1}
    return [
        _step_impl(
            "runner_step_v2_align", "run", name="vllm-v2-hybrid-align",
            description="installed vLLM (V2 runner) of a hybrid GDN model with prefix "
            "caching on, as vLLM serves one by default (mamba_cache_mode align): "
            "vllm-v2-mamba-hybrid's step, MambaHybridModelState's align path "
            "(MambaSpecDecodeGPUContext's metadata of the state caches, preprocess_state's "
            "preprocess_mamba_align_fused_kernel and run_fused_precopy, postprocess_state's "
            "run_fused_postprocess_align; vllm/v1/worker/mamba_utils.py) over real state "
            "caches; the state each request's kernels read held to the one it left",
            declines="declines", traced=True,
        ),
        _step_impl(
            "runner_step_v2_align", "seed_column_past",
            name="vllm-v2-hybrid-align-seed-column-past", kind="mutant", fixes=fixes,
            declines="declines",
            description="installed vLLM (V2 runner, hybrid GDN, align mode) with "
            "MambaHybridModelState.add_request seeding a request's running column with "
            "num_computed_tokens // mamba_block_size: a request new to the engine with "
            "whole blocks computed reads a state it never left",
            trigger=_v2_align_hook("trigger_seed_column_past"),
            reach=_v2_align_hook("reach_align"),
            smallest=_v2_align_hook("smallest_seed_column_past"), traced=True,
        ),
        _step_impl(
            "runner_step_v2_align", "decode_precopy_skipped",
            name="vllm-v2-hybrid-align-decode-precopy-skipped", kind="mutant", fixes=fixes,
            declines="declines",
            description="installed vLLM (V2 runner, hybrid GDN, align mode) with "
            "MambaHybridModelState.preprocess_state returning before its kernels on a step "
            "of decodes alone: a decode that crosses into a new block reads that block's "
            "stale state",
            trigger=_v2_align_hook("trigger_decode_precopy_skipped"),
            reach=_v2_align_hook("reach_align"),
            smallest=_v2_align_hook("smallest_decode_precopy_skipped"), traced=True,
        ),
        _step_impl(
            "runner_step_v2_align", "precopy_unbiased",
            name="vllm-v2-hybrid-align-precopy-unbiased", kind="mutant", declines="declines",
            description="installed vLLM (V2 runner, hybrid GDN, align mode, drafts) with "
            "the fused pre-copy of a spec decode (MambaSpecDecodeGPUContext."
            "run_fused_precopy) handed a token bias of 0: a request that accepted drafts "
            "and moves into a new block reads the state of its last step's first token",
            trigger=_v2_align_hook("trigger_precopy_unbiased"),
            reach=_v2_align_hook("reach_align_drafts"),
            smallest=_v2_align_hook("smallest_precopy_unbiased"), traced=True,
        ),
    ]  # fmt: skip


_encoder_decoder_hook = functools.partial(_lazy, "runner_step_encoder_decoder")


def _runner_step_encoder_decoder() -> list[Implementation]:
    """``vllm``'s step of an encoder-decoder model (the V2 runner's
    ``EncoderDecoderModelState``, the cross-attention group's builder), and a mutant of
    its cross-attention slots."""
    # Served without a speculator here, in the graph mode vLLM keeps for such a model (the
    # eager engine of every step runs NONE beside it); max_model_len 32, so that a budget
    # below it (declined: no chunked prefill) is seldom drawn.
    fixes = {"next_n": 1, "cudagraph_mode": "FULL_DECODE_ONLY", "max_model_len": 32}
    unchunked = {"fixes": fixes, "chunked_prefill": False}
    return [
        _step_impl(
            "runner_step_encoder_decoder", "run", name="vllm-v2-encoder-decoder",
            **unchunked,
            description="installed vLLM (V2 runner) of an encoder-decoder model (Whisper's "
            "family): vllm's step with the model's cross-attention, so that the runner "
            "keeps EncoderDecoderModelState (v1/worker/gpu/model_states/encoder_decoder.py: "
            "the encoder run on a request's first step, each request's encoder length in "
            "prepare_attn) and the cross-attention group's CrossAttentionBuilder "
            "(model_executor/layers/attention/cross_attention.py) builds its seq_lens and "
            "the slots its forward writes the encoder's keys to; every field of both "
            "groups judged, the cross-attention slots held to those each request reads",
            declines="declines", traced=True,
        ),
        _step_impl(
            "runner_step_encoder_decoder", "rows_by_rank",
            name="vllm-v2-encoder-decoder-rows-by-rank", kind="mutant", **unchunked,
            declines="declines",
            description="installed vLLM (V2 runner, encoder-decoder model) with "
            "_get_cross_slot_mapping reading each writing request's blocks from the "
            "block-table row of its rank among the writers: a request at its first step "
            "behind one past it writes its encoder's keys into the other's blocks",
            trigger=_encoder_decoder_hook("trigger_rows_by_rank"),
            reach=_encoder_decoder_hook("reach_encoder_decoder"),
            smallest=_encoder_decoder_hook("smallest_rows_by_rank"), traced=True,
        ),
    ]  # fmt: skip


_pcp_hook = functools.partial(_lazy, "runner_step_pcp")


def _runner_step_pcp() -> list[Implementation]:
    """The V2 runner's step of an MLA model with prefill context parallelism over two
    ranks, and a mutant of its partition."""
    fixes = {"next_n": 1}  # the ranks' draft prefill is not driven
    return [
        _step_impl(
            "runner_step_pcp", "run", name="vllm-pcp", fixes=fixes,
            description="installed vLLM (V2 runner) of an MLA model (Triton MLA) with "
            "prefill context parallelism over two ranks, each rank its own runner: "
            "vllm/v1/worker/gpu/pcp_manager.py: PCPManager.partition_batch (each prefill "
            "in 2*PCP chunks, decodes sharded), _build_batch_layout, "
            "get_num_tokens_for_dispatch, the gathered slot mappings, "
            "restore_for_sampling, the capture runs' PCP buffers; each rank's segments "
            "judged as micro-batches of the unpartitioned step",
            declines="declines", traced=True,
        ),
        _step_impl(
            "runner_step_pcp", "run_chunks_rounded_down",
            name="vllm-pcp-chunks-rounded-down", kind="mutant", fixes=fixes,
            declines="declines",
            description="installed vLLM (V2 runner, PCP 2) with "
            "PCPManager._iter_rank_chunks sizing a prefill's chunks by rounding down: the "
            "last tokens of a query not a multiple of 2*PCP run on no rank",
            trigger=_pcp_hook("trigger_chunks_rounded_down"),
            reach=_pcp_hook("reach_pcp"),
            smallest=_pcp_hook("smallest_chunks_rounded_down"), traced=True,
        ),
    ]  # fmt: skip


def _runner_step_linear() -> list[Implementation]:
    """``vllm-v1-hybrid``'s step with its linear layer on Mamba1, Mamba2, PLE short-conv
    or Bailing linear attention, and a mutant of three builders' FULL-graph staging."""
    engines = (
        (
            "run_mamba1",
            "declines_mamba1",
            "vllm-v1-mamba1",
            "a Mamba1 layer, no drafts (vllm/v1/attention/backends/mamba1_attn.py: "
            "Mamba1AttentionMetadataBuilder.build through mamba_attn.py's "
            "BaseMambaAttentionMetadataBuilder, build_for_cudagraph_capture)",
        ),
        (
            "run_mamba2",
            "declines",
            "vllm-v1-mamba2",
            "a Mamba2 layer (vllm/v1/attention/backends/"
            "mamba2_attn.py: Mamba2AttentionMetadataBuilder.build through mamba_attn.py's "
            "BaseMambaAttentionMetadataBuilder, build_for_cudagraph_capture)",
        ),
        (
            "run_ple_short_conv",
            "declines",
            "vllm-v1-ple-short-conv",
            "a PLE short-conv layer "
            "(vllm/v1/attention/backends/short_conv_attn.py: "
            "PleShortConvAttentionMetadataBuilder.build, build_for_cudagraph_capture)",
        ),
        (
            "run_bailing_linear",
            "declines_bailing_linear",
            "vllm-v1-bailing-linear",
            "a Bailing linear-attention layer (vllm/v1/attention/backends/linear_attn.py: "
            "BailingLinearAttentionMetadataBuilder.build, its FULL-graph staging of the "
            "decodes' state indices, query offsets and accepted counts, "
            "build_for_cudagraph_capture)",
        ),
    )
    mutants = (
        (
            "mamba2_pad_slot_states",
            "vllm-v1-mamba2-pad-slot-states",
            "trigger_full_decode",
            "hybrid.reach_full_graphs",
            "smallest_full_decode",
            "Mamba2AttentionMetadataBuilder.build staging a FULL decode's padding requests' "
            "state indices as PAD_SLOT_ID (-1), not NULL_BLOCK_ID",
        ),
        (
            "ple_short_conv_pad_slot_states",
            "vllm-v1-ple-short-conv-pad-slot-states",
            "hybrid.trigger_full_spec_decode",
            "hybrid.reach_full_spec_decode",
            "hybrid.smallest_full_spec_decode",
            "PleShortConvAttentionMetadataBuilder.build staging a FULL speculative decode's "
            "padding rows of spec_state_indices_tensor as PAD_SLOT_ID (-1), not NULL_BLOCK_ID",
        ),
        (
            "bailing_linear_last_state_padded",
            "vllm-v1-bailing-linear-last-state-padded",
            "trigger_full_decode",
            "hybrid.reach_full_graphs",
            "smallest_full_decode",
            "BailingLinearAttentionMetadataBuilder.build staging a FULL decode's last real "
            "request's state indices as PAD_SLOT_ID (-1), a padding row's",
        ),
    )

    def hook(name: str) -> Any:
        return (
            _hybrid_hook(name[len("hybrid.") :])
            if name.startswith("hybrid.")
            else (_linear_hook(name))
        )

    return [
        *(
            _step_impl("runner_step_linear", attr, name=name, declines=declines,
                      description=f"installed vLLM (V1 runner) of a hybrid model: "
                      f"vllm-v1-hybrid's step with its linear layer {what}, every field of "
                      f"its metadata a kernel reads judged", traced=True)
            for attr, declines, name, what in engines
        ),
        *(
            _step_impl("runner_step_linear", attr, name=name, kind="mutant",
                      declines="declines", description=f"installed vLLM (V1 runner, "
                      f"hybrid) with {what}", trigger=hook(trigger), reach=hook(reach),
                      smallest=hook(smallest), traced=True)
            for attr, name, trigger, reach, smallest, what in mutants
        ),
    ]  # fmt: skip


_mla_hook = functools.partial(_lazy, "runner_step_mla")


def _runner_step_mla() -> list[Implementation]:
    """``vllm-v1``'s step of an MLA model on the Triton MLA and Tokenspeed MLA backends,
    and a mutant of its builder's decode metadata."""
    return [
        _step_impl(
            "runner_step_mla",
            "run",
            name="vllm-v1-mla",
            description="installed vLLM (V1 runner) of an MLA model: vllm-v1's step with "
            "its attention layer on the Triton MLA backend (vllm/model_executor/layers/"
            "attention/mla_attention.py: MLACommonMetadataBuilder.build, _build_decode, "
            "build_mla_chunked_context_metadata, build_for_cudagraph_capture), every field "
            "of its metadata a kernel reads judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_mla",
            "decode_seq_lens_copied",
            name="vllm-v1-mla-decode-seq-lens-copied",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, MLA) with "
            "MLACommonMetadataBuilder._build_decode handing the decode kernel a copy of "
            "the decodes' seq_lens, not the view of the runner's persistent buffer",
            trigger=_mla_hook("trigger_full_decode"),
            reach=_hybrid_hook("reach_full_graphs"),
            smallest=_mla_hook("smallest_full_decode"),
            traced=True,
        ),
        _step_impl(
            "runner_step_tokenspeed_mla",
            "run",
            name="vllm-v1-tokenspeed-mla",
            description="installed vLLM (V1 runner) of an MLA model of DeepSeek-R1's "
            "dimensions on the Tokenspeed MLA backend, its KV cache fp8: vllm-v1-mla's "
            "step with its MLA layer on TOKENSPEED_MLA "
            "(vllm/v1/attention/backends/mla/tokenspeed_mla.py: "
            "TokenspeedMLAMetadataBuilder, pages of 32 or 64), every field of its "
            "metadata a kernel reads judged",
            declines="declines",
            traced=True,
        ),
    ]


_flash_attn_hook = functools.partial(_lazy, "runner_step_flash_attn")


def _runner_step_flash_attn() -> list[Implementation]:
    """``vllm-v1``'s step on the FlashAttention backend (FA3), and a mutant of its
    builder's graph buffer of scheduler metadata."""
    return [
        _step_impl(
            "runner_step_flash_attn",
            "run",
            name="vllm-v1-flash-attn",
            description="installed vLLM (V1 runner) on the FlashAttention backend as on an "
            "sm90 GPU (FA3): vllm-v1's step with its attention layer on FLASH_ATTN "
            "(vllm/v1/attention/backends/flash_attn.py: FlashAttentionMetadataBuilder.build, "
            "_get_scheduler_metadata, _store_scheduler_metadata, build_for_cudagraph_capture), "
            "every field of its metadata a kernel reads judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_step5_dsa",
            "run",
            name="vllm-v1-step5-dsa",
            description="installed vLLM (V1 runner) of a Step5 model's DSA attention: "
            "vllm-v1-flash-attn's step with its attention layer on STEP5_DSA "
            "(vllm/models/step5/nvidia/sparse_attention.py: Step5DSAMetadataBuilder.build, "
            "FlashAttention's metadata with the request count and host query offsets the "
            "DSA forward reads; the prefill plan needs the model's sparse impl, not made "
            "here) and its CSA tail ring's group (csa_tail_ring.py: "
            "Step5CSATailRingMetadataBuilder.build, _ring_metadata_kernel), every field "
            "its kernels read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_step5_dsa",
            "dummy_held_rows",
            name="vllm-v1-step5-dsa-dummy-held-rows",
            kind="mutant",
            description="installed vLLM (V1 runner, Step5's DSA attention and CSA tail "
            "ring) with its dummy runs judged: an idle data-parallel rank's _dummy_run "
            "builds the ring's metadata from the persistent batch's rows and stores into "
            "a held request's ring (a difference of vLLM's own, docs/findings.md)",
            declines="declines",
            trigger=_lazy("runner_step_kpool_tail", "trigger_dummy_held_rows"),
            reach=_hybrid_hook("reach_dummy_run"),
            smallest=_lazy("runner_step_kpool_tail", "smallest_dummy_held_rows"),
            traced=True,
        ),
        _step_impl(
            "runner_step_flash_attn",
            "scheduler_tail_kept",
            name="vllm-v1-flash-attn-scheduler-tail-kept",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, FlashAttention) with "
            "FlashAttentionMetadataBuilder._store_scheduler_metadata copying the step's "
            "scheduler metadata into the graph buffer without zeroing the rest",
            trigger=_flash_attn_hook("trigger_tail"),
            reach=_hybrid_hook("reach_full_graphs"),
            smallest=_flash_attn_hook("smallest_tail"),
            traced=True,
        ),
    ]


_triton_flash_attn_hook = functools.partial(_lazy, "runner_step_triton_flash_attn")


def _runner_step_triton_flash_attn() -> list[Implementation]:
    """``vllm-v1``'s step on the Triton/FlashAttention composite backend, and a mutant of
    its routing's capture child."""
    return [
        _step_impl(
            "runner_step_triton_flash_attn",
            "run",
            name="vllm-v1-triton-flash-attn",
            description="installed vLLM (V1 runner) on the Triton/FlashAttention composite "
            "as on an sm90 GPU (FA3): vllm-v1's step with its attention layer on "
            "TRITON_FLASH_ATTN (vllm/v1/attention/backends/composite.py: "
            "CompositeAttentionMetadataBuilder routing each build and capture to a child), "
            "the child each build is tagged with and FlashAttention's fields judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_triton_flash_attn",
            "capture_variant_general",
            name="vllm-v1-triton-flash-attn-capture-variant-general",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, Triton/FlashAttention composite) with "
            "MMPrefixAttentionRouting.capture_variant 0: capture runs build the Triton "
            "child's metadata while replays of text steps select FlashAttention's",
            trigger=_triton_flash_attn_hook("trigger_capture"),
            reach=_hybrid_hook("reach_full_graphs"),
            smallest=_triton_flash_attn_hook("smallest_capture"),
            traced=True,
        ),
    ]


def _runner_step_cpu() -> list[Implementation]:
    """``vllm-v1``'s step as vLLM's CPU worker runs it, on the CPU attention backend."""
    return [
        _step_impl(
            "runner_step_cpu",
            "run",
            name="vllm-v1-cpu",
            description="installed vLLM (V1 runner) as its CPU worker makes it: "
            "vllm/v1/worker/cpu_model_runner.py CPUModelRunner (its host and device buffers "
            "made one), its attention layer on CPU_ATTN (vllm/v1/attention/backends/"
            "cpu_attn.py: CPUAttentionMetadataBuilder.build, the C++ scheduler stood in by "
            "its checks); the CPU platform captures no graph, so every step runs eagerly",
            # platforms/cpu.py CpuPlatform.check_and_update_config: no capture sizes;
            # CPUAttentionBackend.get_supported_kernel_block_sizes: multiples of 32.
            fixes={"cudagraph_mode": "NONE", "block_size": 32},
            declines="declines",
            traced=True,
        ),
    ]


_flex_hook = functools.partial(_lazy, "runner_step_flex")


def _runner_step_flex() -> list[Implementation]:
    """``vllm-v1``'s step on the FlexAttention backend, and a difference of vLLM's own
    kept apart."""
    # FlexAttentionBackend.get_supported_kernel_block_sizes: multiples of 16.
    pages = {"fixes": {"block_size": 16}, "declines": "declines", "traced": True}
    return [
        _step_impl(
            "runner_step_flex",
            "run",
            name="vllm-v1-flex",
            description="installed vLLM (V1 runner) on FLEX_ATTENTION "
            "(vllm/v1/attention/backends/flex_attention.py: FlexAttentionMetadataBuilder."
            "build: the inverted block table, the persistent offsets, seq_lens and "
            "decode_offset, the block mask), decode_offset held to seq_lens - query_lens, "
            "the keys read as the kernel's mask makes them",
            **pages,
        ),
        _step_impl(
            "runner_step_flex",
            "draft_offsets_stale",
            name="vllm-v1-flex-draft-offsets-stale",
            kind="mutant",
            description="installed vLLM (V1 runner, FlexAttention) with the drafter's "
            "every sub-step judged: propose rewrites the query offsets of its later "
            "sub-steps in place and keeps the first pass's compute_num_computed_tokens "
            "cache, so a draft token's logical position is its first pass's and it sees "
            "too few keys (a difference of vLLM's own, docs/findings.md)",
            trigger=_flex_hook("trigger_draft_offsets_stale"),
            reach=_flex_hook("reach_drafts"),
            smallest=_flex_hook("smallest_draft_offsets_stale"),
            **pages,
        ),
        _step_impl(
            "runner_step_flex",
            "run",
            name="vllm-v1-flex-capture-past-model-len",
            kind="mutant",
            description="installed vLLM (V1 runner, FlexAttention, FULL graphs) with a "
            "capture size past max_model_len's pages: each dummy request's seq_len is the "
            "capture's token count, and the capture build's block mask outgrows its "
            "persistent buffer (a RuntimeError of vLLM's own at start-up, docs/findings.md)",
            trigger=_flex_hook("trigger_capture_past_model_len"),
            reach=_flex_hook("reach_full_capture"),
            smallest=_flex_hook("smallest_capture_past_model_len"),
            **{**pages, "declines": "declines_engine"},
        ),
    ]


_amx_mla_hook = functools.partial(_lazy, "runner_step_amx_mla")


def _runner_step_amx_mla() -> list[Implementation]:
    """``vllm-v1-mla``'s step as vLLM's CPU worker runs it on the AMX MLA backend, and a
    mutant of its builder's prefill lengths."""
    # platforms/cpu.py: no capture sizes; AMXMLABackend.supports_block_size: multiples
    # of 32.
    cpu = {"fixes": {"cudagraph_mode": "NONE", "block_size": 32}, "declines": "declines",
           "traced": True}  # fmt: skip
    return [
        _step_impl(
            "runner_step_amx_mla",
            "run",
            name="vllm-v1-amx-mla",
            description="installed vLLM (V1 runner) of an MLA model as its CPU worker makes "
            "it (CPUModelRunner) on a CPU with AMX: its MLA layer on AMX_MLA "
            "(vllm/v1/attention/backends/mla/amx_mla.py: AMXMLAMetadataBuilder.build, the "
            "block table expanded to req_to_token, the decodes' and prefills' lengths, pool "
            "indices and extend offsets), every field its kernels read judged, the keys they "
            "read through req_to_token held to the MLA metadata's",
            **cpu,
        ),
        _step_impl(
            "runner_step_amx_mla",
            "prefill_lens_unshifted",
            name="vllm-v1-amx-mla-prefill-lens-unshifted",
            kind="mutant",
            description="installed vLLM (V1 runner, CPU worker, AMX MLA) with "
            "AMXMLAMetadataBuilder.build taking the prefills' cpu_seq_lens from the step's "
            "first rows (the decodes') instead of the rows after them",
            trigger=_amx_mla_hook("trigger_mixed"),
            reach=_amx_mla_hook("reach_amx_mla"),
            smallest=_amx_mla_hook("smallest_mixed"),
            **cpu,
        ),
    ]


def _runner_step_triton_diffkv() -> list[Implementation]:
    """``vllm-v1``'s step on the Triton backend of different K and V head sizes."""
    return [
        _step_impl(
            "runner_step_triton_diffkv",
            "run",
            name="vllm-v1-triton-diffkv",
            description="installed vLLM (V1 runner) on the Triton backend of different K "
            "and V head sizes, as a MiMo-V2 model makes it (K 192, V 128): vllm-v1's step "
            "with its attention layer on TRITON_ATTN_DIFFKV "
            "(vllm/v1/attention/backends/triton_attn_diffkv.py: "
            "TritonAttentionDiffKVMetadataBuilder), vllm-v1's fields judged",
            declines="declines",
            traced=True,
        ),
    ]


def _runner_step_aiter_fa() -> list[Implementation]:
    """``vllm-v1``'s step on the ROCm AITER FlashAttention backend."""
    return [
        _step_impl(
            "runner_step_aiter_fa",
            "run",
            name="vllm-v1-aiter-fa",
            description="installed vLLM (V1 runner) on the ROCm AITER FlashAttention "
            "backend as on an MI300 GPU: vllm-v1's step with its attention layer on "
            "ROCM_AITER_FA (vllm/v1/attention/backends/rocm_aiter_fa.py: "
            "AiterFlashAttentionMetadataBuilder.build, its decode/extend/prefill split "
            "and the extends' chunked context, build_for_cudagraph_capture, "
            "build_for_drafting), every field of its metadata a kernel reads judged",
            declines="declines",
            traced=True,
        ),
    ]


def _runner_step_rocm() -> list[Implementation]:
    """``vllm-v1``'s step on the ROCm attention, segmented-prefill and Octave backends,
    and on b12x and HPC; a model whose indexer keeps QSA's side caches, or a kpool tail
    ring; Inkling's."""
    return [
        _step_impl(
            "runner_step_kpool_tail",
            "run",
            name="vllm-v1-kpool-tail",
            description="installed vLLM (V1 runner) of a model whose kpool indexer keeps "
            "its in-progress pool in a per-request ring: vllm-v1's step with the ring as "
            "a KV-cache group of its own on KPOOL_TAIL (v1/attention/backends/mla/"
            "indexer.py: KpoolTailMetadataBuilder.build, compute_kpool_tail_slot_mapping), "
            "every token's ring slot judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_kpool_tail",
            "dummy_held_rows",
            name="vllm-v1-kpool-tail-dummy-held-rows",
            kind="mutant",
            description="installed vLLM (V1 runner, a kpool tail ring) with its dummy runs "
            "judged: an idle data-parallel rank's _dummy_run builds the ring's metadata "
            "from the persistent batch's rows and stores into a held request's ring (a "
            "difference of vLLM's own, docs/findings.md)",
            declines="declines",
            trigger=_lazy("runner_step_kpool_tail", "trigger_dummy_held_rows"),
            reach=_hybrid_hook("reach_dummy_run"),
            smallest=_lazy("runner_step_kpool_tail", "smallest_dummy_held_rows"),
            traced=True,
        ),
        _step_impl(
            "runner_step_kpool_tail",
            "run",
            name="vllm-v1-kpool-tail-padding-last-request",
            kind="mutant",
            description="installed vLLM (V1 runner, a kpool tail ring, FULL graphs) on "
            "steps of max_num_seqs requests padded to a graph: no padding request takes "
            "the padding tokens, and compute_kpool_tail_slot_mapping stores them into the "
            "last request's ring (a difference of vLLM's own, docs/findings.md)",
            declines="declines_engine",
            trigger=_lazy("runner_step_kpool_tail", "trigger_padding_last_request"),
            reach=_lazy("runner_step_kpool_tail", "reach_full_graph_padding"),
            smallest=_lazy("runner_step_kpool_tail", "smallest_padding_last_request"),
            traced=True,
        ),
        *(
            _step_impl(
                "runner_step_inkling",
                attr,
                name=name,
                description=f"installed vLLM (V1 runner) of an Inkling model ({where}): "
                "vllm-v1's step with the short convolutions' state as a sliding-window "
                f"KV-cache group of 4-token blocks (vllm/models/inkling/{where}/"
                "sconv_swa_attn.py: InklingSconvMetadataBuilder.build, its Triton "
                "seq_idx/query_start kernel), every token's request, first row and slot "
                "judged",
                declines="declines",
                traced=True,
            )
            for attr, name, where in (
                ("run", "vllm-v1-inkling", "nvidia"),
                ("run_rocm", "vllm-v1-inkling-rocm", "amd"),
            )
        ),
        _step_impl(
            "runner_step_qsa",
            "run",
            name="vllm-v1-qsa",
            description="installed vLLM (V1 runner) of a model with a QSA indexer: "
            "vllm-v1's step with the indexer's raw key ring and compressed key cache as "
            "KV-cache groups of their own (vllm/models/qwen4_exp/common/qsa_cache.py: "
            "QSAMetadataBuilder.build of each), read by QSAIndexer._metadata, every "
            "token's request, position, visible blocks and slots judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_qsa",
            "dummy_held_rows",
            name="vllm-v1-qsa-dummy-held-rows",
            kind="mutant",
            description="installed vLLM (V1 runner, a QSA indexer) with its dummy runs "
            "judged: an idle data-parallel rank's _dummy_run builds the raw key ring's "
            "metadata from the persistent batch's rows and stores into a held request's "
            "ring (a difference of vLLM's own, docs/findings.md)",
            declines="declines",
            trigger=_lazy("runner_step_kpool_tail", "trigger_dummy_held_rows"),
            reach=_hybrid_hook("reach_dummy_run"),
            smallest=_lazy("runner_step_kpool_tail", "smallest_dummy_held_rows"),
            traced=True,
        ),
        _step_impl(
            "runner_step_hpc",
            "run",
            name="vllm-v1-hpc",
            description="installed vLLM (V1 runner) on the HPC attention backend: "
            "vllm-v1's step with its attention layer on HPC_ATTN "
            "(vllm/v1/attention/backends/hpc_attn.py: HpcAttnMetadataBuilder.build, its "
            "uniform decode split and the decode task map of hpc-ops' scheduler, stood "
            "in), the fields the HPC kernels read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_b12x",
            "run",
            name="vllm-v1-b12x",
            description="installed vLLM (V1 runner) on the b12x paged attention backend: "
            "vllm-v1's step with its attention layer on B12X "
            "(vllm/v1/attention/backends/b12x.py: B12xPagedMetadataBuilder.build, a cache "
            "of separate K and V planes, pages of 64 or 128), vllm-v1's fields judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_rocm",
            "run",
            name="vllm-v1-rocm-attn",
            description="installed vLLM (V1 runner) on the ROCm attention backend: "
            "vllm-v1's step with its attention layer on ROCM_ATTN "
            "(vllm/v1/attention/backends/rocm_attn.py: RocmAttentionMetadataBuilder.build, "
            "build_for_cudagraph_capture, which fills the runner's seq_lens with 1 and "
            "zeroes its query_start_loc), vllm-v1's fields judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_rocm",
            "run_segmented",
            name="vllm-v1-rocm-segmented",
            description="installed vLLM (V1 runner) on the ROCm segmented-prefill backend: "
            "vllm-v1's step with its attention layer on ROCM_SEGMENTED_ATTN "
            "(vllm/v1/attention/backends/rocm_segmented_attn.py: "
            "RocmSegmentedAttentionMetadataBuilder, ROCM_ATTN's builder sized for its "
            "token-major kernel), vllm-v1's fields judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_rocm",
            "run_octave",
            name="vllm-v1-rocm-octave",
            description="installed vLLM (V1 runner) on the ROCm Octave backend: vllm-v1's "
            "step with its attention layer on ROCM_OCTAVE "
            "(vllm/v1/attention/backends/rocm_octave_attn.py: RocmOctaveMetadataBuilder."
            "build, _fill_query_maps), each query token's request and K length, which "
            "its decode kernel reads, judged beside vllm-v1's fields",
            declines="declines_octave",
            traced=True,
        ),
    ]


_turboquant_hook = functools.partial(_lazy, "runner_step_turboquant")


def _runner_step_turboquant() -> list[Implementation]:
    """``vllm-v1``'s step on TurboQuant, and its finding under async scheduling."""
    return [
        _step_impl(
            "runner_step_turboquant",
            "run",
            name="vllm-v1-turboquant",
            description="installed vLLM (V1 runner) on the TurboQuant backend "
            "(--kv-cache-dtype turboquant_k8v4): vllm-v1's step with its attention layer "
            "on TURBOQUANT (vllm/v1/attention/backends/turboquant_attn.py: "
            "TurboQuantMetadataBuilder.build, build_for_cudagraph_capture), the keys its "
            "decode and prefill paths read judged, scheduled synchronously",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_turboquant",
            "run_async",
            name="vllm-v1-turboquant-async-verify-past-rejection",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, TurboQuant) scheduled asynchronously: "
            "a request that rejected drafts verifies again through TurboQuant's prefill "
            "path, which reads the host's optimistic seq_lens_cpu_upper_bound as its "
            "context length, past its sequence (a finding of vLLM's own, kept apart)",
            trigger=_turboquant_hook("trigger_verify_past_rejection"),
            reach=_turboquant_hook("reach_verify_after_drafts"),
            smallest=_turboquant_hook("smallest_verify_past_rejection"),
            traced=True,
        ),
    ]


_sparse_fp8_hook = functools.partial(_lazy, "runner_step_sparse_mla_fp8")


def _runner_step_sparse_mla() -> list[Implementation]:
    """``vllm-v1-mla``'s step of a sparse-attention MLA model on FlashMLA sparse, XPU
    sparse MLA and FlashInfer's sparse MLA backends."""
    return [
        _step_impl(
            "runner_step_sparse_mla",
            "run",
            name="vllm-v1-flashmla-sparse",
            description="installed vLLM (V1 runner) of a sparse-attention MLA model "
            "(index_topk 64) on the FlashMLA sparse backend as on an sm90 GPU, its KV "
            "cache bf16: vllm-v1-mla's step with its MLA layer on FLASHMLA_SPARSE "
            "(vllm/v1/attention/backends/mla/flashmla_sparse.py: "
            "FlashMLASparseMetadataBuilder, SparseMLACommonMetadataBuilder.build: the "
            "uniform split, req_id_per_token in the builder's buffer), every field its "
            "kernels read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_sparse_mla",
            "draft_requests_stale",
            name="vllm-v1-flashmla-sparse-draft-requests-stale",
            kind="mutant",
            description="installed vLLM (V1 runner, FlashMLA sparse) with the drafter's "
            "every sub-step judged: propose rewrites the query offsets of its later "
            "sub-steps in place and keeps the first pass's token_to_req_indices cache on "
            "CommonAttentionMetadata, so req_id_per_token turns a draft token's top-k "
            "positions into another request's KV slots (a difference of vLLM's own, "
            "docs/findings.md)",
            declines="declines",
            trigger=_lazy("runner_step_sparse_mla", "trigger_draft_requests_stale"),
            reach=_lazy("runner_step_sparse_mla", "reach_drafts"),
            smallest=_lazy("runner_step_sparse_mla", "smallest_draft_requests_stale"),
            traced=True,
        ),
        _step_impl(
            "runner_step_sparse_mla_fp8",
            "run",
            name="vllm-v1-flashmla-sparse-fp8",
            description="installed vLLM (V1 runner) of a sparse-attention MLA model on the "
            "FlashMLA sparse backend as on an sm90 GPU, its KV cache fp8_ds_mla and 64 "
            "heads a rank: vllm-v1-flashmla-sparse's step through the separate "
            "prefill/decode FP8 path (FlashMLASparseMetadataBuilder."
            "_build_fp8_separate_prefill_decode: the decodes' kernel rows, each prefill's "
            "workspace start and chunk), every field its kernels read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_sparse_mla_fp8",
            "workspace_by_query",
            name="vllm-v1-flashmla-sparse-fp8-workspace-by-query",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, FlashMLA sparse, fp8 cache) with "
            "_build_fp8_separate_prefill_decode starting each prefill's workspace at the "
            "earlier prefills' query tokens, not their keys",
            trigger=_sparse_fp8_hook("trigger_workspace"),
            reach=_sparse_fp8_hook("reach_prefill"),
            smallest=_sparse_fp8_hook("smallest_workspace"),
            traced=True,
        ),
        _step_impl(
            "runner_step_xpu_mla_sparse",
            "run",
            name="vllm-v1-xpu-mla-sparse",
            cg_supports=("NEVER",),
            description="installed vLLM (V1 runner) of a sparse-attention MLA model "
            "(index_topk 64) on the XPU sparse MLA backend, its KV cache bf16: "
            "vllm-v1-flashmla-sparse's step with its MLA layer (and MTP draft layer) on "
            "XPU_MLA_SPARSE (vllm/v1/attention/backends/mla/xpu_mla_sparse.py: "
            "XPUMLASparseMetadataBuilder.build: req_id_per_token in the builder's "
            "zero-filled buffer, every token routed as a decode; cudagraph support NEVER, "
            "so FULL is declined and FULL decode modes resolve to PIECEWISE), every field "
            "its consumers read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_flashinfer_mla_sparse",
            "run",
            name="vllm-v1-flashinfer-mla-sparse",
            description="installed vLLM (V1 runner) of a sparse-attention MLA model on "
            "FlashInfer's TRT-LLM sparse MLA backend: vllm-v1-flashmla-sparse's step with "
            "its MLA layer on FLASHINFER_MLA_SPARSE "
            "(vllm/v1/attention/backends/mla/flashinfer_mla_sparse.py: "
            "FlashInferMLASparseTRTLLMMetadataBuilder, the head count's reorder threshold, "
            "pages of 32), every field its kernels read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_flashinfer_mla_sparse",
            "run_sm120",
            name="vllm-v1-flashinfer-mla-sparse-sm120",
            description="installed vLLM (V1 runner) of a sparse-attention MLA model "
            "(index_topk 2048) on FlashInfer's SM120 sparse MLA backend: "
            "vllm-v1-flashmla-sparse's step with its MLA layer on "
            "FLASHINFER_MLA_SPARSE_SM120 (FlashInferMLASparseMetadataBuilder), every "
            "field its kernels read judged",
            declines="declines_sm120",
            traced=True,
        ),
        _step_impl(
            "runner_step_flashattn_mla_sparse",
            "run",
            name="vllm-v1-flashattn-mla-sparse",
            description="installed vLLM (V1 runner) of a sparse-attention MLA model on "
            "FlashAttention's sparse MLA backend: vllm-v1-flashmla-sparse's step with its "
            "MLA layer on FLASH_ATTN_MLA_SPARSE "
            "(vllm/v1/attention/backends/mla/flashattn_mla_sparse.py: "
            "FlashAttnMLASparseMetadataBuilder, its head count's reorder threshold, pages "
            "of 64; vllm.vllm_flash_attn's package stood in for the import), every field "
            "its kernels read judged",
            declines="declines",
            traced=True,
        ),
    ]


_flashmla_hook = functools.partial(_lazy, "runner_step_flashmla")


def _runner_step_flashmla() -> list[Implementation]:
    """``vllm-v1-mla``'s step on the FlashMLA backend, its KV cache fp8, and a mutant of
    its builder's graph buffers of the decode schedule."""
    # FlashMLABackend.get_supported_kernel_block_sizes: pages of 64 tokens only.
    pages = {"fixes": {"block_size": 64}, "declines": "declines", "traced": True}
    return [
        _step_impl(
            "runner_step_flashmla",
            "run",
            name="vllm-v1-flashmla",
            description="installed vLLM (V1 runner) of an MLA model on the FlashMLA backend "
            "as on an sm90 GPU, its KV cache fp8: vllm-v1-mla's step with its MLA layer on "
            "FLASHMLA (vllm/v1/attention/backends/mla/flashmla.py: "
            "FlashMLAMetadataBuilder.__init__, _build_decode, the fp8 schedule copied into "
            "its graph buffers; the reorder threshold 128), FlashMLA's schedule calls "
            "stood in by their contracts, every field of its metadata a kernel reads judged",
            **pages,
        ),
        _step_impl(
            "runner_step_flashmla",
            "schedule_not_persistent",
            name="vllm-v1-flashmla-schedule-not-persistent",
            kind="mutant",
            description="installed vLLM (V1 runner, FlashMLA, fp8 cache) with "
            "FlashMLAMetadataBuilder._build_decode handing the kernel the fp8 schedule "
            "FlashMLA made, not its copy in the graph buffers",
            trigger=_flashmla_hook("trigger_full_decode"),
            reach=_flashmla_hook("reach_full_graphs"),
            smallest=_flashmla_hook("smallest_full_decode"),
            **pages,
        ),
    ]


_aiter_mla_hook = functools.partial(_lazy, "runner_step_aiter_mla")


def _runner_step_aiter_mla() -> list[Implementation]:
    """``vllm-v1-mla``'s step on ROCm's AITER MLA backend, and two mutants of its decode
    metadata: its graph buffers, its schedule."""
    full = {
        "declines": "declines",
        "trigger": _aiter_mla_hook("trigger_full_decode"),
        "reach": _aiter_mla_hook("reach_full_graphs"),
        "smallest": _aiter_mla_hook("smallest_full_decode"),
        "traced": True,
    }
    return [
        _step_impl(
            "runner_step_aiter_mla",
            "run",
            name="vllm-v1-aiter-mla",
            description="installed vLLM (V1 runner) of an MLA model on ROCm's AITER MLA "
            "backend as on an MI300X (gfx942): vllm-v1-mla's step with its MLA layer on "
            "ROCM_AITER_MLA (vllm/v1/attention/backends/mla/rocm_aiter_mla.py: "
            "AiterMLAMetadataBuilder.__init__, _build_decode: the kernel's seq_lens, "
            "paged_kv_indptr and the per-token paged_kv_indices of "
            "_expand_page_indices_kernel, qo_indptr, their graph buffers, the decode "
            "schedule), AITER's metadata calls stood in, every field its kernels read "
            "judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_aiter_mla",
            "offsets_not_persistent",
            name="vllm-v1-aiter-mla-offsets-not-persistent",
            kind="mutant",
            description="installed vLLM (V1 runner, AITER MLA) with "
            "AiterMLAMetadataBuilder._build_decode handing the kernel the offsets and key "
            "indices it made, not their copies in its graph buffers",
            **full,
        ),
        _step_impl(
            "runner_step_aiter_mla",
            "schedule_kept_per_shape",
            name="vllm-v1-aiter-mla-schedule-kept-per-shape",
            kind="mutant",
            description="installed vLLM (V1 runner, AITER MLA) with "
            "AiterMLAMetadataBuilder._build_decode asking AITER for a decode schedule only "
            "when the decodes' count or query length changes",
            **full,
        ),
    ]


_aiter_sparse_hook = functools.partial(_lazy, "runner_step_aiter_mla_sparse")


def _runner_step_aiter_mla_sparse() -> list[Implementation]:
    """``vllm-v1-flashmla-sparse``'s step on ROCm's AITER MLA sparse backend, and a mutant
    of its per-token offsets' graph tail."""
    return [
        _step_impl(
            "runner_step_aiter_mla_sparse",
            "run",
            name="vllm-v1-aiter-mla-sparse",
            description="installed vLLM (V1 runner) of a sparse-attention MLA model "
            "(index_topk 64) on ROCm's AITER MLA sparse backend as on an MI300X (gfx942): "
            "vllm-v1-flashmla-sparse's step with its MLA layer on ROCM_AITER_MLA_SPARSE "
            "(vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py: "
            "ROCMAiterMLASparseMetadataBuilder.__init__, build: req_id_per_token, the "
            "per-token paged_kv_indptr of generate_sparse_seqlen_kernel and its graph "
            "tail, the schedule by fingerprint), AITER's metadata calls stood in, every "
            "field its kernels read judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_aiter_mla_sparse",
            "indptr_tail_kept",
            name="vllm-v1-aiter-mla-sparse-indptr-tail-kept",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, AITER MLA sparse) with "
            "ROCMAiterMLASparseMetadataBuilder.build leaving paged_kv_indptr past the "
            "step's tokens as the build before left it",
            trigger=_aiter_sparse_hook("trigger_padded_replay"),
            reach=_aiter_sparse_hook("reach_full_graphs"),
            smallest=_aiter_sparse_hook("smallest_shrunk_replay"),
            traced=True,
        ),
    ]


_sparse_swa_hook = functools.partial(_lazy, "runner_step_sparse_swa")


def _runner_step_sparse_swa() -> list[Implementation]:
    """``vllm-v1``'s step of DeepSeek-V4's sliding-window cache on the sparse SWA
    backend, and a mutant of its window's clamp."""
    # DeepseekSparseSWABackend.get_supported_kernel_block_sizes: multiples of 32.
    pages = {"fixes": {"block_size": 32}, "declines": "declines", "traced": True}
    return [
        _step_impl(
            "runner_step_sparse_swa",
            "run",
            name="vllm-v1-sparse-swa",
            description="installed vLLM (V1 runner) of DeepSeek-V4's sliding-window cache "
            "(DeepseekV4SWACache, window 64, fp8_ds_mla) on DEEPSEEK_SPARSE_SWA as on an "
            "sm90 GPU (vllm/v1/attention/backends/mla/sparse_swa.py: "
            "DeepseekSparseSWAMetadataBuilder.__init__, build: each token's window of KV "
            "slots and its length by _compute_swa_indices_and_lens_kernel, the prefills' "
            "gather lengths and chunk plan, the tile-scheduler plans), FlashMLA's "
            "get_mla_metadata stood in, every field its consumers read judged",
            **pages,
        ),
        _step_impl(
            "runner_step_sparse_swa",
            "window_unclamped",
            name="vllm-v1-sparse-swa-window-unclamped",
            kind="mutant",
            description="installed vLLM (V1 runner, sparse SWA) with "
            "DeepseekSparseSWAMetadataBuilder.build handing "
            "_compute_swa_indices_and_lens_kernel no window: a token's window starts at "
            "its sequence's first position, its length past the index width",
            trigger=_sparse_swa_hook("trigger_past_window"),
            reach=_sparse_swa_hook("reach_swa"),
            smallest=_sparse_swa_hook("smallest_past_window"),
            **pages,
        ),
        _step_impl(
            "runner_step_sparse_swa",
            "draft_requests_stale",
            name="vllm-v1-sparse-swa-draft-requests-stale",
            kind="mutant",
            description="installed vLLM (V1 runner, sparse SWA) with the drafter's every "
            "sub-step judged: propose rewrites the query offsets of its later sub-steps in "
            "place and keeps the first pass's token_to_req_indices cache on "
            "CommonAttentionMetadata, so a draft token reads another request's window (a "
            "difference of vLLM's own, docs/findings.md)",
            trigger=_sparse_swa_hook("trigger_draft_requests_stale"),
            reach=_sparse_swa_hook("reach_drafts"),
            smallest=_sparse_swa_hook("smallest_draft_requests_stale"),
            **pages,
        ),
    ]


_sparse_swa_cpu_hook = functools.partial(_lazy, "runner_step_sparse_swa_cpu")


def _runner_step_sparse_swa_cpu() -> list[Implementation]:
    """``vllm-v1-sparse-swa``'s step as vLLM's CPU worker runs it, a difference of vLLM's
    own kept apart, and a mutant of the CPU layer's reading."""
    # platforms/cpu.py: no capture sizes; DeepseekV4Attention.__init__: the SWA cache's
    # pages of 64 (DeepseekV4SWACache's default).
    cpu = {"fixes": {"cudagraph_mode": "NONE", "block_size": 64}, "declines": "declines",
           "traced": True}  # fmt: skip
    return [
        _step_impl(
            "runner_step_sparse_swa_cpu",
            "run",
            name="vllm-v1-sparse-swa-cpu",
            description="installed vLLM (V1 runner) of DeepSeek-V4's sliding-window cache "
            "as its CPU worker makes it (CPUModelRunner) on the CPU platform: "
            "DeepseekV4CPUSparseSWAMetadataBuilder (vllm/models/deepseek_v4/cpu/cpu_mla.py) "
            "over the shared build, its tile-scheduler plans stood in by no plan of every "
            "layer type; vllm-v1-sparse-swa's fields, and the keys "
            "DeepseekV4CPUAttention.forward_mqa reads (each token's window through its "
            "request's block-table row) held to them",
            **cpu,
        ),
        _step_impl(
            "runner_step_sparse_swa_cpu",
            "tile_keys",
            name="vllm-v1-sparse-swa-cpu-tile-keys",
            kind="mutant",
            description="installed vLLM (V1 runner, CPU worker, DeepSeek-V4's SWA cache) "
            "with DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler as it ships: "
            "its plans name three layer types, the shared build reads five, and every build "
            "raises KeyError 'c1a' (a difference of vLLM's own, docs/findings.md)",
            trigger=_sparse_swa_cpu_hook("trigger_any_step"),
            reach=_sparse_swa_cpu_hook("reach_cpu_swa"),
            smallest=_sparse_swa_cpu_hook("smallest_any_step"),
            **cpu,
        ),
        _step_impl(
            "runner_step_sparse_swa_cpu",
            "prefill_owner_zeroed",
            name="vllm-v1-sparse-swa-cpu-prefill-owner-zeroed",
            kind="mutant",
            description="installed vLLM (V1 runner, CPU worker, DeepSeek-V4's SWA cache) "
            "with the CPU builder's token_to_req_indices left at zero for the prefill "
            "tokens: the CPU layer reads a later prefill's window through the first "
            "request's pages",
            trigger=_sparse_swa_cpu_hook("trigger_prefill_past_first_row"),
            reach=_sparse_swa_cpu_hook("reach_cpu_swa"),
            smallest=_sparse_swa_cpu_hook("smallest_prefill_past_first_row"),
            **cpu,
        ),
    ]


_minimax_m3_hook = functools.partial(_lazy, "runner_step_minimax_m3")


def _runner_step_minimax_m3() -> list[Implementation]:
    """``vllm-v1``'s step of MiniMax M3's block-sparse attention layers (the main attend
    and the lightning indexer), and a mutant of the prefills' query offsets."""
    # MiniMaxM3SparseBackend / MiniMaxM3IndexerBackend.get_supported_kernel_block_sizes: 128.
    pages = {"fixes": {"block_size": 128}, "declines": "declines", "traced": True}
    return [
        _step_impl(
            "runner_step_minimax_m3",
            "run",
            name="vllm-v1-minimax-m3-sparse",
            description="installed vLLM (V1 runner) of MiniMax M3's sparse attention layers "
            "(select_main_backend_and_impl_cls, MiniMaxM3Indexer and its index cache, top-k "
            "8 blocks, bf16) as on an sm100 GPU, one KV-cache group of vLLM's grouping "
            "(vllm/models/minimax_m3: MiniMaxM3SparseMSAMetadataBuilder on "
            "MiniMaxM3SparseMetadataBuilder.build: the decode/prefill split, decode "
            "seq_lens and query length, rebased prefill offsets, cumulative KV lengths "
            "and the CSR's KV blocks; MiniMaxM3IndexerTritonMetadataBuilder.build), the "
            "platform and the tensor-parallel world size stood in, every field the attend "
            "and the indexer kernels read judged",
            **pages,
        ),
        _step_impl(
            "runner_step_minimax_m3",
            "offsets_unrebased",
            name="vllm-v1-minimax-m3-sparse-prefill-offsets-unrebased",
            kind="mutant",
            description="installed vLLM (V1 runner, MiniMax M3 sparse) with "
            "MiniMaxM3SparseMetadataBuilder.build handing the prefills the batch's query "
            "offsets not rebased to the first prefill token: after decodes, the prefill "
            "attend reads query rows past its own",
            trigger=_minimax_m3_hook("trigger_decodes_and_prefills"),
            reach=_minimax_m3_hook("reach_m3"),
            smallest=_minimax_m3_hook("smallest_decodes_and_prefills"),
            **pages,
        ),
    ]


_deepseek_v41_hook = functools.partial(_lazy, "runner_step_deepseek_v41")


def _runner_step_deepseek_v41() -> list[Implementation]:
    """``vllm-v1``'s step of DeepSeek-V4.1's attention layers (compressed MLA, indexer,
    compressor ring, SWA), a mutant of the sparse indexer's prefill rows, and a finding
    of vLLM's own kept apart (a FULL mixed graph's captured split)."""
    # DeepseekV4Attention.__init__: the SWA cache's pages are 32 tokens (the trace's).
    pages = {"fixes": {"block_size": 32}, "declines": "declines", "traced": True}
    return [
        _step_impl(
            "runner_step_deepseek_v41",
            "run",
            name="vllm-v1-deepseek-v41",
            description="installed vLLM (V1 runner) of DeepSeek-V4.1's attention layers as "
            "DeepseekV4FlashMLAAttention makes their caches on an sm100 GPU (compress "
            "ratios 1 and 2, MXFP4 indexer with sparse logits, a compressor ring, SWA "
            "window 64, an SWA-only MTP layer), KV-cache and attention groups vLLM's own, "
            "so that DeepseekV4SparseMLAMetadataBuilder, "
            "DeepseekV41SparseIndexerMetadataBuilder (over the V3.2 indexer's varlen "
            "build), DeepseekV41SparseSWAMetadataBuilder and CompressorMetadataBuilder "
            "build every step and capture; the platform, DeepGEMM's and DeepSelect's "
            "queries and schedule, FlashMLA's planner stood in; every field their "
            "consumers read judged",
            **pages,
        ),
        _step_impl(
            "runner_step_deepseek_v41",
            "sparse_rows_shared",
            name="vllm-v1-deepseek-v41-sparse-rows-shared",
            kind="mutant",
            description="installed vLLM (V1 runner, DeepSeek-V4.1) with "
            "DeepseekV41SparseIndexerMetadataBuilder.build slicing each prefill chunk's "
            "sparse-logits scratch from the first prefill token: after decodes, the "
            "first chunk shares the decode rows' scratch, which later consumer layers "
            "reuse",
            trigger=_deepseek_v41_hook("trigger_sparse_decodes_and_prefills"),
            reach=_deepseek_v41_hook("reach_v41"),
            smallest=_deepseek_v41_hook("smallest_sparse_decodes_and_prefills"),
            **pages,
        ),
        _step_impl(
            "runner_step_deepseek_v41",
            "run",
            name="vllm-v1-deepseek-v41-full-split-captured",
            kind="mutant",
            description="installed vLLM (V1 runner, DeepSeek-V4.1, cudagraph_mode FULL) on "
            "a FULL mixed graph replay (the step's, or the idle rank's dummy run's) that is "
            "not decodes alone on a capture of decodes alone: "
            "DeepseekV4FlashMLAAttention.forward_mqa chose its decode and prefill paths, and "
            "the prefill chunk plan, in Python at capture, so the replay reads SWA rows this "
            "step's build did not write (a finding of vLLM's own, kept apart)",
            trigger=_deepseek_v41_hook("trigger_full_split"),
            reach=_deepseek_v41_hook("reach_full_mixed"),
            smallest=_deepseek_v41_hook("smallest_full_split"),
            **{**pages, "declines": "declines_engine"},
        ),
    ]


_v1_ngram_hook = functools.partial(_lazy, "runner_step_v1_ngram")


def _runner_step_v1_ngram() -> list[Implementation]:
    """``vllm-v1``'s step with the GPU n-gram drafter (its invalid-draft trim), and a
    mutant of its token rows."""
    # The n-gram drafter reserves no lookahead (VllmConfig.num_lookahead_tokens: 0).
    ngram = {
        "lookahead": None,
        "admits": limits.ngram_step_admits,
        "declines": "declines",
        "traced": True,
    }
    return [
        _step_impl(
            "runner_step_v1_ngram",
            "run",
            name="vllm-v1-ngram-gpu",
            description="installed vLLM (V1 runner) with the GPU n-gram drafter "
            "(speculative method ngram_gpu: vllm/v1/spec_decode/ngram_proposer_gpu.py:"
            "NgramProposerGPU): vllm-v1's step, each running request's scheduled drafts "
            "trimmed to the valid ones the last proposal counted "
            "(update_scheduler_for_invalid_drafts in _update_states, before "
            "_prepare_inputs builds the step's offsets, positions and slots), the n-gram "
            "token tensors kept (update_ngram_gpu_tensors_incremental), and the proposal "
            "in the runner's own sample_tokens; the engine's tokens chosen so that the "
            "matcher proposes the trace's drafts",
            **ngram,
        ),
        _step_impl(
            "runner_step_v1_ngram",
            "run_moved_rows_stale",
            name="vllm-v1-ngram-gpu-moved-rows-stale",
            kind="mutant",
            description="installed vLLM (V1 runner, GPU n-gram drafter) with "
            "update_ngram_gpu_tensors_incremental's first-run branch (every step under "
            "synchronous scheduling) copying the new requests' token rows only: a request "
            "condense moved keeps the tokens of the one that left its row on the device, "
            "the drafter matches there, and the next step's trim cuts its drafts by that "
            "count",
            trigger=_v1_ngram_hook("trigger_moved_rows_stale"),
            reach=_v1_ngram_hook("reach_ngram"),
            smallest=_v1_ngram_hook("smallest_moved_rows_stale"),
            **ngram,
        ),
    ]


_flashinfer_hook = functools.partial(_lazy, "runner_step_flashinfer")


def _runner_step_flashinfer() -> list[Implementation]:
    """``vllm-v1``'s step on the FlashInfer backend (native wrappers, as on sm80), and a
    mutant of its builder's device buffer of last page lengths."""
    return [
        _step_impl(
            "runner_step_flashinfer",
            "run",
            name="vllm-v1-flashinfer",
            description="installed vLLM (V1 runner) on the FlashInfer backend as on an "
            "sm80 GPU (native FlashInfer wrappers, TRT-LLM off): vllm-v1's step with its "
            "attention layer on FLASHINFER (vllm/v1/attention/backends/flashinfer.py: "
            "FlashInferMetadataBuilder.__init__, build, _compute_flashinfer_kv_metadata, "
            "fast_plan_decode, a decode wrapper per graph batch size), the arrays each "
            "wrapper's plan receives and its graph buffers judged",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_flashinfer",
            "last_page_len_on_host",
            name="vllm-v1-flashinfer-last-page-len-on-host",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, FlashInfer) with "
            "FlashInferMetadataBuilder._compute_flashinfer_kv_metadata leaving "
            "paged_kv_last_page_len on the host: a FULL decode graph's wrapper reads the "
            "capture's last page lengths",
            trigger=_flashinfer_hook("trigger_stale_last_page"),
            reach=_hybrid_hook("reach_full_graphs"),
            smallest=_flashinfer_hook("smallest_stale_last_page"),
            traced=True,
        ),
        _step_impl(
            "runner_step_flashinfer",
            "run",
            name="vllm-v1-flashinfer-warmup-page-indices",
            kind="mutant",
            declines="declines_but_warm_up",
            description="installed vLLM (V1 runner, FlashInfer) with one request at a "
            "time and a model of one page of 16 tokens: the start-up's attention warm-up "
            "hands FlashInferMetadataBuilder more pages than its page-index buffer holds "
            "(a difference of vLLM's own, docs/findings.md)",
            trigger=_flashinfer_hook("trigger_warm_up_page_indices"),
            reach=_flashinfer_hook("reach_warm_up"),
            smallest=_flashinfer_hook("smallest_warm_up_page_indices"),
            traced=True,
        ),
    ]


_backends_hook = functools.partial(_lazy, "runner_step_backends")


def _runner_step_unpadded_drafts() -> list[Implementation]:
    """``vllm-v1``'s step with the unpadded drafter batch."""
    return [
        _step_impl(
            "runner_step_unpadded_drafts",
            "run",
            name="vllm-v1-unpadded-drafts",
            description="installed vLLM (V1 runner) with disable_padded_drafter_batch: "
            "vllm-v1's step, its drafter proposing on the valid sampled tokens "
            "(GPUModelRunner.propose_draft_token_ids' unpadded path, "
            "vllm/v1/spec_decode/llm_base_proposer.py: prepare_next_token_ids_cpu, "
            "prepare_inputs, propose), every draft sub-step judged",
            declines="declines",
            traced=True,
        ),
    ]


def _runner_step_v1_async() -> list[Implementation]:
    """``vllm-v1``'s step under async scheduling."""
    return [
        _step_impl(
            "runner_step_v1_async",
            "run",
            name="vllm-v1-async",
            description="installed vLLM (V1 runner) with async scheduling, as a CUDA "
            "engine runs by default: vllm-v1's step sent AsyncScheduler's optimistic "
            "computed tokens after a verify, which the runner corrects itself "
            "(_update_states' deferred correction, _prepare_inputs' "
            "update_num_computed_tokens_for_batch_change, _prepare_input_ids from the "
            "sampled tokens on the device); every field judged against a fresh engine "
            "sent the true counts",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_async",
            "run_drift_uncorrected",
            name="vllm-v1-async-drift-uncorrected",
            kind="mutant",
            description="installed vLLM (V1 runner, async scheduling) with "
            "update_num_computed_tokens_for_batch_change taking the scheduler's optimistic "
            "counts: a request that rejected drafts runs on from past its last accepted "
            "token",
            declines="declines",
            trigger=_async_hook("trigger_drift_uncorrected"),
            reach=_async_hook("reach_drift"),
            smallest=_async_hook("smallest_drift_uncorrected"),
            traced=True,
        ),
    ]


_async_hook = functools.partial(_lazy, "runner_step_v1_async")


_dbo_hook = functools.partial(_lazy, "runner_step_dbo")


_v2_dbo_hook = functools.partial(_lazy, "runner_step_v2_dbo")


_dflash_hook = functools.partial(_lazy, "runner_step_dflash")


_v1_dflash_hook = functools.partial(_lazy, "runner_step_v1_dflash")


_step3p5_hook = functools.partial(_lazy, "runner_step_v1_step3p5")


_mrope_hook = functools.partial(_lazy, "runner_step_v1_mrope")


_v2_mrope_hook = functools.partial(_lazy, "runner_step_mrope")


_prompt_embeds_hook = functools.partial(_lazy, "runner_step_prompt_embeds")


_prompt_logprobs_hook = functools.partial(_lazy, "runner_step_prompt_logprobs")


_v1_prompt_logprobs_hook = functools.partial(_lazy, "runner_step_v1_prompt_logprobs")


_profile_hook = functools.partial(_lazy, "runner_step_profile")


def _runner_step_dbo() -> list[Implementation]:
    """Each runner's step with dual-batch overlap (``vllm-v1``'s, ``vllm``'s), and a
    mutant of each one's micro-batch metadata."""
    return [
        _step_impl(
            "runner_step_dbo",
            "run",
            name="vllm-v1-dbo",
            description="installed vLLM (V1 runner) with dual-batch overlap (enable_dbo, "
            "both token thresholds at their floor) beside a data-parallel peer: the ranks' "
            "micro-batch decision (coordinate_batch_across_dp), "
            "vllm/v1/worker/ubatch_utils.py: maybe_create_ubatch_slices, "
            "split_attn_metadata, _make_metadata_with_slice, and UBatchWrapper's "
            "per-micro-batch forward contexts; each micro-batch's metadata judged against "
            "the step's eager unsplit build",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_dbo",
            "run_not_rebased",
            name="vllm-v1-dbo-query-start-not-rebased",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, dual-batch overlap) with "
            "ubatch_utils.slice_query_start_locs not subtracting the micro-batch's first "
            "request's offset: a second micro-batch's query_start_loc indexes past its "
            "own token rows",
            trigger=_dbo_hook("trigger_not_rebased"),
            reach=_dbo_hook("reach_microbatching"),
            smallest=_dbo_hook("smallest_not_rebased"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v2_dbo",
            "run",
            name="vllm-dbo",
            description="installed vLLM (V2 runner) with dual-batch overlap (enable_dbo, "
            "both token thresholds at their floor) beside a data-parallel peer: "
            "vllm/v1/worker/gpu/dp_utils.py: sync_cudagraph_and_dp_padding's micro-batch "
            "branch, cudagraph_utils.py: the micro-batched FULL graphs (_maybe_ubatch_twin, "
            "their capture and replay), ubatch_utils.py: UBatchRunner.prepare, "
            "create_ubatch_slices, _slice_input_batch and each micro-batch's forward "
            "context; each micro-batch's metadata judged against the step's eager unsplit "
            "build",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v2_dbo",
            "run_not_rebased",
            name="vllm-dbo-query-start-not-rebased",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V2 runner, dual-batch overlap) with "
            "gpu/ubatch_utils.py: _slice_query_start_loc not subtracting the micro-batch's "
            "first token: a second micro-batch's query_start_loc points past its own rows",
            trigger=_v2_dbo_hook("trigger_not_rebased"),
            reach=_v2_dbo_hook("reach_microbatching"),
            smallest=_v2_dbo_hook("smallest_not_rebased"),
            traced=True,
        ),
    ]


def _runner_step_backends() -> list[Implementation]:
    """``vllm-v1``'s step beside FlashAttention's and Triton MLA's eager builds, and a
    mutant of FlashAttention's builder that only another backend's KV read shows."""
    return [
        _step_impl(
            "runner_step_backends",
            "run",
            name="vllm-v1-backends",
            description="installed vLLM (V1 runner): each step as vllm-v1 runs it (Triton), "
            "and the step's eager build on FlashAttention (FA3, as vllm-v1-flash-attn), "
            "FlashInfer (as vllm-v1-flashinfer), Triton MLA (as vllm-v1-mla), FlashMLA "
            "(as vllm-v1-flashmla, at pages of 64), AITER FlashAttention (as "
            "vllm-v1-aiter-fa) and AITER MLA (as vllm-v1-aiter-mla) engines "
            "beside it: each backend's kv_len and "
            "kv_slots, derived from its own metadata as its kernels read it, against "
            "Triton's",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_backends",
            "run_flash_attn_kv_short",
            name="vllm-v1-backends-flash-attn-kv-short",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner) with FlashAttentionMetadataBuilder.build "
            "handing FA3 each request's seq_lens one key short, from a buffer of its own, "
            "in every build, eager and graph alike: only another backend's KV length tells",
            trigger=_backends_hook("reach_flash_attn"),
            reach=_backends_hook("reach_flash_attn"),
            smallest=_backends_hook("smallest_flash_attn_kv_short"),
            traced=True,
        ),
        _step_impl(
            "runner_step_backends",
            "run_aiter_fa_extends_as_prefills",
            name="vllm-v1-backends-aiter-fa-extends-as-prefills",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner) with AiterFlashAttentionMetadataBuilder."
            "build splitting the step two ways (every request past the decodes a prefill, "
            "as split_decodes_and_prefills does): an extend's context is never gathered, "
            "which only another backend's KV length tells",
            trigger=_backends_hook("reach_aiter_extend"),
            reach=_backends_hook("reach_aiter_extend"),
            smallest=_backends_hook("smallest_aiter_extend"),
            traced=True,
        ),
    ]


def _runner_step() -> list[Implementation]:
    return [
        _step_impl(
            "runner_step",
            "run",
            description="installed vLLM (V2 runner): vllm/v1/worker/gpu/model_runner.py:"
            "GPUModelRunner.execute_model up to the forward (dispatch_cg_and_sync_dp with a "
            "data-parallel peer, ModelCudaGraphManager's capture and dispatch, _dummy_run, "
            "prepare_inputs, prepare_attn, TritonAttentionMetadataBuilder), kept across the "
            "steps; eager on a second engine, fresh on a new one (the dummy-past-row "
            "finding kept apart)",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_mrope",
            "run",
            name="vllm-mrope",
            description="installed vLLM (V2 runner) of an M-RoPE model (Qwen2-VL's "
            "family): the vllm step, its model config declaring mrope_section so that the "
            "default model state keeps a RopeState (v1/worker/gpu/mm/rope.py: "
            "init_prefill_positions from the model's get_mrope_input_positions, "
            "prepare_positions' _prepare_rope_positions_kernel) whose rows the model is "
            "handed: each channel's row judged, and against the 1-D positions (text tokens: "
            "every channel the position)",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_mrope",
            "run_computed_one_short",
            name="vllm-mrope-computed-one-short",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V2 runner, M-RoPE) with RopeState.prepare_positions "
            "handing its kernel each request's computed tokens one short: every channel of a "
            "token after a request's first step one below its position",
            trigger=_v2_mrope_hook("trigger_computed_one_short"),
            reach=_v2_mrope_hook("reach_mrope"),
            smallest=_v2_mrope_hook("smallest_computed_one_short"),
            traced=True,
        ),
        _step_impl(
            "runner_step_prompt_embeds",
            "run",
            name="vllm-prompt-embeds",
            description="installed vLLM (V2 runner) with prompt embeddings enabled: the vllm "
            "step, requests of even ids arriving with prompt embeddings (a mixed prompt's "
            "is-token-ids mask for some), so that DefaultModelState.prepare_inputs_embeds "
            "and PromptEmbedsState.apply's _apply_prompt_embeds_kernel "
            "(v1/worker/gpu/model_states/prompt_embeds.py) lay them over the tokens' "
            "embeddings in the inputs_embeds buffer the model is handed: each token's row "
            "judged, and against the row its request's prompt gave its position",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_prompt_embeds",
            "run_computed_one_short",
            name="vllm-prompt-embeds-computed-one-short",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V2 runner, prompt embeddings) with "
            "PromptEmbedsState.apply handing its kernel each request's computed tokens one "
            "short: a later prompt chunk takes its rows one position early, the first "
            "decode the prompt's last row",
            trigger=_prompt_embeds_hook("trigger_computed_one_short"),
            reach=_prompt_embeds_hook("reach_prompt_embeds"),
            smallest=_prompt_embeds_hook("smallest_computed_one_short"),
            traced=True,
        ),
        _step_impl(
            "runner_step_prompt_logprobs",
            "run",
            name="vllm-prompt-logprobs",
            description="installed vLLM (V2 runner) with prompt logprobs: the vllm step, "
            "requests of ids divisible by 3 arriving with no computed tokens asking for "
            "them, each step sampled as it ran, so that sample_tokens runs "
            "PromptLogprobsWorker.compute_prompt_logprobs (v1/worker/gpu/sample/"
            "prompt_logprob.py: _prompt_logprobs_token_ids_kernel, the rows of a chunked "
            "prompt kept to its end): the rows handed out for each request, and how many "
            "score its prompt's next token, judged against its prompt's length; and the "
            "sampled tokens' logprobs (compute_topk_scores, _fill_logprob_token_ids_kernel): "
            "each request's own logprob_token_ids in its row; rows scored by token id "
            "(compute_prompt_token_id_logprobs); and, eager, whether each prompt row was "
            "taken from its own token's hidden state",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_prompt_logprobs",
            "run_chunks_dropped",
            name="vllm-prompt-logprobs-chunks-dropped",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V2 runner, prompt logprobs) with "
            "PromptLogprobsWorker keeping no chunk's rows past its step: a chunked prompt "
            "hands out its last chunk's rows alone",
            trigger=_prompt_logprobs_hook("trigger_chunks_dropped"),
            reach=_prompt_logprobs_hook("reach_prompt_logprobs"),
            smallest=_prompt_logprobs_hook("smallest_chunks_dropped"),
            traced=True,
        ),
        _step_impl(
            "runner_step_standalone_ar",
            "run",
            admits=limits.draft_model_step_admits,
            name="vllm-standalone-ar",
            description="installed vLLM (V2 runner) with a standalone draft model: the "
            "vllm step, its speculative config's draft_model method making vllm/v1/worker/"
            "gpu/spec_decode/standalone_ar/speculator.py:StandaloneARSpeculator, whose "
            "_prefill (the correction-token expansion kernel) and _multi_step_decode run "
            "after each step in the runner's own sample_tokens; one rank (no peer)",
            declines="declines",
            as_run=_lazy("runner_step", "never_eager"),
            traced=True,
        ),
        _step_impl(
            "runner_step_mtp_modules",
            "run",
            name="vllm-mtp-modules",
            description="installed vLLM (V2 runner) with one MTP module a draft: the vllm "
            "step, its MTP draft model of num_spec modules making vllm/v1/worker/gpu/"
            "spec_decode/multi_module_mtp/speculator.py:MultiModuleMTPSpeculator, whose "
            "propose (_prepare_input_buffers_kernel, pad_trailing_draft_slots, its graph "
            "dispatch) and _generate_drafts (each module's forward over the step's query, "
            "eager or its FULL graph) run after each step in the runner's own sample_tokens",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_mtp_modules",
            "run",
            name="vllm-mtp-modules-reprefill-before-prompt",
            kind="mutant",
            description="installed vLLM (V2 runner) with one MTP module a draft, after a "
            "decode that rejects more drafts than one past the tokens before its query (a "
            "prompt shorter than num_spec - 1 tokens): MultiModuleMTPSpeculator's "
            "_prepare_input_buffers_kernel re-prefills num_rejected - 1 tokens before the "
            "query, the first at a position below 0 (a finding of vLLM's own, kept apart)",
            declines="declines_engine",
            trigger=_mtp_modules_hook("trigger_reprefill_before_prompt"),
            reach=_mtp_modules_hook("reach_reprefill"),
            smallest=_mtp_modules_hook("smallest_reprefill_before_prompt"),
            standalone=standalone_reprefill.mtp_modules_reprefill,
            traced=True,
        ),
        _step_impl(
            "runner_step_dflash",
            "run",
            lookahead=lookahead.dflash_num_lookahead_tokens,
            admits=limits.dflash_step_admits,
            name="vllm-dflash",
            description="installed vLLM (V2 runner) with a DFlash draft model: the vllm step, "
            "its speculative config's dflash method making vllm/v1/worker/gpu/spec_decode/"
            "dflash/speculator.py:DFlashSpeculator, whose propose "
            "(_prepare_dflash_inputs_kernel: each request's context and its query of the "
            "bonus token and a mask token a draft; its graph dispatch) and one query "
            "forward, eager or its FULL graph, run after each step in the runner's own "
            "sample_tokens",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_dflash",
            "run_query_slots_unpadded",
            lookahead=lookahead.dflash_num_lookahead_tokens,
            admits=limits.dflash_step_admits,
            name="vllm-dflash-query-slots-unpadded",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V2 runner, DFlash draft) with "
            "_prepare_dflash_inputs_kernel not padding the query slot mapping past the "
            "batch's queries: a FULL graph replayed over more rows writes the draft's K/V "
            "at the slots the buffer still holds (a real request's)",
            trigger=_dflash_hook("trigger_query_slots_unpadded"),
            reach=_dflash_hook("reach_dflash"),
            smallest=_dflash_hook("smallest_query_slots_unpadded"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_dflash",
            "run",
            lookahead=lookahead.dflash_num_lookahead_tokens,
            admits=limits.dflash_step_admits,
            name="vllm-v1-dflash",
            description="installed vLLM (V1 runner) with a DFlash draft model: vllm-v1's "
            "step, its speculative config's dflash method making vllm/v1/spec_decode/"
            "dflash.py:DFlashProposer, whose set_inputs_first_pass "
            "(_copy_and_expand_dflash_inputs_kernel: each request's context and its query "
            "of the bonus token and a mask token a draft) and one query forward run after "
            "each step in the runner's own sample_tokens, the target returning its "
            "auxiliary hidden states",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_dflash",
            "run_padding_slots_stale",
            lookahead=lookahead.dflash_num_lookahead_tokens,
            admits=limits.dflash_step_admits,
            name="vllm-v1-dflash-padding-slots-stale",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, DFlash draft) with "
            "SpecDecodeBaseProposer._get_slot_mapping not giving the rows past the query "
            "the padding slot: a padded draft forward writes its padding tokens' K/V at an "
            "earlier proposal's query slots",
            trigger=_v1_dflash_hook("trigger_padding_slots_stale"),
            reach=_v1_dflash_hook("reach_v1_dflash"),
            smallest=_v1_dflash_hook("smallest_padding_slots_stale"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_draft_model",
            "run",
            admits=limits.draft_model_step_admits,
            name="vllm-v1-draft-model",
            description="installed vLLM (V1 runner) with a separate draft model: vllm-v1's "
            "step, its speculative config's draft_model method making vllm/v1/spec_decode/"
            "draft_model.py:DraftModelProposer, whose set_inputs_first_pass takes the extra "
            "input slot (copy_and_expand_eagle_inputs_kernel, compute_new_slot_mapping, "
            "extend_all_queries_by_N) and whose draft forwards run after each step in the "
            "runner's own sample_tokens",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_draft_model",
            "run_padding_slots_stale",
            admits=limits.draft_model_step_admits,
            name="vllm-v1-draft-model-padding-slots-stale",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, a draft model) with "
            "SpecDecodeBaseProposer._get_slot_mapping not giving the rows past the expanded "
            "query the padding slot: a padded first draft forward writes its padding "
            "tokens' K/V at an earlier proposal's slots",
            trigger=_v1_draft_model_hook("trigger_padding_slots_stale"),
            reach=_v1_draft_model_hook("reach_v1_draft_model"),
            smallest=_v1_draft_model_hook("smallest_padding_slots_stale"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_draft_model",
            "run_seq_lens_unextended",
            admits=limits.draft_model_step_admits,
            name="vllm-v1-draft-model-seq-lens-unextended",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, a draft model) with "
            "extend_all_queries_by_N not lengthening seq_lens by the drafting slot: the "
            "bonus token's row writes a key its attention does not read",
            trigger=_v1_draft_model_hook("trigger_seq_lens_unextended"),
            reach=_v1_draft_model_hook("reach_v1_draft_model"),
            smallest=_v1_draft_model_hook("smallest_seq_lens_unextended"),
            traced=True,
        ),
        _step_impl(
            "runner_step_chunked_local",
            "run",
            name="vllm-v1-chunked-local",
            cg_supports=("NEVER",),
            description="installed vLLM (V1 runner) of a model with chunked local attention "
            "(Llama 4's interleaved layers): vllm-v1's step with a second KV-cache group of "
            "a ChunkedLocalAttentionSpec on the backend create_chunked_local_attention_backend "
            "makes of Triton's (model_executor/layers/attention/chunked_local_attention.py: "
            "ChunkedLocalAttentionBuilder.build through v1/attention/backends/utils.py:"
            "make_local_attention_virtual_batches; cudagraph support NEVER, so its engines "
            "run modes NONE and PIECEWISE), the keys each token of the local layer reads "
            "held to its chunk's",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_chunked_local",
            "run_last_chunk_empty",
            name="vllm-v1-chunked-local-last-chunk-empty",
            cg_supports=("NEVER",),
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, chunked local attention) with "
            "make_local_attention_virtual_batches counting a request's last chunk's keys as "
            "seq_len % chunk: a request whose keys end on a chunk boundary reads none there",
            trigger=_chunked_local_hook("trigger_last_chunk_empty"),
            reach=_chunked_local_hook("reach_chunked_local"),
            smallest=_chunked_local_hook("smallest_last_chunk_empty"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_step3p5",
            "run",
            name="vllm-v1-step3p5-mtp",
            description="installed vLLM (V1 runner) with a Step3.5 model's MTP layers a "
            "draft: vllm-v1's step, its speculative config's step3p5_mtp draft making "
            "vllm/v1/spec_decode/step3p5.py:Step3p5MTPProposer (the runner's per-group "
            "block tables and slot mappings, its own attention groups, _get_slot_mapping, "
            "_update_positions_dependent_metadata, propose), run after each step in the "
            "runner's own sample_tokens",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_step3p5",
            "run_padding_slots_stale",
            name="vllm-v1-step3p5-mtp-padding-slots-stale",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, Step3.5 MTP draft) with the draft "
            "step's slot update (eagle_step_update_slot_mapping_and_metadata) not giving "
            "the rows past the batch the padding slot: a padded draft step writes its "
            "padding tokens' K/V at the first pass's slots",
            trigger=_step3p5_hook("trigger_padding_slots_stale"),
            reach=_step3p5_hook("reach_step3p5"),
            smallest=_step3p5_hook("smallest_padding_slots_stale"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_mrope",
            "run",
            name="vllm-v1-mrope",
            description="installed vLLM (V1 runner) of an M-RoPE model (Qwen2-VL's "
            "family): vllm-v1's step, its model config declaring mrope_section so that "
            "the runner keeps mrope_positions (_init_mrope_positions from the model's "
            "get_mrope_input_positions, _calc_mrope_positions, their copy in "
            "_prepare_inputs) and hands the model those: each channel's row judged, and "
            "against the 1-D positions (text tokens: every channel the position)",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_mrope",
            "run_completion_from_tokens",
            name="vllm-v1-mrope-completion-one-past",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, M-RoPE) with _calc_mrope_positions "
            "counting a completion's positions from the request's tokens, its sampled "
            "token included: every decode token's channels one past its position",
            trigger=_mrope_hook("trigger_completion_from_tokens"),
            reach=_mrope_hook("reach_mrope"),
            smallest=_mrope_hook("smallest_completion_from_tokens"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_prompt_logprobs",
            "run",
            name="vllm-v1-prompt-logprobs",
            description="installed vLLM (V1 runner) with prompt logprobs: vllm-v1's step, "
            "requests of ids divisible by 3 arriving with no computed tokens asking for "
            "them, so that sample_tokens runs GPUModelRunner._get_prompt_logprobs_dict "
            "(each chunk's rows at the request's query_start_loc offset, copied at its "
            "computed tokens, the prompt's rows handed out at the step that reaches its "
            "end): the rows handed out for each request, how many score its prompt's "
            "next token, and (eager) how many the model's hidden state of the row "
            "predicts, judged against its prompt's length",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_v1_prompt_logprobs",
            "run_handed_early",
            name="vllm-v1-prompt-logprobs-handed-early",
            kind="mutant",
            declines="declines",
            description="installed vLLM (V1 runner, prompt logprobs) with "
            "_get_prompt_logprobs_dict taking a chunk that ends one token short of the "
            "prompt for its last: the prompt's rows handed out a step early",
            trigger=_v1_prompt_logprobs_hook("trigger_handed_early"),
            reach=_v1_prompt_logprobs_hook("reach_prompt_logprobs"),
            smallest=_v1_prompt_logprobs_hook("smallest_handed_early"),
            traced=True,
        ),
        _step_impl(
            "runner_step_mamba_hybrid",
            "run",
            name="vllm-v2-mamba-hybrid",
            description="installed vLLM (V2 runner) of a hybrid model: the vllm step, its "
            "model config hybrid so that init_model_state picks vllm/v1/worker/gpu/"
            "model_states/mamba_hybrid.py:MambaHybridModelState (prepare_attn, "
            "preprocess_state, postprocess_state), with a second KV-cache group of a GDN "
            "linear-attention layer (GDNAttentionMetadataBuilder, a MambaSpec group of "
            "mamba_cache_mode none), every field of its metadata judged beside the "
            "attention layer's",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_mamba_hybrid",
            "pad_slot_padding",
            name="vllm-v2-mamba-hybrid-pad-slot-states",
            kind="mutant",
            description="installed vLLM (V2 runner, hybrid) with GDNAttentionMetadataBuilder"
            ".build's FULL-graph padding rows of spec_state_indices_tensor filled with "
            "PAD_SLOT_ID (-1), not NULL_BLOCK_ID",
            declines="declines",
            trigger=_mamba_hybrid_hook("trigger_full_spec_decode"),
            reach=_mamba_hybrid_hook("reach_full_spec_decode"),
            smallest=_mamba_hybrid_hook("smallest_full_spec_decode"),
            traced=True,
        ),
        _step_impl(
            "runner_step_mamba_hybrid",
            "dummy_stale_rows",
            name="vllm-v2-mamba-hybrid-dummy-stale-rows",
            kind="mutant",
            description="installed vLLM (V2 runner, hybrid) with vLLM 0.26.0's "
            "BlockTables.get_dummy_block_tables: an idle data-parallel rank's dummy run "
            "reads the block-table rows the last step left, a held request's state block",
            declines="declines",
            trigger=_mamba_hybrid_hook("trigger_dummy_stale_rows"),
            reach=_mamba_hybrid_hook("reach_dummy_run"),
            smallest=_mamba_hybrid_hook("smallest_dummy_stale_rows"),
            traced=True,
        ),
        _step_impl(
            "runner_step_v1",
            "run",
            name="vllm-v1",
            description="installed vLLM (V1 runner): vllm/v1/worker/gpu_model_runner.py:"
            "GPUModelRunner.execute_model through the forward (_update_states, "
            "_prepare_inputs, _determine_batch_execution_and_padding with a data-parallel "
            "peer, CudagraphDispatcher.dispatch, _get_slot_mappings, "
            "_build_attention_metadata, TritonAttentionMetadataBuilder, CUDAGraphWrapper), "
            "_capture_cudagraphs and _dummy_run, kept across the steps; eager on a second "
            "engine, fresh on a new one",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_hybrid",
            "run",
            name="vllm-v1-hybrid",
            description="installed vLLM (V1 runner) of a hybrid model: vllm-v1's step with a "
            "second KV-cache group of a GDN linear-attention layer "
            "(vllm/v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build, "
            "build_for_cudagraph_capture, a MambaSpec group of mamba_cache_mode none), every "
            "field of its metadata judged beside the attention layer's",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_kda",
            "run",
            name="vllm-v1-kimi-k3-kda",
            description="installed vLLM (V1 runner) of a hybrid model whose linear layer is "
            "Kimi K3's KDA: vllm-v1-hybrid's step on KimiK3KDAAttentionBackend "
            "(vllm/models/kimi_k3/nvidia/kda_metadata.py: KimiK3KDAMetadataBuilder.build, "
            "stage_spec_decode_metadata, build_for_cudagraph_capture; FULL graphs kept; "
            "the graph mode FULL declined), every field of its GDN metadata judged beside "
            "the attention layer's",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_kda_rocm",
            "run",
            name="vllm-v1-kimi-k3-kda-rocm",
            description="installed vLLM (V1 runner) of a hybrid model whose linear layer is "
            "Kimi K3's KDA on ROCm: vllm-v1-hybrid's step on KimiK3ROCmKDABackend "
            "(vllm/models/kimi_k3/amd/kda_metadata.py: KimiK3ROCmKDAMetadataBuilder.build, "
            "its FLA chunk metadata built on the device by prepare_chunk_metadata_device, a "
            "Triton kernel under the interpreter; GDN's build_for_cudagraph_capture; GDN's "
            "UNIFORM_BATCH graphs), every field of its GDN metadata judged beside the "
            "attention layer's, and the device chunk_indices and chunk_offsets held to the "
            "ranges the FLA chunk kernels accept and to GDN's host "
            "_build_chunk_metadata of the same prefill query offsets",
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_kda",
            "staging_one_short",
            name="vllm-v1-kimi-k3-kda-staging-one-short",
            kind="mutant",
            description="installed vLLM (V1 runner, Kimi K3 KDA) with "
            "KimiK3KDAMetadataBuilder.build staging num_spec_decodes - 1 requests in the "
            "FULL graph's buffers (the last speculative decode staged as padding)",
            trigger=_hybrid_hook("trigger_full_spec_decode"),
            reach=_hybrid_hook("reach_full_spec_decode"),
            smallest=_hybrid_hook("smallest_full_spec_decode"),
            declines="declines",
            traced=True,
        ),
        _step_impl(
            "runner_step_hybrid",
            "run",
            name="vllm-v1-hybrid-prefill-in-decode-graph",
            kind="mutant",
            description="installed vLLM (V1 runner, hybrid) on a uniform batch holding a "
            "first chunk: the runner replays a FULL decode graph, GDNAttentionMetadataBuilder"
            ".build builds the chunk as a prefill and stages nothing in the graph's buffers, "
            "the replay reads stale state indices (a finding of vLLM's own, kept apart)",
            declines="declines_engine",
            trigger=_hybrid_hook("trigger_prefill_in_decode_graph"),
            reach=_hybrid_hook("reach_full_graphs"),
            smallest=_hybrid_hook("smallest_prefill_in_decode_graph"),
            traced=True,
        ),
        *(
            _step_impl(
                "runner_step_hybrid",
                attr,
                name=name,
                kind="mutant",
                description=f"installed vLLM (V1 runner, hybrid) with {what}",
                declines="declines",
                trigger=_hybrid_hook("trigger_full_spec_decode"),
                reach=_hybrid_hook("reach_full_spec_decode"),
                smallest=_hybrid_hook("smallest_full_spec_decode"),
                traced=True,
            )
            for attr, name, what in (
                (
                    "pad_slot_padding",
                    "vllm-v1-hybrid-pad-slot-states",
                    "GDNAttentionMetadataBuilder.build's FULL-graph padding rows of "
                    "spec_state_indices_tensor filled with PAD_SLOT_ID (-1), not NULL_BLOCK_ID",
                ),
                (
                    "last_state_nulled",
                    "vllm-v1-hybrid-last-state-nulled",
                    "GDNAttentionMetadataBuilder.build's null fill of spec_state_indices_tensor "
                    "starting one row early (the last real request's state indices nulled)",
                ),
                (
                    "padding_repeats_last",
                    "vllm-v1-hybrid-padding-repeats-last",
                    "GDNAttentionMetadataBuilder.build's FULL-graph padding rows of "
                    "spec_state_indices_tensor copied from the last real request's, not "
                    "NULL_BLOCK_ID",
                ),
            )
        ),  # fmt: skip
        _step_impl(
            "runner_step",
            "run",
            name="vllm-dummy-past-row",
            kind="mutant",
            description="installed vLLM (V2 runner) with a capture size past a block-table "
            "row's reach: the capture's dummy request is longer than its row (a difference "
            "of vLLM's own, docs/findings.md)",
            declines="declines_engine",
            trigger=_trigger_dummy_past_row,
            reach=_reach_piecewise_capture,
            smallest=_smallest_dummy_past_row,
            traced=True,
        ),
        _step_impl(
            "runner_step",
            "run",
            name="vllm-warmup-no-requests",
            kind="mutant",
            description="installed vLLM (V2 runner) with drafts and a step budget of "
            "next_n tokens, which its config checks accept: the start-up's kernel warm-up "
            "runs none of its requests, then decodes its request 0 (an IndexError of "
            "vLLM's own, docs/findings.md)",
            declines="declines_engine",
            trigger=_trigger_warm_up_without_requests,
            reach=_reach_v2_drafts,
            smallest=_smallest_warm_up_without_requests,
            traced=True,
        ),
        _step_impl(
            "runner_step_v1",
            "run_drafter_dummy",
            name="vllm-v1-drafter-dummy-slots",
            kind="mutant",
            description="installed vLLM (V1 runner) with its dummy runs judged: an idle "
            "data-parallel rank's SpecDecodeBaseProposer.dummy_run writes the draft layer's "
            "KV through the slots of the last proposal (a difference of vLLM's own, "
            "docs/findings.md)",
            declines="declines",
            trigger=_v1_hook("trigger_drafter_dummy"),
            reach=_v1_hook("reach_drafter_dummy"),
            smallest=_v1_hook("smallest_drafter_dummy"),
            traced=True,
        ),
        _step_impl(
            "runner_step_hybrid",
            "dummy_held_rows",
            name="vllm-v1-hybrid-dummy-held-rows",
            kind="mutant",
            description="installed vLLM (V1 runner, hybrid) with its dummy runs judged: an "
            "idle data-parallel rank's _dummy_run builds the GDN layer's metadata from the "
            "persistent batch's rows, a held request's state block (a difference of vLLM's "
            "own, docs/findings.md)",
            declines="declines",
            trigger=_hybrid_hook("trigger_dummy_held_rows"),
            reach=_hybrid_hook("reach_dummy_run"),
            smallest=_hybrid_hook("smallest_dummy_held_rows"),
            traced=True,
        ),
        _step_impl(
            "runner_step_profile",
            "run_state_slots",
            name="vllm-profile-state-slots",
            kind="mutant",
            description="installed vLLM (V2 runner) whose capture's dummy block tables give "
            "each dummy request a state slot (page 1 + i, as prepare_dummy_attn's valid "
            "state slots): over the minimal KV cache of the worker's start-up "
            "profile_cudagraph_memory, the largest dummy batch names a page past it",
            declines="declines",
            trigger=_profile_hook("trigger_state_slots"),
            reach=_profile_hook("reach_profile"),
            smallest=_profile_hook("smallest_state_slots"),
            traced=True,
        ),
    ]


def _slot_mapping() -> list[Implementation]:
    t = slot_mapping
    return [
        vllm_impl(
            "slot_mapping",
            "run",
            description="installed vLLM (V2 runner): vllm/v1/worker/gpu/block_table.py:"
            "BlockTables.compute_slot_mappings",
        ),
        vllm_impl(
            "slot_mapping",
            "run_v1",
            name="vllm-v1",
            description="installed vLLM (V1 runner): vllm/v1/worker/block_table.py:"
            "BlockTable.compute_slot_mapping",
        ),
        vllm_impl(
            "slot_mapping",
            "upstream_stale_padding",
            name="upstream-pr36580-stale-padding",
            kind="mutant",
            description="installed vLLM (V2 runner) with #36580 reverted: padding written "
            "from positions.shape[0] (T_pad), padded tokens keep stale slots",
            trigger=t.trigger_stale_padding,
            reach=t.reach_padded,
            smallest=t.smallest_stale_padding,
        ),
    ]


def _unpadding() -> list[Implementation]:
    t = unpadding
    return [
        vllm_impl(
            "unpadding",
            "run",
            description="installed vLLM: v1/worker/gpu/block_table.py:BlockTables, "
            "v1/worker/gpu/input_batch.py:prepare_pos_seq_lens, "
            "v1/attention/backend.py:CommonAttentionMetadata.unpadded",
        ),
        vllm_impl(
            "unpadding",
            "upstream_stale_slots",
            name="upstream-pr36580-stale-slots",
            kind="mutant",
            description="installed vLLM's _compute_slot_mappings_kernel with #36580 reverted: "
            "padding starts at the padded token count",
            trigger=t.trigger_padded_tokens,
            reach=t.reach_padded,
            smallest=t.smallest_padded,
        ),
    ]


_SPLIT_CALLEE = Callee(
    "vllm",
    "split_decodes_and_prefills",
    (
        Argument("require_uniform", "require_uniform", False),
        Argument(
            "short_extends_as_prefills",
            "treat_short_extends_as_decodes",
            True,
            to_case=lambda v: int(not v),
        ),
    ),
    (
        Condition(
            "not self.use_pcp",
            {True: "prefill context parallelism off (the default)",
             False: "--prefill-context-parallel-size > 1"},
            # The callers set use_pcp = prefill_context_parallel_size > 1 (their __init__);
            # where that runs, which graphs, padded or not: per release (compat).
            source="vllm/model_executor/layers/attention/mla_attention.py: "
            "MLACommonMetadataBuilder.__init__ (use_pcp = "
            "parallel_config.prefill_context_parallel_size > 1)",
            releases={False: vllm_compat.PCP_RELEASES},
        ),
        Condition(
            "self.query_len_support != QueryLenSupport.VARLEN",
            {True: "an MLA backend whose decode needs uniform query lengths",
             False: "an MLA backend with varlen decode"},
            source="vllm/model_executor/layers/attention/mla_attention.py: "
            "MLACommonMetadataBuilder (query_len_support)",
        ),
        Condition(
            "self.require_uniform_decodes",
            {True: "a sparse MLA backend that requires uniform decodes",
             False: "a sparse MLA backend with varlen decodes"},
            source="vllm/model_executor/layers/attention/sparse_mla_attention.py",
        ),
        Condition(  # 0.26.0 and 0.27.x: DeepseekV32IndexerMetadataBuilder.build
            "not self.use_flattening",
            {True: "the DeepSeek indexer without flattening",
             False: "the DeepSeek indexer with flattening"},
            source="vllm/v1/attention/backends/mla/indexer.py: "
            "DeepseekV32IndexerMetadataBuilder (0.26.0, 0.27.x)",
        ),
        Condition(
            "not (self.use_flattening or self.supports_varlen)",
            {True: "the DeepSeek indexer without flattening or varlen paged MQA logits",
             False: "the DeepSeek indexer with flattening or varlen paged MQA logits"},
            source="vllm/v1/attention/backends/mla/indexer.py: "
            "DeepseekV32IndexerMetadataBuilder",
        ),
    ),
)  # fmt: skip
"""Who calls ``split_decodes_and_prefills`` with the arguments ``decode-split`` draws,
and what their expressions mean: read from vLLM 0.26.0 to 0.33.0; each release's calls
are read from its own package (a call whose expression is not declared here is not taken
as reaching the case), and what prefill context parallelism allows in it from
:data:`compat.PCP_RELEASES <attnfuzz.adapters.vllm.compat.PCP_RELEASES>`."""


def _callers(target: str, impl: str) -> Callee | None:
    return _SPLIT_CALLEE if target == "decode-split" else None


def _planner() -> StepPlanner:
    """vLLM's own step planning (:mod:`.runner_modes`), where the installed release's binds."""
    problem = vllm.planner_problem()
    if problem is not None:
        raise PlannerUnbound(problem)
    from attnfuzz.adapters.vllm.runner_modes import engine_step_plan

    return engine_step_plan


def _padded_single_decode() -> Case:
    """One decode of one token padded to the capture size 2 (a FULL step), split with
    ``require_uniform`` and short extends as prefills, ``decode_threshold`` 0."""
    config = EngineConfig(
        max_model_len=8, max_num_seqs=2, max_num_batched_tokens=2, block_size=1, num_spec=0,
        cudagraph_capture_sizes=(2,), topk=1, num_heads=1, head_dim=1, cudagraph_mode="FULL",
        cg_support="ALWAYS",
    )  # fmt: skip
    params = (("decode_threshold", 0), ("require_uniform", 1), ("short_extends_as_prefills", 1))
    return Case(config, Batch((1,), (1,), seed=0, use_cudagraph=True), params)


SHIPPED_BUGS = (
    ShippedBug("require-uniform", "decode-split", "vllm", "0.25.1", "0.26.0",
        "split_decodes_and_prefills(require_uniform=True) counts short extends as decodes "
        "before it reads treat_short_extends_as_decodes", checks=("values",)),
    ShippedBug("padding-as-prefill", "decode-split", "vllm", "0.30.0", "0.31.0",
        "split_decodes_and_prefills(require_uniform=True) with short extends as prefills "
        "counts a graph-padding request (query length 0) as a prefill; 0.31.0 adds "
        "`& (query_lens != 0)`; before 0.26.0 the padded-uniform check answers first",
        checks=("values",), first_buggy="0.26.0", case=lambda: _padded_single_decode(),
        note="the pull request of 0.31.0's fix is not named here: #29644 is the earlier "
        "change that made the uniform rule pad-aware (it dropped `| (query_lens == 0)`), "
        "the shortcut this defect slipped past"),
    ShippedBug("#43982", "draft-block-tables", "vllm", "0.22.1", "0.23.0",
        "Gemma4 drafter attaches unsliced per-group block tables"),
    ShippedBug("#43991", "max-seq-len", "vllm-mamba-hybrid", "0.22.1", "0.23.0",
        "MambaHybridModelState: max_seq_len = max_model_len outside capture"),
    ShippedBug("#43991", "max-seq-len", "vllm", "0.22.1", "0.23.0",
        "V2 drafter: max_seq_len = max_model_len"),
    ShippedBug("#43991", "max-seq-len", "vllm-v1", "0.22.1", "0.23.0",
        "the drafter the V1 runner drives (EagleSpeculator): draft max_seq_len = max_model_len",
        checks=("max_seq_len", "walk", "page_bounds")),
    ShippedBug("#42135", "mtp-seq-lens", "vllm", "0.21.0", "0.22.0",
        "2-D [max_num_seqs, next_n] seq-lens table sliced [:B, :L]",
        checks=("contiguous", "stride", "consumer"),
        note="0.20.0 to 0.27.1 also lack the native lengths' clamp (the next entry), which a "
        "run meets first; #42135's own checks are what count here"),
    ShippedBug("clamp", "mtp-seq-lens", "vllm", "0.27.1", "0.28.0",
        "native-MTP lengths not clamped at 0: a padding request's lengths are negative "
        "(read as uint32 downstream)", checks=("values",),
        note="fixed upstream in 0.28.0's DeepseekV32IndexerMetadataBuilder."
        "_prepare_decode_tensors (`.clamp_(min=0)`), before attnfuzz met it; attnfuzz "
        "re-finds it on the releases that ship it; not one of the five bugs"),
    ShippedBug("clamp", "indexer-decode", "vllm", "0.27.1", "0.28.0",
        "the builder's unclamped native lengths (mtp-seq-lens): a padding request's row "
        "reaches the decode top-k as [0, -1)", checks=("exception",)),
    ShippedBug("xpu-top-k", "indexer-decode", "vllm-xpu", "0.21.0", "0.22.0",
        "sparse_attn_indexer's XPU branch hands xpu_ops.top_k_per_row_decode the 2-D "
        "lengths it indexes as 1-D: every decode step fails to broadcast", checks=("exception",)),
    ShippedBug("clamp", "indexer-decode", "vllm-xpu", "0.27.1", "0.28.0",
        "the builder's unclamped native lengths (mtp-seq-lens): a padding request's row "
        "reaches the decode top-k as [0, -1)", checks=("exception",)),
    ShippedBug("#50302", "flatten-decode", "vllm", "0.26.0", "0.27.0",
        "indexer's expanded table cdiv(max_model_len, bs) wide vs the 128-token-aligned one "
        "(#46074)"),
)  # fmt: skip
"""vLLM's own defects in the supported releases, each triaged from the releases' source
(docs/releases.md): ``benchmarks/releases.py bugs`` measures them, and the engine tests
of ``tests/test_entries.py`` must fail on a release that ships one."""

VLLM = Engine(
    name=vllm.ENGINE,
    install=vllm.INSTALL,
    # Looked up in the package on each call, where tests stand another release in.
    installed_version=lambda: vllm.installed_version(),
    unavailable=lambda: vllm.unavailable(),
    status=lambda: vllm.status(),
    implementations={
        "decode-split": _decode_split(),
        "draft-block-tables": _draft_block_tables(),
        "flatten-decode": _flatten_decode(),
        "flex-block-mask": _flex_block_mask(),
        "indexer-decode": _indexer_decode(),
        "max-seq-len": _max_seq_len(),
        "mtp-seq-lens": _mtp_seq_lens(),
        "persistent-batch": _persistent_batch(),
        "runner-step": [
            *_runner_step(),
            *_runner_step_linear(),
            *_runner_step_mamba_align(),
            *_runner_step_pcp(),
            *_runner_step_v2_align(),
            *_runner_step_encoder_decoder(),
            *_runner_step_mla(),
            *_runner_step_flash_attn(),
            *_runner_step_triton_flash_attn(),
            *_runner_step_aiter_fa(),
            *_runner_step_cpu(),
            *_runner_step_amx_mla(),
            *_runner_step_flex(),
            *_runner_step_triton_diffkv(),
            *_runner_step_rocm(),
            *_runner_step_turboquant(),
            *_runner_step_sparse_mla(),
            *_runner_step_flashmla(),
            *_runner_step_aiter_mla(),
            *_runner_step_aiter_mla_sparse(),
            *_runner_step_sparse_swa(),
            *_runner_step_sparse_swa_cpu(),
            *_runner_step_minimax_m3(),
            *_runner_step_deepseek_v41(),
            *_runner_step_v1_ngram(),
            *_runner_step_flashinfer(),
            *_runner_step_backends(),
            *_runner_step_unpadded_drafts(),
            *_runner_step_v1_async(),
            *_runner_step_dbo(),
        ],
        "slot-mapping": _slot_mapping(),
        "unpadding": _unpadding(),
    },
    planner=_planner,
    runners=runner_choice,
    shipped_bugs=SHIPPED_BUGS,
    callers=_callers,
)
"""The engine vLLM (the value of the entry point ``vllm``)."""
