"""SGLang's decode graph runner step of a Mamba2 hybrid model (NemotronH's, Falcon-H1's
layout), as the implementation ``sglang-hybrid-mamba2`` of ``runner-step``.

``sglang-hybrid-gdn``'s engine (:mod:`.runner_step_hybrid`: the same model runner,
decode graph runner, ``HybridLinearAttnBackend`` and ``HybridReqToTokenPool``), its
linear layers' backend ``hybrid_linear_attn_backend.py``'s ``Mamba2AttnBackend``
(SGLang 0.5.23; ``attention_registry.py`` makes it for a Mamba2 model that is not a
short-conv one), unchanged: ``__init__``, ``init_forward_metadata``
(``MambaAttnBackendBase._forward_metadata``, then ``mamba/mamba2_metadata.py``'s
``Mamba2Metadata.prepare_mixed``: an extend's query offsets, initial-state flags,
each token's sequence index, and, where a request starts from a state, the logical
chunks of ``_query_start_loc_to_chunk_indices_offsets``) and
``init_forward_metadata_out_graph`` (the capture's and the replay's
``_replay_metadata``, then ``Mamba2Metadata.prepare_decode``).

Stand-ins, besides ``sglang-hybrid-gdn``'s: the model config's ``mamba_chunk_size``
(:data:`CHUNK_SIZE`, small, so that the traces' few tokens cross chunk boundaries; the
models ship 128 or 256, and SGLang's default is 64).

Fields: the Triton engine's, and ``Mamba2Metadata``'s prefixed ``mamba2.``, as
``Mamba2AttnBackend.forward`` hands them to ``MambaMixer2``: ``query_start_loc``
(offsets), ``mamba_cache_indices`` (by request: the state slot the conv and SSD
kernels read and update in place, a padding row's ``PAD_SLOT_ID``;
``Field.writes_state``) and, for an extend, ``has_initial_states`` (by request) and
``seq_idx`` (by token: the request each token belongs to). The logical chunks have
no rows of the step (they are the chunks'); :func:`chunks` reads them for the tests.
As ``sglang-hybrid-gdn``, the ``fresh`` build holds no state slots.
"""

from __future__ import annotations

from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_hybrid as hybrid
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

declines = hybrid.declines

CHUNK_SIZE = 4
"""The Mamba2 layers' chunk size (``hf_text_config.mamba_chunk_size``)."""


def prepare() -> None:
    """Import SGLang's runner and the Mamba2 metadata before a judge forks."""
    hybrid.prepare()
    from sglang.srt.layers.attention.mamba import mamba2_metadata  # noqa: F401


class Mamba2Engine(hybrid.HybridGDNEngine):
    """``sglang-hybrid-gdn``'s engine, its linear layers Mamba2's."""

    PREFIX = "mamba2"

    WHERE = {
        how: where.replace("GDNAttnBackend's _forward_metadata", "Mamba2AttnBackend's")
        .replace("GDNAttnBackend._replay_metadata", "Mamba2AttnBackend's _replay_metadata")
        .replace("GDNAttnBackend's state_indices_list", "Mamba2Metadata's")
        for how, where in hybrid.HybridGDNEngine.WHERE.items()
    }

    def linear_backend(self) -> Any:
        import copy

        from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

        # The model's chunk size (MambaAttnBackendBase.mamba_chunk_size reads it), on
        # this engine's copy of the text config.
        model = self.runner.model_config
        model.hf_text_config = copy.copy(model.hf_text_config)
        model.hf_text_config.mamba_chunk_size = CHUNK_SIZE
        return Mamba2AttnBackend(self.runner)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The Triton backend's fields and ``Mamba2Metadata``'s, for ``rows`` requests
        and ``tokens`` tokens (padding included), copied now."""
        from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID

        m = metadata.gdn  # the linear backend's metadata, whichever backend
        slots = self.runner.req_to_token_pool.mamba_pool.size
        out = [
            # MambaMixer2.forward: request i's tokens [query_start_loc[i],
            # query_start_loc[i + 1]) of the forward's (an extend's first
            # num_prefills + 1 offsets).
            Field(
                "mamba2.query_start_loc",
                "offsets",
                decode.host(m.query_start_loc[: rows + 1]),
                (0, tokens),
            ),
            # ... causal_conv1d and the SSD scan read and write the states at
            # conv_states / ssm_states[mamba_cache_indices[i]] (the pool's slots, slot 0
            # the dummy's), skipping PAD_SLOT_ID.
            Field(
                "mamba2.mamba_cache_indices",
                "requests",
                decode.host(m.mamba_cache_indices[:rows]),
                (PAD_SLOT_ID, slots),
                writes_state=True,
                null_slot=hybrid.DUMMY_SLOT,
            ),
        ]
        mixed = getattr(m, "mixed_metadata", None)
        if mixed is not None:  # an extend's: prepare_mixed
            out += [
                # The conv and the scan start from a request's state where its flag is
                # set, else from zeros.
                Field(
                    "mamba2.has_initial_states",
                    "requests",
                    decode.host(mixed.has_initial_states[:rows].to(torch.int64)),
                    (0, 1),
                ),
                # _chunk_scan_fwd / _state_passing_fwd: token t belongs to request
                # seq_idx[t] of the extend's.
                Field(
                    "mamba2.seq_idx",
                    "tokens",
                    decode.host(mixed.seq_idx[0]),
                    (0, max(m.num_prefills - 1, 0)),
                ),
            ]
        return decode._Engine.metadata_fields(self, rows, tokens, metadata.full) + tuple(out)


def chunks(engine: Mamba2Engine) -> tuple[list[int], list[int]] | None:
    """The logical chunks of the engine's last extend (``chunk_indices``,
    ``chunk_offsets``), None where no request started from a state."""
    mixed = engine.backend.linear_attn_backend.forward_metadata.mixed_metadata
    if mixed is None or mixed.chunk_indices is None:
        return None
    return mixed.chunk_indices.tolist(), mixed.chunk_offsets.tolist()


class Mamba2Life(hybrid.HybridGDNLife):
    """The engine of ``sglang-hybrid-mamba2``: :class:`Mamba2Engine`, kept across a
    life's steps."""

    engine_class = Mamba2Engine

    def prepare(self) -> None:
        prepare()


ENGINE = Mamba2Life()
"""The engine of the implementation ``sglang-hybrid-mamba2`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-hybrid-mamba2`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
