"""SGLang's attention backends of a CPU server, and torch's FlexAttention one, beside
the Triton engine, as the implementation ``sglang-cpu-backends`` of ``runner-step``.

On ``--device cpu`` SGLang picks ``intel_amx`` on x86 and ``torch_native`` on arm64
(``arg_groups/platform_hook.py:handle_cpu_backends``); ``flex_attention`` is torch's
own too, run wherever torch is (graphs disabled, ``arg_groups/attention_hook.py``).
Each step of a trace runs on the Triton engine of ``sglang``
(:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`: its capture, eager, padded,
replay and fresh builds, all reported) and eagerly on an engine of each of those three
backends, each keeping its own requests' rows across the
trace (:class:`~attnfuzz.adapters.sglang.runner_step_backends.BackendsLife`). What runs,
unchanged (SGLang 0.5.23):

- ``layers/attention/intel_amx_backend.py``: ``IntelAMXAttnBackend``: ``__init__`` and
  ``init_forward_metadata`` (a decode; a target verify, whose extend metadata
  ``_build_extend_metadata`` derives from the verify's ``spec_info``: each request
  ``draft_token_num`` tokens; an extend);
- ``layers/attention/torch_native_backend.py``: ``TorchNativeAttnBackend``: ``__init__``
  and ``init_forward_metadata``. It keeps no metadata of its own: its forward reads the
  runner's ``req_to_token`` rows, ``seq_lens`` and extend lengths;
- ``layers/attention/torch_flex_backend.py``: ``TorchFlexAttnBackend``: ``__init__`` and
  ``init_forward_metadata``: a block mask a request (torch's ``create_block_mask``), of
  ``seq_len`` queries by ``seq_len`` keys for an extend (the forward pads each
  request's queries to its whole sequence), of 1 by ``seq_len`` for a decode.

Each backend's build is reported as a ``backend`` build with every field it holds: the
step's inputs, Intel AMX's extend metadata (``amx.seq_lens``, ``amx.extend_seq_lens``,
``amx.extend_start_loc``, each with the range ``extend_attention_cpu`` accepts),
FlexAttention's masks' sizes (``flex.q_len``, ``flex.kv_len``: each request's mask's,
the keys' held to ``seq_lens``, which its forward reads the keys by), and
``kv_len`` and ``kv_slots`` as that backend's kernels read them
(:meth:`IntelAMXEngine.kv_read`, :meth:`TorchNativeEngine.kv_read`). The property
*agreement across backends* holds each field it shares with the Triton eager build to
that build's; safe padding holds every field to its range.

Not run: the CPU graph runner (``model_executor/cpu_graph_runner.py``, a
``torch.compile`` capture of the whole model), which calls the same eager
``init_forward_metadata`` at replay. Declined: a speculative config on ``torch_native``
and on ``flex_attention``, which have no verify path (their ``forward_extend`` reads
``extend_prefix_lens``, which a target verify's batch does not carry).

Stand-ins, besides the step's: the two CPU attention kernels ``IntelAMXAttnBackend``
looks up when built (``torch.ops.sgl_kernel.decode_attention_cpu`` and
``extend_attention_cpu``), where SGLang's CPU kernels are not installed
(:func:`cpu_kernels`): operators that exist and have no implementation, as the
metadata code never calls them.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import with_step_keys
from attnfuzz.adapters.sglang.runner_step_backends import BackendsLife, EagerLife
from attnfuzz.reference.batch import EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs

CPU_OPS = ("decode_attention_cpu", "extend_attention_cpu")
"""The ``sgl_kernel`` operators ``IntelAMXAttnBackend.__init__`` looks up."""

_OPS_LIBRARY: list[Any] = []  # the stand-in operators' library, kept alive once defined


def prepare() -> None:
    """Import SGLang's runner and both CPU backends before a judge forks its child."""
    decode.prepare()
    from sglang.srt.layers.attention import (  # noqa: F401
        intel_amx_backend,
        torch_flex_backend,
        torch_native_backend,
    )


@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    """While ``IntelAMXAttnBackend`` is built: ``import sgl_kernel`` finds SGLang's kernel
    package (an empty one where it is not installed), and each of :data:`CPU_OPS` is an
    operator of ``torch.ops.sgl_kernel``: the installed CPU kernel, else one defined here
    with no implementation (a call raises; the metadata code makes none)."""
    missing = [op for op in CPU_OPS if not hasattr(torch.ops.sgl_kernel, op)]
    if missing and not _OPS_LIBRARY:
        library = torch.library.Library("sgl_kernel", "FRAGMENT")
        for op in missing:
            library.define(f"{op}() -> ()")
        _OPS_LIBRARY.append(library)
    placed = False
    if "sgl_kernel" not in sys.modules:
        try:
            import sgl_kernel  # noqa: F401
        except ImportError:
            sys.modules["sgl_kernel"] = types.ModuleType("sgl_kernel")
            placed = True
    try:
        yield
    finally:
        if placed:
            sys.modules.pop("sgl_kernel", None)


def _request_reads(table: torch.Tensor, rows: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Each request's first ``lengths[b]`` entries of its ``req_to_token`` row ``rows[b]``."""
    host = decode.host(table)
    return [host[r, : max(int(n), 0)].astype(np.int64) for r, n in zip(rows, lengths, strict=True)]


class IntelAMXEngine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is Intel AMX's."""

    ATTENTION_BACKEND = "intel_amx"
    WHERE = {
        **decode._WHERE,
        "eager": "intel_amx_backend.py:IntelAMXAttnBackend.init_forward_metadata",
        "fresh": "intel_amx_backend.py:IntelAMXAttnBackend.init_forward_metadata (a new engine)",
    }

    def make_backend(self) -> Any:
        from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend

        self.runner.use_mla_backend = False
        with cpu_kernels():
            return IntelAMXAttnBackend(self.runner)

    def seq_len_fill(self) -> int:
        """The CPU graph runner's padding fill (``cpu_graph_runner.py``:
        ``get_cpu_graph_seq_len_fill_value``)."""
        return self.backend.get_cpu_graph_seq_len_fill_value()

    def eager_metadata(self, forward_batch: Any) -> Any:
        """The extend metadata ``forward_extend`` reads (a verify's and an extend's),
        and the batch's rows, which both kernels read ``req_to_token`` by."""
        return _engine.StandIn(
            extend=self.backend.extend_metadata, req_pool_indices=forward_batch.req_pool_indices
        )

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """A verify's or an extend's ``extend_metadata``: the lengths
        ``extend_attention_cpu`` reads (the whole KV, the step's part of it) and where
        each request's tokens start."""
        if metadata.extend is None:
            return ()
        seq_lens, extend_lens, start_loc, _ = metadata.extend
        width = self.runner.req_to_token_pool.req_to_token.shape[1]
        return (
            # The kernel reads req_to_token[row, : seq_lens - extend_seq_lens], then the
            # step's keys from k: a row's whole KV is at most its table width.
            Field("amx.seq_lens", "requests", decode.host(seq_lens[:rows]), (0, width)),
            Field(
                "amx.extend_seq_lens", "requests", decode.host(extend_lens[:rows]), (0, tokens)
            ),  # fmt: skip
            # q[extend_start_loc[b] : + extend_seq_lens[b]]: tokens of the forward.
            Field(
                "amx.extend_start_loc", "requests", decode.host(start_loc[:rows]), (0, tokens)
            ),  # fmt: skip
        )

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """A decode: ``decode_attention_cpu`` reads ``req_to_token[row, :seq_lens[b]]``
        (the step's key written first). A verify or an extend: ``extend_attention_cpu``
        reads the prefix ``req_to_token[row, : seq_lens[b] - extend_seq_lens[b]]``, then
        the step's keys ``k[extend_start_loc[b] : + extend_seq_lens[b]]``
        (:func:`with_step_keys`)."""
        rows = decode.host(metadata.req_pool_indices)
        table = self.runner.req_to_token_pool.req_to_token
        if "amx.seq_lens" not in values:
            lengths = values["seq_lens"]
            return lengths, _request_reads(table, rows, lengths)
        extend = values["amx.extend_seq_lens"]
        cached = values["amx.seq_lens"] - extend
        starts = values["amx.extend_start_loc"]
        qo = np.concatenate([starts, starts[-1:] + extend[-1:]]) if len(starts) else np.zeros(1)
        return with_step_keys(
            cached, _request_reads(table, rows, cached), qo.astype(np.int64),
            values["out_cache_loc"],
        )  # fmt: skip


class TorchNativeEngine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is torch's SDPA."""

    ATTENTION_BACKEND = "torch_native"
    WHERE = {
        **decode._WHERE,
        "eager": "torch_native_backend.py:TorchNativeAttnBackend.init_forward_metadata",
        "fresh": "torch_native_backend.py:TorchNativeAttnBackend.init_forward_metadata "
        "(a new engine)",
    }

    def make_backend(self) -> Any:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        return TorchNativeAttnBackend(self.runner)

    def seq_len_fill(self) -> int:
        """0: no graph pads its batches (SGLang disables graphs with this backend,
        ``arg_groups/attention_hook.py``), and its reads, ``req_to_token[row,
        :seq_len]``, accept an empty row."""
        return 0

    def eager_metadata(self, forward_batch: Any) -> Any:
        """The batch's rows: the backend keeps no metadata of its own."""
        return _engine.StandIn(req_pool_indices=forward_batch.req_pool_indices)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        return ()

    def kv_read(
        self, values: dict[str, np.ndarray], metadata: Any
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``_run_sdpa_forward_decode`` and ``_run_sdpa_forward_extend`` read each
        request's ``req_to_token[row, :seq_lens[b]]`` (the step's keys written first)."""
        lengths = values["seq_lens"]
        rows = decode.host(metadata.req_pool_indices)
        return lengths, _request_reads(self.runner.req_to_token_pool.req_to_token, rows, lengths)


class TorchFlexEngine(TorchNativeEngine):
    """One SGLang engine whose model runner's attention backend is torch's FlexAttention:
    torch SDPA's engine (no graph, the same reads of ``req_to_token``), its own masks."""

    ATTENTION_BACKEND = "flex_attention"
    WHERE = {
        **decode._WHERE,
        "eager": "torch_flex_backend.py:TorchFlexAttnBackend.init_forward_metadata",
        "fresh": "torch_flex_backend.py:TorchFlexAttnBackend.init_forward_metadata (a new engine)",
    }

    def make_backend(self) -> Any:
        from sglang.srt.layers.attention.torch_flex_backend import TorchFlexAttnBackend

        return TorchFlexAttnBackend(self.runner)

    def eager_metadata(self, forward_batch: Any) -> Any:
        """The masks the forward reads, a request each (an extend's or a decode's), and
        the batch's rows."""
        b = self.backend
        masks = (
            b.extend_block_masks if forward_batch.forward_mode.is_extend() else b.decode_block_masks
        )
        return _engine.StandIn(masks=list(masks), req_pool_indices=forward_batch.req_pool_indices)

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """Each request's mask's sizes: ``_run_flex_forward_extend`` and
        ``_run_flex_forward_decode`` hand ``flex_attention`` mask ``b`` beside request
        ``b``'s keys, ``req_to_token[row, :seq_lens[b]]``: its key count must be that."""
        sizes = np.array([[int(n) for n in m.seq_lengths] for m in metadata.masks], dtype=np.int64)
        sizes = sizes.reshape(-1, 2)
        width = self.runner.req_to_token_pool.req_to_token.shape[1]
        return (
            Field("flex.q_len", "requests", sizes[:, 0], (1, width)),
            Field("flex.kv_len", "requests", sizes[:, 1], (0, width), agrees_with="seq_lens"),
        )


def declines_torch_native(config: EngineConfig) -> str | None:
    """A speculative config: ``TorchNativeAttnBackend`` (and ``TorchFlexAttnBackend``)
    has no verify path."""
    if config.num_spec:
        return (
            "torch_native and flex_attention have no target verify: forward_extend reads "
            "extend_prefix_lens, which a verify's batch does not carry"
        )
    return None


class _Life(decode.EngineLife):
    def __init__(self, engine: type[decode._Engine]) -> None:
        self.engine_class = engine
        super().__init__()

    def prepare(self) -> None:
        prepare()


ENGINES = BackendsLife(
    decode.EngineLife(),
    # Every field kept: none shares a name with a Triton field of another meaning.
    EagerLife(_Life(IntelAMXEngine), shared=None),
    EagerLife(_Life(TorchNativeEngine), declines_torch_native, shared=None),
    EagerLife(_Life(TorchFlexEngine), declines_torch_native, shared=None),
)
"""The engines of the implementation ``sglang-cpu-backends`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-cpu-backends`` of ``runner-step``: the step on
    :data:`ENGINES`, kept across calls; ``run.new_engine()`` drops them."""
    return ENGINES(inputs)


run.new_engine = ENGINES.new_engine  # type: ignore[attr-defined]
