"""Where attnfuzz writes: ``--db``, ``--out``, Hypothesis' own files, one campaign per ``--out``.

Every bad path is one line on stderr and exit status 2 before any work; a
finding is never lost to a path; nothing is written outside ``--out`` and
``--db``; ``run`` and ``campaign`` accept and refuse the same databases.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.campaign.outdir import release_out
from attnfuzz.harness.cli import main
from attnfuzz.harness.errors import UsageError

ID = "mtp-seq-lens"
TESTS = Path(__file__).parent
# A directory no one can write in, root included: procfs refuses new files.
UNWRITABLE = "/proc/attnfuzz-no-such-dir"


def _run(*args: str) -> int:
    return main(["run", "--target", ID, "--max-examples", "5", "--seed", "0", *args])


def _campaign(*args: str) -> int:
    return main(["campaign", "--targets", ID, "--max-examples", "4", "--profile", "ci", *args])


def _one_line_error(capsys, *words: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("attnfuzz: error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


@pytest.mark.parametrize("command", [_run, _campaign])
@pytest.mark.parametrize(
    "where, words",
    [
        ("file", ["--out", "not a directory"]),
        ("under-file", ["--out", "cannot write there"]),
        ("unwritable", ["--out", "cannot write there"]),
    ],
)
def test_a_bad_out_is_refused_before_any_work(tmp_path, a_file, capsys, command, where, words):
    out = {"file": a_file, "under-file": a_file / "cases", "unwritable": Path(UNWRITABLE)}[where]
    assert command("--out", str(out), "--db", str(tmp_path / "db")) == 2
    _one_line_error(capsys, *words)


@pytest.mark.parametrize("command", [_run, _campaign])
@pytest.mark.parametrize(
    "db, words",
    [
        ("", ["--db", "empty"]),
        ("ftp://host/x", ["expected a directory or redis://"]),
        ("redis://127.0.0.1:1", ["cannot reach Redis"]),
        ("FILE", ["--db", "not a directory"]),
        (UNWRITABLE, ["--db", "cannot write there"]),
    ],
)
def test_run_and_campaign_refuse_the_same_databases(tmp_path, a_file, capsys, command, db, words):
    db = str(a_file) if db == "FILE" else db
    # Without --seed and with a random profile, the database is used: it is checked.
    args = ["--out", str(tmp_path / "out"), "--db", db]
    if command is _run:
        code = main(["run", "--target", ID, "--max-examples", "5", *args])
    else:
        code = main(["campaign", "--targets", ID, "--max-examples", "4", "--profile", "dev", *args])
    assert code == 2
    _one_line_error(capsys, *words)
    assert not Path("redis:").exists() and not (tmp_path / "redis:").exists()


@pytest.mark.slow
def test_nothing_is_written_outside_out_and_db(tmp_path, monkeypatch):
    """Hypothesis' constants cache included (it defaults to ./.hypothesis)."""
    work = tmp_path / "cwd"
    work.mkdir()
    env = dict(os.environ)
    env.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    for args in (
        ["run", "--target", ID, "--max-examples", "10", "--out", str(tmp_path / "cases"),
         "--db", str(tmp_path / "db")],
        ["campaign", "--targets", ID, "--max-examples", "4", "--out", str(tmp_path / "camp"),
         "--db", str(tmp_path / "db")],
    ):  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "-m", "attnfuzz.harness.cli", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(work.iterdir()) == []


def test_relative_paths_are_resolved_before_the_implementation_runs(tmp_path, monkeypatch):
    """An implementation that changes directory moves neither the case nor the database."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(TESTS))
    code = main(["run", "--target", "indexer-decode", "--impl", "campaign_impls:wanders",
                 "--seed", "0", "--out", "cases", "--db", "db"])  # fmt: skip
    assert code == 1
    assert len(list((tmp_path / "cases").glob("*.json"))) == 1


def test_a_case_that_cannot_be_written_is_printed(tmp_path, monkeypatch, capsys):
    """--out was writable at the start; if the write of the case still fails, the case
    goes to the terminal."""
    from attnfuzz.harness import casefile

    def refuse(*args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(casefile, "write_case", refuse)
    monkeypatch.setattr(casefile, "write_new_case", refuse)
    code = main(["run", "--target", "indexer-decode", "--impl", "pr39542-writeback", "--seed",
                 "0", "--max-examples", "500", "--out", str(tmp_path / "cases")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1
    assert "could not write" in err and '"schema": "attnfuzz.case/1"' in err
    assert '"q_lens"' in err


@pytest.mark.slow
def test_workers_are_capped_at_the_cores(tmp_path, capsys):
    cores = len(os.sched_getaffinity(0))
    code = _campaign("-n", "1000", "--out", str(tmp_path / "out"))
    assert code == 0
    assert f"asked for 1000 workers; using {cores}" in capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "campaign.json").read_text())
    assert doc["workers"] == cores


def test_a_second_campaign_in_the_same_out_is_refused(tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-m", "attnfuzz.harness.cli", "campaign", "--targets", ID,
         "--budget", "5m", "--out", str(out), "--db", str(tmp_path / "db")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not (out / cp.LOCK_FILE).exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        second = subprocess.run(
            [sys.executable, "-m", "attnfuzz.harness.cli", "campaign", "--targets", ID,
             "--max-examples", "4", "--out", str(out)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        first.kill()
        first.wait()
    assert second.returncode == 2, second.stdout + second.stderr
    assert "a campaign is already running there" in second.stderr
    assert second.stderr.count("\n") == 1
    assert not list(out.glob(".work-unfinished-*"))


def test_the_lock_of_a_campaign_no_longer_running_is_taken_over(tmp_path):
    """A process the dead campaign left may still hold its lock (a child that inherited
    it): the next campaign takes it over, saying so in one line. A live one's is refused."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    left = (out / cp.LOCK_FILE).open("a+")
    fcntl.flock(left, fcntl.LOCK_EX)  # held here, as by what the campaign left running
    left.write(str(os.getpid()))
    left.flush()
    with pytest.raises(UsageError, match="a campaign is already running there"):
        cp.lock_out(out, io.StringIO())
    gone = subprocess.Popen(["true"])
    gone.wait()
    left.seek(0)
    left.truncate()
    left.write(str(gone.pid))
    left.flush()
    said = io.StringIO()
    lock = cp.lock_out(out, said)
    try:
        assert said.getvalue().count("\n") == 1, said.getvalue()
        assert f"(pid {gone.pid}) is no longer running" in said.getvalue()
        assert (out / cp.LOCK_FILE).read_text() == str(os.getpid())
    finally:
        release_out(out, lock)
        left.close()


def test_hypothesis_home_goes_at_exit_and_a_killed_run_s_with_the_next_command(
    tmp_path, monkeypatch, capsys
):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["TMPDIR"] = str(scratch)
    code = "from attnfuzz.harness.storage import private_hypothesis_home as home; home()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert list(scratch.iterdir()) == []
    killed = subprocess.Popen(  # no exit handler runs, as under SIGKILL
        [sys.executable, "-c", code + "; import os; os._exit(0)"], env=env
    )
    killed.wait()
    (left,) = scratch.iterdir()
    assert left.name.startswith(f"attnfuzz-hypothesis-{killed.pid}-")
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    assert main(["list"]) == 0
    assert list(scratch.iterdir()) == []


@pytest.mark.slow
def test_the_previous_campaign_is_kept_as_the_baseline(tmp_path, capsys):
    out = tmp_path / "out"
    assert _campaign("--out", str(out)) == 0
    first = json.loads((out / "campaign.json").read_text())
    assert _campaign("--out", str(out)) == 0
    assert "previous campaign's results are in" in capsys.readouterr().out
    kept = json.loads((out / "previous" / "campaign.json").read_text())
    assert kept["started"] == first["started"] and (out / "previous" / "summary.md").exists()
    # The daily flow's regression report works as the README writes it.
    assert (
        main(["report", "--baseline", str(out / "previous" / "campaign.json"),
              "--current", str(out / "campaign.json")]) == 0
    )  # fmt: skip


@pytest.mark.slow
def test_a_finished_campaign_s_kept_files_are_never_called_unfinished(tmp_path):
    """A campaign that finished but kept its files (ATTNFUZZ_KEEP_WORK, or a run
    that did not finish) keeps them in .work-kept, replaced by the next such; the
    next campaign does not call it unfinished, and nothing piles up."""
    out = tmp_path / "out"
    env = dict(os.environ, ATTNFUZZ_KEEP_WORK="1")
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-m", "attnfuzz.harness.cli", "campaign", "--targets", ID,
             "--impls", "reference", "--max-examples", "5", "--profile", "ci", "-n", "1",
             "--out", str(out)],
            capture_output=True, text=True, env=env, timeout=600,
        )  # fmt: skip
        assert done.returncode in (0, 3), done.stdout + done.stderr
        assert "did not finish" not in done.stdout + done.stderr
        assert f"kept for inspection: {out / '.work-kept'}" in done.stdout + done.stderr
    assert (out / ".work-kept" / "items").is_dir() and not (out / ".work").exists()
    assert not list(out.glob(".work-unfinished-*"))
