"""How long CI takes, step by step: ``.ci/run`` on a fresh clone of this checkout's HEAD.

    python benchmarks/ci.py [--beside] [--fast-tier-only] [--markdown FILE] [--readme FILE]

``.ci/run`` prints each command it starts with the seconds since it began
(``[ci 123s] COMMAND``); this script clones HEAD into a scratch
directory, runs it there and prints one row per command: its seconds, and the
total. ``--beside`` runs a second ``pytest -n auto`` (the fast tier, in another
clone) beside it for as long as CI runs, as a shared CI machine may. The
goals, on a 2-core machine: the README's test command (the fast tier) at most
10 minutes idle, the whole of ``.ci/run`` at most 45. ``--fast-tier-only``
times the README's two commands only. ``--markdown FILE`` rewrites the section
``ci:steps`` of FILE with the table, ``--readme FILE`` the section ``ci:readme``
(the README's sentence on how long its two commands took; an idle, green run
only); ``--log FILE`` keeps CI's whole output.
Nothing here asserts a time: it is measured.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _markdown import command_line, write_section
from attnfuzz.harness.definitions import markdown_table as table

ROOT = Path(__file__).resolve().parent.parent
STEP = re.compile(r"^\[ci (\d+)s\] (.*)$")


def clone(into: Path) -> Path:
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(into)], check=True)
    return into


def steps_of(log: str, total: float) -> list[tuple[str, float]]:
    """(command, seconds) for each command ``.ci/run`` announced, to the next one's start."""
    starts = [(int(m[1]), m[2]) for m in map(STEP.match, log.splitlines()) if m]
    starts = [(t, c) for t, c in starts if not c.startswith("export ")]  # settings, no step
    out = []
    for k, (t, command) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else total
        out.append((command, end - t))
    return out


def run_ci(workdir: Path, fast_tier_only: bool, beside: bool) -> tuple[int, str, float]:
    repo = clone(workdir / "ci")
    script = repo / ".ci" / "run"
    if fast_tier_only:  # the README's two commands: the lines up to the second one
        text = script.read_text()
        cut = text.index(".venv/bin/pytest -n auto")
        # A script of its own beside .ci/run (which cds to the clone from where it
        # lies): .ci/run itself stays whole, as the tests that read it expect.
        script = script.with_name("run-fast-tier")
        script.write_text(text[: text.index("\n", cut) + 1])
        script.chmod(0o755)
    other = None
    if beside:
        second = clone(workdir / "beside")
        subprocess.run(["./setup.sh"], cwd=second, check=True, stdout=subprocess.DEVNULL)
        other = subprocess.Popen(
            ["bash", "-c", "while .venv/bin/pytest -n auto -q >/dev/null 2>&1; do :; done"],
            cwd=second,
            start_new_session=True,
        )
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [str(script)], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    finally:
        if other is not None:
            os.killpg(other.pid, 15)
            other.wait()
    return proc.returncode, proc.stdout, time.monotonic() - start


def readme_figures(steps: list[tuple[str, float]], cores: int) -> str:
    """The README's sentence on its two commands: the first set-up, the campaign and
    the test command, in the order ``.ci/run`` ran them."""
    setup = next(s for c, s in steps if c == "./setup.sh")
    campaign = next(s for c, s in steps if "attnfuzz campaign" in c)
    tests = next(s for c, s in steps if c.startswith(".venv/bin/pytest"))
    return (
        f"On a fresh clone on a {cores}-core machine, otherwise idle, the campaign took "
        f"{campaign / 60:.1f} minutes and the tests {tests / 60:.1f} (after {setup / 60:.1f} "
        "minutes of set-up; measured by `python benchmarks/ci.py`, [CI](docs/performance.md#ci))."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--beside", action="store_true", help="a second test suite runs beside")
    parser.add_argument("--fast-tier-only", action="store_true", help="the README's commands")
    parser.add_argument("--markdown", type=Path, default=None, help="file to update")
    parser.add_argument("--log", type=Path, default=None, help="write CI's whole output here")
    parser.add_argument("--readme", type=Path, default=None, help="README whose figures to update")
    args = parser.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()  # the commit the clone measures
    with tempfile.TemporaryDirectory(prefix="attnfuzz-ci-") as scratch:
        code, log, total = run_ci(Path(scratch), args.fast_tier_only, args.beside)
    if args.log is not None:
        args.log.write_text(log)
    steps = steps_of(log, total)
    rows = [[command, f"{seconds / 60:.1f}"] for command, seconds in steps]
    failed = f" (failed: exit {code})" if code else ""
    rows.append([f"**all of it**{failed}", f"{total / 60:.1f}"])
    cores = len(os.sched_getaffinity(0))
    title = f"`.ci/run` on a fresh clone, {cores} cores" + (
        ", a second `pytest -n auto` beside it" if args.beside else ", nothing beside it"
    )
    lines = [
        title + ":",
        "",
        table(["command", "minutes"], rows, pad=False),
        "",
        f"Measured by `{command_line('ci', sys.argv[1:], drop=('--markdown', '--log'))}`"
        f" (commit {head}).",
    ]
    print("\n".join(lines))
    if args.markdown is not None:
        write_section(args.markdown, "ci", "steps", lines)
    if args.readme is not None and not code and not args.beside:
        write_section(args.readme, "ci", "readme", [readme_figures(steps, cores)])
    if code:
        print(log[-4000:], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
