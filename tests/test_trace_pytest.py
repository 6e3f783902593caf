"""Traces in the pytest plugin and the public API: a trace case file replays step by
step in a new process (whatever the session's judging child ran before it), an
``attnfuzz_judge`` of a trace fails at its step, an implementation that lives across
steps is fuzzed with traces and its case file is a trace's; ``attnfuzz.load_case``,
``attnfuzz.replay`` and ``attnfuzz.judge`` take trace case files and traces.

Each plugin run is a pytest of its own on a tiny project (as tests/test_pytest_plugin.py
runs them), with tests/ importable: ``stateful_impl`` and ``trace_cases``."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import attnfuzz
import pytest
from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.oracle import Verdict
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace

TESTS = Path(__file__).parent
TIMEOUT_S = 600  # generous: a loaded machine; each run takes seconds


@pytest.fixture
def tc(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    return importlib.import_module("trace_cases")


def run_pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    own = ("PYTEST_", "HYPOTHESIS_", "ATTNFUZZ_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    env |= {
        "PYTHONPATH": os.pathsep.join(map(str, (root, TESTS))),
        "HYPOTHESIS_STORAGE_DIRECTORY": str(root.parent / "hypothesis"),
    }
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist"]
    command += ["-rA", "--strict-config", *args]
    return subprocess.run(
        command, cwd=root, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
    )


def outcomes(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", result.stdout, re.MULTILINE)
    return {node: outcome for outcome, node in found}


JUDGE_TEST = """
from pathlib import Path

import attnfuzz


def test_judge_a_trace(attnfuzz_judge):
    trace = attnfuzz.load_case(Path(__file__).parent / "cases" / "b_trace.json")
    attnfuzz_judge("max-seq-len", trace)
"""

QUICK_PROFILE = """
from hypothesis import Phase, settings

# A quick search: no shrinking (each shrink step forks a process per trace).
settings.register_profile(
    "quick",
    max_examples=50,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
)
settings.load_profile("quick")
"""

TRACED = "trace_cases:TRACED"  # first_call_buffer, declared to live across steps


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One session: two case files (a wide step on its own, judged first by the
    session's child of ``TRACED``, then the trace), a test judging the trace with
    ``attnfuzz_judge``, and a fuzz item of ``TRACED``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(TESTS))
        tc = importlib.import_module("trace_cases")
        root = tmp_path_factory.mktemp("session") / "project"
        cases = root / "cases"
        cases.mkdir(parents=True)
        (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
        (root / "conftest.py").write_text(QUICK_PROFILE)
        (root / "test_judge.py").write_text(JUDGE_TEST)
        # A step on its own with three requests: run first in a process, it sizes
        # first_call_buffer's buffer for every later step (the trace's would then pass).
        wide = Case(tc.two_steps().config, Batch((0, 0, 0), (1, 1, 1)), tc.two_steps().params)
        write_case(cases / "a_single.json", case_document(tc.TARGET, TRACED, wide, Verdict([])))
        tc.write_trace_case(cases / "b_trace.json")
        result = run_pytest(
            root, "--attnfuzz-cases", "cases", "--attnfuzz-impl", f"{tc.TARGET}={TRACED}"
        )
    assert outcomes(result) == {
        "cases/a_single.json::max-seq-len": "PASSED",
        "cases/b_trace.json::max-seq-len": "FAILED",
        "test_judge.py::test_judge_a_trace": "FAILED",
        f"attnfuzz::{tc.TARGET}[{TRACED}]": "FAILED",
    }, result.stdout + result.stderr
    return root, result


def _failure(result: subprocess.CompletedProcess[str], node: str) -> str:
    """The report of one failing item (pytest's section headed by its name)."""
    sections = re.split(r"^_{3,} (.+?) _{3,}$", result.stdout, flags=re.MULTILINE)
    named = dict(zip(sections[1::2], sections[2::2], strict=True))
    return next(text for name, text in named.items() if node in name)


def _written(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / ".attnfuzz" / "cases").iterdir())]


def test_a_trace_case_file_replays_step_by_step_in_a_new_process(tc, session):
    """Replayed after a wide step in the session's judging child, the trace still fails
    at step 1: it runs in a process of its own, its engine new."""
    root, result = session
    failed = f"{tc.TARGET} / {TRACED}: FAIL (shape) at step 1"
    for node in ("b_trace.json", "test_judge_a_trace"):
        text = _failure(result, node)
        assert failed in text and "[shape] out: expected [2, 2, 4], got [2, 1, 4]" in text
    assert "case file: cases/b_trace.json" in _failure(result, "b_trace.json")
    # The judge's failure is written as a trace case file, failing at its step.
    judged = [d for d in _written(root) if d.get("trace") == tc.trace_document()["trace"]]
    assert len(judged) == 1 and judged[0]["step"] == 1


def test_an_implementation_that_lives_across_steps_is_fuzzed_with_traces(tc, session):
    root, result = session
    text = _failure(result, f"attnfuzz fuzz {tc.TARGET} / {TRACED}")
    found = re.search(rf"{TRACED}: FAIL \((\w+)\) at step (\d+)", text)
    assert found is not None and int(found.group(2)) >= 1, text
    assert "Case(" not in text  # Hypothesis' note names a Trace(...), elided
    fuzzed = [d for d in _written(root) if d.get("trace") != tc.trace_document()["trace"]]
    (doc,) = fuzzed
    assert "case" not in doc and doc["step"] == int(found.group(2))
    assert doc["step"] < len(Trace.from_dict(doc["trace"]).steps)


class FirstCallBuffer:
    """first_call_buffer as an engine object: its buffer dropped by ``new_engine()``."""

    def __init__(self) -> None:
        self.out = None

    def new_engine(self) -> None:
        self.out = None

    def __call__(self, inputs):
        from attnfuzz.kernels.max_seq_len import max_seq_len_metadata

        got = max_seq_len_metadata(inputs)
        if self.out is None:
            self.out = got.out.clone()
        rows = min(got.out.shape[1], self.out.shape[1])
        self.out[:, :rows] = got.out[:, :rows]
        return dataclasses.replace(got, out=self.out[:, : got.out.shape[1]])


def test_the_public_api_loads_replays_and_judges_a_trace(tc, tmp_path):
    path = tc.write_trace_case(tmp_path / "trace.json")
    trace = attnfuzz.load_case(path)
    assert isinstance(trace, Trace) and trace == tc.two_steps()
    engine = FirstCallBuffer()
    verdict = attnfuzz.replay(path, engine)
    assert not verdict.ok and verdict.step == 1 and verdict.key == "shape"
    again = attnfuzz.replay(path, engine)  # a new engine each replay: the same step
    assert again.step == 1
    assert attnfuzz.judge(tc.TARGET, engine, trace).step == 1
    assert attnfuzz.replay(path, "triton").ok  # the fixed implementation passes it


def test_a_single_step_failure_that_passes_alone_says_history_dependent(tc, tmp_path):
    """The plugin's single-step search judges in one long-lived child: the buffer an
    earlier example sized fails a later one, which passes in a new process; the
    failure says so, and how to search it (traces)."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "conftest.py").write_text(QUICK_PROFILE)
    result = run_pytest(root, "--attnfuzz-impl", f"{tc.TARGET}={tc.STATEFUL}")
    assert outcomes(result) == {f"attnfuzz::{tc.TARGET}[{tc.STATEFUL}]": "FAILED"}, result.stdout
    assert "HISTORY-DEPENDENT: this case passes in a new process" in result.stdout


def test_a_failure_that_comes_and_goes_says_flaky_and_how_often(tmp_path):
    """The plugin replays a failure in new processes as attnfuzz run does: one at
    random (tests/faulty_impls.py) fails its test with how often it recurred."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "conftest.py").write_text(QUICK_PROFILE)
    impl = "max-seq-len=faulty_impls:raises_at_random"
    result = run_pytest(root, "--attnfuzz-impl", impl)
    assert "FAILED" in result.stdout, result.stdout
    assert re.search(r"FLAKY: it failed \d+ of 10 replays of this case", result.stdout)
    assert "Traceback" not in result.stdout and "FlakyFailure" not in result.stdout
