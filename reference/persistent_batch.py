"""Reference of the model runner's persistent batch: a step's metadata from state kept across steps.

The model runner keeps each running request in a *row* of persistent buffers
for the request's whole life (vLLM V1: ``InputBatch`` and ``BlockTable``,
``vllm/v1/worker/gpu_input_batch.py`` and ``block_table.py``; Model Runner V2:
``RequestState`` and ``BlockTables`` in ``vllm/v1/worker/gpu/``):

- a request new to the engine takes a free row (one a finished or preempted
  request left) and the row's page count is reset (``add_row``);
- each step the scheduler hands on only the pages a request *gained*
  (``new_block_ids``), appended to its row at the row's page count
  (``append_row``);
- each step the scheduler says how many tokens each request has computed
  (``num_computed_tokens``): rejected drafts of the last step are rolled back;
- a request absent from a step has left the engine: its row is free.

From that state the runner builds, per step, the tensors attention reads,
views at the start of persistent buffers (a CUDA graph replays on fixed
addresses): ``query_start_loc[:R_pad + 1]``, ``seq_lens[:R_pad]``,
``block_table[:R_pad]`` (the step's rows in request order) and
``slot_mapping[:T_slots]``. The reference of a step is its common metadata,
computed from the step alone (:func:`~attnfuzz.reference.batch.build_common_metadata`):
padding rows have ``seq_len`` 0, ``query_start_loc`` repeating ``T`` and
``PAD_PAGE`` in every column of the block table; slots from ``T`` to
``T_slots`` are ``-1`` (``T_slots``: the slot mapping's padded length,
``CommonMetadata.slot_mapping_tokens``, as in :mod:`attnfuzz.reference.slot_mapping`),
and so is the rest of the slot buffer, to its end (a kernel bounded by the buffer,
not by the step, reads there).
Of a real request's block-table row only its own pages are compared: the
columns past them hold whatever the row held before.

Inputs. The implementation gets one scheduler output at a time: the step's
requests in batch order with their ids, whether each is new to the engine,
their computed tokens, their query lengths and their *new* pages only, plus the
padded sizes the runner chose. Everything else it must remember itself, so the
earlier steps of its engine (a :class:`~attnfuzz.reference.trace.Trace`) decide
whether it gets a step right.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    PAD_PAGE,
    Batch,
    Case,
    EngineConfig,
    build_block_table,
    build_common_metadata,
    cdiv,
    runner_table_width,
)
from attnfuzz.reference.slot_mapping import PAD_SLOT_ID

__all__ = [
    "PAD_PAGE",
    "PAD_SLOT_ID",
    "PersistentBatchExpected",
    "PersistentBatchInputs",
    "PersistentBatchOutputs",
    "make_inputs",
    "new_to_engine",
    "owned_pages",
    "reference",
]

FIELDS = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")


@dataclass
class PersistentBatchInputs:
    """One scheduler output (host data, as vLLM's ``SchedulerOutput``) and the padded sizes."""

    config: EngineConfig  # the engine's limits: what persistent buffers are sized by
    req_ids: tuple[int, ...]  # [R], batch order
    is_new: tuple[bool, ...]  # [R]: new to the engine (arrived, or resumed after preemption)
    num_computed_tokens: tuple[int, ...]  # [R], the scheduler's (rejected drafts rolled back)
    query_lens: tuple[int, ...]  # [R]
    new_block_ids: tuple[tuple[int, ...], ...]  # [R]: the pages each request gained this step
    num_reqs_padded: int  # R_pad: rows handed on (R when the step is not padded)
    num_slot_tokens: int  # T_slots: slots handed on (-1 past the real tokens)
    device: torch.device  # where the implementation's buffers live

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


@dataclass
class PersistentBatchOutputs:
    query_start_loc: torch.Tensor  # int32 [R_pad + 1]
    seq_lens: torch.Tensor  # int32 [R_pad]
    block_table: torch.Tensor  # int32 [R_pad, W]
    slot_mapping: torch.Tensor  # int64 [T_slots]
    # the persistent buffers the fields are views of (at their first element), by field name
    buffers: dict[str, torch.Tensor]


@dataclass
class PersistentBatchExpected:
    query_start_loc: np.ndarray  # int32 [R_pad + 1]
    seq_lens: np.ndarray  # int32 [R_pad]
    block_table: np.ndarray  # int32 [R_pad, W]: compared on each row's first num_pages entries
    num_pages: np.ndarray  # int32 [R_pad]: a request's pages; W for padding rows (all PAD_PAGE)
    slot_mapping: np.ndarray  # int64 [T_slots]


def owned_pages(config: EngineConfig, batch: Batch) -> list[tuple[int, ...]]:
    """Each request's pages, in order: a trace step's ``pages``; for a step on its
    own, the valid pages of its seeded block table (``cdiv(seq_len, block_size)``)."""
    if batch.pages:
        return [tuple(p) for p in batch.pages]
    table, _ = build_block_table(config, batch)
    return [
        tuple(int(x) for x in table[r, : cdiv(s, config.block_size)])
        for r, s in enumerate(batch.seq_lens)
    ]


def new_to_engine(batch: Batch) -> tuple[bool, ...]:
    """Whether each request is new to the engine: every one of a step on its own; in
    a trace step, one whose pages are all new this step (an arrival, or a preempted
    request resumed). A running request always holds a page from its first step on,
    so one that gained all its pages cannot have been running."""
    if not batch.new_pages:
        return (True,) * batch.num_reqs
    return tuple(n == len(p) for n, p in zip(batch.new_pages, batch.pages, strict=True))


def make_inputs(case: Case, device: torch.device | str = "cpu") -> PersistentBatchInputs:
    """The scheduler output of ``case``'s step: each request's new pages are the last
    ``new_pages`` of its pages (all of them for a step on its own)."""
    config, batch = case.config, case.batch
    meta = build_common_metadata(config, batch)
    pages = owned_pages(config, batch)
    gained = batch.new_pages or tuple(len(p) for p in pages)
    return PersistentBatchInputs(
        config=config,
        req_ids=batch.request_ids,
        is_new=new_to_engine(batch),
        num_computed_tokens=tuple(batch.num_computed_tokens),
        query_lens=tuple(batch.q_lens),
        new_block_ids=tuple(p[len(p) - n :] for p, n in zip(pages, gained, strict=True)),
        num_reqs_padded=meta.num_reqs,
        num_slot_tokens=meta.slot_mapping_tokens,
        device=torch.device(device),
    )


def table_width(config: EngineConfig) -> int:
    """Columns of the runner's block table: ``cdiv(max_model_len, block_size)`` rounded
    up to whole 128-token spans, as vLLM's ``GPUModelRunner.initialize_kv_cache`` sizes
    it (:func:`~attnfuzz.reference.batch.runner_table_width`); every step hands on all."""
    return runner_table_width(config.max_model_len, config.block_size)


def reference(case: Case, inputs: PersistentBatchInputs) -> PersistentBatchExpected:
    """The step's common metadata, its block table at the runner's width (padding rows
    ``PAD_PAGE`` in every column); the slot mapping padded with -1 to ``T_slots``."""
    config = case.config
    meta = build_common_metadata(config, case.batch)
    width = table_width(config)
    table = np.full((meta.num_reqs, width), PAD_PAGE, dtype=np.int32)
    table[:, : meta.block_table.shape[1]] = meta.block_table
    num_pages = np.full(meta.num_reqs, width, dtype=np.int32)
    for r, pages in enumerate(owned_pages(config, case.batch)):
        num_pages[r] = len(pages)
    slots = np.full(meta.slot_mapping_tokens, PAD_SLOT_ID, dtype=np.int64)
    slots[: meta.num_actual_tokens] = meta.slot_mapping
    return PersistentBatchExpected(
        query_start_loc=meta.query_start_loc,
        seq_lens=meta.seq_lens,
        block_table=table,
        num_pages=num_pages,
        slot_mapping=slots,
    )
