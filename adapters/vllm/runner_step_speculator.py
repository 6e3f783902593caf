"""vLLM's V2 speculator run whole after the target step, for the implementation ``vllm`` of
``runner-step`` (:mod:`.runner_step`).

vLLM 0.33.0's V2 ``GPUModelRunner`` makes its speculator in ``__init__``
(``init_speculator``: the tiny DeepSeek model's MTP config makes an ``MTPSpeculator``,
a ``TargetDependentARSpeculator``), loads it in ``load_model``, gives it the target's
attention state in ``initialize_kv_cache`` (``set_attn``, then
``init_cudagraph_manager`` with the resolved cudagraph mode), captures its graphs in
``capture_model`` after the target's, and calls its ``propose`` in ``sample_tokens``
after ``postprocess_sampled`` (and in ``_dummy_run``, ``dummy_run=True``). What runs
unchanged (``vllm/v1/worker/gpu/spec_decode/``):

- ``DraftModelSpeculator``: ``__init__``, ``load_model``, ``set_attn`` (its own
  ``init_attn_backend`` for the draft layer: a ``TritonAttentionMetadataBuilder``),
  ``_configure_decode_metadata_update``, ``_copy_request_inputs``,
  ``_build_attn_metadata``, ``_build_uniform_attn_metadata``,
  ``_build_uniform_batch_dp_sync``, ``_update_draft_decode_metadata``, ``sample_draft``
  (greedy, the config's ``draft_sample_method``);
- ``TargetDependentARSpeculator``: ``init_cudagraph_manager``, ``capture``, ``propose``
  (the draft prefill on the target's metadata or its FULL graph, the multi-step draft
  decode, fused or not, each with ``dispatch_cg_and_sync_dp`` reusing the target's
  data-parallel agreement), ``_prefill``, ``_generate_fused_drafts``, ``_generate_draft``,
  ``_run_model``; the Triton kernels ``prepare_prefill_inputs``,
  ``prepare_decode_inputs``, ``update_draft_inputs`` and ``BlockTables.compute_slot_mappings``
  (under the Triton interpreter);
- ``SpeculatorCudaGraphManager`` (``target_dependent_ar/cudagraph_utils.py``): its
  ``capture`` (fresh dummy metadata per capture, ``prepare_inputs_to_capture``),
  ``specialize_spec_tokens``, and the base manager's ``dispatch`` and ``run_fullgraph``.

Stood in, as ``load_model`` would make them:

- the draft model (``load_draft_model``): the V1 drafter's stand-in
  (:class:`.runner_step_drafter.DraftModel`), recording each forward's attention
  metadata of the draft layer and positions and returning zero hidden states and
  logits; its attention layer, one more layer of the target's KV-cache group as an
  MTP layer is (``load_model`` finds it in the static forward context);
- CUDA graphs (:func:`.runner_step._graphs`): a draft graph keeps the speculator
  function its capture ran, with the capture's arguments, and its replay runs that
  function again (what a replay does: the captured kernels on the same buffers, the
  capture's sizes), the draft model reporting each forward as a replay.

The runner's own ``sample_tokens`` calls ``propose`` (:func:`.runner_step._sample`), on
its real samplers' verdict: the proposal after a step runs before the next one, and
the target's logits make the rejection sampler reject the drafts the next step's
computed tokens say were rejected.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import torch
from attnfuzz.adapters.vllm import _engine
from attnfuzz.adapters.vllm import runner_step_drafter as drafting

DRAFT_LAYER = drafting.DRAFT_LAYER
WHERE = "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py: TargetDependentARSpeculator"

MTP = "mtp"
"""The tiny model's own MTP layer: ``MTPSpeculator``."""
STANDALONE_AR = "draft_model"
"""A separate draft model (:data:`TINY_LLAMA`): ``StandaloneARSpeculator``."""
MTP_MODULES = "mtp_modules"
"""The tiny model with one MTP module per draft (``num_nextn_predict_layers``):
``MultiModuleMTPSpeculator``."""
DFLASH = "dflash"
"""A DFlash draft model (:data:`TINY_DFLASH`): ``DFlashSpeculator``."""
STEP3P5_MTP = "step3p5_mtp"
"""A Step3.5 model's MTP layers a draft (:data:`TINY_STEP3P5`): the V1 runner's
``Step3p5MTPProposer``."""
NGRAM_GPU = "ngram_gpu"
"""The GPU n-gram drafter (no draft model; n-grams of one token, ``prompt_lookup_min`` and
``prompt_lookup_max`` 1): the V1 runner's ``NgramProposerGPU``."""

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 1 << 17,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
"""The standalone draft model's config (a model without MTP layers, so that vLLM keeps
the ``draft_model`` method); no weights are read."""

TINY_DFLASH: dict[str, Any] = {
    **TINY_LLAMA,
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "head_dim": 32,
    # The mask token of the query's parallel drafting slots (get_parallel_drafting_token_id):
    # one of the sampler's tokens (:data:`.runner_step.VOCAB`).
    "dflash_config": {"mask_token_id": 1},
}
"""The DFlash draft model's config (Qwen3's ``DFlashDraftModel``, causal by default);
no weights are read."""

TINY_STEP3P5: dict[str, Any] = {
    **TINY_LLAMA,
    "architectures": ["Step3p5ForCausalLM"],
    "model_type": "step3p5",
    "num_attention_groups": 1,
    "head_dim": 32,
    "num_hidden_layers": 2,
    # SpeculativeConfig.hf_config_override makes it step3p5_mtp (use_step3p5_mtp).
}
"""A Step3.5 model's config, its MTP layers the draft; no weights are read."""

# The speculator functions a draft graph captures (``capture``): a replay runs them again.
_CAPTURED = (
    "_prefill", "_generate_fused_drafts", "_generate_draft", "_generate_drafts",
    "_prepare_graph_forward",
)  # fmt: skip


@functools.cache
def _speculative_config(kind: str, num_spec: int) -> Any:
    from vllm.config import SpeculativeConfig

    base = _engine._base_config(num_spec)
    if kind == STANDALONE_AR:
        method, model = kind, TINY_LLAMA
    elif kind == DFLASH:
        method, model = kind, TINY_DFLASH
    elif kind == STEP3P5_MTP:
        # One MTP layer a draft: SpeculativeConfig wants the drafts a multiple of them.
        method, model = MTP, {**TINY_STEP3P5, "num_nextn_predict_layers": num_spec}
    elif kind == MTP_MODULES:
        method = MTP
        model = {**_engine.TINY_DEEPSEEK_V32, "num_nextn_predict_layers": num_spec}
    elif kind == NGRAM_GPU:
        # No draft model: the drafts follow the first earlier occurrence of a request's
        # last token in its own tokens.
        return SpeculativeConfig(
            method=kind, num_speculative_tokens=num_spec, prompt_lookup_min=1,
            prompt_lookup_max=1, target_model_config=base.model_config,
            target_parallel_config=base.parallel_config,
        )  # fmt: skip
    else:
        raise ValueError(f"attnfuzz: no speculative config of kind {kind!r}")
    draft = Path(_engine.model_dir()) / kind
    draft.mkdir(exist_ok=True)
    (draft / "config.json").write_text(json.dumps(model))
    return SpeculativeConfig(
        method=method, model=str(draft), num_speculative_tokens=num_spec,
        target_model_config=base.model_config, target_parallel_config=base.parallel_config,
    )  # fmt: skip


def speculative_config(kind: str, num_spec: int) -> Any:
    """The validated ``SpeculativeConfig`` that makes the speculator ``kind`` for
    ``num_spec`` drafts (cached; a copy)."""
    return copy.copy(_speculative_config(kind, num_spec))


def repeats_the_query(speculator: Any) -> bool:
    """Whether every draft sub-step runs the step's query (``MultiModuleMTPSpeculator``:
    each MTP module over the same rows), not only the first (the others one token a
    request)."""
    from vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator import (
        MultiModuleMTPSpeculator,
    )

    return isinstance(speculator, MultiModuleMTPSpeculator)


def unreal_rows(speculator: Any, rejected: list[int]) -> list[int]:
    """Each request's rows of the draft query past its real tokens, from its rejected
    drafts: those rejected (their positions not written: ``prepare_prefill_inputs``; or
    written, past the correction token: ``StandaloneARSpeculator``), else the one trailing
    slot a rejection leaves once the last decode's inputs are re-prefilled before the
    query (``MultiModuleMTPSpeculator``: ``_prepare_input_buffers_kernel``, whose slot
    ``pad_trailing_draft_slots`` pads)."""
    if repeats_the_query(speculator):
        return [min(r, 1) for r in rejected]
    return list(rejected)


def where(speculator: Any) -> str:
    """The speculator's class as a build's ``where`` names it."""
    klass = type(speculator)
    path = klass.__module__.removeprefix("vllm.").replace(".", "/")
    return f"{path}.py: {klass.__name__}"


def runs(config: Any, vc: Any) -> bool:
    """Whether the runner has a speculator (next_n > 1) that ``initialize_kv_cache`` can
    give attention: its ``set_attn`` picks a kernel block size as the runner does, and
    Triton's are multiples of 16 (another block size raises there, as it would for the
    target's layers, to which :func:`.runner_step._any_page_triton` gives a backend
    declaring the trace's pages)."""
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    return vc.speculative_config is not None and TritonAttentionBackend.supports_block_size(
        config.block_size
    )


def kv_cache_spec(block_size: int) -> Any:
    """The attention layers' KV-cache spec: full attention over pages of ``block_size``,
    one head of 16 (no attention kernel reads the cache here)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=16, dtype=torch.float32
    )


def make(runner: Any, recorder: Any) -> Any:
    """The speculator ``GPUModelRunner.__init__`` made (``init_speculator``), readied for
    the runner's ``load_model``: its draft model stood in (reporting to
    ``recorder.draft_forward``), its graph functions noting the graph that captures
    them."""
    vc = runner.vllm_config
    speculator = runner.speculator

    def load_draft_model(target_model: Any, target_attn_layer_names: set[str]) -> Any:
        # What load_eagle_model leaves: the draft layer registered, the model loaded.
        # Its KV-cache spec the target's, which the worker reads before it profiles the
        # graphs' memory (runner_step._Engine.profile).
        vc.compilation_config.static_forward_context[DRAFT_LAYER] = drafting._draft_layer(
            vc, kv_cache_spec(vc.cache_config.block_size)
        )
        model = _DFlashDraftModel if is_dflash(speculator) else _ModuleDraftModel
        return model(recorder.draft_forward, speculator.hidden_size, False)

    speculator.load_draft_model = load_draft_model
    for name in _CAPTURED:
        if hasattr(speculator, name):  # StandaloneARSpeculator captures no graph
            setattr(speculator, name, _noted(recorder, vc, getattr(speculator, name)))
    return speculator


class _ModuleDraftModel(drafting.DraftModel):
    """The draft model, taking the MTP module a multi-module draft step runs
    (``spec_step_idx``: every module stood in alike)."""

    def forward(self, *args: Any, spec_step_idx: int = 0, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        return super().compute_logits(hidden_states)


class _DFlashDraftModel(_ModuleDraftModel):
    """The DFlash draft model: its context K/V store (``precompute_and_store_context_kv``,
    the target's hidden states at the context positions, into the context slots) and the
    combination of the target's auxiliary hidden states computed nothing; its query
    forward reports as the other draft models' do."""

    def precompute_and_store_context_kv(
        self, hidden_states: torch.Tensor, positions: torch.Tensor, context_slots: Any = None
    ) -> None:
        pass

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden_states.shape[0], self.hidden_size)


def is_dflash(speculator: Any) -> bool:
    """Whether ``speculator`` is a ``DFlashSpeculator``: one query forward a proposal,
    each request's bonus token and a mask token a draft."""
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    return isinstance(speculator, DFlashSpeculator)


def query_rows(speculator: Any) -> int | None:
    """The rows a request holds in every draft forward of ``speculator`` where they are
    its own, not the step's (``DFlashSpeculator.num_query_per_req``: the bonus token and
    a mask token a draft); None where the draft prefill runs the step's tokens."""
    return speculator.num_query_per_req if is_dflash(speculator) else None


def kv_reads(config: Any, meta: Any) -> tuple[Any, ...]:
    """``kv_len`` and ``kv_slots`` by request of a draft forward's Triton metadata, as
    ``vllm-v1``'s builds state them (:meth:`.runner_step_v1._Engine.kv_fields`): the
    first ``seq_lens[i]`` keys of request ``i``, read through its block-table row. No
    range: each is a function of fields whose ranges are judged."""
    import numpy as np
    from attnfuzz.adapters.vllm.runner_step_v1 import paged_keys
    from attnfuzz.reference.runner_step import Field

    seq_lens = meta.seq_lens.detach().to("cpu").numpy()
    table = meta.block_table.detach().to("cpu").numpy()
    lengths, slots = paged_keys(seq_lens, table, config.block_size)
    bs = config.block_size
    width = max([-(-config.max_model_len // bs) * bs] + [len(s) for s in slots])
    values = np.zeros((len(lengths), width), dtype=np.int64)
    for row, keys in enumerate(slots):
        values[row, : len(keys)] = keys
    return (
        Field("kv_len", "requests", lengths),
        Field("kv_slots", "requests", values, row_lengths=lengths),
    )


def _noted(recorder: Any, vc: Any, fn: Any) -> Any:
    """``fn``, which tells the graph being captured to replay it: again with the
    capture's arguments, under the capture's data-parallel size (a replay runs no host
    code, so no collective of ``set_forward_context``). A call inside another noted
    call is the outer one's; calls one after the other in a capture replay in order
    (``DFlashCudaGraphManager`` captures ``prepare_forward``, then the query forward)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        graph = recorder.capturing
        if graph is None or getattr(graph, "noting", False):
            return fn(*args, **kwargs)
        pc, size = vc.parallel_config, vc.parallel_config.data_parallel_size
        before = graph.rerun

        def rerun() -> None:
            if before is not None:
                before()
            now, pc.data_parallel_size = pc.data_parallel_size, size
            try:
                fn(*args, **kwargs)
            finally:
                pc.data_parallel_size = now

        graph.rerun, graph.noting = rerun, True
        try:
            return fn(*args, **kwargs)
        finally:
            graph.noting = False

    return run
