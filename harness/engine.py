"""The one fuzz engine: Hypothesis settings, example database, corpus key and search loop.

``attnfuzz run`` (:func:`attnfuzz.harness.runner.fuzz`), a campaign's workers
(:mod:`attnfuzz.harness.campaign_worker`), the zoo, the benchmarks and the
pytest plugin all search through :func:`fuzz_test`, with settings from
:func:`fuzz_settings` and a database from :func:`open_database`: Hypothesis
generates, shrinks and remembers; this module wires a target's oracle into a
property, labels scenario classes with :func:`hypothesis.event`, feeds the
target's boundary statistics to :func:`hypothesis.target` and names the corpus.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit
from zipfile import BadZipFile, ZipFile

from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference.batch import Case
from attnfuzz.strategies.batches import SMALL, Scale, scenario_labels
from hypothesis import HealthCheck, Phase, event, example, given
from hypothesis import settings as Settings
from hypothesis import target as guide
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    GitHubArtifactDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)
from hypothesis.errors import HypothesisWarning

REDIS_SCHEMES = ("redis", "rediss", "unix")
GITHUB = "github:"
# The artifact the nightly workflow uploads its example database as.
DEFAULT_ARTIFACT = "attnfuzz-db"
_GITHUB_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def corpus_key(target: str, implementation: str) -> bytes:
    """The example-database key of a target and implementation: it names only what
    is fuzzed, so saved failures survive edits of the harness and are shared by
    ``attnfuzz run``, ``attnfuzz campaign`` and the pytest plugin."""
    return f"attnfuzz.campaign/{target}/{implementation}".encode()


# ---------------------------------------------------------------------------
# The example database
# ---------------------------------------------------------------------------


def is_redis(spec: str) -> bool:
    return urlsplit(spec).scheme in REDIS_SCHEMES


def split_github(spec: str) -> tuple[str | None, tuple[str, str, str] | None]:
    """``(local, (owner, repo, artifact))`` of a database spec (see :func:`open_database`).

    ``local`` is the spec of the writable database (None for a bare ``github:``);
    the GitHub part is None when the spec names none. A malformed GitHub part is a
    :class:`UsageError`; nothing is fetched.
    """
    if spec.startswith(GITHUB):
        local, rest = None, spec[len(GITHUB) :]
    elif f"+{GITHUB}" in spec:
        local, _, rest = spec.rpartition(f"+{GITHUB}")
    else:
        return spec, None
    parts = rest.split("/")
    if len(parts) == 2:
        parts.append(DEFAULT_ARTIFACT)
    if len(parts) != 3 or not all(_GITHUB_NAME.fullmatch(p) for p in parts):
        raise UsageError(f"--db {spec}: expected [DIR+]github:OWNER/REPO[/ARTIFACT]")
    if local is not None and not local.strip():
        raise UsageError(f"--db {spec}: empty directory before +github:")
    owner, repo, artifact = parts
    return local, (owner, repo, artifact)


def open_database(spec: str | Path | ExampleDatabase | None) -> ExampleDatabase | None:
    """Hypothesis' example database named by ``spec``; None for None.

    - an :class:`~hypothesis.database.ExampleDatabase`: itself;
    - ``redis://HOST:PORT[/N]`` (also ``rediss://``, ``unix://``): Hypothesis'
      Redis database (needs the ``redis`` extra);
    - ``github:OWNER/REPO[/ARTIFACT]``: the example database a GitHub Actions
      workflow of ``OWNER/REPO`` uploaded as the artifact ``ARTIFACT`` (default
      ``attnfuzz-db``, the nightly campaign's), read-only: failures found in the
      nightly are replayed, nothing is saved. Fetched on first use with the
      token in ``GITHUB_TOKEN`` (needed for a private repository), or ahead
      by :func:`fetch_artifact`, which says so when it cannot be;
    - ``LOCAL+github:OWNER/REPO[/ARTIFACT]``: the database ``LOCAL`` (a
      directory or a Redis URL) multiplexed with that artifact: reads see
      both, saves go to ``LOCAL`` only. The downloaded artifact is cached in
      ``LOCAL/.github-artifacts/ARTIFACT`` when ``LOCAL`` is a directory;
    - anything else: a directory, Hypothesis' directory database.

    Checking a spec before any work is :func:`attnfuzz.harness.storage.check_database`'s job.
    """
    if spec is None or isinstance(spec, ExampleDatabase):
        return spec
    spec = str(spec)
    local, github = split_github(spec)
    if github is None:
        return _open_local(spec)
    owner, repo, artifact = github
    cache = artifact_cache(spec)
    shared = ReadOnlyDatabase(GitHubArtifactDatabase(owner, repo, artifact, path=cache))
    if local is None:
        return shared
    return MultiplexedDatabase(_open_local(local), shared)


def artifact_cache(spec: str, home: Path | None = None) -> Path | None:
    """Where :func:`open_database` keeps the downloaded GitHub artifact of ``spec``.

    ``LOCAL/.github-artifacts/ARTIFACT`` when ``LOCAL`` is a directory; else the
    ``github-artifacts/ARTIFACT`` directory of Hypothesis' storage directory:
    under ``home`` when given (the storage directory of the processes that will
    open the database), else None (Hypothesis' own, of this process).
    """
    local, github = split_github(spec)
    if github is None:
        return None
    artifact = github[2]
    if local is not None and not is_redis(local):
        return Path(local) / ".github-artifacts" / artifact
    if home is not None:  # the layout of Hypothesis' storage_directory("github-artifacts/...")
        return Path(home) / "github-artifacts" / artifact
    return None


class ArtifactFetch(NamedTuple):
    """What :func:`fetch_artifact` got: ``note`` None when the artifact is there."""

    note: str | None  # one line: why it could not be fetched, and what is read instead
    empty: bool  # nothing of the artifact will be read: the corpus starts empty


def fetch_artifact(spec: str, home: Path | None = None) -> ArtifactFetch:
    """Fetch the GitHub artifact of ``spec`` now, into the cache that every later
    :func:`open_database` of ``spec`` reads (:func:`artifact_cache`, same ``home``).

    Hypothesis fetches it on first use and, when it cannot, only warns and reads
    nothing: in a campaign's workers that warning is lost. Here the warnings it
    gives (:class:`~hypothesis.errors.HypothesisWarning`) become the note, in one
    line; other warnings are passed on. A spec without a GitHub part fetches nothing.
    """
    local, github = split_github(spec)
    if github is None:
        return ArtifactFetch(None, False)
    owner, repo, artifact = github
    db = GitHubArtifactDatabase(owner, repo, artifact, path=artifact_cache(spec, home))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in db.fetch(b"attnfuzz/fetch"):  # any key: the first fetch downloads
            pass
    said = []
    for w in caught:
        if issubclass(w.category, HypothesisWarning):
            said.append(" ".join(str(w.message).split()))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if not said:
        return ArtifactFetch(None, False)
    shown = spec if local is None else spec[len(local) + 1 :]
    note = f"--db {shown}: the artifact could not be fetched ({' '.join(said)})"
    older = _readable_zip(db.path)
    if older is not None:  # Hypothesis falls back on an expired download
        return ArtifactFetch(f"{note}; an older download is read ({older.name})", False)
    return ArtifactFetch(f"{note}; the corpus starts empty", True)


def _readable_zip(directory: Path) -> Path | None:
    """The downloaded artifact in ``directory`` that Hypothesis can read, if any."""
    for path in sorted(directory.glob("*.zip"), reverse=True):
        try:
            with ZipFile(path) as zf:
                if zf.testzip() is None:
                    return path
        except (OSError, BadZipFile):
            continue
    return None


def _open_local(spec: str) -> ExampleDatabase:
    if is_redis(spec):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(spec))
    return DirectoryBasedExampleDatabase(spec)


# ---------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------


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
# The search loop
# ---------------------------------------------------------------------------


class Finding(Exception):
    """A failing case, raised inside the property so that Hypothesis shrinks it.

    Each verdict key has its own subclass (:func:`finding_class`), so that
    Hypothesis tells distinct failures apart when it reports several bugs.
    """

    def __init__(self, verdict: Verdict, case: Case | None = None):
        super().__init__(str(verdict))
        self.verdict = verdict
        self.case = case


_FINDINGS: dict[str, type[Finding]] = {}


def finding_class(key: str) -> type[Finding]:
    """The subclass of :class:`Finding` of one verdict key (one per key, made once)."""
    if key not in _FINDINGS:
        _FINDINGS[key] = type(f"Finding[{key}]", (Finding,), {"__module__": __name__})
    return _FINDINGS[key]


Judge = Callable[[Case], Verdict]
OnCase = Callable[[Case, Verdict, list[str]], None]


def fuzz_test(
    target: Target,
    impl: Implementation,
    *,
    settings: Settings | None = None,
    judge: Judge | None = None,
    scale: Scale = SMALL,
    on_case: OnCase | None = None,
    examples: Sequence[Case] = (),
) -> Callable[[], None]:
    """A Hypothesis test of ``impl`` over ``target.cases(scale, impl)``; call it to search.

    The cases are drawn with ``impl.fixes``' engine values. For each case it
    emits the case's scenario labels with :func:`hypothesis.event`, judges the
    case (``judge``; by default :meth:`Target.judge` in this process on the
    kernels' device), feeds each of ``target.guided`` present in the verdict's
    statistics to :func:`hypothesis.target` (labelled by its name; the search
    maximizes it), calls ``on_case(case, verdict, labels)``, and raises
    :func:`finding_class` ``(verdict.key)`` (a :class:`Finding`) on a failing
    verdict, so that Hypothesis shrinks it.

    ``examples`` are judged first, in order, as Hypothesis explicit examples
    (:func:`hypothesis.example`): never shrunk, and a failing one ends the search.
    ``settings`` defaults to :func:`fuzz_settings` ``()`` (the active profile).
    The test's database key is :func:`corpus_key` of the target and
    implementation, whatever the test's name. A ``judge`` or ``on_case`` may
    raise a :class:`BaseException` that is not an :class:`Exception` to end
    the search: Hypothesis lets it through. Seed the test with
    :func:`hypothesis.seed` for a derandomized run.
    """
    if judge is None:

        def judge(case: Case) -> Verdict:
            return target.judge(impl, case)

    guided = tuple(target.guided)

    def check(case: Case) -> None:
        labels = scenario_labels(case)
        for label in labels:
            event(label)
        verdict = judge(case)
        for name in guided:
            if name in verdict.statistics:
                guide(float(verdict.statistics[name]), label=name)
        if on_case is not None:
            on_case(case, verdict, labels)
        if not verdict.ok:
            raise finding_class(verdict.key)(verdict, case)

    check.__name__ = re.sub(r"\W", "_", f"fuzz_{target.name}_{impl.name}")
    for case in reversed(examples):  # the outermost @example runs first
        check = example(case)(check)
    test = (settings if settings is not None else fuzz_settings())(
        given(target.cases(scale, impl))(check)
    )
    # One corpus per target and implementation, shared by every command.
    test._hypothesis_internal_database_key = corpus_key(target.name, impl.name)  # type: ignore[attr-defined]
    return test
