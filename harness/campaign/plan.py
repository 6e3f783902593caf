"""Planning a campaign: its runs (target x implementation) and the work items of its workers."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnfuzz.harness.errors import UsageError


@dataclass(frozen=True)
class Unit:
    """One target x implementation of the campaign (a run of campaign.json)."""

    target: str
    impl: str
    kind: str
    # Fuzzed with traces of one engine's steps (``--trace``, or an implementation
    # that lives across steps: ``Implementation.traced``).
    traced: bool = False


def plan_units(
    targets: list[str] | None,
    impls: list[str] | None,
    zoo: bool,
    mutants: Sequence[tuple[str, str]] = (),
    trace: bool = False,
) -> list[Unit]:
    """Every selected target against every selected implementation it has.

    ``TARGET=IMPL`` applies to that target alone (selected by it when no
    ``targets`` are given). A bare registered name applies to the targets that
    have it (it must exist on one of them); a bare ``module:attribute`` is a
    user's code written for one target's inputs, so it needs exactly one
    selected target. ``mutants`` are ``(target, mutant)`` pairs a user
    registered (``--mutants``): each runs on its target when that target is selected.
    ``trace`` fuzzes every unit with traces; an implementation that lives across
    steps (``Implementation.traced``) is fuzzed with traces whatever it says.
    """
    from attnfuzz.harness.registry import get_target, split_impl_spec, target_names

    pairs = [split_impl_spec(spec) for spec in impls or []]
    named = [t for t, _ in pairs if t is not None]
    if targets:
        names = targets
    elif pairs and all(t is not None for t, _ in pairs):
        names = list(dict.fromkeys(named))
    else:
        names = target_names()
    for name in [*names, *named]:
        get_target(name)  # a one-line UsageError for an unknown name
    for t in named:
        if t not in names:
            raise UsageError(
                f"--impls {t}=...: target {t} is not among --targets {' '.join(names)}"
            )
    units: list[Unit] = []
    for target_name, spec in pairs:
        if target_name is not None:
            continue
        if ":" in spec:
            if len(set(names)) > 1:
                raise UsageError(
                    f"--impls {spec}: a module:attribute is written for one target's inputs, "
                    f"and the campaign has {len(set(names))} targets; name it, e.g. "
                    f"{names[0]}={spec}"
                )
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
            for t, spec in pairs:
                if t == name or (t is None and (":" in spec or spec in target.implementations)):
                    chosen.append(spec)
        if zoo:
            chosen += [m.name for m in target.mutants]
        chosen += [m for t, m in mutants if t == target.name]
        for spec in dict.fromkeys(chosen):
            impl = target.resolve(spec)  # imports a user's module: a UsageError if it cannot
            units.append(Unit(name, impl.name, impl.kind, trace or impl.traced))
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
    # to the units after it (see budget.item_deadline).
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
                    "traced": unit.traced,
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
