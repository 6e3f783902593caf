"""The engines under test, as plugins: what each declares, and loading them.

An engine (vLLM, SGLang, ...) is declared once, by an :class:`Engine`, and
registered in the entry-point group ``attnfuzz.engines``: the entry point's name
is the engine's name, its value the :class:`Engine` object itself (not a
function returning it), e.g. in the distribution's ``pyproject.toml``::

    [project.entry-points."attnfuzz.engines"]
    vllm = "attnfuzz.adapters.vllm.plugin:VLLM"

The module the entry point names is imported by every command that lists or
builds targets: it must be cheap and must not import the engine itself (an
optional install). The registry (:func:`attnfuzz.harness.registry.get_target`)
adds each engine's implementations to the targets they name. An entry point
that cannot be loaded (its module fails to import, its value is no Engine, its
name is another's) is left out and reported by :func:`unavailable_engines` with
its reason; it never breaks a command, and no finding is blamed on an engine
through it. ``docs/adding-an-engine.md`` walks through writing one.

Nothing under ``harness/``, ``reference/``, ``kernels/``, ``strategies/`` or
``reports/`` imports an engine's package: they ask this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any

from attnfuzz.harness import entry_points
from attnfuzz.harness.callers import Callee

if TYPE_CHECKING:  # torch: the engines' answers to ``attnfuzz list`` are asked without it
    from attnfuzz.harness.target import Implementation
    from attnfuzz.reference.batch import Batch, Case
    from attnfuzz.reference.runner import StepPlan

ENTRY_POINT_GROUP = "attnfuzz.engines"
_NAME = re.compile(r"[a-z][a-z0-9_]*")  # a pytest marker and ATTNFUZZ_REQUIRE_<NAME>

DEFAULT_RUNNER = "the default"
"""What :attr:`Engine.runners` says of the runner a release serves unless told otherwise."""

StepPlanner = Callable[[Any, "Batch"], "StepPlan"]
"""``planner(config, batch) -> StepPlan``, as :func:`attnfuzz.reference.runner.step_plan`."""


@dataclass(frozen=True)
class Engine:
    """One engine under test: how to tell whether it can run here, and what it adds.

    Every callable is called when needed, never at declaration: none may import
    the engine unless the engine is available.
    """

    name: str
    """Lower case (``vllm``): implementations' ``engine``, the pytest marker of its
    tests, ``ATTNFUZZ_REQUIRE_<NAME>``, the key of its version in case files."""
    install: str
    """One line that installs it (``ATTNFUZZ_VLLM=1 ./setup.sh``)."""
    installed_version: Callable[[], str | None]
    """The installed release, or None; looked up without importing the engine."""
    unavailable: Callable[[], str | None]
    """Why none of its code can run here (not installed, an unsupported release), or
    None. An implementation's own ``unavailable`` adds why it cannot bind to the
    installed release (an API that release lacks)."""
    status: Callable[[], str]
    """One line for ``attnfuzz list``: the installed release and what is supported."""
    implementations: Mapping[str, Sequence[Implementation]] = field(default_factory=dict)
    """Target name -> the engine's implementations of it: its own code (kind
    ``engine``) and its upstream mutants (kind ``mutant``, with ``trigger``,
    ``reach`` and ``smallest``), in the order ``attnfuzz list`` shows them."""
    planner: Callable[[], StepPlanner] | None = None
    """Reachability's model: returns the engine's own step planning (called only where
    :attr:`unavailable` is None); raises
    :class:`attnfuzz.harness.reachability.PlannerUnbound` where the installed release's
    planning cannot be driven. None: the reference's rules
    (:mod:`attnfuzz.reference.runner`) stand in for the engine's."""
    shipped_bugs: Sequence[ShippedBug] = ()
    """The engine's own defects that shipped in some of its supported releases."""
    sites: Callable[[str, str], Sequence[Site]] | None = None
    """``sites(target, impl)``: where the engine runs that implementation's code in
    production, for an engine whose steps the reference's runner rules do not
    describe (they model vLLM's runners): reachability judges the finding at each
    site instead of planning the step. None: :attr:`planner` or the reference's rules."""

    runners: Callable[[], Mapping[str, str]] | None = None
    """How the installed release picks its model runner, read from its code: runner
    (:data:`attnfuzz.reference.runner.RUNNERS`) -> the configuration that serves it,
    :data:`DEFAULT_RUNNER` for the one it serves unless told otherwise (called only
    where :attr:`unavailable` is None). A finding live only on runners other than the
    default is live with that configuration, and its reason names it. None: the
    runners are taken as equally served."""

    callers: Callable[[str, str], Callee | None] | None = None
    """``callers(target, impl)``: the engine function that implementation runs and what
    its callers' arguments mean (:mod:`attnfuzz.harness.callers`), for code whose
    arguments the case draws: reachability then plans the step only where some call in
    the installed release passes the case's values, and names the configuration it
    needs. None (or a None result): the arguments are taken as reachable."""

    def shipped_bug(self, target: str, impl: str) -> ShippedBug | None:
        """The first of :attr:`shipped_bugs` of ``target``'s ``impl`` that the installed
        release ships, or None (also where the engine is not installed)."""
        version = self.installed_version()
        if version is None:
            return None
        for bug in self.shipped_bugs:
            if (bug.target, bug.impl) == (target, impl) and bug.shipped_in(version):
                return bug
        return None


@dataclass(frozen=True)
class Site:
    """One place in the engine's runners where an implementation's code runs, read
    from the engine's own source: the site holds where ``caller`` (``module:qualname``)
    still names ``callee`` in the installed release."""

    runner: str  # e.g. "decode CUDA-graph runner"
    step: str  # e.g. "replay": on which steps the code runs there
    caller: str  # "sglang.srt....decode_cuda_graph_runner:DecodeCudaGraphRunner.replay"
    callee: str  # a name the caller's source must contain ("init_forward_metadata_out_graph")
    graph: bool | None = None
    """The step there: a CUDA-graph replay (True: the case judged with
    ``use_cudagraph``), an eager step (False: without), None: the case as it is."""
    note: str = ""


@dataclass(frozen=True)
class ShippedBug:
    """A defect of the engine's own code that shipped in a range of its releases,
    triaged from their source: there the implementation ``impl`` of ``target`` fails
    (``checks``, empty: any), and an engine test that asks it to pass must fail."""

    ref: str
    """The fix's pull request (``#43982``), or a short name where it has none."""
    target: str
    impl: str
    last_buggy: str
    """The last release that ships it."""
    first_fixed: str | None
    """The first release with the fix; None: no supported release has one (a defect
    present in the newest release attnfuzz supports, as far as it was observed)."""
    what: str
    checks: tuple[str, ...] = ()
    """The checks whose failure is this bug; empty: any."""
    note: str = ""
    first_buggy: str | None = None
    """The first release that ships it; None: the oldest the engine's plugin supports."""
    case: Callable[[], Case] | None = None
    """A case that meets it: fails on a release that ships it (on ``checks``), passes
    on one with the fix. None: the target's own tests pin it."""

    def shipped_in(self, version: str) -> bool:
        """Whether release ``version`` ships it."""
        key = release_key(version)
        after_first = self.first_buggy is None or release_key(self.first_buggy) <= key
        return after_first and key <= release_key(self.last_buggy)


def release_key(version: str) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a version string, ordered: ``0.34.0.dev12+gabc`` is
    ``(0, 34, 0)``, ``0.22`` is ``(0, 22, 0)``."""
    parts: list[int] = []
    for piece in version.replace("+", ".").replace("-", ".").split(".")[:3]:
        digits = re.match(r"\d*", piece).group(0)
        if not digits:
            break
        parts.append(int(digits))
    major, minor, patch = (parts + [0, 0, 0])[:3]
    return major, minor, patch


def _as_engine(value: object, name: str) -> Engine:
    """``value`` checked as the engine named ``name`` (:class:`entry_points.Refused` if not)."""
    from attnfuzz.harness.implementation import Implementation

    if not isinstance(value, Engine):
        raise entry_points.Refused(f"is a {type(value).__name__}, not an attnfuzz Engine")
    if value.name != name:
        raise entry_points.Refused(f"declares engine {value.name!r}, not {name!r}")
    if not _NAME.fullmatch(name):
        raise entry_points.Refused(f"names engine {name!r}: expected lower case, digits, _")
    for target, impls in value.implementations.items():
        wrong = [i for i in impls if not isinstance(i, Implementation)]
        if isinstance(impls, str) or wrong:
            raise entry_points.Refused(f"lists {impls!r:.80} for {target}: not Implementations")
    return value


@cache
def _loaded() -> tuple[dict[str, Engine], dict[str, str], dict[str, list[Engine]]]:
    """``(engines, unavailable, held_back)``: the engines of the entry points, by
    name; ``name -> reason`` for those that could not be loaded; and for each name
    two entry points or more share, the engines they declare (held back, unused)."""
    eps = entry_points.entry_points(ENTRY_POINT_GROUP)
    unavailable = entry_points.clashes(eps, "engine")
    loaded: dict[str, Engine] = {}
    held_back: dict[str, list[Engine]] = {}
    for ep in eps:
        engine, reason = entry_points.load(ep, lambda value, n=ep.name: _as_engine(value, n))
        if ep.name in unavailable:
            if engine is not None:
                held_back.setdefault(ep.name, []).append(engine)
        elif engine is None:
            unavailable[ep.name] = reason or f"{entry_points.describe(ep)} failed"
        else:
            loaded[ep.name] = engine
    return loaded, unavailable, held_back


def engines() -> dict[str, Engine]:
    """The engines whose plugin loaded, by name (an engine need not be installed)."""
    return dict(_loaded()[0])


def get(name: str) -> Engine | None:
    """The engine ``name``, or None where no plugin declares it (or it failed to load)."""
    return _loaded()[0].get(name)


def unavailable_engines() -> dict[str, str]:
    """``name -> reason`` for each ``attnfuzz.engines`` entry point that cannot be loaded."""
    return dict(_loaded()[1])


def held_back() -> dict[str, tuple[list[Engine], str]]:
    """``name -> (engines, reason)`` for each engine name two distributions declare:
    none of them is used, and their implementations' names say why where one is
    asked for (``--impl vllm``), instead of being unknown names."""
    _, unavailable, held = _loaded()
    return {name: (list(engines), unavailable[name]) for name, engines in held.items()}


def installed_versions() -> dict[str, str]:
    """The installed release of each engine that has one (looked up, not imported)."""
    out = {}
    for name, engine in _loaded()[0].items():
        version = engine.installed_version()
        if version is not None:
            out[name] = version
    return out
