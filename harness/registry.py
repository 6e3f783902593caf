"""The registered targets, and the mutants users add to them.

Built-in targets: one module per target under ``attnfuzz.harness.targets``. A
module ``foo_bar.py`` there with a ``build() -> Target`` function is the target
``foo-bar``; adding a target is adding its file. Built-in targets are built on
first use (building imports the Triton kernels).

Targets of other distributions: an entry point in the group ``attnfuzz.targets``
whose name is the target's name and whose value is a ``build`` function,
e.g. in the distribution's ``pyproject.toml``::

    [project.entry-points."attnfuzz.targets"]
    my-target = "my_engine.attnfuzz_targets:build"

``build()`` returns a :class:`~attnfuzz.harness.target.Target` of that name.
Such targets are built when the names are first listed, so that one that
cannot be built (its module fails to import, ``build`` raises or returns
something else) is left out of :func:`target_names` and reported by
:func:`unavailable_targets` with its reason, instead of breaking every
command; :func:`get_target` refuses it with that reason. An entry point named
like a built-in target, or two entry points of one name, are a
:class:`UsageError` (which one was meant cannot be known).

Engines (:mod:`attnfuzz.harness.engines`, the group ``attnfuzz.engines``) add
their implementations and upstream mutants to the targets they name when
:func:`get_target` builds them; :func:`engine_problems` says which were left out.

A user's own bug zoo: :func:`add_mutants` registers mutants a user module
declares with :func:`mutant` (see there).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from attnfuzz.harness import engines, entry_points, targets
from attnfuzz.harness.errors import one_line
from attnfuzz.harness.target import Implementation, Target, UsageError
from attnfuzz.reference.batch import Case

ENTRY_POINT_GROUP = "attnfuzz.targets"
DEFAULT_MUTANTS_ATTRIBUTE = "MUTANTS"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@cache
def _builtin_names() -> tuple[str, ...]:
    modules = pkgutil.iter_modules(targets.__path__)
    return tuple(sorted(m.name.replace("_", "-") for m in modules if not m.name.startswith("_")))


@cache
def _plugins() -> tuple[dict[str, Target], dict[str, str]]:
    """``(targets, unavailable)``: the targets of the ``attnfuzz.targets`` entry
    points, built, and ``name -> reason`` for those that could not be built."""
    built: dict[str, Target] = {}
    unavailable: dict[str, str] = {}
    eps = entry_points.entry_points(ENTRY_POINT_GROUP)
    for reason in entry_points.clashes(eps, "target").values():
        raise UsageError(reason)
    builtin = set(_builtin_names())
    for ep in eps:
        if ep.name in builtin:
            raise UsageError(
                f"{entry_points.describe(ep)} is named like the built-in target {ep.name!r}: "
                "rename it"
            )
        target, reason = entry_points.load(ep, lambda build, n=ep.name: _built(build(), n))
        if target is None:
            unavailable[ep.name] = reason or f"{entry_points.describe(ep)} failed"
        else:
            built[ep.name] = target
    return built, unavailable


def _built(target: object, name: str) -> Target:
    """What an entry point's ``build()`` returned, checked as the target ``name``."""
    if not isinstance(target, Target):
        raise entry_points.Refused(f"returned {type(target).__name__}, not an attnfuzz Target")
    if target.name != name:
        raise entry_points.Refused(f"built target {target.name!r}")
    return target


@cache
def target_names() -> list[str]:
    """Every target that can run here: the built-in ones and those of entry points
    that could be built (see :func:`unavailable_targets` for the others)."""
    return sorted([*_builtin_names(), *_plugins()[0]])


def split_impl_spec(spec: str) -> tuple[str | None, str]:
    """``TARGET=IMPL`` -> ``(TARGET, IMPL)``; a bare ``IMPL`` (a registered name or
    ``module:attribute``) -> ``(None, IMPL)``. The same form everywhere an
    implementation is named: ``run``, ``campaign``, the pytest plugin."""
    target, sep, impl = spec.partition("=")
    if not sep or ":" in target:  # "=" inside module:attribute is no target
        return None, spec
    if not target.strip() or not impl.strip():
        raise UsageError(f"implementation {spec!r}: expected TARGET=IMPL, e.g. slot-mapping=pkg:fn")
    return target.strip(), impl.strip()


def unavailable_targets() -> dict[str, str]:
    """``name -> reason`` for each ``attnfuzz.targets`` entry point that cannot be built."""
    return dict(_plugins()[1])


@cache
def get_target(name: str) -> Target:
    """The target ``name``, with the implementations every engine adds to it
    (:mod:`attnfuzz.harness.engines`); a :class:`UsageError` naming why when there is none."""
    if name not in _builtin_names():  # built-ins first: a plugin's build() may use them
        plugins, unavailable = _plugins()
        if name in plugins:
            return _with_engines(plugins[name])
        if name in unavailable:
            raise UsageError(f"target {name!r} is unavailable: {unavailable[name]}")
        raise UsageError(f"unknown target {name!r} (known: {', '.join(target_names())})")
    module = importlib.import_module(f"{targets.__name__}.{name.replace('-', '_')}")
    target = module.build()
    assert target.name == name, f"{module.__name__} builds {target.name!r}, expected {name!r}"
    return _with_engines(target)


_refused: dict[str, list[str]] = {}
"""Target name -> why engines' implementations of it were refused (as last built)."""


def _with_engines(target: Target) -> Target:
    """``target`` with each loaded engine's implementations of it added, in the order
    of the engines' names; one whose name the target already has is refused (why
    goes to :func:`engine_problems`), the rest of the engine still added."""
    refused = _refused[target.name] = []
    for engine in engines.engines().values():
        for impl in engine.implementations.get(target.name, ()):
            unavailable = _Answering(engine.name, impl.unavailable or engine.unavailable)
            added = dataclasses.replace(impl, engine=engine.name, unavailable=unavailable)
            existing = target.implementations.get(impl.name)
            if existing == added:  # a plugin's target, built once, attached again
                continue
            if impl.engine not in (None, engine.name):
                refused.append(
                    f"engine {engine.name}: {target.name}/{impl.name} says it is "
                    f"engine {impl.engine!r}'s code"
                )
            elif existing is not None:
                refused.append(
                    f"engine {engine.name}: {target.name} already has an implementation "
                    f"{impl.name!r} ({existing.kind}: {existing.description}); rename the engine's"
                )
            else:
                try:
                    target.add(added)
                except UsageError as err:  # its ``params`` are none of the target's ranges
                    refused.append(f"engine {engine.name}: {err}")
    for name, (declared, reason) in engines.held_back().items():
        # Two distributions declare the engine: none of its code runs, and asking for
        # one of its implementations says why (not "unknown implementation").
        why = f"engine {name} is left out: {reason}"
        for engine in declared:
            for impl in engine.implementations.get(target.name, ()):
                if impl.name not in target.implementations:
                    held = dataclasses.replace(impl, engine=name, unavailable=lambda w=why: w)
                    try:
                        target.add(held)
                    except UsageError as err:  # as above: its ``params``
                        refused.append(f"engine {name}: {err}")
    return target


@dataclass(frozen=True)  # equal for equal questions: a target attached again compares equal
class _Answering:
    """``unavailable()`` of ``engine``, where an engine that raises instead of answering
    (its import failing inside: a dependency missing) is unavailable, saying why in one
    line, instead of breaking every command that asks (``attnfuzz list`` asks them all)."""

    engine: str
    unavailable: Callable[[], str | None]

    def __call__(self) -> str | None:
        try:
            return self.unavailable()
        except Exception as err:  # noqa: BLE001 - whatever it raised is the engine's
            said = f"{type(err).__name__}: {err}"
            return one_line(f"engine {self.engine} failed to say whether it can run: {said}")


def engine_problems() -> list[str]:
    """Why engine plugins, or some of their implementations, are left out (one line
    each): an entry point that cannot be loaded, an implementation of a target that
    does not exist here or of a name the target already has."""
    out = [f"engine {name}: {why}" for name, why in engines.unavailable_engines().items()]
    named: set[str] = set()
    for engine in engines.engines().values():
        for name in engine.implementations:
            if name in target_names():
                named.add(name)
            else:
                out.append(f"engine {engine.name}: implementations of unknown target {name!r}")
    for name in sorted(named):
        get_target(name)  # refusals are found when the target is built
        out += _refused.get(name, [])
    return out


def unavailable_mutants(names: list[str] | None = None) -> dict[str, list[str]]:
    """``reason -> ["target/mutant", ...]``: the mutants that cannot run here (an
    engine's upstream mutants where the engine is not installed)."""
    left: dict[str, list[str]] = {}
    for name in names or target_names():
        target = get_target(name)
        for impl_name, reason in target.unavailable().items():
            if target.implementations[impl_name].kind == "mutant":
                left.setdefault(reason, []).append(f"{name}/{impl_name}")
    return left


# ---------------------------------------------------------------------------
# A user's own mutants
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """A known bug of a user's, kept to check that the search still finds it:
    ``implementation`` (kind ``"mutant"``) of the target named ``target``."""

    target: str
    implementation: Implementation


def mutant(
    target: str,
    name: str,
    fn: Callable[[Any], Any],
    *,
    description: str = "",
    trigger: Callable[[Case], bool] | None = None,
    reach: Callable[[Case], bool] | None = None,
    smallest: Callable[[], Case] | None = None,
    fixes: Mapping[str, int | str] | None = None,
) -> Mutant:
    """Declare a mutant of ``target``: ``fn(inputs) -> outputs`` as the target's
    implementations are, with a bug in it. Optional, for the zoo's scoreboard as
    for the built-in mutants: ``reach(case)`` (the case runs the code the bug
    lives in), ``trigger(case)`` (the case meets the bug's condition),
    ``smallest()`` (the smallest triggering case, derived by hand); ``fixes``
    as :attr:`Implementation.fixes`. A module lists its mutants, e.g.::

        MUTANTS = [attnfuzz.mutant("slot-mapping", "my-off-by-one", my_slot_mapping)]

    and ``--mutants my_module`` (or ``my_module:MUTANTS``) adds them; see
    :func:`add_mutants`.
    """
    impl = Implementation(
        name,
        fn,
        "mutant",
        description or f"user mutant {name}",
        trigger=trigger,
        reach=reach,
        smallest=smallest,
        fixes=dict(fixes or {}),
    )
    return Mutant(target, impl)


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UsageError(f"mutants {spec!r}: expected MODULE or MODULE:ATTRIBUTE")
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit) as err:  # the user's module failed to import: say how
        raise UsageError(f"cannot load mutants {spec!r}: {type(err).__name__}: {err}") from err
    for part in (attr or DEFAULT_MUTANTS_ATTRIBUTE).split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(
                f"cannot load mutants {spec!r}: {module_name} has no attribute "
                f"{attr or DEFAULT_MUTANTS_ATTRIBUTE!r}"
            ) from None
    return obj


def add_mutants(spec: str) -> list[tuple[str, str]]:
    """Register the mutants ``spec`` declares; return their ``(target, mutant)`` names.

    ``spec`` is ``MODULE:ATTRIBUTE`` (dotted attributes allowed) or ``MODULE``
    (its ``MUTANTS``), naming a :class:`Mutant` (see :func:`mutant`) or an
    iterable of them. Each is added to its target as an implementation of kind
    ``"mutant"``, which the zoo, ``campaign`` and ``run --impl NAME`` then treat
    as they treat the built-in mutants. Adding the same declaration again (a
    campaign worker, a second call) is a no-op. A :class:`UsageError` with a
    one-line reason, before anything is registered, on: a module that fails to
    import, a missing attribute, anything but mutants, none at all, an unknown
    target, a name that is not a plain word (letters, digits, ``_.+-``), or a
    name that another implementation of that target already has.
    """
    obj = _load(spec)
    declared: list[Any] = [obj] if isinstance(obj, Mutant) else _as_list(spec, obj)
    if not declared:
        raise UsageError(f"mutants {spec!r} declares no mutants")
    chosen: dict[tuple[str, str], Implementation] = {}
    for item in declared:
        if not isinstance(item, Mutant):
            raise UsageError(
                f"mutants {spec!r}: {type(item).__name__} {item!r:.80} is not a mutant "
                "(declare each with attnfuzz.mutant(target, name, fn))"
            )
        impl = dataclasses.replace(item.implementation, kind="mutant")
        if not _NAME.fullmatch(impl.name):
            raise UsageError(f"mutants {spec!r}: {impl.name!r} is not a plain name")
        target = get_target(item.target)
        key = (target.name, impl.name)
        existing = target.implementations.get(impl.name, chosen.get(key))
        if existing is not None and existing != impl:
            raise UsageError(
                f"mutants {spec!r}: {target.name} already has an implementation {impl.name!r} "
                f"({existing.kind}: {existing.description})"
            )
        chosen[key] = impl
    for (target_name, _), impl in chosen.items():
        get_target(target_name).add(impl)
    return list(chosen)


def _as_list(spec: str, obj: Any) -> list[Any]:
    if isinstance(obj, str | bytes | Mapping) or not isinstance(obj, Iterable):
        raise UsageError(
            f"mutants {spec!r} is a {type(obj).__name__}: expected a mutant or a list of them"
        )
    return list(obj)
