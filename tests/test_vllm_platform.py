"""The vLLM platform plugin: the CPU platform for attnfuzz's adapters on every release."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from attnfuzz.adapters import vllm_platform
from attnfuzz.adapters.vllm.testing import requires_vllm

ROOT = Path(__file__).resolve().parents[1]


def test_the_plugin_answers_only_when_attnfuzz_asks(monkeypatch):
    """In a vLLM server where attnfuzz happens to be installed it must say nothing, so
    that vLLM detects its platform as it always does."""
    monkeypatch.delenv(vllm_platform.REQUEST, raising=False)
    assert vllm_platform.cpu_platform() is None
    monkeypatch.setenv(vllm_platform.REQUEST, "0")
    assert vllm_platform.cpu_platform() is None
    monkeypatch.setenv(vllm_platform.REQUEST, "1")
    assert vllm_platform.cpu_platform() == "vllm.platforms.cpu.CpuPlatform"


def test_the_plugin_is_declared_for_vllm_and_imports_nothing_heavy():
    """vLLM loads every platform plugin when it starts: the module must stay cheap."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.platform_plugins"]
    assert plugins == {"attnfuzz_cpu": "attnfuzz.adapters.vllm_platform:cpu_platform"}
    code = (
        "import sys, attnfuzz.adapters.vllm_platform; "
        "print(sorted(m for m in ('torch', 'numpy', 'hypothesis', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_adapters_ask_for_the_cpu_platform_where_there_is_no_cuda():
    code = (
        "import os, torch; from attnfuzz.adapters.vllm import _engine; "
        "print(os.environ.get('ATTNFUZZ_VLLM_CPU_PLATFORM'), torch.cuda.is_available())"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != vllm_platform.REQUEST}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    asked, cuda = out.stdout.split()
    assert (asked == "1") == (cuda == "False"), out.stdout + out.stderr


@requires_vllm[0]
@requires_vllm[1]
def test_vllm_resolves_its_platform_through_the_plugin():
    """vLLM's own resolution finds the plugin among its platform plugins and loads
    ``CpuPlatform`` from it (the way releases before 0.28.0, which do not read
    ``VLLM_TARGET_DEVICE``, get the CPU platform)."""
    code = (
        "import os; os.environ['ATTNFUZZ_VLLM_CPU_PLATFORM'] = '1'; "
        "os.environ.pop('VLLM_TARGET_DEVICE', None); "
        "from vllm.plugins import load_plugins_by_group; "
        "from vllm.platforms import resolve_current_platform_cls_qualname; "
        "print(sorted(load_plugins_by_group('vllm.platform_plugins'))); "
        "print(resolve_current_platform_cls_qualname())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert "attnfuzz_cpu" in lines[-2], out.stdout + out.stderr
    assert lines[-1] == "vllm.platforms.cpu.CpuPlatform", out.stdout + out.stderr
