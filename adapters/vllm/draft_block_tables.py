"""vLLM's drafter builds the per-group attention metadata of ``draft-block-tables`` (bug C).

What runs is the installed release's own
``Gemma4Proposer.build_per_group_and_layer_attn_metadata`` (``vllm/v1/spec_decode/gemma4.py``,
first in 0.21.0; the fix of #43982 first in 0.23.0), unchanged, on vLLM's own objects:

- each KV-cache group of the case is one of vLLM's ``AttentionGroup``
  (``vllm/v1/worker/utils.py``) with a ``FullAttentionSpec`` or a
  ``SlidingWindowSpec`` of the group's page size and window, and the metadata
  builder of the Triton attention backend (Gemma4 forces ``TRITON_ATTN``:
  ``Gemma4Proposer._create_draft_vllm_config``), which the group creates itself
  (``AttentionGroup.create_metadata_builders``);
- each group's stored table is a row-slice of vLLM's persistent per-group
  table (``vllm/v1/worker/block_table.py``, ``MultiGroupBlockTable``, sized as
  the release's model runner sizes it from the case's limits, :func:`_table_kwargs`):
  the case's rows are set on its host side, and
  vLLM's ``commit_block_table`` and ``get_device_tensor(num_reqs_padded)`` give
  the table the model runner hands to ``Gemma4Proposer.set_per_group_block_table``
  for every group (``GPUModelRunner._build_attention_metadata``);
- the drafter's common metadata is the padded step's, with the first draft
  group's table, cut back by vLLM's own ``CommonAttentionMetadata.unpadded``
  exactly where the runner does (``num_reqs != num_reqs_padded or num_tokens !=
  num_tokens_padded``, same function).

``SpecDecodeBaseProposer.propose`` hands that metadata to the method through
``set_inputs_first_pass``, which returns it unchanged when the drafter needs no
extra input slots: Gemma4 passes hidden states to its model, so without parallel
drafting it needs none (``llm_base_proposer.py``, ``SpecDecodeBaseProposer.__init__``,
``needs_extra_input_slots``). The adapter calls the method with it directly.

The outputs are, per group, ``query_start_loc``, ``seq_lens`` and ``block_table``
of the metadata vLLM's builder returns: ``TritonAttentionMetadataBuilder.build``
(``vllm/v1/attention/backends/triton_attn.py``) stores the tensors of the common
metadata it is handed as they are, so these are the very tensors the method
hands each group's builder. Each group's attention output is attnfuzz's stand-in
consumer on that metadata, as vLLM's attention layer takes it
(``q[:num_actual_tokens]``): FlashAttention's argument checks (the consumer in
which #43982 was reported, ``batch_size must be equal to batch_size_k``), then the
reference's varlen paged attention. vLLM's own Triton attention kernel would run
interpreted, at about 0.3 s per group: too slow to fuzz.
"""

from __future__ import annotations

import functools
from copy import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

# isort: off
# attnfuzz's kernels first: they set TRITON_INTERPRET, which _engine reads before vLLM is imported.
from attnfuzz.harness.blame import under_test
from attnfuzz.kernels import draft_block_tables as kernels
from attnfuzz.adapters.vllm import _engine

# isort: on
from attnfuzz.adapters.vllm import compat
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.draft_block_tables import (
    DraftBlockTablesInputs,
    DraftBlockTablesOutputs,
    GroupAttentionMetadata,
    KVCacheGroup,
    attention,
)
from vllm.config import set_current_vllm_config
from vllm.utils.math_utils import cdiv
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
from vllm.v1.kv_cache_interface import AttentionSpec, FullAttentionSpec, SlidingWindowSpec
from vllm.v1.spec_decode.gemma4 import Gemma4Proposer
from vllm.v1.worker.block_table import MultiGroupBlockTable
from vllm.v1.worker.utils import AttentionGroup


@under_test  # the engine's code with a fix reverted: its exceptions are the mutant's
class Gemma4ProposerBefore43982(Gemma4Proposer):
    """``Gemma4Proposer`` with the fix of vLLM #43982 reverted (upstream mutant).

    ``build_per_group_and_layer_attn_metadata`` below is the installed release's
    with the lines #43982 changed (in 0.23.0) as they were before it: 0.22.1's
    method, on a release whose builder call is 0.22.1's. The lines that differ
    from a fixed release:

    - its ``batch_size = common_attn_metadata.batch_size()`` is absent;
    - ``cm.block_table_tensor = self._per_group_block_tables[gid]`` stands for
      its ``... = self._per_group_block_tables[gid][:batch_size]`` (and the
      four comment lines above it).

    The builder call is the release's: ``attn_group.build_metadata_for_drafting``
    where ``AttentionGroup`` has it (0.32.0 on: it maps the table to kernel
    blocks first), else ``attn_group.get_metadata_builder().build_for_drafting``
    (0.21.0 to 0.31.0); for a group without a kernel block size, as here, both
    hand the builder the same metadata. On a release before the fix (0.21.0 to
    0.22.1) the method below is the release's own, line for line.
    """

    if compat.has(compat.DRAFTING_METADATA):

        def build_per_group_and_layer_attn_metadata(
            self,
            common_attn_metadata: CommonAttentionMetadata,
            draft_index: int = 0,
        ) -> tuple[list[object], dict[str, object]]:
            per_group_attn_metadata: list[object] = []
            per_layer_attn_metadata: dict[str, object] = {}
            for attn_group in self.draft_attn_groups:
                gid = attn_group.kv_cache_group_id
                if gid in self._per_group_block_tables:
                    cm = copy(common_attn_metadata)
                    cm.block_table_tensor = self._per_group_block_tables[gid]  # reverted line
                else:
                    cm = common_attn_metadata
                attn_metadata = attn_group.build_metadata_for_drafting(
                    common_attn_metadata=cm, draft_index=draft_index
                )
                per_group_attn_metadata.append(attn_metadata)
                for layer_name in attn_group.layer_names:
                    per_layer_attn_metadata[layer_name] = attn_metadata
            return per_group_attn_metadata, per_layer_attn_metadata

    else:

        def build_per_group_and_layer_attn_metadata(
            self,
            common_attn_metadata: CommonAttentionMetadata,
            draft_index: int = 0,
        ) -> tuple[list[object], dict[str, object]]:
            per_group_attn_metadata: list[object] = []
            per_layer_attn_metadata: dict[str, object] = {}
            for attn_group in self.draft_attn_groups:
                gid = attn_group.kv_cache_group_id
                if gid in self._per_group_block_tables:
                    cm = copy(common_attn_metadata)
                    cm.block_table_tensor = self._per_group_block_tables[gid]  # reverted line
                else:
                    cm = common_attn_metadata
                attn_metadata = attn_group.get_metadata_builder().build_for_drafting(
                    common_attn_metadata=cm, draft_index=draft_index
                )
                per_group_attn_metadata.append(attn_metadata)
                for layer_name in attn_group.layer_names:
                    per_layer_attn_metadata[layer_name] = attn_metadata
            return per_group_attn_metadata, per_layer_attn_metadata


GroupSpec = tuple[int, int | None]
"""A KV-cache group as vLLM's spec sees it: page size, sliding window (None: full)."""


@dataclass
class _Drafter:
    """What every step of one engine shares: vLLM's config, tables and drafter."""

    vllm_config: Any
    block_tables: MultiGroupBlockTable  # the runner's persistent per-group tables
    proposer: Gemma4Proposer


def _max_num_blocks(spec: AttentionSpec, vllm_config: Any, max_model_len: int) -> int:
    """A group's pages per request, as the release's runner sizes its table before
    ``MultiGroupBlockTable`` aligns it (``GPUModelRunner.may_reinitialize_input_batch``,
    ``vllm/v1/worker/gpu_model_runner.py``)."""
    if compat.has(compat.MAX_BLOCKS_PER_REQ):
        # 0.26.0 on: the spec says (AttentionSpec: pages of block_size * DCP size).
        return spec.max_num_blocks_per_req(vllm_config, max_model_len)
    # 0.21.0 to 0.25.1: the runner divides by block_size * get_total_cp_world_size().
    from vllm.v1.worker.cp_utils import get_total_cp_world_size

    return cdiv(max_model_len, spec.block_size * get_total_cp_world_size())


def _table_kwargs(
    config: EngineConfig, specs: list[AttentionSpec], vllm_config: Any
) -> dict[str, Any]:
    """``MultiGroupBlockTable``'s arguments, as the release's runner passes them
    (``InputBatch.__init__``, ``vllm/v1/worker/gpu_input_batch.py``)."""
    block_sizes = [s.block_size for s in specs]
    kwargs: dict[str, Any] = dict(
        max_num_reqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        pin_memory=False,
        block_sizes=block_sizes,
        max_num_blocks=[_max_num_blocks(s, vllm_config, config.max_model_len) for s in specs],
    )
    if compat.has(compat.TABLE_MAX_MODEL_LEN):
        # 0.21.0 to 0.25.1 (a required parameter; read only when max_num_blocks is None).
        kwargs["max_model_len"] = config.max_model_len
    if compat.has(compat.TABLE_KERNEL_BLOCK_SIZES):
        # 0.21.0 to 0.31.0: each group's pages as the kernel addresses them. A group
        # without a kernel block size (as the builders here) is not split: its own size.
        kwargs["kernel_block_sizes"] = block_sizes
    return kwargs


def _kv_cache_spec(spec: GroupSpec, num_heads: int, head_dim: int) -> AttentionSpec:
    block_size, window = spec
    common = dict(
        block_size=block_size, num_kv_heads=num_heads, head_size=head_dim, dtype=torch.float32
    )
    if window is None:
        return FullAttentionSpec(**common)
    return SlidingWindowSpec(**common, sliding_window=window)


@functools.lru_cache(maxsize=64)
def _drafter(
    proposer_cls: type[Gemma4Proposer],
    config: EngineConfig,
    groups: tuple[GroupSpec, ...],
    num_heads: int,
    head_dim: int,
    device: str,
) -> _Drafter:
    """vLLM's objects for an engine (cached: a fuzz run meets the same engine often)."""
    vc = _engine.vllm_config(config)
    dev = torch.device(device)
    specs = [_kv_cache_spec(g, num_heads, head_dim) for g in groups]
    with set_current_vllm_config(vc):
        # As the model runner sizes them (GPUModelRunner.may_reinitialize_input_batch):
        # rows for max_num_seqs requests, each spec's pages per request.
        tables = MultiGroupBlockTable(device=dev, **_table_kwargs(config, specs, vc))
        attn_groups = []
        for gid, spec in enumerate(specs):
            group = AttentionGroup(
                backend=TritonAttentionBackend,
                layer_names=[f"draft.layers.{gid}.self_attn.attn"],
                kv_cache_spec=spec,
                kv_cache_group_id=gid,
            )
            group.create_metadata_builders(vc, dev)
            attn_groups.append(group)
    # Made without its constructor, which loads a draft model. The two attributes
    # set are all that set_per_group_block_table and build_per_group_and_layer_attn_metadata
    # read: draft_attn_groups (what Gemma4Proposer.initialize_attn_backend builds, one
    # AttentionGroup per KV-cache spec) and _per_group_block_tables (what __init__
    # creates empty and the runner fills through set_per_group_block_table).
    proposer = object.__new__(proposer_cls)
    proposer.draft_attn_groups = attn_groups
    proposer._per_group_block_tables = {}
    return _Drafter(vc, tables, proposer)


def _slot_mapping(
    table: np.ndarray,
    query_start_loc: np.ndarray,
    seq_lens: np.ndarray,
    block_size: int,
    T_pad: int,
) -> np.ndarray:
    """The slots of the step's tokens in one group's pages; padded tokens map to -1."""
    slots = np.full(T_pad, -1, dtype=np.int64)
    for r in range(len(seq_lens)):
        start, end = int(query_start_loc[r]), int(query_start_loc[r + 1])
        pos = np.arange(int(seq_lens[r]) - (end - start), int(seq_lens[r]))
        slots[start:end] = table[r, pos // block_size].astype(np.int64) * block_size
        slots[start:end] += pos % block_size
    return slots


def _store_table(table: Any, group: KVCacheGroup, num_reqs_padded: int) -> torch.Tensor:
    """The case's stored rows in vLLM's persistent table; the runner's padded view of it."""
    rows = group.block_table.cpu().numpy()
    if rows.shape[1] != table.max_num_blocks_per_req:
        raise ValueError(
            f"the case's table has {rows.shape[1]} columns, vLLM's {table.max_num_blocks_per_req}"
            " (reference/draft_block_tables.py:table_width sizes them as vLLM does)"
        )
    # The host rows as the runner's add_row/condense leave them (stale ids past a
    # request's pages included), then vLLM's own copy to the device.
    table.block_table.np[:num_reqs_padded] = rows
    table.commit_block_table(num_reqs_padded)
    return table.get_device_tensor(num_reqs_padded)


def _propose(inp: DraftBlockTablesInputs, proposer_cls: type[Gemma4Proposer]) -> list[Any]:
    """Per group, the attention metadata vLLM's drafter builds for the step."""
    H, D = inp.q.shape[1], inp.q.shape[2]
    groups = tuple((g.block_size, g.sliding_window) for g in inp.groups)
    device = inp.q.device
    drafter = _drafter(proposer_cls, inp.config, groups, H, D, str(device))
    R, R_pad, T, T_pad = inp.num_real_reqs, inp.num_reqs, inp.num_real_tokens, inp.num_actual_tokens

    # GPUModelRunner._build_attention_metadata: every group's padded table is handed
    # to the drafter; its common metadata is the padded step's with the table of the
    # drafter's own group (kv_cache_gid: its first attention group, here group 0).
    stored = []
    for gid, (table, group) in enumerate(
        zip(drafter.block_tables.block_tables, inp.groups, strict=True)
    ):
        stored.append(_store_table(table, group, R_pad))
        drafter.proposer.set_per_group_block_table(gid, stored[gid])
    query_start_loc_cpu = inp.query_start_loc.cpu()
    seq_lens_cpu = inp.seq_lens.cpu()
    kv_gid = drafter.proposer.draft_attn_groups[0].kv_cache_group_id
    slots = _slot_mapping(
        inp.groups[kv_gid].block_table.cpu().numpy(),
        query_start_loc_cpu.numpy(),
        seq_lens_cpu.numpy()[:R],
        inp.groups[kv_gid].block_size,
        T_pad,
    )
    cm = CommonAttentionMetadata(
        query_start_loc=inp.query_start_loc,
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens=inp.seq_lens,
        num_reqs=R_pad,
        num_actual_tokens=T_pad,
        max_query_len=int(torch.diff(query_start_loc_cpu).max()),
        max_seq_len=inp.max_seq_len,
        block_table_tensor=stored[kv_gid],
        slot_mapping=torch.as_tensor(slots).to(device),
        seq_lens_cpu_upper_bound=seq_lens_cpu,
    )
    if R != R_pad or T != T_pad:  # the runner's condition, gpu_model_runner.py
        cm = cm.unpadded(T, R)
    per_group, _ = drafter.proposer.build_per_group_and_layer_attn_metadata(cm)
    return per_group


def _attention(inp: DraftBlockTablesInputs, group: KVCacheGroup, m: Any) -> torch.Tensor:
    """One group's attention over the metadata vLLM built, as its attention layer
    consumes it (``q[:num_actual_tokens]``): FlashAttention's argument checks, then
    the reference's varlen paged attention (the Triton model of it costs ten times
    as much under the interpreter, and is judged as the ``triton`` implementation)."""
    q = inp.q[: m.num_actual_tokens]
    kernels.check_varlen_arguments(
        q,
        group.key_cache,
        group.value_cache,
        m.query_start_loc,
        m.seq_lens,
        m.block_table,
        group.sliding_window,
    )
    host = [t.cpu().numpy() for t in (q, group.key_cache, group.value_cache)]
    meta = [t.cpu().numpy() for t in (m.query_start_loc, m.seq_lens, m.block_table)]
    out = attention(*host, *meta, group.sliding_window, inp.softmax_scale)
    return torch.as_tensor(out).to(q.device)


def _run(
    inp: DraftBlockTablesInputs, proposer_cls: type[Gemma4Proposer]
) -> DraftBlockTablesOutputs:
    per_group = _propose(inp, proposer_cls)
    metadata = [
        GroupAttentionMetadata(m.query_start_loc, m.seq_lens, m.block_table) for m in per_group
    ]
    out = [_attention(inp, group, m) for group, m in zip(inp.groups, per_group, strict=True)]
    return DraftBlockTablesOutputs(metadata, out)


def run(inputs: DraftBlockTablesInputs) -> DraftBlockTablesOutputs:
    """The installed release's ``Gemma4Proposer.build_per_group_and_layer_attn_metadata``."""
    return _run(inputs, Gemma4Proposer)


def upstream_pr43982_padded_table(inputs: DraftBlockTablesInputs) -> DraftBlockTablesOutputs:
    """The same with #43982 reverted: each group's stored padded table handed on unsliced."""
    return _run(inputs, Gemma4ProposerBefore43982)


def prepare() -> None:
    """Import vLLM and validate the base configs before a judge forks its children."""
    _engine.prepare()


__all__ = ["Gemma4ProposerBefore43982", "prepare", "run", "upstream_pr43982_padded_table"]
