"""Export a finding on engine code as a standalone reproduction (``export --standalone``).

The script is the implementation's own (``Implementation.standalone``): it imports
only the engine and torch, so a maintainer runs it without attnfuzz installed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from attnfuzz.harness.casefile.load import resolve_case
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.export import write_script
from attnfuzz.harness.guards import fits_in_memory
from attnfuzz.reference.batch import DEFAULT_FLOAT_DTYPE, using_float_dtype
from attnfuzz.reference.trace import Trace


def standalone_script(path: Path | str, impl: str | None = None) -> tuple[str, str]:
    """The standalone script of the case file at ``path`` and the implementation's name;
    a one-line :class:`UsageError` where the implementation has none."""
    target, implementation, case, _ = resolve_case(path, impl, note_dtype=False)
    if implementation.standalone is None:
        raise UsageError(
            f"{implementation.name!r} has no standalone reproduction "
            "(export --standalone is for engine findings that declare one)"
        )
    # The case's values, built on the CPU: the script writes them in as literals. A
    # trace's are each step's inputs, in order (its implementation picks the step).
    dtype = case.dtype or DEFAULT_FLOAT_DTYPE
    cpu = torch.device("cpu")
    with fits_in_memory(target.name), using_float_dtype(dtype):
        if isinstance(case, Trace):
            inputs = tuple(target.make_inputs(step, cpu) for step in case.cases())
        else:
            inputs = target.make_inputs(case, cpu)
    return implementation.standalone(inputs), implementation.name


def export_standalone(
    path: Path | str, out: Path | str | None = None, impl: str | None = None
) -> Path:
    """Write the standalone script of the case file at ``path`` to ``out`` (default:
    ``repro_<implementation>.py`` in the current directory); returns the file written."""
    source, name = standalone_script(path, impl)
    dest = Path(out) if out is not None else Path(f"repro_{name.replace('-', '_')}.py")
    if dest.is_dir():
        dest = dest / f"repro_{name.replace('-', '_')}.py"
    return write_script(dest, source)
