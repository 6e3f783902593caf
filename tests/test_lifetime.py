"""Killed from outside, attnfuzz leaves nothing running and nothing that piles up.

A process attnfuzz starts dies with its parent (a campaign's pytest run, its
workers, a judging child); a scratch directory in the temporary directory
carries its owner's pid, goes when its owner ends cleanly, and what a killed
owner left goes with the next command (:mod:`attnfuzz.harness.lifetime`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from attnfuzz.harness import lifetime
from attnfuzz.harness.cli import main

# How long a process killed, or orphaned, may take to be gone on a loaded machine.
GONE_WITHIN_S = 30.0
START_WITHIN_S = 180.0  # a campaign's worker ready: torch, Triton and the targets loaded


def _state(pid: int) -> str | None:
    """The process's state letter, None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _running(pid: int) -> bool:
    return _state(pid) not in (None, "Z")  # a zombie has ended: it only waits to be reaped


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _descendants(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        found += [child, *_descendants(child)]
    return found


def _survivors(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running once the wait for them is over; killed then, so
    that a failing test leaves nothing running either."""
    deadline = time.time() + GONE_WITHIN_S
    while any(map(_running, pids)) and time.time() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _running(p)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _attnfuzz(*args: str, tmp: Path, cwd: Path, **kwargs) -> subprocess.Popen:
    """``attnfuzz ARGS`` with ``tmp`` its temporary directory, run in ``cwd`` (where a
    database goes by default)."""
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env.update(TMPDIR=str(tmp), **kwargs.pop("env", {}))
    cmd = [sys.executable, "-m", "attnfuzz.harness.cli", *args]
    return subprocess.Popen(cmd, env=env, cwd=cwd, **kwargs)


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Path:
    """A temporary directory of the test's own, for this process and its children."""
    path = tmp_path / "tmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


# -- processes -----------------------------------------------------------------

PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from attnfuzz.harness.lifetime import dies_with_this_process
    if sys.argv[1] == "asks":  # the child asks, first thing
        code = "import os, sys; from attnfuzz.harness.lifetime import die_with_parent; "
        code += "die_with_parent(int(sys.argv[1])); print('ready', flush=True); "
        code += "import time; time.sleep(600)"
        child = subprocess.Popen([sys.executable, "-c", code, str(os.getpid())])
    else:  # the parent asks for it, between fork and exec: any program
        cmd = ["sh", "-c", "echo ready; exec sleep 600"]
        child = subprocess.Popen(cmd, preexec_fn=dies_with_this_process())
    os.write(1, f"{child.pid}\\n".encode())  # one write: the child writes to this pipe too
    time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["asks", "preexec"])
def test_a_child_dies_with_its_parent_killed(how):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, text=True
    )
    try:
        lines = {parent.stdout.readline().strip() for _ in range(2)}  # in either order
        assert "ready" in lines, lines
        (child,) = (int(line) for line in lines if line.isdigit())
        assert _running(child)
    finally:
        parent.kill()
        parent.wait()
    assert _survivors([child]) == []


def test_a_child_whose_parent_already_died_ends_itself():
    """The parent gone before the child asked: no signal will come, the child sends it."""
    code = "from attnfuzz.harness.lifetime import die_with_parent; "
    code += f"die_with_parent({os.getpid() + 1}); print('still here')"  # not its parent's pid
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL and "still here" not in done.stdout


@pytest.mark.slow
def test_a_killed_campaign_takes_its_pytest_run_and_workers_with_it(tmp_path):
    """SIGKILL of the controller: no handler runs, yet no process of the campaign is
    left writing in --out, and the next campaign in the same --out starts."""
    out, log = tmp_path / "out", tmp_path / "first.log"
    with log.open("w") as sink:
        first = _attnfuzz("campaign", "--targets", "max-seq-len", "-n", "1", "--budget", "5m",
                          "--out", str(out), tmp=tmp_path, cwd=tmp_path, stdout=sink,
                          stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.time() + START_WITHIN_S
        while "fuzzing ..." not in log.read_text() and first.poll() is None:
            assert time.time() < deadline, log.read_text()
            time.sleep(0.2)
        assert first.poll() is None, log.read_text()
        left = _descendants(first.pid)  # the pytest run, its worker, the judging child
        assert len(left) >= 2, left
    finally:
        first.kill()
        first.wait()
    assert _survivors(left) == []
    second = _attnfuzz("campaign", "--targets", "max-seq-len", "-n", "1", "--max-examples", "3",
                       "--profile", "ci", "--out", str(out), tmp=tmp_path, cwd=tmp_path,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        said = second.stdout.readline()  # the first line: past the lock, before any worker
    finally:
        second.kill()
        second.wait()
    assert said.startswith(f"a previous campaign in {out} did not finish"), said


IMPLS = """
import os, time

def hangs(inputs):
    open(os.environ["LIFETIME_MARKER"], "w").close()
    time.sleep(1000)
"""


def test_a_killed_run_takes_its_judging_child_with_it_and_the_next_command_sweeps(
    tmp_path, scratch
):
    (tmp_path / "lifetime_impls.py").write_text(IMPLS)
    marker = tmp_path / "hanging"
    run = _attnfuzz("run", "--target", "max-seq-len", "--impl", "lifetime_impls:hangs",
                    "--example-timeout", "1000", "--out", str(tmp_path / "cases"),
                    "--db", str(tmp_path / "db"), tmp=scratch, cwd=tmp_path,
                    env={"LIFETIME_MARKER": str(marker)})  # fmt: skip
    try:
        deadline = time.time() + START_WITHIN_S
        while not marker.exists() and run.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert marker.exists() and run.poll() is None
        judging = _descendants(run.pid)
        assert judging
    finally:
        run.kill()
        run.wait()
    assert _survivors(judging) == []
    assert list(scratch.iterdir())  # the judge's and Hypothesis' directories, left behind
    assert main(["list"]) == 0
    assert list(scratch.iterdir()) == []


# -- scratch directories ---------------------------------------------------------


def test_the_sweep_removes_only_what_a_dead_owner_left(tmp_path, scratch):
    dead, alive = _dead_pid(), os.getpid()
    day_ago = time.time() - 2 * lifetime.UNOWNED_AGE_S
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    for name in (
        f"attnfuzz-judge-{dead}-abcd_123",
        f"attnfuzz-hypothesis-{dead}-abcd1234",
        f"attnfuzz-vllm-model-{dead}-abcd1234",
        f"attnfuzz-judge-{alive}-abcd1234",
        f"attnfuzz-release-run-{dead}-abcd1234",  # not a kind of ours
        "attnfuzz-judge-oldform1",  # no owner's pid: by its age
        "attnfuzz-hypothesis-newform",  # not 8 characters: not mkdtemp's
        "attnfuzz-hypothesis-recent12",
    ):
        (scratch / name).mkdir()
        (scratch / name / "config.json").write_text("{}")
    os.utime(scratch / "attnfuzz-judge-oldform1", (day_ago, day_ago))
    (scratch / f"attnfuzz-judge-{dead}-symlink1").symlink_to(elsewhere)
    (scratch / f"attnfuzz-judge-{dead}-afile123").write_text("x")

    removed = lifetime.sweep_stale_scratch()

    assert sorted(p.name for p in removed) == sorted(
        [
            f"attnfuzz-judge-{dead}-abcd_123",
            f"attnfuzz-hypothesis-{dead}-abcd1234",
            f"attnfuzz-vllm-model-{dead}-abcd1234",
            "attnfuzz-judge-oldform1",
        ]
    )
    assert sorted(p.name for p in scratch.iterdir()) == sorted(
        [
            f"attnfuzz-judge-{alive}-abcd1234",
            f"attnfuzz-release-run-{dead}-abcd1234",
            "attnfuzz-hypothesis-newform",
            "attnfuzz-hypothesis-recent12",
            f"attnfuzz-judge-{dead}-symlink1",
            f"attnfuzz-judge-{dead}-afile123",
        ]
    )
    assert (elsewhere / "keep").exists()  # never followed


def test_a_scratch_dir_carries_its_owner_and_goes_when_the_owner_exits(scratch):
    code = textwrap.dedent(
        """
        import os, sys
        from attnfuzz.harness.lifetime import scratch_dir
        path = scratch_dir("judge", remove_at_exit=True)
        print(path.name, flush=True)
        child = os.fork()
        if child == 0:
            sys.exit(0)  # a forked child runs the exit handlers it inherited
        os.waitpid(child, 0)
        print(path.exists())
        """
    )
    env = dict(os.environ, TMPDIR=str(scratch))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    name, kept = proc.stdout.split()
    assert name.startswith("attnfuzz-judge-") and kept == "True", proc.stdout + proc.stderr
    owner = int(name.split("-")[2])
    assert owner != os.getpid() and not lifetime.process_alive(owner)
    assert list(scratch.iterdir()) == []


def test_the_vllm_model_directory_goes_with_its_process(scratch):
    code = "from attnfuzz.adapters.vllm import _engine; import os; "
    code += "print(os.path.exists(os.path.join(_engine.model_dir(), 'config.json')))"
    env = dict(os.environ, TMPDIR=str(scratch))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.stdout.strip() == "True", proc.stdout + proc.stderr
    assert list(scratch.iterdir()) == []


def test_a_clean_run_leaves_nothing_and_sweeps_what_killed_ones_left(tmp_path, scratch):
    dead = _dead_pid()
    left = [f"attnfuzz-judge-{dead}-abcd1234", f"attnfuzz-hypothesis-{dead}-abcd1234"]
    mine = f"attnfuzz-judge-{os.getpid()}-abcd1234"  # a live owner's: kept
    for name in [*left, mine]:
        (scratch / name).mkdir()
    run = _attnfuzz("run", "--target", "max-seq-len", "--seed", "0", "--max-examples", "5",
                    "--out", str(tmp_path / "cases"), tmp=scratch, cwd=tmp_path,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    text, _ = run.communicate(timeout=300)
    assert run.returncode == 0, text
    assert [p.name for p in scratch.iterdir()] == [mine]
