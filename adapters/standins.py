"""Stand-ins both engines' adapters share: what an engine does for the machine, not for
the metadata it computes."""

from __future__ import annotations

import ast
import contextlib
import gc
import inspect
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

from attnfuzz.harness.errors import ContractError


class VendorContractError(ContractError):
    """A call a vendor's function refuses (its ``TORCH_CHECK``), raised by the stand-in
    that models the function: the engine's misuse of the vendor's contract, a finding
    wherever it is raised (harness/blame.py), never attnfuzz's fault."""


@contextlib.contextmanager
def no_collections() -> Iterator[None]:
    """``gc.collect`` a no-op while an engine starts: its memory profiler and its graph
    capture's heap freezing (vLLM's ``DeviceMemoryProfiler`` and
    ``freeze_gc_for_cudagraph_capture``, SGLang's ``freeze_gc``) each run a full
    collection, over a process that holds the engine, torch and Triton: most of an
    engine's start on a CPU. A collection only frees host memory; nothing the engine
    computes reads what it frees (vLLM's own piecewise capture turns it off likewise,
    ``compilation/cuda_graph.py``)."""
    with mock.patch.object(gc, "collect", lambda *args, **kwargs: 0):
        yield


@contextlib.contextmanager
def in_sys_modules(modules: dict[str, types.ModuleType]) -> Iterator[None]:
    """``modules`` importable for the block (a vendor package a CPU lacks, by module
    name), those names alone put back after: a module the block imports for the first
    time stays imported, as it would on a GPU (``mock.patch.dict(sys.modules)`` would
    drop it, and its next import would make its classes anew)."""
    missing = object()
    saved = {name: sys.modules.get(name, missing) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value  # type: ignore[assignment]


class _Unpinned:
    """``torch`` as a module calls it on a CPU: ``zeros`` without ``pin_memory`` (CPU-only
    torch has no pinned allocator), everything else torch's own."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, pin_memory: bool = False, **kwargs: Any) -> Any:
        import torch

        return torch.zeros(*args, **kwargs)


@contextlib.contextmanager
def unpinned(module: types.ModuleType, device: Any) -> Iterator[None]:
    """``module``'s ``torch`` with ``zeros`` unpinned, where ``device`` is a CPU: a
    builder that stages host tensors in pinned memory on a GPU, the same tensors here."""
    if getattr(device, "type", None) != "cpu":
        yield
        return
    with mock.patch.object(module, "torch", _Unpinned()):
        yield


def _asserts_cuda(node: ast.stmt) -> bool:
    return isinstance(node, ast.Assert) and "is_cuda" in ast.unparse(node.test)


class _DropCudaAsserts(ast.NodeTransformer):
    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                kept = [s for s in stmts if not _asserts_cuda(s)]
                setattr(node, field, kept or [ast.Pass()])
        return node


def function_tree(fn: Callable[..., Any]) -> ast.FunctionDef:
    """The function's definition as the engine's source has it, at its own line numbers."""
    source = textwrap.dedent(inspect.getsource(fn))
    tree = ast.parse(source)
    ast.increment_lineno(tree, fn.__code__.co_firstlineno - 1)
    (definition,) = tree.body
    assert isinstance(definition, ast.FunctionDef), fn
    return definition


def stripped_tree(fn: Callable[..., Any]) -> ast.FunctionDef:
    """``fn``'s definition without its ``assert ...is_cuda`` statements and its
    decorators (these wrappers have none that matter: see the test)."""
    definition = function_tree(fn)
    definition.decorator_list = []
    stripped = _DropCudaAsserts().visit(definition)
    assert isinstance(stripped, ast.FunctionDef)
    return stripped


def without_cuda_asserts(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` recompiled from its own source without its ``assert ...is_cuda``
    statements: every other line unchanged, in the engine's file and at its line
    numbers, so that a traceback points where the code under test is. The engines'
    Triton wrappers open with such an assert (SGLang's, vLLM's Kimi K3 staging); the
    rest of each runs under the Triton interpreter."""
    return recompiled(fn, stripped_tree(fn))


def recompiled(fn: Callable[..., Any], definition: ast.FunctionDef) -> Callable[..., Any]:
    """``fn`` compiled anew from ``definition`` (its own source, changed), in the engine's
    file and at its line numbers; its globals (names patched there are seen), defaults and
    keyword defaults ``fn``'s."""
    module = ast.fix_missing_locations(ast.Module(body=[definition], type_ignores=[]))
    code = compile(module, fn.__code__.co_filename, "exec")
    namespace: dict[str, Any] = {}
    exec(code, fn.__globals__, namespace)  # noqa: S102 - the engine's own source, recompiled
    copy = namespace[fn.__name__]
    copy.__defaults__, copy.__kwdefaults__ = fn.__defaults__, fn.__kwdefaults__
    copy.__wrapped_original__ = fn
    return copy
