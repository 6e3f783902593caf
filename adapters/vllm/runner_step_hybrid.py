"""vLLM's model runner V1 step of a hybrid model, as the implementation ``vllm-v1-hybrid``
of ``runner-step``.

The engine of :mod:`.runner_step_v1`, whose model also has a linear-attention layer: a
second KV-cache group of a ``MambaSpec`` on the ``GDNAttentionBackend``
(``vllm/v1/attention/backends/gdn_attn.py``), as ``initialize_kv_cache`` gives a
Qwen3-Next-style model one. The runner's own ``_build_attention_metadata`` then calls
``GDNAttentionMetadataBuilder`` for that group on every step: eager, padded for the
graph (``build``, with the runner's ``num_accepted_tokens`` and
``num_decode_draft_tokens``), in the capture runs (``build_for_cudagraph_capture``),
replayed, and on the fresh engine. Every field of its metadata that a kernel reads is
reported in the step's builds beside the attention layer's, padding rows included, and
judged by the same properties. ``initialize_attn_backend`` keeps the mode the two
backends allow: GDN supports FULL graphs of uniform batches only
(``AttentionCGSupport.UNIFORM_BATCH``), so a FULL mode becomes FULL_AND_PIECEWISE.

The group's cache mode is ``mamba_cache_mode="none"``, a hybrid model served with
``--no-enable-prefix-caching`` (with prefix caching, on by default,
``MambaModelConfig.verify_and_update_config`` sets ``"align"``: ``vllm-v1-mamba2-align``,
:mod:`.runner_step_mamba_align`): each request
holds ``1 + num_spec`` state blocks (``MambaSpec.max_num_blocks_per_req``), given to it
when it is scheduled new and kept while it runs (``MambaManager``), from the one block
pool the attention pages come from. Here the state blocks sit above the attention
pages, a request taking the lowest free state slot when it is new to the engine (an
arrival or a resumption); a request left out of a step was preempted, its slot freed.

A GDN metadata field's rows are the step's requests, tokens or request offsets where
the batch is of one kind (all speculative decodes, or no speculative one); in a mixed
batch the builder splits them (``spec_*`` and ``non_spec_*``) and its sub-batches have
fewer rows than the step: no graph pads such a batch (GDN's FULL graphs are uniform
decodes), so each build holds the same rows, compared whole.

The accepted counts the runner hands the builder are its defaults (1): ``sample_tokens``
runs (as in ``vllm-v1``), but ``_update_states_after_model_execute`` sets them only for
a model whose config is hybrid, which the stand-in model's config is not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import (
    held_between_steps,
    num_blocks,
    prefill_then_decode,
)
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

LINEAR_LAYER = "model.layers.1.linear_attn"  # the GDN layer of the second KV-cache group
NULL_BLOCK_ID = 0  # vllm/v1/attention/backends/utils.py


def prepare() -> None:
    """Import vLLM's V1 runner and the GDN backend before a judge forks."""
    v1.prepare()
    import vllm.v1.attention.backends.gdn_attn  # noqa: F401


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1``; a step GDN builds as a
    prefill in a FULL decode graph is ``vllm-v1-hybrid-prefill-in-decode-graph``'s (a
    finding kept apart)."""
    if prefill_in_decode_graph(case.config, case.batch):
        return (
            "a first chunk in a uniform batch a FULL graph replays: GDN builds it as a "
            "prefill, the graph's buffers stale (kept apart as "
            "vllm-v1-hybrid-prefill-in-decode-graph)"
        )
    return v1.declines(case)


def declines_engine(case: Case) -> str | None:
    """Why this engine does not run ``case``: as ``vllm-v1``."""
    return v1.declines(case)


_FULL_MODES = ("FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY")


def prefill_in_decode_graph(config: EngineConfig, batch: Batch) -> bool:
    """The V1 runner replays a FULL graph for the step (``_is_uniform_decode``: every
    query ``next_n`` tokens, within the largest capture size), and GDN builds a request
    of it as a prefill, which ``GDNAttentionMetadataBuilder.build`` does not stage in
    the graph's buffers (``_stage_decode`` and ``_stage_spec_decode`` need no prefill):
    without drafts, a first chunk (no prior state: ``seq_len <= query_len`` while it is
    prefilling); with drafts, any request of the step that carries none (a prompt
    chunk of ``next_n`` tokens, counted as a prefill beside speculative decodes)."""
    from attnfuzz.reference.persistent_batch import new_to_engine

    if config.runner != "v1" or config.cudagraph_mode not in _FULL_MODES:
        return False
    uniform = all(q == config.next_n for q in batch.q_lens)
    if not uniform or sum(batch.q_lens) > max(config.cudagraph_capture_sizes, default=0):
        return False
    new = new_to_engine(batch)
    if config.num_spec:
        return any(new)
    return any(n and c == 0 for n, c in zip(new, batch.num_computed_tokens, strict=True))


def state_blocks(config: EngineConfig, slot: int) -> list[int]:
    """The ``1 + num_spec`` state blocks of state slot ``slot``: above the attention
    pages (:func:`.runner_step.num_blocks`) in the one pool."""
    per = 1 + config.num_spec
    return [num_blocks(config) + slot * per + j for j in range(per)]


class _HybridEngine(v1._Engine):
    """A V1 runner whose model has an attention layer and a GDN layer."""

    states: dict[str, int]  # each request's state slot: shared by the three engines

    def __init__(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        self.states = {}
        super().__init__(config, device, mode)

    def more_groups(self) -> list[tuple[type, str, Any]]:
        self.recorder.linear_layer = LINEAR_LAYER
        backend, spec = self.linear_group()
        return [(backend, LINEAR_LAYER, spec)]

    def linear_group(self) -> tuple[type, Any]:
        """The linear-attention layer's backend and ``MambaSpec``: GDN's."""
        from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend
        from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
        from vllm.v1.kv_cache_interface import MambaSpec

        # A GDN layer's states: the conv state (width - 1 + num_spec rows; width 4)
        # and the recurrent state; their sizes reach no metadata.
        spec = MambaSpec(
            block_size=self.config.max_model_len,
            shapes=((3 + self.config.num_spec, 8), (1, 4, 4)),
            dtypes=(torch.float32, torch.float32),
            mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
            mamba_cache_mode="none",
            num_speculative_blocks=self.config.num_spec,
        )
        return GDNAttentionBackend, spec

    def pool_size(self) -> int:
        return num_blocks(self.config) + self.config.max_num_seqs * (1 + self.config.num_spec)

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # GDN's UNIFORM_BATCH support: _check_and_update_cudagraph_mode turns FULL into
        # FULL_AND_PIECEWISE (FULL graphs for uniform decodes, piecewise otherwise).
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def output(self, inputs: RunnerStepInputs) -> Any:
        """The step's scheduler output with the GDN group's block ids: a request new to
        the engine (arriving, or resumed with all it holds) its state blocks, a running
        one none (it keeps them)."""
        out = super().output(inputs)

        def blocks(rid: str) -> list[int]:
            slot = self.states.get(rid)  # a fresh engine's placeholder has none: the null
            return [NULL_BLOCK_ID] if slot is None else state_blocks(self.config, slot)

        for new in out.scheduled_new_reqs:
            new.block_ids = (*new.block_ids, blocks(new.req_id))
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if rid in cached.resumed_req_ids:
                cached.new_block_ids[i] = (*cached.new_block_ids[i], blocks(rid))
            elif cached.new_block_ids[i] is not None:
                cached.new_block_ids[i] = (*cached.new_block_ids[i], [])
        return out

    def fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        return super().fields(seen) + self.linear_fields(seen)

    def linear_fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        """Every field of the linear layer's metadata a kernel reads: GDN's."""
        return _linear_fields(self.config, seen, self.pool_size())


def _linear_fields(config: EngineConfig, seen: v1._Seen, pool: int) -> tuple[Field, ...]:
    """Every tensor of the GDN metadata a kernel reads, with what the kernel accepts.
    The consumers are ``GatedDeltaNetAttention._forward_core`` and its decode paths
    (``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``) and the kernels they
    call with these fields."""
    m = seen.linear
    if m is None:
        return ()
    tokens_pad = int(seen.positions.shape[0])
    out = []

    def add(name: str, rows: str, accepts: tuple[int, int] | None, state: bool = False) -> None:
        value = getattr(m, name, None)
        if isinstance(value, torch.Tensor):
            out.append(Field(
                f"gdn.{name}", rows, v1._np(value), accepts, writes_state=state,
                null_slot=NULL_BLOCK_ID if state else None,
            ))  # fmt: skip

    # causal_conv1d.py _causal_conv1d_update_kernel: a state index is a line of the
    # conv state cache (every block of the pool), and null_block_id (0) skips the row;
    # fused_recurrent_gated_delta_rule reads the recurrent state at the same index and
    # writes the final state back there (both skip an index <= 0): each request's
    # state, updated in place (Field.writes_state; the null block is no request's).
    states = (NULL_BLOCK_ID, pool - 1)
    add("spec_state_indices_tensor", "requests", states, state=True)
    add("non_spec_state_indices_tensor", "requests", states, state=True)
    add("prefill_state_indices", "requests", states, state=True)
    # ... query_start_loc: a sequence's tokens are x[qsl[i] : qsl[i + 1]] of the token
    # rows the layer is handed (its padded tokens included).
    add("spec_query_start_loc", "offsets", (0, tokens_pad))
    add("non_spec_query_start_loc", "offsets", (0, tokens_pad))
    add("prefill_query_start_loc", "offsets", (0, tokens_pad))
    # ... num_accepted_tokens: the conv state is read from offset accepted - 1 onwards,
    # through width - 1 + num_spec rows: 1 <= accepted <= 1 + num_spec.
    add("num_accepted_tokens", "requests", (1, 1 + config.num_spec))
    # _forward_core: mixed_qkv.index_select(0, spec_token_indx / non_spec_token_indx),
    # indices into the layer's token rows.
    add("spec_token_indx", "tokens", (0, tokens_pad - 1))
    add("non_spec_token_indx", "tokens", (0, tokens_pad - 1))
    # Masks and flags: any value is a mask (a bool or 0/1).
    add("spec_sequence_masks", "requests", None)
    add("has_initial_state", "requests", None)
    add("prefill_has_initial_state", "requests", None)
    return tuple(out)


class HybridRunnerStepEngine(v1.RunnerStepEngine):
    """``vllm-v1``'s three engines, of a hybrid model; the requests' state slots kept
    across the steps and shared by the three."""

    engine_type = _HybridEngine

    def new_engine(self) -> None:
        super().new_engine()
        self.states: dict[str, int] = {}

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> v1._Engine:
        made = super().engine(config, device, mode)
        assert isinstance(made, _HybridEngine)
        made.states = self.states
        return made

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        if self.key != (inputs.config, inputs.device):
            self.states.clear()
        self._assign(inputs)
        return super().__call__(inputs)

    @staticmethod
    def warm_computed(computed: int) -> int:
        """Each running request a first chunk of one token in the warm-up: GDN's
        ``reorder_batch_threshold`` makes the runner reorder its batch
        (``reorder_batch_to_split_decodes_and_prefills``: extends first, first chunks
        last), which would move the rows of a warm-up mixing first chunks (a request of
        one computed token) and extends; all first chunks stay in their rows. The step
        itself sees the same request (its computed tokens from the scheduler output,
        done prefilling in both engines)."""
        return 0

    def _assign(self, inputs: RunnerStepInputs) -> None:
        """``MambaManager``: a request new to the engine takes the lowest state slot no
        running request of the step holds; one left out of the step is preempted."""
        ids = [str(rid) for rid in inputs.req_ids]
        running = {
            rid: self.states[rid] for rid, new in zip(ids, inputs.is_new, strict=True) if not new
        }
        taken = set(running.values())
        free = (s for s in range(inputs.config.max_num_seqs) if s not in taken)
        for rid, new in zip(ids, inputs.is_new, strict=True):
            if new:
                running[rid] = next(free)
        self.states.clear()
        self.states.update(running)


ENGINE = HybridRunnerStepEngine()
"""The engine of the implementation ``vllm-v1-hybrid`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-hybrid`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- a finding kept apart (docs/findings.md): V1's _dummy_run builds the linear layer's
# metadata from the persistent batch's block-table rows (commit_block_table), which hold
# the requests the engine holds: the dummy request of row 0 names the state block of
# the request in row 0, which the layer's kernels update in place. V2 zeroes a dummy
# run's rows (BlockTables.get_dummy_block_tables).


dummy_held_rows = v1.judging_held(
    HybridRunnerStepEngine,
    "``vllm-v1-hybrid-dummy-held-rows``: ``vllm-v1-hybrid`` with its dummy runs between "
    "steps judged against the requests it holds.",
)


def reach_dummy_run(found: Trace | Case) -> bool:
    """A V1 engine: an idle data-parallel rank runs a dummy step between two real ones."""
    return found.config.runner == "v1"


def trigger_dummy_held_rows(found: Trace | Case) -> bool:
    """A request of one step that the next step runs on: the engine holds it, in its
    persistent batch, through the dummy run between them."""
    return reach_dummy_run(found) and held_between_steps(found)


def smallest_dummy_held_rows() -> Trace:
    """One request prefills 5 tokens, then decodes one: the dummy run between the two
    names the request's state block."""
    return prefill_then_decode("v1", 0)


# -- mutants: GDNAttentionMetadataBuilder.build with one line of its FULL-graph staging
# changed (the staged buffers are the persistent ones a FULL graph replays).


def _staged(meta: Any, builder: Any) -> bool:
    """``build`` put the speculative decodes into the FULL graph buffers."""
    return meta.spec_state_indices_tensor is not None and builder._stage_spec_decode(
        meta.num_prefills, meta.num_decodes, meta.num_spec_decodes, meta.num_spec_decode_tokens
    )


def _pad_slot_padding(meta: Any) -> None:
    """The padding rows' state indices filled with PAD_SLOT_ID (-1), not NULL_BLOCK_ID:
    ``causal_conv1d_update`` skips only the null block, so it reads line -1."""
    meta.spec_state_indices_tensor[meta.num_spec_decodes :].fill_(-1)


def _last_state_nulled(meta: Any) -> None:
    """The null fill starting one row early: the last real request's state indices are
    the null block's, its state neither read nor written."""
    meta.spec_state_indices_tensor[meta.num_spec_decodes - 1 :].fill_(NULL_BLOCK_ID)


def _padding_repeats_last(meta: Any) -> None:
    """The padding rows' state indices a copy of the last real request's, not the null
    block: each padding row's kernels read and update that request's state in place."""
    spec = meta.spec_state_indices_tensor
    spec[meta.num_spec_decodes :] = spec[meta.num_spec_decodes - 1]


@contextlib.contextmanager
def _mutated(change: Callable[[Any], None]) -> Iterator[None]:
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    original = GDNAttentionMetadataBuilder.build

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        meta = original(self, *args, **kwargs)
        if _staged(meta, self):
            change(meta)
        return meta

    with mock.patch.object(GDNAttentionMetadataBuilder, "build", build):
        yield


class _Mutated:
    """A hybrid engine whose GDN builder's metadata ``change`` alters after each build."""

    def __init__(self, change: Callable[[Any], None]) -> None:
        self.change, self.engine = change, HybridRunnerStepEngine()

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        with _mutated(self.change):
            return self.engine(inputs)


_PAD_SLOT = _Mutated(_pad_slot_padding)
_LAST_STATE = _Mutated(_last_state_nulled)
_REPEATS_LAST = _Mutated(_padding_repeats_last)


def pad_slot_padding(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-hybrid-pad-slot-states``: padding rows of a FULL decode's GDN state
    indices hold -1 (safe padding)."""
    return _PAD_SLOT(inputs)


pad_slot_padding.new_engine = _PAD_SLOT.engine.new_engine  # type: ignore[attr-defined]


def last_state_nulled(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-hybrid-last-state-nulled``: a FULL decode's last real request's GDN
    state indices are the null block (padding invariance, replay equals eager)."""
    return _LAST_STATE(inputs)


last_state_nulled.new_engine = _LAST_STATE.engine.new_engine  # type: ignore[attr-defined]


def padding_repeats_last(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v1-hybrid-padding-repeats-last``: the padding rows of a FULL decode's GDN
    state indices name the last real request's state (padding writes no real state)."""
    return _REPEATS_LAST(inputs)


padding_repeats_last.new_engine = _REPEATS_LAST.engine.new_engine  # type: ignore[attr-defined]


def reach_full_spec_decode(trace: Trace | Case) -> bool:
    """A V1 engine with FULL graphs and drafts: GDN stages its speculative decodes in
    the FULL graph buffers."""
    return reach_full_graphs(trace) and trace.config.num_spec >= 1


def trigger_full_spec_decode(trace: Trace | Case) -> bool:
    """A step every request of which decodes its drafts (a uniform speculative decode)
    that a FULL graph holds."""
    from attnfuzz.reference.persistent_batch import new_to_engine

    c = trace.config
    largest = max(c.cudagraph_capture_sizes, default=0)
    return reach_full_spec_decode(trace) and any(
        all(q == 1 + c.num_spec for q in b.q_lens)
        and sum(b.q_lens) <= largest
        and not any(new_to_engine(b))
        for b in _batches(trace)
    )


def _batches(found: Trace | Case) -> list[Batch]:
    """The steps of a trace, or a case's one step."""
    return [found.batch] if isinstance(found, Case) else list(found.steps)


def reach_full_graphs(trace: Trace | Case) -> bool:
    """A V1 engine with FULL graphs and pages the Triton backend runs."""
    c = trace.config
    return c.runner == "v1" and c.cudagraph_mode in _FULL_MODES and c.block_size % 16 == 0


def trigger_prefill_in_decode_graph(trace: Trace | Case) -> bool:
    return reach_full_graphs(trace) and any(
        prefill_in_decode_graph(trace.config, b) for b in _batches(trace)
    )


def smallest_prefill_in_decode_graph() -> Trace:
    """Seed 0's minimized witness: one request of a one-token prompt, no drafts, on an
    engine whose FULL decode graph holds one token: the replay reads the capture's null
    state index where the eager build has the request's state block."""
    config = EngineConfig(
        max_model_len=8, max_num_seqs=1, max_num_batched_tokens=1, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(1,), cudagraph_mode="FULL", cg_support="ALWAYS",
        runner="v1",
    )  # fmt: skip
    return Trace(config, (Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,)),))


def smallest_full_spec_decode() -> Trace:
    """One request prefills 5 tokens, then decodes next_n = 2 tokens, padded to the
    FULL decode graph of 4 tokens (2 requests)."""
    return prefill_then_decode("v1", 1)


def trigger_full_decode(trace: Trace | Case) -> bool:
    """A step every request of which decodes (``next_n`` tokens, none new to the
    engine) that a FULL graph holds: the graph replays its decode metadata (a linear
    builder stages it in the graph's buffers first)."""
    from attnfuzz.reference.persistent_batch import new_to_engine

    c = trace.config
    largest = max(c.cudagraph_capture_sizes, default=0)
    return reach_full_graphs(trace) and any(
        all(q == c.next_n for q in b.q_lens) and sum(b.q_lens) <= largest
        and not any(new_to_engine(b))
        for b in _batches(trace)
    )  # fmt: skip


def smallest_full_decode() -> Trace:
    """One request prefills 3 tokens, then decodes one, padded to the FULL decode graph
    of 2 tokens (2 requests)."""
    config = EngineConfig(
        max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2,), cudagraph_mode="FULL_AND_PIECEWISE",
        runner="v1",
    )  # fmt: skip
    return Trace(
        config,
        (
            Batch((0,), (3,), req_ids=(7,), pages=((1,),), new_pages=(1,)),
            Batch((3,), (1,), req_ids=(7,), pages=((1,),), new_pages=(0,)),
        ),
    )
