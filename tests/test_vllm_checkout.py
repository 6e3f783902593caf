"""An engineer's own vLLM tree, first on ``PYTHONPATH``: ``attnfuzz list`` names it,
and a run judges its code, not the installed release's (docs/engine-engineers.md).

The tree is the installed release's files (linked, not copied), with the one file
a branch changes written out: here ``split_decodes_and_prefills`` with #29644's
uniform branch reverted, as a branch that broke it would have it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm

pytestmark = [
    *requires_vllm,
    pytest.mark.skipif(shutil.which("cp") is None, reason="links the tree with cp -rs"),
]

FIXED = """        if treat_short_extends_as_decodes and torch.all(
            (query_lens == query_lens[0]) | (query_lens == 0)
        ):
            return num_reqs, 0, num_tokens, 0  # all decodes
        is_prefill = (query_lens != query_lens[0]) & (query_lens != 0)"""
BRANCH = "        is_prefill = query_lens != query_lens[0]"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    import importlib.util

    installed = Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
    tree = tmp_path_factory.mktemp("vllm-branch")
    subprocess.run(["cp", "-rs", str(installed), str(tree / "vllm")], check=True)
    changed = tree / "vllm" / "v1" / "attention" / "backends" / "utils.py"
    text = changed.resolve().read_text()
    if FIXED not in text:
        pytest.skip("this vLLM release's split_decodes_and_prefills has another uniform branch")
    changed.unlink()
    changed.write_text(text.replace(FIXED, BRANCH))
    return tree


def _attnfuzz(tree: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *sys.path]))
    return subprocess.run([sys.executable, "-m", "attnfuzz.harness.cli", *args],
                          capture_output=True, text=True, env=env, timeout=600)  # fmt: skip


def test_list_names_the_tree_a_run_judges(checkout):
    done = _attnfuzz(checkout, "list")
    assert done.returncode == 0, done.stderr
    assert f"from the tree at {checkout} (not a git tree)" in done.stdout


def test_a_run_on_the_tree_finds_what_the_branch_broke(checkout, tmp_path):
    done = _attnfuzz(checkout, "run", "--target", "decode-split", "--impl", "vllm", "--seed",
                     "0", "--max-examples", "300", "--out", str(tmp_path))  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL" in done.stdout and list(tmp_path.glob("*.json"))
