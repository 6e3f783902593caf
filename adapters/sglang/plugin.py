"""The engine SGLang, declared to attnfuzz: the ``attnfuzz.engines`` entry point ``sglang``.

Each implementation names its adapter function by module and attribute
(:class:`attnfuzz.adapters.sglang.EngineCall`): importing an adapter imports
SGLang, which a plugin must not do when it loads.
"""

from __future__ import annotations

from attnfuzz.adapters import sglang
from attnfuzz.harness.engines import Engine
from attnfuzz.harness.target import Implementation

IMPLEMENTATIONS: dict[str, list[Implementation]] = {}

SGLANG = Engine(
    name=sglang.ENGINE,
    install=sglang.INSTALL,
    installed_version=lambda: sglang.installed_version(),
    unavailable=lambda: sglang.unavailable(),
    status=lambda: sglang.status(),
    implementations=IMPLEMENTATIONS,
    planner=None,
)
"""The engine SGLang (the value of the entry point ``sglang``)."""
