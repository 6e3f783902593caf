"""vLLM's model runner V1 step on the ROCm AITER FlashAttention backend, as the
implementation ``vllm-v1-aiter-fa`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer) on
vLLM's ``ROCM_AITER_FA`` backend (``vllm/v1/attention/backends/rocm_aiter_fa.py``), as
an MI300 GPU runs it: ``AiterFlashAttentionMetadataBuilder`` builds every step (eager,
padded for the graph, replayed, afresh), ``build_for_cudagraph_capture`` the capture
runs and ``build_for_drafting`` the drafter's sub-steps. What this builder does beside
the others attnfuzz drives:

- it splits the step three ways, decodes, then extends, then prefills
  (``split_decodes_prefills_and_extends``, by the reorder threshold ``1 + num_spec``:
  ``_init_reorder_batch_threshold(1, supports_spec_as_decode=True)``), on the batch the
  runner reordered into decode, short extend, long extend and prefill regions
  (``reorder_batch_to_split_decodes_and_prefills``); a prefill is a row whose
  ``seq_lens`` equals its query length (``seq_lens_cpu_upper_bound``);
- the decodes keep the step's ``seq_lens`` and block table, their largest query length
  choosing the kernel (``decode_metadata.max_query_len``);
- the prefills get query offsets rebased to their first token and their bounds; the
  extends the same, and their context in chunks of at most ``32768 // num_extends``
  keys (``_CP_TOKENS_PER_ITER_ROCM``): each chunk's workspace offsets, starts and
  token-to-request map, which ``cp_mha_gather_cache`` gathers by.

Its graphs are ``AttentionCGSupport.UNIFORM_BATCH``: ``initialize_attn_backend`` turns
cudagraph mode FULL into FULL_AND_PIECEWISE, and a FULL graph replays a uniform decode.

Stood in beyond ``vllm-v1``: pinned host memory, which the builder asks for by name
(``torch.zeros(..., pin_memory=True)`` for the extends' chunk offsets) and CPU-only torch
cannot allocate: on a CPU the module's ``torch.zeros`` makes the same tensor unpinned
(:func:`attnfuzz.adapters.standins.unpinned`); the values are the same either way. The
builder is otherwise plain torch, and ``rocm_aiter_ops.is_shuffle_kv_cache_enabled()`` is False (no
``VLLM_ROCM_SHUFFLE_KV_CACHE``), as it is by default on ROCm. The model has no
``Attention`` layer, so no sliding window and no KV sharing
(``AiterKVSharingMetadata``) is built. The model's attention
is 1 KV head of 128, bf16 (``AiterFlashAttentionBackend.get_supported_head_sizes``:
64, 128, 256; ``supported_dtypes``: fp16, bf16).

Every field of ``AiterFlashAttentionMetadata`` a kernel reads is reported (``aiter.*``)
with the range its consumer accepts (``AiterFlashAttentionImpl.forward`` and
``extend_forward``): the step's query offsets, ``seq_lens`` and block table (the
decodes read their first ``num_decodes`` rows), the decodes' query bound, the
prefills' and extends' rebased query offsets and bounds, each context chunk's
workspace offsets, starts and token-to-request map; beside ``vllm-v1``'s fields of the
step (the forward context's slot mapping, the positions). Every build also states
``kv_len`` and ``kv_slots`` by request, the keys those kernels read
(:meth:`_AiterFAEngine.kv_read`), which ``vllm-v1-backends`` holds to ``vllm-v1``'s.

Declined: ``vllm-v1``'s cases, and block sizes the backend has no kernel block size
for (``AiterFlashAttentionBackend.get_supported_kernel_block_sizes``: 16 and 32, so
multiples of 16, a larger page split into kernel blocks by ``prepare_kernel_block_sizes``:
the block table and the slots are counted in those).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
from attnfuzz.adapters.standins import unpinned
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_AITER_FA = "vllm/v1/attention/backends/rocm_aiter_fa.py"
HEAD_SIZE = 128
"""The model's head size: one the backend supports (``get_supported_head_sizes``)."""


def prepare() -> None:
    """Import vLLM's V1 runner and the AITER FlashAttention backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

    return AiterFlashAttentionBackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s runner cases, and block sizes
    the backend has no kernel block size for."""
    return declines_config(case.config) or v1.step_declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not _backend().supports_block_size(config.block_size):
        return (
            f"block_size {config.block_size}: the AITER FlashAttention backend's kernel "
            f"block sizes are 16 and 32, which divide no other ({_AITER_FA} "
            "AiterFlashAttentionBackend.get_supported_kernel_block_sizes)"
        )
    return v1.declines_config(config)


# -- the engine -----------------------------------------------------------------------------


def _freeze(meta: Any) -> SimpleNamespace:
    """What the kernels read of ``meta`` now (the persistent buffers change after the
    forward): the split, the step's tensors, each sub-batch's."""
    decode, prefill, extend = meta.decode_metadata, meta.prefill_metadata, meta.extend_metadata
    out = SimpleNamespace(
        num_decodes=meta.num_decodes, num_extends=meta.num_extends,
        num_prefills=meta.num_prefills, num_decode_tokens=meta.num_decode_tokens,
        num_extend_tokens=meta.num_extend_tokens,
        query_start_loc=meta.query_start_loc.clone(), seq_lens=meta.seq_lens.clone(),
        block_table=meta.block_table.clone(),
        decode_max_query_len=None if decode is None else decode.max_query_len,
        prefill=None, extend=None,
    )  # fmt: skip
    if prefill is not None:
        out.prefill = SimpleNamespace(
            query_start_loc=prefill.query_start_loc.clone(),
            max_query_len=prefill.max_query_len, max_seq_len=prefill.max_seq_len,
        )  # fmt: skip
    if extend is not None:
        chunked = extend.chunk_context_metadata
        out.extend = SimpleNamespace(
            query_start_loc=extend.query_start_loc.clone(),
            max_query_len=extend.max_query_len, max_seq_len=extend.max_seq_len,
            workspace=int(chunked.workspace.shape[1]),
            chunks=[
                SimpleNamespace(
                    cu_seq_lens=chunked.cu_seq_lens_chunk[c].clone(),
                    starts=chunked.chunk_starts[c].clone(),
                    # cp_mha_gather_cache's grid: the chunk's total tokens, no more.
                    token_to_batch=chunked.token_to_batch[c, : chunked.total_token_per_batch[c]]
                    .clone(),
                    max_seq_len=chunked.max_seq_lens[c],
                )
                for c in range(chunked.num_chunks)
            ],
        )  # fmt: skip
    return out


def _cdiv(lengths: np.ndarray, block_size: int) -> np.ndarray:
    return -(-lengths.astype(np.int64) // block_size)


def _aiter_fields(config: EngineConfig, seen: v1._Seen, bs: int) -> list[Field]:
    """Every field of the AITER FlashAttention metadata a kernel reads, with what it
    accepts (``AiterFlashAttentionImpl.forward``: the decode tokens first, then the
    extends', then the prefills'). ``bs``: the kernel block size, the block table's
    unit (a page of ``config.block_size`` is ``config.block_size // bs`` of them)."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    reach = int(m.block_table.shape[1]) * bs
    kernel_blocks = num_blocks(config) * (config.block_size // bs)
    seq_lens = v1._np(m.seq_lens)
    query_start_loc = v1._np(m.query_start_loc).astype(np.int64)
    q_lens = np.diff(query_start_loc)
    nd, ne = m.num_decodes, m.num_extends
    out = [
        # unified_attention / paged attention (decodes), cp_mha_gather_cache (extends):
        # request i's query rows are q[query_start_loc[i] : [i + 1]] ...
        Field("aiter.query_start_loc", "offsets", query_start_loc, (0, tokens_pad)),
        # ... its keys the first seq_lens[i] of its pages (seqused_k, cache_seqlens) ...
        Field("aiter.seq_lens", "requests", seq_lens, (0, reach)),
        # ... block_table[i, j] a kernel block of the KV cache, a row's first
        # cdiv(seq_lens[i], kernel block size) read.
        Field("aiter.block_table", "requests", v1._np(m.block_table), (0, kernel_blocks - 1),
              row_lengths=_cdiv(seq_lens, bs)),
    ]  # fmt: skip
    if m.decode_max_query_len is not None:
        # decode_metadata.max_query_len: the bound of every decode's query (unified
        # attention's max_seqlen_q; 1 takes the paged kernel, one query row a request).
        longest = int(q_lens[:nd].max(initial=0))
        out.append(Field("aiter.decode.max_query_len", "requests",
                         np.full(nd, m.decode_max_query_len), (longest, tokens_pad)))  # fmt: skip
    for name, sub, first in (("extend", m.extend, nd), ("prefill", m.prefill, nd + ne)):
        if sub is None:
            continue
        rows = len(v1._np(sub.query_start_loc)) - 1
        sub_q = q_lens[first : first + rows]
        sub_seq = seq_lens[first : first + rows].astype(np.int64)
        # flash_attn_varlen_func: the sub-batch's query rows, offsets from its first token;
        # its bounds at least every row's query and keys.
        out += [
            Field(f"aiter.{name}.query_start_loc", "offsets", v1._np(sub.query_start_loc),
                  (0, tokens_pad)),
            Field(f"aiter.{name}.max_query_len", "requests", np.full(rows, sub.max_query_len),
                  (int(sub_q.max(initial=0)), tokens_pad)),
            Field(f"aiter.{name}.max_seq_len", "requests", np.full(rows, sub.max_seq_len),
                  (int(sub_seq.max(initial=0)), reach)),
        ]  # fmt: skip
    if m.extend is not None:
        for c, chunk in enumerate(m.extend.chunks):
            name = f"aiter.extend.chunk{c}"
            out += [
                # cp_mha_gather_cache: extend r's context keys starts[r] to starts[r] +
                # cu_seq_lens[r + 1] - cu_seq_lens[r] land at those workspace rows ...
                Field(f"{name}.cu_seq_lens", "offsets", v1._np(chunk.cu_seq_lens),
                      (0, m.extend.workspace)),
                Field(f"{name}.starts", "requests", v1._np(chunk.starts), (0, reach)),
                # ... each workspace row's extend (the gather's token_to_batch).
                Field(f"{name}.token_to_batch", "tokens", v1._np(chunk.token_to_batch),
                      (0, max(ne - 1, 0))),
            ]  # fmt: skip
    return out


class _AiterFAEngine(v1._Engine):
    """A V1 runner whose attention layer is on the AITER FlashAttention backend."""

    freeze = staticmethod(_freeze)

    def _context(self) -> Any:
        from vllm.v1.attention.backends import rocm_aiter_fa

        stack = contextlib.ExitStack()
        stack.enter_context(super()._context())
        stack.enter_context(unpinned(rocm_aiter_fa, self.device))
        return stack

    def attention_group(self) -> tuple[type, Any]:
        return v1.bf16_attention_group(self.vllm_config, self.config, _backend(), HEAD_SIZE)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # AttentionCGSupport.UNIFORM_BATCH: _check_and_update_cudagraph_mode turns FULL
        # into FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        aiter = []
        if seen.meta is not None:
            aiter = _aiter_fields(self.config, seen, self.kernel_block_size())
        return v1._fields(self.config, no_meta) + tuple(aiter) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots as ``AiterFlashAttentionImpl.forward``
        reads them, rows in the split's order:

        - a decode (rows ``0`` to ``num_decodes``): unified attention or the paged kernel
          reads the first ``seq_lens[i]`` keys of the cache (the step's own included,
          written before), through ``block_table[i]``;
        - an extend: ``extend_forward`` gathers its context chunk by chunk
          (``cp_mha_gather_cache``: extend ``r``'s keys ``starts[r]`` to ``starts[r] +
          cu_seq_lens[r + 1] - cu_seq_lens[r]`` through ``block_table[num_decodes +
          r]``), then attends to the step's own keys, taken from the forward's input
          (its query rows, ``query_start_loc``), at the slots the forward context's
          slot mapping writes them to;
        - a prefill: the step's own keys alone (``cu_seqlens_k`` its query offsets)."""
        m = seen.meta
        bs = self.kernel_block_size()
        nd, ne, n_p = m.num_decodes, m.num_extends, m.num_prefills
        lengths, slots = v1.paged_keys(v1._np(m.seq_lens)[:nd], v1._np(m.block_table)[:nd], bs)
        if ne + n_p == 0:
            return lengths, slots
        if seen.slot_mapping is None:
            raise RuntimeError("attnfuzz: an AITER extend or prefill forward with no slot mapping")
        written = v1._np(seen.slot_mapping).astype(np.int64)
        query = v1._np(m.query_start_loc).astype(np.int64)
        table = v1._np(m.block_table)
        context: list[list[np.ndarray]] = [[] for _ in range(ne)]
        for chunk in m.extend.chunks if m.extend is not None else []:
            cu, starts = v1._np(chunk.cu_seq_lens), v1._np(chunk.starts)
            for r in range(ne):
                start = int(starts[r])
                stop = start + int(cu[r + 1] - cu[r])
                context[r].append(v1.page_slots(table[nd + r], stop, bs, start))
        keys = list(slots)
        for r in range(ne + n_p):
            i = nd + r
            own = written[query[i] : query[i + 1]]
            keys.append(np.concatenate([*(context[r] if r < ne else []), own]))
        return np.array([len(k) for k in keys], dtype=np.int64), keys


class AiterFARunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, on the AITER FlashAttention backend."""

    engine_type = _AiterFAEngine

    # The builder's reorder_batch_threshold makes the runner reorder its batch, as MLA's
    # does: the fresh engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = AiterFARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-aiter-fa`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-aiter-fa`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the three-way split with its extends counted as prefills -----------------------


@contextlib.contextmanager
def extends_as_prefills() -> Iterator[None]:
    """``AiterFlashAttentionMetadataBuilder.build`` splits the step two ways, as
    ``split_decodes_and_prefills`` does: every request past the decodes is a prefill,
    one with context too, so the prefill kernel attends to an extend's new keys alone
    (its context never gathered)."""
    from vllm.v1.attention.backends import rocm_aiter_fa

    original = rocm_aiter_fa.split_decodes_prefills_and_extends

    def split(common_attn_metadata: Any, decode_threshold: int = 1) -> tuple[int, ...]:
        nd, ne, n_p, nd_tokens, ne_tokens, np_tokens = original(
            common_attn_metadata, decode_threshold
        )
        return nd, 0, ne + n_p, nd_tokens, 0, ne_tokens + np_tokens

    with mock.patch.object(rocm_aiter_fa, "split_decodes_prefills_and_extends", split):
        yield


def reach_extend(trace: Any) -> bool:
    """A V1 trace the AITER backend runs beside Triton (block sizes of multiples of 16, no
    varlen decode graphs) in which some step holds an extend: a request with context
    whose query is longer than the reorder threshold."""
    c = trace.config
    if c.runner != "v1" or c.varlen_decode or c.block_size % 16:
        return False
    cases = trace.cases() if hasattr(trace, "cases") else [trace]
    threshold = 1 + c.num_spec
    return any(
        computed > 0 and q > threshold
        for case in cases
        for computed, q in zip(case.batch.num_computed_tokens, case.batch.q_lens, strict=True)
    )
