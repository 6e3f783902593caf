"""The registered targets, built on first use (building imports the Triton kernels)."""

from __future__ import annotations

import importlib
from functools import cache

from attnfuzz.harness.target import Target, UsageError

# target name -> module under attnfuzz.harness.targets that builds it
_MODULES: dict[str, str] = {
    "indexer-decode": "indexer_decode",
}


def target_names() -> list[str]:
    return list(_MODULES)


@cache
def get_target(name: str) -> Target:
    if name not in _MODULES:
        raise UsageError(f"unknown target {name!r} (known: {', '.join(_MODULES)})")
    module = importlib.import_module(f"attnfuzz.harness.targets.{_MODULES[name]}")
    return module.build()
