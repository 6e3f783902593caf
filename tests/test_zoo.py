"""The bug zoo: counts, detection, survivors and the ``attnfuzz zoo`` command.

The target here is ``mtp-seq-lens`` (cheap to judge), copied with a recorder
of every case it builds inputs for: the hand counts below are taken over what
the target actually judged, not over what the zoo says it judged.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from attnfuzz.harness import registry
from attnfuzz.harness.cli import main
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.testing import hand_case
from attnfuzz.harness.zoo import CaseSize, MutantScore, SeedRun, run_arm, size_gap
from attnfuzz.reference.batch import Case

BASE = "mtp-seq-lens"
MUTANT = "pr42135-noclamp"  # found within a few dozen examples


def reach(case: Case) -> bool:
    return case.config.next_n > 1


def trigger(case: Case) -> bool:
    return case.batch.num_reqs >= 2


def recording_target(*extra: Implementation) -> tuple[Target, list[Case]]:
    """A copy of ``mtp-seq-lens`` that records each case it judges; mutants as given."""
    base = registry.get_target(BASE)
    judged: list[Case] = []

    def make_inputs(case, device):
        judged.append(case)
        return base.make_inputs(case, device)

    impls = {n: i for n, i in base.implementations.items() if i.kind != "mutant"}
    impls |= {i.name: i for i in extra}
    target = dataclasses.replace(base, name="zoo-check", make_inputs=make_inputs)
    target.implementations = impls
    return target, judged


def counted_mutant() -> Implementation:
    real = registry.get_target(BASE).implementations[MUTANT]
    return dataclasses.replace(real, name="counted", reach=reach, trigger=trigger)


def correct_as_mutant() -> Implementation:
    """The fixed implementation declared a mutant: nothing can detect it."""
    fixed = registry.get_target(BASE).implementations["triton"]
    return Implementation("correct", fixed.fn, "mutant", "not a bug", trigger, reach)


def first_failure(target: Target, impl: Implementation, cases: list[Case]) -> int:
    """Index of the first case ``impl`` fails, judged again on the registered target."""
    base = registry.get_target(BASE)
    return next(i for i, c in enumerate(cases) if not base.judge(impl, c).ok)


@pytest.mark.parametrize("arm", ["attnfuzz", "naive-random"])
def test_counts_cover_the_search_up_to_detection_and_nothing_after(arm):
    impl = counted_mutant()
    target, judged = recording_target(impl)
    run = run_arm(arm, target, impl, seed=0, budget_s=60, shrink_budget_s=60)
    assert run.detected and run.key is not None
    k = first_failure(target, impl, judged)
    search = judged[: k + 1]
    assert run.examples == k + 1
    assert run.reached == sum(c.config.num_spec >= 1 for c in search)
    assert run.triggered == sum(len(c.batch.q_lens) > 1 for c in search)
    if arm == "attnfuzz":  # shrinking ran after, and its cases are not counted
        assert run.case == judged[-1] and len(judged) > k + 1
        assert not registry.get_target(BASE).judge(impl, run.case).ok
    else:  # baselines report the first failing case as it came
        assert run.case == judged[k] and len(judged) == k + 1
    assert run.meets_trigger == trigger(run.case)


def test_a_correct_implementation_survives_with_its_counts():
    impl = correct_as_mutant()
    target, judged = recording_target(impl)
    run = run_arm("grid", target, impl, seed=0, budget_s=60)
    # The grid is finite: every case judged, none failed.
    assert not run.detected and run.case is None and run.examples == len(judged) > 0
    assert run.triggered == sum(c.batch.num_reqs > 1 for c in judged) > 0
    judged.clear()
    run = run_arm("attnfuzz", target, impl, seed=0, budget_s=60, max_examples=25)
    assert not run.detected and run.examples == len(judged) == 25
    assert run.reached == sum(c.config.num_spec > 0 for c in judged)


def test_the_grid_never_meets_a_padding_trigger():
    """Tidy batches are what hides these bugs: generation falls short, not the oracle."""
    base = registry.get_target(BASE)
    impl = base.implementations[MUTANT]
    run = run_arm("grid", base, impl, seed=0, budget_s=60)
    assert not run.detected and run.triggered == 0 and run.examples > 0


def test_budgets_end_the_search_and_the_shrinking():
    target = registry.get_target(BASE)
    seen = []
    r = fuzz(target, target.resolve("triton"), max_examples=10**9, rng_seed=0, database=None,
             budget_s=0.3, on_case=lambda case, verdict: seen.append(verdict.ok))  # fmt: skip
    assert r.stopped_by_budget and not r.failed and len(seen) == r.examples > 0 and all(seen)
    r = fuzz(target, target.resolve(MUTANT), max_examples=10**9, rng_seed=0, database=None,
             shrink_budget_s=0.0)  # fmt: skip
    # Stopped before the first shrink step: the reported case is the first failure.
    assert r.failed and r.stopped_by_budget and r.examples == r.examples_to_failure


def test_case_size_and_gap_to_the_smallest():
    small = CaseSize.of(hand_case((2, 2, 2), (3, 3, 3)))
    assert small == CaseSize(3, 6, 2, 64, ())
    assert size_gap(small, small) == "none"
    found = CaseSize.of(hand_case((2, 2, 2, 1), (3, 3, 3, 4), max_model_len=32))
    assert size_gap(found, small) == "req +1, tok +1, len -32"
    assert size_gap(CaseSize(1, 1, 1, 8, (("w", 3),)), CaseSize(1, 1, 1, 8, (("w", 1),))) == (
        "w 3 vs 1"
    )
    assert size_gap(CaseSize(1, 1, 2, 8), CaseSize(1, 1, 1, 8)) == "next_n +1"


def test_a_median_never_hides_misses():
    hit = SeedRun(0, 5, 0.5, True)
    miss = SeedRun(1, 90, 3.0, False)
    score = MutantScore("t", "m", "attnfuzz", 3.0, [hit, miss, dataclasses.replace(miss)])
    assert score.status == "survived" and score.found == 1
    assert math.isinf(score.median_seconds) and score.row()[6] == "miss"
    assert score.row()[4] == "-"  # no reach declared: never invented
    score.runs = [hit, dataclasses.replace(hit, seconds=1.5), miss]
    assert score.median_seconds == 1.5 and score.worst_seconds == math.inf
    score.runs = [hit]
    assert score.status == "killed" and score.to_dict()["worst_seconds"] == 0.5


def test_zoo_command_reports_a_survivor_and_exits_1(tmp_path, monkeypatch, capsys):
    target, _ = recording_target(correct_as_mutant(), counted_mutant())
    monkeypatch.setattr(registry, "target_names", lambda: ["zoo-check"])
    monkeypatch.setattr(registry, "get_target", lambda name: target)
    # The counted mutant is caught in a few dozen examples: 10 s holds on a loaded machine.
    args = ["zoo", "--seeds", "1", "--budget", "10", "--out", str(tmp_path)]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "SURVIVED: zoo-check/correct (0/1)" in out and "| counted" in out
    doc = json.loads((tmp_path / "zoo.json").read_text())
    rows = {m["mutant"]: m for m in doc["mutants"]}
    assert rows["correct"]["status"] == "survived" and rows["correct"]["triggered"] > 0
    assert rows["counted"]["status"] == "killed" and rows["counted"]["runs"][0]["case"]
    assert rows["counted"]["smallest"] is not None  # the real mutant's hand-derived trigger
    assert "zoo-check | correct" in (tmp_path / "zoo.md").read_text()
    # Only the detected mutant: every mutant killed, exit 0.
    target.implementations.pop("correct")
    assert main(args) == 0


def test_zoo_command_refuses_bad_arguments(tmp_path, capsys):
    assert main(["zoo", "--targets", "no-such-target", "--out", str(tmp_path)]) == 2
    assert main(["zoo", "--budget", "0", "--out", str(tmp_path)]) == 2
    assert "must be > 0" in capsys.readouterr().err
    assert not (tmp_path / "zoo.json").exists()
