"""The ``--out`` directory: one campaign at a time, the last results kept as the baseline."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TextIO

from attnfuzz.harness.target import UsageError

LOCK_FILE = ".campaign.lock"


def lock_out(out: Path) -> TextIO:
    """Hold ``<out>/.campaign.lock`` for the campaign's life; a second campaign
    in the same directory is a usage error, not a corruption of the first."""
    import fcntl

    handle = (out / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UsageError(
            f"--out {out}: a campaign is already running there (pid {holder}); "
            "wait for it or choose another --out"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


PREVIOUS = "previous"
RESULTS = ("campaign.json", "summary.md", "report.html", "junit.xml", "cases")


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
