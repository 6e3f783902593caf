"""Export a case file as a standalone pytest regression test.

The exported file embeds the case as a Python literal and needs nothing but
attnfuzz installed: it judges the implementation on the case with
:meth:`Target.judge`, so it fails while the bug is present and passes once it
is fixed. A trace case file's test replays the trace: its steps in order, by
one engine started afresh in a new process
(:meth:`~attnfuzz.harness.isolation.IsolatedJudge.judge_trace`, so that no
state another test left in the process is the engine's), and fails at the step
the bug is at. Every string taken from the case file enters the generated
source as a ``repr`` literal, never as code or inside a docstring.

The generated file passes ``ruff check`` and ``ruff format --check`` under the
default settings and any line length from 88 up: the embedded data sits between
``# fmt: off`` and ``# fmt: on``, laid out one item a line within 88 columns
(long strings split into adjacent literals in parentheses), so that no
formatter setting moves it; the rest is as ``ruff format`` writes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from attnfuzz.harness.casefile.load import resolve_case
from attnfuzz.harness.definitions import DEFAULT_REGRESSIONS, fit
from attnfuzz.harness.errors import UsageError
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace

DEFAULT_DIR = DEFAULT_REGRESSIONS
"""Where ``attnfuzz export`` writes, relative to the current directory: where a
project keeps its regression tests (this project's own pytest and ruff skip it)."""
LINE = 88
"""Columns of the generated file: ``ruff``'s and ``black``'s default line length."""
MAX_TEST_NAME = LINE - len("def ():")
"""``def NAME():`` then fits in :data:`LINE` columns."""


def _slug(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_") or "case"


def _plain(value: Any) -> Any:
    """JSON data whose ``repr`` is a literal: ``json`` reads ``NaN`` as a float
    that would print as the bare name ``nan``."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _escaped(c: str) -> str:
    if c in '\\"':
        return "\\" + c
    if c.isprintable():
        return c
    return repr(c)[1:-1]  # control characters, line separators, lone surrogates


def _string(text: str) -> str:
    """A double-quoted string literal (as ``ruff format`` writes them) of any text."""
    return '"' + "".join(_escaped(c) for c in text) + '"'


def _chunks(text: str, width: int) -> list[str]:
    """String literals of at most ``width`` columns whose concatenation is ``text``,
    cut after a space where one is near (an escape sequence is never cut in two)."""
    out: list[str] = []
    part: list[str] = []
    for piece in map(_escaped, text):
        if part and 2 + sum(map(len, part)) + len(piece) > width:
            spaces = [i for i, p in enumerate(part) if p == " " and i >= len(part) // 2]
            cut = spaces[-1] + 1 if spaces else len(part)
            out.append('"' + "".join(part[:cut]) + '"')
            part = part[cut:]
        part.append(piece)
    out.append('"' + "".join(part) + '"')
    return out


def _flat(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_string(k)}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    return repr(value)  # int, float, bool, None


def _literal(value: Any, indent: int = 0, head: int = 0, tail: int = 0) -> str:
    """A Python literal of JSON data, within :data:`LINE` columns where it can be.

    The literal starts ``head`` columns after ``indent`` and is followed by
    ``tail`` columns (a comma). What does not fit on that line is laid out one
    item a line; a scalar that does not fit moves to a line of its own in
    parentheses, a string as adjacent literals one a line.
    """
    flat = _flat(value)
    if indent + head + len(flat) + tail <= LINE:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict) and value:
        items = [
            f"{pad}{_string(k)}: {_literal(v, indent + 4, len(_string(k)) + 2, 1)},"
            for k, v in value.items()
        ]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and value:
        items = [f"{pad}{_literal(v, indent + 4, 0, 1)}," for v in value]
        return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"
    lines = _chunks(value, LINE - len(pad)) if isinstance(value, str) else [flat]
    return "(\n" + "".join(f"{pad}{line}\n" for line in lines) + " " * indent + ")"


def regression_test_name(
    target: str, found_on: str, impl: str, key: str, case: Case | Trace
) -> str:
    """``test_<target>__<found on>__<key>[__on_<impl>]_<digest>``: one name per case and
    implementation, so that two different cases never overwrite each other's file.

    Past :data:`MAX_TEST_NAME` characters the longest parts are cut, and the
    digest then covers the names as well as the case.
    """
    names = [target, found_on, key] + ([f"on {impl}"] if impl != found_on else [])
    parts = [_slug(p) for p in names]
    room = MAX_TEST_NAME - len("test_") - len("_01234567") - 2 * (len(parts) - 1)
    digested: Any = case.to_dict()
    if sum(map(len, parts)) > room:
        digested = [digested, names]
        parts = fit(parts, room)
    digest = hashlib.sha256(json.dumps(digested, sort_keys=True).encode()).hexdigest()[:8]
    return "test_" + "__".join(parts) + "_" + digest


def _assignments(values: Any) -> list[str]:
    """``LABEL = literal`` of each ``(label, value)``, laid out within the line length."""
    return [f"{label} = {_literal(_plain(value), 0, len(label) + 3)}" for label, value in values]


def render_test(
    name: str,
    target: str,
    impl: str,
    found_on: str,
    case: Case | Trace,
    verdict: dict[str, Any],
    derived: Any,
    step: int | None = None,
) -> str:
    """The source of a standalone pytest file whose test ``name`` judges ``impl`` on ``case``;
    of a trace, replays it (``step``: the step it was found failing at)."""
    if isinstance(case, Trace):
        return _render_trace_test(name, target, impl, found_on, case, verdict, derived, step)
    assignments = _assignments(
        (
            ("TARGET", target),
            ("IMPLEMENTATION", impl),
            ("FOUND_ON", found_on),
            ("DTYPE", case.dtype or "float32"),
            ("CASE", dataclasses.replace(case, dtype=None).to_dict()),
            ("FOUND", verdict),
            ("DERIVED", derived),
        )
    )
    data = "\n".join(assignments[:4]) + "\n\n" + "\n\n".join(assignments[4:])
    source = f'''"""Regression test exported by ``attnfuzz export``.

It judges IMPLEMENTATION on CASE, a minimized case the fuzzer found on
FOUND_ON, against the reference: it fails while the bug is present and passes
once it is fixed. Its float inputs are built in DTYPE, the dtype it was found
in. FOUND is the verdict when the case was found, DERIVED the quantities to
read the trigger off; neither is used by the test.
"""

from __future__ import annotations

from attnfuzz.harness.registry import get_target
from attnfuzz.reference.batch import Case

# The case file's data, one item a line within 88 columns; no formatter moves it.
# fmt: off
{data}
# fmt: on


def {name}():
    target = get_target(TARGET)
    implementation = target.resolve(IMPLEMENTATION)
    verdict = target.judge(implementation, Case.from_dict({{**CASE, "dtype": DTYPE}}))
    message = f"{{TARGET}} / {{IMPLEMENTATION}} fails the exported case:\\n{{verdict}}"
    assert verdict.ok, message
'''
    compile(source, f"{name}.py", "exec")  # generated code must at least parse
    return source


def _render_trace_test(
    name: str,
    target: str,
    impl: str,
    found_on: str,
    trace: Trace,
    verdict: dict[str, Any],
    derived: Any,
    step: int | None,
) -> str:
    """The source of a standalone pytest file whose test ``name`` replays ``trace`` on
    ``impl`` in a new process, step by step, and fails at the step that fails."""
    found_at = step if step is not None else len(trace.steps) - 1
    assignments = _assignments(
        (
            ("TARGET", target),
            ("IMPLEMENTATION", impl),
            ("FOUND_ON", found_on),
            ("DTYPE", trace.dtype or "float32"),
            ("STEP", found_at),
            ("TRACE", dataclasses.replace(trace, dtype=None).to_dict()),
            ("FOUND", verdict),
            ("DERIVED", derived),
        )
    )
    data = "\n".join(assignments[:5]) + "\n\n" + "\n\n".join(assignments[5:])
    source = f'''"""Regression test exported by ``attnfuzz export``.

It replays TRACE, a minimized trace of one engine's life that the fuzzer found
failing at step STEP on FOUND_ON, on IMPLEMENTATION: its steps in order, each
judged against the reference, by one engine started afresh in a new process (no
state another test left behind is the engine's). It fails, at the step that
fails, while the bug is present, and passes once it is fixed. Its float inputs
are built in DTYPE, the dtype it was found in. FOUND is the verdict when the
trace was found, DERIVED the quantities of its failing step (and one line per
step); neither is used by the test.
"""

from __future__ import annotations

from attnfuzz.harness.isolation import IsolatedJudge
from attnfuzz.harness.registry import get_target
from attnfuzz.reference.trace import Trace

# The case file's data, one item a line within 88 columns; no formatter moves it.
# fmt: off
{data}
# fmt: on


def {name}():
    target = get_target(TARGET)
    implementation = target.resolve(IMPLEMENTATION)
    trace = Trace.from_dict({{**TRACE, "dtype": DTYPE}})
    with IsolatedJudge(target, implementation) as judge:  # a new process: a new engine
        verdict = judge.judge_trace(trace)
    message = (
        f"{{TARGET}} / {{IMPLEMENTATION}} fails the exported trace at step {{verdict.step}} "
        f"(found failing at step {{STEP}}):\\n{{verdict}}"
    )
    assert verdict.ok, message
'''
    compile(source, f"{name}.py", "exec")  # generated code must at least parse
    return source


def export_case(path: Path | str, out: Path | str = DEFAULT_DIR, impl: str | None = None) -> Path:
    """Write the case file at ``path`` as a pytest file; returns the file written.

    ``out`` is a directory (created if needed) or a file name ending in ``.py``.
    A trace case file's test replays its trace step by step (see the module).
    """
    target, implementation, case, doc = resolve_case(path, impl, note_dtype=False)
    verdict = doc.get("verdict", {})
    found_on = doc["implementation"]
    name = regression_test_name(
        target.name, found_on, implementation.name, str(verdict.get("key", "failure")), case
    )
    source = render_test(
        name,
        target.name,
        implementation.name,
        found_on,
        case,
        verdict,
        doc.get("derived"),
        doc.get("step"),
    )
    out = Path(out)
    return write_script(out if out.suffix == ".py" else out / f"{name}.py", source)


def write_script(dest: Path, source: str) -> Path:
    """Write an exported script, its directories created; a one-line
    :class:`UsageError` where it cannot be written."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(source, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write {dest}: {err.strerror or err}") from err
    return dest
