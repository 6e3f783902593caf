"""The public Python API: ``attnfuzz.__all__`` is what docs/api.md documents, and
``import attnfuzz`` is cheap."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import attnfuzz
import pytest
from hypothesis import given, settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
API_PAGE = ROOT / "docs" / "api.md"
HEAVY = ("torch", "triton", "hypothesis", "numpy")
TIMEOUT_S = 300


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_import_prints_all_and_imports_nothing_heavy() -> None:
    result = python(
        "import sys, json, attnfuzz; print(json.dumps(attnfuzz.__all__)); "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert result.returncode == 0, result.stderr
    names, heavy = (json.loads(line) for line in result.stdout.splitlines())
    assert names == attnfuzz.__all__
    assert heavy == []


def test_a_strategy_at_import_time_builds_nothing() -> None:
    """``@given(attnfuzz.cases(...))`` in a test module: the target is built on the first draw."""
    result = python(
        "import sys, attnfuzz; attnfuzz.cases('mtp-seq-lens'); attnfuzz.cases('no-such-target'); "
        "print([m for m in ('torch', 'triton') if m in sys.modules])"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_pytest_plugin_imports_nothing_heavy() -> None:
    """pytest imports the plugin in every run where attnfuzz is installed."""
    result = python(
        "import sys, attnfuzz.harness.pytest_plugin; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_public_name_resolves() -> None:
    assert len(set(attnfuzz.__all__)) == len(attnfuzz.__all__)
    for name in attnfuzz.__all__:
        assert getattr(attnfuzz, name) is not None, name
    assert set(attnfuzz.__all__) <= set(dir(attnfuzz))
    with pytest.raises(AttributeError):
        attnfuzz.no_such_name  # noqa: B018


def test_version_is_pyprojects() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert attnfuzz.__version__ == importlib.metadata.version("attnfuzz") == declared


def test_packaging_declares_plugin_typing_and_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    points = importlib.metadata.entry_points(group="pytest11")
    assert [p.value for p in points if p.name == "attnfuzz"] == ["attnfuzz.harness.pytest_plugin"]
    assert (ROOT / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["attnfuzz"]
    assert not any(d.startswith("redis") for d in project["project"]["dependencies"])
    assert "redis" in project["project"]["optional-dependencies"]


def test_python_m_attnfuzz_is_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "attnfuzz", "--help"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: attnfuzz")


def test_every_public_name_is_documented() -> None:
    """Each name of ``__all__`` appears as ``attnfuzz.NAME`` on the "Public
    Python API" page."""
    documented = set(re.findall(r"attnfuzz\.(\w+)", API_PAGE.read_text()))
    missing = [name for name in attnfuzz.__all__ if name not in documented]
    assert not missing, f"not documented in docs/api.md: {missing}"


def test_the_readme_documents_no_other_name() -> None:
    """Every ``attnfuzz.X`` in the README and the docs is a public name, ``__all__`` itself, a
    subpackage (a module path such as ``attnfuzz.reference.<target>``), the
    entry-point groups of targets and engines, or a schema id (``attnfuzz.case/1``)."""
    from attnfuzz.harness import engines, registry

    subpackages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    groups = {m.ENTRY_POINT_GROUP.removeprefix("attnfuzz.") for m in (engines, registry)}
    allowed = set(attnfuzz.__all__) | {"__all__"} | subpackages | groups
    text = "\n".join(p.read_text() for p in [README, *sorted((ROOT / "docs").rglob("*.md"))])
    unknown = set()
    for match in re.finditer(r"\battnfuzz\.(\w+)(?!/|\w)", text):
        name = match.group(1)
        if name not in allowed:
            unknown.add(name)
    assert not unknown, f"README or docs name attnfuzz.X not in __all__: {sorted(unknown)}"


def test_every_package_of_the_checkout_is_shipped() -> None:
    """A wheel holds the packages ``pyproject.toml`` lists: each folder of modules
    (but the test suite and the benchmarks, which are not installed) is one."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    not_shipped = {"tests", "benchmarks", "docs", "build"}
    found = set()
    for module in ROOT.rglob("*.py"):
        parts = module.relative_to(ROOT).parent.parts
        if parts and (parts[0] in not_shipped or parts[0].startswith(".")):
            continue
        found.add(".".join(("attnfuzz", *parts)))
    assert found - listed == set(), "folders of modules missing from [tool.setuptools] packages"
    assert listed - found == set(), "packages listed that do not exist"


CASE_FILE = (
    ROOT
    / "tests"
    / "downstream"
    / "tests"
    / "cases"
    / "mtp-seq-lens--pr42135-strided--contiguous.json"
)


def test_judge_load_case_and_replay() -> None:
    case = attnfuzz.load_case(CASE_FILE)
    assert isinstance(case, attnfuzz.Case)
    # The file names a registered mutant: replayed on it by default, on any implementation asked.
    assert attnfuzz.replay(CASE_FILE).key == "contiguous"
    assert attnfuzz.replay(CASE_FILE, "triton").ok
    target = attnfuzz.get_target("mtp-seq-lens")
    strided = target.implementations["pr42135-strided"]
    for impl in ("pr42135-strided", strided, strided.fn):  # a name, an Implementation, a callable
        verdict = attnfuzz.judge("mtp-seq-lens", impl, case)
        assert isinstance(verdict, attnfuzz.Verdict) and verdict.key == "contiguous"
        assert all(isinstance(m, attnfuzz.Mismatch) for m in verdict.mismatches)
    with pytest.raises(attnfuzz.UsageError, match="unknown target"):
        attnfuzz.judge("no-such-target", "triton", case)


def test_run() -> None:
    result = attnfuzz.run("mtp-seq-lens", "pr42135-strided", max_examples=300, seed=0)
    assert isinstance(result, attnfuzz.RunResult)
    assert result.failed and result.verdict is not None
    assert not attnfuzz.judge("mtp-seq-lens", "pr42135-strided", result.case).ok
    assert attnfuzz.judge("mtp-seq-lens", "triton", result.case).ok


@settings(max_examples=10, database=None)
@given(case=attnfuzz.cases("mtp-seq-lens", attnfuzz.SMALL, impl="triton"))
def test_cases_draws_the_targets_cases(case) -> None:
    assert isinstance(case, attnfuzz.Case)
    assert case.config.max_model_len <= attnfuzz.SMALL.max_model_len


def test_run_campaign(tmp_path: Path) -> None:
    import io

    options = attnfuzz.CampaignOptions(
        targets=["mtp-seq-lens"], impls=["triton"], max_examples=5, seed=0, out=tmp_path
    )
    campaign, status = attnfuzz.run_campaign(options, io.StringIO())
    assert status == 0
    assert [(r["target"], r["implementation"]) for r in campaign["runs"]] == [
        ("mtp-seq-lens", "triton")
    ]
    assert (tmp_path / "campaign.json").is_file()
