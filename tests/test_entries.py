"""Every implementation of every registered target, judged alike.

One module over the registry, as PyTorch's ``test_ops.py`` runs over ``op_db``:
each test is parametrized by ``(target, implementation)`` (ids ``target/impl``,
so ``-k slot-mapping`` or ``-k indexer-decode/vllm`` select), and a new target,
implementation or mutant is tested here without a line written for it. What an
implementation must do follows from its kind:

- ``fixed``, ``reference`` and ``engine`` pass: every mutant's smallest case,
  and a derandomized search (``harness.testing.PASSING_EXAMPLES``), except an
  engine's release that ships a known defect of it, where the search may meet
  it (``Engine.shipped_bugs``; each defect's own case fails exactly on the
  releases that ship it);
- a ``mutant`` declares reach, trigger and a smallest case that is valid,
  reached, triggered and fails while the fixed implementations pass it, and the
  search finds it (``DETECTING_EXAMPLES``);
- an engine's implementation carries the engine's marker (``-m vllm``), skips
  with its own reason where it cannot run, and fails instead under
  ``ATTNFUZZ_REQUIRE_<ENGINE>=1``.

A target's own semantics (what a mutant's failure looks like, what its search
covers) stay in its own test files.
"""

from __future__ import annotations

import pytest
from attnfuzz.harness import engines
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.target import InvalidCase
from attnfuzz.harness.testing import (
    NIGHTLY_ENGINE_TRACES,
    PASSING_TRACES,
    assert_detected,
    assert_passes,
    engine_marks,
    entry_params,
    example_violations,
    judge_example,
    kind_of,
    require_variable,
)
from attnfuzz.reference.trace import Trace
from hypothesis import HealthCheck, given, settings

FIXED = ("fixed", "reference")
"""Kinds of attnfuzz's own correct code: a mutant's smallest case must pass them."""

PASSING = entry_params(lambda impl: kind_of(impl) != "mutant")
SEARCHED = entry_params(lambda impl: kind_of(impl) != "mutant", shipped_bugs_fail=True)
"""As PASSING; where the installed engine release ships a known defect of the
implementation, its search may meet it (an xfail; the defect's case is judged below)."""
ONE_STEP = entry_params(
    lambda impl: kind_of(impl) != "mutant" and not impl.traced, shipped_bugs_fail=True
)
"""As SEARCHED, those that run one step at a time: they must pass traces too."""
MUTANTS = entry_params(lambda impl: kind_of(impl) == "mutant")


def _nightly_search(param):
    """``param`` with the ``nightly`` mark where its search runs an engine's whole step
    on every trace (an engine's mutant of a target that lives across steps): seconds a
    trace, tens to hundreds of traces to a finding. The nightly workflow searches for
    those; CI judges each on its smallest trace (below), where its check must fail."""

    target, name = param.values
    impl = get_target(target).implementations[name]
    slow = impl.engine is not None and impl.traced
    marks = [*param.marks, *([pytest.mark.nightly] if slow else [])]
    return pytest.param(*param.values, marks=marks, id=param.id)


SEARCHED_MUTANTS = [_nightly_search(p) for p in MUTANTS]
TRACED_ENGINE = entry_params(
    lambda impl: kind_of(impl) != "mutant" and impl.engine is not None and impl.traced,
    shipped_bugs_fail=True,
)
"""As SEARCHED, the engines' implementations that live across steps."""
ENGINE = entry_params(lambda impl: impl.engine is not None)


def accepts(target, impl, case) -> bool:
    """Whether ``impl`` was meant to run ``case`` (its ``fixes``, its ``declines``; each
    step of a trace)."""
    try:
        for step in case.cases() if isinstance(case, Trace) else [case]:
            target.refuse_unfixed(impl, step)
    except InvalidCase:
        return False
    return True


# -- implementations that must pass ----------------------------------------------------------


SIDE_BY_SIDE_TRACES = {
    ("runner-step", "sglang-backends"): 4,
    ("runner-step", "sglang-deepseek-v4"): 2,
    ("runner-step", "sglang-deepseek-v4-hip-radix"): 2,
    ("runner-step", "sglang-deepseek-v4-hip-radix-draft"): 2,
    ("runner-step", "sglang-eagle-worker"): 4,
    ("runner-step", "sglang-fa3-prefill-graph"): 4,
    ("runner-step", "sglang-multi-layer-eagle"): 4,
    ("runner-step", "sglang-multi-layer-eagle-worker"): 4,
    ("runner-step", "sglang-prefill-graph"): 4,
    ("runner-step", "vllm"): 4,
    ("runner-step", "vllm-v1-backends"): 4,
    ("runner-step", "vllm-v1-deepseek-v41"): 2,
    ("runner-step", "vllm-dflash"): 4,
    ("runner-step", "vllm-mrope"): 4,
    ("runner-step", "vllm-mtp-modules"): 4,
    ("runner-step", "vllm-pcp"): 2,
    ("runner-step", "vllm-prompt-embeds"): 4,
    ("runner-step", "vllm-prompt-logprobs"): 4,
    ("runner-step", "vllm-v1-prompt-logprobs"): 4,
    ("runner-step", "vllm-standalone-ar"): 4,
    ("runner-step", "vllm-v2-encoder-decoder"): 4,
    ("runner-step", "vllm-v2-hybrid-align"): 4,
    ("runner-step", "vllm-v2-mamba-hybrid"): 4,
}
"""Generated traces for an implementation that runs each step on several engines or
graph runners (SGLang's attention backends side by side; a graph runner per draft
layer; prefill graphs beside the decode graphs, every size of both captured when an
engine starts; the EAGLE workers' target, draft and draft-extend graph runners; vLLM's
V2 runners, each of a trace's engines built, loaded and captured by vLLM's own code (the
PCP one five: the unpartitioned step's three and a runner per rank);
the V1 runner's step beside six backends' eager builds of it: 10 to 16 s a trace on a
2-core machine; SGLang's DeepSeek-V4 backend, whose metadata a graph builds anew at
every replay through a dozen interpreted Triton kernels), in place of its kind's
budget: the engine tier stays small; a campaign or a nightly run searches longer."""


@pytest.mark.parametrize("target, impl", SEARCHED)
def test_passes_a_derandomized_search(target, impl):
    assert_passes(target, impl, max_examples=SIDE_BY_SIDE_TRACES.get((target, impl)))


@pytest.mark.slow
@pytest.mark.nightly
@pytest.mark.parametrize("target, impl", TRACED_ENGINE)
def test_passes_a_longer_derandomized_search_at_another_seed(target, impl):
    """CI's search of an engine implementation that lives across steps is short (each
    trace whole engine steps): nightly judges more traces, drawn at another seed."""
    assert_passes(target, impl, max_examples=NIGHTLY_ENGINE_TRACES, seed=1)


@pytest.mark.parametrize("target, impl", ONE_STEP)
def test_passes_a_derandomized_trace_search(target, impl):
    """Several steps of one engine judged in turn pass as each step alone does: an
    implementation that keeps nothing across steps must not start to (CI's
    ``attnfuzz run --trace`` of every such implementation, as a generic test)."""
    assert_passes(target, impl, max_examples=PASSING_TRACES, traced=True)


def _judged_by_its_search(param):
    """``param`` with the ``slow`` and ``nightly`` marks where the implementation is an
    engine's that lives across steps, each trace a whole engine life of seconds: its
    derandomized search above judges first those of its own engine's mutants and of
    attnfuzz's own (explicit examples; it stops at the first failing one); this test,
    judging every mutant's and naming every failing one, is nightly's."""
    target, name = param.values
    impl = get_target(target).implementations[name]
    late = [pytest.mark.slow, pytest.mark.nightly] if impl.engine and impl.traced else []
    return pytest.param(*param.values, marks=[*param.marks, *late], id=param.id)


@pytest.mark.parametrize("target, impl", [_judged_by_its_search(p) for p in PASSING])
def test_passes_each_mutants_smallest_case(target, impl):
    """Each mutant's smallest case the implementation accepts, judged alone: a
    failure names every mutant whose case it fails (the search above judges
    them too, and stops at the first)."""
    t = get_target(target)
    i = t.resolve(impl)
    judged, failed = 0, []
    for mutant in t.implementations.values():
        if kind_of(mutant) != "mutant" or mutant.smallest is None:
            continue
        case = mutant.smallest()
        if not accepts(t, i, case):
            continue
        judged += 1
        verdict = judge_example(t, i, case)
        if not verdict.ok:
            failed.append(f"{mutant.name}: {verdict}")
    assert not failed, "\n".join(failed)
    if kind_of(i) in FIXED:  # an engine's glue may decline them all; attnfuzz's own code none
        assert judged > 0, f"{target}/{impl} accepts no mutant's smallest case"


# -- mutants -----------------------------------------------------------------------------------


@pytest.mark.parametrize("target, mutant", MUTANTS)
def test_mutant_declares_reach_trigger_and_a_smallest_case_that_fails(target, mutant):
    """The smallest case is one the engine can produce (and, for an engine's mutant,
    one inside the engine's own limits), reaches the bug's code, meets its trigger
    and fails the mutant, and every fixed implementation meant to run it passes it."""
    t = get_target(target)
    impl = t.resolve(mutant)
    assert impl.reach is not None and impl.trigger is not None and impl.smallest is not None
    case = impl.smallest()  # a trace for a bug of the engine's life (impl.traced)
    assert isinstance(case, Trace) == impl.traced
    assert example_violations(t, case) == []
    assert impl.reach(case) and impl.trigger(case)
    steps = case.cases() if isinstance(case, Trace) else [case]
    for step in steps:  # a state its engine reaches (Implementation.admits)
        assert t.unreachable(impl, step) is None, t.unreachable(impl, step)
    if accepts(t, impl, case):  # else the installed engine runs it through other code
        assert not judge_example(t, impl, case).ok
    fixed = [i for i in t.implementations.values() if kind_of(i) in FIXED and accepts(t, i, case)]
    assert fixed, f"no fixed implementation of {target} runs {mutant}'s smallest case"
    for other in fixed:
        assert judge_example(t, other, case).ok, other.name


@pytest.mark.slow
@pytest.mark.parametrize("target, mutant", SEARCHED_MUTANTS)
def test_mutant_is_detected(target, mutant):
    assert_detected(target, mutant)


def _mutants_by_engine() -> list:
    """``(target, engine)`` for each engine (None: attnfuzz's own) that has mutants of
    the target, with that engine's marks: the engine tier (``-m vllm``) checks its own
    mutants' triggers, which the tier without engines never registers."""
    out = []
    for name in target_names():
        by_engine = {m.engine: m for m in get_target(name).mutants}
        for engine, mutant in sorted(by_engine.items(), key=lambda kv: kv[0] or ""):
            marks = engine_marks(mutant)
            out.append(pytest.param(name, engine, marks=marks, id=f"{name}/{engine or 'own'}"))
    return out


@pytest.mark.parametrize("target, engine", _mutants_by_engine())
def test_every_trigger_implies_its_reach(target, engine):
    t = get_target(target)
    mutants = [m for m in t.mutants if m.engine == engine]

    @settings(
        max_examples=300, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(t.cases())
    def check(case):
        for impl in mutants:
            assert impl.reach(case) or not impl.trigger(case), impl.name

    check()


# -- engines -----------------------------------------------------------------------------------


@pytest.mark.parametrize("target, impl", ENGINE)
def test_binds_to_the_installed_release(target, impl):
    """The installed release has what the implementation calls. Where it cannot run
    the test skips with the reason (its marks), unless the engine is required."""
    reason = get_target(target).implementations[impl].why_unavailable()
    engine = get_target(target).implementations[impl].engine
    assert reason is None, f"{require_variable(engine)}=1 but {target}/{impl}: {reason}"


def _shipped_bugs_with_a_case() -> list:
    out = []
    for engine in engines.engines().values():
        for bug in engine.shipped_bugs:
            if bug.case is not None:
                marks = [getattr(pytest.mark, engine.name)]
                out.append(
                    pytest.param(
                        engine.name, bug, marks=marks, id=f"{bug.target}/{bug.impl}/{bug.ref}"
                    )
                )
    return out


@pytest.mark.parametrize("engine, bug", _shipped_bugs_with_a_case())
def test_a_shipped_bug_fails_its_case_exactly_where_it_shipped(engine, bug):
    """A defect an engine declares as shipped: its case fails, on the defect's checks,
    on every release up to ``last_buggy``, and passes from ``first_fixed`` on."""
    t = get_target(bug.target)
    impl = t.implementations[bug.impl]
    reason = impl.why_unavailable()
    if reason is not None:
        pytest.skip(reason)
    verdict = t.judge(impl, bug.case())
    version = engines.get(engine).installed_version()
    if bug.shipped_in(version):
        assert not verdict.ok, f"{engine} {version} ships {bug.ref}, yet its case passes"
        failed = {m.check for m in verdict.mismatches}
        assert not bug.checks or failed <= set(bug.checks), (failed, bug.checks)
    else:
        assert verdict.ok, f"{engine} {version} has {bug.ref}'s fix: {verdict}"
