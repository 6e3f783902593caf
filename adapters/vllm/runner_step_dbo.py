"""vLLM's model runner V1 step with dual-batch overlap, as the implementation
``vllm-v1-dbo`` of ``runner-step``.

The engines of :mod:`.runner_step_v1`, their parallel config's ``enable_dbo`` set
(``--enable-dbo``, with an all-to-all backend microbatching accepts,
``deepep_low_latency``) and both token thresholds at the config's own floor, the
number of micro-batches (``ParallelConfig``'s validation refuses less), so that
small drawn steps split. The graph engine runs each step as rank 0 of two beside
its data-parallel peer (:func:`.runner_step_v1._data_parallel`), whose dispatch
attempts microbatching too. What runs unchanged, beyond ``vllm-v1``'s:

- ``GPUModelRunner._allow_microbatching`` (the prefix-sharing veto) and the
  micro-batch decision of ``_determine_batch_execution_and_padding``;
  ``vllm/v1/worker/dp_utils.py``: ``coordinate_batch_across_dp`` with
  ``check_ubatch_thresholds``, ``_post_process_ubatch`` (both ranks must agree, no
  empty second micro-batch) and the DP padding a split forces;
- ``vllm/v1/worker/ubatch_utils.py``: ``maybe_create_ubatch_slices`` and
  ``_pad_out_ubatch_slices`` (the padded tail given to the last micro-batch),
  ``split_attn_metadata``, ``_make_metadata_with_slice`` and
  ``slice_query_start_locs`` (each micro-batch's metadata, a request the split cuts
  rebased and shortened), as ``_build_attention_metadata`` and ``_get_slot_mappings``
  call them;
- ``vllm/v1/worker/gpu_ubatch_wrapper.py``: ``UBatchWrapper`` as ``load_model`` wraps
  the model with it (its FULL graph wrapper inside), its ``__call__`` (the per-micro-batch
  ``DPMetadata``, the choice of capture, replay or run) and ``_make_ubatch_metadata``
  (a forward context per micro-batch, the model inputs sliced).

Stood in, beyond ``vllm-v1``'s: the micro-batch threads, their CUDA streams, events
and SM control (``make_ubatch_contexts``, ``create_sm_control_context``): each
micro-batch's forward runs on the host thread in turn, in its own forward context
(``_run_ubatches``), and a micro-batched FULL graph (``_capture_ubatches``) is one
stand-in graph per micro-batch, whose replay reports what each micro-batch's forward
read. The capture runs one rank (as ``vllm-v1``'s), so that a micro-batched graph is
captured by ``UBatchWrapper`` the first time a FULL step splits.

Builds: ``vllm-v1``'s; where a step splits, each micro-batch's forward is a build
``microbatch`` (its ``first_token`` and real sizes: its token slice, less the DP and
graph padding, and the requests whose query overlaps it), with every field its kernel
reads (query offsets, sequence lengths, block-table rows, slot mapping, positions,
padding rows included, and ``kv_len``/``kv_slots``), judged by micro-batch agreement
against the step's eager unsplit build; the step's own ``padded`` build is then what
the whole forward writes and reads outside attention (the slot mapping of both
micro-batches, the positions). A split dummy run's micro-batches are capture runs.

Declined: ``vllm-v1``'s declines, and a drafter: the V1 drafter's forwards under a
split target step are not driven here (the step's own builds would be, its proposal
is not), so an engine with a speculative config is ``vllm-v1``'s.
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
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import _LAYER
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace, as_trace
from attnfuzz.strategies.traces import data_parallel_peer

prepare = v1.prepare

NUM_UBATCHES = 2
"""``ParallelConfig.num_ubatches`` with ``enable_dbo``."""

ALL2ALL = "deepep_low_latency"
"""An all-to-all backend ``VllmConfig`` accepts for microbatching on CUDA (the model here
has no experts, so none runs)."""

_WHERE = "gpu_ubatch_wrapper.py: UBatchWrapper"


def declines(case: Case) -> str | None:
    """``vllm-v1``'s declines, and an engine with a drafter."""
    if case.config.num_spec:
        return "a drafter: its proposal after a split step is not driven (vllm-v1 runs it)"
    return v1.declines(case)


def dbo_parallel_config(base: Any) -> Any:
    """``base`` with dual-batch overlap on, both thresholds at their floor: the values
    pass ``ParallelConfig``'s own validation first (it refuses a threshold below the
    number of micro-batches)."""
    from vllm.config import ParallelConfig

    checked = ParallelConfig(
        enable_dbo=True,
        dbo_decode_token_threshold=NUM_UBATCHES,
        dbo_prefill_token_threshold=NUM_UBATCHES,
        all2all_backend=ALL2ALL,
    )
    out = copy.copy(base)
    for name in (
        "enable_dbo", "dbo_decode_token_threshold", "dbo_prefill_token_threshold",
        "all2all_backend",
    ):  # fmt: skip
        setattr(out, name, getattr(checked, name))
    if out.num_ubatches != NUM_UBATCHES:
        raise RuntimeError(f"attnfuzz: vLLM splits a DBO step {out.num_ubatches} ways")
    return out


# -- stand-ins -----------------------------------------------------------------------------


def _ubatch_contexts(
    num_micro_batches: int, forward_contexts: list[Any], token_offsets: list[int], **_: Any
) -> list[Any]:
    """``make_ubatch_contexts``: each micro-batch's id, forward context and first token
    (no threads, streams or events)."""
    return [
        SimpleNamespace(id=i, forward_context=fc, token_offset=start)
        for i, (fc, start) in enumerate(zip(forward_contexts, token_offsets, strict=True))
    ]


class _MicroGraphs:
    """A micro-batched FULL graph: one stand-in graph per micro-batch, replayed in turn."""

    def __init__(self, engine: _DboEngine, graphs: list[tuple[int, v1._Graph]]) -> None:
        self.engine, self.graphs = engine, graphs

    def replay(self) -> None:
        for i, (start, graph) in enumerate(self.graphs):
            if graph.read is None:
                raise RuntimeError("attnfuzz: a micro-batch graph captured no forward")
            where = f"{_WHERE}.__call__: micro-batch {i}'s graph replayed"
            self.engine.micro(graph.read.frozen(), start, where)


def _wrapper(engine: _DboEngine, resolved: Any) -> Any:
    """``load_model``'s ``UBatchWrapper`` around the model (FULL where the mode has FULL
    graphs), its threads, streams and graphs stood in."""
    import vllm.compilation.cuda_graph as cg
    import vllm.v1.worker.gpu_ubatch_wrapper as uw
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import override_forward_context

    class Wrapper(uw.UBatchWrapper):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with (
                mock.patch.object(uw, "make_ubatch_contexts", _ubatch_contexts),
                mock.patch("torch.cuda.current_stream", lambda *a, **k: v1._Stream()),
            ):
                return super().__call__(*args, **kwargs)

        def _run_ubatches(self, ubatch_metadata: list[Any], model: Any) -> torch.Tensor:
            outs = []
            for m in ubatch_metadata:
                ctx = m.context
                with override_forward_context(ctx.forward_context):
                    where = f"{_WHERE}._run_ubatches: micro-batch {ctx.id}"
                    engine.micro(
                        engine.recorder.handed(m.positions).frozen(), ctx.token_offset, where
                    )
                    outs.append(self._forward(model, m))
            return torch.cat(outs)

        def _capture_ubatches(self, ubatch_metadata: list[Any], model: Any) -> torch.Tensor:
            graphs, outs = [], []
            for m in ubatch_metadata:
                ctx, graph = m.context, v1._Graph(engine.recorder)
                with override_forward_context(ctx.forward_context):
                    where = f"{_WHERE}._capture_ubatches: micro-batch {ctx.id}"
                    engine.micro(
                        engine.recorder.handed(m.positions).frozen(), ctx.token_offset, where
                    )
                    engine.recorder.capturing = graph
                    try:
                        outs.append(self._forward(model, m))
                    finally:
                        engine.recorder.capturing = None
                graphs.append((ctx.token_offset, graph))
            num_tokens = sum(m.num_tokens for m in ubatch_metadata)
            out = torch.cat(outs)
            self.cudagraphs[num_tokens] = uw.CUDAGraphMetaData(
                cudagraph=_MicroGraphs(engine, graphs),  # type: ignore[arg-type]
                ubatch_metadata=ubatch_metadata,
                outputs=out,
            )
            return out

        @staticmethod
        def _forward(model: Any, m: Any) -> Any:
            return model(
                input_ids=m.input_ids, positions=m.positions,
                intermediate_tensors=m.intermediate_tensors, inputs_embeds=m.inputs_embeds,
            )  # fmt: skip

    mode = CUDAGraphMode.FULL if resolved.has_full_cudagraphs() else CUDAGraphMode.NONE
    with (
        mock.patch.object(
            cg, "current_platform", SimpleNamespace(get_global_graph_pool=lambda: None)
        ),
        mock.patch.object(uw, "create_sm_control_context", lambda pc: contextlib.nullcontext()),
    ):
        return Wrapper(v1._Model(engine.recorder), engine.vllm_config, mode, engine.device)


class _Handed(v1._Handed):
    """What the runner calls as ``self.model``: an unsplit forward as ``vllm-v1``'s; a
    split one's own build is what the whole forward writes and reads outside attention
    (its micro-batches' slot mappings, the positions), each micro-batch a build of its
    own (:meth:`_DboEngine.micro`)."""

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        r = self.recorder
        if context.ubatch_slices is None or r.kind is None:
            return super().forward(input_ids=input_ids, positions=positions, **kwargs)
        slots = None
        if isinstance(context.slot_mapping, list):
            slots = torch.cat([m[_LAYER] for m in context.slot_mapping])
        kind = "padded" if r.kind == "step" else r.kind
        r.seen.append((kind, r.where, v1._Seen(None, slots, positions).frozen()))
        return self.inner(input_ids=input_ids, positions=positions, **kwargs)


# -- the engine ----------------------------------------------------------------------------


class _DboEngine(v1._Engine):
    """A V1 engine with dual-batch overlap on."""

    def __init__(self, config: Any, device: torch.device, mode: str) -> None:
        made = v1._vllm_config
        # Each micro-batch's first token, in the order their builds were recorded.
        self.first_tokens: list[int] = []

        def dbo_config(*args: Any) -> Any:
            vc = made(*args)
            vc.parallel_config = dbo_parallel_config(vc.parallel_config)
            return vc

        with mock.patch.object(v1, "_vllm_config", dbo_config):
            super().__init__(config, device, mode)

    def load(self, resolved: Any) -> Any:
        return _Handed(_wrapper(self, resolved), self.recorder)

    def micro(self, seen: v1._Seen, start: int, where: str) -> None:
        """A micro-batch's forward read ``seen``: a build ``microbatch`` of the step,
        a capture run's otherwise."""
        r = self.recorder
        if r.kind is None:
            return
        if r.kind == "step":
            r.seen.append(("microbatch", where, seen))
            self.first_tokens.append(start)
        else:
            r.seen.append((r.kind, where, seen))


class DboRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines with dual-batch overlap; each micro-batch build given
    its first token and real sizes."""

    engine_type = _DboEngine

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        out = super().__call__(inputs)
        graphs = self.graphs
        assert isinstance(graphs, _DboEngine)
        starts, graphs.first_tokens = graphs.first_tokens, []
        return with_micro_batch_sizes(out, inputs, graphs.runner.input_batch.req_ids, starts)


def with_micro_batch_sizes(
    out: RunnerStepOutputs, inputs: RunnerStepInputs, order: Any, starts: list[int]
) -> RunnerStepOutputs:
    """``out`` with each ``microbatch`` build given its first token (``starts``, in the
    order the builds were recorded) and real sizes: its token slice less the DP and graph
    padding, and the requests whose query overlaps it (``order``: the step's request ids
    in the runner's batch order, their query lengths the scheduler's)."""
    if not any(b.how == "microbatch" for b in out.builds):
        return out
    q = dict(zip(map(str, inputs.req_ids), inputs.query_lens, strict=True))
    cu = np.cumsum([0] + [q[rid] for rid in order])
    starts = list(starts)
    builds: list[StepBuild] = []
    for b in out.builds:
        if b.how == "microbatch":
            start = starts.pop(0)
            tokens = len(b.field("positions").values)  # the micro-batch's, padded
            stop = min(start + tokens, inputs.num_tokens)
            first = int(np.searchsorted(cu, start, "right")) - 1
            reqs = int(np.searchsorted(cu, stop, "left")) - first
            b = StepBuild(
                b.how, max(reqs, 0), max(stop - start, 0), b.fields, b.where,
                draft=b.draft, first_token=start,
            )  # fmt: skip
        builds.append(b)
    return RunnerStepOutputs(tuple(builds))


ENGINE = DboRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-dbo`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-dbo`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


@contextlib.contextmanager
def _not_rebased() -> Iterator[None]:
    """The defect: ``slice_query_start_locs`` hands a micro-batch the step's query
    offsets of its requests without subtracting its first request's (a second
    micro-batch's offsets then index past its own token rows)."""
    import vllm.v1.worker.ubatch_utils as uu

    def sliced(query_start_loc: torch.Tensor, request_slice: slice) -> torch.Tensor:
        return query_start_loc[request_slice.start : request_slice.stop + 1].clone()

    with mock.patch.object(uu, "slice_query_start_locs", sliced):
        yield


def run_not_rebased(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-dbo-query-start-not-rebased``: ``vllm-v1-dbo`` with
    :func:`_not_rebased` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(DboRunnerStepEngine(), _not_rebased)
run_not_rebased.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


# -- the mutant's trigger -------------------------------------------------------------------


def reach_microbatching(trace: Trace | Case) -> bool:
    """An engine ``vllm-v1-dbo`` runs: V1, no drafter, pages the Triton backend runs."""
    c = trace.config
    return c.runner == "v1" and not c.num_spec and not c.varlen_decode and c.block_size % 16 == 0


def trigger_not_rebased(trace: Trace | Case) -> bool:
    """A step that may split with a request starting inside it after its first token: at
    least two requests beside a peer that runs tokens (a uniform decode or a prefill;
    none or an idle one never splits), so that a second micro-batch can start at one
    of them (the split itself is the runner's, after padding)."""
    return reach_microbatching(trace) and any(
        len(b.q_lens) >= 2
        and data_parallel_peer(b.q_lens, b.num_computed_tokens) in ("uniform decode", "prefill")
        for b in as_trace(trace).steps
    )


def smallest_not_rebased() -> Trace:
    """Two requests prefill 2 and 3 tokens beside a peer prefilling 6: both ranks pad to
    8, the split falls at token 4, inside the second request, and the second
    micro-batch holds its last token (its offsets [0, 1], which the defect leaves as
    [2, 3])."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2, 4, 8), runner="v1",
    )  # fmt: skip
    step = Batch((0, 0), (2, 3), req_ids=(1, 2), pages=((1,), (2,)), new_pages=(1, 1))
    return Trace(config, (step,))
