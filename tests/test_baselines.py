"""Baselines: naive random and the tidy grid produce only valid cases, of the promised kinds."""

from __future__ import annotations

import random
from collections import Counter

from attnfuzz.reference.batch import build_common_metadata, split_decodes_and_prefills
from attnfuzz.reference.invariants import violations
from attnfuzz.strategies.baselines import grid_cases, naive_random_case, naive_random_cases
from attnfuzz.strategies.batches import SMALL, Scale, scenario_labels

PARAMS = {"window": (1, 3), "q_block_log2": (0, 5)}


def take(n: int, seed: int = 0, scale: Scale = SMALL, params=None) -> list:
    stream = naive_random_cases(random.Random(seed), scale, params)
    return [next(stream) for _ in range(n)]


def test_naive_random_cases_are_valid_and_cover_the_ranges():
    cases = take(400, params=PARAMS)
    for case in cases:
        assert violations(case.config, case.batch) == [], case
        assert [name for name, _ in case.params] == sorted(PARAMS)
    next_ns = Counter(c.config.next_n for c in cases)
    assert set(next_ns) == {1, 2, 3, 4}
    for name, (lo, hi) in PARAMS.items():
        assert {c.param(name) for c in cases} == set(range(lo, hi + 1))
    assert {c.batch.use_cudagraph for c in cases} == {True, False}
    assert max(c.config.max_model_len for c in cases) <= SMALL.max_model_len


def test_naive_random_orders_decodes_first_and_keeps_uniform_lengths():
    for case in take(200, seed=3):
        is_decode = [q <= case.config.threshold for q in case.batch.q_lens]
        assert is_decode == sorted(is_decode, reverse=True), case.batch.q_lens
    # Uniform query lengths: prefills (q > next_n) dominate, nothing steers towards decodes.
    labels = Counter(label for case in take(400, seed=4) for label in scenario_labels(case))
    assert labels["all_prefill"] > 0.5 * 400


def test_naive_random_is_reproducible_from_its_seed():
    assert take(30, seed=7, params=PARAMS) == take(30, seed=7, params=PARAMS)
    assert take(30, seed=7) != take(30, seed=8)
    assert naive_random_case(random.Random(1)) == take(1, seed=1)[0]


def test_grid_is_valid_tidy_and_covers_decode_prefill_and_mixed():
    cases = grid_cases(SMALL, PARAMS)
    shapes: dict[int, set[str]] = {}
    for case in cases:
        config, batch = case.config, case.batch
        assert violations(config, batch) == [], case
        assert dict(case.params) == {name: lo for name, (lo, _) in PARAMS.items()}
        meta = build_common_metadata(config, batch)
        # Unpadded: no padding request or token reaches the metadata.
        assert (meta.num_reqs, meta.num_actual_tokens) == (batch.num_reqs, sum(batch.q_lens))
        split = split_decodes_and_prefills(meta, config.threshold)
        assert all(d == config.next_n for d in split.decode_lens), batch.q_lens
        assert split.num_decodes * config.next_n == split.num_decode_tokens
        labels = set(scenario_labels(case))
        assert not labels & {"requires_padding", "ragged_decode", "sum(d)!=N_d", "B*L!=N_d"}
        shapes.setdefault(config.next_n, set()).update(
            labels & {"all_decode", "all_prefill", "mixed"}
        )
    assert shapes == {n: {"all_decode", "all_prefill", "mixed"} for n in (1, 2, 3, 4)}
    # Decode steps replayed in a graph run at a captured size; the others run eagerly.
    for case in cases:
        if "uniform_decode" in scenario_labels(case) and case.batch.use_cudagraph:
            assert sum(case.batch.q_lens) in case.config.cudagraph_capture_sizes


def test_grid_seed_moves_only_the_data_seeds():
    a, b = grid_cases(SMALL, seed=0), grid_cases(SMALL, seed=1)
    assert len(a) == len(b) and [c.batch.seed for c in a] != [c.batch.seed for c in b]
    strip = lambda cs: [(c.config, c.batch.q_lens, c.batch.num_computed_tokens) for c in cs]  # noqa: E731
    assert strip(a) == strip(b)


def test_baselines_respect_a_smaller_scale():
    tiny = Scale(max_model_len=32, max_num_seqs=2, max_num_batched_tokens=16, topk=2)
    grid = grid_cases(tiny)
    assert grid and all(violations(c.config, c.batch) == [] for c in grid)
    for case in grid + take(100, scale=tiny):
        assert case.config.max_model_len <= 32 and case.config.max_num_seqs <= 2
        assert case.config.topk <= 2 and sum(case.batch.q_lens) <= 16
