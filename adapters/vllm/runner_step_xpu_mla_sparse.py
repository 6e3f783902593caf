"""vLLM's model runner V1 step of a sparse-attention MLA model on the XPU sparse MLA
backend, as the implementation ``vllm-v1-xpu-mla-sparse`` of ``runner-step``.

The engine of :mod:`.runner_step_sparse_mla` (DeepSeek-V3.2's attention, the indexer's
top-k of ``index_topk`` 64 keys per query token, its latent head 576, its KV cache
bf16), its MLA layer (and the MTP draft layer) on vLLM's ``XPU_MLA_SPARSE`` backend
(``vllm/v1/attention/backends/mla/xpu_mla_sparse.py``, the backend
``XPUPlatform.get_attn_backend_cls`` picks for every sparse model): its own
``XPUMLASparseMetadataBuilder.build`` runs on every build (eager, padded, afresh, the
drafter's sub-steps; a PIECEWISE capture run builds none). It is not
``SparseMLACommonMetadataBuilder``:

- ``req_id_per_token``, each query token's request (``np.repeat`` of the request indices
  by the host query lengths), into a buffer of ``max_num_batched_tokens`` the builder
  owns, zero-filled first, handed on as its first ``num_actual_tokens`` entries;
- the runner's block table, query offsets and slot mapping, handed on as they are;
- no split: every request a decode and every token a decode token (``num_decodes =
  num_reqs``, ``num_prefills = 0``, ``num_decode_tokens = num_actual_tokens``), so
  that the MLA layer sends every token down the sparse MQA path; no reorder threshold
  (the runner does not reorder its batch).

Its consumer, ``XPUMLASparseImpl.forward_mqa``, reads ``req_id_per_token`` and the
block table in ``triton_convert_req_index_to_global_index``
(``v1/attention/backends/mla/sparse_utils.py``: token ``t``'s top-k positions, at most
its own position, become latent-cache rows through ``block_table[req_id_per_token[t]]``),
then ``triton_bf16_mla_sparse_interface`` (``v1/attention/ops/xpu_mla_sparse.py``)
reads those rows alone; the shared MLA layer (``model_executor/layers/attention/
mla_attention.py`` ``MLAAttention.forward_impl``) reads ``num_decode_tokens``.

Nothing is stood in beyond ``vllm-v1-flashmla-sparse``'s engine: the builder is plain
torch and numpy, and the layer's ``impl`` is never made (the model is stood in). The
builder copies ``index_topk`` into ``topk_tokens`` and no field reads it (the XPU
kernels would want a multiple of 128, ``triton_convert_req_index_to_global_index``'s
``BLOCK_N``, as DeepSeek-V3.2's 2048 is; the engine keeps its siblings' 64).

Fields: ``vllm-v1``'s of the step (the forward context's slot mapping, the positions),
``sparse.req_id_per_token`` (tokens, each a row of the block table handed on) and
``sparse.block_table`` by request (a row's pages up to its furthest token's position,
the indexer's causal bound), as ``vllm-v1-flashmla-sparse`` names them, and
``xpu_sparse.*``: ``query_start_loc`` (offsets) and ``mqa`` (by token, 1 where
``forward_impl`` sends the token to ``forward_mqa``: the first ``num_decode_tokens``).
``num_decodes`` and ``num_prefills`` are only asserted to be set (no field). No
``kv_len``/``kv_slots``: the keys are the indexer's choice, not the metadata's.

Graphs: the builder's ``_cudagraph_support`` is ``AttentionCGSupport.NEVER``.
``GPUModelRunner._check_and_update_cudagraph_mode`` hands it to
``CompilationConfig.resolve_cudagraph_mode_and_sizes`` (``config/compilation.py``),
which refuses FULL (a FULL mixed mode: ``ValueError``) and turns FULL_DECODE_ONLY and
FULL_AND_PIECEWISE into PIECEWISE (VLLM_COMPILE, attention among the splitting ops);
``XPUPlatform.check_and_update_config`` (``vllm/platforms/xpu.py``) keeps the mode
where torch has XPU graphs (``supports_xpu_graph``: 2.11 on) and sleep mode is off.
So no FULL graph is ever captured or replayed: every build hands on the step's own rows.

Declined: ``vllm-v1-mla``'s cases, and cudagraph mode FULL (vLLM refuses to start). The
backend takes every kernel block size (``get_supported_kernel_block_sizes`` is
``AttentionBackend``'s, ``MultipleOf(1)``), so pages of 4 and 8 run too (``vllm-v1-mla``
declines them for the Triton backend's sake, on no layer here); its head size is 576
(``get_supported_head_sizes``), the MLA engine's latent head.
"""

from __future__ import annotations

import contextlib
import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_sparse_mla as sparse
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_XPU_SPARSE = "vllm/v1/attention/backends/mla/xpu_mla_sparse.py"
_RESOLVE = "vllm/config/compilation.py CompilationConfig.resolve_cudagraph_mode_and_sizes"


def prepare() -> None:
    """Import vLLM's V1 runner and the XPU sparse MLA backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.xpu_mla_sparse import XPUMLASparseBackend

    return XPUMLASparseBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-mla``'s cases but the Triton
    backend's block sizes, and the mode no builder of ``AttentionCGSupport.NEVER``
    starts with."""
    return declines_config(case.config) or v1.step_declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner != "v1" or config.varlen_decode:
        return mla.declines_config(config)  # the V2 runner's, as vllm-v1-mla
    if config.cudagraph_mode == "FULL":
        return (
            "cudagraph_mode FULL: XPUMLASparseMetadataBuilder's support is NEVER, and "
            f"{_RESOLVE} raises ValueError for a FULL mixed mode ({_XPU_SPARSE})"
        )
    head_size = mla.KV_LORA_RANK + mla.QK_ROPE_HEAD_DIM
    if not _backend().supports_head_size(head_size):
        return f"head size {head_size}: {_XPU_SPARSE} XPUMLASparseBackend.get_supported_head_sizes"
    if not _backend().supports_block_size(config.block_size):
        return f"block_size {config.block_size}: {_XPU_SPARSE} has no kernel block size for it"
    # Every block size: XPUMLASparseBackend.get_supported_kernel_block_sizes is
    # AttentionBackend's, MultipleOf(1); vllm-v1-mla's multiples of 16 are the Triton
    # backend's, which no layer of this engine is on.
    return None


def _freeze(meta: Any) -> SimpleNamespace:
    """What the XPU sparse MLA layer reads of ``meta`` now (the builder's buffer and the
    runner's change after the forward)."""
    return SimpleNamespace(
        num_reqs=meta.num_reqs, num_actual_tokens=meta.num_actual_tokens,
        num_decodes=meta.num_decodes, num_prefills=meta.num_prefills,
        num_decode_tokens=meta.num_decode_tokens,
        req_id_per_token=meta.req_id_per_token.clone(), block_table=meta.block_table.clone(),
        query_start_loc=meta.query_start_loc.clone(),
    )  # fmt: skip


def _pages_read(req_id: np.ndarray, positions: np.ndarray, rows: int, bs: int) -> np.ndarray:
    """The leading pages of each block-table row the conversion reads: token ``t``'s
    top-k positions are at most its own (the indexer's causal mask), so it reads the
    first ``cdiv(positions[t] + 1, bs)`` pages of row ``req_id[t]``; a row the most of
    its tokens' (0: a row no token names; a token naming no row reads none here, safety
    judges it)."""
    out = np.zeros(rows, dtype=np.int64)
    n = min(len(req_id), len(positions))
    req = req_id[:n].astype(np.int64)
    pages = -(-(positions[:n].astype(np.int64) + 1) // bs)
    named = (req >= 0) & (req < rows)
    np.maximum.at(out, req[named], pages[named])
    return out


def _xpu_fields(config: EngineConfig, seen: v1._Seen, bs: int) -> list[Field]:
    """Every field of the XPU sparse MLA metadata a consumer reads, with what it
    accepts."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    req_id = v1._np(m.req_id_per_token)
    table = v1._np(m.block_table)
    rows = int(table.shape[0])
    mqa = (np.arange(m.num_actual_tokens) < m.num_decode_tokens).astype(np.int64)
    return [
        # sparse_utils.py triton_convert_req_index_to_global_index (XPUMLASparseImpl.
        # forward_mqa): token t's top-k positions are read through
        # block_table[req_id_per_token[t]], a row of the table handed on (the step's).
        Field("sparse.req_id_per_token", "tokens", req_id, (0, max(rows - 1, 0))),
        # ... block_table[r, j] is a page of the latent cache (KVCacheConfig's, in
        # kernel blocks); a row's pages up to its furthest token's position are read.
        Field("sparse.block_table", "requests", table,
              (0, num_blocks(config) * (config.block_size // bs) - 1),
              row_lengths=_pages_read(req_id, v1._np(seen.positions), rows, bs)),
        # mla_attention.py MLAAttention.forward_impl, under decode context parallelism
        # (dcp_manager.combine, the sparse MQA path): request i's query rows are
        # query_start_loc[i] : query_start_loc[i + 1] of the forward's tokens.
        Field("xpu_sparse.query_start_loc", "offsets", v1._np(m.query_start_loc),
              (0, tokens_pad)),
        # forward_impl: the first num_decode_tokens of the num_actual_tokens query rows
        # go to forward_mqa, the rest to the MHA path, whose _use_sparse_mha reads
        # attn_metadata.prefill (XPUMLASparseMetadata has none) and whose forward_mha
        # XPUMLASparseImpl lacks (MLAAttentionImpl's raises NotImplementedError): 1 only.
        Field("xpu_sparse.mqa", "tokens", mqa, (1, 1)),
    ]  # fmt: skip


class _XPUMLASparseEngine(sparse._SparseMLAEngine):
    """A V1 runner of a sparse-attention MLA model on the XPU sparse MLA backend."""

    backend = staticmethod(_backend)
    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # the builder reads nothing of the device

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # AttentionCGSupport.NEVER (resolve_cudagraph_mode_and_sizes): a FULL decode
        # mode becomes PIECEWISE, attention being compiled piecewise (FULL is declined).
        return CUDAGraphMode.PIECEWISE if mode.decode_mode() == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        xpu = []
        if seen.meta is not None:
            xpu = _xpu_fields(self.config, seen, self.kernel_block_size())
        return v1._fields(self.config, no_meta) + tuple(xpu)


class XPUMLASparseRunnerStepEngine(sparse.SparseMLARunnerStepEngine):
    """``vllm-v1-mla``'s three engines, on the XPU sparse MLA backend."""

    engine_type = _XPUMLASparseEngine

    # The builder sets no reorder_batch_threshold: the runner keeps its batch's order,
    # so the fresh engine's warm-up adds each running request as vllm-v1's does.
    warm_computed = staticmethod(v1.RunnerStepEngine.warm_computed)


ENGINE = XPUMLASparseRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-xpu-mla-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-xpu-mla-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
