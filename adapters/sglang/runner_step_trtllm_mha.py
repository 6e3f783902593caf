"""SGLang's decode graph runner step on the TRT-LLM MHA backend, as the implementation
``sglang-trtllm-mha`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows and decode graph runner), on the engine started with
``--attention-backend trtllm_mha``. What runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/trtllm_mha_backend.py``: ``TRTLLMHAAttnBackend`` (a
  ``FlashInferAttnBackend``): ``__init__``; ``init_forward_metadata`` (eager: a
  decode, a target verify of ``topk`` 1, an extend; ``_fill_page_table_device``);
  ``init_cuda_graph_state``; ``init_forward_metadata_out_graph`` with
  ``in_capture=True`` for every capture batch size (``_build_cuda_graph_metadata``)
  and, from ``load_batch``, the replay's; ``init_forward_metadata_in_graph``
  (``_apply_cuda_graph_metadata``), what the graph records and runs again at each
  replay;
- the Triton kernels ``kernels/ops/attention/trtllm_mha_page_table.py:
  build_trtllm_mha_page_table`` (the eager page table) and
  ``kernels/ops/attention/trtllm_mha_graph_metadata.py:update_trtllm_mha_graph_metadata``
  (the graph's ``cache_seqlens``, ``cu_seqlens_k`` and page table), under Triton's
  interpreter.

Stand-ins, besides the step's: FlashInfer's wrappers, as ``sglang-flashinfer``'s
(:mod:`~attnfuzz.adapters.sglang.flashinfer_stand_in`: the parent
``FlashInferAttnBackend.__init__`` builds them; TRT-LLM MHA plans none), and
flashinfer's device queries ``trtllm_mla_backend.make_persistent_multi_ctas_kv_counter_buffer``
sizes a zeroed buffer by (:func:`~attnfuzz.adapters.sglang.trtllm_mla.flashinfer_utils`),
each only where ``flashinfer`` does not import. No GPU: the platform is no SM90 or
SM120, so the backend takes the trtllm-gen path (no XQA, no fmha_v2 prefill), which a
Blackwell GPU takes. The KV cache and queries are bf16; the KV buffers are never read.

The graph (:class:`_RecordedGraph`): SGLang writes this backend's graph metadata
inside the graph (``capture_one_shape``'s ``run_once`` calls
``_run_in_graph_metadata_prep`` before the model's forward), so a capture runs that
body once, as the CUDA graph's warmup does, and a replay runs it again, as the
recorded kernels run again; the model's forward computes nothing (its attention
layers read the metadata, never write it).

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``,
``eager``, ``padded``: the backend's ``forward_metadata`` after ``execute``,
``replay``: the metadata the graph of that batch size captured, ``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what flashinfer's trtllm-gen kernels read of ``TRTLLMMHAMetadata``:
``cache_seqlens_int32`` and ``page_table`` by request (a row: the pages its
``cache_seqlens`` reach), ``cu_seqlens_q`` and ``cu_seqlens_k`` as offsets, and, for a
verify or an extend, ``max_seq_len_q`` (the query length of every request of a
verify; an extend's longest). Each with the range its consumer accepts
(:meth:`TRTLLMMHAEngine.accepts`). And ``kv_len`` and ``kv_slots``, what every backend
states alike, from ``cache_seqlens_int32`` and ``page_table``
(:meth:`TRTLLMMHAEngine.kv_read`).

Mutant (a re-created defect of the graph metadata):
``sglang-trtllm-mha-verify-offset-forgotten`` (the graph verify's ``seqlen_offset`` 0
in ``_apply_cuda_graph_metadata``: ``cache_seqlens`` of the committed prefix alone;
padding invariance, replay equals eager).

In ``sglang-backends`` too, beside the Triton engine, for the configs it does not
decline (:func:`declines_config`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine, flashinfer_stand_in, trtllm_mla
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.adapters.sglang.runner_step import reach_verify_replay as reach_verify_replay
from attnfuzz.adapters.sglang.runner_step_flashinfer import FlashInferEngine, _patched
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

DTYPE = torch.bfloat16
"""The KV cache's and the queries' dtype: one trtllm-gen runs (the buffers are never read)."""

PAGE_SIZES = (16, 32, 64, 128)
"""``arg_groups/overrides.py:_mla_backend_page_constraints``: the page sizes SGLang runs
TRT-LLM MHA with (any other becomes 64)."""


def prepare() -> None:
    """Import SGLang's runner and TRT-LLM MHA backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import trtllm_mha_backend  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang never runs TRT-LLM MHA on ``case``'s config, else None
    (:func:`declines_config`)."""
    return declines_config(case.config)


def declines_config(config: EngineConfig) -> str | None:
    """Why SGLang never runs TRT-LLM MHA on ``config``, else None. Its other
    refusals no case meets: an EAGLE ``topk`` above 1 (``arg_groups/speculative_hook.py``:
    "trtllm_mha backend only supports topk = 1"; the step's engine runs topk 1), pages
    of 128 without GQA (``TRTLLMHAAttnBackend.__init__``; no case draws 128, the model
    is GQA), and a KV cache method whose attention access is neither plain nor native
    FP4 (``_check_decode_kv_access``, ``_check_prefill_kv_access``; the engine's KV cache
    is plain bf16)."""
    page = config.block_size
    if page not in PAGE_SIZES:
        return (
            f"page size {page}: SGLang runs TRT-LLM MHA with pages of 16, 32, 64 or 128 "
            "tokens only, any other becomes 64 (arg_groups/overrides.py: "
            "_mla_backend_page_constraints)"
        )
    return None


def _computes_nothing(*args: Any, **kwargs: Any) -> None:
    """The model's forward inside the graph stand-in: attention layers read the
    metadata the in-graph preparation wrote, never write it; nothing to compute."""
    return None


class _RecordedGraph(decode._Graph):
    """The decode runner's graph where there is no CUDA, for a backend whose metadata
    is written inside the graph: a capture runs ``run_once`` (the in-graph metadata
    preparation, then a model forward that computes nothing), as the warmup before a
    CUDA graph's capture does, and records it; a replay runs it again, as the graph's
    recorded kernels run again on the buffers they captured."""

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
        return super().replay(shape_key, static_forward_batch, **kwargs)

    def _run(self, body: Any) -> None:
        """``body`` run eagerly, as a warmup runs it: no stream is capturing (the
        runner's in-graph marker, ``_record_in_graph_metadata_prep_done``, asks its
        device module, which on a CPU has no capture to ask of)."""
        module = self.runner.device_module
        eager = _engine.StandIn(is_current_stream_capturing=lambda: False)
        with _patched(self.runner, "device_module", eager):
            body()
        assert self.runner.device_module is module

    def cleanup(self) -> None:
        self.bodies.clear()
        super().cleanup()


class TRTLLMMHAEngine(FlashInferEngine):
    """One SGLang engine whose model runner's attention backend is TRT-LLM MHA."""

    ATTENTION_BACKEND = "trtllm_mha"
    GRAPH = _RecordedGraph
    WHERE = {
        "eager": "trtllm_mha_backend.py:TRTLLMHAAttnBackend.init_forward_metadata",
        "fresh": "trtllm_mha_backend.py:TRTLLMHAAttnBackend.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (buffers; "
        "TRTLLMHAAttnBackend._apply_cuda_graph_metadata's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: TRTLLMHAAttnBackend._build_cuda_graph_metadata's views, "
        "rewritten by the recorded _apply_cuda_graph_metadata)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(TRTLLMHAAttnBackend._build_cuda_graph_metadata, then init_forward_metadata_in_graph)",
    }

    @contextlib.contextmanager
    def planning(self) -> Iterator[None]:
        """FlashInfer's names (:meth:`FlashInferEngine.planning`) and, where flashinfer
        does not import, its device queries in ``trtllm_mla_backend``."""
        from sglang.srt.layers.attention import trtllm_mla_backend

        with super().planning(), contextlib.ExitStack() as stack:
            if not flashinfer_stand_in.vendor_imports():
                stack.enter_context(
                    _bound(trtllm_mla_backend, "flashinfer", trtllm_mla.flashinfer_utils())
                )
            yield

    def make_backend(self) -> Any:
        """``TRTLLMHAAttnBackend(model_runner)``, on what the backend reads of the model
        runner besides FlashInfer's."""
        from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
        from sglang.srt.layers.quantization.fp4_kv_cache_quant_method import (
            UnquantizedKVCacheMethod,
        )

        runner, pool = self.runner, self.runner.token_to_kv_pool
        runner.kv_cache_dtype = DTYPE
        runner.dtype = DTYPE
        runner.prefill_attention_backend_str = "trtllm_mha"
        runner.decode_attention_backend_str = "trtllm_mha"
        runner.model_config.is_multimodal = False
        # Sizes the multi-CTA KV counter (and XQA's mask, on SM90): --max-running-requests.
        runner.max_running_requests = self.config.max_num_seqs
        runner.model_config.hf_config.architectures = ["LlamaForCausalLM"]
        # MHATokenToKVPool.quant_method: unquantized unless a KV quantization is asked.
        pool.get_kv_cache_quant_method = UnquantizedKVCacheMethod
        # Its __init__ looks for ENCODER_ONLY layers; the graph stand-in runs the model's
        # forward, which computes nothing here.
        runner.model = _engine.StandIn(
            shared_experts_config=None, forward=_computes_nothing, modules=lambda: iter(())
        )
        # _resolve_swa_kv_pool asks the allocator for its KV cache (not a sliding-window one).
        allocator = _engine.StandIn(get_kvcache=lambda: pool)
        with self.planning(), _patched(runner, "token_to_kv_pool_allocator", allocator):
            return TRTLLMHAAttnBackend(runner)

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay left as its metadata."""
        return self.backend.forward_metadata

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`), and trtllm-gen's."""
        acc = decode._Engine.accepts(self)
        page = self.config.block_size
        # trtllm_batch_decode_with_kv_cache / trtllm_batch_context_with_kv_cache read
        # kv_cache[block_tables[b, j]]: _reshape_paged_kv_cache views the pool's
        # size + page_size rows as pages.
        pages = (self.runner.token_to_kv_pool.size + page) // page
        acc["page_table"] = (0, pages - 1)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """``TRTLLMMHAMetadata``'s fields for ``rows`` requests and ``tokens`` tokens
        (padding included), copied now."""
        # forward_decode (_run_fixed_q_len_decode) and forward_extend hand flashinfer's
        # trtllm-gen kernels block_tables=page_table and seq_lens=cache_seqlens_int32,
        # every row, with max_seq_len (max_kv_len) = self.max_context_len (paged_rows).
        out = [
            *paged_rows(self, metadata, rows),
            # The context kernel (an extend) reads q[cum_seq_lens_q[b] : cum_seq_lens_q[b
            # + 1]] of the forward's tokens; the decode kernel of a verify the same rows
            # by q_len_per_req, which this preset states alike.
            Field(
                "cu_seqlens_q",
                "offsets",
                decode.host(metadata.cu_seqlens_q[: rows + 1]),
                (0, tokens),
            ),
            # cum_seq_lens_kv (the context kernel's): each request's KV offsets, keys read
            # through the page table: no range binds it but its agreement.
            Field("cu_seqlens_k", "offsets", decode.host(metadata.cu_seqlens_k[: rows + 1])),
        ]
        if tokens > rows:  # a verify's q_len_per_req, an extend's max_q_len: each row's
            q = int(metadata.max_seq_len_q)
            out.append(Field("max_seq_len_q", "requests", np.full(rows, q), (1, tokens)))
        return tuple(out)

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as trtllm-gen's kernels read them
        (every key from the paged cache, the step's own written first by
        ``set_kv_buffer``): ``cache_seqlens[b]`` keys, key ``j`` in page
        ``page_table[b, j // page_size]`` at ``j % page_size``."""
        lens, table = values["cache_seqlens_int32"], values["page_table"]
        page = self.config.block_size
        return lens, [decode.page_slots(table[b], lens[b], page) for b in range(len(lens))]


def paged_rows(engine: Any, metadata: Any, rows: int) -> tuple[Field, Field]:
    """``cache_seqlens_int32`` and ``page_table`` of ``rows`` requests as a paged kernel
    of ``engine``'s backend reads them (TRT-LLM MHA's, HPC-Ops'): row ``b`` reads
    ``page_table[b, :cdiv(cache_seqlens[b], page_size)]``, a length at most the
    backend's ``max_context_len`` (the kernels size their work by it) and the row's reach.

    What a row holds past its read pages is no value of SGLang's: the eager table is
    ``torch.empty``, the graph's keeps a longer request's pages, and SGLang's writers
    stop there by contract (``update_trtllm_mha_graph_metadata``: "consumers must bound
    reads by cache_seqlens"; ``_fill_page_table_device``: "the actual writes stay bounded
    by cache_seqlens"). The field is the rows as the kernels read them."""
    page = engine.config.block_size
    lens = decode.host(metadata.cache_seqlens_int32[:rows])
    table = decode.host(metadata.page_table[:rows])
    reach = min(table.shape[1] * page, engine.backend.max_context_len)
    read = -(-lens // page)
    table[np.arange(table.shape[1])[None, :] >= read[:, None]] = 0
    return (
        Field("cache_seqlens_int32", "requests", lens, (0, reach)),
        Field("page_table", "requests", table, engine.accepts()["page_table"], row_lengths=read),
    )


@contextlib.contextmanager
def _bound(module: Any, name: str, value: Any) -> Iterator[None]:
    """``module.name`` is ``value`` for the block (a name the module may lack)."""
    missing = object()
    saved = getattr(module, name, missing)
    setattr(module, name, value)
    try:
        yield
    finally:
        if saved is missing:
            delattr(module, name)
        else:
            setattr(module, name, saved)


class TRTLLMMHALife(decode.EngineLife):
    """The engine of ``sglang-trtllm-mha``: :class:`TRTLLMMHAEngine`, kept across a
    life's steps; its graph's replay run with FlashInfer's names bound."""

    engine_class: type[TRTLLMMHAEngine] = TRTLLMMHAEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> TRTLLMMHAEngine:
        return self.engine_class(config, device, graphs=graphs)

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with engine.planning():
            return super().graph_builds(engine, inputs, mode)


ENGINE = TRTLLMMHALife()
"""The engine of the implementation ``sglang-trtllm-mha`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-trtllm-mha`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the TRT-LLM MHA backend's graph metadata, re-created ----------------------


class _VerifyOffsetForgotten(TRTLLMMHAEngine):
    """The graph verify's ``seqlen_offset`` taken as 0 in ``_apply_cuda_graph_metadata``
    (the draft decode's and the normal decode's branch, not the verify's
    ``metadata.max_seq_len_q``): the fused kernel writes ``cache_seqlens`` and
    ``cu_seqlens_k`` of the committed prefix alone, at capture and at every replay."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        apply = backend._apply_cuda_graph_metadata

        def offset_forgotten(bs: int, *args: Any, **kwargs: Any) -> None:
            metadata = backend.target_verify_metadata.get(bs)
            mode = kwargs.get("forward_mode", args[2] if len(args) > 2 else None)
            if metadata is None or not mode.is_target_verify():
                return apply(bs, *args, **kwargs)
            window, metadata.max_seq_len_q = metadata.max_seq_len_q, 0
            try:
                return apply(bs, *args, **kwargs)
            finally:
                metadata.max_seq_len_q = window

        backend._apply_cuda_graph_metadata = offset_forgotten
        return backend


class _MutantLife(TRTLLMMHALife):
    def __init__(self, engine: type[TRTLLMMHAEngine]) -> None:
        self.engine_class = engine
        super().__init__()


VERIFY_OFFSET_FORGOTTEN = _MutantLife(_VerifyOffsetForgotten)


def run_verify_offset_forgotten(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-trtllm-mha-verify-offset-forgotten``:
    :class:`_VerifyOffsetForgotten`."""
    return VERIFY_OFFSET_FORGOTTEN(inputs)


run_verify_offset_forgotten.new_engine = VERIFY_OFFSET_FORGOTTEN.new_engine  # type: ignore[attr-defined]


def smallest_verify_offset_forgotten() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 in the graph of one,
    on pages of 16 tokens (the smallest TRT-LLM MHA runs)."""
    config = EngineConfig(max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16,
                          block_size=16, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)
