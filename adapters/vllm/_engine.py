"""vLLM's own objects for a case: environment, configs, KV-cache specs, common metadata.

Everything the adapters share, written once. Facts this relies on (vLLM 0.33.0):

- ``VLLM_TARGET_DEVICE=cpu`` selects vLLM's CPU platform where torch has no
  CUDA; vLLM's ``@triton.jit`` metadata kernels then run under the Triton
  interpreter, which needs ``TRITON_INTERPRET=1`` *and* an empty
  ``CUDA_VISIBLE_DEVICES`` (``vllm/triton_utils/importing.py`` disables
  Triton otherwise). ``HF_HUB_OFFLINE=1``: nothing is ever fetched.
- A ``ModelConfig`` is built from a local directory holding a tiny
  ``config.json`` (a 2-layer DeepSeek-V3.2-style model with one MTP layer),
  with ``skip_tokenizer_init=True``.
- Platforms override some limits while a ``VllmConfig`` is validated (the CPU
  platform sets the MLA block size to 16 and the batched-token budget to
  2048). The builders read the limits from the config when they allocate
  their persistent buffers, and a case is one step of a scheduler running
  under the case's limits, so :func:`vllm_config` sets the case's limits on
  the validated config (block size, token and request budgets, model length,
  capture sizes) before any builder sees it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any
from unittest import mock

import numpy as np
import torch

# First: decides TRITON_INTERPRET (set where there is no CUDA), which the lines below read.
from attnfuzz.kernels import _triton  # noqa: F401  # isort: skip
from attnfuzz.adapters import vllm_platform
from attnfuzz.harness.lifetime import scratch_dir
from attnfuzz.reference.batch import CommonMetadata, EngineConfig


def configure_environment() -> None:
    """Set what vLLM reads at import, before it is imported (never overriding a user's)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # Imported as a library, vLLM leaves its loggers unconfigured, and Python's
    # last-resort handler would print its platform warnings ("Failed to import
    # from vllm._C", "Reset SSM cache type ...") into attnfuzz's own output.
    logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"])
    if not torch.cuda.is_available():
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # read from 0.28.0 on
        os.environ.setdefault(vllm_platform.REQUEST, "1")  # every release: the plugin
        if os.environ.get("TRITON_INTERPRET") == "1":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""


configure_environment()

# A DeepSeek-V3.2-style model, as small as vLLM accepts: the sparse indexer's
# metadata builder and the MTP drafter are configured from it.
TINY_DEEPSEEK_V32: dict[str, Any] = {
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v32",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_routed_experts": 2,
    "n_shared_experts": 1,
    "num_experts_per_tok": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "vocab_size": 128,
    "max_position_embeddings": 1 << 17,
    "index_topk": 4,
    "index_head_dim": 16,
    "index_n_heads": 2,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


@cache
def model_dir() -> str:
    """A private directory holding the tiny model's ``config.json``, written once.

    vLLM reads it while a config is built; it is kept (read again by a
    config built later) and removed when this process exits, or by the next
    attnfuzz command if this process is killed (:mod:`attnfuzz.harness.lifetime`).
    """
    path = scratch_dir("vllm-model", remove_at_exit=True)
    (path / "config.json").write_text(json.dumps(TINY_DEEPSEEK_V32))
    return str(path)


@cache
def _base_config(num_spec: int) -> Any:
    """A validated ``VllmConfig`` of the tiny model with ``num_spec`` MTP tokens (cached:
    the first one takes seconds, a speculative config most of a second)."""
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    max_model_len = TINY_DEEPSEEK_V32["max_position_embeddings"]
    model = ModelConfig(
        model=model_dir(), skip_tokenizer_init=True, max_model_len=max_model_len, dtype="bfloat16"
    )
    parallel = ParallelConfig()
    spec = None
    if num_spec > 0:
        spec = SpeculativeConfig(
            method="mtp",
            num_speculative_tokens=num_spec,
            target_model_config=model,
            target_parallel_config=parallel,
        )
    scheduler = SchedulerConfig(
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
    )
    return VllmConfig(
        model_config=model,
        speculative_config=spec,
        scheduler_config=scheduler,
        cache_config=CacheConfig(block_size=16),
        parallel_config=parallel,
    )


def vllm_config(config: EngineConfig) -> Any:
    """The ``VllmConfig`` of a case's engine: the validated base with the case's limits.

    Copies: the cached base is never modified.
    """
    base = _base_config(config.num_spec)
    out = copy.copy(base)
    out.model_config = copy.copy(base.model_config)
    out.model_config.max_model_len = config.max_model_len
    out.scheduler_config = copy.copy(base.scheduler_config)
    out.scheduler_config.max_num_seqs = config.max_num_seqs
    out.scheduler_config.max_num_batched_tokens = config.max_num_batched_tokens
    out.scheduler_config.max_model_len = config.max_model_len
    out.cache_config = copy.copy(base.cache_config)
    out.cache_config.block_size = config.block_size
    out.compilation_config = copy.copy(base.compilation_config)
    sizes = sorted(config.cudagraph_capture_sizes)
    out.compilation_config.cudagraph_capture_sizes = sizes
    out.compilation_config.max_cudagraph_capture_size = max(sizes, default=0)
    return out


@contextmanager
def worker_workspace(device: torch.device) -> Iterator[None]:
    """While an engine's runner is made: what ``Worker.init_device`` gives it first
    (``gpu_worker.py:_init_workspace_and_model_runner``), a workspace manager of its
    own on ``device`` (``vllm/v1/worker/workspace.py:init_workspace_manager``).

    The manager is process-wide, and the builders reserve their scratch in it when
    they are made (``triton_mla.py:_reserve_attn_logits_workspace``, only when one is
    initialized). In one process of many engines, whether that ran, and whether it
    had to grow a buffer another engine left, depended on what ran before; each
    engine now starts from a manager of its own, as each vLLM worker does. A manager
    grows its buffer after ``torch.accelerator.empty_cache()``, which raises where
    there is no accelerator (this machine): there it releases nothing. Releases
    without the module are left as they are."""
    if importlib.util.find_spec("vllm.v1.worker.workspace") is None:
        yield
        return
    from vllm.v1.worker import workspace

    workspace.reset_workspace_manager()
    workspace.init_workspace_manager(device)
    if torch.accelerator.is_available():
        yield
        return
    with mock.patch.object(torch.accelerator, "empty_cache", lambda: None):
        yield


def prepare() -> None:
    """Import vLLM and validate the base configs before any child is forked."""
    import vllm.config  # noqa: F401

    _base_config(0)


def common_attn_metadata(
    meta: CommonMetadata,
    device: torch.device | str,
    *,
    seq_lens_cpu_upper_bound: np.ndarray | None = None,
) -> Any:
    """vLLM's ``CommonAttentionMetadata`` of the step ``meta`` describes (padded sizes).

    ``query_start_loc_cpu`` and ``seq_lens_cpu_upper_bound`` are host copies, as
    the model runner passes them; the upper bound defaults to the exact lengths.
    """
    from vllm.v1.attention.backend import CommonAttentionMetadata

    def dev(x: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(x)).to(device)

    upper = meta.seq_lens if seq_lens_cpu_upper_bound is None else seq_lens_cpu_upper_bound
    return CommonAttentionMetadata(
        query_start_loc=dev(meta.query_start_loc),
        query_start_loc_cpu=torch.as_tensor(meta.query_start_loc.copy()),
        seq_lens=dev(meta.seq_lens),
        num_reqs=meta.num_reqs,
        num_actual_tokens=meta.num_actual_tokens,
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        block_table_tensor=dev(meta.block_table),
        slot_mapping=dev(meta.slot_mapping),
        seq_lens_cpu_upper_bound=torch.as_tensor(np.asarray(upper, dtype=np.int32).copy()),
    )
