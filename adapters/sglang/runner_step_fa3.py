"""SGLang's decode graph runner step on the FlashAttention 3 backend, as the
implementation ``sglang-fa3`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows, decode graph runner and graph stand-in), on the engine started with
``--attention-backend fa3``. What runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/flashattention_backend.py``: ``FlashAttentionBackend``:
  ``__init__``; ``init_forward_metadata`` (eager: a decode, a target verify of
  ``topk`` 1, an extend); ``init_cuda_graph_state`` (the persistent buffers, as
  ``DecodeCudaGraphRunner.__init__`` calls it); ``init_forward_metadata_out_graph``
  with ``in_capture=True`` for every capture batch size
  (``_init_full_cg_decode_metadata``, ``_bind_metadata_buffers``,
  ``_apply_cuda_graph_metadata``, the scheduler metadata's capture) and, from
  ``load_batch``, the replay (``_set_decode_page_metadata``, the Triton kernel
  ``kernels/ops/attention/metadata.py:normal_decode_set_metadata``, the scheduler
  metadata's recompute into its graph buffer).

Stand-ins, besides the step's: FlashAttention 3's module ``sgl_kernel.flash_attn``
where it does not import (:mod:`~attnfuzz.adapters.sglang.fa3_backend`: its
``get_scheduler_metadata`` by its contract; its kernels never run). The KV cache is
bf16 (FlashAttention 3 runs fp16, bf16 and fp8 only); its buffers are never read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``,
``eager``, ``padded``: the backend's ``forward_metadata`` after ``load_batch``,
``replay``: the metadata the graph of that batch size captured, ``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and the metadata's ``cache_seqlens_int32`` and ``page_table`` by
request (a page-table row: the pages its ``cache_seqlens`` reach, what the kernel
reads), ``cu_seqlens_q`` and ``cu_seqlens_k`` as offsets. Each with the range its
consumer accepts (:meth:`FA3Engine.accepts`). And ``kv_len`` and ``kv_slots``, what
every backend states alike, from ``cache_seqlens_int32`` and ``page_table``
(:meth:`FA3Engine.kv_read`).

Mutants (re-created defects of the graph metadata, each caught by its property):
``sglang-fa3-verify-window-forgotten`` (the graph's verify lengths without the
draft window: padding invariance, replay equals eager) and
``sglang-fa3-table-short-of-window`` (the graph's page table ``next_n`` tokens
short of the context: safe padding, at a replay or a verify's capture).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import fa3_backend
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import (
    arrive_then_step,
    graph_batch_sizes,
    replayed,
)
from attnfuzz.adapters.sglang.runner_step import reach_verify_replay as reach_verify_replay
from attnfuzz.reference.batch import Case, EngineConfig, cdiv
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

KV_CACHE_DTYPE = torch.bfloat16
"""The KV cache's dtype: one FlashAttention 3 runs (its buffers are never read)."""


def prepare() -> None:
    """Import SGLang's runner and FA3 backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import flashattention_backend  # noqa: F401


class FA3Engine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is FlashAttention 3."""

    ATTENTION_BACKEND = "fa3"
    WHERE = {
        "eager": "flashattention_backend.py:FlashAttentionBackend.init_forward_metadata",
        "fresh": "flashattention_backend.py:FlashAttentionBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch "
        "(buffers; FlashAttentionBackend._apply_cuda_graph_metadata's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: FlashAttentionBackend._bind_metadata_buffers' views)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(FlashAttentionBackend._init_full_cg_decode_metadata, in_capture)",
    }

    LOCAL_ATTENTION = False
    """Whether the model has chunked (local) attention layers (``sglang-fa3-local``)."""

    def make_backend(self) -> Any:
        """``FlashAttentionBackend(model_runner)`` (``fa_impl_ver`` 3), on what the
        backend reads of the model runner besides the Triton backend's."""
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend

        self.runner.kv_cache_dtype = KV_CACHE_DTYPE
        self.runner.kv_cache_dtype_str = "auto"
        self.runner.model_config.is_local_attention_model = self.LOCAL_ATTENTION
        with fa3_backend.flash_attn_module():
            return FlashAttentionBackend(self.runner)

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay preparation left as its metadata."""
        return self.backend.forward_metadata

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`), and FlashAttention 3's."""
        acc = super().accepts()
        page = self.config.block_size
        # flash_attn_with_kvcache (forward_decode, forward_extend) reads k_cache[page_table
        # [b, j]], the pool's pages: get_paged_mha_kv_cache views its size + page_size rows.
        pages = (self.runner.token_to_kv_pool.size + page) // page
        acc["page_table"] = (0, pages - 1)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """``FlashAttentionMetadata``'s fields for ``rows`` requests and ``tokens`` tokens
        (padding included), copied now."""
        acc, page = self.accepts(), self.config.block_size
        lens = decode.host(metadata.cache_seqlens_int32[:rows])
        table = decode.host(metadata.page_table[:rows])
        # flashattention_backend.py:FlashAttentionBackend.forward_decode (and forward_extend
        # for a verify or an extend) hands flash_attn_with_kvcache page_table, cache_seqlens
        # and cu_seqlens_q, every row of them, padding rows included. In FlashAttention 3
        # (hopper/flash_api.cpp:mha_fwd) a paged KV's seqlen_k is page_table.size(1) *
        # page_size, and row b reads page_table[b, :cdiv(cache_seqlens[b], page_size)]: a
        # length from 0 (no key: a zero output row) to the row's reach.
        reach = table.shape[1] * page
        read = -(-lens // page)
        return (
            Field("cache_seqlens_int32", "requests", lens, (0, reach)),
            Field("page_table", "requests", table, acc["page_table"], row_lengths=read),
            # flash_attn_with_kvcache reads q[cu_seqlens_q[b] : cu_seqlens_q[b + 1]] of the
            # tokens the forward hands it (padding included).
            Field(
                "cu_seqlens_q",
                "offsets",
                decode.host(metadata.cu_seqlens_q[: rows + 1]),
                (0, tokens),
            ),
            # cu_seqlens_k reaches the kernel only as cu_seqlens_k_new (forward_extend),
            # read where new keys are appended (k, v given): SGLang writes the KV first
            # (set_kv_buffer) and hands none, so no range binds it.
            Field("cu_seqlens_k", "offsets", decode.host(metadata.cu_seqlens_k[: rows + 1])),
        )

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as ``flash_attn_with_kvcache`` reads
        them (``forward_decode``, ``forward_extend``: every key from the paged cache,
        the step's own written first): ``cache_seqlens[b]`` keys, key ``j`` in page
        ``page_table[b, j // page_size]`` at ``j % page_size`` (``mha_fwd``'s paged KV)."""
        lens, table = values["cache_seqlens_int32"], values["page_table"]
        page = self.config.block_size
        return lens, [decode.page_slots(table[b], lens[b], page) for b in range(len(lens))]


class FA3Life(decode.EngineLife):
    """The engine of ``sglang-fa3``: :class:`FA3Engine`, kept across a life's steps."""

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> FA3Engine:
        return FA3Engine(config, device, graphs=graphs)


ENGINE = FA3Life()
"""The engine of the implementation ``sglang-fa3`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutants: defects of the FA3 backend's graph metadata, re-created -----------------------------


class _WindowForgotten(FA3Engine):
    """The graph's verify metadata without the verify's draft window: the capture and
    the replay fill ``cache_seqlens`` (and the page table's reach) for the committed
    prefix alone (``_apply_cuda_graph_metadata``'s ``verify_delta`` taken as 0, the
    ragged layout's, for the fixed-width verify)."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        fill = backend._set_decode_page_metadata

        def prefix_only(plan: Any, metadata: Any, rows: Any, seq_lens: Any, delta: int) -> None:
            fill(plan, metadata, rows, seq_lens, 0)

        backend._set_decode_page_metadata = prefix_only
        return backend


class _TableShortOfWindow(FA3Engine):
    """The graph's page table sized for a context ``next_n`` tokens short of the model's
    (``init_cuda_graph_state``: ``max_num_pages`` from ``context_len``): a request whose
    KV reaches the model's limit reads past its row (the context-length class)."""

    def make_backend(self) -> Any:
        model = self.runner.model_config
        model.context_len = max(1, self.config.max_model_len - self.config.next_n)
        try:
            return super().make_backend()
        finally:
            model.context_len = self.config.max_model_len


class _MutantLife(FA3Life):
    def __init__(self, engine: type[FA3Engine]) -> None:
        self.engine_class = engine
        super().__init__()

    def make(self, config: Any, device: torch.device, graphs: bool) -> FA3Engine:
        return self.engine_class(config, device, graphs=graphs)


WINDOW_FORGOTTEN = _MutantLife(_WindowForgotten)
TABLE_SHORT_OF_WINDOW = _MutantLife(_TableShortOfWindow)


def run_window_forgotten(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-fa3-verify-window-forgotten``: :class:`_WindowForgotten`."""
    return WINDOW_FORGOTTEN(inputs)


def run_table_short_of_window(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-fa3-table-short-of-window``: :class:`_TableShortOfWindow`."""
    return TABLE_SHORT_OF_WINDOW(inputs)


run_window_forgotten.new_engine = WINDOW_FORGOTTEN.new_engine  # type: ignore[attr-defined]
run_table_short_of_window.new_engine = TABLE_SHORT_OF_WINDOW.new_engine  # type: ignore[attr-defined]


# -- where the mutants live: the steps SGLang's decode graph replays --------------------------


def reach_graph(trace: Trace | Case) -> bool:
    """The engine captures decode graphs (each capture builds the graph's metadata)."""
    return bool(graph_batch_sizes(trace.config))


def trigger_table_short_of_window(trace: Trace | Case) -> bool:
    """A KV (``cache_seqlens``: the prefix and the step's tokens) past
    ``cdiv(max_model_len - next_n, page_size)`` pages in a graph build: a replayed
    request's, or a captured verify's (the fill length 1 and its ``next_n`` drafts)."""
    config = trace.config
    reach = cdiv(max(1, config.max_model_len - config.next_n), config.block_size)
    reach *= config.block_size
    captured = 1 + config.next_n if config.num_spec else 1
    return reach_graph(trace) and (
        captured > reach
        or any(
            c + q > reach
            for s in replayed(trace)
            for c, q in zip(s.num_computed_tokens, s.query_lens, strict=True)
        )
    )


def smallest_window_forgotten() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)


def smallest_table_short_of_window() -> Trace:
    """One request of 7 tokens, then its decode to the model's limit of 8, in the graph
    of one: its 8 tokens reach past a table of 7 pages of one token."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 7)
