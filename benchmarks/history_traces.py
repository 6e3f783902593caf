"""Judgements to a replaying trace: every defect of an engine's life, seeds 0-9.

    python benchmarks/history_traces.py [--seeds 10] [--max-examples 1000] [--subject T:I ...]
                                        [--jobs 1] [--markdown docs/traces.md]

Each subject is run as a user runs it, ``attnfuzz run --target T --impl I --seed S
--max-examples N`` in a new process (its judges in children of their own):

- the stateful implementations of ``tests/``: those that keep state without saying how
  a new engine starts, run one step at a time (wrong only after an earlier call of the
  same process: the search says HISTORY-DEPENDENT, and the run turns its history into a
  trace, or searches traces afresh when the history fails as none); those with a
  ``new_engine``, with ``--trace``;
- every mutant that lives across steps (``traced``; an engine's own are left out,
  minutes a trace here), searched as traces directly.

Per subject: the seeds whose run ended at a trace that failed again in new processes
(``confirmed``), by which route (its history, a fresh trace search, or a traced
search), and the judgements that made the case, as the run counts them (``judgements
to this case``: the search and its shrinking, and every judgement in a new process:
replays, a history's traces). A count, not a time: it does not depend on the machine.
``--markdown FILE`` rewrites the section ``history_traces:judgements`` of FILE.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import median, table
from _markdown import command_line, write_section

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

STATEFUL = (
    ("max-seq-len", "stateful_impl:first_call_buffer", False),
    ("max-seq-len", "stateful_impl:previous_call_buffer", False),
    ("max-seq-len", "stateful_impl:full_after_fewer", True),
    ("max-seq-len", "boundary_impls:decode_len_cache", True),
    ("persistent-batch", "boundary_impls:last_page_slots", True),
)
"""The user implementations of ``tests/`` whose answer depends on what ran before, and
whether a user runs it with ``--trace``: one that says how a new engine starts
(``new_engine``) gets a new engine before each single-step example, where it is right,
so only traces meet its defect."""

TOTAL = re.compile(r"judgements to this case: (\d+) ")
STEPS = re.compile(r"minimized trace: (\d+) step")


def traced_mutants() -> list[tuple[str, str, bool]]:
    from attnfuzz.harness.registry import get_target, target_names

    out = []
    for name in target_names():
        for impl in get_target(name).mutants:
            if impl.traced and impl.engine is None:
                out.append((name, impl.name, False))  # traced by its declaration
    return out


def run_once(target: str, impl: str, trace: bool, seed: int, max_examples: int) -> dict:
    """One ``attnfuzz run`` in a new process; what its output says."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
        )
        args = ["--target", target, "--impl", impl, "--seed", str(seed),
                "--max-examples", str(max_examples), "--out", out,
                *(["--trace"] if trace else [])]  # fmt: skip
        exe = [sys.executable, "-m", "attnfuzz", "run", *args]
        done = subprocess.run(exe, cwd=out, env=env, capture_output=True, text=True)
    text = done.stdout + done.stderr
    total, steps = TOTAL.search(text), STEPS.search(text)
    if "its history replays" in text:
        route = "history"
    elif "searching again as traces" in text:
        route = "trace search"
    elif "HISTORY-DEPENDENT" in text:
        route = "history-dependent, no trace"
    else:
        route = "traced search"
    return {
        "exit": done.returncode,
        "trace": done.returncode == 1 and steps is not None and "confirmed:" in text,
        "route": route,
        "judgements": int(total[1]) if total else None,
        "steps": int(steps[1]) if steps else None,
    }


def _subject(spec: str) -> tuple[str, str, bool]:
    target, impl = spec.split(":", 1)
    trace = impl.endswith(":trace")
    return target, impl.removesuffix(":trace"), trace


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--max-examples", type=int, default=1000)
    parser.add_argument(
        "--subject", action="append", default=None, help="TARGET:IMPL (TARGET:IMPL:trace)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side")
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    subjects = (
        [_subject(s) for s in args.subject] if args.subject else [*STATEFUL, *traced_mutants()]
    )
    rows, ok = [], True
    # Each run is a process of its own and counts judgements, not time: side by side
    # they give the same table, sooner.
    with ThreadPoolExecutor(args.jobs) as pool:
        pending = {
            (target, impl, trace): [
                pool.submit(run_once, target, impl, trace, s, args.max_examples)
                for s in range(args.seeds)
            ]
            for target, impl, trace in subjects
        }
        for (target, impl, trace), futures in pending.items():
            runs = [f.result() for f in futures]
            traced = [r for r in runs if r["trace"]]
            counts = [r["judgements"] for r in traced if r["judgements"] is not None]
            routes = sorted({r["route"] for r in runs})
            ok &= len(traced) == args.seeds
            rows.append([
                target, impl + (" (--trace)" if trace else ""), f"{len(traced)}/{args.seeds}",
                ", ".join(routes),
                f"{median(counts):.0f}", f"{max(counts, default=0)}",
                f"{max((r['steps'] or 0 for r in traced), default=0)}",
            ])  # fmt: skip
            print(f"{target}/{impl}: {rows[-1][2:]}", file=sys.stderr, flush=True)
    title = (
        f"Judgements to a replaying trace (seeds 0-{args.seeds - 1}, "
        f"--max-examples {args.max_examples}; a count, not a time)"
    )
    header = ["target", "implementation", "replaying trace", "route", "median judgements",
              "most judgements", "most steps"]  # fmt: skip
    text = table(header, rows)
    print(f"{title}\n\n{text}")
    if args.markdown is not None:
        command = command_line("history_traces", sys.argv[1:])
        write_section(
            args.markdown,
            "history_traces",
            "judgements",
            [f"{title}: `{command}`.", "", *text.splitlines()],
        )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
