"""``attnfuzz run`` says how far it is on stderr: what was judged, of how many, and
the phase; stdout keeps its lines (the verdict last)."""

from __future__ import annotations

import re

import pytest
from attnfuzz.harness.cli import main, progress

LINE = re.compile(r"^run: \[ *\d+\.\d+s\] (\w+): ", re.M)


@pytest.fixture
def every_call(monkeypatch):
    """A line for everything judged (the interval is seconds otherwise)."""
    monkeypatch.setattr(progress, "EVERY_S", 0.0)


def run(tmp_path, *args: str) -> int:
    common = ["--seed", "0", "--db", str(tmp_path / "db"), "--out", str(tmp_path / "cases")]
    return main(["run", "--target", "max-seq-len", *common, *args])


def test_a_search_counts_its_examples_on_stderr(tmp_path, capsys, every_call):
    assert run(tmp_path, "--max-examples", "4") == 0
    out, err = capsys.readouterr()
    assert "searching: 4/4 examples judged" in err, err
    assert set(LINE.findall(err)) == {"searching"}, err
    assert not LINE.search(out) and out.splitlines()[-1] == "PASS: no failure found", out


def test_a_trace_search_counts_its_traces(tmp_path, capsys, every_call):
    assert run(tmp_path, "--max-examples", "2", "--trace") == 0
    out, err = capsys.readouterr()
    assert "searching: 2/2 traces judged" in err, err
    assert out.splitlines()[-1] == "PASS: no failure found", out


def test_a_failure_is_said_shrinking_then_confirming(tmp_path, capsys, every_call):
    impl = "pr42135-strided"
    assert main(["run", "--target", "mtp-seq-lens", "--impl", impl, "--seed", "1",
                 "--max-examples", "50", "--db", str(tmp_path / "db"),
                 "--out", str(tmp_path / "cases")]) == 1  # fmt: skip
    out, err = capsys.readouterr()
    phases = LINE.findall(err)
    in_order = [p for k, p in enumerate(phases) if not k or p != phases[k - 1]]
    assert in_order == ["searching", "shrinking", "confirming", "reachability"], err
    assert "shrinking: 0/50 examples judged since the first failure (example " in err, err
    assert "confirming: 5 replays in new processes (after " in err, err
    assert not LINE.search(out) and "FAIL mtp-seq-lens / pr42135-strided" in out, out


def test_nothing_is_said_before_the_interval(capsys):
    said = progress.RunProgress(200)
    said.search(traced=True)
    said.confirming()
    assert capsys.readouterr().err == ""
