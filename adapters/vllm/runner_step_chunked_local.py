"""vLLM's model runner V1 step of a model with chunked local attention (Llama 4's
interleaved layers), as the implementation ``vllm-v1-chunked-local`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, whose model also has a chunked local attention
layer: a second KV-cache group of a ``ChunkedLocalAttentionSpec`` on the backend
``ChunkedLocalAttention`` makes of the Triton one
(``model_executor/layers/attention/chunked_local_attention.py``
``create_chunked_local_attention_backend``). The runner's own
``_build_attention_metadata`` then runs that backend's ``ChunkedLocalAttentionBuilder``
for the group on every step: ``make_local_attention_virtual_batches``
(``v1/attention/backends/utils.py``) splits each request's query at the boundaries of
its chunks of :func:`chunk_size` keys into *virtual requests*, each reading the keys of
its chunk through a block table of its own, and the Triton builder builds on those.
The builder supports no graph (``AttentionCGSupport.NEVER``): the engine's cases are of
``cg_support`` NEVER, modes NONE and PIECEWISE (vLLM refuses FULL and turns the modes of
FULL decode graphs into PIECEWISE).

What the layer's kernel reads is reported by token of the step (``local.*``): the keys
each query token reads (``kv_len``, ``kv_slots``: token ``t`` of virtual request ``i``
reads the first ``seq_lens[i] - q_i + t + 1`` keys of its virtual block-table row), and
the group's slot mapping, which names the slot each token's key is written to. They are
judged by every property of the step, and within each build against what chunked local
attention is (Llama 4's ``attention_chunk_size``): a query at position ``p`` attends to
the keys of its request at positions ``p - p % chunk`` to ``p``, which
``local.chunk_len`` and ``local.chunk_slots`` derive from the full attention layer's
own metadata (its request offsets, its block-table row) and the group's pages.

The group's pages are the attention pages' own numbers shifted past them (page ``p``
of the trace is the local group's page ``p + num_blocks``): both groups take their
blocks from one pool, and the local layer's keys never share a page with the full
layer's. Not modelled: ``ChunkedLocalAttentionManager`` freeing the pages of a request's
past chunks for other requests to take (the runner's table keeps their numbers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import PAD_SLOT_ID, num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

LOCAL_LAYER = "model.layers.1.self_attn"  # the chunked local layer of the second group


def chunk_size(config: EngineConfig) -> int:
    """The model's ``attention_chunk_size``: a multiple of the page
    (``make_local_attention_virtual_batches`` asserts it), two pages of 16 and one of 32
    or 64, so small traces cross chunks of both kinds."""
    return max(32, config.block_size)


def prepare() -> None:
    """Import vLLM's V1 runner and the chunked local backend before a judge forks."""
    v1.prepare()
    import vllm.model_executor.layers.attention.chunked_local_attention  # noqa: F401


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1``. Its cases are of
    ``cg_support`` NEVER (the plugin's ``cg_supports``): vLLM refuses mode FULL for a
    backend of no graph support and turns the modes of FULL decode graphs into
    PIECEWISE (``compilation.py`` ``resolve_cudagraph_mode_and_sizes``), so its
    engines run NONE and PIECEWISE."""
    return v1.declines(case)


def _shifted(config: EngineConfig, pages: list[int]) -> list[int]:
    """The local group's pages of attention pages ``pages``: past them in the pool (the
    null page stays the null page, a fresh engine's placeholder)."""
    return [p + num_blocks(config) if p else 0 for p in pages]


class _LocalEngine(v1._Engine):
    """A V1 runner whose model has a full attention layer and a chunked local one."""

    def more_groups(self) -> list[tuple[type, str, Any]]:
        from vllm.model_executor.layers.attention.chunked_local_attention import (
            create_chunked_local_attention_backend,
        )
        from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec

        self.recorder.linear_layer = LOCAL_LAYER
        chunk = chunk_size(self.config)
        backend = create_chunked_local_attention_backend(v1._triton_backend(), chunk)
        spec = ChunkedLocalAttentionSpec(
            block_size=self.config.block_size, num_kv_heads=1, head_size=16,
            dtype=torch.float32, attention_chunk_size=chunk,
        )  # fmt: skip
        return [(backend, LOCAL_LAYER, spec)]

    def pool_size(self) -> int:
        return 2 * num_blocks(self.config)

    def output(self, inputs: RunnerStepInputs) -> Any:
        """The step's scheduler output with the local group's block ids: the attention
        pages' own, shifted (:func:`_shifted`)."""
        out = super().output(inputs)
        for new in out.scheduled_new_reqs:
            new.block_ids = (*new.block_ids, _shifted(self.config, new.block_ids[0]))
        cached = out.scheduled_cached_reqs
        for i, ids in enumerate(cached.new_block_ids):
            if ids is not None:
                cached.new_block_ids[i] = (*ids, _shifted(self.config, ids[0]))
        return out

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        return super().fields(seen) + local_fields(self.config, seen, self.pool_size())


def _token_reads(
    qsl: np.ndarray, seq_lens: np.ndarray, table: np.ndarray, tokens: int, bs: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The keys each of ``tokens`` token rows reads under the Triton kernel's causal
    mask (``kernel_unified_attention_*``): token ``t`` of request ``i`` (rows
    ``qsl[i]`` to ``qsl[i + 1]``) reads the first ``seq_lens[i] - q_i + t + 1`` keys
    through row ``i`` of ``table``; a row past the last offset reads none."""
    owner = v1.token_requests(qsl, tokens)
    lengths = np.zeros(tokens, dtype=np.int64)
    slots: list[np.ndarray] = []
    for j in range(tokens):
        i = int(owner[j])
        if i >= len(seq_lens):
            slots.append(np.zeros(0, dtype=np.int64))
            continue
        q = int(qsl[i + 1] - qsl[i])
        lengths[j] = int(seq_lens[i]) - q + (j - int(qsl[i])) + 1
        slots.append(v1.page_slots(table[i], int(lengths[j]), bs))
    return lengths, slots


def _chunk_reads(
    config: EngineConfig, meta: Any, positions: np.ndarray, tokens: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The keys chunked local attention reads for each real token: a query at position
    ``p`` of request ``r`` attends to ``r``'s keys ``p - p % chunk`` to ``p``, in the
    local group's pages of the full layer's block-table row (:func:`_shifted`); its
    request is the one the full layer's offsets place it in."""
    bs, chunk = config.block_size, chunk_size(config)
    owner = v1.token_requests(v1._np(meta.query_start_loc), tokens)
    table = v1._np(meta.block_table).astype(np.int64)
    lengths = np.zeros(tokens, dtype=np.int64)
    slots: list[np.ndarray] = []
    for j in range(tokens):
        p = int(positions[j])
        row = np.array(_shifted(config, table[int(owner[j])].tolist()), dtype=np.int64)
        start = p - p % chunk
        lengths[j] = p + 1 - start
        slots.append(v1.page_slots(row, p + 1, bs, start=start))
    return lengths, slots


def _padded(rows: list[np.ndarray], width: int) -> np.ndarray:
    """One row of ``width`` a token: its slots, then zeros no consumer reads."""
    table = np.zeros((len(rows), width), dtype=np.int64)
    for j, row in enumerate(rows):
        table[j, : len(row)] = row
    return table


def local_fields(config: EngineConfig, seen: v1._Seen, pool: int) -> tuple[Field, ...]:
    """What the chunked local layer's kernels read of one forward, by token: its slot
    mapping, and the keys each query token reads, which must be those of its chunk."""
    m = seen.linear
    if m is None:
        return ()
    bs = config.block_size
    tokens_pad = int(seen.positions.shape[0])
    slots = v1._np(m.slot_mapping)
    out = [
        # attention.py unified_kv_cache_update: the group's slot mapping (each token's
        # key written to its slot, PAD_SLOT_ID skipping it), as the full layer's.
        Field("local.slot_mapping", "tokens", slots, (PAD_SLOT_ID, pool * bs - 1),
              writes_kv=True, read_in="local.kv_slots"),
    ]  # fmt: skip
    # triton_unified_attention.py: the virtual requests' offsets, keys and table rows.
    lengths, read = _token_reads(
        v1._np(m.query_start_loc), v1._np(m.seq_lens), v1._np(m.block_table), len(slots), bs
    )
    width = max([-(-config.max_model_len // bs) * bs, *(len(r) for r in read)])
    # The virtual block table indexes the pool's pages: the kernel reads page
    # block_table[i, k // bs] for key k of virtual request i.
    virtual = v1._np(m.block_table)
    out += [
        Field("local.block_table", "tokens", virtual, (0, pool - 1),
              row_lengths=-(-v1._np(m.seq_lens).astype(np.int64) // bs)),
        Field("local.kv_len", "tokens", lengths, agrees_with="local.chunk_len"),
        Field("local.kv_slots", "tokens", _padded(read, width), row_lengths=lengths,
              agrees_with="local.chunk_slots"),
    ]  # fmt: skip
    if seen.meta is not None:
        positions = v1._np(seen.flat_positions if seen.flat_positions is not None
                           else seen.positions)  # fmt: skip
        real = int(v1._np(seen.meta.query_start_loc)[-1])
        want_len, want = _chunk_reads(config, seen.meta, positions, min(real, tokens_pad))
        out += [
            Field("local.chunk_len", "tokens", want_len),
            Field("local.chunk_slots", "tokens", _padded(want, width), row_lengths=want_len),
        ]
    return tuple(out)


class LocalRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of a model with a chunked local layer."""

    engine_type = _LocalEngine


ENGINE = LocalRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-chunked-local`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-chunked-local`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant -----------------------------------------------------------------------------


@contextlib.contextmanager
def _last_chunk_empty() -> Iterator[None]:
    """The defect: ``make_local_attention_virtual_batches`` counting the keys of each
    request's last chunk as ``seq_len % chunk`` (not ``chunk + seq_len % -chunk``): a
    request whose keys end on a chunk boundary reads none in its last virtual request."""
    import vllm.model_executor.layers.attention.chunked_local_attention as chunked

    make = chunked.make_local_attention_virtual_batches

    def wrong(chunk: int, common: Any, block_size: int = 0) -> Any:
        virtual, table = make(chunk, common, block_size)
        qsl = common.query_start_loc_cpu.numpy()
        seq_lens = common.seq_lens.cpu().numpy()
        q = qsl[1:] - qsl[:-1]
        first = np.minimum(chunk - ((seq_lens - q) % chunk), q)
        last = np.cumsum(1 + -(-(q - first) // chunk)) - 1
        lengths = virtual.seq_lens.clone()
        lengths[torch.as_tensor(last)] = torch.as_tensor(seq_lens % chunk, dtype=lengths.dtype)
        virtual.seq_lens = lengths
        return virtual, table

    with mock.patch.object(chunked, "make_local_attention_virtual_batches", wrong):
        yield


def run_last_chunk_empty(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-chunked-local-last-chunk-empty``: ``vllm-v1-chunked-local``
    with :func:`_last_chunk_empty` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(LocalRunnerStepEngine(), _last_chunk_empty)
run_last_chunk_empty.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


def reach_chunked_local(found: Trace | Case) -> bool:
    """An engine ``vllm-v1-chunked-local`` runs: V1's, pages of multiples of 16, of no
    FULL graph (``cg_support`` NEVER)."""
    c = found.config
    return c.runner == "v1" and c.block_size % 16 == 0 and c.cg_support == "NEVER"


def trigger_last_chunk_empty(found: Trace | Case) -> bool:
    """A step whose request's keys end on a chunk boundary."""
    if not reach_chunked_local(found):
        return False
    chunk = chunk_size(found.config)
    return any(
        (c + q) % chunk == 0
        for b in as_trace(found).steps
        for c, q in zip(b.num_computed_tokens, b.q_lens, strict=True)
        if q
    )


def smallest_last_chunk_empty() -> Trace:
    """One request prefills 32 tokens, a chunk of two pages of 16: its last (and only)
    virtual request reads no key."""
    config = EngineConfig(max_model_len=64, max_num_seqs=1, max_num_batched_tokens=32,
                          block_size=16, cudagraph_mode="PIECEWISE", cg_support="NEVER",
                          runner="v1")  # fmt: skip
    return Trace(config, (Batch((0,), (32,), req_ids=(0,), pages=((1, 2),), new_pages=(2,)),))
