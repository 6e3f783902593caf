"""Loading a case file for replay: the one loader, for every command and the API.

:func:`target_and_case` reads a case file (:func:`~.read.read_case`), looks its
target up and refuses a case the engine could never produce;
:func:`resolve_case` also resolves the implementation that replays it
(``attnfuzz repro``, ``attnfuzz export``, the pytest plugin, ``attnfuzz.replay``);
:func:`refuse_missing` says how to name a case file relative to a test module.
``attnfuzz.load_case`` is :func:`refuse_missing` then :func:`target_and_case`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from attnfuzz.harness.casefile.read import read_case
from attnfuzz.harness.errors import MESSAGE_LIMIT, UsageError, one_line
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.traces import refuse_invalid_trace
from attnfuzz.reference.batch import DTYPE_VARIABLE, Case
from attnfuzz.reference.trace import Trace


def target_and_case(path: Path | str) -> tuple[Target, Case | Trace, dict[str, Any]]:
    """The target, case and document of a case file, the case in the float dtype it
    was found in, refused as ``attnfuzz repro`` refuses it (a one-line :class:`UsageError`).
    A trace case file's case is a :class:`~attnfuzz.reference.trace.Trace`."""
    doc = read_case(path)
    target = get_target(doc["target"])
    case = dataclasses.replace(doc["case"], dtype=doc["settings"]["dtype"])
    if isinstance(case, Trace):
        refuse_invalid_trace(target, case, str(path))
    else:
        target.refuse_invalid(case, str(path), alone=True)  # a new engine replays it
    return target, case, doc


def resolve_case(
    path: Path | str, impl: str | None = None, *, note_dtype: bool = True
) -> tuple[Target, Implementation, Case | Trace, dict[str, Any]]:
    """Read a case file and resolve what replays it: target, implementation, case, document.

    ``impl`` overrides the implementation the case was found on. A case file
    is data: a ``module:attribute`` it names is imported only when the caller
    names it again with ``impl``. Every problem (unknown name, a case the
    invariants refuse, one the implementation's engine never reaches:
    :class:`~attnfuzz.harness.errors.Unreachable`) is a one-line :class:`UsageError`.

    The case replays in the float dtype it records (``settings.dtype``, set as
    the returned case's ``dtype``), whatever ``ATTNFUZZ_DTYPE`` says: the case
    wins, and with ``note_dtype`` a setting that differs is said in one line on
    stderr. (A setting the device cannot run is refused before, by
    :func:`attnfuzz.harness.devices.check_device`.)
    """
    target, case, doc = target_and_case(path)
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
    implementation = target.resolve(name)
    # A state the implementation's engine never reaches is refused before anything
    # runs: neither a pass nor a failure of the engine (its limits: Implementation.admits).
    steps = case.cases() if isinstance(case, Trace) else [case]
    for k, step in enumerate(steps):
        where = f"{path}: step {k}" if isinstance(case, Trace) else str(path)
        target.refuse_unreachable(implementation, step, where)
    setting = os.environ.get(DTYPE_VARIABLE)
    if note_dtype and setting and case.dtype is not None and setting != case.dtype:
        note = (
            f"{DTYPE_VARIABLE}={setting} is not used: {path} was found in {case.dtype}, "
            "which the replay uses"
        )
        print(f"attnfuzz: note: {one_line(note, MESSAGE_LIMIT)}", file=sys.stderr)
    return target, implementation, case, doc


def refuse_missing(path: str | Path) -> None:
    """A relative path to nothing: a one-line :class:`UsageError` naming the path
    tried and how to name one relative to the test file (pytest, and so the current
    directory, may be started anywhere)."""
    if Path(path).is_absolute() or os.path.lexists(path):
        return  # anything else that is wrong is read_case's to say
    raise UsageError(
        f"no case file {path}: tried {Path.cwd() / path}, relative to the current "
        "directory; in a test module, name it relative to the module, e.g. "
        f"Path(__file__).parent / 'cases' / {Path(path).name!r}"
    )
