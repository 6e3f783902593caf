"""vLLM's model runner V2 step of a hybrid model, as the implementation
``vllm-v2-mamba-hybrid`` of ``runner-step``.

The engine of :mod:`.runner_step` (implementation ``vllm``), its model a hybrid of an
attention layer and a linear-attention layer (Qwen3-Next's kind): the model config is
hybrid (``ModelConfig.is_hybrid``, from the architecture's registry entry), so that
``GPUModelRunner.load_model``'s ``init_model_state`` picks vLLM 0.33.0's
``MambaHybridModelState`` (``vllm/v1/worker/gpu/model_states/mamba_hybrid.py``), and the
worker's ``KVCacheConfig`` has a second KV-cache group, a ``MambaSpec`` on the
``GDNAttentionBackend`` (``vllm/v1/attention/backends/gdn_attn.py``), as for such a
model. What then runs unchanged, besides what :mod:`.runner_step` runs:

- ``initialize_kv_cache``: both groups' backends and builders (``init_attn_backend``),
  the block tables of both (the state group's rows ``1 + num_spec`` blocks:
  ``MambaSpec.max_num_blocks_per_req``), the graph mode both backends allow (GDN's
  ``AttentionCGSupport.UNIFORM_BATCH``: a FULL mode resolves to FULL_AND_PIECEWISE),
  ``MambaHybridModelState.initialize_kv_cache``;
- ``MambaHybridModelState.prepare_attn`` on every forward (the step's, padded or eager,
  each capture's and each dummy run's, the speculator's draft prefill on the target's
  metadata): ``is_prefilling``, and with drafts ``num_accepted_tokens`` (its
  ``postprocess_state`` after each sample) and ``num_decode_draft_tokens_cpu``, into
  ``build_attn_metadata`` and GDN's ``GDNAttentionMetadataBuilder`` (``build``,
  ``build_for_cudagraph_capture``, the FULL graph's staged buffers);
- ``MambaHybridModelState.add_request`` and ``preprocess_state`` (which returns at
  once: the cache mode is ``mamba_cache_mode="none"``, prefix caching off; with it on,
  vLLM's default, ``MambaModelConfig`` sets ``"align"``).

Each forward's build holds the GDN metadata's fields beside the attention layer's
(:func:`.runner_step_hybrid._linear_fields`, the consumers' ranges: a state index is a
line of the state cache, the null block 0 skipping the row), judged by the step's
properties. A request's state blocks are those of the lowest state slot no running
request holds when it arrives (``MambaManager``), above the attention pages, shared by
the three engines (the fresh one's warm-up gives a running request its own).

Stood in: the GDN layer (what the model registers: its backend, no weights) and what
:mod:`.runner_step` stands in.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from attnfuzz.adapters.vllm import runner_step
from attnfuzz.adapters.vllm import runner_step_hybrid as hybrid
from attnfuzz.adapters.vllm.runner_step_v1 import Mutated
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

LINEAR_LAYER = hybrid.LINEAR_LAYER


def prepare() -> None:
    """Import vLLM's runner, the model state and the GDN backend before a judge forks."""
    runner_step.prepare()
    import vllm.v1.attention.backends.gdn_attn  # noqa: F401
    import vllm.v1.worker.gpu.model_states.mamba_hybrid  # noqa: F401


def declines(case: Case) -> str | None:
    """What :func:`.runner_step.declines` declines."""
    return runner_step.declines(case)


def state_blocks(config: EngineConfig, slot: int) -> list[int]:
    """The ``1 + num_spec`` state blocks of state slot ``slot``
    (:func:`.runner_step_hybrid.state_blocks`)."""
    return hybrid.state_blocks(config, slot)


def _gdn_layer(spec: Any) -> Any:
    """The linear-attention layer, as the model registers it in the static forward
    context (``init_attn_backend`` asks it its backend): GDN's, its state spec ``spec``
    (:func:`_gdn_spec`, what the worker reads before it profiles the graphs' memory)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend

    class LinearLayer(AttentionLayerBase):
        def get_attn_backend(self) -> type:
            return GDNAttentionBackend

        def get_kv_cache_spec(self, vllm_config: Any) -> Any:
            return spec

    return LinearLayer()


def _gdn_spec(config: EngineConfig) -> Any:
    """The GDN layer's ``MambaSpec``: cache mode ``none`` (prefix caching off), ``1 + num_spec``
    blocks a request; its states the conv state (width - 1 + num_spec rows; width 4) and
    the recurrent state, whose sizes reach no metadata."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    return MambaSpec(
        block_size=config.max_model_len,
        shapes=((3 + config.num_spec, 8), (1, 4, 4)),
        dtypes=(torch.float32, torch.float32),
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode="none",
        num_speculative_blocks=config.num_spec,
    )


class _MambaHybridEngine(runner_step._Engine):
    """A V2 runner of the hybrid model; ``states``: each request's state slot, the
    engine's owner's (shared by its engines)."""

    def __init__(
        self, config: EngineConfig, device: torch.device, mode: str, speculator: str,
        states: dict[str, int],
    ) -> None:  # fmt: skip
        self.states = states
        super().__init__(config, device, mode, speculator)

    def configure(self, vc: Any) -> Any:
        """The hybrid model's config: its registry entry says hybrid (``is_hybrid``,
        which ``init_model_state`` reads)."""
        mc = vc.model_config = copy.copy(vc.model_config)
        mc._model_info = dataclasses.replace(mc._model_info, is_hybrid=True)
        self.recorder.linear_layer = LINEAR_LAYER
        return vc

    def layers(self) -> dict[str, Any]:
        return {**super().layers(), LINEAR_LAYER: _gdn_layer(_gdn_spec(self.config))}

    def pool_size(self) -> int:
        """The block pool: the attention pages, then every state slot's blocks."""
        config = self.config
        return runner_step.num_blocks(config) + config.max_num_seqs * (1 + config.num_spec)

    def kv_cache_config(self, layers: list[str]) -> Any:
        """The attention group, then the GDN layer's (:func:`_gdn_spec`)."""
        from vllm.v1.kv_cache_interface import KVCacheGroupSpec

        kv = super().kv_cache_config(layers)
        kv.kv_cache_groups.append(KVCacheGroupSpec([LINEAR_LAYER], _gdn_spec(self.config)))
        kv.num_blocks = self.pool_size()
        return kv

    def resolves_to(self, mode: Any) -> Any:
        from vllm.config import CUDAGraphMode

        # GDN's UNIFORM_BATCH support: FULL graphs of uniform decodes, piecewise others.
        return CUDAGraphMode.FULL_AND_PIECEWISE if mode == CUDAGraphMode.FULL else mode

    def output(self, inputs: RunnerStepInputs, held: set[str]) -> Any:
        """The step's scheduler output with the GDN group's block ids: a new request its
        state blocks, a running one none (it keeps them)."""
        out = super().output(inputs, held)
        for new in out.scheduled_new_reqs:
            new.block_ids = (*new.block_ids, state_blocks(self.config, self.states[new.req_id]))
        cached = out.scheduled_cached_reqs
        for i, gained in enumerate(cached.new_block_ids):
            if gained is not None:
                cached.new_block_ids[i] = (*gained, [])
        return out

    def fields(self, seen: Any, *, history: bool = True) -> tuple[Field, ...]:
        """The attention layer's fields and the GDN layer's; ``history`` False leaves out
        ``num_accepted_tokens`` too: the drafts each request accepted in its last step
        (``postprocess_state``), which a fresh engine's warm-up, one token a request and
        no drafts, does not repeat."""
        linear = hybrid._linear_fields(self.config, seen, self.pool_size())
        if not history:
            linear = tuple(f for f in linear if f.name != "gdn.num_accepted_tokens")
        return super().fields(seen, history=history) + linear


class MambaHybridRunnerStepEngine(runner_step.SlottedRunnerStepEngine):
    """``vllm``'s three engines, of the hybrid model; the requests' state slots kept
    across the steps and shared by the three."""

    engine_type = _MambaHybridEngine


ENGINE = MambaHybridRunnerStepEngine()
"""The engine of the implementation ``vllm-v2-mamba-hybrid`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``vllm-v2-mamba-hybrid``: the step on :data:`ENGINE`, kept
    across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant: GDNAttentionMetadataBuilder.build with one line of its FULL-graph staging
# changed (:func:`.runner_step_hybrid._pad_slot_padding`), under this runner.


_PAD_SLOT = Mutated(
    MambaHybridRunnerStepEngine(), lambda: hybrid._mutated(hybrid._pad_slot_padding)
)


def pad_slot_padding(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v2-mamba-hybrid-pad-slot-states``: the padding requests of a FULL
    speculative decode's GDN state indices hold PAD_SLOT_ID (-1), not the null block,
    which ``causal_conv1d_update`` skips (safe padding)."""
    return _PAD_SLOT(inputs)


pad_slot_padding.new_engine = _PAD_SLOT.engine.new_engine  # type: ignore[attr-defined]


def _batches(found: Trace | Case) -> list[Batch]:
    return [found.batch] if isinstance(found, Case) else list(found.steps)


def reach_full_spec_decode(found: Trace | Case) -> bool:
    """A V2 engine with FULL graphs and drafts: GDN stages its speculative decodes in the
    FULL graph's buffers."""
    c = found.config
    return c.runner == "v2" and c.cudagraph_mode in hybrid._FULL_MODES and c.num_spec >= 1


def trigger_full_spec_decode(found: Trace | Case) -> bool:
    """A step every request of which decodes its drafts, none new to the engine, within
    the largest capture size: a FULL graph replays it."""
    from attnfuzz.reference.persistent_batch import new_to_engine

    c = found.config
    largest = max(c.cudagraph_capture_sizes, default=0)
    return reach_full_spec_decode(found) and any(
        all(q == 1 + c.num_spec for q in b.q_lens)
        and sum(b.q_lens) <= largest
        and not any(new_to_engine(b))
        for b in _batches(found)
    )


def smallest_full_spec_decode() -> Trace:
    """One request prefills 5 tokens, then decodes next_n = 2 tokens, padded to the FULL
    decode graph of 4 tokens (2 requests: one padding)."""
    return runner_step.prefill_then_decode("v2", 1)


# -- a re-created defect: vLLM 0.26.0's BlockTables.get_dummy_block_tables, which hands a
# dummy run the input block tables' rows as the last real step left them (0.27.0 zeroes
# them first: "Zero the rows so dummy runs write mamba state to the reserved null block
# rather than through the previous real step's (stale) block ids").


@contextlib.contextmanager
def _stale_dummy_rows() -> Iterator[None]:
    from vllm.v1.worker.gpu.block_table import BlockTables

    def get_dummy_block_tables(self: Any, num_reqs: int) -> tuple[torch.Tensor, ...]:
        return tuple(block_table[:num_reqs] for block_table in self.input_block_tables)

    with mock.patch.object(BlockTables, "get_dummy_block_tables", get_dummy_block_tables):
        yield


_STALE_ROWS = Mutated(MambaHybridRunnerStepEngine(), _stale_dummy_rows)


def dummy_stale_rows(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``vllm-v2-mamba-hybrid-dummy-stale-rows``: an idle data-parallel rank's dummy run
    between two steps names, through the block-table rows the last step left, the state
    block of a request the engine holds, and the GDN layer updates that state in place (a
    dummy run writes nothing live)."""
    return _STALE_ROWS(inputs)


dummy_stale_rows.new_engine = _STALE_ROWS.engine.new_engine  # type: ignore[attr-defined]


def reach_dummy_run(found: Trace | Case) -> bool:
    """A V2 engine: an idle data-parallel rank runs a dummy step between two real ones."""
    return found.config.runner == "v2"


def trigger_dummy_stale_rows(found: Trace | Case) -> bool:
    """A request of one step that the next step runs on: the dummy run between them
    reads the first step's rows, that request's state block among them."""
    return reach_dummy_run(found) and runner_step.held_between_steps(found)


def smallest_dummy_stale_rows() -> Trace:
    """One request prefills 5 tokens, then decodes one: the dummy run between the two
    reads the prefill's block-table row, the request's state block."""
    return runner_step.prefill_then_decode("v2", 0)
