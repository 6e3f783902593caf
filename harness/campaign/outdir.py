"""The ``--out`` directory: one campaign at a time, the last results kept as the baseline."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TextIO

from attnfuzz.harness.definitions import PREVIOUS
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.lifetime import process_alive

LOCK_FILE = ".campaign.lock"


def lock_out(out: Path, stream: TextIO | None = None) -> TextIO:
    """Hold ``<out>/.campaign.lock`` for the campaign's life; a second campaign
    in the same directory is a usage error, not a corruption of the first.
    :func:`release_out` removes the file.

    The lock of a campaign that is no longer running is taken over, with a
    line on ``stream``: a process it left may still hold the lock (a child
    that inherited it), but no campaign does."""
    import fcntl

    while True:
        handle = (out / LOCK_FILE).open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip()
            if _take_over(out, handle, holder, stream):
                handle.close()
                continue
            handle.close()
            raise UsageError(
                f"--out {out}: a campaign is already running there "
                f"(pid {holder or 'another process'}); wait for it or choose another --out"
            ) from None
        # The campaign before may have removed the file between our open and our lock:
        # a lock on a file no longer there excludes no one. Lock the one that is.
        try:
            if os.stat(out / LOCK_FILE).st_ino == os.fstat(handle.fileno()).st_ino:
                break
        except FileNotFoundError:
            pass
        handle.close()
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def _take_over(out: Path, handle: TextIO, holder: str, stream: TextIO | None) -> bool:
    """Remove the lock file ``handle`` opened if the campaign ``holder`` (its pid)
    is gone; whether the lock is to be tried again."""
    import fcntl

    if not holder.isdecimal() or process_alive(int(holder)):
        return False  # running, or not yet saying who it is
    try:
        directory = os.open(out, os.O_RDONLY)
    except OSError:
        return False
    try:
        # Two campaigns taking over at once: the second finds the file the first made.
        fcntl.flock(directory, fcntl.LOCK_EX)
        if os.stat(out / LOCK_FILE).st_ino != os.fstat(handle.fileno()).st_ino:
            return True
        os.unlink(out / LOCK_FILE)
    except FileNotFoundError:
        return True
    except OSError:  # it cannot be removed: refused as if running, never a loop
        return False
    finally:
        os.close(directory)
    print(
        f"--out {out}: the campaign that held it (pid {holder}) is no longer running; "
        "its lock is taken over",
        file=stream,
    )
    return True


def release_out(out: Path, handle: TextIO) -> None:
    """End :func:`lock_out`: the lock file goes (while still held, see there), then the lock."""
    try:
        (out / LOCK_FILE).unlink(missing_ok=True)
    except OSError:
        pass  # a lock file left behind is harmless: the next campaign takes it over
    handle.close()


RESULTS = (
    "campaign.json",
    "campaign.invalid.json",  # a document its schema refused (see results.write_results)
    "summary.md",
    "report.html",
    "junit.xml",
    "cases",
)


def keep_previous(out: Path, stream: TextIO) -> None:
    """The last campaign's results move to ``<out>/previous/``: the baseline of
    ``attnfuzz report``, never overwritten by the campaign that follows it."""
    if not (out / "campaign.json").exists():
        return
    previous = out / PREVIOUS
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for name in RESULTS:
        if (out / name).exists():
            os.replace(out / name, previous / name)
    print(f"the previous campaign's results are in {previous}", file=stream)
