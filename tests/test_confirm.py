"""A failure is replayed in new processes before it is reported (harness/confirm.py).

Each implementation of :mod:`faulty_impls` fails at a time of its own choosing:
a crash or a hang at a trace's fourth step, at random, on every seventh call of
a process, in a window of the wall clock, or slowly on a machine too slow for
the per-example timeout. Whatever it does, ``attnfuzz run`` ends with a verdict
line of its own kind (FAIL, FLAKY, HISTORY-DEPENDENT, INCOMPLETE), a case file
where there is a finding, and never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.confirm import (
    CONFIRMING,
    HISTORY_REPLAYS,
    RECHECK_FACTOR,
    REPLAYS,
    Status,
    confirm,
)
from attnfuzz.harness.oracle import Check, Mismatch, Verdict

TESTS = Path(__file__).parent
TARGET = "max-seq-len"


@pytest.fixture
def faulty(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    import faulty_impls

    return faulty_impls


def _run(capsys, name: str, out: Path, *extra: str) -> tuple[int, str]:
    code = main(["run", "--target", TARGET, "--impl", f"faulty_impls:{name}", "--seed", "0",
                 "--out", str(out), *extra])  # fmt: skip
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err, captured
    return code, captured.out


def _case_file(out: Path) -> Path:
    (path,) = [p for p in out.glob("*.json") if not p.name.endswith(".history.json")]
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "key", "timeout"),
    [("segv_on_the_4th_call", "crash", None), ("hang_on_the_4th_call", "timeout", "2")],
)
def test_a_trace_that_crashes_or_hangs_keeps_its_finding_at_its_step(
    tmp_path, capsys, faulty, name, key, timeout
):
    """The child says which step it starts: a crash or a hang is that step's verdict,
    the trace up to it is written, and it replays there in a new process."""
    extra = [
        "--trace",
        "--max-examples",
        "30",
        *(["--example-timeout", timeout] if timeout else []),
    ]
    code, text = _run(capsys, name, tmp_path / "cases", *extra)
    assert code == 1, text
    assert f"FAIL {TARGET} / faulty_impls:{name}  [{key}]" in text
    doc = read_case(_case_file(tmp_path / "cases"))
    assert doc["verdict"]["key"] == key
    # The fourth call of the trace's process is its step 3; the steps after it never ran.
    assert doc["step"] == 3 and len(doc["trace"]["steps"]) == 4
    if key == "timeout":  # judged again under a longer limit before it is a finding
        assert f"within {2 * RECHECK_FACTOR}s: no verdict either" in text
        assert "reachability" not in doc
    assert main(["repro", str(_case_file(tmp_path / "cases")),
                 "--impl", f"faulty_impls:{name}"]) == 1  # fmt: skip
    replayed = capsys.readouterr().out
    assert f"FAIL ({key}) at step 3" in replayed and "Traceback" not in replayed


def test_a_failure_at_random_is_flaky_with_how_often_it_failed(tmp_path, capsys, faulty):
    code, text = _run(capsys, "raises_at_random", tmp_path / "cases", "--max-examples", "100")
    assert code == 1, text
    assert f"FLAKY {TARGET} / faulty_impls:raises_at_random  [exception:RuntimeError]" in text
    doc = read_case(_case_file(tmp_path / "cases"))
    flaky = doc["flaky"]
    assert flaky["replays"] == REPLAYS and 0 <= flaky["failed"] < REPLAYS
    assert f"it failed {flaky['failed']} of {REPLAYS} replays" in text
    assert "HISTORY-DEPENDENT" not in text


def test_a_failure_of_the_wall_clock_is_flaky_not_history_dependent(tmp_path, capsys, faulty):
    name = "fails_in_a_window_of_the_clock"
    code, text = _run(capsys, name, tmp_path / "cases", "--max-examples", "100")
    assert code == 1, text
    assert f"FLAKY {TARGET} / faulty_impls:{name}" in text
    assert "HISTORY-DEPENDENT" not in text
    assert "flaky" in read_case(_case_file(tmp_path / "cases"))


def test_a_failure_on_every_7th_call_is_history_dependent(tmp_path, capsys, faulty):
    """It is not sticky (the case after it passes), but a replay of what the process
    ran up to it brings it back: history-dependent, never a traceback."""
    code, text = _run(capsys, "fails_every_7th_call", tmp_path / "cases", "--max-examples", "20")
    assert code == 1, text
    assert "HISTORY-DEPENDENT" in text and "FlakyFailure" not in text
    (history,) = (tmp_path / "cases").glob("*.history.json")
    assert len(json.loads(history.read_text())["preceding"]) == 7


def test_a_timeout_that_a_longer_limit_passes_is_incomplete_not_a_finding(
    tmp_path, capsys, faulty, monkeypatch
):
    """Its first call in a process takes 3 s, past the 1 s timeout: judged again in
    a new process within 10 s, it passes. This machine was slow; no finding."""
    monkeypatch.setenv("ATTNFUZZ_TEST_SLOW_S", "3")
    code, text = _run(capsys, "slow_once_per_process", tmp_path / "cases",
                      "--max-examples", "5", "--example-timeout", "1")  # fmt: skip
    assert code == 3, text
    assert f"INCOMPLETE {TARGET} / faulty_impls:slow_once_per_process" in text
    assert "LATENT" not in text and "FAIL" not in text
    assert not (tmp_path / "cases").exists() or not any((tmp_path / "cases").iterdir())


def _attnfuzz(*args: str, env: dict[str, str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), *sys.path]),
               PYTHONUNBUFFERED="1", **env)  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "attnfuzz.harness.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_the_failure_is_replayed_keeps_it(tmp_path, signum):
    """SIGINT or SIGTERM while the shrunk case replays in a new process: the case as
    the search left it is written, no traceback, exit 128 + the signal."""
    calls = tmp_path / "calls"
    proc = _attnfuzz("run", "--target", TARGET, "--impl", "faulty_impls:raises_and_replays_slowly",
                     "--seed", "0", "--max-examples", "20", "--out", str(tmp_path / "cases"),
                     env={"ATTNFUZZ_TEST_CALLS": str(calls)})  # fmt: skip
    try:
        deadline = time.time() + 240
        # A second process calling it: the replays in new processes began.
        while time.time() < deadline and (not calls.exists() or len(calls.read_text().split()) < 2):
            time.sleep(0.1)
        assert len(calls.read_text().split()) >= 2, "no replay began within four minutes"
        proc.send_signal(signum)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, text
    assert "Traceback" not in text
    assert "interrupted before the failure was replayed in a new process" in text
    doc = read_case(_case_file(tmp_path / "cases"))
    assert doc["verdict"]["key"] == "exception:RuntimeError"


def test_an_interrupt_during_the_trace_search_keeps_the_history_dependent_finding(tmp_path):
    # Its history fails as no trace of one engine (harness/history_trace.py): a search.
    impl = "faulty_impls:fails_on_every_7th_new_engine"
    proc = _attnfuzz("run", "--target", TARGET, "--impl", impl,
                     "--seed", "0", "--max-examples", "100000", "--out", str(tmp_path / "cases"),
                     env={})  # fmt: skip
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("searching again as traces"):
                break
        time.sleep(3.0)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    text = "".join(lines) + text
    assert proc.returncode == 130, text
    assert "Traceback" not in text
    assert "INTERRUPTED: no failure found so far" not in text
    assert "the history-dependent failure above stands" in text
    assert list((tmp_path / "cases").glob("*.history.json"))


# -- confirm() on its own: counts, not times ----------------------------------------------


class _Scripted:
    """A stand-in for the isolated judge that answers fresh replays from a script and
    fails, in a history replay, the cases ``history_fails`` names (every replay), or
    each replay's cases in turn from ``history_script``."""

    def __init__(self, fresh: list[bool], history_fails: bool | set[str] = False,
                 history_script: list[set[str]] | None = None):  # fmt: skip
        self.fresh = list(fresh)
        if history_fails is True:
            history_fails = {"case"}
        self.history_fails = history_fails or set()
        self.history_script = history_script
        self.history_replays = 0
        self.timeout_s = 1.0

    def judge_fresh(self, case, deadline=None):
        if case == "case":
            return _verdict(self.fresh.pop(0))
        self.history_replays += 1  # a history replay starts with a fresh judge
        return self.judge(case, deadline)

    def judge(self, case, deadline=None):
        if self.history_script is not None:
            return _verdict(case in self.history_script[self.history_replays - 1])
        return _verdict(case in self.history_fails)


def _verdict(fails: bool) -> Verdict:
    return Verdict([Mismatch(Check.VALUES, "out", "1", "2")] if fails else [])


def test_confirm_counts_replays():
    failing = _verdict(True)
    judge = _Scripted([True] * CONFIRMING)
    got = confirm(judge, "case", failing)  # type: ignore[arg-type]
    assert got.status is Status.CONFIRMED and (got.replays, got.failed) == (CONFIRMING, CONFIRMING)
    judge = _Scripted([True, False] + [True] * (REPLAYS - 2))
    got = confirm(judge, "case", failing)  # type: ignore[arg-type]
    assert got.status is Status.FLAKY and (got.replays, got.failed) == (REPLAYS, REPLAYS - 1)
    # Passing every replay: its history decides.
    history = ["before", "case"]
    got = confirm(_Scripted([False] * REPLAYS, True), "case", failing, history)  # type: ignore[arg-type]
    assert got.status is Status.HISTORY_DEPENDENT
    got = confirm(_Scripted([False] * REPLAYS, False), "case", failing, history)  # type: ignore[arg-type]
    assert got.status is Status.FLAKY and got.failed == 0


def test_a_history_that_fails_elsewhere_or_not_every_time_is_not_history_dependent():
    """A fault of when a call runs (the wall clock, a loaded machine) fails some history
    replays, or fails at a case before the one that failed: flaky. Only a failure at
    the same case, in every one of HISTORY_REPLAYS replays, depends on the history."""
    failing = _verdict(True)
    history = ["first", "before", "case"]
    judge = _Scripted([False] * REPLAYS, history_script=[{"case"}] * HISTORY_REPLAYS)
    got = confirm(judge, "case", failing, history)  # type: ignore[arg-type]
    assert got.status is Status.HISTORY_DEPENDENT and judge.history_replays == HISTORY_REPLAYS
    # It fails where it failed in all but the last replay.
    script = [{"case"}] * (HISTORY_REPLAYS - 1) + [set()]
    got = confirm(_Scripted([False] * REPLAYS, history_script=script), "case", failing, history)  # type: ignore[arg-type]
    assert got.status is Status.FLAKY and got.failed == 0
    # Each replay fails at the case, but one also fails before it: not the same place.
    for where in history[:-1]:
        script = [{"case"}] * (HISTORY_REPLAYS - 1) + [{where, "case"}]
        judge = _Scripted([False] * REPLAYS, history_script=script)
        got = confirm(judge, "case", failing, history)  # type: ignore[arg-type]
        assert got.status is Status.FLAKY, where


@pytest.mark.slow
def test_a_campaign_confirms_its_findings_as_run_does(tmp_path, capsys, faulty, monkeypatch):
    """One policy on both front-ends: a failure at random is a finding marked flaky
    (with how often it failed), a timeout that a longer limit passes is no finding
    and leaves its run INCOMPLETE (exit 3 where nothing else failed)."""
    monkeypatch.setenv("ATTNFUZZ_TEST_SLOW_S", "3")
    out = tmp_path / "out"
    code = main(["campaign", "--targets", TARGET, "--impls", "faulty_impls:raises_at_random",
                 "faulty_impls:slow_once_per_process", "--profile", "ci", "--max-examples", "40",
                 "--example-timeout", "1", "-n", "1", "--out", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 1, printed  # the flaky finding
    doc = json.loads((out / "campaign.json").read_text())
    runs = {r["implementation"]: r for r in doc["runs"]}
    (flaky,) = [f for f in doc["findings"] if f["implementation"].endswith("raises_at_random")]
    assert flaky["flaky"]["replays"] == REPLAYS, flaky
    assert read_case(out / flaky["case_file"])["flaky"] == flaky["flaky"]
    assert "FLAKY" in printed
    slow = runs["faulty_impls:slow_once_per_process"]
    assert not slow["findings"] and "too slow" in slow["incomplete"], slow
    assert "INCOMPLETE" in printed and "WITHDRAWN" in printed
    # Its case file, written when the timeout was first seen, is gone with the finding.
    assert [p.name for p in (out / "cases").iterdir()] == [Path(flaky["case_file"]).name]


def test_shrinking_is_held_to_the_example_count(tmp_path, capsys, monkeypatch):
    """A run judges at most --max-examples cases after its first failure, and a
    traced run as many more for the moves Hypothesis cannot make
    (harness.trace_shrink): a trace search of 12 examples ends within 36 traces,
    shrinking cut or not."""
    monkeypatch.syspath_prepend(str(TESTS))
    code = main(["run", "--target", TARGET, "--impl", "stateful_impl:first_call_buffer",
                 "--trace", "--seed", "0", "--max-examples", "12",
                 "--out", str(tmp_path / "cases")])  # fmt: skip
    text = capsys.readouterr().out
    assert code == 1, text
    judged = int(text.split(f"{TARGET} / stateful_impl:first_call_buffer: ")[1].split()[0])
    assert judged <= 36, text


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for ``signum`` (Linux's SigCgt)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
@pytest.mark.parametrize("after_s", [0.0, 0.3, 1.0, 2.0, 4.0, 8.0])
def test_a_signal_while_the_command_loads_ends_it_quietly(tmp_path, after_s):
    """torch and Triton take seconds to load on a loaded machine, and more loads as
    the command starts (the device check imports Triton's C extension): a SIGINT at
    any of these moments, or once the search runs, ends the command with 130, no
    traceback, nothing written, and no half-loaded module left to make a false
    finding. The moments count from the command's first line (its handling of
    SIGTERM in place): before it, Python itself is starting, as for any program."""
    proc = _attnfuzz("run", "--target", TARGET, "--max-examples", "100000", "--seed", "0",
                     "--out", str(tmp_path / "cases"), env={})  # fmt: skip
    try:
        deadline = time.time() + 120
        while proc.poll() is None and not _catches(proc.pid, signal.SIGTERM):
            assert time.time() < deadline, "the command never reached its first line"
            time.sleep(0.01)
        if after_s == 0.0:  # the handling is in place before torch loads, not after
            assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()
        time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "FAIL" not in text
    assert not (tmp_path / "cases").exists() or not any((tmp_path / "cases").iterdir())


_INTERRUPT_INSIDE_EXEC = """
import os, signal, sys
from attnfuzz.harness.cli.run import Signals
with Signals() as signals:
    try:
        exec("os.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass")
    except KeyboardInterrupt:
        print("caught")
sys.exit(128 + signals.signum)
"""


def test_a_signal_caught_inside_exec_leaves_the_exit_status_to_the_command(tmp_path):
    """The moment a SIGINT lands is chance: inside code run by ``exec`` of a string
    (a dataclass's generated methods, as torch loads), a bare ``KeyboardInterrupt``
    leaving it made CPython end a ``python -m`` process by SIGINT at exit (status
    -2), though the command caught it and returned 130. Here the landing place is
    fixed. Run with ``-m`` as the command is: a script's ``sys.exit`` exits at once."""
    (tmp_path / "interrupt_inside_exec.py").write_text(_INTERRUPT_INSIDE_EXEC)
    path = [str(tmp_path), str(TESTS), *sys.path]
    done = subprocess.run([sys.executable, "-m", "interrupt_inside_exec"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)),
                          timeout=120)  # fmt: skip
    assert done.stdout.strip() == "caught", done.stderr
    assert done.returncode == 128 + signal.SIGINT, done.stderr


def test_a_trace_of_more_steps_than_the_cap_is_refused_in_one_line(tmp_path, capsys):
    """64 steps at most: a trace's replay is bounded (each step its own timeout)."""
    from attnfuzz.harness.casefile import case_document, write_case
    from attnfuzz.harness.oracle import Verdict as V
    from attnfuzz.reference.batch import Batch, EngineConfig
    from attnfuzz.reference.trace import Trace

    config = EngineConfig(max_model_len=128, max_num_seqs=1, max_num_batched_tokens=1,
                          block_size=1, cudagraph_capture_sizes=(1,))  # fmt: skip
    steps = tuple(
        Batch(
            num_computed_tokens=(k,),
            q_lens=(1,),
            req_ids=(0,),
            pages=(tuple(range(1, k + 2)),),
            new_pages=(k + 1 if k == 0 else 1,),
        )  # fmt: skip
        for k in range(65)
    )
    for n, code in ((64, 1), (65, 2)):
        failing = V([Mismatch(Check.VALUES, "out", "1", "2")], step=n - 1)
        trace = Trace(config, steps[:n], (("capturing", 0),))
        path = write_case(tmp_path / f"{n}.json", case_document(TARGET, "triton", trace, failing))
        got = main(["repro", str(path), "--json"])
        captured = capsys.readouterr()
        if code == 2:
            assert got == 2 and "maxItems" in captured.err and len(captured.err) <= 520
        else:
            assert got in (0, 1) and not captured.err.strip(), captured.err


def test_a_campaign_timeout_the_budget_leaves_unjudged_is_no_finding():
    """A timeout seen once, whose judgement under a longer limit the campaign's budget
    cuts, is withdrawn (its run INCOMPLETE), never kept as a finding of this machine's
    speed; any other failure the budget leaves unconfirmed stays as it was found."""
    from attnfuzz.harness.campaign.findings import confirm_findings
    from attnfuzz.harness.isolation import OutOfTime
    from attnfuzz.reference.batch import Batch, Case, EngineConfig

    class OutOfBudget:
        timeout_s = 1.0

        def judge_fresh(self, case, deadline=None):
            raise OutOfTime

    case = Case(EngineConfig(max_model_len=8, max_num_seqs=1, max_num_batched_tokens=1,
                             block_size=1, cudagraph_capture_sizes=(1,)),
                Batch(num_computed_tokens=(0,), q_lens=(1,)), (("capturing", 0),))  # fmt: skip

    def entry(key: str, check: Check) -> dict:
        mismatch = Mismatch(check, "out", "a", "b").to_dict()
        verdict = {"key": key, "mismatches": [mismatch]}
        return {"key": key, "case": case.to_dict(), "verdict": verdict}

    class Log:
        state = {"findings": {"timeout": entry("timeout", Check.TIMEOUT),
                              "values": entry("values", Check.VALUES)}}  # fmt: skip

        def flush(self):
            pass

    log = Log()
    confirm_findings(log, OutOfBudget(), {}, deadline=0.0)
    assert list(log.state["findings"]) == ["values"] and log.state["unconfirmed"] == 1
