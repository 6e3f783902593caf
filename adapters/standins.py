"""Stand-ins both engines' adapters share: what an engine does for the machine, not for
the metadata it computes."""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib.abc
import importlib.machinery
import importlib.util
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


class Unused:
    """Any attribute of a stood-in package: usable as a base class or an annotation at
    import time; calling it says it is a stand-in."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Unused:
        return Unused(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name} is attnfuzz's stand-in; the engine called it")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


def _attribute_of(owner: str) -> Callable[[str], Unused]:
    def attribute(attr: str) -> Unused:
        if attr.startswith("__"):  # __file__, __version__: what tools probe modules for
            raise AttributeError(attr)
        return Unused(f"{owner}.{attr}")

    return attribute


class EmptyPackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of :attr:`packages` (and of any module inside them) with an
    empty package, each attribute an :class:`Unused`."""

    packages: tuple[str, ...] = ()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _attribute_of(spec.name)  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


@contextlib.contextmanager
def packages_stood_in(*packages: str) -> Iterator[None]:
    """``packages`` importable for the block as :class:`EmptyPackages` where they do
    not import (a package a CPU install lacks, imported at load by an engine module
    that never calls it here); after the block no new import finds them and they leave
    ``sys.modules``. A module the block imported keeps what it bound of them."""
    absent = [p for p in packages if importlib.util.find_spec(p) is None]
    finder = type("StoodIn", (EmptyPackages,), {"packages": tuple(absent)})()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] in absent]:
            if isinstance(getattr(sys.modules[name], "__loader__", None), EmptyPackages):
                del sys.modules[name]


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
