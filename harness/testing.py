"""Assertions for test suites: an implementation passes, a mutant is caught."""

from __future__ import annotations

from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import RunResult, fuzz
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
