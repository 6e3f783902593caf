"""Assertions for test suites: an implementation passes, a mutant is caught.

Each mutant's hand-derived smallest case (:attr:`Implementation.smallest`) is
always judged, as a Hypothesis explicit example (``@example``): in
:func:`assert_passes` every mutant's smallest case of the target the
implementation can run must pass, and :func:`assert_detected` first asserts
that the mutant fails its own.

Both search with a budget of the implementation's kind (:data:`PASSING_EXAMPLES`,
:data:`DETECTING_EXAMPLES`) unless told otherwise, and run each search once per
process: the generic tests (``tests/test_entries.py``) and a target's own tests
of what that search covered read the same run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Any

from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.runner import RunResult, fuzz
from attnfuzz.harness.target import Implementation, InvalidCase, Target
from attnfuzz.reference.batch import DTYPE_VARIABLE, Batch, Case, EngineConfig
from attnfuzz.reference.invariants import violations
from attnfuzz.reference.trace import Trace, as_trace, first_step_violations, trace_violations


def spec_config(**overrides) -> EngineConfig:
    """The example engine of docs/domain.md, section 7: next_n = 2, K = 4, max_model_len = 64.

    Capture sizes are multiples of next_n up to 128, 8 and 104 among them.
    """
    base = dict(
        max_model_len=64,
        max_num_seqs=64,
        max_num_batched_tokens=256,
        block_size=4,
        num_spec=1,
        cudagraph_capture_sizes=(2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 104, 112, 128),
        topk=4,
        num_heads=2,
        head_dim=4,
    )
    base.update(overrides)
    return EngineConfig(**base)


def hand_case(
    q_lens: tuple[int, ...],
    computed: tuple[int, ...],
    use_cudagraph: bool = True,
    seed: int = 7,
    **config,
) -> Case:
    """A hand-written case on :func:`spec_config`; refuses one the engine could not produce."""
    case = Case(spec_config(**config), Batch(tuple(computed), tuple(q_lens), seed, use_cudagraph))
    broken = violations(case.config, case.batch)
    assert not broken, broken
    return case


PASSING_EXAMPLES = {"fixed": 300, "reference": 300, "engine": 200}
"""Generated cases an implementation that must pass is judged on, by kind."""

PASSING_TRACES = 10
"""Generated traces (several steps of one engine each) an implementation that runs
one step at a time must pass too, whatever its kind."""

PASSING_OWN_TRACES = 120
"""Generated traces one of attnfuzz's own implementations that lives across steps (a
runner of its own kernels, its reference) is judged on, in place of its kind's
:data:`PASSING_EXAMPLES`: a trace holds 1 to 6 steps (2.6 on average in runner-step's
search at seed 0), so 120 judge about as many steps as the 300 cases of a one-step
search."""

PASSING_ENGINE_TRACES = 6
"""Generated traces an engine implementation that lives across steps is judged on (in
place of its kind's :data:`PASSING_EXAMPLES`), after every mutant's smallest trace:
each trace is several whole steps of the engine's own Python (a runner step: seconds
each on a 2-core machine, for some eighty implementations), so the suite's search is
sized by this count (CI's engine tier is most of its time); the nightly run judges
:data:`NIGHTLY_ENGINE_TRACES` at another seed, and a campaign or
``benchmarks/surface.py`` (200 per implementation) searches longer."""

NIGHTLY_ENGINE_TRACES = 40
"""Generated traces the nightly run judges an engine implementation that lives across
steps on, at a seed CI's search does not draw."""

DETECTING_EXAMPLES = 1000
"""Generated cases a mutant must be found within (the slow tier, ``-m slow``)."""


def nightly_seeds(seeds: tuple[int, ...] = (1, 2)) -> list[Any]:
    """``seeds`` as ``pytest.param``s marked ``slow`` and ``nightly``: a search test CI
    runs at seed 0, repeated on other draws by the nightly workflow only (CI's time
    stays sized by one seed's examples)."""
    import pytest

    return [pytest.param(s, marks=[pytest.mark.slow, pytest.mark.nightly]) for s in seeds]


def kind_of(impl: Implementation) -> str:
    """The implementation's kind as its plain name (``"mutant"``, ...), whether the
    kind is held as a string or an enumeration member."""
    return str(getattr(impl.kind, "value", impl.kind))


def require_variable(engine: str) -> str:
    """``ATTNFUZZ_REQUIRE_<ENGINE>``: set to 1 (CI, with the engine installed), a test
    of that engine's code fails instead of skipping where the engine is missing."""
    return f"ATTNFUZZ_REQUIRE_{engine.upper()}"


def implementation_params(target: str) -> list[Any]:
    """Every implementation of ``target`` as a ``pytest.param`` named after it.

    One of an engine (``vllm``) carries that engine's marker (``-m vllm`` selects
    them) and skips, saying why, where the engine is not installed; under
    :func:`require_variable` it fails instead.
    """
    import pytest

    out = []
    for name, impl in get_target(target).implementations.items():
        marks: list[Any] = []
        if impl.engine is not None:
            marks.append(getattr(pytest.mark, impl.engine))
            reason = impl.why_unavailable()
            if reason is not None:
                if os.environ.get(require_variable(impl.engine)) == "1":
                    raise RuntimeError(f"{require_variable(impl.engine)}=1 but {reason}")
                marks.append(pytest.mark.skip(reason=reason))
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def engine_marks(impl: Implementation) -> list[Any]:
    """The marks of a test that runs ``impl``: none for attnfuzz's own code; for an
    engine's, the engine's marker (``-m vllm``) and, where it cannot run here, a skip
    giving the implementation's reason, unless :func:`require_variable` is set: then
    the test runs and fails on that reason."""
    import pytest

    if impl.engine is None:
        return []
    marks: list[Any] = [getattr(pytest.mark, impl.engine)]
    reason = impl.why_unavailable()
    if reason is not None and os.environ.get(require_variable(impl.engine)) != "1":
        marks.append(pytest.mark.skip(reason=reason))
    return marks


def shipped_bug_marks(target: str, impl: Implementation) -> list[Any]:
    """Where the installed release of ``impl``'s engine ships one of the engine's own
    defects in it (:attr:`attnfuzz.harness.engines.Engine.shipped_bugs`), an ``xfail``
    on an assertion (an attnfuzz error still errors): a search asked to pass may meet
    the defect there. Not strict: a derandomized search need not draw the defect's
    case on every release that ships it; the defect's own ``case`` is judged on every
    release (``tests/test_entries.py``)."""
    import pytest
    from attnfuzz.harness import engines

    engine = engines.get(impl.engine) if impl.engine is not None else None
    bug = engine.shipped_bug(target, impl.name) if engine is not None else None
    if bug is None:
        return []
    why = f"{engine.name} {engine.installed_version()} ships {bug.ref} ({bug.what}), "
    why += f"fixed in {bug.first_fixed}" if bug.first_fixed else "present in its newest release"
    return [pytest.mark.xfail(strict=False, raises=AssertionError, reason=why)]


def entry_params(
    select: Callable[[Implementation], bool], *, shipped_bugs_fail: bool = False
) -> list[Any]:
    """``(target, implementation)`` of every registered target, as ``pytest.param`` entries
    with :func:`engine_marks`, for each implementation ``select`` keeps; ids are
    ``target/implementation`` (``-k slot-mapping/triton``). ``shipped_bugs_fail``: add
    :func:`shipped_bug_marks` (for a test that asks the implementation to pass)."""
    import pytest

    out = []
    for name in target_names():
        for impl in get_target(name).implementations.values():
            if select(impl):
                marks = engine_marks(impl)
                if shipped_bugs_fail:
                    marks += shipped_bug_marks(name, impl)
                out.append(pytest.param(name, impl.name, marks=marks, id=f"{name}/{impl.name}"))
    return out


def smallest_cases(
    target: Target, impl: Implementation, engines: Collection[str | None] | None = None
) -> list[Case | Trace]:
    """The smallest case of each of ``target``'s mutants that has one, in
    registration order, except those ``impl`` was never meant to run (outside
    the engine values it fixes). For an implementation that lives across steps
    (``traced``) they are traces (a case on its own: a trace of one step); for
    any other, the mutants' traces are left out. Mutants that share one smallest case
    give it once: judging it again would only repeat its verdict. ``engines``: only
    the mutants of these engines (None in it: attnfuzz's own); by default every one."""
    out: list[Case | Trace] = []
    for mutant in target.implementations.values():
        if kind_of(mutant) != "mutant" or mutant.smallest is None:
            continue
        if engines is not None and mutant.engine not in engines:
            continue
        found = mutant.smallest()
        if isinstance(found, Trace) and not impl.traced:
            continue
        trace = as_trace(found)
        try:
            for k in range(len(trace.steps)):
                target.refuse_unfixed(impl, trace.case(k))
        except InvalidCase:
            continue  # e.g. a mutant's case of another top-k than ``impl`` is built for
        case = trace if impl.traced else found
        if case not in out:
            out.append(case)
    return out


def assert_passes(
    target: str,
    impl: str,
    max_examples: int | None = None,
    seed: int = 0,
    traced: bool | None = None,
) -> RunResult:
    """Every mutant's smallest case (explicit examples) and a derandomized run of
    ``max_examples`` generated cases (by default the kind's :data:`PASSING_EXAMPLES`)
    find nothing. ``traced``: generate traces of one engine's steps (by default only
    for an implementation that lives across steps). The run is made once per
    process (see :func:`_once`).

    An engine's implementation that lives across steps is judged here on the smallest
    traces of its own engine's mutants and of attnfuzz's own only: another engine's
    mutant's trace was written to reach that engine's code; here it is one more trace,
    of seconds (each builds, warms up and captures engines), that claims to reach
    nothing. The nightly ``test_passes_each_mutants_smallest_case`` judges every
    mutant's smallest trace on every such implementation."""
    t = get_target(target)
    i = t.resolve(impl)
    traced = i.traced if traced is None else traced
    default = PASSING_EXAMPLES[kind_of(i)]
    if traced and i.traced:
        default = PASSING_ENGINE_TRACES if kind_of(i) == "engine" else PASSING_OWN_TRACES
    budget = max_examples if max_examples is not None else default
    engines = (None, i.engine) if i.engine is not None and i.traced else None
    explicit = smallest_cases(t, i, engines) if traced == i.traced else []

    def run() -> RunResult:
        result = fuzz(
            t,
            i,
            max_examples=budget,
            rng_seed=seed,
            database=None,
            examples=explicit,
            traced=traced,
        )
        assert not result.failed, f"{target}/{impl} failed on {result.case}:\n{result.verdict}"
        assert result.examples >= budget + len(explicit), f"only {result.examples} examples ran"
        return result

    return _once(("passes", t, i, budget, seed, traced, tuple(explicit)), run)


def assert_detected(
    target: str, mutant: str, seed: int = 0, max_examples: int = DETECTING_EXAMPLES
) -> RunResult:
    """The mutant fails its smallest case (an explicit example), and a
    derandomized run without it finds the mutant, its minimized case meeting
    the bug's trigger. The run is made once per process (see :func:`_once`). A
    mutant of the engine's life (``traced``) is searched with traces, its
    smallest case and minimized case being traces."""
    t = get_target(target)
    impl = t.resolve(mutant)
    traced = impl.traced

    def run() -> RunResult:
        smallest = impl.smallest() if impl.smallest is not None else None
        # A case the installed engine runs through other code is not the mutant's there.
        declined = (
            impl.declines is not None
            and smallest is not None
            and any(impl.declines(c) for c in _steps(smallest))
        )
        if smallest is not None and not declined:
            # Generation is asked for one case only: the explicit example fails first and
            # ends the run.
            alone = fuzz(
                t,
                impl,
                max_examples=1,
                rng_seed=seed,
                database=None,
                examples=[smallest],
                traced=traced,
            )
            assert alone.failed and alone.case == smallest and alone.examples == 1, (
                f"{target}/{mutant} passes its smallest case {smallest}"
            )
        result = fuzz(
            t, impl, max_examples=max_examples, rng_seed=seed, database=None, traced=traced
        )
        assert result.failed, f"{target}/{mutant} survived {result.examples} examples"
        assert result.case is not None
        if impl.trigger is not None:
            assert impl.trigger(result.case), f"minimized case misses the trigger: {result.case}"
        return result

    return _once(("detected", t, impl, max_examples, seed), run)


def _steps(found: Case | Trace) -> list[Case]:
    return found.cases() if isinstance(found, Trace) else [found]


def judge_example(
    target: Target, impl: Implementation, example: Case | Trace, device: str | None = None
) -> Verdict:
    """The verdict on a case (a new engine), or on a trace (one engine, step by step)."""
    if isinstance(example, Trace):
        return target.judge_trace(impl, example, device)
    return target.judge(impl, example, device)


def example_violations(target: Target, example: Case | Trace) -> list[str]:
    """Why no engine could produce ``example``: each step's invariants and the target's
    parameters, and for a trace what its steps say of a request across them (a case
    on its own: what it says as a new engine's first step)."""
    out = [p for c in _steps(example) for p in violations(c.config, c.batch)]
    out += target.param_violations(_steps(example)[0])
    if out:
        return out  # the scheduler's fields may be malformed: nothing more to read
    if isinstance(example, Trace):
        return trace_violations(example)
    return first_step_violations(example.batch)


_RUNS: dict[tuple[Any, ...], tuple[RunResult, tuple[Any, ...]]] = {}


def _once(key: tuple[Any, ...], run: Callable[[], RunResult]) -> RunResult:
    """``run()``'s result, made once per process for ``key`` and the setting that
    shapes a run (the float dtype variable); a failed assertion is not kept, so a
    second caller fails again. Objects of the key (a target, an implementation) are
    told apart by identity, and kept alive with the result so that no other takes
    their id: a rebuilt or replaced one is run afresh."""
    plain = tuple(
        v if isinstance(v, str | int | tuple) or v is None else (type(v).__name__, id(v))
        for v in key
    )
    plain = (*plain, os.environ.get(DTYPE_VARIABLE))
    if plain not in _RUNS:
        _RUNS[plain] = (run(), key)
    return _RUNS[plain][0]
