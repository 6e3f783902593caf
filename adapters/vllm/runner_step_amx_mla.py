"""vLLM's CPU worker's model runner V1 step of an MLA model on the AMX MLA backend, as
the implementation ``vllm-v1-amx-mla`` of ``runner-step``.

The engine of :mod:`.runner_step_mla` (an MLA model, the tiny DeepSeek model's latent
head of 576), made as the CPU worker makes it (:class:`.runner_step_cpu.CPUWorker`:
``CPUModelRunner``), its MLA layer (and the MTP draft layer) on ``AMX_MLA``
(``vllm/v1/attention/backends/mla/amx_mla.py``), the backend
``CpuPlatform.get_attn_backend_cls`` picks for an MLA model on a CPU with AMX tiles.
``AMXMLAMetadataBuilder.build`` is ``MLACommonMetadataBuilder.build`` (its query
lengths ``SINGLE_ONLY``: the reorder threshold 1, so a decode with drafts is a
prefill) followed by what the AMX kernels read instead of the block table:

- a decode's ``req_to_token``, the block table expanded to one KV row a position
  (``_expand_block_table``: ``block_table[i, j] * block_size + offset``), its
  ``seq_lens_i64`` (the decode seq_lens as int64), ``req_pool_indices`` (its row of
  ``req_to_token``) and ``num_kv_splits`` (from the step's longest sequence and the
  CPU's thread count), which ``AMXMLAImpl.forward_mqa`` hands ``decode_attention_cpu``;
- a prefill's ``req_to_token``, ``req_pool_indices``, ``cpu_seq_lens`` (its whole
  sequence), ``extend_seq_lens`` and ``extend_start_loc`` (its query lengths and first
  rows) and ``max_len_extend``, which ``forward_mha`` hands ``cpu_mla_extend``.

Every one of them is a field of the step's builds, with what its kernel accepts; the
decodes' int64 lengths must equal the MLA decode seq_lens they are cast from
(*agreement within a build*); and ``kv_len`` and ``kv_slots`` are read as the kernels of
the MLA metadata read them, and again as the AMX kernels read them, through
``req_to_token`` (``amx.kv_len``, ``amx.kv_slots``), which must agree
(:meth:`_AMXMLAEngine.kv_fields`).

Stood in beyond ``vllm-v1-cpu``'s: ``current_platform.num_compute_units()`` (the
host's CPU threads, which set ``num_kv_splits``) by a fixed count
(:data:`THREADS`), so that no build depends on the machine that judges it. The CPU
platform captures no graph: every engine is of cudagraph mode NONE.

Declined: ``vllm-v1-mla``'s cases, and block sizes the backend does not take
(``AMXMLABackend.supports_block_size``: multiples of 32).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_cpu as cpu
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import attention_pages
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

_AMX_MLA = "vllm/v1/attention/backends/mla/amx_mla.py"
THREADS = 8
"""``current_platform.num_compute_units()`` as this engine's CPU has it."""


def prepare() -> None:
    """Import vLLM's V1 runner, the CPU runner and the AMX MLA backend before a judge
    forks."""
    mla.prepare()
    cpu.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.amx_mla import AMXMLABackend

    return AMXMLABackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1-mla``'s cases, block sizes the
    backend does not take, and graphs."""
    return declines_config(case.config) or mla.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not _backend().supports_block_size(config.block_size):
        return (
            f"block_size {config.block_size}: the AMX MLA backend takes multiples of 32 "
            f"({_AMX_MLA} AMXMLABackend.supports_block_size)"
        )
    if config.cudagraph_mode != "NONE":
        return (
            "CUDA graphs: the CPU platform captures none (platforms/cpu.py "
            "CpuPlatform.check_and_update_config empties cudagraph_capture_sizes)"
        )
    return mla.declines_config(config)


@contextlib.contextmanager
def amx_mla() -> Iterator[None]:
    """``amx_mla.py`` on a CPU of :data:`THREADS` threads."""
    from vllm.v1.attention.backends.mla import amx_mla as module

    platform = SimpleNamespace(num_compute_units=lambda *a, **k: THREADS)
    with mock.patch.object(module, "current_platform", platform):
        yield


# -- the engine -----------------------------------------------------------------------------


def _freeze(meta: Any) -> SimpleNamespace:
    """What the MLA layer's kernels read of ``meta`` now (:func:`.runner_step_mla._freeze`),
    and what the AMX kernels read beside it."""
    out = mla._freeze(meta)
    decode, prefill = meta.decode, meta.prefill
    if decode is not None:
        out.decode.amx = SimpleNamespace(
            req_to_token=decode.req_to_token.clone(), seq_lens=decode.seq_lens_i64.clone(),
            req_pool_indices=decode.req_pool_indices.clone(),
            num_kv_splits=decode.num_kv_splits,
        )  # fmt: skip
    if prefill is not None:
        out.prefill.amx = SimpleNamespace(
            req_to_token=prefill.req_to_token.clone(),
            req_pool_indices=prefill.req_pool_indices.clone(),
            seq_lens=prefill.cpu_seq_lens.clone(), extend_seq_lens=prefill.extend_seq_lens.clone(),
            extend_start_loc=prefill.extend_start_loc.clone(),
            max_len_extend=prefill.max_len_extend,
        )  # fmt: skip
    return out


def _amx_fields(config: EngineConfig, seen: v1._Seen) -> list[Field]:
    """Every field the AMX kernels read beside the MLA metadata's, with what they accept
    (``AMXMLAImpl.forward_mqa`` -> ``decode_attention_cpu``, ``forward_mha`` ->
    ``cpu_mla_extend``)."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    rows_of_cache = attention_pages(config, seen.pages) * config.block_size
    out: list[Field] = []
    for name, sub in (("decode", m.decode), ("prefill", m.prefill)):
        if sub is None:
            continue
        amx = sub.amx
        table = v1._np(amx.req_to_token)
        rows = len(v1._np(amx.req_pool_indices))
        lengths = v1._np(amx.seq_lens)
        out += [
            # The kernel reads request i's KV rows req_to_token[req_pool_indices[i], :len]
            # of the flat latent cache (num_blocks * block_size rows).
            Field(f"amx.{name}.req_pool_indices", "requests", v1._np(amx.req_pool_indices),
                  (0, max(rows - 1, 0))),
            Field(f"amx.{name}.req_to_token", "requests", table, (0, rows_of_cache - 1),
                  row_lengths=lengths.astype(np.int64)),
            Field(f"amx.{name}.seq_lens", "requests", lengths, (0, int(table.shape[1])),
                  agrees_with="mla.decode.seq_lens" if name == "decode" else None),
        ]  # fmt: skip
        if name == "decode":
            # decode_attention_cpu splits each sequence's keys this many ways (its
            # attn_logits are sized by it): at least one.
            out.append(Field("amx.decode.num_kv_splits", "requests",
                             np.full(rows, amx.num_kv_splits), (1, 2 * THREADS)))  # fmt: skip
            continue
        extend = v1._np(amx.extend_seq_lens)
        out += [
            # cpu_mla_extend: prefill i's new tokens are q[extend_start_loc[i] :
            # + extend_seq_lens[i]] of the prefill tokens, the last of its seq_lens keys.
            Field("amx.prefill.extend_seq_lens", "requests", extend, (0, tokens_pad)),
            Field("amx.prefill.extend_start_loc", "requests", v1._np(amx.extend_start_loc),
                  (0, tokens_pad)),
            Field("amx.prefill.max_len_extend", "requests", np.full(rows, amx.max_len_extend),
                  (int(extend.max(initial=0)), tokens_pad)),
        ]  # fmt: skip
    return out


class _AMXMLAEngine(cpu.CPUWorker, mla._MLAEngine):
    """A CPU worker's V1 runner whose attention layer is an MLA layer on AMX MLA."""

    backend = staticmethod(_backend)
    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        stack = contextlib.ExitStack()
        stack.enter_context(super().platform())
        stack.enter_context(amx_mla())
        return stack

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        out = super().fields(seen)
        return out if seen.meta is None else (*out, *_amx_fields(self.config, seen))

    def kv_fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        """``kv_len`` and ``kv_slots`` as ``vllm-v1-mla``'s (the MLA metadata's decode
        seq_lens and block table, the prefills' context chunks), and ``amx.kv_len`` and
        ``amx.kv_slots`` as the AMX kernels read the same keys (:func:`_amx_keys`),
        which must equal them (*agreement within a build*): two readings of one cache."""
        if seen.meta is None:
            return ()
        readings = {"": self.kv_read(seen), "amx.": _amx_keys(seen)}
        return v1.kv_reading_fields(self.config, self.kernel_block_size(), readings)


def _amx_keys(seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each request's keys and their latent-cache rows as the AMX kernels read them,
    decodes first (the rows the split puts first), then prefills:

    - a decode: ``decode_attention_cpu`` reads ``req_to_token[req_pool_indices[i],
      : seq_lens_i64[i]]`` (its own key written before, by ``do_kv_cache_update``);
    - a prefill: ``cpu_mla_extend`` reads its prefix, the first ``cpu_seq_lens[i] -
      extend_seq_lens[i]`` rows of ``req_to_token[req_pool_indices[i]]``, from the
      cache, and its new keys from the forward's input (rows ``extend_start_loc[i]`` on
      of the prefill tokens, after the decode tokens), at the slots the forward
      context's slot mapping writes them to."""
    m = seen.meta
    lengths: list[int] = []
    slots: list[np.ndarray] = []

    def row(table: np.ndarray, pool: np.ndarray, i: int) -> np.ndarray:
        # A pool index off the table reads nothing here: its field's range says why.
        return table[pool[i]].astype(np.int64) if 0 <= pool[i] < len(table) else table[:0, 0]

    if m.decode is not None:
        amx = m.decode.amx
        table, pool = v1._np(amx.req_to_token), v1._np(amx.req_pool_indices)
        for i, n in enumerate(v1._np(amx.seq_lens).tolist()):
            lengths.append(n)
            slots.append(row(table, pool, i)[: max(n, 0)])
    if m.prefill is not None:
        if seen.slot_mapping is None:
            raise RuntimeError("attnfuzz: an MLA prefill forward with no slot mapping")
        amx = m.prefill.amx
        table, pool = v1._np(amx.req_to_token), v1._np(amx.req_pool_indices)
        written = v1._np(seen.slot_mapping).astype(np.int64)
        first = v1._np(amx.extend_start_loc).astype(np.int64) + m.num_decode_tokens
        extend = v1._np(amx.extend_seq_lens).astype(np.int64)
        for i, n in enumerate(v1._np(amx.seq_lens).tolist()):
            prefix = row(table, pool, i)[: max(n - extend[i], 0)]
            keys = np.concatenate([prefix, written[first[i] : first[i] + extend[i]]])
            lengths.append(len(keys))
            slots.append(keys)
    return np.array(lengths, dtype=np.int64), slots


class AMXMLARunnerStepEngine(mla.MLARunnerStepEngine):
    """``vllm-v1-mla``'s three engines, as the CPU worker makes them, on AMX MLA."""

    engine_type = _AMXMLAEngine


ENGINE = AMXMLARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-amx-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-amx-mla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: AMXMLAMetadataBuilder.build with one slice changed ----------------------------


@contextlib.contextmanager
def _prefill_lens_unshifted() -> Iterator[None]:
    """``build`` takes the prefills' ``cpu_seq_lens`` from the first rows of the step's
    ``seq_lens`` (``seq_lens[:num_prefills]``), not from the rows after the decodes: in a
    step with decodes and a prefill, ``cpu_mla_extend`` reads a decode's length as the
    prefill's, so its prefix is another length than the MLA metadata's."""
    from vllm.v1.attention.backends.mla.amx_mla import AMXMLAMetadataBuilder

    original = AMXMLAMetadataBuilder.build

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any,
              fast_build: bool = False) -> Any:  # fmt: skip
        meta = original(self, common_prefix_len, common_attn_metadata, fast_build)
        common = common_attn_metadata
        if meta.prefill is not None:
            meta.prefill.cpu_seq_lens = common.seq_lens[: meta.num_prefills].to(torch.int64)
        return meta

    with mock.patch.object(AMXMLAMetadataBuilder, "build", build):
        yield


_MUTANT = v1.Mutated(AMXMLARunnerStepEngine(), _prefill_lens_unshifted)


def prefill_lens_unshifted(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-amx-mla-prefill-lens-unshifted``: the prefills' lengths read from the
    decodes' rows."""
    return _MUTANT(inputs)


prefill_lens_unshifted.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


def reach_amx_mla(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-amx-mla`` runs: V1, no graphs, pages of a multiple of 32."""
    c = trace.config
    return (
        c.runner == "v1" and c.cudagraph_mode == "NONE" and c.block_size % 32 == 0
        and not c.varlen_decode
    )  # fmt: skip


def trigger_mixed(trace: Trace | Case) -> bool:
    """A step with a decode (one query token: the reorder threshold is 1) beside a
    prefill, its requests not all of one length (else every row reads alike)."""
    if not reach_amx_mla(trace):
        return False
    for step in as_trace(trace).steps:
        q_lens = step.q_lens
        lengths = {c + q for c, q in zip(step.num_computed_tokens, q_lens, strict=True)}
        if 1 in q_lens and any(q > 1 for q in q_lens) and len(lengths) > 1:
            return True
    return False


def smallest_mixed() -> Trace:
    """Two requests prefill 20 and 5 tokens; then the second decodes (first in the step,
    as the scheduler puts decodes) while the first prefills 14 more: the decode's 6 keys
    read as the prefill's length."""
    config = EngineConfig(
        max_model_len=96, max_num_seqs=2, max_num_batched_tokens=64, block_size=32,
        num_spec=0, cudagraph_capture_sizes=(1,), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0, 0), (20, 5), req_ids=(7, 8), pages=((1,), (3,)), new_pages=(1, 1)),
            Batch((5, 20), (1, 14), req_ids=(8, 7), pages=((3,), (1, 2)), new_pages=(0, 1)),
        ),
    )
