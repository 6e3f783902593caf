"""Load a case file for replay, and export it as a standalone pytest regression test.

The exported file embeds the case as a Python literal and needs nothing but
attnfuzz installed: it judges the implementation on the case with
:meth:`Target.judge`, so it fails while the bug is present and passes once it
is fixed. Every string taken from the case file enters the generated source as
a ``repr`` literal, never as code or inside a docstring.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import Implementation, Target, UsageError
from attnfuzz.reference.batch import Case

DEFAULT_DIR = Path("tests") / "regressions"


def load_case(
    path: Path | str, impl: str | None = None
) -> tuple[Target, Implementation, Case, dict[str, Any]]:
    """Read a case file and resolve what replays it: target, implementation, case, document.

    ``impl`` overrides the implementation the case was found on. A case file
    is data: a ``module:attribute`` it names is imported only when the caller
    names it again with ``impl``. Every problem (unknown name, a case the
    invariants refuse) is a one-line :class:`UsageError`.
    """
    doc = read_case(path)
    target = get_target(doc["target"])
    case: Case = doc["case"]
    target.refuse_invalid(case, str(path))
    name = impl or doc["implementation"]
    if impl is None and name not in target.implementations:
        if ":" in name:
            raise UsageError(
                f"{path} was found on {name!r}, which is not registered; "
                f"replay it with --impl {name}"
            )
        known = ", ".join(target.implementations)
        raise UsageError(
            f"{path}: unknown implementation {name!r} for {target.name} (known: {known})"
        )
    return target, target.resolve(name), case, doc


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


def _string(text: str) -> str:
    """A double-quoted string literal (as ``ruff format`` writes them) of any text."""
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        else:  # control characters, line separators, lone surrogates: escaped
            out.append(repr(c)[1:-1])
    return '"' + "".join(out) + '"'


def _flat(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_string(k)}: {_flat(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flat(v) for v in value) + "]"
    return repr(value)  # int, float, bool, None


def _literal(value: Any, indent: int = 0) -> str:
    """A Python literal of JSON data, one item a line where it does not fit in one."""
    value = _plain(value) if indent == 0 else value
    flat = _flat(value)
    if indent + len(flat) <= 88 or not isinstance(value, dict | list) or not value:
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{_string(k)}: {_literal(v, indent + 4)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    items = [f"{pad}{_literal(v, indent + 4)}," for v in value]
    return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"


def regression_test_name(target: str, found_on: str, impl: str, key: str, case: Case) -> str:
    """``test_<target>__<found on>__<key>[__on_<impl>]_<digest>``: one name per case and
    implementation, so that two different cases never overwrite each other's file."""
    digest = hashlib.sha256(json.dumps(case.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
    parts = [target, found_on, key] + ([f"on {impl}"] if impl != found_on else [])
    return "test_" + "__".join(_slug(p) for p in parts) + "_" + digest


def render_test(
    name: str,
    target: str,
    impl: str,
    found_on: str,
    case: Case,
    verdict: dict[str, Any],
    derived: Any,
) -> str:
    """The source of a standalone pytest file whose test ``name`` judges ``impl`` on ``case``."""
    source = f'''"""Regression test exported by ``attnfuzz export``.

It judges IMPLEMENTATION on CASE, a minimized case the fuzzer found on
FOUND_ON, against the reference: it fails while the bug is present and passes
once it is fixed. FOUND is the verdict when the case was found, DERIVED the
quantities to read the trigger off; neither is used by the test.
"""

from __future__ import annotations

from attnfuzz.harness.registry import get_target
from attnfuzz.reference.batch import Case

TARGET = {_string(target)}
IMPLEMENTATION = {_string(impl)}
FOUND_ON = {_string(found_on)}

CASE = {_literal(case.to_dict())}

FOUND = {_literal(verdict)}

DERIVED = {_literal(derived)}


def {name}() -> None:
    target = get_target(TARGET)
    verdict = target.judge(target.resolve(IMPLEMENTATION), Case.from_dict(CASE))
    assert verdict.ok, f"{{TARGET}} / {{IMPLEMENTATION}} fails the exported case:\\n{{verdict}}"
'''
    compile(source, f"{name}.py", "exec")  # generated code must at least parse
    return source


def export_case(path: Path | str, out: Path | str = DEFAULT_DIR, impl: str | None = None) -> Path:
    """Write the case file at ``path`` as a pytest file; returns the file written.

    ``out`` is a directory (created if needed) or a file name ending in ``.py``.
    """
    target, implementation, case, doc = load_case(path, impl)
    verdict = doc.get("verdict") if isinstance(doc.get("verdict"), dict) else {}
    found_on = doc["implementation"]
    name = regression_test_name(
        target.name, found_on, implementation.name, str(verdict.get("key", "failure")), case
    )
    source = render_test(
        name, target.name, implementation.name, found_on, case, verdict, doc.get("derived")
    )
    out = Path(out)
    dest = out if out.suffix == ".py" else out / f"{name}.py"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(source, encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write {dest}: {err.strerror or err}") from err
    return dest
