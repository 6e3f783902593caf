"""Assertions for test suites: an implementation passes, a mutant is caught.

Each mutant's hand-derived smallest case (:attr:`Implementation.smallest`) is
always judged, as a Hypothesis explicit example (``@example``): in
:func:`assert_passes` every mutant's smallest case of the target the
implementation can run must pass, and :func:`assert_detected` first asserts
that the mutant fails its own.
"""

from __future__ import annotations

import os
from typing import Any

from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import RunResult, fuzz
from attnfuzz.harness.target import Implementation, InvalidCase, Target
from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.invariants import violations


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


def smallest_cases(target: Target, impl: Implementation) -> list[Case]:
    """The smallest case of each of ``target``'s mutants that has one, in
    registration order, except those ``impl`` was never meant to run (outside
    the engine values it fixes)."""
    out = []
    for mutant in target.implementations.values():
        if mutant.kind != "mutant" or mutant.smallest is None:
            continue
        case = mutant.smallest()
        try:
            target.refuse_unfixed(impl, case)
        except InvalidCase:
            continue  # e.g. a mutant's case of another top-k than ``impl`` is built for
        out.append(case)
    return out


def assert_passes(target: str, impl: str, max_examples: int = 300, seed: int = 0) -> RunResult:
    """Every mutant's smallest case (explicit examples) and a derandomized run of
    ``max_examples`` generated cases find nothing."""
    t = get_target(target)
    i = t.resolve(impl)
    explicit = smallest_cases(t, i)
    result = fuzz(t, i, max_examples=max_examples, rng_seed=seed, database=None, examples=explicit)
    assert not result.failed, f"{target}/{impl} failed on {result.case}:\n{result.verdict}"
    assert result.examples >= max_examples + len(explicit), f"only {result.examples} examples ran"
    return result


def assert_detected(target: str, mutant: str, seed: int = 0, max_examples: int = 1000) -> RunResult:
    """The mutant fails its smallest case (an explicit example), and a
    derandomized run without it finds the mutant, its minimized case meeting
    the bug's trigger."""
    t = get_target(target)
    impl = t.resolve(mutant)
    smallest = impl.smallest() if impl.smallest is not None else None
    # A case the installed engine runs through other code is not the mutant's there.
    if smallest is not None and (impl.declines is None or impl.declines(smallest) is None):
        # Generation is asked for one case only: the explicit example fails first and ends the run.
        alone = fuzz(t, impl, max_examples=1, rng_seed=seed, database=None, examples=[smallest])
        assert alone.failed and alone.case == smallest and alone.examples == 1, (
            f"{target}/{mutant} passes its smallest case {smallest}"
        )
    result = fuzz(t, impl, max_examples=max_examples, rng_seed=seed, database=None)
    assert result.failed, f"{target}/{mutant} survived {result.examples} examples"
    assert result.case is not None
    if impl.trigger is not None:
        assert impl.trigger(result.case), f"minimized case misses the trigger: {result.case}"
    return result
