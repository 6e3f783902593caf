"""Assertions for test suites: an implementation passes, a mutant is caught."""

from __future__ import annotations

from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import RunResult, fuzz


def assert_passes(target: str, impl: str, max_examples: int = 300, seed: int = 0) -> RunResult:
    """A derandomized run of ``max_examples`` cases finds nothing."""
    t = get_target(target)
    result = fuzz(t, t.resolve(impl), max_examples=max_examples, rng_seed=seed, database=None)
    assert not result.failed, f"{target}/{impl} failed on {result.case}:\n{result.verdict}"
    assert result.examples >= max_examples, f"only {result.examples} examples ran"
    return result


def assert_detected(target: str, mutant: str, seed: int = 0, max_examples: int = 1000) -> RunResult:
    """A derandomized run finds the mutant; its minimized case meets the bug's trigger."""
    t = get_target(target)
    impl = t.resolve(mutant)
    result = fuzz(t, impl, max_examples=max_examples, rng_seed=seed, database=None)
    assert result.failed, f"{target}/{mutant} survived {result.examples} examples"
    assert result.case is not None
    if impl.trigger is not None:
        assert impl.trigger(result.case), f"minimized case misses the trigger: {result.case}"
    return result
