"""attnfuzz's error classes, and how a message is said in one line.

A :class:`UsageError` (and its kinds :class:`InvalidCase`, :class:`Unreachable`,
:class:`CaseTooLarge`) is the caller's mistake or this machine's limit, never a
verdict on an implementation (exit status 2). A :class:`HarnessError` is
attnfuzz's own code failing (exit status 4). A :class:`ContractError` is the
engine's misuse of a vendor operation's stand-in: a finding like any other exception.

This module imports nothing of attnfuzz, so that every part of it (the harness, the
reports, the engine adapters) may raise and format these.
"""

from __future__ import annotations

import re


class UsageError(Exception):
    """A mistake of the caller (unknown name, bad case file): exit status 2."""


class InvalidCase(UsageError):
    """A case the engine could never produce; the oracle refuses to judge it."""


class Unreachable(InvalidCase):
    """A case outside the limits an engine implementation declares (``Implementation.admits``):
    a state that engine never reaches, however valid for the target; refused, never judged."""


class CaseTooLarge(UsageError):
    """A case whose metadata, inputs or reference do not fit in this machine's memory."""


class Interrupted(KeyboardInterrupt):  # noqa: N818 - a KeyboardInterrupt, named as one
    """SIGINT or SIGTERM, raised by attnfuzz's own handler: a ``KeyboardInterrupt``
    to every ``except``, but not one CPython takes for the program's end. A
    handler's exception lands wherever the main thread is, and CPython remembers
    a bare ``KeyboardInterrupt`` that leaves code run by ``exec`` of a string
    (``dataclasses`` makes each ``__repr__`` so, as torch loads): caught by the
    command, it still made the process end by SIGINT (status -2 to its parent)
    instead of the 130 the command returned. The check is on the exact class."""


class HarnessError(Exception):
    """attnfuzz's own code failed while judging (an adapter's glue, a stand-in, a
    reference, the harness): no verdict on the implementation, never a finding.
    Its message names the file and line in attnfuzz (:class:`~attnfuzz.harness.blame.Fault`)."""


class ContractError(ValueError):
    """A stand-in refused arguments its vendor operation does not accept (a finding)."""


MESSAGE_LIMIT = 500
"""Characters of a message to the terminal that quotes input (an error, a note);
a line of a report or of ``campaign.json`` holds :func:`one_line`'s default, 300."""


_BREAKS = re.compile(r" *[^\S ]\s*")
"""A run of whitespace holding something other than a plain space."""


def one_line(text: object, limit: int = 300) -> str:
    """``text`` as one line of printable characters, at most ``limit`` long.

    A run of whitespace that holds a line break or a tab becomes one space (none
    at the end, nor at the start unless it is plain spaces); runs of plain spaces
    stay, so that an indented or aligned line keeps its layout; every other
    non-printable character (a control character, a lone surrogate) is escaped
    as ``repr`` writes it (``\\x1b``); a longer text is cut and ends with
    ``...``. Whatever an input held, it never reaches a terminal or a report raw.
    """
    text = str(text)
    flat = _BREAKS.sub(" ", text).rstrip()
    if text[: len(text) - len(text.lstrip())].strip(" "):  # no indentation: a break
        flat = flat.lstrip()
    out: list[str] = []
    length = 0
    for c in flat:
        piece = c if c.isprintable() else repr(c)[1:-1]
        out.append(piece)
        length += len(piece)
        if length > limit:
            return "".join(out)[: max(limit - 3, 0)] + "..."
    return "".join(out)


class PlannerUnbound(Exception):
    """The installed engine's own step planning cannot be driven (its release lacks
    an API attnfuzz's planner adapter calls): the reference's rules, read off
    another release, would not be this release's."""


class PlannerRefuses(ValueError):
    """The installed engine's own step planning does not run this (runner, mode)
    configuration: its release rewrites the mode for the backend, or lacks what the
    configuration needs (adaptive verification's varlen decode graphs). No step of
    the engine runs there: reachability leaves the pair out, saying so."""
