"""SGLang's decode graph runner step with one backend for prefill and another for
decode, as the implementation ``sglang-prefill-decode`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows, decode graph runner and graph stand-in), on the engine started with
``--prefill-attention-backend fa3 --decode-attention-backend triton``. Where the two
differ, ``model_runner_components/attention_backend_setup.py:_build_resolved_backend``
builds each (the decode backend first) and wraps them in
``layers/attention/hybrid_attn_backend.py``'s ``HybridAttnBackend`` (SGLang 0.5.23),
which runs unchanged: ``__init__``; ``_select_backend`` (a decode goes to the decode
backend, an extend to the prefill backend, a target verify to the prefill backend under
``--speculative-attention-mode prefill``, the default); ``init_forward_metadata``
(eager), ``init_cuda_graph_state`` (the decode backend's, and the prefill backend's
too for a speculative engine: its verify is captured on it),
``get_cuda_graph_seq_len_fill_value``, and ``init_forward_metadata_out_graph`` at
every capture and replay, each handing on to the backend it selects. The implementation
``sglang-prefill-decode-verify-on-decode`` is the same engine under
``--speculative-attention-mode decode``: a verify goes to the decode backend, and the
graph state is the decode backend's alone. Under them,
``sglang``'s Triton backend and ``sglang-fa3``'s FlashAttention 3 backend, with their
stand-ins (:mod:`~attnfuzz.adapters.sglang.runner_step_fa3`). The KV cache is bf16, the
model runner's one dtype, which both backends read.

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``,
``eager``, ``padded``, ``replay``, ``fresh``), each naming in its ``where`` the backend
that built it. Fields: the runner's inputs, and the metadata of the backend the step
went to, as that backend's own implementation reads it: a decode's are ``sglang``'s
(``kv_indptr``, ``kv_indices``), a verify's and an extend's ``sglang-fa3``'s
(``cache_seqlens_int32``, ``page_table``, ``cu_seqlens_q``, ``cu_seqlens_k``). And
``kv_len`` and ``kv_slots`` from them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang import runner_step_fa3 as fa3
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild

PREFILL, DECODE = "fa3", "triton"
"""``--prefill-attention-backend`` and ``--decode-attention-backend``."""

_MODES = {"decode": "DECODE", "verify": "TARGET_VERIFY", "extend": "EXTEND"}


def prepare() -> None:
    """Import SGLang's runner, both backends and their wrapper before a judge forks."""
    fa3.prepare()
    from sglang.srt.layers.attention import hybrid_attn_backend  # noqa: F401


def _forward_mode(mode: str) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return getattr(ForwardMode, _MODES[mode])


class _HybridGraph(decode._Graph):
    """The decode graph: a capture records the metadata of the backend the capture ran
    on (the one the graph runner's ``capture_forward_mode`` selects)."""

    def capture_one(self, shape_key: Any, *args: Any, **kwargs: Any) -> None:
        runner = self.runner  # the decode graph runner
        chosen = runner.attn_backend._select_backend(runner.capture_forward_mode)
        self.graphs[shape_key] = chosen.forward_metadata


class PrefillDecodeEngine(fa3.FA3Engine):
    """One SGLang engine whose model runner's attention backend is ``HybridAttnBackend``
    over FlashAttention 3 for prefill and Triton for decode. Its fields are read by the
    engine of the backend a build came from (:meth:`_reader`)."""

    ATTENTION_BACKEND = DECODE
    SERVER_ARGS = {"prefill_attention_backend": PREFILL, "decode_attention_backend": DECODE}
    GRAPH = _HybridGraph
    _HYBRID = "hybrid_attn_backend.py:HybridAttnBackend"
    WHERE = {
        "eager": f"{_HYBRID}.init_forward_metadata",
        "fresh": f"{_HYBRID}.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        f"{_HYBRID}.init_forward_metadata_out_graph's backend)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (what the graph "
        "reads)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        f"({_HYBRID}.init_forward_metadata_out_graph, in_capture)",
    }

    def make_backend(self) -> Any:
        """As ``_build_resolved_backend``: the decode backend, the prefill backend, and
        ``HybridAttnBackend`` over them (no model-level wrapper: a plain decoder)."""
        from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend

        prefill = fa3.FA3Engine.make_backend(self)  # sets the runner's bf16 KV cache first
        decode_backend = decode._Engine.make_backend(self)
        return HybridAttnBackend(
            model_runner=self.runner, decode_backend=decode_backend, prefill_backend=prefill
        )

    def _chosen(self, mode: str) -> Any:
        return self.backend._select_backend(_forward_mode(mode))

    def _reader(self, metadata: Any) -> type[decode._Engine]:
        """The engine class whose fields read ``metadata``: FA3's for its
        ``FlashAttentionMetadata``, the Triton engine's otherwise."""
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionMetadata

        return fa3.FA3Engine if isinstance(metadata, FlashAttentionMetadata) else decode._Engine

    def eager_metadata(self, forward_batch: Any) -> Any:
        return self.backend._select_backend(forward_batch.forward_mode).forward_metadata

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        build = super().eager(inputs, mode, how)
        return dataclasses.replace(build, where=f"{build.where}: {self._name(mode)}")

    def _name(self, mode: str) -> str:
        return f"{type(self._chosen(mode)).__name__} ({mode})"

    def persistent_metadata(self, mode: str) -> Any:
        """What the replay's preparation left in the chosen backend: FA3's
        ``forward_metadata``, or the Triton backend's persistent buffers."""
        chosen = self._chosen(mode)
        if chosen is self.backend.prefill_backend:
            return chosen.forward_metadata
        return _engine.StandIn(
            kv_indptr=chosen.kv_indptr,
            kv_indices=chosen.cuda_graph_kv_indices,
            qo_indptr=chosen.qo_indptr if mode == "verify" else None,
        )

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        return self._reader(metadata).metadata_fields(self, rows, tokens, metadata)

    def kv_read(self, values: dict[str, Any], metadata: Any) -> Any:
        return self._reader(metadata).kv_read(self, values, metadata)


class PrefillDecodeLife(decode.EngineLife):
    """The engine of ``sglang-prefill-decode``: :class:`PrefillDecodeEngine`, kept across
    a life's steps."""

    engine_class: type[PrefillDecodeEngine] = PrefillDecodeEngine

    def prepare(self) -> None:
        prepare()

    def server_args(self, config: EngineConfig, attention_backend: str) -> Any:
        return decode._server_args(config, attention_backend, **self.engine_class.SERVER_ARGS)

    def graph_read(self, engine: Any) -> list[Any]:
        """Both backends: each keeps its own persistent buffers."""
        return [engine.backend.decode_backend, engine.backend.prefill_backend]

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        name = engine._name(mode)
        return [
            dataclasses.replace(b, where=f"{b.where}: {name}")
            for b in super().graph_builds(engine, inputs, mode)
        ]


ENGINE = PrefillDecodeLife()
"""The engine of the implementation ``sglang-prefill-decode`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-prefill-decode`` of ``runner-step``: the step on
    :data:`ENGINE`, kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


class VerifyOnDecodeEngine(PrefillDecodeEngine):
    """The same engine under ``--speculative-attention-mode decode``: a target verify
    goes to the decode backend, and the graph state is the decode backend's alone."""

    SERVER_ARGS = {**PrefillDecodeEngine.SERVER_ARGS, "speculative_attention_mode": "decode"}


class _VerifyOnDecodeLife(PrefillDecodeLife):
    engine_class = VerifyOnDecodeEngine


VERIFY_ON_DECODE = _VerifyOnDecodeLife()
"""The engine of ``sglang-prefill-decode-verify-on-decode``."""


def run_verify_on_decode(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-prefill-decode-verify-on-decode`` of ``runner-step``:
    the step on :data:`VERIFY_ON_DECODE`; ``run_verify_on_decode.new_engine()`` drops it."""
    return VERIFY_ON_DECODE(inputs)


run_verify_on_decode.new_engine = VERIFY_ON_DECODE.new_engine  # type: ignore[attr-defined]
