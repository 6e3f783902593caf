"""A project's defaults for attnfuzz: the ``[tool.attnfuzz]`` table of its ``pyproject.toml``.

Example::

    [tool.attnfuzz]
    db = ".attnfuzz/db"          # a directory, or a database URL (kept as written)
    out = "attnfuzz-campaign"    # relative paths are relative to this file's directory
    cases = "tests/attnfuzz-cases"
    budget = 120                 # seconds
    max_examples = 1000
    min_examples = 200           # the example floor of a pass or a survivor (0: none)
    profile = "ci"               # a Hypothesis settings profile
    targets = ["mtp-seq-lens", "indexer-decode"]
    mutants = ["my_engine.bugs"] # registry.add_mutants specs
    scale = "small"
    workers = 4

Command-line options win over these; these win over attnfuzz's own defaults.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import PROFILE_NAMES, SCALE_NAMES
from attnfuzz.harness.errors import UsageError

PYPROJECT = "pyproject.toml"


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _non_negative_int(value: Any) -> bool:
    return _positive_int(value) or (type(value) is int and value == 0)


def _positive_number(value: Any) -> bool:
    # TOML has inf and nan; a budget of either would never end (--budget refuses them too).
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(_text(v) for v in value)


# key -> (check, what the check wants, in words)
KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "db": (_text, "a non-empty string (a directory or a database URL)"),
    "out": (_text, "a non-empty string (a directory)"),
    "cases": (_text, "a non-empty string (a directory)"),
    "budget": (_positive_number, "a finite number of seconds > 0"),
    "max_examples": (_positive_int, "an integer >= 1"),
    "min_examples": (_non_negative_int, "an integer >= 0"),
    "profile": (lambda v: v in PROFILE_NAMES, f"one of {', '.join(PROFILE_NAMES)}"),
    "targets": (_texts, "a list of target names"),
    "mutants": (_texts, "a list of MODULE[:ATTRIBUTE] specs"),
    "scale": (lambda v: v in SCALE_NAMES, f"one of {', '.join(sorted(SCALE_NAMES))}"),
    "workers": (_positive_int, "an integer >= 1"),
}


def find_pyproject(start: Path | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` in ``start`` (default: the working directory)
    or one of its parents, or None. The nearest one is the project's, whether or
    not it has a ``[tool.attnfuzz]`` table: a project's settings never come from
    a project that contains it."""
    here = (start if start is not None else Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / PYPROJECT
        if candidate.is_file():
            return candidate
    return None


def defaults(start: Path | None = None) -> dict[str, Any]:
    """The ``[tool.attnfuzz]`` settings of the project at ``start`` (see :func:`find_pyproject`).

    Returns only the keys the table sets (empty without a table or a file), each
    checked and typed: ``out`` and ``cases`` as :class:`~pathlib.Path` resolved
    against the file's directory; ``db`` likewise unless it is a URL or names a
    remote database (``scheme://...`` or containing ``github:``), kept as
    written; ``budget`` as float; ``max_examples``, ``min_examples`` and ``workers`` as int;
    ``targets`` and ``mutants`` as lists of strings; ``profile`` and ``scale``
    as strings. A file that is not TOML, a ``tool.attnfuzz`` that is not a table,
    an unknown key or a value of the wrong type is a :class:`UsageError` naming
    the file and the key.
    """
    path = find_pyproject(start)
    if path is None:
        return {}
    try:
        with path.open("rb") as f:
            document = tomllib.load(f)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise UsageError(f"{path}: cannot read it as TOML: {err}") from err
    table = document.get("tool", {}).get("attnfuzz", {})
    if not isinstance(table, dict):
        raise UsageError(f"{path}: tool.attnfuzz must be a table, got {type(table).__name__}")
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            known = ", ".join(KEYS)
            raise UsageError(f"{path}: [tool.attnfuzz] unknown key {key!r} (known: {known})")
        check, wanted = KEYS[key]
        if not check(value):
            raise UsageError(f"{path}: [tool.attnfuzz] {key} must be {wanted}, got {value!r}")
        out[key] = _typed(key, value, path.parent)
    return out


def _typed(key: str, value: Any, base: Path) -> Any:
    if key in ("out", "cases"):
        return base / value
    if key == "db":
        remote = "://" in value or "github:" in value
        return value if remote else str(base / value)
    if key == "budget":
        return float(value)
    if key in ("targets", "mutants"):
        return list(value)
    return value
