"""vLLM's model runner V2 step of a hybrid model with prefix caching on, as the
implementation ``vllm-v2-hybrid-align`` of ``runner-step``.

``vllm-v2-mamba-hybrid`` (:mod:`.runner_step_mamba_hybrid`) serves its GDN layer with
``mamba_cache_mode="none"``; with prefix caching on, vLLM's default for a generative
model, ``MambaModelConfig.verify_and_update_config`` sets ``"align"`` and
``mamba_block_size`` to the block size, as for ``vllm-v1-hybrid-align``
(:mod:`.runner_step_mamba_align`, whose scheduler model and state tags this engine
shares). The V2 runner keeps a request's running state on the device, in
``MambaHybridModelState`` (``vllm/v1/worker/gpu/model_states/mamba_hybrid.py``), and
moves it with the fused kernels of ``vllm/v1/worker/mamba_utils.py``, which no other
implementation runs:

- ``initialize_kv_cache``: ``MambaSpecDecodeGPUContext.create`` and
  ``initialize_from_forward_context`` (``_populate_metadata``: each state cache's base
  address, block stride and element size, read from the layer's bound ``kv_cache``);
- ``add_request``: the running block's column seeded from the computed tokens;
- ``preprocess_state`` before each real step's attention metadata:
  ``preprocess_mamba_align_fused_kernel`` (each request's source and destination
  column), then ``run_fused_precopy`` (``precopy_mamba_align_fused_kernel`` and
  ``_copy_mamba_state_block``: the running state copied from block to block by address);
- ``postprocess_state`` after each sample: ``run_fused_postprocess_align``
  (``postprocess_mamba_fused_kernel``).

All run under Triton's interpreter over real state caches. The GDN builder reads the
align block table through ``mamba_get_block_table_tensor``: its
``mamba_aligned_state_indices`` (``compute_aligned_state_indices``) is CUDA's alone
(``GDNAttentionMetadataBuilder.__init__``: ``supports_update_block_table``).

Judged as ``vllm-v1-hybrid-align``: the model's forward stands in for the GDN kernels'
one effect on the states (each real request's state block, ``non_spec_state_indices_
tensor``, is read, then holds the state after the step's tokens), in the eager and
piecewise forwards and in a FULL graph's replay (over the buffers it captured), and the
step's build carries ``gdn.state_left`` with ``gdn.conv_found`` and
``gdn.temporal_found`` (*agreement within a build*). The state a request left is the
scheduler's: its computed tokens before the step.

With drafts, a speculative decode's state is read and kept as ``vllm-v1-hybrid-align``
takes it (:func:`.runner_step_mamba_align.kernel_states`: GDN's
``spec_state_indices_tensor`` row read at the accepted count the model state gathered,
``num_accepted_tokens``), so that the pre-copy of the state of the drafts a request
accepted into its new block (``preprocess_mamba_align_fused_kernel``'s source column and
offset) and the post-copy after sampling are held to the state the request left.

Declined as ``vllm-v1-hybrid-align``: what the scheduler never sends in align mode;
and a dummy batch (a capture's, an idle data-parallel rank's) holding a request longer
than the block table's row (:func:`declines_past_row`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step
from attnfuzz.adapters.vllm import runner_step_mamba_align as align
from attnfuzz.adapters.vllm import runner_step_mamba_hybrid as v2_hybrid
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.persistent_batch import new_to_engine
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

LINEAR_LAYER = v2_hybrid.LINEAR_LAYER


def prepare() -> None:
    """Import vLLM's V2 runner, the hybrid model state and the align-mode kernels."""
    v2_hybrid.prepare()
    import vllm.v1.worker.mamba_utils  # noqa: F401


def declines(case: Case) -> str | None:
    """What the scheduler never sends in align mode
    (:func:`.runner_step_mamba_align.declines_align`), a dummy request past the block
    table (:func:`declines_past_row`), then as ``vllm-v2-mamba-hybrid``."""
    return (
        align.declines_align(case.config, case.batch)
        or declines_past_row(case.config, case.batch)
        or v2_hybrid.declines(case)
    )


def declines_past_row(config: EngineConfig, batch: Batch | None = None) -> str | None:
    """A dummy batch holding a request longer than the block table's row: a capture of a
    mixed graph (a piecewise one, a FULL mixed one) of a size, or the dummy run an idle
    data-parallel rank runs beside the step ``batch`` (its token count, padded to a
    capture size where the mode captures any). ``InputBatch.make_dummy`` gives each dummy
    request its query as its ``seq_len`` (one request for a mixed dummy run), and in
    align mode ``mamba_get_block_table_tensor`` gathers column ``(seq_len - 1) //
    block_size`` of a row ``cdiv(max_model_len, block_size)`` wide. On CUDA its Triton
    kernel reads past the row, unchecked; on a CPU its torch branch (kept for the
    builders' unit tests) raises. What CUDA reads there is not observed here, so such a
    config or step is not judged."""
    width = -(-config.max_model_len // config.block_size)
    graphs = config.cudagraph_mode != "NONE"
    mixed = config.cudagraph_mode not in ("NONE", "FULL_DECODE_ONLY")
    dummies = [
        (size, -(-size // min(size, config.max_num_seqs)))
        for size in (config.cudagraph_capture_sizes if mixed else ())
    ]
    if batch is not None:
        tokens = sum(batch.q_lens)
        above = [s for s in config.cudagraph_capture_sizes if s >= tokens] if graphs else []
        padded = min(above, default=tokens)
        dummies.append((padded, padded))
    for tokens, longest in dummies:
        if (longest - 1) // config.block_size >= width:
            return (
                f"a dummy batch of {tokens} tokens holding a request of {longest}, past "
                f"its block-table row of {width} blocks (InputBatch.make_dummy; "
                "mamba_get_block_table_tensor in align mode, whose CPU branch raises "
                "where CUDA's kernel reads past the row)"
            )
    return None


@dataclasses.dataclass
class _Recorder(runner_step._Recorder):
    """The recorder, which also hands each forward of a real step (eager, piecewise, or
    a FULL graph's replay) the GDN layer's metadata it reads (``on_step``)."""

    on_step: Callable[[Any], None] | None = None

    def new_graph(self) -> runner_step._Graph:
        return _Graph(self)

    def forward(self, positions: torch.Tensor) -> None:
        super().forward(positions)
        if self.kind == "step" and self.on_step is not None:
            self.on_step(self.handed(positions).linear)


class _Graph(runner_step._Graph):
    """A graph whose replay of a real step also runs the GDN kernels' stand-in over the
    metadata buffers it captured."""

    recorder: _Recorder

    def replay(self) -> None:
        super().replay()
        r = self.recorder
        if self.rerun is None and r.kind == "step" and r.on_step is not None:
            assert self.read is not None
            r.on_step(self.read.linear)


class _AlignEngine(v2_hybrid._MambaHybridEngine):
    """``vllm-v2-mamba-hybrid``'s runner in align mode: its config, its GDN group's spec
    and block lists (``sched``'s), its state caches real and bound to the layer."""

    recorder_type = _Recorder

    def __init__(
        self, config: EngineConfig, device: torch.device, mode: str, speculator: str,
        sched: align.AlignScheduler, tracked: bool,
    ) -> None:  # fmt: skip
        self.sched, self.tracked = sched, tracked
        self.states_cache: list[torch.Tensor] = []
        self.input_batch: Any = None  # the step's, as prepare_attn was handed it
        self.kernel_states: Any = None  # what the step's GDN kernels found
        super().__init__(config, device, mode, speculator, {})
        state = self.runner.model_state
        prepare_attn = state.prepare_attn

        def stash(input_batch: Any, *args: Any, **kwargs: Any) -> Any:
            self.input_batch = input_batch
            return prepare_attn(input_batch, *args, **kwargs)

        state.prepare_attn = stash
        self.recorder.on_step = self.on_step

    def configure(self, vc: Any) -> Any:
        """``MambaModelConfig.verify_and_update_config`` with prefix caching on."""
        vc = super().configure(vc)
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.enable_prefix_caching = True
        vc.cache_config.mamba_cache_mode = "align"
        vc.cache_config.mamba_block_size = self.config.block_size
        return vc

    def target_model(self) -> runner_step._Model:
        """The model, whose ``get_mamba_state_copy_funcs`` is Qwen3-Next's: the GDN
        layer's ``gated_delta_net_state_copy_func``."""
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        model = super().target_model()
        funcs = MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()
        model.get_mamba_state_copy_funcs = lambda types: dict.fromkeys(types, funcs)
        return model

    def spec(self) -> Any:
        """The GDN layer's ``MambaSpec`` in align mode: a state block a page of the block
        size, the group's block table as long as the attention one."""
        return dataclasses.replace(
            v2_hybrid._gdn_spec(self.config), block_size=self.config.block_size,
            mamba_cache_mode="align",
        )  # fmt: skip

    def layers(self) -> dict[str, Any]:
        """The layers, the GDN layer's state caches allocated and bound as
        ``init_kv_cache`` binds them (the adapter stands that in: :mod:`.runner_step`),
        which ``initialize_from_forward_context`` reads."""
        spec = self.spec()
        layer = v2_hybrid._gdn_layer(spec)
        self.states_cache = [
            torch.zeros((self.pool_size(), *shape), dtype=dtype)
            for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
        ]
        layer.kv_cache = self.states_cache
        return {**runner_step._Engine.layers(self), LINEAR_LAYER: layer}

    def pool_size(self) -> int:
        return runner_step.num_blocks(self.config) + align.state_blocks(self.config)

    def kv_cache_config(self, layers: list[str]) -> Any:
        from vllm.v1.kv_cache_interface import KVCacheGroupSpec

        kv = runner_step._Engine.kv_cache_config(self, layers)
        kv.kv_cache_groups.append(KVCacheGroupSpec([LINEAR_LAYER], self.spec()))
        kv.num_blocks = self.pool_size()
        return kv

    def output(self, inputs: RunnerStepInputs, held: set[str]) -> Any:
        """The step's scheduler output with the GDN group's block lists
        (:func:`.runner_step_mamba_align.with_state_blocks`)."""
        out = runner_step._Engine.output(self, inputs, held)
        align.with_state_blocks(out, self.sched, self.states_cache)
        return out

    def on_step(self, meta: Any) -> None:
        """The GDN kernels' reads and writes of the step's real requests
        (:func:`.runner_step_mamba_align.kernel_states`), in the rows of the batch
        ``prepare_attn`` was handed; none on the fresh engine."""
        if meta is None or not self.tracked or self.input_batch is None:
            return
        batch = self.input_batch
        rows = [(rid, self.sched.computed[rid]) for rid in batch.req_ids[: batch.num_reqs]]
        slots = align.gdn_slots(meta, len(rows))
        self.kernel_states = align.kernel_states(self.states_cache, slots, rows,
                                                 self.sched.scheduled)  # fmt: skip

    def step_seen(self, state: Any) -> runner_step._Seen:
        seen = super().step_seen(state)
        seen.kernel_states, self.kernel_states = self.kernel_states, None
        return seen

    def fields(self, seen: Any, *, history: bool = True) -> tuple[Field, ...]:
        state = getattr(seen, "kernel_states", None)
        return super().fields(seen, history=history) + align.state_fields("gdn", state)


class AlignRunnerStepEngine(v2_hybrid.MambaHybridRunnerStepEngine):
    """``vllm-v2-mamba-hybrid``'s three engines in align mode, their block lists the one
    scheduler's (:class:`.runner_step_mamba_align.AlignScheduler`); the fresh engine's
    states untracked."""

    def new_engine(self) -> None:
        super().new_engine()
        self.sched: align.AlignScheduler | None = None
        self._fresh_made = False

    def engine(self, config: EngineConfig, device: torch.device, mode: str) -> runner_step._Engine:
        assert self.sched is not None
        return _AlignEngine(config, device, mode, self.speculator, self.sched,
                            not self._fresh_made)  # fmt: skip

    def track(self, inputs: RunnerStepInputs, same_engine: bool) -> None:
        """The scheduler's block lists of the step (state slots are blocks here)."""
        if not same_engine or self.sched is None:
            self.sched = align.AlignScheduler(inputs.config)
        self.sched.step(inputs)

    def _fresh(self, *args: Any) -> Any:
        self._fresh_made = True
        try:
            return super()._fresh(*args)
        finally:
            self._fresh_made = False


ENGINE = AlignRunnerStepEngine()
"""The engine of the implementation ``vllm-v2-hybrid-align`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v2-hybrid-align``: the step on :data:`ENGINE`, kept
    across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


def reach_align(found: Trace | Case) -> bool:
    """An engine ``vllm-v2-hybrid-align``'s mutants of steps without drafts run: V2's,
    without drafts."""
    return found.config.runner == "v2" and found.config.num_spec == 0


# -- the mutant ----------------------------------------------------------------------------


@contextlib.contextmanager
def _seed_column_past() -> Iterator[None]:
    """The defect: ``MambaHybridModelState.add_request`` seeding a request's running
    column with ``num_computed_tokens // mamba_block_size`` (vLLM: ``(num_computed_tokens
    - 1) // mamba_block_size``, the block of its last computed token). A request new to
    the engine with whole blocks computed (a prefix hit, a resumption) then names the
    block after its state as its source: the pre-copy finds source and destination the
    same, or copies the wrong block, and its kernels read a state it never left."""
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    add_request = MambaHybridModelState.add_request

    def wrong(self: Any, req_index: int, new_req_data: Any) -> None:
        add_request(self, req_index, new_req_data)
        column = new_req_data.num_computed_tokens // self.cache_config.mamba_block_size
        self._mamba_state_idx_gpu[req_index].fill_(column)

    with mock.patch.object(MambaHybridModelState, "add_request", wrong):
        yield


_SEED_COLUMN_PAST = Mutated(AlignRunnerStepEngine(), _seed_column_past)


def seed_column_past(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v2-hybrid-align-seed-column-past``: ``vllm-v2-hybrid-align``
    with :func:`_seed_column_past` in force."""
    return _SEED_COLUMN_PAST(inputs)


seed_column_past.new_engine = _SEED_COLUMN_PAST.engine.new_engine  # type: ignore[attr-defined]


def trigger_seed_column_past(found: Trace | Case) -> bool:
    """A request new to the engine with computed tokens (whole blocks, as the scheduler
    sends one in align mode) that the step runs: its kernels read the state it left."""
    if not reach_align(found):
        return False
    return any(
        new and c > 0 and q > 0
        for b in as_trace(found).steps
        for new, c, q in zip(new_to_engine(b), b.num_computed_tokens, b.q_lens, strict=True)
    )


def smallest_seed_column_past() -> Trace:
    """One request new to the engine with a prefix hit of a block of 16 tokens decodes
    one token: its state is in its first block, and the pre-copy must move it to the
    second."""
    config = EngineConfig(max_model_len=32, max_num_seqs=1, max_num_batched_tokens=16,
                          block_size=16, cudagraph_mode="NONE", runner="v2")  # fmt: skip
    return Trace(config, (Batch((16,), (1,), req_ids=(0,), pages=((1, 2),), new_pages=(2,)),))


@contextlib.contextmanager
def _decode_precopy_skipped() -> Iterator[None]:
    """The defect: ``MambaHybridModelState.preprocess_state`` returning before its kernels
    on a step of decodes alone (one token a request, none prefilling), as if a decode
    kept its running block. A decode that crosses into a new block then runs on that
    block before any state is moved there, and the running column is not advanced."""
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    preprocess_state = MambaHybridModelState.preprocess_state

    def wrong(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> None:
        n = input_batch.num_reqs
        decodes = (input_batch.num_scheduled_tokens[:n] == 1).all()
        if n and decodes and not input_batch.is_prefilling_np[:n].any():
            return
        preprocess_state(self, input_batch, *args, **kwargs)

    with mock.patch.object(MambaHybridModelState, "preprocess_state", wrong):
        yield


_DECODE_PRECOPY_SKIPPED = Mutated(AlignRunnerStepEngine(), _decode_precopy_skipped)


def decode_precopy_skipped(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v2-hybrid-align-decode-precopy-skipped``: ``vllm-v2-hybrid-align``
    with :func:`_decode_precopy_skipped` in force."""
    return _DECODE_PRECOPY_SKIPPED(inputs)


decode_precopy_skipped.new_engine = _DECODE_PRECOPY_SKIPPED.engine.new_engine  # type: ignore[attr-defined]


def trigger_decode_precopy_skipped(found: Trace | Case) -> bool:
    """A step of decodes alone, none new to the engine, one of which crosses into a new
    block: its state must move before it runs."""
    if not reach_align(found):
        return False
    bs = found.config.block_size
    for b in as_trace(found).steps:
        prompts = b.prompt_lens or (0,) * b.num_reqs
        steps = list(zip(new_to_engine(b), b.num_computed_tokens, b.q_lens, prompts,
                         strict=True))  # fmt: skip
        decodes = all(not new and q == 1 and c >= p for new, c, q, p in steps)
        if decodes and any(c > 0 and c % bs == 0 for _, c, _, _ in steps):
            return True
    return False


def smallest_decode_precopy_skipped() -> Trace:
    """:func:`.runner_step_mamba_align.block_crossing` on V2's runner."""
    return align.block_crossing("v2")


def precopy_unbiased(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``vllm-v2-hybrid-align-precopy-unbiased``: ``vllm-v2-hybrid-align``
    with :func:`.runner_step_mamba_align._precopy_unbiased` in force (the fused
    pre-copy's token bias 0)."""
    return _PRECOPY_UNBIASED(inputs)


_PRECOPY_UNBIASED = Mutated(AlignRunnerStepEngine(), align._precopy_unbiased)
precopy_unbiased.new_engine = _PRECOPY_UNBIASED.engine.new_engine  # type: ignore[attr-defined]


def reach_align_drafts(found: Trace | Case) -> bool:
    """An engine ``vllm-v2-hybrid-align`` runs with drafts."""
    return found.config.runner == "v2" and found.config.num_spec > 0


def trigger_precopy_unbiased(found: Trace | Case) -> bool:
    """On V2's runner with drafts,
    :func:`.runner_step_mamba_align.moves_accepted_state`."""
    return reach_align_drafts(found) and align.moves_accepted_state(found)


def smallest_precopy_unbiased() -> Trace:
    """:func:`.runner_step_mamba_align.accepted_drafts_crossing` on V2's runner."""
    return align.accepted_drafts_crossing("v2")
