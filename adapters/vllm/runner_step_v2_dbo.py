"""vLLM's model runner V2 step with dual-batch overlap, as the implementation ``vllm-dbo``
of ``runner-step``.

The engines of :mod:`.runner_step` (implementation ``vllm``), their parallel config's
``enable_dbo`` set as :func:`.runner_step_dbo.dbo_parallel_config` sets it (both token
thresholds at the config's floor, an all-to-all backend microbatching accepts), so that
small drawn steps split. The runner is rank 0 of two while ``initialize_kv_cache`` and
``capture_model`` run (``maybe_build_ubatch_runner`` makes a ``UBatchRunner`` only
with more than one data-parallel rank), and each step runs beside its data-parallel
peer (:func:`.runner_step._data_parallel`), whose vote for microbatching is the
runner's own. What runs unchanged, beyond ``vllm``'s:

- ``vllm/v1/worker/gpu/dp_utils.py``: ``sync_cudagraph_and_dp_padding``'s micro-batch
  branch (both ranks must vote, ``check_ubatch_thresholds`` on the smaller rank, a
  micro-batched FULL graph or an eager split, the padding every rank then takes);
- ``vllm/v1/worker/gpu/cudagraph_utils.py``: ``CudaGraphManager._maybe_ubatch_twin``
  (the micro-batched twin of each uniform FULL capture size), ``dispatch`` with
  ``num_ubatches``, and ``ModelCudaGraphManager.capture``'s micro-batch branch
  (``InputBatch.make_dummy``, the dummy block tables and slots, ``UBatchRunner.prepare``
  and ``begin_capturable_run`` for capture);
- ``vllm/v1/worker/gpu/ubatch_utils.py``: ``UBatchRunner`` (``__init__``, ``prepare``,
  ``_make_forward_contexts``, ``run``, ``begin_capturable_run`` and its ``finish``),
  ``create_ubatch_slices`` (over ``vllm/v1/worker/ubatch_utils.py``'s
  ``maybe_create_ubatch_slices``), ``_slice_input_batch``, ``_slice_query_start_loc``,
  ``_slice_seq_lens``, ``slice_model_inputs``, ``merge_ubatch_outputs``; each
  micro-batch's metadata from ``DefaultModelState.prepare_attn`` with its ``ubatch_idx``.

Stood in, beyond ``vllm``'s: the micro-batch threads, their CUDA streams, events and
SM control (``make_ubatch_contexts``, ``create_sm_control_context``,
``threading.Thread``/``Barrier`` in ``ubatch_utils``): each micro-batch's forward
runs on the host thread in turn when ``finish`` joins it, in its own forward context
(:class:`_UBatchContext`); a micro-batched FULL graph (:class:`_MicroGraph`) keeps
each micro-batch's reads and its replay reports each of them.

Builds: ``vllm``'s; where a step splits, each micro-batch's forward is a build
``microbatch`` (its ``first_token`` and real sizes: its token slice, less the DP and
graph padding, and the requests whose query overlaps it), with ``vllm``'s fields of a
forward and ``kv_len``/``kv_slots`` (the keys Triton's kernel reads through the
micro-batch's own ``seq_lens`` and block-table rows), judged by micro-batch agreement
against the step's eager unsplit build. The split step's own ``padded`` build is what
the whole forward writes and reads outside attention: the step's slot mapping (the
micro-batches' slices of it), positions and sampling fields. A micro-batch of a
capture run is a ``capture`` build, of a dummy run a ``dummy`` build.

Declined: ``vllm``'s declines, and a drafter: the speculator's forwards after a split
step are not driven here (its proposal is ``vllm``'s).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step as v2
from attnfuzz.adapters.vllm.runner_step_dbo import (
    NUM_UBATCHES,
    dbo_parallel_config,
    with_micro_batch_sizes,
)
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated, paged_keys
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

_WHERE = "gpu/ubatch_utils.py: UBatchRunner"

# Of a split step's own build, the fields the whole forward reads outside attention.
_WHOLE = ("slot_mapping", "positions", "logits_indices", "cu_num_logits", "idx_mapping")


def prepare() -> None:
    """Import vLLM's runner and its micro-batch runner before a judge forks."""
    v2.prepare()
    import vllm.v1.worker.gpu.ubatch_utils  # noqa: F401


def declines(case: Case) -> str | None:
    """``vllm``'s declines, and an engine with a drafter."""
    if case.config.num_spec:
        return "a drafter: its proposal after a split step is not driven (vllm runs it)"
    return v2.declines(case)


# -- stand-ins -----------------------------------------------------------------------------


class _Deferred:
    """``threading.Thread`` of a micro-batch: started, it waits; joined, it runs, on the
    joining thread, so that the micro-batches run in order (as their hand-offs order
    them on the device) and the process-wide forward context is one at a time."""

    def __init__(self, target: Callable[..., None], args: tuple = ()) -> None:
        self.target, self.args, self.done = target, args, False

    def start(self) -> None:
        return None

    def join(self) -> None:
        if not self.done:
            self.done = True
            self.target(*self.args)


class _NoBarrier:
    """``threading.Barrier``: no thread parks (:class:`_Deferred` runs at the join)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties

    def wait(self) -> int:
        return 0


class _UBatchContext:
    """``make_ubatch_contexts``' context of one micro-batch: its id and forward context;
    entered, the forward context is the micro-batch's and the recorder knows its first
    token (no streams, events or hand-offs)."""

    def __init__(self, recorder: _DboRecorder, i: int, forward_context: Any, start: int) -> None:
        self.id, self.forward_context, self.start = i, forward_context, start
        self.recorder = recorder
        self.cpu_wait_event = SimpleNamespace(set=lambda: None)
        self._context: Any = None

    def __enter__(self) -> _UBatchContext:
        from vllm.forward_context import override_forward_context

        self._context = override_forward_context(self.forward_context)
        self._context.__enter__()
        self.recorder.micro = (self.id, self.start)
        return self

    def __exit__(self, *exc: Any) -> Any:
        self.recorder.micro = None
        return self._context.__exit__(*exc)


@contextlib.contextmanager
def _micro_batches(recorder: Callable[[], _DboRecorder]) -> Iterator[None]:
    """What ``UBatchRunner`` needs of threads, streams and the device, stood in; each
    micro-batch reports to ``recorder()`` (the engine that splits)."""
    import vllm.v1.worker.gpu.ubatch_utils as uu

    def contexts(forward_contexts: list[Any], token_offsets: list[int], **_: Any) -> list[Any]:
        return [
            _UBatchContext(recorder(), i, fc, start)
            for i, (fc, start) in enumerate(zip(forward_contexts, token_offsets, strict=True))
        ]

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    with contextlib.ExitStack() as stack:
        stack.enter_context(
            mock.patch.multiple(
                uu,
                threading=SimpleNamespace(Thread=_Deferred, Barrier=_NoBarrier),
                make_ubatch_contexts=contexts,
                create_sm_control_context=lambda pc: contextlib.nullcontext(),
                current_stream=lambda: None,
            )
        )
        stack.enter_context(mock.patch.object(torch.accelerator, "set_device_index", nothing))
        # A capture's threads set up cuBLAS on the capture streams first.
        stack.enter_context(mock.patch.object(torch.cuda, "stream", contextlib.nullcontext))
        stack.enter_context(mock.patch.object(torch.cuda, "current_blas_handle", nothing))
        yield


class _MicroGraph(v2._Graph):
    """A CUDA graph that may hold micro-batches: its capture keeps each micro-batch's
    reads, its replay reports each as the runner's replay preparation left them."""

    def __init__(self, recorder: _DboRecorder) -> None:
        super().__init__(recorder)
        self.micro: list[tuple[int, v2._Seen]] = []

    def replay(self) -> None:
        if not self.micro:
            return super().replay()
        recorder = self.recorder
        assert isinstance(recorder, _DboRecorder)
        for i, (start, seen) in enumerate(self.micro):
            where = f"cudagraph_utils.py: run_fullgraph, micro-batch {i}'s graph replayed"
            recorder.micro_build(seen.frozen(), start, where)


class _DboRecorder(v2._Recorder):
    """``vllm``'s recorder, each micro-batch's forward a build of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.micro: tuple[int, int] | None = None  # the running micro-batch: id, first token
        self.first_tokens: list[int] = []  # of each microbatch build, in order

    def new_graph(self) -> _MicroGraph:
        return _MicroGraph(self)

    def forward(self, positions: torch.Tensor) -> None:
        if self.micro is None:
            return super().forward(positions)
        i, start = self.micro
        seen = self.handed(positions)
        if isinstance(self.capturing, _MicroGraph):
            self.capturing.micro.append((start, seen))
            self.capturing.read = seen
        self.micro_build(seen.frozen(), start, f"{_WHERE}.begin_capturable_run: micro-batch {i}")
        return None

    def micro_build(self, seen: v2._Seen, start: int, where: str) -> None:
        """A micro-batch's forward read ``seen``: a build ``microbatch`` of a step, a
        capture run's or a dummy run's otherwise."""
        if self.kind is None:
            return
        if self.kind == "step":
            self.seen.append(("microbatch", where, seen))
            self.first_tokens.append(start)
        else:
            self.seen.append((self.kind, f"{where} ({self.where})", seen))


# -- the engine ----------------------------------------------------------------------------


class _WholeSeen(v2._Seen):
    """What a split step's whole forward reads outside attention (:data:`_WHOLE`)."""


class _DboEngine(v2._Engine):
    """A V2 engine with dual-batch overlap on, built and captured with the micro-batches'
    stand-ins (:func:`_micro_batches`; its steps run with them too:
    :class:`DboRunnerStepEngine`)."""

    recorder_type = _DboRecorder
    recorder: _DboRecorder

    def __init__(self, config: EngineConfig, device: torch.device, mode: str, speculator: str):
        self.whole: tuple[Any, Any] | None = None  # the last step's block tables and slots
        made = v2._vllm_config

        def dbo(*args: Any) -> Any:
            vc = made(*args)
            vc.parallel_config = dbo_parallel_config(vc.parallel_config)
            return vc

        with _micro_batches(lambda: self.recorder), mock.patch.object(v2, "_vllm_config", dbo):
            super().__init__(config, device, mode, speculator)
        prepare_attn = self.runner.prepare_attn

        def kept(input_batch: Any) -> Any:
            self.whole = prepare_attn(input_batch)
            return self.whole

        self.runner.prepare_attn = kept  # the step's own, which its micro-batches slice

    def kv_cache_config(self, layers: list[str]) -> Any:
        """``vllm``'s, handed ``initialize_kv_cache`` with the runner rank 0 of two:
        ``maybe_build_ubatch_runner`` makes a ``UBatchRunner`` only then (the runner is
        built as one rank: with two, a MoE model's asks for its expert-parallel group)."""
        self.runner.parallel_config.data_parallel_size = 2
        return super().kv_cache_config(layers)

    def capture(self) -> None:
        """``vllm``'s, rank 0 of two (its micro-batched graphs' forward contexts count
        both ranks); one rank after it, each step then saying its own peer."""
        try:
            super().capture()
        finally:
            self.runner.parallel_config.data_parallel_size = 1

    def fields(self, seen: v2._Seen, *, history: bool = True) -> tuple[Field, ...]:
        """``vllm``'s fields of a forward, and ``kv_len``/``kv_slots``: the keys Triton's
        kernel reads (:func:`.runner_step_v1.paged_keys`), by which micro-batch agreement
        judges a request the split cuts. A split step's own: :data:`_WHOLE` alone."""
        out = v2._fields(self.config, seen, history=history)
        if isinstance(seen, _WholeSeen):
            return tuple(f for f in out if f.name in _WHOLE)
        if seen.meta is None:
            return out
        m, bs = seen.meta, self.config.block_size
        lengths, slots = paged_keys(v2._np(m.seq_lens), v2._np(m.block_table), bs)
        width = max([int(m.block_table.shape[1]) * bs] + [len(s) for s in slots])
        table = np.zeros((len(lengths), width), dtype=np.int64)
        for r, row in enumerate(slots):
            table[r, : len(row)] = row
        return out + (
            Field("kv_len", "requests", lengths),
            Field("kv_slots", "requests", table, row_lengths=lengths),
        )

    def step_seen(self, state: Any) -> v2._Seen:
        """A split step's attention is its micro-batches' (their builds); its own build is
        the step's slot mapping and what sampling reads (:class:`_WholeSeen`)."""
        if state.attn_metadata is not None:
            return super().step_seen(state)
        batch = state.input_batch
        assert self.whole is not None, "a split step prepared no attention inputs"
        block_tables, slot_mappings = self.whole
        meta = SimpleNamespace(
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_table=block_tables[0],
            slot_mapping=slot_mappings[0][: batch.num_tokens_after_padding],
        )
        return _WholeSeen(meta, batch.positions, batch)


class DboRunnerStepEngine(v2.RunnerStepEngine):
    """``vllm``'s three engines with dual-batch overlap; each micro-batch build given its
    first token and real sizes."""

    engine_type = _DboEngine

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        # Of the three engines, the one of graphs has a peer, so it alone splits a step.
        with _micro_batches(lambda: self.graphs.recorder):  # type: ignore[union-attr]
            out = super().__call__(inputs)
        graphs = self.graphs
        assert isinstance(graphs, _DboEngine)
        starts, graphs.recorder.first_tokens = graphs.recorder.first_tokens, []
        assert graphs.last is not None  # the step's ExecuteModelState: its batch order
        order = graphs.last.state.input_batch.req_ids
        return with_micro_batch_sizes(out, inputs, order, starts)


ENGINE = DboRunnerStepEngine()
"""The engine of the implementation ``vllm-dbo`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-dbo`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


@contextlib.contextmanager
def _not_rebased() -> Iterator[None]:
    """The defect: ``_slice_query_start_loc`` copies a micro-batch's query offsets from
    the step's without subtracting its first token (clamped to its tokens, a second
    micro-batch's offsets then all point past its rows)."""
    import vllm.v1.worker.gpu.ubatch_utils as uu

    def sliced(
        query_start_loc: torch.Tensor, out: torch.Tensor, req_start: int, req_stop: int,
        tok_start: int, num_tokens_padded: int,
    ) -> torch.Tensor:  # fmt: skip
        out.copy_(query_start_loc[req_start : req_stop + 1])
        return out.clamp_(0, num_tokens_padded)

    with mock.patch.object(uu, "_slice_query_start_loc", sliced):
        yield


def run_not_rebased(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-dbo-query-start-not-rebased``: ``vllm-dbo`` with
    :func:`_not_rebased` in force."""
    return _MUTATED(inputs)


_MUTATED = Mutated(DboRunnerStepEngine(), _not_rebased)
run_not_rebased.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_microbatching(trace: Trace | Case) -> bool:
    """An engine ``vllm-dbo`` runs: V2, no drafter."""
    c = trace.config
    return c.runner == "v2" and not c.num_spec and not c.varlen_decode


def splits(config: EngineConfig, step: Batch) -> bool:
    """Whether both ranks split ``step``: both run as many tokens as the thresholds ask
    (:data:`.runner_step_dbo.NUM_UBATCHES`, the floor both are set at), this rank the
    step's and its peer those :func:`.runner_step._peer` gives it (none never splits,
    an idle one runs one token)."""
    inputs = ref.make_inputs(Case(config, step))
    peer = v2._peer(inputs, config.next_n)
    return peer is not None and min(inputs.num_tokens, peer.num_tokens) >= NUM_UBATCHES


def trigger_not_rebased(trace: Trace | Case) -> bool:
    """A step both ranks split (:func:`splits`): its second micro-batch starts after the
    step's first token, so its offsets are the step's less that token."""
    return reach_microbatching(trace) and any(
        splits(trace.config, b) for b in as_trace(trace).steps
    )


def smallest_not_rebased() -> Trace:
    """Two requests prefill 2 and 3 tokens beside a peer prefilling 6: the ranks split
    at the midpoint of 6 tokens, inside the second request, and the second micro-batch
    holds its last two tokens (its offsets [0, 2], which the defect leaves as [2, 3])."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2, 4, 8), runner="v2",
    )  # fmt: skip
    step = Batch((0, 0), (2, 3), req_ids=(1, 2), pages=((1,), (2,)), new_pages=(1, 1))
    return Trace(config, (step,))
