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
