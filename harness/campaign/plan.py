"""Planning a campaign: its runs (target x implementation) and the work items of its workers."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnfuzz.harness.target import UsageError


@dataclass(frozen=True)
class Unit:
    """One target x implementation of the campaign (a run of campaign.json)."""

    target: str
    impl: str
    kind: str


def plan_units(
    targets: list[str] | None,
    impls: list[str] | None,
    zoo: bool,
    mutants: Sequence[tuple[str, str]] = (),
) -> list[Unit]:
    """Every selected target against every selected implementation it has.

    A registered name applies to the targets that have it (it must exist on
    one of them); ``module:attribute`` applies to every selected target.
    ``mutants`` are ``(target, mutant)`` pairs a user registered
    (``--mutants``): each runs on its target when that target is selected.
    """
    from attnfuzz.harness.registry import get_target, target_names

    names = targets or target_names()
    for name in names:
        get_target(name)  # a one-line UsageError for an unknown name
    units: list[Unit] = []
    for spec in impls or []:
        if ":" in spec:
            continue
        if not any(spec in get_target(t).implementations for t in names):
            raise UsageError(f"no selected target has an implementation {spec!r}")
    for name in dict.fromkeys(names):
        target = get_target(name)
        target.float_dtype_name()  # ATTNFUZZ_DTYPE it cannot build in: a usage error now
        chosen: list[str] = []
        if impls is None:
            chosen += [i.name for i in target.implementations.values() if i.kind == "fixed"]
        else:
            chosen += [s for s in impls if ":" in s or s in target.implementations]
        if zoo:
            chosen += [m.name for m in target.mutants]
        chosen += [m for t, m in mutants if t == target.name]
        for spec in dict.fromkeys(chosen):
            impl = target.resolve(spec)  # imports a user's module: a UsageError if it cannot
            units.append(Unit(name, impl.name, impl.kind))
    if not units:
        raise UsageError("nothing to run: no selected target has a selected implementation")
    return units


def shards_per_unit(units: int, workers: int) -> int:
    """Enough shards that the items divide evenly among the workers."""
    return workers // math.gcd(units, workers)


def plan_items(units: list[Unit], workers: int, max_examples: int | None) -> list[dict[str, Any]]:
    """The work units of the pytest run, in the order they are handed out."""
    shards = shards_per_unit(len(units), workers)
    items = []
    # Mutants first: a caught mutant ends early, and the time it leaves goes
    # to the units after it (see campaign_worker.item_deadline).
    order = sorted(range(len(units)), key=lambda u: units[u].kind != "mutant")
    for u in order:
        unit = units[u]
        for s in range(shards):
            cap = None
            if max_examples is not None:  # split the unit's examples among its shards
                cap = max_examples // shards + (1 if s < max_examples % shards else 0)
            items.append(
                {
                    "id": f"u{u:03d}s{s:02d}",
                    "unit": u,
                    "shard": s,
                    "target": unit.target,
                    "impl": unit.impl,
                    "kind": unit.kind,
                    "max_examples": cap,
                }
            )
    return items


def import_root(module_name: str) -> str | None:
    """The sys.path entry a user's module was imported from, for the workers."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    path = Path(file).resolve().parent
    depth = module_name.count(".") + (1 if Path(file).name == "__init__.py" else 0)
    return str(path.parents[depth - 1]) if depth else str(path)
