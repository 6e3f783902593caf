"""vLLM's model runner V1 step of a sparse-attention MLA model on the FlashMLA sparse
backend with an fp8 KV cache, as the implementation ``vllm-v1-flashmla-sparse-fp8`` of
``runner-step``.

The engine of :mod:`.runner_step_sparse_mla` (DeepSeek-V3.2's attention, ``index_topk``
64, as on an sm90 GPU), its latent cache ``fp8_ds_mla`` (656 bytes a token) and 64 query
heads a rank (DeepSeek-V3.2's 128 at tensor parallelism 2): with at least
``MIN_HEADS_FOR_BF16_PREFILL`` (32) heads ``FlashMLASparseMetadataBuilder.build`` takes
the separate prefill/decode path, ``_build_fp8_separate_prefill_decode``, beside the
sparse metadata ``vllm-v1-flashmla-sparse`` judges:

- the decodes: their count ``num_decodes`` (``num_decode_tokens // decode_query_len``),
  the FP8 kernel's per-row buffers cut to it (``cache_lens``, ``dummy_block_table``) and
  FlashMLA's lazily made schedule (``get_mla_metadata``);
- the prefills: ``request_ids`` (each token's prefill, -1 for a decode token), each
  prefill's start in the bf16 workspace its keys are gathered into, cut into chunks that
  fit the workspace (``split_prefill_chunks``, the starts made chunk-local in place), each
  chunk's tokens, block table, sequence lengths and total rows.

Stood in beyond ``vllm-v1-flashmla-sparse``, as a CUDA build with FlashMLA has it:
``get_mla_metadata`` where ``flashmla_sparse.py`` looks it up, by its contract
(``vllm/third_party/flashmla/flash_mla_interface.py``: an empty ``FlashMLASchedMeta``
that the first kernel call fills, and None: :func:`.runner_step_flashmla.get_mla_metadata`);
``torch`` in ``flashmla_sparse.py`` with ``zeros`` unpinned on a CPU (no pinned
allocator here; the builder pins the workspace starts it stages).

Fields: ``vllm-v1-flashmla-sparse``'s, and ``sparse_fp8.*``, each with what its consumer
(``FlashMLASparseImpl._forward_fp8_kv_separate_prefill_decode``) accepts:

- ``decode.row_start`` by decode request: where the FP8 decode kernel reads a decode's
  queries (``reshape_query_for_spec_decode`` views the decode tokens as ``num_decodes``
  rows of ``decode_query_len``), and ``decode.cache_lens`` (its ``cache_seqlens``, one a
  row: the model length);
- ``prefill.request_ids`` by token (``triton_convert_req_index_to_global_index``'s
  ``prefill_workspace_request_ids``: -1, or a prefill of the step);
- by prefill: ``prefill.workspace_room``, the workspace rows between the end of a
  prefill's gathered keys (its start plus its sequence length) and the next prefill's
  start in its chunk, or the chunk's end (``cp_gather_and_upconvert_fp8_kv_cache`` writes
  a prefill's keys from its start; the bf16 kernel reads ``workspace[:chunk_tot_seqlen]``
  at ``start + top-k position``): at least 0; ``prefill.chunk_seq_lens`` and
  ``prefill.chunk_block_table`` (the gather's pages, a row's first
  ``cdiv(seq_len, page size)``);
- by token: ``prefill.token_chunk``, the chunk whose ``tokens_slice`` holds a prefill
  token (-1 for a decode token).

Declined: ``vllm-v1-flashmla-sparse``'s cases.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.standins import unpinned
from attnfuzz.adapters.vllm import runner_step_flashmla as flashmla
from attnfuzz.adapters.vllm import runner_step_sparse_mla as sparse
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

NUM_HEADS = 64
"""Query heads a rank: DeepSeek-V3.2's 128 at tensor parallelism 2, at least
``MIN_HEADS_FOR_BF16_PREFILL``, so the builder takes the separate prefill/decode path."""


def prepare() -> None:
    """Import vLLM's V1 runner and the FlashMLA sparse backend before a judge forks."""
    sparse.prepare()


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-flashmla-sparse``'s cases."""
    return sparse.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    return sparse.declines_config(config)


@contextlib.contextmanager
def flashmla_fp8(device: torch.device) -> Iterator[None]:
    """FlashMLA's schedule call as its interface makes it, and (on a CPU) no pinning."""
    from vllm.v1.attention.backends.mla import flashmla_sparse as module

    with (
        mock.patch.object(module, "get_mla_metadata", flashmla.get_mla_metadata),
        unpinned(module, device),
    ):
        yield


def _freeze(meta: Any) -> SimpleNamespace:
    """The sparse metadata (:func:`.runner_step_sparse_mla._freeze`) and what the FP8
    path reads of ``fp8_extra_metadata`` now."""
    out = sparse._freeze(meta)
    f = meta.fp8_extra_metadata
    out.fp8 = None
    if f is None or not hasattr(f, "num_decode_tokens"):
        return out
    d, p = f.decode, f.prefill
    out.fp8 = SimpleNamespace(
        num_decodes=f.num_decodes, num_decode_tokens=f.num_decode_tokens,
        decode_query_len=None if d is None else d.decode_query_len,
        cache_lens=None if d is None else d.kernel_metadata.cache_lens.clone(),
        request_ids=None if p is None else p.request_ids.clone(),
        chunks=[] if p is None else [
            SimpleNamespace(
                tokens=(c.tokens_slice.start, c.tokens_slice.stop),
                starts=c.workspace_starts.clone(), total=int(c.chunk_tot_seqlen),
                seq_lens=c.seq_lens.clone(), block_table=c.block_table.clone(),
            )
            for c in p.chunks
        ],
    )  # fmt: skip
    return out


def _fp8_fields(config: EngineConfig, seen: v1._Seen, bs: int, model_len: int) -> list[Field]:
    """The FP8 path's fields (module docstring), with what each consumer accepts."""
    f = seen.meta.fp8
    out: list[Field] = []
    if f.cache_lens is not None:
        n, q = f.num_decodes, f.decode_query_len
        out += [
            Field("sparse_fp8.decode.row_start", "requests",
                  np.arange(n, dtype=np.int64) * q, (0, max(f.num_decode_tokens - q, 0))),
            Field("sparse_fp8.decode.cache_lens", "requests", v1._np(f.cache_lens),
                  (0, model_len)),
        ]  # fmt: skip
    if f.request_ids is None:
        return out
    prefills = sum(len(c.seq_lens) for c in f.chunks)
    chunk_of = np.full(len(f.request_ids), -1, dtype=np.int64)
    room, seq_lens, tables = [], [], []
    for k, c in enumerate(f.chunks):
        chunk_of[c.tokens[0] : c.tokens[1]] = k
        starts, lens = v1._np(c.starts).astype(np.int64), v1._np(c.seq_lens).astype(np.int64)
        ends = np.append(starts[1:], c.total)
        room.append(ends - (starts + lens))
        seq_lens.append(lens)
        tables.append(v1._np(c.block_table))
    width = max(t.shape[1] for t in tables)
    table = np.zeros((prefills, width), dtype=np.int64)
    row = 0
    for t in tables:
        table[row : row + len(t), : t.shape[1]] = t
        row += len(t)
    lens = np.concatenate(seq_lens)
    pages = num_blocks(config) * (config.block_size // bs) - 1
    out += [
        Field("sparse_fp8.prefill.request_ids", "tokens", v1._np(f.request_ids),
              (-1, prefills - 1)),
        Field("sparse_fp8.prefill.token_chunk", "tokens", chunk_of, (-1, len(f.chunks) - 1)),
        Field("sparse_fp8.prefill.workspace_room", "requests", np.concatenate(room),
              (0, max(c.total for c in f.chunks))),
        Field("sparse_fp8.prefill.chunk_seq_lens", "requests", lens, (0, table.shape[1] * bs)),
        Field("sparse_fp8.prefill.chunk_block_table", "requests", table, (0, pages),
              row_lengths=-(-lens // bs)),
    ]  # fmt: skip
    return out


class _SparseMLAFp8Engine(sparse._SparseMLAEngine):
    """A V1 runner of a sparse-attention MLA model on FlashMLA sparse, its cache fp8."""

    kv_cache_dtype = "fp8_ds_mla"
    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(super().platform())
        stack.enter_context(flashmla_fp8(self.device))
        return stack

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        # The heads a rank, on this engine's copy of the model config.
        model = vc.model_config = copy.copy(vc.model_config)
        model.model_arch_config = copy.copy(model.model_arch_config)
        model.model_arch_config.total_num_attention_heads = NUM_HEADS  # get_num_attention_heads
        return super().attention_group()

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        if seen.meta is None or seen.meta.fp8 is None:
            return out
        model_len = self.vllm_config.model_config.max_model_len
        return (*out, *_fp8_fields(self.config, seen, self.kernel_block_size(), model_len))


class SparseMLAFp8RunnerStepEngine(sparse.SparseMLARunnerStepEngine):
    """``vllm-v1-flashmla-sparse``'s three engines, the KV cache fp8."""

    engine_type = _SparseMLAFp8Engine


ENGINE = SparseMLAFp8RunnerStepEngine()
"""The engine of the implementation ``vllm-v1-flashmla-sparse-fp8`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-flashmla-sparse-fp8`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the workspace starts by query tokens, not by the keys gathered ------------------


@contextlib.contextmanager
def _starts_by_query() -> Iterator[None]:
    """``_build_fp8_separate_prefill_decode`` with each prefill's workspace start the
    sum of the earlier prefills' query lengths in its chunk: a prefill with context
    gathers more keys than that, over the next prefill's."""
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseMetadataBuilder

    original = FlashMLASparseMetadataBuilder._build_fp8_separate_prefill_decode

    def build(self: Any, common: Any, metadata: Any) -> Any:
        out = original(self, common, metadata)
        if out.prefill is None:
            return out
        q = common.query_start_loc_cpu
        for c in out.prefill.chunks:
            first = int(np.searchsorted(q.numpy(), c.tokens_slice.start))
            lens = q[first + 1 : first + 1 + len(c.seq_lens)] - q[first : first + len(c.seq_lens)]
            starts = torch.zeros(len(lens), dtype=c.workspace_starts.dtype)
            starts[1:] = torch.cumsum(lens[:-1], dim=0)
            c.workspace_starts.copy_(starts)
        return out

    with mock.patch.object(
        FlashMLASparseMetadataBuilder, "_build_fp8_separate_prefill_decode", build
    ):
        yield


_MUTANT = v1.Mutated(SparseMLAFp8RunnerStepEngine(), _starts_by_query)


def workspace_by_query(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-flashmla-sparse-fp8-workspace-by-query``: each prefill's workspace start
    counts the earlier prefills' query tokens, not their keys (workspace room)."""
    return _MUTANT(inputs)


workspace_by_query.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


THRESHOLD = 256
"""The builder's reorder threshold for 64 heads (``FlashMLASparseMetadataBuilder``):
a uniform run of queries up to this long is a run of decodes."""


def _prefills(case: Case) -> list[int]:
    """The step's prefills as ``split_decodes_and_prefills(require_uniform=True)`` finds
    them: from the first query of another length than the first (none where the first is
    past the threshold: every request a prefill)."""
    q = case.batch.q_lens
    if not q or q[0] > THRESHOLD:
        return list(range(len(q)))
    first = next((i for i, n in enumerate(q) if n not in (q[0], 0)), len(q))
    return list(range(first, len(q)))


def reach_prefill(trace: Trace | Case) -> bool:
    """A V1 step with a prefill: ``_build_fp8_separate_prefill_decode`` lays out the
    prefills' workspace."""
    steps = trace.cases() if isinstance(trace, Trace) else [trace]
    return trace.config.runner == "v1" and any(_prefills(case) for case in steps)


def trigger_workspace(trace: Trace | Case) -> bool:
    """A step of two prefills or more, one before the last with context (a chunk of
    its prompt computed before): its keys outnumber its queries."""
    if trace.config.runner != "v1":
        return False
    for case in trace.cases() if isinstance(trace, Trace) else [trace]:
        prefills = _prefills(case)
        if any(case.batch.num_computed_tokens[i] > 0 for i in prefills[:-1]):
            return True
    return False


def smallest_workspace() -> Trace:
    """A request prefills 4 of its prompt of 8 beside another's whole prompt of 2; then
    the second decodes, the first prefills the rest (4 queries, 8 keys) and a third its
    prompt of 3: two prefills, the first gathering 8 keys, the mutant's second start 4."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=3, max_num_batched_tokens=16, block_size=64,
        num_spec=0, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0, 0), (2, 4), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1),
                  prompt_lens=(2, 8)),
            Batch((2, 4, 0), (1, 4, 3), req_ids=(0, 1, 2), pages=((1,), (2,), (3,)),
                  new_pages=(0, 0, 1), prompt_lens=(2, 8, 3)),
        ),
    )  # fmt: skip
