"""How a benchmark script publishes its tables: it rewrites its own section of a docs page.

A section is the text between ``<!-- SCRIPT:NAME:begin -->`` and
``<!-- SCRIPT:NAME:end -->``, SCRIPT the script's name (``benchmarks/SCRIPT.py``)
and NAME one of the sections it writes. ``tests/test_docs.py`` holds every table
of measured numbers in the docs to such a section, so that none is copied by hand.
No heavy import here: ``releases.py`` runs without torch.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def marker(script: str, name: str, edge: str) -> str:
    """``<!-- SCRIPT:NAME:begin -->`` (``edge`` ``begin``) or ``...:end -->``."""
    return f"<!-- {script}:{name}:{edge} -->"


def write_section(path: Path, script: str, name: str, lines: Sequence[str]) -> None:
    """Replace what lies between the section's markers in ``path`` with ``lines``."""
    begin, end = marker(script, name, "begin"), marker(script, name, "end")
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path} has no {begin} ... {end} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(head + begin + "\n" + "\n".join(lines) + "\n" + end + tail)


def command_line(script: str, argv: Sequence[str], drop: Sequence[str] = ("--markdown",)) -> str:
    """The command that measured a table, as a reader would type it again: the
    script's arguments without ``--markdown FILE`` (where it was written) nor the
    other options ``drop`` names with their values (this machine's paths)."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in drop:
            skip = True
        elif not arg.startswith(tuple(f"{d}=" for d in drop)):
            args.append(arg)
    return shlex.join(["python", f"benchmarks/{script}.py", *args])
