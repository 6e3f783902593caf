"""SGLang's decode graph runner step of a Kimi Linear hybrid model (full attention and
Kimi Delta Attention layers), as the implementation ``sglang-hybrid-kda`` of
``runner-step``.

``sglang-hybrid-gdn``'s engine (:mod:`.runner_step_hybrid`: the same model runner,
decode graph runner, ``HybridLinearAttnBackend`` and ``HybridReqToTokenPool``), its
linear layers' backend ``layers/attention/linear/kda_backend.py``'s ``KDAAttnBackend``
(SGLang 0.5.23; ``attention_registry.py`` makes it for a Kimi Linear model),
unchanged: ``__init__`` (its kernel dispatcher over the linear backends the server
resolves, the transposed conv-state shape, the verify's intermediate state rows),
``init_forward_metadata`` (``MambaAttnBackendBase``'s, then its prefix-tracking
rows) and ``init_forward_metadata_out_graph`` at capture and replay
(``_replay_metadata``).

Stand-ins: ``sglang-hybrid-gdn``'s; nothing of the KDA backend's.

Fields: the Triton engine's and, as ``sglang-hybrid-gdn``'s, the linear backend's
``ForwardMetadata`` that ``forward_decode`` and ``forward_extend`` hand the KDA
kernels, prefixed ``kda.``: ``query_start_loc``, ``mamba_cache_indices`` (its state
slots; ``Field.writes_state``) and, for a verify, ``intermediate_state_indices``.
"""

from __future__ import annotations

from typing import Any

from attnfuzz.adapters.sglang import runner_step_hybrid as hybrid
from attnfuzz.reference.runner_step import RunnerStepInputs, RunnerStepOutputs

declines = hybrid.declines


def prepare() -> None:
    """Import SGLang's runner and the KDA backend before a judge forks."""
    hybrid.prepare()
    from sglang.srt.layers.attention.linear import kda_backend  # noqa: F401


class KDAEngine(hybrid.HybridGDNEngine):
    """``sglang-hybrid-gdn``'s engine, its linear layers on ``KDAAttnBackend``."""

    PREFIX = "kda"

    WHERE = {
        how: where.replace("GDNAttnBackend", "KDAAttnBackend")
        for how, where in hybrid.HybridGDNEngine.WHERE.items()
    }

    def linear_backend(self) -> Any:
        from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend

        return KDAAttnBackend(self.runner)


class KDALife(hybrid.HybridGDNLife):
    """The engine of ``sglang-hybrid-kda``: :class:`KDAEngine`, kept across a life's
    steps."""

    engine_class = KDAEngine

    def prepare(self) -> None:
        prepare()


ENGINE = KDALife()
"""The engine of the implementation ``sglang-hybrid-kda`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-hybrid-kda`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]
