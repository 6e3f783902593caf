"""Strategies: only valid batches, and every scenario class reached often enough."""

from __future__ import annotations

from collections import Counter

from attnfuzz.reference.batch import build_common_metadata
from attnfuzz.reference.invariants import metadata_violations, violations
from attnfuzz.strategies.batches import PRODUCTION, cases, scenario_labels
from hypothesis import HealthCheck, given, settings

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
    "padding_requests": 0.01,
    "sum(d)!=N_d": 0.01,
    "B*L!=N_d": 0.03,
    "at_max_num_seqs": 0.05,
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
