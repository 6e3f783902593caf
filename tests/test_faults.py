"""Fault injection: whatever an implementation does, the finding is kept and replays.

Each implementation of :mod:`campaign_impls` is the reference on cases with at
most one decode and misbehaves on the others: it raises (any class, including
``SystemExit`` and ``KeyboardInterrupt``), hangs, aborts, segfaults, calls
``os._exit``, returns something the oracle cannot read, blows its memory, floods
the terminal or changes the working directory. For ``run``, ``repro`` and
``campaign`` alike the test asserts the finding with its check, a case file that
triggers it, the same verdict on replay, the exit status and, for campaigns,
the budget and the reports.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.cli import main

TESTS = Path(__file__).parent
ID = "indexer-decode"
HANG_TIMEOUT = "5"  # seconds: the hang's case is found after this, and again on replay

# implementation -> (verdict key, how the mismatch's "got" starts)
FAULTS = {
    "raises": ("exception:ValueError", "ValueError: refusing 2"),
    "exits": ("exception:SystemExit", "SystemExit: 3"),
    "interrupts": ("exception:KeyboardInterrupt", "KeyboardInterrupt"),
    "hangs": ("timeout", f"no verdict after {HANG_TIMEOUT}s at campaign_impls.py"),
    "aborts": ("crash", "killed by SIGABRT (Fatal Python error: Aborted"),
    "segfaults": ("crash", "killed by SIGSEGV (Fatal Python error: Segmentation fault"),
    "exits_hard": ("crash", "the process exited with status 7 during the call"),
    "unreadable": ("output", "RuntimeError: no "),
    "malformed": ("type", "dict"),  # the oracle checks the type of what came back
    "wanders": ("exception:ValueError", "ValueError: refusing 2"),
}


@pytest.fixture
def impls(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    import campaign_impls

    return campaign_impls


def _timeout(name: str) -> list[str]:
    return ["--example-timeout", HANG_TIMEOUT] if name == "hangs" else []


@pytest.mark.parametrize(
    "name",  # a hang is judged again under ten times its timeout: minutes
    [pytest.param(n, marks=pytest.mark.slow) if n == "hangs" else n for n in sorted(FAULTS)],
)
def test_run_keeps_the_finding_and_repro_replays_it(tmp_path, impls, capsys, name):
    key, got = FAULTS[name]
    out = tmp_path / "cases"
    impl = f"campaign_impls:{name}"
    args = ["run", "--target", ID, "--impl", impl, "--seed", "0", "--max-examples", "300"]
    cwd = os.getcwd()
    code = main([*args, "--out", str(out), "--db", str(tmp_path / "db"), *_timeout(name)])
    printed = capsys.readouterr().out
    assert os.getcwd() == cwd  # the implementation ran elsewhere: nothing of it here
    assert code == 1, printed
    (path,) = out.glob("*.json")  # in --out, whatever the implementation did
    doc = read_case(path)
    assert doc["verdict"]["key"] == key
    assert doc["verdict"]["mismatches"][0]["got"].startswith(got), doc["verdict"]
    assert impls.misbehaves(doc["case"]), f"the case does not trigger it: {doc['case']}"
    assert f"[{key}]" in printed and f"attnfuzz repro {path}" in printed
    # The same verdict on replay, in a child of its own; the reference passes it.
    assert main(["repro", str(path), "--impl", impl]) == 1  # under the case's timeout
    replayed = capsys.readouterr().out
    assert f"FAIL ({key})" in replayed and got in replayed
    assert main(["repro", str(path), "--impl", "reference"]) == 0


def test_a_flood_of_output_stays_out_of_the_terminal(tmp_path, impls, capsys):
    code = main(["run", "--target", ID, "--impl", "campaign_impls:floods", "--seed", "0",
                 "--max-examples", "20", "--out", str(tmp_path / "cases")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0 and "PASS" in out
    assert len(out) + len(err) < 2000 and "flood flood" not in out + err


def _attnfuzz(*args: str, **kwargs) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]))
    env.update(kwargs.pop("env", {}))
    cmd = [sys.executable, "-m", "attnfuzz.harness.cli", *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kwargs
    )


def test_a_memory_blow_up_under_a_cap_is_an_exception_finding(tmp_path):
    """Under an address-space cap, the terabyte the implementation asks for is refused."""
    cap = 24 << 30

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    proc = _attnfuzz("run", "--target", ID, "--impl", "campaign_impls:allocates", "--seed", "0",
                     "--max-examples", "300", "--out", str(tmp_path / "cases"),
                     preexec_fn=limit)  # fmt: skip
    text, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, text
    (path,) = (tmp_path / "cases").glob("*.json")
    mismatch = read_case(path)["verdict"]["mismatches"][0]
    assert mismatch["check"] == "exception" and "RuntimeError" in mismatch["got"], mismatch


def test_ctrl_c_during_run_writes_what_was_found_and_exits_130(tmp_path):
    """The search found a failure and is shrinking it (each step takes half a second):
    SIGINT ends the run, the smallest case so far is written, the exit status is 130."""
    marker = tmp_path / "found"
    proc = _attnfuzz("run", "--target", ID, "--impl", "campaign_impls:raises_slowly", "--seed",
                     "0", "--out", str(tmp_path / "cases"),
                     env={"ATTNFUZZ_TEST_MARKER": str(marker)})  # fmt: skip
    try:
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "no failure found within two minutes"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "interrupted" in text
    (path,) = (tmp_path / "cases").glob("*.json")
    assert read_case(path)["verdict"]["key"] == "exception:ValueError"


def test_ctrl_c_during_a_run_that_found_nothing_exits_130(tmp_path):
    """Once the search runs (its first example judged: a wall-clock wait would land
    while a loaded machine still loads the command), SIGINT ends it with 130."""
    marker = tmp_path / "searching"
    proc = _attnfuzz("run", "--target", ID, "--impl", "campaign_impls:marks_its_first_call",
                     "--max-examples", "100000", "--out", str(tmp_path / "cases"),
                     "--db", str(tmp_path / "db"),
                     env={"ATTNFUZZ_TEST_MARKER": str(marker)})  # fmt: skip
    try:
        deadline = time.time() + 120
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "no example judged within two minutes"
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "INTERRUPTED" in text
    # A random run (no --seed): Hypothesis' own "@seed" advice is not attnfuzz's to print.
    assert "reproduce" not in text and "@seed" not in text
    assert not (tmp_path / "cases").exists() or not any((tmp_path / "cases").iterdir())


@pytest.mark.slow
def test_a_campaign_keeps_every_fault_as_a_finding_that_replays(tmp_path, impls, capsys):
    names = sorted(FAULTS)
    out = tmp_path / "out"
    code = main([
        "campaign", "--targets", ID, "--impls", *[f"campaign_impls:{n}" for n in names],
        "reference", "--profile", "ci", "--max-examples", "150", "--example-timeout",
        HANG_TIMEOUT, "-n", "2", "--out", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 1, printed  # findings on user implementations
    doc = json.loads((out / "campaign.json").read_text())
    assert not doc["events"], doc["events"]
    runs = {r["implementation"]: r for r in doc["runs"]}
    for name in names:
        key, got = FAULTS[name]
        impl = f"campaign_impls:{name}"
        found = {f["key"]: f for f in doc["findings"] if f["implementation"] == impl}
        assert list(found) == [key], (name, found)
        assert found[key]["verdict"]["mismatches"][0]["got"].startswith(got)
        assert runs[impl]["status"] == "fail" and runs[impl]["examples"] > 0
        # A hang ends its unit with the case that hung, as `run` does: nothing shrinks it.
        assert (runs[impl]["timing"]["shrinking"] == 0) == (key == "timeout"), runs[impl]
        path = out / found[key]["case_file"]
        case = read_case(path)["case"]
        assert impls.misbehaves(case), f"{name}: the case does not trigger it: {case}"
        assert main(["repro", str(path), "--impl", impl]) == 1  # under the case's timeout
        assert f"FAIL ({key})" in capsys.readouterr().out
    # The reference ran its whole budget beside the misbehaving implementations.
    assert runs["reference"]["status"] == "pass" and runs["reference"]["examples"] == 150
    # Every report says the same.
    summary = (out / "summary.md").read_text()
    junit = (out / "junit.xml").read_text()
    for f in doc["findings"]:
        assert f["id"] in summary or f["case_file"] in summary or f["key"] in summary
    assert f'failures="{len(names)}"' in junit
    assert (out / "report.html").exists()


@pytest.mark.slow
def test_a_hang_or_an_interrupt_does_not_stretch_the_budget(tmp_path, impls):
    """Units after a hanging call still run, and the campaign ends near its budget.
    The budget holds the workers' start-up (27 s of 30 on a loaded 2-core machine
    left 2 examples a run, no verdict): 60 s leaves room to judge after it."""
    out = tmp_path / "out"
    budget = 60
    start = time.time()
    code = main([
        "campaign", "--targets", ID, "--impls", "campaign_impls:hangs",
        "campaign_impls:interrupts", "reference", "--budget", f"{budget}s",
        "--example-timeout", "5", "-n", "2", "--out", str(out), "--db", str(tmp_path / "db"),
        "--quiet",
    ])  # fmt: skip
    wall = time.time() - start
    doc = json.loads((out / "campaign.json").read_text())
    assert code == 1, doc["runs"]
    assert doc["seconds"] < budget + 6 and wall < budget + 10
    runs = {r["implementation"]: r for r in doc["runs"]}
    assert runs["reference"]["status"] == "pass" and runs["reference"]["examples"] > 0
    assert runs["campaign_impls:interrupts"]["status"] == "fail"


@pytest.mark.parametrize("body", ["import sys\nsys.exit(7)\n", "raise KeyError('boom')\n"])
def test_a_module_that_exits_or_raises_on_import_is_a_usage_error(
    tmp_path, monkeypatch, capsys, body
):
    """``--impl mod:fn`` whose module calls ``sys.exit`` while importing: one line, exit 2."""
    (tmp_path / "exits_on_import.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "exits_on_import", raising=False)
    code = main(["run", "--target", ID, "--impl", "exits_on_import:fn", "--seed", "0",
                 "--out", str(tmp_path / "cases")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot load implementation" in err, err


def test_a_segfault_handler_a_library_left_in_the_parent_changes_no_verdict():
    """vLLM's code loads tvm_ffi, which installs a SIGSEGV handler that aborts: the
    judge's child must still report the segfault, with its frame, as a segfault."""
    script = f"""
import ctypes, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from attnfuzz.harness.isolation import IsolatedJudge
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import hand_case
libc = ctypes.CDLL(None)
libc.signal.restype = ctypes.c_void_p
libc.signal(11, ctypes.cast(libc.abort, ctypes.c_void_p))  # a foreign handler, as tvm_ffi's
target = get_target({ID!r})
with IsolatedJudge(target, target.resolve("campaign_impls:segfaults"), timeout_s=60) as judge:
    print(judge.judge(hand_case((2, 2), (3, 4))).mismatches[0].got)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    got = done.stdout.strip().splitlines()[-1]
    assert got.startswith("killed by SIGSEGV (Fatal Python error: Segmentation fault"), got
    assert "in string_at" in got or " at " in got, got


def test_a_cuda_judge_spawns_its_children_and_a_cpu_judge_forks_them():
    """A child forked from a process that has asked whether CUDA is there (the kernels'
    import does) cannot use CUDA ("Cannot re-initialize CUDA in forked subprocess", seen
    on an H200): a judge on a CUDA device spawns, one on the CPU forks (cheap)."""
    from attnfuzz.harness.isolation import IsolatedJudge
    from attnfuzz.harness.registry import get_target

    target = get_target("max-seq-len")
    impl = target.implementations["triton"]
    assert IsolatedJudge(target, impl, "cuda")._context().get_start_method() == "spawn"
    assert IsolatedJudge(target, impl, "cuda:0")._context().get_start_method() == "spawn"
    assert IsolatedJudge(target, impl, "cpu")._context().get_start_method() == "fork"
