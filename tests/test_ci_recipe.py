"""The CI recipe for an engine repository (docs/ci/), its steps run here on a small
example: a campaign on a user implementation with a bug, its summary, and the gate
that fails on a new finding but not on a known, triaged one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "docs" / "ci"
SMALL = "--targets indexer-decode --max-examples 60 --seed 0 -n 1 --profile ci"


def _step(cwd: Path, step: str, impls: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, ATTNFUZZ_IMPLS=impls, ATTNFUZZ_ARGS=SMALL,
               GITHUB_STEP_SUMMARY=str(cwd / "job-summary.md"),
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), *sys.path]))  # fmt: skip
    return subprocess.run(["bash", str(RECIPE / "attnfuzz-pr.sh"), step], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


def test_the_workflow_runs_every_step_of_the_script():
    workflow = (RECIPE / "attnfuzz-pr.yml").read_text()
    for step in ("install", "campaign", "summary", "gate"):
        assert f"attnfuzz-pr.sh {step}" in workflow


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="the recipe is a bash script")
def test_a_new_finding_fails_the_job_and_a_triaged_one_does_not(tmp_path):
    # A PR with a bug: the campaign finds it; nothing is known yet, so the job fails.
    assert _step(tmp_path, "campaign", "campaign_impls:raises").returncode == 0
    assert _step(tmp_path, "summary", "").returncode == 0
    assert "campaign_impls:raises" in (tmp_path / "job-summary.md").read_text()
    gate = _step(tmp_path, "gate", "")
    assert gate.returncode == 1, gate.stdout + gate.stderr

    # Triaged: the maintainers commit the campaign as known; the same finding passes.
    known = tmp_path / ".attnfuzz" / "known"
    known.mkdir(parents=True)
    shutil.copy(tmp_path / "attnfuzz-out" / "campaign.json", known / "campaign.json")
    assert _step(tmp_path, "campaign", "campaign_impls:raises").returncode == 0
    gate = _step(tmp_path, "gate", "")
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert "### Still failing (1)" in gate.stdout

    # Another bug beside the known one: new, so the job fails again, naming only it.
    assert _step(tmp_path, "campaign", "campaign_impls:raises campaign_impls:exits").returncode == 0
    gate = _step(tmp_path, "gate", "")
    assert gate.returncode == 1, gate.stdout + gate.stderr
    new = gate.stdout.split("### New findings (1)")[1].split("###")[0]
    assert "campaign_impls:exits" in new and "campaign_impls:raises" not in new


def test_install_without_a_source_says_what_to_set(tmp_path):
    done = _step(tmp_path, "install", "")
    assert done.returncode != 0 and "ATTNFUZZ_SOURCE" in done.stderr
