"""``attnfuzz list`` and ``attnfuzz describe`` read attnfuzz's own targets from the
catalogue (``harness/catalogue.py``): without torch, Triton or Hypothesis, printing
what building the targets prints; an edited source builds them; and the shipped
catalogue says what the targets say now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from attnfuzz.harness import catalogue, engines
from attnfuzz.harness.catalogue import LIVE_VARIABLE, WRITE

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "triton", "hypothesis")
TIMEOUT_S = 300
COMMANDS = [
    ["list"],
    ["list", "--json"],
    ["describe", "mtp-seq-lens"],
    ["describe", "mtp-seq-lens", "--json"],
    ["describe", "runner-step"],
    ["describe", "slot-mapping", "--json"],
]

# Runs each command line through main() in one process, reading the catalogue at
# argv[1]; prints each one's exit status and stdout, then the heavy modules loaded.
PROBE = """
import contextlib, io, json, sys
from pathlib import Path
from attnfuzz.harness import catalogue
catalogue.CATALOGUE = Path(sys.argv[1])
from attnfuzz.harness.cli import main
done = []
for argv in json.loads(sys.argv[2]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    done.append([status, out.getvalue()])
heavy = [m for m in {heavy!r} if m in sys.modules]
print(json.dumps({{"done": done, "heavy": heavy}}))
"""


def _probe(path: Path, live: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != LIVE_VARIABLE}
    if live:
        env[LIVE_VARIABLE] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), str(path), json.dumps(COMMANDS)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """A catalogue of the source as it is (the shipped one may trail an edited checkout)."""
    path = tmp_path_factory.mktemp("catalogue") / "catalogue.json"
    try:
        catalogue.write(path)
    except RuntimeError as err:  # another distribution's targets or engines are installed
        pytest.skip(str(err))
    return path


def test_list_and_describe_print_what_the_built_targets_print_without_torch(fresh) -> None:
    read = _probe(fresh, live=False)
    built = _probe(fresh, live=True)
    assert [status for status, _ in read["done"]] == [0] * len(COMMANDS)
    for argv, (_, text), (_, expected) in zip(COMMANDS, read["done"], built["done"], strict=True):
        assert text == expected, argv
    assert set(built["heavy"]) >= {"torch", "triton"}  # the live path builds the targets
    if engines.installed_versions():
        pytest.skip("an engine is installed here: list builds the targets to ask it")
    assert read["heavy"] == []


def test_an_edited_source_builds_the_targets(fresh, monkeypatch) -> None:
    # As in a fresh process: here the registry is loaded, which alone builds the targets.
    monkeypatch.delitem(sys.modules, "attnfuzz.harness.registry", raising=False)
    monkeypatch.delenv(LIVE_VARIABLE, raising=False)
    assert catalogue.why_live(fresh) is None
    assert catalogue.described("mtp-seq-lens", fresh) is not None
    monkeypatch.setattr(catalogue, "source_digest", lambda: "the digest of an edited source")
    assert catalogue.why_live(fresh) == "the source differs from the catalogue's"
    assert catalogue.described("mtp-seq-lens", fresh) is None
    assert catalogue.listed(fresh) is None


def test_the_catalogue_is_not_read_where_the_registry_is_loaded(fresh, monkeypatch) -> None:
    """Mutants a user added (``add_mutants``) live in the loaded registry's targets only."""
    import attnfuzz.harness.registry  # noqa: F401 - loaded, as by ``zoo --mutants``

    monkeypatch.delenv(LIVE_VARIABLE, raising=False)
    assert catalogue.why_live(fresh).startswith("the registry is loaded")
    assert catalogue.described("mtp-seq-lens", fresh) is None


def test_the_shipped_catalogue_says_what_the_targets_say() -> None:
    try:
        stale = catalogue.differences()
    except RuntimeError as err:  # another distribution's targets or engines are installed
        pytest.skip(str(err))
    assert stale == [], (
        f"harness/catalogue.json differs from the targets in: {', '.join(stale)}; "
        f"regenerate it with: {WRITE}"
    )


def test_the_digest_covers_the_packages_an_install_holds() -> None:
    """The source digested is that of the packages pyproject.toml installs, and the
    catalogue is package data of an install."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {
        ROOT.joinpath(*name.split(".")[1:]) for name in config["packages"] if name != "attnfuzz"
    }
    digested = {path.parent for path in catalogue.source_files(ROOT)}
    assert digested == packages | {ROOT}
    assert "catalogue.json" in config["package-data"]["attnfuzz.harness"]
