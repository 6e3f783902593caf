"""Failing cases as readable, replayable JSON.

A case file holds only printable scalars (the drawn config and batch with its
data seed), never a Hypothesis blob and never code: loading one parses JSON
and checks every field, nothing more. The same file replays the same failure
on another machine and under another Hypothesis version.

Writing is :mod:`.document`, reading (with its limits) :mod:`.read`.
"""

from __future__ import annotations

from attnfuzz.harness.casefile.document import (
    case_document,
    derived,
    engine_record,
    engine_versions,
    environment,
    write_case,
    write_new_case,
)
from attnfuzz.harness.casefile.read import (
    MAX_CASE_BYTES,
    MAX_CASE_DEPTH,
    MAX_CASE_ELEMENTS,
    MAX_INT_DIGITS,
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    MAX_KEY_CHARS,
    load_json,
    read_case,
    short,
)

__all__ = [
    "MAX_CASE_BYTES",
    "MAX_CASE_DEPTH",
    "MAX_CASE_ELEMENTS",
    "MAX_INT_DIGITS",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_KEY_CHARS",
    "case_document",
    "derived",
    "engine_record",
    "engine_versions",
    "environment",
    "load_json",
    "read_case",
    "short",
    "write_case",
    "write_new_case",
]
