"""A re-created defect of vLLM's start-up graph-memory profiling, as the mutant
``vllm-profile-state-slots`` of ``runner-step``.

The implementation ``vllm`` (:mod:`.runner_step`) starts its graph engine as the worker
does: ``Worker.determine_available_memory`` calls ``profile_cudagraph_memory``
(``vllm/v1/worker/gpu/cudagraph_utils.py``) before the real KV cache exists, which
captures the target's and the speculator's graphs (the largest two FULL ones) over a
minimal KV cache, ``_init_minimal_kv_cache_for_profiling``'s
``min(max_num_reqs, max_cudagraph_capture_size)`` pages, one a request. Each forward of
it is a ``capture`` build, its pages and slots judged against that minimal cache
(:meth:`.runner_step._Engine.kv_pages`).

The defect: the capture's dummy block tables (``BlockTables.get_dummy_block_tables``)
give each dummy request a state slot of its own, page ``1 + i`` in column 0, as
``GPUModelRunner.prepare_dummy_attn(valid_state_slots=True)`` does for a dummy run over
the worker's cache. There every such page exists; over profiling's minimal cache the
largest dummy batch (``min_blocks`` requests) names page ``min_blocks``, one past it, and
the profiling capture's warm-up forward reads past the cache. Safe padding of that
build's ``block_table`` fails; every capture over the worker's cache passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace


def prepare() -> None:
    """Import vLLM's runner before a judge forks (:func:`.runner_step.prepare`)."""
    runner_step.prepare()


def declines(case: Case) -> str | None:
    """What :func:`.runner_step.declines` declines."""
    return runner_step.declines(case)


@contextlib.contextmanager
def _state_slots() -> Iterator[None]:
    """The defect: ``get_dummy_block_tables`` as vLLM's, then each dummy request's page
    ``1 + i`` in column 0 (``prepare_dummy_attn``'s valid state slots)."""
    from vllm.v1.worker.gpu.block_table import BlockTables

    dummy_block_tables = BlockTables.get_dummy_block_tables

    def with_state_slots(self: Any, num_reqs: int) -> tuple[Any, ...]:
        tables = dummy_block_tables(self, num_reqs)
        for table in tables:
            table[:, 0] = torch.arange(1, num_reqs + 1, dtype=table.dtype)
        return tables

    with mock.patch.object(BlockTables, "get_dummy_block_tables", with_state_slots):
        yield


def run_state_slots(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-profile-state-slots``: ``vllm`` with :func:`_state_slots` in
    force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(runner_step.RunnerStepEngine(), _state_slots)
run_state_slots.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_profile(trace: Trace | Case) -> bool:
    """An engine whose start-up profiles its graphs' memory: V2, graphs to capture
    (``Worker.determine_available_memory``: a mode other than NONE)."""
    c = trace.config
    return c.runner == "v2" and c.cudagraph_mode != "NONE" and bool(c.cudagraph_capture_sizes)


def trigger_state_slots(trace: Trace | Case) -> bool:
    """Any such engine: profiling's largest dummy batch holds ``min_blocks`` requests
    (the largest capture size's, at most ``max_num_seqs``), and the defect names page
    ``min_blocks`` for the last of them."""
    return reach_profile(trace)


def smallest_state_slots() -> Trace:
    """One request prefills 3 tokens on an engine of two requests and capture sizes 1
    and 2: the profiling cache holds 2 pages, and its capture of 2 dummy requests names
    page 2."""
    config = EngineConfig(
        max_model_len=32, max_num_seqs=2, max_num_batched_tokens=8, block_size=16,
        cudagraph_capture_sizes=(1, 2), runner="v2",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (3,), req_ids=(0,), pages=((1,),), new_pages=(1,)),))
