"""Strategies: only valid batches, and every scenario class reached often enough."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.testing import nightly_seeds
from attnfuzz.reference.batch import build_common_metadata
from attnfuzz.reference.invariants import metadata_violations, violations
from attnfuzz.strategies.batches import PRODUCTION, cases, scenario_labels
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 1000

# Each class with the least share of examples it must keep (measured shares are
# 2-10x these; a strategy change that starves one fails here, not in the field).
REQUIRED = {
    "next_n=1": 0.05,
    "next_n=2": 0.05,
    "next_n=3": 0.05,
    "next_n=4": 0.05,
    "requires_padding": 0.03,
    "ragged_decode": 0.03,
    "max_decode_len<next_n": 0.03,
    "fewer_drafts": 0.03,
    "all_decode": 0.05,
    "all_prefill": 0.05,
    "mixed": 0.05,
    "prefills_follow_decodes": 0.05,
    "uniform_decode": 0.05,
    "padded": 0.02,
    # The runner's steps (reference.runner): each runtime mode, and the padded steps
    # the runner builds beyond uniform decodes of next_n > 1.
    "mode=NONE": 0.05,
    "mode=PIECEWISE": 0.05,
    "mode=FULL": 0.05,
    "cudagraph_mode=NONE": 0.05,
    "cudagraph_mode=PIECEWISE": 0.05,
    "cudagraph_mode=FULL_DECODE_ONLY": 0.05,
    "cudagraph_mode=FULL_AND_PIECEWISE": 0.05,
    "cudagraph_mode=FULL": 0.05,
    "padded_next_n=1": 0.02,
    "padded_mixed": 0.005,
    "padded_ragged_decode": 0.005,
    "padded_slot_mapping": 0.02,
    "dp": 0.05,
    "dp_padded": 0.002,
    "padding_requests": 0.01,
    "sum(d)!=N_d": 0.01,
    "B*L!=N_d": 0.03,
    "at_max_num_seqs": 0.05,
    # Request counts at a tile boundary of the kernels (TILE_BOUNDARIES), and a graph's
    # padding past one the real count is under: 0.0% each before they were drawn.
    "at_tile_boundary": 0.005,
    "padded_past_tile": 0.005,
    "at_max_num_batched_tokens": 0.03,
    "max_num_batched_tokens<max_model_len": 0.05,
    "max_num_batched_tokens>=max_model_len": 0.05,
}


def collect(strategy, n: int) -> tuple[Counter, int]:
    labels: Counter = Counter()
    seen = [0]

    @settings(
        max_examples=n, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(strategy)
    def draw(case):
        assert violations(case.config, case.batch) == [], case
        meta = build_common_metadata(case.config, case.batch)
        assert metadata_violations(case.config, case.batch, meta) == [], case
        labels.update(scenario_labels(case))
        seen[0] += 1

    draw()
    return labels, seen[0]


def test_default_strategy_is_valid_small_and_reaches_every_scenario_class():
    labels, n = collect(cases(), EXAMPLES)
    assert n == EXAMPLES
    shares = {k: labels[k] / n for k in REQUIRED}
    starved = {k: round(v, 3) for k, v in shares.items() if v < REQUIRED[k]}
    assert not starved, f"scenario classes below their share: {starved}"


def test_default_sizes_stay_small():
    @settings(max_examples=300, derandomize=True, database=None, deadline=None)
    @given(cases())
    def small(case):
        assert case.config.topk <= 16 and case.config.max_model_len <= 256

    small()


def test_production_scale_is_a_setting_of_the_same_strategy():
    labels, n = collect(cases(PRODUCTION), 100)
    assert n == 100 and labels["next_n>1"] > 0


def test_fixed_fields_are_drawn_as_their_values_above_the_scales_limits():
    """``fixes`` wins over the scale (topk=512 at SMALL, whose topk is 16); the
    other fields still vary, and every case stays one the engine can produce."""
    from attnfuzz.strategies.batches import SMALL

    fixes = {"topk": 512, "next_n": 1}
    lengths: set[int] = set()

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(cases(SMALL, None, fixes))
    def draw(case):
        assert case.config.topk == 512 and case.config.next_n == 1, case
        assert violations(case.config, case.batch) == [], case
        lengths.add(case.config.max_model_len)

    draw()
    assert len(lengths) > 1  # unfixed fields are still drawn
    heads: set[int] = set()

    @settings(max_examples=100, derandomize=True, database=None, deadline=None)
    @given(cases(PRODUCTION, None, {"next_n": 3, "max_num_batched_tokens": 5}))
    def production(case):
        assert case.config.next_n == 3 and case.config.max_num_batched_tokens == 5, case
        assert violations(case.config, case.batch) == [], case
        heads.add(case.config.num_heads)

    production()
    assert len(heads) > 1  # unfixed fields are still drawn


def test_fixes_that_no_config_can_meet_are_refused():
    import pytest
    from attnfuzz.strategies.batches import engine_configs, fixes_problems

    assert fixes_problems({"topk": 512, "next_n": 1}) == []
    assert "cannot fix 'num_spec'" in fixes_problems({"num_spec": 0})[0]
    assert "integer >= 1" in fixes_problems({"topk": 0})[0]
    assert "integer >= 1" in fixes_problems({"topk": True})[0]
    assert "does not fit max_model_len=2" in fixes_problems({"next_n": 3, "max_model_len": 2})[0]

    @settings(max_examples=1, database=None)
    @given(engine_configs(fixes={"seed": 1}))
    def draw(config):
        pass

    with pytest.raises(ValueError, match="cannot fix 'seed'"):
        draw()
    assert "must be one of NONE" in fixes_problems({"cudagraph_mode": "EAGER"})[0]
    assert "must be one of NONE" in fixes_problems({"cudagraph_mode": 1})[0]

    @settings(max_examples=1, database=None)
    @given(engine_configs(fixes={"cudagraph_mode": "FULL"}, supports=("UNIFORM_BATCH",)))
    def full_without_an_always_backend(config):
        pass

    with pytest.raises(ValueError, match="keeps cudagraph_mode=FULL"):
        full_without_an_always_backend()


def test_a_fixed_cudagraph_mode_is_the_only_one_drawn_and_its_steps_are_never_padded():
    """An engine platform without CUDA graphs (vLLM's CPU platform) fixes NONE: every
    step runs eagerly and unpadded, whatever the capture sizes; the baselines too."""
    import random

    from attnfuzz.reference.runner import step_plan
    from attnfuzz.strategies.baselines import grid_cases, naive_random_cases

    fixes = {"cudagraph_mode": "NONE"}
    seen: list = []

    @settings(max_examples=200, derandomize=True, database=None, deadline=None)
    @given(cases(fixes=fixes))
    def draw(case):
        assert case.config.cudagraph_mode == "NONE", case
        assert step_plan(case.config, case.batch).mode == "NONE", case
        assert violations(case.config, case.batch) == [], case
        seen.append(case.config.cg_support)

    draw()
    assert len(set(seen)) > 1  # the backend's support is still drawn
    stream = naive_random_cases(random.Random(1), fixes=fixes)
    for case in [next(stream) for _ in range(50)] + grid_cases(fixes=fixes):
        assert case.config.cudagraph_mode == "NONE", case


def test_no_fixes_draw_and_shrink_exactly_as_before():
    """Saved corpora and derandomized seeds replay unchanged for implementations
    without fixes: the same draws, and the same minimal case for a property."""
    from attnfuzz.reference.batch import Batch, Case, EngineConfig
    from hypothesis import find

    def drawn(strategy) -> list:
        out = []

        @settings(max_examples=100, derandomize=True, database=None, deadline=None)
        @given(strategy)
        def draw(case):
            out.append(case)

        draw()
        return out

    assert drawn(cases()) == drawn(cases(fixes={}))
    minimal = find(
        cases(),
        lambda c: c.config.next_n > 2 and c.batch.num_reqs > 3 and c.config.topk > 5,
        settings=settings(derandomize=True, database=None, max_examples=2000),
    )
    config = EngineConfig(
        max_model_len=8, max_num_seqs=4, max_num_batched_tokens=12, block_size=1, num_spec=2,
        cudagraph_capture_sizes=(3, 12), topk=6, num_heads=1, head_dim=1,
        cudagraph_mode="FULL", cg_support="ALWAYS",
    )  # fmt: skip
    assert minimal == Case(config, Batch((0, 0, 0, 0), (3, 3, 3, 3), seed=0, use_cudagraph=True))


def test_the_baselines_honour_fixes_and_draw_as_before_without_them():
    """The zoo's baselines give an implementation with fixes only cases it
    accepts; without fixes their stream of draws is the one saved runs used."""
    import random

    from attnfuzz.strategies.baselines import grid_cases, naive_random_cases

    fixes = {"topk": 512, "next_n": 1}
    stream = naive_random_cases(random.Random(1), params={"w": (0, 3)}, fixes=fixes)
    drawn = [next(stream) for _ in range(100)]
    grid = grid_cases(fixes=fixes)
    for case in drawn + grid:
        assert case.config.topk == 512 and case.config.next_n == 1, case
        assert violations(case.config, case.batch) == [], case
    assert len({c.config.max_model_len for c in drawn}) > 1 and len(grid) > 1
    plain, empty = (
        naive_random_cases(random.Random(5)),
        naive_random_cases(random.Random(5), fixes={}),
    )
    assert [next(plain) for _ in range(50)] == [next(empty) for _ in range(50)]
    assert {c.config.next_n for c in grid_cases()} == {1, 2, 3, 4}


def test_attnfuzz_s_own_files_are_never_hypothesis_local_constants(tmp_path):
    """From a checkout, attnfuzz's modules would count as local code whose literals
    Hypothesis mixes into draws: a seed's cases would depend on which of them a
    process imported. They never count; a user's own module still does."""
    import attnfuzz.strategies.batches as batches
    from hypothesis.internal.conjecture import providers

    assert not providers.is_local_module_file(batches.__file__)
    assert not providers.is_local_module_file(providers.__file__)  # site-packages, as ever
    mine = tmp_path / "my_impl.py"
    mine.write_text("X = 12345\n")
    assert providers.is_local_module_file(str(mine))


@settings(max_examples=100, derandomize=True, database=None, deadline=None)
@given(
    st.sampled_from(target_names()).flatmap(
        lambda name: st.tuples(st.just(name), get_target(name).cases())
    )
)
def test_drawn_cases_are_first_steps_of_a_new_engine(drawn):
    """A drawn case is judged on its own, by a new engine: every target's strategy
    draws only cases the judge takes as that engine's first step (``alone``)."""
    name, case = drawn
    get_target(name).refuse_invalid(case, alone=True)


# -- tile boundaries (issue 40, point 3) ----------------------------------------------


def test_tile_boundaries_are_where_attnfuzz_s_kernels_change_their_row_tile():
    from attnfuzz.kernels._triton import block
    from attnfuzz.strategies.batches import TILE_BOUNDARIES

    for b in TILE_BOUNDARIES:
        assert block(b) == b < block(b + 1), b


def test_request_counts_at_tile_boundaries_are_drawn_only_where_the_range_reaches_one():
    from attnfuzz.strategies.batches import tile_edges

    assert tile_edges(1, 14) == []  # a range below every boundary draws as before
    assert tile_edges(1, 16) == [15, 16]
    assert tile_edges(15, 40) == [15, 16, 17, 31, 32, 33]


@pytest.mark.parametrize("seed", [0, *nightly_seeds()])
def test_a_consumer_tiled_by_the_real_request_count_is_found(seed, monkeypatch):
    """``boundary_impls:real_rows_tile`` leaves the padding rows past a tile sized by the
    real request count unwritten: only a graph that pads a step past a tile boundary its
    real count is under shows it. Not found within 1000 examples at seeds 0-2 before
    configs straddled a boundary (max_num_seqs stayed <= 16)."""
    from attnfuzz.harness.runner import fuzz

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    target = get_target("max-seq-len")
    impl = target.resolve("boundary_impls:real_rows_tile")
    result = fuzz(target, impl, max_examples=1000, rng_seed=seed, database=None)
    assert result.failed and result.examples_to_failure <= 1000
    meta = build_common_metadata(result.case.config, result.case.batch)
    assert meta.num_real_reqs <= 16 < meta.num_reqs  # padded past the tile
