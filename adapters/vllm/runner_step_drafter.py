"""vLLM's V1 drafter run whole after the target step, for the implementation ``vllm-v1`` of
``runner-step`` (:mod:`.runner_step_v1`).

After ``execute_model``, vLLM 0.33.0's V1 runner proposes the next step's drafts in
``sample_tokens``: with an EAGLE/MTP drafter and the padded drafter batch (the
``SpeculativeConfig`` default, ``disable_padded_drafter_batch=False``), if the step fits
in the drafter (``GPUModelRunner._input_fits_in_drafter``, against the draft model's
length limit, the case's as ``SpeculativeConfig`` derives it) it calls
``GPUModelRunner.propose_draft_token_ids`` on the GPU sampled tokens (the rejection
sampler's); else one of several data-parallel ranks runs the drafter's dummy run. What
runs unchanged, on the runner's own ``EagleProposer`` (``vllm/v1/spec_decode/eagle.py``,
``llm_base_proposer.py``) made by the runner's constructor:

- ``GPUModelRunner.propose_draft_token_ids`` and ``_input_fits_in_drafter``;
- ``SpecDecodeBaseProposer``: ``__init__``, ``initialize_cudagraph_keys``,
  ``initialize_attn_backend`` (its own ``TritonAttentionMetadataBuilder`` for the draft
  layer), ``prepare_next_token_ids_padded``, ``prepare_inputs_padded``, ``propose`` (the
  first pass, ``set_inputs_first_pass``, the draft loop,
  ``_update_positions_dependent_metadata``, ``build_per_group_and_layer_attn_metadata``
  for each draft sub-step, ``_determine_batch_execution_and_padding`` with the
  data-parallel all-reduce, ``_get_slot_mapping``, greedy sampling) and ``dummy_run``
  (in the runner's capture and dummy runs); their Triton kernels
  (``vllm/v1/spec_decode/utils.py``) under the Triton interpreter.

Stood in, as ``load_model`` would make them:

- the draft model: a module that records what each draft forward reads (the forward
  context's attention metadata and slot mapping of the draft layer, the positions) and
  returns zero hidden states (a pair for the MTP models that return one,
  ``model_returns_tuple``) and zero logits; its attention layer (``_DraftLayer``, in
  the static forward context, one more layer of the target's KV-cache group as an MTP
  layer is) names the Triton backend;
- nothing of the sampler: ``sample_tokens`` runs whole (:mod:`.runner_step_v1`), V1's
  ``RejectionSampler`` deciding from the target's logits, which the stand-in model
  makes so that greedy sampling accepts the drafts the step accepts (:func:`accepted`:
  the trace's ``rejected``, the same on every engine); the draft model's logits pick
  the draft token the next step's scheduler output carries;
- the data-parallel peer's drafter: its dispatch (``_determine_batch_execution_and_padding``
  of its own drafter, as rank 1) on the peer's step sizes (first pass: its tokens;
  draft sub-steps: its requests), as :func:`.runner_step._peer` derives the peer.

Each draft forward is a build of the step with ``draft`` its sub-step (0: the first
pass over the step's tokens; ``k >= 1``: one token per request); its real sizes are
the step's requests and the sub-step's tokens (the padded drafter batch keeps a
rejected draft's token as a row of the first pass). The draft model's graphs are
piecewise (``initialize_cudagraph_keys``): attention runs outside them, so a draft
sub-step has no replay.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.runner_step import RunnerStepInputs

DRAFT_LAYER = "model.layers.2.self_attn.attn"
"""The MTP draft layer's name: the layer after the tiny model's two (``num_hidden_layers``)."""

WHERE = "v1/spec_decode/llm_base_proposer.py: SpecDecodeBaseProposer.propose"


def _draft_layer(vllm_config: Any, spec: Any = None) -> Any:
    """The draft model's attention layer, its backend the target's (Triton)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    return draft_layer(vllm_config, TritonAttentionBackend, spec)


def draft_layer(vllm_config: Any, backend: type, spec: Any = None) -> Any:
    """The draft model's attention layer, as the static forward context holds it: its
    backend ``backend`` (the target's: the drafter's ``initialize_attn_backend`` asks
    it), its heads the model's, its KV-cache spec ``spec`` (None: the target's
    KV-cache group holds the layer, which the worker's ``KVCacheConfig`` says)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class DraftLayer(AttentionLayerBase):
        num_heads = vllm_config.model_config.get_num_attention_heads(vllm_config.parallel_config)

        def get_attn_backend(self) -> type:
            return backend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return spec

    return DraftLayer()


class DraftModel(torch.nn.Module):
    """The draft model: reports each forward to ``seen`` (the recorder's hook) and returns
    zero hidden states (two of them where the MTP model returns a pair)."""

    def __init__(self, seen: Any, hidden_size: int, returns_pair: bool) -> None:
        super().__init__()
        self.seen = seen
        self.hidden_size = hidden_size
        self.returns_pair = returns_pair

    def forward(
        self,
        input_ids: Any = None,
        positions: Any = None,
        hidden_states: Any = None,
        inputs_embeds: Any = None,
    ) -> Any:
        self.seen(positions)
        out = torch.zeros(positions.shape[-1], self.hidden_size)  # M-RoPE's: a row a channel
        return (out, out.clone()) if self.returns_pair else out

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden_states.shape[0], 1)


def speculative_config(base: Any, config: EngineConfig, padded: bool = True) -> Any:
    """A copy of the cached ``SpeculativeConfig`` for ``config``'s engine: its draft
    model's length limit derived from the case's (as ``SpeculativeConfig`` derives it
    from the target's, ``_maybe_override_draft_max_model_len``), which the runner's
    ``_input_fits_in_drafter`` reads; ``padded`` False sets
    ``disable_padded_drafter_batch`` (the unpadded drafter batch)."""
    from vllm.config import SpeculativeConfig

    out = copy.copy(base)
    out.disable_padded_drafter_batch = not padded
    draft = out.draft_model_config = copy.copy(base.draft_model_config)
    draft.max_model_len = SpeculativeConfig._maybe_override_draft_max_model_len(
        None, draft.max_model_len, config.max_model_len
    )
    return out


def install(runner: Any, recorder: Any) -> None:
    """What ``load_model`` gives the runner's drafter, before ``initialize_kv_cache``: the
    draft model (reporting to ``recorder.draft_forward``) and its attention layer. Its
    dummy runs tell ``recorder`` they run (``drafting``: their all-reduces meet the peer's
    drafter)."""
    drafter = runner.drafter
    layers = drafter.vllm_config.compilation_config.static_forward_context
    layers[DRAFT_LAYER] = _draft_layer(drafter.vllm_config)
    drafter._draft_attn_layer_names = {DRAFT_LAYER}
    drafter.model = DraftModel(recorder.draft_forward, drafter.hidden_size, False)
    drafter.model.returns_pair = drafter.model_returns_tuple()
    dummy_run = drafter.dummy_run

    def reported(*args: Any, **kwargs: Any) -> None:
        recorder.drafting = True
        try:
            dummy_run(*args, **kwargs)
        finally:
            recorder.drafting = False

    drafter.dummy_run = reported


def accepted(inputs: RunnerStepInputs, drafts: dict[str, list[int]]) -> dict[str, int]:
    """How many of its drafts each request of the step accepts: the trace's (its drafts
    less those it rejects, ``num_rejected``), on every engine of the step alike."""
    rejected = inputs.num_rejected or (0,) * inputs.num_reqs
    out = {}
    for rid, x in zip(inputs.req_ids, rejected, strict=True):
        d = len(drafts.get(str(rid), ()))
        out[str(rid)] = d - min(x, d)
    return out


def first_pass_tokens(out: Any, taken: dict[str, int], padded: bool) -> int:
    """The real tokens of the first draft pass: the step's; in an unpadded drafter batch
    less each request's rejected drafts (``prepare_inputs``)."""
    total = out.total_num_scheduled_tokens
    if padded:
        return total
    drafts = out.scheduled_spec_decode_tokens
    return total - sum(len(d) - taken[rid] for rid, d in drafts.items() if d)


def peer_columns(runner: Any, collect: Any, sizes: tuple[int, ...]) -> None:
    """Run the peer's drafter dispatch (its own ``_determine_batch_execution_and_padding``,
    as rank 1 of two, the runner's parallel config already so) once for each of ``sizes``
    tokens, its all-reduce answered by ``collect``, which keeps the peer's column and
    raises ``stop``."""
    drafter = runner.drafter
    rank, drafter.dp_rank = drafter.dp_rank, 1
    try:
        for n in sizes:
            with contextlib.suppress(collect.stop):
                drafter._determine_batch_execution_and_padding(n)
    finally:
        drafter.dp_rank = rank
