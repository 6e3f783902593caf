"""SGLang's decode graph runner step on the FlashInfer backend, as the implementation
``sglang-flashinfer`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows, decode graph runner and graph stand-in), on the engine started with
``--attention-backend flashinfer``. What runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/flashinfer_backend.py``: ``FlashInferAttnBackend``: ``__init__``
  (its persistent ``kv_indptr``, ``kv_last_page_len`` and ``qo_indptr``, its eager
  wrappers); ``init_forward_metadata`` (eager: a decode, a target verify of ``topk``
  1, an extend over the ragged and paged wrappers); ``init_cuda_graph_state``;
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture batch
  size (``_prepare_cuda_graph_metadata``, ``_create_decode_wrappers``,
  ``_create_prefill_wrappers``; ``fast_decode_plan`` installed on the decode graph's
  wrappers) and, from ``load_batch``, the replay;
- ``FlashInferIndicesUpdaterDecode`` / ``FlashInferIndicesUpdaterPrefill``
  (``update_single_wrapper``, ``call_begin_forward``): the ``kv_indptr``,
  ``kv_indices`` (``KVIndexTranslator.pack_read_stream``, a Triton kernel) and
  ``qo_indptr`` SGLang computes; for a verify, ``eagle_info.py``'s
  ``EagleVerifyInput.generate_attn_arg_prefill``.

Stand-ins, besides the step's: FlashInfer's wrappers and ``fast_decode_plan`` where
``flashinfer`` does not import (:mod:`~attnfuzz.adapters.sglang.flashinfer_stand_in`:
``plan`` checks FlashInfer's contract, keeps or copies the arrays as FlashInfer does,
records them; its kernels never run), bound in ``flashinfer_backend``'s namespace only
while the backend is built or plans (:meth:`FlashInferEngine.planning`); and there,
where there is no CUDA, the backend's ``device="cuda"`` allocations on the engine's
device. The KV cache and queries are bf16 (FlashInfer runs fp16, bf16 and fp8); the
KV buffers are never read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``,
``eager``, ``padded``: the backend's persistent buffers after ``load_batch``,
``replay``: the buffers of the wrappers the graph of that batch size captured,
``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what the paged wrapper's kernels read: ``kv_indices`` by request
(row ``i``: ``kv_indices[kv_indptr[i] : kv_indptr[i + 1]]``, pages of one token),
``kv_last_page_len`` by request, ``kv_indptr`` and ``qo_indptr`` (verify, extend) as
offsets. Each with the range its consumer accepts (:meth:`FlashInferEngine.accepts`).
And ``kv_len`` and ``kv_slots``, what every backend states alike, from the paged
wrapper's arrays and, for an extend, the ragged one's (:meth:`FlashInferEngine.kv_read`).

Mutants (re-created defects of the graph metadata, each caught by its properties):
``sglang-flashinfer-indptr-off-buffer`` (the decode graph's ``kv_indptr`` computed off
the graph wrapper's buffer, which ``fast_decode_plan`` never copies: the replay reads
the capture's; replay equals eager, padding invariance) and
``sglang-flashinfer-verify-window-forgotten`` (the graph verify's KV lengths without
the draft window: replay equals eager, padding invariance).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine, flashinfer_stand_in
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import (
    arrive_then_step,
    replayed,
)
from attnfuzz.adapters.sglang.runner_step import reach_verify_replay as reach_verify_replay
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

DTYPE = torch.bfloat16
"""The KV cache's and the queries' dtype: one FlashInfer runs (the buffers are never read)."""

PAGE_SIZE = 1
"""The page size SGLang plans every FlashInfer wrapper with (``call_begin_forward``
hands ``1``): a page is a token, ``kv_indices`` are token slots."""


def prepare() -> None:
    """Import SGLang's runner and FlashInfer backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import flashinfer_backend  # noqa: F401


@dataclass
class _Arrays:
    """What FlashInfer's paged kernels read: the arrays its wrapper holds."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    qo_indptr: torch.Tensor | None


def _wrapper_arrays(metadata: Any) -> _Arrays:
    """The arrays of the first wrapper of the backend's ``DecodeMetadata`` or
    ``PrefillMetadata`` (one wrapper: no sliding window, no cross attention)."""
    if isinstance(metadata, _Arrays):
        return metadata
    wrappers = getattr(metadata, "decode_wrappers", None) or metadata.prefill_wrappers
    w = wrappers[0]
    return _Arrays(
        w._paged_kv_indptr_buf,
        w._paged_kv_indices_buf,
        w._paged_kv_last_page_len_buf,
        w._qo_indptr_buf,
    )


class _OnDevice:
    """``torch`` as ``flashinfer_backend`` sees it where there is no CUDA: its
    ``device="cuda"`` allocations (``init_cuda_graph_state``, the eager decode's
    ``kv_indices``) on the engine's device; everything else torch's own."""

    ALLOCATORS = ("empty", "zeros", "ones", "full", "arange", "tensor")

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def __getattr__(self, name: str) -> Any:
        real = getattr(torch, name)
        if name not in self.ALLOCATORS:
            return real

        def allocate(*args: Any, **kwargs: Any) -> Any:
            if str(kwargs.get("device")) == "cuda":
                kwargs["device"] = self._device
            # Host buffers pinned for copies to a GPU: CPU-only torch refuses the pin,
            # which changes no value.
            kwargs.pop("pin_memory", None)
            return real(*args, **kwargs)

        return allocate


class FlashInferEngine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is FlashInfer."""

    ATTENTION_BACKEND = "flashinfer"
    WHERE = {
        "eager": "flashinfer_backend.py:FlashInferAttnBackend.init_forward_metadata",
        "fresh": "flashinfer_backend.py:FlashInferAttnBackend.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "FlashInferAttnBackend's kv_indptr, cuda_graph_kv_indices, kv_last_page_len)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (what the "
        "graph's wrappers hold: FlashInferAttnBackend._create_decode_wrappers' / "
        "_create_prefill_wrappers' buffers)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(FlashInferAttnBackend.init_forward_metadata_out_graph, in_capture)",
    }

    BACKEND_MODULE = "flashinfer_backend"
    """The module of ``sglang.srt.layers.attention`` the backend plans in."""
    FLASHINFER_NAMES = flashinfer_stand_in.NAMES
    """What that module binds from ``flashinfer`` at import."""

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """While the backend is built or plans: FlashInfer's names where it does not
        import, and, without CUDA, its ``"cuda"`` allocations on the engine's device."""
        module = importlib.import_module(f"sglang.srt.layers.attention.{self.BACKEND_MODULE}")
        names = self.FLASHINFER_NAMES
        with flashinfer_stand_in.bound(module, names), contextlib.ExitStack() as stack:
            if not torch.cuda.is_available():
                stack.enter_context(_patched(module, "torch", _OnDevice(self.device)))
            yield

    def make_backend(self) -> Any:
        """``FlashInferAttnBackend(model_runner)``, on what the backend reads of the
        model runner besides the Triton backend's."""
        from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
        from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import (
            UnquantizedKVCacheMethod,
        )

        runner, pool = self.runner, self.runner.token_to_kv_pool
        runner.kv_cache_dtype = DTYPE
        runner.dtype = DTYPE
        runner.prefill_attention_backend_str = "flashinfer"
        runner.decode_attention_backend_str = "flashinfer"
        runner.model_config.is_multimodal = False
        runner.model_config.hf_config.architectures = ["LlamaForCausalLM"]
        # MHATokenToKVPool.quant_method: unquantized unless a KV quantization is asked.
        pool.get_kv_cache_quant_method = UnquantizedKVCacheMethod
        # _resolve_swa_kv_pool asks the allocator for its KV cache (not a sliding-window one).
        allocator = _engine.StandIn(get_kvcache=lambda: pool)
        with self.planning(), _patched(runner, "token_to_kv_pool_allocator", allocator):
            return FlashInferAttnBackend(runner)

    def _graph_runner(self) -> Any:
        with self.planning():
            return super()._graph_runner()

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with self.planning():
            return super().eager(inputs, mode, how=how)

    def persistent_metadata(self, mode: str) -> Any:
        """The backend's persistent buffers the graph's wrappers were built over."""
        b = self.backend
        qo = b.cuda_graph_qo_indptr[0] if mode == "verify" else None
        return _Arrays(b.kv_indptr[0], b.cuda_graph_kv_indices[0], b.kv_last_page_len, qo)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What FlashInfer's paged kernels read for ``rows`` requests and ``tokens``
        tokens (padding included), copied now."""
        arrays = _wrapper_arrays(metadata)
        # The paged kernels read kv_indices[kv_indptr[i] : kv_indptr[i + 1]] as pages of
        # one token of the layer's KV buffer (forward_decode / forward_extend hand the
        # wrapper token_to_kv_pool.get_kv_buffer(layer_id): size + page_size rows), as
        # the Triton backend's kernels do: its fields and ranges, of the wrapper's arrays.
        fields = super().metadata_fields(
            rows,
            tokens,
            _engine.StandIn(
                kv_indptr=arrays.kv_indptr,
                kv_indices=arrays.kv_indices,
                qo_indptr=arrays.qo_indptr,
            ),
        )
        # A row's length is (kv_indptr[i + 1] - kv_indptr[i] - 1) * page_size +
        # kv_last_page_len[i] (flashinfer/page.py:get_seq_lens; include/flashinfer/page.cuh
        # paged_kv_t::get_length), with 1 <= kv_last_page_len <= page_size (the wrappers'
        # documented contract): SGLang's page size 1.
        last = decode.host(arrays.kv_last_page_len[:rows])
        return (*fields, Field("kv_last_page_len", "requests", last, (1, PAGE_SIZE)))

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as FlashInfer's kernels read them: the
        paged wrapper's ``paged_kv_t::get_length`` keys of row ``i`` (0 for an empty row,
        else ``(kv_indptr[i + 1] - kv_indptr[i] - 1) * page_size + kv_last_page_len[i]``),
        key ``j`` in page ``kv_indices[kv_indptr[i] + j // page_size]``; where the
        extend runs the ragged wrapper too (``PrefillMetadata.use_ragged``:
        ``forward_extend``), then the step's own keys, ragged over ``qo_indptr``."""
        pages = np.diff(values["kv_indptr"])
        cached = np.where(pages == 0, 0, (pages - 1) * PAGE_SIZE + values["kv_last_page_len"])
        table = values["kv_indices"]
        slots = [decode.page_slots(table[i], n, PAGE_SIZE) for i, n in enumerate(cached)]
        if not getattr(metadata, "use_ragged", False):  # a decode, a verify: paged only
            return cached, slots
        return decode.with_step_keys(cached, slots, values["qo_indptr"], values["out_cache_loc"])


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


class FlashInferLife(decode.EngineLife):
    """The engine of ``sglang-flashinfer``: :class:`FlashInferEngine`, kept across a
    life's steps; its graph's replay planned with FlashInfer's names bound."""

    engine_class: type[FlashInferEngine] = FlashInferEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> FlashInferEngine:
        return self.engine_class(config, device, graphs=graphs)

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with engine.planning():
            return super().graph_builds(engine, inputs, mode)


ENGINE = FlashInferLife()
"""The engine of the implementation ``sglang-flashinfer`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-flashinfer`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutants: defects of the FlashInfer backend's graph metadata, re-created -----------------------


class _IndptrOffBuffer(FlashInferEngine):
    """The decode updater's ``kv_indptr`` for a graph wrapper computed in a buffer of its
    own (as for an eager wrapper), not in the wrapper's ``paged_kv_indptr_buffer``: the
    capture's ``plan`` copies it in, the replay's ``fast_decode_plan`` copies nothing,
    so the graph reads the capture's offsets (``call_begin_forward``'s ``kv_indptr``)."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        updater = backend.indices_updater_decode
        begin = updater.call_begin_forward

        def off_buffer(wrapper: Any, lens: Any, total: Any, kv_indptr: Any, *rest: Any,
                       **kwargs: Any) -> Any:  # fmt: skip
            if wrapper.is_cuda_graph_enabled:
                kv_indptr = kv_indptr.clone()
            return begin(wrapper, lens, total, kv_indptr, *rest, **kwargs)

        updater.call_begin_forward = off_buffer
        return backend


class _WindowForgotten(FlashInferEngine):
    """The graph verify's KV without the verify's draft window: the prefill updater
    hands ``generate_attn_arg_prefill`` the committed prefix less the window, which it
    widens back to the prefix alone (the capture's and the replay's)."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        updater = backend.indices_updater_prefill
        begin = updater.call_begin_forward

        def prefix_only(ragged: Any, paged: Any, rows: Any, lens: Any, total: int, *rest: Any,
                        **kwargs: Any) -> Any:  # fmt: skip
            if paged.is_cuda_graph_enabled:
                window = self.config.next_n
                lens, total = lens - window, total - window * len(lens)
            return begin(ragged, paged, rows, lens, total, *rest, **kwargs)

        updater.call_begin_forward = prefix_only
        return backend


class _MutantLife(FlashInferLife):
    def __init__(self, engine: type[FlashInferEngine]) -> None:
        self.engine_class = engine
        super().__init__()


INDPTR_OFF_BUFFER = _MutantLife(_IndptrOffBuffer)
WINDOW_FORGOTTEN = _MutantLife(_WindowForgotten)


def run_indptr_off_buffer(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-flashinfer-indptr-off-buffer``: :class:`_IndptrOffBuffer`."""
    return INDPTR_OFF_BUFFER(inputs)


def run_window_forgotten(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-flashinfer-verify-window-forgotten``: :class:`_WindowForgotten`."""
    return WINDOW_FORGOTTEN(inputs)


run_indptr_off_buffer.new_engine = INDPTR_OFF_BUFFER.new_engine  # type: ignore[attr-defined]
run_window_forgotten.new_engine = WINDOW_FORGOTTEN.new_engine  # type: ignore[attr-defined]


# -- where the mutants live: the steps SGLang's decode graph replays --------------------------


def reach_decode_replay(trace: Trace) -> bool:
    """A decode (no drafts) the decode graph replays: every such replay's requests hold
    at least 2 tokens, past the capture's fill length 1 (the stale offsets)."""
    return trace.config.num_spec == 0 and bool(replayed(trace))


def smallest_indptr_off_buffer() -> Trace:
    """One request of one token, then its decode in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 1)


def smallest_window_forgotten() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)
