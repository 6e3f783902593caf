"""vLLM's model runner V1 step of a sparse-attention MLA model on the FlashMLA sparse
backend, as the implementation ``vllm-v1-flashmla-sparse`` of ``runner-step``.

The engine of :mod:`.runner_step_mla`, its MLA layer (and the MTP draft layer) on vLLM's
``FLASHMLA_SPARSE`` backend (``vllm/v1/attention/backends/mla/flashmla_sparse.py``), the
DeepSeek-V3.2 attention whose keys the indexer's top-k picks, its model config's
``index_topk`` 64, its KV cache bf16, as a Hopper GPU runs it: ``FlashMLASparseMetadataBuilder``
(on ``SparseMLACommonMetadataBuilder``, ``vllm/model_executor/layers/attention/
sparse_mla_attention.py``) builds every step (eager, padded for the graph, replayed,
afresh, the drafter's sub-steps) and the capture runs. What it builds:

- the split by ``split_decodes_and_prefills`` with ``require_uniform`` (a decode run ends
  at the first query of another length) at the reorder threshold of the head count
  (256 for this model's, ``_init_reorder_batch_threshold(..., supports_spec_as_decode=
  True)``);
- ``req_id_per_token``, each query token's request, in a buffer the builder owns
  (``token_to_req_indices``), which the sparse kernels read to turn a token's top-k
  positions into KV slots through its request's block-table row;
- the decodes' ``seq_lens`` and the block table (the runner's), the prefills' query
  offsets and block table (``_build_prefill_fields``) and their chunked context.

Stood in, as a CUDA build on an sm90 GPU has it: ``num_compute_units`` where
``flashmla_sparse.py`` looks it up, 132 (the FP8 decode's tile buffers are sized by it
at ``__init__``; with a bf16 cache they are not read).

Fields: ``vllm-v1``'s of the step (the forward context's slot mapping, the positions)
and ``sparse.*``: ``req_id_per_token`` (tokens, each its request's row: the request
the query offsets place it in, ``sparse.token_request``, on the target's forward and
the drafter's first pass; vLLM 0.33.0's V1 drafter hands its later sub-steps its first
pass's map, kept apart as ``vllm-v1-flashmla-sparse-draft-requests-stale``), ``seq_lens``
and ``block_table`` by request (a row's first ``cdiv(seq_lens[i], page size)`` pages,
no top-k position reaching past its sequence), the prefills' query offsets. No
``kv_len``/``kv_slots``: the keys are the indexer's choice, not the metadata's.

Declined: ``vllm-v1-mla``'s cases, and block sizes that are not multiples of 64
(``FlashMLASparseBackend.get_supported_kernel_block_sizes``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

_SPARSE = "vllm/v1/attention/backends/mla/flashmla_sparse.py"
SMS = 132
"""The SMs of an H100 SXM or an H200 (``num_compute_units``)."""
INDEX_TOPK = 64
"""The model config's ``index_topk``: the keys the indexer picks for each query token."""


def prepare() -> None:
    """Import vLLM's V1 runner and the FlashMLA sparse backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend

    return FlashMLASparseBackend


@contextlib.contextmanager
def sm90() -> Iterator[None]:
    """``flashmla_sparse.py`` as it runs on an sm90 GPU: 132 SMs."""
    from vllm.v1.attention.backends.mla import flashmla_sparse as module

    with mock.patch.object(module, "num_compute_units", lambda *a, **k: SMS):
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-mla``'s cases, and block sizes
    the backend has no kernel block size for."""
    return declines_config(case.config) or mla.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % 64:
        return (
            f"block_size {config.block_size}: the FlashMLA sparse backend's pages are "
            f"multiples of 64 ({_SPARSE} FlashMLASparseBackend.get_supported_kernel_block_sizes)"
        )
    return mla.declines_config(config)


def _freeze(meta: Any) -> SimpleNamespace:
    """What the sparse kernels read of ``meta`` now (the buffers change after the
    forward)."""
    prefill = meta.prefill
    return SimpleNamespace(
        num_decodes=meta.num_decodes, num_prefills=meta.num_prefills,
        req_id_per_token=meta.req_id_per_token.clone(), seq_lens=meta.seq_lens.clone(),
        block_table=meta.block_table.clone(), query_start_loc=meta.query_start_loc.clone(),
        prefill_query_start_loc=None if prefill is None else prefill.query_start_loc.clone(),
    )  # fmt: skip


def _sparse_fields(
    config: EngineConfig, seen: v1._Seen, bs: int, map_judged: bool = True
) -> list[Field]:
    """Every field of the sparse MLA metadata a kernel reads, with what it accepts.
    ``map_judged``: each token's request held to the query offsets
    (``_Engine.offsets_judged``)."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    seq_lens = v1._np(m.seq_lens)
    rows = len(seq_lens)
    reach = int(m.block_table.shape[1]) * bs
    out = [
        # triton_convert_req_index_to_global_index: token t's top-k positions are read
        # through block_table[req_id_per_token[t]], a request's row of this step: the
        # request the query offsets place it in.
        *v1.request_map_fields("sparse.req_id_per_token", v1._np(m.req_id_per_token),
                               v1._np(m.query_start_loc), rows, map_judged),
        # ... positions below seq_lens[i] (the indexer's causal extent) ...
        Field("sparse.seq_lens", "requests", seq_lens, (0, reach)),
        # ... in the row's first cdiv(seq_lens[i], page size) pages of the latent cache.
        Field("sparse.block_table", "requests", v1._np(m.block_table),
              (0, num_blocks(config) * (config.block_size // bs) - 1),
              row_lengths=-(-seq_lens.astype(np.int64) // bs)),
    ]  # fmt: skip
    if m.prefill_query_start_loc is not None:
        # The prefill path: prefill i's query rows, offsets from the first prefill token.
        out.append(Field("sparse.prefill.query_start_loc", "offsets",
                         v1._np(m.prefill_query_start_loc), (0, tokens_pad)))  # fmt: skip
    return out


class _SparseMLAEngine(mla._MLAEngine):
    """A V1 runner of a sparse-attention MLA model on the FlashMLA sparse backend."""

    backend = staticmethod(_backend)
    freeze = staticmethod(_freeze)
    index_topk = INDEX_TOPK  # the model config's

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return sm90()  # 132 SMs

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        # The indexer's top-k (DeepSeek-V3.2's index_topk), on this engine's copy.
        vc.model_config = copy.copy(vc.model_config)
        vc.model_config.hf_text_config = copy.copy(vc.model_config.hf_text_config)
        vc.model_config.hf_text_config.index_topk = self.index_topk
        return super().attention_group()

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        sparse = []
        if seen.meta is not None:
            bs, judged = self.kernel_block_size(), self.offsets_judged(seen)
            sparse = _sparse_fields(self.config, seen, bs, judged)
        return v1._fields(self.config, no_meta) + tuple(sparse)


class SparseMLARunnerStepEngine(mla.MLARunnerStepEngine):
    """``vllm-v1-mla``'s three engines, on the FlashMLA sparse backend."""

    engine_type = _SparseMLAEngine


ENGINE = SparseMLARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashmla-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashmla-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: the drafter's later sub-steps keep its first pass's request map --


draft_requests_stale = v1.kept_apart(
    SparseMLARunnerStepEngine,
    "``vllm-v1-flashmla-sparse-draft-requests-stale``: ``vllm-v1-flashmla-sparse`` with "
    "the drafter's sub-steps after its first pass held to their query offsets.",
    stale_drafts_judged=True,
)


def reach_drafts(trace: Trace | Case) -> bool:
    """An engine of ``vllm-v1-flashmla-sparse`` whose drafter runs a sub-step after its
    first pass (two drafts or more)."""
    return (
        trace.config.runner == "v1"
        and trace.config.num_spec >= 2
        and (declines_config(trace.config) is None)
    )


def trigger_draft_requests_stale(trace: Trace | Case) -> bool:
    """A step of two requests or more, one of more than one token (the first pass's map
    then differs from one token a request in some of the first rows)."""
    return reach_drafts(trace) and any(
        len(b.q_lens) > 1 and max(b.q_lens) > 1 for b in as_trace(trace).steps
    )


def smallest_draft_requests_stale() -> Trace:
    """Two requests prefill 2 tokens each on pages 1 and 2 (of 64), two drafts: the
    second sub-step hands request 1's draft token request 0's row."""
    config = EngineConfig(
        max_model_len=128, max_num_seqs=2, max_num_batched_tokens=8, block_size=64,
        num_spec=2, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    step = Batch((0, 0), (2, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1))
    return Trace(config, (step,))
