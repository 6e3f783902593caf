"""The bug zoo: counts, detection, survivors and the ``attnfuzz zoo`` command.

The target here is ``mtp-seq-lens`` (cheap to judge), copied with a recorder
of every case it builds inputs for: the hand counts below are taken over what
the target actually judged, not over what the zoo says it judged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
from attnfuzz.harness import registry
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import DEFAULT_MIN_EXAMPLES, INCOMPLETE
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.testing import hand_case
from attnfuzz.harness.zoo import (
    CaseSize,
    MutantScore,
    SeedRun,
    exit_status,
    run_arm,
    score_mutant,
    size_gap,
)
from attnfuzz.reference.batch import Case

BASE = "mtp-seq-lens"
MUTANT = "pr42135-noclamp"  # found within a few dozen examples


def reach(case: Case) -> bool:
    return case.config.next_n > 1


def trigger(case: Case) -> bool:
    return case.batch.num_reqs >= 2


def recording_target(*extra: Implementation, delay: float = 0.0) -> tuple[Target, list[Case]]:
    """A copy of ``mtp-seq-lens`` that records each case it judges; mutants as given.
    ``delay`` seconds more per case: a machine as loaded as we like."""
    base = registry.get_target(BASE)
    judged: list[Case] = []

    def make_inputs(case, device):
        judged.append(case)
        time.sleep(delay)
        return base.make_inputs(case, device)

    impls = {n: i for n, i in base.implementations.items() if i.kind != "mutant"}
    impls |= {i.name: i for i in extra}
    target = dataclasses.replace(base, name="zoo-check", make_inputs=make_inputs)
    target.implementations = impls
    return target, judged


def counted_mutant() -> Implementation:
    real = registry.get_target(BASE).implementations[MUTANT]
    return dataclasses.replace(real, name="counted", reach=reach, trigger=trigger)


def correct_as_mutant(source: str = "triton") -> Implementation:
    """The fixed implementation (or the reference: faster) declared a mutant: nothing
    can detect it."""
    fixed = registry.get_target(BASE).implementations[source]
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


def use_only(monkeypatch, target: Target) -> None:
    """The zoo sees ``target`` alone."""
    monkeypatch.setattr(registry, "target_names", lambda: [target.name])
    monkeypatch.setattr(registry, "get_target", lambda name: target)


def test_zoo_command_reports_a_survivor_and_exits_1(tmp_path, monkeypatch, capsys):
    target, _ = recording_target(correct_as_mutant(), counted_mutant())
    use_only(monkeypatch, target)
    # Counted in examples, not seconds: the correct one searches the whole floor however
    # loaded the machine; the counted mutant is caught in a few dozen examples.
    args = ["zoo", "--seeds", "1", "--max-examples", str(DEFAULT_MIN_EXAMPLES)]
    args += ["--out", str(tmp_path)]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "SURVIVED: zoo-check/correct (0/1)" in out and "| counted" in out
    doc = json.loads((tmp_path / "zoo.json").read_text())
    rows = {m["mutant"]: m for m in doc["mutants"]}
    assert rows["correct"]["status"] == "survived" and rows["correct"]["triggered"] > 0
    assert rows["counted"]["status"] == "killed" and rows["counted"]["runs"][0]["case"]
    assert rows["counted"]["smallest"] is not None  # the real mutant's hand-derived trigger
    assert "zoo-check | correct" in (tmp_path / "zoo.md").read_text()
    assert "smallest by hand: the smallest trigger" in (tmp_path / "zoo.md").read_text()
    # Only the detected mutant: every mutant killed, exit 0.
    target.implementations.pop("correct")
    assert main(args) == 0


def test_zoo_command_refuses_bad_arguments(tmp_path, capsys):
    assert main(["zoo", "--targets", "no-such-target", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit) as refused:  # a duration > 0, refused as it is parsed
        main(["zoo", "--budget", "0", "--out", str(tmp_path)])
    assert refused.value.code == 2
    assert "expected a positive duration" in capsys.readouterr().err
    assert not (tmp_path / "zoo.json").exists()


# -- the example floor: survived, or incomplete -----------------------------------------


def test_a_miss_survives_only_at_the_floor_and_a_detection_counts_at_any_count():
    floor = DEFAULT_MIN_EXAMPLES
    hit = SeedRun(0, 1, 0.01, True, min_examples=floor)  # caught at example 1
    missed = SeedRun(1, floor, 9.0, False, cut_by="time budget", budget_s=10, min_examples=floor)
    cut = dataclasses.replace(missed, seed=2, examples=120)
    capped = dataclasses.replace(missed, seed=3, examples=120, cut_by=None)  # ended at its cap
    assert [r.verdict for r in (hit, missed, cut, capped)] == [
        "caught", "survived", INCOMPLETE, "survived",
    ]  # fmt: skip
    assert cut.why_incomplete() == f"120 of {floor} examples in the 10 s budget"
    assert cut.to_dict()["verdict"] == INCOMPLETE and missed.to_dict()["incomplete"] is None

    def score(*runs: SeedRun) -> MutantScore:
        return MutantScore("t", "m", "attnfuzz", 10.0, list(runs))

    assert score(hit).status == "killed"
    assert score(hit, cut).status == INCOMPLETE  # no verdict: neither killed nor survived
    assert score(hit, cut).row()[-1] == f"{INCOMPLETE} (seed 2: {cut.why_incomplete()})"
    assert score(cut, missed).status == "survived"  # one real survivor is enough
    assert score(hit, capped).status == "survived"
    # The exit status: a survivor (1) wins over an incomplete mutant (3) over all killed (0).
    assert exit_status([score(hit)]) == 0
    assert exit_status([score(hit), score(hit, cut)]) == 3
    assert exit_status([score(hit, cut), score(cut, missed)]) == 1
    baseline = dataclasses.replace(score(cut, missed), arm="naive-random")
    assert exit_status([score(hit), baseline]) == 0  # only the attnfuzz arm decides


def test_a_seed_is_complete_at_its_cap_or_at_the_end_of_a_finite_arm():
    impl = correct_as_mutant()
    target, judged = recording_target(impl)
    score = score_mutant(target, impl, "attnfuzz", 1, None, max_examples=30, min_examples=10**6)
    (run,) = score.runs
    assert run.examples == len(judged) == 30 and run.min_examples == 30  # floor <= the cap
    assert run.verdict == "survived" and score.status == "survived"
    score = score_mutant(target, impl, "grid", 1, 60, min_examples=10**6)
    assert score.runs[0].cut_by is None and score.status == "survived"  # the grid ran out


def test_a_budget_too_short_for_the_floor_is_incomplete_not_survived(tmp_path, monkeypatch, capsys):
    """The loaded machine of the bug report: a correct implementation declared a
    mutant, judged slowly, in a budget far too short for the default floor."""
    target, judged = recording_target(correct_as_mutant(), delay=0.02)  # <= 25 in 0.5 s
    use_only(monkeypatch, target)
    args = ["zoo", "--seeds", "2", "--budget", "0.5", "--out", str(tmp_path)]
    assert main(args) == 3
    out = capsys.readouterr().out
    assert "SURVIVED" not in out and "survived" not in out
    doc = json.loads((tmp_path / "zoo.json").read_text())
    assert doc["verdict"] == INCOMPLETE and doc["min_examples"] == DEFAULT_MIN_EXAMPLES
    (row,) = doc["mutants"]
    assert row["status"] == INCOMPLETE and row["detected"] == 0 and row["incomplete_seeds"] == 2
    reasons = []
    for run in row["runs"]:
        assert run["verdict"] == INCOMPLETE and run["cut_by"] == "time budget"
        assert 0 < run["examples"] < DEFAULT_MIN_EXAMPLES
        assert run["incomplete"] == (
            f"{run['examples']} of {DEFAULT_MIN_EXAMPLES} examples in the 0.5 s budget"
        )
        reasons.append(f"seed {run['seed']}: {run['incomplete']}")
    assert sum(r["examples"] for r in row["runs"]) <= len(judged)  # + the warm-up's
    line = f"{INCOMPLETE}: zoo-check/correct (0/2 detected; {'; '.join(reasons)})"
    assert line in out.splitlines()
    table = (tmp_path / "zoo.md").read_text()
    assert f"| {INCOMPLETE} (seed 0: {row['runs'][0]['incomplete']}; seed 1:" in table
    assert line in table and "floor 200 examples" in table


@pytest.mark.slow
def test_counted_in_examples_two_zoos_print_the_same_scoreboard(tmp_path, monkeypatch, capsys):
    """``--max-examples`` and no ``--budget``: every seed judges exactly its examples
    (fewer when detected: at any count, below the floor too), so the scoreboard, wall
    clock left out, is the same run after run."""
    target, _ = recording_target(correct_as_mutant("reference"), counted_mutant())
    use_only(monkeypatch, target)
    boards, docs = [], []
    for run in ("first", "second"):
        args = ["zoo", "--max-examples", "300", "--seeds", "2", "--out", str(tmp_path / run)]
        assert main(args) == 1  # the correct one survives 300 examples: a real survivor
        out = capsys.readouterr().out
        boards.append(out[out.index("| target") : out.index("\nwritten to")])
        docs.append(json.loads((tmp_path / run / "zoo.json").read_text()))
    assert boards[0] == boards[1]
    assert "median s" not in boards[0] and "median ex" in boards[0]
    for doc in docs:
        assert doc["budget_s"] is None and doc["max_examples"] == 300
    rows = {m["mutant"]: m for m in docs[0]["mutants"]}
    assert [r["examples"] for r in rows["correct"]["runs"]] == [300, 300]
    assert rows["correct"]["status"] == "survived"
    assert rows["counted"]["status"] == "killed"
    assert all(r["examples"] < DEFAULT_MIN_EXAMPLES for r in rows["counted"]["runs"])
    md = [(tmp_path / run / "zoo.md").read_text() for run in ("first", "second")]
    assert md[0] == md[1].replace("second", "first")


def test_the_floor_comes_from_the_command_line_or_the_project():
    from attnfuzz.harness.cli.dispatch import build_parser

    for command in ("zoo", "campaign"):
        assert build_parser().parse_args([command]).min_examples == DEFAULT_MIN_EXAMPLES
        project = build_parser({"min_examples": 7})
        assert project.parse_args([command]).min_examples == 7
        assert project.parse_args([command, "--min-examples", "0"]).min_examples == 0


def test_the_scoreboard_says_what_each_column_counts():
    """Under the table, wherever it is shown (console, zoo.md): every column past the
    names is explained (reached 67/126, smallest by hand, gap len -56 read alone)."""
    from attnfuzz.harness.zoo import COLUMNS
    from attnfuzz.harness.zoo.report import LEGEND

    counted = [c for c in COLUMNS if c not in ("target", "mutant", "arm", "status")]
    for column in counted:
        assert column.split()[0] in LEGEND, column
    for field in ("req", "tok", "len"):
        assert f"{field} " in LEGEND
