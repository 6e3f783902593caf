"""vLLM's model runner V1 step, whole, as the implementation ``vllm-v1`` of ``runner-step``.

From one scheduler output, vLLM 0.33.0's V1 ``GPUModelRunner.execute_model``
(``vllm/v1/worker/gpu_model_runner.py``) runs unchanged up to and through the model
forward, on a runner made by its own constructor, and the runner decides the step's
padding and graph itself. What runs unchanged:

- ``GPUModelRunner``: ``__init__``, ``initialize_metadata_builders``,
  ``may_reinitialize_input_batch``, ``_check_and_update_cudagraph_mode`` (the mode the
  Triton backend's ``AttentionCGSupport`` keeps, and the dispatcher's keys);
  ``execute_model`` (``_update_states``, ``_prepare_inputs``,
  ``_determine_batch_execution_and_padding``, ``_get_slot_mappings``,
  ``_build_attention_metadata``, ``_preprocess``, ``_model_forward``); the worker's
  start-up ``profile_cudagraph_memory`` where the mode captures graphs
  (:meth:`_Engine.profile`: ``_init_minimal_kv_cache_for_profiling`` and
  ``initialize_kv_cache`` over a minimal KV cache, ``_warmup_and_capture``,
  ``_cleanup_profiling_kv_cache``); the capture as
  ``capture_model`` runs it (``CudagraphDispatcher.get_capture_descs``,
  ``_capture_cudagraphs``, ``_warmup_and_capture``, ``_dummy_run``); ``_dummy_run`` as
  ``Worker.execute_dummy_batch`` calls it, and as ``kernel_warmup``'s attention warm-up
  calls it before the capture (a mixed batch; FlashInfer engines: :meth:`_Engine.warm_up`);
- ``vllm/v1/cudagraph_dispatcher.py``: ``CudagraphDispatcher`` (its keys and ``dispatch``);
- ``vllm/v1/worker/dp_utils.py``: ``coordinate_batch_across_dp`` (the data-parallel
  padding decision);
- ``vllm/compilation/cuda_graph.py``: ``CUDAGraphWrapper`` (FULL graphs: capture on a
  new batch descriptor, replay after), wrapped around the model as ``load_model`` does;
- ``InputBatch``, ``BlockTable`` and the Triton attention backend's own
  ``TritonAttentionMetadataBuilder`` (``build``, ``build_for_cudagraph_capture``);
  ``set_forward_context``;
- ``sample_tokens`` after each ``execute_model``, as the worker calls it: ``_sample``
  with V1's ``RejectionSampler`` (greedy: each draft against the target's argmax, the
  bonus token; its Triton kernels under the interpreter), ``_bookkeeping_sync``, and the
  drafter's proposal (``propose_draft_token_ids``, or the dummy run of a step that does
  not fit in the drafter);
- finishing: the requests the step names finished (``finished_req_ids``) leave the
  runner's state and its persistent batch (``InputBatch.remove_request``), which
  ``condense`` closes up, moving the last requests' rows (block-table rows too) down
  into the holes;
- the drafter, ``EagleProposer``, made by the runner, and its dummy runs
  (:mod:`.runner_step_drafter` says what of it runs and what is stood in).

Stood in, and only where a model, a GPU graph or a collective is needed:

- the model: a module that records what the runner hands it (the forward context's
  attention metadata and slot mapping, the positions) and returns zero hidden states,
  and logits that make greedy sampling accept the drafts the trace's step accepts
  (``rejected``; :func:`_logits`); the draft model (:mod:`.runner_step_drafter`);
- greedy sampling's ``argmax`` as on a GPU (the CPU platform's ``_C.greedy_argmax`` is
  a compiled op); CUDA streams and events of the host copies of sampled and drafted
  tokens;
- CUDA graphs: ``torch.cuda.CUDAGraph`` / ``torch.cuda.graph`` in ``cuda_graph``, a graph
  that remembers what the forward it "captured" read (views of the persistent buffers)
  and whose ``replay`` computes nothing, only records those views as the runner's
  preparation left them; the graph pool, ``weak_ref_tensors``, the capture stream and
  the runner's copy streams; ``get_pp_group`` (one rank); piecewise graphs are inside
  the compiled model, and the stand-in model is not compiled;
- the data-parallel all-reduce (``dp_utils.dist.all_reduce``): a second rank whose column
  is filled by its own ``_determine_batch_execution_and_padding`` (the peer's batch
  derived from the step, as the V2 adapter's :func:`.runner_step._peer`; for the idle
  rank's dummy run, the step itself);

Builds of one step (``reference/runner_step.py``), each from its own engine object:

- ``padded``: the engine of the config's graph mode, with a data-parallel peer, what
  ``execute_model`` handed the model (graph or not);
- ``replay``: on a FULL dispatch, what the replayed graph reads;
- ``capture``: every forward of the capture (warm-ups and captures, each capture size of
  each mode);
- ``dummy``: each step, before it, a dummy run of this rank idle while the peer runs
  the step, its ``live`` rows the eager build's requests not new to the step; and the
  drafter's dummy run inside a step it does not fit in, holding all the step's requests;
- ``eager``: the same steps on an engine of cudagraph mode NONE, one rank;
- ``fresh``: a new engine of mode NONE, its requests added as new in one warm-up step
  in the rows the eager engine holds them in (V1's persistent batch keeps a request in
  its row: which row is the engine's history), then the same scheduler output;
- each engine's drafter's sub-steps of the proposal after the step, as the step's
  build (``eager``, ``padded``, ``fresh``) with ``draft`` its sub-step; its dummy runs'
  forwards as ``capture`` in a capture, else ``dummy``.

Every build of a forward with attention metadata also states ``kv_len`` and
``kv_slots`` by request, the keys the backend's kernels read and the KV slot of each,
derived from its own metadata (:meth:`_Engine.kv_fields`, :meth:`_Engine.kv_read`,
which each backend's engine reads its own way): ``vllm-v1-backends`` holds them across
backends, the step's other properties across its builds.

A request the step names finished (the trace's ``finished``) is sent in
``finished_req_ids``; one a step leaves out and not finished is unscheduled (a
preempted one comes back resumed, ``resumed_req_ids``), as the scheduler tells a V1
runner. The fresh engine never held a finished request: its row left behind must
change nothing.

Declined: the V2 runner's cases (``config.runner``), varlen decode graphs (a V2
runner's adaptive verification), and block sizes the Triton backend has no kernel
block size for (not a multiple of 16: ``prepare_kernel_block_sizes`` raises).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any
from unittest import mock

import attnfuzz.kernels._triton  # noqa: F401  (TRITON_INTERPRET before vLLM's kernels are defined)
import numpy as np
import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_speculator as speculating
from attnfuzz.adapters.vllm.lookahead import Lookahead, num_lookahead_tokens
from attnfuzz.adapters.vllm.lookahead import declines as lookahead_declines
from attnfuzz.adapters.vllm.runner_step import (
    _LAYER,
    PAD_SLOT_ID,
    _Peer,
    _peer,
    _scheduler_output,
    _vllm_config,
    attention_pages,
    held_between_steps,
    held_by_dummies,
    num_blocks,
    prefill_then_decode,
)
from attnfuzz.adapters.vllm.slot_mapping import host_memory
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import (
    NO_REAL_ROWS,
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
)
from attnfuzz.reference.trace import Trace

_WHERE = "vllm/v1/worker/gpu_model_runner.py: GPUModelRunner.execute_model"


def prepare() -> None:
    """Import vLLM's V1 runner before a judge forks."""
    _engine.prepare()
    import vllm.compilation.cuda_graph  # noqa: F401
    import vllm.v1.attention.backends.triton_attn  # noqa: F401
    import vllm.v1.worker.gpu_model_runner  # noqa: F401


def declines(case: Case, lookahead: Lookahead = num_lookahead_tokens) -> str | None:
    """Why the V1 runner does not run ``case``'s engine, else None: its config's
    (:func:`declines_config`), then a step whose pages do not hold the drafter's
    ``lookahead`` (:func:`step_declines`)."""
    return declines_config(case.config) or step_declines(case, lookahead)


def step_declines(case: Case, lookahead: Lookahead = num_lookahead_tokens) -> str | None:
    """Why the V1 runner does not run ``case``'s step on an engine it runs: a request
    whose pages do not hold the drafter's ``lookahead`` (:func:`.lookahead.declines`)."""
    return lookahead_declines(case, lookahead(case.config))


def declines_config(config: EngineConfig) -> str | None:
    """Why the V1 runner does not run an engine of ``config``, else None."""
    if config.runner != "v1":
        return "the V2 model runner has another execute_model (gpu/model_runner.py)"
    if config.varlen_decode:
        return (
            "varlen decode graphs are the V2 runner's adaptive verification "
            "(gpu/spec_decode/adaptive_verification.py); V1 has none"
        )
    if not _triton_backend().supports_block_size(config.block_size):
        # initialize_kv_cache: prepare_kernel_block_sizes finds no kernel block size
        # for the Triton backend's (select_common_block_size raises).
        return (
            f"block_size {config.block_size}: the Triton attention backend's kernel "
            "block sizes are multiples of 16 (triton_attn.py get_supported_kernel_block_sizes)"
        )
    return None


# -- stand-ins -----------------------------------------------------------------------------


@dataclass
class _Seen:
    """What one forward read: the attention metadata of the layer (None: a forward that
    builds none, as a PIECEWISE capture), its slot mapping and the positions."""

    meta: Any
    slot_mapping: torch.Tensor | None
    positions: torch.Tensor
    # A second KV-cache group's layer's metadata (a hybrid model's linear attention),
    # None where the engine has none or the forward built none.
    linear: Any = None
    # The engine's copy of the attention metadata's fields (None: the Triton backend's).
    freeze: Any = None
    pages: int | None = None  # the KV cache's pages when it ran (None: the engine's)
    # The runner's 1-D positions of the forward's tokens where ``positions`` are an
    # M-RoPE model's (a row a channel, :mod:`.runner_step_v1_mrope`); None: the same.
    flat_positions: torch.Tensor | None = None
    # The drafter's sub-step of the forward (0: its first pass; None: not a draft's).
    draft: int | None = None

    def frozen(self) -> _Seen:
        """What the forward reads now: the persistent buffers change after it."""
        meta = None
        if self.meta is not None and self.freeze is not None:
            meta = self.freeze(self.meta)
        elif self.meta is not None:
            names = ("query_start_loc", "seq_lens", "block_table")
            meta = SimpleNamespace(**{n: getattr(self.meta, n).clone() for n in names})
        slots = None if self.slot_mapping is None else self.slot_mapping.clone()
        linear = None
        if self.linear is not None:
            # Every tensor the metadata holds, as it is now (None where it holds none).
            linear = SimpleNamespace(**{
                n: v.clone() if isinstance(v, torch.Tensor) else v
                for n, v in vars(self.linear).items()
            })  # fmt: skip
        flat = None if self.flat_positions is None else self.flat_positions.clone()
        positions = self.positions.clone()
        return _Seen(meta, slots, positions, linear, self.freeze, self.pages, flat, self.draft)


@dataclass
class _Recorder:
    """Where the model and the graphs report what they read (``kind``: the build it
    belongs to; None: nobody listens)."""

    kind: str | None = None
    where: str = ""
    seen: list[tuple[str, str, _Seen]] = field(default_factory=list)
    capturing: Any = None  # the graph being captured, which keeps what the forward read
    # The drafter's forwards of a proposal: (kind, draft sub-step, what it read).
    drafted: list[tuple[str, int, _Seen]] = field(default_factory=list)
    draft: int | None = None  # the next draft sub-step while the drafter proposes
    first_pass: int = 0  # the real tokens of the proposal's first pass
    drafting: bool = False  # the drafter runs (its all-reduces are its peer's drafter's)
    # The target's logits of the step's sampled rows (their count in, the logits out):
    # what makes greedy sampling accept the drafts the step accepts (:func:`_logits`).
    logits: Any = None
    linear_layer: str | None = None  # a second KV-cache group's layer, if the model has one
    freeze: Any = None  # the engine's copy of its attention metadata (_Seen.freeze)
    # The pages of the KV cache the runner holds now: the worker's, or the minimal one
    # of its start-up profiling (None: the engine's).
    kv_pages: Callable[[], int | None] = lambda: None
    # Of a forward's token count, the runner's 1-D positions of its tokens (a view of its
    # buffer), where the model is handed other positions (an M-RoPE model's,
    # :mod:`.runner_step_v1_mrope`); None: the model's are those.
    flat_positions: Callable[[int], torch.Tensor] | None = None

    def handed(self, positions: torch.Tensor, layer: str = _LAYER) -> _Seen:
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        metadata = context.attn_metadata
        slots = context.slot_mapping
        linear = None
        if metadata and layer == _LAYER and self.linear_layer is not None:
            linear = metadata.get(self.linear_layer)
        return _Seen(
            metadata[layer] if metadata else None,
            slots.get(layer) if isinstance(slots, dict) else None,
            positions,
            linear,
            self.freeze,
            self.kv_pages(),
            # The target's forwards only: a drafter's positions are its own buffer's.
            None
            if self.flat_positions is None or layer != _LAYER
            else self.flat_positions(positions.shape[-1]),
        )

    def draft_forward(self, positions: torch.Tensor) -> None:
        """What a draft forward read: a sub-step of a proposal, else a dummy run's."""
        if self.kind is None:
            return
        seen = self.handed(positions, drafting.DRAFT_LAYER)
        seen.draft = self.draft
        seen = seen.frozen()
        if self.draft is None:
            # The drafter's dummy run: of a capture, else while the engine holds requests
            # (a dummy run between steps, or a step's requests the drafter does not fit).
            where = "llm_base_proposer.py: SpecDecodeBaseProposer.dummy_run"
            self.seen.append(("capture" if self.kind == "capture" else "dummy", where, seen))
        else:
            self.drafted.append((self.kind, self.draft, seen))
            self.draft += 1


class _Model(torch.nn.Module):
    """The model: returns zero hidden states; inside a graph capture, the graph keeps
    what the forward read."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> torch.Tensor:
        if self.recorder.capturing is not None:
            self.recorder.capturing.read = self.recorder.handed(positions)
        return torch.zeros(positions.shape[-1], 1)  # an M-RoPE model's: a row a channel


class _Handed(torch.nn.Module):
    """What the runner calls as ``self.model`` (the graph wrapper or the model): records
    what it is handed, the step's own build, then runs it; its logits are zeros."""

    def __init__(self, inner: Any, recorder: _Recorder) -> None:
        super().__init__()
        self.inner = inner
        self.recorder = recorder

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        r = self.recorder
        if r.kind is not None:
            kind = "padded" if r.kind == "step" else r.kind
            r.seen.append((kind, r.where, r.handed(positions).frozen()))
        return self.inner(input_ids=input_ids, positions=positions, **kwargs)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.recorder.logits is None:
            return torch.zeros(hidden_states.shape[0], 1)
        return self.recorder.logits(hidden_states.shape[0])


class _Graph:
    """A CUDA graph whose capture keeps what the captured forward read and whose replay
    computes nothing: it reports those reads (views of the persistent buffers) as the
    runner's preparation left them."""

    def __init__(self, recorder: _Recorder) -> None:
        self.recorder = recorder
        self.read: _Seen | None = None

    def replay(self) -> None:
        if self.read is None:
            raise RuntimeError("attnfuzz: a graph replayed that captured no forward")
        r = self.recorder
        if r.kind is not None:
            kind = "replay" if r.kind == "step" else r.kind
            where = f"compilation/cuda_graph.py: CUDAGraphWrapper.__call__ ({r.where})"
            r.seen.append((kind, where, self.read.frozen()))


class _Stream:
    """A CUDA stream on no device: the runner's copies to the host run in order on the
    host."""

    def wait_stream(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Event:
    """A CUDA event on no device (the CPU backend has none): the host's copies are done
    when ``record`` returns."""

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


class _GraphPools:
    """The platform as ``profile_cudagraph_memory`` asks it: a throwaway graph pool's
    handle a token (no graph is captured here), the rest the platform's."""

    def __init__(self, platform: Any) -> None:
        self.platform = platform

    def graph_pool_handle(self) -> Any:
        return object()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.platform, name)


def _one_rank() -> Any:
    """``get_pp_group()``: a single pipeline stage."""
    return SimpleNamespace(is_first_rank=True, is_last_rank=True, ranks=[0], world_size=1)


@contextlib.contextmanager
def _graphs(recorder: _Recorder) -> Iterator[None]:
    """``cuda_graph``'s CUDA graphs, pool and stream, and the runner's pipeline group and
    progress bar, stood in."""
    import vllm.compilation.cuda_graph as cg
    import vllm.v1.worker.gpu_model_runner as gmr

    @contextlib.contextmanager
    def graph(g: _Graph, pool: Any = None, stream: Any = None) -> Iterator[None]:
        recorder.capturing = g
        try:
            yield
        finally:
            recorder.capturing = None

    cuda = SimpleNamespace(CUDAGraph=lambda: _Graph(recorder), graph=graph)

    class Torch:
        """``torch`` as ``cuda_graph`` sees it: its ``cuda`` graphs stood in."""

        def __getattr__(self, name: str) -> Any:
            return cuda if name == "cuda" else getattr(torch, name)

    with (
        mock.patch.multiple(
            cg,
            torch=Torch(),
            capture_pool=lambda pool, vllm_config: contextlib.nullcontext(None),
            current_stream=lambda: None,
            weak_ref_tensors=lambda t: t,
        ),
        mock.patch.multiple(gmr, get_pp_group=_one_rank, is_global_first_rank=lambda: False),
    ):
        yield


# -- the runner ----------------------------------------------------------------------------


@functools.cache
def _triton_backend() -> type:
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    return TritonAttentionBackend


class _Engine:
    """One V1 runner: made by its constructor, given the KV-cache group and attention
    group ``initialize_kv_cache`` would give it (it also allocates the cache and binds the
    layers, of which there are none here), its model wrapped as ``load_model`` does, and
    its graphs captured as ``capture_model`` does."""

    padded_drafts = True  # the speculative config's drafter batch (disable_padded_drafter_batch)
    # SchedulerConfig.async_scheduling as the engine runs with it (the CPU platform turns
    # it off; a CUDA engine's VllmConfig turns it on where nothing is incompatible).
    async_scheduling = False
    # The drafter the speculative config makes (runner_step_speculator's kinds: MTP keeps
    # the tiny model's own MTP layer, an EagleProposer).
    speculator = speculating.MTP
    # The engine's copy of its attention metadata, taken as a consumer reads it
    # (_Seen.freeze); None: the metadata object itself.
    freeze: Callable[[Any], Any] | None = None
    # Where the model and the graphs report what they read (an engine that reads more of
    # the forward context than one layer's metadata reports it in its own).
    recorder_type: type[_Recorder] = _Recorder

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        """What the backend reads of the GPU and its vendor packages, stood in while the
        engine is built (its capture runs build metadata) and at every step (nothing
        here; a vendor backend's engine names its own)."""
        return contextlib.nullcontext()

    def __init__(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        self.config, self.device = config, device  # what platform() may read
        with self.platform():
            self._build(config, device, mode)

    def _build(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        import vllm.v1.worker.gpu_model_runner as gmr
        from vllm.config import CUDAGraphMode, set_current_vllm_config
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.worker.utils import AttentionGroup

        self.config, self.device = config, device
        self.recorder = self.recorder_type()
        self.recorder.freeze = self.freeze
        # The V2 speculator's choice is V2's: MTP leaves the speculative config as it is
        # (the V1 drafter's is set below).
        vc = self.vllm_config = self.make_config(config, mode)
        vc.scheduler_config.async_scheduling = self.async_scheduling
        if vc.speculative_config is not None:
            vc.speculative_config = drafting.speculative_config(
                vc.speculative_config, config, self.padded_drafts
            )
        with (
            host_memory(device),
            _engine.worker_workspace(device),
            set_current_vllm_config(vc),
            mock.patch.object(gmr, "get_pp_group", _one_rank),
            # The copy streams and events of sampled and drafted tokens: CUDA's, which
            # no CPU has.
            mock.patch("torch.cuda.Stream", lambda *a, **k: _Stream()),
            mock.patch("torch.Event", lambda *a, **k: _Event()),
            mock.patch("torch.cuda.Event", lambda *a, **k: _Event()),
        ):
            r = self.runner = self.runner_type()(vc, device)
            self.recorder.kv_pages = self.kv_pages
            layers = [_LAYER]
            if r.speculative_config is not None:
                # load_model: the drafter's model and its layer, in the target's group.
                self.install_drafter()
                layers.append(drafting.DRAFT_LAYER)
            attention, spec = self.attention_group()
            groups = [KVCacheGroupSpec(layers, spec)]
            backends: list[type] = [attention]
            attn_groups = [[AttentionGroup(attention, [_LAYER], spec, 0)]]
            for backend, layer, other in self.more_groups():
                attn_groups.append([AttentionGroup(backend, [layer], other, len(groups))])
                groups.append(KVCacheGroupSpec([layer], other))
                backends.append(backend)
            kv = KVCacheConfig(
                num_blocks=self.pool_size(), kv_cache_tensors=[], kv_cache_groups=groups
            )
            self.set_up_kv_cache(kv, attn_groups)
            resolved = vc.compilation_config.cudagraph_mode
            if resolved != self.resolves_to(CUDAGraphMode[mode]):
                raise RuntimeError(f"attnfuzz: vLLM resolved cudagraph_mode {mode} to {resolved}")
            r.model = self.load(resolved)
            # A release whose worker does not profile the graphs' memory has no such method.
            if (
                self.profiles
                and resolved != CUDAGraphMode.NONE
                and hasattr(r, "profile_cudagraph_memory")
            ):
                self.profile()
        self.held: set[str] = set()
        # The tokens of each request new to the engine whose prompt the step alone does
        # not tell (a fresh engine's warm-up of a request its twin is still recomputing).
        self.prompts: dict[str, int] = {}
        # Each request's tokens (prompt and outputs) before the last step it was told.
        self.tokens: dict[str, int] = {}
        self.warm_up()
        self.capture()

    def runner_type(self) -> type:
        """The runner class the worker makes: a CUDA worker's ``GPUModelRunner`` (the CPU
        worker's subclass, :mod:`.runner_step_cpu`)."""
        import vllm.v1.worker.gpu_model_runner as gmr

        return gmr.GPUModelRunner

    def make_config(self, config: EngineConfig, mode: str) -> Any:
        """The engine's ``VllmConfig``: the runner's, of ``mode`` and the drafter (a
        model of another kind changes its model config, :mod:`.runner_step_v1_mrope`)."""
        return _vllm_config(config, mode, self.speculator)

    def warm_up(self) -> None:
        """``Worker.compile_or_warm_up_model``'s ``kernel_warmup`` before the capture
        (``model_executor/warmup/kernel_warmup.py``), of what builds attention metadata:
        where every attention group is FlashInfer's (and the model generates),
        ``mixed_batch_attention_warmup``, a ``_dummy_run`` of one prompt chunk beside
        one-token decodes (``create_mixed_batch``, ``force_attention``), built on the
        runner's fresh buffers and judged as a capture run's build. Called as vLLM calls
        it, not the whole ``kernel_warmup``: its other warm-ups tune kernels (and import
        vision packages) and build no metadata."""
        from vllm.model_executor.warmup.attention_warmup import mixed_batch_attention_warmup

        r = self.runner
        groups = [group for groups in r.attn_groups for group in groups]
        if r.is_pooling_model or not groups:
            return
        if not all(_backend_name(group.backend) == "FLASHINFER" for group in groups):
            return
        worker = SimpleNamespace(
            model_runner=r,
            use_v2_model_runner=False,
            scheduler_config=self.vllm_config.scheduler_config,
            model_config=self.vllm_config.model_config,
        )
        where = "attention_warmup.py: mixed_batch_attention_warmup (kernel_warmup)"
        with _running(self, "capture", where, contextlib.nullcontext()):
            mixed_batch_attention_warmup(worker)

    def kv_pages(self) -> int | None:
        """The pages of the KV cache the runner holds now (None: none yet)."""
        kv = getattr(self.runner, "kv_cache_config", None)
        return None if kv is None else int(kv.num_blocks)

    def set_up_kv_cache(self, kv: Any, attn_groups: list[list[Any]]) -> None:
        """What ``initialize_kv_cache`` sets up of the KV-cache config ``kv`` (it also
        allocates the cache and binds the layers, of which there are none here):
        ``initialize_attn_backend``'s mode the backends keep and its groups
        ``attn_groups``, their builders, the input batch of their block sizes."""
        from vllm.v1.worker.utils import prepare_kernel_block_sizes

        r = self.runner
        r.kv_cache_config = kv
        backends = [{groups[0].backend} for groups in attn_groups]
        r._check_and_update_cudagraph_mode(backends, kv.kv_cache_groups)
        r.attn_groups = attn_groups
        r.initialize_metadata_builders(kv, prepare_kernel_block_sizes(kv, r.attn_groups))
        r.may_reinitialize_input_batch(kv)

    profiles = False
    """Whether the worker profiles the graphs' memory before it sets up the KV cache."""

    def profile(self) -> None:
        """``Worker.determine_available_memory``'s ``profile_cudagraph_memory``, run as a
        CUDA worker runs it, after ``load_model`` and before ``initialize_kv_cache``: the
        KV-cache layout resolved as ``EngineCore._initialize_kv_caches`` does, a minimal
        KV cache (``_init_minimal_kv_cache_for_profiling``: vLLM's own
        ``initialize_kv_cache`` over ``min(max_num_reqs, max capture size)`` pages, from
        the layers' specs, each layer this engine's groups name), the first two
        descriptors of each mode captured over it (``_warmup_and_capture``, the first
        FULL one with ``profile_seq_lens``), then ``_cleanup_profiling_kv_cache``. Each
        forward a ``capture`` build, judged over the minimal cache's pages. The engine's
        KV cache set up again after it (:meth:`set_up_kv_cache`), as the worker's
        ``initialize_kv_cache`` does."""
        import vllm.v1.worker.gpu_model_runner as gmr
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            record_kv_cache_layout,
            resolve_kv_cache_layout,
        )

        r, vc, recorder = self.runner, self.vllm_config, self.recorder
        kv, attn_groups = r.kv_cache_config, r.attn_groups
        # The model's attention layers, as its construction registers them: each a
        # backend and a spec (the stand-in layer the draft model's is).
        context = vc.compilation_config.static_forward_context
        registered = dict(context)
        for group, groups in zip(kv.kv_cache_groups, attn_groups, strict=True):
            for name in group.layer_names:
                context[name] = drafting.draft_layer(vc, groups[0].backend, group.kv_cache_spec)
        backends = get_current_attn_backends(vc)
        layouts = [layout.name for layout in get_supported_kv_cache_layouts(backends)]
        layout = resolve_kv_cache_layout(vc, [layouts], list(r.get_kv_cache_spec().values()))
        record_kv_cache_layout(r.cache_config, layout.name)  # Worker.set_kv_cache_layout
        del r.kv_cache_config  # no KV cache before the worker's start-up profiling
        r.attn_groups = []
        recorder.kind = "capture"
        recorder.where = "gpu_model_runner.py: GPUModelRunner.profile_cudagraph_memory"
        try:
            with (
                host_memory(self.device),
                _graphs(recorder),
                self._context(),
                mock.patch.object(gmr, "current_platform", _GraphPools(gmr.current_platform)),
                mock.patch.object(gmr, "graph_capture", lambda device: contextlib.nullcontext()),
                # The device's synchronizations and memory queries: no device here.
                mock.patch("torch.accelerator.synchronize", lambda *a, **k: None),
                mock.patch("torch.accelerator.empty_cache", lambda *a, **k: None),
                mock.patch("torch.accelerator.get_memory_info", lambda *a, **k: (0, 0)),
            ):
                r.profile_cudagraph_memory()
        finally:
            recorder.kind = None
            context.clear()
            context.update(registered)
        self.set_up_kv_cache(kv, attn_groups)

    def load(self, resolved: Any) -> Any:
        """``load_model``'s model as the runner calls it: a FULL graph wrapper around the
        model where the mode has FULL graphs (no microbatching), what it is handed
        recorded (:class:`_Handed`)."""
        import vllm.compilation.cuda_graph as cg
        from vllm.config import CUDAGraphMode

        model: Any = self.target_model()
        if resolved.has_full_cudagraphs():
            with mock.patch.object(
                cg, "current_platform", SimpleNamespace(get_global_graph_pool=lambda: None)
            ):
                model = cg.CUDAGraphWrapper(model, self.vllm_config, CUDAGraphMode.FULL)
        return _Handed(model, self.recorder)

    def target_model(self) -> torch.nn.Module:
        """The stand-in model ``load_model`` loads (:class:`_Model`)."""
        return _Model(self.recorder)

    def install_drafter(self) -> None:
        """``load_model``'s drafter: its model and layer (:func:`.runner_step_drafter.install`)."""
        drafting.install(self.runner, self.recorder)

    def first_pass_tokens(self, out: Any, taken: dict[str, int]) -> int:
        """The real tokens of a proposal's first draft forward
        (:func:`.runner_step_drafter.first_pass_tokens`)."""
        return drafting.first_pass_tokens(out, taken, self.padded_drafts)

    def attention_group(self) -> tuple[type, Any]:
        """The attention layer's backend and KV-cache spec, as ``load_model`` and
        ``initialize_kv_cache`` find them: the Triton backend's (an MLA engine's differ,
        :mod:`.runner_step_mla`)."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        spec = FullAttentionSpec(
            block_size=self.config.block_size, num_kv_heads=1, head_size=16, dtype=torch.float32
        )
        return _triton_backend(), spec

    # What a hybrid model's engine adds (:mod:`.runner_step_hybrid`); one group here.

    def more_groups(self) -> list[tuple[type, str, Any]]:
        """The KV-cache groups past the attention one: (backend, layer, spec) each."""
        return []

    def pool_size(self) -> int:
        """``KVCacheConfig.num_blocks``: the one block pool every group takes from."""
        return num_blocks(self.config)

    def resolves_to(self, mode: Any) -> Any:
        """The cudagraph mode ``initialize_attn_backend`` keeps of ``mode``: the Triton
        backend supports every graph (``AttentionCGSupport.ALWAYS``)."""
        return mode

    def output(self, inputs: RunnerStepInputs) -> Any:
        """The step's scheduler output to this engine (:func:`_output`): a new request's
        prompt ``prompts`` says, where it says one; a running request scheduled only the
        drafts past its tokens, as ``Scheduler.schedule`` schedules them
        (``num_new_tokens + num_computed_tokens - num_tokens``: none for a request still
        recomputing what it had before it was preempted, whose query is a prefill chunk)."""
        out = _output(inputs, self.held)
        for new in out.scheduled_new_reqs:
            if new.req_id in self.prompts:
                new.prompt_token_ids = new.prefill_token_ids = [0] * self.prompts[new.req_id]
        requests = self.runner.requests
        self.tokens = {rid: requests[rid].num_tokens for rid in out.num_scheduled_tokens
                       if rid in requests}  # fmt: skip
        cached = out.scheduled_cached_reqs
        cached.num_output_tokens = [self.num_output_tokens(requests[rid]) for rid in cached.req_ids]
        # Scheduler._make_cached_request_data: the tokens of a request the step before did
        # not schedule (not in the persistent batch), which _update_states reads under
        # async scheduling to recover its outputs.
        for rid in cached.req_ids:
            if rid not in self.runner.input_batch.req_id_to_index:
                state = requests[rid]
                cached.all_token_ids[rid] = [*state.prompt_token_ids, *state.output_token_ids]
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        drafts = out.scheduled_spec_decode_tokens
        for rid in list(drafts):
            past = computed[rid] + out.num_scheduled_tokens[rid] - self.tokens[rid]
            if past <= 0:
                del drafts[rid]
            else:
                drafts[rid] = drafts[rid][:past]
        return out

    def num_output_tokens(self, state: Any) -> int:
        """A running request's output tokens as the scheduler counts them
        (``Scheduler._make_cached_request_data``: ``num_output_tokens`` and its
        placeholders): those the runner appended from its samples, which
        ``_update_states`` keeps where the count says all (a smaller count discards
        the rest, as after a failed KV load)."""
        return len(state.output_token_ids)

    def fields(self, seen: _Seen) -> tuple[Field, ...]:
        """Every field a consumer reads of one forward (:func:`_fields`), and what the
        backend's kernels read of the KV cache (:meth:`kv_fields`); where those are the
        Triton kernel's, the slot mapping names them as the keys each token's query
        reads (``Field.read_in``, *queries read their own keys*)."""
        fields = _fields(self.config, seen, self.kernel_block_size()) + self.kv_fields(seen)
        if type(self).kv_read is not _Engine.kv_read:
            return fields
        # A causal query attends to its own key: each token's slot is among the first
        # seq_lens keys of its request that the Triton kernel reads (kv_read). Another
        # backend's keys read are its own to relate to the slots it writes.
        return tuple(
            replace(f, read_in="kv_slots") if f.name == "slot_mapping" else f for f in fields
        )

    def kernel_block_size(self) -> int:
        """The attention group's kernel block size: the unit of its block table
        (``prepare_kernel_block_sizes``), of its slot mapping too. A backend whose kernel
        blocks are smaller than a page (``AttentionGroup.kernel_block_size``, set where
        the two differ) is handed a block table of kernel blocks
        (``AttentionGroup.create_metadata_builders``); the input batch's table is of pages."""
        kernel = self.runner.attn_groups[0][0].kernel_block_size
        return int(kernel or self.runner.input_batch.block_table[0].block_size)

    stale_drafts_judged = False
    """Whether what a builder derives from the query offsets through
    ``CommonAttentionMetadata``'s caches (each token's request,
    ``token_to_req_indices``; each request's computed tokens,
    ``compute_num_computed_tokens``) is held to the offsets in the drafter's sub-steps
    after its first pass too: vLLM 0.33.0's V1 drafter hands them its first pass's
    (``SpecDecodeBaseProposer.propose`` rewrites the offsets of its
    ``CommonAttentionMetadata`` in place; its ``_token_to_req_indices_cache`` and
    ``_num_computed_tokens_cache`` stay set), a difference of vLLM's own kept apart
    (docs/findings.md)."""

    def offsets_judged(self, seen: _Seen) -> bool:
        """Whether what ``seen``'s builder derives from the query offsets is held to
        them: on the target's forward and the drafter's first pass, on every sub-step
        where :attr:`stale_drafts_judged`."""
        return self.stale_drafts_judged or not seen.draft

    def kv_fields(self, seen: _Seen) -> tuple[Field, ...]:
        """``kv_len`` and ``kv_slots`` by request, derived from the forward's attention
        metadata as the backend's kernels read it (:meth:`kv_read`): what every backend
        states alike, whatever its fields are named (none for a forward with no
        metadata). No range: each is a function of fields whose ranges are judged. A
        row of slots is as wide as a block-table row reaches (at least
        ``cdiv(max_model_len, block_size)`` pages), in every build."""
        if seen.meta is None:
            return ()
        return kv_reading_fields(self.config, self.kernel_block_size(), {"": self.kv_read(seen)})

    def kv_read(self, seen: _Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as the Triton backend's kernel reads
        them: ``triton_unified_attention.py kernel_unified_attention_*`` reads the
        first ``seq_lens[i]`` keys of sequence ``i`` (the step's own included: the
        cache is written before the forward), key ``j`` in page
        ``block_table[i, j // block_size]`` at ``j % block_size``."""
        m = seen.meta
        return paged_keys(_np(m.seq_lens), _np(m.block_table), self.kernel_block_size())

    def capture(self) -> None:
        """``capture_model``'s captures: each mode's batch descriptors of the dispatcher,
        largest first, ``_capture_cudagraphs``."""
        from vllm.compilation.monitor import set_cudagraph_capturing_enabled
        from vllm.config import CUDAGraphMode

        r = self.runner
        if r.compilation_config.cudagraph_mode == CUDAGraphMode.NONE:
            return
        self.recorder.kind = "capture"
        self.recorder.where = "gpu_model_runner.py: GPUModelRunner._capture_cudagraphs"
        set_cudagraph_capturing_enabled(True)
        try:
            with (
                host_memory(self.device),
                _graphs(self.recorder),
                self._context(),
                # The device synchronizations between captures: no device here.
                mock.patch("torch.accelerator.synchronize", lambda *a, **k: None),
            ):
                for mode, descs in r.cudagraph_dispatcher.get_capture_descs():
                    r._capture_cudagraphs(batch_descriptors=descs, cudagraph_runtime_mode=mode)
        finally:
            set_cudagraph_capturing_enabled(False)
            self.recorder.kind = None

    def _context(self) -> Any:
        from vllm.config import set_current_vllm_config

        stack = contextlib.ExitStack()
        stack.enter_context(set_current_vllm_config(self.vllm_config))
        stack.enter_context(self.platform())
        return stack


# -- one step ------------------------------------------------------------------------------


@contextlib.contextmanager
def _data_parallel(
    runner: Any,
    recorder: _Recorder,
    peer: _Peer | None,
    q_lens: tuple[int, ...] | None = None,
) -> Iterator[None]:
    """The runner as rank 0 of two, the all-reduce answered with the column the peer's
    own ``_determine_batch_execution_and_padding`` fills (as ``execute_model`` calls it:
    microbatching where the engine's config has it), its requests' query lengths
    ``q_lens`` (None: the peer's tokens spread evenly, the last request taking the
    rest); one rank where ``peer`` is None.
    While the drafter runs (``recorder.drafting``), each all-reduce is answered with the
    next column the peer's drafter fills proposing for its step (a first pass of its
    tokens, then, with more than one draft, a draft loop of its requests)."""
    import vllm.v1.worker.dp_utils as dp_utils

    pc = runner.parallel_config
    if peer is None:
        pc.data_parallel_size, pc.data_parallel_rank = 1, 0
        yield
        return
    group = SimpleNamespace(device="cpu", device_group=None, cpu_group=None)
    column: list[torch.Tensor] = []

    class Collected(Exception):
        pass

    def collect(tensor: torch.Tensor, group: Any = None) -> None:
        column.append(tensor[:, 1].clone())
        raise Collected

    collect.stop = Collected  # type: ignore[attr-defined]

    def answer(tensor: torch.Tensor, group: Any = None) -> None:
        if not recorder.drafting:
            tensor[:, 1] += column[0]
        elif len(column) > 1:
            tensor[:, 1] += column.pop(1)
        else:
            raise RuntimeError("attnfuzz: the drafter reached more all-reduces than the peer's")

    if q_lens is None:
        q = np.full(peer.num_reqs, peer.num_tokens // peer.num_reqs, np.int32)
        q[-1] += peer.num_tokens - int(q.sum())
    else:
        q = np.asarray(q_lens, np.int32)
    try:
        pc.data_parallel_size, pc.data_parallel_rank = 2, 1
        with mock.patch.multiple(
            dp_utils, get_dp_group=lambda: group, dist=SimpleNamespace(all_reduce=collect)
        ):
            try:
                runner._determine_batch_execution_and_padding(
                    num_tokens=peer.num_tokens, num_reqs=peer.num_reqs,
                    num_scheduled_tokens_np=q, max_num_scheduled_tokens=int(q.max()),
                    # The peer's _allow_microbatching: its derived batch shares no
                    # prefix, so it splits where the thresholds let it (never without
                    # microbatching).
                    allow_microbatching=pc.use_ubatching,
                )  # fmt: skip
            except Collected:
                pass
            if not column:
                raise RuntimeError("attnfuzz: the peer rank's dispatch reached no all-reduce")
            if runner.speculative_config is not None:
                loop = (peer.num_reqs,) if runner.num_spec_tokens > 1 else ()
                drafting.peer_columns(runner, collect, (peer.num_tokens, *loop))
        pc.data_parallel_rank = 0
        with mock.patch.multiple(
            dp_utils, get_dp_group=lambda: group, dist=SimpleNamespace(all_reduce=answer)
        ):
            yield
    finally:
        pc.data_parallel_size, pc.data_parallel_rank = 1, 0


def _output(inputs: RunnerStepInputs, held: set[str]) -> Any:
    """The step's ``SchedulerOutput`` (:func:`.runner_step._scheduler_output`) as the
    scheduler sends it to a V1 runner that holds the requests ``held``: the requests
    finished since the last step in ``finished_req_ids`` (``Scheduler.schedule`` sends
    what ``finish_requests`` and ``_free_request`` collected; ``_update_states`` drops
    their state and rows, then condenses the batch); a request left out and not
    finished is left unscheduled (the scheduler preempts without telling the runner,
    which keeps its state); a request new to the step that the runner holds was
    preempted and is resumed (``resumed_req_ids``, all its pages, as
    ``Scheduler._make_cached_request_data``); each arriving request a greedy generation
    (V1's ``InputBatch.add_request`` takes sampling or pooling parameters)."""
    from vllm.sampling_params import SamplingParams

    out = _scheduler_output(inputs, set())
    out.finished_req_ids = {str(rid) for rid in inputs.finished_req_ids}
    cached = out.scheduled_cached_reqs
    arriving = []
    for new in out.scheduled_new_reqs:
        if new.req_id in held:
            cached.req_ids.append(new.req_id)
            cached.resumed_req_ids.add(new.req_id)
            cached.new_block_ids.append(new.block_ids)
            cached.num_computed_tokens.append(new.num_computed_tokens)
            cached.num_output_tokens.append(0)
        else:
            new.sampling_params = SamplingParams(temperature=0.0)
            arriving.append(new)
    out.scheduled_new_reqs = arriving
    # Scheduler.schedule: the drafts to propose, the config's (no dynamic speculation).
    out.num_spec_tokens_to_schedule = inputs.config.num_spec
    return out


def _backend_name(backend: type) -> str | None:
    """``kernel_warmup``'s ``_is_flashinfer_backend``: a backend's name, None where it
    names none."""
    try:
        return backend.get_name()
    except NotImplementedError:
        return None


@contextlib.contextmanager
def _running(engine: _Engine, kind: str, where: str, data_parallel: Any) -> Iterator[None]:
    """The runner's call in host memory, graph stand-ins, the engine's context and the
    data-parallel peer, what the model sees recorded as ``kind`` at ``where``."""
    engine.recorder.kind, engine.recorder.where = kind, where
    try:
        with host_memory(engine.device), _graphs(engine.recorder), engine._context(), data_parallel:
            yield
    finally:
        engine.recorder.kind = None


DRAFT_TOKEN = 0
"""The token of every draft the scheduler output carries (``runner_step._scheduler_output``)."""


def _logits(runner: Any, out: Any, taken: dict[str, int]) -> Any:
    """The target's logits of the step's sampled rows, as the model would make them for
    greedy sampling to accept ``taken`` drafts of each request: per request, in the
    runner's batch order (after ``_update_states``), a row per draft and one past them
    (``spec_decode_metadata``'s target and bonus rows; one row without drafts). The
    rejection sampler accepts a draft whose row's argmax is the draft's token: the
    first ``taken`` rows pick :data:`DRAFT_TOKEN`, the next another token (the rejected
    draft's recovered token, or the bonus token)."""

    def logits(rows: int) -> torch.Tensor:
        drafts = out.scheduled_spec_decode_tokens
        picks: list[int] = []
        for rid in runner.input_batch.req_ids:
            d = len(drafts.get(rid, ()))
            picks += [DRAFT_TOKEN] * taken[rid] + [DRAFT_TOKEN + 1] * (d + 1 - taken[rid])
        if len(picks) != rows:
            raise RuntimeError(
                f"attnfuzz: {rows} sampled rows, the step's drafts make {len(picks)}"
            )
        values = torch.zeros(rows, runner.input_batch.vocab_size)
        values[torch.arange(rows), torch.tensor(picks, dtype=torch.long)] = 1.0
        return values

    return logits


@contextlib.contextmanager
def _sampling(engine: _Engine, out: Any, taken: dict[str, int]) -> Iterator[None]:
    """``sample_tokens``' host stand-ins: greedy sampling as on a GPU (``argmax``; the
    CPU platform's ``_C.greedy_argmax`` is a compiled op this build lacks), the copy
    streams, and the drafter's proposal reported to the recorder as the step's draft
    sub-steps (``propose_draft_token_ids``, the real tokens of its first pass those of
    :func:`.runner_step_drafter.first_pass_tokens`)."""
    from vllm.v1.sample.sampler import Sampler

    r, rec = engine.runner, engine.recorder
    propose = r.propose_draft_token_ids

    def proposed(*args: Any, **kwargs: Any) -> Any:
        rec.draft = 0
        rec.first_pass = engine.first_pass_tokens(out, taken)
        try:
            return propose(*args, **kwargs)
        finally:
            rec.draft = None

    def greedy(logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1).view(-1)

    with (
        mock.patch.object(Sampler, "greedy_sample", staticmethod(greedy)),
        mock.patch.object(r, "propose_draft_token_ids", proposed),
        mock.patch("torch.cuda.stream", lambda stream: contextlib.nullcontext()),
        mock.patch("torch.cuda.current_stream", lambda *a, **k: _Stream()),
        # Async scheduling's output copy (AsyncGPUModelRunnerOutput): its stream, made
        # on first use, and its event.
        mock.patch("torch.cuda.Stream", lambda *a, **k: _Stream()),
        mock.patch("torch.cuda.Event", lambda *a, **k: _Event()),
    ):
        rec.drafting = True
        try:
            yield
        finally:
            rec.drafting = False


def _execute(engine: _Engine, out: Any, taken: dict[str, int], peer: _Peer | None = None) -> Any:
    """``execute_model`` of one scheduler output, then ``sample_tokens`` as the worker
    calls it: V1's rejection sampler on the model's logits (:func:`_logits`: its
    requests accept ``taken`` drafts), bookkeeping and the drafter's proposal; the
    runner's input batch after it."""
    r = engine.runner
    where = "gpu_model_runner.py: GPUModelRunner.execute_model"
    rec = engine.recorder
    with _running(engine, "step", where, _data_parallel(r, rec, peer)):
        rec.logits = _logits(r, out, taken)
        try:
            r.execute_model(out)
        finally:
            rec.logits = None
        with _sampling(engine, out, taken):
            r.sample_tokens(None)
    engine.held = set(r.requests)
    return r.input_batch


def _dummy(engine: _Engine, inputs: RunnerStepInputs) -> None:
    """``Worker.execute_dummy_batch``: this rank idle while the peer runs the step."""
    r = engine.runner
    peer = _Peer(inputs.num_reqs, inputs.num_tokens, None, None)
    where = "gpu_model_runner.py: GPUModelRunner._dummy_run (execute_dummy_batch)"
    data_parallel = _data_parallel(r, engine.recorder, peer, inputs.query_lens)
    with _running(engine, "dummy", where, data_parallel):
        r._dummy_run(r.uniform_decode_query_len, uniform_decode=True)


# -- builds --------------------------------------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy().copy()


def _fields(
    config: EngineConfig, seen: _Seen, kernel_block: int | None = None
) -> tuple[Field, ...]:
    """Every field a consumer reads of one forward, padding rows included, with the range
    the consumer accepts (a forward with no attention metadata: its slot mapping and
    positions). ``kernel_block``: the block table's unit where the backend splits a page
    into kernel blocks (``prepare_kernel_block_sizes``; None: a page); a slot's number is
    the same in either unit."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    pages = attention_pages(config, seen.pages)
    slots = pages * config.block_size
    unit = kernel_block or config.block_size
    blocks = pages * (config.block_size // unit)
    out = []
    if m is not None:
        out += [
            # triton_unified_attention.py kernel_unified_attention_*: a sequence's query
            # rows are q[query_start_loc[i] : query_start_loc[i + 1]] of the token rows.
            Field("query_start_loc", "offsets", _np(m.query_start_loc), (0, tokens_pad)),
            # ... its keys are the first seq_lens[i] of the sequence, read through its
            # block-table row: no more than the row reaches.
            Field(
                "seq_lens",
                "requests",
                _np(m.seq_lens),
                (0, int(m.block_table.shape[1]) * unit),
            ),
            # ... block_table[i, j] indexes the KV cache's pages (KVCacheConfig.num_blocks),
            # or their kernel blocks; the kernel reads a row's first cdiv(seq_lens[i], unit).
            Field(
                "block_table",
                "requests",
                _np(m.block_table),
                (0, blocks - 1),
                row_lengths=-(-_np(m.seq_lens).astype(np.int64) // unit),
            ),
        ]
    if seen.slot_mapping is not None:
        # attention.py unified_kv_cache_update -> TritonAttentionImpl.do_kv_cache_update
        # (the Triton backend writes the cache outside forward): the forward context's
        # slot mapping; PAD_SLOT_ID (negative) skips a token.
        out.append(
            Field(
                "slot_mapping",
                "tokens",
                _np(seen.slot_mapping),
                (PAD_SLOT_ID, slots - 1),
                writes_kv=True,
            )
        )
    # rotary_embedding: cos_sin_cache[positions], the model's positions.
    out.append(Field("positions", "tokens", _np(seen.positions), (0, config.max_model_len - 1)))
    return tuple(out)


def bf16_attention_group(
    vllm_config: Any, config: EngineConfig, backend: type, head_size: int, **spec: Any
) -> tuple[type, Any]:
    """The attention group of an engine whose attention layer (and the MTP draft layer,
    where the drafter has one) is on ``backend``: its ``FullAttentionSpec`` of one KV
    head of ``head_size``, bf16 (``spec``: more of the spec, a V head size)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    layers = vllm_config.compilation_config.static_forward_context
    if drafting.DRAFT_LAYER in layers:
        layers[drafting.DRAFT_LAYER] = drafting.draft_layer(vllm_config, backend)
    return backend, FullAttentionSpec(
        block_size=config.block_size, num_kv_heads=1, head_size=head_size,
        dtype=torch.bfloat16, **spec,
    )  # fmt: skip


def page_slots(pages: np.ndarray, stop: int, block_size: int, start: int = 0) -> np.ndarray:
    """The KV slots of keys ``start`` to ``stop`` of a request whose block-table row is
    ``pages``: key ``j`` in page ``pages[j // block_size]`` at ``j % block_size``
    (``page * block_size + offset``, as the slot mapping counts), none past what the row
    reaches (its range is judged on the table)."""
    keys = np.arange(max(start, 0), max(min(stop, len(pages) * block_size), 0))
    return pages[keys // block_size].astype(np.int64) * block_size + keys % block_size


def token_requests(query_start_loc: np.ndarray, tokens: int) -> np.ndarray:
    """The request of each of ``tokens`` token rows as the query offsets place it (row
    ``r`` holds tokens ``query_start_loc[r]`` to ``query_start_loc[r + 1]``); a row past
    the last offset, ``len(query_start_loc) - 1``: no request's."""
    ends = query_start_loc[1:].astype(np.int64)
    return np.searchsorted(ends, np.arange(tokens), side="right").astype(np.int64)


def request_map_fields(
    name: str, owner: np.ndarray, query_start_loc: np.ndarray, rows: int, judged: bool
) -> list[Field]:
    """A builder's map of each token to its request's row (``name``: a row of the step's
    block table, so in range), and, where ``judged``, the request the step's query
    offsets place the token in (``<prefix>.token_request``), which the map must equal
    (*agreement within a build*)."""
    request = f"{name.rsplit('.', 1)[0]}.token_request"
    out = [Field(name, "tokens", owner, (0, max(rows - 1, 0)),
                 agrees_with=request if judged else None)]  # fmt: skip
    if judged:
        out.append(Field(request, "tokens", token_requests(query_start_loc, len(owner))))
    return out


def kv_reading_fields(
    config: EngineConfig, bs: int, readings: dict[str, tuple[np.ndarray, list[np.ndarray]]]
) -> tuple[Field, ...]:
    """``kv_len`` and ``kv_slots`` of each reading of one cache (the first is named
    ``kv_len``/``kv_slots``; each other, under its prefix, must equal it: two kernels of
    one step reading the same keys, *agreement within a build*). A row of slots is as
    wide as a block-table row reaches (at least ``cdiv(max_model_len, bs)`` pages) and
    as the widest reading."""
    widest = [len(s) for _, slots in readings.values() for s in slots]
    width = max([-(-config.max_model_len // bs) * bs, *widest])
    out: list[Field] = []
    for i, (prefix, (lengths, slots)) in enumerate(readings.items()):
        table = np.zeros((len(lengths), width), dtype=np.int64)
        for r, row in enumerate(slots):
            table[r, : len(row)] = row
        out += [
            Field(f"{prefix}kv_len", "requests", lengths, agrees_with="kv_len" if i else None),
            Field(f"{prefix}kv_slots", "requests", table, row_lengths=lengths,
                  agrees_with="kv_slots" if i else None),
        ]  # fmt: skip
    return tuple(out)


def paged_keys(
    seq_lens: np.ndarray, block_table: np.ndarray, block_size: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each request's ``seq_lens[i]`` keys read through its block-table row: lengths
    and slots by request (:func:`page_slots`)."""
    lengths = seq_lens.astype(np.int64)
    slots = [page_slots(block_table[i], int(n), block_size) for i, n in enumerate(lengths)]
    return lengths, slots


def _builds(engine: _Engine, num_reqs: int, num_tokens: int) -> list[StepBuild]:
    """The builds the model and the graphs reported, in order; emptied. A step's own
    builds have its real sizes, a capture or dummy run none; a dummy run inside a step
    holds all its requests (one between steps: :func:`.runner_step.held_by_dummies`)."""
    out = []
    for kind, where, seen in engine.recorder.seen:
        sizes = (0, 0) if kind in NO_REAL_ROWS else (num_reqs, num_tokens)
        live = tuple(range(num_reqs)) if kind == "dummy" else ()
        out.append(StepBuild(kind, *sizes, engine.fields(seen), where=where, live=live))
    engine.recorder.seen.clear()
    return out


def _drafts(engine: _Engine, how: str, num_reqs: int, num_tokens: int) -> list[StepBuild]:
    """The drafter's builds of the step's proposal, as ``how``; emptied. The first pass
    runs every token of the step (the padded drafter batch keeps a rejected draft's
    token as a row; the unpadded one drops it: ``_Recorder.first_pass``), each later
    sub-step one token per request."""
    out = []
    for _, draft, seen in engine.recorder.drafted:
        tokens = engine.recorder.first_pass if draft == 0 else num_reqs
        fields = engine.fields(seen)
        out.append(StepBuild(how, num_reqs, tokens, fields, drafting.WHERE, draft=draft))
    engine.recorder.drafted.clear()
    return out


def _step(
    engine: _Engine, inputs: RunnerStepInputs, out: Any, how: str, peer: _Peer | None = None
) -> list[StepBuild]:
    """The builds of one ``execute_model``: what it handed the model (as ``how``), a
    graph replay's, and the drafter's sub-steps (as ``how``) of the proposal after it."""
    taken = drafting.accepted(inputs, out.scheduled_spec_decode_tokens)
    batch = _execute(engine, out, taken, peer)
    builds = _builds(engine, batch.num_reqs, out.total_num_scheduled_tokens)
    handed = [b for b in builds if b.how == "padded"]
    if len(handed) != 1:
        raise RuntimeError(f"attnfuzz: execute_model handed the model {len(handed)} forwards")
    builds = [
        StepBuild(how, b.num_reqs, b.num_tokens, b.fields, _WHERE) if b.how == "padded" else b
        for b in builds
    ]
    return builds + _drafts(engine, how, batch.num_reqs, out.total_num_scheduled_tokens)


# -- the implementation --------------------------------------------------------------------


class _StartUpEngine(_Engine):
    """``vllm-v1``'s engine: the worker's start-up, its graph-memory profiling included
    (:meth:`_Engine.profile`). The implementations on other backends leave it out:
    it is the runner's code, not theirs, and it doubles what building an engine costs."""

    profiles = True


class RunnerStepEngine:
    """One vLLM V1 engine seen three ways: with the config's graphs and a data-parallel
    peer, eagerly (cudagraph mode NONE), and afresh each step."""

    engine_type: type[_Engine] = _StartUpEngine
    # Whether the dummy run between two steps is judged against the requests the engine
    # holds while it runs (a data-parallel rank that runs a dummy step while holding
    # requests it runs after). vLLM 0.33.0's V1 runner writes through them there: its
    # drafter through the last proposal's slots, a linear layer through the held
    # requests' block-table rows (findings kept apart, docs/findings.md), so its
    # implementations leave it out and the kept-apart entries judge it.
    judges_held = False

    def __init__(self) -> None:
        self.new_engine()

    def new_engine(self) -> None:
        self.key: tuple[EngineConfig, torch.device] | None = None
        self.graphs: _Engine | None = None
        self.eager: _Engine | None = None
        self.pages: dict[str, tuple[int, ...]] = {}  # the scheduler's: each request's pages

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        self._check(inputs)
        builds: list[StepBuild] = []
        if self.key != (inputs.config, inputs.device):
            self.key = (inputs.config, inputs.device)
            self.graphs = self.engine(inputs.config, inputs.device, inputs.config.cudagraph_mode)
            self.eager = self.engine(inputs.config, inputs.device, "NONE")
            builds += _builds(self.graphs, 0, 0)  # the capture runs
        graphs, eager = self.graphs, self.eager
        assert graphs is not None and eager is not None
        # This rank idle while the peer runs the step (a dummy run between two steps).
        _dummy(graphs, inputs)
        dummies = _builds(graphs, 0, 0)
        stepped = _step(eager, inputs, eager.output(inputs), "eager")
        rows = list(eager.runner.input_batch.req_ids)
        if self.judges_held:
            dummies = held_by_dummies(dummies, inputs, rows)
        builds += dummies + stepped
        peer = _peer(inputs, graphs.runner.uniform_decode_query_len)
        builds += _step(graphs, inputs, graphs.output(inputs), "padded", peer)
        held = {rid: self.pages.get(rid, ()) for rid in map(str, inputs.req_ids)}
        self.pages = {
            str(rid): (() if new else held[str(rid)]) + tuple(gained)
            for rid, new, gained in zip(
                inputs.req_ids, inputs.is_new, inputs.new_block_ids, strict=True
            )
        }
        builds += self._fresh(inputs, held, rows)
        return RunnerStepOutputs(tuple(builds))

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> _Engine:
        """A new engine of cudagraph mode ``mode``."""
        return self.engine_type(config, device, mode)

    @staticmethod
    def warm_computed(computed: int) -> int:
        """The computed tokens a running request of ``computed`` tokens is added with in
        the fresh engine's warm-up step (of one token): all but one."""
        return computed - 1

    @staticmethod
    def _check(inputs: RunnerStepInputs) -> None:
        top = num_blocks(inputs.config) - 1
        if any(p < 0 or p > top for pages in inputs.new_block_ids for p in pages):
            raise ValueError(f"attnfuzz: a page id outside the engine's KV cache [0, {top}]")

    def _fresh(
        self, inputs: RunnerStepInputs, held: dict[str, tuple[int, ...]], rows: list[str]
    ) -> list[StepBuild]:
        """The step on a new engine of mode NONE, its requests in the rows ``rows`` (the
        eager engine's, after the step): V1's persistent batch keeps a request in its row
        across steps, so which row a request holds is the engine's history by design.
        One warm-up step adds, in those rows, each running request as new (one token, at
        its computed tokens less one, with the pages it held) and a placeholder where a
        request new to the step sits; the step's own output then finishes the
        placeholders, and ``_update_states`` gives their rows, lowest first, to the new
        requests (as it gave the eager engine's, whose new requests also take rows in
        the order it adds them: holes lowest first, then appended)."""
        config = inputs.config
        fresh = self.engine(config, inputs.device, "NONE")
        index = {str(rid): i for i, rid in enumerate(inputs.req_ids)}
        if not all(inputs.is_new):
            warm = []
            for row, rid in enumerate(rows):
                i = index[rid]
                if inputs.is_new[i]:
                    warm.append((-1 - row, 0, ()))  # a placeholder: no step's id is negative
                else:
                    computed = inputs.num_computed_tokens[i]
                    warm.append((int(rid), self.warm_computed(computed), held[rid]))
                    # A request the eager engine is still prefilling (the runner's
                    # is_prefilling: fewer computed tokens than its prompt) or recomputing
                    # (preempted, back): its prompt all the tokens it had, so that the
                    # fresh engine's warm-up leaves it prefilling too (no token sampled,
                    # none drafted after). One that decodes is sampled its next token.
                    tokens = self.eager.tokens.get(rid, 0) if self.eager else 0
                    state = self.eager.runner.requests.get(rid) if self.eager else None
                    prompt = state.num_prompt_tokens if state is not None else 0
                    if tokens > computed + 1 or computed < prompt:
                        fresh.prompts[rid] = max(tokens, prompt)
            step = RunnerStepInputs(
                config=config,
                req_ids=tuple(w[0] for w in warm),
                is_new=(True,) * len(warm),
                num_computed_tokens=tuple(w[1] for w in warm),
                query_lens=(1,) * len(warm),
                new_block_ids=tuple(w[2] for w in warm),
                device=inputs.device,
            )
            warm = fresh.output(step)
            _execute(fresh, warm, drafting.accepted(step, warm.scheduled_spec_decode_tokens))
            fresh.recorder.seen.clear()
            fresh.recorder.drafted.clear()
        out = fresh.output(inputs)
        # The eager engine added the step's arrivals, then its resumed requests: listed
        # in the order of their rows, the fresh engine's arrivals take the same rows.
        out.scheduled_new_reqs.sort(key=lambda new: rows.index(new.req_id))
        return _step(fresh, inputs, out, "fresh")


ENGINE = RunnerStepEngine()
"""The engine of the implementation ``vllm-v1`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1`` of ``runner-step``: the step on :data:`ENGINE`, kept
    across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


class Mutated:
    """An implementation's engine run with ``patch()`` (a re-created defect of the
    engine's code, a context manager) in force during each step."""

    def __init__(self, engine: Any, patch: Any) -> None:
        self.engine, self.patch = engine, patch

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        with self.patch():
            return self.engine(inputs)


# -- a finding kept apart: the drafter's dummy run writes the last proposal's draft slots
# (docs/findings.md). vLLM 0.33.0's _dummy_run fills the target's slot mappings with -1
# ("Dummy runs have no real slot assignments"), then hands them to the drafter's
# dummy_run, which, the draft layer being among them, writes through its own slot-mapping
# buffer (SpecDecodeBaseProposer._get_slot_mapping with no new mapping): what the last
# proposal left there, the slots of the requests it drafted for.


def kept_apart(
    engine_type: type[RunnerStepEngine],
    doc: str,
    runner: dict[str, Any] | None = None,
    **engine: Any,
) -> Any:
    """An implementation on ``engine_type``'s engines, with the attributes ``runner`` on
    ``engine_type`` and ``engine`` on its engine (``engine_type.engine_type``; as
    ``stale_drafts_judged=True``): a finding kept apart, judged where the main
    implementation leaves it. Its engines are kept across calls; its ``new_engine()``
    drops them."""
    attributes = dict(runner or {})
    if engine:
        inner = engine_type.engine_type
        attributes["engine_type"] = type(f"KeptApart{inner.__name__}", (inner,), engine)
    kept = type(f"KeptApart{engine_type.__name__}", (engine_type,), attributes)()

    def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
        return kept(inputs)

    run.__doc__ = doc
    run.new_engine = kept.new_engine  # type: ignore[attr-defined]
    return run


def judging_held(engine_type: type[RunnerStepEngine], doc: str) -> Any:
    """:func:`kept_apart` with the dummy run between two steps judged against the
    requests the engine holds while it runs (``judges_held``)."""
    return kept_apart(engine_type, doc, runner={"judges_held": True})


run_drafter_dummy = judging_held(
    RunnerStepEngine,
    "``vllm-v1-drafter-dummy-slots``: ``vllm-v1`` with its dummy runs between steps "
    "judged against the requests it holds.",
)


def reach_drafter_dummy(found: Trace | Case) -> bool:
    """A V1 engine with a drafter (its dummy runs follow the target's)."""
    return found.config.runner == "v1" and found.config.num_spec >= 1


def trigger_drafter_dummy(found: Trace | Case) -> bool:
    """A request of one step that the next step runs on: the dummy run between them
    writes where the proposal after the first drafted for it."""
    return reach_drafter_dummy(found) and held_between_steps(found)


def smallest_drafter_dummy() -> Trace:
    """One request prefills 5 tokens, then decodes next_n = 2: the dummy run before the
    decode writes its draft KV at the prefill's first slots."""
    return prefill_then_decode("v1", 1)
