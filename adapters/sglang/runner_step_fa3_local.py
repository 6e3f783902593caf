"""SGLang's decode graph runner step on the FlashAttention 3 backend of a model with chunked
(local) attention layers, as the implementation ``sglang-fa3-local`` of ``runner-step``.

Llama 4's iRoPE layers attend within chunks of ``attention_chunk_size`` tokens: a token
at position ``p`` sees the keys of positions ``C * (p // C)`` to ``p``. On FA3
(``layers/attention/local_attention.py``) SGLang splits each request into "virtual"
requests, one a chunk its queries touch (``make_local_attention_virtual_batches``), and
hands the kernel their ``local_query_start_loc``, ``local_seqused_k`` and
``local_block_table``. The step is :mod:`~attnfuzz.adapters.sglang.runner_step_fa3`'s
(its engine, stand-ins, graph), the model ``is_local_attention_model`` with a chunk of
:data:`CHUNK` tokens (or a page); what runs besides (SGLang 0.5.23):
``LocalAttentionMetadataBuilder.build`` (eager: a decode, an extend),
``alloc_cuda_graph_buffers`` and ``build_for_capture`` (each capture),
``update_for_replay`` (each replay, from ``_apply_cuda_graph_metadata``).

Fields, besides ``sglang-fa3``'s, by query token (what ``forward_decode`` /
``forward_extend`` hand ``flash_attn_with_kvcache`` for a local layer, causal: the
``i``-th query of a virtual request of ``q`` queries and ``k`` keys reads its first
``k - q + i + 1`` keys, through its row of ``local_block_table``): ``local.kv_len`` and
``local.kv_slots``, each held by *agreement within a build* to the keys of the token's
chunk among the keys the full layers read for its request (``kv_slots``, by the token's
``positions``): ``local.chunk_len``, ``local.chunk_slots``. Speculative configs are
declined: a target verify builds no local metadata (its ``TODO``), a draft extend none
that this step reaches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

CHUNK = 4
"""``attention_chunk_size``, at least: small, so that the cases' requests span several
chunks; a page's tokens where pages are larger (``make_local_attention_virtual_batches``
asserts that the chunk is a multiple of the page)."""


def chunk_of(block_size: int) -> int:
    """The model's chunk for pages of ``block_size`` tokens (:data:`CHUNK`)."""
    return block_size * max(1, CHUNK // block_size)


def prepare() -> None:
    """Import SGLang's runner and FA3 backend before a judge forks its child."""
    fa3.prepare()


def declines(case: Case) -> str | None:
    """Why this engine runs no step of ``case``'s config, else None."""
    if case.config.num_spec:
        return (
            "a speculative config: FA3 builds no local-attention metadata for a target "
            "verify (flashattention_backend.py: init_forward_metadata's TODO)"
        )
    return None


class LocalEngine(fa3.FA3Engine):
    """The FA3 engine of a model whose layers include chunked (local) attention."""

    LOCAL_ATTENTION = True

    def make_backend(self) -> Any:
        self.runner.attention_chunk_size = chunk_of(self.config.block_size)  # Llama 4's: 8192
        return super().make_backend()

    def kv_fields(self, fields: tuple[Field, ...], metadata: Any) -> tuple[Field, ...]:
        out = super().kv_fields(fields, metadata)
        local = getattr(metadata, "local_attn_metadata", None)
        if local is None:
            return out
        values = {f.name: f.values for f in (*fields, *out)}
        positions, full, full_lens = values["positions"], values["kv_slots"], values["kv_len"]
        qo = values["cu_seqlens_q"]
        host = decode.host
        starts = host(local.local_query_start_loc)
        seen = host(local.local_seqused_k)
        table = host(local.local_block_table)
        page, tokens = self.config.block_size, len(positions)
        size = chunk_of(page)
        width = max(table.shape[1] * page, size)
        lens, slots = np.zeros(tokens, np.int64), np.zeros((tokens, width), np.int64)
        chunk_lens, chunk = np.zeros(tokens, np.int64), np.zeros((tokens, width), np.int64)
        for t in range(tokens):
            v = int(np.searchsorted(starts, t, side="right")) - 1
            if 0 <= v < len(seen) and starts[v] <= t < starts[v + 1]:
                q, i = int(starts[v + 1] - starts[v]), int(t - starts[v])
                n = max(int(seen[v]) - q + i + 1, 0)
                row = decode.page_slots(table[v], n, page)
                lens[t], slots[t, : len(row)] = n, row
            b = int(np.searchsorted(qo, t, side="right")) - 1
            if 0 <= b < len(full_lens):
                p = int(positions[t])
                keys = full[b, size * (p // size) : min(p + 1, int(full_lens[b]))]
                chunk_lens[t], chunk[t, : len(keys)] = len(keys), keys[:width]
        reach = table.shape[1] * page
        return out + (
            Field("local.kv_len", "tokens", lens, (0, reach), agrees_with="local.chunk_len"),
            Field("local.kv_slots", "tokens", slots, row_lengths=lens,
                  agrees_with="local.chunk_slots"),
            Field("local.chunk_len", "tokens", chunk_lens),
            Field("local.chunk_slots", "tokens", chunk, row_lengths=chunk_lens),
        )  # fmt: skip


class LocalLife(fa3.FA3Life):
    """The engine of ``sglang-fa3-local``: :class:`LocalEngine`, across a life's steps."""

    def make(self, config: Any, device: torch.device, graphs: bool) -> LocalEngine:
        return LocalEngine(config, device, graphs=graphs)


ENGINE = LocalLife()
"""The engine of the implementation ``sglang-fa3-local`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3-local`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
