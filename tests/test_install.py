"""``pip install`` of attnfuzz into an environment that already has torch (and an
engine) adds attnfuzz and what it lacks, and never replaces what is there
(docs/engine-engineers.md). Checked with pip's own plan (``--dry-run --report``),
offline: every dependency is already installed where the suite runs."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEFT_ALONE = ("torch", "triton", "vllm", "sglang", "numpy")
# What a campaign needs at run time, not only the tests: it is a pytest session.
AT_RUN_TIME = ("pytest", "pytest-xdist", "hypothesis", "torch")


def _source_copy(into: Path) -> Path:
    """The checkout's files, without what a build or a run left in it."""
    left = (".venv", ".git", ".attnfuzz", "build", "out", "*.egg-info", "__pycache__",
            ".hypothesis", ".pytest_cache", ".ruff_cache")  # fmt: skip
    skip = shutil.ignore_patterns(*left)
    return Path(shutil.copytree(ROOT, into / "attnfuzz", ignore=skip, symlinks=True))


def test_pip_installs_attnfuzz_alone_where_torch_and_its_dependencies_are(tmp_path):
    source = _source_copy(tmp_path)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index",
         "--no-build-isolation", "--quiet", "--report", str(report), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(report.read_text())["install"]
    planned = {item["metadata"]["name"].lower() for item in plan}
    assert planned == {"attnfuzz"}, planned
    for name in LEFT_ALONE:
        assert name not in planned


def test_what_a_campaign_needs_at_run_time_is_a_dependency_not_an_extra():
    from packaging.requirements import Requirement

    core = {Requirement(r).name for r in importlib.metadata.requires("attnfuzz") or []
            if "extra ==" not in r}  # fmt: skip
    for name in AT_RUN_TIME:
        assert name in core, f"{name} is needed by `attnfuzz campaign`, not only by tests"


def test_torch_is_asked_for_by_a_floor_only():
    """Any installed torch the engine brought satisfies attnfuzz: no pin to replace it."""
    from packaging.requirements import Requirement

    (req,) = [Requirement(r) for r in importlib.metadata.requires("attnfuzz") or []
              if Requirement(r).name == "torch"]  # fmt: skip
    assert all(spec.operator == ">=" for spec in req.specifier), req
