"""vLLM's model runner V1 step of an MLA model, as the implementation ``vllm-v1-mla`` of
``runner-step``.

The engine of :mod:`.runner_step_v1`, its attention layer an MLA layer on the Triton
MLA backend (``vllm/v1/attention/backends/mla/triton_mla.py``, whose
``TritonMLAMetadataBuilder`` is ``MLACommonMetadataBuilder`` with uniform multi-token
decodes, ``QueryLenSupport.UNIFORM``, and FULL graphs of uniform batches,
``AttentionCGSupport.UNIFORM_BATCH``): the builder CUTLASS MLA, FlashMLA and
FlashInfer MLA build on. Its KV-cache group is an ``MLAAttentionSpec`` (one latent
head of ``kv_lora_rank + qk_rope_head_dim``), so the runner's own
``_build_attention_metadata`` runs ``MLACommonMetadataBuilder.build`` on every step
(eager, padded for the graph, replayed, afresh, the drafter's sub-steps) and
``build_for_cudagraph_capture`` in the capture runs (``vllm/model_executor/layers/
attention/mla_attention.py``): the decode/prefill split by the reorder threshold
(``split_decodes_and_prefills``, ``1 + num_spec`` with drafts), the decode block table
and seq_lens sliced to the decodes, the prefills' block table, query offsets and
chunked-context metadata (``build_mla_chunked_context_metadata``) and the prefill
backend's ``prepare_metadata``. ``initialize_attn_backend`` keeps the mode the backend
allows: a FULL mode becomes FULL_AND_PIECEWISE.

Stood in beyond ``vllm-v1``: the MLA layer the model would register in the static
forward context (``MLAAttention.__init__``), which the builder reads for its latent
dimensions and its prefill backend: here an object of the tiny DeepSeek model's
dimensions, its prefill backend the one vLLM's selector picks for the platform
(``get_mla_prefill_backend``; on a CPU ``CPUSDPAMLAPrefillBackend``), made as the layer
makes it. The model's latent head is 512 + 64 (``head_dim`` 576, one of the sizes
``MLACommonMetadata.__post_init__`` accepts), set on the engine's copy of the model
config.

Every field of the MLA metadata a kernel reads is reported (``mla.*``: the decodes'
seq_lens and block table, the prefills' query offsets, context lengths and block table,
each context chunk's workspace offsets, starts, token-to-request map and query
offsets) with the range its kernel accepts, beside ``vllm-v1``'s fields of the step
(the forward context's slot mapping, the positions), and judged by the step's
properties; and ``kv_len`` and ``kv_slots`` by request, the keys those kernels read
(:meth:`_MLAEngine.kv_read`), which ``vllm-v1-backends`` holds to ``vllm-v1``'s. The
scalars of the split (``num_decodes``, ``num_decode_tokens``) are the
decode fields' lengths: a padded FULL decode counts its padding requests as decodes
(``split_decodes_and_prefills`` with ``require_uniform``), their rows judged by safety.

Declined: ``vllm-v1``'s cases, nothing more. The Triton MLA backend's kernel block
sizes are multiples of 16, as the Triton backend's; its reorder threshold is
``1 + num_spec`` (``QueryLenSupport.UNIFORM``, ``_init_reorder_batch_threshold``), so
every speculative decode of a V1 step is a decode; in a uniform batch (the only one a
FULL graph replays) every query is a decode, a first chunk's too
(``split_decodes_and_prefills``: ``treat_short_extends_as_decodes`` without context
parallelism), so a FULL graph never replays a prefill (the hybrid builders' finding
does not arise).
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
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import _LAYER, num_blocks
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

_MLA = "vllm/model_executor/layers/attention/mla_attention.py"
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 512, 64  # the latent head: 576, as DeepSeek's


def prepare() -> None:
    """Import vLLM's V1 runner and the Triton MLA backend before a judge forks."""
    v1.prepare()
    _backend()


@functools.cache
def _backend() -> type:
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

    return TritonMLABackend


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1`` (the Triton MLA backend's
    kernel block sizes are also multiples of 16: ``triton_mla.py
    TritonMLABackend.get_supported_kernel_block_sizes``)."""
    return v1.declines(case)


declines_config = v1.declines_config
""":func:`declines` of an engine of ``config`` alone (its step not read)."""


def _mla_layer(vllm_config: Any, backend: type) -> Any:
    """An MLA layer as the static forward context holds it (``MLAAttention.__init__``):
    what the builder reads of it, its latent dimensions and its prefill backend, made
    as the layer makes it, of the class vLLM's selector picks for the platform; its
    backend the engine's (the MTP draft layer's too: the drafter's
    ``initialize_attn_backend`` asks it)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class MLALayer(_MLALayer, AttentionLayerBase):
        def get_attn_backend(self) -> type:
            return backend

        def get_kv_cache_spec(self, vllm_config: Any) -> None:
            return None  # the engine's KV-cache group holds the layer

    return MLALayer(vllm_config)


class _MLALayer:
    """What the builder reads of an MLA layer."""

    def __init__(self, vllm_config: Any) -> None:
        from vllm.v1.attention.backends.mla.prefill.selector import get_mla_prefill_backend

        hf = vllm_config.model_config.hf_text_config
        self.num_heads = vllm_config.model_config.get_num_attention_heads(
            vllm_config.parallel_config
        )
        self.q_lora_rank, self.kv_lora_rank = hf.q_lora_rank, hf.kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = hf.qk_nope_head_dim, hf.qk_rope_head_dim
        self.v_head_dim = hf.v_head_dim
        self.scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        self.prefill_backend = get_mla_prefill_backend(vllm_config)(
            num_heads=self.num_heads, scale=self.scale, kv_lora_rank=self.kv_lora_rank,
            qk_nope_head_dim=self.qk_nope_head_dim, qk_rope_head_dim=self.qk_rope_head_dim,
            v_head_dim=self.v_head_dim, vllm_config=vllm_config,
        )  # fmt: skip


def _freeze(meta: Any) -> SimpleNamespace:
    """What the MLA layer's kernels read of ``meta`` now (the persistent buffers change
    after the forward): the split, the decode and prefill sub-batches' tensors, each
    context chunk's."""
    decode, prefill = meta.decode, meta.prefill
    out = SimpleNamespace(
        num_decodes=meta.num_decodes, num_prefills=meta.num_prefills,
        num_decode_tokens=meta.num_decode_tokens, decode=None, prefill=None,
    )  # fmt: skip
    if decode is not None:
        out.decode = SimpleNamespace(
            block_table=decode.block_table.clone(), seq_lens=decode.seq_lens.clone()
        )
    if prefill is not None:
        chunked = prefill.chunked_context
        chunks = [] if chunked is None else chunked.chunks
        out.prefill = SimpleNamespace(
            block_table=prefill.block_table.clone(),
            query_start_loc=prefill.query_start_loc.clone(),
            context_lens=None if chunked is None else chunked.context_lens.clone(),
            workspace=0 if chunked is None else int(chunked.workspace.shape[0]),
            chunks=[
                SimpleNamespace(
                    request_start=c.request_slice.start,
                    cu_seq_lens=c.cu_seq_lens.clone(),
                    starts=c.starts.clone(),
                    token_to_seq=c.token_to_seq.clone(),
                    query_start_loc=c.query_start_loc.clone(),
                )
                for c in chunks
            ],
        )
    return out


def _cdiv(lengths: torch.Tensor, block_size: int) -> np.ndarray:
    return -(-v1._np(lengths).astype(np.int64) // block_size)


def _mla_fields(config: EngineConfig, seen: v1._Seen) -> list[Field]:
    """Every tensor of the MLA metadata a kernel reads, with what the kernel accepts.
    The consumers are ``MLAAttention.forward_impl`` (``mla_attention.py``), which hands
    the first ``num_decode_tokens`` query rows to the decode kernel and the rest to
    the prefill path, ``TritonMLAImpl.forward_mqa`` and ``decode_attention_fwd``
    (``triton_mla.py``, ``v1/attention/ops/triton_decode_attention.py``) and
    ``_compute_prefill_context`` with the prefill backend's ``run_prefill_*``."""
    m = seen.meta
    tokens_pad = int(seen.positions.shape[0])
    pages = (0, num_blocks(config) - 1)
    bs = config.block_size
    out = []
    if m.decode is not None:
        d = m.decode
        reach = int(d.block_table.shape[1]) * bs
        out += [
            # decode_attention_fwd: a decode row's keys are the first seq_lens[i] of its
            # sequence, read through its block-table row (forward_mqa repeats both per
            # query token of a multi-token decode, the extents shortened causally).
            Field("mla.decode.seq_lens", "requests", v1._np(d.seq_lens), (0, reach)),
            # ... block_table[i, j] is a page of the latent cache (KVCacheConfig's);
            # the kernel reads a row's first cdiv(seq_lens[i], page size) pages.
            Field("mla.decode.block_table", "requests", v1._np(d.block_table), pages,
                  row_lengths=_cdiv(d.seq_lens, bs)),
        ]  # fmt: skip
    if m.prefill is not None:
        p = m.prefill
        reach = int(p.block_table.shape[1]) * bs
        prefills = int(p.block_table.shape[0])
        # The prefills' rows (requests num_decodes on): no graph pads a batch holding a
        # prefill (FULL graphs are uniform decodes), so every build holds the same rows.
        out += [
            # The prefill backend's run_prefill_new_tokens: prefill i's query rows are
            # q[query_start_loc[i] : query_start_loc[i + 1]] of the prefill tokens.
            Field("mla.prefill.query_start_loc", "offsets", v1._np(p.query_start_loc),
                  (0, tokens_pad)),
        ]  # fmt: skip
        if p.context_lens is not None:
            out += [
                # The context each prefill gathers from the cache (seq_len - query_len).
                Field("mla.prefill.context_lens", "requests", v1._np(p.context_lens),
                      (0, reach)),
                # _compute_prefill_context: the gather reads block_table[chunk's
                # requests], a row's pages of its context only.
                Field("mla.prefill.block_table", "requests", v1._np(p.block_table), pages,
                      row_lengths=_cdiv(p.context_lens, bs)),
            ]  # fmt: skip
        for i, c in enumerate(p.chunks):
            name = f"mla.prefill.chunk{i}"
            out += [
                # gather_mla_context_cache_cpu / gather_and_maybe_dequant_cache: chunk
                # request r's context tokens [starts[r], starts[r] + len) land at
                # workspace rows cu_seq_lens[r] : cu_seq_lens[r + 1].
                Field(f"{name}.cu_seq_lens", "offsets", v1._np(c.cu_seq_lens),
                      (0, p.workspace)),
                Field(f"{name}.starts", "requests", v1._np(c.starts), (0, reach)),
                # gather_and_maybe_dequant_cache: each workspace token's request of the
                # chunk (rows: the chunk's context tokens, compared on the first as
                # many as the step has tokens).
                Field(f"{name}.token_to_seq", "tokens", v1._np(c.token_to_seq),
                      (0, max(prefills - 1, 0))),
                # run_prefill_context_chunk: the chunk's query rows of each request.
                Field(f"{name}.query_start_loc", "offsets", v1._np(c.query_start_loc),
                      (0, tokens_pad)),
            ]  # fmt: skip
    return out


def latent_head(vc: Any) -> None:
    """The latent head (``kv_lora_rank + qk_rope_head_dim``) of an MLA model, on ``vc``'s
    own copy of the model config (the copy shares the base's hf config and
    architecture, so each is copied before it is changed)."""
    model = vc.model_config = copy.copy(vc.model_config)
    model.hf_text_config = copy.copy(model.hf_text_config)
    model.hf_text_config.kv_lora_rank = KV_LORA_RANK
    model.hf_text_config.qk_rope_head_dim = QK_ROPE_HEAD_DIM
    model.model_arch_config = copy.copy(model.model_arch_config)
    model.model_arch_config.head_size = KV_LORA_RANK + QK_ROPE_HEAD_DIM


def latent_spec(config: EngineConfig, kv_cache_dtype: str = "auto") -> Any:
    """The ``MLAAttentionSpec`` of the latent cache: one head of the latent size, bf16,
    or a byte a value for an fp8 cache (``kv_cache_dtype_str_to_dtype``)."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    auto = kv_cache_dtype == "auto"
    return MLAAttentionSpec(
        block_size=config.block_size, num_kv_heads=1,
        head_size=KV_LORA_RANK + QK_ROPE_HEAD_DIM,
        dtype=torch.bfloat16 if auto else torch.uint8,
        cache_dtype_str=None if auto else kv_cache_dtype,
    )  # fmt: skip


class _MLAEngine(v1._Engine):
    """A V1 runner whose attention layer is an MLA layer on the Triton MLA backend."""

    backend = staticmethod(_backend)  # the MLA backend class, of its layers
    freeze = staticmethod(_freeze)
    kv_cache_dtype = "auto"  # CacheConfig.cache_dtype: the model's (bf16)

    def attention_group(self) -> tuple[type, Any]:

        vc = self.vllm_config
        latent_head(vc)
        layers = vc.compilation_config.static_forward_context
        layers[_LAYER] = _mla_layer(vc, self.backend())
        if drafting.DRAFT_LAYER in layers:  # the MTP layer is an MLA layer too
            layers[drafting.DRAFT_LAYER] = _mla_layer(vc, self.backend())
        # The KV cache's dtype, which the builders read of the cache config (an fp8
        # cache is a byte a value: KVCacheSpec's dtype for it, kv_cache_dtype_str_to_dtype).
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.cache_dtype = self.kv_cache_dtype
        return self.backend(), latent_spec(self.config, self.kv_cache_dtype)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # TritonMLAMetadataBuilder's UNIFORM_BATCH support: _check_and_update_cudagraph_mode
        # turns FULL into FULL_AND_PIECEWISE.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        # The forward context's slot mapping (the latent cache's writes) and the
        # positions, as vllm-v1's; the MLA metadata's own fields.
        no_meta = v1._Seen(None, seen.slot_mapping, seen.positions)
        mla = _mla_fields(self.config, seen) if seen.meta is not None else []
        return v1._fields(self.config, no_meta) + tuple(mla) + self.kv_fields(seen)

    def kv_read(self, seen: v1._Seen) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each request's keys and their latent-cache slots as the MLA layer's kernels
        read them (``MLAAttention.forward_impl``), decodes first (the rows the split
        puts first), then prefills:

        - a decode: ``TritonMLAImpl.forward_mqa`` -> ``decode_attention_fwd`` reads the
          first ``decode.seq_lens[i]`` keys of the cache (the step's own included,
          written before), through ``decode.block_table[i]``;
        - a prefill: ``_forward_prefill`` reads its context from the cache chunk by
          chunk (``_compute_prefill_context``: each chunk gathers, for prefill
          ``request_slice.start + r``, the context keys ``starts[r]`` to
          ``starts[r] + cu_seq_lens[r + 1] - cu_seq_lens[r]`` through
          ``prefill.block_table``), then the step's own keys, which
          ``run_prefill_new_tokens`` takes from the forward's input (rows
          ``prefill.query_start_loc``, after the decode tokens), at the slots the
          forward context's slot mapping writes them to."""
        m = seen.meta
        bs = self.kernel_block_size()
        lengths: list[int] = []
        slots: list[np.ndarray] = []
        if m.decode is not None:
            d_lens, d_slots = v1.paged_keys(
                v1._np(m.decode.seq_lens), v1._np(m.decode.block_table), bs
            )
            lengths += d_lens.tolist()
            slots += d_slots
        if m.prefill is not None:
            p = m.prefill
            if seen.slot_mapping is None:
                raise RuntimeError("attnfuzz: an MLA prefill forward with no slot mapping")
            table = v1._np(p.block_table)
            context: list[list[np.ndarray]] = [[] for _ in range(table.shape[0])]
            for c in p.chunks:
                cu, starts = v1._np(c.cu_seq_lens), v1._np(c.starts)
                for r, start in enumerate(starts.tolist()):
                    stop = start + int(cu[r + 1] - cu[r])
                    context[c.request_start + r].append(
                        v1.page_slots(table[c.request_start + r], stop, bs, start)
                    )
            query = v1._np(p.query_start_loc).astype(np.int64) + m.num_decode_tokens
            written = v1._np(seen.slot_mapping).astype(np.int64)
            for i, parts in enumerate(context):
                keys = np.concatenate([*parts, written[query[i] : query[i + 1]]])
                lengths.append(len(keys))
                slots.append(keys)
        return np.array(lengths, dtype=np.int64), slots


class MLARunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of an MLA model."""

    engine_type = _MLAEngine

    # The MLA builder's reorder_batch_threshold makes the runner reorder its batch, as
    # GDN's does: the fresh engine's warm-up adds each running request as a first chunk.
    warm_computed = staticmethod(hybrid.HybridRunnerStepEngine.warm_computed)


ENGINE = MLARunnerStepEngine()
"""The engine of the implementation ``vllm-v1-mla`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-mla`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: MLACommonMetadataBuilder._build_decode with one line changed.


@contextlib.contextmanager
def _seq_lens_copied() -> Iterator[None]:
    """``_build_decode`` hands the decode kernel a copy of the decodes' seq_lens (as a
    builder that casts, clamps or pads them into a new tensor would), not the view of
    the runner's persistent ``seq_lens`` that ``build`` slices: a FULL graph captures
    the copy, and its replay reads the capture's lengths."""
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder

    original = MLACommonMetadataBuilder._build_decode

    def build_decode(self: Any, *args: Any, **kwargs: Any) -> Any:
        decode = original(self, *args, **kwargs)
        decode.seq_lens = decode.seq_lens.clone()
        return decode

    with mock.patch.object(MLACommonMetadataBuilder, "_build_decode", build_decode):
        yield


_MUTANT = v1.Mutated(MLARunnerStepEngine(), _seq_lens_copied)


def decode_seq_lens_copied(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-mla-decode-seq-lens-copied``: a FULL graph's replay reads the decode
    seq_lens of its capture (replay equals eager)."""
    return _MUTANT(inputs)


decode_seq_lens_copied.new_engine = _MUTANT.engine.new_engine  # type: ignore[attr-defined]


# The mutant's trace: a FULL decode the graph replays (shared with runner_step_linear's).
trigger_full_decode = hybrid.trigger_full_decode
smallest_full_decode = hybrid.smallest_full_decode
