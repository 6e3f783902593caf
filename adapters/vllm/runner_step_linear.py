"""vLLM's model runner V1 step of a hybrid model whose linear-attention layer is of
another backend than GDN, as the implementations ``vllm-v1-mamba1``, ``vllm-v1-mamba2``,
``vllm-v1-ple-short-conv`` and ``vllm-v1-bailing-linear`` of ``runner-step``.

The engine of :mod:`.runner_step_hybrid` (a second KV-cache group of one linear layer,
a ``MambaSpec`` of ``mamba_cache_mode="none"``, ``1 + num_spec`` state blocks a request
above the attention pages), its layer one of:

- ``mamba2``: a Mamba2 layer (``MambaMixer2``) on ``Mamba2AttentionBackend``: the runner's
  ``_build_attention_metadata`` runs ``Mamba2AttentionMetadataBuilder.build`` (through
  ``BaseMambaAttentionMetadataBuilder._compute_common_metadata`` and
  ``_update_metadata_for_cudagraph_capture``, its chunk metadata for the SSD scan and
  the causal conv's program table) and ``build_for_cudagraph_capture``
  (``vllm/v1/attention/backends/mamba2_attn.py``, ``mamba_attn.py``); the model's chunk
  size is :data:`CHUNK_SIZE`;
- ``mamba1``: a Mamba1 layer (``MambaMixer``) on ``Mamba1AttentionBackend``:
  ``Mamba1AttentionMetadataBuilder.build`` is the base builder's
  ``_compute_common_metadata`` (no chunks of its own: the model has no chunk size,
  ``ModelConfig.get_mamba_chunk_size``'s 2048); its state has no rows for drafts, so a
  config that drafts is declined (:func:`declines_mamba1`);
- ``ple-short-conv``: the PLE short-conv layer (``models/qwen4_exp``'s
  ``PleShortConvLayer``) on ``PleShortConvAttentionBackend``: its builder's ``build``
  (a speculative split of its own, ``_build_non_spec_metadata`` through the base
  builder otherwise) and ``build_for_cudagraph_capture``
  (``vllm/v1/attention/backends/short_conv_attn.py``).

Every field of the builder's metadata that the layer's kernels read is reported (as
``mamba2.*`` or ``short_conv.*``), with the range its kernel accepts, and judged by the
step's properties beside the attention layer's. Both builders support FULL graphs of
uniform batches only (``AttentionCGSupport.UNIFORM_BATCH``): a FULL mode becomes
FULL_AND_PIECEWISE, as for GDN.

Declined beyond ``vllm-v1``: the steps ``vllm-v1-hybrid`` declines (a first chunk in a
uniform batch a FULL graph replays, built as a prefill, the graph's buffers left
stale: ``BaseMambaAttentionMetadataBuilder._compute_common_metadata`` keeps a first
prompt chunk a prefill as GDN's builder does).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import PAD_SLOT_ID
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

NULL_BLOCK_ID = hybrid.NULL_BLOCK_ID
CHUNK_SIZE = 8  # the Mamba2 model's chunk size (hf config chunk_size): chunks of a prompt
CONV_BLOCK_M = 8  # compute_causal_conv1d_metadata's BLOCK_M: tokens a conv program covers


@dataclass(frozen=True)
class LinearBackend:
    """One linear-attention layer: its backend, its ``MambaSpec``'s state shapes (of
    ``num_spec``) and ``mamba_type``, and the fields of its metadata a kernel reads."""

    name: str  # the implementation's suffix, and its fields' prefix
    backend: str  # module:class of the attention backend
    mamba_type: str  # MambaAttentionBackendEnum's member
    shapes: Callable[[int], tuple[tuple[int, ...], ...]]
    fields: Callable[[EngineConfig, Any, int, int], list[tuple[str, str, Any]]]
    # The state index its decode kernels skip (a padding row's): the null block for
    # the conv kernels, PAD_SLOT_ID for the lightning-attention ones.
    skipped_state: int = NULL_BLOCK_ID

    def backend_class(self) -> type:
        module, cls = self.backend.split(":")
        return getattr(importlib.import_module(module), cls)


def _mamba2_fields(config: EngineConfig, m: Any, tokens_pad: int, pool: int) -> list:
    """(name, rows, accepts) of every tensor of ``Mamba2AttentionMetadata`` a kernel
    reads: ``MambaMixer2.forward`` (``model_executor/layers/mamba/mamba_mixer2.py``) and
    the kernels it hands them to."""
    states = (NULL_BLOCK_ID, pool - 1)
    out = []
    if m.num_decodes:  # forward's "if has_decode" reads these
        out += [
            # ops/causal_conv1d.py _causal_conv1d_update_kernel: a state index is a line
            # of the conv state cache (every block of the pool), null_block_id skipping
            # the row; selective_state_update reads the SSM state at the same index.
            ("state_indices_tensor_d", "requests", states),
            # ... a sequence's tokens are x[qsl[i] : qsl[i + 1]] of the decode tokens.
            ("query_start_loc_d", "offsets", (0, tokens_pad)),
            # ... the conv state is read from offset accepted - 1 on (and
            # selective_state_update's state at accepted - 1), but only for a row of a
            # non-empty query: a padding request's row (an empty query, its count
            # diff(query_start_loc) = 0 in a capture or dummy run's build) returns
            # first. No range holds every row: compared across builds only.
            ("num_accepted_tokens", "requests", None),
        ]
    if m.num_prefills:  # ... and "if has_prefill" these
        prefills = m.num_prefills
        chunks = max(len(m.cu_chunk_seqlen_p) - 1, 1)
        out += [
            # _causal_conv1d_fwd_kernel: as the decode's state indices; the SSD scan
            # writes each sequence's final state at the same index.
            ("state_indices_tensor_p", "requests", states),
            ("query_start_loc_p", "offsets", (0, tokens_pad)),
            # A mask: causal_conv1d_fn and the SSD scan's initial states.
            ("has_initial_states_p", "requests", None),
            # ops/ssd_combined.py mamba_chunk_scan_combined_varlen: chunk c's tokens are
            # cu_chunk_seqlens[c] : cu_chunk_seqlens[c + 1] of the prefill tokens, of
            # sequence seq_idx[c]. A chunk holds a token at least, so there are no
            # more chunks than tokens (rows "tokens": the real rows cover the chunks).
            ("cu_chunk_seqlen_p", "tokens", (0, tokens_pad)),
            ("seq_idx_p", "tokens", (0, prefills - 1)),
            # ops/ssd_state_passing.py _state_passing_fwd_kernel: sequence i's chunks
            # end at last_chunk_indices[i] + 1 and start after sequence i - 1's; a
            # sequence of no chunk (an empty query: a padding request) repeats the
            # previous one's, -1 before any chunk.
            ("last_chunk_indices_p", "requests", (-1, chunks - 1)),
            # _causal_conv1d_fwd_kernel: program p convolves the
            # token_chunk_offset_ptr[p]-th BLOCK_M tokens of prefill sequence
            # batch_ptr[p]; pad_slot_id (-1) ends a program (no more programs than
            # tokens).
            ("batch_ptr", "tokens", (PAD_SLOT_ID, prefills - 1)),
            ("token_chunk_offset_ptr", "tokens",
             (PAD_SLOT_ID, -(-tokens_pad // CONV_BLOCK_M) - 1)),
        ]  # fmt: skip
    return out


def _mamba1_fields(config: EngineConfig, m: Any, tokens_pad: int, pool: int) -> list:
    """(name, rows, accepts) of every tensor of ``Mamba1AttentionMetadata`` a kernel reads:
    ``MambaMixer.forward`` (``model_executor/layers/mamba/mamba_mixer.py``) and the
    kernels it hands them to, each range as :func:`_mamba2_fields` reads it of the same
    kernel."""
    states = (NULL_BLOCK_ID, pool - 1)
    out = []
    if m.num_decodes:  # forward's "if has_decode": causal_conv1d_update and
        # selective_state_update read and write the state at each decode's index.
        out.append(("state_indices_tensor_d", "requests", states))
    if m.num_prefills:  # ... and "if has_prefill"
        prefills = m.num_prefills
        # Mamba1's builder computes no chunks (Mamba2's does): a field the metadata
        # leaves None is no field (linear_fields reports tensors only).
        cu_chunks = m.cu_chunk_seqlen_p
        chunks = 1 if cu_chunks is None else max(len(cu_chunks) - 1, 1)
        out += [
            # causal_conv1d_fn (its metadata the builder's) and selective_scan_fn.
            ("state_indices_tensor_p", "requests", states),
            ("query_start_loc_p", "offsets", (0, tokens_pad)),
            ("has_initial_states_p", "requests", None),
            # selective_scan_fn: chunk c's tokens, and each sequence's last chunk.
            ("cu_chunk_seqlen_p", "tokens", (0, tokens_pad)),
            ("last_chunk_indices_p", "requests", (-1, chunks - 1)),
            # _causal_conv1d_fwd_kernel's program table, as Mamba2's.
            ("batch_ptr", "tokens", (PAD_SLOT_ID, prefills - 1)),
            ("token_chunk_offset_ptr", "tokens",
             (PAD_SLOT_ID, -(-tokens_pad // CONV_BLOCK_M) - 1)),
        ]  # fmt: skip
    return out


def _ple_short_conv_fields(config: EngineConfig, m: Any, tokens_pad: int, pool: int) -> list:
    """(name, rows, accepts) of every tensor of ``PleShortConvAttentionMetadata`` a
    kernel reads: ``PleShortConvLayer._short_conv_dilated_dispatch``
    (``models/qwen4_exp/nvidia/ple_layer.py``) and ``ple_conv``
    (``models/qwen4_exp/common/ops/ple.py``)."""
    states = (NULL_BLOCK_ID, pool - 1)
    spec = m.spec_sequence_masks is not None
    out = []
    if spec:  # the dispatch's "if has_spec" reads these
        out += [
            # ple_conv: a state index is a line of the conv state cache, NULL_STATE_ID
            # (NULL_BLOCK_ID) an inactive row.
            ("spec_state_indices_tensor", "requests", states),
            # ... a sequence's tokens are x[qsl[i] : qsl[i + 1]] of the token rows.
            ("spec_query_start_loc", "offsets", (0, tokens_pad)),
            # ... mode "spec": the conv state from offset accepted - 1, clamped to
            # [0, spec_query_len - 1] (_ple_conv_*_kernel): any count is safe.
            ("num_accepted_tokens", "requests", None),
            ("spec_sequence_masks", "requests", None),  # a mask
        ]
    if m.num_decodes or m.num_prefills:  # ... "if has_non_spec" these
        # The non-speculative decodes' then prefills' state indices, split by the layer.
        out.append(("state_indices_tensor", "requests", states))
        if spec:  # ... token_indices: the token rows of each kind (a mixed batch)
            out += [
                ("spec_token_indx", "tokens", (0, tokens_pad - 1)),
                ("non_spec_token_indx", "tokens", (0, tokens_pad - 1)),
            ]
    if m.num_decodes:
        out.append(("has_initial_states_d", "requests", None))  # a mask
    if m.num_prefills:
        out += [
            ("query_start_loc_p", "offsets", (0, tokens_pad)),
            ("has_initial_states_p", "requests", None),  # a mask
        ]
    return out


def _bailing_linear_fields(config: EngineConfig, m: Any, tokens_pad: int, pool: int) -> list:
    """(name, rows, accepts) of every tensor of ``BailingLinearAttentionMetadata`` a
    kernel reads: ``BailingLinearAttention._forward`` and its decode and prefill paths
    (``model_executor/layers/mamba/linear/bailing_linear_attn.py``)."""
    out = []
    if m.num_decodes:
        out += [
            # _decode_infer: with drafts, _bailing_linear_attn_decode_spec_step_kernel
            # reads state_indices_tensor_d[i, j] (j < 1 + num_spec) as the slot it reads
            # and writes, a slot of -1 skipped; without, lightning_attn.py's
            # _linear_attn_decode_kernel reads the 1-D rows, pad_slot_id skipped.
            ("state_indices_tensor_d", "requests", (PAD_SLOT_ID, pool - 1)),
            # ... the legacy 1-D rows, handed to the decode without drafts.
            ("state_indices_tensor", "requests", (PAD_SLOT_ID, pool - 1)),
            # ... request i's tokens are q[qsl[i] : qsl[i + 1]] of the decode tokens.
            ("query_start_loc_d", "offsets", (0, tokens_pad)),
            # ... the accepted offset clamped to [0, state width - 1]: any count is safe.
            ("num_accepted_tokens", "requests", None),
        ]
    if m.num_prefills:
        out += [
            # clear_linear_attention_cache_for_new_sequences and
            # linear_attention_prefill_and_mix: kv_cache[slot_id] of a prefill, no slot
            # skipped (-1 would be the pool's last line).
            ("state_indices_tensor_p", "requests", (NULL_BLOCK_ID, pool - 1)),
            # ... prefill i's tokens are q[qsl[d + i] : qsl[d + i + 1]] (d decodes first).
            ("query_start_loc", "offsets", (0, tokens_pad)),
        ]
    return out


BACKENDS = {
    b.name: b
    for b in (
        LinearBackend(
            "mamba2",
            "vllm.v1.attention.backends.mamba2_attn:Mamba2AttentionBackend",
            "MAMBA2",
            # The conv state (width - 1 + num_spec rows; width 4), the SSM state
            # (heads, head dim, state dim); their sizes reach no metadata.
            lambda num_spec: ((3 + num_spec, 8), (2, 4, 4)),
            _mamba2_fields,
        ),
        LinearBackend(
            "mamba1",
            "vllm.v1.attention.backends.mamba1_attn:Mamba1AttentionBackend",
            "MAMBA1",
            # MambaStateShapeCalculator.mamba1_state_shape: the conv state (width - 1
            # rows, no rows for drafts) and the SSM state; their sizes reach no metadata.
            lambda num_spec: ((3, 8), (8, 4)),
            _mamba1_fields,
        ),
        LinearBackend(
            "ple-short-conv",
            "vllm.v1.attention.backends.short_conv_attn:PleShortConvAttentionBackend",
            "SHORT_CONV",
            # MambaStateShapeCalculator.short_conv_state_shape: the conv state alone.
            lambda num_spec: ((3 + num_spec, 8),),
            _ple_short_conv_fields,
        ),
        LinearBackend(
            "bailing-linear",
            "vllm.v1.attention.backends.linear_attn:BailingLinearAttentionBackend",
            "LINEAR",
            # MambaStateShapeCalculator.linear_attention_state_shape: (heads, head dim,
            # head dim), the state alone; its size reaches no metadata.
            lambda num_spec: ((1, 4, 4),),
            _bailing_linear_fields,
            skipped_state=PAD_SLOT_ID,
        ),
    )
}


def prepare() -> None:
    """Import vLLM's V1 runner and the linear backends before a judge forks."""
    hybrid.prepare()
    for b in BACKENDS.values():
        b.backend_class()


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1-hybrid``, whose finding
    ``vllm-v1-hybrid-prefill-in-decode-graph`` these builders share: a uniform batch a
    FULL graph replays, holding a first chunk the builder builds as a prefill
    (``BaseMambaAttentionMetadataBuilder._compute_common_metadata`` keeps a first prompt
    chunk a prefill; with drafts, a request of next_n prompt tokens beside speculative
    decodes), stages nothing in the graph's buffers, so the replay reads stale state
    indices."""
    if hybrid.prefill_in_decode_graph(case.config, case.batch):
        return (
            "a first chunk in a uniform batch a FULL graph replays: the linear layer's "
            "builder builds it as a prefill, the graph's buffers stale (as "
            "vllm-v1-hybrid-prefill-in-decode-graph)"
        )
    return v1.declines(case)


def declines_mamba1(case: Case) -> str | None:
    """Why the Mamba1 engine does not run ``case``: as :func:`declines`, and a config that
    drafts: a Mamba1 layer's state has no rows for drafts
    (``MambaStateShapeCalculator.mamba1_state_shape`` takes no ``num_spec``) and
    ``MambaMixer.forward`` decodes one token a request (``causal_conv1d_update``,
    ``selective_state_update``, no accepted counts read)."""
    if case.config.num_spec:
        return (
            f"num_spec {case.config.num_spec}: a Mamba1 layer's state has no rows for drafts "
            "(mamba_utils.py MambaStateShapeCalculator.mamba1_state_shape; "
            "mamba_mixer.py MambaMixer.forward decodes one token a request)"
        )
    return declines(case)


def declines_bailing_linear(case: Case) -> str | None:
    """Why the Bailing engine does not run ``case``: as ``vllm-v1``. Unlike the conv
    backends', its builder splits a step by ``split_decodes_and_prefills`` alone, so a
    first chunk of ``next_n`` tokens in a uniform batch is a decode it stages in the
    FULL graph's buffers (``vllm-v1-hybrid``'s finding is not its)."""
    return v1.declines(case)


def _mamba2_state_by_request(m: Any) -> torch.Tensor:
    """``MambaMixer2.forward``: the decodes' rows (``state_indices_tensor_d``, its first
    column the state read) then the prefills' (``state_indices_tensor_p``), as the
    runner's reorder puts decodes first."""
    decode = m.state_indices_tensor_d[:, 0]
    return torch.cat((decode, m.state_indices_tensor_p.to(decode.dtype)))


def _ple_state_by_request(m: Any) -> torch.Tensor:
    """``PleShortConvLayer._short_conv_dilated_dispatch``: without speculative rows,
    ``state_indices_tensor`` (decodes then prefills); with only speculative rows (a
    FULL graph's padding included), ``spec_state_indices_tensor``; in a mixed batch the
    speculative rows' in ``spec_state_indices_tensor`` and the others' in
    ``state_indices_tensor``, one-token decodes first, then prefills, each in row
    order (``build``'s ``non_spec_req_idx``); a row of neither (an empty query) is read
    by no kernel, shown as the null block."""
    if m.spec_sequence_masks is None:
        return m.state_indices_tensor
    if not m.num_decodes and not m.num_prefills:
        return m.spec_state_indices_tensor
    spec = m.spec_sequence_masks.to(torch.bool)
    q = torch.diff(m.query_start_loc)[: len(spec)]
    out = torch.full((len(spec),), NULL_BLOCK_ID, dtype=m.state_indices_tensor.dtype)
    out[spec] = m.spec_state_indices_tensor[: int(spec.sum())].to(out.dtype)
    decodes = (~spec & (q == 1)).nonzero()[:, 0]
    prefills = (~spec & (q > 1)).nonzero()[:, 0]
    out[torch.cat((decodes, prefills))] = m.state_indices_tensor
    return out


def _bailing_state_by_request(m: Any) -> torch.Tensor:
    """``BailingLinearAttention._forward``: the decodes' rows (``state_indices_tensor_d``,
    its first column the state read) then the prefills' (``state_indices_tensor_p``),
    as the runner's reorder puts decodes first."""
    decode = m.state_indices_tensor_d
    decode = decode[:, 0] if decode.dim() > 1 else decode
    return torch.cat((decode, m.state_indices_tensor_p.to(decode.dtype)))


def _mamba1_state_by_request(m: Any) -> torch.Tensor:
    """``MambaMixer.forward``: the decodes' rows (``state_indices_tensor_d``) then the
    prefills' (``state_indices_tensor_p``), as the runner's reorder puts decodes first."""
    decode = m.state_indices_tensor_d
    if decode is None:
        return m.state_indices_tensor_p
    decode = decode[:, 0] if decode.dim() > 1 else decode
    if m.state_indices_tensor_p is None:
        return decode
    return torch.cat((decode, m.state_indices_tensor_p.to(decode.dtype)))


_STATE_BY_REQUEST = {
    "mamba1": _mamba1_state_by_request,
    "mamba2": _mamba2_state_by_request,
    "ple-short-conv": _ple_state_by_request,
    "bailing-linear": _bailing_state_by_request,
}


class _LinearEngine(hybrid._HybridEngine):
    """A V1 runner whose model has an attention layer and a linear layer of ``linear``."""

    def __init__(
        self, config: EngineConfig, device: torch.device, mode: str, linear: LinearBackend
    ) -> None:
        self.linear = linear
        super().__init__(config, device, mode)

    def linear_group(self) -> tuple[type, Any]:
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
        from vllm.v1.kv_cache_interface import MambaSpec

        if self.linear.name == "mamba2":
            # ModelConfig.get_mamba_chunk_size: the hf config's chunk_size (Mamba2's),
            # on this engine's copy (the model config's copy shares its hf config).
            model = self.vllm_config.model_config
            model.hf_text_config = copy.copy(model.hf_text_config)
            model.hf_text_config.chunk_size = CHUNK_SIZE
        shapes = self.linear.shapes(self.config.num_spec)
        spec = MambaSpec(
            block_size=self.config.max_model_len,
            shapes=shapes,
            dtypes=(torch.float32,) * len(shapes),
            mamba_type=MambaAttentionBackendEnum[self.linear.mamba_type],
            mamba_cache_mode="none",
            num_speculative_blocks=self.config.num_spec,
        )
        return self.linear.backend_class(), spec

    def linear_fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        m = seen.linear
        if m is None:
            return ()
        tokens_pad = int(seen.positions.shape[0])
        prefix = self.linear.name.replace("-", "_").removeprefix("ple_")
        # Each request's state line, in the step's rows: the builder splits them by kind
        # (decode, prefill, speculative) into fields a build of another split lacks (a
        # graph replaying a decode where the eager build has a prefill).
        states = (min(NULL_BLOCK_ID, self.linear.skipped_state), self.pool_size() - 1)
        # Each state index names the line the layer's kernels read and update in place
        # (Field.writes_state); the null block is no request's (the kernels skip it).
        by_request = _STATE_BY_REQUEST[self.linear.name](m)
        out = [Field(
            f"{prefix}.state_by_request", "requests", v1._np(by_request), states,
            writes_state=True, null_slot=NULL_BLOCK_ID,
        )]  # fmt: skip
        for name, rows, accepts in self.linear.fields(self.config, m, tokens_pad, self.pool_size()):
            value = getattr(m, name, None)
            if isinstance(value, torch.Tensor):
                state = "state_indices" in name  # every such field of these builders
                out.append(Field(
                    f"{prefix}.{name}", rows, v1._np(value), accepts, writes_state=state,
                    null_slot=NULL_BLOCK_ID if state else None,
                ))  # fmt: skip
        return tuple(out)


class LinearRunnerStepEngine(hybrid.HybridRunnerStepEngine):
    """``vllm-v1-hybrid``'s three engines, their linear layer of ``linear``."""

    def __init__(self, linear: LinearBackend) -> None:
        self.linear = linear
        super().__init__()

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> v1._Engine:
        made = _LinearEngine(config, device, mode, self.linear)
        made.states = self.states
        return made


ENGINES = {name: LinearRunnerStepEngine(b) for name, b in BACKENDS.items()}
"""The engine of each implementation ``vllm-v1-<name>``, kept across calls."""


def run_mamba2(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-mamba2`` of ``runner-step``: the step on its engine,
    kept across calls; ``run_mamba2.new_engine()`` drops it."""
    return ENGINES["mamba2"](inputs)


def run_mamba1(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-mamba1`` of ``runner-step``, as :func:`run_mamba2`."""
    return ENGINES["mamba1"](inputs)


def run_ple_short_conv(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-ple-short-conv`` of ``runner-step``, as
    :func:`run_mamba2`."""
    return ENGINES["ple-short-conv"](inputs)


def run_bailing_linear(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-bailing-linear`` of ``runner-step``, as
    :func:`run_mamba2`."""
    return ENGINES["bailing-linear"](inputs)


run_mamba1.new_engine = ENGINES["mamba1"].new_engine  # type: ignore[attr-defined]
run_mamba2.new_engine = ENGINES["mamba2"].new_engine  # type: ignore[attr-defined]
run_ple_short_conv.new_engine = ENGINES["ple-short-conv"].new_engine  # type: ignore[attr-defined]
run_bailing_linear.new_engine = ENGINES["bailing-linear"].new_engine  # type: ignore[attr-defined]


# -- mutants: a builder's FULL-graph staging with one line changed.


def _mamba2_pad_slot(meta: Any, builder: Any, common: Any) -> Any:
    """The runner's padding requests (empty queries) of a FULL decode staged with
    PAD_SLOT_ID (-1) as their state indices, not the null block (Mamba's padding
    before the null block was PAD_SLOT_ID): ``causal_conv1d_update`` skips only
    null_block_id, so it reads line -1."""
    staged = meta.state_indices_tensor_d
    if staged is not None and staged.data_ptr() == builder.state_indices_tensor_d.data_ptr():
        empty = torch.diff(common.query_start_loc_cpu)[: staged.shape[0]] == 0
        staged[empty] = PAD_SLOT_ID
    return meta


def _ple_pad_slot(meta: Any, builder: Any, common: Any) -> Any:
    """``PleShortConvAttentionMetadataBuilder.build``'s padding rows of a FULL
    speculative decode's ``spec_state_indices_tensor`` filled with PAD_SLOT_ID (-1),
    not NULL_BLOCK_ID: ``ple_conv`` skips only NULL_STATE_ID, so it writes line -1."""
    staged = meta.spec_state_indices_tensor
    if staged is not None and staged.data_ptr() == builder.spec_state_indices_tensor.data_ptr():
        staged[meta.num_spec_decodes :] = PAD_SLOT_ID
    return meta


def _bailing_last_state_padded(meta: Any, builder: Any, common: Any) -> Any:
    """``BailingLinearAttentionMetadataBuilder.build``'s FULL-graph staging with its
    last real decode's state indices PAD_SLOT_ID (-1), as a padding row's: the
    lightning-attention decode skips it, its state neither read nor written."""
    staged = meta.state_indices_tensor_d
    if staged.data_ptr() not in (
        builder.decode_state_indices_tensor.data_ptr(),
        builder.decode_legacy_state_indices_tensor.data_ptr(),
    ):
        return meta
    real = (staged if staged.dim() == 1 else staged[:, 0]) != PAD_SLOT_ID
    if real.any():
        last = int(real.nonzero()[-1, 0])
        staged[last] = PAD_SLOT_ID
        meta.state_indices_tensor[last] = PAD_SLOT_ID
    return meta


_MUTATED = {
    "mamba2": (
        "vllm.v1.attention.backends.mamba2_attn:Mamba2AttentionMetadataBuilder",
        "build",
        _mamba2_pad_slot,
    ),
    "ple-short-conv": (
        "vllm.v1.attention.backends.short_conv_attn:PleShortConvAttentionMetadataBuilder",
        "build",
        _ple_pad_slot,
    ),
    "bailing-linear": (
        "vllm.v1.attention.backends.linear_attn:BailingLinearAttentionMetadataBuilder",
        "build",
        _bailing_last_state_padded,
    ),
}


@contextlib.contextmanager
def _mutated(name: str) -> Iterator[None]:
    where, method, change = _MUTATED[name]
    module, cls = where.split(":")
    owner = getattr(importlib.import_module(module), cls)
    original = getattr(owner, method)

    def mutated(self: Any, *args: Any, **kwargs: Any) -> Any:
        # build(common_prefix_len, common_attn_metadata, ...), positional or named
        common = kwargs["common_attn_metadata"] if len(args) < 2 else args[1]
        return change(original(self, *args, **kwargs), self, common)

    with mock.patch.object(owner, method, mutated):
        yield


class _Mutated:
    """An engine of ``name``'s backend whose builder ``_MUTATED[name]`` changes."""

    def __init__(self, name: str) -> None:
        self.name, self.engine = name, LinearRunnerStepEngine(BACKENDS[name])

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        with _mutated(self.name):
            return self.engine(inputs)


_MUTANTS = {name: _Mutated(name) for name in _MUTATED}


def mamba2_pad_slot_states(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-mamba2-pad-slot-states``: a FULL decode's padding requests' Mamba2
    state indices hold -1 (safe padding)."""
    return _MUTANTS["mamba2"](inputs)


def ple_short_conv_pad_slot_states(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-ple-short-conv-pad-slot-states``: a FULL speculative decode's padding
    rows of the PLE short conv's state indices hold -1 (safe padding)."""
    return _MUTANTS["ple-short-conv"](inputs)


def bailing_linear_last_state_padded(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-bailing-linear-last-state-padded``: a FULL decode's last real request's
    Bailing state indices hold -1 (replay equals eager, padding invariance)."""
    return _MUTANTS["bailing-linear"](inputs)


for _run, _name in ((mamba2_pad_slot_states, "mamba2"),
                    (ple_short_conv_pad_slot_states, "ple-short-conv"),
                    (bailing_linear_last_state_padded, "bailing-linear")):  # fmt: skip
    _run.new_engine = _MUTANTS[_name].engine.new_engine  # type: ignore[attr-defined]


# The mutants' trace: a FULL decode the graph replays (shared with runner_step_mla's).
trigger_full_decode = hybrid.trigger_full_decode
smallest_full_decode = hybrid.smallest_full_decode
