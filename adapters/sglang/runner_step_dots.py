"""SGLang's decode graph runner step on FlashAttention 3 over a hybrid sliding-window KV
pool, wrapped by Dots' SWA-MLA backend, as the implementation ``sglang-dots-swa-mla`` of
``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step_fa3` (its model runner, request
rows, decode graph runner, graph stand-in and ``sgl_kernel.flash_attn`` stand-in), on the
engine SGLang makes for a Dots3 model without an index top-k (``configs/dots3.py``:
``is_hybrid_swa``; ``wrap_attention_backend``): the model runner's KV pool is
``mem_cache/swa_memory_pool.py:SWAKVPool`` (one sliding-window layer, one full layer)
with its allocator ``mem_cache/allocator/swa.py:SWATokenToKVPoolAllocator``, which owns
the full-to-SWA slot mapping, and its backend is
``layers/attention/dots_hybrid_backend.py:wrap_dots_attention_backend``'s
``DotsSWAMLAAttnBackend`` over ``FlashAttentionBackend``. What runs besides the FA3
step's, unchanged (SGLang 0.5.23):

- ``FlashAttentionBackend``'s sliding-window pool paths (``use_sliding_window_kv_pool``):
  the eager ``swa_page_table`` (``translate_loc_from_full_to_swa``) and
  ``swa_out_cache_loc`` (``_get_swa_write_locations``, the translator's SWA write ids),
  the graph's SWA write buffer refilled at each replay (``_init_full_cg_decode_metadata``);
- ``DotsSWAMLAAttnBackend``: ``__init__``, ``init_forward_metadata``,
  ``init_forward_metadata_out_graph`` (capture, replay), ``init_cuda_graph_state``,
  ``get_cuda_graph_seq_len_fill_value``, ``on_after_cuda_graph_warmup``,
  ``selected_backend``, ``_use_draft_step_out_cache_loc``, and an extend's
  ``_init_prefill_metadata`` (the latent cache each request's SWA layers read: the last
  ``min(q + window, seq_len)`` keys, translated to SWA slots).

Stand-ins, besides the FA3 step's: a pinned host tensor is a plain one on a CPU (the
prefill metadata's ``torch.tensor(..., pin_memory=True)``; CPU-only torch has none).
The full-to-SWA mapping is the allocator's own (``set_full_to_swa_mapping``), each full
page paired with a distinct SWA page (:meth:`SWAPoolEngine.swa_page`), as a real
allocator that frees and reuses pages in another order makes them differ.

Fields, besides ``sglang-fa3``'s: ``swa_page_table`` (a row a request: the SWA pages its
``cache_seqlens`` reach; a window layer's ``flash_attn_with_kvcache`` reads
``k_cache[swa_page_table[b, j]]`` of the SWA pool) held to ``swa.expected_table``, the
allocator's SWA page of each full page the row reads (agreement within the build); and
``swa_out_cache_loc`` (the window layers' KV write) held to ``swa.expected_loc``, the
allocator's SWA slot of each token's ``out_cache_loc``. An extend's Dots prefill
metadata: ``dots.kv_len`` (each request's tail) and ``dots.kv_slots`` (its SWA slots, a
row a request), held to ``dots.expected_slots``: the same tail of the request's keys
read off the build's own ``swa_page_table``.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.reference.batch import Case
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild

SWA_WINDOW = 4
"""The model's sliding window (``model_runner.sliding_window_size``): small, so that a
case's requests pass it."""


def prepare() -> None:
    """Import SGLang's runner, FA3 backend and the Dots wrapper before a judge forks."""
    fa3.prepare()
    from sglang.srt.layers.attention import dots_hybrid_backend  # noqa: F401
    from sglang.srt.mem_cache import swa_memory_pool  # noqa: F401
    from sglang.srt.mem_cache.allocator import swa  # noqa: F401


def declines(case: Case) -> str | None:
    """Why SGLang runs no Dots3 step for ``case``'s config, else None: drafts (Dots' NextN
    draft wraps each draft step's backend; not driven here)."""
    if case.config.num_spec:
        return f"num_spec {case.config.num_spec}: the Dots draft's backends are not driven"
    return None


def _tensor_unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
    """``torch.tensor`` on a CPU: a pinned host list is a plain one."""
    return torch.tensor(*args, **kwargs)


@contextlib.contextmanager
def unpinned() -> Iterator[None]:
    """While the Dots backend builds: its pinned host lists plain ones."""
    from sglang.srt.layers.attention import dots_hybrid_backend

    plain = types.SimpleNamespace(**{**vars(torch), "tensor": _tensor_unpinned})
    with mock.patch.object(dots_hybrid_backend, "torch", plain):
        yield


class SWAPoolEngine(decode.SWAAllocated, fa3.FA3Engine):
    """One SGLang engine on FlashAttention 3 whose KV pool is a hybrid sliding-window one
    (``SWAKVPool``: ``use_sliding_window_kv_pool``), its allocator SGLang's."""

    def make_backend(self) -> Any:
        """``SWAKVPool`` (two MHA pools: layer 0 sliding-window, layer 1 full) and its
        ``SWATokenToKVPoolAllocator`` (which registers the mapping with the pool), the
        translator over them, then the FA3 backend."""
        from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

        runner, page = self.runner, self.config.block_size
        pool = SWAKVPool(
            size=self.pages() * page,
            size_swa=self.pages() * page,
            page_size=page,
            dtype=fa3.KV_CACHE_DTYPE,
            head_num=1,
            head_dim=decode.HEAD_DIM,
            swa_attention_layer_ids=[0],
            full_attention_layer_ids=[1],
            device=str(self.device),
            enable_memory_saver=False,
        )
        self.allocate_swa(pool, fa3.KV_CACHE_DTYPE)
        runner.sliding_window_size = SWA_WINDOW
        backend = super().make_backend()
        assert backend.use_sliding_window_kv_pool
        return backend

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """FA3's fields, and the window layers' table and writes, each held to the
        allocator's mapping of what the full layers read and write."""
        out = super().metadata_fields(rows, tokens, metadata)
        if metadata.swa_page_table is None:
            return out
        page, acc = self.config.block_size, self.accepts()
        lens = decode.host(metadata.cache_seqlens_int32[:rows])
        table = decode.host(metadata.page_table[:rows])
        swa_table = decode.host(metadata.swa_page_table[:rows])
        read = -(-lens // page)
        mapped = np.array([self.swa_page(int(p)) for p in table.ravel()]).reshape(table.shape)
        cols = np.arange(table.shape[1])[None, :] < read[:, None]
        expected = np.where(cols, mapped, 0)
        out += (
            # forward_extend / forward_decode hand a window layer flash_attn_with_kvcache
            # page_table=swa_page_table (the SWA pool's pages, sized like the full pool's).
            Field(
                "swa_page_table",
                "requests",
                np.where(cols, swa_table[:, : table.shape[1]], 0),
                acc["page_table"],
                row_lengths=read,
                agrees_with="swa.expected_table",
            ),
            Field("swa.expected_table", "requests", expected),
        )
        if metadata.swa_out_cache_loc is not None:
            loc = decode.host(metadata.swa_out_cache_loc[:tokens])
            out += (
                # set_kv_buffer of a window layer writes each token's key at its SWA slot.
                Field(
                    "swa_out_cache_loc",
                    "tokens",
                    loc,
                    (0, self.runner.token_to_kv_pool.size + page - 1),
                    agrees_with="swa.expected_loc",
                ),
            )
        return out

    def _fields(
        self, rows: int, tokens: int, inputs_of: dict[str, torch.Tensor], metadata: Any
    ) -> tuple[Field, ...]:
        """The step's fields, and the allocator's SWA slot of each token's write."""
        fields = super()._fields(rows, tokens, inputs_of, metadata)
        if not any(f.name == "swa_out_cache_loc" for f in fields):
            return fields
        loc = next(f for f in fields if f.name == "out_cache_loc").values
        page = self.config.block_size
        swa = np.array([self.swa_page(int(s) // page) * page + int(s) % page for s in loc])
        return (*fields, Field("swa.expected_loc", "tokens", swa.astype(np.int64)))


class DotsEngine(SWAPoolEngine):
    """:class:`SWAPoolEngine` whose backend is Dots': ``wrap_dots_attention_backend``'s
    ``DotsSWAMLAAttnBackend`` over FA3 (a target model without an index top-k)."""

    WHERE = {
        how: where.replace(
            "FlashAttentionBackend.init_forward_metadata",
            "DotsSWAMLAAttnBackend.init_forward_metadata",
        )
        for how, where in fa3.FA3Engine.WHERE.items()
    }

    def make_backend(self) -> Any:
        from sglang.srt.layers.attention import dots_hybrid_backend as dots

        fa3_backend = super().make_backend()
        model = self.runner.model_config
        model.is_draft_model = False
        model.hf_text_config = types.SimpleNamespace(index_topk=None)
        backend = dots.wrap_dots_attention_backend(self.runner, fa3_backend)
        assert type(backend) is dots.DotsSWAMLAAttnBackend, type(backend)
        return backend

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with unpinned():
            return super().eager(inputs, mode, how=how)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The FA3 fields, and an extend's Dots prefill metadata: each request's tail of
        keys and their SWA slots (``get_swa_mla_prefill_latent_cache`` gathers the SWA
        layer's latent cache at ``kv_indices``), held to the same tail of its keys read
        off the build's own ``swa_page_table``."""
        out = super().metadata_fields(rows, tokens, metadata)
        prefill = getattr(self.backend, "_prefill_metadata", None)
        if prefill is None or metadata is not self.backend.forward_metadata:
            return out
        values = {f.name: f.values for f in out}
        cu = decode.host(prefill.cu_seqlens_k)
        tails = np.diff(cu)
        flat = decode.host(prefill.kv_indices)
        width = self.runner.req_to_token_pool.req_to_token.shape[1]
        got = np.zeros((len(tails), width), dtype=np.int64)
        want = np.zeros_like(got)
        page = self.config.block_size
        for r, (lo, hi) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
            got[r, : hi - lo] = flat[lo:hi]
            kv = int(values["cache_seqlens_int32"][r])
            swa = decode.page_slots(values["swa_page_table"][r], kv, page)
            want[r, : hi - lo] = swa[kv - (hi - lo) : kv]
        return (
            *out,
            Field("dots.kv_len", "requests", tails, (1, width)),
            Field(
                "dots.kv_slots",
                "requests",
                got,
                (0, self.runner.token_to_kv_pool.size + page - 1),
                agrees_with="dots.expected_slots",
            ),
            Field("dots.expected_slots", "requests", want),
        )


class DotsLife(fa3.FA3Life):
    """The engine of ``sglang-dots-swa-mla``: :class:`DotsEngine`."""

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> DotsEngine:
        return DotsEngine(config, device, graphs=graphs)


ENGINE = DotsLife()
"""The engine of the implementation ``sglang-dots-swa-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-dots-swa-mla`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
