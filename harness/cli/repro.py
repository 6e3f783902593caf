"""``attnfuzz repro``: replay a case file, in isolation, on its implementation or another."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnfuzz.harness.cli.args import add_device_argument, add_timeout_argument, one_line
from attnfuzz.harness.definitions import EXIT_FOUND, EXIT_OK
from attnfuzz.harness.target import Implementation

HELP = "replay a case file"
CHECKS_DEVICE = True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("case", type=Path)
    p.add_argument(
        "--impl", default=None, help="another implementation to replay it on (or TARGET=IMPL)"
    )
    add_device_argument(p)
    add_timeout_argument(p, "for the replay (default: the case's, else 30s)")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness.export import load_case
    from attnfuzz.harness.isolation import DEFAULT_TIMEOUT_S, IsolatedJudge
    from attnfuzz.harness.registry import split_impl_spec
    from attnfuzz.harness.target import UsageError

    named, spec = split_impl_spec(args.impl) if args.impl else (None, None)
    # A case file is data: it never makes attnfuzz import a module (see load_case).
    target, impl, case, doc = load_case(args.case, spec)
    if named is not None and named != target.name:
        raise UsageError(f"--impl {args.impl} names target {named}; the case is of {target.name}")
    device = args.device  # checked by main() before any work
    note_engine_version(doc, impl)
    # The timeout the case was found under, so that a hang replays as a hang.
    timeout = args.example_timeout or doc["settings"].get("example_timeout") or DEFAULT_TIMEOUT_S
    with IsolatedJudge(target, impl, device, timeout) as isolated:
        verdict = isolated.judge(case)
    lines = str(verdict).splitlines()
    print(f"{target.name} / {impl.name}: {lines[0]}")
    for line in lines[1:]:
        print("  " + one_line(line.strip()))
    return EXIT_OK if verdict.ok else EXIT_FOUND


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
        print(f"attnfuzz: note: {one_line(note)}", file=sys.stderr)
