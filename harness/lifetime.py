"""The lifetime of attnfuzz's processes and scratch directories.

Killed from outside (SIGKILL: no handler, no clean-up), attnfuzz must leave
nothing running and nothing that piles up:

- A process attnfuzz starts (a campaign's pytest run, its xdist workers, a
  judging child) dies with its parent: :func:`die_with_parent` asks Linux for
  a signal when the parent ends (``prctl(PR_SET_PDEATHSIG)``). Elsewhere only
  a parent already gone is noticed.
- A scratch directory in the system's temporary directory
  (:func:`scratch_dir`) is named after the process that owns it,
  ``attnfuzz-<kind>-<pid>-XXXXXXXX``. The owner removes it when it ends
  cleanly; what an owner killed left is removed by the next attnfuzz command
  (:func:`sweep_stale_scratch`), once that process is gone.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "KINDS",
    "die_with_parent",
    "dies_with_this_process",
    "process_alive",
    "scratch_dir",
    "sweep_stale_scratch",
]

KINDS = ("judge", "hypothesis", "vllm-model")
"""What attnfuzz keeps in the temporary directory; the sweep touches these names only."""

# Releases before the owner's pid was in the name wrote attnfuzz-<kind>-XXXXXXXX:
# whose it is cannot be known, so it goes only once nothing has touched it for a day.
UNOWNED_AGE_S = 24 * 3600

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# tempfile.mkdtemp's names: the prefix, then 8 of [a-z0-9_].
_SCRATCH_NAME = re.compile(
    rf"attnfuzz-({'|'.join(re.escape(k) for k in KINDS)})-(?:(\d+)-)?[a-z0-9_]{{8}}"
)


@functools.cache
def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without prctl: the ppid check still holds
        return None


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """This process gets ``sig`` when ``parent_pid``, its parent, ends.

    Call it first thing in the child. A parent that died before the request
    sends nothing, so the child then sends ``sig`` to itself: it was orphaned
    if its parent is no longer ``parent_pid``. Linux sends the signal when the
    parent's *thread* that started the child ends: start children from a
    thread that lives as long as they should (the main thread).
    """
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)  # refused (seccomp): the check below stays
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def dies_with_this_process(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child dies with this process."""
    _prctl()  # looked up here: between fork and exec the child only calls it
    return functools.partial(die_with_parent, os.getpid(), sig)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie is not; another user's is)."""
    if pid <= 0:  # not one process: 0 and -1 would ask about whole groups
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:  # no pid is that large
        return False
    try:
        # "pid (comm) S ...": the state follows the last parenthesis (comm may hold any).
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no procfs: os.kill's answer stands
    return state != "Z"


def scratch_dir(kind: str, *, remove_at_exit: bool = False) -> Path:
    """A new private directory ``attnfuzz-<kind>-<pid>-XXXXXXXX`` in the temporary directory.

    Its owner removes it when done with it (or, with ``remove_at_exit``, when
    this process exits cleanly); if the owner is killed, the next
    :func:`sweep_stale_scratch` removes it.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown scratch kind {kind!r} (known: {', '.join(KINDS)})")
    owner = os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"attnfuzz-{kind}-{owner}-"))
    if remove_at_exit:
        atexit.register(_remove_if_owner, path, owner)
    return path


def _remove_if_owner(path: Path, owner: int) -> None:
    # A forked child inherits the exit handlers; the directory is its parent's.
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


def sweep_stale_scratch(now: float | None = None) -> list[Path]:
    """Remove the scratch directories whose owner is gone; returns those removed.

    Only this user's directories of attnfuzz's own names (:data:`KINDS`) are
    looked at, never through a symbolic link; a directory whose owner is
    alive is kept, one without an owner's pid only once a day old; what cannot
    be removed is left.
    """
    root = tempfile.gettempdir()
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        found = _SCRATCH_NAME.fullmatch(entry.name)
        if found is None:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        owner = found.group(2)
        if owner is None:
            stale = now - info.st_mtime > UNOWNED_AGE_S
        else:
            stale = not process_alive(int(owner))
        if stale:
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(Path(entry.path))
    return removed
