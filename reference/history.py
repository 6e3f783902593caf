"""The history of the public input and output dataclasses' fields.

The dataclasses of ``attnfuzz.reference.<target>`` are a contract with every
implementation written against them. A field renamed with its meaning kept
stays readable under its old name for one minor version (:func:`renamed_alias`,
with a ``DeprecationWarning``); one whose meaning changed, or that was removed,
is gone at once, and reading it raises :class:`RemovedField` with its history
(``CHANGELOG.md`` has every entry).
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar


class RemovedField(AttributeError):
    """An implementation read a field the contract no longer has; the message says what
    became of it. Judged as a usage error (the implementation targets an older attnfuzz),
    never as a finding."""


class FieldHistory:
    """Base of a public dataclass: a field it no longer has reads with its history.

    ``removed`` maps an old field name to what became of it, e.g.
    ``{"upper_max": "removed in 0.2.0: compute max(seq_lens_cpu_upper_bound[:R])"}``.
    """

    removed: ClassVar[dict[str, str]] = {}

    # Raises for the caller, whose read it was (attnfuzz.harness.blame: transparent).
    def __getattr__(self, name: str) -> Any:
        # Called only when the normal lookup failed.
        note = type(self).removed.get(name)
        if note is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise RemovedField(f"{type(self).__name__}.{name} {note} (see attnfuzz's CHANGELOG.md)")


def renamed_alias(new: str, since: str) -> property:
    """A read-only property under a field's old name that returns field ``new`` and
    warns that the old name goes away in the next minor version after ``since``."""

    def read(self: Any) -> Any:
        warnings.warn(
            f"{type(self).__name__}: this field was renamed to {new} in {since}; "
            "the old name goes in the next minor version",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(self, new)

    return property(read)
