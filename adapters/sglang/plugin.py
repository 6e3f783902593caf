"""The engine SGLang, declared to attnfuzz: the ``attnfuzz.engines`` entry point ``sglang``.

Each implementation names its adapter function by module and attribute
(:class:`attnfuzz.adapters.sglang.EngineCall`): importing an adapter imports
SGLang, which a plugin must not do when it loads.
"""

from __future__ import annotations

from attnfuzz.adapters import sglang
from attnfuzz.harness.engines import Engine
from attnfuzz.harness.target import Implementation


def _graph_input_padding() -> list[Implementation]:
    from attnfuzz.harness.targets import graph_input_padding as t

    return [
        sglang.implementation(
            "graph_runner",
            "run",
            name="sglang",
            description="installed SGLang: runner_utils/buffers.py:DecodeInputBuffers, "
            "cuda_graph_buffer_registry.py:build_decode_registry + "
            "CudaGraphBufferRegistry.fill_from, "
            "runner/decode_cuda_graph_runner.py:build_replay_fb_view",
        ),
        sglang.implementation(
            "graph_runner",
            "upstream_stale_swa_slots",
            name="upstream-pr24743-stale-swa-slots",
            kind="mutant",
            description="installed SGLang's decode buffer fill with #24743 reverted: padded "
            "tokens keep stale sliding-window slots",
            trigger=t.trigger_swa_padded,
            reach=t.reach_swa,
            smallest=t.smallest_stale_swa_slots,
        ),
    ]


IMPLEMENTATIONS: dict[str, list[Implementation]] = {
    "graph-input-padding": _graph_input_padding(),
}

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
