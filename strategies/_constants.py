"""Hypothesis draws the same cases for a seed wherever attnfuzz runs.

Hypothesis mixes into its draws the literals of the *local* modules a process
has imported (``providers._get_local_constants``): code outside site-packages.
Installed from a checkout (editable), attnfuzz's own modules count as local,
so a derandomized run's cases depended on which of them the process happened
to import (a pytest worker imports more than ``attnfuzz run``) and on every
literal added to the project; installed from a wheel, they never count. Here
attnfuzz's own files are never local: a seed draws the same cases in any
process, from a checkout or a wheel. A user's own modules (``--impl
module:attribute``) still count, as Hypothesis means them to.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
"""attnfuzz's package directory (the checkout, for an editable install)."""


def is_attnfuzz_file(path: str) -> bool:
    try:
        return Path(path).resolve().is_relative_to(PACKAGE)
    except (OSError, ValueError):
        return False


def _not_attnfuzz(is_local: Callable[[str], bool]) -> Callable[[str], bool]:
    def is_local_module_file(path: str) -> bool:
        return not is_attnfuzz_file(path) and is_local(path)

    is_local_module_file.attnfuzz_excluded = True  # type: ignore[attr-defined]
    return is_local_module_file


def exclude_attnfuzz_from_local_constants() -> bool:
    """Install the rule; returns whether it could (an internal of Hypothesis: where a
    release lacks it, draws are Hypothesis' own)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without local constants
        return False
    current = getattr(providers, "is_local_module_file", None)
    if current is None:
        return False
    if not getattr(current, "attnfuzz_excluded", False):
        providers.is_local_module_file = _not_attnfuzz(current)
    return True


exclude_attnfuzz_from_local_constants()
