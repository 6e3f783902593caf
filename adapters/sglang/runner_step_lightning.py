"""SGLang's decode graph runner step of a hybrid model whose linear layers are Bailing's
lightning attention, as the implementation ``sglang-hybrid-lightning`` of
``runner-step``.

``sglang-hybrid-gdn``'s engine (:mod:`.runner_step_hybrid`: the same model runner,
decode graph runner, ``HybridLinearAttnBackend`` and ``HybridReqToTokenPool``), its
linear layer's backend ``layers/attention/linear/lightning_backend.py``'s
``LightningAttentionBackend`` (SGLang 0.5.23; ``attention_registry.py`` makes it for a
Bailing hybrid model), unchanged: ``init_forward_metadata`` (``MambaAttnBackendBase.
_forward_metadata``, then ``linear_metadata.py``'s ``BailingLinearMetadata.
prepare_mixed``: the extend requests' query offsets and initial-state flags, the
decodes' count) and ``init_forward_metadata_out_graph`` (the capture's and the
replay's ``_replay_metadata``, then ``BailingLinearMetadata.prepare_decode``).

Stand-ins, besides ``sglang-hybrid-gdn``'s: the model runner's ``kv_cache_dtype_str``
(the server's default, ``auto``), which the backend keeps and its metadata never reads.

Fields: the Triton engine's, and ``BailingLinearMetadata``'s prefixed ``lightning.``,
as ``lightning_backend.py``'s ``_linear_attention_entry`` hands them to the seg_la
kernel: ``query_start_loc`` (offsets: each request's tokens), ``mamba_cache_indices``
(by request: the state slot the kernel reads and updates in place, a padding row's
``PAD_SLOT_ID``; ``Field.writes_state``), ``has_initial_states`` (by request: the
scale of its initial state, 0 for a request without one) and ``q_lengths`` (by
request). As ``sglang-hybrid-gdn``, the ``fresh`` build holds no state slots.

Mutant (a re-created defect): ``sglang-hybrid-lightning-padding-repeats-last`` (the
replay pads by repeating the last real row, a common way to pad a batch: each padding
row names that request's state slot, and the padded forward updates its state;
*padding writes no real state*).
"""

from __future__ import annotations

from typing import Any

import torch
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_hybrid as hybrid
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs
from attnfuzz.reference.trace import Trace, as_trace

declines = hybrid.declines


def prepare() -> None:
    """Import SGLang's runner and the lightning backend before a judge forks."""
    hybrid.prepare()
    from sglang.srt.layers.attention.linear import lightning_backend  # noqa: F401


class LightningEngine(hybrid.HybridGDNEngine):
    """``sglang-hybrid-gdn``'s engine, its linear layers on ``LightningAttentionBackend``."""

    PREFIX = "lightning"

    WHERE = {
        how: where.replace(
            "GDNAttnBackend's _forward_metadata", "LightningAttentionBackend's"
        ).replace("GDNAttnBackend._replay_metadata", "LightningAttentionBackend's _replay_metadata")
        for how, where in hybrid.HybridGDNEngine.WHERE.items()
    }

    def linear_backend(self) -> Any:
        from sglang.srt.layers.attention.linear.lightning_backend import (
            LightningAttentionBackend,
        )

        # The server's --kv-cache-dtype default (server_args.py), which the model runner
        # keeps as kv_cache_dtype_str; the backend keeps it, its metadata reads none.
        self.runner.kv_cache_dtype_str = "auto"
        return LightningAttentionBackend(self.runner)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """The Triton backend's fields and ``BailingLinearMetadata``'s, for ``rows``
        requests and ``tokens`` tokens (padding included), copied now."""
        from sglang.kernels.ops.mamba.causal_conv1d_triton import PAD_SLOT_ID

        linear = metadata.gdn  # the linear backend's metadata, whichever backend
        slots = self.runner.req_to_token_pool.mamba_pool.size
        out = (
            # forward_extend / forward_decode read each request's tokens
            # [query_start_loc[i], query_start_loc[i + 1]) of the forward's, its
            # q_lengths[i] of them, and its state at mamba_cache_indices[i] (the pool's
            # slots, PAD_SLOT_ID skipped), from zeros where has_initial_states[i] is 0.
            Field(
                "lightning.query_start_loc",
                "offsets",
                decode.host(linear.query_start_loc[: rows + 1]),
                (0, tokens),
            ),
            Field(
                "lightning.mamba_cache_indices",
                "requests",
                decode.host(linear.mamba_cache_indices[:rows]),
                (PAD_SLOT_ID, slots),
                writes_state=True,
                null_slot=hybrid.DUMMY_SLOT,
            ),
            Field(
                "lightning.q_lengths", "requests", decode.host(linear.q_lengths[:rows]), (0, tokens)
            ),  # fmt: skip
            Field(
                "lightning.has_initial_states",
                "requests",
                decode.host(linear.has_initial_states[:rows].to(torch.int64)),
                (0, 1),
            ),
        )
        return decode._Engine.metadata_fields(self, rows, tokens, metadata.full) + out


class LightningLife(hybrid.HybridGDNLife):
    """The engine of ``sglang-hybrid-lightning``: :class:`LightningEngine`, kept across a
    life's steps."""

    engine_class = LightningEngine

    def prepare(self) -> None:
        prepare()


ENGINE = LightningLife()
"""The engine of the implementation ``sglang-hybrid-lightning`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-hybrid-lightning`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the lightning backend's graph metadata, re-created ------------------


class _PaddingRepeatsLast(LightningEngine):
    """The replay's padding rows padded by repeating the last real row, a common way to
    pad a batch, instead of ``_replay_metadata``'s request row 0 and ``PAD_SLOT_ID``:
    each padding row names the last real request's state slot, and the padded forward
    updates that request's state with the padding row's tokens."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        linear = backend.linear_attn_backend
        replay = linear._replay_metadata

        def repeats_last(bs: int, req_pool_indices: Any, *args: Any, **kwargs: Any) -> Any:
            padding = kwargs.get("num_padding") or 0
            if not kwargs.get("in_capture", False) and 0 < padding < bs:
                req_pool_indices[bs - padding :] = req_pool_indices[bs - padding - 1]
                kwargs["num_padding"] = 0
            return replay(bs, req_pool_indices, *args, **kwargs)

        linear._replay_metadata = repeats_last
        return backend


PADDING_REPEATS_LAST = LightningLife(_PaddingRepeatsLast)


def run_padding_repeats_last(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-hybrid-lightning-padding-repeats-last``:
    :class:`_PaddingRepeatsLast`."""
    return PADDING_REPEATS_LAST(inputs)


run_padding_repeats_last.new_engine = PADDING_REPEATS_LAST.new_engine  # type: ignore[attr-defined]


def reach_padded_replay(trace: Trace | Case) -> bool:
    """A step the decode graph replays with padding rows: fewer requests than the
    smallest graph batch size that holds them."""
    sizes = decode.graph_batch_sizes(as_trace(trace).config)
    steps = decode.replayed(trace)
    return any(min(b for b in sizes if b >= s.num_reqs) > s.num_reqs for s in steps)


def trigger_padding_repeats_last(trace: Trace | Case) -> bool:
    """A padded replay: its padding rows name the last real request's state slot."""
    return reach_padded_replay(trace)


def smallest_padding_repeats_last() -> Trace:
    """One request of one token, then its decode in the graph of two requests."""
    config = EngineConfig(max_model_len=8, max_num_seqs=2, max_num_batched_tokens=8,
                          block_size=1, num_spec=0, cudagraph_capture_sizes=(2,))  # fmt: skip
    return decode.arrive_then_step(config, 1)
