"""SGLang's decode graph runner step on the Qwen sparse-attention (QSA) backend, as the
implementation ``sglang-qwen-sparse`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same request rows, decode
graph runner and graph stand-in), on the engine of a Qwen4-Exp model: its attention
backend made by ``attention_registry.py:create_qsa_backend`` (``--attention-backend
qsa``; on Qwen4-Exp ``attn_backend_wrapper`` puts the same backend as the full-attention
side of ``HybridLinearAttnBackend``, which hands it the same calls: the GDN side is
``sglang-hybrid-gdn``'s), its KV pool ``mem_cache/qsa_kv_pool.py:QSATokenToKVPool`` as
``kv_cache_configurator.py`` makes it for a QSA profile (compress ratio 4, block top-k
512; the per-request pending ring), on pages of 64 tokens
(``arg_groups/model_overrides/qwen4_exp.py``: "Setting page size to 64 for compressed
QSA"). What runs besides, unchanged (SGLang 0.5.23):

- ``layers/attention/qwen_sparse_attn_backend.py``: ``QwenSparseAttnBackend``:
  ``__init__`` (its profile from the model config: ``qsa/config.py:parse_qsa_profile``);
  ``init_forward_metadata`` (eager: ``_metadata_from_forward_batch`` of a decode, a
  target verify of ``topk`` 1, an extend; ``_qsa_build_write_plan`` and
  ``_qsa_write_plan``; ``qsa/metadata.py``'s ``compressed_decode_view``,
  ``build_pending_ring_slots``, ``build_group_ring_slots``,
  ``build_rope_position_matrix``); ``init_cuda_graph_state``;
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture batch
  size (``_capture_cuda_graph_metadata``, ``_graph_speculative_layout``) and, from
  ``load_batch``, the replay's (``_replay_cuda_graph_metadata``,
  ``_replay_cuda_graph_metadata_gpu``); ``get_cuda_graph_seq_len_fill_value``;
- ``qsa/graph_metadata.py:launch_graph_metadata``'s Triton kernel
  ``_qsa_graph_row_metadata_kernel`` (every graph buffer of a decode's and a verify's
  replay), under Triton's interpreter: the replay a CUDA GPU runs.
- ``mem_cache/allocation_sizing.py:get_req_to_token_extra_context_len``: the
  request-to-token table as wide as SGLang makes it (``context_len + 4`` without drafts;
  with drafts, on pages of 64, ``2 *`` the drafts' decode allocation ``+ 63`` past it).

The model's ``context_len`` is the engine's ``max_model_len`` rounded up to whole pages
(a served context, as Qwen4-Exp's 262144 tokens are): the first finding below stays
apart.

Stand-ins, besides the step's: pinned host memory (``init_cuda_graph_state`` stages a
draft extend's lengths in two ``pin_memory=True`` buffers, which torch refuses on a
machine without an accelerator: plain host memory there, :func:`no_pinned_memory`, while
the graph runner is built); and the replay's device test: ``_can_replay_with_gpu_kernels``
asks whether ``seq_lens`` is a CUDA tensor, and where there is none it answers as on a GPU
(:func:`cuda_replay_gate`: its own test, the pool's ``supports_graph_metadata_kernels``
for a ``cuda`` device). Nothing else: the vendor kernels (the trtllm sparse decode, the
FA2/FA4 varlen fallback, TileLang's MQA) are resolved by a forward only, which the graph
stand-in never runs. The KV cache and queries are bf16; the KV buffers are never read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``: the backend's ``forward_metadata`` after ``load_batch``, ``replay``: the
metadata the graph of that batch size captured, its views of the graph buffers as the
replay left them, ``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what the consumers (the indexer ``qsa/qsa_indexer.py:QSAIndexer``, the
sparse attention's gathers) read of ``QwenSparseAttnMetadata`` and its
``QSAIndexerMetadata``, by metadata row (a decode's and an extend's rows are its requests,
a verify's its query tokens): ``sequence_lengths``, ``row_req_pool_indices``; for a decode
and a verify ``decode_logical_positions``, ``compressed_page_table`` (the eager
``decode_page_table``, the graph's ``graph_compressed_page_table``; a row's
``cdiv(compressed_lengths, 16)`` pages read) and ``compressed_lengths``
(``decode_lengths``, ``graph_compressed_lengths``); by query token ``token_to_batch_idx``,
``pending_ring_slots`` and ``pending_ring_rows`` (the ring row of each: a request's
state, judged by *padding writes no real state*); the compression of the indexer cache
as ``update_key_state_and_compress`` runs it, per metadata row (the eager plan is
compacted, the graph's a row each): ``compress_write_locs`` (the compressed slots a row
writes; slot 0 the inert dump) and, for a decode and a verify, ``compress_ring_locs``
(the ring slots its group averages), for an extend ``compress_member_rows`` (each
group's first token row); for an extend ``token_slot_table``
(``gather_qsa_compressed_keys``), ``extend_rope_matrix`` and
``prefill_sequence_lengths_cpu``. Each with the range its consumer accepts
(:meth:`QwenSparseEngine.accepts`, :meth:`QwenSparseEngine.metadata_fields`). And
``kv_len`` and ``kv_slots``, what every backend states alike: the keys a request's sparse
attention may select and their slots (:meth:`QwenSparseEngine.kv_read`). A new engine's
request rows are its own: the ``fresh`` build holds none of the fields naming them
(:attr:`QwenSparseEngine.HISTORY`). Not judged: ``fa2_valid_counts`` and
``fa2_cu_seqlens_k`` (the forward writes them: ``qwen_sparse_fa2_cu_seqlens_triton``),
``fa2_cu_seqlens_q`` (a constant ``arange``), ``graph_prefix_lengths`` (no consumer reads
it), ``compress_group_positions`` (read only where the ring slots or member rows are
absent).

Findings of SGLang's own, kept apart (each engine below, its smallest trace):

- :class:`ProductionContextEngine` (the model's ``context_len`` the engine's
  ``max_model_len``, any ``--context-length``): the replay writes ``row_width_pages =
  req_to_token.shape[1] // full_page`` columns of the compressed page table
  (``graph_metadata.py:_qsa_graph_row_metadata_kernel``; the host fallback
  ``_update_qsa_cuda_graph_metadata`` alike), a floor: where the table is no whole
  number of 64-token pages, a request whose compressed blocks reach the last, partial
  page reads the never-written column (page 0) where the eager ``compressed_decode_view``
  reads its own page. Without drafts the table is ``context_len + 4`` wide: every context
  whose remainder mod 64 lies in 1 to 59 (100000, say: requests of 99972 tokens on).
- :class:`HostReplayEngine` (the replay off CUDA, ``_update_qsa_cuda_graph_metadata``, as
  SGLang runs it where ``seq_lens`` is no CUDA tensor): a padded verify's padding rows
  take ``req_pool_indices[0]``, a real request's row (``_graph_speculative_layout``'s
  ``dummy_req``), so their index keys are stored into that request's pending ring
  (``pending_ring_slots``), which its next compression averages; the kernel gives them
  row 0, the inert one ("Request slot 0 is never allocated").

Mutant (a re-created defect of the graph metadata):
``sglang-qwen-sparse-page-table-off-buffer`` (the replay refreshes a copy of the graph's
compressed page table, ``msgspec.structs.replace``-d into a new metadata the backend then
holds, not the buffer the graph captured: each replay's ``forward_metadata`` is right,
the graph reads the capture's table; replay equals eager).

Not driven yet: the draft extend (``DRAFT_EXTEND_V2``, the draft-extend graph runner's;
``launch_graph_metadata``'s mode 2), ``QwenSparseMultiStepDraftBackend`` (the MTP draft
decode) and ``QSAMTPSharedSparseIndices``, context-parallel prefill, DP padding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import arrive_then_step, replayed
from attnfuzz.reference.batch import Case, EngineConfig, cdiv
from attnfuzz.reference.runner_step import (
    Field,
    RunnerStepInputs,
    RunnerStepOutputs,
    StepBuild,
    make_inputs,
)
from attnfuzz.reference.trace import Trace

DTYPE = torch.bfloat16
"""The KV cache's and the queries' dtype: one the trtllm sparse decode runs (never read)."""

PAGE_SIZE = 64
"""``arg_groups/model_overrides/qwen4_exp.py:_qwen4_exp_overrides``: a model with a QSA
profile runs on pages of 64 tokens, whatever ``--page-size`` says."""

COMPRESS_RATIO = 4
"""The profile's ``indexer_compress_ratio``: keys a compressed block averages (the ratio
``_can_defer_block_expansion`` takes Qwen4-Exp's to be)."""

INDEXER = dict(
    indexer_n_heads=2,
    indexer_kv_heads=1,  # qsa/config.py: "the QSA MQA operators require indexer_kv_heads=1"
    indexer_head_dim=16,
    indexer_budget=2048,  # block top-k 512 (fast_topk_v2's widths: 512 or 2048)
    indexer_compress_ratio=COMPRESS_RATIO,
)
"""The model config's QSA profile (``qsa/config.py:parse_qsa_profile``), small heads."""

FULL_ATTENTION_LAYERS = [0]
"""The model's full-attention layers: the QSA pool's (``full_attention_layer_ids``)."""

INERT_SLOT = 0
"""``qsa_kv_pool.py``: "compressed slot 0 is the inert dump": a row that completes no
group writes there (``_qsa_write_plan``, ``_qsa_graph_row_metadata_kernel``)."""


def prepare() -> None:
    """Import SGLang's runner and QSA backend before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import qwen_sparse_attn_backend  # noqa: F401
    from sglang.srt.layers.attention.qsa import graph_metadata  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang never runs the QSA backend on ``case``'s step, else None. Pages other
    than 64 tokens are the fixed ``block_size``'s (``Implementation.fixes``). Its other
    refusals no case meets: an EAGLE ``topk`` above 1 (``_require_chain_speculation``;
    the engine runs topk 1)."""
    config = case.config
    if config.num_spec and config.next_n > COMPRESS_RATIO:
        return (
            f"next_n {config.next_n}: QwenSparseAttnBackend._require_chain_speculation "
            f"refuses a verify wider than the compress ratio ({COMPRESS_RATIO}): 'the "
            "pending index-key ring holds one group'"
        )
    inputs = make_inputs(case)
    unaligned = [c for c in inputs.num_computed_tokens if c % COMPRESS_RATIO]
    if decode.step_mode(inputs) == "extend" and unaligned:
        return (
            f"an extend over a prefix of {unaligned[0]} tokens: QwenSparseAttnBackend."
            "_qsa_build_write_plan asserts every extend's prefix whole compression groups "
            "('Prefix sharing is page-granular and the page is a ratio multiple'; the "
            "scheduler cuts chunks at pages: schedule_policy.py, end // page_size)"
        )
    return None


# -- what a CPU lacks ---------------------------------------------------------------------------


@contextlib.contextmanager
def no_pinned_memory() -> Iterator[None]:
    """``torch.zeros(..., pin_memory=True)`` allocates plain host memory for the block,
    where no accelerator has a pinned allocator (torch refuses it there); a GPU's is left
    alone. ``init_cuda_graph_state`` pins the two staging halves of a draft extend's
    lengths (``_graph_extend_lens_pin``): a copy's source, never metadata."""
    if torch.cuda.is_available():
        yield
        return
    zeros = torch.zeros

    def unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return zeros(*args, **kwargs)

    with mock.patch.object(torch, "zeros", unpinned):
        yield


def cuda_replay_gate(backend: Any) -> None:
    """``backend._can_replay_with_gpu_kernels`` answered as on a CUDA GPU: its own test
    (a request-to-token table, and ``supports_graph_metadata_kernels`` of the pool), with
    the device a ``cuda`` one where the tensors are on the host. The replay then runs
    ``launch_graph_metadata``'s Triton kernels, interpreted."""
    from sglang.srt.layers.attention.qsa.graph_metadata import supports_graph_metadata_kernels

    def gate(self: Any, metadata: Any, seq_lens: torch.Tensor) -> bool:
        if self.req_to_token is None:
            return False
        pool = metadata.indexer_metadata.token_to_kv_pool
        return supports_graph_metadata_kernels(pool, "cuda")

    backend._can_replay_with_gpu_kernels = types.MethodType(gate, backend)


# -- the engine ---------------------------------------------------------------------------------


def served_context_len(config: EngineConfig) -> int:
    """The model's ``context_len`` of ``sglang-qwen-sparse``: ``max_model_len`` rounded up
    to whole pages, so that the request-to-token table is whole pages too (the finding of
    :data:`CONTEXT_LEN_PAGE_TABLE` kept apart)."""
    return cdiv(config.max_model_len, PAGE_SIZE) * PAGE_SIZE


def _per_row(
    locs: np.ndarray, rows: np.ndarray, members: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A write plan's entries (compressed slot ``locs[e]`` of metadata row ``rows[e]``, its
    members ``members[e]``) as row tables, in plan order: the slots each of ``n`` rows
    writes, their members, and how many each. An entry of the inert slot writes nothing
    the cache keeps (``qsa_kv_pool.py``): not a row's write."""
    taken = [(int(r), int(loc), m) for loc, r, m in zip(locs, rows, members, strict=True)
             if loc != INERT_SLOT]  # fmt: skip
    counts = np.zeros(n, dtype=np.int64)
    for r, _, _ in taken:
        counts[r] += 1
    width = max(1, int(counts.max(initial=0)))
    slots = np.zeros((n, width), dtype=np.int64)
    of = np.zeros((n, width) + members.shape[1:], dtype=np.int64)
    seen = np.zeros(n, dtype=np.int64)
    for r, loc, m in taken:
        slots[r, seen[r]], of[r, seen[r]] = loc, m
        seen[r] += 1
    return slots, of, counts


class QwenSparseEngine(decode._Engine):
    """One SGLang engine of a Qwen4-Exp model: its attention backend
    ``QwenSparseAttnBackend``, its KV pool ``QSATokenToKVPool``."""

    ATTENTION_BACKEND = "qsa"
    CUDA_REPLAY = True
    """The replay a CUDA GPU runs (``launch_graph_metadata``); False: the host fallback."""
    WHERE = {
        "eager": "qwen_sparse_attn_backend.py:QwenSparseAttnBackend.init_forward_metadata",
        "fresh": "qwen_sparse_attn_backend.py:QwenSparseAttnBackend.init_forward_metadata "
        "(a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "QwenSparseAttnBackend._replay_cuda_graph_metadata's forward_metadata)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: QwenSparseAttnBackend._capture_cuda_graph_metadata's views of "
        "its graph buffers, as the replay left them)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(QwenSparseAttnBackend._capture_cuda_graph_metadata, in_capture)",
    }
    HISTORY = (
        "row_req_pool_indices",
        "pending_ring_slots",
        "pending_ring_rows",
        "compress_ring_locs",
    )
    """Fields that name the engine's own request rows (a ring slot is ``req_pool_idx *
    ratio + position % ratio``): a new engine's are its own, history picks them."""

    def context_len(self) -> int:
        """The model's ``context_len`` (``--context-length``)."""
        return served_context_len(self.config)

    def make_backend(self) -> Any:
        """``create_qsa_backend(model_runner)`` (``ATTENTION_BACKENDS["qsa"]``), on the model
        runner's QSA model config, request-to-token table and pool."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.qsa_kv_pool import QSATokenToKVPool

        runner, config = self.runner, self.config
        context_len = self.context_len()
        runner.dtype = runner.kv_cache_dtype = runner.model_config.dtype = DTYPE
        runner.model_config.context_len = context_len
        for name, value in INDEXER.items():  # the text config parse_qsa_profile reads
            setattr(runner.model_config.hf_text_config, name, value)
        # kv_cache_configurator.py:_build_req_to_token_pool: the model's context and the
        # row headroom of the server's decode over-allocation.
        width = context_len + get_req_to_token_extra_context_len()
        pool = ReqToTokenPool(
            size=config.max_num_seqs,
            max_context_len=width,
            device=str(self.device),
            enable_memory_saver=False,
        )
        # kv_cache_configurator.py (the hybrid pool of a QSA profile): as many ring rows
        # as request rows; its mamba pool is the GDN layers' (never read by QSA).
        profile = runner.model_config.hf_text_config
        kv_pool = QSATokenToKVPool(
            size=decode.pool_pages(config) * PAGE_SIZE,
            dtype=DTYPE,
            page_size=PAGE_SIZE,
            head_num=1,
            head_dim=decode.HEAD_DIM,
            full_attention_layer_ids=FULL_ATTENTION_LAYERS,
            device=str(self.device),
            mamba_pool=None,
            qsa_index_kv_heads=profile.indexer_kv_heads,
            qsa_index_head_dim=profile.indexer_head_dim,
            qsa_compress_ratio=profile.indexer_compress_ratio,
            qsa_token_topk=profile.indexer_budget,
            num_request_slots=pool.req_to_token.shape[0],
        )
        runner.req_to_token_pool, runner.token_to_kv_pool = pool, kv_pool
        runner.kv_index_translator = KVIndexTranslator(
            req_to_token=pool.req_to_token,
            token_to_kv_pool_allocator=None,
            token_to_kv_pool=kv_pool,
            page_size=PAGE_SIZE,
            device=str(self.device),
        )
        backend = ATTENTION_BACKENDS["qsa"](runner)
        if self.CUDA_REPLAY and not torch.device(self.device).type == "cuda":
            cuda_replay_gate(backend)
        return backend

    def _graph_runner(self) -> Any:
        with no_pinned_memory():
            return super()._graph_runner()

    def persistent_metadata(self, mode: str) -> Any:
        """What the backend's replay preparation left as its metadata."""
        return self.backend.forward_metadata

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        """The step's eager build; a new engine's without the fields of its own rows."""
        build = super().eager(inputs, mode, how=how)
        if how != "fresh":
            return build
        kept = tuple(f for f in build.fields if f.name not in self.HISTORY)
        return dataclasses.replace(build, fields=kept)

    # -- what the consumers accept -------------------------------------------------------------

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`), and the QSA consumers'."""
        acc = decode._Engine.accepts(self)
        table = self.runner.req_to_token_pool.req_to_token
        pool = self.runner.token_to_kv_pool
        ring = pool.qsa_num_request_slots * pool.qsa_compress_ratio
        # The sparse attention (sparse_attn.py:_compact_kv, fused_kv.py:fused_kv_prepare)
        # reads req_to_token[row_req_pool_indices[r], p] for each selected position p <
        # sequence_lengths[r]: a row of the table, a length at most its width and at
        # least one key (qsa/config.py: "Padding rows carry logical length 1";
        # _fa2_valid_counts hands the paged decode a row of no key otherwise).
        acc["row_req_pool_indices"] = (0, table.shape[0] - 1)
        acc["sequence_lengths"] = (1, table.shape[1])
        # expand_qsa_block_indices and the indexer's ring store take the query's logical
        # position: a column of the table.
        acc["decode_logical_positions"] = (0, table.shape[1] - 1)
        # QSATokenToKVPool.set_qsa_key_state_buffer / qsa_index_q_norm_rope_store write
        # the pending ring at pending_ring_slots; the compression (qsa_indexer.py:
        # update_key_state_and_compress, _compress_decode_cuda_graph) reads it at the ring
        # slots of every plan entry: qsa_num_request_slots * ratio rows.
        acc["pending_ring_slots"] = (0, ring - 1)
        acc["compress_ring_locs"] = (0, ring - 1)
        # set_qsa_compressed_k_buffer / qsa_index_k_compress_store write the compressed
        # cache at each entry's slot: qsa_compressed_capacity rows.
        acc["compress_write_locs"] = (0, pool.qsa_compressed_capacity - 1)
        # qsa_mqa_decode views the compressed cache as pages of qsa_compressed_page_size
        # and gathers page_table entries (torch_qsa_mqa_decode: every entry).
        acc["compressed_page_table"] = (
            0,
            pool.qsa_compressed_capacity // pool.qsa_compressed_page_size - 1,
        )
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the consumers read of ``QwenSparseAttnMetadata`` ``metadata`` for ``rows``
        requests and ``tokens`` tokens (padding included), copied now."""
        acc = self.accepts()
        indexer = metadata.indexer_metadata
        pool = self.runner.token_to_kv_pool
        extend = not metadata.is_cuda_graph and indexer.decode_logical_positions is None
        # A verify's metadata rows are its query tokens (_speculative_row_to_request; the
        # graph's speculative layout), a decode's and an extend's its requests.
        per = "tokens" if self.config.num_spec and not extend else "requests"
        n = rows if per == "requests" else tokens
        lengths = decode.host(metadata.sequence_lengths[:n])
        ring = decode.host(indexer.pending_ring_slots[:tokens])
        out = [
            Field("sequence_lengths", per, lengths, acc["sequence_lengths"]),
            Field(
                "row_req_pool_indices",
                per,
                decode.host(metadata.row_req_pool_indices[:n]),
                acc["row_req_pool_indices"],
            ),
            # get_seqlens_expanded / _logical_to_physical index sequence_lengths (and the
            # token-slot rows) by it: a metadata row.
            Field(
                "token_to_batch_idx",
                "tokens",
                decode.host(metadata.token_to_batch_idx[:tokens]),
                (0, n - 1),
            ),
            # Where each query token's index key is stored: a slot of its own request's
            # pending ring (build_pending_ring_slots: req_pool_idx * ratio + position %
            # ratio; an extend's tokens before the pending tail: the dump rows [0, ratio)).
            Field("pending_ring_slots", "tokens", ring, acc["pending_ring_slots"]),
            # Its ring row: a request's state (its pending group's keys, which a later
            # row's compression averages); row 0 no request owns ("request slot 0 is never
            # allocated", the inert dump). A padding token must store into no real one.
            Field(
                "pending_ring_rows",
                "tokens",
                ring // COMPRESS_RATIO,
                (0, pool.qsa_num_request_slots - 1),
                writes_state=True,
                null_slot=0,
            ),
        ]
        if extend:
            out += self._extend_fields(rows, tokens, metadata)
        else:
            out += self._paged_fields(n, per, metadata)
        return tuple(out)

    def _paged_fields(self, n: int, per: str, metadata: Any) -> list[Field]:
        """A decode's and a verify's: the paged indexer's inputs, and the compression each
        row runs (the eager plan is compacted: its entries put back on their rows)."""
        acc, indexer = self.accepts(), metadata.indexer_metadata
        pool = self.runner.token_to_kv_pool
        if metadata.is_cuda_graph:
            table = indexer.graph_compressed_page_table[:n]
            lengths = indexer.graph_compressed_lengths[:n]
            # _compress_decode_cuda_graph: row r writes graph_write_locs[r] from the ring
            # at graph_ring_group_locs[r] (a row that completes no group: slot 0).
            locs = decode.host(indexer.graph_write_locs[:n])
            ring = decode.host(indexer.graph_ring_group_locs[:n])
            writes, members, counts = _per_row(locs, np.arange(n), ring, n)
        else:
            table, lengths = indexer.decode_page_table, indexer.decode_lengths
            # update_key_state_and_compress: entry e writes write_locs[e] from the ring at
            # compress_group_ring_locs[e], for metadata row compress_sequence_ids[e].
            writes, members, counts = _per_row(
                decode.host(indexer.write_locs),
                decode.host(indexer.compress_sequence_ids),
                decode.host(indexer.compress_group_ring_locs),
                n,
            )
        table, lengths = decode.host(table[:n]), decode.host(lengths[:n])
        page = pool.qsa_compressed_page_size
        # get_decode_mqa_inputs hands qsa_mqa_decode max_model_len = the table's width in
        # compressed blocks: a row's context length at most that, its pages those of its
        # length (the scoring masks every block past it).
        reach = table.shape[1] * page
        ring_rows = members.reshape(n, -1)
        return [
            Field(
                "decode_logical_positions",
                per,
                decode.host(indexer.decode_logical_positions[:n]),
                acc["decode_logical_positions"],
            ),
            Field("compressed_lengths", per, lengths, (0, reach)),
            Field(
                "compressed_page_table",
                per,
                table,
                acc["compressed_page_table"],
                row_lengths=-(-lengths // page),
            ),
            Field(
                "compress_write_locs",
                per,
                writes,
                acc["compress_write_locs"],
                row_lengths=counts,
                writes_state=True,
                null_slot=INERT_SLOT,
            ),
            Field(
                "compress_ring_locs",
                per,
                ring_rows,
                acc["compress_ring_locs"],
                row_lengths=counts * COMPRESS_RATIO,
            ),
        ]

    def _extend_fields(self, rows: int, tokens: int, metadata: Any) -> list[Field]:
        """An extend's: the prefill indexer's token-slot rows and positions, and the
        compression of every group the chunk completes (its members the chunk's tokens)."""
        acc, indexer = self.accepts(), metadata.indexer_metadata
        lengths = decode.host(metadata.sequence_lengths[:rows])
        writes, first, counts = _per_row(
            decode.host(indexer.write_locs),
            decode.host(indexer.compress_sequence_ids),
            decode.host(indexer.compress_member_rows),
            rows,
        )
        kv_rows = self.runner.token_to_kv_pool.size + PAGE_SIZE
        prefill = indexer.prefill_sequence_lengths_cpu
        out = [
            Field(
                "compress_write_locs",
                "requests",
                writes,
                acc["compress_write_locs"],
                row_lengths=counts,
                writes_state=True,
                null_slot=INERT_SLOT,
            ),
            # update_key_state_and_compress (is_extend): a group's members are the packed
            # token rows member_rows + 0..ratio - 1, clamped to the chunk's last.
            Field(
                "compress_member_rows",
                "requests",
                first,
                (0, tokens - 1),
                row_lengths=counts,
            ),
            # gather_qsa_compressed_keys reads token_slot_table[r, block * ratio] for each
            # complete block of the row (sequence_lengths // ratio), a KV slot of the pool.
            Field(
                "token_slot_table",
                "requests",
                decode.host(metadata.token_slot_table[:rows]),
                (0, kv_rows - 1),
                row_lengths=lengths,
            ),
        ]
        if indexer.extend_rope_matrix is not None:
            # _fused_compress_store / _rope_from_matrix: a group's RoPE coordinates, the
            # rotary cache's rows.
            rope = decode.host(indexer.extend_rope_matrix[:tokens])
            out.append(Field("extend_rope_matrix", "tokens", rope, acc["positions"]))
        if prefill is not None:
            # prefill_max_row_keys / get_prefill_mqa_inputs: the host copy of the lengths.
            host = np.asarray(prefill[:rows], dtype=np.int64)
            out.append(
                Field("prefill_sequence_lengths_cpu", "requests", host, acc["sequence_lengths"])
            )
        return out

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as the sparse attention reads them: a
        decode's and a verify's selected positions ``p < sequence_lengths[r]`` of its
        last metadata row ``r`` (a verify's last draft) at ``req_to_token[
        row_req_pool_indices[r], p]`` (``_compact_kv``; the step's keys written first by
        ``set_kv_buffer``); an extend's at ``token_slot_table[r, p]``
        (``pack_qsa_prefill_kv`` reads the same row of the table)."""
        lengths = values["sequence_lengths"]
        if "token_slot_table" in values:
            table = values["token_slot_table"]
            return lengths, [table[r, : max(n, 0)] for r, n in enumerate(lengths)]
        table = self.runner.req_to_token_pool.req_to_token
        w = self.config.next_n if self.config.num_spec else 1
        last = np.arange(w - 1, len(lengths), w)
        rows = values["row_req_pool_indices"]
        kv = lengths[last]
        slots = [decode.host(table[int(rows[r]), : max(int(lengths[r]), 0)]) for r in last]
        return kv, slots


class QwenSparseLife(decode.EngineLife):
    """The engine of ``sglang-qwen-sparse``: :class:`QwenSparseEngine`, kept across a
    life's steps."""

    engine_class: type[QwenSparseEngine] = QwenSparseEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> QwenSparseEngine:
        return self.engine_class(config, device, graphs=graphs)


ENGINE = QwenSparseLife()
"""The engine of the implementation ``sglang-qwen-sparse`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-qwen-sparse`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


class _Life(QwenSparseLife):
    def __init__(self, engine: type[QwenSparseEngine]) -> None:
        self.engine_class = engine
        super().__init__()


# -- mutant: a defect of the QSA backend's graph metadata, re-created ---------------------------


class _PageTableOffBuffer(QwenSparseEngine):
    """The replay's compressed page table refreshed in a copy: ``_replay_cuda_graph_metadata``
    handed, for the graph's key, the captured metadata ``msgspec.structs.replace``-d with a
    clone of ``graph_compressed_page_table`` (the frozen struct's way to a new field), which
    ``launch_graph_metadata`` writes and the backend then holds as ``forward_metadata``. The
    graph reads the buffer it captured, which no replay writes again."""

    def make_backend(self) -> Any:
        import msgspec

        backend = super().make_backend()
        replay = backend._replay_cuda_graph_metadata

        def off_buffer(*, bs: int, forward_mode: Any, **kwargs: Any) -> None:
            key = (forward_mode, bs)
            captured = backend._cuda_graph_metadata[key]
            indexer = captured.indexer_metadata
            table = indexer.graph_compressed_page_table.clone()
            copied = msgspec.structs.replace(indexer, graph_compressed_page_table=table)
            backend._cuda_graph_metadata[key] = msgspec.structs.replace(
                captured, indexer_metadata=copied
            )
            try:
                replay(bs=bs, forward_mode=forward_mode, **kwargs)
            finally:
                backend._cuda_graph_metadata[key] = captured

        backend._replay_cuda_graph_metadata = off_buffer
        return backend


PAGE_TABLE_OFF_BUFFER = _Life(_PageTableOffBuffer)


def run_page_table_off_buffer(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-qwen-sparse-page-table-off-buffer``: :class:`_PageTableOffBuffer`."""
    return PAGE_TABLE_OFF_BUFFER(inputs)


run_page_table_off_buffer.new_engine = PAGE_TABLE_OFF_BUFFER.new_engine  # type: ignore[attr-defined]


def _keys_after(inputs: RunnerStepInputs) -> list[int]:
    """The keys each request of a decode or verify step reads (its last query row's)."""
    return [c + q for c, q in zip(inputs.num_computed_tokens, inputs.query_lens, strict=True)]


def reach_replay(trace: Trace) -> bool:
    """A decode or a verify the decode graph replays."""
    return bool(replayed(trace))


def trigger_page_table_off_buffer(trace: Trace) -> bool:
    """A replayed step with a request of a whole compression group at least: its query
    rows score the compressed blocks of the page table's first column on."""
    return any(max(_keys_after(s)) >= COMPRESS_RATIO for s in replayed(trace))


def smallest_page_table_off_buffer() -> Trace:
    """One request of three tokens, then its decode (the fourth key: one compressed block)
    in the graph of one."""
    return arrive_then_step(_smallest_config(num_spec=0, capture=(1,)), 3)


def _smallest_config(num_spec: int, capture: tuple[int, ...], seqs: int = 1) -> EngineConfig:
    return EngineConfig(max_model_len=8, max_num_seqs=seqs, max_num_batched_tokens=8,
                        block_size=PAGE_SIZE, num_spec=num_spec,
                        cudagraph_capture_sizes=capture)  # fmt: skip


# -- findings of SGLang's own, kept apart --------------------------------------------------------


class ProductionContextEngine(QwenSparseEngine):
    """:class:`QwenSparseEngine` with the model's ``context_len`` the engine's
    ``max_model_len``: the table ``context_len + get_req_to_token_extra_context_len()``
    wide, whole pages or not."""

    def context_len(self) -> int:
        return self.config.max_model_len


CONTEXT_LEN_PAGE_TABLE = _Life(ProductionContextEngine)
"""The engine of the context-length finding (module docstring), kept across steps."""


def run_context_len_page_table(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The step on :class:`ProductionContextEngine`: the context-length finding."""
    return CONTEXT_LEN_PAGE_TABLE(inputs)


run_context_len_page_table.new_engine = CONTEXT_LEN_PAGE_TABLE.new_engine  # type: ignore[attr-defined]


def trigger_context_len_page_table(trace: Trace) -> bool:
    """A replayed decode (no drafts: the table's headroom is 4 keys, past which no whole
    page lies) of a request whose compressed blocks reach a page column past
    ``(max_model_len + 4) // 64``, the columns the replay writes."""
    config = trace.config
    if config.num_spec:
        return False
    written = (config.max_model_len + 4) // PAGE_SIZE
    blocks = PAGE_SIZE // COMPRESS_RATIO
    return any(
        cdiv(n // COMPRESS_RATIO, blocks) > written for s in replayed(trace) for n in _keys_after(s)
    )


def smallest_context_len_page_table() -> Trace:
    """A context of 8 tokens (a table of 12 columns: no whole page), one request of three
    tokens, then its decode (one compressed block, in page column 0) in the graph of one."""
    return arrive_then_step(_smallest_config(num_spec=0, capture=(1,)), 3)


class HostReplayEngine(QwenSparseEngine):
    """:class:`QwenSparseEngine` replaying through the host fallback
    (``_update_qsa_cuda_graph_metadata``), as SGLang does where ``seq_lens`` is no CUDA
    tensor (``_can_replay_with_gpu_kernels``: an XPU's, say)."""

    CUDA_REPLAY = False


HOST_REPLAY = _Life(HostReplayEngine)
"""The engine of the host-fallback finding (module docstring), kept across steps."""


def run_host_replay(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The step on :class:`HostReplayEngine`: the host-fallback finding."""
    return HOST_REPLAY(inputs)


run_host_replay.new_engine = HOST_REPLAY.new_engine  # type: ignore[attr-defined]


def trigger_host_replay_padding(trace: Trace) -> bool:
    """A verify the graph replays padded: a graph of more requests than the step's."""
    sizes = decode.graph_batch_sizes(trace.config)
    return trace.config.num_spec > 0 and any(s.num_reqs not in sizes for s in replayed(trace))


def smallest_host_replay_padding() -> Trace:
    """One request of one token, then its verify of ``next_n`` 2 in the graph of two
    requests (one padding request)."""
    return arrive_then_step(_smallest_config(num_spec=1, capture=(4,), seqs=2), 1)
