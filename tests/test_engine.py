"""The one fuzz engine: settings factory, databases, corpus key, guided search, explicit examples.

Nothing here runs a kernel: each search judges through a stand-in ``judge``
(the real :meth:`Target.judge` is the per-target tests' business), and
nothing reaches the network (the GitHub artifact is never fetched).
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from attnfuzz.harness import engine, registry
from attnfuzz.harness.campaign.worker import run_item
from attnfuzz.harness.database import check_database, database_spec, open_database
from attnfuzz.harness.engine import Finding, corpus_key, finding_class, fuzz_test
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.settings import PROFILES, fuzz_settings
from attnfuzz.harness.testing import smallest_cases
from attnfuzz.reference.batch import Case
from hypothesis import Phase, seed, settings
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    GitHubArtifactDatabase,
    InMemoryExampleDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

TARGET = "mtp-seq-lens"


def _failing(case: Case) -> Verdict:
    return Verdict([Mismatch("values", "stand-in", "1", "0")])


def _append_to(cases: list[Case]):
    return lambda case, verdict: cases.append(case)


def _guided_target(*names: str):
    """A copy of a registered target whose ``guided`` statistics are ``names``."""
    target = copy.copy(get_target(TARGET))
    target.guided = names  # type: ignore[attr-defined]
    return target


# -- corpus key ---------------------------------------------------------------------


def test_corpus_key_names_only_target_and_implementation():
    """The bytes saved corpora are filed under: changing them orphans every database."""
    assert corpus_key("mtp-seq-lens", "triton") == b"attnfuzz.campaign/mtp-seq-lens/triton"


def test_a_failure_is_saved_under_the_corpus_key(tmp_path):
    db = DirectoryBasedExampleDatabase(tmp_path / "db")
    target = get_target(TARGET)
    impl = target.resolve("triton")
    test = fuzz_test(
        target, impl, settings=fuzz_settings(max_examples=5, database=db), judge=_failing
    )
    with pytest.raises(Finding):
        test()
    assert list(db.fetch(corpus_key(TARGET, "triton")))


# -- databases ----------------------------------------------------------------------


def test_a_directory_and_none():
    assert open_database(None) is None
    db = InMemoryExampleDatabase()
    assert open_database(db) is db
    assert isinstance(open_database("some/dir"), DirectoryBasedExampleDatabase)


def test_github_alone_is_read_only_with_the_nightly_artifact_by_default():
    db = open_database("github:owner/repo")
    assert isinstance(db, ReadOnlyDatabase)
    shared = db._wrapped
    assert isinstance(shared, GitHubArtifactDatabase)
    assert (shared.owner, shared.repo, shared.artifact_name) == ("owner", "repo", "attnfuzz-db")
    assert open_database("github:owner/repo/other")._wrapped.artifact_name == "other"


def test_a_directory_plus_github_saves_only_to_the_directory(tmp_path):
    local_dir = tmp_path / "db"
    db = open_database(f"{local_dir}+github:owner/repo/nightly")
    assert isinstance(db, MultiplexedDatabase)
    local, shared = db._wrapped
    assert isinstance(local, DirectoryBasedExampleDatabase)
    assert isinstance(shared, ReadOnlyDatabase)
    assert isinstance(shared._wrapped, GitHubArtifactDatabase)
    # The download is cached beside the local corpus, not in a temporary home.
    assert Path(shared._wrapped.path) == local_dir / ".github-artifacts" / "nightly"
    db.save(b"key", b"value")
    assert list(DirectoryBasedExampleDatabase(local_dir).fetch(b"key")) == [b"value"]
    assert not shared._wrapped._initialized  # nothing was fetched, nothing was written there


def test_redis_plus_github():
    pytest.importorskip("redis")
    from hypothesis.extra.redis import RedisExampleDatabase

    db = open_database("redis://127.0.0.1:1/0+github:owner/repo")  # connects only when used
    local, shared = db._wrapped
    assert isinstance(local, RedisExampleDatabase)
    assert isinstance(shared, ReadOnlyDatabase)


@pytest.mark.parametrize(
    "spec",
    ["github:owner", "github:owner/repo/a/b", "github:own er/repo", "+github:o/r", "d+github:"],
)
def test_malformed_github_specs_are_usage_errors(spec):
    with pytest.raises(UsageError, match="github"):
        open_database(spec)
    with pytest.raises(UsageError):
        database_spec(spec)


def test_the_local_part_is_resolved_and_checked_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert database_spec("db+github:o/r") == f"{tmp_path / 'db'}+github:o/r"
    assert database_spec("github:o/r") == "github:o/r"
    check_database(database_spec("db+github:o/r"))  # writable: no error, no network
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        check_database(database_spec("file+github:o/r"))


# -- settings -----------------------------------------------------------------------


def test_settings_inherit_the_active_profile_and_add_what_the_search_needs():
    settings.register_profile(
        "attnfuzz-test-engine", max_examples=7, deadline=1000, print_blob=True
    )
    previous = settings.get_current_profile_name()
    settings.load_profile("attnfuzz-test-engine")
    try:
        s = fuzz_settings()
    finally:
        settings.load_profile(previous)
    assert (s.max_examples, s.print_blob) == (7, True)  # the profile's
    assert s.deadline is None and len(s.suppress_health_check) > 0
    assert Phase.target in s.phases and Phase.explain not in s.phases
    assert Phase.reuse in s.phases and Phase.shrink in s.phases


def test_settings_values_given_win():
    parent = settings(max_examples=3, phases=[Phase.generate])
    s = fuzz_settings(parent, max_examples=9, database=None, reuse=False, shrink=False)
    assert s.max_examples == 9 and s.database is None
    assert set(s.phases) == {Phase.generate, Phase.target}
    assert fuzz_settings(database="some/dir").database == DirectoryBasedExampleDatabase("some/dir")


def test_campaign_profiles_come_from_the_factory():
    for profile in PROFILES.values():
        s = settings.get_profile(profile.hypothesis_profile)
        assert s.deadline is None and s.report_multiple_bugs and s.database is None
        assert s.derandomize == profile.derandomized and Phase.target in s.phases


# -- the search loop ----------------------------------------------------------------


def test_guided_statistics_feed_hypothesis_target(monkeypatch):
    """Each guided statistic present in a verdict is one hypothesis.target observation,
    under its own label; statistics not guided are not."""
    calls: list[tuple[float, str]] = []
    real = engine.guide

    def spy(observation: float, *, label: str = "") -> float:
        calls.append((observation, label))
        return real(observation, label=label)

    monkeypatch.setattr(engine, "guide", spy)
    target = _guided_target("closeness", "absent")

    def judge(case: Case) -> Verdict:
        return Verdict(statistics={"closeness": case.batch.num_reqs, "other": 1})

    s = fuzz_settings(max_examples=20, database=None)
    assert Phase.target in s.phases
    seen: list[Case] = []
    test = fuzz_test(
        target,
        target.resolve("triton"),
        settings=s,
        judge=judge,
        on_case=lambda case, verdict, labels: seen.append(case),
    )
    seed(0)(test)()
    assert calls == [(float(c.batch.num_reqs), "closeness") for c in seen]
    assert len(calls) >= 20


def test_a_registered_target_s_guided_measures_reach_hypothesis_target(monkeypatch):
    """Through the real judge: every case observes exactly the target's guided names."""
    labels: list[str] = []
    monkeypatch.setattr(engine, "guide", lambda observation, label="": labels.append(label))
    target = get_target("decode-split")
    assert target.guided, "the target guides nothing: pick another for this test"
    result = fuzz(target, target.resolve("triton"), max_examples=10, rng_seed=0, database=None)
    assert labels == list(target.guided) * result.examples


def test_an_unguided_target_observes_nothing(monkeypatch):
    calls: list[float] = []
    monkeypatch.setattr(engine, "guide", lambda observation, label="": calls.append(observation))
    target = _guided_target()
    s = fuzz_settings(max_examples=5, database=None)
    test = fuzz_test(
        target, target.resolve("triton"), settings=s, judge=lambda c: Verdict(statistics={"x": 1})
    )
    seed(0)(test)()
    assert calls == []


def test_a_failure_raises_the_finding_of_its_key_with_the_shrunk_case():
    target = get_target(TARGET)
    s = fuzz_settings(max_examples=50, database=None, report_multiple_bugs=False)
    test = fuzz_test(target, target.resolve("triton"), settings=s, judge=_failing)
    with pytest.raises(finding_class("values")) as info:
        seed(0)(test)()
    assert info.value.verdict.key == "values" and isinstance(info.value.case, Case)
    assert finding_class("values") is finding_class("values") != finding_class("timeout")
    assert issubclass(finding_class("timeout"), Finding)


def test_explicit_examples_are_judged_first_in_order():
    target = get_target(TARGET)
    impl = target.resolve("triton")
    first, second = smallest_cases(target, impl)[:2]
    seen: list[Case] = []

    def judge(case: Case) -> Verdict:
        seen.append(case)
        return Verdict()

    result = fuzz(target, impl, max_examples=3, rng_seed=0, database=None, examples=[first, second])
    assert not result.failed and result.examples == 5
    s = fuzz_settings(max_examples=3, database=None)
    test = fuzz_test(target, impl, settings=s, judge=judge, examples=[first, second])
    seed(0)(test)()
    assert seen[:2] == [first, second] and len(seen) == 5


def test_mutants_that_share_a_smallest_case_give_it_once():
    # mtp-seq-lens' re-created PR 42135 mutants and their upstream twins fail one case.
    target = get_target(TARGET)
    mutants = [i for i in target.implementations.values() if i.smallest is not None]
    wanted = [m.smallest() for m in mutants]
    assert len(wanted) > len({repr(c) for c in wanted}), "no two mutants share a case"
    cases = smallest_cases(target, target.resolve("triton"))
    assert all(c in cases for c in wanted)
    assert all(a != b for k, a in enumerate(cases) for b in cases[k + 1 :])


def test_a_failing_explicit_example_ends_the_run_unshrunk():
    target = get_target(TARGET)
    impl = target.resolve("pr42135-strided")
    smallest = impl.smallest()
    result = fuzz(target, impl, max_examples=1, rng_seed=0, database=None, examples=[smallest])
    assert result.failed and result.case == smallest and result.examples == 1


def test_run_budget_and_derandomized_seed_through_the_engine():
    """``fuzz`` on the engine: a seed replays the same cases; a budget of 0 s ends the search."""
    target = get_target(TARGET)
    impl = target.resolve("reference")
    runs: list[list[Case]] = [[], []]
    for cases in runs:
        fuzz(target, impl, max_examples=10, rng_seed=3, database=None, on_case=_append_to(cases))
    assert runs[0] == runs[1] and len(runs[0]) == 10
    result = fuzz(target, impl, max_examples=10**6, rng_seed=3, database=None, budget_s=0.0)
    assert result.stopped_by_budget and result.examples <= 2


# -- the campaign worker ------------------------------------------------------------

USER_MUTANTS = """
import attnfuzz.harness.registry as registry
from attnfuzz.harness.targets.slot_mapping import reference_impl


def first_slot_off_by_one(inputs):
    out = reference_impl(inputs)
    out.slot_mapping[0] += 1
    return out


MUTANTS = [registry.mutant("slot-mapping", "engine-test-first-slot", first_slot_off_by_one)]
"""


@pytest.fixture
def user_mutants(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module of user mutants importable from ``tmp_path``; the registry is
    rebuilt before and after, so the mutant is seen by this test only."""
    (tmp_path / "attnfuzz_test_engine_mutants.py").write_text(USER_MUTANTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.get_target.cache_clear()
    yield "attnfuzz_test_engine_mutants"
    registry.get_target.cache_clear()
    sys.modules.pop("attnfuzz_test_engine_mutants", None)


def _worker_run(scratch: Path, mutants: list[str] | None) -> dict:
    for sub in ("items", "inflight", "faults", "started"):
        (scratch / sub).mkdir(parents=True, exist_ok=True)
    item = {"id": "u0", "unit": "u0", "shard": 0, "target": "slot-mapping",
            "impl": "engine-test-first-slot", "kind": "mutant", "max_examples": 50}  # fmt: skip
    plan = {"started": time.time(), "deadline": None, "items": [item], "workers": 1,
            "example_timeout": 60, "device": "cpu", "derandomized": True, "database": None,
            "scale": "small", "profile": "ci", "seed": 0}  # fmt: skip
    if mutants is not None:
        plan["mutants"] = mutants
    return run_item(scratch, plan, item)


def test_a_campaign_worker_adds_the_plan_s_mutants_before_resolving(tmp_path, user_mutants):
    """A worker is a fresh process: the plan's ``--mutants`` specs are how it knows them."""
    with pytest.raises(UsageError, match="engine-test-first-slot"):
        _worker_run(tmp_path / "without", None)
    state = _worker_run(tmp_path / "with", [user_mutants])
    assert state["status"] == "done" and state["findings"], state
