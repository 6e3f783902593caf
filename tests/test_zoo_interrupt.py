"""Ctrl-C or SIGTERM stops ``attnfuzz zoo``: what ran is written, marked interrupted,
exit 130 / 143; the seed in flight is cut, never a survivor. And the zoo writes
nothing outside ``--out`` (Hypothesis' constants cache included)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PROBE = """
import os, pathlib
import attnfuzz
from attnfuzz.harness.registry import get_target

FIXED = get_target("mtp-seq-lens").implementations["triton"].fn


CALLS = [0]


def never_wrong(inputs):
    CALLS[0] += 1
    if CALLS[0] > 10:  # past the zoo's warm-up (two calls): its search is under way
        pathlib.Path(os.environ["ZOO_PROBE_MARKER"]).touch()
    return FIXED(inputs)


MUTANTS = [attnfuzz.mutant("mtp-seq-lens", "never-wrong", never_wrong, description="no bug")]
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_zoo_and_what_ran_is_written_marked(tmp_path, signum):
    (tmp_path / "zoo_probe.py").write_text(PROBE)
    marker = tmp_path / "reached"
    work = tmp_path / "cwd"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
               ZOO_PROBE_MARKER=str(marker))  # fmt: skip
    env.pop("HYPOTHESIS_STORAGE_DIRECTORY", None)
    out = tmp_path / "zoo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnfuzz.harness.cli", "zoo", "--targets", "mtp-seq-lens",
         "--mutants", "zoo_probe", "--seeds", "1", "--budget", "300", "--out", str(out)],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while not marker.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert marker.exists(), "the zoo never reached the probe mutant"
        time.sleep(1.0)
        proc.send_signal(signum)
        text, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, text
    assert "Traceback" not in text and "INTERRUPTED" in text
    doc = json.loads((out / "zoo.json").read_text())
    assert doc["interrupted"] is True
    probe = next(m for m in doc["mutants"] if m["mutant"] == "never-wrong")
    assert probe["status"] != "survived" and len(probe["runs"]) == 1, probe
    assert probe["runs"][0]["cut_by"] == "interrupted"
    assert all(m["status"] == "killed" for m in doc["mutants"] if m is not probe)
    assert "Interrupted" in (out / "zoo.md").read_text()
    assert list(work.iterdir()) == []  # nothing outside --out


def test_an_interrupt_python_ignores_prints_no_traceback_and_still_stops():
    """A signal's KeyboardInterrupt can land in a garbage-collector callback or a
    ``__del__``, where Python prints "Exception ignored ... Traceback" and goes on:
    the run stops at its next example all the same (``stop_requested``), quietly.
    In a process of its own: pytest replaces Python's hook for such exceptions."""
    script = (
        "import os, signal\n"
        "from attnfuzz.harness.cli.run import Signals\n"
        "class Collected:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "        sum(range(10_000))  # the handler runs here, inside __del__\n"
        "with Signals() as signals:\n"
        "    thing = Collected()\n"
        "    del thing\n"
        "    print('received', signals.received())\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "received True\n", proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr
