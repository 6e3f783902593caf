"""Where an engine's code comes from: a release wheel, or an engineer's own tree.

An engine engineer fuzzes their branch: an editable install of their checkout
(``pip install -e .``), or the checkout first on ``PYTHONPATH``. What runs is the
code Python imports, so the tree is found from the package's own location (its
import spec, without importing it), and pip's record of the install
(``direct_url.json``, PEP 610) says how it got there. A tree under git names its
commit and whether files changed since.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sysconfig
from pathlib import Path

__all__ = ["engine_tree", "source_text"]


def engine_tree(package: str) -> Path | None:
    """The directory holding ``package`` as Python would import it, when that is
    not an installed distribution's site directory (a checkout on ``sys.path``, or an
    editable install's tree); None for a package installed from a wheel or absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    where = Path(next(iter(spec.submodule_search_locations))).parent
    site = {Path(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    return None if where in site else where


def _git(tree: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True,
                              text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _commit(tree: Path) -> str:
    """``commit abc1234`` (``, 3 files changed`` when the tree differs from it)."""
    head = _git(tree, "rev-parse", "--short=12", "HEAD")
    if head is None:
        return "not a git tree"
    changed = _git(tree, "status", "--porcelain", "--untracked-files=no")
    n = len(changed.splitlines()) if changed else 0
    return f"commit {head}" + (f", {n} file{'s' * (n != 1)} changed" if n else "")


def _direct_url(dist: str) -> dict | None:
    try:
        text = importlib.metadata.distribution(dist).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    return json.loads(text) if text else None


def source_text(dist: str, package: str | None = None) -> str:
    """Where distribution ``dist`` (its import package ``package``, by default the
    same name) comes from, in words for ``attnfuzz list``:

    - ``the tree at PATH (commit abc1234)``: imported from a directory that is not
      the site directory (an editable install, or a checkout on ``PYTHONPATH``);
    - ``an archive at URL`` / ``git URL at commit C``: installed from those;
    - ``a release from a package index``: installed by pip from an index.
    """
    tree = engine_tree(package or dist)
    url = _direct_url(dist) or {}
    if tree is not None:
        how = ", editable" if url.get("dir_info", {}).get("editable") else ""
        return f"the tree at {tree} ({_commit(tree)}{how})"
    if "vcs_info" in url:
        return f"git {url.get('url')} at commit {url['vcs_info'].get('commit_id', '?')[:12]}"
    if "archive_info" in url or "dir_info" in url:
        return f"an archive at {url.get('url')}"
    return "a release from a package index"
