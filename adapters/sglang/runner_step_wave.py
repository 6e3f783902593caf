"""SGLang's decode graph runner step on the Wave backend (ROCm), as the implementation
``sglang-wave`` of ``runner-step``.

The step of :mod:`~attnfuzz.adapters.sglang.runner_step` (its driver
:class:`~attnfuzz.adapters.sglang.runner_step.EngineLife`, the same model runner,
request rows, decode graph runner and graph stand-in), on the engine started with
``--attention-backend wave`` (``attention_registry.py:create_wave_backend``). What runs
besides, unchanged (SGLang 0.5.23):

- ``layers/attention/wave_backend.py``: ``WaveAttnBackend``: ``__init__`` (its persistent
  ``kv_indptr``, ``qo_indptr``, ``mask_indptr``); ``get_num_kv_splits`` (over SGLang's
  Triton ``get_num_kv_splits_triton``); ``init_forward_metadata`` (eager: a decode, a
  target verify of ``topk`` 1, an extend); ``init_cuda_graph_state``;
  ``init_forward_metadata_out_graph`` with ``in_capture=True`` for every capture batch
  size (``_apply_cuda_graph_metadata``, ``_build_cuda_graph_forward_metadata``) and, from
  ``load_batch``, the replay's (``_apply_cuda_graph_metadata``: the decode's and the
  verify's branches); ``get_cuda_graph_seq_len_fill_value``;
- the Triton kernels ``kernels/ops/attention/kv_indices.py:create_flashinfer_kv_indices_triton``
  (every ``kv_indices``) and ``kernels/ops/attention/metadata.py:get_num_kv_splits_triton``
  (every decode's ``num_kv_splits``), under Triton's interpreter;
- ``layers/attention/wave_ops/decode_attention.py:decode_attention_intermediate_arrays_shapes``
  (the decode's split buffers), imported under the stand-in below.

The backend's metadata is all written outside the graph (it has no
``init_forward_metadata_in_graph``): the graph stand-in is the Triton step's; as
Triton's, the replay writes the persistent buffers and leaves ``forward_metadata`` as
it was, so ``padded`` reads those buffers (:meth:`WaveEngine.persistent_metadata`).

Stand-ins, besides the step's:

- the ``wave_lang`` package (:data:`WAVE_LANG`: Wave's compiler, which builds its
  kernels for AMD GPUs), in ``sys.modules`` only while the engine is built or steps
  (:func:`wave`), with SGLang's own ``wave_ops.decode_attention`` and
  ``wave_ops.extend_attention`` (imported once under it: they import ``wave_lang`` at
  import); its compiler and kernel templates refuse (the model's forward never runs);
  ``get_paged_decode_intermediate_arrays_shapes`` and ``paged_decode_attention_shape``
  (``wave_lang/kernel/wave/templates/paged_decode_attention.py``) by their contract: the
  shapes of the decode's split buffers ``attn_logits`` / ``attn_lse``, no field here;
- ``wave_backend.get_device_core_count`` (read once, by ``__init__``): an MI300X's 304
  compute units (:data:`DEVICE_CORE_COUNT`), where a CPU has 0 (which would make every
  ``num_kv_splits`` the static ``max_kv_splits`` and run no ``get_num_kv_splits_triton``).

The KV cache and queries are the Triton step's float32 (never read: no forward runs).

Builds: those of :mod:`~attnfuzz.adapters.sglang.runner_step` (``capture``, ``eager``,
``padded``: the persistent buffers after ``load_batch``, ``replay``: the metadata the
graph of that batch size captured, its views of those buffers, ``fresh``).

Fields, each with the range its consumer accepts (:meth:`WaveEngine.accepts`,
:meth:`WaveEngine.metadata_fields`): the runner's ``seq_lens``, ``req_pool_indices``,
``out_cache_loc`` and ``positions``; of ``ForwardMetadata``, ``kv_indices`` by request
(row ``i``: ``kv_indices[kv_indptr[i] : kv_indptr[i + 1]]``, token slots) and
``kv_indptr`` as offsets, which Wave's paged decode kernel (``decode_attention_fwd``,
phase 0 of ``get_paged_decode_attention_kernels``: its ``request_indices``) and its
extend kernel (``extend_attention_wave``) read; a graph decode's ``num_kv_splits`` by
request (read only by the Triton fallback of ``decode_attention_wave``; a schedule of the
whole padded batch, judged by its range alone: :meth:`WaveEngine.metadata_fields`); a
verify's and an extend's ``qo_indptr`` as offsets and ``max_extend_len``; a verify's
``mask_indptr`` (which ``extend_attention_wave`` never hands its kernel: no range). And
``kv_len`` and ``kv_slots``, what every backend states alike, read as the Triton
kernels read the same fields (:meth:`runner_step._Engine.kv_read`: a decode's keys all
from the cache, a verify's and an extend's cached prefix, then the step's own keys).

Mutant (a re-created defect of the graph metadata):
``sglang-wave-verify-prefix-with-drafts`` (the graph verify's ``kv_indptr`` and
``kv_indices`` (and with them ``mask_indptr``) built over ``seq_lens +
num_draft_tokens``, as FlashInfer builds a verify's, in ``_apply_cuda_graph_metadata``:
the drafts read twice, from the cache and from the step; padded and replayed verifies
unlike the eager one).

Declines (:func:`declines`): a defect of SGLang's own, kept apart as
``sglang-wave-verify-mask-overflow`` (:func:`mask_overflow`): ``init_cuda_graph_state``
sizes ``cuda_graph_custom_mask`` ``max_bs * max_context_len`` and
``_apply_cuda_graph_metadata`` copies a verify's whole custom mask (``N * (seq_len +
N)`` entries a request) into it, which raises past the buffer: at a replayed verify
whose requests' entries pass it, and at the capture where ``N * (N + 1)`` passes the
context.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import pathlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import torch
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang import runner_step as decode
from attnfuzz.adapters.sglang.runner_step import (
    arrive_then_step,
    graph_batch_sizes,
    reach_verify_replay,
    replayed,
    step_mode,
)
from attnfuzz.adapters.standins import in_sys_modules
from attnfuzz.reference.batch import Case, EngineConfig
from attnfuzz.reference.runner_step import Field, RunnerStepInputs, RunnerStepOutputs, StepBuild
from attnfuzz.reference.trace import Trace

__all__ = ["reach_verify_replay"]  # the mutant's reach, re-exported for the plugin

DEVICE_CORE_COUNT = 304
"""``get_device_core_count`` on an MI300X (gfx942): its compute units, what
``torch.cuda.get_device_properties(...).multi_processor_count`` reports under ROCm."""

WAVE_OPS = (
    "sglang.srt.layers.attention.wave_ops.decode_attention",
    "sglang.srt.layers.attention.wave_ops.extend_attention",
)
"""SGLang's modules that import ``wave_lang`` at import: the backend imports both in
``__init__``, and the decode's buffer shapes from the first in each metadata call."""


def prepare() -> None:
    """Import SGLang's runner, registry and Wave backend before a judge forks its child
    (``wave_backend`` imports ``wave_lang`` only in its functions)."""
    decode.prepare()
    from sglang.srt.layers.attention import attention_registry, wave_backend  # noqa: F401


# -- Wave, as far as SGLang imports it ----------------------------------------------------------


def _refused(name: str) -> Callable[..., Any]:
    """A part of Wave's compiler or kernels: only a forward reaches it, and none runs here."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is attnfuzz's stand-in; no forward runs here")

    refuse.__name__ = name.rsplit(".", 1)[-1]
    return refuse


paged_decode_attention_shape = collections.namedtuple(
    "paged_decode_attention_shape",
    ["num_query_heads", "num_kv_heads", "head_size", "head_size_kv", "block_size", "num_seqs"],
)
"""``wave_lang/kernel/wave/templates/paged_decode_attention.py:paged_decode_attention_shape``
(the six fields ``decode_attention_intermediate_arrays_shapes`` names)."""


def get_paged_decode_intermediate_arrays_shapes(
    shape: Any, num_kv_splits: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``paged_decode_attention.py:get_paged_decode_intermediate_arrays_shapes``: phase 0's
    outputs, one a split (``U``) of every request and query head (phase 1 reduces them)."""
    logits = (num_kv_splits, shape.num_seqs, shape.num_query_heads, shape.head_size_kv)
    return logits, (num_kv_splits, shape.num_seqs, shape.num_query_heads)


def _package(name: str, **names: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]  # a package: its submodules import
    for attr, value in names.items():
        setattr(module, attr, value)
    return module


CACHE_BASE_DIR = pathlib.PurePosixPath("wave_cache")
"""``wave_lang.kernel.wave.cache.CACHE_BASE_DIR`` (the backend sets its rank's directory
under it; nothing is written there: no kernel compiles)."""


CONSTRAINTS = ("GenericDot", "MMAOperand", "MMAType")
"""``wave_lang.kernel.wave.constraints``' names ``wave_ops`` imports (its kernels' MMA kinds)."""


def _stand_in() -> dict[str, types.ModuleType]:
    """The ``wave_lang`` package as far as SGLang imports it, by module name."""
    wave = "wave_lang.kernel.wave"
    templates = f"{wave}.templates"
    return {
        "wave_lang": _package("wave_lang"),
        "wave_lang.kernel": _package("wave_lang.kernel"),
        "wave_lang.kernel.lang": _package("wave_lang.kernel.lang"),
        # Wave's symbols (tkl.sym.*): star-imported; only its kernels use them.
        "wave_lang.kernel.lang.global_symbols": _package("wave_lang.kernel.lang.global_symbols"),
        wave: _package(wave),
        f"{wave}.cache": _package(f"{wave}.cache", CACHE_BASE_DIR=CACHE_BASE_DIR),
        f"{wave}.compile": _package(
            f"{wave}.compile",
            WaveCompileOptions=_refused(f"{wave}.compile.WaveCompileOptions"),
            wave_compile=_refused(f"{wave}.compile.wave_compile"),
        ),
        f"{wave}.constraints": _package(
            f"{wave}.constraints",
            **{n: _refused(f"{wave}.constraints.{n}") for n in CONSTRAINTS},
        ),
        f"{wave}.scheduling": _package(f"{wave}.scheduling"),
        f"{wave}.scheduling.schedule": _package(
            f"{wave}.scheduling.schedule",
            SchedulingType=_refused(f"{wave}.scheduling.schedule.SchedulingType"),
        ),
        templates: _package(templates),
        f"{templates}.paged_decode_attention": _package(
            f"{templates}.paged_decode_attention",
            get_paged_decode_attention_kernels=_refused(
                f"{templates}.paged_decode_attention.get_paged_decode_attention_kernels"
            ),
            get_paged_decode_intermediate_arrays_shapes=get_paged_decode_intermediate_arrays_shapes,
            paged_decode_attention_shape=paged_decode_attention_shape,
        ),
        f"{templates}.attention_common": _package(
            f"{templates}.attention_common",
            AttentionShape=_refused(f"{templates}.attention_common.AttentionShape"),
        ),
        f"{templates}.extend_attention": _package(
            f"{templates}.extend_attention",
            get_extend_attention_kernel=_refused(
                f"{templates}.extend_attention.get_extend_attention_kernel"
            ),
        ),
        f"{wave}.utils": _package(f"{wave}.utils"),
        f"{wave}.utils.general_utils": _package(
            f"{wave}.utils.general_utils",
            get_default_scheduling_params=_refused(
                f"{wave}.utils.general_utils.get_default_scheduling_params"
            ),
        ),
        f"{wave}.utils.run_utils": _package(
            f"{wave}.utils.run_utils",
            set_default_run_config=_refused(f"{wave}.utils.run_utils.set_default_run_config"),
        ),
    }


WAVE_LANG = _stand_in()
"""The stand-in ``wave_lang`` package and its submodules (module docstring)."""


@functools.cache
def _wave_ops() -> dict[str, types.ModuleType]:
    """SGLang's ``wave_ops`` modules, imported once under :data:`WAVE_LANG` and kept here
    alone: where ``wave_lang`` is absent they do not import, so they stay so outside."""
    imported = {name: name in sys.modules for name in WAVE_OPS}
    with in_sys_modules(WAVE_LANG):
        modules = {name: importlib.import_module(name) for name in WAVE_OPS}
    for name, was in imported.items():
        if not was:
            package, _, leaf = name.rpartition(".")
            sys.modules.pop(name, None)
            vars(sys.modules[package]).pop(leaf, None)
    return modules


@contextlib.contextmanager
def wave() -> Iterator[None]:
    """While the engine is built or steps: ``wave_lang`` importable (:data:`WAVE_LANG`)
    with SGLang's ``wave_ops`` modules over it, both undone after, and the cache
    directory the backend's ``__init__`` moves put back. Where ``wave_lang`` imports (a
    ROCm GPU with Wave installed), none."""
    try:
        importlib.import_module("wave_lang.kernel.wave.cache")
    except ImportError:
        pass
    else:
        yield
        return
    cache = WAVE_LANG["wave_lang.kernel.wave.cache"]
    try:
        with in_sys_modules({**WAVE_LANG, **_wave_ops()}):
            yield
    finally:
        cache.CACHE_BASE_DIR = CACHE_BASE_DIR  # type: ignore[attr-defined]


# -- the engine ---------------------------------------------------------------------------------


def _mode_of(metadata: Any) -> str:
    """What ``ForwardMetadata`` ``metadata`` was built for: a verify's holds its custom
    mask, an extend's its query offsets alone, a decode's neither (the paged decode
    kernel takes no query offsets)."""
    if metadata.custom_mask is not None:
        return "verify"
    return "decode" if metadata.qo_indptr is None else "extend"


class WaveEngine(decode._Engine):
    """One SGLang engine whose model runner's attention backend is Wave."""

    ATTENTION_BACKEND = "wave"
    WHERE = {
        "eager": "wave_backend.py:WaveAttnBackend.init_forward_metadata",
        "fresh": "wave_backend.py:WaveAttnBackend.init_forward_metadata (a new engine)",
        "padded": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.load_batch (buffers; "
        "WaveAttnBackend._apply_cuda_graph_metadata's kv_indptr, cuda_graph_kv_indices, "
        "cuda_graph_num_kv_splits, qo_indptr, mask_indptr)",
        "replay": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.execute (the metadata "
        "the graph captured: WaveAttnBackend._build_cuda_graph_forward_metadata's views of "
        "the persistent buffers)",
        "capture": "decode_cuda_graph_runner.py:DecodeCudaGraphRunner.capture_one_shape "
        "(WaveAttnBackend.init_forward_metadata_out_graph, in_capture)",
    }

    def make_backend(self) -> Any:
        """``create_wave_backend(model_runner)`` (the registry's ``wave``): the backend on
        an MI300X's compute units, ``wave_lang`` stood in."""
        from sglang.srt.layers.attention import wave_backend
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        cores = mock.patch.object(
            wave_backend, "get_device_core_count", lambda device_id=0: DEVICE_CORE_COUNT
        )
        with wave(), cores:
            return ATTENTION_BACKENDS["wave"](self.runner)

    def _graph_runner(self) -> Any:
        with wave():
            return super()._graph_runner()

    def eager(self, inputs: RunnerStepInputs, mode: str, how: str = "eager") -> StepBuild:
        with wave():
            return super().eager(inputs, mode, how=how)

    def persistent_metadata(self, mode: str) -> Any:
        """The backend's persistent buffers after the runner's replay preparation
        (``_apply_cuda_graph_metadata`` writes them; ``forward_metadata`` keeps what it
        held): what ``_build_cuda_graph_forward_metadata`` hands the kernels, by mode."""
        b = self.backend
        verify = mode == "verify"
        return _engine.StandIn(
            kv_indptr=b.kv_indptr,
            kv_indices=b.cuda_graph_kv_indices,
            num_kv_splits=b.cuda_graph_num_kv_splits if mode == "decode" else None,
            qo_indptr=b.qo_indptr if verify else None,
            custom_mask=b.cuda_graph_custom_mask if verify else None,
            mask_indptr=b.mask_indptr if verify else None,
            max_extend_len=b.num_draft_tokens if verify else None,
        )

    def accepts(self) -> dict[str, tuple[int, int]]:
        """What each field's consumer accepts, read from its code: the runner's inputs'
        and ``kv_indices``' (:meth:`runner_step._Engine.accepts`: Wave's kernels read
        ``k_buffer[kv_indices]`` of the pool's size + page_size rows, as Triton's; a
        request of at least the fill length 1: phase 1 of the paged decode reduces
        ``min(seq_len, U)`` splits, none for no key), and ``num_kv_splits``."""
        acc = decode._Engine.accepts(self)
        # decode_attention_wave hands num_kv_splits only to its Triton fallback
        # (_needs_triton_fallback), decode_attention_fwd_grouped: _fwd_grouped_kernel_stage1
        # and _fwd_kernel_stage2 split a request's keys in cdiv(seq_len, num_kv_splits[i])
        # (at least 1 split) over a grid of max_kv_splits splits (past it, keys unread).
        acc["num_kv_splits"] = (1, self.backend.max_kv_splits)
        return acc

    def metadata_fields(self, rows: int, tokens: int, metadata: Any) -> tuple[Field, ...]:
        """What the kernels read of ``ForwardMetadata`` ``metadata`` for ``rows`` requests
        and ``tokens`` tokens (padding included), copied now."""
        acc, mode = self.accepts(), _mode_of(metadata)
        # kv_indptr / kv_indices: the paged decode's phase 0 (a decode: request_indices =
        # kv_indptr, keys kv_indices[kv_indptr[s] : kv_indptr[s + 1]]) and
        # extend_attention_wave (a verify's or an extend's cached prefix:
        # kv_indices[kv_indptr[s] + j]) read row i as the Triton kernels do: the Triton
        # step's fields and ranges; a verify's and an extend's query offsets too.
        qo = metadata.qo_indptr if mode != "decode" else None
        view = _engine.StandIn(
            kv_indptr=metadata.kv_indptr, kv_indices=metadata.kv_indices, qo_indptr=qo
        )
        out = list(super().metadata_fields(rows, tokens, view))
        if mode == "decode":
            # A schedule of the whole batch, padding rows included (get_num_kv_splits_triton:
            # from its longest and shortest request and its size; from 44 requests on an
            # MI300X a graph's padding changes the real rows' count), not a value of each
            # request: no build must agree with another on it, and any count in range
            # gives the fallback the same attention. Judged by its range where the graph
            # reads it (cuda_graph_num_kv_splits: capture, padded, replay); an eager
            # build's is a tensor of its own, left out.
            graph = getattr(self.backend, "cuda_graph_num_kv_splits", None)  # none: no graphs
            if metadata.num_kv_splits is graph:
                splits = decode.host(metadata.num_kv_splits[:rows])
                out.append(Field("num_kv_splits", "requests", splits, acc["num_kv_splits"]))
            return tuple(out)
        if mode == "verify":
            # extend_attention_wave takes custom_mask and mask_indptr but hands its kernel
            # neither (a causal mask: the chain's): no consumer, no range.
            mask = decode.host(metadata.mask_indptr[: rows + 1])
            out.append(Field("mask_indptr", "offsets", mask))
        # extend_attention_wave: AttentionShape.max_seq_len and the kernel's
        # MAX_EXTEND_SEQ_LEN, its grid's query tiles (ceil(max / tile)) of every request:
        # a request's query is at least 1 and at most the forward's tokens.
        q = int(metadata.max_extend_len)
        out.append(Field("max_extend_len", "requests", np.full(rows, q), (1, tokens)))
        return tuple(out)


class WaveLife(decode.EngineLife):
    """The engine of ``sglang-wave``: :class:`WaveEngine`, kept across a life's steps; its
    graph's replay prepared with ``wave_lang`` stood in."""

    engine_class: type[WaveEngine] = WaveEngine

    def prepare(self) -> None:
        prepare()

    def make(self, config: Any, device: torch.device, graphs: bool) -> WaveEngine:
        return self.engine_class(config, device, graphs=graphs)

    def graph_builds(self, engine: Any, inputs: RunnerStepInputs, mode: str) -> list[StepBuild]:
        with wave():
            return super().graph_builds(engine, inputs, mode)


# -- a defect of SGLang's own: the graph verify's custom-mask buffer ---------------------------


def mask_overflow(trace: Trace | Case) -> str | None:
    """Where a step of ``trace`` (a case: a trace of one step) copies a verify's custom
    mask past the graph's mask buffer, why (one line), else None.

    ``WaveAttnBackend.init_cuda_graph_state`` sizes ``cuda_graph_custom_mask``
    ``max_bs * self.max_context_len``, and ``_apply_cuda_graph_metadata`` (target verify)
    copies ``spec_info.custom_mask`` whole into its head (``custom_mask[:
    spec_info.custom_mask.shape[0]] = spec_info.custom_mask``): past the buffer the
    slice is shorter than the mask and the copy raises. It runs at every capture of the
    verify graphs (on the runner's dummy mask) and at every replay (on the batch's)."""
    config = trace.config
    sizes = graph_batch_sizes(config)
    if not config.num_spec or not sizes:  # no verify graphs: the copy never runs
        return None
    # DecodeCudaGraphRunner.__init__: max_bs = max(capture_bs), what
    # init_cuda_graph_state(max_bs, ...) is given (the graphs' sizes: graph_batch_sizes).
    max_bs = sizes[-1]
    # WaveAttnBackend.__init__: max_context_len = model_runner.model_config.context_len,
    # the engine's max_model_len (runner_step._model_runner).
    context_len = config.max_model_len
    # WaveAttnBackend.__init__: num_draft_tokens = speculative_num_draft_tokens, each
    # request's tokens in a verify (next_n: runner_step._server_args).
    N = config.next_n
    buffer = max_bs * context_len
    # Capture: decode_cuda_graph_runner hands the capture's EagleVerifyInput the runner's
    # buffers.custom_mask, which base_runner._allocate_decode_buffers sizes (max_bs *
    # seq_len_fill_value + max_num_token) * num_tokens_per_req: fill 1
    # (get_cuda_graph_seq_len_fill_value), max_num_token = max_bs * N
    # (captured_req_width N), num_tokens_per_req N.
    captured = (max_bs * 1 + max_bs * N) * N
    if captured > buffer:
        return (
            f"the verify graphs' capture copies a custom mask of {captured} entries into "
            f"cuda_graph_custom_mask of {buffer} (max_bs {max_bs} * context_len "
            f"{context_len}): SGLang's own defect (sglang-wave-verify-mask-overflow, "
            "wave_backend.py _apply_cuda_graph_metadata)"
        )
    for inputs in replayed(trace):
        if step_mode(inputs) != "verify":
            continue
        # Replay: the batch's EagleVerifyInput.custom_mask, FULL_MASK: N * (seq_len + N)
        # entries a request (mask_indptr's seq_mask_len), seq_len its committed prefix
        # (runner_step._Engine._verify_input).
        entries = sum(N * (int(c) + N) for c in inputs.num_computed_tokens)
        if entries > buffer:
            return (
                f"a replayed verify copies a custom mask of {entries} entries into "
                f"cuda_graph_custom_mask of {buffer} (max_bs {max_bs} * context_len "
                f"{context_len}): SGLang's own defect (sglang-wave-verify-mask-overflow, "
                "wave_backend.py _apply_cuda_graph_metadata)"
            )
    return None


def declines(case: Case) -> str | None:
    """:func:`mask_overflow` of ``case``: ``sglang-wave`` leaves SGLang's own defect to
    ``sglang-wave-verify-mask-overflow``."""
    return mask_overflow(case)


def reach_verify_graph(trace: Trace | Case) -> bool:
    """Verify graphs (``num_spec`` >= 1, CUDA graphs on): ``_apply_cuda_graph_metadata``'s
    verify branch runs at their capture, and at each replayed verify."""
    return trace.config.num_spec >= 1 and bool(graph_batch_sizes(trace.config))


def trigger_mask_overflow(trace: Trace | Case) -> bool:
    """The finding's condition (:func:`mask_overflow`)."""
    return mask_overflow(trace) is not None


def smallest_mask_overflow() -> Trace:
    """One request of four tokens, then its verify of one draft (2 tokens) in the graph
    of one, a context of 11: 2 * (4 + 2) = 12 mask entries into a buffer of 1 * 11.

    Inside SGLang's limits: ``managers/tp_worker.py`` admits a prompt shorter than
    ``max_req_input_len = max_req_len - 5``, ``max_req_len = context_len - 1`` (5 here;
    at a context of 8, prompts of 1 token only, so a one-step witness there, a prompt
    of 3, is out), and a running request verifies a prefix of at most ``context_len -
    4`` (:data:`~attnfuzz.adapters.sglang.limits.SCHEDULER_MARGIN`: 7); one draft at
    ``topk`` 1 (``speculative_num_draft_tokens = speculative_num_steps + 1``), decode
    graphs up to batch size 1. No smaller context has a one-prompt witness: a prompt
    ``p <= context_len - 7`` overflows where ``2 * (p + 2) > context_len``."""
    config = EngineConfig(max_model_len=11, max_num_seqs=1, max_num_batched_tokens=11,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 4)


ENGINE = WaveLife()
"""The engine of the implementation ``sglang-wave`` of ``runner-step``."""


def run(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The implementation ``sglang-wave`` of ``runner-step``: the step on :data:`ENGINE`,
    kept across calls; ``run.new_engine()`` drops it."""
    return ENGINE(inputs)


run.new_engine = ENGINE.new_engine  # type: ignore[attr-defined]


MASK_OVERFLOW = WaveLife()
"""The engine of ``sglang-wave-verify-mask-overflow``: SGLang's, unmodified."""


def run_verify_mask_overflow(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """``sglang-wave-verify-mask-overflow``: the unmodified step on :data:`MASK_OVERFLOW`
    (the cases ``sglang-wave`` declines)."""
    return MASK_OVERFLOW(inputs)


run_verify_mask_overflow.new_engine = MASK_OVERFLOW.new_engine  # type: ignore[attr-defined]


# -- mutant: a defect of the Wave backend's graph verify metadata, re-created -------------------


class _VerifyPrefixWithDrafts(WaveEngine):
    """The graph verify's KV built over ``seq_lens + num_draft_tokens`` (FlashInfer's
    verify ``kv_indptr``, the comment in ``WaveAttnBackend.init_forward_metadata`` warns
    of), in ``_apply_cuda_graph_metadata``: each request's prefix then holds its drafts,
    which ``extend_attention_wave`` also reads from the step (``k_extend``). The eager
    verify is SGLang's."""

    def make_backend(self) -> Any:
        backend = super().make_backend()
        apply = backend._apply_cuda_graph_metadata

        def with_drafts(**kwargs: Any) -> Any:
            if kwargs["forward_mode"].is_target_verify():
                kwargs["seq_lens"] = kwargs["seq_lens"] + backend.num_draft_tokens
            return apply(**kwargs)

        backend._apply_cuda_graph_metadata = with_drafts
        return backend


class _MutantLife(WaveLife):
    def __init__(self, engine: type[WaveEngine]) -> None:
        self.engine_class = engine
        super().__init__()


VERIFY_PREFIX_WITH_DRAFTS = _MutantLife(_VerifyPrefixWithDrafts)


def run_verify_prefix_with_drafts(inputs: RunnerStepInputs) -> RunnerStepOutputs:
    """The mutant ``sglang-wave-verify-prefix-with-drafts``: :class:`_VerifyPrefixWithDrafts`."""
    return VERIFY_PREFIX_WITH_DRAFTS(inputs)


run_verify_prefix_with_drafts.new_engine = VERIFY_PREFIX_WITH_DRAFTS.new_engine  # type: ignore[attr-defined]


def smallest_verify_prefix_with_drafts() -> Trace:
    """One request of one token, then its verify of one draft in the graph of one."""
    config = EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=8,
                          block_size=1, num_spec=1, cudagraph_capture_sizes=(2,))  # fmt: skip
    return arrive_then_step(config, 1)
