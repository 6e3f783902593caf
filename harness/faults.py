"""How a judging child's end reads as a verdict: a hang (``timeout``) or a death
(``crash``), from :mod:`faulthandler`'s report and the child's exit status.

The isolated judge (:mod:`attnfuzz.harness.isolation`) and a campaign's
controller (reading a lost worker's fault log) share these words.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

from attnfuzz.harness.oracle import Check, Mismatch


def describe_fault(text: str) -> tuple[Check, str] | None:
    """``("timeout" | "crash", detail)`` from a :mod:`faulthandler` report, or None.

    The detail names the innermost frame of the faulting thread (the file
    name only, never a full path).
    """
    blocks = re.split(r"^(?=(?:Current thread|Thread) 0x)", text, flags=re.M)
    blocks = [b for b in blocks if re.match(r"(Current thread|Thread) 0x", b)]
    current = [b for b in blocks if b.startswith("Current thread")]
    # The faulting thread is "Current thread"; on a timeout the main thread is last.
    block = current[0] if current else blocks[-1] if blocks else ""
    where = ""
    frame = re.search(r'File "([^"]+)", line (\d+) in (\S+)', block)
    if frame:
        where = f" at {Path(frame.group(1)).name}:{frame.group(2)} in {frame.group(3)}"
    if re.search(r"Timeout \(([^)]*)\)", text):
        return Check.TIMEOUT, where
    fatal = re.search(r"Fatal Python error: ([^\n]+)", text)
    if fatal:
        return Check.CRASH, f"Fatal Python error: {fatal.group(1).strip()}{where}"
    return None


def timeout_mismatch(where: str, timeout_s: float, detail: str = "") -> Mismatch:
    return Mismatch(
        Check.TIMEOUT,
        where,
        f"a verdict within {timeout_s:g}s",
        f"no verdict after {timeout_s:g}s{detail}",
    )


def crash_mismatch(where: str, detail: str) -> Mismatch:
    return Mismatch(Check.CRASH, where, "the process to survive the call", detail)


def exit_detail(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}"
    return f"the process exited with status {exitcode} during the call"
