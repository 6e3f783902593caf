"""vLLM's model runner V2 step, whole, as the implementation ``vllm`` of ``runner-step``.

From one scheduler output, vLLM 0.33.0's ``GPUModelRunner.execute_model``
(``vllm/v1/worker/gpu/model_runner.py``) runs unchanged up to the model forward, on a
runner vLLM's own code builds, and the runner decides the step's padding and graph
itself. What runs unchanged:

- ``GPUModelRunner`` built as the worker builds it (:class:`_Engine`): ``__init__``
  (``RequestState``, ``InputBuffers``, ``init_speculator``, the LoRA state, the
  draft tokens handler), ``load_model`` (``init_model_state``, the ``Sampler``, the
  ``RejectionSampler``, the prompt logprobs and structured outputs workers, the
  speculator's ``load_model``), the worker's start-up ``profile_cudagraph_memory``
  over a minimal KV cache where the mode captures graphs (:meth:`_Engine.profile`),
  ``initialize_kv_cache`` with the worker's
  ``KVCacheConfig`` (:func:`kv_cache_config`: ``init_attn_backend`` with its kernel
  block sizes and builders, ``BlockTables``, ``resolve_cudagraph_mode_and_sizes``,
  ``ModelCudaGraphManager``, the speculator's ``set_attn`` and
  ``init_cudagraph_manager``, the model state's ``initialize_kv_cache``), the worker's
  kernel warm-up ``warmup_kernels`` (``v1/worker/gpu/warmup.py``: steps of its own
  requests through ``execute_model`` and ``sample_tokens``, then finished, leaving the
  runner's buffers as a served engine's first step finds them; :meth:`_Engine.warm_up`)
  and ``capture_model`` (the target's graphs, then the speculator's);
- ``GPUModelRunner``: ``execute_model`` (``update_pp_decode_requests``,
  ``finish_requests``, ``free_states``, ``add_requests``, ``update_requests``,
  ``gather_batch_req_state``, ``prepare_inputs``, ``prepare_attn``,
  ``prepare_dummy_attn``, ``_dummy_run``), then ``sample_tokens(None)`` between two
  steps (``sample``, ``postprocess_sampled``, the speculator's ``propose``);
- the samplers ``load_model`` makes (``vllm/v1/worker/gpu/sample/``,
  ``spec_decode/rejection_sampler.py``): the ``Sampler`` (every request greedy:
  ``SamplingParams(temperature=0)``), the ``RejectionSampler`` verifying the step's
  drafts (``gather_draft_sampled``, ``rejection_sample`` and its Triton kernels,
  ``get_num_sampled_and_rejected``), the prompt logprobs worker;
- ``vllm/v1/worker/gpu/dp_utils.py``: ``dispatch_cg_and_sync_dp`` and
  ``sync_cudagraph_and_dp_padding`` (the data-parallel padding decision);
- ``vllm/v1/worker/gpu/cudagraph_utils.py``: ``ModelCudaGraphManager.__init__``
  (its candidates from the config's capture sizes and mode), ``dispatch``,
  ``capture`` (with ``prepare_inputs_to_capture``, ``InputBatch.make_dummy``,
  ``BlockTables.get_dummy_block_tables`` / ``get_dummy_slot_mappings``) and
  ``run_fullgraph``;
- ``vllm/v1/worker/gpu/model_states/default.py``: ``DefaultModelState.prepare_attn``
  and ``attn_utils.build_attn_metadata``, into the Triton attention backend's own
  ``TritonAttentionMetadataBuilder`` (``build``, ``build_for_cudagraph_capture``:
  the builder a CPU-only vLLM runs);
- ``RequestState``, ``BlockTables``, ``InputBuffers`` and their kernels (under the
  Triton interpreter here); ``set_forward_context``;
- the speculator (next_n > 1, pages a multiple of 16): ``MTPSpeculator`` made, attached,
  captured and proposing after each step as the runner does (:mod:`.runner_step_speculator`
  says what of it runs and what is stood in); the engine's ``speculator`` names the
  speculative config that makes another (``StandaloneARSpeculator``:
  :mod:`.runner_step_standalone_ar`; ``MultiModuleMTPSpeculator``:
  :mod:`.runner_step_mtp_modules`).

Stood in, and only where a model, a GPU graph or a collective is needed:

- the model: a module that records what it is handed (the forward context's
  attention metadata, the positions) and returns zero hidden states, which the model
  loader ``load_model`` calls returns; its attention layer, which the model's
  construction registers in the static forward context (:func:`_attention_layer`);
- what the runner's construction needs of a GPU or of the worker (:func:`_cpu_runner`:
  CUDA streams and events, the KV cache tensors, the accelerator's memory queries,
  the workspace lock, the pipeline-parallel group) and ``RequestState``'s rows
  (:func:`_rows`);
- pages Triton's kernels do not take (not a multiple of 16): the attention layer's
  backend a subclass of Triton's that declares them (:func:`_any_page_triton`), and
  no speculator (its ``set_attn`` would refuse the draft layer's pages:
  :class:`_HeldDrafts`);
- CUDA graphs: ``torch.cuda.CUDAGraph`` / ``torch.cuda.graph`` in
  ``cudagraph_utils``, a graph that remembers what the forward it "captured" read
  (the capture's metadata: views of the persistent buffers) and whose ``replay``
  computes nothing, only records those views as the replay leaves them; the graph
  pool, ``graph_capture`` and the capture stream; ``get_pp_group`` (one rank);
- the data-parallel all-reduce (``get_dp_group().cpu_all_reduce_``): a second rank
  whose column is filled by its own ``dispatch_cg_and_sync_dp`` call
  (:mod:`.runner_modes`); the peer's batch is derived from the step (:func:`_peer`);
- the target's logits (``compute_logits``): ``sample_tokens`` runs between two steps,
  so it runs before the next one, and the logits are chosen (:func:`_verdict`, a
  vocabulary of two tokens) so that the greedy rejection sampler accepts exactly the
  drafts the next step's computed tokens say were accepted (the trace's scheduler
  decides; a count no sampler could give is refused); ``AsyncOutput`` (the copy of the
  sampled tokens to the host on a CUDA stream) and the draft tokens handler's copy
  stream. A request's row of tokens holds ``next_n`` more than ``max_model_len``: the
  trace's scheduler runs a request up to the model's length, vLLM's one token short
  of it (room for the token sampled after), so the tokens sampled then land in the row.
  Where the speculator is not made (a block size Triton's drafter kernels do not take,
  which vLLM would refuse), a stand-in proposing token 0 (:class:`_HeldDrafts`).

Builds of one step (``reference/runner_step.py``), each from its own engine object:

- ``padded``: the engine of the config's graph mode, with a data-parallel peer,
  as ``execute_model`` dispatched and padded it (``ExecuteModelState``);
- ``replay``: on a FULL dispatch, what the replayed graph reads;
- ``capture``: every forward of ``capture`` (the engine's start, each capture
  size of the config);
- ``dummy``: each step, before it, a dummy run (``_dummy_run`` as
  ``Worker.execute_dummy_batch`` calls it) of this rank idle while the peer runs
  the step, its ``live`` rows the eager build's requests not new to the step;
- ``eager``: the same steps on an engine of cudagraph mode NONE, one rank;
- ``fresh``: a new engine of mode NONE, its requests added as new in warm-up steps,
  then the same scheduler output;
- each engine's speculator's sub-steps of the proposal after the last step (the draft
  prefill, ``draft`` 0, then each draft decode), as that engine's build (``eager``,
  ``padded``, ``fresh``) with ``draft`` set, a replayed draft graph's as ``replay``;
  the draft forwards of its capture as ``capture``, of its dummy runs as ``dummy``.

The engine's attention backend is Triton's, whose builder runs on the CPU: its
``AttentionCGSupport`` (ALWAYS, ``get_attn_cg_support``) and
``CompilationConfig.resolve_cudagraph_mode_and_sizes`` decide the mode as
``initialize_kv_cache`` does (the case's ``cg_support`` names another backend's, and is
not this engine's); the tiny DeepSeek-V3.2 model makes vLLM turn breakable piecewise
graphs on (``VllmConfig._maybe_enable_breakable_cudagraph``). A running request's query
past its one token is its drafts (``scheduled_spec_decode_tokens``) up to ``num_spec``,
else a prefill chunk; its prompt is what it knew on arrival (the scheduler output alone
does not say more).

Declined: the V1 runner, and varlen decode graphs. They come with adaptive
verification, which any speculator of 0.33.0 turns on (without a confidence head its
online acceptance estimator stands in). Its manager admits each request's drafts on
the device, by cost curves timed during the capture runs (``set_cost_curves`` could fix
them) and by the drafter's confidences. Not driven yet: the trace's scheduler would
have to draw the admitted drafts, and the eager and fresh engines (no graphs, so no
adaptive verification) be handed the step with only those.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any
from unittest import mock

import attnfuzz.kernels._triton  # noqa: F401  (TRITON_INTERPRET before vLLM's kernels are defined)
import numpy as np
import torch
from attnfuzz.adapters.standins import no_collections
from attnfuzz.adapters.vllm import _engine
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm.lookahead import Lookahead, num_lookahead_tokens
from attnfuzz.adapters.vllm.lookahead import declines as lookahead_declines
from attnfuzz.adapters.vllm.slot_mapping import host_memory
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import (
    NO_REAL_ROWS,
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.traces import data_parallel_peer, held_through_dummy

_LAYER = "model.layers.0.self_attn.attn"  # the one attention layer of the KV-cache group
PAD_SLOT_ID = -1  # vllm/v1/attention/backends/utils.py


def prepare() -> None:
    """Import vLLM's runner before a judge forks."""
    _engine.prepare()
    import vllm.v1.attention.backends.triton_attn  # noqa: F401
    import vllm.v1.worker.gpu.model_runner  # noqa: F401
    import vllm.v1.worker.gpu.spec_decode.mtp.speculator  # noqa: F401


def declines(case: Case, lookahead: Lookahead = num_lookahead_tokens) -> str | None:
    """Why this adapter does not run ``case``'s engine (whose drafter reserves
    ``lookahead`` tokens), else None; a capture size past a block-table row's reach is
    ``vllm-dummy-past-row``'s (a finding kept apart)."""
    from attnfuzz.adapters.vllm.plugin import capture_past_row

    if capture_past_row(case.config):
        return (
            "a capture size past a block-table row's reach: the capture's dummy request "
            "outgrows its row (kept apart as vllm-dummy-past-row)"
        )
    return warm_up_without_requests(case.config) or declines_engine(case, lookahead)


def reach_without_drafts(trace: Trace | Case) -> bool:
    """An engine of a V2 runner with no drafts: what the implementations that decline
    drafts (``vllm-mrope``, ``vllm-prompt-embeds``, ``vllm-prompt-logprobs``) run."""
    return trace.config.runner == "v2" and trace.config.num_spec == 0


def smallest_config() -> EngineConfig:
    """The engine of those implementations' smallest traces: two sequences, pages of 16,
    one capture size of 2 tokens in mode FULL_AND_PIECEWISE, no drafts."""
    return EngineConfig(
        max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2,), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v2",
    )  # fmt: skip


def warm_up_without_requests(config: EngineConfig) -> str | None:
    """The V2 worker's kernel warm-up of an engine of ``config`` runs none of its
    requests and then decodes its request 0 (``plugin.warm_up_without_requests``): an
    IndexError at vLLM 0.33.0's start-up, kept apart as ``vllm-warmup-no-requests``."""
    from attnfuzz.adapters.vllm.plugin import warm_up_without_requests as without

    if not without(config):
        return None
    return (
        f"the start-up warm-up's requests of {config.next_n + 1} prompt tokens exceed the "
        f"{config.max_num_batched_tokens}-token budget, so it runs none and then decodes "
        f"its request 0 (v1/worker/gpu/warmup.py _warmup_kernels: IndexError; kept apart "
        f"as vllm-warmup-no-requests)"
    )


def declines_engine(case: Case, lookahead: Lookahead = num_lookahead_tokens) -> str | None:
    """Why the installed engine runs ``case`` through other code than this adapter's, or
    its step lacks the pages of the drafter's ``lookahead`` (:func:`.lookahead.declines`)."""
    if case.config.runner != "v2":
        return "the V1 model runner has another execute_model (gpu_model_runner.py)"
    if case.config.varlen_decode:
        return (
            "varlen decode graphs come with adaptive verification, whose draft budget "
            "follows cost curves timed at capture (gpu/spec_decode/adaptive_verification.py: "
            "AdaptiveVerificationManager.get_num_tokens): not driven by this adapter"
        )
    return lookahead_declines(case, lookahead(case.config))


# -- stand-ins -----------------------------------------------------------------------------


class _Standin:
    """An object of which the runner reads only the attributes set: a read of any other
    raises here, in attnfuzz (the release reads what the adapter does not model)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"{type(self).__name__} (attnfuzz's stand-in in adapters/vllm/runner_step.py) has "
            f"no {name!r}: the installed vLLM's runner reads what the adapter does not model"
        )


@dataclass
class _Seen:
    """What one forward read: the attention metadata of the layer, the positions,
    and the runner's input batch where the runner kept it."""

    meta: Any
    positions: torch.Tensor
    batch: Any = None
    linear: Any = None  # a second KV-cache group's metadata (a hybrid model's state layer)
    pages: int | None = None  # the KV cache's pages when it ran (None: the engine's)
    # An M-RoPE model's positions, a row a channel, where the model is handed those in
    # place of ``positions`` (:mod:`.runner_step_mrope`); None: it is handed those.
    channels: torch.Tensor | None = None
    # The embeddings the model is handed in place of token ids (``inputs_embeds``, a
    # view of the model state's persistent buffer), where it is (:mod:`.runner_step_prompt_embeds`).
    embeds: torch.Tensor | None = None

    def frozen(self) -> _Seen:
        """What the forward reads now: the persistent buffers change after it."""
        names = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
        meta = SimpleNamespace(**{n: getattr(self.meta, n).clone() for n in names})
        linear = None
        if self.linear is not None:
            linear = SimpleNamespace(
                **{
                    k: v.clone() if isinstance(v, torch.Tensor) else v
                    for k, v in vars(self.linear).items()
                }
            )
        channels = None if self.channels is None else self.channels.clone()
        embeds = None if self.embeds is None else self.embeds.clone()
        return _Seen(meta, self.positions.clone(), linear=linear, pages=self.pages,
                     channels=channels, embeds=embeds)  # fmt: skip


@dataclass
class _Recorder:
    """Where the model and the graphs report what they read (``kind``: the build it
    belongs to; None: nobody listens)."""

    kind: str | None = None
    where: str = ""  # the engine function whose forward it is
    seen: list[tuple[str, str, _Seen]] = field(default_factory=list)
    capturing: Any = None  # the graph being captured, which keeps what the forward read
    # The speculator's forwards of a proposal: (build, draft sub-step, what it read).
    drafted: list[tuple[str, int, _Seen]] = field(default_factory=list)
    draft: int | None = None  # the next draft sub-step while the speculator proposes
    speculator_where: str = speculating.WHERE  # the speculator's class, in vLLM
    replaying: bool = False  # a draft graph replays (its forwards are the replay's)
    linear_layer: str | None = None  # the target's layer of a second KV-cache group
    # The pages of the KV cache the runner holds now: the worker's, or the minimal one
    # of its start-up profiling (None: the engine's).
    kv_pages: Callable[[], int | None] = lambda: None

    def new_graph(self) -> _Graph:
        """A stood-in CUDA graph that reports here (``torch.cuda.CUDAGraph()``)."""
        return _Graph(self)

    def handed(self, positions: torch.Tensor, layer: str = _LAYER) -> _Seen:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        if not metadata:
            return _Seen(None, positions)
        linear = None
        if layer == _LAYER and self.linear_layer is not None:
            linear = metadata[self.linear_layer]
        return _Seen(metadata[layer], positions, linear=linear, pages=self.kv_pages())

    def forward(self, positions: torch.Tensor) -> None:
        seen = self.handed(positions)
        if self.capturing is not None:
            self.capturing.read = seen
        if self.kind in NO_REAL_ROWS:  # a step's own build is its ExecuteModelState
            self.seen.append((self.kind, self.where, seen.frozen()))

    def draft_forward(self, positions: torch.Tensor) -> None:
        """What a draft forward read: a sub-step of a proposal, else a capture's or a
        dummy run's."""
        if self.kind is None:
            return
        seen = self.handed(positions, speculating.DRAFT_LAYER).frozen()
        if self.draft is None:
            if self.kind in NO_REAL_ROWS:
                where = f"{self.speculator_where} ({self.where})"
                self.seen.append((self.kind, where, seen))
            return
        self.drafted.append(("replay" if self.replaying else self.kind, self.draft, seen))
        self.draft += 1


class _Model(torch.nn.Module):
    """The model: reports what it is handed and returns zero hidden states."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder
        self.logits: torch.Tensor | None = None  # the next sample's, set by _sample

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> torch.Tensor:
        self.recorder.forward(positions)
        return torch.zeros(positions.shape[0], 1)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The logits :func:`_sample` chose for the step's logits rows, once."""
        logits, self.logits = self.logits, None
        if logits is None or logits.shape[0] != hidden_states.shape[0]:
            raise RuntimeError("attnfuzz: the runner sampled rows the adapter chose no logits for")
        return logits


class _Graph:
    """A CUDA graph whose capture keeps what the captured forward read and whose replay
    computes nothing: it reports those reads (views of the persistent buffers) as the
    runner's replay preparation left them."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder
        self.read: _Seen | None = None
        self.rerun: Any = None  # a draft graph's captured speculator function

    def replay(self) -> None:
        if self.rerun is not None:
            # A draft graph holds the metadata updates of its loop: run them again.
            self.recorder.replaying = True
            try:
                self.rerun()
            finally:
                self.recorder.replaying = False
            return
        if self.read is None:
            raise RuntimeError("attnfuzz: a graph replayed that captured no forward")
        if self.recorder.kind is not None:
            kind = "replay" if self.recorder.kind == "step" else self.recorder.kind
            where = f"cudagraph_utils.py: CudaGraphManager.run_fullgraph ({self.recorder.where})"
            self.recorder.seen.append((kind, where, self.read.frozen()))


@contextlib.contextmanager
def _graphs(recorder: _Recorder) -> Iterator[None]:
    """``cudagraph_utils``' CUDA graphs, pool, streams and capture context, stood in."""
    import vllm.v1.worker.gpu.cudagraph_utils as cg

    @contextlib.contextmanager
    def graph(g: _Graph, pool: Any = None, stream: Any = None) -> Iterator[None]:
        recorder.capturing = g
        try:
            yield
        finally:
            recorder.capturing = None

    class Breakable:
        """``BreakableCUDAGraphWrapper``: a piecewise graph whose captured pieces do
        nothing; the model runs (what its breaks run eagerly, attention, reads)."""

        _all_instances: list[Any] = []  # their pools, which profiling swaps: none here

        def __init__(self, model: Any, vllm_config: Any, key_fn: Any = None) -> None:
            self.model = model

        @staticmethod
        def clear_all_graphs() -> None:
            return None

        def __call__(self, **inputs: Any) -> Any:
            return self.model(**inputs)

    cuda = SimpleNamespace(CUDAGraph=recorder.new_graph, graph=graph)

    class Torch:
        """``torch`` as ``cudagraph_utils`` sees it: its ``cuda`` graphs stood in."""

        def __getattr__(self, name: str) -> Any:
            return cuda if name == "cuda" else getattr(torch, name)

    with mock.patch.multiple(
        cg,
        torch=Torch(),
        graph_capture=lambda device: contextlib.nullcontext(),
        capture_pool=lambda pool, vllm_config: contextlib.nullcontext(None),
        current_stream=lambda: None,
        is_global_first_rank=lambda: False,  # no progress bar
        BreakableCUDAGraphWrapper=Breakable,
    ):
        yield


def _one_rank() -> Any:
    """``get_pp_group()``: a single pipeline stage."""
    return SimpleNamespace(is_first_rank=True, is_last_rank=True)


# -- the runner ----------------------------------------------------------------------------


def num_blocks(config: EngineConfig) -> int:
    """Pages of the engine's KV cache: every sequence at its longest, the null page 0
    and two spare (the scheduler's pool for the cases, reference.batch)."""
    return config.max_num_seqs * config.max_blocks_per_seq + 3


def attention_pages(config: EngineConfig, held: int | None) -> int:
    """The attention pages a forward's block table and slots may name: the engine's
    (:func:`num_blocks`), fewer where the runner held a smaller KV cache when it ran
    (``held``: start-up profiling's minimal one; None: the engine's)."""
    return min(held or num_blocks(config), num_blocks(config))


def kv_cache_spec(config: EngineConfig) -> Any:
    """The attention layer's KV-cache spec (:func:`.runner_step_speculator.kv_cache_spec`)."""
    return speculating.kv_cache_spec(config.block_size)


def kv_cache_config(config: EngineConfig, layers: list[str]) -> Any:
    """The ``KVCacheConfig`` the worker hands ``initialize_kv_cache``: one KV-cache group
    of full attention over ``layers`` (the target's, and the draft's where the
    speculator's layer shares it, as an MTP layer does), :func:`num_blocks` pages, no
    tensors (nothing is allocated: :func:`_cpu_runner`)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=num_blocks(config),
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(layers), kv_cache_spec(config))],
    )


@functools.cache
def _any_page_triton() -> type:
    """Triton's attention backend for pages its kernels do not take (not a multiple of
    16: ``get_supported_kernel_block_sizes``): the traces' pages are small so that a
    few tokens cross pages, and no attention kernel runs here, so only that declared
    constraint is lifted (``init_attn_backend`` then keeps the manager's page size);
    the metadata builder and its graph support are Triton's own."""
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    class AnyPageTritonAttentionBackend(TritonAttentionBackend):
        @staticmethod
        def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
            return [MultipleOf(1)]

    return AnyPageTritonAttentionBackend


def _attention_layer(vc: Any, config: EngineConfig) -> Any:
    """The target's attention layer, as the model registers it in the static forward
    context (``init_attn_backend`` asks it its backend): Triton's."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    backend = TritonAttentionBackend
    if not backend.supports_block_size(config.block_size):
        backend = _any_page_triton()

    class TargetLayer(AttentionLayerBase):
        num_heads = vc.model_config.get_num_attention_heads(vc.parallel_config)

        def get_attn_backend(self) -> type:
            return backend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            # What the worker's get_kv_cache_spec reads before it profiles the graphs'
            # memory (the KVCacheConfig after it is the worker's: kv_cache_config).
            return kv_cache_spec(config)

    return TargetLayer()


def _vllm_config(config: EngineConfig, mode: str, speculator: str) -> Any:
    from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode

    vc = _engine.vllm_config(config)
    if vc.speculative_config is not None and speculator != speculating.MTP:
        vc.speculative_config = speculating.speculative_config(speculator, config.num_spec)
    cc = vc.compilation_config
    # A CUDA engine's compilation (the CPU platform sets neither): VLLM_COMPILE,
    # attention among the splitting ops (CompilationConfig.set_splitting_ops_for_v1).
    cc.mode = CompilationMode.VLLM_COMPILE
    cc.splitting_ops = list(CompilationConfig._attention_ops)
    cc.cudagraph_mode = CUDAGraphMode[mode]
    cc.static_forward_context = {}
    vc.parallel_config = copy.copy(vc.parallel_config)
    return vc


class _GraphPools:
    """``current_platform`` as ``cudagraph_utils`` asks it: CUDA graph pools, a handle a
    token (no graph is captured here); ``profile_cudagraph_memory`` swaps the class's
    global pool for a throwaway one and back."""

    _global_graph_pool: Any = None

    def get_global_graph_pool(self) -> Any:
        return type(self)._global_graph_pool

    def graph_pool_handle(self) -> Any:
        return object()


@contextlib.contextmanager
def _cpu_runner(device: torch.device) -> Iterator[None]:
    """What ``GPUModelRunner.__init__``, ``initialize_kv_cache`` and ``capture_model``
    need of a GPU and of the worker, stood in: CUDA streams and events (the output copy
    stream, the draft tokens handler's copy event: no copy runs on one here); the
    pipeline-parallel group (one stage: ``Worker.init_device`` makes the groups); the
    KV cache tensors (``init_kv_cache``: device memory that only the attention kernels,
    which do not run, read); the accelerator's memory queries around the capture (how
    much the graphs took); the workspace lock after it (``Worker.init_device``'s
    workspace manager, process-wide: :func:`._engine.worker_workspace` makes the
    engine's); the device synchronizations; the graph pools (:class:`_GraphPools`);
    the memory profiler's and the capture's garbage collections
    (:func:`..standins.no_collections`). Host memory for the buffers
    (:func:`.slot_mapping.host_memory`)."""

    import vllm.v1.worker.gpu.cudagraph_utils as cg
    import vllm.v1.worker.gpu.model_runner as model_runner

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    with contextlib.ExitStack() as stack:
        stack.enter_context(host_memory(device))
        stack.enter_context(no_collections())
        for owner, name, value in (
            (torch.cuda, "Stream", nothing),
            (torch.cuda, "Event", nothing),
            (torch.accelerator, "empty_cache", nothing),
            (torch.accelerator, "get_memory_info", lambda *a: (0, 0)),
            (model_runner, "get_pp_group", _one_rank),
            (model_runner, "init_kv_cache", lambda *a, **k: {}),
            (model_runner, "lock_workspace", nothing),
            (cg, "get_pp_group", _one_rank),
            (torch.accelerator, "synchronize", nothing),
            (cg, "current_platform", _GraphPools()),
        ):
            stack.enter_context(mock.patch.object(owner, name, value))
        yield


@contextlib.contextmanager
def _rows(config: EngineConfig) -> Iterator[None]:
    """``RequestState``'s rows of tokens ``next_n`` longer than ``max_model_len``: the
    trace's scheduler runs a request up to ``max_model_len``, one token past vLLM's (which
    keeps room for the token sampled after it), and ``post_update`` stores the tokens
    sampled then past the row, unmasked."""
    import vllm.v1.worker.gpu.model_runner as model_runner

    made = model_runner.RequestState

    def request_state(*, max_model_len: int, **kwargs: Any) -> Any:
        return made(max_model_len=max_model_len + config.next_n, **kwargs)

    with mock.patch.object(model_runner, "RequestState", request_state):
        yield


_WARMS_UP: contextvars.ContextVar[bool] = contextvars.ContextVar("warms_up", default=True)
"""Whether an engine made now runs the worker's kernel warm-up (:meth:`_Engine.warm_up`)."""


class _Engine:
    """One runner, built by vLLM's own code: ``GPUModelRunner.__init__``, ``load_model``
    (its model loader stood in: :class:`_Model`, the speculator's draft model as
    :func:`.runner_step_speculator.make` makes it), ``initialize_kv_cache`` with the
    worker's :func:`kv_cache_config`, and ``capture_model`` (:meth:`capture`)."""

    recorder_type: type[_Recorder] = _Recorder
    """Where the engine's model and graphs report what they read."""

    def __init__(
        self, config: EngineConfig, device: torch.device, mode: str, speculator: str
    ) -> None:
        from vllm.config import CUDAGraphMode, set_current_vllm_config
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        self.config, self.device = config, device
        self.recorder = self.recorder_type()
        vc = self.vllm_config = self.configure(_vllm_config(config, mode, speculator))
        with (
            _cpu_runner(device),
            _engine.worker_workspace(device),
            set_current_vllm_config(vc),
            _rows(config),
        ):
            r = self.runner = GPUModelRunner(vc, device)
            r.main_stream = None  # AsyncOutput's, stood in (_sampling)
            if r.speculator is not None and not speculating.runs(config, vc):
                # set_attn would refuse the draft layer's pages (see _HeldDrafts).
                r.speculator = None
            if r.speculator is not None:
                speculating.make(r, self.recorder)
                self.recorder.speculator_where = speculating.where(r.speculator)
            model = self.target_model()

            def load_model(vllm_config: Any, model_config: Any) -> _Model:
                # What the model's construction registers: its attention layers.
                vc.compilation_config.static_forward_context.update(self.layers())
                return model

            loader = SimpleNamespace(load_model=load_model)
            with mock.patch("vllm.v1.worker.gpu.model_runner.get_model_loader", lambda c: loader):
                r.load_model()
            self.recorder.kv_pages = self.kv_pages
            self.profile()
            layers = [_LAYER] + ([speculating.DRAFT_LAYER] if r.speculator is not None else [])
            r.initialize_kv_cache(self.kv_cache_config(layers))
            resolved = r.cudagraph_manager.cudagraph_mode
            if resolved != self.resolves_to(CUDAGraphMode[mode]):
                raise RuntimeError(f"attnfuzz: vLLM resolved cudagraph_mode {mode} to {resolved}")
        self.held: set[str] = set()
        self.last: _Last | None = None
        self.warm_up()
        self.capture()

    def warm_up(self) -> None:
        """``Worker.compile_or_warm_up_model``'s kernel warm-up of a V2 runner, before the
        capture (``kernel_config.enable_jit_warmup``, on by default): vLLM's own
        ``warmup_kernels`` (``v1/worker/gpu/warmup.py``) runs steps of requests of its
        own through ``execute_model`` and ``sample_tokens`` (a prefill of every request,
        then decodes with and without drafts, each sampled, the greedy pass again under
        a speculative config), then finishes them, so that the
        runner's buffers hold what the warm-up leaves when the first step comes, as a
        served engine's do. Its own forwards are not judged: its requests are sized by
        ``decode_query_len`` alone (positions past a small ``max_model_len``), for which
        the fields' ranges here, written for the scheduler's steps, do not say what
        their consumers accept. The logits it samples are zeros. The fresh engine of
        *history invariance* is not warmed up (:meth:`RunnerStepEngine._fresh`)."""
        if not _WARMS_UP.get():
            return  # the fresh engine of history invariance (RunnerStepEngine._fresh)
        kernel_config = getattr(self.vllm_config, "kernel_config", None)
        if not getattr(kernel_config, "enable_jit_warmup", False):
            return  # the worker warms up only then (a release without the option: never)
        from vllm.v1.worker.gpu.warmup import warmup_kernels

        r, recorder = self.runner, self.recorder  # recorder.kind None: nothing recorded

        def compute_logits(hidden_states: torch.Tensor) -> torch.Tensor:
            return torch.zeros(hidden_states.shape[0], r.vocab_size, device=hidden_states.device)

        def execute_model(out: Any) -> Any:
            with host_memory(self.device), _graphs(recorder), _data_parallel(r, None):
                return r.execute_model(out)

        def sample_tokens(grammar: Any) -> Any:
            with (
                host_memory(self.device),
                _graphs(recorder),
                _data_parallel(r, None),
                _sampling(),
                _drafts_held(r),
            ):
                return r.sample_tokens(grammar)

        # What the warm-up samples with, stood in where the Triton interpreter cannot
        # run vLLM's kernels and no metadata depends on it: its requests' sampling
        # parameters greedy (SamplingParams.for_sampler_warmup's top-k/top-p kernels),
        # and the grammar bitmask its prefill applies to the logits.
        from vllm import SamplingParams

        greedy = SamplingParams(temperature=0)
        with (
            _cpu_runner(self.device),
            mock.patch.object(r.model, "compute_logits", compute_logits),
            mock.patch.object(SamplingParams, "for_sampler_warmup", lambda: greedy),
            mock.patch.object(
                r.structured_outputs_worker, "apply_grammar_bitmask", lambda *a, **k: None
            ),
        ):
            warmup_kernels(r, execute_model, sample_tokens)  # as one rank

    def target_model(self) -> _Model:
        """The model the stood-in loader loads (:class:`_Model`)."""
        return _Model(self.recorder)

    def kv_pages(self) -> int | None:
        """The pages of the KV cache the runner holds now (None: none yet)."""
        kv = getattr(self.runner, "kv_cache_config", None)
        return None if kv is None else int(kv.num_blocks)

    profiles = False
    """Whether the worker profiles the graphs' memory before it sizes the KV cache."""

    def profile(self) -> None:
        """``Worker.determine_available_memory``'s ``profile_cudagraph_memory``, before the
        real KV cache, wherever the mode captures graphs: a minimal KV cache
        (``_init_minimal_kv_cache_for_profiling``: one page a request, at most the
        largest capture size), the speculator's and the target's graphs captured over it
        (the largest two FULL ones), then torn down (``_teardown_profiling_state``).
        Every forward of it a ``capture`` build, judged over the minimal cache's pages.
        The KV-cache layout resolved first, as ``EngineCore._initialize_kv_caches`` does
        before the workers profile. Nothing where the release's runner has no
        ``profile_cudagraph_memory`` (its worker does not profile)."""
        from vllm.config import CUDAGraphMode
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )

        r, recorder = self.runner, self.recorder
        if not self.profiles or r.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:
            return
        if not hasattr(r, "profile_cudagraph_memory"):
            return  # a release whose worker does not profile the graphs' memory
        backends = get_current_attn_backends(self.vllm_config)
        layouts = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        specs = r.get_kv_cache_spec()
        resolve_kv_cache_layout(self.vllm_config, [layouts], list(specs.values()))
        recorder.kind = "capture"
        recorder.where = "cudagraph_utils.py: profile_cudagraph_memory"
        try:
            with _graphs(recorder):
                r.profile_cudagraph_memory()
        finally:
            recorder.kind = None

    def configure(self, vc: Any) -> Any:
        """The engine's ``VllmConfig``, as the model's config makes it."""
        return vc

    def layers(self) -> dict[str, Any]:
        """The layers the model's construction registers in the static forward context."""
        return {_LAYER: _attention_layer(self.vllm_config, self.config)}

    def kv_cache_config(self, layers: list[str]) -> Any:
        """The ``KVCacheConfig`` the worker hands ``initialize_kv_cache``."""
        return kv_cache_config(self.config, layers)

    def resolves_to(self, mode: Any) -> Any:
        """The mode ``initialize_kv_cache`` resolves the config's ``mode`` to: itself
        (Triton's attention supports every graph)."""
        return mode

    def output(self, inputs: RunnerStepInputs, held: set[str]) -> Any:
        """The step's ``SchedulerOutput`` (:func:`_scheduler_output`)."""
        return _scheduler_output(inputs, held)

    def fields(self, seen: _Seen, *, history: bool = True) -> tuple[Field, ...]:
        """The fields of one forward's build (:func:`_fields`)."""
        return _fields(self.config, seen, history=history)

    def step_seen(self, state: Any) -> _Seen:
        """What the step's forward was handed: its ``ExecuteModelState``'s metadata."""
        batch = state.input_batch
        linear = self.recorder.linear_layer
        return _Seen(
            state.attn_metadata[_LAYER], batch.positions, batch,
            linear=state.attn_metadata[linear] if linear is not None else None,
        )  # fmt: skip

    def capture(self) -> None:
        """``GPUModelRunner.capture_model``: the target's graphs
        (``ModelCudaGraphManager.capture``), then the speculator's; every forward a
        ``capture`` build (none where the mode captures nothing)."""
        r = self.runner
        recorder = self.recorder
        recorder.kind = "capture"
        recorder.where = "cudagraph_utils.py: ModelCudaGraphManager.capture"
        speculator = r.speculator
        if speculator is not None:
            capture = speculator.capture

            def speculator_capture(*args: Any, **kwargs: Any) -> Any:
                recorder.where = "SpeculatorCudaGraphManager.capture"
                return capture(*args, **kwargs)

            speculator.capture = speculator_capture
        try:
            with _cpu_runner(self.device), _graphs(recorder):
                r.capture_model()
        finally:
            recorder.kind = None
            if speculator is not None:
                del speculator.capture


# -- one step ------------------------------------------------------------------------------


def _scheduler_output(
    inputs: RunnerStepInputs, held: set[str], is_new: tuple[bool, ...] | None = None
) -> Any:
    """The step's ``SchedulerOutput``: new requests (all their pages, their prompt where
    the step says it, else their tokens known up to the end of the step's query; at
    least those) in ``scheduled_new_reqs``, running ones in
    ``scheduled_cached_reqs`` (the pages they gained, None for none), the drafts a
    running request's query carries past its one token (``scheduled_spec_decode_tokens``,
    as ``Scheduler.schedule`` sends them: at most ``num_spec``; a longer query, or one
    within the request's prompt, is a prefill chunk), and the held requests the step has
    not, finished."""
    from vllm import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    config = inputs.config
    greedy = SamplingParams(temperature=0.0)  # the sampler's argmax: the logits decide
    new, cached = [], CachedRequestData.make_empty()
    scheduled: dict[str, int] = {}
    drafts: dict[str, list[int]] = {}
    steps = zip(
        inputs.req_ids, is_new or inputs.is_new, inputs.num_computed_tokens, inputs.query_lens,
        inputs.new_block_ids, inputs.prompt_lens or (0,) * inputs.num_reqs, strict=True,
    )  # fmt: skip
    for rid, fresh, computed, q, pages, prompt in steps:
        req_id = str(rid)
        scheduled[req_id] = q
        if fresh:
            known = min(max(computed + q, prompt, 1), config.max_model_len)
            new.append(
                NewRequestData(
                    req_id=req_id, prompt_token_ids=[0] * known, mm_features=[],
                    sampling_params=greedy, pooling_params=None, block_ids=(list(pages),),
                    num_computed_tokens=computed, lora_request=None,
                    prefill_token_ids=[0] * known,
                )
            )  # fmt: skip
        else:
            cached.req_ids.append(req_id)
            cached.new_block_ids.append((list(pages),) if pages else None)
            cached.num_computed_tokens.append(computed)
            cached.num_output_tokens.append(0)
            # A request still in its prompt prefills a chunk; drafts follow the prompt.
            if 1 < q <= 1 + config.num_spec and computed >= prompt:
                drafts[req_id] = [0] * (q - 1)
    return SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens=drafts,
        scheduled_encoder_inputs={},
        finished_req_ids=held - set(scheduled),
        free_encoder_mm_hashes=[],
        preempted_req_ids=set(),
        num_spec_tokens_to_schedule=config.num_spec,  # Scheduler.schedule: no dynamic SD
    )


@dataclass(frozen=True)
class _Peer:
    """The other data-parallel rank's batch: its requests and tokens, its uniform decode
    count (None: not one) and longest query (None: it has a prefill)."""

    num_reqs: int
    num_tokens: int
    uniform: int | None
    max_query_len: int | None


def _peer(inputs: RunnerStepInputs, dql: int) -> _Peer | None:
    """The peer rank of the step, the one :func:`~attnfuzz.strategies.traces.data_parallel_peer`
    names from the step's own sizes: none (one rank); idle (its ``execute_dummy_batch``:
    one request of ``decode_query_len`` tokens, ``Worker.execute_dummy_batch`` and
    ``_dummy_run``); a uniform decode of as many requests as the limits allow (DP padding
    pads this step to the peer's graph); a prefill one token longer than this step."""
    config = inputs.config
    which = data_parallel_peer(inputs.query_lens, inputs.num_computed_tokens)
    if which == "none":
        return None
    if which == "idle":
        return _Peer(1, dql, dql, dql)
    if which == "uniform decode":
        reqs = min(config.max_num_seqs, config.max_num_batched_tokens // dql)
        return _Peer(reqs, reqs * dql, dql, dql)
    tokens = min(inputs.num_tokens + 1, config.max_num_batched_tokens, config.max_model_len)
    return _Peer(1, tokens, None, None)


def with_peer(config: EngineConfig, batch: Batch) -> Batch:
    """``batch`` as the engines of ``runner-step`` run it, for the reference's
    ``step_plan``: beside the data-parallel peer :func:`_peer` puts there (its tokens; a
    uniform decode or not), and never forced eager (:func:`never_eager`)."""
    sizes = SimpleNamespace(
        config=config, query_lens=batch.q_lens, num_computed_tokens=batch.num_computed_tokens,
        num_tokens=sum(batch.q_lens),
    )  # fmt: skip
    peer = _peer(sizes, config.next_n)  # type: ignore[arg-type]
    tokens = 0 if peer is None else peer.num_tokens
    uniform = peer is not None and peer.uniform is not None
    return dataclasses.replace(
        never_eager(config, batch), dp_peer_tokens=tokens, dp_peer_uniform=uniform
    )


def never_eager(config: EngineConfig, batch: Batch) -> Batch:
    """``batch`` as an engine of ``runner-step`` of one rank runs it: a scheduler output
    cannot force a step eager, so the runner dispatches it on its own."""
    return dataclasses.replace(batch, use_cudagraph=True, dp_peer_tokens=0, dp_peer_uniform=False)


@contextlib.contextmanager
def _data_parallel(runner: Any, peer: _Peer | None) -> Iterator[None]:
    """The runner as rank 0 of two, the all-reduce answered with the column ``peer``'s
    own ``dispatch_cg_and_sync_dp`` fills (as ``execute_model`` calls it: no LoRA; its
    vote for microbatching the runner's own, as both ranks run one config); one rank
    where ``peer`` is None."""
    from attnfuzz.adapters.vllm.runner_modes import _peer_all_reduce_v2, _peer_column_v2
    from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp

    pc = runner.parallel_config
    # The speculator reads the group's size where the runner does (its own copies).
    ranks = [runner.speculator] if runner.speculator is not None else []
    if peer is None:
        # What the engine had is restored after (a DBO engine's start-up captures as
        # rank 0 of two; its kernel warm-up runs as one rank between).
        found = (
            (pc.data_parallel_size, pc.data_parallel_rank),
            [(s.dp_size, s.dp_rank) for s in ranks],
        )
        pc.data_parallel_size, pc.data_parallel_rank = 1, 0
        for s in ranks:
            s.dp_size, s.dp_rank = 1, 0
        try:
            yield
        finally:
            (pc.data_parallel_size, pc.data_parallel_rank), theirs = found
            for s, (size, rank) in zip(ranks, theirs, strict=True):
                s.dp_size, s.dp_rank = size, rank
        return
    pc.data_parallel_size, pc.data_parallel_rank = 2, 0
    for s in ranks:
        s.dp_size, s.dp_rank = 2, 0
    with _peer_column_v2() as column:
        dispatch_cg_and_sync_dp(
            runner.cudagraph_manager, peer.num_reqs, peer.num_tokens, peer.uniform, 2, 1,
            max_query_len=peer.max_query_len, num_active_loras=0, parallel_config=pc,
            allow_ubatching=getattr(runner, "ubatch_runner", None) is not None,
            uniform_decode=peer.uniform == runner.decode_query_len,
        )  # fmt: skip
    try:
        with _peer_all_reduce_v2(column):
            yield
    finally:
        pc.data_parallel_size, pc.data_parallel_rank = 1, 0
        for s in ranks:
            s.dp_size, s.dp_rank = 1, 0


@dataclass
class _Last:
    """What ``sample_tokens`` takes of an engine's last step: its ``ExecuteModelState``,
    each request's length after it and drafts in it, and the step's data-parallel peer."""

    state: Any
    seq_lens: list[int]
    drafts: list[int]
    peer: _Peer | None


def _sample(engine: _Engine, now: dict[str, int], how: str | None = None) -> list[StepBuild]:
    """``sample_tokens`` of the engine's last step, as ``execute_model``'s caller calls it
    (no grammar), on the ``ExecuteModelState`` the step left: the runner's sampler, its
    rejection sampler verifying the step's drafts, ``postprocess_sampled``, then the
    speculator's proposal, its forwards the draft builds of ``how`` (None: not
    recorded), which it returns. The target's logits (:func:`_verdict`) make the greedy
    sampler accept the drafts the scheduler has since counted computed (``now``: each
    request's computed tokens; every draft accepted for a request not in it)."""
    last = engine.last
    if last is None:
        return []
    engine.last = None
    r = engine.runner
    batch = last.state.input_batch
    rejected = [s - now.get(rid, s) for rid, s in zip(batch.req_ids, last.seq_lens, strict=True)]
    for rid, s, x, d in zip(batch.req_ids, last.seq_lens, rejected, last.drafts, strict=True):
        # The runner counts a request's tokens itself (postprocess_sampled): only
        # rejected drafts roll its count back, as the scheduler's does.
        if not 0 <= x <= d:
            raise ValueError(
                f"attnfuzz: request {rid} runs on from {s - x} computed tokens after a step "
                f"to {s} with {d} drafts: a sampler's count is {s - d} to {s}"
            )
    r.model.logits = _verdict(batch, rejected, r.vocab_size)
    r.execute_model_state = last.state
    recorder = engine.recorder
    recorder.kind, recorder.draft = how, 0
    try:
        with (
            host_memory(engine.device),
            _graphs(recorder),
            _data_parallel(r, last.peer),
            _sampling(),
            _drafts_held(r),
        ):
            r.sample_tokens(None)
    finally:
        recorder.kind = recorder.draft = None
        r.execute_model_state = None
    out = []
    extra = whole = unreal = own = None
    if r.speculator is not None:
        extra = r.speculator.num_extra_query_per_req
        whole = speculating.repeats_the_query(r.speculator)
        unreal = speculating.unreal_rows(r.speculator, rejected)
        own = speculating.query_rows(r.speculator)
    for kind, draft, seen in recorder.drafted:
        # The draft prefill runs the step's tokens (and the speculator's extra query
        # rows, a request's correction token); each draft decode one per request, or
        # the step's tokens again (one MTP module a draft); a speculator with a query
        # of its own (DFlash) as many rows a request, every one real, with the keys
        # each reads (padding writes no real KV judges its padding rows' slots).
        tokens = batch.num_reqs
        fields = engine.fields(seen)
        if own is not None:
            tokens = own * batch.num_reqs
            fields += speculating.kv_reads(engine.config, seen.meta)
        elif draft == 0 or whole:
            assert extra is not None and unreal is not None
            tokens = batch.num_tokens + extra * batch.num_reqs
            fields = _draft_prefill_positions(engine.config, seen, fields, unreal)
        # Made after the last step, for its requests, once this step came.
        build = StepBuild(kind, batch.num_reqs, tokens, fields, recorder.speculator_where,
                          draft=draft, proposed_before=True)  # fmt: skip
        out.append(build)
    recorder.drafted.clear()
    return out


@contextlib.contextmanager
def _drafts_held(runner: Any) -> Iterator[None]:
    """``sample_tokens`` where the runner verifies drafts but the adapter runs no
    speculator (:class:`_HeldDrafts` proposes in its place), the runner's own after."""
    held = runner.speculator
    if held is None and runner.rejection_sampler is not None:
        runner.speculator = _HeldDrafts(runner.num_speculative_steps)
    try:
        yield
    finally:
        runner.speculator = held


class _HeldDrafts(_Standin):
    """The speculator where the adapter has none (:func:`.runner_step_speculator.runs`:
    the drafter's attention needs a block size Triton's kernels take, which vLLM's
    ``initialize_kv_cache`` would refuse): greedy (no draft logits), proposing token 0,
    the draft model's argmax."""

    draft_logits = None
    supports_mm_inputs = False

    def __init__(self, num_speculative_steps: int) -> None:
        self.num_speculative_steps = num_speculative_steps

    def propose(self, input_batch: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(
            input_batch.num_reqs, self.num_speculative_steps, dtype=torch.int64,
            device=input_batch.input_ids.device,
        )  # fmt: skip


VOCAB = 2
"""The tokens the target's logits choose from (:func:`_verdict`): the drafts (the draft
model's argmax, token 0) and one other, for the target to reject a draft with."""


def _verdict(batch: Any, rejected: list[int], vocab_size: int) -> torch.Tensor:
    """The target's logits of the step's logits rows, for a greedy sampler: request
    ``i``'s row ``j`` verifies the draft its row ``j + 1`` holds (``_rejection_kernel``);
    its argmax is that draft for the accepted ones, another token at the first rejected,
    token 0 after (the bonus token, or a row past the rejection nobody samples)."""
    cu = batch.cu_num_logits_np
    drafts = batch.input_ids[batch.logits_indices].to("cpu").to(torch.int64)
    argmax = torch.zeros(int(cu[-1]), dtype=torch.int64)
    for i, r in enumerate(rejected):
        start, end = int(cu[i]), int(cu[i + 1])
        accepted = end - start - 1 - r
        for j in range(end - start - 1):
            draft = int(drafts[start + j + 1])
            if j < accepted:
                argmax[start + j] = max(draft, 0)
            elif j == accepted:
                argmax[start + j] = (max(draft, 0) + 1) % VOCAB
                break
    logits = torch.zeros(len(argmax), vocab_size)  # the model's vocabulary
    logits[torch.arange(len(argmax)), argmax] = 1.0
    return logits.to(batch.input_ids.device)


@contextlib.contextmanager
def _sampling() -> Iterator[None]:
    """``AsyncOutput``: the copy of the sampled tokens to the host on a CUDA copy stream,
    stood in (the engine's caller reads it; no kernel of the next step does)."""
    import vllm.v1.worker.gpu.model_runner as model_runner

    with mock.patch.object(model_runner, "AsyncOutput", SimpleNamespace):
        yield


def _draft_prefill_positions(
    config: EngineConfig, seen: _Seen, fields: tuple[Field, ...], unreal: list[int]
) -> tuple[Field, ...]:
    """The draft prefill's positions, per request: its query rows (``query_start_loc``),
    of which the first ``query_len - unreal`` are real (``unreal``:
    :func:`.runner_step_speculator.unreal_rows`). The speculator pads each
    request's query to include its rejected drafts, keeping the target's batch shape
    (``TargetDependentARSpeculator.propose``), and ``prepare_prefill_inputs`` writes no
    position for those rows: what an earlier step left there is read, by the draft
    model alone, for a token past the request's accepted length (its draft KV is written
    again, by the next step's draft prefill or the draft loop, before a forward's length
    reaches it) and whose output nobody samples. Every entry is still held to the
    model's positions."""
    qsl = _np(seen.meta.query_start_loc).astype(np.int64)
    positions = _np(seen.positions)
    lens = qsl[1:] - qsl[:-1]
    width = max(int(lens.max(initial=0)), 1)
    per_request = np.zeros((len(lens), width), dtype=positions.dtype)  # 0: past a query
    for i, (start, n) in enumerate(zip(qsl[:-1], lens, strict=True)):
        per_request[i, :n] = positions[start : start + n]
    real = lens.copy()
    real[: len(unreal)] -= np.asarray(unreal, dtype=np.int64)
    field = Field(
        "positions", "requests", per_request, (0, config.max_model_len - 1),
        row_lengths=real,
    )  # fmt: skip
    return tuple(field if f.name == "positions" else f for f in fields)


def _execute(engine: _Engine, out: Any, peer: _Peer | None = None) -> Any:
    """``execute_model`` of one scheduler output; its ``ExecuteModelState`` (None where
    the runner ran no forward)."""
    r = engine.runner
    engine.recorder.kind = "step"
    engine.recorder.where = "model_runner.py: GPUModelRunner.execute_model"
    try:
        with host_memory(engine.device), _graphs(engine.recorder), _data_parallel(r, peer):
            r.execute_model(out)
    finally:
        engine.recorder.kind = None
    state = r.execute_model_state
    r.execute_model_state = None
    engine.held = set(r.req_states.req_id_to_index)
    if state is None:  # no forward: no rank had a token to run (execute_model returns)
        engine.last = None
        return None
    batch = state.input_batch
    seq_lens = [
        int(r.req_states.num_computed_tokens_np[r.req_states.req_id_to_index[rid]])
        + out.num_scheduled_tokens[rid]
        for rid in batch.req_ids
    ]
    drafts = [len(out.scheduled_spec_decode_tokens.get(rid, ())) for rid in batch.req_ids]
    engine.last = _Last(state, seq_lens, drafts, peer)
    return state


def _dummy(engine: _Engine, peer: _Peer) -> None:
    """``Worker.execute_dummy_batch``: this rank idle while ``peer`` runs."""
    r = engine.runner
    engine.recorder.kind = "dummy"
    engine.recorder.where = "model_runner.py: GPUModelRunner._dummy_run (execute_dummy_batch)"
    try:
        with host_memory(engine.device), _graphs(engine.recorder), _data_parallel(r, peer):
            r._dummy_run(1, uniform_decode=True)
    finally:
        engine.recorder.kind = None


# -- builds --------------------------------------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy().copy()


def _fields(config: EngineConfig, seen: _Seen, *, history: bool = True) -> tuple[Field, ...]:
    """Every field a consumer reads of one forward, padding rows included, with the range
    the consumer accepts. ``history`` False leaves out what the engine's history
    decides by design (which row of the persistent state a request holds)."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    pages = attention_pages(config, seen.pages)
    slots = pages * config.block_size
    out = [
        # triton_unified_attention.py kernel_unified_attention_*: a sequence's query rows
        # are q[query_start_loc[i] : query_start_loc[i + 1]] of the padded token rows.
        Field("query_start_loc", "offsets", _np(m.query_start_loc), (0, tokens_pad)),
        # ... its keys are the first seq_lens[i] of the sequence, read through its block
        # table row: no more than the row reaches (its width in pages x block_size; a
        # dummy run's request may be longer than max_model_len, within the row).
        Field(
            "seq_lens",
            "requests",
            _np(m.seq_lens),
            (0, int(m.block_table.shape[1]) * config.block_size),
        ),  # fmt: skip
        # ... block_table[i, j] indexes the KV cache's pages (KVCacheConfig.num_blocks);
        # the kernel reads a row's first cdiv(seq_lens[i], block_size) pages, its loads
        # masked by seq_len (_gather_block_tables_kernel copies only those; the rest of
        # the row keeps what an earlier step left).
        Field(
            "block_table",
            "requests",
            _np(m.block_table),
            (0, pages - 1),
            row_lengths=-(-_np(m.seq_lens).astype(np.int64) // config.block_size),
        ),  # fmt: skip
        # triton_reshape_and_cache_flash.py: a token's slot in the cache; PAD_SLOT_ID
        # (negative) skips it.
        Field(
            "slot_mapping", "tokens", _np(m.slot_mapping), (PAD_SLOT_ID, slots - 1), writes_kv=True
        ),
        # rotary_embedding: cos_sin_cache[positions], the model's positions.
        Field("positions", "tokens", _np(seen.positions), (0, config.max_model_len - 1)),
    ]
    batch = seen.batch
    if batch is not None:
        # GPUModelRunner.sample: hidden_states[logits_indices], the padded token rows.
        # One entry per logit, at most one per token: as "tokens" every entry is real.
        out.append(
            Field("logits_indices", "tokens", _np(batch.logits_indices), (0, tokens_pad - 1))
        )
        # cu_num_logits: each request's logits rows, offsets into logits_indices.
        n_logits = int(batch.logits_indices.shape[0])
        out.append(Field("cu_num_logits", "offsets", _np(batch.cu_num_logits), (0, n_logits)))
        if history:
            # states.py RequestState: the request's row, idx_mapping[i] < max_num_reqs.
            out.append(
                Field(
                    "idx_mapping", "requests", _np(batch.idx_mapping),
                    (0, config.max_num_seqs - 1),
                )
            )  # fmt: skip
    return tuple(out)


def _step_build(how: str, engine: _Engine, state: Any, **kw: Any) -> StepBuild:
    batch = state.input_batch
    seen = engine.step_seen(state)
    return StepBuild(
        how, batch.num_reqs, batch.num_tokens, engine.fields(seen, **kw),
        where="vllm/v1/worker/gpu/model_runner.py: GPUModelRunner.execute_model",
    )  # fmt: skip


def held_by_dummies(
    dummies: list[StepBuild], inputs: RunnerStepInputs, rows: Sequence[str]
) -> list[StepBuild]:
    """``dummies`` (dummy runs before the step) with the rows of the step's eager build,
    in its order ``rows`` (request ids), whose requests the engine held while they ran:
    those not new to the step."""
    running = {str(rid) for rid, new in zip(inputs.req_ids, inputs.is_new, strict=True) if not new}
    live = tuple(i for i, rid in enumerate(rows) if str(rid) in running)
    return [dataclasses.replace(b, live=live) for b in dummies]


def prefill_then_decode(runner: str, num_spec: int) -> Trace:
    """One request prefills 5 tokens, then decodes ``1 + num_spec`` (the same request in
    two steps), on runner ``runner`` with FULL_AND_PIECEWISE graphs of 4 and 8 tokens
    and pages of 16: the decode pads to the FULL graph of 4 tokens with drafts."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=num_spec, cudagraph_capture_sizes=(4, 8),
        cudagraph_mode="FULL_AND_PIECEWISE", runner=runner,
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0,), (5,), req_ids=(7,), pages=((1,),), new_pages=(1,)),
            Batch((5,), (1 + num_spec,), req_ids=(7,), pages=((1,),), new_pages=(0,)),
        ),
    )


def held_between_steps(found: Trace | Case) -> bool:
    """Whether a request of one step runs in the next, not new to it: the engine holds
    it through the dummy run between the two."""
    return held_through_dummy([found.batch] if isinstance(found, Case) else found.steps)


def _seen_builds(engine: _Engine, num_reqs: int, num_tokens: int) -> list[StepBuild]:
    """The builds the model and the graphs reported, in order; emptied."""
    out = []
    for kind, where, seen in engine.recorder.seen:
        sizes = (num_reqs, num_tokens) if kind == "replay" else (0, 0)
        out.append(StepBuild(kind, *sizes, engine.fields(seen), where=where))
    engine.recorder.seen.clear()
    return out


# -- the implementation --------------------------------------------------------------------


class _StartUpEngine(_Engine):
    """``vllm``'s engine: the worker's start-up, its graph-memory profiling included
    (:meth:`_Engine.profile`). The implementations on other backends leave it out:
    it is the runner's code, not theirs, and it doubles what building an engine costs."""

    profiles = True


class RunnerStepEngine:
    """One vLLM engine seen three ways: with the config's graphs and a data-parallel
    peer, eagerly (cudagraph mode NONE), and afresh each step."""

    speculator = speculating.MTP
    """The speculator the speculative config makes (:data:`.runner_step_speculator.MTP`,
    :data:`.runner_step_speculator.STANDALONE_AR`)."""
    data_parallel = True
    """Whether the graph engine has a data-parallel peer (its dummy runs come with it)."""
    engine_type: type[_Engine] = _StartUpEngine
    """The runner each of the three engines is."""

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        self.key: tuple[EngineConfig, torch.device] | None = None
        self.graphs: _Engine | None = None
        self.eager: _Engine | None = None
        self.fresh: _Engine | None = None  # the last step's, which proposes after it
        self.pages: dict[str, tuple[int, ...]] = {}  # the scheduler's: each request's pages

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        self._check(inputs)
        builds: list[StepBuild] = []
        if self.key != (inputs.config, inputs.device):
            self.key = (inputs.config, inputs.device)
            mode = inputs.config.cudagraph_mode
            self.graphs = self.engine(inputs.config, inputs.device, mode)
            self.eager = self.engine(inputs.config, inputs.device, "NONE")
            self.fresh = None
            builds += _seen_builds(self.graphs, 0, 0)  # the capture runs
        graphs, eager = self.graphs, self.eager
        assert graphs is not None and eager is not None
        now = {
            str(rid): c
            for rid, new, c in zip(
                inputs.req_ids, inputs.is_new, inputs.num_computed_tokens, strict=True
            )
            if not new
        }
        dql = graphs.runner.decode_query_len
        # sample_tokens of the last step, each engine's speculator proposing after it.
        builds += _sample(eager, now, "eager") + _sample(graphs, now, "padded")
        if self.fresh is not None:
            builds += _sample(self.fresh, now, "fresh")
        dummies: list[StepBuild] = []
        if self.data_parallel:
            # This rank idle while the peer runs the step (a dummy run between two steps).
            step_peer = _Peer(inputs.num_reqs, inputs.num_tokens, None, None)
            _dummy(graphs, step_peer)
            dummies = _seen_builds(graphs, 0, 0)

        state = _execute(eager, eager.output(inputs, eager.held))
        builds += held_by_dummies(dummies, inputs, state.input_batch.req_ids)
        builds.append(_step_build("eager", eager, state))
        peer = _peer(inputs, dql) if self.data_parallel else None
        state = _execute(graphs, graphs.output(inputs, graphs.held), peer)
        padded = _step_build("padded", graphs, state)
        builds += [padded, *_seen_builds(graphs, padded.num_reqs, padded.num_tokens)]
        held = {rid: self.pages.get(rid, ()) for rid in map(str, inputs.req_ids)}
        self.pages = {
            str(rid): (() if new else held[str(rid)]) + tuple(gained)
            for rid, new, gained in zip(
                inputs.req_ids, inputs.is_new, inputs.new_block_ids, strict=True
            )
        }
        fresh, self.fresh = self._fresh(inputs, held)
        builds.append(fresh)
        return RunnerStepOutputs(tuple(builds))

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> _Engine:
        """One runner of graph mode ``mode`` (:attr:`engine_type`)."""
        return self.engine_type(config, device, mode, self.speculator)

    @staticmethod
    def _check(inputs: RunnerStepInputs) -> None:
        top = num_blocks(inputs.config) - 1
        if any(p < 0 or p > top for pages in inputs.new_block_ids for p in pages):
            raise ValueError(f"attnfuzz: a page id outside the engine's KV cache [0, {top}]")

    def _fresh(
        self, inputs: RunnerStepInputs, held: dict[str, tuple[int, ...]]
    ) -> tuple[StepBuild, _Engine]:
        """The step on a new engine of mode NONE: its running requests first added as new
        (one token each, at their computed tokens less one, with the pages they held, a
        request still prefilling with its prompt, so that it prefills on; as many
        warm-up steps as the token budget takes), then the step's own output; the
        engine, whose speculator proposes after the step."""
        config = inputs.config
        # Not warmed up (_Engine.warm_up): a history without the warm-up's leftovers,
        # which the engines that ran the trace have, for history invariance to set
        # against theirs; and one warm-up a trace's engine, not one a step.
        token = _WARMS_UP.set(False)
        try:
            fresh = self.engine(config, inputs.device, "NONE")
        finally:
            _WARMS_UP.reset(token)
        running = [i for i, new in enumerate(inputs.is_new) if not new]
        prompts = inputs.prompt_lens or (0,) * inputs.num_reqs
        budget = min(config.max_num_batched_tokens, config.max_num_seqs)
        for start in range(0, len(running), budget):
            part = running[start : start + budget]
            warm = RunnerStepInputs(
                config=config,
                req_ids=tuple(inputs.req_ids[i] for i in part),
                is_new=(True,) * len(part),
                num_computed_tokens=tuple(inputs.num_computed_tokens[i] - 1 for i in part),
                query_lens=(1,) * len(part),
                new_block_ids=tuple(held[str(inputs.req_ids[i])] for i in part),
                device=inputs.device,
                prompt_lens=tuple(
                    prompts[i] if inputs.num_computed_tokens[i] < prompts[i] else 0 for i in part
                ),
            )
            _sample(fresh, {})
            _execute(fresh, fresh.output(warm, fresh.held - set(map(str, warm.req_ids))))
        _sample(fresh, {str(inputs.req_ids[i]): inputs.num_computed_tokens[i] for i in running})
        state = _execute(fresh, fresh.output(inputs, fresh.held))
        return _step_build("fresh", fresh, state, history=False), fresh


class SlottedRunnerStepEngine(RunnerStepEngine):
    """``vllm``'s three engines, each running request holding a slot of the engine's
    (a hybrid model's state slot, an encoder-decoder model's cross-attention blocks) as
    the scheduler assigns it (:func:`assign_slots`), kept across the steps and shared
    by the three: ``engine_type`` takes them after the speculator."""

    def new_engine(self) -> None:
        super().new_engine()
        self.slots: dict[str, int] = {}

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> _Engine:
        make: Any = self.engine_type
        return make(config, device, mode, self.speculator, self.slots)

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        self.track(inputs, same_engine=self.key == (inputs.config, inputs.device))
        return super().__call__(inputs)

    def track(self, inputs: RunnerStepInputs, same_engine: bool) -> None:
        """The scheduler's side of the step, before the runner's: the requests' slots
        (:func:`assign_slots`; none kept from another engine's steps)."""
        if not same_engine:
            self.slots.clear()
        assign_slots(self.slots, inputs)


def assign_slots(slots: dict[str, int], inputs: RunnerStepInputs) -> None:
    """A request new to the engine takes the lowest slot no running request of the step
    holds (as vLLM's ``MambaManager`` hands out state slots); one left out of the step
    is finished and gives its slot back."""
    ids = [str(rid) for rid in inputs.req_ids]
    running = {rid: slots[rid] for rid, new in zip(ids, inputs.is_new, strict=True) if not new}
    taken = set(running.values())
    free = (s for s in range(inputs.config.max_num_seqs) if s not in taken)
    for rid, new in zip(ids, inputs.is_new, strict=True):
        if new:
            running[rid] = next(free)
    slots.clear()
    slots.update(running)


ENGINE = RunnerStepEngine()
"""The engine of the implementation ``vllm`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm`` of ``runner-step``: the step on :data:`ENGINE`, kept
    across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
