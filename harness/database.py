"""The example database: each ``--db`` spec checked, resolved and opened, in one place.

``run``, ``campaign``, ``zoo`` and the pytest plugin accept, refuse and open the
same ``--db`` the same way:

- a directory or ``redis://HOST:PORT[/N]`` (also ``rediss://``, ``unix://``),
  optionally multiplexed with a GitHub Actions artifact
  (``DIR+github:OWNER/REPO[/ARTIFACT]``, or ``github:...`` alone, read-only:
  :func:`open_database` says how each is opened);
- anything else with a scheme, an empty value, a file, or a directory attnfuzz
  cannot write is a usage error before any work (:func:`database_spec`,
  :func:`check_database`). The artifact itself is never a usage error:
  :func:`note_artifact` fetches it before the search and, if it cannot be
  fetched, says so in one note (the search goes on, its corpus empty).
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import NamedTuple, TextIO
from urllib.parse import urlsplit
from zipfile import BadZipFile, ZipFile

from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.storage import probe_writable
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

    Checking a spec before any work is :func:`check_database`'s job.
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


def database_spec(spec: str) -> str:
    """Check a ``--db`` value and return it, a directory made absolute (also
    the directory before ``+github:``)."""
    if not spec.strip():
        raise UsageError("--db: empty; give a directory or redis://HOST:PORT")
    if not spec.isprintable():  # a terminal escape or a line break is no path anyone meant
        raise UsageError(f"--db {spec!r}: control characters in the name; nothing was created")
    local, github = split_github(spec)
    if github is not None:
        rest = spec[len(local) + 1 :] if local is not None else spec
        return rest if local is None else f"{database_spec(local)}+{rest}"
    scheme = urlsplit(spec).scheme
    if scheme in REDIS_SCHEMES:
        return spec
    if scheme and len(scheme) > 1:  # not a Windows drive letter
        raise UsageError(
            f"--db {spec}: expected a directory or redis://HOST:PORT "
            f"(optionally +{GITHUB}OWNER/REPO[/ARTIFACT])"
        )
    return str(Path(spec).resolve())


def check_database(spec: str) -> None:
    """The database must be usable before any work: Redis answers, a directory is
    writable. Of ``LOCAL+github:...`` the local part is checked; the artifact is
    :func:`note_artifact`'s."""
    local, github = split_github(spec)
    if github is not None:
        if local is not None:
            check_database(local)
        return
    if is_redis(spec):
        try:
            import redis
        except ImportError as err:
            raise UsageError(f"--db {spec}: the redis package is not installed") from err
        try:
            redis.Redis.from_url(spec, socket_connect_timeout=5).ping()
        except (redis.RedisError, ValueError) as err:
            raise UsageError(f"--db {spec}: cannot reach Redis ({err})") from err
    else:
        # Probed, not created: a command refused later leaves no empty database
        # behind; Hypothesis makes the directory when it first saves an example.
        probe_writable(Path(database_spec(spec)), "--db", create=False)


def note_artifact(
    spec: str, home: Path | None = None, stream: TextIO | None = None
) -> ArtifactFetch:
    """Fetch the GitHub artifact of a checked ``--db`` once, before the search (see
    :func:`fetch_artifact`; ``home``: the Hypothesis storage
    directory of the processes that will search). If it could not be fetched, one
    note on ``stream`` (default stderr): not an error, an empty corpus is still a search."""
    fetched = fetch_artifact(spec, home)
    if fetched.note is not None:
        print(f"attnfuzz: note: {fetched.note}", file=stream or sys.stderr, flush=True)
    return fetched
