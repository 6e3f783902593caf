"""vLLM's CPU platform for attnfuzz's vLLM adapters, as a vLLM platform plugin.

vLLM picks its platform through plugins (entry point group
``vllm.platform_plugins``; ``vllm/platforms/__init__.py``,
``resolve_current_platform_cls_qualname``), and an out-of-tree plugin that
answers wins over the built-in detection. Releases before 0.28.0 detect the
CPU platform from a ``+cpu`` wheel version only (they do not read
``VLLM_TARGET_DEVICE``), and the package index's wheel is the CUDA build: there
every adapter would fail with "Failed to infer device type". This plugin
selects ``CpuPlatform`` on every release alike.

It answers only when attnfuzz's adapters ask for the CPU platform (``REQUEST``,
set by ``adapters.vllm._engine.configure_environment`` on a machine without
CUDA); in any other process where attnfuzz is installed, a vLLM server
included, it returns None and vLLM detects its platform as it always does. It
imports nothing but ``os``, since vLLM loads it whenever it starts.
"""

from __future__ import annotations

import os

REQUEST = "ATTNFUZZ_VLLM_CPU_PLATFORM"
CPU_PLATFORM = "vllm.platforms.cpu.CpuPlatform"


def cpu_platform() -> str | None:
    """The platform class vLLM should load: its CPU platform if attnfuzz asked, else None."""
    return CPU_PLATFORM if os.environ.get(REQUEST) == "1" else None
