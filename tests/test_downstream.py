"""The pytest plugin as a downstream project uses it, each suite run in its own pytest.

``tests/downstream`` is a sample project with its own ``pyproject.toml`` and
implementation module (``mtp_builder``, a fixed builder and one with a known bug
of ``mtp-seq-lens``); its suite uses the plugin's three ways in: ``@given`` over
``attnfuzz.cases`` judged by the ``attnfuzz_judge`` fixture, its case files
collected as tests, and ``--attnfuzz-impl`` on the command line. It passes on the
fixed builder and fails on the bug, naming the check.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

DOWNSTREAM = Path(__file__).parent / "downstream"
CASES = DOWNSTREAM / "tests" / "cases"
TARGET = "mtp-seq-lens"
FIXED = "mtp_builder:context_lens"
MUTANT = "mtp_builder:context_lens_noclamp"
DECLARED = "builder-noclamp"  # the same, declared in mtp_builder.MUTANTS
NOCLAMP_CASE = "mtp-seq-lens--mtp_builder_context_lens_noclamp--values.json"
STRIDED_CASE = "mtp-seq-lens--pr42135-strided--contiguous.json"
FUZZ_ITEM = f"attnfuzz::{TARGET}[{{}}]"
TIMEOUT_S = 600  # generous: a loaded machine; the suites take seconds


def run_downstream(
    tmp_path: Path,
    *args: str,
    cwd: Path = DOWNSTREAM,
    profile: str = "quick",
    path: tuple[Path, ...] = (),
    module: str = "pytest",
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` (or another ``module``) in ``cwd`` with the
    downstream modules importable, and ``path`` after them; nothing is written
    into the checkout (no cache, Hypothesis' files and the plugin's case files
    under ``tmp_path``)."""
    own = ("PYTEST_", "HYPOTHESIS_", "ATTNFUZZ_")  # the outer run's settings stay outside
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    env |= {
        "PYTHONPATH": os.pathsep.join(map(str, (DOWNSTREAM, *path))),
        "HYPOTHESIS_PROFILE": profile,
        "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis"),
    }
    command = [sys.executable, "-m", module, *args]
    if module == "pytest":
        command[3:3] = ["-p", "no:cacheprovider", "-rA"]
        if "no:attnfuzz" not in args:
            command.append(f"--attnfuzz-out={tmp_path / 'found'}")
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def outcomes(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Node id -> PASSED/FAILED/ERROR, from the ``-rA`` summary."""
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", result.stdout, re.MULTILINE)
    return {node: outcome for outcome, node in found}


def expected_items(impl: str) -> set[str]:
    return {
        f"tests/cases/{NOCLAMP_CASE}::{TARGET}",
        f"tests/cases/{STRIDED_CASE}::{TARGET}",
        "tests/test_mtp_builder.py::test_context_lens_agree_with_the_oracle",
        "tests/test_mtp_builder.py::test_fixed_builder_through_the_public_api",
        FUZZ_ITEM.format(impl),
    }


def test_the_project_imports_only_the_public_api() -> None:
    """``attnfuzz`` itself, and the inputs and outputs of a target it implements
    (``attnfuzz.reference.<target>``, README "Testing your own implementation")."""
    for source in DOWNSTREAM.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "attnfuzz":
                    ok = name == "attnfuzz" or re.fullmatch(r"attnfuzz\.reference\.\w+", name)
                    assert ok, f"{source.name} imports {name}"


def test_passes_on_the_fixed_builder(tmp_path: Path) -> None:
    result = run_downstream(
        tmp_path, "--attnfuzz-impl", f"{TARGET}={FIXED}", "--hypothesis-show-statistics"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    got = outcomes(result)
    assert set(got) == expected_items(FIXED), got
    assert set(got.values()) == {"PASSED"}
    # The fuzz item ran under the suite's profile ("quick": 25 examples) and
    # reported Hypothesis' statistics, with attnfuzz's scenario labels as events.
    stats, stopped = result.stdout.split(FUZZ_ITEM.format(FIXED) + ":", 1)[1].split(
        "Stopped because", 1
    )
    assert "Events:" in stats and "next_n" in stats, stats
    assert stopped.startswith(" settings.max_examples=25"), stopped


@pytest.mark.slow
@pytest.mark.parametrize("named", [MUTANT, DECLARED])
def test_fails_on_the_mutant_naming_the_check(tmp_path: Path, monkeypatch, named: str) -> None:
    """The bug named by ``module:attribute`` or as the project's declared mutant."""
    # Enough examples for the search to meet a padded graph (the bug's trigger), seeded.
    result = run_downstream(
        tmp_path,
        "--attnfuzz-impl",
        f"{TARGET}={named}",
        "--hypothesis-seed",
        "0",
        profile="thorough",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    # The failure went into the suite's example database, under the key attnfuzz's
    # commands use for this target and implementation: `attnfuzz run --db` shares it.
    key = f"attnfuzz.campaign/{TARGET}/{named}".encode()
    saved = tmp_path / "hypothesis" / "examples" / hashlib.sha384(key).hexdigest()[:16]
    assert saved.is_dir() and any(saved.iterdir())
    got = outcomes(result)
    assert set(got) == expected_items(named), got
    assert got == {
        f"tests/cases/{NOCLAMP_CASE}::{TARGET}": "FAILED",  # the regression case
        f"tests/cases/{STRIDED_CASE}::{TARGET}": "PASSED",  # another bug's case
        "tests/test_mtp_builder.py::test_context_lens_agree_with_the_oracle": "FAILED",
        # judges the fixed builder whatever the option says
        "tests/test_mtp_builder.py::test_fixed_builder_through_the_public_api": "PASSED",
        FUZZ_ITEM.format(named): "FAILED",
    }
    out = result.stdout
    # Each failure's message is the verdict, naming the check and where it failed.
    assert f"{TARGET} / {named}: FAIL (values)" in out
    assert "[values] context_lens[" in out
    assert out.count("FAIL (values)") >= 3, out
    # ... then the case file it wrote, which replays the failure, and how.
    name = re.sub(r"[^0-9A-Za-z._=-]", "_", f"{TARGET}--{named}--values")
    saved = tmp_path / "found" / f"{name}.json"
    assert f"case file: {saved}\n" in out, out
    assert f"replay: attnfuzz repro {saved}" in out, out
    document = json.loads(saved.read_text())
    assert document["schema"] == "attnfuzz.case/1"
    assert document["implementation"] == named
    assert document["verdict"]["key"] == "values"
    # A few lines a failure, as torch.testing's: no case printed at length, none
    # of the plugin's source (three failures: the case file, @given, the fuzz item).
    failures = out.split("= FAILURES =", 1)[1].split("= short test summary info =", 1)[0]
    assert len(failures.splitlines()) < 50, failures
    assert '"schema"' not in failures and not re.search(r"^E\s+max_num_seqs=", failures, re.M)
    assert "pytest_plugin.py" not in failures, failures
    monkeypatch.syspath_prepend(str(DOWNSTREAM))
    import attnfuzz
    import mtp_builder  # declares its mutants; registers none in this process

    assert attnfuzz.replay(saved, mtp_builder.context_lens_noclamp).key == "values"
    assert attnfuzz.replay(saved, mtp_builder.context_lens).ok


def test_ini_names_the_implementation_without_a_fuzz_item(tmp_path: Path) -> None:
    """Without the option, attnfuzz_judge and the case files judge the ini's
    implementation, and no fuzz item is added."""
    result = run_downstream(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    got = outcomes(result)
    assert set(got) == expected_items(FIXED) - {FUZZ_ITEM.format(FIXED)}, got
    assert set(got.values()) == {"PASSED"}


def test_cases_option_collects_a_directory_anywhere(tmp_path: Path) -> None:
    """``--attnfuzz-cases DIR`` collects DIR even where pytest would not look (a
    hidden directory) and replays each case on the implementation its file names
    when no option names one; a case found on a user's module is not imported
    from the file."""
    cases = tmp_path / "work" / ".attnfuzz" / "campaign" / "cases"
    cases.mkdir(parents=True)
    for name in (NOCLAMP_CASE, STRIDED_CASE):
        shutil.copy(CASES / name, cases / name)
    (tmp_path / "work" / "unrelated.json").write_text("{}")  # not asked for: not collected
    result = run_downstream(tmp_path, "--attnfuzz-cases", str(cases), cwd=tmp_path / "work")
    assert result.returncode == 1, result.stdout + result.stderr
    prefix = ".attnfuzz/campaign/cases/"
    assert outcomes(result) == {
        f"{prefix}{NOCLAMP_CASE}::{TARGET}": "FAILED",
        f"{prefix}{STRIDED_CASE}::{TARGET}": "FAILED",
    }
    out = result.stdout
    assert f"{TARGET} / pr42135-strided: FAIL (contiguous)" in out  # the file's own
    assert f"found on '{MUTANT}', which is not registered" in out
    assert "--attnfuzz-impl mtp-seq-lens=IMPL" in out


def test_a_bad_option_is_a_usage_error(tmp_path: Path) -> None:
    result = run_downstream(tmp_path, "--attnfuzz-impl", "mtp-seq-lens")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "expected TARGET=IMPL" in result.stderr
    # Names are resolved when pytest starts: an unknown one is the same one line.
    result = run_downstream(tmp_path, "--attnfuzz-impl", "no-such-target=triton", "-k", "no-such")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(
        "ERROR: --attnfuzz-impl no-such-target=triton: unknown target 'no-such-target' (known: "
    ), line


def test_a_suite_without_attnfuzz_runs_as_without_the_plugin(tmp_path: Path) -> None:
    """The plugin is loaded in every pytest run where attnfuzz is installed: a
    suite that uses none of it collects and runs the same with it disabled."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "data.json").write_text('{"schema": "attnfuzz.case/1"}')  # never collected
    (suite / "test_plain.py").write_text(
        "import pytest\n"
        "from hypothesis import given, strategies as st\n\n"
        "@pytest.fixture\n"
        "def three():\n"
        "    return 3\n\n"
        "@given(st.integers(0, 5))\n"
        "def test_small(x):\n"
        "    assert x < 5\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_fixture(three, n):\n"
        "    assert three + n > 3\n"
    )
    runs = {
        flags: run_downstream(tmp_path, *flags, "-q", "--tb=line", "-p", "no:randomly", cwd=suite)
        for flags in [(), ("-p", "no:attnfuzz")]
    }
    with_plugin, without = runs.values()
    assert with_plugin.returncode == without.returncode == 1
    assert outcomes(with_plugin) == outcomes(without)
    assert outcomes(with_plugin) == {
        "test_plain.py::test_small": "FAILED",
        "test_plain.py::test_fixture[1]": "PASSED",
        "test_plain.py::test_fixture[2]": "PASSED",
    }

    def summary(result: subprocess.CompletedProcess[str]) -> str:
        return re.sub(r" in [\d.]+s.*", "", result.stdout.strip().splitlines()[-1])

    assert summary(with_plugin) == summary(without)


def installed_metadata(site: Path) -> Path:
    """The metadata ``pip install`` writes for the downstream project, with its entry
    points as its pyproject.toml declares them, in a folder put on ``PYTHONPATH``:
    the project looks installed to that interpreter only (not to this environment)."""
    project = tomllib.loads((DOWNSTREAM / "pyproject.toml").read_text())["project"]
    info = site / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = []
    for group, points in project["entry-points"].items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {value}" for name, value in points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


def test_a_target_from_the_projects_entry_point(tmp_path: Path) -> None:
    """The project's own target ``query-start-loc`` (entry point ``attnfuzz.targets``):
    ``attnfuzz run`` catches its mutant, and the plugin fuzzes its fixed
    implementation and replays the case found as a regression test."""
    site = installed_metadata(tmp_path / "site")
    out = tmp_path / "found"
    found = run_downstream(
        tmp_path,
        *("run", "--target", "query-start-loc", "--impl", "exclusive", "--seed", "0"),
        *("--max-examples", "100", "--out", str(out)),
        module="attnfuzz",
        cwd=tmp_path,
        path=(site,),
    )
    assert found.returncode == 1, found.stdout + found.stderr
    assert "FAIL query-start-loc / exclusive  [values]" in found.stdout
    assert [p.name for p in out.iterdir()] == ["query-start-loc--exclusive--values.json"]
    result = run_downstream(
        tmp_path,
        # `=`: a bare path among the arguments would move pytest's rootdir there.
        *("--attnfuzz-impl", "query-start-loc=torch", f"--attnfuzz-cases={out}"),
        *("-k", "query-start-loc"),
        path=(site,),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    got = outcomes(result)
    case = "query-start-loc--exclusive--values.json::query-start-loc"  # outside the rootdir
    assert sorted(got) == ["attnfuzz::query-start-loc[torch]", case], got
    assert set(got.values()) == {"PASSED"}


@pytest.mark.slow
def test_the_projects_own_mutant_in_a_campaign(tmp_path: Path, monkeypatch) -> None:
    """``[tool.attnfuzz] mutants`` adds the project's declared mutant to a campaign
    run in the project, which catches it; the case found replays in the project's
    suite through the plugin, which knows the mutant by name (``attnfuzz_mutants``)."""
    out = tmp_path / "campaign"
    found = run_downstream(
        tmp_path,
        *("campaign", "--targets", TARGET, "--impls", DECLARED, "--seed", "0"),
        *("--max-examples", "1000", "--out", str(out), "--quiet"),
        module="attnfuzz",
    )
    assert found.returncode == 0, found.stdout + found.stderr  # a mutant caught is no failure
    assert f"CAUGHT   {TARGET} / {DECLARED} (mutant)" in found.stdout
    case = out / "cases" / f"{TARGET}--{DECLARED}--values.json"
    assert json.loads(case.read_text())["implementation"] == DECLARED
    result = run_downstream(
        tmp_path, f"--attnfuzz-cases={case.parent}", "--attnfuzz-impl", f"{TARGET}={DECLARED}"
    )
    failed = {node for node, outcome in outcomes(result).items() if outcome == "FAILED"}
    assert f"{case.name}::{TARGET}" in failed, result.stdout
    assert f"{TARGET} / {DECLARED}: FAIL (values)" in result.stdout
    assert f"case file: {case}\nreplay: attnfuzz repro {case}\n" in result.stdout
    monkeypatch.syspath_prepend(str(DOWNSTREAM))
    import attnfuzz
    import mtp_builder

    assert attnfuzz.replay(case, mtp_builder.context_lens).ok
