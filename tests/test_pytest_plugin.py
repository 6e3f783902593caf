"""The pytest plugin as a user meets it, each run a pytest of its own on a tiny project.

An implementation that segfaults or hangs fails its own test with a verdict
and a case file, the rest of the session still runs (each case is judged in a
child process; ``--attnfuzz-in-process`` opts out); a failure is reported in a
few lines; a bad name on the command line or in the ini file is one line,
exit status 4, when pytest starts. (``tests/test_downstream.py`` runs a whole
sample project.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import attnfuzz
import pytest

DOWNSTREAM = Path(__file__).parent / "downstream"  # its mtp_builder: a builder and its bug
TARGET = "mtp-seq-lens"
TIMEOUT_S = 600  # generous: a loaded machine; each run takes seconds

FAULTS = """
import ctypes
import os
import signal
import time

import mtp_builder


def segfault(inputs):
    ctypes.string_at(0)


def segfault_by_signal(inputs):
    os.kill(os.getpid(), signal.SIGSEGV)


def hang(inputs):
    time.sleep(3600)


def slow(inputs):
    time.sleep(0.3)  # past Hypothesis' default deadline of 200 ms, on any machine
    return mtp_builder.context_lens(inputs)


def recording_pid(inputs):
    with open("pids.txt", "a") as f:
        f.write(f"{os.getpid()}\\n")
    return mtp_builder.context_lens(inputs)
"""

# A @given test judging the implementation under test (the ini's or the option's).
GIVEN_TEST = """
import attnfuzz
from hypothesis import given, settings


@settings(max_examples=200, database=None)
@given(case=attnfuzz.cases("mtp-seq-lens"))
def test_judged(case, attnfuzz_judge):
    attnfuzz_judge("mtp-seq-lens", case)
"""

LATER_TEST = """
def test_runs_after_the_others():
    assert True
"""

CONFTEST = """
import os

with open("pytest.pid", "w") as f:
    f.write(str(os.getpid()))
"""


def project(tmp_path: Path, ini: str = "") -> Path:
    """A tiny project: its implementations, a @given test judged by the plugin,
    a plain test collected after it, and its ini (``[tool.pytest.ini_options]``)."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text(f"[tool.pytest.ini_options]\n{ini}\n")
    (root / "faults.py").write_text(FAULTS)
    (root / "test_a_judged.py").write_text(GIVEN_TEST)
    (root / "test_z_later.py").write_text(LATER_TEST)
    (root / "conftest.py").write_text(CONFTEST)
    return root


def run_pytest(root: Path, *args: str, xdist: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -rA ARGS`` in ``root``, with none of the outer run's settings
    (nor pytest-xdist's plugin, unless ``xdist``)."""
    own = ("PYTEST_", "HYPOTHESIS_", "ATTNFUZZ_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    env |= {
        "PYTHONPATH": os.pathsep.join(map(str, (root, DOWNSTREAM))),
        "HYPOTHESIS_STORAGE_DIRECTORY": str(root.parent / "hypothesis"),
    }
    # --strict-config: an ini key the plugin does not declare would be an error, not ignored.
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    command += [] if xdist else ["-p", "no:xdist"]
    command += ["-rA", "--strict-config"]
    return subprocess.run(
        [*command, *args], cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def outcomes(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Node id -> PASSED/FAILED/ERROR, from the ``-rA`` summary."""
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", result.stdout, re.MULTILINE)
    return {node: outcome for outcome, node in found}


def failures(result: subprocess.CompletedProcess[str]) -> str:
    """What pytest prints between its FAILURES header and the short summary."""
    return result.stdout.split("= FAILURES =", 1)[1].split("= short test summary info =", 1)[0]


def case_files(text: str, root: Path) -> list[Path]:
    return [root / name for name in re.findall(r"^E?\s*case file: (\S+)$", text, re.MULTILINE)]


@pytest.mark.slow
def test_a_segfault_is_a_crash_verdict_and_the_session_goes_on(tmp_path: Path) -> None:
    """A fuzz item and a @given test each fail with the crash check and a case file
    that replays it; the test collected after them still runs and reports."""
    root = project(tmp_path, f'attnfuzz_impl = ["{TARGET}=faults:segfault_by_signal"]')
    result = run_pytest(root, "--attnfuzz-impl", "slot-mapping=faults:segfault")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Fatal Python error" not in result.stderr  # pytest's own process lived on
    assert outcomes(result) == {
        "test_a_judged.py::test_judged": "FAILED",
        "test_z_later.py::test_runs_after_the_others": "PASSED",
        "attnfuzz::slot-mapping[faults:segfault]": "FAILED",
    }
    assert re.search(r"^=+ 2 failed, 1 passed in ", result.stdout, re.MULTILINE), result.stdout
    text = failures(result)
    for impl in ("faults:segfault_by_signal", "faults:segfault"):
        crashed = f"[crash] {impl}: expected the process to survive the call, got killed by SIGSEGV"
        assert crashed in text, text
    written = case_files(text, root)
    assert [p.name for p in written] == [
        f"{TARGET}--faults_segfault_by_signal--crash.json",
        "slot-mapping--faults_segfault--crash.json",
    ]
    for path in written:
        document = json.loads(path.read_text())
        assert document["verdict"]["key"] == "crash"
        assert document["settings"]["example_timeout"] == 30  # the default
    # The replay line replays it: a crash again, in attnfuzz's own child.
    replay = re.search(r"replay: attnfuzz (repro .*--impl faults:segfault)$", text, re.M)
    assert replay is not None, text
    done = subprocess.run(
        [sys.executable, "-m", "attnfuzz", *replay.group(1).split()],
        cwd=root,
        env=os.environ | {"PYTHONPATH": os.pathsep.join(map(str, (root, DOWNSTREAM)))},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 1 and "FAIL (crash)" in done.stdout, done.stdout + done.stderr


def test_a_hang_is_a_timeout_verdict_and_its_case_as_it_ran(tmp_path: Path) -> None:
    """``--attnfuzz-example-timeout``: a call that never returns fails its test with
    the timeout check at once (no shrinking, each step of which would cost a timeout)."""
    root = project(tmp_path, f'attnfuzz_impl = ["{TARGET}=faults:hang"]')
    started = time.monotonic()
    result = run_pytest(
        root, "--attnfuzz-impl", "slot-mapping=faults:hang", "--attnfuzz-example-timeout", "1"
    )
    took = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert outcomes(result) == {
        "test_a_judged.py::test_judged": "FAILED",
        "test_z_later.py::test_runs_after_the_others": "PASSED",
        "attnfuzz::slot-mapping[faults:hang]": "FAILED",
    }
    text = failures(result)
    assert text.count("[timeout] faults:hang: expected a verdict within 1s") == 2, text
    assert "the case as it ran: a timeout is not shrunk" in text, text
    assert len(case_files(text, root)) == 2, text
    for path in case_files(text, root):
        document = json.loads(path.read_text())
        assert document["verdict"]["key"] == "timeout"
        assert document["settings"]["example_timeout"] == 1
    assert took < 120, took  # two hangs of a second, not a shrink of either


@pytest.mark.parametrize("how", ["child", "option", "ini"])
def test_judging_in_process_is_an_opt_out(tmp_path: Path, how: str) -> None:
    """By default the implementation runs in a child process, never in pytest's;
    ``--attnfuzz-in-process`` or the ini key ``attnfuzz_in_process`` runs it in pytest's."""
    ini = f'attnfuzz_impl = ["{TARGET}=faults:recording_pid"]'
    if how == "ini":
        ini += "\nattnfuzz_in_process = true"
    root = project(tmp_path, ini)
    args = ["--attnfuzz-in-process"] if how == "option" else []
    result = run_pytest(root, *args, "--attnfuzz-impl", f"{TARGET}=faults:recording_pid")
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(outcomes(result)) == 3
    pytest_pid = (root / "pytest.pid").read_text()
    pids = set((root / "pids.txt").read_text().split())
    if how == "child":
        assert pids and pytest_pid not in pids
    else:
        assert pids == {pytest_pid}


def test_a_failure_is_reported_in_a_few_lines(tmp_path: Path, monkeypatch) -> None:
    """As torch.testing reports: the check, where, the counts, the case file and one
    replay line; no case printed at length, none of the plugin's own source."""
    mutant = "mtp_builder:context_lens_noclamp"
    root = project(tmp_path, f'attnfuzz_impl = ["{TARGET}={mutant}"]')
    result = run_pytest(root, "--attnfuzz-impl", f"{TARGET}={mutant}", "--hypothesis-seed", "0")
    assert result.returncode == 1, result.stdout + result.stderr
    assert outcomes(result) == {
        "test_a_judged.py::test_judged": "FAILED",
        "test_z_later.py::test_runs_after_the_others": "PASSED",
        f"attnfuzz::{TARGET}[{mutant}]": "FAILED",
    }
    text = failures(result)
    assert len(text.splitlines()) < 40, text  # two failures
    assert text.count(f"{TARGET} / {mutant}: FAIL (values)") == 2, text
    assert text.count("[values] context_lens[") == 2, text
    assert "Mismatched elements: " in text, text
    assert "pytest_plugin.py" not in text and "def __call__" not in text, text
    # No case at length: neither as JSON nor as Hypothesis prints it, a field a line.
    assert '"schema"' not in text and not re.search(r"^E\s+max_num_seqs=", text, re.M), text
    assert "case=Case(...)" in text, text  # Hypothesis' note names it, the file holds it
    written = case_files(text, root)
    assert len(written) == 2, text
    monkeypatch.syspath_prepend(str(DOWNSTREAM))
    import mtp_builder

    for path in written:  # under the rootdir, named as `attnfuzz run` names it
        shown = path.relative_to(root)
        assert shown.parent == Path(".attnfuzz", "cases"), shown
        assert shown.name.startswith(f"{TARGET}--mtp_builder_context_lens_noclamp--values")
        assert f"replay: attnfuzz repro {shown} --impl {mutant}\n" in text, text
        assert attnfuzz.replay(path, mtp_builder.context_lens_noclamp).key == "values"


# Two tests that fail with the same finding (the mutant's check), each on a case of
# its own: the mutant's smallest case, at two batch seeds.
SAME_FINDING_TESTS = """
import dataclasses

from attnfuzz.harness.registry import get_target

MUTANT = "pr42135-noclamp"


def seeded(seed):
    case = get_target("mtp-seq-lens").implementations[MUTANT].smallest()
    return dataclasses.replace(case, batch=dataclasses.replace(case.batch, seed=seed))


def test_seed_1(attnfuzz_judge):
    attnfuzz_judge("mtp-seq-lens", seeded(1), MUTANT)


def test_seed_2(attnfuzz_judge):
    attnfuzz_judge("mtp-seq-lens", seeded(2), MUTANT)
"""


@pytest.mark.slow
def test_xdist_workers_keep_each_tests_case_of_one_finding(tmp_path: Path) -> None:
    """Under ``-n 2`` each test runs in a worker of its own, both write the same
    finding's case file at once: neither overwrites the other's (``<name>-2.json``),
    each failure names its own file, and each file replays its test's case."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "test_same_finding.py").write_text(SAME_FINDING_TESTS)
    result = run_pytest(root, "-n", "2", "--attnfuzz-out=cases", xdist=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert outcomes(result) == {
        "test_same_finding.py::test_seed_1": "FAILED",
        "test_same_finding.py::test_seed_2": "FAILED",
    }
    name = f"{TARGET}--pr42135-noclamp--values"
    assert sorted(p.name for p in (root / "cases").iterdir()) == [f"{name}-2.json", f"{name}.json"]
    # Each test's own section of the failures: the case file it names, and its replay.
    parts = re.split(r"^_{3,} (test_seed_\d) _{3,}$", failures(result), flags=re.M)[1:]
    sections = dict(zip(parts[::2], parts[1::2], strict=True))
    named = {test: case_files(text, root) for test, text in sections.items()}
    assert sorted(named) == ["test_seed_1", "test_seed_2"], failures(result)
    assert named["test_seed_1"] != named["test_seed_2"]
    for test, [path] in named.items():
        assert json.loads(path.read_text())["case"]["batch"]["seed"] == int(test[-1])
        replay = re.search(r"^E?\s*replay: attnfuzz (repro .*)$", sections[test], re.M)
        assert replay is not None, sections[test]
        done = subprocess.run(
            [sys.executable, "-m", "attnfuzz", *replay.group(1).split()],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert done.returncode == 1 and "FAIL (values)" in done.stdout, done.stdout + done.stderr


def _write_seeded(out: Path, seed: int) -> str:
    from attnfuzz.harness.casefile import write_new_case

    return write_new_case(out, "finding", {"case": {"seed": seed}, "environment": {}}).name


def test_write_new_case_keeps_every_case_and_writes_a_case_found_again_once(tmp_path):
    """Processes writing one finding's cases into one directory at once keep them all;
    the same case found again (another environment) replaces its own file."""
    import multiprocessing

    from attnfuzz.harness.casefile import write_new_case

    out = tmp_path / "cases"
    with multiprocessing.get_context("fork").Pool(4) as pool:
        names = pool.starmap(_write_seeded, [(out, seed) for seed in range(8)])
    assert sorted(names) == sorted(["finding.json"] + [f"finding-{n}.json" for n in range(2, 9)])
    seeds = {json.loads((out / n).read_text())["case"]["seed"]: n for n in names}
    assert sorted(seeds) == list(range(8))
    again = {"case": {"seed": 3}, "environment": {"torch": "later"}}
    assert write_new_case(out, "finding", again).name == seeds[3]
    assert json.loads((out / seeds[3]).read_text()) == again
    (out / "half.json").write_text('{"case": {"se')  # another process is writing it
    assert write_new_case(out, "half", again).name == "half-2.json"
    assert len(list(out.iterdir())) == 10  # no temporary file left


CLASH = """
import attnfuzz

MUTANTS = [attnfuzz.mutant("mtp-seq-lens", "triton", lambda inputs: None)]
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--attnfuzz-mutants", "no_such_module"],
            "--attnfuzz-mutants: cannot load mutants 'no_such_module': "
            "ModuleNotFoundError: No module named 'no_such_module'",
            id="module",
        ),
        pytest.param(
            ["--attnfuzz-mutants", "faults:GARBAGE"],
            "--attnfuzz-mutants: cannot load mutants 'faults:GARBAGE': "
            "faults has no attribute 'GARBAGE'",
            id="attribute",
        ),
        pytest.param(
            ["-o", "attnfuzz_mutants=no_such_module"],
            "attnfuzz_mutants: cannot load mutants 'no_such_module': ",
            id="ini-mutants",
        ),
        pytest.param(
            ["--attnfuzz-mutants", "clash"],
            "--attnfuzz-mutants: mutants 'clash': mtp-seq-lens already has an "
            "implementation 'triton' (",
            id="clash",
        ),
        pytest.param(
            ["--attnfuzz-impl", f"{TARGET}=no_such_module:fn"],
            f"--attnfuzz-impl {TARGET}=no_such_module:fn: cannot load implementation "
            "'no_such_module:fn': ModuleNotFoundError: No module named 'no_such_module'",
            id="impl-module",
        ),
        pytest.param(
            ["--attnfuzz-impl", "no-such-target=triton"],
            "--attnfuzz-impl no-such-target=triton: unknown target 'no-such-target' (known: ",
            id="target",
        ),
        pytest.param(
            ["-o", f"attnfuzz_impl={TARGET}=nope"],
            f"attnfuzz_impl {TARGET}=nope: unknown implementation 'nope' for {TARGET} (known: ",
            id="ini-impl",
        ),
        pytest.param(
            ["--attnfuzz-impl", f"{TARGET}=triton", "--attnfuzz-example-timeout", "soon"],
            "--attnfuzz-example-timeout 'soon': expected a number of seconds > 0",
            id="timeout",
        ),
    ],
)
def test_bad_names_are_one_line_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    """As ``attnfuzz campaign --mutants`` refuses them: one line, before any test."""
    root = project(tmp_path)
    (root / "clash.py").write_text(CLASH)
    result = run_pytest(root, *args)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert result.stdout == "", result.stdout
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"ERROR: {message}"), line


def test_load_case_says_which_path_it_tried(tmp_path: Path, monkeypatch) -> None:
    """A relative path is the current directory's, which a test cannot choose: the
    error names the path tried and how to name one relative to the test file."""
    monkeypatch.chdir(tmp_path)
    for call in (attnfuzz.load_case, attnfuzz.replay):
        with pytest.raises(attnfuzz.UsageError) as refused:
            call("tests/cases/CASE.json")
        message = str(refused.value)
        assert len(message.splitlines()) == 1, message
        assert f"tried {tmp_path / 'tests' / 'cases' / 'CASE.json'}," in message, message
        assert "Path(__file__).parent / 'cases' / 'CASE.json'" in message, message


def test_a_judged_test_runs_without_hypothesis_deadline(tmp_path: Path) -> None:
    """A judgement's time is the machine's (a child process judges): a @given test that
    uses attnfuzz_judge must not fail on Hypothesis' deadline. An implementation slower
    than the default 200 ms on every call passes, and its test with it."""
    root = project(tmp_path, f'attnfuzz_impl = ["{TARGET}=faults:slow"]')
    (root / "test_a_judged.py").write_text(GIVEN_TEST.replace("max_examples=200", "max_examples=3"))
    result = run_pytest(root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes(result)["test_a_judged.py::test_judged"] == "PASSED"
