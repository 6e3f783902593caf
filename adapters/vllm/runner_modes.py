"""vLLM 0.33.0's own decision of a step's CUDA-graph mode and padding, on the host.

:func:`engine_step_plan` computes what :func:`attnfuzz.reference.runner.step_plan`
states as rules, by running the engine's code on a ``VllmConfig`` built by
:func:`attnfuzz.adapters.vllm._engine.vllm_config`:

- The mode: ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
  (``vllm/config/compilation.py``) with ``AttentionCGSupport[config.cg_support]``
  as the backends' minimum support, on a compilation config set up as a CUDA
  engine's is (``VLLM_COMPILE``, attention among the splitting ops: the CPU
  platform sets neither). A mode it rewrites is refused (``ValueError``).
- Model Runner V1: a real ``CudagraphDispatcher`` (``vllm/v1/cudagraph_dispatcher.py``)
  with its keys, and ``GPUModelRunner._determine_batch_execution_and_padding``
  itself (``vllm/v1/worker/gpu_model_runner.py``), called on a stand-in runner
  holding only what it reads; data parallelism runs ``coordinate_batch_across_dp``
  (``vllm/v1/worker/dp_utils.py``) unchanged, with the all-reduce of ``_run_ar``
  answered for a second rank (:func:`_peer_all_reduce_v1`).
- Model Runner V2: a ``CudaGraphManager`` (``vllm/v1/worker/gpu/cudagraph_utils.py``)
  whose ``__init__`` needs a pipeline-parallel group and a CUDA graph pool, so it
  is made with ``object.__new__`` and given only the attributes its real
  ``_init_candidates`` and ``dispatch`` read (:func:`_v2_manager`); then
  ``dispatch_cg_and_sync_dp`` (``vllm/v1/worker/gpu/dp_utils.py``) unchanged,
  which under data parallelism runs ``sync_cudagraph_and_dp_padding`` with
  ``get_dp_group`` answered for a second rank (:func:`_peer_all_reduce_v2`).

Nothing is captured or replayed: only the host-side decisions run.
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager, nullcontext
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.runner import StepPlan, mode_problem

DP_SIZE = 2
"""Ranks of a data-parallel step: this one (rank 0) and the peer the batch describes."""
DP_RANK, PEER_RANK = 0, 1

_RESOLVE = "vllm/config/compilation.py: CompilationConfig.resolve_cudagraph_mode_and_sizes"
_V1_DECISION = "v1/worker/gpu_model_runner.py: _determine_batch_execution_and_padding"
_ADAPTIVE = "v1/worker/gpu/spec_decode/adaptive_verification.py: resolve_adaptive_cudagraph_mode"


def prepare() -> None:
    _engine.prepare()
    import vllm.v1.cudagraph_dispatcher  # noqa: F401
    import vllm.v1.worker.gpu.dp_utils  # noqa: F401
    import vllm.v1.worker.gpu_model_runner  # noqa: F401


def _refuse(config: EngineConfig, rule: str, got: Any) -> ValueError:
    why = mode_problem(config.cudagraph_mode, config.cg_support, config.next_n)
    return ValueError(
        f"vLLM does not keep cudagraph_mode {config.cudagraph_mode} "
        f"(cg_support {config.cg_support}, next_n={config.next_n}, runner {config.runner}, "
        f"varlen_decode={config.varlen_decode}): {rule} gives {got}{f'; {why}' if why else ''}"
    )


def resolved_config(config: EngineConfig) -> tuple[Any, Any]:
    """``(vllm_config, mode)``: the case's ``VllmConfig`` after the runner resolved its
    CUDA-graph mode, and that mode (``config.cudagraph_mode``; any other is refused)."""
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode
    from vllm.v1.attention.backend import AttentionCGSupport

    vc = _engine.vllm_config(config)  # copies: compilation_config is this case's own
    cc = vc.compilation_config
    # What a CUDA platform has where the CPU one has NONE and no splitting ops:
    # CompilationConfig.set_splitting_ops_for_v1 puts the attention ops in
    # splitting_ops under VLLM_COMPILE. The resolution's fallbacks read them,
    # and CudagraphDispatcher.__init__ asserts them for piecewise modes.
    cc.mode = CompilationMode.VLLM_COMPILE
    cc.splitting_ops = list(CompilationConfig._attention_ops)
    wanted = CUDAGraphMode[config.cudagraph_mode]
    cc.cudagraph_mode = wanted
    v2 = config.runner == "v2"
    if v2 and config.varlen_decode:
        # model_runner.py (V2) GPUModelRunner.initialize_kv_cache: with adaptive
        # verification the mode is first given a separate decode routine.
        from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
            resolve_adaptive_cudagraph_mode,
        )

        if not wanted.has_full_cudagraphs():  # the function asserts it
            raise _refuse(config, _ADAPTIVE, "an assertion error (no FULL graphs)")
        adapted = resolve_adaptive_cudagraph_mode(wanted, piecewise_capture_available=True)
        if adapted != wanted:
            raise _refuse(config, _ADAPTIVE, adapted.name)
    sizes = sorted(cc.cudagraph_capture_sizes)
    try:
        # gpu_model_runner.py: GPUModelRunner._check_and_update_cudagraph_mode (V1);
        # gpu/model_runner.py: GPUModelRunner.initialize_kv_cache (V2). The minimum
        # support over the backends is the case's cg_support; the model is compiled
        # (piecewise capture available).
        mode = cc.resolve_cudagraph_mode_and_sizes(
            AttentionCGSupport[config.cg_support],
            "attnfuzz",
            config.next_n,
            use_v2_model_runner=v2,
            max_num_reqs=config.max_num_seqs,
            piecewise_capture_available=True,
        )
    except ValueError as e:  # no FULL graphs with cg_support NEVER, or no capture size left
        raise ValueError(
            f"{_RESOLVE} refuses cudagraph_mode {config.cudagraph_mode} with cg_support "
            f"{config.cg_support} (next_n={config.next_n}): {e}"
        ) from e
    if mode != wanted:
        raise _refuse(config, _RESOLVE, mode.name)
    if sorted(cc.cudagraph_capture_sizes) != sizes:
        # V1 with FULL decode graphs and next_n > 1 rounds the sizes up to multiples
        # of next_n (CompilationConfig.adjust_cudagraph_sizes_for_spec_decode);
        # attnfuzz's engines capture multiples of next_n only (reference.invariants).
        raise ValueError(
            f"{_RESOLVE} (adjust_cudagraph_sizes_for_spec_decode) rewrites the capture sizes "
            f"{sizes} to {sorted(cc.cudagraph_capture_sizes)} (next_n={config.next_n}): "
            f"attnfuzz's capture sizes are multiples of next_n"
        )
    return vc, mode


def engine_step_plan(config: EngineConfig, batch: Batch) -> StepPlan:
    """The runtime mode and padding vLLM's runner ``config.runner`` gives ``batch``.

    ``batch.use_cudagraph = False`` runs the step eager the runner's way
    (V1 ``force_eager``, V2 ``need_eager``); ``batch.dp_peer_tokens > 0`` adds a
    second data-parallel rank with that many tokens, a uniform decode of
    ``next_n`` per request when ``batch.dp_peer_uniform``, else one request.
    """
    vc, mode = resolved_config(config)
    if batch.dp_peer_tokens:
        vc.parallel_config = copy.copy(vc.parallel_config)
        vc.parallel_config.data_parallel_size = DP_SIZE
        vc.parallel_config.data_parallel_rank = DP_RANK
    if config.runner == "v1":
        return _v1_plan(config, batch, vc, mode)
    if config.runner == "v2":
        return _v2_plan(config, batch, vc, mode)
    raise ValueError(f"runner {config.runner!r}: expected v1 or v2")


# --- Model Runner V1 -----------------------------------------------------------


def _v1_plan(config: EngineConfig, batch: Batch, vc: Any, mode: Any) -> StepPlan:
    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    next_n = config.next_n
    # gpu_model_runner.py: GPUModelRunner.__init__ builds the dispatcher;
    # _check_and_update_cudagraph_mode initializes its keys with the resolved mode.
    dispatcher = CudagraphDispatcher(vc)
    dispatcher.initialize_cudagraph_keys(mode, next_n)
    # The attributes of the runner _determine_batch_execution_and_padding reads
    # (no LoRA adapters, no encoder-decoder model), its own static _is_uniform_decode.
    runner = SimpleNamespace(
        _is_uniform_decode=GPUModelRunner._is_uniform_decode,
        uniform_decode_query_len=next_n,
        model_config=vc.model_config,
        input_batch=SimpleNamespace(lora_id_to_lora_request={}),
        cudagraph_dispatcher=dispatcher,
        vllm_config=vc,
        parallel_config=vc.parallel_config,
    )
    q = np.asarray(batch.q_lens, dtype=np.int32)
    num_reqs, num_tokens = len(q), int(q.sum())
    peer = nullcontext()
    if batch.dp_peer_tokens:
        # The peer rank's own dispatch (the same dispatcher: every rank has the
        # same keys), as its _determine_batch_execution_and_padding makes it.
        peer_tokens = batch.dp_peer_tokens
        peer_uniform = batch.dp_peer_uniform and GPUModelRunner._is_uniform_decode(
            next_n, next_n, peer_tokens, peer_tokens // next_n
        )
        peer_mode, peer_desc = dispatcher.dispatch(peer_tokens, uniform_decode=peer_uniform)
        peer = _peer_all_reduce_v1([peer_tokens, peer_desc.num_tokens, 0, peer_mode.value])
    with peer:
        # gpu_model_runner.py: GPUModelRunner.execute_model's call; force_eager as
        # _dummy_run passes it (only CUDAGraphMode.NONE allowed). Microbatching is
        # allowed (_allow_microbatching) and off (ParallelConfig.use_ubatching).
        cg_mode, desc, _, _, _ = GPUModelRunner._determine_batch_execution_and_padding(
            runner,
            num_tokens=num_tokens,
            num_reqs=num_reqs,
            num_scheduled_tokens_np=q,
            max_num_scheduled_tokens=int(q.max()),
            allow_microbatching=True,
            force_eager=not batch.use_cudagraph,
        )
    # GPUModelRunner.execute_model: the padded sizes, pad_attn, and the slot
    # mapping's length (padded with pad_attn or has_separate_kv_update).
    num_tokens_padded = desc.num_tokens
    num_reqs_padded = desc.num_reqs if desc.num_reqs is not None else num_reqs
    pad_attn = cg_mode == CUDAGraphMode.FULL
    pad_slots = pad_attn or config.separate_kv_update
    return StepPlan(
        mode=cg_mode.name,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_tokens_padded=num_tokens_padded,
        num_reqs_padded=num_reqs_padded if pad_attn else num_reqs,
        slot_mapping_tokens=num_tokens_padded if pad_slots else num_tokens,
        decided_by=(_V1_DECISION,),
    )


def _peer_all_reduce_v1(peer_column: list[int]) -> AbstractContextManager[Any]:
    """``vllm/v1/worker/dp_utils.py``'s collective answered for the peer rank.

    ``_run_ar`` fills its rank's column of a ``[4, dp_size]`` tensor (tokens,
    padded tokens, microbatching, runtime mode) and sums it over the group with
    ``torch.distributed.all_reduce``: the stand-in adds the peer's column. It also
    stands in for ``get_dp_group`` (read by ``_get_device_and_group``), on the CPU.
    """
    import vllm.v1.worker.dp_utils as dp_utils

    def all_reduce(tensor: torch.Tensor, group: Any = None) -> None:
        tensor[:, PEER_RANK] += torch.tensor(peer_column, dtype=tensor.dtype)

    group = SimpleNamespace(device="cpu", device_group=None, cpu_group=None)
    stack = mock.patch.multiple(
        dp_utils, get_dp_group=lambda: group, dist=SimpleNamespace(all_reduce=all_reduce)
    )
    return stack


# --- Model Runner V2 -----------------------------------------------------------


def _v2_manager(vc: Any, mode: Any, decode_query_len: int, varlen_decode: bool) -> Any:
    """A ``CudaGraphManager`` as ``GPUModelRunner.initialize_kv_cache`` (V2) makes it,
    its graphs taken as captured.

    ``CudaGraphManager.__init__`` asks ``get_pp_group()`` (no process group here)
    and the platform for a graph pool (none on the CPU), so the object is made
    with ``object.__new__`` and given, as ``__init__`` sets them, only the
    attributes the real ``_init_candidates`` and ``dispatch`` read:
    ``vllm_config``, ``compilation_config``, ``max_num_reqs`` (max_num_seqs),
    ``cudagraph_mode``, ``decode_query_len``, ``varlen_decode``,
    ``ubatch_runner`` (None: no microbatching, read by ``_maybe_ubatch_twin``),
    ``lora_capture_cases`` (``[0]``: no LoRA), the LoRA dispatch map from the
    real ``_build_lora_dispatch_map``, and the empty ``_candidates`` and
    ``_capture_descs`` that ``_init_candidates`` fills. ``_graphs_captured = True``
    stands for ``capture()`` having run, after which ``dispatch`` answers.
    """
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    manager = object.__new__(CudaGraphManager)
    manager.vllm_config = vc
    manager.compilation_config = vc.compilation_config
    manager.max_num_reqs = vc.scheduler_config.max_num_seqs
    manager.cudagraph_mode = mode
    manager.decode_query_len = decode_query_len
    manager.varlen_decode = varlen_decode
    manager.ubatch_runner = None
    manager.lora_capture_cases = [0]
    manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
    manager._candidates = {}
    manager._capture_descs = {}
    manager._init_candidates()
    manager._graphs_captured = True
    return manager


def _v2_plan(config: EngineConfig, batch: Batch, vc: Any, mode: Any) -> StepPlan:
    from vllm.config import CUDAGraphMode
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp
    from vllm.v1.worker.utils import get_uniform_decode_token_count

    next_n = config.next_n
    manager = _v2_manager(vc, mode, next_n, config.varlen_decode)
    num_reqs, num_tokens = len(batch.q_lens), sum(batch.q_lens)
    max_query_len = max(batch.q_lens)
    # gpu/model_runner.py: GPUModelRunner.gather_batch_req_state. A step with no
    # prefill is eligible for decode graphs; attnfuzz's decodes are the requests
    # with q_len <= decode_threshold (reference.batch).
    has_prefill = any(q > config.threshold for q in batch.q_lens)
    uniform = get_uniform_decode_token_count(num_reqs, num_tokens, max_query_len, not has_prefill)
    peer = nullcontext()
    if batch.dp_peer_tokens:
        # The peer's own dispatch: a uniform decode of next_n per request, or one
        # request of another length (no uniform count, no query-length bound).
        peer_tokens = batch.dp_peer_tokens
        peer_uniform = next_n if batch.dp_peer_uniform else None
        peer_reqs = peer_tokens // next_n if peer_uniform else 1
        peer_desc = manager.dispatch(peer_reqs, peer_tokens, peer_uniform, 0, peer_uniform)
        # sync_cudagraph_and_dp_padding's rows: tokens, desired mode, uniform count
        # (0: None), max query length (-1: None), ubatching, requests, skip drafts.
        column = [peer_tokens, peer_desc.cg_mode.value, peer_uniform or 0, peer_uniform or -1]
        peer = _peer_all_reduce_v2([*column, 0, peer_reqs, 0])
    with peer:
        # gpu/model_runner.py: GPUModelRunner.execute_model's call (no LoRA, no
        # microbatching runner; max_query_len None with a prefill).
        desc, _ = dispatch_cg_and_sync_dp(
            manager,
            num_reqs,
            num_tokens,
            uniform,
            DP_SIZE if batch.dp_peer_tokens else 1,
            DP_RANK,
            max_query_len=None if has_prefill else max_query_len,
            need_eager=not batch.use_cudagraph,
            num_active_loras=0,
            parallel_config=vc.parallel_config,
            allow_ubatching=False,
            uniform_decode=uniform == next_n,
        )
    # gpu/model_runner.py: GPUModelRunner.prepare_inputs pads to
    # max(num_tokens, desc.num_tokens) and desc.num_reqs (None: unpadded); the
    # slot mappings always span the padded count (prepare_attn,
    # BlockTables.compute_slot_mappings); DefaultModelState.prepare_attn hands
    # attention the padded sizes only on FULL steps.
    num_tokens_padded = max(num_tokens, desc.num_tokens)
    num_reqs_padded = desc.num_reqs or num_reqs
    pad_attn = desc.cg_mode == CUDAGraphMode.FULL
    return StepPlan(
        mode=desc.cg_mode.name,
        num_tokens=num_tokens,
        num_reqs=num_reqs,
        num_tokens_padded=num_tokens_padded,
        num_reqs_padded=num_reqs_padded if pad_attn else num_reqs,
        slot_mapping_tokens=num_tokens_padded,
        decided_by=("vllm/v1/worker/gpu/dp_utils.py: dispatch_cg_and_sync_dp",),
    )


def _peer_all_reduce_v2(peer_column: list[int]) -> AbstractContextManager[Any]:
    """``get_dp_group()`` of ``vllm/v1/worker/gpu/dp_utils.py`` answered for the peer rank:
    ``cpu_all_reduce_`` sums the ranks' columns of a ``[7, dp_size]`` tensor in place,
    and the stand-in adds the peer's column to this rank's."""
    import vllm.v1.worker.gpu.dp_utils as dp_utils

    def cpu_all_reduce_(tensor: torch.Tensor) -> None:
        tensor[:, PEER_RANK] += torch.tensor(peer_column, dtype=tensor.dtype)

    group = SimpleNamespace(cpu_all_reduce_=cpu_all_reduce_)
    return mock.patch.object(dp_utils, "get_dp_group", lambda: group)
