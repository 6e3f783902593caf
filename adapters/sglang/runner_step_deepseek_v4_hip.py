"""SGLang's decode graph runner step on DeepSeek-V4's HIP radix backend (ROCm), as the
implementation ``sglang-deepseek-v4-hip-radix`` of ``runner-step``, and the EAGLE draft
after it on the HIP multi-step backend, as ``sglang-deepseek-v4-hip-radix-draft``.

The engine of :mod:`~attnfuzz.adapters.sglang.runner_step_deepseek_v4` (its model, pool,
SWA allocator, request rows, decode graph runner and server arguments), on the backend
``attention_registry.py:create_dsv4_backend`` makes on ROCm:
``layers/attention/deepseek_v4_backend_hip_radix.py:DeepseekV4HipRadixBackend``. What runs
of it, unchanged (SGLang 0.5.23): ``__init__``; ``init_forward_metadata`` (eager:
``_build_forward_metadata`` of a decode (``init_forward_metadata_decode``, then
``init_forward_metadata_in_graph``'s ``make_forward_metadata_from_raw_decode``), a target
verify of ``topk`` 1 (``init_forward_metadata_target_verify`` /
``init_forward_metadata_target_verify_old``, ``_move_to_device``) and an extend
(``_init_forward_metadata_prefill_from_batch``), each over ``init_forward_metadata_prefill``
or ``make_core_attn_metadata``: HIP's own ``get_swa_page_indices`` (the window gathered
in torch), ``attn_glue_hip.py``'s Triton ``page_table_from_req_to_token`` and
``sparse_buffers``, ``DSV4AttnMetadata.init_compression_metadata`` /
``init_flashmla_related``, ``init_forward_metadata_indexer``, the SWA write locations);
``init_cuda_graph_state``; ``init_forward_metadata_out_graph`` with ``in_capture=True``
for every capture batch size and, from ``load_batch``, the replay's
(``replay_cuda_graph_metadata_from``); ``on_after_cuda_graph_warmup``;
``get_cuda_graph_seq_len_fill_value``. Its Triton kernels run under Triton's interpreter.

Where HIP differs from CUDA, both run as they are: a decode graph's metadata is the raw
``DSV4RawDecodeMetadata`` (HIP's own class and ``copy_``), upgraded inside the graph; an
EAGLE verify's is not (only DSpark's defers into the graph): ``load_batch`` builds it
whole and ``DSV4Metadata.copy_`` writes it into the captured metadata, its
``assign_fields`` rebinding ``swa_out_cache_loc``, which the recorded in-graph body
writes. The platform is an MI300X (gfx942), what SGLang's default path does there:

- ``is_hip`` answers True where the metadata path asks it (:func:`rocm`):
  ``attention_registry._is_hip`` (the HIP backend), ``deepseek_v4_memory_pool._is_hip``,
  ``compressor_v2._is_hip``, ``dsv4/metadata.py`` (``PagedIndexerMetadata`` keeps no
  DeepGEMM schedule on HIP, and its ``copy_`` takes HIP's fields), ``unified_kv_gate``
  and ``sglang.srt.utils.is_hip`` (``_create_flashmla_metadata``: no FlashMLA schedule on
  HIP); ``is_gfx95_supported`` False, as SGLang finds it without a HIP build (the KV
  layout V4; the attention kernel, a forward's, ``tilelang``). A ROCm tensor is a
  ``cuda`` one: ``attn_metadata_kernels._inputs_on_cuda`` True (the Triton kernels).
- The environment's defaults: no ``unified_kv_triton``, no FP4 indexer, no OPUS prefill,
  no decoder SWA bounded replay, no request window. What ``arg_groups/model_hook.py`` sets
  for DeepSeek-V4 on ROCm (``SGLANG_OPT_USE_TOPK_V2``, ``SGLANG_OPT_USE_AITER_INDEXER``,
  ``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH``, ...) leaves the metadata path as the defaults do
  (the top-k plan made, no DeepGEMM schedule on HIP). No metadata call of that path
  reaches ``aiter`` (only the FP4 indexer's row-group probe at ``__init__`` and the
  forward's kernels would), nor FlashMLA or DeepGEMM: none is stood in, so an import of
  one fails loudly.
- SGLang's JIT planners, the sibling's stand-ins by their contract
  (:func:`runner_step_deepseek_v4.jit_stand_ins`): the compressors' plans and
  ``plan_topk_v2``; the host list ``_move_to_device`` pins is plain host memory.

The graph (:class:`_InGraphMetadata`): the sibling's stand-in (a capture runs the body,
the hook, the body; a replay runs the body again and writes its tensors into the captured
ones), keeping a capture as the tensors the graph's kernels read
(:func:`runner_step_deepseek_v4_draft.structure`: the backend goes on rebinding fields of
the one object a verify graph keeps) and running the
replay's body over a copy of what ``load_batch`` left (a replay runs no Python: the
fields the body rebinds stay as ``load_batch`` left them).

Builds: those of the sibling (``capture``, ``eager``, ``padded``: the backend's
``forward_metadata`` after ``load_batch``, a decode's raw metadata or a verify's copied
metadata without ``swa_out_cache_loc``, ``replay``, ``fresh``).

Fields, by metadata row (a decode's rows are its requests, a verify's and an extend's
their query tokens), each with the range its consumer on an MI300X accepts
(:meth:`HipRadixEngine.metadata_fields`, the consumer named at each): ``seq_lens_casual``;
``swa_topk_lengths`` and ``swa_page_indices`` (``flash_mla_with_kvcache_entrypoint``'s
tilelang kernel: ``indices[t, :topk_length[t]]``, -1 skipped); ``swa_out_cache_loc`` (the
SWA write); and where the compressed layers run (not a draft's): ``positions_casual`` and
``page_table`` and ``c4_topk_lengths_raw`` (the C4 indexer), ``c4_sparse_topk_lengths``,
``c128_topk_lengths_clamp1`` and ``c128_page_indices`` (the compressed layers'
attention), ``c4_out_loc`` and ``c128_out_loc`` (the compressors' writes,
``compress_norm_rope_store``). And ``kv_len`` and ``kv_slots``: the window each request's
last query token reads and its SWA slots.

The draft (:class:`HipRadixDraftEngine`, ``runner_step_deepseek_v4_draft``'s on ROCm's
backend): ``runner_step_draft``'s EAGLE draft runner
(``EAGLEDraftCudaGraphRunner`` whole) over ``DeepseekV4MultiStepBackend`` (``__init__``,
its ``init_forward_metadata``, ``init_cuda_graph_state``, ``init_forward_metadata_out_graph``
at capture and replay, ``init_forward_metadata_in_graph``, ``on_after_cuda_graph_warmup``)
on the draft's pool: one NextN layer of compress ratio 0 over the target allocator's
full-to-SWA mapping (``need_compress`` False: the window alone). Its graph
(:class:`_DraftInGraph`) runs ``run_once`` as the decode graph's stand-in runs its body.
Fields: the draft's inputs (``runner_step_draft``'s) and, for each draft step ``s`` whose
attention runs, ``seq_lens_casual.s``, ``swa_topk_lengths.s``, ``swa_page_indices.s``,
``swa_out_cache_loc.s`` by request; ``kv_len`` and ``kv_slots`` the last attending step's.

Mutant (a re-created defect of the decode graph's raw metadata):
``sglang-deepseek-v4-hip-radix-out-loc-stale`` (HIP's ``DSV4RawDecodeMetadata.copy_``
forgetting ``out_cache_loc``, recompiled from SGLang's source without that statement: the
recorded upgrade derives every replay's ``c4_out_loc`` and ``c128_out_loc`` from the
capture's zeros; replay equals eager).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_deepseek_v4 as dsv4
from attnfuzz.adapters.sglang import runner_step_deepseek_v4_draft as v4draft
from attnfuzz.adapters.sglang import runner_step_draft as draft
from attnfuzz.adapters.sglang.runner_step import arrive_then_step, replayed
from attnfuzz.adapters.standins import function_tree, recompiled
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

BACKEND_MODULE = "sglang.srt.layers.attention.deepseek_v4_backend_hip_radix"


def prepare() -> None:
    """Import SGLang's runner and the HIP radix backend before a judge forks its child."""
    dsv4.prepare()
    importlib.import_module(BACKEND_MODULE)


def declines(case: Case) -> str | None:
    """Why SGLang never runs ``case``'s config on DeepSeek-V4, else None: the HIP backend
    asserts pages of 256 as the CUDA one does (``DeepseekV4HipRadixBackend.__init__``)."""
    return dsv4.declines(case)


def _is_hip() -> bool:
    """``sglang.srt.utils.is_hip``, as a ROCm build of torch answers it."""
    return True


def _tensor_unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
    """``torch.tensor`` on a CPU: a pinned host list is a plain one (CPU-only torch has no
    pinned allocator)."""
    return torch.tensor(*args, **kwargs)


@contextlib.contextmanager
def rocm() -> Iterator[None]:
    """While the engine is built or steps: the platform an MI300X answers, and SGLang's
    CUDA-only JIT planners stood in (module docstring)."""
    from sglang.kernels.ops.attention.dsv4 import attn_metadata_kernels
    from sglang.srt import utils
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.layers.attention.dsv4 import compressor_v2, metadata, unified_kv_gate
    from sglang.srt.mem_cache import deepseek_v4_memory_pool

    backend = importlib.import_module(BACKEND_MODULE)
    unpinned = types.SimpleNamespace(**{**vars(torch), "tensor": _tensor_unpinned})
    with (
        mock.patch.object(utils, "is_hip", _is_hip),
        mock.patch.object(metadata, "is_hip", _is_hip),
        mock.patch.object(unified_kv_gate, "is_hip", _is_hip),
        mock.patch.object(attention_registry, "_is_hip", True),
        mock.patch.object(deepseek_v4_memory_pool, "_is_hip", True),
        mock.patch.object(compressor_v2, "_is_hip", True),
        mock.patch.object(attn_metadata_kernels, "_inputs_on_cuda", lambda *a, **k: True),
        mock.patch.object(backend, "torch", unpinned),
        dsv4.jit_stand_ins(),
    ):
        yield


class _InGraphMetadata(dsv4._InGraphMetadata):
    """The CUDA sibling's graph stand-in, its capture kept as the tensors the graph's
    kernels read: the HIP backend's verify graph keeps one metadata object per batch size
    and rebinds its fields at each replay (``DSV4AttnMetadata.copy_``'s ``assign_fields``),
    while the graph reads what it captured."""

    def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
        super().capture_one(shape_key, *args, **kwargs)
        self.graphs[shape_key] = v4draft.structure(self.graphs[shape_key])

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        # The body runs over a copy of what load_batch left: a replay runs no Python, so
        # the fields the recorded body rebinds stay as load_batch left them.
        backend = self.runner.attn_backend
        left = backend.forward_metadata
        backend.forward_metadata = v4draft.structure(left)
        try:
            return super().replay(shape_key, static_forward_batch, **kwargs)
        finally:
            backend.forward_metadata = left


class HipRadixEngine(dsv4.DeepseekV4Engine):
    """One SGLang engine whose model runner's attention backend is DeepSeek-V4's HIP radix
    backend."""

    GRAPH = _InGraphMetadata
    WHERE = {
        "eager": "deepseek_v4_backend_hip_radix.py:DeepseekV4HipRadixBackend.init_forward_metadata",
        "fresh": "deepseek_v4_backend_hip_radix.py:DeepseekV4HipRadixBackend."
        "init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "DeepseekV4HipRadixBackend.init_forward_metadata_out_graph's metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured, rewritten by the recorded init_forward_metadata_in_graph)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(DeepseekV4HipRadixBackend.init_forward_metadata_out_graph, then "
        "init_forward_metadata_in_graph)",
    }

    def __init__(self, config: Any, device: torch.device, graphs: bool) -> None:
        # The runner step's own engine under ROCm's platform, not the sibling's vendors()
        # (a CUDA GPU's: FlashMLA, DeepGEMM, the CUDA backend's placement).
        with rocm():
            decode._Engine.__init__(self, config, device, graphs)

    def make_backend(self) -> Any:
        """The sibling's engine (its pool, allocator, model config), the backend
        ``create_dsv4_backend`` makes on ROCm: ``DeepseekV4HipRadixBackend(model_runner)``."""
        from sglang.srt.layers.attention import deepseek_v4_backend as cuda

        hip = importlib.import_module(BACKEND_MODULE)
        # The sibling's make_backend checks the registry's choice; on ROCm it is HIP's.
        with mock.patch.object(cuda, "DeepseekV4AttnBackend", hip.DeepseekV4HipRadixBackend):
            backend = super().make_backend()
        assert type(backend) is hip.DeepseekV4HipRadixBackend, type(backend)
        return backend

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with rocm():  # not the sibling's vendors(): ROCm's platform
            return decode._Engine.eager(self, inputs, mode, how=how)

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay preparation left as its metadata: a decode's raw
        metadata, a verify's captured metadata as ``DSV4Metadata.copy_`` refreshed it."""
        return self.backend.forward_metadata

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the kernels an MI300X runs read of ``DSV4Metadata`` ``metadata`` for
        ``rows`` requests and ``tokens`` tokens (padding included), copied now; none of
        the raw metadata (its tensors are the runner's inputs, judged as such). A draft's
        (``need_compress`` False: no compressed layer, no indexer) holds the window alone."""
        if not dsv4._full(metadata):
            return ()
        core = metadata.core_attn_metadata
        assert core.seq_lens_casual.shape[0] == tokens, (core.seq_lens_casual.shape, tokens)
        table = self.runner.req_to_token_pool.req_to_token
        lens = decode.host(core.seq_lens_casual)
        swa = decode.host(core.swa_page_indices)
        swa_lens = decode.host(core.swa_topk_lengths)
        out = [
            # make_core_attn_metadata: each query token's causal length, which the window,
            # the compressed lengths and init_compression_metadata's kernel derive from:
            # at least its own key (the padding fill 1), at most the request-to-token row.
            Field("seq_lens_casual", "tokens", lens, (1, table.shape[1])),
            # _forward_attention hands flash_mla_with_kvcache_entrypoint (hip_flash_mla.py;
            # on gfx942 tilelang_fp8_attention.py:dpsk_v4_fp8_attention_fwd, which "follows
            # the original flash_mla.flash_mla_with_kvcache signature") indices=
            # swa_page_indices, topk_length=swa_topk_lengths: its partial kernel reads
            # Indices[t, pos] for pos < topk_length[t] within the indices' width, skips -1,
            # and gathers K_combined (the SWA cache: get_swa_key_buffer_radix's rows) at the
            # rest. A length at most the width, at least 1 (_match_num_queries pads with 1).
            Field("swa_topk_lengths", "tokens", swa_lens, (1, swa.shape[1])),
            Field(
                "swa_page_indices", "tokens", swa, (-1, self.swa_rows() - 1), row_lengths=swa_lens
            ),
        ]
        if core.swa_out_cache_loc is not None:
            # store_cache (set_swa_key_buffer_radix_fused) writes each token's SWA key at
            # swa_out_cache_loc, padding tokens' included. The recorded in-graph body
            # writes it; what load_batch leaves of a verify graph's metadata has none.
            out.append(
                Field(
                    "swa_out_cache_loc",
                    "tokens",
                    decode.host(core.swa_out_cache_loc),
                    (0, self.swa_rows() - 1),
                    writes_kv=True,
                    read_in="swa_page_indices",  # a causal query's window ends at its key
                )
            )
        if metadata.indexer_metadata is not None:
            out += self._compressed_fields(core, lens)
        return tuple(out)


class HipRadixLife(dsv4.DeepseekV4Life):
    """The engine of ``sglang-deepseek-v4-hip-radix``: :class:`HipRadixEngine`, kept across a
    life's steps; its graph's replay on the platform an MI300X answers."""

    engine_class: type[HipRadixEngine] = HipRadixEngine

    def prepare(self) -> None:
        prepare()

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with rocm():  # not the sibling's vendors(): ROCm's platform
            return decode.EngineLife.graph_builds(self, engine, inputs, mode)


ENGINE = HipRadixLife()
"""The engine of the implementation ``sglang-deepseek-v4-hip-radix`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-deepseek-v4-hip-radix`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the EAGLE draft: the multi-step backend ---------------------------------------------------


def declines_draft(case: Case) -> str | None:
    """Why SGLang runs no DeepSeek-V4 draft decode for ``case``'s config on ROCm, else
    None: as on CUDA (:func:`runner_step_deepseek_v4_draft.declines`)."""
    return v4draft.declines(case)


class HipRadixDraftEngine(v4draft.DeepseekV4DraftEngine):
    """:class:`runner_step_deepseek_v4_draft.DeepseekV4DraftEngine` on ROCm: the target's
    engine :class:`HipRadixEngine`, the draft's extend backend
    ``DeepseekV4HipRadixBackend(draft_model_runner, skip_prefill=False)`` and HIP's
    ``DeepseekV4MultiStepBackend`` (``draft_utils.py:_create_dsv4_decode_backend`` on HIP),
    on the platform an MI300X answers."""

    WHERE = {
        how: where.replace("deepseek_v4_backend.py:", "deepseek_v4_backend_hip_radix.py:")
        for how, where in v4draft.DeepseekV4DraftEngine.WHERE.items()
    }
    platform = staticmethod(rocm)

    def make_target(self, config: EngineConfig, device: torch.device) -> HipRadixEngine:
        return HipRadixEngine(config, device, graphs=False)

    def make_backends(self, runner: Any) -> tuple[Any, Any]:
        hip = importlib.import_module(BACKEND_MODULE)
        return (
            hip.DeepseekV4HipRadixBackend(runner, skip_prefill=False),
            hip.DeepseekV4MultiStepBackend(runner, draft.EAGLE_TOPK, self.num_steps),
        )


class HipRadixDraftLife(v4draft.DeepseekV4DraftLife):
    """The draft of ``sglang-deepseek-v4-hip-radix-draft`` across the steps of one engine:
    :class:`HipRadixDraftEngine`; the draft model's extend on its own HIP backend."""

    engine_class = HipRadixDraftEngine

    def prepare(self) -> None:
        prepare()
        v4draft.prepare()


DRAFT = HipRadixDraftLife()
"""The engine of the implementation ``sglang-deepseek-v4-hip-radix-draft``."""


def run_draft(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-deepseek-v4-hip-radix-draft`` of ``runner-step``: the
    step's draft on :data:`DRAFT`, kept across calls; ``run_draft.new_engine()`` drops it."""
    return DRAFT(inputs)


run_draft.new_engine = DRAFT.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the decode graph's raw metadata, re-created -----------------------------


@functools.cache
def _copy_without_out_loc() -> Callable[..., None]:
    """``DSV4RawDecodeMetadata.copy_`` recompiled from SGLang's own source without the
    statement that copies ``out_cache_loc`` (the other two, of the runner's buffers'
    views, kept)."""
    hip = importlib.import_module(BACKEND_MODULE)
    fn = hip.DSV4RawDecodeMetadata.copy_
    definition = function_tree(fn)
    kept = [s for s in definition.body if "out_cache_loc" not in ast.unparse(s)]
    assert len(kept) == len(definition.body) - 1, ast.unparse(definition)
    definition.body = kept
    return recompiled(fn, definition)


class _OutLocStaleLife(HipRadixLife):
    """The decode graph's raw write locations never refreshed: ``DSV4RawDecodeMetadata.copy_``
    copies ``req_pool_indices`` and ``seq_lens`` (views of the runner's buffers at capture)
    and forgets ``out_cache_loc``, a tensor of its own (``init_forward_metadata_out_graph``
    makes it ``torch.zeros_like(seq_lens)`` at capture). The recorded
    ``make_forward_metadata_from_raw_decode`` then derives every replay's ``c4_out_loc`` and
    ``c128_out_loc`` from the capture's zeros: the compressors write a completed group's key
    into the padding page, not the request's. ``swa_out_cache_loc`` reads the runner's own
    buffer, and is right."""

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        hip = importlib.import_module(BACKEND_MODULE)
        with mock.patch.object(hip.DSV4RawDecodeMetadata, "copy_", _copy_without_out_loc()):
            return super().graph_builds(engine, inputs, mode)


OUT_LOC_STALE = _OutLocStaleLife()


def run_out_loc_stale(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-deepseek-v4-hip-radix-out-loc-stale``: :class:`_OutLocStaleLife`."""
    return OUT_LOC_STALE(inputs)


run_out_loc_stale.new_engine = OUT_LOC_STALE.new_engine  # type: ignore[attr-defined]


def reach_decode_replay(trace: Trace) -> bool:
    """A decode (no drafts) the decode graph replays: ``replay_cuda_graph_metadata_from``
    copies the step's raw metadata into the captured one (``DSV4RawDecodeMetadata.copy_``)."""
    return trace.config.num_spec == 0 and bool(replayed(trace))


def trigger_out_loc_stale(trace: Trace) -> bool:
    """A replayed decode whose request completes a C4 group (its keys a multiple of 4): its
    token's ``c4_out_loc`` is its own slot over 4, not the capture's 0."""
    return trace.config.num_spec == 0 and any(
        (c + q) % 4 == 0
        for step in replayed(trace)
        for c, q in zip(step.num_computed_tokens, step.query_lens, strict=True)
    )


def smallest_out_loc_stale() -> Trace:
    """One request of three tokens, then its decode (the fourth key: a C4 group) in the
    graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=dsv4.PAGE_SIZE, num_spec=0,
                          cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 3)
