"""vLLM's CPU worker's model runner V1 step of DeepSeek-V4's sliding-window cache, as the
implementation ``vllm-v1-sparse-swa-cpu`` of ``runner-step``.

The engine of :mod:`.runner_step_sparse_swa` (its attention layer, and the MTP draft
layer, a ``DeepseekV4SWACache``), made as the CPU worker makes it
(:class:`.runner_step_cpu.CPUWorker`: ``CPUModelRunner``) on the CPU platform, where
``DeepseekSparseSWABackend.get_builder_cls`` picks ``DeepseekV4CPUSparseSWAMetadataBuilder``
(``vllm/models/deepseek_v4/cpu/cpu_mla.py``): the shared builder's ``build``, its
``build_tile_scheduler`` returning no FlashMLA plan (the CPU plans none).

What the CPU layer reads of the SWA metadata differs from the CUDA layer's:
``DeepseekV4CPUAttention.forward_mqa`` (``models/deepseek_v4/cpu/cpu_sparse.py``)
ignores ``decode_swa_indices`` and the prefills' gather, and recomputes each token's
window from its position (``max(pos - window + 1, 0)`` to ``pos``), mapped to cache
slots through its request's row of the block table (``token_to_req_indices``;
``map_local_to_global_slots_cpu``: ``block_table[req, j // block_size] * block_size +
j % block_size``), for every query row. So the keys are read twice: ``kv_len`` and
``kv_slots`` as ``vllm-v1-sparse-swa`` reads them (the CUDA kernels' reading of the same
builder's fields), and ``cpu.kv_len`` and ``cpu.kv_slots`` as the CPU layer reads them,
which must agree (*agreement within a build*: one cache, one step). The other fields
are ``vllm-v1-sparse-swa``'s, less the tile-scheduler plan's freshness, which no CPU
consumer reads.

The SWA cache's pages are of 64 tokens, as ``DeepseekV4Attention.__init__`` makes it
(``DeepseekV4SWACache``'s default ``block_size``).

Stood in beyond ``vllm-v1-cpu``'s: ``current_platform`` where ``sparse_swa.py`` reads it
(the CPU platform: ``is_cpu``, neither ROCm nor XPU, no CUDA capability), as this
machine's vLLM may not detect its platform as the CPU one; and the CPU builder's
``build_tile_scheduler`` by its intent, no plan of every layer type (:func:`no_plans`):
vLLM 0.33.0's returns the three V4 types only, and the shared ``build`` reads the two
V4.1 types too (``tile_sched[_LAYER_TYPE_C1A]``), so that every build raises
``KeyError: 'c1a'``. That difference of vLLM's own is kept apart as
``vllm-v1-sparse-swa-cpu-tile-keys`` (the builder as it ships; docs/findings.md). The
CPU platform captures no graph: every engine is of cudagraph mode NONE.

In the drafter's sub-steps after its first pass the CPU reading is not taken: vLLM
0.33.0's V1 drafter hands them its first pass's request map (kept apart as
``vllm-v1-sparse-swa-draft-requests-stale``, :mod:`.runner_step_sparse_swa`), through
which both readings go, differently.

Declined: ``vllm-v1-sparse-swa``'s cases, and graphs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
from attnfuzz.adapters.vllm import runner_step_cpu as cpu
from attnfuzz.adapters.vllm import runner_step_sparse_swa as swa
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

BLOCK_SIZE = 64
"""The SWA cache's pages, as ``DeepseekV4Attention.__init__`` makes it (``fixes``)."""


def prepare() -> None:
    """Import vLLM's V1 runner, the CPU runner, the sparse SWA backend and the CPU
    DeepSeek-V4 builders before a judge forks."""
    swa.prepare()
    cpu.prepare()
    _builder()


@functools.cache
def _builder() -> type:
    from vllm.models.deepseek_v4.cpu.cpu_mla import DeepseekV4CPUSparseSWAMetadataBuilder

    return DeepseekV4CPUSparseSWAMetadataBuilder


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-sparse-swa``'s cases, and graphs."""
    return declines_config(case.config) or swa.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.cudagraph_mode != "NONE":
        return (
            "CUDA graphs: the CPU platform captures none (platforms/cpu.py "
            "CpuPlatform.check_and_update_config empties cudagraph_capture_sizes)"
        )
    return swa.declines_config(config)


class _Cpu:
    """``current_platform`` as ``sparse_swa.py`` asks it on the CPU platform."""

    def __init__(self, platform: Any) -> None:
        self._platform = platform

    def is_cpu(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_device_capability_family(self, family: int, device_id: int = 0) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


@contextlib.contextmanager
def cpu_swa() -> Iterator[None]:
    """``sparse_swa.py`` as it runs on the CPU platform (module docstring)."""
    from vllm.v1.attention.backends.mla import sparse_swa as module

    with mock.patch.object(module, "current_platform", _Cpu(module.current_platform)):
        yield


def layer_types() -> tuple[str, ...]:
    """Every layer type ``sparse_swa.py`` names (its ``_LAYER_TYPE_*``): the keys the
    shared ``build`` reads of a tile-scheduler plan."""
    from vllm.v1.attention.backends.mla import sparse_swa as module

    return tuple(v for k, v in sorted(vars(module).items()) if k.startswith("_LAYER_TYPE_"))


@contextlib.contextmanager
def no_plans() -> Iterator[None]:
    """``DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler`` as its docstring
    says it means it: no plan (``None``) of every layer type (module docstring)."""

    def build_tile_scheduler(self: Any, num_decode_tokens: int) -> dict[str, Any]:
        return dict.fromkeys(layer_types())

    with mock.patch.object(_builder(), "build_tile_scheduler", build_tile_scheduler):
        yield


def _freeze(meta: Any) -> Any:
    """:func:`.runner_step_sparse_swa._freeze`, less the tile-scheduler plan's freshness
    (no CPU consumer reads a plan)."""
    out = swa._freeze(meta)
    out.tile_sched_fresh = None
    return out


def cpu_keys(seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each request's keys and their SWA-cache slots, in position order, as
    ``DeepseekV4CPUAttention.forward_mqa`` reads them: query row ``t`` (every row) reads
    the positions ``max(pos - window + 1, 0)`` to ``pos`` of its request
    ``token_to_req_indices[t]``, position ``j`` at ``block_table[req, j // block_size] *
    block_size + j % block_size`` (``map_local_to_global_slots_cpu``). A request off the
    table, or a position past its row, reads nothing here: the fields' ranges say why."""
    m = seen.meta
    positions = v1._np(seen.positions).astype(np.int64)
    owner = v1._np(m.token_to_req_indices)
    table = v1._np(m.block_table).astype(np.int64)
    rows = len(v1._np(m.seq_lens))
    bs = int(m.block_size)
    slots: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(rows)]
    for t, pos in enumerate(positions.tolist()):
        r = int(owner[t])
        if not 0 <= r < rows:
            continue
        local = np.arange(max(pos - swa.WINDOW + 1, 0), pos + 1, dtype=np.int64)
        local = local[local // bs < table.shape[1]]
        read = table[r, local // bs] * bs + local % bs
        slots[r] = np.array(
            list(dict.fromkeys([*slots[r].tolist(), *read.tolist()])), dtype=np.int64
        )
    return np.array([len(s) for s in slots], dtype=np.int64), slots


class _CPUSWAEngine(cpu.CPUWorker, swa._SWAEngine):
    """A CPU worker's V1 runner whose attention layer is DeepSeek-V4's SWA cache."""

    freeze = staticmethod(_freeze)
    plans_stood_in = True
    """Whether the CPU builder's ``build_tile_scheduler`` is :func:`no_plans`."""

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(cpu.CPUWorker.platform(self))
        stack.enter_context(cpu_swa())
        if self.plans_stood_in:
            stack.enter_context(no_plans())
        return stack

    def resolves_to(self, mode: Any) -> Any:
        return mode  # NONE only (declines_config)

    def kv_fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        """``kv_len`` and ``kv_slots`` as ``vllm-v1-sparse-swa`` reads them, and
        ``cpu.kv_len`` and ``cpu.kv_slots`` as the CPU layer reads the same keys
        (:func:`cpu_keys`), which must equal them."""
        if seen.meta is None:
            return ()
        readings = {"": self.kv_read(seen)}
        if self.offsets_judged(seen):
            # A later sub-step's keys go through vLLM's stale request map (the engine's
            # stale_drafts_judged): kept apart.
            readings["cpu."] = cpu_keys(seen)
        return v1.kv_reading_fields(self.config, self.kernel_block_size(), readings)


class SparseSWACPURunnerStepEngine(swa.SparseSWARunnerStepEngine):
    """``vllm-v1-sparse-swa``'s engines, as the CPU worker makes them."""

    engine_type = _CPUSWAEngine


ENGINE = SparseSWACPURunnerStepEngine()
"""The engine of the implementation ``vllm-v1-sparse-swa-cpu`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-sparse-swa-cpu`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: the CPU builder's plans lack the V4.1 layer types ---------------


tile_keys = v1.kept_apart(
    SparseSWACPURunnerStepEngine,
    "``vllm-v1-sparse-swa-cpu-tile-keys``: ``vllm-v1-sparse-swa-cpu`` with "
    "``DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler`` as vLLM ships it.",
    plans_stood_in=False,
)


def trigger_any_step(trace: Trace | Case) -> bool:
    """Any step: every build reads the plans."""
    return reach_cpu_swa(trace) and len(as_trace(trace).steps) > 0


def smallest_any_step() -> Trace:
    """One request prefills one token."""
    config = EngineConfig(
        max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8, block_size=BLOCK_SIZE,
        num_spec=0, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,)),))


# -- mutant: the CPU builder with its prefill tokens' requests left at zero -----------------


@contextlib.contextmanager
def _prefill_owner_zeroed() -> Iterator[None]:
    """``DeepseekV4CPUSparseSWAMetadataBuilder.build`` fills ``token_to_req_indices`` for
    the decode tokens only, its prefill tokens' left at the buffer's zero: the map
    disagrees with the query offsets, and while the CUDA reading (the prefills' gather,
    by request) is unchanged, the CPU layer maps a prefill token of any row but the
    first through the first row's pages."""
    builder = _builder()
    original = builder.build

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        meta = original(self, *args, **kwargs)
        meta.token_to_req_indices[meta.num_decode_tokens :] = 0
        return meta

    with mock.patch.object(builder, "build", build):
        yield


_MUTANT = v1.Mutated(SparseSWACPURunnerStepEngine(), _prefill_owner_zeroed)


def prefill_owner_zeroed(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-sparse-swa-cpu-prefill-owner-zeroed``: every prefill token read as the
    first request's."""
    return _MUTANT(inputs)


prefill_owner_zeroed.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


def reach_cpu_swa(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-sparse-swa-cpu`` runs: V1, no graphs, pages the backend takes."""
    return declines_config(trace.config) is None


def trigger_prefill_past_first_row(trace: Trace | Case) -> bool:
    """A step of two requests or more, one of more than one query token: the split's
    prefill rows then include one past the first (the decode rows come first; with no
    decode, every row is a prefill's)."""
    return reach_cpu_swa(trace) and any(
        len(step.q_lens) > 1 and max(step.q_lens) > 1 for step in as_trace(trace).steps
    )


def smallest_prefill_past_first_row() -> Trace:
    """Two requests prefill 5 and 3 tokens in one step, on pages 1 and 3: the second's
    tokens read page 1's slots."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, block_size=BLOCK_SIZE,
        num_spec=0, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    step = Batch((0, 0), (5, 3), req_ids=(0, 1), pages=((1,), (3,)), new_pages=(1, 1))
    return Trace(config, (step,))
