"""The failure report of attnfuzz's pytest plugin (``harness/pytest_plugin.py``).

A failing case is short, as ``torch.testing``'s: the verdict (check, where,
expected and got), the case file it was written to and the command that
replays it. :class:`CaseFailure` and :class:`CaseTimeout` carry it; Hypothesis'
note restating the case (some twenty lines) is cut to ``Case(...)``, the case
file holding it. Importing this imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.reference.batch import Case
    from attnfuzz.reference.trace import Trace


class Judged:
    """A case an implementation fails: the verdict, where its case file is and
    how to replay it, in a few lines (``str``)."""

    def __init__(
        self,
        target: str,
        impl: str,
        case: Case | Trace,
        verdict: Verdict,
        *,
        timeout: float | None = None,
        found_on: str | None = None,
        shown: str | None = None,
        note: str = "",
    ) -> None:
        super().__init__(f"{target} / {impl}: FAIL ({verdict.key})")
        self.target, self.impl, self.case, self.verdict = target, impl, case, verdict
        self.timeout = timeout  # the per-case timeout it was judged under, if in a child
        self.found_on = found_on or impl  # the implementation its case file names
        self.shown: str | None = shown  # the case file, once written
        self.unsaved: str | None = None  # why it could not be written, and the case
        self.note = note

    def __str__(self) -> str:
        from attnfuzz.harness.definitions import repro_command

        first, *rest = str(self.verdict).splitlines()
        lines = [f"{self.target} / {self.impl}: {first}", *rest]
        if self.note:
            lines.append(self.note)
        if self.shown is not None:
            replay = repro_command(self.shown, self.impl)
            if self.impl != self.found_on and ":" not in self.impl:
                replay += f" --impl {shlex.quote(self.impl)}"
            lines += [f"case file: {self.shown}", f"replay: {replay}"]
        else:
            lines.append(self.unsaved or "case file: written when pytest reports the failure")
        return "\n".join(lines)


class CaseFailure(Judged, AssertionError):
    """A case an implementation fails (an ``AssertionError``)."""

    # The plugin's, as pytest names it on a failure's first line and users import it.
    __module__ = "attnfuzz.harness.pytest_plugin"


class CaseTimeout(Judged, BaseException):
    """A case that gave no verdict within the timeout, from ``attnfuzz_judge``. Not an
    ``Exception``: Hypothesis ends the test's search at once instead of shrinking
    it, each step of which would cost a whole timeout."""

    __module__ = "attnfuzz.harness.pytest_plugin"  # as CaseFailure's


def judged_failures(err: BaseException) -> Iterator[Judged]:
    """The failing cases inside ``err`` (Hypothesis groups distinct ones)."""
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            yield from judged_failures(inner)
    elif isinstance(err, Judged):
        yield err


def display_path(path: Path, here: Path) -> str:
    """``path`` as the user types it: relative to where pytest was started, if under it."""
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def elide_cases(text: str) -> str:
    """``text`` with each ``Case(...)`` or ``Trace(...)`` repr (as Hypothesis prints a
    failing example's arguments, some twenty lines a step) written ``Case(...)``
    (``Trace(...)``)."""
    out: list[str] = []
    start = 0
    for found in re.finditer(r"\b(?:Case|Trace)\(", text):
        if found.start() < start:  # inside a case already elided
            continue
        end = _closing(text, found.end())
        if end is None:
            break
        out.append(text[start : found.end()] + "...")
        start = end
    return "".join(out) + text[start:]


def _closing(text: str, i: int) -> int | None:
    """The index of the ``)`` that closes the bracket open before ``text[i]``."""
    depth, quote = 1, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None
