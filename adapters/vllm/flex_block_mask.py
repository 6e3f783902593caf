"""``flex-block-mask`` by vLLM's own FlexAttention metadata builder.

:func:`run` turns a case's inputs into vLLM's objects and calls, unchanged,
``FlexAttentionMetadataBuilder.build`` of vLLM 0.33.0
(``vllm/v1/attention/backends/flex_attention.py``), which builds the block
mask through ``FlexAttentionMetadata._build_block_mask_direct`` and copies it
into its persistent tables (``copy_to_persistent``: the strided slice
``table[:rows, :cols]``). The outputs are vLLM's own ``BlockMask``'s
``kv_indices`` and ``kv_num_blocks``: views of those persistent tables.

What the adapter sets up, as the engine does at start:

- a ``VllmConfig`` with the case's limits (``_engine.vllm_config``), the
  case's ``q_block_size`` as ``attention_config.flex_attn_q_block_size`` and
  the case's pages as ``cache_config.num_gpu_blocks`` (page 0 the null block:
  ``reference.flex_block_mask.reserve_null_page``);
- a ``FullAttentionSpec`` of the case's ``block_size``;
- one builder per engine limits and ``q_block_size`` (its persistent buffers
  belong to the engine, so they outlive a step). Before each step the builder's
  two block-mask tables are placed in the case's persistent memory, at the
  shapes the builder computed for them (``max_num_query_groups`` by
  ``max_num_kv_indices``, ``max_num_query_groups``): vLLM allocates them
  uninitialised (``torch.empty``), so the stale values the case holds there
  are what an engine's tables hold, and the oracle checks that nothing outside
  the step's view changed. ``persistent_physical_to_logical`` is sized by
  ``num_gpu_blocks`` when first built; a case with another cache size gets it
  afresh (an engine's cache size is fixed at start, a case's is its own).

:func:`upstream_capacity` is the same builder with its tables sized as before
#39353.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from functools import lru_cache
from typing import Any

import torch
from attnfuzz.adapters.vllm import _engine, compat
from attnfuzz.harness.blame import under_test
from attnfuzz.reference.batch import Case, EngineConfig, cdiv
from attnfuzz.reference.flex_block_mask import (
    FlexBlockMaskInputs,
    FlexBlockMaskOutputs,
    q_block_size,
)

_HEAD_SIZE = 16  # the KV-cache spec's; the block mask does not depend on it

# The engine's builders, most recent last: each holds vLLM's other persistent
# buffers (sized by the limits), so only the last few are kept.
_builders: OrderedDict[tuple[EngineConfig, int, bool], Any] = OrderedDict()
_KEEP_BUILDERS = 8


def prepare() -> None:
    """Import vLLM's FlexAttention backend and validate the base config (before a fork)."""
    _engine.prepare()
    import vllm.v1.attention.backends.flex_attention  # noqa: F401
    import vllm.v1.kv_cache_interface  # noqa: F401


def _vllm_config(config: EngineConfig, q_block_size: int) -> Any:
    vc = _engine.vllm_config(config)
    if compat.has(compat.FLEX_Q_BLOCK_SIZE):  # else the builder picks it (:func:`declines`)
        vc.attention_config = copy.copy(vc.attention_config)
        vc.attention_config.flex_attn_q_block_size = q_block_size
    return vc


@lru_cache(maxsize=8)
def _own_q_block_size(config: EngineConfig) -> int:
    """The ``q_block_size`` the installed builder picks for ``config`` by itself."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadataBuilder

    vc = _engine.vllm_config(config)
    spec = _spec(config.block_size)
    with set_current_vllm_config(vc):
        return FlexAttentionMetadataBuilder(spec, ["flex.0"], vc, torch.device("cpu")).q_block_size


def declines(case: Case) -> str | None:
    """Why the installed release cannot build ``case``'s mask, else None.

    A release without ``AttentionConfig.flex_attn_q_block_size`` (0.21.0) picks the
    query block size in the builder's ``__init__`` (``flex_attention.py``: 16 with
    torch 2.9 or newer, else 128) and offers no knob: a case of another
    ``q_block_size`` is one that release never builds.
    """
    if compat.has(compat.FLEX_Q_BLOCK_SIZE):
        return None
    own = _own_q_block_size(case.config)
    if q_block_size(case) == own:
        return None
    return (
        f"vLLM {compat.installed_version()}'s FlexAttention builder fixes q_block_size at "
        f"{own} (no attention_config.flex_attn_q_block_size before 0.22.0); the case has "
        f"{q_block_size(case)}"
    )


def _spec(block_size: int) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=_HEAD_SIZE, dtype=torch.float32
    )


def _pre_fix_builder_class() -> type:
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadataBuilder

    @under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
    class PreFix39353Builder(FlexAttentionMetadataBuilder):
        """vLLM 0.33.0's builder with the persistent block-mask tables sized as before
        #39353 ("[Model Runner V2] Fix flex attention kv blocks calculation issue").

        The pre-fix lines were not found in the indexed sources; they are
        reconstructed from the pull request's title and crash and from
        docs/domain.md (bug E): the tables had one row per token of a longest
        sequence and one column per page of it. The only difference from
        0.33.0 is the three values its ``__init__`` computes, re-assigned here
        after it: 0.33.0 has ``max_num_query_groups =
        cdiv(max_num_batched_tokens, q_block_size)``, ``max_num_kv_indices =
        q_block_size * cdiv(max_model_len, block_size)`` and
        ``persistent_kv_num_blocks`` of ``max_num_query_groups`` entries.
        ``build`` (which allocates ``persistent_kv_indices`` as
        ``[max_num_query_groups, max_num_kv_indices]`` and copies each step's
        mask into its slice ``[:rows, :cols]``) is 0.33.0's, unchanged.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.max_num_query_groups = self.max_model_len
            self.max_num_kv_indices = cdiv(self.max_model_len, self.block_size)
            self.persistent_kv_num_blocks = torch.empty(
                self.max_model_len, dtype=torch.int32, device=self.device
            )

    return PreFix39353Builder


def _builder(inputs: FlexBlockMaskInputs, fixed: bool) -> Any:
    """The engine's builder for the case's limits and ``q_block_size`` (cached)."""
    assert inputs.config is not None, "the vLLM adapter needs the case's EngineConfig"
    key = (inputs.config, inputs.q_block_size, fixed)
    builder = _builders.get(key)
    if builder is not None:
        _builders.move_to_end(key)
    else:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadataBuilder

        vc = _vllm_config(inputs.config, inputs.q_block_size)
        spec = _spec(inputs.block_size)
        cls = FlexAttentionMetadataBuilder if fixed else _pre_fix_builder_class()
        with set_current_vllm_config(vc):
            builder = cls(spec, ["flex.0"], vc, inputs.persistent_kv_indices.device)
        _builders[key] = builder
        while len(_builders) > _KEEP_BUILDERS:
            _builders.popitem(last=False)
    return builder


def _place_tables(builder: Any, inputs: FlexBlockMaskInputs) -> None:
    """The builder's block-mask tables, at the shapes it computed, in the case's memory."""
    rows, cols = builder.max_num_query_groups, builder.max_num_kv_indices
    counts = builder.persistent_kv_num_blocks
    assert tuple(counts.shape) == (rows,) and counts.dtype == torch.int32
    builder.persistent_kv_indices = inputs.persistent_kv_indices[: rows * cols].view(rows, cols)
    builder.persistent_kv_num_blocks = inputs.persistent_kv_num_blocks[:rows]


def _run(inputs: FlexBlockMaskInputs, fixed: bool) -> FlexBlockMaskOutputs:
    assert inputs.common is not None, "the vLLM adapter needs the step's CommonMetadata"
    builder = _builder(inputs, fixed)
    builder.cache_config.num_gpu_blocks = inputs.num_pages
    p2l = builder.persistent_physical_to_logical
    if p2l is not None and p2l.shape[1] != inputs.num_pages:
        builder.persistent_physical_to_logical = None  # vLLM sizes it on the next build
    _place_tables(builder, inputs)
    common = _engine.common_attn_metadata(inputs.common, inputs.persistent_kv_indices.device)
    metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)
    mask = metadata.block_mask
    return FlexBlockMaskOutputs(mask.kv_indices[0, 0], mask.kv_num_blocks[0, 0])


def run(inputs: FlexBlockMaskInputs) -> FlexBlockMaskOutputs:
    """The installed vLLM's ``FlexAttentionMetadataBuilder.build`` on the case's step."""
    return _run(inputs, fixed=True)


def upstream_capacity(inputs: FlexBlockMaskInputs) -> FlexBlockMaskOutputs:
    """The builder with its tables sized as before #39353 (see ``PreFix39353Builder``)."""
    return _run(inputs, fixed=False)
