"""Where attnfuzz writes: the example database, the output directory, Hypothesis' own files.

``run``, ``campaign`` and ``zoo`` open both through these functions, so that
the same ``--db`` and ``--out`` are accepted, refused and resolved the same
way by every command:

- ``--db`` is a directory or ``redis://HOST:PORT[/N]`` (also ``rediss://``,
  ``unix://``), optionally multiplexed with a GitHub Actions artifact
  (``DIR+github:OWNER/REPO[/ARTIFACT]``, or ``github:...`` alone, read-only:
  :func:`attnfuzz.harness.engine.open_database` says how each is opened);
  anything else with a scheme, an empty value, a file, or a directory
  attnfuzz cannot write is a usage error before any work. The artifact
  itself is never a usage error: :func:`note_artifact` fetches it before
  the search and, if it cannot be fetched, says so in one note (the search
  goes on, its corpus empty).
- ``--out`` is a directory that can be created and written; checked before
  any work, so a finding is never lost to a bad path.
- Both are resolved to absolute paths at start: an implementation that
  changes the working directory moves nothing.
- Hypothesis' own cache (``.hypothesis/constants``) goes to a temporary
  directory, not the working directory: nothing is written outside ``--out``
  and ``--db``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

# The database names are the engine's; importable from here as before.
from attnfuzz.harness.engine import (
    GITHUB,
    REDIS_SCHEMES,
    ArtifactFetch,
    fetch_artifact,
    is_redis,
    open_database,
    split_github,
)
from attnfuzz.harness.errors import UsageError

__all__ = [
    "REDIS_SCHEMES",
    "check_database",
    "database_spec",
    "is_redis",
    "note_artifact",
    "open_database",
    "prepare_out",
    "private_hypothesis_home",
]


def _probe_writable(directory: Path, what: str, create: bool = True) -> None:
    """Show that files can be written in ``directory`` (created if ``create``, else
    only its nearest existing ancestor is probed); a usage error if not."""
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{what} {directory}: not a directory")
    probe_in = directory
    if not create:
        while not probe_in.exists() and probe_in != probe_in.parent:
            probe_in = probe_in.parent
    try:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        elif not probe_in.is_dir():
            raise NotADirectoryError(20, f"{probe_in} is not a directory")
        fd, probe = tempfile.mkstemp(prefix=".attnfuzz-probe-", dir=probe_in)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise UsageError(f"{what} {directory}: cannot write there ({err.strerror or err})") from err


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
        _probe_writable(Path(database_spec(spec)), "--db", create=False)


def note_artifact(
    spec: str, home: Path | None = None, stream: TextIO | None = None
) -> ArtifactFetch:
    """Fetch the GitHub artifact of a checked ``--db`` once, before the search (see
    :func:`~attnfuzz.harness.engine.fetch_artifact`; ``home``: the Hypothesis storage
    directory of the processes that will search). If it could not be fetched, one
    note on ``stream`` (default stderr): not an error, an empty corpus is still a search."""
    fetched = fetch_artifact(spec, home)
    if fetched.note is not None:
        print(f"attnfuzz: note: {fetched.note}", file=stream or sys.stderr, flush=True)
    return fetched


def prepare_out(path: Path, what: str = "--out", create: bool = True) -> Path:
    """``--out`` made absolute and shown to be writable; created unless ``create`` is
    False (``run`` creates it only when there is a case to write)."""
    path = Path(path).resolve()
    _probe_writable(path, what, create)
    return path


def private_hypothesis_home() -> None:
    """Hypothesis' cache in a temporary directory of this process, removed at exit,
    unless the user named one (``HYPOTHESIS_STORAGE_DIRECTORY``)."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis.configuration import set_hypothesis_home_dir

    home = tempfile.mkdtemp(prefix="attnfuzz-hypothesis-")
    atexit.register(shutil.rmtree, home, True)
    set_hypothesis_home_dir(home)
