"""Entry points of other distributions: loading one, and saying which failed and why.

Shared by the groups attnfuzz reads (``attnfuzz.targets``, ``attnfuzz.engines``):
a plugin that cannot be loaded is reported with its reason (one line) instead of
breaking every command, and blamed on its entry point, never on attnfuzz or an
engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from importlib import metadata
from typing import Any, TypeVar

T = TypeVar("T")


class Refused(Exception):
    """What an entry point handed over is not what its group expects (the message says
    why, to follow the entry point's description: ``returned int, not ...``)."""


def entry_points(group: str) -> list[metadata.EntryPoint]:
    """The entry points of ``group``, by name (a stable order whatever the installs)."""
    return sorted(metadata.entry_points(group=group), key=lambda ep: (ep.name, ep.value))


def describe(ep: metadata.EntryPoint) -> str:
    """``entry point NAME = VALUE of DIST (group GROUP)``: where a reader finds it."""
    dist = getattr(ep, "dist", None)
    where = f" of {dist.name}" if dist is not None else ""
    return f"entry point {ep.name} = {ep.value}{where} (group {ep.group})"


OWN_DISTRIBUTION = "attnfuzz"
"""The distribution of attnfuzz's own entry points (its engines ``vllm``, ``sglang``)."""


def clashes(eps: list[metadata.EntryPoint], what: str) -> dict[str, str]:
    """``name -> reason`` for each name of a ``what`` (``target``, ``engine``) that two
    entry points or more share: which one was meant cannot be known. The reason,
    one line, names their distributions and what to do."""
    counts = Counter(ep.name for ep in eps)
    out: dict[str, str] = {}
    for name in (name for name, count in counts.items() if count > 1):
        same = [ep for ep in eps if ep.name == name]
        both = " and ".join(describe(ep) for ep in same)
        out[name] = f"{both} both name {what} {name!r}: {_remedy(same)}"
    return out


def _remedy(same: list[metadata.EntryPoint]) -> str:
    """What ends a clash of ``same``: uninstall, or rename in, the distributions
    other than attnfuzz's own (attnfuzz's own names are its documented ones)."""
    dists = sorted({dist.name for ep in same if (dist := getattr(ep, "dist", None)) is not None})
    others = [name for name in dists if name != OWN_DISTRIBUTION] or dists
    if len(dists) == 1:
        return f"rename one of them in {dists[0]}"
    if len(others) == 1:
        return f"uninstall {others[0]} (pip uninstall {others[0]}) or rename its entry point"
    if others:
        return f"uninstall all but one of {', '.join(others)}, or rename their entry points"
    return "uninstall all but one of their distributions, or rename their entry points"


def load(ep: metadata.EntryPoint, make: Callable[[Any], T]) -> tuple[T | None, str | None]:
    """``(make(ep.load()), None)``, or ``(None, reason)`` where importing the entry
    point or ``make`` fails (``make`` raises :class:`Refused` to refuse what it was
    given)."""
    try:
        loaded = ep.load()
    except (Exception, SystemExit) as err:  # a broken plugin is reported, not fatal
        return None, f"{describe(ep)} failed: {type(err).__name__}: {err}"
    try:
        return make(loaded), None
    except Refused as err:
        return None, f"{describe(ep)} {err}"
    except (Exception, SystemExit) as err:  # a plugin's own function raised
        return None, f"{describe(ep)} failed: {type(err).__name__}: {err}"
