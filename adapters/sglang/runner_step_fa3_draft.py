"""SGLang's EAGLE draft graph runner on the FlashAttention 3 multi-step draft backend,
as the implementation ``sglang-fa3-eagle-draft`` of ``runner-step``.

The draft of :mod:`~attnfuzz.adapters.sglang.runner_step_draft` (``sglang-eagle-draft``:
its driver, draft batch, worker and graph stand-ins, the draft of the next round after
a verify, the draft model's extend after any other step), on the engine started with
``--attention-backend fa3`` (the chain draft, ``--speculative-eagle-topk 1``; a draft
of ``num_spec`` >= 2 steps, as ``sglang-eagle-draft`` declines the others). What runs
besides (SGLang 0.5.23, ``layers/attention/flashattention_backend.py``):

- ``FlashAttentionMultiStepBackend``: ``__init__`` (a ``FlashAttentionBackend`` of
  each draft step ``0 .. num_steps - 2``, its ``speculative_step_id``),
  ``init_forward_metadata``, ``init_cuda_graph_state`` and
  ``init_forward_metadata_out_graph`` (``build_inner_fb_view``, each step's);
- each step's ``FlashAttentionBackend``: ``init_forward_metadata``'s draft decode of
  ``topk`` 1 (``cache_seqlens`` the committed prefix and the step's ``step_id + 1``
  drafts); ``init_cuda_graph_state``; ``_init_full_cg_decode_metadata``,
  ``_bind_metadata_buffers`` (``page_table_draft_decode``) and
  ``_apply_cuda_graph_metadata`` with ``_spec_read_seq_len_delta`` (``step_id + 1``)
  and ``_set_decode_page_metadata`` (the Triton kernel ``normal_decode_set_metadata``),
  at capture and replay;
- for an extend: the draft model's ``FlashAttentionBackend.init_forward_metadata``
  (``sglang-fa3``'s extend fields).

Stand-ins: those of ``sglang-eagle-draft`` and of ``sglang-fa3``
(``sgl_kernel.flash_attn`` where it does not import).

Fields: the draft's inputs (``seq_lens``, ``req_pool_indices``, ``positions``,
``out_cache_loc``, as ``sglang-eagle-draft``'s), and for each draft step ``s`` whose
attention runs: ``cache_seqlens_int32.s`` and ``page_table.s`` by request (a row: the
pages its ``cache_seqlens`` reach), ``cu_seqlens_q.s`` and ``cu_seqlens_k.s`` as
offsets; each with the range its consumer accepts (``sglang-fa3``'s). And ``kv_len.s``
and ``kv_slots.s``: the keys each step's ``flash_attn_with_kvcache`` reads; ``kv_len``
and ``kv_slots``, the last attending step's: the keys of the draft as a whole (the
earlier steps read a prefix of them), which *padding writes no real KV* holds the
padding rows' ``out_cache_loc`` to.

Mutant: ``sglang-fa3-eagle-draft-step-not-advanced`` (the graph's draft decode reads
every step's KV as the first step's: ``_spec_read_seq_len_delta`` 1, the step's
``cache_seqlens`` not advanced): padding invariance and replay equals eager on the
second draft step of a replayed draft.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import fa3_backend
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_draft as draft
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.adapters.sglang.runner_step import arrive_then_step
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace


def prepare() -> None:
    draft.prepare()
    fa3.prepare()


def declines(case: Case) -> str | None:
    """Why SGLang runs no multi-step draft decode for ``case``'s config
    (``sglang-eagle-draft``'s reasons: the FA3 multi-step backend is built where the
    Triton one is)."""
    return draft.declines(case)


class _FA3DraftGraph(draft._DraftGraph):
    """The draft runner's graph: a capture records each draft step's FA3 metadata (the
    views of that step backend's persistent buffers the graph reads)."""

    def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
        backends = self.runner.draft_attn_backend.attn_backends
        self.graphs[shape_key] = [b.forward_metadata for b in backends]


_WHERE = {
    "eager": "flashattention_backend.py:FlashAttentionMultiStepBackend.init_forward_metadata",
    "fresh": "flashattention_backend.py:FlashAttentionMultiStepBackend.init_forward_metadata "
    "(a new engine)",
    "padded": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.execute (each step "
    "backend's forward_metadata after FlashAttentionBackend._apply_cuda_graph_metadata)",
    "replay": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.execute (what each "
    "draft step's graph reads: FlashAttentionBackend._bind_metadata_buffers' views)",
    "capture": "eagle_draft_cuda_graph_runner.py:EAGLEDraftCudaGraphRunner.capture_one_shape "
    "(FlashAttentionBackend._init_full_cg_decode_metadata, in_capture)",
}


class FA3DraftEngine(draft._DraftEngine):
    """One EAGLE engine's draft on FlashAttention 3: the target's rows on an
    :class:`~attnfuzz.adapters.sglang.runner_step_fa3.FA3Engine` (the draft model's
    extend backend), ``FlashAttentionMultiStepBackend`` and the draft graph runner."""

    GRAPH = _FA3DraftGraph
    WHERE = _WHERE

    def make_target(self, config: EngineConfig, device: torch.device) -> Any:
        return fa3.FA3Engine(config, device, graphs=False)

    def make_draft_backend(self) -> Any:
        """``FlashAttentionMultiStepBackend(model_runner, topk, num_steps)`` (``fa_impl_ver``
        3), as ``draft_utils.py:DraftBackendFactory`` builds it for ``fa3``."""
        from sglang.srt.layers.attention.flashattention_backend import (
            FlashAttentionMultiStepBackend,
        )

        with fa3_backend.flash_attn_module():
            return FlashAttentionMultiStepBackend(self.runner, draft.EAGLE_TOPK, self.num_steps)

    def _fields(
        self, rows: int, inputs_of: dict[str, torch.Tensor], steps: list[Any]
    ) -> tuple[Field, ...]:
        """The draft's inputs (``sglang-eagle-draft``'s), then each draft step's FA3
        metadata (``sglang-fa3``'s fields, suffixed by the step) and the keys it reads."""
        out = list(super()._fields(rows, inputs_of, []))
        target: fa3.FA3Engine = self.engine
        for s, metadata in enumerate(steps):
            # The draft decode's tokens: one a request (topk 1).
            fields = target.metadata_fields(rows, rows * draft.EAGLE_TOPK, metadata)
            lens, slots = target.kv_read({f.name: f.values for f in fields}, metadata)
            width = self.runner.req_to_token_pool.req_to_token.shape[1]
            table = np.zeros((rows, width), dtype=np.int64)
            for r, row in enumerate(slots):
                table[r, : min(len(row), width)] = row[:width]
            out += [Field(f"{f.name}.{s}", f.rows, f.values, f.accepts, f.row_lengths)
                    for f in fields]  # fmt: skip
            out.append(Field(f"kv_len.{s}", "requests", lens))
            out.append(Field(f"kv_slots.{s}", "requests", table, row_lengths=lens))
        if steps:
            # The last attending step reads every key the earlier ones read, and more:
            # the keys of the draft as a whole, which padding writes no real KV reads.
            out.append(Field("kv_len", "requests", lens))
            out.append(Field("kv_slots", "requests", table, row_lengths=lens))
        return tuple(out)

    def eager(self, inputs: RunnerStepInputs, how: str = "eager") -> StepBuild:
        """``FlashAttentionMultiStepBackend.init_forward_metadata`` of the draft, no graph:
        each step backend's own new metadata."""
        fb = self.draft_batch(inputs)
        self.draft_backend.init_forward_metadata(fb)
        steps = [b.forward_metadata for b in self.draft_backend.attn_backends]
        inputs_of = {
            "seq_lens": fb.seq_lens,
            "out_cache_loc": fb.out_cache_loc,
            "positions": fb.positions,
        }
        if how != "fresh":  # a new engine's rows are its own: history picks them
            inputs_of["req_pool_indices"] = fb.req_pool_indices
        R, T = inputs.num_reqs, inputs.num_tokens
        return StepBuild(how, R, T, self._fields(R, inputs_of, steps), _WHERE[how])


class FA3DraftLife(draft.DraftLife):
    """The draft of ``sglang-fa3-eagle-draft`` across the steps of one engine."""

    engine_class: type[FA3DraftEngine] = FA3DraftEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: EngineConfig, device: torch.device, graphs: bool) -> FA3DraftEngine:
        return self.engine_class(config, device, graphs=graphs)

    def persistent(self, engine: FA3DraftEngine) -> list[Any]:
        """Each FA3 step backend's ``forward_metadata``, its graph buffers after a replay's
        preparation."""
        return [b.forward_metadata for b in engine.draft_backend.attn_backends]


ENGINE = FA3DraftLife()
"""The engine of the implementation ``sglang-fa3-eagle-draft`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-fa3-eagle-draft`` of ``runner-step``: the step's draft on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- the mutant: the graph's draft steps not advanced ------------------------------------------


class _StepNotAdvanced(FA3DraftEngine):
    """Every draft step's graph metadata built as the first step's: the replay's
    ``_spec_read_seq_len_delta`` 1 whatever the step (``speculative_step_id`` forgotten),
    so step ``s`` reads ``s`` fewer draft keys than it wrote."""

    def make_draft_backend(self) -> Any:
        backend = super().make_draft_backend()
        for b in backend.attn_backends:
            b._spec_read_seq_len_delta = lambda forward_mode, spec_info: 1
        return backend


class _MutantLife(FA3DraftLife):
    engine_class = _StepNotAdvanced


STEP_NOT_ADVANCED = _MutantLife()


def run_step_not_advanced(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-fa3-eagle-draft-step-not-advanced``: :class:`_StepNotAdvanced`."""
    return STEP_NOT_ADVANCED(inputs)


run_step_not_advanced.new_engine = STEP_NOT_ADVANCED.new_engine  # type: ignore[attr-defined]


def reach_draft_replay(trace: Trace | Case) -> bool:
    """A draft the draft graph replays: after a replayed verify, of two steps or more."""
    return trace.config.num_spec >= draft.MIN_DRAFT_STEPS and bool(decode.replayed(trace))


def trigger_step_not_advanced(trace: Trace | Case) -> bool:
    """A replayed draft with a second attention step (``num_spec`` 3 or more: steps
    ``0 .. num_spec - 2`` attend)."""
    return trace.config.num_spec >= 3 and reach_draft_replay(trace)


def smallest_step_not_advanced() -> Trace:
    """One request of one token, then its verify of ``next_n`` 4 and the draft of three
    steps (two attending) in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8, block_size=1,
                          num_spec=3, cudagraph_capture_sizes=(4,))  # fmt: skip
    return arrive_then_step(config, 1)
