"""A refused command creates nothing, and echoes nothing raw."""

from __future__ import annotations

import pytest
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import EXIT_USAGE

ID = "mtp-seq-lens"


@pytest.mark.parametrize("command", ["run", "campaign"])
def test_a_db_of_control_characters_is_refused_escaped_and_creates_nothing(
    tmp_path, monkeypatch, capsys, command
):
    monkeypatch.chdir(tmp_path)
    db = "\x1b[31mred\x1b[0m\n"
    target = ["--target", ID] if command == "run" else ["--targets", ID, "--profile", "dev"]
    code = main([command, *target, "--max-examples", "2", "--db", db, "--out", "out"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "\x1b" not in err and err.count("\n") == 1 and "control characters" in err
    assert list(tmp_path.iterdir()) == []


def test_a_run_refused_for_its_implementation_leaves_no_database(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["run", "--target", ID, "--impl", "no_such_module:fn", "--max-examples", "2"])
    assert code == EXIT_USAGE and "cannot load implementation" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
