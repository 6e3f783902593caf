"""The SGLang plugin (``adapters/sglang/plugin.py``): its implementations where SGLang
is missing, and its adapter references, checked without importing SGLang."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from attnfuzz.adapters import sglang
from attnfuzz.adapters.sglang.plugin import SGLANG
from attnfuzz.adapters.sglang.testing import sglang_test
from attnfuzz.harness.cli import main
from attnfuzz.harness.registry import get_target, target_names


@pytest.fixture
def no_sglang(monkeypatch):
    """As on a machine where SGLang is not installed."""
    monkeypatch.setattr(sglang, "installed_version", lambda: None)


def test_the_plugin_declares_engine_code_and_upstream_mutants():
    kinds = {impl.kind for impls in SGLANG.implementations.values() for impl in impls}
    assert kinds == {"engine", "mutant"}, kinds
    for target, impls in SGLANG.implementations.items():
        registered = get_target(target).implementations
        for impl in impls:
            assert registered[impl.name].engine == sglang.ENGINE, (target, impl.name)


def test_list_shows_sglang_as_unavailable_with_the_install_line(no_sglang, capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert f"unavailable: SGLang is not installed; install SGLang {sglang.VERSION} with: " in text
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    mine = [i for r in rows for i in r["implementations"] if i["engine"] == "sglang"]
    assert mine and all(sglang.INSTALL in i["unavailable"] for i in mine)


def test_every_adapter_the_plugin_names_is_a_function_of_its_module():
    """The plugin names adapter functions by module and attribute (importing an adapter
    imports SGLang): a rename must fail here, not when it runs."""
    adapters = Path(sglang.__file__).parent
    named = 0
    for target, impls in SGLANG.implementations.items():
        assert target in target_names(), target
        for impl in impls:
            call = impl.fn
            assert isinstance(call, sglang.EngineCall), (target, impl.name, call)
            tree = ast.parse((adapters / f"{call.module}.py").read_text())
            defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert call.attr in defined, f"{target}/{impl.name}: no {call!r}"
            # A judge warms the child it forks with the module's prepare(): without one,
            # every child imports SGLang anew (seconds a case).
            assert "prepare" in defined, f"{call.module}: no prepare()"
            named += 1
    assert named == sum(len(impls) for impls in SGLANG.implementations.values()) > 0


@sglang_test
def test_list_json_stays_json_where_an_engine_prints_at_import():
    """A fresh process's ``attnfuzz list --json`` probes every adapter's APIs, which
    imports SGLang's ``aiter_backend``; where ``aiter`` is absent that module prints a line
    at import. The line goes to stderr: stdout is the JSON alone."""
    done = subprocess.run(
        [sys.executable, "-m", "attnfuzz", "list", "--json"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    rows = json.loads(done.stdout)
    assert any(impl["name"] == "sglang-aiter" for r in rows for impl in r["implementations"])
