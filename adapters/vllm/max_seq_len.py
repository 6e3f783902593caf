"""vLLM's own ``max_seq_len`` bounds as implementations of target ``max-seq-len`` (bug D).

What runs is the installed release's code, unchanged (vLLM 0.21.0 to 0.33.0,
each bound to what it offers, :mod:`.compat`):

- the model state's bound: ``prepare_attn`` of ``DefaultModelState``
  (``vllm/v1/worker/gpu/model_states/default.py``; implementation ``vllm``) or of
  ``MambaHybridModelState`` (``model_states/mamba_hybrid.py``;
  ``vllm-mamba-hybrid``), handed to ``build_attn_metadata``
  (``vllm/v1/worker/gpu/attn_utils.py``), which builds the step's
  ``CommonAttentionMetadata`` for each attention group. Fixed, it is
  ``max_model_len`` when ``for_capture``, else ``seq_lens_cpu_upper_bound[:num_reqs].max()``
  (``DefaultModelState`` since #40654, before 0.21.0; ``MambaHybridModelState``
  since #43991, in 0.23.0: before, ``max_model_len`` always);
- the draft's bound, with two speculative tokens or more (with one the drafter
  runs only its prefill, on the model state's metadata, and returns: no draft
  bound): the drafter the release's ``init_speculator`` builds, its ``propose``
  and its decode steps' builder (:mod:`.max_seq_len_drafters`: from 0.23.0
  ``min(max(seq_lens_cpu_upper_bound[:num_reqs]) + num_spec, max_model_len)``;
  before, ``EagleSpeculator``'s ``max_model_len``). At capture the draft's
  graphs take their metadata from the model state's capture branch
  (``cudagraph_utils.prepare_inputs_to_capture`` calls
  ``model_state.prepare_attn(for_capture=True)`` with the draft's groups, on
  every release), so that is what runs here for the draft when the case captures.

The V1 model runner as ``vllm-v1`` (:func:`run_v1`): its
``GPUModelRunner._build_attention_metadata`` (``vllm/v1/worker/gpu_model_runner.py``)
takes ``max_model_len`` when ``for_cudagraph_capture``, else
``optimistic_seq_lens_cpu[:num_reqs].max()`` (the real requests), on the runner's
persistent buffer that ``_prepare_inputs`` fills and zeroes past ``num_reqs``
each step (the same on every release). The draft's bound there is the V2
drafter's, as in ``vllm``: V1's drafter raises the target's bound by one per
decode step instead (:func:`v1_draft_bounds`). #43991 touched only the V2
runner ("[Model Runner V2] Use actual batch max_seq_len"), so no V1 revert is
registered.

The bounds are read off the ``CommonAttentionMetadata`` vLLM builds, through
the metadata builder of the consumer: the consumer (the paged walk and its
outputs) stays attnfuzz's own, so after vLLM has computed both bounds this
adapter runs ``kernels.max_seq_len.paged_walk`` with them, as the ``triton``
implementation does.

The step reaches vLLM as the model runner hands it over
(``GPUModelRunner.prepare_inputs``, ``vllm/v1/worker/gpu/model_runner.py``): an
``InputBatch`` with the query lengths, ``query_start_loc`` and the real and
padded request counts, and the host ``seq_lens_cpu_upper_bound`` of ``R_pad``
rows (built afresh, padding rows 0, on every release). A padded step replays a
full graph (``CUDAGraphMode.FULL``: the model state takes
``num_reqs_after_padding`` rows); any other step runs eagerly at its real sizes.

How each object is built, as cheaply as vLLM allows: the model states and the
drafter by their own constructors (they run on the CPU with the tiny model's
config), once per engine config; the drafter as :mod:`.max_seq_len_drafters`
says.

Upstream mutants (``upstream_*``): the same calls with the fix of #43991 reverted
in the installed release's own source, line for line (see
:data:`_PRE_FIX_MODEL_STATE` and :func:`.max_seq_len_drafters.pre_fix_draft`),
on a release that has the fix (``DraftModelSpeculator``, 0.23.0 on; before, the
release's own code is the pre-fix code, which ``vllm-mamba-hybrid`` and ``vllm``
run). The pre-fix lines are those of the pull request: its description
(``MambaHybridModelState.prepare_attn`` and the eagle/MTP draft's
``_build_draft_attn_metadata`` "still passed ``max_seq_len=max_model_len``"), its
diff of ``model_states/mamba_hybrid.py`` (the bound block added after the
``max_query_len`` lines), and a public back-port script of #43991 whose
old/new anchors give the replaced lines verbatim. ``DefaultModelState`` got its
bound in #40654, before #43991, so no revert of it is registered here.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.adapters.vllm import max_seq_len_drafters as drafters
from attnfuzz.kernels.max_seq_len import _run
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.max_seq_len import MaxSeqLenInputs, MaxSeqLenOutputs, has_draft

_LAYER = "attnfuzz.max_seq_len.consumer"  # the one attention layer of the consumer's group


# ---------------------------------------------------------------------------
# Upstream #43991, reverted: the release's fixed lines and the lines before the fix
# ---------------------------------------------------------------------------

# MambaHybridModelState.prepare_attn. #43991 added the bound block after the
# max_query_len lines and replaced ``max_seq_len=self.max_model_len`` in the
# build_attn_metadata call (the PR's diff of model_states/mamba_hybrid.py). The
# reverted method keeps the release's ``seq_lens_cpu_upper_bound=`` argument (passed
# from 0.25.0 on: :data:`_FOLLOW_ON`), now read off the input batch, since the block
# that named it is gone.
_PRE_FIX_MODEL_STATE: list[tuple[str, str]] = [
    (
        """        seq_lens_cpu_upper_bound = input_batch.seq_lens_cpu_upper_bound
        if for_capture:
            # Capture with worst-case max_seq_len so the graph is valid at any replay.
            max_seq_len = self.max_model_len
        else:
            max_seq_len = seq_lens_cpu_upper_bound[:num_reqs].max().item()
""",
        "",
    ),
    ("            max_seq_len=max_seq_len,\n", "            max_seq_len=self.max_model_len,\n"),
    (
        "            seq_lens_cpu_upper_bound=seq_lens_cpu_upper_bound,\n",
        "            seq_lens_cpu_upper_bound=input_batch.seq_lens_cpu_upper_bound,\n",
    ),
]

_FOLLOW_ON = frozenset({_PRE_FIX_MODEL_STATE[2][0]})
"""Edits that follow from another where the release has their line: a use of a name
the revert removes (0.23.0 and 0.24.0 do not pass ``seq_lens_cpu_upper_bound=``)."""

# The draft's half (DraftModelSpeculator's decode builder, ``_build_draft_attn_metadata``
# in eagle/speculator.py when #43991 was written): the pre-fix call passed
# ``max_seq_len=self.max_model_len``; see drafters.pre_fix_draft for the line each
# release has. The fix also added the lines of ``propose`` that set
# ``draft_max_seq_len``; with that line reverted they feed nothing, so ``propose``
# runs unchanged.


def _reverted(
    cls: type, name: str, edits: list[tuple[str, str]], follow_on: Collection[str] = ()
) -> Callable[..., Any]:
    """``cls.name`` compiled from vLLM's own source with ``edits`` applied, each to
    exactly one place (so a vLLM whose lines moved fails here, loudly; one in
    ``follow_on`` at most once), in the globals of the module that defines it."""
    function = getattr(cls, name)
    source = inspect.getsource(function)  # indented as in its class, as the edits are
    for fixed, pre_fix in edits:
        count = source.count(fixed)
        if count != 1 and not (fixed in follow_on and count == 0):
            raise RuntimeError(
                f"{cls.__qualname__}.{name}: expected the line(s) {fixed!r} once, found {count} "
                f"(vLLM {_installed()} differs from the release the revert was written for)"
            )
        source = source.replace(fixed, pre_fix)
    namespace = dict(vars(sys.modules[function.__module__]))
    code = compile(
        textwrap.dedent(source), f"<{cls.__qualname__}.{name} before vllm#43991>", "exec"
    )
    exec(code, namespace)  # noqa: S102 - vLLM's own source, with the lines above reverted
    return namespace[name]


def _installed() -> str:
    from attnfuzz.adapters.vllm import installed_version

    return installed_version() or "?"


# ---------------------------------------------------------------------------
# vLLM's objects for one engine config, built once
# ---------------------------------------------------------------------------


@dataclass
class _Engine:
    vllm_config: Any
    model_state: Any
    speculator: Any | None  # None where the drafter builds no metadata (has_draft)
    attn_groups: list[list[Any]]
    kv_cache_config: Any
    block_table: torch.Tensor  # the speculator's input block table, [max_num_seqs, W]


def _consumer_groups(config: EngineConfig, device: torch.device) -> tuple[list[list[Any]], Any]:
    """One KV-cache group whose attention group's builder is the consumer's."""
    from vllm.v1.attention.backend import AttentionMetadataBuilder, CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.worker.utils import AttentionGroup

    class PagedWalkBuilder(AttentionMetadataBuilder):
        """The consumer's metadata builder: its metadata is the step's
        ``CommonAttentionMetadata`` as vLLM built it (``max_seq_len``,
        ``seq_lens``, ``block_table_tensor``), all a paged walk reads."""

        def __init__(self) -> None:  # nothing to allocate: vLLM's base init is not needed
            pass

        # The base class's parameter names: releases before 0.33.0's
        # AttentionGroup.build_metadata call build(common_attn_metadata=...).
        def build(
            self,
            common_prefix_len: int,
            common_attn_metadata: CommonAttentionMetadata,
            fast_build: bool = False,
        ) -> CommonAttentionMetadata:
            return common_attn_metadata

        def build_for_cudagraph_capture(
            self, common_attn_metadata: CommonAttentionMetadata
        ) -> CommonAttentionMetadata:
            return common_attn_metadata

    spec = FullAttentionSpec(
        block_size=config.block_size, num_kv_heads=1, head_size=config.head_dim,
        dtype=torch.float32,
    )  # fmt: skip
    group = AttentionGroup(
        backend=None,  # type: ignore[arg-type]  # never asked: the builder is given
        layer_names=[_LAYER],
        kv_cache_spec=spec,
        kv_cache_group_id=0,
        metadata_builders=[PagedWalkBuilder()],
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec([_LAYER], spec)]
    )
    return [[group]], kv_cache_config


@lru_cache(maxsize=256)  # the strategies draw a new engine config nearly every case
def _engine_for(
    config: EngineConfig, device: torch.device, state: str, draft_pre_fix: bool
) -> _Engine:
    """vLLM's model state (``state``: "default", "mamba-hybrid" or its pre-fix) and
    drafter (its pre-fix builder when ``draft_pre_fix``) for ``config``."""
    import torch.nn as nn
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    vc = _engine.vllm_config(config)
    attn_groups, kv_cache_config = _consumer_groups(config, device)
    with set_current_vllm_config(vc):
        if state == "default":
            cls = DefaultModelState
        else:
            from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

            cls = MambaHybridModelState
        # The model module is read only for rope and multimodal state, which a
        # text model with 1-D positions has none of.
        model_state = cls(vc, nn.Module(), None, device)
        if state == "mamba-hybrid-pre-fix":
            fn = _reverted(cls, "prepare_attn", _PRE_FIX_MODEL_STATE, _FOLLOW_ON)
            model_state.prepare_attn = types.MethodType(fn, model_state)
        block_table = torch.zeros(
            (config.max_num_seqs, config.max_blocks_per_seq), dtype=torch.int32, device=device
        )
        speculator = None
        if has_draft(config.num_spec):
            speculator = drafters.build(
                vc, device, attn_groups, kv_cache_config, block_table,
                config.max_num_batched_tokens,
            )  # fmt: skip
            if draft_pre_fix:
                owner, name, edits = drafters.pre_fix_draft()
                fn = _reverted(owner, name, edits)
                setattr(speculator, name, types.MethodType(fn, speculator))
    return _Engine(vc, model_state, speculator, attn_groups, kv_cache_config, block_table)


def prepare() -> None:
    """Import vLLM, validate the base configs, import the modules every call uses."""
    from attnfuzz.adapters.vllm import compat

    _engine.prepare()
    _engine._base_config(1)
    import vllm.v1.worker.gpu.model_states.default  # noqa: F401

    if compat.has(compat.MAMBA_HYBRID):
        import vllm.v1.worker.gpu.model_states.mamba_hybrid  # noqa: F401
    drafters.drafter_class()  # imports the drafter's module


# ---------------------------------------------------------------------------
# The step as the model runner hands it over
# ---------------------------------------------------------------------------


def _input_batch(inputs: MaxSeqLenInputs, device: torch.device) -> Any:
    """vLLM's ``InputBatch`` of the step, as ``GPUModelRunner.prepare_inputs`` fills it.

    Fields ``prepare_attn`` and ``propose`` do not read before the bound are
    filled plausibly (zeros, identities), never from stale memory. Each release's
    ``InputBatch`` gets the fields it declares (``max_seq_len_np``: 0.23.0 to 0.29.0,
    ``None`` without pipeline parallelism; ``is_padding``, ``prompt_lens``: 0.25.0
    on; ``has_prefill``: 0.28.0 on; ``decode_graph_eligible``: 0.31.0 on).
    """
    from vllm.v1.worker.gpu.input_batch import InputBatch

    meta, config = inputs.common, inputs.config
    R, R_pad = meta.num_real_reqs, meta.num_reqs
    T, T_pad = meta.num_real_tokens, meta.num_actual_tokens
    q_lens = np.diff(meta.query_start_loc).astype(np.int32)[:R]
    seq_lens = meta.seq_lens[:R].astype(np.int32)
    num_computed = seq_lens - q_lens
    # The split's classification: a request longer than the threshold prefills.
    is_prefilling = q_lens > config.threshold
    drafts = np.where(is_prefilling, 0, q_lens - 1).astype(np.int32)
    positions = np.concatenate(
        [np.arange(c, s, dtype=np.int64) for c, s in zip(num_computed, seq_lens, strict=True)]
        + [np.zeros(T_pad - T, dtype=np.int64)]
    )
    query_start_loc_np = meta.query_start_loc.astype(np.int32)
    query_start_loc = torch.from_numpy(query_start_loc_np.copy()).to(device)
    idx_mapping_np = np.arange(R, dtype=np.intp)
    idx_mapping = torch.arange(R, dtype=torch.int64, device=device)
    fields = dict(
        req_ids=[f"req-{r}" for r in range(R)],
        num_reqs=R,
        num_reqs_after_padding=R_pad,
        idx_mapping=idx_mapping,
        idx_mapping_np=idx_mapping_np,
        expanded_idx_mapping=idx_mapping,
        expanded_local_pos=torch.zeros(R, dtype=torch.int32, device=device),
        num_scheduled_tokens=q_lens,
        num_tokens=T,
        num_tokens_after_padding=T_pad,
        num_draft_tokens=int(drafts.sum()),
        num_draft_tokens_per_req=drafts if config.num_spec > 0 else None,
        query_start_loc=query_start_loc,
        query_start_loc_np=query_start_loc_np,
        seq_lens=inputs.seq_lens.clone(),  # the runner's seq_lens buffer, [R_pad]
        seq_lens_cpu_upper_bound=inputs.seq_lens_cpu_upper_bound,
        dcp_local_seq_lens=None,
        num_computed_tokens_np=num_computed,
        prefill_len_np=np.where(is_prefilling, seq_lens, num_computed).astype(np.int32),
        num_computed_prefill_tokens_np=num_computed,
        is_prefilling_np=is_prefilling,
        has_prefill=bool(is_prefilling.any()),
        decode_graph_eligible=not bool(is_prefilling.any()),
        input_ids=torch.zeros(T_pad, dtype=torch.int32, device=device),
        positions=torch.from_numpy(positions).to(device),
        is_padding=torch.from_numpy(np.arange(T_pad) >= T).to(device),
        logits_indices=query_start_loc[1 : R + 1] - 1,
        cu_num_logits=torch.arange(R + 1, dtype=torch.int32, device=device),
        cu_num_logits_np=np.arange(R + 1, dtype=np.int32),
        has_structured_output_reqs=False,
        prompt_lens=None,
        max_seq_len_np=None,  # populated with pipeline parallelism only
    )
    declared = {f.name for f in dataclasses.fields(InputBatch)}
    return InputBatch(**{k: v for k, v in fields.items() if k in declared})


def _bounds(inputs: MaxSeqLenInputs, engine: _Engine) -> tuple[int, int | None]:
    """``(model state, draft)`` max_seq_len as vLLM's code builds them for the step."""
    from vllm.config import set_current_vllm_config
    from vllm.config.compilation import CUDAGraphMode

    device = inputs.kv_cache.device
    meta = inputs.common
    R_pad = meta.num_reqs
    mode = CUDAGraphMode.FULL if meta.padded else CUDAGraphMode.NONE
    input_batch = _input_batch(inputs, device)
    block_tables = (inputs.block_table,)  # the runner's, gathered to [R_pad, W]
    slot_mappings = torch.from_numpy(meta.slot_mapping).to(device)[None]
    with set_current_vllm_config(engine.vllm_config):

        def model_state_bound(attn_groups: list[list[Any]]) -> int:
            metadata = engine.model_state.prepare_attn(
                input_batch, mode, block_tables, slot_mappings, attn_groups,
                engine.kv_cache_config, for_capture=inputs.capturing,
            )  # fmt: skip
            return metadata[_LAYER].max_seq_len

        model = model_state_bound(engine.attn_groups)
        spec = engine.speculator
        if spec is None:
            return model, None
        if inputs.capturing:
            # The draft's graphs capture metadata from the model state's capture branch.
            return model, model_state_bound(spec.attn_groups)
        engine.block_table[:R_pad].copy_(inputs.block_table)
        metadata = drafters.bound(
            spec, input_batch, inputs.seq_lens_cpu_upper_bound, mode, meta.padded
        )
        return model, metadata[_LAYER].max_seq_len


def _consume(inputs: MaxSeqLenInputs, model: int, draft: int | None) -> MaxSeqLenOutputs:
    """attnfuzz's consumer (the paged walk) on the bounds vLLM built."""
    bounds = torch.tensor([model, draft or 0], dtype=torch.int32, device=inputs.kv_cache.device)
    got = _run(inputs, bounds)
    # The bounds as vLLM hands them to its kernels: host integers.
    got.max_seq_len, got.draft_max_seq_len = model, draft
    return got


def _call(inputs: MaxSeqLenInputs, state: str, draft_pre_fix: bool = False) -> MaxSeqLenOutputs:
    engine = _engine_for(inputs.config, inputs.kv_cache.device, state, draft_pre_fix)
    return _consume(inputs, *_bounds(inputs, engine))


def run(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """``DefaultModelState.prepare_attn`` and the release's drafter's bound."""
    return _call(inputs, "default")


def run_mamba_hybrid(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """``MambaHybridModelState.prepare_attn`` and the release's drafter's bound."""
    return _call(inputs, "mamba-hybrid")


def upstream_model_len(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """#43991 reverted in ``MambaHybridModelState.prepare_attn``: ``max_model_len``
    outside capture too (the draft as fixed)."""
    return _call(inputs, "mamba-hybrid-pre-fix")


def upstream_draft_model_len(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """#43991 reverted in ``DraftModelSpeculator``'s decode builder
    (``_build_attn_metadata``, ``_build_draft_attn_metadata`` before 0.30.0): the
    draft's ``max_seq_len`` is ``max_model_len`` (the model state as fixed)."""
    return _call(inputs, "default", draft_pre_fix=True)


# ---------------------------------------------------------------------------
# The V1 model runner (vllm/v1/worker/gpu_model_runner.py), in every release
# ---------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _v1_runner(config: EngineConfig, device: torch.device) -> Any:
    """vLLM's V1 ``GPUModelRunner`` for ``config``, built by its own constructor on
    the CPU, with the consumer's KV-cache group and attention group.

    It is built from the config without its speculative config: with one, the
    constructor asks for the pipeline-parallel group (``get_pp_group``) to build
    its drafter, which needs a distributed init. ``_build_attention_metadata``
    reads the speculative config only to pick the metadata it hands the drafter
    (the first group's ``cm``), not for ``max_seq_len``.

    Where the constructor probes the device's compute units
    (``_init_device_properties``, to 0.31.0), the probe answers as vLLM's CPU
    platform does from 0.23.0 (``CpuPlatform.num_compute_units``:
    ``torch.get_num_threads()``); 0.21.0's CPU platform does not implement it.
    ``num_sms`` only sizes cascade attention's choice, never ``max_seq_len``.
    """
    from attnfuzz.adapters.vllm import compat
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    cls = GPUModelRunner
    if compat.has(compat.V1_DEVICE_PROPERTIES):

        class CpuProbedRunner(GPUModelRunner):
            def _init_device_properties(self) -> None:
                self.num_sms = torch.get_num_threads()

        cls = CpuProbedRunner
    vc = _engine.vllm_config(dataclasses.replace(config, num_spec=0))
    with set_current_vllm_config(vc):
        runner = cls(vc, device)
    # What initialize_kv_cache would assign (it also allocates the cache and loads
    # the layers' backends, which this adapter has none of).
    attn_groups, runner.kv_cache_config = _consumer_groups(config, device)
    runner.attn_groups = attn_groups
    return runner


def _v1_bound(inputs: MaxSeqLenInputs) -> int:
    """The model state's ``max_seq_len`` as the V1 runner builds it for the step:
    ``GPUModelRunner._build_attention_metadata``, read off the
    ``CommonAttentionMetadata`` it hands the consumer's builder."""
    from vllm.config import set_current_vllm_config

    device = inputs.kv_cache.device
    meta = inputs.common
    R, R_pad = meta.num_real_reqs, meta.num_reqs
    T, T_pad = meta.num_real_tokens, meta.num_actual_tokens
    runner = _v1_runner(inputs.config, device)
    q_lens = np.diff(meta.query_start_loc).astype(np.int32)[:R]
    upper = inputs.seq_lens_cpu_upper_bound
    input_batch = runner.input_batch
    # The host's num_computed_tokens counts every draft of the previous step as
    # accepted, so num_computed + num_scheduled is the step's upper bound.
    computed = upper[:R].numpy().astype(np.int32) - q_lens
    input_batch.num_computed_tokens_cpu_tensor[:R] = torch.from_numpy(computed)
    prefilling = q_lens > inputs.config.threshold
    prompt = np.where(prefilling, upper[:R].numpy(), computed).astype(np.int32)
    input_batch.num_prompt_tokens_cpu_tensor[:R] = torch.from_numpy(prompt)
    num_scheduled_tokens = q_lens
    num_reqs = R
    # GPUModelRunner._prepare_inputs' lines for the two buffers the bound reads
    # (the whole method needs the scheduler's output and the request states):
    # query_start_loc, padded non-decreasing, and the optimistic seq_lens, zeroed
    # past num_reqs, verbatim.
    cu_num_tokens = np.cumsum(num_scheduled_tokens)
    runner.query_start_loc.np[0] = 0
    runner.query_start_loc.np[1 : num_reqs + 1] = cu_num_tokens
    runner.query_start_loc.np[num_reqs + 1 :].fill(cu_num_tokens[-1])
    runner.query_start_loc.copy_to_gpu()
    torch.add(
        runner.input_batch.num_computed_tokens_cpu_tensor[:num_reqs],
        torch.from_numpy(num_scheduled_tokens),
        out=runner.optimistic_seq_lens_cpu[:num_reqs],
    )
    runner.optimistic_seq_lens_cpu[num_reqs:].fill_(0)
    runner.seq_lens[:R_pad].copy_(inputs.seq_lens)  # the exact lengths, 0 for padding
    slot_mappings = {0: torch.from_numpy(meta.slot_mapping).to(device)}
    with set_current_vllm_config(runner.vllm_config):
        metadata, _ = runner._build_attention_metadata(
            num_tokens=T, num_reqs=R, max_query_len=int(q_lens.max()),
            num_tokens_padded=T_pad, num_reqs_padded=R_pad,
            for_cudagraph_capture=inputs.capturing, slot_mappings=slot_mappings,
        )  # fmt: skip
    return metadata[_LAYER].max_seq_len


def run_v1(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    """The V1 runner: ``GPUModelRunner._build_attention_metadata`` for the model
    state's bound; the draft's bound from the V2 drafter, as in :func:`run`.

    V1's own drafter (``spec_decode/llm_base_proposer.py``) does not build one
    draft bound: each of its decode steps raises the target's ``max_seq_len`` by
    one (``SpecDecodeBaseProposer._update_positions_dependent_metadata``:
    ``min(max_seq_len + 1, max_model_len)``), so step ``k`` of ``num_spec - 1`` has
    ``min(max + k, max_model_len)``, one below the model's single draft bound at the
    last step. That rule is not this target's draft path; see
    :func:`v1_draft_bounds`.
    """
    engine = _engine_for(inputs.config, inputs.kv_cache.device, "default", False)
    _, draft = _bounds(inputs, engine)
    return _consume(inputs, _v1_bound(inputs), draft)


def v1_draft_bounds(inputs: MaxSeqLenInputs) -> list[int]:
    """``max_seq_len`` of each decode step of V1's EAGLE/MTP drafter for the step
    (``num_spec - 1`` of them; none with one speculative token: ``propose``
    returns after its first pass when ``num_speculative_tokens == 1``).

    The drafter starts from the metadata ``_build_attention_metadata`` hands it
    (the first group's, unpadded; ``prepare_inputs_padded``, the default padded
    drafter batch, keeps its ``max_seq_len``) and runs, per decode step,
    ``SpecDecodeBaseProposer._update_positions_dependent_metadata`` unchanged
    (its slot-mapping kernel interpreted). The proposer is ``object.__new__`` with
    the attributes that method reads (``uses_mrope``, ``positions``,
    ``_slot_mapping_buffer``, ``max_model_len``; to 0.29.0 also ``uses_xdrope_dim``
    and ``draft_uses_xdrope_dim``, 0 for the tiny text model, as the constructor
    reads them off the model configs): its constructor loads the draft model's
    config and needs the pipeline-parallel group.
    """
    from copy import copy

    from vllm.v1.spec_decode.eagle import EagleProposer

    _v1_bound(inputs)  # fills the runner's buffers and builds the step's metadata
    runner = _v1_runner(inputs.config, inputs.kv_cache.device)
    meta, config = inputs.common, inputs.config
    R, R_pad = meta.num_real_reqs, meta.num_reqs
    T, T_pad = meta.num_real_tokens, meta.num_actual_tokens
    metadata, _ = runner._build_attention_metadata(
        num_tokens=T, num_reqs=R, max_query_len=1, num_tokens_padded=T_pad,
        num_reqs_padded=R_pad, slot_mappings={0: torch.from_numpy(meta.slot_mapping)},
    )  # fmt: skip
    cm = copy(metadata[_LAYER])
    if R != R_pad or T != T_pad:
        cm = cm.unpadded(T, R)  # as _build_attention_metadata does for the drafter
    cm.seq_lens = cm.seq_lens.clone()  # the kernel advances them in place
    cm.block_table_tensor = inputs.block_table[:R].clone()
    proposer = object.__new__(EagleProposer)
    proposer.uses_mrope = False
    proposer.uses_xdrope_dim = proposer.draft_uses_xdrope_dim = 0  # read to 0.29.0 only
    proposer.max_model_len = config.max_model_len
    proposer.positions = torch.zeros(config.max_num_batched_tokens, dtype=torch.int64)
    proposer._slot_mapping_buffer = torch.zeros(config.max_num_batched_tokens, dtype=torch.int64)
    positions = (cm.seq_lens - 1).to(torch.int64)  # each request's last position
    bounds = []
    for _ in range(config.num_spec - 1):  # SpecDecodeBaseProposer.propose's loop
        positions = proposer._update_positions_dependent_metadata(
            positions, cm, R, R, config.block_size
        )
        bounds.append(int(cm.max_seq_len))
    return bounds
