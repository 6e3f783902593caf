"""attnfuzz: differential testing and fuzzing of attention metadata.

The public API is what ``__all__`` lists (docs/api.md, "Public Python API"), with
the input and output dataclasses of ``attnfuzz.reference.<target>``; every
other module (``attnfuzz.harness``, ``attnfuzz.strategies``, ``attnfuzz.kernels``,
``attnfuzz.adapters``, ``attnfuzz.reports``) is internal. ``import attnfuzz`` is cheap: it imports
neither torch, Triton nor Hypothesis; each name is imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnfuzz.harness.definitions import VERSION as __version__  # cheap: no torch

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers
    from attnfuzz.harness.campaign import Options as CampaignOptions
    from attnfuzz.harness.campaign import run_campaign
    from attnfuzz.harness.errors import HarnessError, UsageError
    from attnfuzz.harness.oracle import Check, Mismatch, Verdict
    from attnfuzz.harness.registry import Mutant, add_mutants, get_target, mutant, target_names
    from attnfuzz.harness.runner import RunResult
    from attnfuzz.harness.target import Implementation, Target
    from attnfuzz.reference.batch import Batch, Case, EngineConfig
    from attnfuzz.reference.trace import Trace
    from attnfuzz.strategies.batches import PRODUCTION, SMALL, Scale
    from hypothesis.strategies import SearchStrategy

    # What names an implementation: a registered name or "module:attribute", an
    # Implementation, or any callable taking the target's inputs.
    ImplementationLike = str | Implementation | Callable[[Any], Any]

# Public name -> "module:attribute". Moving a module only changes this map.
_LAZY: dict[str, str] = {
    "target_names": "attnfuzz.harness.registry:target_names",
    "get_target": "attnfuzz.harness.registry:get_target",
    "mutant": "attnfuzz.harness.registry:mutant",
    "Mutant": "attnfuzz.harness.registry:Mutant",
    "add_mutants": "attnfuzz.harness.registry:add_mutants",
    "run_campaign": "attnfuzz.harness.campaign:run_campaign",
    "CampaignOptions": "attnfuzz.harness.campaign:Options",
    "Target": "attnfuzz.harness.target:Target",
    "Implementation": "attnfuzz.harness.target:Implementation",
    "UsageError": "attnfuzz.harness.errors:UsageError",
    "HarnessError": "attnfuzz.harness.errors:HarnessError",
    "Verdict": "attnfuzz.harness.oracle:Verdict",
    "Mismatch": "attnfuzz.harness.oracle:Mismatch",
    "Check": "attnfuzz.harness.oracle:Check",
    "RunResult": "attnfuzz.harness.runner:RunResult",
    "Case": "attnfuzz.reference.batch:Case",
    "EngineConfig": "attnfuzz.reference.batch:EngineConfig",
    "Batch": "attnfuzz.reference.batch:Batch",
    "Scale": "attnfuzz.strategies.batches:Scale",
    "SMALL": "attnfuzz.strategies.batches:SMALL",
    "PRODUCTION": "attnfuzz.strategies.batches:PRODUCTION",
}

__all__ = [
    "__version__",
    # targets and their strategies
    "target_names",
    "get_target",
    "cases",
    # a user's own mutants (bug zoo)
    "mutant",
    "Mutant",
    "add_mutants",
    # judging, case files
    "judge",
    "load_case",
    "replay",
    # fuzzing
    "run",
    "run_campaign",
    "CampaignOptions",
    # types
    "Target",
    "Implementation",
    "Case",
    "EngineConfig",
    "Batch",
    "Verdict",
    "Mismatch",
    "Check",
    "RunResult",
    "Scale",
    "SMALL",
    "PRODUCTION",
    "UsageError",
    "HarnessError",
]


def __getattr__(name: str) -> Any:
    spec = _LAZY.get(name)
    if spec is None:
        raise AttributeError(f"module 'attnfuzz' has no attribute {name!r}")
    module_name, _, attr = spec.partition(":")
    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _target(target: str | Target) -> Target:
    from attnfuzz.harness.registry import get_target

    return get_target(target) if isinstance(target, str) else target


def _implementation(target: Target, impl: ImplementationLike) -> Implementation:
    from attnfuzz.harness.target import Implementation

    if isinstance(impl, Implementation):
        return impl
    if isinstance(impl, str):
        return target.resolve(impl)
    if callable(impl):
        name = f"{getattr(impl, '__module__', '?')}:{getattr(impl, '__qualname__', repr(impl))}"
        return Implementation(name, impl, "user", f"user implementation {name}")
    raise TypeError(f"an implementation is a name, an Implementation or a callable, got {impl!r}")


def cases(
    target: str | Target,
    scale: Scale | None = None,
    impl: ImplementationLike | None = None,
) -> SearchStrategy[Case]:
    """The Hypothesis strategy of ``target``'s cases: engine configs, scheduler
    steps and the target's own parameters, up to ``scale`` (default ``SMALL``).

    ``impl``, when given, is the implementation the cases are for: an
    implementation that fixes engine fields (``Implementation.fixes``) gets
    cases drawn with those values. The target is looked up when the strategy
    is first drawn from, so using this in ``@given(...)`` at import time costs
    nothing and an unknown name fails the test that draws, not the import.
    """
    from hypothesis import strategies as st

    def build() -> SearchStrategy[Case]:
        from attnfuzz.strategies.batches import SMALL

        t = _target(target)
        if impl is None:
            return t.cases(scale or SMALL)
        return t.cases(scale or SMALL, _implementation(t, impl))

    return st.deferred(build)


def judge(
    target: str | Target,
    impl: ImplementationLike,
    case: Case | Trace,
    device: str | None = None,
) -> Verdict:
    """Run ``impl`` on ``case`` in this process and compare it with ``target``'s oracle.

    A trace (``attnfuzz.reference.trace.Trace``, what :func:`load_case` gives of
    a trace case file) is judged step by step by one engine, started afresh
    (the implementation's ``new_engine()``); ``verdict.step`` is the step it fails at.

    ``target`` is a name (``"mtp-seq-lens"``) or a :class:`Target`; ``impl`` a
    registered name (``"triton"``), ``"module:attribute"``, an
    :class:`Implementation`, or any callable taking the target's inputs.
    ``device`` defaults to where the kernels run. Returns the :class:`Verdict`
    (``verdict.ok``; ``str(verdict)`` says what failed); never raises for a
    failure of the implementation. A case the engine could never produce
    raises :class:`UsageError` (``InvalidCase``), as does an unknown name, and
    so does one outside the limits the implementation declares of its engine
    (``Implementation.admits``: ``Unreachable``, one line saying why).
    """
    from attnfuzz.reference.trace import Trace

    t = _target(target)
    if isinstance(case, Trace):
        return t.judge_trace(_implementation(t, impl), case, device)
    return t.judge(_implementation(t, impl), case, device)


def load_case(path: str | Path) -> Case | Trace:
    """The case of a case file (``attnfuzz.case/1``), with the float dtype it was
    found in, checked as ``attnfuzz repro`` checks it. Reading a case file
    imports nothing it names. Every problem is a one-line :class:`UsageError`.
    A trace case file's is its trace (``attnfuzz.reference.trace.Trace``: the
    engine config and its steps, ``trace.case(k)`` step ``k`` as a case), which
    :func:`judge` judges step by step.

    A relative ``path`` is relative to the current directory, as everywhere in
    Python; in a test module, name the file relative to the module instead
    (``Path(__file__).parent / "cases" / "CASE.json"``), so that the suite runs
    from any directory. A file that is not there says both."""
    from attnfuzz.harness.casefile.load import refuse_missing, target_and_case

    refuse_missing(path)
    return target_and_case(path)[1]


def replay(
    path: str | Path,
    impl: ImplementationLike | None = None,
    device: str | None = None,
) -> Verdict:
    """Judge a case file's case on ``impl`` in this process: the :class:`Verdict`.

    ``impl`` is as for :func:`judge`; by default the implementation the file
    names, which must be registered (a ``module:attribute`` in a file is
    imported only when passed again as ``impl``). ``attnfuzz repro`` is the
    same judged in a child process, under the timeout the case was found with.

    A trace case file replays its steps in order, by one engine started afresh
    (the implementation's ``new_engine()``); ``verdict.step`` is the step it
    fails at. State an implementation keeps elsewhere (a module's buffer) is not
    reset in this process: ``attnfuzz repro`` replays a trace in a new one.
    """
    from attnfuzz.harness.casefile.load import refuse_missing, resolve_case, target_and_case
    from attnfuzz.reference.trace import Trace

    refuse_missing(path)
    if impl is None or isinstance(impl, str):
        target, implementation, case, _ = resolve_case(path, impl, note_dtype=False)
    else:
        target, case, _ = target_and_case(path)
        implementation = _implementation(target, impl)
    if isinstance(case, Trace):
        return target.judge_trace(implementation, case, device)
    return target.judge(implementation, case, device)


def run(
    target: str | Target,
    impl: ImplementationLike = "triton",
    *,
    max_examples: int = 200,
    seed: int | None = None,
    database: str | Path | None = None,
    scale: Scale | None = None,
    device: str | None = None,
    budget_s: float | None = None,
) -> RunResult:
    """Fuzz one implementation of one target in this process, as ``attnfuzz run``
    does (without its child process per case); the failure, if any, comes back
    minimized in the :class:`RunResult` (``result.failed``, ``result.case``,
    ``result.verdict``), never raised.

    ``seed`` makes the run derandomized; ``database`` (a directory or any
    ``--db`` spec, default none) keeps and replays what was found.
    ``budget_s`` ends a search that found nothing after that many seconds.

    An implementation that lives across steps (``Implementation.traced``) is
    searched with traces of one engine's steps, as ``attnfuzz run`` searches it:
    ``result.case`` is then the minimized failing trace, ``result.verdict.step``
    the step it fails at.
    """
    from attnfuzz.harness.runner import fuzz
    from attnfuzz.strategies.batches import SMALL

    t = _target(target)
    implementation = _implementation(t, impl)
    return fuzz(
        t,
        implementation,
        max_examples=max_examples,
        rng_seed=seed,
        database=None if database is None else str(database),
        scale=scale or SMALL,
        device=device,
        budget_s=budget_s,
        traced=implementation.traced,
    )
