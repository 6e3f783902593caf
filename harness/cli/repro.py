"""``attnfuzz repro``: replay a case file, in isolation, on its implementation or another."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnfuzz.harness.cli.args import (
    MESSAGE_LIMIT,
    add_device_argument,
    add_timeout_argument,
    one_line,
)
from attnfuzz.harness.definitions import EXIT_FOUND, EXIT_LATENT, EXIT_OK, VERSION

if TYPE_CHECKING:  # the command imports what it runs when it runs
    from attnfuzz.harness.target import Implementation
    from attnfuzz.reference.trace import Trace

HELP = "replay a case file"
CHECKS_DEVICE = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("case", type=Path)
    p.add_argument(
        "--impl", default=None, help="another implementation to replay it on (or TARGET=IMPL)"
    )
    add_device_argument(p)
    add_timeout_argument(p, "for the replay (default: the case's, else 30s)")
    p.add_argument("--json", action="store_true", help="the verdict and differences as JSON")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness.casefile.load import resolve_case
    from attnfuzz.harness.errors import UsageError
    from attnfuzz.harness.isolation import DEFAULT_TIMEOUT_S, IsolatedJudge
    from attnfuzz.harness.oracle import Check
    from attnfuzz.harness.reachability import finding_reachability, is_latent
    from attnfuzz.harness.registry import split_impl_spec
    from attnfuzz.harness.runner import RunResult
    from attnfuzz.harness.traces import reachable_step
    from attnfuzz.reference.trace import Trace

    named, spec = split_impl_spec(args.impl) if args.impl else (None, None)
    # A case file is data: it never makes attnfuzz import a module (see resolve_case).
    target, impl, case, doc = resolve_case(args.case, spec)
    if named is not None and named != target.name:
        raise UsageError(f"--impl {args.impl} names target {named}; the case is of {target.name}")
    device = args.device  # checked by main() before any work
    note_engine_version(doc, impl)
    # The timeout the case was found under, so that a hang replays as a hang.
    timeout = args.example_timeout or doc["settings"].get("example_timeout") or DEFAULT_TIMEOUT_S
    reach = None
    with IsolatedJudge(target, impl, device, timeout) as isolated:
        if isinstance(case, Trace):  # one engine's steps, in order, in a new process
            verdict = isolated.judge_trace(case)
        else:
            verdict = isolated.judge(case)
        # Computed on replay (a case file may predate it, or the engine moved); never of a
        # timeout: where the engine runs code says nothing of how fast this machine runs it.
        if not verdict.ok and verdict.key != Check.TIMEOUT:
            replayed = RunResult(target.name, impl.name, case=case, verdict=verdict)
            step_case, step_judge = reachable_step(replayed, isolated.judge_trace, isolated.judge)
            reach = finding_reachability(target, impl, step_case, step_judge)
    latent = is_latent(reach)
    failed = EXIT_LATENT if latent else EXIT_FOUND
    found_elsewhere = differences(doc, impl, device)
    if args.json:
        print(
            json.dumps(
                {
                    "target": target.name,
                    "implementation": impl.name,
                    "ok": verdict.ok,
                    "key": None if verdict.ok else verdict.key,
                    "step": verdict.step,
                    "mismatches": [m.to_dict() for m in verdict.mismatches],
                    "differences": found_elsewhere,
                    "reachability": None if reach is None else reach.to_dict(),
                },
                indent=2,
            )
        )
        return EXIT_OK if verdict.ok else failed
    lines = str(verdict).splitlines()
    if latent:  # its own verdict word: the engine never runs it on such metadata
        lines[0] = lines[0].replace("FAIL", "LATENT", 1)
    print(f"{target.name} / {impl.name}: {lines[0]}")
    if isinstance(case, Trace):
        print_steps(case, verdict.step, doc.get("step"))
    for line in lines[1:]:
        print("  " + one_line(line.strip(), MESSAGE_LIMIT))
    for d in found_elsewhere:  # a verdict read beside where the case was recorded
        what = f"recorded with {d['what']} {d['recorded']}, replayed with {d['here']}"
        print("  " + one_line(what, MESSAGE_LIMIT))
    if reach is not None:
        for line in reach.lines():
            print(one_line(line, MESSAGE_LIMIT))
    flaky = doc.get("flaky")
    if flaky and verdict.ok:
        print(
            f"  found flaky: it failed {flaky['failed']} of {flaky['replays']} replays of the "
            "same case, each in a new process, when it was found; this replay passed"
        )
    if doc.get("history_dependent") and verdict.ok:
        print(
            "  found history-dependent: it failed only after other examples ran in the same "
            "process; attnfuzz run --trace searches it as one engine's steps"
        )
    return EXIT_OK if verdict.ok else failed


def differences(doc: dict, impl: Implementation, device: str | None) -> list[dict[str, str]]:
    """What differs between where the case was recorded and this replay: attnfuzz's
    version, the device, the engine's version (for a case of an engine's code, replayed
    on it), the float dtype the environment asks for (the recorded one is used)."""
    import os

    from attnfuzz.harness.casefile import engine_versions
    from attnfuzz.kernels._triton import device as kernel_device
    from attnfuzz.reference.batch import DTYPE_VARIABLE

    recorded = doc.get("environment", {})
    here_device = str(device or kernel_device())
    rows = [
        ("attnfuzz", recorded.get("attnfuzz"), VERSION),
        ("device", recorded.get("device"), here_device),
    ]
    found = doc.get("engine")
    if found is not None and impl.engine == found["name"]:
        rows.append(
            (found["name"], found["version"], engine_versions().get(found["name"], "absent"))
        )
    asked = os.environ.get(DTYPE_VARIABLE)
    dtype = doc.get("settings", {}).get("dtype")
    if asked and dtype and asked != dtype:
        rows.append((f"dtype (the recorded one is used; {DTYPE_VARIABLE} asks)", dtype, asked))
    out = []
    for what, then, now in rows:
        if then is None or str(then).split(":")[0] == str(now).split(":")[0]:
            continue  # cuda:0 and cuda are one device kind
        out.append({"what": what, "recorded": str(then), "here": str(now)})
    return out


def note_engine_version(doc: dict, impl: Implementation) -> None:
    """Say so when a case found on an engine's code replays on another version of it."""
    from attnfuzz.harness.casefile import engine_versions

    found = doc.get("engine")
    if found is None or impl.engine != found["name"]:
        return
    installed = engine_versions().get(found["name"], "absent")
    if installed != found["version"]:
        note = (
            f"this case was found on {found['name']} {found['version']}; "
            f"{found['name']} {installed} is installed here, and replays it"
        )
        print(f"attnfuzz: note: {one_line(note, MESSAGE_LIMIT)}", file=sys.stderr)


def print_steps(trace: Trace, failed_at: int | None, recorded: int | None) -> None:
    """A trace's steps as they replayed: each passed, failed, or was not reached."""
    from attnfuzz.reference.trace import step_summary

    for k, step in enumerate(trace.steps):
        if failed_at is None or k < failed_at:
            mark = "ok"
        else:
            mark = "FAILS" if k == failed_at else "not run"
        summary = step_summary(trace.steps[k - 1] if k else None, step)
        print("  " + one_line(f"step {k} [{mark}]: {summary}", MESSAGE_LIMIT))
    if recorded is not None and failed_at != recorded:
        where = "passes" if failed_at is None else f"fails at step {failed_at}"
        print(f"  recorded failing at step {recorded}; replayed here it {where}")
