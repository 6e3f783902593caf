"""How an engine's adapters bind to the installed release: shared by every engine plugin.

Nothing here imports an engine until it is asked to. :class:`Api` names one
piece of an engine's API an adapter calls and finds it by looking (a module
that imports, an attribute, a keyword a signature takes), never by reading the
version number. :class:`EngineCall` is an adapter function named by module and
attribute, imported on its first call: importing an adapter imports its engine.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from attnfuzz.harness.errors import one_line

_BEFORE_IMPORT: dict[str, Callable[[], None]] = {}


def before_import(package: str, configure: Callable[[], None]) -> None:
    """Run ``configure`` (the engine's environment: variables it reads at import,
    stand-ins for modules it imports and never uses here) before any probe
    imports a module of ``package``."""
    _BEFORE_IMPORT[package] = configure


@dataclass(frozen=True)
class Api:
    """One piece of an engine's API that an adapter calls, found by looking for it."""

    module: str  # e.g. "vllm.v1.worker.block_table"
    attr: str = ""  # a dotted path inside the module, "" for the module itself
    keyword: str = ""  # a parameter the callable at ``attr`` must take
    since: str = ""  # the first release that has it: for the install hint only
    # "module:function", a context manager the adapter imports ``module`` within (a
    # stand-in for a vendor package that the module imports and a CPU lacks)
    within: str = ""

    def __str__(self) -> str:
        where = f"{self.module}.{self.attr}" if self.attr else self.module
        return f"{where}({self.keyword}=)" if self.keyword else where

    def missing(self) -> str | None:
        """Why this API is not there, in one line, or None when it is."""
        return _missing(self)


class ImportFailed(str):
    """Why an API is not there, where its module is there but does not import: a
    dependency missing, the engine's set-up or its own code raising. A broken
    install, which no other release mends: never answered by an install hint."""


def absent(err: BaseException, module: str) -> bool:
    """Whether ``err``, raised importing ``module``, says that ``module`` (or a package
    between the engine's and it) is not in the installed release: the release lacks
    the API. A module outside that chain not found (``idna``) is a broken install."""
    name = getattr(err, "name", None)
    if not isinstance(err, ModuleNotFoundError) or not name or "." not in name:
        return False  # the engine's top-level package absent is a broken install too
    return module == name or module.startswith(f"{name}.")


def engine_prints_to_stderr() -> contextlib.AbstractContextManager[Any]:
    """An engine module's import-time prints sent to stderr: attnfuzz's stdout carries its
    reports and JSON (``attnfuzz list --json``), which a line SGLang prints on import
    (``aiter_backend.py``, where ``aiter`` is absent) would break."""
    return contextlib.redirect_stdout(sys.stderr)


@cache
def _missing(api: Api) -> str | None:
    package = api.module.split(".")[0]
    configure = _BEFORE_IMPORT.get(package)
    try:
        if configure is not None:
            configure()
    except Exception as err:  # noqa: BLE001 - the engine's set-up imports its dependencies
        why = f"importing {package} failed (its set-up): {type(err).__name__}: {err}"
        return ImportFailed(one_line(why))
    try:
        with engine_prints_to_stderr(), _within(api):
            obj = importlib.import_module(api.module)
    except Exception as err:  # noqa: BLE001 - a probe: the import error is the answer
        why = one_line(f"importing {api.module} failed: {type(err).__name__}: {err}")
        return why if absent(err, api.module) else ImportFailed(why)
    for name in filter(None, api.attr.split(".")):
        if not hasattr(obj, name):
            return f"{api} is missing"
        obj = getattr(obj, name)
    if api.keyword:
        try:
            parameters = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return f"{api} has no signature to read"
        if api.keyword not in parameters:
            return f"{api} is missing (no {api.keyword}= parameter)"
    return None


def _within(api: Api) -> contextlib.AbstractContextManager[Any]:
    """The context the adapter imports ``api.module`` within (``Api.within``)."""
    if not api.within:
        return contextlib.nullcontext()
    module, function = api.within.split(":")
    return getattr(importlib.import_module(module), function)()


def install_hint(
    engine: str, apis: tuple[Api, ...], version: str, why: str, install_line: Callable[[str], str]
) -> str:
    """``; it binds from ENGINE X: how``, naming the release that has every API
    ``apis`` holds, not only the missing one; none where the installed release is
    that one or newer, or where it does not import (:class:`ImportFailed`):
    another release mends neither."""
    from attnfuzz.harness.engines import release_key

    since = max((a.since for a in apis if a.since), key=release_key, default="")
    if not since or isinstance(why, ImportFailed):
        return ""
    if release_key(version) >= release_key(since):
        return ""
    return f"; it binds from {engine} {since}: {install_line(since)}"


def has(api: Api) -> bool:
    """Whether the installed engine offers ``api`` (for an adapter that binds either form)."""
    return api.missing() is None


class EngineCall:
    """``<package>.<module>.<attr>(inputs)``, imported on first use.

    :meth:`prepare` imports the engine and builds what every call shares (the
    adapter module's own ``prepare()``); a judge calls it before it forks its
    child, so that each child starts warm.
    """

    def __init__(self, package: str, module: str, attr: str, unavailable: Callable[[], str | None]):
        self.package, self.module, self.attr = package, module, attr
        self._unavailable = unavailable
        self._fn: Callable[[Any], Any] | None = None

    def unavailable(self) -> str | None:
        """Why this adapter cannot run on the installed engine (if any), or None."""
        return self._unavailable()

    def prepare(self) -> Callable[[Any], Any]:
        if self._fn is None:
            reason = self.unavailable()
            if reason is not None:
                raise RuntimeError(reason)
            with engine_prints_to_stderr():
                mod = importlib.import_module(f"{self.package}.{self.module}")
                mod_prepare = getattr(mod, "prepare", None)
                if mod_prepare is not None:
                    mod_prepare()
            self._fn = getattr(mod, self.attr)
        return self._fn

    def __call__(self, inputs: Any) -> Any:
        return self.prepare()(inputs)

    def new_engine(self) -> None:
        """The adapter's ``new_engine()``, where it keeps state across steps (an engine
        object): the harness starts each trace with it. The module's engine is shared by
        whoever imported it (a test that ran it directly, another call of the same
        function), so it is reset whenever the module is loaded, called through this
        object or not; a module not loaded yet keeps nothing."""
        fn = self._fn
        if fn is None:
            mod = sys.modules.get(f"{self.package}.{self.module}")
            fn = getattr(mod, self.attr, None) if mod is not None else None
        hook = getattr(fn, "new_engine", None)
        if callable(hook):
            hook()

    def __repr__(self) -> str:
        return f"<{self.package.rsplit('.', 1)[-1]} {self.module}.{self.attr}>"
