"""Where attnfuzz writes: the output directory and Hypothesis' own files.

- ``--out`` is a directory that can be created and written; checked before
  any work, so a finding is never lost to a bad path.
- It is resolved to an absolute path at start (``--db`` too, see
  :mod:`attnfuzz.harness.database`): an implementation that changes the
  working directory moves nothing.
- Hypothesis' own cache (``.hypothesis/constants``) goes to a temporary
  directory, not the working directory: nothing is written outside ``--out``
  and ``--db``. It is a scratch directory of :mod:`attnfuzz.harness.lifetime`:
  removed at exit, or by the next command if this one is killed.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.lifetime import scratch_dir

__all__ = ["prepare_out", "private_hypothesis_home", "probe_writable"]


def probe_writable(directory: Path, what: str, create: bool = True) -> None:
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


def prepare_out(path: Path, what: str = "--out", create: bool = True) -> Path:
    """``--out`` made absolute and shown to be writable; created unless ``create`` is
    False (``run`` creates it only when there is a case to write)."""
    path = Path(path).resolve()
    probe_writable(path, what, create)
    return path


def private_hypothesis_home() -> None:
    """Hypothesis' cache in a temporary directory of this process, removed at exit,
    unless the user named one (``HYPOTHESIS_STORAGE_DIRECTORY``)."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(scratch_dir("hypothesis", remove_at_exit=True))
