"""The pytest plugin as a downstream project uses it, each suite run in its own pytest.

``tests/downstream`` is a sample project with its own ``pyproject.toml`` and
implementation module (``mtp_builder``, a fixed builder and one with a known bug
of ``mtp-seq-lens``); its suite uses the plugin's three ways in: ``@given`` over
``attnfuzz.cases`` judged by the ``attnfuzz_judge`` fixture, its case files
collected as tests, and ``--attnfuzz-impl`` on the command line. It passes on the
fixed builder and fails on the bug, naming the check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOWNSTREAM = Path(__file__).parent / "downstream"
CASES = DOWNSTREAM / "tests" / "cases"
TARGET = "mtp-seq-lens"
FIXED = "mtp_builder:context_lens"
MUTANT = "mtp_builder:context_lens_noclamp"
NOCLAMP_CASE = "mtp-seq-lens--mtp_builder_context_lens_noclamp--values.json"
STRIDED_CASE = "mtp-seq-lens--pr42135-strided--contiguous.json"
FUZZ_ITEM = f"attnfuzz::{TARGET}[{{}}]"
TIMEOUT_S = 600  # generous: a loaded machine; the suites take seconds


def pytest_run(
    tmp_path: Path, *args: str, cwd: Path = DOWNSTREAM, profile: str = "quick"
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest ARGS`` in ``cwd`` with the downstream module importable;
    nothing is written into the checkout (no cache, Hypothesis' files under ``tmp_path``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS_"))}
    env |= {
        "PYTHONPATH": str(DOWNSTREAM),
        "HYPOTHESIS_PROFILE": profile,
        "HYPOTHESIS_STORAGE_DIRECTORY": str(tmp_path / "hypothesis"),
    }
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", *args]
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


def test_passes_on_the_fixed_builder(tmp_path: Path) -> None:
    result = pytest_run(
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


def test_fails_on_the_mutant_naming_the_check(tmp_path: Path, monkeypatch) -> None:
    # Enough examples for the search to meet a padded graph (the bug's trigger), seeded.
    result = pytest_run(
        tmp_path,
        "--attnfuzz-impl",
        f"{TARGET}={MUTANT}",
        "--hypothesis-seed",
        "0",
        profile="thorough",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    # The failure went into the suite's example database, under the key attnfuzz's
    # commands use for this target and implementation: `attnfuzz run --db` shares it.
    key = f"attnfuzz.campaign/{TARGET}/{MUTANT}".encode()
    saved = tmp_path / "hypothesis" / "examples" / hashlib.sha384(key).hexdigest()[:16]
    assert saved.is_dir() and any(saved.iterdir())
    got = outcomes(result)
    assert set(got) == expected_items(MUTANT), got
    assert got == {
        f"tests/cases/{NOCLAMP_CASE}::{TARGET}": "FAILED",  # the regression case
        f"tests/cases/{STRIDED_CASE}::{TARGET}": "PASSED",  # another bug's case
        "tests/test_mtp_builder.py::test_context_lens_agree_with_the_oracle": "FAILED",
        # judges the fixed builder whatever the option says
        "tests/test_mtp_builder.py::test_fixed_builder_through_the_public_api": "PASSED",
        FUZZ_ITEM.format(MUTANT): "FAILED",
    }
    out = result.stdout
    # Each failure's message is the verdict, naming the check and where it failed.
    assert f"{TARGET} / {MUTANT}: FAIL (values)" in out
    assert "[values] context_lens[" in out
    assert out.count("FAIL (values)") >= 3, out
    # ... and then the case file, which replays the failure.
    marker = f"replay: attnfuzz repro {TARGET}--mtp_builder_context_lens_noclamp--values.json"
    start = out.index("{", out.index(marker))
    document, _ = json.JSONDecoder().raw_decode(out, start)
    assert document["schema"] == "attnfuzz.case/1"
    assert document["implementation"] == MUTANT
    assert document["verdict"]["key"] == "values"
    saved = tmp_path / "found.json"
    saved.write_text(json.dumps(document))
    monkeypatch.syspath_prepend(str(DOWNSTREAM))
    import attnfuzz

    assert attnfuzz.replay(saved, MUTANT).key == "values"
    assert attnfuzz.replay(saved, FIXED).ok


def test_ini_names_the_implementation_without_a_fuzz_item(tmp_path: Path) -> None:
    """Without the option, attnfuzz_judge and the case files judge the ini's
    implementation, and no fuzz item is added."""
    result = pytest_run(tmp_path)
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
    result = pytest_run(tmp_path, "--attnfuzz-cases", str(cases), cwd=tmp_path / "work")
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
    result = pytest_run(tmp_path, "--attnfuzz-impl", "mtp-seq-lens")
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert "expected TARGET=IMPL" in result.stderr
    # Names are resolved when the item runs: an unknown one is that item's error, in a line.
    result = pytest_run(tmp_path, "--attnfuzz-impl", "no-such-target=triton", "-k", "no-such")
    assert outcomes(result) == {
        FUZZ_ITEM.replace(TARGET, "no-such-target").format("triton"): "ERROR"
    }
    assert "unknown target 'no-such-target'" in result.stdout


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
        flags: pytest_run(tmp_path, *flags, "-q", "--tb=line", "-p", "no:randomly", cwd=suite)
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
        return re.sub(r" in [\d.]+s", "", result.stdout.strip().splitlines()[-1])

    assert summary(with_plugin) == summary(without)
