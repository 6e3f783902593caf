"""SGLang's decode graph runner step of a short-conv hybrid model (LFM2's, ZAYA1's), as
the implementation ``sglang-hybrid-short-conv`` of ``runner-step``.

``sglang-hybrid-gdn``'s engine (:mod:`.runner_step_hybrid`: the same model runner,
decode graph runner and ``HybridReqToTokenPool``), on the backend
``attention_registry.py:attn_backend_wrapper`` makes for a short-conv hybrid model
(SGLang 0.5.23): ``hybrid_linear_attn_backend.py``'s ``ShortConvHybridAttnBackend`` over
the Triton backend and ``layers/attention/linear/short_conv_backend.py``'s
``ShortConvAttnBackend``, unchanged: ``__init__``, ``init_cuda_graph_state`` (its graph
buffer of slot indices), ``init_forward_metadata`` (``MambaAttnBackendBase.
_forward_metadata``, then ``_refresh_cache_indices`` and the extend's initial-state
flags), ``init_forward_metadata_out_graph`` at capture and at replay
(``_replay_metadata``, then ``_refresh_cache_indices``: the batch's slot indices copied
into the graph's buffer), and ``conv_state_metadata``, the handle the model's conv
layers read.

Stand-ins: ``sglang-hybrid-gdn``'s; nothing of the short-conv backend's.

Fields: the Triton engine's, and what ``conv_state_metadata`` hands the model's conv
kernel, prefixed ``short_conv.``: ``cache_indices`` (by request: the state slot the
kernel reads and updates in place, a padding row's ``PAD_SLOT_ID``;
``Field.writes_state``; in a graph, the view of the buffer the capture read),
``query_start_loc`` (offsets) and, for an extend, ``has_initial_state`` (by request).
As ``sglang-hybrid-gdn``, the ``fresh`` build holds no state slots.

Mutant (a re-created defect): ``sglang-hybrid-short-conv-fresh-indices`` (each step's
slot indices a new tensor, not refilled into the graph's buffer in place: a replayed
graph reads the capture's slots; replay equals eager).
"""

from __future__ import annotations

from typing import Any

import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_hybrid as hybrid
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace

declines = hybrid.declines

LAYER = hybrid.GDN_LAYERS[0]  # the model's conv layer: the mamba pool's layer


def prepare() -> None:
    """Import SGLang's runner and the short-conv backend before a judge forks."""
    hybrid.prepare()
    from sglang.srt.layers.attention.linear import short_conv_backend  # noqa: F401


def _metadata(backend: Any, verify: bool) -> Any:
    """What a graph or a build reads: the Triton backend's metadata (``full``), the
    linear backend's (``gdn``), and the conv layers' handle (``conv``:
    ``conv_state_metadata``, whose ``cache_indices`` in a graph is a view of the
    buffer ``_refresh_cache_indices`` refills in place)."""
    conv = backend.conv_state_metadata(LAYER, None)
    return _engine.StandIn(
        full=backend.full_attn_backend.forward_metadata,
        gdn=backend.linear_attn_backend.forward_metadata,
        conv=conv,
        verify=verify,
    )


class _ShortConvGraph(hybrid._HybridGraph):
    METADATA = staticmethod(_metadata)


class ShortConvEngine(hybrid.HybridGDNEngine):
    """``sglang-hybrid-gdn``'s engine, its linear layers short convolutions."""

    GRAPH = _ShortConvGraph
    PREFIX = "short_conv"

    WHERE = {
        how: where.replace("GDNAttnBackend's _forward_metadata", "ShortConvAttnBackend's")
        .replace("GDNAttnBackend._replay_metadata", "ShortConvAttnBackend's _replay_metadata")
        .replace("HybridLinearAttnBackend", "ShortConvHybridAttnBackend")
        .replace("GDNAttnBackend's state_indices_list", "ShortConvAttnBackend's cache indices")
        for how, where in hybrid.HybridGDNEngine.WHERE.items()
    }

    def make_backend(self) -> Any:
        """``ShortConvHybridAttnBackend(TritonAttnBackend, ShortConvAttnBackend, [0])``,
        as ``attn_backend_wrapper`` builds it for a short-conv hybrid model."""
        from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
            ShortConvHybridAttnBackend,
        )

        made = super().make_backend()
        return ShortConvHybridAttnBackend(
            made.full_attn_backend, made.linear_attn_backend, hybrid.FULL_ATTENTION_LAYERS
        )

    def linear_backend(self) -> Any:
        from sglang.srt.layers.attention.linear.short_conv_backend import ShortConvAttnBackend

        return ShortConvAttnBackend(self.runner)

    def persistent_metadata(self, mode: str) -> Any:
        """The hybrid engine's, and the conv layers' handle after the replay's
        preparation."""
        base = super().persistent_metadata(mode)
        conv = self.backend.conv_state_metadata(LAYER, None)
        return _engine.StandIn(full=base.full, gdn=base.gdn, conv=conv, verify=base.verify)

    def state_field(self) -> str:
        return "short_conv.cache_indices"

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The Triton backend's fields and the conv layers' handle, for ``rows`` requests
        and ``tokens`` tokens (padding included), copied now."""
        from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID

        conv = metadata.conv
        slots = self.runner.req_to_token_pool.mamba_pool.size
        out = [
            # The conv kernel (causal_conv1d_update on decode, causal_conv1d_fn on an
            # extend) reads and updates conv_states[cache_indices[i]] in place (the
            # pool's size + 1 slots, slot 0 the dummy's), skipping PAD_SLOT_ID.
            Field(
                "short_conv.cache_indices",
                "requests",
                decode.host(conv.cache_indices[:rows]),
                (PAD_SLOT_ID, slots),
                writes_state=True,
                null_slot=hybrid.DUMMY_SLOT,
            ),
            # ... and request i's tokens [query_start_loc[i], query_start_loc[i + 1]).
            Field(
                "short_conv.query_start_loc",
                "offsets",
                decode.host(conv.query_start_loc[: rows + 1]),
                (0, tokens),
            ),
        ]
        if conv.has_initial_state is not None:  # an extend's: from zeros where False
            out.append(
                Field(
                    "short_conv.has_initial_state",
                    "requests",
                    decode.host(conv.has_initial_state[:rows].to(torch.int64)),
                    (0, 1),
                )
            )
        return decode._Engine.metadata_fields(self, rows, tokens, metadata.full) + tuple(out)


class ShortConvLife(hybrid.HybridGDNLife):
    """The engine of ``sglang-hybrid-short-conv``: :class:`ShortConvEngine`, kept across
    a life's steps."""

    engine_class = ShortConvEngine

    def prepare(self) -> None:
        prepare()


ENGINE = ShortConvLife()
"""The engine of the implementation ``sglang-hybrid-short-conv`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-hybrid-short-conv`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the short-conv backend's graph metadata, re-created -----------------


class _FreshIndices(ShortConvEngine):
    """``_refresh_cache_indices`` handing out a new tensor each step instead of
    refilling the graph's buffer in place: a graph keeps reading the tensor its
    capture was handed, and its conv layers read and update the capture's slots."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        conv = backend.linear_attn_backend

        def fresh_indices() -> None:
            md = conv.forward_metadata
            idx = md.mamba_cache_indices if md is not None else None
            conv._cache_indices = None if idx is None else idx.to(conv.cache_indices_dtype)

        conv._refresh_cache_indices = fresh_indices
        return backend


FRESH_INDICES = ShortConvLife(_FreshIndices)


def run_fresh_indices(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-hybrid-short-conv-fresh-indices``: :class:`_FreshIndices`."""
    return FRESH_INDICES(inputs)


run_fresh_indices.new_engine = FRESH_INDICES.new_engine  # type: ignore[attr-defined]


def reach_replay(trace: Trace | Case) -> bool:
    """A step the decode graph replays (a decode or verify within its batch sizes): the
    graph's conv layers read the buffer the replay refilled."""
    return bool(decode.replayed(trace))


def trigger_fresh_indices(trace: Trace | Case) -> bool:
    """A replayed step: the graph reads the indices its capture was handed."""
    return reach_replay(trace)


def smallest_fresh_indices() -> Trace:
    """One request of one token, then its decode in the graph of two requests: the
    graph reads the capture's slots."""
    config = EngineConfig(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2,))  # fmt: skip
    return decode.arrive_then_step(config, 1)
