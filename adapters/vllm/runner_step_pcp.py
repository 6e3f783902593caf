"""vLLM's model runner V2 step of an MLA model with prefill context parallelism, as the
implementation ``vllm-pcp`` of ``runner-step``.

Prefill context parallelism (``--prefill-context-parallel-size``) is built by the V2
runner only: ``maybe_build_pcp_manager`` (``vllm/v1/worker/gpu/pcp_manager.py``) makes a
``PCPManager`` where the size is above one, and ``prepare_inputs`` hands every step to
``PCPManager.partition_batch``, which rewrites the step into this rank's share: each
prefill cut into ``2 * PCP`` chunks, rank ``r`` taking chunks ``r`` and ``2 * PCP - 1 - r``
(``_iter_rank_chunks``), each decode handed to one rank in turn
(``pcp_shard_decode_requests``: PCP without decode context parallelism), the rank's rows
ordered decodes first (``_reorder_segments``). The ranks then all-gather their keys and
values, and each writes every rank's tokens to its cache through the gathered slot
mapping (``_build_batch_layout``, ``prepare_slot_mappings``,
``_convert_to_gathered_slot_mappings``: rank ``r``'s rows at ``r * padded``), its write
mask leaving padding rows at ``PAD_SLOT_ID``. PCP runs MLA models only
(``PCPManager.validate_config``).

Engines: ``vllm``'s three (:mod:`.runner_step`) on an MLA model, the MLA layer on
Triton MLA's backend (``MLACommonMetadataBuilder``) as ``vllm-v1-mla`` has it
(:mod:`.runner_step_mla`): the unpartitioned step, PCP off, which is the spec the ranks
are held to; and beside them one engine per PCP rank (:data:`PCP` ranks, each of the
config's graph mode), built and stepped by vLLM's own code, ``partition_batch``,
``get_num_tokens_for_dispatch``, the PCP ``prepare_attn`` and slot mappings,
``prepare_inputs_for_capture_or_profile`` and ``get_dummy_*`` in its capture runs, and
``restore_for_sampling`` after each step included. What runs unchanged beyond
``vllm``'s: the above; the MLA builder with ``use_pcp`` (``treat_short_extends_as_decodes``
off, so a short first chunk is a prefill).

Stood in, beyond ``vllm``'s: the PCP group (``get_pcp_group``: the rank and the group's
size; its ``all_gather`` of the hidden states, which are zeros, repeats this rank's).

Builds of a rank's step, micro-batches of the unpartitioned step (``how="microbatch"``,
judged by *micro-batch agreement* against the eager one):

- each of the rank's segments (a row of its batch: a chunk of one request's query) a
  build of one request, its ``first_token`` the step's token the segment starts at
  (found from its first position and the request's computed tokens, as the step orders
  them), its fields those of its tokens and its request: ``positions``, ``slot_mapping``
  (the rank's rows of the gathered slot mapping: where its tokens' keys are written)
  and ``kv_len``/``kv_slots`` (the keys the MLA kernels read for it:
  :meth:`.runner_step_mla._MLAEngine.kv_read`);
- the rank's forward whole, with no real row (``first_token`` past the step's tokens):
  every field of it, judged by safety, its slot mapping's padding rows by *padding
  writes no real KV*.

So the ranks' segments together must hold each of the step's tokens once, each with the
unpartitioned step's position, slot and keys read. A FULL graph's replay on a rank is
that rank's forward (what the replayed graph reads); its capture runs are ``capture``
builds.

Declined: ``vllm``'s declines; a config of FULL graphs (``validate_config``: PCP takes
FULL graphs of decode-only routines only); pages not a multiple of 16 (Triton MLA's
kernel block sizes). Fixed by the plugin: no drafter (``next_n`` 1).
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
from attnfuzz.adapters.vllm import runner_step as v2
from attnfuzz.adapters.vllm import runner_step_mla as mla
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.persistent_batch import new_to_engine
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace, as_trace

PCP = 2  # the prefill context parallel size: the smallest that partitions
_WHERE = "vllm/v1/worker/gpu/pcp_manager.py: PCPManager.partition_batch"
PARTITION = "pcp"  # the ranks' micro-batches of a step (StepBuild.partition)


def prepare() -> None:
    """Import vLLM's V2 runner, its PCP manager and the Triton MLA backend before a judge
    forks."""
    v2.prepare()
    mla.prepare()
    import vllm.v1.worker.gpu.pcp_manager  # noqa: F401


def declines(case: Case) -> str | None:
    """``vllm``'s declines, a config of FULL graphs and pages Triton MLA does not take."""
    c = case.config
    if c.cudagraph_mode == "FULL":
        return ("FULL graphs: PCPManager.validate_config takes full graphs of decode-only "
                "routines only (FULL_DECODE_ONLY, FULL_AND_PIECEWISE)")  # fmt: skip
    if c.block_size % 16:
        return "pages not a multiple of 16: Triton MLA's kernel block sizes"
    if c.num_spec:
        return "a drafter: the ranks' draft prefill is not driven"
    return v2.declines(case)


# -- an MLA model on the V2 runner -----------------------------------------------------------


def _frozen(meta: Any) -> SimpleNamespace:
    """What the MLA layer's kernels read of ``meta`` now: its query offsets, its slot
    mapping and the split (:func:`.runner_step_mla._freeze`)."""
    if isinstance(meta, SimpleNamespace):
        return meta
    return SimpleNamespace(
        query_start_loc=meta.query_start_loc.clone(),
        slot_mapping=meta.slot_mapping.clone(),
        split=mla._freeze(meta),
    )


class _MLASeen(v2._Seen):
    """A forward's reads of an MLA layer (:func:`_frozen`)."""

    def frozen(self) -> _MLASeen:
        return _MLASeen(_frozen(self.meta), self.positions.clone(), pages=self.pages)


class _MLARecorder(v2._Recorder):
    def handed(self, positions: torch.Tensor, layer: str = v2._LAYER) -> v2._Seen:
        seen = super().handed(positions, layer)
        return _MLASeen(seen.meta, seen.positions, seen.batch, pages=seen.pages)


class _MLAEngine(v2._Engine):
    """A V2 runner whose attention layer is an MLA layer on the Triton MLA backend."""

    recorder_type = _MLARecorder
    pcp = 1  # the engine's prefill context parallel size

    def configure(self, vc: Any) -> Any:
        mla.latent_head(vc)
        vc.parallel_config.prefill_context_parallel_size = self.pcp
        return vc

    def layers(self) -> dict[str, Any]:
        return {v2._LAYER: mla._mla_layer(self.vllm_config, mla._backend())}

    def kv_cache_config(self, layers: list[str]) -> Any:
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

        return KVCacheConfig(
            num_blocks=v2.num_blocks(self.config), kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(list(layers), mla.latent_spec(self.config))],
        )  # fmt: skip

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # TritonMLAMetadataBuilder's UNIFORM_BATCH support: FULL becomes FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def step_seen(self, state: Any) -> v2._Seen:
        batch = state.input_batch
        return _MLASeen(state.attn_metadata[v2._LAYER], batch.positions, batch)

    def fields(self, seen: v2._Seen, *, history: bool = True) -> tuple[Field, ...]:
        """The forward's fields as ``vllm``'s (its slot mapping: the latent cache's
        writes), the MLA metadata's (:func:`.runner_step_mla._mla_fields`) and the keys
        its kernels read (``kv_len``/``kv_slots``)."""
        if seen.meta is None:  # a forward that builds no metadata: its positions alone
            return (Field("positions", "tokens", v2._np(seen.positions),
                          (0, self.config.max_model_len - 1)),)  # fmt: skip
        m = _frozen(seen.meta)
        tokens = SimpleNamespace(meta=m.split, positions=seen.positions)
        own = SimpleNamespace(
            query_start_loc=m.query_start_loc, slot_mapping=m.slot_mapping,
            seq_lens=torch.zeros(0, dtype=torch.int32),
            block_table=torch.zeros((0, 1), dtype=torch.int32),
        )  # fmt: skip
        base = v2._fields(self.config, v2._Seen(own, seen.positions, seen.batch), history=history)
        base = tuple(f for f in base if f.name not in ("seq_lens", "block_table"))
        slots = self.slots_of_tokens(m.slot_mapping, int(seen.positions.shape[0]))
        base = tuple(
            Field("slot_mapping", "tokens", slots, f.accepts, writes_kv=True,
                  read_in="kv_slots") if f.name == "slot_mapping" else f
            for f in base
        )  # fmt: skip
        return base + tuple(mla._mla_fields(self.config, tokens)) + self.kv_fields(m, slots)

    def slots_of_tokens(self, slot_mapping: torch.Tensor, tokens: int) -> np.ndarray:
        """Where the forward's token rows write their keys: its slot mapping."""
        return v2._np(slot_mapping)[:tokens]

    def kv_fields(self, m: SimpleNamespace, slots: np.ndarray) -> tuple[Field, ...]:
        bs = self.config.block_size
        reader = SimpleNamespace(kernel_block_size=lambda: bs)
        read = mla._MLAEngine.kv_read(
            reader, SimpleNamespace(meta=m.split, slot_mapping=torch.from_numpy(slots))
        )  # type: ignore[arg-type]
        return v1.kv_reading_fields(self.config, bs, {"": read})


# -- the PCP ranks ------------------------------------------------------------------------


@contextlib.contextmanager
def _pcp_group(rank: int) -> Iterator[None]:
    """``get_pcp_group()`` of rank ``rank`` of :data:`PCP`: its rank and size; its
    ``all_gather`` (of the hidden states, zeros here) repeats this rank's rows."""
    import vllm.v1.worker.gpu.pcp_manager as pm

    group = SimpleNamespace(
        rank_in_group=rank, world_size=PCP,
        all_gather=lambda t, dim=0: torch.cat([t] * PCP, dim),
    )  # fmt: skip
    with mock.patch.object(pm, "get_pcp_group", lambda: group):
        yield


class _RankEngine(_MLAEngine):
    """One PCP rank's runner: rank :attr:`rank` of :data:`PCP`."""

    pcp = PCP
    rank = 0

    def __init__(self, config: EngineConfig, device: torch.device, mode: str, speculator: str):
        with _pcp_group(self.rank):
            super().__init__(config, device, mode, speculator)

    def slots_of_tokens(self, slot_mapping: torch.Tensor, tokens: int) -> np.ndarray:
        """This rank's rows of the gathered slot mapping (rank ``r``'s tokens at
        ``r * tokens``: ``_build_batch_layout``), where its token rows' keys are written;
        a capture run's gathered mapping is all padding, its first rows taken."""
        gathered = v2._np(slot_mapping)
        if len(gathered) < PCP * tokens:
            raise RuntimeError(
                f"attnfuzz: a gathered slot mapping of {len(gathered)} rows for "
                f"{PCP} ranks of {tokens} tokens"
            )
        return gathered[self.rank * tokens : (self.rank + 1) * tokens]


@functools.cache
def _rank_type(rank: int) -> type[_RankEngine]:
    return type(f"_Rank{rank}Engine", (_RankEngine,), {"rank": rank})


def _segments(
    fields: tuple[Field, ...], batch: Any, global_batch: Any, tokens: int
) -> tuple[list[StepBuild], StepBuild]:
    """A rank's step as micro-batches of the unpartitioned step (module docstring): one a
    segment, then the forward whole with no real row."""
    got = {f.name: f for f in fields}
    qsl = got["query_start_loc"].values.astype(np.int64)
    positions = got["positions"].values.astype(np.int64)
    order = [str(r) for r in global_batch.req_ids]
    starts = global_batch.query_start_loc_np.astype(np.int64)
    computed = global_batch.num_computed_tokens_np.astype(np.int64)
    out = []
    for i, rid in enumerate(batch.req_ids[: batch.num_reqs]):
        lo, hi = int(qsl[i]), int(qsl[i + 1])
        if hi <= lo:
            continue  # a rank with nothing to run holds one empty row
        g = order.index(str(rid))
        first = int(starts[g] + positions[lo] - computed[g])
        n = hi - lo
        seg = (
            Field("query_start_loc", "offsets", np.array([0, n], dtype=np.int64)),
            Field("positions", "tokens", positions[lo:hi], got["positions"].accepts),
            Field("slot_mapping", "tokens", got["slot_mapping"].values[lo:hi],
                  got["slot_mapping"].accepts, writes_kv=True, read_in="kv_slots"),
            Field("kv_len", "requests", got["kv_len"].values[i : i + 1]),
            Field("kv_slots", "requests", got["kv_slots"].values[i : i + 1],
                  row_lengths=got["kv_len"].values[i : i + 1]),
        )  # fmt: skip
        where = f"{_WHERE}: segment {i}"
        out.append(
            StepBuild("microbatch", 1, n, seg, where, first_token=first, partition=PARTITION)
        )
    real = int(qsl[batch.num_reqs])
    # The rank's logits rows are never read: sample_tokens samples the step's own batch,
    # its hidden states restored from every rank's (restore_for_sampling; partition_batch:
    # "Local logits are never sampled"). kv_len and kv_slots are the segments'.
    unread = ("logits_indices", "cu_num_logits", "kv_len", "kv_slots")
    whole = tuple(
        Field(f.name, f.rows, f.values[real:], f.accepts, writes_kv=True)
        if f.name == "slot_mapping" else f
        for f in fields
        if f.name not in unread
    )  # fmt: skip
    whole_build = StepBuild("microbatch", 0, 0, whole, f"{_WHERE}: the rank's forward",
                            first_token=tokens, partition=PARTITION)  # fmt: skip
    return out, whole_build


class PcpRunnerStepEngine(v2.RunnerStepEngine):
    """``vllm``'s three engines of an MLA model (the unpartitioned step), and one engine
    per PCP rank."""

    engine_type = _MLAEngine
    data_parallel = False

    def new_engine(self) -> None:
        super().new_engine()
        self.ranks: list[_RankEngine] = []

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        fresh_config = self.key != (inputs.config, inputs.device)
        out = list(super().__call__(inputs).builds)
        config, mode = inputs.config, inputs.config.cudagraph_mode
        if fresh_config:
            self.ranks = []
            for rank in range(PCP):
                engine = _rank_type(rank)(config, inputs.device, mode, self.speculator)
                self.ranks.append(engine)
                out += v2._seen_builds(engine, 0, 0)  # its capture runs
        for engine in self.ranks:
            out += self._rank_step(engine, inputs)
        return RunnerStepOutputs(tuple(out))

    @staticmethod
    def _rank_step(engine: _RankEngine, inputs: RunnerStepInputs) -> list[StepBuild]:
        """The step on one rank: ``sample_tokens`` of its last step, then the step."""
        with _pcp_group(engine.rank):
            _sample(engine)
            state = v2._execute(engine, engine.output(inputs, engine.held))
        r = engine.runner
        if state is None:  # no forward: the rank holds none of the step's tokens
            where = f"{_WHERE}: rank {engine.rank} ran no forward"
            return [StepBuild("microbatch", 0, 0, (), where, first_token=inputs.num_tokens,
                              partition=PARTITION)]  # fmt: skip
        replayed = [seen for kind, _, seen in engine.recorder.seen if kind == "replay"]
        engine.recorder.seen.clear()
        seen = replayed[-1] if replayed else engine.step_seen(state)
        batch = state.input_batch
        seen = _MLASeen(seen.meta, seen.positions, batch, pages=seen.pages)
        segments, whole = _segments(
            engine.fields(seen), batch, r.pcp_manager.global_batch, inputs.num_tokens
        )
        return [*segments, whole]


def _sample(engine: _RankEngine) -> None:
    """``sample_tokens`` of the rank's last step: the hidden states restored to the
    unpartitioned step (``restore_for_sampling``), sampled greedily over logits of zeros
    (no drafts: nothing to accept or reject)."""
    last = engine.last
    if last is None:
        return
    engine.last = None
    r = engine.runner
    logits = int(r.pcp_manager.global_batch.cu_num_logits_np[-1])
    r.model.logits = torch.zeros(logits, r.vocab_size)
    r.execute_model_state = last.state
    with (
        v2.host_memory(engine.device),
        v2._graphs(engine.recorder),
        v2._data_parallel(r, None),
        v2._sampling(),
    ):
        r.sample_tokens(None)
    r.execute_model_state = None


ENGINE = PcpRunnerStepEngine()
"""The engine of the implementation ``vllm-pcp`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-pcp`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant -----------------------------------------------------------------------------


@contextlib.contextmanager
def _chunks_rounded_down() -> Iterator[None]:
    """The defect: ``_iter_rank_chunks`` sizes a prefill's ``2 * PCP`` chunks by rounding
    its query length down, so a query that is not a multiple of ``2 * PCP`` tokens loses
    its last tokens (no rank runs them; their keys are never written)."""
    import vllm.v1.worker.gpu.pcp_manager as pm

    def chunks(
        self: Any, rank: int, num_scheduled_tokens: np.ndarray, is_prefilling: np.ndarray
    ) -> Iterator[tuple[int, int, int]]:
        num_chunks = 2 * self.pcp_world_size
        decode_ordinal = 0
        replicated = self.replicated_requests(num_scheduled_tokens, is_prefilling)
        for i, n in enumerate(num_scheduled_tokens.tolist()):
            if n == 0:
                continue
            if not replicated[i]:
                size, picked = n // num_chunks, (rank, num_chunks - 1 - rank)
            else:  # a sharded decode: one owner, in turn (shard_decode_requests)
                size, picked = n, (0,) if rank == decode_ordinal % self.pcp_world_size else ()
                decode_ordinal += 1
            for c in picked:
                if min(size, n - c * size) > 0:
                    yield i, c * size, min(size, n - c * size)

    with mock.patch.object(pm.PCPManager, "_iter_rank_chunks", chunks):
        yield


def run_chunks_rounded_down(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-pcp-chunks-rounded-down``: ``vllm-pcp`` with
    :func:`_chunks_rounded_down` in force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(PcpRunnerStepEngine(), _chunks_rounded_down)
run_chunks_rounded_down.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


def reach_pcp(trace: Trace | Case) -> bool:
    """An engine ``vllm-pcp`` runs: V2, no drafter, not FULL graphs, pages of 16s."""
    c = trace.config
    return (c.runner == "v2" and not c.num_spec and not c.varlen_decode
            and c.cudagraph_mode != "FULL" and c.block_size % 16 == 0)  # fmt: skip


def trigger_chunks_rounded_down(trace: Trace | Case) -> bool:
    """A step prefills a query whose length is not a multiple of ``2 * PCP``: the
    request's computed tokens short of its prefill length, as the runner has it (what a
    request knew on arrival: its prompt, or its tokens up to the end of that step's
    query, ``_scheduler_output``)."""
    if not reach_pcp(trace):
        return False
    t = as_trace(trace)
    prefill: dict[int, int] = {}
    for step in t.steps:
        n = len(step.q_lens)
        ids = step.req_ids or tuple(range(n))
        prompts = step.prompt_lens or (0,) * n
        for rid, c, q, new, p in zip(ids, step.num_computed_tokens, step.q_lens,
                                     new_to_engine(step), prompts, strict=True):  # fmt: skip
            if new:
                prefill[rid] = min(max(c + q, p, 1), t.config.max_model_len)
            if q % (2 * PCP) and c < prefill.get(rid, 0):
                return True
    return False


def smallest_chunks_rounded_down() -> Trace:
    """One request prefills 5 tokens: chunks of one token (5 // 4), rank 0 holding tokens
    0 and 3, rank 1 tokens 1 and 2; the last token runs nowhere."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(4, 8), runner="v2",
    )  # fmt: skip
    step = Batch((0,), (5,), req_ids=(1,), pages=((1,),), new_pages=(1,))
    return Trace(config, (step,))
