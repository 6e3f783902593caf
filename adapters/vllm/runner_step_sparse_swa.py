"""vLLM's model runner V1 step of DeepSeek-V4's sliding-window cache, as the
implementation ``vllm-v1-sparse-swa`` of ``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer (and the MTP draft layer)
a ``DeepseekV4SWACache`` (``vllm/v1/attention/backends/mla/sparse_swa.py``), the
sliding-window KV cache each DeepSeek-V4 attention layer keeps beside its sparse MLA,
made by vLLM's own constructor as ``DeepseekV4Attention.__init__`` makes it (its
KV-cache spec its own ``get_kv_cache_spec``: a ``SlidingWindowMLASpec`` of one
512-wide head in the ``fp8_ds_mla`` layout, as the FlashMLA model's cache is). Its
backend is the cache's default, ``DeepseekSparseSWABackend`` (``DEEPSEEK_SPARSE_SWA``),
whose ``DeepseekSparseSWAMetadataBuilder`` (``AttentionCGSupport.UNIFORM_BATCH``: a
FULL mode becomes FULL_AND_PIECEWISE) builds every step: eager, padded for the graph,
replayed, afresh, the drafter's sub-steps (the V1 ``EagleProposer``'s own builder of
the draft layer), and the capture runs. The FlashMLA and FlashInfer models' SWA
backends (``models/deepseek_v4/nvidia/``) subclass this builder only to declare
``AttentionCGSupport.ALWAYS``. What it builds:

- the decode/prefill split (``split_decodes_and_prefills`` at ``1 + num_spec``,
  ``max_decode_query_len``; the builder asks for no reordering, so a decode after a
  prefill is a prefill);
- ``token_to_req_indices`` (``compute_token_to_req_indices``) and ``is_valid_token``
  (``slot_mapping >= 0``) in its own buffers;
- each decode token's window, ``decode_swa_indices`` (KV slots of the positions
  ``max(pos - window + 1, replay_start, 0)`` to ``pos``, -1 past them) and
  ``decode_swa_lens``, and the same of each prefill token in paged coordinates
  (``prefill_swa_indices``, ``prefill_swa_lens``), by the Triton kernel
  ``_compute_swa_indices_and_lens_kernel`` (``ComputeSWAIndicesAndLensKernel``), a
  padding token's row cleared to -1, its length 0;
- the prefills' gather lengths (``ComputePrefillMetadataKernel``: ``query_len +
  min(prefix, window - 1)``), their seq_lens and host query lengths, from which
  ``get_prefill_chunk_plan`` cuts the prefills into workspace chunks;
- one empty FlashMLA tile-scheduler plan a layer type (here SWA-only: the tiny model
  has no compress ratios) when the step has decode tokens (``build_tile_scheduler``).

Both Triton kernels run under the Triton interpreter (attnfuzz sets
``TRITON_INTERPRET``). The model config's ``sliding_window`` is 64 on the engine's
copy (DeepSeek-V4's is 128): a multiple of 64 as the decode kernel's index width is
(``get_dspark_swa_index_width``'s alignment), small enough that the default scale's
sequences run past it.

Stood in, as a CUDA build on an sm90 GPU has them, where ``sparse_swa.py`` reads them:
``current_platform`` (neither ROCm, XPU nor CPU, not of the sm120 family:
``DeepseekSparseSWABackend.get_builder_cls`` picks this builder, not the CPU
platform's, and ``build_tile_scheduler`` asks for plans) and FlashMLA's
``get_mla_metadata`` (not built here; its contract an empty ``FlashMLASchedMeta``,
:func:`.runner_step_flashmla.get_mla_metadata`).

Fields: ``vllm-v1``'s forward-context slot mapping and positions, and ``swa.*``, with
the range their consumers accept (``DeepseekV4FlashMLAAttention.forward_mqa``,
``_forward_decode``, ``_forward_prefill`` in ``vllm/models/deepseek_v4/nvidia/
flashmla.py``; the cache insert of ``DeepseekV4Attention`` in ``models/deepseek_v4/
attention.py``): by token, each token's window length and KV slots (decode rows then
prefill rows, as ``forward_mqa`` hands the first ``num_decode_tokens`` query rows to
the decode kernel), its request and validity, the metadata's slot mapping; by
request, seq_lens, the block table, ``replay_start``; the query offsets; of the
prefills, their seq_lens, gather lengths and the room each has in its chunk's
workspace; of the decodes, whether the step's tile-scheduler plan is fresh. And
``kv_len``/``kv_slots``: the keys each request's tokens read (:meth:`_SWAEngine.kv_read`).
Each token's request must be the one the query offsets place it in (``swa.token_request``,
*agreement within a build*), on the target's forward and the drafter's first pass: vLLM
0.33.0's V1 drafter hands its later sub-steps its first pass's map, a difference of its
own kept apart as ``vllm-v1-sparse-swa-draft-requests-stale``
(``_Engine.stale_drafts_judged`` of :mod:`.runner_step_v1`).

Not driven: the vision variant's in-image visibility (``_build_image_visibility``: a
``DeepseekV4Config`` with vision layers and a step's multimodal spans), the DSpark
drafter's non-causal windows (``causal=False``), ``update_draft_decode_metadata``
(model runner V2's speculator calls it) and a group's SWA bounded replay
(``replay_start``, which the V1 runner never passes: zeros).

Declined: ``vllm-v1``'s cases, and block sizes the backend has no kernel block size
for (``DeepseekSparseSWABackend.get_supported_kernel_block_sizes``: multiples of 32);
the implementation draws pages of 32.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_drafter as drafting
from attnfuzz.adapters.vllm import runner_step_flashmla as flashmla
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import _LAYER, num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

_SWA = "vllm/v1/attention/backends/mla/sparse_swa.py"
WINDOW = 64
"""The model config's ``sliding_window`` on the engine's copy (module docstring)."""
HEAD_DIM = 512  # DeepseekSparseSWABackend.get_supported_head_sizes
KERNEL_BLOCK = 32  # DeepseekSparseSWABackend.get_supported_kernel_block_sizes: MultipleOf(32)
BLOCK_SIZE = 32
"""The pages the implementation draws (``fixes``): the smallest the backend takes."""


def prepare() -> None:
    """Import vLLM's V1 runner and the sparse SWA backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

    return DeepseekSparseSWABackend


class _Sm90:
    """``current_platform`` as ``sparse_swa.py`` asks it on an sm90 CUDA build: not
    ROCm, XPU nor CPU, not of the sm120 family; anything else the platform's."""

    def __init__(self, platform: Any) -> None:
        self._platform = platform

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_device_capability_family(self, family: int, device_id: int = 0) -> bool:
        return family == 90

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


@contextlib.contextmanager
def sm90() -> Iterator[None]:
    """``sparse_swa.py`` as it runs on an sm90 GPU (module docstring)."""
    from vllm.v1.attention.backends.mla import sparse_swa as module

    with mock.patch.multiple(
        module,
        current_platform=_Sm90(module.current_platform),
        get_mla_metadata=flashmla.get_mla_metadata,
    ):
        yield


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: ``vllm-v1``'s cases, and block sizes the
    backend has no kernel block size for."""
    return declines_config(case.config) or v1.declines(case)


def declines_config(config: EngineConfig) -> str | None:
    """:func:`declines` of an engine of ``config`` alone (its step not read)."""
    if config.runner == "v1" and not config.varlen_decode and config.block_size % KERNEL_BLOCK:
        return (
            f"block_size {config.block_size}: the sparse SWA backend's pages are multiples "
            f"of {KERNEL_BLOCK} ({_SWA} DeepseekSparseSWABackend.get_supported_kernel_block_sizes)"
        )
    return v1.declines_config(config)


def _swa_layer(vllm_config: Any, prefix: str, block_size: int) -> Any:
    """The SWA cache layer as ``DeepseekV4Attention.__init__`` makes it (registering
    itself in the static forward context under ``prefix``), its dtype the
    ``fp8_ds_mla`` layout's (``_resolve_dsv4_kv_cache_dtype``), its pages the engine's."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    vllm_config.compilation_config.static_forward_context.pop(prefix, None)
    return DeepseekV4SWACache(
        head_dim=HEAD_DIM, window_size=WINDOW, dtype=torch.uint8, prefix=prefix,
        cache_config=vllm_config.cache_config, block_size=block_size,
    )  # fmt: skip


def _clone(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()


def _freeze(meta: Any) -> SimpleNamespace:
    """What the consumers read of ``meta`` now (the builder's buffers change after the
    forward), and the prefill chunk plan an SWA-only layer asks of it."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention

    fresh = None
    if meta.num_decode_tokens:
        plan = meta.tile_sched_swaonly
        fresh = plan is not None and not getattr(plan, "have_initialized", False)
    return SimpleNamespace(
        num_decodes=meta.num_decodes, num_prefills=meta.num_prefills,
        num_decode_tokens=meta.num_decode_tokens, num_prefill_tokens=meta.num_prefill_tokens,
        block_size=meta.block_size, width=meta.decode_swa_width,
        seq_lens=meta.seq_lens.clone(), query_start_loc=meta.query_start_loc.clone(),
        block_table=meta.block_table.clone(), slot_mapping=meta.slot_mapping.clone(),
        is_valid_token=meta.is_valid_token.clone(),
        token_to_req_indices=meta.token_to_req_indices.clone(),
        decode_swa_indices=meta.decode_swa_indices.clone(),
        decode_swa_lens=meta.decode_swa_lens.clone(),
        prefill_swa_indices=_clone(meta.prefill_swa_indices),
        prefill_swa_lens=_clone(meta.prefill_swa_lens),
        replay_start=meta.replay_start.clone(),
        prefill_seq_lens=_clone(meta.prefill_seq_lens),
        prefill_gather_lens=_clone(meta.prefill_gather_lens),
        prefill_query_lens=_clone(meta.prefill_query_lens_cpu),
        # _forward_prefill of an SWA-only layer (compress_ratio 1).
        chunk_plan=meta.get_prefill_chunk_plan(
            compress_ratio=1, prefill_chunk_size=DeepseekV4Attention.PREFILL_CHUNK_SIZE
        ),
        tile_sched_fresh=fresh,
    )  # fmt: skip


def _by_token(m: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
    """Each token's window (KV slots, -1 past its length) and its length: the decode
    rows for the first ``num_decode_tokens`` query rows, the prefill rows after them
    (``forward_mqa``'s split)."""
    d, p = m.num_decode_tokens, m.num_prefill_tokens
    rows = [v1._np(m.decode_swa_indices).reshape(d, m.width)]
    lens = [v1._np(m.decode_swa_lens)[:d]]
    if p:
        prefill = v1._np(m.prefill_swa_indices)
        rows.append(prefill.reshape(p, prefill.shape[-1])[:, : m.width])
        lens.append(v1._np(m.prefill_swa_lens)[:p])
    return np.concatenate(rows), np.concatenate(lens)


def _prefill_room(m: SimpleNamespace) -> np.ndarray:
    """Each prefill's room in its chunk's workspace: ``dequantize_and_gather_k_cache``
    writes its ``gather_lens[i]`` keys at column ``chunk_N`` of ``chunk_M`` (the chunk
    plan's upper bound of them), so the room ``chunk_M - chunk_N - gather_lens[i]``."""
    gather = v1._np(m.prefill_gather_lens).astype(np.int64)
    room = np.zeros_like(gather)
    for start, end, n, width in m.chunk_plan:
        room[start:end] = width - n - gather[start:end]
    return room


def _swa_fields(
    config: EngineConfig, seen: v1._Seen, bs: int, map_judged: bool = True
) -> list[Field]:
    """Every field of the SWA metadata a consumer reads, with what it accepts.
    ``map_judged``: each token's request held to the query offsets
    (``_Engine.offsets_judged``)."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    slots = num_blocks(config) * config.block_size
    seq_lens = v1._np(m.seq_lens)
    rows = len(seq_lens)
    reach = int(m.block_table.shape[1]) * bs
    indices, lens = _by_token(m)
    qsl = v1._np(m.query_start_loc)
    out = [
        # _forward_decode -> flash_mla_with_kvcache(indices=decode_swa_indices,
        # topk_length=decode_swa_lens): token t attends to the first lens[t] KV slots of
        # its row of the SWA cache, at most the row's width (the window); -1 no slot.
        Field("swa.lens", "tokens", lens, (0, m.width)),
        Field("swa.indices", "tokens", indices, (-1, slots - 1), row_lengths=lens),
        # compute_global_topk_indices_and_lens (a compressed layer's decode): a token's
        # request's row of the block table, a valid token's only; the request the query
        # offsets place it in.
        *v1.request_map_fields("swa.token_to_req_indices", v1._np(m.token_to_req_indices),
                               qsl, rows, map_judged),
        Field("swa.is_valid_token", "tokens", v1._np(m.is_valid_token).astype(np.int64),
              (0, 1)),
        # DeepseekV4Attention's cache insert (fused_deepseek_v4_qnorm_rope_kv_rope_quant_
        # insert): token t's key goes to slot_mapping[t] of the SWA cache; -1 none.
        Field("swa.slot_mapping", "tokens", v1._np(m.slot_mapping), (-1, slots - 1),
              writes_kv=True),
        # _forward_prefill: query_start_loc (device and host) cut the prefills' rows.
        Field("swa.query_start_loc", "offsets", qsl, (0, tokens_pad)),
        # ... dequantize_and_gather_k_cache reads a prefill's keys up to seq_lens[i]
        # through its block-table row (block_table[num_decodes:]).
        Field("swa.seq_lens", "requests", seq_lens, (0, reach)),
        Field("swa.block_table", "requests", v1._np(m.block_table),
              (0, num_blocks(config) * (config.block_size // bs) - 1),
              row_lengths=-(-seq_lens.astype(np.int64) // bs)),
        # _compute_swa_indices_and_lens_kernel: no window starts below replay_start[i].
        Field("swa.replay_start", "requests", v1._np(m.replay_start)[:rows], (0, reach)),
    ]  # fmt: skip
    if m.prefill_seq_lens is not None:
        p_seq = v1._np(m.prefill_seq_lens).astype(np.int64)
        gather = v1._np(m.prefill_gather_lens).astype(np.int64)
        out += [
            Field("swa.prefill.seq_lens", "requests", p_seq, (0, reach)),
            # dequantize_and_gather_k_cache: prefill i's keys seq_lens[i] - gather_lens[i]
            # to seq_lens[i], none before its first position ...
            Field("swa.prefill.gather_start", "requests", p_seq - gather, (0, reach)),
            Field("swa.prefill.gather_lens", "requests", gather, (0, reach)),
            # ... into its chunk's workspace, chunk_M - chunk_N columns for them (the
            # plan's bound of a gather: max_num_batched_tokens + window - 1).
            Field("swa.prefill.gather_room", "requests", _prefill_room(m),
                  (0, config.max_num_batched_tokens + WINDOW - 1)),
            # get_prefill_chunk_plan: the host query lengths of the prefills.
            Field("swa.prefill.query_lens", "requests", v1._np(m.prefill_query_lens),
                  (0, config.max_num_batched_tokens)),
        ]  # fmt: skip
    if m.tile_sched_fresh is not None:
        # _forward_decode: the step's plan of the SWA-only layers, empty
        # (have_initialized unset) so that the kernel plans it for this step's lengths.
        fresh = np.full(m.num_decode_tokens, int(m.tile_sched_fresh), dtype=np.int64)
        out.append(Field("swa.tile_sched_fresh", "tokens", fresh, (1, 1)))
    return out


class _SWAEngine(v1._Engine):
    """A V1 runner whose attention layer is DeepSeek-V4's SWA cache."""

    freeze = staticmethod(_freeze)

    def platform(self) -> contextlib.AbstractContextManager[Any]:
        return sm90()

    def attention_group(self) -> tuple[type, Any]:
        vc = self.vllm_config
        # The window (hf_config.sliding_window, which the builder reads), on this
        # engine's copy of the model config.
        model = vc.model_config = copy.copy(vc.model_config)
        model.hf_config = copy.copy(model.hf_config)
        model.hf_config.sliding_window = WINDOW
        # The fp8_ds_mla layout's cache dtype (_resolve_dsv4_kv_cache_dtype writes it
        # back on the cache config), which get_kv_cache_spec reads.
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.cache_dtype = "fp8_ds_mla"
        layer = _swa_layer(vc, _LAYER, self.config.block_size)
        if drafting.DRAFT_LAYER in vc.compilation_config.static_forward_context:
            # The MTP layer's attention keeps an SWA cache too (compress ratio 1).
            _swa_layer(vc, drafting.DRAFT_LAYER, self.config.block_size)
        return _backend(), layer.get_kv_cache_spec(vc)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # DeepseekSparseSWAMetadataBuilder's UNIFORM_BATCH support.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        bs, judged = self.kernel_block_size(), self.offsets_judged(seen)
        swa = [] if seen.meta is None else _swa_fields(self.config, seen, bs, judged)
        return v1._fields(self.config, no_meta) + tuple(swa) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their SWA-cache slots, in position order, as its
        tokens read them (``forward_mqa``): a decode's valid tokens (``is_valid_token``;
        a padding token's row is no request's) the slots of their rows of
        ``decode_swa_indices`` (``flash_mla_with_kvcache``), a prefill's the keys
        ``dequantize_and_gather_k_cache`` gathers, ``seq_lens[i] - gather_lens[i]`` to
        ``seq_lens[i]`` through its block-table row."""
        m = seen.meta
        bs = self.kernel_block_size()
        indices, lens = _by_token(m)
        owner = v1._np(m.token_to_req_indices)
        valid = v1._np(m.is_valid_token)
        table = v1._np(m.block_table)
        rows = len(v1._np(m.seq_lens))
        slots: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(rows)]
        for t in range(m.num_decode_tokens):
            if valid[t] and lens[t] > 0:  # a padding token is no request's
                r = int(owner[t])
                read = np.concatenate([slots[r], indices[t, : lens[t]].astype(np.int64)])
                slots[r] = np.array(list(dict.fromkeys(read.tolist())), dtype=np.int64)
        if m.prefill_seq_lens is not None:
            p_seq = v1._np(m.prefill_seq_lens).astype(np.int64)
            gather = v1._np(m.prefill_gather_lens).astype(np.int64)
            for i, (stop, n) in enumerate(zip(p_seq, gather, strict=True)):
                r = m.num_decodes + i
                slots[r] = v1.page_slots(table[r], int(stop), bs, int(stop - n))
        return np.array([len(s) for s in slots], dtype=np.int64), slots


class SparseSWARunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of DeepSeek-V4's SWA cache."""

    engine_type = _SWAEngine


ENGINE = SparseSWARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-sparse-swa`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-sparse-swa`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart: the drafter's later sub-steps keep its first pass's request map --


draft_requests_stale = v1.kept_apart(
    SparseSWARunnerStepEngine,
    "``vllm-v1-sparse-swa-draft-requests-stale``: ``vllm-v1-sparse-swa`` with the "
    "drafter's sub-steps after its first pass held to their query offsets.",
    stale_drafts_judged=True,
)


def reach_drafts(trace: Trace | Case) -> bool:
    """An engine of ``vllm-v1-sparse-swa`` whose drafter runs a sub-step after its first
    pass (``propose``'s loop: two drafts or more)."""
    return reach_swa(trace) and trace.config.num_spec >= 2


def trigger_draft_requests_stale(trace: Trace | Case) -> bool:
    """A step of two requests or more, one of more than one token: the first pass's map
    then differs from one token a request in some of the first rows."""
    return reach_drafts(trace) and any(
        len(b.q_lens) > 1 and max(b.q_lens) > 1 for b in hybrid._batches(trace)
    )


def smallest_draft_requests_stale() -> Trace:
    """Two requests prefill 2 tokens each on pages 1 and 2, two drafts: the first pass
    maps its tokens to ``[0, 0, 1, 1]``; the second sub-step, one token a request, reads
    ``[0, 0]``: request 1's draft token reads request 0's window."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=2, max_num_batched_tokens=8, block_size=BLOCK_SIZE,
        num_spec=2, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    step = Batch((0, 0), (2, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1))
    return Trace(config, (step,))


# -- mutant: DeepseekSparseSWAMetadataBuilder.build with its window dropped ----------------


@contextlib.contextmanager
def _window_unclamped() -> Iterator[None]:
    """``build`` hands ``_compute_swa_indices_and_lens_kernel`` no window (a window as
    long as any sequence) beside the index width it keeps: a token's window starts at
    its sequence's first position, its length ``pos + 1`` past the window's width, its
    row the sequence's first ``window`` slots."""
    from vllm.v1.attention.backends.mla import sparse_swa as module

    original = module._COMPUTE_SWA_INDICES_AND_LENS_KERNEL

    def launch(indices: Any, lens: Any, window_size: int, *args: Any, **kwargs: Any) -> Any:
        return original(indices, lens, 1 << 30, *args, **kwargs)

    with mock.patch.object(module, "_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", launch):
        yield


_UNCLAMPED = v1.Mutated(SparseSWARunnerStepEngine(), _window_unclamped)


def window_unclamped(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-sparse-swa-window-unclamped``: a token past the window's first
    ``window`` positions reads more keys than its row holds (``swa.lens``)."""
    return _UNCLAMPED(inputs)


window_unclamped.new_engine = _UNCLAMPED.engine.new_engine  # type: ignore[attr-defined]


def reach_swa(trace: Trace | Case) -> bool:
    """A V1 engine of pages the backend takes: every step runs the builder."""
    return declines_config(trace.config) is None


def trigger_past_window(trace: Trace | Case) -> bool:
    """A step of a request whose sequence runs past the window (a token at position
    ``window`` or later, whose clamped window starts after position 0)."""
    return reach_swa(trace) and any(
        c + q > WINDOW for b in hybrid._batches(trace)
        for c, q in zip(b.num_computed_tokens, b.q_lens, strict=True)
    )  # fmt: skip


def smallest_past_window() -> Trace:
    """One request prefills ``window + 1`` tokens in one step (3 pages of 32), on an
    engine without graphs (none is needed; and an engine of graph mode with no capture
    size is one vLLM refuses to make): its last token, at position 64, reads 65 keys
    where its row holds 64."""
    config = EngineConfig(
        max_model_len=WINDOW + 2, max_num_seqs=1, max_num_batched_tokens=WINDOW + 1,
        block_size=BLOCK_SIZE, cudagraph_capture_sizes=(), cudagraph_mode="NONE", runner="v1",
    )  # fmt: skip
    step = Batch((0,), (WINDOW + 1,), req_ids=(0,), pages=((1, 2, 3),), new_pages=(3,))
    return Trace(config, (step,))
