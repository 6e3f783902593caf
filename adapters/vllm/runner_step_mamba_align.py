"""vLLM's model runner V1 step of a hybrid model with prefix caching on, as the
implementations ``vllm-v1-mamba2-align`` (a Mamba2 layer) and ``vllm-v1-hybrid-align`` (a
GDN layer, Qwen3-Next's) of ``runner-step``.

``vllm-v1-mamba2`` models a hybrid model served with ``--no-enable-prefix-caching``
(``mamba_cache_mode="none"``: one state block a request, for its life). Prefix caching
is on by default for a generative model (``EngineArgs``: ``is_prefix_caching_supported``),
and ``MambaModelConfig.verify_and_update_config`` then sets ``mamba_cache_mode="align"``
and ``mamba_block_size`` to the attention block size
(``model_executor/models/config.py``): the Mamba group's block table is as long as the
attention one, the state of a request's last computed token lives in the block of that
token (``mamba_get_block_table_tensor``: column ``(seq_len - 1) // block_size``), and
each step that moves a request into a new block first copies its running state there.
These implementations are that configuration: the engines of :mod:`.runner_step_linear`
(a Mamba2 layer in a second KV-cache group) and :mod:`.runner_step_hybrid` (a GDN layer)
with ``enable_prefix_caching``, ``mamba_cache_mode="align"`` and ``mamba_block_size`` as
vLLM sets them, so that every step runs, besides the builders, the runner's own
``preprocess_mamba`` (``v1/worker/mamba_utils.py``: ``cleanup_mamba_state_idx``, the
previous and current state block of each request, ``collect_mamba_copy_meta`` with the
model's ``MambaStateCopyFuncCalculator`` copy functions of its layer,
``do_mamba_copy_block``'s ``batch_memcpy`` Triton kernel under Triton's interpreter,
from the blocks' addresses).

The scheduler's side, ``MambaManager`` in align mode (``v1/core/single_type_kv_cache_
manager.py``), is modelled here (:class:`AlignScheduler`): a request's list holds a block
at the index of its last scheduled token, ``num_spec`` speculative blocks past it, and
null blocks before it (``allocate_new_blocks``: ``cdiv(num_tokens, block_size) +
num_speculative_blocks`` entries; a step that crosses into a new block takes a new one
and moves the speculative blocks left behind to the end of the list,
``_relocate_speculative_block``); the blocks before the one of a request's last computed
token are freed at its next step (``remove_skipped_blocks``, ``last_state_block_idx``),
a finished or preempted request's at once, and a freed block is handed out again (first
freed, first reused). A request new to the engine with computed tokens is a prefix-cache
hit, of whole blocks (``find_longest_cache_hit``): its list holds the hit's block at
index ``hit // block_size - 1``, whose state is the prefix's (put there as the cache
holds it). The layer exports no prefill checkpoints (``num_prefill_checkpoint_blocks``
0: FlashInfer's GDN prefill alone does).

The state itself: the layer's conv and temporal (SSM, recurrent) state caches are real
tensors of the pool's blocks, bound as ``bind_kv_cache`` binds them (the layer in the
static forward context), so that the runner's copies move real bytes. The model's
forward stands in for the layer's kernels' one effect on them (:func:`kernel_states`):
each real request's state block (Mamba2's ``mamba2.state_by_request``, GDN's
``non_spec_state_indices_tensor``) is read, then holds the state after the step's tokens
(``(request, seq_len)``); a speculative decode (GDN's ``spec_state_indices_tensor``
row) reads the state of its accepted count and keeps the state after each of its
tokens. Fields: the base engine's, and by request ``<layer>.state_left`` (the state the
request left: ``(request, computed tokens)``, -1 for a request with none, whose first
chunk reads no state) with ``<layer>.conv_found`` and ``<layer>.temporal_found``, what
each state cache holds where the kernels read (*agreement within a build*: a request
reads the state it left, carried across blocks by the runner's copies). The fresh engine
(history invariance) has no history of states: its builds carry no such field, nor
``num_accepted_tokens`` (its warm-up accepts no drafts).

With drafts (``vllm-v1-hybrid-align``; Mamba2's engine takes none) the model's registry
entry says hybrid (``ModelConfig.is_hybrid``), as a real hybrid model's does, so that the
runner drives a hybrid model's spec decode in align mode (``v1/worker/mamba_utils.py``):
``MambaBuffers.postprocess_align``'s ``MambaSpecDecodeGPUContext`` over the state caches'
addresses, ``preprocess_mamba``'s fused pre-copy (``precopy_mamba_align_fused_kernel``,
the state of the accepted drafts moved into a request's new block),
``stage_postprocess_inputs_to_gpu``, and after sampling ``postprocess_mamba_align_gpu``
(``postprocess_mamba_fused_kernel``: the state at a block boundary the accepted tokens
reached copied into that block, the accepted counts the next step reads), all under
Triton's interpreter.

Declined beyond the base engine, what the scheduler never sends in align mode: a prefill
chunk short of its prompt's end that ends inside a block
(``Scheduler._mamba_block_aligned_split`` ends such a chunk on a block boundary, unless
a block is wider than the step's token budget and the chunk stays in its first block),
and a request new to the engine whose computed tokens are not whole
blocks (a hit is ``(i + 1) * block_size`` tokens).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
from collections import deque
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm import runner_step_linear as linear
from attnfuzz.adapters.vllm import runner_step_v1 as v1
from attnfuzz.adapters.vllm.runner_step import num_blocks
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.persistent_batch import new_to_engine
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

NULL_BLOCK_ID = hybrid.NULL_BLOCK_ID
LINEAR = linear.BACKENDS["mamba2"]
TAG = 1 << 20
"""A state's tag: ``(request + 1) * TAG + tokens`` (the tokens a state holds are below
it; a state no request left, all zeros, is 0)."""


def tag(rid: str | int, tokens: int) -> int:
    """The state of request ``rid`` after its first ``tokens`` tokens."""
    return (int(rid) + 1) * TAG + tokens


def prepare() -> None:
    """Import vLLM's V1 runner, the Mamba2 backend and the align-mode copies."""
    linear.prepare()
    import vllm.v1.worker.mamba_utils  # noqa: F401


def declines(case: Case) -> str | None:
    """Why this engine does not run ``case``: what the scheduler never sends in align
    mode (module docstring), then as ``vllm-v1-mamba2``."""
    return declines_align(case.config, case.batch) or linear.declines(case)


def declines_gdn(case: Case) -> str | None:
    """As :func:`declines`, of ``vllm-v1-hybrid``'s engine."""
    return declines_align(case.config, case.batch) or hybrid.declines(case)


def declines_align(config: EngineConfig, batch: Batch) -> str | None:
    """The steps ``Scheduler.schedule`` does not make for a model with Mamba layers in
    align mode (``v1/core/sched/scheduler.py``)."""
    bs = config.block_size
    prompts = batch.prompt_lens or (0,) * batch.num_reqs
    steps = zip(new_to_engine(batch), batch.num_computed_tokens, batch.q_lens, prompts,
                strict=True)  # fmt: skip
    for new, computed, q, prompt in steps:
        if new and computed % bs:
            return (
                f"a request new to the engine with {computed} computed tokens: a prefix hit "
                f"of a hybrid model in align mode is whole blocks of {bs} "
                "(MambaManager.find_longest_cache_hit)"
            )
        end = computed + q
        within_first = bs > config.max_num_batched_tokens and end // bs * bs <= computed
        if q and end < prompt and end % bs and not within_first:
            return (
                f"a prefill chunk ending at {end}, inside a block of {bs}, short of its "
                f"prompt of {prompt}: in align mode the scheduler ends it on a block "
                "boundary (Scheduler._mamba_block_aligned_split)"
            )
    return None


class AlignScheduler:
    """``MambaManager``'s block lists in align mode, for the three engines of a step
    (module docstring): ``blocks`` the scheduler's lists (freed blocks nulled),
    ``sent`` what each engine's runner holds (its block table is append-only), ``held``
    the lists before the step's gains, ``seeds`` the prefix hits' states to put in
    place. With drafts each list ends in ``num_spec`` speculative blocks past the
    running one (``num_speculative_blocks``)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        first = num_blocks(config)  # the state blocks sit above the attention pages
        self.free: deque[int] = deque(range(first, first + state_blocks(config)))
        self.blocks: dict[str, list[int]] = {}
        self.sent: dict[str, list[int]] = {}
        self.held: dict[str, list[int]] = {}
        self.gained: dict[str, list[int]] = {}
        self.seeds: dict[int, int] = {}
        # MambaManager's own books: last_state_block_idx, _num_retired_blocks,
        # _allocated_block_reqs.
        self.last_state: dict[str, int] = {}
        self.retired: dict[str, int] = {}
        self.allocated: set[str] = set()
        self.scheduled: dict[str, int] = {}  # the step's tokens of each request
        self.computed: dict[str, int] = {}  # and its computed tokens before it

    def _take(self) -> int:
        if not self.free:
            raise RuntimeError("attnfuzz: the Mamba state blocks ran out (adapter bug)")
        return self.free.popleft()

    def _release(self, rid: str) -> None:
        self.free.extend(b for b in self.blocks.pop(rid, []) if b != NULL_BLOCK_ID)
        self.sent.pop(rid, None)
        self.last_state.pop(rid, None)
        self.retired.pop(rid, None)
        self.allocated.discard(rid)

    def _free(self, row: list[int], index: int) -> None:
        if row[index] != NULL_BLOCK_ID:
            self.free.append(row[index])
            row[index] = NULL_BLOCK_ID

    def _remove_skipped(self, rid: str, computed: int) -> None:
        """``MambaManager.remove_skipped_blocks``: the blocks before the one of the last
        computed token (``get_num_skipped_tokens``: ``computed - 1``), from the retired
        mark on (``_remove_blocks_in_range``), then the block allocated two steps ago
        (``last_state_block_idx``) once it lies before that one."""
        row, bs = self.blocks[rid], self.config.block_size
        if computed - 1 > 0:
            last = min((computed - 1) // bs, len(row))
            first = self.retired.get(rid, 0)
            if first < last:
                for i in range(first, last):
                    self._free(row, i)
                self.retired[rid] = last
        index = self.last_state.get(rid)
        if index is not None and index < -(-computed // bs) - 1:
            self._free(row, index)

    def _allocate(self, rid: str, tokens: int) -> None:
        """``MambaManager.allocate_new_blocks`` in align mode, of ``tokens`` (computed
        and scheduled, drafts included): the running block at the index of the last
        token, null blocks before it, ``num_spec`` speculative blocks past it; the
        previous step's speculative blocks that now lie before the running one move to
        the end of the list (``_relocate_speculative_block``)."""
        row, spec = self.blocks[rid], self.config.num_spec
        required = -(-tokens // self.config.block_size) + spec
        if required <= len(row):  # over-allocated by drafts rejected since
            self.allocated.add(rid)
            return
        before = len(row)
        running = rid in self.allocated
        if running:
            self.last_state[rid] = before - 1 - spec
        elif before:  # a prefix hit: its last block holds the hit's state
            self.last_state[rid] = before - 1
        skipped = required - spec - 1
        row += [NULL_BLOCK_ID] * (skipped - before)
        if running:
            for i in range(before - spec, before):
                if i >= skipped:
                    break
                row.append(row[i])
                row[i] = NULL_BLOCK_ID
        row += [self._take() for _ in range(required - len(row))]
        self.allocated.add(rid)

    def step(self, inputs: RunnerStepInputs) -> None:
        """The lists after the scheduler's ``allocate_slots`` of the step ``inputs``."""
        bs = self.config.block_size
        ids = [str(r) for r in inputs.req_ids]
        running = {rid for rid, new in zip(ids, inputs.is_new, strict=True) if not new}
        for rid in [r for r in self.blocks if r not in running]:
            self._release(rid)  # finished, preempted, or back from preemption anew
        self.held = {rid: list(self.sent[rid]) for rid in running}
        self.gained, self.seeds = {}, {}
        self.scheduled = dict(zip(ids, inputs.query_lens, strict=True))
        self.computed = dict(zip(ids, inputs.num_computed_tokens, strict=True))
        steps = zip(ids, inputs.is_new, inputs.num_computed_tokens, inputs.query_lens,
                    strict=True)  # fmt: skip
        for rid, new, computed, q in steps:
            row = self.blocks.setdefault(rid, [])
            self._remove_skipped(rid, computed)
            if new and computed:  # a prefix hit: the block of its last token holds it
                hit = self._take()
                row += [NULL_BLOCK_ID] * (computed // bs - 1) + [hit]
                self.seeds[hit] = tag(rid, computed)
            before = len(self.sent.get(rid, []))
            self._allocate(rid, computed + q)
            sent = self.sent.setdefault(rid, [])
            sent += row[len(sent) :]
            self.gained[rid] = sent[before:]


def state_blocks(config: EngineConfig) -> int:
    """The state blocks the pool holds: a request holds its running block and
    ``num_spec`` speculative ones, and at most as many left from its previous steps
    (freed at its next step); and one more."""
    return 2 * (1 + config.num_spec) * config.max_num_seqs + 1


def with_state_blocks(out: Any, sched: AlignScheduler, caches: list[torch.Tensor]) -> None:
    """Put the Mamba group's block ids (:class:`AlignScheduler`) into the step's scheduler
    output ``out``: a request new to the engine its list (a fresh engine's warm-up of a
    running request the list it held), a running one what it gained; and the prefix
    hits' states in place in ``caches``."""
    for new in out.scheduled_new_reqs:
        row = sched.held.get(new.req_id) or sched.sent.get(new.req_id) or [NULL_BLOCK_ID]
        new.block_ids = (*new.block_ids, list(row))
    cached = out.scheduled_cached_reqs
    for i, rid in enumerate(cached.req_ids):
        if rid in cached.resumed_req_ids:
            cached.new_block_ids[i] = (*cached.new_block_ids[i], list(sched.sent[rid]))
        else:
            gained = sched.gained.get(rid, [])
            mine = cached.new_block_ids[i]
            if mine is not None or gained:
                cached.new_block_ids[i] = (*(mine or ([],)), list(gained))
    for block, state in sched.seeds.items():
        write_state(caches, block, state)


def write_state(caches: list[torch.Tensor], block: int, state: int) -> None:
    """Block ``block`` of every state cache holds the state tagged ``state``."""
    for cache in caches:
        _write(cache[block], state)


def read_state(caches: list[torch.Tensor], block: int) -> list[int]:
    """The tag of the state each state cache holds at block ``block``."""
    return [_read(cache[block]) for cache in caches]


def _read(where: torch.Tensor) -> int:
    # ``view`` rather than ``reshape``: a copy would hide the state the kernel wrote.
    who, tokens = (int(x) for x in where.view(-1)[:2].tolist())
    return who * TAG + tokens


def _write(where: torch.Tensor, state: int) -> None:
    where.view(-1)[:2] = torch.tensor(divmod(state, TAG), dtype=where.dtype)


SpecRow = tuple[list[int], int]
"""A speculative decode's state blocks (``spec_state_indices_tensor``'s row:
``1 + num_spec`` columns) and its accepted tokens of the step before
(``num_accepted_tokens``)."""


def kernel_states(
    caches: list[torch.Tensor], slots: list[int | SpecRow], rows: list[tuple[str, int]],
    scheduled: dict[str, int],
) -> SimpleNamespace:  # fmt: skip
    """The linear layer's kernels' reads and writes of a step's real requests: ``rows``
    each request and its computed tokens in row order, ``slots`` where its kernels read
    and update the state (the metadata's): a state block, or a speculative decode's
    blocks (:data:`SpecRow`). What each state cache holds there (found), the state the
    request left (``(request, computed)``, -1 for none: its first chunk reads no state);
    then what the kernels write there.

    ``caches`` are the conv state (``(state_len, dim)`` a block, vLLM's default layout
    SD) and the temporal one. A state block holds the state after the step's tokens,
    the conv window at row 0. A speculative decode of ``q`` tokens keeps the state after
    each of them, as the copies of ``_copy_mamba_state_block`` (``v1/worker/
    mamba_utils.py``) and the spec-decode kernels take them: the temporal state after
    token ``t`` in column ``t``, the conv window after it in row ``t`` of column 0's
    block; it reads those of its accepted count ``a`` (column, row ``a - 1``)."""
    conv, temporal = caches
    left, found = [], [[], []]
    for (rid, computed), slot in zip(rows, slots, strict=False):
        have = computed > 0
        left.append(tag(rid, computed) if have else -1)
        if isinstance(slot, tuple):
            cols, accepted = slot
            read = [_read(conv[cols[0]][accepted - 1]), _read(temporal[cols[accepted - 1]])]
            for t in range(scheduled[rid]):
                _write(conv[cols[0]][t], tag(rid, computed + t + 1))
                _write(temporal[cols[t]], tag(rid, computed + t + 1))
        else:
            read = read_state(caches, slot) if have else [-1, -1]
            if slot != NULL_BLOCK_ID:
                write_state(caches, slot, tag(rid, computed + scheduled[rid]))
        for f, value in zip(found, read, strict=True):
            f.append(value if have else -1)
    return SimpleNamespace(left=np.array(left, dtype=np.int64),
                           found=[np.array(f, dtype=np.int64) for f in found])  # fmt: skip


def state_fields(prefix: str, state: SimpleNamespace | None) -> tuple[Field, ...]:
    """The fields of :func:`kernel_states`: what each request's kernels found in each
    state cache, which agrees with the state it left (none where nothing was tracked)."""
    if state is None:
        return ()
    left = f"{prefix}.state_left"
    return (
        Field(left, "requests", state.left),
        Field(f"{prefix}.conv_found", "requests", state.found[0], agrees_with=left),
        Field(f"{prefix}.temporal_found", "requests", state.found[1], agrees_with=left),
    )


class _StateLayer:
    """The Mamba2 layer as the runner's copies find it in the static forward context:
    its state caches, as ``bind_kv_cache`` binds them."""

    def __init__(self, kv_cache: list[torch.Tensor]) -> None:
        self.kv_cache = kv_cache


class _AlignEngine(hybrid._HybridEngine):
    """What align mode makes of a V1 runner of a hybrid model (a base of the engine
    classes below, before the engine of their linear layer): its config, its Mamba
    group's spec and blocks, its states real, the kernels' reads and writes of them."""

    prefix = ""  # the linear layer's fields' prefix
    sched: AlignScheduler
    tracked = True  # whether its states are judged (not the fresh engine's)
    states_cache: list[torch.Tensor]

    copy_func = ""  # the layer's MambaStateCopyFuncCalculator method

    def __init__(
        self, config: EngineConfig, device: torch.device, mode: str,
        sched: AlignScheduler, tracked: bool,
    ) -> None:  # fmt: skip
        self.sched, self.tracked, self.states_cache = sched, tracked, []
        self.build_base(config, device, mode)

    def build_base(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        """The linear layer's engine, built as its own constructor builds it."""
        raise NotImplementedError

    def copy_funcs(self) -> tuple[Any, ...]:
        """The model's ``get_mamba_state_copy_func`` of its linear layer."""
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return getattr(MambaStateCopyFuncCalculator, self.copy_func)()

    def state_slots(self, meta: Any, num_reqs: int) -> list[int | SpecRow]:
        """Where the layer's kernels read and update each request's state, in row order
        (:func:`kernel_states`)."""
        raise NotImplementedError

    def make_config(self, config: EngineConfig, mode: str) -> Any:
        """``MambaModelConfig.verify_and_update_config`` with prefix caching on; the
        model's registry entry says hybrid (``ModelConfig.is_hybrid``: with drafts the
        runner then keeps the accepted counts, ``_update_states_after_model_execute``,
        and copies states after sampling, ``MambaBuffers.postprocess_align``)."""
        vc = super().make_config(config, mode)
        mc = vc.model_config = copy.copy(vc.model_config)
        mc._model_info = dataclasses.replace(mc._model_info, is_hybrid=True)
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.enable_prefix_caching = True
        vc.cache_config.mamba_cache_mode = "align"
        vc.cache_config.mamba_block_size = config.block_size
        return vc

    def linear_group(self) -> tuple[type, Any]:
        backend, spec = super().linear_group()
        spec = dataclasses.replace(spec, block_size=self.config.block_size,
                                   mamba_cache_mode="align")  # fmt: skip
        return backend, spec

    def pool_size(self) -> int:
        return num_blocks(self.config) + state_blocks(self.config)

    def set_up_kv_cache(self, kv: Any, attn_groups: list[list[Any]]) -> None:
        super().set_up_kv_cache(kv, attn_groups)
        spec = kv.kv_cache_groups[-1].kv_cache_spec
        self.states_cache = [
            torch.zeros((kv.num_blocks, *shape), dtype=dtype)
            for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
        ]
        context = self.vllm_config.compilation_config.static_forward_context
        context[linear.hybrid.LINEAR_LAYER] = _StateLayer(self.states_cache)

    def load(self, resolved: Any) -> Any:
        handed = _StatefulHanded(super().load(resolved).inner, self.recorder, self)
        funcs = self.copy_funcs()
        handed.get_mamba_state_copy_funcs = lambda types: dict.fromkeys(types, funcs)
        return handed

    def output(self, inputs: RunnerStepInputs) -> Any:
        """The step's scheduler output with the Mamba group's block ids
        (:func:`with_state_blocks`)."""
        out = v1._Engine.output(self, inputs)
        with_state_blocks(out, self.sched, self.states_cache)
        return out

    def kernels(self, meta: Any) -> SimpleNamespace | None:
        """The Mamba2 kernels' reads and writes of the step's real requests
        (:func:`kernel_states`)."""
        if meta is None or not self.tracked or not self.states_cache:
            return None
        r = self.runner
        rows = r.input_batch.req_ids[: r.input_batch.num_reqs]
        computed = [(rid, r.requests[rid].num_computed_tokens) for rid in rows]
        slots = self.state_slots(meta, len(rows))
        return kernel_states(self.states_cache, slots, computed, self.sched.scheduled)

    def linear_fields(self, seen: v1._Seen) -> tuple[Field, ...]:
        """The linear layer's fields and its states'; the fresh engine's leave out
        ``num_accepted_tokens`` too: the drafts each request accepted in its last step
        (``_update_states_after_model_execute``), which the fresh engine's warm-up, no
        drafts, does not repeat."""
        state = getattr(seen, "kernel_states", None)
        fields = super().linear_fields(seen)
        if not self.tracked:
            fields = tuple(f for f in fields if f.name != f"{self.prefix}.num_accepted_tokens")
        return fields + state_fields(self.prefix, state)


class _Mamba2AlignEngine(_AlignEngine, linear._LinearEngine):
    """``vllm-v1-mamba2``'s engine in align mode."""

    prefix, copy_func = "mamba2", "mamba2_state_copy_func"

    def build_base(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        linear._LinearEngine.__init__(self, config, device, mode, LINEAR)

    def state_slots(self, meta: Any, num_reqs: int) -> list[int | SpecRow]:
        return linear._STATE_BY_REQUEST["mamba2"](meta).tolist()


class _GdnAlignEngine(_AlignEngine):
    """``vllm-v1-hybrid``'s engine (a GDN layer) in align mode."""

    prefix, copy_func = "gdn", "gated_delta_net_state_copy_func"

    def build_base(self, config: EngineConfig, device: torch.device, mode: str) -> None:
        hybrid._HybridEngine.__init__(self, config, device, mode)

    def state_slots(self, meta: Any, num_reqs: int) -> list[int | SpecRow]:
        return gdn_slots(meta, num_reqs)


def gdn_slots(meta: Any, num_reqs: int) -> list[int | SpecRow]:
    """``GDNAttentionMetadataBuilder.build``'s state blocks of each row: without
    speculative rows ``non_spec_state_indices_tensor`` (``block_table_tensor[:, 0]``, a
    FULL graph's staged copy, its padding rows null); with them (``spec_sequence_masks``:
    the decodes, those of no draft too), each speculative row's
    ``spec_state_indices_tensor`` row and ``num_accepted_tokens``, the other rows'
    ``non_spec_state_indices_tensor`` in order."""
    non_spec = meta.non_spec_state_indices_tensor
    non_spec = [] if non_spec is None else non_spec.tolist()
    if meta.spec_sequence_masks is None:
        return non_spec
    spec = zip(
        meta.spec_state_indices_tensor.tolist(), meta.num_accepted_tokens.tolist(), strict=False
    )
    rest = iter(non_spec)
    return [
        next(spec) if is_spec else next(rest)
        for is_spec in meta.spec_sequence_masks[:num_reqs].tolist()
    ]


class _StatefulHanded(v1._Handed):
    """The runner's model: records the step's forward as :class:`.runner_step_v1._Handed`
    does, and there stands in for the Mamba2 kernels' reads and writes of the states
    (:meth:`_AlignEngine.kernels`)."""

    def __init__(self, inner: Any, recorder: Any, engine: _AlignEngine) -> None:
        super().__init__(inner, recorder)
        self.engine = [engine]  # a list: no submodule

    def forward(self, input_ids: Any = None, positions: Any = None, **kwargs: Any) -> Any:
        from vllm.forward_context import get_forward_context

        r = self.recorder
        states = None
        if r.kind == "step":
            metadata = get_forward_context().attn_metadata
            meta = metadata.get(linear.hybrid.LINEAR_LAYER) if metadata else None
            states = self.engine[0].kernels(meta)
        out = super().forward(input_ids=input_ids, positions=positions, **kwargs)
        if states is not None:
            r.seen[-1][2].kernel_states = states
        return out


class AlignRunnerStepEngine(hybrid.HybridRunnerStepEngine):
    """A hybrid model's three engines in align mode, of ``engine_type``, their block
    lists the one scheduler's (:class:`AlignScheduler`); the fresh engine's states
    untracked."""

    def __init__(self, engine_type: type[_AlignEngine]) -> None:
        self.align_type = engine_type
        super().__init__()

    def new_engine(self) -> None:
        super().new_engine()
        self.sched: AlignScheduler | None = None
        self._fresh_made = False

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> v1._Engine:
        assert self.sched is not None
        return self.align_type(config, device, mode, self.sched, not self._fresh_made)

    def __call__(self, inputs: RunnerStepInputs) -> RunnerStepOutputs:
        if self.key != (inputs.config, inputs.device) or self.sched is None:
            self.sched = AlignScheduler(inputs.config)
        self.sched.step(inputs)
        return super().__call__(inputs)

    def _assign(self, inputs: RunnerStepInputs) -> None:
        """The block lists are :class:`AlignScheduler`'s (no state slots)."""

    def _fresh(self, *args: Any) -> Any:
        self._fresh_made = True
        try:
            return super()._fresh(*args)
        finally:
            self._fresh_made = False


ENGINE = AlignRunnerStepEngine(_Mamba2AlignEngine)
"""The engine of the implementation ``vllm-v1-mamba2-align`` of ``runner-step``."""
GDN_ENGINE = AlignRunnerStepEngine(_GdnAlignEngine)
"""The engine of the implementation ``vllm-v1-hybrid-align`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-mamba2-align`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


def run_gdn(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v1-hybrid-align`` of ``runner-step``, as :func:`run`."""
    return GDN_ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
run_gdn.new_engine = GDN_ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant -----------------------------------------------------------------------------


@contextlib.contextmanager
def _copy_skipped() -> Iterator[None]:
    """The defect: ``collect_mamba_copy_meta`` returning early when ``src_block_idx ==
    dest_block_idx or accept_token_bias == 0`` (``and`` in vLLM): without drafts no copy
    is made, so a request that moves into a new block reads that block's stale state."""
    import vllm.v1.worker.mamba_utils as mamba_utils

    collect = mamba_utils.collect_mamba_copy_meta

    def wrong(copy_bufs: Any, kv_cache_config: Any, funcs: Any, group_ids: Any,
              src: int, dest: int, bias: int, *rest: Any) -> None:  # fmt: skip
        if src == dest or bias == 0:
            return
        collect(copy_bufs, kv_cache_config, funcs, group_ids, src, dest, bias, *rest)

    with mock.patch.object(mamba_utils, "collect_mamba_copy_meta", wrong):
        yield


def run_copy_skipped(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-mamba2-align-copy-skipped``: ``vllm-v1-mamba2-align`` with
    :func:`_copy_skipped` in force."""
    return _MUTATED(inputs)


_MUTATED = v1.Mutated(AlignRunnerStepEngine(_Mamba2AlignEngine), _copy_skipped)
run_copy_skipped.new_engine = _MUTATED.engine.new_engine  # type: ignore[attr-defined]


def reach_align(found: Trace | Case) -> bool:
    """An engine ``vllm-v1-mamba2-align`` runs: V1's, without drafts."""
    return found.config.runner == "v1" and found.config.num_spec == 0


def trigger_copy_skipped(found: Trace | Case) -> bool:
    """A request with state (computed tokens) whose step's last token lies in a later
    block than its last computed one: its running state must move there."""
    if not reach_align(found):
        return False
    bs = found.config.block_size
    return any(
        c > 0 and q > 0 and (c - 1) // bs != (c + q - 1) // bs
        for b in as_trace(found).steps
        for c, q in zip(b.num_computed_tokens, b.q_lens, strict=True)
    )


def block_crossing(runner: str) -> Trace:
    """One request prefills a block of 16 tokens, then decodes one in its second block:
    its state must be copied from the first block to the second (``runner``'s engine)."""
    config = EngineConfig(max_model_len=32, max_num_seqs=1, max_num_batched_tokens=16,
                          block_size=16, cudagraph_mode="NONE", runner=runner)  # fmt: skip
    return Trace(
        config,
        (
            Batch((0,), (16,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(16,)),
            Batch((16,), (1,), req_ids=(0,), pages=((1, 2),), new_pages=(1,), prompt_lens=(16,)),
        ),
    )


def two_requests_crossing(config: EngineConfig) -> Trace:
    """Request 0 prefills a block of 16 tokens, then decodes into its second block;
    request 1 arrives with a prefix hit of one block (16 of its 20 prompt tokens) and
    prefills the other 4; then both decode (a uniform decode: a FULL graph replays it).
    The block size must be 16."""
    return Trace(
        config,
        (
            Batch((0,), (16,), req_ids=(0,), pages=((1,),), new_pages=(1,),
                  prompt_lens=(16,)),
            Batch((16, 16), (1, 4), req_ids=(0, 1), pages=((1, 2), (3, 4)),
                  new_pages=(1, 2), prompt_lens=(16, 20)),
            Batch((17, 20), (1, 1), req_ids=(0, 1), pages=((1, 2), (3, 4)),
                  new_pages=(0, 0), prompt_lens=(16, 20)),
        ),
    )  # fmt: skip


def smallest_copy_skipped() -> Trace:
    """:func:`block_crossing` on V1's runner."""
    return block_crossing("v1")


@contextlib.contextmanager
def _precopy_unbiased() -> Iterator[None]:
    """The defect: the fused pre-copy of a spec decode (``MambaSpecDecodeGPUContext.
    run_fused_precopy``) handed a token bias of 0: a request that accepted drafts in its
    last step and now moves into a new block gets the state of its last step's first
    token, not the state after the drafts it accepted."""
    from vllm.v1.worker.mamba_utils import MambaSpecDecodeGPUContext

    precopy = MambaSpecDecodeGPUContext.run_fused_precopy
    signature = inspect.signature(precopy)

    def wrong(*args: Any, **kwargs: Any) -> None:
        # The V1 runner passes its arguments by keyword, the V2 model state by position.
        bound = signature.bind(*args, **kwargs)
        bound.arguments["token_bias_gpu"] = torch.zeros_like(bound.arguments["token_bias_gpu"])
        precopy(*bound.args, **bound.kwargs)

    with mock.patch.object(MambaSpecDecodeGPUContext, "run_fused_precopy", wrong):
        yield


def run_precopy_unbiased(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v1-hybrid-align-precopy-unbiased``: ``vllm-v1-hybrid-align``
    with :func:`_precopy_unbiased` in force."""
    return _UNBIASED(inputs)


_UNBIASED = v1.Mutated(AlignRunnerStepEngine(_GdnAlignEngine), _precopy_unbiased)
run_precopy_unbiased.new_engine = _UNBIASED.engine.new_engine  # type: ignore[attr-defined]


def reach_align_drafts(found: Trace | Case) -> bool:
    """An engine ``vllm-v1-hybrid-align`` runs with drafts."""
    return found.config.runner == "v1" and found.config.num_spec > 0


def trigger_precopy_unbiased(found: Trace | Case) -> bool:
    """On V1's runner with drafts, :func:`moves_accepted_state`."""
    return reach_align_drafts(found) and moves_accepted_state(found)


def moves_accepted_state(found: Trace | Case) -> bool:
    """A request whose running state moves to a new block (``preprocess_mamba``: the
    block of its step's last token differs from its last step's) while its accepted
    count is above 1: the drafts it accepted in its last step, unless the fused
    post-copy after that step reset the count (its accepted tokens reached a block
    boundary within the block it ran in)."""
    bs = found.config.block_size
    running: dict[int, tuple[int, int]] = {}  # request -> (state block, accepted count)
    for b in as_trace(found).steps:
        rejected = b.rejected or (0,) * b.num_reqs
        prompts = b.prompt_lens or (0,) * b.num_reqs
        now = {}
        for rid, c, q, r, prompt in zip(b.req_ids, b.num_computed_tokens, b.q_lens,
                                        rejected, prompts, strict=True):  # fmt: skip
            block = -(-(c + q) // bs) - 1
            prev, accepted = running.get(rid, ((c - 1) // bs, 1))
            if prev not in (-1, block) and accepted > 1:
                return True
            drafts = q - 1 if c >= prompt and q > 1 else 0
            accepted = drafts - r + 1
            start = c + q - drafts  # the tokens of the running state
            aligned = (start + accepted - 1) // bs * bs
            if aligned >= start and aligned // bs - 1 == block:
                accepted = 1
            now[rid] = (block, accepted)
        running = now
    return False


def smallest_precopy_unbiased() -> Trace:
    """:func:`accepted_drafts_crossing` on V1's runner."""
    return accepted_drafts_crossing("v1")


def accepted_drafts_crossing(runner: str) -> Trace:
    """One request prefills 12 tokens, decodes 3 (two drafts) accepting one, then
    decodes 3 more from 14 into its second block of 16: its state must move there from
    the column of the accepted draft (``runner``'s engine)."""
    config = EngineConfig(max_model_len=32, max_num_seqs=1, max_num_batched_tokens=16,
                          block_size=16, num_spec=2, cudagraph_mode="NONE",
                          runner=runner)  # fmt: skip
    return Trace(
        config,
        (
            Batch((0,), (12,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(12,)),
            Batch((12,), (3,), req_ids=(0,), pages=((1,),), new_pages=(0,), prompt_lens=(12,),
                  rejected=(1,)),
            Batch((14,), (3,), req_ids=(0,), pages=((1, 2),), new_pages=(1,),
                  prompt_lens=(12,)),
        ),
    )  # fmt: skip
