"""``attnfuzz list`` names where an engine's code comes from: an engineer's own tree
(its commit, whether it changed) or a release."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from attnfuzz.harness.provenance import engine_tree, source_text

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _tree(tmp_path, package: str):
    tree = tmp_path / "checkout"
    (tree / package).mkdir(parents=True)
    (tree / package / "__init__.py").write_text("VERSION = '0.0.1.dev1'\n")
    (tree / package / "metadata.py").write_text("def build(): return 1\n")
    return tree


def _git(tree, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b", "HOME": str(tree)}  # fmt: skip
    done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True,
                          check=True, env=env)  # fmt: skip
    return done.stdout.strip()


@needs_git
def test_a_checkout_on_the_path_is_named_with_its_commit_and_its_changes(tmp_path, monkeypatch):
    tree = _tree(tmp_path, "fake_engine_tree")
    _git(tree, "init", "-q")
    _git(tree, "add", ".")
    _git(tree, "commit", "-qm", "branch")
    head = _git(tree, "rev-parse", "--short=12", "HEAD")
    monkeypatch.syspath_prepend(str(tree))
    assert engine_tree("fake_engine_tree") == tree
    assert source_text("fake_engine_tree") == f"the tree at {tree} (commit {head})"
    (tree / "fake_engine_tree" / "metadata.py").write_text("def build(): return 2\n")
    assert source_text("fake_engine_tree") == f"the tree at {tree} (commit {head}, 1 file changed)"


def test_a_tree_outside_git_says_so_and_an_installed_package_is_a_release(tmp_path, monkeypatch):
    tree = _tree(tmp_path, "fake_engine_nogit")
    monkeypatch.syspath_prepend(str(tree))
    assert source_text("fake_engine_nogit") == f"the tree at {tree} (not a git tree)"
    # pytest comes from the site directory, installed by pip from an index.
    assert engine_tree("pytest") is None and "_pytest" in sys.modules
    assert source_text("pytest", "_pytest") == "a release from a package index"
