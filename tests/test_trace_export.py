"""``attnfuzz export`` of a trace case file: a standalone pytest file that replays the
trace, every step in order, by one new engine in a new process, and fails at the step
it was found failing at (a hand-written trace case file, tests/trace_cases.py)."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from attnfuzz.harness.cli import main
from attnfuzz.harness.export import LINE, export_case

TESTS = Path(__file__).parent
BIN = Path(sys.executable).parent


@pytest.fixture
def tc(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    return importlib.import_module("trace_cases")


def _values(source: str) -> dict:
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
    }


def _pytest(path: Path) -> subprocess.CompletedProcess:
    """The exported file on its own, from its directory, with tests/ importable (the
    user's module the trace was found on, ``stateful_impl``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
    cmd += ["--rootdir", str(path.parent), str(path)]
    return subprocess.run(
        cmd, cwd=path.parent, env=env, capture_output=True, text=True, timeout=300
    )


def test_an_exported_trace_embeds_its_steps_and_replays_them(tc, tmp_path):
    case_file = tc.write_trace_case(tmp_path / "trace.json")
    path = export_case(case_file, tmp_path / "out", tc.STATEFUL)
    source = path.read_text()
    values = _values(source)
    doc = tc.trace_document()
    assert values["TRACE"] == doc["trace"] and values["STEP"] == doc["step"] == 1
    assert values["FOUND"] == doc["verdict"] and values["DERIVED"] == doc["derived"]
    assert values["IMPLEMENTATION"] == tc.STATEFUL and values["DTYPE"] == "float32"
    # Every step in order, by a new engine in a new process.
    assert "judge.judge_trace(trace)" in source and "IsolatedJudge(" in source
    assert max(map(len, source.splitlines())) <= LINE
    ruff = BIN / "ruff"
    if ruff.exists():  # as every exported file: clean under ruff's defaults
        for check in (["check"], ["format", "--check", "--diff"]):
            done = subprocess.run(
                [str(ruff), *check, "--isolated", str(path)], capture_output=True, text=True
            )
            assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_an_exported_trace_fails_at_its_step_on_the_bug_and_passes_on_the_fix(tc, tmp_path):
    case_file = tc.write_trace_case(tmp_path / "trace.json")
    out = tmp_path / "regressions"
    buggy = export_case(case_file, out, tc.STATEFUL)
    assert main(["export", str(case_file), "-o", str(out), "--impl", "triton"]) == 0
    (fixed,) = [p for p in out.glob("test_*.py") if p != buggy]
    failing = _pytest(buggy)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "fails the exported trace at step 1 (found failing at step 1)" in failing.stdout
    assert "[shape] out: expected [2, 2, 4], got [2, 1, 4]" in failing.stdout
    passing = _pytest(fixed)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "1 passed" in passing.stdout
