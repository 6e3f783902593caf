"""vLLM's own decision of a step's CUDA-graph mode and padding, on the host.

:func:`engine_step_plan` computes what :func:`attnfuzz.reference.runner.step_plan`
states as rules (read off vLLM 0.33.0), by running the installed release's code on
a ``VllmConfig`` built by :func:`attnfuzz.adapters.vllm._engine.vllm_config`:

- The mode: ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
  (``vllm/config/compilation.py``) with ``AttentionCGSupport[config.cg_support]``
  as the backends' minimum support, on a compilation config set up as a CUDA
  engine's is (``VLLM_COMPILE``, attention among the splitting ops: the CPU
  platform sets neither). A mode it rewrites is refused (:class:`PlannerRefuses`).
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
  which under data parallelism runs ``sync_cudagraph_and_dp_padding`` with the
  all-reduce answered with the column the peer rank's own call fills
  (:func:`_peer_column_v2`).

Releases 0.21.0 to 0.33.0 bind: where a release offers a step in an older form
(a keyword the resolution or the DP dispatch lacks, V2's uniform count before
``get_uniform_decode_token_count``, the manager's attributes), :func:`compat.has`
picks it and the release's own code runs. Adaptive verification (``varlen_decode``)
exists from 0.28.0: before, such a configuration is refused.

One inline difference has no API to find it by: from 0.31.0 V2's ``execute_model``
passes ``max_query_len=None`` for a step with a prefill, 0.28.0 to 0.30.0 its longest
query. The planner passes None on every release; on 0.28.0 to 0.30.0 a varlen decode
graph (``varlen_decode``) could take a step with a prefill no longer than ``next_n``
(``decode_threshold < next_n``, or a data-parallel peer that is not a uniform decode
with at most ``next_n`` tokens), which the planner does not replay.

Nothing is captured or replayed: only the host-side decisions run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import MethodType, SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import _engine, compat
from attnfuzz.harness.errors import PlannerRefuses
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.runner import StepPlan, mode_problem

DP_SIZE = 2
"""Ranks of a data-parallel step: this one (rank 0) and the peer the batch describes."""
DP_RANK, PEER_RANK = 0, 1

_RESOLVE = "vllm/config/compilation.py: CompilationConfig.resolve_cudagraph_mode_and_sizes"
_V1_DECISION = "v1/worker/gpu_model_runner.py: _determine_batch_execution_and_padding"
_ADAPTIVE = "v1/worker/gpu/spec_decode/adaptive_verification.py: resolve_adaptive_cudagraph_mode"
_V2_INIT = "v1/worker/gpu/cudagraph_utils.py: CudaGraphManager.__init__ (0.24.0)"
_ADAPTIVE_INLINE = "v1/worker/gpu/model_runner.py: GPUModelRunner.initialize_kv_cache (0.28.0)"


def prepare() -> None:
    _engine.prepare()
    import vllm.v1.cudagraph_dispatcher  # noqa: F401
    import vllm.v1.worker.gpu.dp_utils  # noqa: F401
    import vllm.v1.worker.gpu_model_runner  # noqa: F401


def _refuse(config: EngineConfig, rule: str, got: Any) -> PlannerRefuses:
    why = mode_problem(config.cudagraph_mode, config.cg_support, config.next_n)
    return PlannerRefuses(
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
        # gpu/model_runner.py (V2) GPUModelRunner.initialize_kv_cache: with adaptive
        # verification the mode is first given a separate decode routine.
        rule, adapted = _adaptive_mode(config, wanted)
        if adapted != wanted:
            raise _refuse(config, rule, adapted.name)
    sizes = sorted(cc.cudagraph_capture_sizes)
    # The keywords this release's resolution takes: from 0.25.0 use_v2_model_runner
    # (before, it rounds V2's capture sizes as V1's: 0.24.0 compilation.py,
    # resolve_cudagraph_mode_and_sizes); from 0.30.0 piecewise_capture_available
    # (before, piecewise capture is taken as available, as here: the model is compiled).
    keywords: dict[str, Any] = {}
    if compat.has(compat.RESOLVE_V2_RUNNER):
        keywords["use_v2_model_runner"] = v2
    if compat.has(compat.RESOLVE_MODES):
        keywords["piecewise_capture_available"] = True
    try:
        # gpu_model_runner.py: GPUModelRunner._check_and_update_cudagraph_mode (V1);
        # gpu/model_runner.py: GPUModelRunner.initialize_kv_cache (V2). The minimum
        # support over the backends is the case's cg_support; the model is compiled
        # (piecewise capture available).
        mode = cc.resolve_cudagraph_mode_and_sizes(
            AttentionCGSupport[config.cg_support],
            "attnfuzz",
            config.next_n,
            max_num_reqs=config.max_num_seqs,
            **keywords,
        )
    except ValueError as e:  # no FULL graphs with cg_support NEVER, or no capture size left
        raise PlannerRefuses(
            f"{_RESOLVE} refuses cudagraph_mode {config.cudagraph_mode} with cg_support "
            f"{config.cg_support} (next_n={config.next_n}): {e}"
        ) from e
    if mode != wanted:
        raise _refuse(config, _RESOLVE, mode.name)
    _check_sizes(config.next_n, cc, sizes, _RESOLVE)
    return vc, mode


def _check_sizes(next_n: int, cc: Any, sizes: list[int], rule: str) -> None:
    """V1 with FULL decode graphs and next_n > 1 (and before 0.25.0 V2 too) rounds the
    capture sizes up to multiples of next_n (``adjust_cudagraph_sizes_for_spec_decode``);
    attnfuzz's engines capture multiples of next_n only (reference.invariants)."""
    if sorted(cc.cudagraph_capture_sizes) != sizes:
        raise ValueError(
            f"{rule} (adjust_cudagraph_sizes_for_spec_decode) rewrites the capture sizes "
            f"{sizes} to {sorted(cc.cudagraph_capture_sizes)} (next_n={next_n}): "
            f"attnfuzz's capture sizes are multiples of next_n"
        )


def _adaptive_mode(config: EngineConfig, wanted: Any) -> tuple[str, Any]:
    """``(rule, mode)``: the mode V2's ``initialize_kv_cache`` gives ``wanted`` under
    adaptive verification, and the code that decides it; refused where the release has
    no adaptive verification (no varlen decode graphs: 0.28.0 brings both)."""
    from vllm.config import CUDAGraphMode

    if compat.has(compat.ADAPTIVE_MODE):
        # 0.30.0 on: gpu/model_runner.py GPUModelRunner.initialize_kv_cache calls it.
        from vllm.v1.worker.gpu.spec_decode.adaptive_verification import (
            resolve_adaptive_cudagraph_mode,
        )

        if not wanted.has_full_cudagraphs():  # the function asserts it
            raise _refuse(config, _ADAPTIVE, "an assertion error (no FULL graphs)")
        return _ADAPTIVE, resolve_adaptive_cudagraph_mode(wanted, piecewise_capture_available=True)
    if compat.has(compat.V2_VARLEN_DECODE):
        # 0.28.0, 0.29.0 (gpu/model_runner.py: GPUModelRunner.initialize_kv_cache) have no
        # function for it: the runner sets the mode itself, whatever was asked.
        return _ADAPTIVE_INLINE, CUDAGraphMode.FULL_AND_PIECEWISE
    raise PlannerRefuses(
        f"vLLM {compat.installed_version()} has no adaptive verification, which "
        f"varlen_decode=True needs: {compat.V2_VARLEN_DECODE.missing()} "
        f"(first in {compat.V2_VARLEN_DECODE.since})"
    )


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
        compilation_config=vc.compilation_config,
        input_batch=SimpleNamespace(lora_id_to_lora_request={}),
        cudagraph_dispatcher=dispatcher,
        vllm_config=vc,
        parallel_config=vc.parallel_config,
    )
    if compat.has(compat.V1_SP_PADDING):
        # Before 0.32.0 the decision first pads the count for sequence parallelism
        # with the runner's own method (0.31.0 gpu_model_runner.py:
        # _determine_batch_execution_and_padding), which reads compilation_config.
        runner._pad_for_sequence_parallelism = MethodType(
            GPUModelRunner._pad_for_sequence_parallelism, runner
        )
    # Cascade attention is off (a FULL graph cannot run it): a required argument before
    # 0.32.0, then deprecated and ignored.
    cascade = {"use_cascade_attn": False} if compat.has(compat.V1_CASCADE_ATTN) else {}
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
            **cascade,
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
    ``cudagraph_mode``, ``decode_query_len``, ``varlen_decode`` (0.28.0 on),
    ``ubatch_runner`` (None: no microbatching, read by ``_maybe_ubatch_twin``, 0.30.0
    on), ``use_breakable_cg`` (0.23.0 on, read by 0.26.0's ``_init_candidates``),
    ``lora_capture_cases`` (``[0]``: no LoRA) and the LoRA dispatch map from the real
    ``_build_lora_dispatch_map`` (0.24.0 on), and the empty ``_candidates`` (a list
    before 0.24.0, then a dict keyed by tokens and LoRAs) and ``_capture_descs`` that
    ``_init_candidates`` fills. ``_graphs_captured = True`` stands for ``capture()``
    having run, after which ``dispatch`` answers.
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
    if compat.has(compat.V2_BREAKABLE):
        from vllm.v1.worker.gpu.cudagraph_utils import is_breakable_cudagraph_enabled

        manager.use_breakable_cg = (
            is_breakable_cudagraph_enabled() and mode.has_piecewise_cudagraphs()
        )
    if compat.has(compat.V2_LORA_CASES):
        manager.lora_capture_cases = [0]
        manager._lora_dispatch_map, manager._max_lora_case = manager._build_lora_dispatch_map()
        manager._candidates = {}
    else:  # 0.21.0 to 0.23.0: a list indexed by token count alone
        manager._candidates = []
    manager._capture_descs = {}
    if not compat.has(compat.RESOLVE_V2_RUNNER):
        # Before 0.25.0 __init__ rounds the capture sizes itself, in any mode (0.24.0
        # gpu/cudagraph_utils.py: CudaGraphManager.__init__). vllm-project/vllm#45953
        # (cited by 0.25.0's resolve_cudagraph_mode_and_sizes) gave the resolution
        # use_v2_model_runner and V2 its own rounding in _init_candidates.
        cc = vc.compilation_config
        sizes = sorted(cc.cudagraph_capture_sizes)
        cc.adjust_cudagraph_sizes_for_spec_decode(
            decode_query_len, vc.parallel_config.tensor_parallel_size
        )
        _check_sizes(decode_query_len, cc, sizes, _V2_INIT)
    manager._init_candidates()
    manager._graphs_captured = True
    return manager


def _uniform_token_count(
    num_reqs: int, num_tokens: int, max_query_len: int, has_prefill: bool
) -> int | None:
    """The uniform decode count V2's runner passes ``dispatch_cg_and_sync_dp``."""
    if compat.has(compat.UNIFORM_DECODE_ELIGIBLE):
        # gpu/model_runner.py: GPUModelRunner.gather_batch_req_state. A step with no
        # prefill is eligible for decode graphs.
        from vllm.v1.worker.utils import get_uniform_decode_token_count

        return get_uniform_decode_token_count(
            num_reqs, num_tokens, max_query_len, decode_graph_eligible=not has_prefill
        )
    if compat.has(compat.UNIFORM_HAS_PREFILL):
        # 0.28.0 to 0.30.0: the same helper, told whether the step has a prefill.
        from vllm.v1.worker.utils import get_uniform_decode_token_count

        return get_uniform_decode_token_count(
            num_reqs, num_tokens, max_query_len, has_prefill=has_prefill
        )
    # Before 0.28.0 (0.27.0 gpu/model_runner.py: GPUModelRunner.execute_model) any step
    # whose requests have one length is uniform, prefill or not.
    from vllm.v1.worker.gpu.cudagraph_utils import get_uniform_token_count

    return get_uniform_token_count(num_reqs, num_tokens, max_query_len)


def _v2_dispatch(
    manager: Any,
    vc: Any,
    next_n: int,
    *,
    num_reqs: int,
    num_tokens: int,
    max_query_len: int,
    has_prefill: bool,
    dp_size: int,
    dp_rank: int,
    need_eager: bool,
) -> Any:
    """``dispatch_cg_and_sync_dp`` as ``GPUModelRunner.execute_model`` (V2) calls it
    for one rank's step (no LoRA, no microbatching runner), with the keywords the
    release takes; its batch descriptor."""
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    uniform = _uniform_token_count(num_reqs, num_tokens, max_query_len, has_prefill)
    keywords: dict[str, Any] = {}
    if compat.has(compat.V2_DP_LORAS):  # 0.24.0 on
        keywords["num_active_loras"] = 0
    if compat.has(compat.V2_DP_QUERY_LEN):  # 0.28.0 on: the bound of varlen decode graphs
        # None with a prefill, as from 0.31.0 (gpu/model_runner.py: execute_model);
        # 0.28.0 to 0.30.0 pass a prefill step's bound too (see the module's docstring).
        keywords["max_query_len"] = None if has_prefill else max_query_len
    if compat.has(compat.V2_DP_UBATCHING):  # 0.30.0 on
        keywords.update(
            parallel_config=vc.parallel_config,
            allow_ubatching=False,
            uniform_decode=uniform == next_n,
        )
    desc, _ = dispatch_cg_and_sync_dp(
        manager,
        num_reqs,
        num_tokens,
        uniform,
        dp_size,
        dp_rank,
        need_eager=need_eager,
        **keywords,
    )
    return desc


def _v2_plan(config: EngineConfig, batch: Batch, vc: Any, mode: Any) -> StepPlan:
    from vllm.config import CUDAGraphMode

    next_n = config.next_n
    manager = _v2_manager(vc, mode, next_n, config.varlen_decode)
    num_reqs, num_tokens = len(batch.q_lens), sum(batch.q_lens)
    # gpu/model_runner.py: GPUModelRunner.gather_batch_req_state. attnfuzz's decodes
    # are the requests with q_len <= decode_threshold (reference.batch).
    has_prefill = any(q > config.threshold for q in batch.q_lens)
    dp_size = DP_SIZE if batch.dp_peer_tokens else 1
    peer = nullcontext()
    if batch.dp_peer_tokens:
        # The peer's own call: a uniform decode of next_n per request, or one request
        # of another length, a prefill (from 0.28.0 no uniform count and no query-length
        # bound; before, get_uniform_token_count counts its one length as uniform).
        peer_tokens = batch.dp_peer_tokens
        uniform_peer = batch.dp_peer_uniform
        with _peer_column_v2() as column:
            _v2_dispatch(
                manager,
                vc,
                next_n,
                num_reqs=peer_tokens // next_n if uniform_peer else 1,
                num_tokens=peer_tokens,
                max_query_len=next_n if uniform_peer else peer_tokens,
                has_prefill=not uniform_peer,
                dp_size=dp_size,
                dp_rank=PEER_RANK,
                need_eager=False,
            )
        peer = _peer_all_reduce_v2(column)
    with peer:
        # gpu/model_runner.py: GPUModelRunner.execute_model's call.
        desc = _v2_dispatch(
            manager,
            vc,
            next_n,
            num_reqs=num_reqs,
            num_tokens=num_tokens,
            max_query_len=max(batch.q_lens),
            has_prefill=has_prefill,
            dp_size=dp_size,
            dp_rank=DP_RANK,
            need_eager=not batch.use_cudagraph,
        )
    # gpu/model_runner.py: GPUModelRunner.prepare_inputs pads to
    # max(num_tokens, desc.num_tokens) (before 0.29.0 to desc.num_tokens, never
    # below num_tokens here) and desc.num_reqs (None: unpadded); the slot mappings
    # always span the padded count (prepare_attn, BlockTables.compute_slot_mappings);
    # DefaultModelState.prepare_attn hands attention the padded sizes only on FULL steps.
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


class _Collected(Exception):
    """Ends the peer's call at its collective: its column is all attnfuzz needs."""


@contextmanager
def _peer_column_v2() -> Iterator[torch.Tensor]:
    """Collects the column the peer rank's own ``sync_cudagraph_and_dp_padding``
    (``vllm/v1/worker/gpu/dp_utils.py``) fills before its all-reduce: the rows and
    their meaning are the release's (3 rows in 0.21.0, 7 in 0.33.0)."""
    column = torch.zeros(0, dtype=torch.int32)

    def collect(tensor: torch.Tensor) -> None:
        column.resize_(tensor.shape[0]).copy_(tensor[:, PEER_RANK])
        raise _Collected

    try:
        with _dp_group_v2(collect):
            yield column
    except _Collected:
        pass
    if not column.numel():
        raise RuntimeError("the peer rank's dispatch_cg_and_sync_dp reached no all-reduce")


def _peer_all_reduce_v2(peer_column: torch.Tensor) -> AbstractContextManager[Any]:
    """The all-reduce of ``vllm/v1/worker/gpu/dp_utils.py`` answered for the peer
    rank: the ranks' columns of the tensor are summed in place, and the stand-in adds
    the peer's column to this rank's."""

    def all_reduce(tensor: torch.Tensor) -> None:
        tensor[:, PEER_RANK] += peer_column.to(tensor.dtype)

    return _dp_group_v2(all_reduce)


def _dp_group_v2(all_reduce: Callable[[torch.Tensor], None]) -> AbstractContextManager[Any]:
    """``get_dp_group()`` of ``vllm/v1/worker/gpu/dp_utils.py`` whose all-reduce is
    ``all_reduce``: 0.33.0 calls its ``cpu_all_reduce_``; before, the module's
    ``dist.all_reduce(tensor, group=get_dp_group().cpu_group)`` (0.32.0 dp_utils.py:
    sync_cudagraph_and_dp_padding), stood in for where the module imports ``dist``."""
    import vllm.v1.worker.gpu.dp_utils as dp_utils

    group = SimpleNamespace(cpu_all_reduce_=all_reduce, cpu_group=None)
    stand_ins: dict[str, Any] = {"get_dp_group": lambda: group}
    if hasattr(dp_utils, "dist"):  # the collective the module holds, whichever it is
        stand_ins["dist"] = SimpleNamespace(
            all_reduce=lambda tensor, group=None: all_reduce(tensor)
        )
    return mock.patch.multiple(dp_utils, **stand_ins)
