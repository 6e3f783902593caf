"""``attnfuzz list``: targets, their implementations and mutants."""

from __future__ import annotations

import argparse
import json

from attnfuzz.harness.definitions import EXIT_OK

HELP = "targets, implementations and mutants"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def command(args: argparse.Namespace) -> int:
    from attnfuzz.harness import registry
    from attnfuzz.harness.registry import get_target, target_names

    rows = []
    for name in target_names():
        target = get_target(name)
        rows.append(
            {
                "target": name,
                "summary": target.summary,
                "implementations": [
                    {
                        "name": i.name,
                        "kind": i.kind,
                        "description": i.description,
                        "engine": i.engine,
                        # Why it cannot run here (an engine not installed), or null.
                        "unavailable": i.why_unavailable(),
                    }
                    for i in target.implementations.values()
                ],
            }
        )
    # Targets of other distributions (entry points) that could not be built, with why.
    broken = registry.unavailable_targets()
    if args.json:
        rows += [
            {"target": name, "summary": None, "implementations": [], "unavailable": why}
            for name, why in broken.items()
        ]
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    reasons: dict[str, None] = {}
    for row in rows:
        print(f"{row['target']}: {row['summary']}")
        for impl in row["implementations"]:
            mark = ""
            if impl["unavailable"] is not None:
                mark = " (unavailable)"
                reasons[impl["unavailable"]] = None
            print(f"  {impl['name']:<28} {impl['kind']:<9} {impl['description']}{mark}")
    for reason in reasons:
        print(f"unavailable: {reason}")
    for name, why in broken.items():
        print(f"{name}: unavailable target ({why})")
    return EXIT_OK
