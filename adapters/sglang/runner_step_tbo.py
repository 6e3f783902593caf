"""SGLang's decode graph runner step under two-batch overlap, as the implementation
``sglang-tbo`` of ``runner-step``.

With ``--enable-two-batch-overlap`` SGLang splits each step into two micro-batches that
run as forwards of their own, overlapping one's MoE communication with the other's
compute; the model runner's attention backend is ``layers/attention/tbo_backend.py``'s
``TboAttnBackend``: a primary backend for the whole batch and two children, one per
micro-batch (``attention_backend_setup.py``: ``TboAttnBackend.init_new``). The step of
:mod:`~attnfuzz.adapters.sglang.runner_step` (its driver, model runner, request rows,
decode graph runner and graph stand-in), on an engine started with
``--enable-two-batch-overlap --moe-a2a-backend deepep`` (the EP all-to-all that lets
SGLang run it without attention DP: ``arg_groups/validation_hook.py:
check_two_batch_overlap``), its three backends Triton's. What runs besides, unchanged
(SGLang 0.5.23):

- the scheduler's split, on one rank: ``batch_overlap/two_batch_overlap.py``:
  ``TboDPAttentionPreparer.prepare_all_gather`` and ``compute_output``
  (``compute_split_seq_index``: half the requests of a decode or a verify; an extend's
  balanced split, or its two-chunk split, which cuts one request's query between the
  micro-batches when the balanced one leaves them too uneven), after
  ``layers/moe/utils.py:initialize_moe_config`` (as the scheduler calls it at start);
- ``TboForwardBatchPreparer.prepare`` (``prepare_raw``, ``filter_batch``,
  ``derive_fields_related_to_seq_len_for_two_chunk``, ``split_spec_info``): the two
  children's ``ForwardBatch``, as ``ForwardBatch.init_new`` makes them;
- ``TboAttnBackend``: ``init_forward_metadata`` (the primary's, then each child's over
  its micro-batch), ``init_cuda_graph_state`` (each of the three), and
  ``init_forward_metadata_out_graph`` at every capture (the children's over the
  capture's split, made by the graph runner's ``TboCudaGraphRunnerPlugin.
  capture_one_batch_size``) and at replay (``_dispatch_children_from_replay_view``:
  the padded batch split as ``compute_split_indices_for_cuda_graph_replay`` splits it,
  ``_build_tbo_child_replay_fb_view``), after ``TboCudaGraphRunnerPlugin.replay_prepare``.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``, ``replay``, ``fresh``: the primary backend's), and a ``microbatch`` build of
each child of the eager step and of the padded step (its ``first_token`` where its
tokens start in the step; a child of padding alone has no real row). A micro-batch's
fields: the child batch's ``query_start_loc`` (where each request's query starts in the
child's forward), ``seq_lens``, ``req_pool_indices``, ``out_cache_loc``, ``positions``,
its Triton metadata under ``mb.`` (``mb.kv_indptr``, ``mb.kv_indices``, ``mb.qo_indptr``:
offsets of the child's own, judged by safety), and ``kv_len`` and ``kv_slots`` as the
child's kernels read them. The property *micro-batch agreement* holds each to the
eager build's cut to the child's tokens (a request whose query the split cuts reads its
keys up to the cut). Every build of the step also carries ``query_start_loc``: the
query offsets the property cuts by.

Under the MLP sync two-batch overlap implies, the graph runner replays a step only where
the scheduler voted for the decode graph (``scheduler_components/dp_attn.py:
_local_decode_cuda_graph_vote``, one rank's vote here; a verify is a decode at the
scheduler), so an extend runs eagerly.

Mutant: ``sglang-tbo-two-chunk-prefix-forgotten`` (the two-chunk split's second child
keeps its first request's whole-batch prefix: it reads that request's keys short of
the first child's share; micro-batch agreement).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    make_inputs,
)
from attnfuzz.reference.trace import Trace, as_trace

SERVER_ARGS = {"enable_two_batch_overlap": True, "moe_a2a_backend": "deepep"}
"""``--enable-two-batch-overlap --moe-a2a-backend deepep``."""

_TBO = "tbo_backend.py:TboAttnBackend"


def prepare() -> None:
    """Import SGLang's runner, backend and two-batch overlap before a judge forks."""
    decode.prepare()
    from sglang.srt.batch_overlap import two_batch_overlap  # noqa: F401
    from sglang.srt.layers.attention import tbo_backend  # noqa: F401


@contextlib.contextmanager
def moe_flags() -> Iterator[None]:
    """SGLang's MoE flags (``get_flags().moe``: two-batch overlap on, DeepEP's mode) as
    ``initialize_moe_config`` seeds them from the server arguments in force, put back
    after: the flags are the process's, and another engine here runs without them."""
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.runtime_context import get_flags

    moe = get_flags().moe
    saved = {name: getattr(moe, name) for name in type(moe).__struct_fields__}
    initialize_moe_config()
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(moe, name, value)


@contextlib.contextmanager
def tbo_args(config: EngineConfig) -> Iterator[Any]:
    """The server arguments of a step under two-batch overlap, and the MoE flags."""
    with decode._server_args(config, "triton", **SERVER_ARGS) as args, moe_flags():
        yield args


def declines(case: Case) -> str | None:
    """Why ``case``'s config is not run under two-batch overlap, else None:

    - no decode graph batch size is left (``runner_step.graph_batch_sizes`` under the
      alignment of 2 two-batch overlap sets):
      ``get_batch_sizes_to_capture`` asserts one is, and SGLang does not start;
    - one is above ``max_num_seqs`` (an odd ``max_running_requests`` rounded up): the
      capture of it overflows the Triton backend's graph buffers, which are sized by the
      request pool (``triton_backend.py``: ``max_bs = req_to_token_pool.size``; the
      FlashInfer backend sizes its own by ``get_cuda_graph_max_batch_size``, rounded up
      alike). The engine fails to start; seen here with attnfuzz's model runner, whose
      request pool is ``max_num_seqs`` rows as SGLang's is, and not yet triaged against a
      real launch, so it is declined, not reported."""
    config = case.config
    if config.cudagraph_mode == "NONE":
        return None
    sizes = decode.graph_batch_sizes(config, alignment=2)
    if not sizes:
        return (
            "no decode graph batch size two-batch overlap can split (even, at most "
            "max_running_requests rounded up): get_batch_sizes_to_capture asserts one, "
            "SGLang does not start"
        )
    if sizes[-1] > config.max_num_seqs:
        return (
            f"decode graph of {sizes[-1]} requests above max_num_seqs {config.max_num_seqs} "
            "(rounded up to even under two-batch overlap): its capture overflows the Triton "
            "backend's graph buffers, sized by the request pool (not yet triaged)"
        )
    return None


def query_offsets(mode: str, batch_size: int, next_n: int, extend_lens: Any = None) -> np.ndarray:
    """Where each request's query starts in a forward's tokens: one token a request for a
    decode, ``next_n`` for a verify, an extend's own lengths."""
    if mode == "extend":
        return np.concatenate([[0], np.cumsum(np.asarray(extend_lens, dtype=np.int64))])
    width = next_n if mode == "verify" else 1
    return np.arange(batch_size + 1, dtype=np.int64) * width


class _TboGraph(decode._Graph):
    """The decode graph: a capture records the primary backend's metadata (the graph's
    attention reads it for the whole batch)."""

    def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
        self.graphs[shape_key] = self.runner.attn_backend.primary.forward_metadata


class TboEngine(decode._Engine):
    """One SGLang engine under two-batch overlap: ``TboAttnBackend`` over three Triton
    backends. Its eager step is split by the scheduler's rule into two children."""

    SERVER_ARGS = SERVER_ARGS
    GRAPH = _TboGraph
    WHERE = {
        "eager": f"{_TBO}.init_forward_metadata (the primary's)",
        "fresh": f"{_TBO}.init_forward_metadata (the primary's; a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "the primary's)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (what the graph "
        "reads)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        f"({_TBO}.init_forward_metadata_out_graph, in_capture)",
    }

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        with tbo_args(config):  # the graph runner captures with the flags on
            super().__init__(config, device, graphs)

    def make_backend(self) -> Any:
        from sglang.srt.layers.attention.tbo_backend import TboAttnBackend
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        return TboAttnBackend.init_new(lambda: TritonAttnBackend(self.runner))

    def forward_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        """The step's ForwardBatch, split as the scheduler splits it on one rank
        (``TboDPAttentionPreparer``), its children made (``TboForwardBatchPreparer``)."""
        from sglang.srt.batch_overlap.two_batch_overlap import (
            TboDPAttentionPreparer,
            TboForwardBatchPreparer,
        )
        from sglang.srt.managers.scheduler_components.dp_attn import (
            _local_decode_cuda_graph_vote,
        )
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        fb = super().forward_batch(inputs, mode)
        self.step_offsets = query_offsets(
            mode, inputs.num_reqs, self.config.next_n, list(inputs.query_lens)
        )
        # The rank's ScheduleBatch, as far as the preparer reads it. A verify is a decode
        # there (schedule_batch.py: prepare_for_decode sets DECODE; the speculative worker
        # makes the verify's batch after the scheduler's sync).
        local = _engine.StandIn(
            forward_mode=ForwardMode.EXTEND if mode == "extend" else ForwardMode.DECODE,
            batch_size=lambda: fb.batch_size,
            spec_info=fb.spec_info,
            extend_num_tokens=fb.extend_num_tokens,
            extend_lens=fb.extend_seq_lens_cpu,
            is_extend_in_batch=mode == "extend",
        )
        preparer = TboDPAttentionPreparer()
        can_run, forward_mode = preparer.prepare_all_gather(local)
        # One rank: the gathered (can_run_tbo, forward_mode) columns are its own.
        split, global_mode = preparer.compute_output(torch.tensor([[int(can_run), forward_mode]]))
        fb.tbo_split_seq_index, fb.global_forward_mode = split, global_mode
        # The rank's vote for the decode graph (one rank: the gathered minimum is its own),
        # which the graph runner asks for under the MLP sync two-batch overlap implies.
        fb.can_run_decode_cuda_graph = _local_decode_cuda_graph_vote(
            local_batch=local, disable_cuda_graph=self.graph_runner is None
        )
        with forward_context(ForwardContext(attn_backend=self.backend)):
            TboForwardBatchPreparer.prepare(fb)
        self.split_batch = fb
        return fb

    def eager_metadata(self, forward_batch: Any) -> Any:
        return self.backend.primary.forward_metadata

    def persistent_metadata(self, mode: str) -> Any:
        primary = self.backend.primary
        return _engine.StandIn(
            kv_indptr=primary.kv_indptr,
            kv_indices=primary.cuda_graph_kv_indices,
            qo_indptr=primary.qo_indptr if mode == "verify" else None,
        )

    def _fields(
        self, rows: int, tokens: int, inputs_of: dict[str, torch.Tensor], metadata: Any
    ) -> tuple[Field, ...]:
        """The fields of :class:`~attnfuzz.adapters.sglang.runner_step._Engine`, after the
        build's query offsets (what micro-batch agreement cuts a step by)."""
        fields = super()._fields(rows, tokens, inputs_of, metadata)
        qsl = Field("query_start_loc", "offsets", self._query_start_loc(rows, tokens), (0, tokens))
        return (qsl, *fields)

    def _query_start_loc(self, rows: int, tokens: int) -> np.ndarray:
        """The eager step's query offsets (:meth:`forward_batch`); a graph's batch (its
        ``rows`` requests of ``tokens // rows`` tokens each, padding included) its own."""
        step = getattr(self, "step_offsets", None)
        if step is not None and len(step) == rows + 1 and step[-1] == tokens:
            return step
        return np.arange(rows + 1, dtype=np.int64) * (tokens // max(rows, 1))

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> Any:
        self.mode = mode
        build = super().eager(inputs, mode, how)
        if how == "fresh":
            return build
        return [build, *self.eager_microbatches(inputs, mode)]

    def eager_microbatches(self, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        """A ``microbatch`` build of each child of the eager step (copied now)."""
        fb = self.split_batch
        if fb.tbo_children is None:
            return []
        out, first = [], 0
        for child, backend in zip(fb.tbo_children, self.backend.children, strict=True):
            tokens = int(child.out_cache_loc.shape[0])
            if child.batch_size > 0:
                lens = child.extend_seq_lens_cpu if mode == "extend" else None
                offsets = query_offsets(mode, child.batch_size, self.config.next_n, lens)
                # Its real rows end at its last request with a query token: where the
                # two-chunk split's cut lands on a request boundary, the first child ends
                # with that request holding none of its tokens (prepare_raw keeps it), a
                # row that computes nothing.
                real = int(np.flatnonzero(np.diff(offsets))[-1]) + 1 if tokens else 0
                out.append(self._microbatch(child, backend.forward_metadata, offsets, first,
                                            real, tokens, "eager", mode))  # fmt: skip
            first += tokens
        return out

    def _microbatch(
        self, child: Any, metadata: Any, offsets: np.ndarray, first: int,
        real_reqs: int, real_tokens: int, of: str, mode: str,
    ) -> StepBuild:  # fmt: skip
        """A child's build: its batch's fields, its metadata under ``mb.``, its reads."""
        rows, tokens = int(child.batch_size), int(child.out_cache_loc.shape[0])
        acc = self.accepts()
        if mode == "extend":
            # An extend's kernels read req_to_token[row, :seq_len] for the row's queries:
            # a row of no query token (above) reads none, whatever its length, 0 included.
            acc["seq_lens"] = (0, acc["seq_lens"][1])
        own = self.metadata_fields(rows, tokens, metadata)
        fields = (
            Field("query_start_loc", "offsets", offsets[: rows + 1], (0, tokens)),
            Field("seq_lens", "requests", decode.host(child.seq_lens[:rows]), acc["seq_lens"]),
            Field(
                "req_pool_indices",
                "requests",
                decode.host(child.req_pool_indices[:rows]),
                acc["req_pool_indices"],
            ),  # fmt: skip
            Field(
                "out_cache_loc",
                "tokens",
                decode.host(child.out_cache_loc[:tokens]),
                acc["out_cache_loc"],
                writes_kv=True,
            ),  # fmt: skip
            Field(
                "positions", "tokens", decode.host(child.positions[:tokens]), acc["positions"]
            ),  # fmt: skip
            *(Field(f"mb.{f.name}", f.rows, f.values, f.accepts, f.row_lengths) for f in own),
        )
        # The child's reads, from its fields under the names its kernels' reader knows.
        fields += self.kv_fields((*fields[:5], *own), metadata)
        where = f"{_TBO}: child {'a' if first == 0 else 'b'} of the {of} step"
        return StepBuild("microbatch", real_reqs, real_tokens, fields, where=where,
                         first_token=first)  # fmt: skip

    def padded_microbatches(self, graphs: Any, inputs: RunnerStepInputs, mode: str) -> list:
        """A ``microbatch`` build of each child of the padded step, as
        ``_dispatch_children_from_replay_view`` split it (the graph runner's buffers
        sliced, each child's persistent buffers after its replay preparation)."""
        from sglang.srt.batch_overlap.two_batch_overlap import (
            compute_split_indices_for_cuda_graph_replay,
        )

        bs, width = graphs.bs, self.config.next_n if mode == "verify" else 1
        split_seq, split_tok = compute_split_indices_for_cuda_graph_replay(
            forward_mode=graphs.capture_forward_mode, cuda_graph_num_tokens=bs * width,
            spec_info=None if mode != "verify" else _engine.StandIn(draft_token_num=width),
        )  # fmt: skip
        b = graphs.buffers
        R, out = inputs.num_reqs, []
        for backend, seqs, toks in (
            (self.backend.children[0], slice(0, split_seq), slice(0, split_tok)),
            (self.backend.children[1], slice(split_seq, bs), slice(split_tok, bs * width)),
        ):
            n = seqs.stop - seqs.start
            if n == 0:
                continue
            child = _engine.StandIn(
                batch_size=n,
                seq_lens=b.seq_lens[seqs],
                req_pool_indices=b.req_pool_indices[seqs],
                out_cache_loc=b.out_cache_loc[toks],
                positions=b.positions[toks],
            )
            real = max(0, min(R, seqs.stop) - seqs.start)
            offsets = query_offsets(mode, n, self.config.next_n)
            # The child's persistent buffers, which its replay preparation rewrote (its
            # forward_metadata is the capture's view of them: not reassigned at replay).
            persistent = _engine.StandIn(
                kv_indptr=backend.kv_indptr,
                kv_indices=backend.cuda_graph_kv_indices,
                qo_indptr=backend.qo_indptr if mode == "verify" else None,
            )
            out.append(self._microbatch(child, persistent, offsets, toks.start,
                                        real, real * width, "padded", mode))  # fmt: skip
        return out


class TboLife(decode.EngineLife):
    """The engine of ``sglang-tbo``: :class:`TboEngine`, kept across a life's steps."""

    engine_class = TboEngine

    def prepare(self) -> None:
        prepare()

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return tbo_args(config)

    def graph_read(self, engine: Any) -> list[Any]:
        return [engine.backend.primary, *engine.backend.children]

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        builds = super().graph_builds(engine, inputs, mode)
        if not builds:
            return builds
        return builds + engine.padded_microbatches(engine.graph_runner, inputs, mode)


ENGINE = TboLife()
"""The engine of the implementation ``sglang-tbo`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-tbo`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant: the two-chunk split's second child reads its first request's prefix short ----


def _two_chunk_prefix_forgotten(real: Any) -> Any:
    """``derive_fields_related_to_seq_len_for_two_chunk`` with one statement undone: the
    second child's first request (the one the split cuts) keeps the prefix it had in the
    whole batch, not advanced past the first child's share of its query
    (``child_b.extend_prefix_lens_cpu[0] += left_last_seq_token_num`` forgotten)."""
    from sglang.srt.batch_overlap.two_batch_overlap import (
        _update_device_and_sum_field_from_cpu_field,
    )

    def derive(batch: Any, *, child_a: Any, child_b: Any, tbo_split_seq_index: int) -> None:
        real(batch, child_a=child_a, child_b=child_b, tbo_split_seq_index=tbo_split_seq_index)
        child_b.extend_prefix_lens_cpu[0] = batch.extend_prefix_lens_cpu[tbo_split_seq_index]
        _update_device_and_sum_field_from_cpu_field(
            batch=child_b, cpu_field="extend_prefix_lens_cpu",
            device_field="extend_prefix_lens", sum_field=None,
        )  # fmt: skip

    return derive


class _PrefixForgotten(TboEngine):
    def forward_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        from sglang.srt.batch_overlap.two_batch_overlap import TboForwardBatchPreparer

        real = TboForwardBatchPreparer.derive_fields_related_to_seq_len_for_two_chunk
        TboForwardBatchPreparer.derive_fields_related_to_seq_len_for_two_chunk = (
            _two_chunk_prefix_forgotten(real)
        )
        try:
            return super().forward_batch(inputs, mode)
        finally:
            TboForwardBatchPreparer.derive_fields_related_to_seq_len_for_two_chunk = real


class _MutantLife(TboLife):
    engine_class = _PrefixForgotten


PREFIX_FORGOTTEN = _MutantLife()


def run_two_chunk_prefix_forgotten(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-tbo-two-chunk-prefix-forgotten``: :class:`_PrefixForgotten`."""
    return PREFIX_FORGOTTEN(inputs)


run_two_chunk_prefix_forgotten.new_engine = PREFIX_FORGOTTEN.new_engine  # type: ignore[attr-defined]


def _extend_lens(trace: Trace | Case) -> list[list[int]]:
    """The query lengths of each extend step of ``trace`` (as ``step_mode`` runs it)."""
    steps = [make_inputs(case) for case in as_trace(trace).cases()]
    return [list(s.query_lens) for s in steps if decode.step_mode(s) == "extend"]


def reach_extend(trace: Trace | Case) -> bool:
    """An extend: the step two-batch overlap may split inside a request."""
    return bool(_extend_lens(trace))


def trigger_two_chunk_prefix_forgotten(trace: Trace | Case) -> bool:
    """An extend whose split is two-chunk (``_is_two_chunk_split_enabled`` of its query
    lengths, under the engine's flags): one request's query cut between the children."""
    prepare()
    from sglang.srt.batch_overlap.two_batch_overlap import _is_two_chunk_split_enabled

    trace = as_trace(trace)
    with tbo_args(trace.config):
        return any(_is_two_chunk_split_enabled(lens) for lens in _extend_lens(trace))


def smallest_two_chunk_prefix_forgotten() -> Trace:
    """One request of two tokens arriving alone: the balanced split leaves a child empty,
    so the split is two-chunk, a token each."""
    config = EngineConfig(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2,))  # fmt: skip
    arrive = Batch((0,), (2,), 0, True, req_ids=(0,), pages=((1, 2),), new_pages=(2,))
    return Trace(config, (arrive,))
