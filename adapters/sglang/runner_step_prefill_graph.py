"""SGLang's prefill CUDA-graph runner step on the Triton attention backend, as the
implementation ``sglang-prefill-graph`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows and decode graph runner), with SGLang's prefill graphs on: the server
arguments ``--cuda-graph-backend-prefill breakable`` (``arg_groups/cuda_graph_hook.py``:
the default on CUDA, ``cuda_graph_config.py:default_prefill_backend``) and
``--cuda-graph-bs-prefill`` the case's capture sizes, as token counts. Triton is a
backend SGLang captures prefill graphs for (``arg_groups/attention_hook.py`` turns
them off for ``torch_native`` and ``flex_attention`` only).

What runs, unchanged (SGLang 0.5.23), besides the decode step's code:
``model_executor/runner/prefill_cuda_graph_runner.py``: ``PrefillCudaGraphRunner``
whole: ``__init__`` (its buffers ``PrefillInputBuffers.create``,
``build_prefill_registry``, the breakable backend's static request buffers),
``capture`` (``_capture_one_stream``, ``capture_one_shape``, ``capture_prepare``,
``_init_forward_metadata_for_capture``: the backend's ``init_forward_metadata`` of
every capture size's dummy extend), ``can_run_graph`` (``can_replay_locally``: the
padding factor, the largest capture size), and ``load_batch`` (``_pad_to_bucket``,
``CudaGraphBufferRegistry.fill_from``: the padded tokens' reset, ``_shape_key``,
``_prepare_forward_metadata_for_replay``: the backend's ``init_forward_metadata`` of
the step).

Stand-ins: those of the decode step, and the prefill graph backend
(``resolve_prefill_backend``): :class:`_PrefillGraph`, a ``BreakableCudaGraphBackend``
(the runner branches on that type) whose capture records the capture's buffers and
metadata and whose replay does nothing; the model's forward is never called (the
breakable graph's attention runs outside the captured segments, over the metadata
``load_batch`` built). ``execute``'s model body and logits tail are not run.

A step SGLang runs as an extend (:func:`runner_step.step_mode`) whose token count a
captured prefill graph covers (``can_run_graph``) gets the builds of a decode graph
step: ``padded`` (the runner's input buffers after ``load_batch``: positions and
out_cache_loc padded to the capture size, the static request buffers, and the
backend's metadata) and ``replay`` (what the replay reads: the static
ForwardBatch's tensors), beside ``eager`` and ``fresh``; the engine's first step
carries every capture size's ``capture`` build. Any other extend runs eagerly, and
decodes through the decode graph runner as in ``sglang``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.standins import no_collections
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace, as_trace

_RUNNER = "prefill_cuda_graph_runner.py:PrefillCudaGraphRunner"
_WHERE = {
    **decode._WHERE,
    "prefill-padded": f"{_RUNNER}.load_batch (buffers, backend's)",
    "prefill-replay": f"{_RUNNER}.load_batch (the static ForwardBatch the replay reads)",
    "prefill-capture": f"{_RUNNER}.capture_one_shape",
}


def prepare() -> None:
    """Import SGLang's runners and backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.model_executor.runner import prefill_cuda_graph_runner  # noqa: F401


def prefill_sizes(config: EngineConfig) -> list[int]:
    """The prefill graphs' token counts: the case's capture sizes that a capture batch
    can hold (``cuda_graph_setup.py:capture_prefill_graph``: at most the request
    pool's rows of the model's context each); none without CUDA graphs."""
    if config.cudagraph_mode == "NONE":
        return []
    most = config.max_num_seqs * config.max_model_len
    return sorted({s for s in config.cudagraph_capture_sizes if s <= most})


def declines(case: Case) -> str | None:
    """Why SGLang captures no prefill graph for ``case``'s config, else None
    (:func:`declines_config`)."""
    return declines_config(case.config)


def declines_config(config: EngineConfig) -> str | None:
    """Why SGLang never replays a prefill graph on ``config``, else None. A target
    verify is never replayed by it (``PrefillCudaGraphRunner.can_replay_locally``:
    ``is_target_verify``), and an EAGLE target's prefill captures FULL hidden states,
    a speculative engine this step does not build: speculative decoding is declined.
    Without a capture size a capture batch holds, no prefill graph is captured
    (``cuda_graph_setup.py:capture_prefill_graph``)."""
    if config.num_spec:
        return (
            "speculative decoding: the prefill graph runner never replays a target verify "
            "(prefill_cuda_graph_runner.py: PrefillCudaGraphRunner.can_replay_locally)"
        )
    if config.cudagraph_mode != "NONE" and not prefill_sizes(config):
        return (
            "no capture size a capture batch holds (cuda_graph_setup.py: "
            "capture_prefill_graph disables the prefill graph)"
        )
    return None


@contextlib.contextmanager
def _server_args(config: EngineConfig, attention_backend: str = "triton") -> Iterator[Any]:
    """The decode step's server arguments with the prefill graphs on: breakable, at the
    case's capture sizes (tokens)."""
    from sglang.srt.model_executor import cuda_graph_config as graph_config

    default = graph_config.default_cuda_graph_config

    def with_prefill() -> Any:
        graphs = default()
        graphs.prefill.backend = graph_config.Backend.BREAKABLE
        graphs.prefill.bs = prefill_sizes(config) or None
        return graphs

    with (
        mock.patch.object(graph_config, "default_cuda_graph_config", with_prefill),
        decode._server_args(config, attention_backend) as args,
    ):
        yield args


def _prefill_graph_class() -> type:
    from sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend import (
        BreakableCudaGraphBackend,
    )

    class _PrefillGraph(BreakableCudaGraphBackend):
        """The prefill runner's breakable graph backend, where there is no CUDA: a capture
        records its build (``on_capture``), a replay does nothing."""

        on_capture: Any = None

        def __init__(self, cuda_graph_runner: Any, **kwargs: Any) -> None:
            self._cuda_graph_runner = cuda_graph_runner
            self._model_runner = cuda_graph_runner.model_runner
            self.keys: set[Any] = set()

        @contextlib.contextmanager
        def capture_session(self, stream: Any) -> Iterator[None]:
            yield

        def capture_one(self, shape_key: Any, forward_fn: Any, **kwargs: Any) -> None:
            self.keys.add(shape_key)
            if self.on_capture is not None:
                self.on_capture(shape_key)

        def can_run(self, forward_batch: Any, shape_key: Any) -> bool:
            return shape_key in self.keys

        @contextlib.contextmanager
        def replay_session(self) -> Iterator[None]:
            yield

        def cleanup(self) -> None:
            self.keys.clear()

    return _PrefillGraph


def _dummy_batch(forward_batch: Any) -> Any:
    """``ModelRunner.prepare_dummy_forward_batch`` on one attention-TP rank."""
    forward_batch.attn_tp_sequence_sharded = False
    return forward_batch


class PrefillGraphEngine(decode._Engine):
    """The ``sglang`` engine with its prefill graph runner (``prefill_graphs``), built
    with the decode graph runner as ``cuda_graph_setup.py`` builds both."""

    WHERE = _WHERE

    prefill_graphs: Any = None

    def _graph_runner(self) -> Any:
        """The prefill graph runner, then the decode one (``cuda_graph_setup.py``:
        prefill before decode), over the process-wide input-buffer pool
        (``input_buffers.py:share_input_buffer``) of a new process: a new engine's runners
        share their buffers with each other, never with an earlier engine's."""
        from sglang.srt.model_executor import input_buffers

        input_buffers._forward_input_buffer_pool.clear()
        if prefill_sizes(self.config):
            self.prefill_graphs = self._prefill_runner()
        return super()._graph_runner()

    def _prefill_runner(self) -> Any:
        """``PrefillCudaGraphRunner(model_runner)``, each capture size recorded."""
        from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as module

        engine, graph = self, _prefill_graph_class()

        class _Recording(graph):  # type: ignore[valid-type,misc]
            def on_capture(self, shape_key: Any) -> None:
                engine.captures.append(engine._prefill_capture(self._cuda_graph_runner, shape_key))

        @contextlib.contextmanager
        def graph_capture(stream: Any = None) -> Iterator[Any]:
            yield _engine.StandIn(stream=stream)

        group = _engine.StandIn(ca_comm=None, world_size=1, rank_in_group=0, barrier=lambda: None)
        self._prefill_model_runner()
        with (
            mock.patch.object(module, "resolve_prefill_backend", _Recording),
            mock.patch.object(module, "graph_capture", graph_capture),
            mock.patch.object(module, "get_or_create_global_graph_capture_stream", lambda: None),
            module.get_parallel().override(tp_group=group),
            no_collections(),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            return module.PrefillCudaGraphRunner(self.runner)

    def _prefill_model_runner(self) -> None:
        """What the prefill runner reads of the model runner besides the decode runner's:
        a text-only generation model of one pipeline rank, its layer stack empty (the
        breakable graph's body is never run)."""
        runner = self.runner
        runner.model_config.is_multimodal = False
        runner.is_generation = True
        runner.pp_group = _engine.StandIn(is_first_rank=True, is_last_rank=True)
        runner.attention_layers, runner.mha_companion_layers = [], []
        runner.moe_layers, runner.moe_fusions = [], []
        runner.model.model = _engine.StandIn(layers=[], forward=decode._never_called)
        # The decode runner's shared logits buffer holds no prefill rows: a prefill graph's
        # logits are the eager tail's (_next_token_logits_buffer None), never read here.
        runner.graph_shared_output.max_rows = 0
        # ModelRunner.prepare_dummy_forward_batch: the SP flag of a dummy batch, never set
        # on one rank.
        runner.prepare_dummy_forward_batch = _dummy_batch

    def _prefill_capture(self, runner: Any, shape_key: Any) -> StepBuild:
        """A capture size's build: ``capture_prepare``'s dummy extend (the static request
        buffers of its requests, the token slots) and the metadata built for it."""
        tokens = shape_key.size
        rows = -(-tokens // self.runner.model_config.context_len)
        return self._prefill_build("capture", runner, rows, tokens, 0, 0)

    def _prefill_build(
        self, how: str, runner: Any, rows: int, tokens: int, num_reqs: int, num_tokens: int
    ) -> StepBuild:
        static = runner._prefill_static_buffers
        registry = runner.buffer_registry
        inputs_of = {
            "seq_lens": static["seq_lens"],
            "req_pool_indices": static["req_pool_indices"],
            "out_cache_loc": registry.get_slot("out_cache_loc").buffer,
            "positions": registry.get_slot("positions").buffer,
        }
        fields = self._fields(rows, tokens, inputs_of, self.backend.forward_metadata)
        return StepBuild(how, num_reqs, num_tokens, fields, where=self.WHERE[f"prefill-{how}"])


class PrefillGraphLife(decode.EngineLife):
    """:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife` of
    :class:`PrefillGraphEngine`: an extend a prefill graph covers is loaded into it."""

    engine_class: type[PrefillGraphEngine] = PrefillGraphEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> Any:
        with _server_args(config):
            return self.engine_class(config, device, graphs=graphs)

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        if mode != "extend":
            return super().graph_builds(engine, inputs, mode)
        graphs = engine.prefill_graphs
        fb = engine.forward_batch(inputs, mode)
        if graphs is None or not graphs.can_run_graph(fb):
            return []
        static, _ = graphs.load_batch(fb)
        R, T = inputs.num_reqs, inputs.num_tokens
        padded = len(static.input_ids)
        inputs_of = {
            "seq_lens": static.seq_lens,
            "req_pool_indices": static.req_pool_indices,
            "out_cache_loc": static.out_cache_loc,
            "positions": static.positions,
        }
        replay = engine._fields(R, padded, inputs_of, engine.backend.forward_metadata)
        return [
            engine._prefill_build("padded", graphs, R, padded, R, T),
            StepBuild("replay", R, T, replay, where=engine.WHERE["prefill-replay"]),
        ]

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return _server_args(config, attention_backend)

    def graph_serves(self, engine: Any, mode: str) -> bool:
        """An extend too, where the engine has prefill graphs (``can_run_graph`` decides)."""
        if mode == "extend":
            return engine.prefill_graphs is not None
        return super().graph_serves(engine, mode)


ENGINE = PrefillGraphLife()
"""The engine of the implementation ``sglang-prefill-graph``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-prefill-graph``: the step on :data:`ENGINE`."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: the padded tokens' KV slot a sentinel SGLang's KV write does not skip --------------


class _PaddingSlotSentinel(PrefillGraphEngine):
    """The prefill registry's ``out_cache_loc`` slot padded with -1 (``FILL_SENTINEL``,
    vLLM's ``PAD_SLOT_ID``) instead of SGLang's ``ZERO`` (``cuda_graph_buffer_registry.py``:
    ``build_prefill_registry``, the padding slot 0): SGLang's KV write takes no sentinel
    (``memory_pool.py:MHATokenToKVPool.set_kv_buffer`` stores every token's key at its
    ``loc``, which its ``maybe_detect_oob`` bounds to ``[0, size + page_size)``), so a
    padding token's key is stored outside the pool."""

    def _prefill_runner(self) -> Any:
        from sglang.srt.model_executor.cuda_graph_buffer_registry import PaddingPolicy

        runner = super()._prefill_runner()
        slot = runner.buffer_registry.get_slot("out_cache_loc")
        slot.padding_policy, slot.pad_value = PaddingPolicy.FILL_SENTINEL, -1
        return runner


class _MutantLife(PrefillGraphLife):
    def __init__(self, engine: type[PrefillGraphEngine]) -> None:
        self.engine_class = engine
        super().__init__()


PADDING_SLOT_SENTINEL = _MutantLife(_PaddingSlotSentinel)


def run_padding_slot_sentinel(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-prefill-graph-padding-slot-sentinel``:
    :class:`_PaddingSlotSentinel`."""
    return PADDING_SLOT_SENTINEL(inputs)


run_padding_slot_sentinel.new_engine = PADDING_SLOT_SENTINEL.new_engine  # type: ignore[attr-defined]


def padded_prefill(inputs: RunnerStepInputs) -> bool:
    """Whether the prefill graph replays the step with padding tokens: an extend
    (:func:`runner_step.step_mode`) of no more tokens than the largest capture size,
    whose capture size (``_pad_to_bucket``) is above its token count and at most twice
    it (``can_replay_locally``: ``_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR``)."""
    sizes, T = prefill_sizes(inputs.config), inputs.num_tokens
    if inputs.config.num_spec or decode.step_mode(inputs) != "extend" or not T:
        return False
    bucket = min((s for s in sizes if s >= T), default=None)
    return bucket is not None and T < bucket <= 2 * T


def reach_padded_prefill(trace: Trace | Case) -> bool:
    """A step of ``trace`` (a case: a trace of one step) the prefill graph replays with
    padding tokens (:func:`padded_prefill`)."""
    trace = as_trace(trace)
    return any(padded_prefill(decode.make_inputs(c)) for c in trace.cases())


def smallest_padding_slot_sentinel() -> Trace:
    """One request arrives with 3 tokens: its extend padded to the graph of 4, one
    padding token."""
    config = EngineConfig(max_model_len=4, max_num_seqs=1, max_num_batched_tokens=4,
                          block_size=1, cudagraph_capture_sizes=(4,))  # fmt: skip
    arrive = Batch((0,), (3,), 0, True, req_ids=(0,), pages=((1, 2, 3),), new_pages=(3,))
    return Trace(config, (arrive,))


# -- mutant: the padded tokens' KV slots kept from the previous replay -----------------------


class _StalePaddingSlots(PrefillGraphEngine):
    """The prefill registry's ``out_cache_loc`` slot copied head only, its padded tail
    kept from the previous replay (``PaddingPolicy.FOREACH_COPY``) instead of reset to
    SGLang's padding slot 0 (``ZERO``, ``cuda_graph_buffer_registry.py``:
    ``build_prefill_registry``): a padding token's slot is a real token's of an earlier
    extend, in range, and the padded forward's KV write (``set_kv_buffer``, which skips
    no token) stores the padding token's key over that request's cached one."""

    def _prefill_runner(self) -> Any:
        from sglang.srt.model_executor.cuda_graph_buffer_registry import PaddingPolicy

        runner = super()._prefill_runner()
        runner.buffer_registry.get_slot("out_cache_loc").padding_policy = PaddingPolicy.FOREACH_COPY
        return runner


STALE_PADDING_SLOTS = _MutantLife(_StalePaddingSlots)


def run_stale_padding_slots(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-prefill-graph-stale-padding-slots``: :class:`_StalePaddingSlots`."""
    return STALE_PADDING_SLOTS(inputs)


run_stale_padding_slots.new_engine = STALE_PADDING_SLOTS.new_engine  # type: ignore[attr-defined]


def replays_prefill(inputs: RunnerStepInputs) -> int:
    """The capture size the prefill graph replays the step at (``_pad_to_bucket``), else 0:
    an extend of no more tokens than the largest capture size, padded at most twofold
    (``can_replay_locally``)."""
    sizes, T = prefill_sizes(inputs.config), inputs.num_tokens
    if inputs.config.num_spec or decode.step_mode(inputs) != "extend" or not T:
        return 0
    bucket = min((s for s in sizes if s >= T), default=0)
    return bucket if bucket <= 2 * T else 0


def trigger_stale_padding_slots(trace: Trace | Case) -> bool:
    """A padded prefill replay of ``trace`` whose padding tokens' slots, as the earlier
    prefill replays left the buffer (slot 0 before any), include one a real request of
    the step reads: a key of its own (SGLang's pages: a request's pages kept while it
    runs, new ones when it arrives or resumes)."""
    trace = as_trace(trace)
    pages: dict[int, list[int]] = {}
    left: list[int] = []  # the prefill buffer's out_cache_loc, as the last replay left it
    for case in trace.cases():
        inputs = decode.make_inputs(case)
        bs = inputs.config.block_size
        for r, new, gained in zip(inputs.req_ids, inputs.is_new, inputs.new_block_ids,
                                  strict=True):  # fmt: skip
            pages[r] = [*([] if new else pages.get(r, [])), *gained]
        bucket = replays_prefill(inputs)
        if not bucket:
            continue
        step = list(zip(inputs.req_ids, inputs.num_computed_tokens, inputs.query_lens,
                        strict=True))  # fmt: skip
        T = inputs.num_tokens
        read = {s for r, c, q in step for s in _slots(pages[r], bs, 0, c + q)}
        if T < bucket and read & set(left[T:bucket]):
            return True
        left = [s for r, c, q in step for s in _slots(pages[r], bs, c, c + q)] + left[T:]
    return False


def _slots(pages: list[int], block_size: int, start: int, stop: int) -> list[int]:
    """The KV slots of keys ``start`` to ``stop`` of a request of ``pages``
    (:meth:`~attnfuzz.adapters.sglang.runner_step._Engine.slots`)."""
    return [pages[p // block_size] * block_size + p % block_size for p in range(start, stop)]


def reach_stale_padding_slots(trace: Trace | Case) -> bool:
    """A padded prefill replay after an earlier one of more tokens (whose slots the
    padding tokens could keep)."""
    trace = as_trace(trace)
    most = 0
    for case in trace.cases():
        inputs = decode.make_inputs(case)
        bucket = replays_prefill(inputs)
        if bucket and inputs.num_tokens < bucket and most > inputs.num_tokens:
            return True
        if bucket:
            most = max(most, inputs.num_tokens)
    return False


def smallest_stale_padding_slots() -> Trace:
    """One request arrives with 4 tokens (the graph of 4, no padding), then extends by 2
    more: the graph of 4 again, its 2 padding tokens keeping the first replay's slots 3
    and 4, keys the request reads."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=4,
                          block_size=1, cudagraph_capture_sizes=(4,))  # fmt: skip
    arrive = Batch((0,), (4,), 0, True, req_ids=(0,), pages=((1, 2, 3, 4),), new_pages=(4,))
    extend = Batch((4,), (2,), 0, True, req_ids=(0,), pages=((1, 2, 3, 4, 5, 6),),
                   new_pages=(2,))  # fmt: skip
    return Trace(config, (arrive, extend))
