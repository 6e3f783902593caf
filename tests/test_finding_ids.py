"""A finding's id names its case file: whatever the key holds (an exception class of
300 characters), the name fits a file system, stays one per finding, and the case
written under it replays."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import MAX_FINDING_ID, finding_id

TESTS = Path(__file__).parent
IMPL = "long_names_impl:raises_a_long_name"


def test_a_short_id_is_as_before_and_a_long_one_is_cut_to_one_per_key():
    assert finding_id("max-seq-len", "pkg:fn", "exception:KeyError") == (
        "max-seq-len--pkg_fn--exception_KeyError"
    )
    long_key = "exception:" + "E" * 300
    fid = finding_id("max-seq-len", IMPL, long_key)
    assert len(fid) == MAX_FINDING_ID and fid.startswith("max-seq-len--long_names_impl_raises")
    assert fid.rsplit("--", 1)[-1].startswith("exception_EEEE")  # still reads as its key
    # Keys, or implementations, that differ past the cut have ids of their own.
    assert finding_id("max-seq-len", IMPL, long_key + "F") != fid
    assert finding_id("max-seq-len", IMPL + "x" * 300, "values") != finding_id(
        "max-seq-len", IMPL + "y" * 300, "values"
    )
    assert finding_id("max-seq-len", IMPL, long_key) == fid  # and the same id every time


@pytest.fixture
def long_names(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    import long_names_impl

    return long_names_impl


def test_a_case_whose_key_is_300_characters_is_written_and_replays(tmp_path, long_names, capsys):
    out = tmp_path / "cases"
    args = ["run", "--target", "max-seq-len", "--impl", IMPL, "--seed", "0"]
    code = main([*args, "--max-examples", "10", "--out", str(out), "--db", str(tmp_path / "db")])
    printed = capsys.readouterr()
    assert code == 1, printed
    (path,) = out.glob("*.json")  # in --out, not only on stderr
    key = f"exception:{long_names.LONG_NAME}"
    assert path.name == f"{finding_id('max-seq-len', IMPL, key)}.json"
    assert read_case(path)["verdict"]["key"] == key
    assert f"attnfuzz repro {path}" in printed.out
    assert main(["repro", str(path), "--impl", IMPL]) == 1
    assert f"FAIL ({key})" in capsys.readouterr().out
