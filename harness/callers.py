"""Who calls an engine function, with which arguments: read from the installed release.

A finding on a helper such as vLLM's ``split_decodes_and_prefills`` is judged with
arguments the case draws (``require_uniform``, ``treat_short_extends_as_decodes``);
whether the engine ever passes that combination, and under which configuration, is
a fact of its callers, not of the function. An engine declares, for an
implementation (:attr:`attnfuzz.harness.engines.Engine.callers`), a
:class:`Callee`: the function, how the case's parameters map onto its keywords, and
what the conditions its callers write mean (:class:`Condition`). This module finds
every call of the function in the installed package (by its syntax tree, no import)
and tells which calls can pass the case's values, under which configuration and on
which model runners (:func:`callers_of`). What a configuration allows moves between
releases (the runners it runs on, the cudagraph modes the engine accepts with it,
whether its FULL steps pad the request count): a condition declares it per range of
releases (:class:`Releases`), read from each range's source, and the installed
release's range applies. Reachability plans steps only on those runners and modes and
names the configuration (:mod:`attnfuzz.harness.reachability`).
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Argument:
    """One parameter of the case that is a keyword of the callee."""

    param: str
    """The case's parameter (``Case.params``), e.g. ``short_extends_as_prefills``."""
    keyword: str
    """The callee's keyword, e.g. ``treat_short_extends_as_decodes``."""
    default: Any
    """The callee's default for a call that leaves the keyword out."""
    to_case: Callable[[Any], int] = int
    """The keyword's value as the case's parameter (``lambda v: int(not v)``)."""


@dataclass(frozen=True)
class Releases:
    """What one configuration allows in a range of the engine's releases, read from that
    range's source (the engine's file and function for each fact in ``source``)."""

    since: str
    """The first release of the range."""
    before: str | None = None
    """The first release after it; None: every later release."""
    runners: tuple[str, ...] | None = None
    """The only model runners the configuration runs on; None: all."""
    modes: tuple[str, ...] | None = None
    """The only cudagraph modes (``cudagraph_mode``) the engine accepts with it; None: all."""
    pads_requests: bool = True
    """Whether a FULL step under it pads the request count (padding requests of query
    length 0 reach the metadata builders)."""
    source: str = ""

    def covers(self, version: str) -> bool:
        from attnfuzz.harness.engines import release_key  # engines imports this module

        key = release_key(version)
        return release_key(self.since) <= key and (
            self.before is None or key < release_key(self.before)
        )

    def span(self) -> str:
        if self.before is None:
            return f"{self.since} and later"
        return f"{self.since} to before {self.before}"


@dataclass(frozen=True)
class Condition:
    """What a caller's expression for a keyword means, read from the engine's code."""

    expr: str
    """The expression as callers write it (``ast.unparse``), e.g. ``not self.use_pcp``."""
    config: Mapping[bool, str]
    """For each value of the expression, the configuration under which it has it."""
    runners: Mapping[bool, tuple[str, ...]] = field(default_factory=dict)
    """For a value, the only model runners that configuration runs on in every release
    (absent: all); :attr:`releases` replaces it where the limits move between releases."""
    source: str = ""
    """Where the meaning and the runner limit are read (file and function)."""
    releases: Mapping[bool, tuple[Releases, ...]] = field(default_factory=dict)
    """For a value, what its configuration allows in each range of releases. A release
    no range covers has no declared meaning for that value: a call that needs it there is
    not taken as reaching the case."""


@dataclass(frozen=True)
class Callee:
    """A function of the engine an implementation runs, and its callers' vocabulary."""

    package: str  # "vllm"
    function: str  # "split_decodes_and_prefills"
    arguments: tuple[Argument, ...]
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class Call:
    """One call of the callee in the installed package: where, and its keywords' source."""

    path: str  # relative to the package's parent: "vllm/v1/attention/backends/mla/indexer.py"
    line: int
    function: str  # the enclosing function's qualified name
    keywords: tuple[tuple[str, str], ...]

    def where(self) -> str:
        return f"{self.path}:{self.line} {self.function}"


@dataclass(frozen=True)
class Admitting:
    """A call that can pass the case's values: under ``config`` (empty: any), on ``runners``."""

    call: Call
    config: tuple[str, ...]
    runners: tuple[str, ...] | None  # None: every runner
    sources: tuple[str, ...]
    limited_by: tuple[str, ...] = ()  # the configurations that limit the runners
    modes: tuple[str, ...] | None = None  # None: every cudagraph mode
    pads_requests: bool = True  # its FULL steps pad the request count
    modes_limited_by: tuple[str, ...] = ()  # the configurations that limit the modes

    def allows(self, runner: str, mode: str) -> bool:
        return (self.runners is None or runner in self.runners) and (
            self.modes is None or mode in self.modes
        )


@dataclass(frozen=True)
class Callers:
    """What :func:`callers_of` found: the calls that admit the case, and those that do not."""

    callee: Callee
    admitting: tuple[Admitting, ...]
    refusing: tuple[tuple[Call, str], ...]  # each with why
    version: str | None = None  # the release whose limits apply

    def allows(self, runner: str, mode: str) -> bool:
        """Some admitting call runs on ``runner`` under cudagraph mode ``mode``."""
        return any(a.allows(runner, mode) for a in self.admitting)

    def pads_requests(self, runner: str, mode: str) -> bool:
        """Some admitting call that runs there pads the request count of a FULL step."""
        return any(a.allows(runner, mode) and a.pads_requests for a in self.admitting)

    def modes_on(self, runner: str) -> tuple[str, ...] | None:
        """The modes some admitting call on ``runner`` is accepted under; None: any."""
        out: list[str] = []
        for a in self.admitting:
            if a.runners is not None and runner not in a.runners:
                continue
            if a.modes is None:
                return None
            out.extend(m for m in a.modes if m not in out)
        return tuple(out)

    def runners(self) -> set[str] | None:
        """The runners some admitting call runs on; None: any."""
        out: set[str] = set()
        for a in self.admitting:
            if a.runners is None:
                return None
            out.update(a.runners)
        return out

    def configurations(self) -> list[str]:
        """Each admitting call's builder and configuration, one line each, without repeats."""
        out = []
        for a in self.admitting:
            owner = a.call.function.split(".")[0]
            out.append(f"{owner} under {' and '.join(a.config)}" if a.config else owner)
        return list(dict.fromkeys(out))

    def decided_by(self) -> list[str]:
        out = []
        for a in self.admitting:
            args = ", ".join(f"{k}={v}" for k, v in a.call.keywords)
            out.append(f"{a.call.where()} calls {self.callee.function}({args})")
        out.extend(dict.fromkeys(s for a in self.admitting for s in a.sources if s))
        return out


def package_root(package: str) -> Path | None:
    """The installed package's directory, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def calls_of(package: str, function: str) -> tuple[Call, ...]:
    """Every call of ``function`` (by name, or as an attribute) in ``package``'s modules."""
    root = package_root(package)
    if root is None:
        return ()
    out: list[Call] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if function + "(" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        rel = str(path.relative_to(root.parent))
        out.extend(_calls_in(tree, function, rel))
    return tuple(out)


def _calls_in(tree: ast.AST, function: str, rel: str) -> list[Call]:
    out: list[Call] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if child.name == function and not isinstance(child, ast.ClassDef):
                    continue  # the definition itself (a recursive call is no caller)
                visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Call):
                f = child.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name == function and scope:
                    keywords = tuple(
                        (k.arg, ast.unparse(k.value)) for k in child.keywords if k.arg is not None
                    )
                    out.append(Call(rel, child.lineno, ".".join(scope), keywords))
            visit(child, scope)

    visit(tree, ())
    return out


def installed_version(package: str) -> str | None:
    """The installed release of ``package`` (its distribution's metadata, no import)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def callers_of(callee: Callee, params: Mapping[str, Any], version: str | None = None) -> Callers:
    """The calls that can pass ``params`` (the case's parameters), each with the
    configuration its conditions need and what that configuration allows in release
    ``version`` (default: the installed one); a call that passes another literal, or
    an expression this module has no meaning for (in that release), cannot (with why)."""
    if version is None:
        version = installed_version(callee.package)
    conditions = {c.expr: c for c in callee.conditions}
    admitting: list[Admitting] = []
    refusing: list[tuple[Call, str]] = []
    for call in calls_of(callee.package, callee.function):
        passed = dict(call.keywords)
        config: list[str] = []
        runners: set[str] | None = None
        modes: list[str] | None = None
        pads = True
        sources: list[str] = []
        limited_by: list[str] = []
        modes_limited_by: list[str] = []
        why = ""
        for arg in callee.arguments:
            if arg.param not in params:
                continue
            want = params[arg.param]
            expr = passed.get(arg.keyword)
            if expr is None:
                if arg.to_case(arg.default) != want:
                    why = f"{arg.keyword} left at its default {arg.default!r}"
                    break
                continue
            try:
                value = ast.literal_eval(expr)
            except (ValueError, SyntaxError):
                cond = conditions.get(expr)
                if cond is None:
                    why = f"{arg.keyword}={expr}: no declared meaning, not judged reachable"
                    break
                # The expression's value that gives the case's parameter.
                values = [v for v in (True, False) if arg.to_case(v) == want]
                if not values:
                    why = f"{arg.keyword}={expr} never gives {arg.param}={want}"
                    break
                meaning = cond.config[values[0]]
                config.append(meaning)
                sources.append(cond.source)
                limit = cond.runners.get(values[0])
                ranges = cond.releases.get(values[0], ())
                if ranges:
                    held = next((r for r in ranges if version and r.covers(version)), None)
                    if held is None:
                        read = ", ".join(r.span() for r in ranges)
                        why = (
                            f"{arg.keyword}={expr}: what {meaning} allows is read for "
                            f"{callee.package} {read}, not {version}"
                        )
                        break
                    limit = held.runners
                    if held.modes is not None:
                        modes = [m for m in held.modes if modes is None or m in modes]
                        modes_limited_by.append(meaning)
                    pads = pads and held.pads_requests
                    sources.append(f"{callee.package} {held.span()}: {held.source}")
                if limit is not None:
                    runners = set(limit) if runners is None else runners & set(limit)
                    limited_by.append(meaning)
                continue
            if arg.to_case(value) != want:
                why = f"{arg.keyword}={expr}"
                break
        if why:
            refusing.append((call, why))
        else:
            limited = None if runners is None else tuple(sorted(runners))
            admitting.append(
                Admitting(
                    call,
                    tuple(config),
                    limited,
                    tuple(sources),
                    tuple(limited_by),
                    None if modes is None else tuple(modes),
                    pads,
                    tuple(modes_limited_by),
                )
            )
    return Callers(callee, tuple(admitting), tuple(refusing), version)


def describe_refusal(found: Callers, params: Mapping[str, Any]) -> str:
    """Why no call in the installed release passes ``params``."""
    shown = ", ".join(f"{k}={v}" for k, v in params.items())
    n = len(found.refusing)
    text = (
        f"no call of {found.callee.function} in the installed {found.callee.package} "
        f"is known to pass {shown} ({n} calls read)"
    )
    undeclared = [c.where() for c, why in found.refusing if "no declared meaning" in why]
    if undeclared:
        text += "; calls whose expressions have no declared meaning: " + ", ".join(undeclared)
    return text


def runner_limits(found: Callers) -> list[str]:
    """The configurations that keep the admitting calls off some runners."""
    return list(dict.fromkeys(c for a in found.admitting for c in a.limited_by))


def mode_limits(found: Callers) -> list[str]:
    """The configurations that keep the admitting calls off some cudagraph modes."""
    return list(dict.fromkeys(c for a in found.admitting for c in a.modes_limited_by))


def admitted_runners(found: Callers, runners: Sequence[str]) -> list[str]:
    """Of ``runners``, those some admitting call runs on."""
    allowed = found.runners()
    return [r for r in runners if allowed is None or r in allowed]
