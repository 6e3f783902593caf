"""The target model: a target declared as data, and the implementations attached to it.

A *target* is one metadata computation of the engine, declared in one
:class:`Target` expression (as OpInfo declares an op): how to build the
inputs of a case from its seed, what the reference says, how to compare
(with the names of its own checks), its parameters, dtypes and graph safety,
and its implementations: the optimized one (``triton``), the reference itself
(a self-check), and its mutants (the historical bugs, each an entry with the
``reach``, ``trigger`` and ``smallest`` the zoo measures). An *implementation*
is any callable ``fn(inputs) -> outputs`` for that target; more are attached
later with :meth:`Target.add` by whoever provides them (an engine plugin, a
user's ``module:attribute`` or mutants). Judging a case is
:mod:`attnfuzz.harness.judging`'s job.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from attnfuzz.harness.definitions import Kind
from attnfuzz.harness.errors import CaseTooLarge, HarnessError, InvalidCase, Unreachable, UsageError
from attnfuzz.harness.guards import fits_in_memory
from attnfuzz.harness.implementation import Implementation
from attnfuzz.harness.oracle import Check, Mismatch
from attnfuzz.harness.stack import on_own_stack
from attnfuzz.harness.traces import refuse_continuing
from attnfuzz.reference.batch import (
    DEFAULT_FLOAT_DTYPE,
    DTYPE_VARIABLE,
    FLOAT_DTYPES,
    Case,
    build_common_metadata,
    split_decodes_and_prefills,
    using_float_dtype,
)
from attnfuzz.reference.invariants import violations
from attnfuzz.reference.runner import CG_SUPPORTS
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.batches import (
    BOUNDARY_MEASURES,
    SMALL,
    Scale,
    boundary_measures,
    cases,
    fixes_violations,
)
from attnfuzz.strategies.traces import traces
from hypothesis import strategies as st

if TYPE_CHECKING:
    from attnfuzz.harness.oracle import Verdict

# The errors live in ``guards``; callers import them from here, with the target.
__all__ = [
    "CaseTooLarge",
    "HarnessError",
    "Implementation",
    "InvalidCase",
    "Kind",
    "Target",
    "Unreachable",
    "UsageError",
    "fits_in_memory",
]


@dataclass
class Target:
    """One target, declared whole: ``build()`` of a target module returns one
    ``Target(...)`` expression (``docs/adding-a-target.md``)."""

    name: str
    summary: str
    make_inputs: Callable[[Case, torch.device], Any]
    reference: Callable[[Case, Any], Any]
    compare: Callable[[Case, Any, Any, Any], list[Mismatch]]
    # Its implementations and mutants (:meth:`Implementation.mutant`), declared as
    # a sequence of entries (or a mapping by name); kept as ``name -> entry``, to
    # which :meth:`add` attaches more (an engine plugin's, a user's).
    implementations: dict[str, Implementation] = field(default_factory=dict)
    # The target's own integers (``Case.params``): name -> inclusive range. They
    # are drawn after the step by Hypothesis and uniformly by the baselines.
    params: dict[str, tuple[int, int]] = field(default_factory=dict)
    graph_safe: bool = False  # the call is replayed in a CUDA graph: it may not allocate
    # The target's view of a step (metadata and decode split) for case files'
    # derived quantities; None: the ragged split of the common metadata.
    describe: Callable[[Case], Any] | None = None
    # Per-case counts read off an implementation's outputs, summed over a run.
    statistics: Callable[[Any], dict[str, int]] | None = None
    # Names of statistics that measure a case's closeness to a bug's condition
    # (larger is closer): the search maximizes each with ``hypothesis.target``.
    # A name in ``strategies.batches.BOUNDARY_MEASURES`` is measured on the case
    # itself (``describe``'s view), so no implementation can misreport it; any
    # other name is a key of ``statistics``. Each target says why it chose them.
    guided: tuple[str, ...] = ()
    # The float dtypes the target's inputs can be built in, as OpInfo's ``dtypes``;
    # the first is the default. ``ATTNFUZZ_DTYPE`` overrides it with another of
    # them; a target without float inputs keeps the default, float32 only.
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    # The AttentionCGSupport of the backends its code runs with (only modes they keep
    # are drawn); whether V2's varlen decode graphs (adaptive verification) are drawn;
    # where its engine code runs (harness.reachability.RUNS_IN).
    cg_supports: tuple[str, ...] = CG_SUPPORTS
    varlen_decode: bool = True
    runs_in: str = "builder"
    # The names of the target's own checks (a small StrEnum of its module, or
    # strings), beside the generic ones of :class:`~attnfuzz.harness.oracle.Check`:
    # its comparison reports no other (judging refuses it as a HarnessError).
    checks: Iterable[str] = ()

    def __post_init__(self) -> None:
        self.implementations = self._entries(self.implementations)
        self.checks = tuple(str(name) for name in self.checks)
        generic = [name for name in self.checks if name in set(Check)]
        if generic or len(set(self.checks)) != len(self.checks) or "" in self.checks:
            raise UsageError(
                f"target {self.name}: checks must be distinct names, none of the generic "
                f"ones ({', '.join(generic) or 'a repeated or empty name'})"
            )
        known = set(FLOAT_DTYPES.values())
        if not self.dtypes or len(set(self.dtypes)) != len(self.dtypes) or set(self.dtypes) - known:
            raise UsageError(
                f"target {self.name}: dtypes must be distinct, among "
                f"{', '.join(FLOAT_DTYPES)}, got {self.dtypes}"
            )

    def _entries(self, declared: Mapping[str, Any] | Iterable[Any]) -> dict[str, Implementation]:
        """``name -> implementation`` of what the declaration lists, each name once."""
        impls = list(declared.values() if isinstance(declared, Mapping) else declared)
        out = {getattr(impl, "name", ""): impl for impl in impls}
        if len(out) != len(impls) or not all(isinstance(i, Implementation) for i in impls):
            raise UsageError(f"target {self.name}: implementations of distinct names expected")
        for impl in impls:
            self.params_of(impl)  # its narrower ranges are the target's own
        return out

    def params_of(self, impl: Implementation | None = None) -> dict[str, tuple[int, int]]:
        """The ranges ``impl``'s cases draw the target's own integers in: the target's,
        narrowed where ``impl.params`` says. A name the target lacks, or a range
        outside the target's, is a :class:`UsageError`."""
        out = dict(self.params)
        for name, (lo, hi) in (impl.params if impl is not None else {}).items():
            if name not in self.params:
                raise UsageError(
                    f"implementation {impl.name!r}: {self.name} has no parameter {name!r} "
                    f"(it has {', '.join(sorted(self.params)) or 'none'})"
                )
            low, high = self.params[name]
            if not low <= lo <= hi <= high:
                raise UsageError(
                    f"implementation {impl.name!r}: params {name}=({lo}, {hi}) lies outside "
                    f"{self.name}'s range ({low}, {high})"
                )
            out[name] = (lo, hi)
        return out

    @property
    def dtype_names(self) -> list[str]:
        """``dtypes`` by name (``float32``, ...), the default first."""
        names = {dtype: name for name, dtype in FLOAT_DTYPES.items()}
        return [names[d] for d in self.dtypes]

    def float_dtype_name(self, case: Case | None = None) -> str:
        """The name of the float dtype ``case``'s inputs are built in: the one it
        records (a case file's), else ``ATTNFUZZ_DTYPE`` when set, else the
        target's default (``dtypes[0]``). One that is not among ``dtypes`` is
        refused in one line: :class:`InvalidCase` for a case's, :class:`UsageError`
        for the variable's. Without ``case``: the setting a run would use (check
        it before any work)."""
        allowed = self.dtype_names
        if case is not None and case.dtype is not None:
            if case.dtype not in allowed:
                raise InvalidCase(
                    f"the case's dtype {case.dtype}: {self.name} builds its inputs in "
                    f"{', '.join(allowed)} only"
                )
            return case.dtype
        setting = os.environ.get(DTYPE_VARIABLE)
        if not setting:
            return allowed[0]
        if setting not in FLOAT_DTYPES:
            raise UsageError(
                f"{DTYPE_VARIABLE}={setting!r}: expected one of {', '.join(FLOAT_DTYPES)}"
            )
        if setting not in allowed:
            raise UsageError(
                f"{DTYPE_VARIABLE}={setting}: {self.name} builds its inputs in "
                f"{', '.join(allowed)} only"
            )
        return setting

    def add(self, impl: Implementation) -> None:
        self.params_of(impl)
        self.implementations[impl.name] = impl

    @property
    def mutants(self) -> list[Implementation]:
        """The mutants that can run here (an engine's upstream mutants need the engine)."""
        impls = self.implementations.values()
        return [i for i in impls if i.kind is Kind.MUTANT and i.why_unavailable() is None]

    def unavailable(self) -> dict[str, str]:
        """Implementations that cannot run here, each with the reason."""
        reasons = {name: impl.why_unavailable() for name, impl in self.implementations.items()}
        return {name: why for name, why in reasons.items() if why is not None}

    def cases(
        self, scale: Scale = SMALL, impl: Implementation | None = None
    ) -> st.SearchStrategy[Case]:
        """The cases of this target at ``scale``; with ``impl``, only those it
        accepts: its ``fixes`` are drawn as their values, whatever the scale's
        limits, its ``params`` in their narrower ranges, and none it declines or
        its engine never reaches (``admits``; shrinking stays among them). An
        implementation without any of these draws exactly the cases (and shrinks
        exactly as) ``cases(scale)`` does, so saved corpora replay."""
        return self._drawn(cases, scale, impl, lambda case: [case])

    def traces(
        self, scale: Scale = SMALL, impl: Implementation | None = None
    ) -> st.SearchStrategy[Trace]:
        """The traces of one engine's steps (:mod:`attnfuzz.strategies.traces`), as :meth:`cases`
        draws cases; with ``impl``, those whose every step it accepts, with its lookahead."""
        drawn = functools.partial(
            traces,
            lookahead=impl.lookahead if impl else None,
            chunked_prefill=impl.chunked_prefill if impl else True,
        )
        return self._drawn(drawn, scale, impl, Trace.cases)

    def _drawn(self, strategy: Any, scale: Scale, impl: Implementation | None, steps: Any) -> Any:
        ranges = self.params_of(impl)
        params = {name: st.integers(lo, hi) for name, (lo, hi) in ranges.items()}
        fixes = impl.fixes if impl is not None else None
        supports = impl.supports(self.cg_supports) if impl is not None else self.cg_supports
        drawn = strategy(scale, params, fixes, supports, self.varlen_decode)
        if impl is None or (impl.declines is None and impl.admits is None):
            return drawn
        declines = impl.declines

        def taken(case: Case) -> bool:
            if declines is not None and declines(case) is not None:
                return False
            return self.unreachable(impl, case) is None

        # A filter, not an ``assume`` in the property: a rejected draw is never judged,
        # and Hypothesis never shrinks to one (fuzz_settings lifts the health checks).
        return drawn.filter(lambda x: all(map(taken, steps(x))))

    def unreachable(self, impl: Implementation, case: Case) -> str | None:
        """Why ``impl``'s engine never reaches ``case``: ``impl.admits`` of the case's
        inputs (built on the CPU, floats in the default dtype: a limit reads none);
        None when it does, or declares no limits."""
        if impl.admits is None:
            return None
        with fits_in_memory(self.name), using_float_dtype(DEFAULT_FLOAT_DTYPE):
            inputs = self.make_inputs(case, torch.device("cpu"))
        return impl.admits(inputs)

    def judge_trace(
        self, impl: Implementation, trace: Trace, device: Any = None, clock: Counter | None = None
    ) -> Verdict:
        """:func:`attnfuzz.harness.traces.judge_trace`: ``impl`` over ``trace``'s steps."""
        from attnfuzz.harness.traces import judge_trace

        return on_own_stack(judge_trace, self, impl, trace, device, clock)

    def refuse_unfixed(self, impl: Implementation, case: Case, where: str | None = None) -> None:
        """Raise :class:`InvalidCase` (one line) when ``case`` differs from a field
        ``impl`` fixes, or ``impl`` declines it: the implementation was never meant
        to run it; :class:`Unreachable` when it lies outside the limits of ``impl``'s
        engine (``admits``): that engine never reaches it, so no verdict on it is one
        of the engine."""
        wrong = fixes_violations(case.config, impl.fixes)
        wrong += impl.support_violations(case.config.cg_support, self.cg_supports)
        declined = impl.declines(case) if impl.declines is not None else None
        if declined is not None:
            wrong.append(declined)
        if wrong:
            prefix = f"{where}: " if where else ""
            raise InvalidCase(
                f"{prefix}implementation {impl.name} of {self.name} cannot judge this case: "
                f"{'; '.join(wrong)}"
            )
        self.refuse_unreachable(impl, case, where)

    def refuse_unreachable(
        self, impl: Implementation, case: Case, where: str | None = None
    ) -> None:
        """Raise :class:`Unreachable` (one line: the engine and why) when ``case`` lies
        outside the limits of ``impl``'s engine (:meth:`unreachable`)."""
        why = self.unreachable(impl, case)
        if why is not None:
            prefix = f"{where}: " if where else ""
            engine = impl.engine or "its engine"
            raise Unreachable(
                f"{prefix}unreachable for {engine}, not judged: {impl.name} of {self.name} "
                f"is never given this case: {why}"
            )

    def boundary(self, case: Case) -> dict[str, int]:
        """The guided measures of ``case`` that are read off the case itself (see ``guided``)."""
        names = [name for name in self.guided if name in BOUNDARY_MEASURES]
        if not names:
            return {}
        if self.describe is not None:
            meta, split = self.describe(case)
        else:
            meta = build_common_metadata(case.config, case.batch)
            split = split_decodes_and_prefills(meta, case.config.threshold)
        measures = boundary_measures(case, meta, split)
        return {name: measures[name] for name in names}

    def param_violations(self, case: Case) -> list[str]:
        """The case's own integers are exactly the target's, each inside its range."""
        names = [name for name, _ in case.params]
        if sorted(names) != sorted(self.params):
            return [f"{self.name} takes parameters {sorted(self.params)}, the case has {names}"]
        out = []
        for name, value in case.params:
            lo, hi = self.params[name]
            if not lo <= value <= hi:
                out.append(f"parameter {name}={value} outside [{lo}, {hi}]")
        return out

    def refuse_invalid(self, case: Case, where: str | None = None, *, alone: bool = False) -> None:
        """Raise :class:`InvalidCase` for a case the engine could never produce
        (broken invariants, wrong target parameters), named by ``where``; ``alone``:
        judged on its own, by a new engine, it must be a first step (as a trace's 0)."""
        prefix = f"{where}: " if where else ""
        with fits_in_memory(where or self.name):
            broken = violations(case.config, case.batch) + self.param_violations(case)
        if case.config.cg_support not in self.cg_supports:
            broken.append(
                f"cg_support {case.config.cg_support}: {self.name} runs with backends of "
                f"AttentionCGSupport {' or '.join(self.cg_supports)}"
            )
        if case.config.varlen_decode and not self.varlen_decode:
            broken.append(
                f"varlen_decode: {self.name} does not model adaptive verification, "
                "which brings varlen decode graphs"
            )
        if broken:
            raise InvalidCase(f"{prefix}not a batch the engine can produce: {'; '.join(broken)}")
        if alone:
            refuse_continuing(case.batch, prefix)

    def resolve(self, spec: str) -> Implementation:
        """A registered name, or ``module:attribute`` naming a user's callable or a
        user's :class:`Implementation` (to declare ``fixes`` and a description);
        either is judged as kind :attr:`Kind.USER` under the name ``spec``, which is
        how its corpus and case files name it."""
        if spec in self.implementations:
            impl = self.implementations[spec]
            reason = impl.why_unavailable()
            if reason is not None:
                raise UsageError(f"implementation {spec!r} of {self.name} cannot run: {reason}")
            return impl
        if ":" not in spec:
            known = ", ".join(self.implementations)
            raise UsageError(f"unknown implementation {spec!r} for {self.name} (known: {known})")
        module_name, _, attr = spec.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (Exception, SystemExit) as err:  # the user's module failed to import: say how
            raise UsageError(
                f"cannot load implementation {spec!r}: {type(err).__name__}: {err}"
            ) from err
        if isinstance(obj, Implementation):
            return dataclasses.replace(obj, name=spec, kind=Kind.USER)
        if not callable(obj):
            raise UsageError(f"implementation {spec!r} is not callable")
        return Implementation(spec, obj, Kind.USER, f"user implementation {spec}")

    def asks_graph_safety(self, impl: Implementation) -> bool:
        """Whether judging ``impl`` asks its call not to allocate: the target is
        replayed in a CUDA graph, and ``impl`` is device code (the reference
        computes on the host by design: reading device tensors back is a copy)."""
        return self.graph_safe and impl.kind is not Kind.REFERENCE

    def judge(
        self,
        impl: Implementation,
        case: Case,
        device: torch.device | str | None = None,
        clock: Counter | None = None,
    ) -> Verdict:
        """``impl`` on ``case``, held to the reference: :func:`.judging.judge`."""
        from attnfuzz.harness.judging import judge  # judging needs this module as a type only

        return on_own_stack(judge, self, impl, case, device, clock)
