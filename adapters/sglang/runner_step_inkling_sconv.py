"""SGLang's decode graph runner step of an Inkling model, as the implementation
``sglang-inkling-sconv`` of ``runner-step``.

``sglang-hybrid-short-conv``'s engine (:mod:`.runner_step_short_conv`: the same model
runner, decode graph runner and ``HybridReqToTokenPool``), on the backend
``attention_registry.py:attn_backend_wrapper`` makes for an Inkling model (SGLang
0.5.23): ``layers/attention/linear/inkling_sconv_backend.py``'s
``InklingShortConvHybridAttnBackend`` over the Triton backend (what
``model_overrides/inkling.py`` pins where there is no fa4) and
``InklingShortConvAttnBackend``, every layer both full attention and short conv (the
model's ``full_attention_layer_ids`` and ``conv_layer_ids``: one layer here). What runs,
unchanged:

- ``InklingShortConvAttnBackend``: ``__init__`` (``_alloc_graph_buffers``, sized from the
  configured capture shapes), ``init_cuda_graph_state``, eager ``init_forward_metadata``
  (``_prepare_slot_indices``: ``_prepare_track_indices`` and the fused slot gather into
  the graph's buffer; ``_refresh_sconv_metadata``: ``_refresh_decode_metadata``,
  ``_refresh_extend_metadata``, ``_refresh_track_conv_indices``),
  ``init_forward_metadata_out_graph`` (a decode or verify: nothing, the pool's gather is
  recordable) and ``init_forward_metadata_in_graph`` (the decode's and verify's whole
  metadata, written into the graph-static buffers), ``conv_state_metadata``;
- ``InklingShortConvHybridAttnBackend``'s ``init_forward_metadata``,
  ``init_forward_metadata_out_graph`` and ``init_forward_metadata_in_graph``;
- SGLang's Triton metadata kernels, under Triton's interpreter:
  ``kernels/ops/mamba/mamba_state_indices_triton.py:fused_replay_state_indices``,
  ``models/inkling_common/kernels/sconv.py``'s ``fused_decode_sconv_metadata`` and
  ``fused_extend_sconv_metadata``, ``kernels/ops/mamba/sconv_tracking.py:
  fill_track_conv_indices``;
- ``HybridReqToTokenPool`` with Inkling's ``InklingConvCacheParams`` (six conv streams of
  ``sconv_kernel_size - 1`` = 3 positions) and the mamba extra buffer Inkling requires
  (``models/inkling.py`` asserts ``enable_mamba_extra_buffer``; ``_inkling_overrides``
  pins ``--mamba-radix-cache-strategy extra_buffer``): each request's working slot and
  its two ping-pong track slots (the overlap schedule's, SGLang's default).

Stand-ins, besides ``sglang-hybrid-gdn``'s, only for what a CPU lacks:

- CUDA placement (:func:`gpu_paths`): the backend module's ``is_cuda()`` answers True, and
  ``fused_extend_sconv_metadata``, ``fill_track_conv_indices`` and the backend's
  ``_refresh_track_conv_indices`` are recompiled from their own source with every
  ``tensor.is_cuda`` read answering True (:func:`placed_on_cuda`; every other line
  unchanged), so a CPU takes the path a GPU takes (the fused Triton kernels, not the
  unfused torch fallback SGLang keeps off CUDA);
- the graph (:class:`_InGraphPrep`): this backend writes a decode's and a verify's
  metadata inside the graph (``capture_one_shape``'s ``run_once`` calls
  ``_run_in_graph_metadata_prep``), so a capture runs that body once, as the warmup does,
  and keeps the metadata it made; a replay runs it again and writes each tensor it built
  into the captured metadata's tensor of the same place, as the recorded kernels write
  their captured outputs. The model's forward computes nothing;
- the scheduler's mamba tracking (:meth:`InklingEngine.plan_tracks`), as
  ``schedule_batch.py`` computes it: an extend's ``mamba_track_indices`` (the request's
  ping-pong slot at its ``mamba_next_track_idx``), ``mamba_track_mask`` (an extend of at
  least ``mamba_checkpoint_grid`` tokens: ``_mamba_radix_cache_v2_req_prepare_for_extend``)
  and ``mamba_track_seqlens``; a decode's (``prepare_for_decode``: tracked where the new
  length is a multiple of ``mamba_track_grid``); the track index flipped where tracked. A
  verify carries none (the decode graph keeps no track buffer under speculation:
  ``enable_mamba_track``); ``mamba_cache_chunk_size`` is pre-seeded on the server
  arguments (``overrides.mamba_cache_chunk_size`` honours it) at Inkling's value,
  ``max(64, page_size)``, as the model config is none here.

Builds: those of :mod:`.runner_step` (``capture``: the metadata each graph captured,
``eager``, ``padded``: the metadata the replay's in-graph preparation handed the backend,
``replay``: the metadata the graph captured, rewritten by the replay, ``fresh``).

Fields: the Triton engine's, and what ``conv_state_metadata`` hands the model's conv
modules (``models/inkling_common/sconv.py:ShortConvolution``), prefixed ``sconv.``, each
with the range its consumer accepts (:meth:`InklingEngine.accepts`, the consumer named):
``cache_indices`` (by request: the working slot the conv kernels read and update in place;
a graph's padding rows gather row 0's, the pool's dummy slot 0: ``Field.writes_state``,
``null_slot``), ``query_start_loc`` and ``cu`` (offsets), ``has_initial_state`` and
``cache_mask`` (by request, 0/1), ``safe_idx`` (by request: the slot ``causal_conv1d``
reads the initial window from), ``si`` (by token: its request), ``track_cache_indices``
(by request: the ping-pong slot a tracked request's window is written to, -1 where the
kernels write none: ``Field.writes_state``) and, for an extend, ``track_conv_indices``
(by request, ``conv_kernel - 1`` token indices each: the window snapshotted). A new
engine picks its own slots: the ``fresh`` build holds no slot field.

Mutant (a re-created defect of the track metadata):
``sglang-inkling-sconv-track-unclamped`` (``_track_conv_indices_kernel`` without its clamp
to the step's tokens: an extend shorter than the conv window, or an untracked request,
snapshots a window from before the step's first token, a negative token index: safe
padding, on the eager extend).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import math
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_hybrid as hybrid
from attnfuzz.adapters.sglang import runner_step_short_conv as short_conv
from attnfuzz.adapters.standins import function_tree, recompiled
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace, as_trace

BACKEND_MODULE = "sglang.srt.layers.attention.linear.inkling_sconv_backend"

LAYERS = [0]
"""The model's layers: each full attention (``full_attention_layer_ids``) and short conv
(``conv_layer_ids``, the mamba pool's layers)."""
LAYER = LAYERS[0]  # the layer whose conv metadata is read (the backend's is step-global)

SCONV_KERNEL = 4
"""``InklingModelConfig.sconv_kernel_size`` (its default): windows of 3 positions."""

MAMBA_CHUNK = 64
"""``InklingModelConfig.mamba_chunk_size``: 64, the floor it keeps."""

TRACK_INTERVAL = 256
"""``--mamba-track-interval``'s default."""

TRACK_SLOTS = 2
"""``allocation_sizing.get_mamba_tracking_slots``: two ping-pong slots a request with the
extra buffer and the overlap schedule (SGLang's default)."""


def prepare() -> None:
    """Import SGLang's runner and the Inkling backend before a judge forks."""
    short_conv.prepare()
    importlib.import_module(BACKEND_MODULE)


def declines(case: Case) -> str | None:
    """Why SGLang never runs an Inkling model on ``case``'s config, else None
    (:func:`declines_config`)."""
    return declines_config(case.config)


def declines_config(config: EngineConfig) -> str | None:
    """Why SGLang never runs an Inkling model on ``config``, else None: the extra buffer
    (``arg_groups/mamba_hook.py:validate_mamba_extra_buffer``) asks a track interval
    that is a multiple of the page (``mamba_track_interval % page_size == 0``), and
    ``overrides.mamba_cache_chunk_size`` a chunk and page of which one divides the
    other."""
    page = config.block_size
    if TRACK_INTERVAL % page or max(MAMBA_CHUNK, page) % min(MAMBA_CHUNK, page):
        return (
            f"page size {page}: SGLang runs Inkling's mamba extra buffer on pages that "
            f"divide the track interval {TRACK_INTERVAL} (arg_groups/mamba_hook.py: "
            "validate_mamba_extra_buffer)"
        )
    return None


# -- CUDA placement ---------------------------------------------------------------------------


class _OnCuda(ast.NodeTransformer):
    """Every ``<tensor>.is_cuda`` read answers True."""

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if node.attr == "is_cuda" and isinstance(node.ctx, ast.Load):
            return ast.copy_location(ast.Constant(True), node)
        return node


def placed_on_cuda(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` recompiled from its own source, in the engine's file and at its line
    numbers, with every ``tensor.is_cuda`` read answering True: every other line
    unchanged. Its globals are its module's (names patched there are seen)."""
    definition = function_tree(fn)
    definition.decorator_list = []
    return recompiled(fn, _OnCuda().visit(definition))


@functools.cache
def _placed() -> dict[str, Callable[..., Any]]:
    """The backend module's kernel wrappers that ask where a tensor is, placed on CUDA
    (recompiled once, from SGLang's own functions, before anything is patched in)."""
    from sglang.kernels.ops.mamba import sconv_tracking
    from sglang.srt.models.inkling_common.kernels import sconv

    return {
        "fused_extend_sconv_metadata": placed_on_cuda(sconv.fused_extend_sconv_metadata),
        "fill_track_conv_indices": placed_on_cuda(sconv_tracking.fill_track_conv_indices),
    }


@functools.cache
def _placed_track_refresh() -> Callable[..., Any]:
    backend = importlib.import_module(BACKEND_MODULE)
    return placed_on_cuda(backend.InklingShortConvAttnBackend._refresh_track_conv_indices)


@contextlib.contextmanager
def gpu_paths(fill_track: Callable[..., Any] | None = None) -> Iterator[None]:
    """The paths a CUDA GPU takes, in the backend module (put back after): ``is_cuda()``
    True, the kernel wrappers placed on CUDA (``fill_track``: a mutant's in place of
    ``fill_track_conv_indices``)."""
    backend = importlib.import_module(BACKEND_MODULE)
    placed = dict(_placed())
    if fill_track is not None:
        placed["fill_track_conv_indices"] = fill_track
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(backend, "is_cuda", lambda: True))
        for name, fn in placed.items():
            stack.enter_context(mock.patch.object(backend, name, fn))
        yield


# -- the graph --------------------------------------------------------------------------------


def _tensors(md: Any) -> Iterator[tuple[str, torch.Tensor | None]]:
    """Every tensor of an ``InklingShortConvMetadata``, with its place in it."""
    for name in md.__struct_fields__:
        value = getattr(md, name)
        if isinstance(value, dict):  # precomputed: SconvDecodeMetadata / SconvExtendMetadata
            for key, t in value.items():
                yield f"{name}[{key!r}]", t
        else:
            yield name, value


def rewrite(captured: Any, replayed: Any) -> None:
    """``replayed``'s tensors written into ``captured``'s at the same places: what the
    graph's recorded kernels do at a replay. The same places, shapes and dtypes, or this
    stand-in is wrong about the graph."""
    want, got = dict(_tensors(captured)), dict(_tensors(replayed))
    if want.keys() != got.keys():
        raise RuntimeError(
            f"attnfuzz's graph stand-in: the replay's metadata holds {sorted(got)}, "
            f"the capture's {sorted(want)}"
        )
    for place, t in want.items():
        new = got[place]
        if (t is None) != (new is None):
            raise RuntimeError(f"attnfuzz's graph stand-in: {place} set at one of capture "
                               "and replay only (a graph changes no launch)")  # fmt: skip
        if t is None or new is t:
            continue
        if new.shape != t.shape or new.dtype != t.dtype:
            raise RuntimeError(
                f"attnfuzz's graph stand-in: {place} of {tuple(new.shape)} {new.dtype} at "
                f"replay, {tuple(t.shape)} {t.dtype} at capture (a graph changes no shape)"
            )
        t.copy_(new)


def _computes_nothing(*args: Any, **kwargs: Any) -> None:
    """The model's forward inside the graph stand-in: its conv modules read the metadata
    the in-graph preparation wrote, never write it; nothing to compute."""
    return None


class _InGraphPrep(short_conv._ShortConvGraph):
    """The decode runner's graph where there is no CUDA, for a backend whose metadata is
    written inside the graph (module docstring): a capture runs the body (the in-graph
    preparation, then a forward that computes nothing) and records the metadata; a
    replay runs it again and rewrites the captured conv metadata with what it built."""

    def __init__(self, runner: Any) -> None:
        super().__init__(runner)
        self.bodies: dict[Any, Any] = {}

    def capture_one(
        self,
        shape_key: Any,
        forward_fn: Any,
        capture_inputs: Any = None,
        post_warmup_hook: Any = None,
    ) -> None:
        self._run(forward_fn)
        self.bodies[shape_key] = forward_fn
        super().capture_one(shape_key, forward_fn, capture_inputs, post_warmup_hook)

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        self._run(self.bodies[shape_key])
        backend = self.runner.attn_backend
        rewrite(self.graphs[shape_key].conv, backend.conv_state_metadata(LAYER, None))
        return super().replay(shape_key, static_forward_batch, **kwargs)

    def _run(self, body: Any) -> None:
        """``body`` run eagerly, as a warmup runs it: no stream is capturing (the runner's
        in-graph marker asks its device module)."""
        module = self.runner.device_module
        self.runner.device_module = _engine.StandIn(is_current_stream_capturing=lambda: False)
        try:
            body()
        finally:
            self.runner.device_module = module

    def cleanup(self) -> None:
        self.bodies.clear()
        super().cleanup()


# -- the engine -------------------------------------------------------------------------------


class _TrackedSlot(hybrid._Slot):
    """A request's KV handle with the extra buffer's fields (``schedule_batch.py``'s
    ``Req.kv``: what ``HybridReqToTokenPool.alloc`` / ``_alloc_ping_pong_buffer`` and
    ``free_mamba_cache`` read and write)."""

    def __init__(self) -> None:
        super().__init__()
        self.mamba_ping_pong_track_buffer: torch.Tensor | None = None
        self.mamba_ping_pong_empty: list[bool] | None = None
        self.mamba_prev_track_seqlen: int | None = None
        self.mamba_next_track_idx: int | None = None
        self.mamba_last_track_idx: int | None = None
        self.mamba_last_track_seqlen: int | None = None


_plain_server_args = decode._server_args


@contextlib.contextmanager
def inkling_server_args(config: EngineConfig, *args: Any, **extra: Any) -> Iterator[Any]:
    """``runner_step._server_args`` and what ``_inkling_overrides`` pins: the extra
    buffer; ``mamba_cache_chunk_size`` pre-seeded (module docstring)."""
    with _plain_server_args(
        config, *args, mamba_radix_cache_strategy="extra_buffer", **extra
    ) as server:
        server._mamba_cache_chunk_size = max(MAMBA_CHUNK, config.block_size)
        yield server


@dataclasses.dataclass
class _Tracks:
    """The step's tracking, as the scheduler hands it (by request)."""

    positions: list[int]
    mask: list[bool]
    seqlens: list[int]


def extend_track(computed: int, q: int, grid: int) -> tuple[bool, int]:
    """An extend's ``(track_mask, track_seqlen)``, as ``schedule_batch.py:
    _mamba_radix_cache_v2_req_prepare_for_extend`` computes it without DCP (``grid``:
    ``mamba_checkpoint_grid``): tracked when it extends at least ``grid`` tokens."""
    if q < grid:
        return False, -1
    aligned = computed + (q // grid) * grid
    if computed + (q // MAMBA_CHUNK) * MAMBA_CHUNK != aligned:
        return True, aligned + 1  # _force_track_h
    return True, computed + q


class InklingEngine(short_conv.ShortConvEngine):
    """``sglang-hybrid-short-conv``'s engine on Inkling's backend and pool."""

    GRAPH = _InGraphPrep
    PREFIX = "sconv"
    fill_track: Callable[..., Any] | None = None  # a mutant's fill_track_conv_indices

    WHERE = {
        "eager": "inkling_sconv_backend.py:InklingShortConvHybridAttnBackend."
        "init_forward_metadata (TritonAttnBackend's, InklingShortConvAttnBackend's)",
        "fresh": "inkling_sconv_backend.py:InklingShortConvHybridAttnBackend."
        "init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (buffers, "
        "Triton's; InklingShortConvAttnBackend.init_forward_metadata_in_graph's metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured, rewritten by the recorded init_forward_metadata_in_graph)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(init_forward_metadata_out_graph, then init_forward_metadata_in_graph)",
    }

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        self.tracks: _Tracks | None = None
        # The engine is built under Inkling's server arguments (runner_step's own name,
        # which _Engine.__init__ reads, put back after).
        with (
            mock.patch.object(decode, "_server_args", inkling_server_args),
            gpu_paths(self.fill_track),
        ):
            super().__init__(config, device, graphs)

    def _pool(self) -> Any:
        """``HybridReqToTokenPool`` as ``_build_hybrid_req_pool`` makes it for Inkling: a
        working slot and ``TRACK_SLOTS`` ping-pong slots a request, the extra buffer,
        the overlap schedule, Inkling's conv streams (``mamba2_cache_params``)."""
        from sglang.srt.configs.inkling import (
            InklingConvCacheParams,
            InklingConvStateShape,
            InklingStateDType,
        )
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        config, table = self.config, self.runner.req_to_token_pool.req_to_token
        width = SCONV_KERNEL - 1
        # Six streams (k, v, local k, local v, attention and MLP outputs), small dims.
        shape = InklingConvStateShape(conv=[(width, 8)] * 6, temporal=(0, 0, 0))
        params = InklingConvCacheParams(
            shape=shape,
            layers=LAYERS,
            dtype=InklingStateDType(conv=torch.bfloat16, temporal=torch.bfloat16),
        )
        return HybridReqToTokenPool(
            size=config.max_num_seqs,
            mamba_size=config.max_num_seqs * (1 + TRACK_SLOTS),
            mamba_spec_state_size=config.max_num_seqs,
            max_context_len=table.shape[1],
            device=str(self.device),
            enable_memory_saver=False,
            cache_params=params,
            mamba_layer_ids=LAYERS,
            enable_mamba_extra_buffer=True,
            speculative_num_draft_tokens=config.next_n if config.num_spec else None,
            speculative_eagle_topk=1 if config.num_spec else None,
            enable_overlap_schedule=True,
        )

    def make_backend(self) -> Any:
        """``InklingShortConvHybridAttnBackend(TritonAttnBackend,
        InklingShortConvAttnBackend(runner), full_attention_layer_ids)``, as
        ``attn_backend_wrapper`` builds it for an Inkling model."""
        backend = importlib.import_module(BACKEND_MODULE)
        made = hybrid.HybridGDNEngine.make_backend(self)
        sconv = made.linear_attn_backend
        # The one method whose own line asks a tensor where it is (module docstring).
        sconv._refresh_track_conv_indices = types.MethodType(_placed_track_refresh(), sconv)
        return backend.InklingShortConvHybridAttnBackend(made.full_attn_backend, sconv, LAYERS)

    def linear_backend(self) -> Any:
        backend = importlib.import_module(BACKEND_MODULE)
        return backend.InklingShortConvAttnBackend(self.runner)

    def _graph_runner(self) -> Any:
        # The graph stand-in runs the capture's forward, which computes nothing.
        self.runner.model = _engine.StandIn(
            shared_experts_config=None, forward=_computes_nothing, modules=lambda: iter(())
        )
        return super()._graph_runner()

    # -- the scheduler's requests and tracking ------------------------------------------------

    def admit(self, inputs: RunnerStepInputs) -> None:
        """``sglang-hybrid-gdn``'s admission, each request's handle with the extra
        buffer's fields (``alloc`` gives it its ping-pong slots)."""
        pool = self.runner.req_to_token_pool
        staying = {i for i, new in zip(inputs.req_ids, inputs.is_new, strict=True) if not new}
        for i in [i for i in self.requests if i not in staying]:
            del self.requests[i]
            req = self.slots_of.pop(i)
            pool.free_mamba_cache(req)
            pool.free(req)
        for i, new, gained in zip(inputs.req_ids, inputs.is_new, inputs.new_block_ids, strict=True):
            if new:
                req = _engine.StandIn(kv=_TrackedSlot())
                (row,) = pool.alloc([req])
                self.slots_of[i] = req
                self.requests[i] = decode._Request(row)
            self.requests[i].pages += list(gained)

    def write_rows(self, inputs: RunnerStepInputs) -> None:
        super().write_rows(inputs)
        self.tracks = self.plan_tracks(inputs)

    def plan_tracks(self, inputs: RunnerStepInputs) -> _Tracks | None:
        """The step's tracking as the scheduler computes it, once a step (module
        docstring); each tracked request's next ping-pong position flipped after."""
        from sglang.srt.runtime_context import mamba_checkpoint_grid, mamba_track_grid

        mode = decode.step_mode(inputs)
        if mode == "verify":
            return None
        page = self.config.block_size
        reqs = [self.slots_of[i].kv for i in inputs.req_ids]
        positions = [kv.mamba_next_track_idx for kv in reqs]
        if mode == "extend":
            grid = mamba_checkpoint_grid(page)
            entries = [
                extend_track(computed, q, grid)
                for computed, q in zip(inputs.num_computed_tokens, inputs.query_lens, strict=True)
            ]
            mask, seqlens = [m for m, _ in entries], [s for _, s in entries]
        else:
            # prepare_for_decode: the new length a multiple of mamba_track_grid.
            interval = mamba_track_grid(page)
            mask = [(c + 1) % interval == 0 for c in inputs.num_computed_tokens]
            seqlens = [-1] * len(mask)
        pool = self.runner.req_to_token_pool
        for kv, tracked in zip(reqs, mask, strict=True):
            if tracked:
                kv.mamba_last_track_idx = kv.mamba_next_track_idx
                kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(
                    kv.mamba_next_track_idx
                )
        return _Tracks(positions, mask, seqlens)

    def forward_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        """The Triton engine's ForwardBatch and the scheduler's tracking
        (``ScheduleBatch.prepare_for_extend`` / ``prepare_for_decode``:
        ``_gather_mamba_track_indices`` of the ping-pong mapping)."""
        fb = super().forward_batch(inputs, mode)
        tracks = self.tracks
        if tracks is None:
            return fb
        dev = self.device
        mapping = self.runner.req_to_token_pool.req_index_to_mamba_ping_pong_track_buffer_mapping
        positions = torch.tensor(tracks.positions, dtype=torch.int64, device=dev)
        fb.mamba_track_indices = mapping[fb.req_pool_indices, positions]
        fb.mamba_track_mask = torch.tensor(tracks.mask, dtype=torch.bool, device=dev)
        if mode == "extend":
            fb.mamba_track_seqlens = torch.tensor(tracks.seqlens, dtype=torch.int64, device=dev)
        return fb

    # -- builds -------------------------------------------------------------------------------

    def state_fields(self) -> tuple[str, ...]:
        """The fields of state slots, which a new engine picks itself."""
        return ("sconv.cache_indices", "sconv.safe_idx", "sconv.track_cache_indices")

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        build = super().eager(inputs, mode, how)
        if how != "fresh":
            return build
        fields = tuple(f for f in build.fields if f.name not in self.state_fields())
        return dataclasses.replace(build, fields=fields)

    def persistent_metadata(self, mode: str) -> Any:
        """Triton's persistent buffers after the replay preparation, and the conv
        metadata the replay's in-graph preparation handed the backend."""
        base = hybrid.HybridGDNEngine.persistent_metadata(self, mode)
        conv = self.backend.conv_state_metadata(LAYER, None)
        return _engine.StandIn(full=base.full, gdn=base.gdn, conv=conv, verify=base.verify)

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the Triton engine's,
        and the conv modules' (``models/inkling_common/kernels/sconv.py``)."""
        from sglang.srt.models.inkling_common.kernels.sconv import PAD_SLOT_ID

        acc = decode._Engine.accepts(self)
        slots = self.runner.req_to_token_pool.mamba_pool.size  # size + 1 rows, 0 the dummy
        # fused_causal_conv1d_update_decode (decode), update_sconv_cache (extend) and
        # save_intermediate_conv_windows (verify) read and update
        # sconv_cache[cache_indices[b]], skipping PAD_SLOT_ID.
        acc["sconv.cache_indices"] = (PAD_SLOT_ID, slots)
        # causal_conv1d (extend, verify) reads its initial window at sconv_cache[safe_idx[b]].
        acc["sconv.safe_idx"] = (0, slots)
        # fused_causal_conv1d_update_decode / fused_gather_scatter_to_sconv_cache write the
        # tracked window to sconv_cache[track_indices[b]]; a negative one is no write
        # (schedule_batch.py: set_mamba_track_indices_from_reqs).
        acc["sconv.track_cache_indices"] = (-1, slots)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The Triton backend's fields and the conv modules' metadata, for ``rows``
        requests and ``tokens`` tokens (padding included), copied now."""
        acc = self.accepts()
        md = metadata.conv
        pre = md.precomputed
        host = decode.host
        out = [
            Field(
                "sconv.cache_indices",
                "requests",
                host(md.cache_indices[:rows]),
                acc["sconv.cache_indices"],
                writes_state=True,
                null_slot=hybrid.DUMMY_SLOT,
            ),
            # causal_conv1d / update_sconv_cache read request b's tokens
            # [query_start_loc[b], query_start_loc[b + 1]); causal_conv1d the same by cu.
            Field(
                "sconv.query_start_loc",
                "offsets",
                host(md.query_start_loc[: rows + 1]),
                (0, tokens),
            ),
            Field("sconv.cu", "offsets", host(pre["cu"][: rows + 1]), (0, tokens)),
            # update_sconv_cache gates the old window on has_initial_state;
            # causal_conv1d reads it through cache_mask.
            Field(
                "sconv.has_initial_state",
                "requests",
                host(md.has_initial_state[:rows].to(torch.int64)),
                (0, 1),
            ),
            Field(
                "sconv.cache_mask",
                "requests",
                host(pre["cache_mask"].reshape(-1)[:rows].to(torch.int64)),
                (0, 1),
            ),
            Field(
                "sconv.safe_idx", "requests", host(pre["safe_idx"][:rows]), acc["sconv.safe_idx"]
            ),
            # causal_conv1d reads cu[si[t]] and safe_idx[si[t]]: a request of the step.
            Field("sconv.si", "tokens", host(pre["si"][:tokens]), (0, max(rows - 1, 0))),
        ]
        if md.track_cache_indices is not None:
            out.append(
                Field(
                    "sconv.track_cache_indices",
                    "requests",
                    host(md.track_cache_indices[:rows]),
                    acc["sconv.track_cache_indices"],
                    writes_state=True,
                    null_slot=hybrid.DUMMY_SLOT,
                )
            )
        if md.track_conv_indices is not None:
            # fused_gather_scatter_to_sconv_cache reads hidden_states[track_conv_indices[b, w]]:
            # every row in the step's tokens ("every row it may read must index inside this
            # replay's token buffer": _refresh_track_conv_indices).
            out.append(
                Field(
                    "sconv.track_conv_indices",
                    "requests",
                    host(md.track_conv_indices[:rows]),
                    (0, tokens - 1),
                )
            )
        return decode._Engine.metadata_fields(self, rows, tokens, metadata.full) + tuple(out)


class InklingLife(short_conv.ShortConvLife):
    """The engine of ``sglang-inkling-sconv``: :class:`InklingEngine`, kept across a
    life's steps, each step under Inkling's server arguments and the CUDA paths."""

    engine_class = InklingEngine

    def prepare(self) -> None:
        prepare()

    @contextlib.contextmanager
    def server_args(self, config: EngineConfig, attention_backend: str) -> Iterator[Any]:
        fill_track = self.engine_class.fill_track
        with inkling_server_args(config, attention_backend) as args, gpu_paths(fill_track):
            yield args


ENGINE = InklingLife()
"""The engine of the implementation ``sglang-inkling-sconv`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-inkling-sconv`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the track metadata, re-created ---------------------------------------


def unclamped_fill(
    *,
    query_start_loc: torch.Tensor,
    track_seqlens: torch.Tensor,
    prefix_lens: torch.Tensor | None,
    output: torch.Tensor,
    live: int,
    chunk_size: int,
) -> None:
    """``fill_track_conv_indices`` whose kernel leaves out its clamp
    (``index = tl.minimum(tl.maximum(index, 0), total - 1)``): SGLang's launch, then the
    live rows rewritten with the kernel's own index before that line (its floor of a
    negative length, its window offsets)."""
    _placed()["fill_track_conv_indices"](
        query_start_loc=query_start_loc,
        track_seqlens=track_seqlens,
        prefix_lens=prefix_lens,
        output=output,
        live=live,
        chunk_size=chunk_size,
    )
    width = output.shape[1]
    tracked = track_seqlens[:live].to(torch.int64)
    prefix = (
        torch.zeros_like(tracked) if prefix_lens is None else prefix_lens[:live].to(torch.int64)
    )
    aligned = torch.div(tracked - prefix, chunk_size, rounding_mode="floor") * chunk_size
    start = query_start_loc[:live].to(torch.int64) + aligned - width
    output[:live] = start[:, None] + torch.arange(width, dtype=torch.int64)


class _TrackUnclamped(InklingEngine):
    """``_track_conv_indices_kernel`` without its clamp to ``[0, total - 1]``: a
    request whose window reaches before the step's first token (an extend shorter
    than the window, or an untracked request) snapshots negative token indices."""

    fill_track = staticmethod(unclamped_fill)


class _MutantLife(InklingLife):
    def __init__(self, engine: type[InklingEngine]) -> None:
        self.engine_class = engine
        super().__init__()


TRACK_UNCLAMPED = _MutantLife(_TrackUnclamped)


def run_track_unclamped(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-inkling-sconv-track-unclamped``: :class:`_TrackUnclamped`."""
    return TRACK_UNCLAMPED(inputs)


run_track_unclamped.new_engine = TRACK_UNCLAMPED.new_engine  # type: ignore[attr-defined]


def _extends(trace: Trace | Case) -> list[RunnerStepInputs]:
    from attnfuzz.reference.runner_step import make_inputs
    from attnfuzz.reference.trace import as_trace

    steps = [make_inputs(case) for case in as_trace(trace).cases()]
    return [s for s in steps if s.num_reqs and decode.step_mode(s) == "extend"]


def reach_extend(trace: Trace | Case) -> bool:
    """An extend step: the backend builds its track windows."""
    return bool(_extends(trace))


def trigger_track_unclamped(trace: Trace | Case) -> bool:
    """An extend with a request whose window, unclamped, starts before the step's first
    token: ``query_start_loc[b] + aligned - (conv_kernel - 1) < 0``, ``aligned`` the
    kernel's chunk-floored tracked length (-64 and below for an untracked request)."""
    page = as_trace(trace).config.block_size
    chunk = max(MAMBA_CHUNK, page)  # mamba_cache_chunk_size; also the checkpoint grid
    for step in _extends(trace):
        start = 0
        for computed, q in zip(step.num_computed_tokens, step.query_lens, strict=True):
            _, seqlen = extend_track(computed, q, math.lcm(chunk, page))
            if start + (seqlen - computed) // chunk * chunk - (SCONV_KERNEL - 1) < 0:
                return True
            start += q
    return False


def smallest_track_unclamped() -> Trace:
    """One request arrives with one token: its window reaches three tokens before it."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    arrive = Batch((0,), (1,), 0, True, req_ids=(0,), pages=((1,),), new_pages=(1,))
    return Trace(config, (arrive,))
