"""vLLM's model runner V2 step of an encoder-decoder model (Whisper's family), as the
implementation ``vllm-v2-encoder-decoder`` of ``runner-step``.

The engines of :mod:`.runner_step` (implementation ``vllm``), of a model with
cross-attention: vLLM 0.33.0's ``resolve_model_state_cls`` finds a ``CrossAttention``
among the model's modules and keeps an ``EncoderDecoderModelState``
(``v1/worker/gpu/model_states/encoder_decoder.py``). What then runs is vLLM's own:

- ``add_request`` hands each request's encoder input (its ``mm_features``) to the
  runner's ``EncoderCache``; on a request's first step the scheduler schedules it
  (``scheduled_encoder_inputs``), ``prepare_inputs_embeds`` runs the encoder through
  the ``EncoderRunner`` (``prepare_mm_inputs``, ``execute_mm_encoder``: the model's
  ``embed_multimodal``) and ``prepare_inputs`` hands its outputs to the forward
  (``encoder_outputs``); the runner runs that step eagerly (``skip_compiled``);
- ``prepare_attn`` builds every KV-cache group's metadata with each request's encoder
  length (``_get_encoder_seq_lens``: the sum of its features' embeddings; a padding
  row 0; the largest length, ``max_source_positions``, for a capture), which the
  cross-attention group's builder, ``create_cross_attention_backend``'s
  ``CrossAttentionBuilder`` over Triton's, turns into its ``seq_lens`` and into the
  slots its forward writes the encoder's keys to (``_get_cross_slot_mapping``: a
  request's encoder tokens, through its cross-attention block table, on its first
  step only);
- the worker's warm-up (``warmup.py``, its encoder-decoder branch), the graph-memory
  profiling and the FULL decode graphs' capture, as for ``vllm``.

Judged: ``vllm``'s fields of the self-attention layer, and the cross-attention layer's:
its ``seq_lens`` (held to each request's encoder length as the scheduler sent it,
``cross.encoder_lens``, by *agreement within a build*), its block table (a row's
``cdiv(seq_len, block_size)`` pages read), and, in a build of the step's requests, the
slots it writes, a row a request (``cross.slot_mapping``), held to the slots each
request at its first step reads (``cross.kv_slots``: its encoder tokens through its
own block-table row; none for a request past it), by agreement within a build. Every
property of ``vllm`` holds them too (padding invariance, replay equals eager, safe
padding, history invariance).

The engine as vLLM makes one of such a model (``SchedulerConfig.__post_init__`` and
``VllmConfig.__post_init__`` with ``is_encoder_decoder``): no chunked prefill and no
prefix caching (a request prefills its prompt whole, new to the engine at 0
computed tokens), a budget ``max_num_batched_tokens`` at least ``max_model_len``, the
step's encoder inputs within ``max_num_encoder_input_tokens`` (the same budget),
cudagraph mode NONE or FULL_DECODE_ONLY (any other is overridden to the latter), no
drafts. Traces outside those are declined.

Stood in: the model (zeros; its encoder ``embed_multimodal`` too), its config's
``is_encoder_decoder`` and ``max_source_positions`` (:data:`MAX_SOURCE_POSITIONS`),
``ModelConfig.supports_multimodal_inputs`` (its per-instance cache: the model's
registry entry is attnfuzz's), the scheduler's encoder lengths
(:func:`encoder_len`, a function of the request id) and its cross-attention blocks (a
request's own, from a slot it holds while it runs: :func:`cross_pages`), and what
:mod:`.runner_step` stands in.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step as rs
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case, EngineConfig, cdiv
from attnfuzz.reference.persistent_batch import new_to_engine
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

prepare = rs.prepare

CROSS_LAYER = "model.layers.0.encoder_attn.attn"  # the second KV-cache group's layer
MAX_SOURCE_POSITIONS = 16
"""The model's ``hf_config.max_source_positions``: the longest encoder input."""
MODES = ("NONE", "FULL_DECODE_ONLY")
"""The cudagraph modes vLLM runs an encoder-decoder model in (``VllmConfig.__post_init__``
overrides any other to FULL_DECODE_ONLY)."""


def encoder_len(req_id: int) -> int:
    """The encoder tokens of request ``req_id``'s input (its one feature's
    ``mm_position.length``): every length from 1 to :data:`MAX_SOURCE_POSITIONS` among
    any 16 consecutive ids, so that requests of one step differ and meet page ends."""
    return 1 + (7 * req_id + 4) % MAX_SOURCE_POSITIONS


def cross_pages(config: EngineConfig, slot: int, req_id: int) -> list[int]:
    """The cross-attention blocks of the request that holds ``slot``: the first
    ``cdiv(encoder_len, block_size)`` of the slot's, past the attention pages."""
    per_slot = cdiv(MAX_SOURCE_POSITIONS, config.block_size)
    first = rs.num_blocks(config) + slot * per_slot
    return list(range(first, first + cdiv(encoder_len(req_id), config.block_size)))


# -- what vLLM runs -------------------------------------------------------------------------


def declines(case: Case) -> str | None:
    """``vllm``'s declines, and what vLLM does not run for an encoder-decoder model."""
    config, batch = case.config, case.batch
    if config.num_spec > 0:
        return "drafts: an encoder-decoder engine is served without a speculator here"
    if config.cudagraph_mode not in MODES:
        return (
            f"cudagraph mode {config.cudagraph_mode}: vLLM overrides it to FULL_DECODE_ONLY "
            "for an encoder-decoder model (config/vllm.py VllmConfig.__post_init__)"
        )
    if config.max_num_batched_tokens < config.max_model_len:
        return (
            f"max_num_batched_tokens {config.max_num_batched_tokens} < max_model_len "
            f"{config.max_model_len} without chunked prefill, which an encoder-decoder model "
            "turns off (config/scheduler.py SchedulerConfig.verify_max_model_len raises)"
        )
    return declines_step(config, batch) or rs.declines(case)


def declines_step(config: EngineConfig, batch: Batch) -> str | None:
    """Why vLLM's scheduler never hands an encoder-decoder engine ``batch``: a request
    new to it past 0 computed tokens (no prefix caching), a prefill chunk (no chunked
    prefill), or encoder inputs past the step's encoder budget."""
    prompts = batch.prompt_lens or (0,) * batch.num_reqs
    rows = zip(batch.request_ids, new_to_engine(batch), batch.num_computed_tokens,
               batch.q_lens, prompts, strict=True)  # fmt: skip
    encoded = 0
    for rid, new, computed, q, prompt in rows:
        if new and computed > 0:
            return (
                f"request {rid} new to the engine at {computed} computed tokens: no prefix caching"
            )
        if (not new and q > 1) or computed + q < prompt:
            return f"request {rid} prefills a chunk of its prompt: no chunked prefill"
        encoded += encoder_len(rid) if computed == 0 else 0
    if encoded > config.max_num_batched_tokens:
        return (
            f"{encoded} encoder tokens in one step past the encoder budget of "
            f"{config.max_num_batched_tokens} (SchedulerConfig.max_num_encoder_input_tokens; "
            "EncoderDecoderCacheManager.can_allocate)"
        )
    return None


class _EncoderDecoderModel(rs._Model):
    """``vllm``'s stand-in model, with a cross-attention module (what
    ``resolve_model_state_cls`` looks for) and an encoder of zeros."""

    def __init__(self, recorder: rs._Recorder) -> None:
        super().__init__(recorder)
        from vllm.model_executor.layers.attention import CrossAttention

        # A module of the class alone: its layer is the stood-in CROSS_LAYER.
        cross = CrossAttention.__new__(CrossAttention)
        torch.nn.Module.__init__(cross)
        self.encoder_attn = cross

    def embed_multimodal(self, **kwargs: Any) -> list[torch.Tensor]:
        """Each encoder input's embeddings: zeros, as many as its tokens."""
        lengths = kwargs["encoder_len"].reshape(-1).tolist()
        return [torch.zeros(int(n), 1) for n in lengths]


def _cross_spec(config: EngineConfig) -> Any:
    from vllm.v1.kv_cache_interface import CrossAttentionSpec

    return CrossAttentionSpec(
        block_size=config.block_size, num_kv_heads=1, head_size=16, dtype=torch.float32
    )


def _cross_layer(vc: Any, config: EngineConfig) -> Any:
    """The cross-attention layer, as the model registers it: the backend
    ``create_cross_attention_backend`` makes of ``vllm``'s (Triton's)."""
    from vllm.model_executor.layers.attention.cross_attention import (
        create_cross_attention_backend,
    )

    layer = rs._attention_layer(vc, config)
    backend = create_cross_attention_backend(layer.get_attn_backend())
    spec = _cross_spec(config)
    layer.get_attn_backend = lambda: backend
    layer.get_kv_cache_spec = lambda vllm_config: spec
    return layer


def _mm_feature(req_id: str) -> Any:
    """Request ``req_id``'s encoder input, as the processor hands it to the scheduler: one
    item at position 0 of :func:`encoder_len` tokens."""
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalKwargsItem,
        PlaceholderRange,
    )

    n = encoder_len(int(req_id))
    data = MultiModalKwargsItem(
        {"encoder_len": MultiModalFieldElem(torch.tensor([n]), MultiModalBatchedField())}
    )
    return MultiModalFeatureSpec(
        data=data, modality="audio", identifier=f"audio-{req_id}",
        mm_position=PlaceholderRange(offset=0, length=n),
    )  # fmt: skip


class _EncoderDecoderEngine(rs._StartUpEngine):
    """A V2 engine of an encoder-decoder model; ``slots``: the cross-attention slot each
    running request holds (shared by the three engines)."""

    def __init__(self, config: EngineConfig, device: torch.device, mode: str, speculator: str,
                 slots: dict[str, int]) -> None:  # fmt: skip
        self.slots = slots
        super().__init__(config, device, mode, speculator)

    def configure(self, vc: Any) -> Any:
        """The model config of an encoder-decoder model, the scheduler's as
        ``SchedulerConfig.__post_init__`` makes it for one."""
        vc = super().configure(vc)
        mc = vc.model_config = copy.copy(vc.model_config)
        hf = mc.hf_config = copy.copy(mc.hf_config)
        hf.is_encoder_decoder = True
        hf.max_source_positions = MAX_SOURCE_POSITIONS
        mc.__dict__.pop("is_encoder_decoder", None)  # a cached property
        mc._supports_multimodal_inputs_cache = {
            (mc.is_multimodal_model, mc.runner_type, None): True
        }
        sc = vc.scheduler_config = copy.copy(vc.scheduler_config)
        sc.__post_init__(self.config.max_model_len, is_encoder_decoder=True)
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.enable_prefix_caching = False
        self.recorder.linear_layer = CROSS_LAYER
        return vc

    def target_model(self) -> rs._Model:
        return _EncoderDecoderModel(self.recorder)

    def layers(self) -> dict[str, Any]:
        return {**super().layers(), CROSS_LAYER: _cross_layer(self.vllm_config, self.config)}

    def pool_size(self) -> int:
        """The block pool: the attention pages, then every slot's cross-attention blocks."""
        config = self.config
        return rs.num_blocks(config) + config.max_num_seqs * cdiv(
            MAX_SOURCE_POSITIONS, config.block_size
        )

    def kv_cache_config(self, layers: list[str]) -> Any:
        from vllm.v1.kv_cache_interface import KVCacheGroupSpec

        kv = super().kv_cache_config(layers)
        kv.kv_cache_groups.append(KVCacheGroupSpec([CROSS_LAYER], _cross_spec(self.config)))
        kv.num_blocks = self.pool_size()
        return kv

    def output(self, inputs: RunnerStepInputs, held: set[str]) -> Any:
        """``vllm``'s scheduler output with each new request's encoder input and
        cross-attention blocks, its encoder input scheduled on its first step."""
        out = super().output(inputs, held)
        for new in out.scheduled_new_reqs:
            new.mm_features = [_mm_feature(new.req_id)]
            rid = int(new.req_id)
            new.block_ids = (*new.block_ids, cross_pages(self.config, self.slots[new.req_id], rid))
            if new.num_computed_tokens == 0:
                out.scheduled_encoder_inputs[new.req_id] = [0]
        cached = out.scheduled_cached_reqs
        for i, gained in enumerate(cached.new_block_ids):
            if gained is not None:
                cached.new_block_ids[i] = (*gained, [])
        return out

    def fields(self, seen: rs._Seen, *, history: bool = True) -> tuple[Field, ...]:
        """``vllm``'s fields, their pages those of the whole block pool, and the
        cross-attention layer's (:func:`cross_fields`)."""
        # Both groups' blocks come from one pool (KVCacheConfig.num_blocks): the
        # self-attention layer's cache holds all of them, and the warm-up's requests
        # (warmup.py) name blocks past the attention pages, left in rows past their reach.
        pool = min(seen.pages or self.pool_size(), self.pool_size())
        slots = pool * self.config.block_size
        wider = {"block_table": (0, pool - 1), "slot_mapping": (rs.PAD_SLOT_ID, slots - 1)}
        own = tuple(
            dataclasses.replace(f, accepts=wider[f.name]) if f.name in wider else f
            for f in super().fields(seen, history=history)
        )
        if seen.linear is None:
            return own
        return own + cross_fields(self.config, seen, pool)


def cross_fields(config: EngineConfig, seen: rs._Seen, pool: int) -> tuple[Field, ...]:
    """The cross-attention layer's fields of one forward (its metadata ``seen.linear``)."""
    c, bs = seen.linear, config.block_size
    seq_lens = rs._np(c.seq_lens).astype(np.int64)
    table = rs._np(c.block_table)
    out = [
        # triton_unified_attention (causal False): a request's keys are the first
        # seq_lens[i] encoder tokens, read through its block-table row.
        Field("cross.seq_lens", "requests", seq_lens, (0, table.shape[1] * bs),
              agrees_with="cross.encoder_lens" if seen.batch is not None else None),
        # ... the row's first cdiv(seq_lens[i], block_size) pages, of the block pool.
        Field("cross.block_table", "requests", table, (0, pool - 1),
              row_lengths=-(-seq_lens // bs)),
    ]  # fmt: skip
    batch = seen.batch
    # A capture's, a dummy run's or a replay's: no request of the step, and its slots
    # no forward writes (the model's cross-attention has no keys without encoder
    # outputs, as Whisper's WhisperCrossAttention.forward; encoder steps run eagerly).
    if batch is None:
        return tuple(out)
    n = batch.num_reqs
    req_ids = [int(r) for r in batch.req_ids[:n]]
    first = batch.num_computed_tokens_np[:n] == 0
    lens = np.array([encoder_len(r) for r in req_ids], dtype=np.int64)
    written = np.where(first, lens, 0)
    # The slots each request at its first step reads its encoder tokens' keys from, by
    # its own block-table row (paged_attention's addressing); -1 past them.
    read = np.full((n, MAX_SOURCE_POSITIONS), rs.PAD_SLOT_ID, dtype=np.int64)
    for i in range(n):
        tokens = np.arange(written[i])
        read[i, : written[i]] = table[i, tokens // bs].astype(np.int64) * bs + tokens % bs
    out += [
        # The scheduler's: each request's encoder input (mm_position.length).
        Field("cross.encoder_lens", "requests", lens),
        Field("cross.kv_slots", "requests", read, (rs.PAD_SLOT_ID, pool * bs - 1)),
        # CrossAttentionImpl.forward: do_kv_cache_update of the encoder's keys at
        # slot_mapping (the builder's, its requests' in batch order), a row a request.
        Field("cross.slot_mapping", "requests",
              by_request(rs._np(c.slot_mapping).astype(np.int64), written),
              (rs.PAD_SLOT_ID, pool * bs - 1), agrees_with="cross.kv_slots"),
    ]  # fmt: skip
    return tuple(out)


def by_request(flat: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``flat`` cut into rows of ``counts`` entries, a row a request, -1 past them. Where
    ``flat`` does not hold ``sum(counts)`` entries, one row of all of it: no row of it
    can then be told a request's, and it agrees with no slots read."""
    if len(flat) != int(counts.sum()):
        return flat[None, :]
    rows = np.full((len(counts), MAX_SOURCE_POSITIONS), rs.PAD_SLOT_ID, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    for i, (start, n) in enumerate(zip(starts, counts, strict=True)):
        rows[i, :n] = flat[start : start + n]
    return rows


class EncoderDecoderRunnerStepEngine(rs.SlottedRunnerStepEngine):
    """``vllm``'s three engines, of an encoder-decoder model; the requests'
    cross-attention slots kept across the steps and shared by the three."""

    engine_type = _EncoderDecoderEngine


ENGINE = EncoderDecoderRunnerStepEngine()
"""The engine of the implementation ``vllm-v2-encoder-decoder`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v2-encoder-decoder``: the step on :data:`ENGINE`, kept
    across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant ----------------------------------------------------------------------------


@contextlib.contextmanager
def _rows_by_rank() -> Iterator[None]:
    """The defect: ``_get_cross_slot_mapping`` reading each writing request's blocks from
    the block-table row of its rank among the writers, not from its own row: a request
    at its first step behind one past it writes its encoder's keys into the other's
    cross-attention blocks, and reads its own unwritten."""
    from vllm.model_executor.layers.attention import cross_attention

    def wrong(encoder_seq_lens: np.ndarray, block_table_tensor: torch.Tensor,
              kv_cache_spec: Any, device: torch.device) -> torch.Tensor:  # fmt: skip
        bs = kv_cache_spec.block_size
        out = []
        for rank, i in enumerate(np.nonzero(encoder_seq_lens)[0]):
            tokens = torch.arange(int(encoder_seq_lens[i]), dtype=torch.int64, device=device)
            out.append(block_table_tensor[rank][tokens // bs] * bs + tokens % bs)
        return torch.cat(out) if out else torch.empty(0, dtype=torch.int64, device=device)

    with mock.patch.object(cross_attention, "_get_cross_slot_mapping", wrong):
        yield


_ROWS_BY_RANK = Mutated(EncoderDecoderRunnerStepEngine(), _rows_by_rank)


def rows_by_rank(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v2-encoder-decoder-rows-by-rank``: ``vllm-v2-encoder-decoder``
    with :func:`_rows_by_rank` in force."""
    return _ROWS_BY_RANK(inputs)


rows_by_rank.new_engine = _ROWS_BY_RANK.engine.new_engine  # type: ignore[attr-defined]


def reach_encoder_decoder(found: Trace | Case) -> bool:
    """An engine ``vllm-v2-encoder-decoder`` runs: V2, no drafts."""
    return found.config.runner == "v2" and found.config.num_spec == 0


def trigger_rows_by_rank(found: Trace | Case) -> bool:
    """A step with a request at its first step and one past it: the runner's batch may
    put the first behind the other (V2 orders a step's requests by its own rule)."""
    if not reach_encoder_decoder(found):
        return False
    for b in as_trace(found).steps:
        first = [c == 0 for c in b.num_computed_tokens]
        if any(first) and not all(first):
            return True
    return False


def smallest_rows_by_rank() -> Trace:
    """Request 0 prefills 2 tokens; then it decodes while request 1 arrives and prefills
    2: request 1's encoder keys belong in its own cross-attention blocks."""
    config = EngineConfig(max_model_len=32, max_num_seqs=2, max_num_batched_tokens=32,
                          block_size=4, cudagraph_capture_sizes=(1,),
                          cudagraph_mode="FULL_DECODE_ONLY", runner="v2")  # fmt: skip
    return Trace(
        config,
        (
            Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(2,)),
            Batch((2, 0), (1, 2), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 1),
                  prompt_lens=(2, 2)),
        ),
    )  # fmt: skip
