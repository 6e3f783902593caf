"""SGLang's decode graph runner step on the AITER backend with
``SGLANG_USE_AITER_UNIFIED_ATTN=1``, kept apart as the finding
``sglang-aiter-unified-page-size-one``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step_aiter` (``sglang-aiter``: the
same driver, model runner, request rows, decode graph runner, graph stand-in and
``aiter`` stand-in, MHA on gfx942), its ``AiterAttnBackend`` built with
``SGLANG_USE_AITER_UNIFIED_ATTN=1`` in ``os.environ`` (``AiterAttnBackend.__init__``
reads it once, through ``get_bool_env_var``; nothing reads it at metadata time): its
``use_triton_unified_attention`` and ``decode_uses_page_table`` are True, the model has
no sliding window. What runs besides ``sglang-aiter``'s, unchanged (SGLang 0.5.23):

- ``layers/attention/aiter_backend.py``: ``AiterAttnBackend.init_forward_metadata``'s
  page-table decode (a fresh ``(bs, max_kv_len)`` table by the Triton kernel
  ``kernels/ops/attention/kv_indices.py:create_flashmla_kv_indices_triton``, under
  Triton's interpreter, cut to pages by ``_transform_table_1_to_real`` at a page size
  above 1; ``qo_indptr_unified_decode``); ``init_cuda_graph_state`` (its
  ``cuda_graph_page_table``); ``_apply_cuda_graph_metadata``'s page-table decode
  branch, at capture and at every replay;
- ``AiterAttnBackend.forward_extend`` for every extend (the unified path builds its
  page table in the forward: ``_forward_extend_unified``,
  ``_build_extend_unified_page_table``, the Triton kernel
  ``kernels/ops/attention/aiter_unified_page_table.py:
  scatter_req_to_token_to_page_table_kernel``, interpreted), its kernel stood in.

Stand-ins, besides ``sglang-aiter``'s: aiter's ``unified_attention``
(``aiter/ops/triton/attention/unified_attention.py``, a GPU kernel), which records what
it is handed while an extend's forward runs (:func:`_recording`), and the layer the
forward is handed (:data:`LAYER`: the engine's heads and head size, no sliding window,
no soft cap) with a KV cache of zeros (never read). No other forward runs; the KV
cache and queries are bf16.

Builds: ``sglang-aiter``'s (``capture``, ``eager``, ``padded``, ``replay``, ``fresh``).

Fields: the runner's ``seq_lens``, ``req_pool_indices``, ``out_cache_loc`` and
``positions``, and what ``unified_attention`` is handed: a decode's (``forward_decode``:
``block_table=forward_metadata.kv_indices``, ``cu_seqlens_q=forward_metadata.qo_indptr``,
``max_seqlen_q=forward_metadata.max_q_len``, ``seqused_k=forward_batch.seq_lens``; the
graph's, those its capture's ``forward_metadata`` held) and an extend's
(``_forward_extend_unified``: its own page table and ``cu_seqlens_q``): ``kv_indices``
the page table (2-D, each row read up to ``cdiv(seq_lens[i], page_size)`` entries),
``qo_indptr`` as offsets, ``max_q_len``. Each with the range its consumer accepts
(:meth:`UnifiedEngine.accepts`, :meth:`UnifiedEngine.metadata_fields`). And ``kv_len``
and ``kv_slots``, what every backend states alike, derived from them as the kernel reads
them (:meth:`UnifiedEngine.kv_read`).

Declines: every config of drafts (``num_spec`` > 0): the target verify goes through
``_use_unified_verify`` (``_build_verify_unified_metadata``, its page table of the
prefix and the drafts, ``seqused_k`` the prefix and the drafts), whose metadata this
implementation does not judge (:func:`declines_config`).

The finding (SGLang's own, kept apart): ``aiter_backend.py:
AiterAttnBackend._apply_cuda_graph_metadata``, the decode branch (``spec_info`` None,
``decode_uses_page_table``), copies the request-to-token rows into
``self.cuda_graph_page_table`` only for a sliding-window pool or under ``elif
self.page_size > 1:``: at page size 1 the graph's page table is never written, from
capture on. Every decode the graph replays hands ``unified_attention`` the zeros of
``init_cuda_graph_state`` (slot 0 for every key of every request), while the eager
decode (``init_forward_metadata``) hands it each request's slots. Observed here: replay
equals eager (and padding invariance) fail on ``kv_indices`` and ``kv_slots``, and where
the graph pads, padding writes no real KV on ``out_cache_loc`` (a padding token writes
slot 0, which the unwritten table has every real request read); at page sizes above 1
none. The effect on the attention output is read from the source, not run:
``unified_attention`` reads key ``j`` of request ``i`` at page
``block_table[i, j // page_size]``, so each replayed decode attends ``seq_len`` copies
of slot 0's key and value.

Reachability (read from SGLang's source, not run): the variable is meant for
non-sliding-window models too (``forward_decode``'s comment: "Non-SWA models (e.g.
Qwen3-VL) enabled via SGLANG_USE_AITER_UNIFIED_ATTN"); on HIP the default page size is
1 (``arg_groups/overrides.py:_page_size_default``), and the one override that reads the
variable raises it to 16 for Qwen3-VL alone, where ``--page-size`` is not given
(``arg_groups/model_overrides/qwen3_vl.py:_qwen3vl_overrides``); nothing rejects page
size 1 with it. So another non-sliding-window MHA model served on AITER with the
variable set and CUDA graphs not disabled, or Qwen3-VL with ``--page-size 1``,
replays the unwritten table. Upstream: sgl-project/sglang pull request #40410, "[AMD]
Fix AITER unified decode page table for page size one", open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_aiter as base
from attnfuzz.adapters.sglang.runner_step import arrive_then_step, page_slots
from attnfuzz.adapters.sglang.runner_step_aiter import DTYPE
from attnfuzz.adapters.sglang.runner_step_flashinfer import _patched
from attnfuzz.adapters.sglang.triton_backend import HEAD_DIM
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

ENV = {"SGLANG_USE_AITER_UNIFIED_ATTN": "1"}
"""What the backend is built under (``AiterAttnBackend.__init__``: ``get_bool_env_var``)."""

LAYER = _engine.StandIn(
    layer_id=0,
    tp_q_head_num=2,
    tp_k_head_num=1,
    tp_v_head_num=1,
    qk_head_dim=HEAD_DIM,
    v_head_dim=HEAD_DIM,
    head_dim=HEAD_DIM,
    scaling=HEAD_DIM**-0.5,
    logit_cap=0.0,
    sliding_window_size=None,
    is_cross_attention=False,
    k_scale=None,
    v_scale=None,
)
"""The ``RadixAttention`` an extend's forward is handed: the engine's model (2 query heads,
1 KV head), no sliding window, no soft cap."""


def prepare() -> None:
    base.prepare()


def declines_config(config: EngineConfig) -> str | None:
    """Why this implementation does not judge ``config``, else None."""
    if config.num_spec:
        return (
            "drafts: the target verify runs AiterAttnBackend's unified verify "
            "(_use_unified_verify: _build_verify_unified_metadata), whose metadata "
            "sglang-aiter-unified-page-size-one does not judge"
        )
    return None


def declines(case: Case) -> str | None:
    """:func:`declines_config` of ``case``'s config."""
    return declines_config(case.config)


@contextlib.contextmanager
def _recording(handed: list[dict[str, Any]]) -> Iterator[None]:
    """aiter's ``unified_attention`` as ``aiter_backend`` binds it, recording the keywords
    each call is handed (the forward's output is never read)."""
    from sglang.srt.layers.attention import aiter_backend

    def unified_attention(**kwargs: Any) -> None:
        handed.append(kwargs)

    with mock.patch.object(aiter_backend, "unified_attention", unified_attention):
        yield


class UnifiedEngine(base.AiterEngine):
    """One SGLang engine on AITER (MHA) with ``SGLANG_USE_AITER_UNIFIED_ATTN=1``."""

    WHERE = {
        **base.AiterEngine.WHERE,
        "eager": "aiter_backend.py:AiterAttnBackend.init_forward_metadata (a decode's "
        "page table; an extend's: forward_extend, _forward_extend_unified)",
        "fresh": "aiter_backend.py:AiterAttnBackend.init_forward_metadata (a new engine; "
        "an extend's: forward_extend, _forward_extend_unified)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "AiterAttnBackend._apply_cuda_graph_metadata's forward_metadata: "
        "cuda_graph_page_table)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: AiterAttnBackend._apply_cuda_graph_metadata's at capture, its "
        "views of cuda_graph_page_table and qo_indptr_unified_decode)",
    }

    def make_backend(self) -> Any:
        """``sglang-aiter``'s backend, built with ``SGLANG_USE_AITER_UNIFIED_ATTN=1``."""
        with mock.patch.dict(os.environ, ENV):
            backend = super().make_backend()
        assert backend.decode_uses_page_table and not backend.use_sliding_window_kv_pool
        return backend

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        """A decode's: ``sglang-aiter``'s (``init_forward_metadata``, its page table). An
        extend's: ``init_forward_metadata``, then ``forward_extend`` of one layer, whose
        unified path builds what ``unified_attention`` is handed (recorded)."""
        if mode != "extend":
            return super().eager(inputs, mode, how=how)
        with self.stepping():
            fb = self.forward_batch(inputs, mode)
            self.backend.init_forward_metadata(fb)
            handed = self._extend_handed(fb)
        inputs_of = {
            "seq_lens": fb.seq_lens,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        if how != "fresh":  # a new engine's rows are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        fields = self._fields(R, T, inputs_of, handed)
        return StepBuild(how, R, T, fields, where=self.WHERE[how])

    def _extend_handed(self, fb: Any) -> Any:
        """What ``forward_extend`` (the unified path: ``_forward_extend_unified``) hands
        ``unified_attention`` for one layer of ``fb``, its KV write left out."""
        rows = self.runner.token_to_kv_pool.size + self.config.block_size
        cache = torch.zeros((rows, 1, HEAD_DIM), dtype=DTYPE, device=self.device)
        pool = _engine.StandIn(get_kv_buffer=lambda layer_id: (cache, cache))
        q = torch.zeros((fb.input_ids.shape[0], 2 * HEAD_DIM), dtype=DTYPE, device=self.device)
        kv = torch.zeros((fb.input_ids.shape[0], HEAD_DIM), dtype=DTYPE, device=self.device)
        handed: list[dict[str, Any]] = []
        with _recording(handed), _patched(self.backend, "token_to_kv_pool", pool):
            self.backend.forward_extend(q, kv, kv, LAYER, fb, save_kv_cache=False)
        (call,) = handed
        return _engine.StandIn(
            kv_indices=call["block_table"],
            qo_indptr=call["cu_seqlens_q"],
            max_q_len=call["max_seqlen_q"],
        )

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        (:meth:`runner_step._Engine.accepts`: ``unified_attention`` reads ``seqused_k`` keys
        a request, from the first; no partitions bind it), and the page table's."""
        acc = decode._Engine.accepts(self)
        kv_rows = self.runner.token_to_kv_pool.size + self.config.block_size
        # unified_attention reads k.view(-1, page_size, H, D)[block_table[i, j // page_size]]
        # (forward_decode, _forward_extend_unified): a page of the layer's KV buffer, whose
        # size + page_size rows are (size + page_size) / page_size pages.
        acc["kv_pages"] = (0, kv_rows // self.config.block_size - 1)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What ``unified_attention`` is handed (``metadata``: a decode's
        ``ForwardMetadata``, an extend's recorded call) for ``rows`` requests and
        ``tokens`` tokens (padding included), copied now. The kernel family's read
        (``kernels/ops/attention/unified_attention_3d_mtp.py:
        unified_attention_3d_mtp_kernel``, SGLang's own of aiter's ``unified_attention``,
        which is not installed here): request ``i``'s query rows ``q[cu_seqlens_q[i] :
        cu_seqlens_q[i + 1]]`` (``find_seq_idx``), its key ``j < seqused_k[i]`` at
        ``block_table[i, j // BLOCK_SIZE]``, offset ``j % BLOCK_SIZE``."""
        acc = self.accepts()
        table = decode.host(metadata.kv_indices[:rows])
        qo = decode.host(metadata.qo_indptr[: rows + 1])
        return (
            # The row lengths read (cdiv(seq_lens[i], page_size)) are set in _fields.
            Field("kv_indices", "requests", table, acc["kv_pages"]),
            Field("qo_indptr", "offsets", qo, (0, tokens)),
            # max_seqlen_q sizes the kernel's query blocks of a request: at least one
            # query row, at most the forward's tokens.
            Field("max_q_len", "requests", np.full(rows, int(metadata.max_q_len)), (1, tokens)),
        )

    def _fields(
        self, rows: int, tokens: int, inputs_of: dict[str, torch.Tensor], metadata: Any
    ) -> tuple[Field, ...]:
        """:meth:`runner_step._Engine._fields`, each page-table row read up to the
        request's ``cdiv(seq_lens[i], page_size)`` pages (``seqused_k`` is the runner's
        ``seq_lens``: ``forward_decode``, ``_forward_extend_unified``)."""
        fields = super()._fields(rows, tokens, inputs_of, metadata)
        seq_lens = next(f.values for f in fields if f.name == "seq_lens")
        pages = -(-np.maximum(seq_lens, 0) // self.config.block_size)
        return tuple(
            dataclasses.replace(f, row_lengths=pages) if f.name == "kv_indices" else f
            for f in fields
        )

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their KV slots, as ``unified_attention`` reads them:
        ``seqused_k[i]`` keys (the runner's ``seq_lens``: a decode's and an extend's keys
        all from the cache, ``set_kv_buffer`` having written the step's first), key ``j``
        at slot ``block_table[i, j // page_size] * page_size + j % page_size``."""
        lengths = values["seq_lens"]
        page = self.config.block_size
        table = values["kv_indices"]
        return lengths, [page_slots(table[r], n, page) for r, n in enumerate(lengths)]


class UnifiedLife(base.AiterLife):
    """The engine of ``sglang-aiter-unified-page-size-one``: :class:`UnifiedEngine`."""

    engine_class = UnifiedEngine

    def prepare(self) -> None:
        prepare()


ENGINE = UnifiedLife()
"""The engine of ``sglang-aiter-unified-page-size-one``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``sglang-aiter-unified-page-size-one``: the step on :data:`ENGINE`, kept across
    calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


def reach_decode_replay(trace: Trace) -> bool:
    """A decode (no drafts) the decode graph replays: ``_apply_cuda_graph_metadata``'s
    page-table decode branch."""
    return base.reach_decode_replay(trace)


def trigger_page_size_one(trace: Trace) -> bool:
    """The finding's condition: a decode the graph replays at page size 1 (every real
    request reads a slot of a page the scheduler handed it, none the zeros' slot 0)."""
    return trace.config.block_size == 1 and reach_decode_replay(trace)


def smallest_page_size_one() -> Trace:
    """One request of one token, then its decode in the graph of one, pages of 1."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(1,))  # fmt: skip
    return arrive_then_step(config, 1)
