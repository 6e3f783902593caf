"""vLLM's model runner V1 step of a model with a QSA indexer (Qwen4-Exp's), as the
implementation ``vllm-v1-qsa`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, whose attention layer's indexer keeps two side
caches, each made by its own constructor (``vllm/models/qwen4_exp/common/qsa_cache.py``,
as ``QSAIndexer.__init__`` in ``models/qwen4_exp/nvidia/indexer_qsa.py`` makes them):

- the raw key ring (``QSAKeyStateCache``): a ``CircularBufferSpec`` of
  ``round_up(ratio + num_speculative_tokens, ratio)`` rows, one block a request (the
  open group's committed keys and every row a speculative step stores);
- the compressed keys (``QSACompressedKeyCache``): an ``MLAAttentionSpec`` of the
  attention's pages, one state per ``ratio`` tokens (``tokens_per_state``).

Each is a KV-cache group of its own on ``QSAStateBackend``, whose ``QSAMetadataBuilder``
builds every step, capture run and draft build of the group: the decode/prefill split
(threshold ``1 + num_spec``, uniform), ``decode_query_len``, and through
``build_qsa_metadata`` (its Triton kernel, as a GPU build binds it: :func:`triton_path`;
vLLM binds a torch path where Triton is absent, as on this machine) each token's
request, its logical position (-1 past the step's tokens), its visible compressed
blocks, and its slot: the ring's (``circular_qsa_slot_mapping``: the request's one block,
the position modulo the ring, only a request's last ring-full of tokens), or the
compressed cache's (``compressed_qsa_slot_mapping``: a group's last token writes its
group's state). Its graphs are ``UNIFORM_BATCH`` (a FULL mode becomes FULL_AND_PIECEWISE).
The indexer's compression ratio is 4 (``indexer_compress_ratio``, attnfuzz's choice).

The consumer is ``QSAIndexer.forward``: it takes both caches' metadata from the forward
context through ``QSAIndexer._metadata``, which refuses metadata whose token counts,
splits or (on a CPU) logical positions disagree (a ``RuntimeError``); the recorder runs
that method itself on every forward. Fields, beside ``vllm-v1``'s of the attention
layer: ``qsa.raw.*`` and ``qsa.cmp.*``, each token's request (``token_to_req``, a row of
the step's requests), logical position (up to ``max_model_len - 1``; any negative is none:
the kernels compress no group that ends before ``ratio - 1``), slot (``-1``,
``PAD_SLOT_ID``, or a slot of its cache: the pool's blocks times the ring's rows or a
page's states; a padding token's must be no real token's, ``writes_state``), the
compressed cache's visible blocks (0 to ``max_model_len // ratio``), and
``qsa.raw.ring_block``, the ring block each request's tokens store into (the null block
where none; a padding or dummy request's no real or held request's). Not reported: the
compressed cache's ``k_work_metadata`` (rows of compression work, neither tokens nor
requests).

Kept apart, ``vllm-v1-qsa-dummy-held-rows``: the dummy runs between steps judged against
the requests the engine holds. V1's ``_dummy_run`` builds from the persistent batch's
block-table rows, so the dummy request of row 0 takes the held request's ring block and
the ring slot mapping stores the dummy token there: the mechanism of
``vllm-v1-kpool-tail-dummy-held-rows``.

The scheduler's pages are the trace's: the compressed group's block table is them (its
pages are the attention's size), the ring's block a request's first page, given when it
is new to the engine (a fresh engine's placeholder the null block).

Declined: ``vllm-v1``'s cases, and pages the ring does not divide
(``QSAKeyStateCache.get_kv_cache_spec`` asserts it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang._engine import interpreter_bool_masks
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_QSA = "vllm/models/qwen4_exp/common/qsa_cache.py"
RATIO = 4  # the indexer's compression ratio (indexer_compress_ratio)
INDEX_HEAD_DIM = 16  # the indexer's key width: it sizes the caches, reaches no metadata
_INDEXER = "model.layers.0.self_attn.indexer"
RAW = f"{_INDEXER}.raw_key_cache"
COMPRESSED = f"{_INDEXER}.compressed_key_cache"
NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1
NO_POSITION = -(2**31)  # the least logical position the kernels take as none (int32)


def prepare() -> None:
    """Import vLLM's V1 runner, the QSA caches and the indexer before a judge forks."""
    v1.prepare()
    _modules()


@functools.cache
def _modules() -> SimpleNamespace:
    from vllm.models.qwen4_exp.common import qsa_cache
    from vllm.models.qwen4_exp.nvidia import indexer_qsa

    return SimpleNamespace(cache=qsa_cache, indexer=indexer_qsa)


def ring_rows(config: EngineConfig) -> int:
    """``QSAKeyStateCache.get_kv_cache_spec``: the ratio plus the drafts, in whole groups."""
    return -(-(RATIO + config.num_spec) // RATIO) * RATIO


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and pages the ring
    does not divide."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    return ring_declines(
        config, ring_rows(config), "QSA key", f"{_QSA} QSAKeyStateCache.get_kv_cache_spec"
    )


def ring_declines(config: EngineConfig, rows: int, ring: str, where: str) -> str | None:
    """Why a V1 engine of ``config`` with a ring of ``rows`` rows beside its attention
    does not run: ``vllm-v1``'s reasons, and pages the ring does not divide (``where``
    asserts it)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % rows:
        return (
            f"block_size {config.block_size}: the {ring} ring of {rows} rows must divide "
            f"the attention block size ({where})"
        )
    return v1.declines_config(config)


class _Recorder(v1._Recorder):
    """``vllm-v1``'s recorder; with the attention layer's metadata, both QSA caches'
    (their tensors as the forward holds them), after ``QSAIndexer._metadata`` takes them
    as the indexer's forward does."""

    def handed(self, positions: torch.Tensor, layer: str = v1._LAYER) -> v1._Seen:
        from vllm.forward_context import get_forward_context

        seen = super().handed(positions, layer)
        metadata = get_forward_context().attn_metadata
        if layer != v1._LAYER or not metadata:
            return seen
        indexer = SimpleNamespace(
            raw_key_cache=SimpleNamespace(prefix=RAW),
            compressed_key_cache=SimpleNamespace(prefix=COMPRESSED),
        )
        raw, compressed = _modules().indexer.QSAIndexer._metadata(indexer)
        seen.linear = SimpleNamespace(**{
            f"{name}_{part}": getattr(meta, part)
            for name, meta in (("raw", raw), ("cmp", compressed))
            for part in ("token_to_req", "logical_positions", "slot_mapping", "visible_blocks")
        })  # fmt: skip
        return seen


class RingBlocks(v1._Engine):
    """A V1 runner whose KV-cache groups past the attention's are a per-request ring (a
    ``CircularBufferSpec``: one block a request, its first page, given when it is new to
    the engine, a fresh engine's placeholder the null block) or the attention's pages."""

    def __init__(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        self.pages: dict[str, int] = {}  # each request's pages this engine was told of
        super().__init__(config, device, mode)

    def output(self, inputs: RunnerStepInputs) -> Any:
        """``vllm-v1``'s scheduler output, each request's pages given to every group."""
        out = super().output(inputs)
        for new in out.scheduled_new_reqs:
            new.block_ids = self._groups(new.req_id, list(new.block_ids[0]), 0)
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            ids = cached.new_block_ids[i]
            if ids is not None:
                held = 0 if rid in cached.resumed_req_ids else self.pages.get(rid, 0)
                cached.new_block_ids[i] = self._groups(rid, list(ids[0]), held)
        return out

    def _groups(self, rid: str, pages: list[int], held: int) -> tuple[list[int], ...]:
        """Each group's block ids of the pages ``pages`` a request gains, after the
        ``held`` it has."""
        from vllm.v1.kv_cache_interface import CircularBufferSpec

        self.pages[rid] = held + len(pages)
        ring = [] if held else pages[:1] or [NULL_BLOCK_ID]
        groups = self.runner.kv_cache_config.kv_cache_groups
        return tuple(
            ring if isinstance(g.kv_cache_spec, CircularBufferSpec) else pages for g in groups
        )


def ring_block_field(
    name: str, slots: np.ndarray, starts: np.ndarray, rows: int, pool: int
) -> Field:
    """The ring block each request's tokens store into, read off their ring slots
    (``slots``, -1 or less for none; ``rows`` rows a block; the step's query offsets
    ``starts``): the ring a request keeps across steps, the null block where it stores
    none. A padding or dummy request's is no real or held request's."""
    starts = starts.astype(np.int64)
    blocks = np.full(max(len(starts) - 1, 0), NULL_BLOCK_ID, dtype=np.int64)
    for i in range(len(blocks)):
        own = slots[starts[i] : starts[i + 1]]
        own = own[own >= 0]
        if len(own):
            blocks[i] = int(own.max()) // rows
    return Field(name, "requests", blocks, (NULL_BLOCK_ID, pool - 1),
                 writes_state=True, null_slot=NULL_BLOCK_ID)  # fmt: skip


@contextlib.contextmanager
def triton_path() -> Iterator[None]:
    """``build_qsa_metadata`` as a GPU build with Triton binds it: the Triton kernel (here
    under Triton's interpreter, with the boolean masks a compiled kernel has), no
    programmatic dependent launch (``_metadata_launch_pdl``: a launch option, not a
    value the kernel computes)."""
    cache = _modules().cache
    interpreter_bool_masks()
    with (
        mock.patch.object(cache, "build_qsa_metadata", cache.build_qsa_metadata_triton),
        mock.patch.object(cache, "_metadata_launch_pdl", lambda: False),
    ):
        yield


class _QSAEngine(RingBlocks):
    """A V1 runner whose attention layer's indexer keeps QSA's two side caches."""

    recorder_type = _Recorder

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return triton_path()

    def more_groups(self) -> list[tuple[type, str, Any]]:
        cache = _modules().cache
        vc = self.vllm_config
        made = dict(cache_config=vc.cache_config, vllm_config=vc, compress_ratio=RATIO)
        raw = cache.QSAKeyStateCache(
            head_size=INDEX_HEAD_DIM, dtype=torch.bfloat16, prefix=RAW, **made
        )
        compressed = cache.QSACompressedKeyCache(
            head_size=INDEX_HEAD_DIM, dtype=torch.bfloat16, prefix=COMPRESSED, **made
        )
        return [
            (cache.QSAStateBackend, RAW, raw.get_kv_cache_spec(vc)),
            (cache.QSAStateBackend, COMPRESSED, compressed.get_kv_cache_spec(vc)),
        ]

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # QSAMetadataBuilder's UNIFORM_BATCH: FULL becomes FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        q = seen.linear
        if seen.meta is None or q is None:
            return out
        config = self.config
        rows = max(len(v1._np(seen.meta.query_start_loc)) - 1, 1)
        pool = num_blocks(config)
        spaces = {"raw": pool * ring_rows(config), "cmp": pool * (config.block_size // RATIO)}
        more = []
        for name, slots in spaces.items():
            prefix = f"qsa.{name}"
            more += [
                # QSAIndexer.forward: a token's request, a row of the step's requests
                # (query_start_loc, block_table[token_to_req]) ...
                Field(f"{prefix}.token_to_req", "tokens", getattr(q, f"{name}_token_to_req"),
                      (0, rows - 1)),
                # ... its position in its sequence, negative for none (-1 past the step's
                # tokens; a capture's query longer than its seq_len, less): the kernels
                # (ops/qsa.py, ops/qsa_prepare.py) compress no group ending before ratio - 1
                # and store at no slot of -1 ...
                Field(f"{prefix}.logical_positions", "tokens",
                      getattr(q, f"{name}_logical_positions"),
                      (NO_POSITION, config.max_model_len - 1)),
                # ... and the slot of its cache it stores its key at (qsa_store_cache_rows:
                # PAD_SLOT_ID stores none); a padding token's names no real token's.
                Field(f"{prefix}.slot_mapping", "tokens", getattr(q, f"{name}_slot_mapping"),
                      (PAD_SLOT_ID, slots - 1), writes_state=True, null_slot=PAD_SLOT_ID),
            ]  # fmt: skip
        # qsa_select_paged_*: a token sees its first visible_blocks compressed states.
        more.append(Field("qsa.cmp.visible_blocks", "tokens", q.cmp_visible_blocks,
                          (0, config.max_model_len // RATIO)))  # fmt: skip
        more = [dataclasses.replace(f, values=np.asarray(f.values, dtype=np.int64)) for f in more]
        # The raw ring block each request's tokens store into.
        raw = v1._np(q.raw_slot_mapping).astype(np.int64)
        starts = v1._np(seen.meta.query_start_loc)
        ring = ring_block_field("qsa.raw.ring_block", raw, starts, ring_rows(config), pool)
        return (*out, *more, ring)


class QSARunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of a model with a QSA indexer."""

    engine_type = _QSAEngine
    # The builders' reorder threshold makes the runner reorder its batch.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = QSARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-qsa`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-qsa`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: V1's dummy run stores into a held request's raw key ring, as
# vllm-v1-kpool-tail-dummy-held-rows's into its kpool ring (docs/findings.md).

dummy_held_rows = v1.judging_held(
    QSARunnerStepEngine,
    "``vllm-v1-qsa-dummy-held-rows``: ``vllm-v1-qsa`` with its dummy runs between steps "
    "judged against the requests it holds.",
)
