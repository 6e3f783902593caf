"""SGLang's decode graph runner step on the DeepSeek-V4 attention backend, as the
implementation ``sglang-deepseek-v4`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same request rows and
decode graph runner), on the engine SGLang makes for a DeepSeek-V4 model:
``--attention-backend dsv4`` (``arg_groups/model_overrides/deepseek_v4.py``), pages of 256
tokens ("the system hardcodes page_size=256"), ``--dsv4-attn-backend flashmla`` (what
``auto`` resolves to for V4, not V4.1), its attention backend made by
``attention_registry.py:create_dsv4_backend``, its KV pool
``mem_cache/deepseek_v4_memory_pool.py:DeepSeekV4TokenToKVPool`` (three layers of
compress ratios 0, 4 and 128: a sliding-window-only layer, a C4 layer with its indexer, a
C128 layer; a window of 128) and its SWA allocator ``mem_cache/allocator/swa.py:
SWATokenToKVPoolAllocator``, which owns the full-to-SWA slot mapping. What runs besides,
unchanged (SGLang 0.5.23):

- ``layers/attention/deepseek_v4_backend.py``: ``DeepseekV4AttnBackend``: ``__init__``;
  ``init_forward_metadata`` (eager: ``_build_forward_metadata`` of a decode
  (``init_forward_metadata_decode``), a target verify of ``topk`` 1
  (``init_forward_metadata_target_verify``) and an extend (``init_forward_metadata_prefill``,
  ``expand_prefill_casually``), then ``init_forward_metadata_in_graph``'s upgrade of the
  raw metadata: ``make_forward_metadata_from_raw_decode`` /
  ``make_forward_metadata_from_raw_verify``, ``make_core_attn_metadata``,
  ``DSV4AttnMetadata.init_compression_metadata`` and ``init_flashmla_related``,
  ``init_forward_metadata_indexer``, the SWA write locations); ``init_cuda_graph_state``;
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture batch
  size and, from ``load_batch``, the replay's (``replay_cuda_graph_metadata_from``:
  ``DSV4RawDecodeMetadata.copy_`` / ``DSV4RawVerifyMetadata.copy_`` into the captured raw
  metadata); ``on_after_cuda_graph_warmup``; ``get_cuda_graph_seq_len_fill_value``;
- SGLang's Triton metadata kernels, under Triton's interpreter, as a CUDA GPU runs them
  (``attn_metadata_kernels.py`` dispatches on the placement of its inputs: CUDA inputs
  take the Triton kernels, and :func:`gpu_paths` answers so): ``BuildPageTablePositions``
  (``_page_table_positions_kernel``), ``BuildCausalSwaPageIndices``
  (``_causal_swa_page_indices_kernel``), ``ExpandPrefillCausally``
  (``_expand_prefill_causally_kernel``) and ``metadata_kernel.py``'s
  ``_init_compressed_attn_metadata_kernel``;
- ``mem_cache/memory_pool.py:ReqToTokenPool``, the pool and the allocator above.

The graph (:class:`_InGraphMetadata`): SGLang builds this backend's full metadata inside
the graph: out of it (``init_forward_metadata_out_graph``) it keeps only the raw inputs
(``DSV4RawDecodeMetadata``: the batch's rows, lengths and write locations), and the
capture's ``run_once`` upgrades them (``_run_in_graph_metadata_prep``:
``init_forward_metadata_in_graph``), recording every kernel that writes the full
``DSV4Metadata``. A capture here runs that body as SGLang's ``FullCudaGraphBackend`` does
(a warmup, ``on_after_cuda_graph_warmup``, which puts the raw metadata back, then the
capture itself) and keeps the metadata the capture made: the tensors the graph's kernels
write. A replay runs the body again over the same static inputs and writes every tensor
it builds into the captured metadata's tensor of the same place, as the recorded kernels
write their captured outputs (a graph writes no new tensor, and changes no shape: a
tensor of another shape is an error of this stand-in); the backend's ``forward_metadata``
stays what ``load_batch`` left (the raw metadata), as a replay runs no Python. The model's
forward computes nothing (its layers read the metadata, never write it). Limitation: a
host value the body read at capture would be frozen in a real graph and is read again
here; the decode and verify bodies read none (their shapes come from the batch size, their
width from ``MAX_SEQ_LEN_FOR_CAPTURE``).

Stand-ins, only for what cannot run on a CPU, each in place only while the engine is built
or steps (:func:`vendors`), each keeping its vendor's contract (shapes, dtypes) and never
computing a value a field here reports:

- FlashMLA (the ``flash_mla`` wheel, :data:`FLASH_MLA`): ``get_mla_metadata()`` returns an
  empty ``FlashMLASchedMeta``, which the first decode kernel fills (its vendor's own
  behaviour: no computation); ``get_mla_decoding_metadata``, the legacy schedule SGLang's
  dense FlashMLA backend asks for (:mod:`.flashmla`), its shapes; its kernels refuse (no
  forward runs);
- DeepGEMM (``deep_gemm``, :data:`DEEP_GEMM`): ``get_num_sms`` (a device property: 4 SMs)
  and ``get_paged_mqa_logits_metadata``, the paged-MQA logits schedule
  (:func:`~attnfuzz.adapters.sglang.dsa_backend.paged_mqa_schedule`), read by the indexer's
  logits kernel only;
- three of SGLang's own JIT C++ kernels, CUDA-only (``sglang/kernels/jit``, built by
  ``load_jit`` with ``cuda_files``), stood in by their contract (:func:`jit_stand_ins`):
  the compressor's planners ``deepseek_v4/c_plan.cuh:plan_compress_decode`` /
  ``plan_compress_prefill`` (``CompressorDecodePlan`` / ``CompressorPrefillPlan``: a
  ``[batch, 16]`` / ``[tokens, 16]`` and ``[tokens, 8]`` uint8 plan of the compressors'
  state-ring slots, its inputs' dtypes checked, zero-filled), the indexer's schedule
  ``deepseek_v4/paged_mqa_metadata.cuh`` (``dsv4/attn.py:get_paged_mqa_logits_metadata``:
  the DeepGEMM schedule above) and ``plan_topk_v2``'s ``topk_plan`` (which leaves the plan
  untouched, as its kernel does for small batches). None of their outputs is a field
  here: the compressor plans and the schedules are not judged;
- CUDA placement: the backend module's ``is_cuda`` / ``_is_cuda`` answer True (so
  ``needs_cpu_seq_lens`` is False, as on a GPU, and ``__init__`` reads the FlashMLA
  interface), ``attn_metadata_kernels._inputs_on_cuda`` True (the Triton kernels, not the
  torch reference SGLang keeps for CPU unit tests); host buffers SGLang pins
  (``CompressorPrefillPlan.generate``'s ``pin_buffer``) are plain host memory.

The KV cache is fp8 (``kv_cache_dtype`` ``fp8_e4m3``, V4's default); its buffers are never
read. The SWA allocator's pages: the engine pairs full page ``p`` with SWA page
``pages - p`` (:meth:`DeepseekV4Engine.swa_page`; the allocator's own choice is its free
list's, and a step reads them only through the mapping), written with the allocator's own
``set_full_to_swa_mapping``; the padding page 0 maps to SWA page 0.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``: the metadata
each graph captured, ``eager``, ``padded``: the backend's ``forward_metadata`` after
``load_batch``, the raw metadata, whose tensors are the runner's inputs, ``replay``: the
metadata the graph of that batch size captured, as its replay rewrote it, ``fresh``).

Fields, by metadata row (a decode's rows are its requests, a verify's and an extend's
their query tokens: ``tokens``), each with the range its consumer accepts
(:meth:`DeepseekV4Engine.metadata_fields`, the consumer named at each):
``seq_lens_casual``, ``positions_casual``, ``swa_topk_lengths`` and ``swa_page_indices``
(the sliding window: FlashMLA's sparse decode ``indices`` / ``topk_length``; a row's
``swa_topk_lengths`` entries read), ``swa_out_cache_loc`` (the SWA write:
``store_cache``), ``page_table`` (``cdiv(seq_lens_casual, 256)`` pages read),
``c4_topk_lengths_raw`` (the C4 indexer's ``compressed_seq_lens``),
``c4_sparse_topk_lengths`` (FlashMLA's ``extra_topk_length`` at ratio 4),
``c128_topk_lengths_clamp1`` and ``c128_page_indices`` (its ``extra_topk_length`` /
``extra_indices_in_kvcache`` at ratio 128). And ``kv_len`` and ``kv_slots``, what every
backend states alike: the window each request's last query token reads and its SWA slots.

Mutant (a re-created defect of the window's metadata):
``sglang-deepseek-v4-swa-lengths-unclamped`` (``_page_table_positions_kernel``'s window
length not clamped to the window, ``tl.minimum(seq_len, swa_window)`` dropped: past 128
keys a query's ``swa_topk_lengths`` reaches past the 128 indices FlashMLA is handed; safe
padding, in every build). The captured raw metadata's ``seq_lens`` and
``req_pool_indices`` are views of the runner's buffers; its ``out_cache_loc``
(``raw_out_loc``) feeds ``c4_out_loc`` / ``c128_out_loc``, where the compressors write
(``compressor_v2.py``: ``_get_out_loc``), judged as such.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine, dsa_backend
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.adapters.standins import VendorContractError, in_sys_modules, no_collections
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace, as_trace

PAGE_SIZE = 256
"""``deepseek_v4_backend.py``: "the system hardcodes page_size=256" (and the model
override sets it)."""
SWA_WINDOW = 128
"""``deepseek_v4_backend.py:SWA_WINDOW``: the sliding window every layer attends."""
INDEX_TOPK = 512
"""The model's ``index_topk`` (``DEFAULT_INDEX_TOPK``; V4's): the C4 indexer's top-k."""
COMPRESS_RATIOS = [0, 4, 128]
"""The model's layers' compress ratios: window only, C4 (indexed), C128."""
KV_DTYPE = torch.float8_e4m3fn
"""The KV cache's dtype: V4's default (``_deepseek_v4_kv_cache_dtype``: fp8_e4m3)."""
NUM_SMS = dsa_backend.NUM_SMS
"""The SM count DeepGEMM's stand-in answers (a small GPU's)."""
BACKEND_MODULE = "sglang.srt.layers.attention.deepseek_v4_backend"


def prepare() -> None:
    """Import SGLang's runner and the DeepSeek-V4 backend before a judge forks its child."""
    decode.prepare()
    importlib.import_module(BACKEND_MODULE)


def declines(case: Case) -> str | None:
    """Why SGLang never runs ``case``'s config on DeepSeek-V4, else None: pages of any
    size but 256 (the plugin fixes ``block_size`` to 256; a case of another page size is
    SGLang's no-configuration)."""
    if case.config.block_size != PAGE_SIZE:
        return (
            f"page size {case.config.block_size}: SGLang runs DeepSeek-V4 on pages of 256 "
            "tokens only (deepseek_v4_backend.py: 'the system hardcodes page_size=256')"
        )
    return None


# -- vendor stand-ins ------------------------------------------------------------------------


def _refused(name: str) -> Callable[..., Any]:
    """A vendor kernel: only a forward calls it, and no forward runs here."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is attnfuzz's stand-in; no forward runs here")

    kernel.__name__ = name.rsplit(".", 1)[-1]
    return kernel


@dataclasses.dataclass
class FlashMLASchedMeta:
    """``flash_mla/flash_mla_interface.py:FlashMLASchedMeta``: the split-KV schedule the
    first sparse decode call computes and keeps (empty until then)."""

    have_initialized: bool = False
    config: Any = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FlashMLASchedMeta, None]:
    """``flash_mla.get_mla_metadata``: "Returns an empty instance of FlashMLASchedMeta. The
    actual scheduling metadata is computed in the first call to flash_mla_with_kvcache"."""
    return FlashMLASchedMeta(), None


NUM_SMS = 132
"""The SM count the legacy schedule's parts are reckoned from (an H100's)."""


def get_mla_decoding_metadata(
    cache_seqlens: torch.Tensor,
    num_q_tokens_per_head_k: int,
    num_heads_k: int,
    num_heads_q: int | None = None,
    is_fp8_kvcache: bool = False,
    topk: int | None = None,
    use_legacy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_mla.get_mla_decoding_metadata``: the legacy split-KV schedule, as tensors
    (``flash_mla_interface.get_mla_metadata`` with ``cache_seqlens``, SGLang's dense
    FlashMLA backend). Its shapes are the vendor's: ``tile_scheduler_metadata``
    ``[num_sm_parts, 8]`` int32, ``num_sm_parts = sms // num_heads_k //
    cdiv(num_q_tokens_per_head_k, 64)``; ``num_splits`` ``[batch + 1]`` int32. Its
    values (the split points) are the vendor's own: the stand-in's are one split a
    request. Refused, as the op's checks refuse: lengths not int32 of one dimension.
    ``use_legacy`` picks the wheel's kernel set; the legacy one's schedule is this."""
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise VendorContractError(
            "flash_mla.get_mla_decoding_metadata: seqlens_k must be int32 of one "
            f"dimension, got {cache_seqlens.dtype} {tuple(cache_seqlens.shape)}"
        )
    parts = max(NUM_SMS // num_heads_k // -(-num_q_tokens_per_head_k // 64), 1)
    device = cache_seqlens.device
    schedule = torch.zeros((parts, 8), dtype=torch.int32, device=device)
    splits = torch.arange(cache_seqlens.shape[0] + 1, dtype=torch.int32, device=device)
    return schedule, splits


def _package(name: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]  # a package: its submodules import
    for attr, value in names.items():
        setattr(module, attr, value)
    return module


def _flash_mla() -> dict[str, types.ModuleType]:
    kernels = {
        n: _refused(f"flash_mla.{n}")
        for n in (
            "flash_mla_with_kvcache",
            "flash_mla_sparse_fwd",
            "fused_norm_rope_attn_rope_cast",
        )
    }
    kernels["get_mla_decoding_metadata"] = get_mla_decoding_metadata  # type: ignore[assignment]
    interface = _package(
        "flash_mla.flash_mla_interface", FlashMLASchedMeta=FlashMLASchedMeta, **kernels
    )
    return {
        "flash_mla": _package(
            "flash_mla",
            get_mla_metadata=get_mla_metadata,
            flash_mla_interface=interface,
            **kernels,
        ),
        "flash_mla.flash_mla_interface": interface,
    }


def paged_mqa_logits_metadata(
    context_lens: torch.Tensor, block_kv: int, num_sms: int
) -> torch.Tensor:
    """``deep_gemm.get_paged_mqa_logits_metadata``: ``[num_sms + 1, 2]`` int32, the
    (query row, split) each SM starts at; read by the indexer's logits kernel alone."""
    assert context_lens.dtype == torch.int32 and context_lens.dim() in (1, 2), context_lens.shape
    return dsa_backend.paged_mqa_schedule(context_lens, block_kv, num_sms)


FLASH_MLA = _flash_mla()
"""The stand-in ``flash_mla`` package (module docstring)."""
DEEP_GEMM = {
    "deep_gemm": _package(
        "deep_gemm",
        get_num_sms=lambda: NUM_SMS,
        get_paged_mqa_logits_metadata=paged_mqa_logits_metadata,
        fp8_paged_mqa_logits=_refused("deep_gemm.fp8_paged_mqa_logits"),
        fp8_mqa_logits=_refused("deep_gemm.fp8_mqa_logits"),
    )
}
"""The stand-in ``deep_gemm`` package (module docstring)."""


def _checked(t: torch.Tensor, what: str, dtype: torch.dtype, dim: int) -> None:
    """A JIT kernel's ``TensorMatcher``: the dtype and rank it verifies."""
    if t.dtype != dtype or t.dim() != dim:
        raise TypeError(f"{what}: {t.dtype} of {t.dim()} dims, the kernel verifies {dtype}, {dim}")


class _CompressPlanModule:
    """``_jit_compress_plan_module()`` (``deepseek_v4/c_plan.cuh``, CUDA-only): plans of
    its shape and dtype, zero-filled (no field here reads them)."""

    @staticmethod
    def plan_decode(
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        full_to_state: torch.Tensor,
        seq_lens: torch.Tensor,
        compress_ratio: int,
        swa_page_size: int,
        ring_size: int,
        use_req_ring: bool,
    ) -> torch.Tensor:
        _checked(req_pool_indices, "req_pool_indices", torch.int64, 1)
        _checked(req_to_token, "req_to_token", torch.int32, 2)
        _checked(full_to_state, "full_to_state", torch.int64, 1)
        _checked(seq_lens, "seq_lens", torch.int64, 1)
        assert seq_lens.shape == req_pool_indices.shape and compress_ratio in (4, 128)
        # sizeof(DecodePlan): seq_len, write_loc, read_page_0, read_page_1.
        return torch.zeros((seq_lens.shape[0], 16), dtype=torch.uint8, device=seq_lens.device)

    @staticmethod
    def plan_prefill(
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        full_to_state: torch.Tensor,
        seq_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        pin_buffer: torch.Tensor,
        num_q_tokens: int,
        compress_ratio: int,
        swa_page_size: int,
        ring_size: int,
        use_req_ring: bool,
        use_cuda_graph: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        _checked(req_pool_indices, "req_pool_indices", torch.int64, 1)
        _checked(req_to_token, "req_to_token", torch.int32, 2)
        _checked(seq_lens, "seq_lens", torch.int64, 1)
        _checked(extend_lens, "extend_lens", torch.int64, 1)
        assert seq_lens.shape == extend_lens.shape == req_pool_indices.shape
        assert compress_ratio in (4, 128) and req_pool_indices.shape[0] <= num_q_tokens
        device = req_to_token.device
        # sizeof(CompressPlan) 16, sizeof(WritePlan) 8, a row per query token.
        return (
            torch.zeros((num_q_tokens, 16), dtype=torch.uint8, device=device),
            torch.zeros((num_q_tokens, 8), dtype=torch.uint8, device=device),
        )


class _IndexerMetadataModule:
    """``_jit_metadata_module()`` (``deepseek_v4/paged_mqa_metadata.cuh``, CUDA-only):
    ``run(seq_lens, metadata, workspace)`` writes the paged-MQA schedule DeepGEMM would."""

    @staticmethod
    def run(seq_lens: torch.Tensor, metadata: torch.Tensor, workspace: torch.Tensor) -> None:
        _checked(seq_lens, "seq_lens", torch.int32, 1)
        assert metadata.shape[1] == 2 and metadata.dtype == torch.int32
        num_sms = metadata.shape[0] - 1
        metadata.copy_(dsa_backend.paged_mqa_schedule(seq_lens, dsa_backend.SPLIT_KV, num_sms))


class _TopkPlanModule:
    """``_jit_topk_v2_module()`` (``plan_topk_v2``'s ``topk_plan``, CUDA-only): leaves the
    plan buffer as it is, what its kernel does for small batches ("Small batches and
    devices without clusters leave the plan buffer untouched")."""

    @staticmethod
    def topk_plan(seq_lens: torch.Tensor, metadata: torch.Tensor, static_threshold: int) -> None:
        assert metadata.shape == (seq_lens.shape[0] + 1, 2), (metadata.shape, seq_lens.shape)


def _empty_unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
    """``torch.empty`` on a CPU: a pinned host buffer is a plain one (CPU-only torch has no
    pinned allocator)."""
    return torch.empty(*args, **kwargs)


@contextlib.contextmanager
def jit_stand_ins() -> Iterator[None]:
    """SGLang's CUDA-only JIT kernels of the metadata path stood in by their contract
    (module docstring), in their modules' namespaces, put back after."""
    from sglang.kernels.ops.attention.dsv4 import attn, compress, topk

    unpinned = types.SimpleNamespace(**{**vars(torch), "empty": _empty_unpinned})
    with (
        mock.patch.object(compress, "_jit_compress_plan_module", lambda: _CompressPlanModule),
        mock.patch.object(compress, "torch", unpinned),
        mock.patch.object(attn, "_jit_metadata_module", lambda: _IndexerMetadataModule),
        mock.patch.object(topk, "_jit_topk_v2_module", lambda: _TopkPlanModule),
    ):
        yield


@contextlib.contextmanager
def gpu_paths() -> Iterator[None]:
    """The paths a CUDA GPU takes: the backend module's ``is_cuda()`` and ``_is_cuda``
    True, ``attn_metadata_kernels._inputs_on_cuda`` True (the Triton kernels)."""
    from sglang.kernels.ops.attention.dsv4 import attn_metadata_kernels

    backend = importlib.import_module(BACKEND_MODULE)
    with (
        mock.patch.object(backend, "_is_cuda", True),
        mock.patch.object(backend, "is_cuda", lambda: True),
        mock.patch.object(attn_metadata_kernels, "_inputs_on_cuda", lambda *a, **k: True),
    ):
        yield


@contextlib.contextmanager
def vendors() -> Iterator[None]:
    """While the engine is built or steps: every stand-in of the module docstring."""
    with in_sys_modules({**FLASH_MLA, **DEEP_GEMM}), jit_stand_ins(), gpu_paths():
        yield


# -- the graph --------------------------------------------------------------------------------


def _tensors(obj: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor ``obj`` (a metadata object: dataclasses, named tuples, lists, dicts)
    holds, each with its place in it."""
    if torch.is_tensor(obj):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name, None), f"{path}.{f.name}")
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        for name in obj._fields:
            yield from _tensors(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from _tensors(item, f"{path}[{key!r}]")


def rewrite(captured: Any, replayed: Any) -> None:
    """``replayed``'s tensors written into ``captured``'s at the same places: what the
    graph's recorded kernels do at a replay (their outputs are the capture's tensors).
    The same places, shapes and dtypes, or this stand-in is wrong about the graph."""
    want = dict(_tensors(captured))
    got = dict(_tensors(replayed))
    if want.keys() != got.keys():
        raise RuntimeError(
            f"attnfuzz's graph stand-in: the replay's metadata holds tensors at "
            f"{sorted(got.keys() ^ want.keys())} where the capture's does not"
        )
    for place, t in want.items():
        new = got[place]
        if new.shape != t.shape or new.dtype != t.dtype:
            raise RuntimeError(
                f"attnfuzz's graph stand-in: {place} of {tuple(new.shape)} {new.dtype} at "
                f"replay, {tuple(t.shape)} {t.dtype} at capture (a graph changes no shape)"
            )
        if new is not t:
            t.copy_(new)


class _InGraphMetadata(decode._Graph):
    """The decode runner's graph where there is no CUDA, for a backend whose metadata is
    built inside the graph (module docstring): a capture runs the body twice (a warmup,
    the backend's ``post_warmup_hook``, the capture) and keeps the metadata the capture
    made; a replay runs it again and writes its tensors into the captured ones."""

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
        # FullCudaGraphBackend.capture_one: warmups, each followed by the hook (two there;
        # one here: the second repeats the first on the same inputs), then the capture.
        self._run(forward_fn)
        if post_warmup_hook is not None:
            post_warmup_hook()
        self._run(forward_fn)
        self.bodies[shape_key] = forward_fn
        self.graphs[shape_key] = self.runner.attn_backend.forward_metadata

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        backend = self.runner.attn_backend
        left = backend.forward_metadata  # what load_batch left: no Python runs in a replay
        self._run(self.bodies[shape_key])
        rewrite(self.graphs[shape_key], backend.forward_metadata)
        backend.forward_metadata = left
        return super().replay(shape_key, static_forward_batch, **kwargs)

    def _run(self, body: Any) -> None:
        """``body`` run eagerly, as a warmup runs it: no stream is capturing (the
        runner's in-graph marker asks its device module)."""
        module = self.runner.device_module
        self.runner.device_module = _engine.StandIn(is_current_stream_capturing=lambda: False)
        try:
            body()
        finally:
            self.runner.device_module = module

    def cleanup(self) -> None:
        self.bodies.clear()
        super().cleanup()


def _computes_nothing(*args: Any, **kwargs: Any) -> None:
    """The model's forward inside the graph stand-in: its layers read the metadata the
    in-graph preparation built, never write it; nothing to compute."""
    return None


# -- the engine -------------------------------------------------------------------------------


def _full(metadata: Any) -> bool:
    """Whether ``metadata`` is the full ``DSV4Metadata`` (not the raw inputs
    ``init_forward_metadata_out_graph`` keeps)."""
    return hasattr(metadata, "core_attn_metadata")


class DeepseekV4Engine(decode.SWAAllocated, decode._Engine):
    """One SGLang engine whose model runner's attention backend is DeepSeek-V4's."""

    ATTENTION_BACKEND = "dsv4"
    GRAPH = _InGraphMetadata
    WHERE = {
        "eager": "deepseek_v4_backend.py:DeepseekV4AttnBackend.init_forward_metadata",
        "fresh": "deepseek_v4_backend.py:DeepseekV4AttnBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "DeepseekV4AttnBackend.init_forward_metadata_out_graph's raw metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured, rewritten by the recorded init_forward_metadata_in_graph)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(DeepseekV4AttnBackend.init_forward_metadata_out_graph, then "
        "init_forward_metadata_in_graph)",
    }

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        with vendors():
            super().__init__(config, device, graphs)

    def make_backend(self) -> Any:
        """``create_dsv4_backend(model_runner)`` (the registry's ``dsv4``), over the pool
        and allocator SGLang makes for DeepSeek-V4, on what the backend reads of the model
        runner besides the Triton backend's."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.layers.attention.deepseek_v4_backend import DeepseekV4AttnBackend
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
        from transformers import PretrainedConfig

        runner, config = self.runner, self.config
        tokens = self.pages() * PAGE_SIZE
        rows = runner.req_to_token_pool.req_to_token.shape[0]
        # kv_cache_configurator.py:_build_dsv4_kv_pool, its sizes the engine's pages'.
        pool = DeepSeekV4TokenToKVPool(
            max_num_reqs=config.max_num_seqs,
            num_req_slots=rows,
            swa_size=tokens,
            c4_size=tokens // 4,
            c128_size=tokens // 128,
            c4_state_pool_size=tokens // 4,
            c128_state_pool_size=tokens // 128,
            page_size=PAGE_SIZE,
            swa_page_size=PAGE_SIZE,
            sliding_window=SWA_WINDOW,
            dtype=KV_DTYPE,
            c4_state_dtype=torch.float32,
            c128_state_dtype=torch.float32,
            qk_nope_head_dim=448,
            qk_rope_head_dim=64,
            indexer_head_dim=128,
            layer_num=len(COMPRESS_RATIOS),
            device=str(self.device),
            enable_memory_saver=False,
            compression_ratios=COMPRESS_RATIOS,
            online_mtp_max_draft_tokens=config.next_n if config.num_spec else 0,
            full_size=tokens,
        )
        # The allocator registers its full-to-SWA mapping with the pool (register_mapping).
        self.allocate_swa(pool, KV_DTYPE)
        hf_config = PretrainedConfig(
            architectures=["DeepseekV4ForCausalLM"],
            model_type="deepseek_v4",
            index_topk=INDEX_TOPK,
            compress_ratios=COMPRESS_RATIOS,
            window_size=SWA_WINDOW,
        )
        model_config = runner.model_config
        model_config.hf_config = model_config.hf_text_config = hf_config
        # "DSV4 MQA head_dim = qk_nope_head_dim(448) + qk_rope_head_dim(64) = 512".
        model_config.head_dim = model_config.v_head_dim = 512
        model_config.is_multimodal = False
        runner.kv_cache_dtype = runner.dtype = KV_DTYPE
        runner.sliding_window_size = SWA_WINDOW
        runner.model = _engine.StandIn(
            shared_experts_config=None, forward=_computes_nothing, modules=lambda: iter(())
        )
        backend = ATTENTION_BACKENDS["dsv4"](runner)
        assert type(backend) is DeepseekV4AttnBackend, type(backend)
        return backend

    def _graph_runner(self) -> Any:
        with no_collections():
            return super()._graph_runner()

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with vendors():
            return super().eager(inputs, mode, how=how)

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay preparation left as its metadata (the raw inputs)."""
        return self.backend.forward_metadata

    def accepts(self) -> dict[str, tuple[int, int]]:
        """The runner's inputs' ranges (:meth:`runner_step._Engine.accepts`)."""
        return decode._Engine.accepts(self)

    def cache_rows(self) -> tuple[int, int]:
        """The rows (token slots) of the SWA cache and of the C128 layer's extra cache, as
        ``_forward_attention`` views them for FlashMLA: ``[pages, page_size, 1, bytes]``."""
        pool = self.runner.token_to_kv_pool
        layer = COMPRESS_RATIOS.index(128)
        c128 = pool.get_extra_key_buffer(layer).shape[0] * pool.get_extra_key_page_size(layer)
        return self.swa_rows(), c128

    def swa_rows(self) -> int:
        """The rows (token slots) of the SWA cache, as ``_forward_attention`` views it for
        the attention kernel: ``[pages, swa_page_size, 1, bytes]`` (the target's pool, or a
        draft's)."""
        pool = self.runner.token_to_kv_pool
        return pool.get_swa_key_buffer_radix(0).shape[0] * pool.get_swa_key_page_size()

    def compressed_rows(self) -> tuple[int, int]:
        """The rows (compressed slots) the C4 and C128 layers' caches hold: the C4 layer's
        extra cache and its indexer's key cache (both written at ``c4_out_loc``, the
        smaller bounding it), the C128 layer's extra cache."""
        pool = self.runner.token_to_kv_pool
        c4 = COMPRESS_RATIOS.index(4)
        core = pool.get_extra_key_buffer(c4).shape[0] * pool.get_extra_key_page_size(c4)
        index = pool.get_index_k_with_scale_buffer(c4).shape[0] * pool.get_index_k_page_size(4)
        return min(core, index), self.cache_rows()[1]

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the consumers read of ``DSV4Metadata`` ``metadata`` for ``rows`` requests
        and ``tokens`` tokens (padding included), copied now; none of the raw metadata
        (its tensors are the runner's inputs, judged as such). A draft's (``need_compress``
        False: no compressed layer, no indexer) holds the window alone."""
        if not _full(metadata):
            return ()
        core = metadata.core_attn_metadata
        n = core.seq_lens_casual.shape[0]  # a row per query token
        assert n == tokens, (n, tokens)
        table = self.runner.req_to_token_pool.req_to_token
        lens = decode.host(core.seq_lens_casual)
        swa = decode.host(core.swa_page_indices)
        swa_lens = decode.host(core.swa_topk_lengths)
        swa_rows = self.swa_rows()
        out = [
            # make_core_attn_metadata: each query token's causal length; init_compression_
            # metadata's kernel and the compressors read it. A query reads at least its own
            # key (the padding fill 1) and at most the request-to-token row.
            Field("seq_lens_casual", "tokens", lens, (1, table.shape[1])),
            # flash_mla_with_kvcache (_forward_attention): indices=swa_page_indices,
            # topk_length=swa_topk_lengths; it reads indices[t, :topk_length[t]] of the SWA
            # cache (get_swa_key_buffer_radix: swa_size + page_size rows), -1 an empty
            # entry. A length at most the indices' width, at least 1 (match_num_queries
            # pads lengths with 1: a query always reads a key).
            Field("swa_topk_lengths", "tokens", swa_lens, (1, swa.shape[1])),
            Field("swa_page_indices", "tokens", swa, (-1, swa_rows - 1), row_lengths=swa_lens),
            # store_cache writes each token's SWA key at swa_out_cache_loc (the SWA cache's
            # rows), padding tokens' included, before the attention reads the window: a
            # causal query's window ends at its own key.
            Field(
                "swa_out_cache_loc",
                "tokens",
                decode.host(core.swa_out_cache_loc),
                (0, swa_rows - 1),
                writes_kv=True,
                read_in="swa_page_indices",
            ),
        ]
        if metadata.indexer_metadata is not None:
            out += self._compressed_fields(core, lens)
        return tuple(out)

    def _compressed_fields(self, core: Any, lens: np.ndarray) -> list[Field]:
        """What the C4 indexer, the compressed layers' attention and the compressors read."""
        c4_rows, c128_rows = self.compressed_rows()
        c128 = decode.host(core.c128_page_indices)
        c128_lens = decode.host(core.c128_topk_lengths_clamp1)
        page_table = decode.host(core.page_table)
        return [
            # The query's position: the C4 indexer's query RoPE (C4IndexerBackendMixin's
            # core_metadata.positions), below the model's context.
            Field(
                "positions_casual",
                "tokens",
                decode.host(core.positions_casual),
                (0, self.config.max_model_len - 1),
            ),
            # The C4 indexer (PagedIndexerMetadata: page_table, compressed_seq_lens) reads
            # page_table[t, :cdiv(seq_lens_casual, 256)]: the KV pool's pages.
            Field(
                "page_table",
                "tokens",
                page_table,
                (0, self.pages() - 1),
                row_lengths=-(-lens // PAGE_SIZE),
            ),
            # Its compressed_seq_lens (c4_topk_lengths_raw): compressed slots [0, len) of
            # the row's pages (page_table's width times the 64 C4 slots a page holds).
            Field(
                "c4_topk_lengths_raw",
                "tokens",
                decode.host(core.c4_topk_lengths_raw),
                (0, page_table.shape[1] * (PAGE_SIZE // 4)),
            ),
            # The attention at ratio 4: extra_topk_length of the indexer's top-k
            # (c4_sparse_page_indices, index_topk wide), at least one (sparse_buffers'
            # minimum of the clamp-1 length with index_topk).
            Field(
                "c4_sparse_topk_lengths",
                "tokens",
                decode.host(core.c4_sparse_topk_lengths),
                (1, core.c4_sparse_page_indices.shape[1]),
            ),
            # ...at ratio 128: extra_indices_in_kvcache=c128_page_indices (slots of the
            # layer's extra cache, -1 empty), extra_topk_length=c128_topk_lengths_clamp1.
            Field("c128_topk_lengths_clamp1", "tokens", c128_lens, (1, c128.shape[1])),
            Field("c128_page_indices", "tokens", c128, (-1, c128_rows - 1), row_lengths=c128_lens),
            # CompressorBackendMixin.forward_unified hands compress_norm_rope_store
            # out_loc=c4_out_loc / c128_out_loc (_get_out_loc): its kernel
            # (fused_norm_rope_v2.cuh, CompressDecode / CompressExtend) writes a token's
            # compressed key at out_loc[token] (paged: out_loc >> page bits) of the C4
            # layer's and its indexer's caches, and of the C128 layer's.
            Field("c4_out_loc", "tokens", decode.host(core.c4_out_loc), (0, c4_rows - 1)),
            Field("c128_out_loc", "tokens", decode.host(core.c128_out_loc), (0, c128_rows - 1)),
        ]

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their slots as the sliding window reads them (FlashMLA's
        ``indices[t, :topk_length[t]]``, SWA slots): its last query token's window. The raw
        metadata (``padded``) holds none."""
        if "swa_topk_lengths" not in values:
            return np.zeros(0, dtype=np.int64), []
        lens, slots = values["swa_topk_lengths"], values["swa_page_indices"]
        per = len(lens) // max(1, len(values["seq_lens"]))
        last = np.arange(len(values["seq_lens"])) * per + per - 1
        return lens[last], [slots[t, : lens[t]] for t in last]

    def kv_fields(self, fields: tuple[Field, ...], metadata: Any) -> tuple[Field, ...]:
        """``kv_len`` and ``kv_slots`` (:meth:`kv_read`) where the build holds the window."""
        if not any(f.name == "swa_topk_lengths" for f in fields):
            return ()
        return super().kv_fields(fields, metadata)


class DeepseekV4Served:
    """What a life of a DeepSeek-V4 engine, the target's or its draft's, adds to its
    driver: SGLang imported as this module imports it, DeepSeek-V4's server arguments,
    and an engine of its :attr:`engine_class`."""

    engine_class: type

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> Any:
        return self.engine_class(config, device, graphs=graphs)

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return _server_args(config)


class DeepseekV4Life(DeepseekV4Served, decode.EngineLife):
    """The engine of ``sglang-deepseek-v4``: :class:`DeepseekV4Engine`, kept across a
    life's steps; its graph's replay with the stand-ins in place."""

    engine_class: type[DeepseekV4Engine] = DeepseekV4Engine

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with vendors():
            return super().graph_builds(engine, inputs, mode)


def _server_args(config: EngineConfig) -> Any:
    """``decode._server_args`` and what the DeepSeek-V4 override and defaults set."""
    return decode._server_args(
        config, "dsv4", dsv4_attn_backend="flashmla", kv_cache_dtype="fp8_e4m3"
    )


ENGINE = DeepseekV4Life()
"""The engine of the implementation ``sglang-deepseek-v4`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-deepseek-v4`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the window's metadata, re-created ------------------------------------


class _SwaLengthsUnclamped(DeepseekV4Engine):
    """The window's lengths not clamped to the window: ``_page_table_positions_kernel``'s
    ``tl.minimum(seq_len, swa_window)`` dropped, each query's ``swa_topk_lengths`` its causal
    length (``make_core_attn_metadata`` hands FlashMLA that length over the 128 indices of
    ``swa_page_indices``). Past 128 keys FlashMLA would read indices past those it is
    handed; every build is broken alike (eager, capture, each replay's recorded body)."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        make = backend.make_core_attn_metadata

        def unclamped(*args: Any, **kwargs: Any) -> Any:
            core = make(*args, **kwargs)
            core.swa_topk_lengths.copy_(core.seq_lens_casual)  # no minimum with the window
            return core

        backend.make_core_attn_metadata = unclamped
        return backend


class _MutantLife(DeepseekV4Life):
    def __init__(self, engine: type[DeepseekV4Engine]) -> None:
        self.engine_class = engine
        super().__init__()


SWA_LENGTHS_UNCLAMPED = _MutantLife(_SwaLengthsUnclamped)


def run_swa_lengths_unclamped(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-deepseek-v4-swa-lengths-unclamped``: :class:`_SwaLengthsUnclamped`."""
    return SWA_LENGTHS_UNCLAMPED(inputs)


run_swa_lengths_unclamped.new_engine = SWA_LENGTHS_UNCLAMPED.new_engine  # type: ignore[attr-defined]


def reach_past_window(trace: Trace | Case) -> bool:
    """A step of a request past the window: a query token of more than 128 keys, whose
    window length the clamp bounds (a case alone: a trace of one step)."""
    steps = as_trace(trace).cases()
    return any(n > SWA_WINDOW for case in steps for n in case.batch.seq_lens)


def smallest_swa_lengths_unclamped() -> Trace:
    """One request of 128 tokens (the window, full), then its decode: 129 keys."""
    config = EngineConfig(
        max_model_len=136,
        max_num_seqs=1,
        max_num_batched_tokens=136,
        block_size=PAGE_SIZE,
        num_spec=0,
        cudagraph_capture_sizes=(1,),
    )
    return arrive_then_step(config, SWA_WINDOW)
