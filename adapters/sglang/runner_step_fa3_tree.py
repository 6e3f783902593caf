"""SGLang's decode graph runner step on the FlashAttention 3 backend under EAGLE's tree
draft (``--speculative-eagle-topk`` > 1), as the implementation ``sglang-fa3-tree`` of
``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step_fa3` (its engine, driver and
stand-ins), on the engine started with ``--attention-backend fa3
--speculative-algorithm EAGLE --speculative-eagle-topk K --speculative-num-steps S
--speculative-num-draft-tokens N``: ``K`` the config's ``topk`` (2 or more: 1 is the
chain, ``sglang-fa3``'s), ``S`` its ``num_spec`` and ``N`` its ``next_n`` (a verify of
``next_n`` tokens a request). SGLang accepts these (``arg_groups/speculative_hook.py:
_handle_eagle_family``: ``num_draft_tokens`` is left as given for ``topk`` > 1, and
fa3 is among ``_PAGE_TREE_SPEC_BACKENDS`` for any page size; ``eagle_utils.py:
organize_draft_results`` picks ``N - 1`` of ``K + (S - 1) * K * K`` scores, which
``N - 1 = S`` never exceeds).

A verify's draft tokens are a tree: token 0 the root (the request's last verified
token), token ``i`` > 0 the child of ``(i - 1) // K`` (the ``K``-ary tree in breadth
order, each level one draft step). Its ``EagleVerifyInput`` carries the tree's
``custom_mask`` (``FULL_MASK``: for each request, ``N`` rows of its prefix and the
``N`` draft columns, a token seeing its prefix, its ancestors and itself) and the
tokens' ``positions`` (the prefix length and the token's depth), as
``eagle_utils.py:build_tree_kernel_efficient`` hands them to the verify; the
forward's ``positions`` are those.

What runs besides :mod:`~attnfuzz.adapters.sglang.runner_step_fa3`'s (SGLang 0.5.23,
``layers/attention/flashattention_backend.py:FlashAttentionBackend``): the ``topk``
> 1 target verify of ``init_forward_metadata`` (the prefix's metadata and the
expanded metadata of the draft tokens: each token's row of draft slots, sorted by
the tree's mask), of ``init_cuda_graph_state`` (``target_verify_metadata_topk_normal``
and ``_expand``), of the capture (``_init_full_cg_decode_metadata``'s early return,
``_bind_metadata_buffers``) and of the replay (``_apply_cuda_graph_metadata``:
``build_trtllm_mha_page_table``, the mask extraction with the padding rows' indices
zeroed, the sort).

Fields: those of ``sglang-fa3`` (``cache_seqlens_int32``, ``page_table``,
``cu_seqlens_q``, ``cu_seqlens_k``: the prefix's, by request), and the expanded
metadata's, by draft token (``expand.cache_seqlens_int32``, ``expand.page_table``,
slot ids: ``forward_extend`` hands the cache to ``flash_attn_with_kvcache`` as pages
of one slot; ``expand.cu_seqlens_q``, ``expand.cu_seqlens_k`` as offsets). ``kv_len``
and ``kv_slots``: the prefix's keys, then the draft slots any token of the request
reads, in the order the tree's tokens first read them (the draft columns' order).

Mutant: ``sglang-fa3-tree-mask-unsorted`` (the replay's expanded page table in the
draft columns' order, the mask's sort forgotten: a token reads its earlier sibling's
key instead of its own): replay equals eager and padding invariance, on a verify of
three draft tokens or more.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

MIN_TOPK = 2
"""The tree draft: ``topk`` 1 is the chain (``sglang-fa3``), whose verify has no tree."""


def prepare() -> None:
    fa3.prepare()


def declines(case: Case) -> str | None:
    """Why SGLang runs no tree verify for ``case``'s config, else None."""
    config = case.config
    if config.num_spec < 1:
        return "num_spec 0: no EAGLE draft, no target verify (sglang-fa3 runs the decode)"
    if config.topk < MIN_TOPK:
        return (
            f"topk {config.topk}: --speculative-eagle-topk 1 is the chain draft "
            "(sglang-fa3's verify), no tree"
        )
    return None


def tree_parents(num_draft_tokens: int, topk: int) -> list[int]:
    """Each draft token's parent (the root's: -1): the ``topk``-ary tree in breadth order."""
    return [-1] + [(i - 1) // topk for i in range(1, num_draft_tokens)]


def tree_rows(num_draft_tokens: int, topk: int) -> np.ndarray:
    """``[i, j]``: whether draft token ``i`` sees draft token ``j`` (an ancestor, or itself)."""
    parents = tree_parents(num_draft_tokens, topk)
    seen = np.zeros((num_draft_tokens, num_draft_tokens), dtype=bool)
    for i in range(num_draft_tokens):
        j = i
        while j >= 0:
            seen[i, j] = True
            j = parents[j]
    return seen


def tree_depths(num_draft_tokens: int, topk: int) -> list[int]:
    return [int(row.sum()) - 1 for row in tree_rows(num_draft_tokens, topk)]


class _TreeGraph(decode._Graph):
    """The decode graph: a capture records both metadata a tree verify's attention reads
    (the prefix's and the draft tokens' expanded one: views of the persistent buffers)."""

    def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
        backend = self.runner.attn_backend
        self.graphs[shape_key] = decode._engine.StandIn(
            main=backend.forward_metadata, expand=backend.forward_metadata_spec_decode_expand
        )


class TreeEngine(fa3.FA3Engine):
    """The FA3 engine of an EAGLE target whose draft is a tree of ``config.topk`` branches."""

    GRAPH = _TreeGraph

    def __init__(self, config: EngineConfig, device: torch.device, graphs: bool) -> None:
        self.EAGLE_TOPK = config.topk
        super().__init__(config, device, graphs)

    def _verify_input(self, seq_lens: torch.Tensor) -> Any:
        """The tree's ``EagleVerifyInput``: its mask and positions (module docstring)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        N, K = self.config.next_n, self.EAGLE_TOPK
        seen = tree_rows(N, K)
        depth = torch.tensor(tree_depths(N, K), dtype=torch.int64)
        lens = seq_lens.cpu().tolist()
        mask = torch.cat(
            [
                torch.cat(
                    [torch.ones((N, s), dtype=torch.bool), torch.from_numpy(seen)], 1
                ).flatten()
                for s in lens
            ]
        )
        positions = (seq_lens.cpu()[:, None] + depth[None, :]).flatten()
        return EagleVerifyInput(
            draft_token=None,
            custom_mask=mask.to(self.device),
            positions=positions.to(self.device),
            retrieve_index=None,
            retrieve_next_token=None,
            retrieve_next_sibling=None,
            retrieve_cum_len=None,
            spec_steps=self.config.num_spec,
            topk=K,
            draft_token_num=N,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=int(seq_lens.sum()),
            seq_lens_cpu=seq_lens.cpu(),
        )

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> Any:
        self.eager_mode = mode  # the backend's expanded metadata is a verify's alone
        return super().eager(inputs, mode, how)

    def forward_batch(self, inputs: RunnerStepInputs, mode: str) -> Any:
        """The step's ForwardBatch; a verify's positions are its tree's (the draft tokens'
        depths past the prefix, as the verify hands ``spec_info.positions`` on)."""
        fb = super().forward_batch(inputs, mode)
        if mode == "verify":
            fb.positions = fb.spec_info.positions
        return fb

    def persistent_metadata(self, mode: str) -> Any:
        backend = self.backend
        return decode._engine.StandIn(
            main=backend.forward_metadata, expand=backend.forward_metadata_spec_decode_expand
        )

    def _pair(self, metadata: Any) -> tuple[Any, Any]:
        """The prefix's metadata and the expanded one (None outside a tree verify): a
        graph's pair, or the eager build's, the backend's own after a verify (another
        mode leaves the last verify's, or the capture's, there: never read)."""
        if hasattr(metadata, "main"):
            return metadata.main, metadata.expand
        if getattr(self, "eager_mode", None) != "verify":
            return metadata, None
        return metadata, self.backend.forward_metadata_spec_decode_expand

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        main, expand = self._pair(metadata)
        fields = super().metadata_fields(rows, tokens, main)
        if expand is None or expand.cache_seqlens_int32 is None:
            return fields
        N, host = self.config.next_n, decode.host
        lens = host(expand.cache_seqlens_int32[: rows * N])
        table = host(expand.page_table[: rows * N])
        # forward_extend's cascade: flash_attn_with_kvcache over paged_view(k_cache, 1),
        # pages of one slot: every slot of the pool (size + page_size rows); row t reads
        # page_table[t, :cache_seqlens[t]], at most the row's N columns.
        slots = self.runner.token_to_kv_pool.size + self.config.block_size
        return fields + (
            Field("expand.cache_seqlens_int32", "tokens", lens, (0, table.shape[1])),
            Field("expand.page_table", "tokens", table, (0, slots - 1), row_lengths=lens),
            Field(
                "expand.cu_seqlens_q",
                "offsets",
                host(expand.cu_seqlens_q[: rows * N + 1]),
                (0, tokens),
            ),
            # As the prefix's cu_seqlens_k: handed as cu_seqlens_k_new, no new keys.
            Field("expand.cu_seqlens_k", "offsets", host(expand.cu_seqlens_k[: rows * N + 1])),
        )

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The prefix's keys (:meth:`FA3Engine.kv_read`), then the draft slots any of the
        request's tokens reads (the cascade's second pass: ``expand.page_table[t,
        :expand.cache_seqlens[t]]``), in the order its tokens first read them."""
        lens, slots = super().kv_read(values, metadata)
        if "expand.page_table" not in values:
            return lens, slots
        N = self.config.next_n
        table, reach = values["expand.page_table"], values["expand.cache_seqlens_int32"]
        out_lens, out_slots = [], []
        for b in range(len(lens)):
            drafts: list[int] = []
            for t in range(b * N, (b + 1) * N):
                for s in table[t, : max(int(reach[t]), 0)].tolist():
                    if s not in drafts:
                        drafts.append(s)
            out_lens.append(int(lens[b]) + len(drafts))
            out_slots.append(np.concatenate([slots[b], np.asarray(drafts, dtype=np.int64)]))
        return np.asarray(out_lens, dtype=np.int64), out_slots


class TreeLife(fa3.FA3Life):
    """The engine of ``sglang-fa3-tree``: :class:`TreeEngine`, kept across a life's steps."""

    engine_class: type[TreeEngine] = TreeEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> TreeEngine:
        return self.engine_class(config, device, graphs=graphs)

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return decode._server_args(config, attention_backend, config.topk)


ENGINE = TreeLife()
"""The engine of the implementation ``sglang-fa3-tree`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3-tree`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a sliding-window model: the tree's keys merged for the window layers ------------------------

SWA_WINDOW = 4
"""The model's sliding window (``model_runner.sliding_window_size``): any window makes
``FlashAttentionBackend.has_swa``; the merged metadata does not depend on its size."""


def declines_swa(case: Case) -> str | None:
    """:func:`declines`, and pages other than one token: ``_init_sliding_window_attn_spec_
    metadata`` asserts ``page_size == 1`` ("doesn't support topk > 1 speculative decoding
    with page size > 1 sliding window attention")."""
    if case.config.block_size != 1:
        return (
            f"page size {case.config.block_size}: FA3's sliding-window tree verify runs on "
            "pages of one token only (flashattention_backend.py: "
            "_init_sliding_window_attn_spec_metadata asserts page_size == 1)"
        )
    return declines(case)


class SWATreeEngine(TreeEngine):
    """:class:`TreeEngine` of a model with a sliding window and no sliding-window pool
    (``has_swa`` without ``use_sliding_window_kv_pool``): a tree verify also builds
    ``swa_spec_metadata``, the keys of each draft token for the window layers, the
    prefix's and the tree's merged (``_init_sliding_window_attn_spec_metadata``,
    ``prepare_swa_spec_page_table_triton``), eager and, from the graph's
    ``target_verify_metadata_topk_swa`` buffers, at capture and replay."""

    def make_backend(self) -> Any:
        self.runner.sliding_window_size = SWA_WINDOW
        return super().make_backend()

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        fields = super().metadata_fields(rows, tokens, metadata)
        main, expand = self._pair(metadata)
        swa = getattr(main, "swa_spec_metadata", None)
        if expand is None or swa is None:
            return fields
        N, host = self.config.next_n, decode.host
        lens = host(swa.cache_seqlens_int32[: rows * N])
        table = host(swa.page_table[: rows * N])
        table[np.arange(table.shape[1])[None, :] >= lens[:, None]] = 0
        # forward_extend hands a window layer flash_attn_with_kvcache(page_table=swa's,
        # cache_seqlens=swa's, cu_seqlens_q one a token): token t reads the keys
        # swa.page_table[t, :cache_seqlens[t]], pages of one slot. They must be the keys
        # the cascade of the other layers gives the token: its request's prefix
        # (page_table[b, :cache_seqlens[b]]), then its expanded row.
        prefix_lens = host(main.cache_seqlens_int32[:rows])
        prefix = host(main.page_table[:rows])
        ex_lens = host(expand.cache_seqlens_int32[: rows * N])
        ex_table = host(expand.page_table[: rows * N])
        cascade = np.zeros_like(table)
        cascade_lens = np.zeros_like(lens)
        for t in range(rows * N):
            b = t // N
            keys = np.concatenate([prefix[b, : prefix_lens[b]], ex_table[t, : ex_lens[t]]])
            cascade_lens[t] = len(keys)
            cascade[t, : min(len(keys), table.shape[1])] = keys[: table.shape[1]]
        slots = self.runner.token_to_kv_pool.size + self.config.block_size
        return fields + (
            Field(
                "swa.cache_seqlens_int32", "tokens", lens, (0, table.shape[1]),
                agrees_with="swa.cascade_len",
            ),
            Field(
                "swa.page_table", "tokens", table, (0, slots - 1), row_lengths=lens,
                agrees_with="swa.cascade_slots",
            ),
            Field("swa.cu_seqlens_k", "offsets", host(swa.cu_seqlens_k[: rows * N + 1])),
            Field("swa.cascade_len", "tokens", cascade_lens),
            Field("swa.cascade_slots", "tokens", cascade),
        )  # fmt: skip


class SWATreeLife(TreeLife):
    """The engine of ``sglang-fa3-tree-swa``."""

    engine_class = SWATreeEngine


SWA_ENGINE = SWATreeLife()


def run_swa(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3-tree-swa`` of ``runner-step``: the step on
    :data:`SWA_ENGINE`, kept across calls; ``run_swa.new_engine()`` drops it."""
    return SWA_ENGINE(inputs)


run_swa.new_engine = SWA_ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant: the replay's expanded page table unsorted ------------------------------------


class _MaskUnsorted(TreeEngine):
    """The replay's expanded page table left in the draft columns' order: the sort by the
    tree's mask (``_apply_cuda_graph_metadata``: ``keys``, ``sort_order``) forgotten, so
    row ``t`` holds draft columns ``0 .. cache_seqlens[t] - 1`` whatever its mask."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        apply = backend._apply_cuda_graph_metadata

        def unsorted(*args: Any, **kwargs: Any) -> None:
            apply(*args, **kwargs)
            expand = backend.forward_metadata_spec_decode_expand
            if not kwargs["forward_mode"].is_target_verify() or expand is None:
                return
            N, bs = backend.speculative_num_draft_tokens, kwargs["bs"]
            rows, seq_lens = kwargs["req_pool_indices"][:bs], kwargs["seq_lens"][:bs]
            cols = torch.arange(N)[None, :] + seq_lens[:, None]
            drafts = backend.req_to_token[rows, :].gather(1, cols).repeat_interleave(N, 0)
            expand.page_table.copy_(drafts)

        backend._apply_cuda_graph_metadata = unsorted
        return backend


class _MutantLife(TreeLife):
    engine_class = _MaskUnsorted


MASK_UNSORTED = _MutantLife()


def run_mask_unsorted(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-fa3-tree-mask-unsorted``: :class:`_MaskUnsorted`."""
    return MASK_UNSORTED(inputs)


run_mask_unsorted.new_engine = MASK_UNSORTED.new_engine  # type: ignore[attr-defined]


def trigger_mask_unsorted(trace: Trace | Case) -> bool:
    """A replayed tree verify with a token whose mask skips a draft column before it: a
    second child of the root (``next_n`` 3 or more, ``topk`` 2 or more)."""
    config = trace.config
    return config.topk >= MIN_TOPK and config.next_n >= 3 and decode.reach_verify_replay(trace)


def reach_tree_verify_replay(trace: Trace | Case) -> bool:
    return trace.config.topk >= MIN_TOPK and decode.reach_verify_replay(trace)


def smallest_mask_unsorted() -> Trace:
    """One request of one token, then its verify of a tree of three (the root and its two
    children) in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8, block_size=1,
                          num_spec=2, topk=2, cudagraph_capture_sizes=(3,))  # fmt: skip
    return arrive_then_step(config, 1)
