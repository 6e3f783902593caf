"""The registered targets: one module per target under ``attnfuzz.harness.targets``.

A module ``foo_bar.py`` there with a ``build() -> Target`` function is the
target ``foo-bar``; adding a target is adding its file. Targets are built on
first use (building imports the Triton kernels).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from attnfuzz.harness import targets
from attnfuzz.harness.target import Target, UsageError


@cache
def target_names() -> list[str]:
    modules = pkgutil.iter_modules(targets.__path__)
    return sorted(m.name.replace("_", "-") for m in modules if not m.name.startswith("_"))


@cache
def get_target(name: str) -> Target:
    if name not in target_names():
        raise UsageError(f"unknown target {name!r} (known: {', '.join(target_names())})")
    module = importlib.import_module(f"{targets.__name__}.{name.replace('-', '_')}")
    target = module.build()
    assert target.name == name, f"{module.__name__} builds {target.name!r}, expected {name!r}"
    return target


def unavailable_mutants(names: list[str] | None = None) -> dict[str, list[str]]:
    """``reason -> ["target/mutant", ...]``: the mutants that cannot run here (an
    engine's upstream mutants where the engine is not installed)."""
    left: dict[str, list[str]] = {}
    for name in names or target_names():
        target = get_target(name)
        for impl_name, reason in target.unavailable().items():
            if target.implementations[impl_name].kind == "mutant":
                left.setdefault(reason, []).append(f"{name}/{impl_name}")
    return left
