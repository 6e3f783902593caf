"""SGLang's environment on a machine without a GPU: what must hold before and while
SGLang's metadata code runs. Everything the SGLang adapters share, written once;
each workaround is its own function with its own test (tests/test_sglang_engine.py).

Facts this relies on (SGLang 0.5.23, torch 2.13.0 CPU, Triton 3.9.0):

- SGLang's metadata modules import ``torchvision`` at module level (through
  the multimodal model configs) and never call it here. The only
  ``torchvision`` wheel for this torch is a CUDA build, so a stand-in package
  answers those imports (:func:`stand_in_torchvision`). It is installed after
  ``transformers`` has looked for the real one, so that ``transformers`` still
  records it as absent and takes none of its vision paths.
- SGLang's model runner module imports ``uvicorn`` at load (``distributed/gated_launch.py``)
  and never calls it here; where it is absent, a stand-in answers that import only
  (:func:`stand_in_server`).
- The DSA backend asks for the GPU's compute capability when it is built
  (:func:`device_capability`).
- SGLang's Triton wrappers open with ``assert x.is_cuda``; the rest of each
  function runs under the Triton interpreter
  (:func:`attnfuzz.adapters.standins.without_cuda_asserts`).
- The Triton 3.9 interpreter gives ``scalar_bool & block_bool`` the dtype
  int32, and its masked load and store then refuse the mask
  (:func:`interpreter_bool_masks`).
- Server arguments and the parallel ranks go through SGLang's own test
  facility, ``get_context().override_server_args(...)`` (:func:`server_args`).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from functools import cache
from typing import Any

import torch

# First: decides TRITON_INTERPRET (set where there is no CUDA), which the lines below read.
from attnfuzz.kernels import _triton  # isort: skip
from attnfuzz.adapters.standins import EmptyPackages  # isort: skip


class StandIn(types.SimpleNamespace):
    """An object of attnfuzz's that SGLang's code reads (a model runner, a config, a
    pool, a runner's buffers or view). A field it lacks raises here, in attnfuzz's
    frame, so that the error is attnfuzz's (harness/blame.py), never a finding on
    the SGLang code that read it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy, pickle and friends probe for these
            raise AttributeError(name)
        raise AttributeError(
            f"attnfuzz's stand-in has no {name!r} (the SGLang code under test reads it)"
        )


STAND_IN_PACKAGES = ("torchvision",)
"""Packages SGLang imports at load and never calls in the metadata code driven here."""


class _StandInFinder(EmptyPackages):
    """Answers ``import torchvision`` and ``import torchvision.x.y`` with empty packages."""

    packages = STAND_IN_PACKAGES


TRANSFORMERS_WITHOUT_GATE = (5, 23)
"""The transformers (the default list's) whose ``AutoImageProcessor`` works without
``torchvision``; older ones (5.8.1, the pin of SGLang 0.5.11 to 0.5.13) refuse it
when ``register`` is called, which SGLang's configs do at import."""


def _transformers_gates_image_processors() -> bool:
    """Whether the installed transformers refuses ``AutoImageProcessor`` without
    ``torchvision`` (read from its version: importing it would record the answer)."""
    import importlib.metadata

    from attnfuzz.harness.engines import release_key

    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return False
    return release_key(version)[:2] < TRANSFORMERS_WITHOUT_GATE


@cache
def stand_in_torchvision() -> None:
    """Install the stand-in ``torchvision``, unless a real one imports.

    Where transformers gates ``AutoImageProcessor`` on ``torchvision`` (before
    5.23), the stand-in goes in first, so that transformers finds it: SGLang's
    configs register image processors at import, and nothing here calls them."""
    if _transformers_gates_image_processors():
        try:
            import torchvision  # noqa: F401
        except Exception:  # noqa: BLE001 - absent, or a CUDA build that fails to load
            for name in [m for m in sys.modules if m.split(".")[0] in STAND_IN_PACKAGES]:
                del sys.modules[name]
            sys.meta_path.insert(0, _StandInFinder())
        return
    import transformers.utils.import_utils  # noqa: F401  # records torchvision as absent first

    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or a CUDA build that fails to load
        for name in [m for m in sys.modules if m.split(".")[0] in STAND_IN_PACKAGES]:
            del sys.modules[name]
        sys.meta_path.insert(0, _StandInFinder())


KERNEL_PACKAGES = ("sgl_kernel",)
"""SGLang's compiled CUDA kernels (the ``sgl-kernel`` wheel, a CUDA build): 0.5.9 and
0.5.10 import them at load, unguarded (``mem_cache/memory_pool_host.py``,
``layers/attention/nsa_backend.py``), and the metadata code driven here never calls them."""


def _importer(frame: types.FrameType | None) -> types.FrameType | None:
    """The frame of the ``import`` statement, past the import machinery's own frames."""
    while frame is not None and frame.f_code.co_filename.startswith("<frozen importlib"):
        frame = frame.f_back
    return frame


@cache
def _guarded_lines(filename: str) -> frozenset[int]:
    """The lines of ``filename``'s ``try:`` bodies: an import there has a fallback."""
    try:
        with open(filename, encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return frozenset(lines)


def _unguarded_sglang_import(frame: types.FrameType | None) -> bool:
    """Whether ``frame`` runs an SGLang module's own top-level code, outside a ``try:``:
    an import that would fail that module, and with it every module importing it."""
    if frame is None or frame.f_code.co_name != "<module>":
        return False
    if not frame.f_globals.get("__name__", "").startswith("sglang."):
        return False
    return frame.f_lineno not in _guarded_lines(frame.f_code.co_filename)


class _KernelStandInFinder(_StandInFinder):
    """Answers an import of :data:`KERNEL_PACKAGES` with an empty package, only where an
    SGLang module imports it at load without a fallback (:func:`_unguarded_sglang_import`).
    A guarded import (``try: ... except ImportError``), an import inside a function, and
    anyone else's import find nothing, as without the finder: a release that imports
    without the kernels (0.5.11 on) takes exactly the paths it takes without it. (Once
    stood in, ``from sgl_kernel import x`` finds the stand-in's attribute, guarded or not:
    only on the releases that needed it.)"""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] not in KERNEL_PACKAGES:
            return None
        if _unguarded_sglang_import(_importer(sys._getframe(1))):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None


def is_kernel_stand_in(module: types.ModuleType) -> bool:
    """Whether ``module`` is one of :class:`_KernelStandInFinder`'s empty packages."""
    spec = getattr(module, "__spec__", None)
    return isinstance(getattr(spec, "loader", None), _KernelStandInFinder)


@cache
def stand_in_kernels() -> bool:
    """Install the kernels' stand-in finder where the kernels do not import (a machine
    without their CUDA build); returns whether it was installed."""
    if all(importlib.util.find_spec(name) is not None for name in KERNEL_PACKAGES):
        return False
    sys.meta_path.append(_KernelStandInFinder())
    return True


SERVER_PACKAGES = ("uvicorn",)
"""The HTTP server SGLang 0.5.23 imports at load, unguarded, in
``distributed/gated_launch.py`` (reached from ``model_executor/model_runner.py``, which
``layers/attention/hybrid_linear_attn_backend.py`` imports): a server's dependency,
never called by the metadata code driven here, absent from the CPU install."""


class _ServerStandInFinder(_KernelStandInFinder):
    """:class:`_KernelStandInFinder` for :data:`SERVER_PACKAGES`: only an SGLang module's
    own unguarded import at load is answered, and only where the package is absent (the
    finder goes last: a real install is found first)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] not in SERVER_PACKAGES:
            return None
        if _unguarded_sglang_import(_importer(sys._getframe(1))):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None


@cache
def stand_in_server() -> bool:
    """Install the server's stand-in finder where the server does not import; returns
    whether it was installed."""
    if all(importlib.util.find_spec(name) is not None for name in SERVER_PACKAGES):
        return False
    sys.meta_path.append(_ServerStandInFinder())
    return True


@cache
def interpreter_bool_masks() -> bool:
    """Under the Triton interpreter, give masked loads and stores a boolean mask.

    Triton 3.9's interpreter computes ``scalar_bool & block_bool`` as int32
    data under the type ``int1``, and its masked load and store then raise
    ``mask has unsupported dtype``; a compiled kernel has an ``i1`` mask there.
    The cast keeps every value (an ``int1`` is 0 or 1). Returns whether it was
    applied: never where kernels are compiled."""
    if not _triton.INTERPRET:
        return False
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder

    def boolean(mask: Any) -> Any:
        if mask.data.dtype == np.bool_:
            return mask
        return interpreter.TensorHandle(mask.data.astype(np.bool_), mask.dtype)

    load, store = builder.create_masked_load, builder.create_masked_store

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):  # noqa: ANN001, ANN202
        return load(self, ptrs, boolean(mask), other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):  # noqa: ANN001, ANN202
        return store(self, ptrs, value, boolean(mask), cache_policy)

    builder.create_masked_load = create_masked_load
    builder.create_masked_store = create_masked_store
    return True


def configure_environment() -> None:
    """Set what SGLang reads at import, before it is imported (never overriding a user's)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("SGLANG_LOGGING_LEVEL", "ERROR")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") == "1":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    vllm_first()
    stand_in_torchvision()
    stand_in_kernels()
    stand_in_server()
    interpreter_bool_masks()
    quiet_cpu_notices()


def vllm_first() -> None:
    """SGLang imports some of vLLM's modules at load, where vLLM is installed: vLLM's
    CPU set-up (its platform, read once at its import) goes first, or vLLM, later
    driven in the same process (a campaign of both engines, CI's engine tests),
    would find no device."""
    if importlib.util.find_spec("vllm") is not None:
        from attnfuzz.adapters.vllm import _engine as vllm_engine

        vllm_engine.configure_environment()


def quiet_cpu_notices() -> None:
    """Silence what SGLang says at import on a machine without a GPU, about kernels
    attnfuzz never calls (AWQ and GGUF quantization, its CUDA JIT's architecture), so
    that ``attnfuzz list`` and a run print only attnfuzz's own lines."""
    import logging
    import warnings

    for what in ("AWQ", "GGUF quantization"):
        warnings.filterwarnings("ignore", f"Only CUDA.* support {what}", UserWarning)
    logging.getLogger("sglang.kernels.jit.utils.arch").setLevel(logging.ERROR)


@contextlib.contextmanager
def device_capability(capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    """``torch.cuda.get_device_capability()`` answers ``capability`` (an H100's by
    default) where there is no GPU to ask; a real GPU is asked as usual."""
    if torch.cuda.is_available():
        yield
        return
    real = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: capability
    try:
        yield
    finally:
        torch.cuda.get_device_capability = real


def new_process_buffers() -> None:
    """Forget SGLang's process-wide pool of graph runners' input buffers
    (``model_executor/input_buffers.py``: ``share_input_buffer`` aliases every later
    buffer of the same name and size onto the first one registered). One server process
    runs one configuration; attnfuzz makes engines of many in one process, and a buffer
    an earlier engine's runner filled at its creation (a width of its own) must not be
    what a later engine's capture reads: each new engine starts with the pool a new
    process has. Engines already made keep their buffers; the runners of one engine
    still share theirs, as in SGLang."""
    try:
        from sglang.srt.model_executor import input_buffers
    except ImportError:  # a release before the pool
        return
    pool = getattr(input_buffers, "_forward_input_buffer_pool", None)
    if pool is not None:
        pool.clear()


def prepare() -> None:
    """Import what every adapter shares, once: SGLang's runtime context, with the
    parallel ranks of one process (tensor, attention and decode-context rank 0)."""
    configure_environment()
    _parallel_ranks()


@cache
def _parallel_ranks() -> None:
    if importlib.util.find_spec("sglang.srt.runtime_context") is None:
        _old_parallel_ranks()
        return
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if hasattr(parallel, "override_permanently"):
        parallel.override_permanently(**one_rank(parallel))
    # Else (0.5.14 and a few after it): server_args() overrides them for each call.


ONE_RANK = dict(attn_dcp_rank=0, attn_tp_rank=0, tp_rank=0)
"""The parallel ranks of one process: tensor, attention and decode-context rank 0."""


def one_rank(parallel: Any) -> dict[str, int]:
    """:data:`ONE_RANK`'s fields that this release's parallel context has (0.5.14's
    has no decode-context rank, and refuses a field it does not know)."""
    return {name: rank for name, rank in ONE_RANK.items() if hasattr(type(parallel), name)}


def _old_parallel_ranks() -> None:
    """Releases before the runtime context (0.5.13 and older) read the attention
    tensor-parallel size from ``parallel_state``'s group, set up by the distributed
    init: a stand-in group of one rank, where none is set. 0.5.9 and 0.5.10's NSA
    backend also read the attention context-parallel group's (``_ATTN_CP``)."""
    from sglang.srt.distributed import parallel_state

    if getattr(parallel_state, "_ATTN_TP", None) is None:
        parallel_state._ATTN_TP = StandIn(world_size=1, rank_in_group=0)
    if hasattr(parallel_state, "_ATTN_CP") and parallel_state._ATTN_CP is None:
        parallel_state._ATTN_CP = StandIn(world_size=1, rank_in_group=0)


def _default_server_args(**fields: Any) -> Any:
    """A ``ServerArgs`` of the defaults and ``fields``, built without ``__post_init__``
    (which resolves a model and probes the hardware): what older releases read."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    args = ServerArgs.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            value = None
        object.__setattr__(args, f.name, value)
    for name, value in fields.items():
        object.__setattr__(args, name, value)
    return args


@contextlib.contextmanager
def _old_server_args(**fields: Any) -> Iterator[Any]:
    """Before the runtime context: the module-global server args (set by the scheduler),
    set for one call and restored after."""
    from sglang.srt import server_args as module

    previous = getattr(module, "_global_server_args", None)
    args = _default_server_args(device="cpu", **fields)
    module.set_global_server_args_for_scheduler(args)
    try:
        yield args
    finally:
        module._global_server_args = previous


@contextlib.contextmanager
def server_args(**fields: Any) -> Iterator[Any]:
    """SGLang's server arguments for one call: ``fields`` over the defaults,
    published through SGLang's ``override_server_args`` and restored after."""
    prepare()
    if importlib.util.find_spec("sglang.srt.runtime_context") is None:
        with _old_server_args(**fields) as args:
            yield args
        return
    from sglang.srt.runtime_context import get_context, get_parallel

    parallel = get_parallel()
    ranks = (
        parallel.override(**one_rank(parallel))
        if not hasattr(parallel, "override_permanently")
        else contextlib.nullcontext()
    )
    context = get_context()
    if not hasattr(context, "override_server_args"):  # 0.5.14: server args still global
        with ranks, _old_server_args(**fields) as args:
            yield args
        return
    with ranks, context.override_server_args(device="cpu", **fields) as args:
        yield args
