"""The V2 drafter's ``max_seq_len`` on each release, for :mod:`.max_seq_len` (bug D).

The V2 model runner builds its drafter with ``init_speculator``
(``vllm/v1/worker/gpu/spec_decode/__init__.py``), and so does this module: the
drafter it returns for the tiny model's MTP config is the one this release runs.
Two families, found by looking (:mod:`.compat`), never by version:

- ``EagleSpeculator`` (``spec_decode/eagle/speculator.py``, where there is no
  ``spec_decode/speculator.py``: vLLM 0.21.0 to 0.22.1, whose ``use_eagle()``
  covers "mtp"). Its decode steps (``multi_step_decode``) build their metadata
  with ``_build_draft_attn_metadata(num_reqs, num_reqs_padded, num_tokens_padded)``,
  which passes ``max_seq_len=self.max_model_len``: the draft half of #43991,
  unfixed. ``propose`` computes nothing that bound reads, so it is not run.
- ``MTPSpeculator`` (``spec_decode/mtp/speculator.py``) on ``DraftModelSpeculator``
  (``spec_decode/speculator.py``), through ``AutoRegressiveSpeculator`` or
  ``TargetDependentARSpeculator``: ``propose`` sets ``draft_max_seq_len =
  min(max(seq_lens_cpu_upper_bound[:num_reqs]) + num_spec, max_model_len)``
  before its first call (``_copy_request_inputs``, where it is stopped), and the
  decode steps hand it to ``build_attn_metadata`` through the builder the release
  has: ``_build_uniform_attn_metadata(batch_desc, ...)`` where it exists, else
  ``_build_draft_attn_metadata(num_reqs, num_reqs_padded, num_tokens_padded)``,
  with ``seq_lens_cpu_upper_bound=`` and ``step=`` where it takes them.

The draft's decode steps run one token per request, a full graph of ``R_pad``
requests when the step is padded (``dispatch_cg_and_sync_dp`` with
``uniform_token_count=1``), as every release's decode loop calls its builder.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from attnfuzz.adapters.vllm import compat


class Stop(Exception):
    """Raised where ``propose`` leaves the bound for the draft's forward pass."""


def _stop(*args: Any, **kwargs: Any) -> None:
    raise Stop


def has_draft_max_seq_len() -> bool:
    """The drafter computes a draft bound in ``propose`` (``DraftModelSpeculator``)."""
    return compat.has(compat.DRAFT_MODEL_SPECULATOR)


def build(
    vllm_config: Any,
    device: torch.device,
    attn_groups: list[list[Any]],
    kv_cache_config: Any,
    block_table: torch.Tensor,
    max_num_tokens: int,
) -> Any:
    """The release's drafter for ``vllm_config``, by ``init_speculator``, with what
    ``load_model`` and ``set_attn`` would assign.

    ``BlockTables`` pins host memory, which a CPU-only torch refuses, so the
    drafter gets a namespace of the attributes its builders read: the input
    block tables, the slot mappings and a context-parallel size of 1 (one GPU).
    ``set_attn`` also loads the draft's backends from the model's layers, which
    this adapter has none of: the consumer's groups take their place, and the
    consumer's one layer is the draft's (``load_model``'s ``draft_attn_layer_names``:
    ``EagleSpeculator`` builds no metadata without one).
    """
    from vllm.v1.worker.gpu.spec_decode import init_speculator

    # From 0.32.0 the runner hands its request states too (read by the n-gram
    # drafter only, not by MTP's branch).
    extra = {"req_states": None} if compat.has(compat.INIT_SPECULATOR_REQ_STATES) else {}
    speculator = init_speculator(vllm_config, device, **extra)
    expected = drafter_class()
    if not isinstance(speculator, expected):  # pragma: no cover - a fork's dispatch
        raise RuntimeError(
            f"init_speculator built {type(speculator).__qualname__}, not a "
            f"{expected.__qualname__}: this adapter does not know its draft bound"
        )
    speculator.attn_groups = attn_groups
    speculator.kv_cache_config = kv_cache_config
    speculator.draft_attn_layer_names = {layer for g in attn_groups[0] for layer in g.layer_names}
    speculator.block_tables = types.SimpleNamespace(
        input_block_tables=[block_table],
        slot_mappings=torch.full((1, max_num_tokens), -1, dtype=torch.int64, device=device),
        cp_size=1,
    )
    if has_draft_max_seq_len():
        # The first call of propose after the bound: the draft's forward pass starts.
        speculator._copy_request_inputs = _stop
    return speculator


def drafter_class() -> type:
    """The class of the drafter ``init_speculator`` builds here (imported)."""
    if has_draft_max_seq_len():
        from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

        return DraftModelSpeculator
    why = compat.EAGLE_DRAFT_METADATA.missing()
    if why is not None:  # pragma: no cover - neither form: a fork outside the range
        raise RuntimeError(f"no V2 drafter this adapter knows: {why}")
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

    return EagleSpeculator


def pre_fix_draft() -> tuple[type, str, list[tuple[str, str]]]:
    """Where #43991's draft half is reverted on this release: the class, the
    decode builder that passes the draft's bound, and the edit (fixed line, pre-fix
    line). The pre-fix call passed ``max_seq_len=self.max_model_len``; the fixed
    one ``self.draft_max_seq_len``, clamped by ``min(..., self.max_model_len)``
    where ``max_model_len`` became a property read off the config (auto-fit can
    lower it after the drafter is built)."""
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    if compat.has(compat.DRAFT_BUILD_ATTN_METADATA):
        name = "_build_attn_metadata"  # under _build_uniform_attn_metadata
    else:
        name = "_build_draft_attn_metadata"
    if compat.has(compat.DRAFT_MAX_MODEL_LEN_PROPERTY):
        fixed = "            max_seq_len=min(self.draft_max_seq_len, self.max_model_len),\n"
    else:
        fixed = "            max_seq_len=self.draft_max_seq_len,\n"
    return DraftModelSpeculator, name, [(fixed, "            max_seq_len=self.max_model_len,\n")]


def bound(speculator: Any, input_batch: Any, upper: torch.Tensor, mode: Any, padded: bool) -> Any:
    """The draft's decode-step metadata (a dict by layer) as the release builds it
    for the step: ``propose`` up to its bound, then the decode steps' builder."""
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    R, R_pad = input_batch.num_reqs, input_batch.num_reqs_after_padding
    desc = BatchExecutionDescriptor(
        cg_mode=mode, num_tokens=R_pad, num_reqs=R_pad if padded else None,
        uniform_token_count=1,
    )  # fmt: skip
    if not has_draft_max_seq_len():
        # EagleSpeculator.multi_step_decode's call.
        return speculator._build_draft_attn_metadata(
            num_reqs=R, num_reqs_padded=desc.num_reqs or R, num_tokens_padded=desc.num_tokens
        )
    # propose copies the target's hidden states into its buffer before its first
    # call where that comes first (AutoRegressiveSpeculator, to 0.29.0): zeros of
    # the padded step's shape, never read for the bound.
    hidden = torch.zeros(
        input_batch.num_tokens_after_padding, speculator.hidden_size,
        dtype=speculator.dtype, device=speculator.device,
    )  # fmt: skip
    try:
        speculator.propose(
            input_batch, None, None, hidden, None, None, None, None, None, None, None
        )
    except Stop:
        pass
    else:  # pragma: no cover - vLLM's propose changed shape
        raise RuntimeError(f"{type(speculator).__qualname__}.propose ran past the draft's bound")
    if compat.has(compat.DRAFT_UNIFORM_METADATA):
        return speculator._build_uniform_attn_metadata(
            desc, R, num_query_per_req=1, seq_lens_cpu_upper_bound=upper, step=1
        )
    since_step = {"seq_lens_cpu_upper_bound": upper, "step": 1}
    return speculator._build_draft_attn_metadata(
        num_reqs=R, num_reqs_padded=desc.num_reqs or R, num_tokens_padded=desc.num_tokens,
        **(since_step if compat.has(compat.DRAFT_METADATA_STEP) else {}),
    )  # fmt: skip
