"""Hypothesis settings: the one factory (:func:`fuzz_settings`) and the campaign profiles.

Importing this module registers each campaign profile (:data:`PROFILES`) with
Hypothesis as ``attnfuzz-<name>``; whoever needs a profile imports it here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnfuzz.harness.database import open_database
from attnfuzz.harness.definitions import PROFILE_NAMES
from hypothesis import HealthCheck, Phase
from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase


class _Inherit:
    """Marks an argument of :func:`fuzz_settings` left to the parent settings."""

    def __repr__(self) -> str:
        return "INHERIT"


INHERIT: Any = _Inherit()


def fuzz_settings(
    parent: Settings | None = None,
    *,
    max_examples: int | None = None,
    database: str | Path | ExampleDatabase | None = INHERIT,
    derandomize: bool | None = None,
    reuse: bool = True,
    shrink: bool = True,
    report_multiple_bugs: bool | None = None,
    print_blob: bool | None = None,
) -> Settings:
    """The Hypothesis settings of every attnfuzz search: the one factory.

    Each value not given is ``parent``'s (by default the active Hypothesis
    profile: a test suite's ``--hypothesis-profile``, seed and database hold).
    ``database`` is a spec for :func:`open_database`, a database, or None for none.

    Whatever the parent, the search itself requires:

    - no deadline: the first Triton call compiles, and the campaign's
      per-example timeout is its own (:mod:`attnfuzz.harness.isolation`);
    - no health check: a slow first call and the strategies' filters are expected;
    - ``Phase.target`` among the phases: the guided search that
      :func:`fuzz_test` feeds with the target's boundary statistics;
    - no ``Phase.explain``: it would judge the minimal failing case's
      neighbours after shrinking, so the last case judged would no longer be
      the minimal one (:func:`attnfuzz.harness.runner.fuzz` relies on that);
    - ``Phase.reuse`` dropped when ``reuse`` is False (the database's saved
      failures are replayed by an earlier run only), ``Phase.shrink`` when
      ``shrink`` is False.
    """
    parent = parent if parent is not None else Settings()
    phases = set(parent.phases) | {Phase.target}
    phases.discard(Phase.explain)
    if not reuse:
        phases.discard(Phase.reuse)
    if not shrink:
        phases.discard(Phase.shrink)
    given_values: dict[str, Any] = {
        "max_examples": max_examples,
        "derandomize": derandomize,
        "report_multiple_bugs": report_multiple_bugs,
        "print_blob": print_blob,
    }
    values = {name: value for name, value in given_values.items() if value is not None}
    if database is not INHERIT:
        values["database"] = open_database(database)
    return Settings(
        parent,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[p for p in Phase if p in phases],
        **values,
    )


# ---------------------------------------------------------------------------
# The campaign profiles
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """A campaign profile: Hypothesis settings plus the campaign's own defaults."""

    name: str
    derandomized: bool  # rounds seeded from --seed (default 0); no example database
    budget_s: float  # when neither --budget nor --max-examples is given
    round_examples: int  # max_examples of one Hypothesis run inside a budget
    example_timeout_s: float  # per example; the first Triton call on a GPU compiles
    description: str

    @property
    def hypothesis_profile(self) -> str:
        return f"attnfuzz-{self.name}"


PROFILES = {
    "ci": Profile("ci", True, 120.0, 200, 60.0, "derandomized: the gate for pull requests"),
    "fuzz": Profile("fuzz", False, 600.0, 2000, 60.0, "random, with the database: nightly"),
    "dev": Profile("dev", False, 60.0, 200, 30.0, "random, with the database: local work"),
}

assert tuple(PROFILES) == PROFILE_NAMES, "definitions.PROFILE_NAMES names these profiles"

for _profile in PROFILES.values():
    # Hypothesis' defaults under the engine's requirements (fuzz_settings), and
    # every distinct bug: a unit reports each failure it finds.
    Settings.register_profile(
        _profile.hypothesis_profile,
        fuzz_settings(
            Settings.get_profile("default"),
            max_examples=_profile.round_examples,
            derandomize=_profile.derandomized,
            database=None,  # chosen per campaign: see open_database
            report_multiple_bugs=True,
            print_blob=False,
        ),
    )
