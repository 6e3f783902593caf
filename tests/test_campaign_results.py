"""A campaign never loses its results: a document its schema refuses, a report or a whole
``--out`` that cannot be written, a GitHub artifact that cannot be fetched.

Each test runs one small real campaign (one mutant caught in a few examples: exit 0
when everything is written) with the failure injected in the controller process.
"""

from __future__ import annotations

import errno
import json
import pathlib
import subprocess
import sys
from pathlib import Path

import pytest
from attnfuzz.harness.campaign import supervise
from attnfuzz.harness.cli import main
from attnfuzz.harness.errors import UsageError

TARGET, MUTANT = "slot-mapping", "position-off-by-one"  # caught within 20 examples
CASE = f"cases/{TARGET}--{MUTANT}--values.json"
REPORTS = ("junit.xml", "summary.md", "report.html")
NO_GITHUB = "github:nobody/nothing"


def campaign(out: Path, *args: str) -> int:
    return main(
        ["campaign", "--targets", TARGET, "--impls", MUTANT, "--max-examples", "20",
         "--min-examples", "0", "--out", str(out), "--quiet", *args]
    )  # fmt: skip


def assert_cleaned(out: Path) -> None:
    """The lock, the scratch and every temporary file are gone."""
    assert not (out / ".campaign.lock").exists()
    assert not (out / ".work").exists()
    assert not list(out.glob(".work-unfinished-*"))
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_everything_written_is_exit_0_with_nothing_left_behind(tmp_path, capsys):
    out = tmp_path / "out"
    assert campaign(out, "--profile", "ci") == 0
    assert {p.name for p in out.iterdir()} == {"campaign.json", "cases", *REPORTS}
    assert capsys.readouterr().err == ""
    assert_cleaned(out)


@pytest.mark.slow
@pytest.mark.parametrize("builder", ["refuses", "returns"])
def test_a_document_its_schema_refuses_is_kept_and_the_campaign_fails(
    tmp_path, monkeypatch, capsys, builder
):
    """As with ``budget = inf`` at Ctrl-C: the builder refuses its own document (or, not
    checking, returns it): campaign.invalid.json keeps the data, the rest is written."""
    real = supervise.campaign_record

    def build(*args, **fields):
        if builder == "refuses":
            return real(*args, **{**fields, "budget_seconds": float("inf")})
        doc = real(*args, **fields)
        doc["budget"]["seconds"] = float("inf")
        return doc

    if builder == "refuses":
        with pytest.raises(UsageError, match="inf is not of type"):
            build(**_fields())
    monkeypatch.setattr(supervise, "campaign_record", build)
    out = tmp_path / "out"
    code = campaign(out, "--profile", "ci")
    captured = capsys.readouterr()
    assert code == 1, captured
    assert not (out / "campaign.json").exists()
    kept = json.loads((out / "campaign.invalid.json").read_text())
    assert "inf is not of type" in kept["note"]
    assert [r["implementation"] for r in kept["runs"]] == [MUTANT]
    assert [f["case_file"] for f in kept["findings"]] == [CASE]
    assert json.loads((out / CASE).read_text())["schema"] == "attnfuzz.case/1"
    err = captured.err.splitlines()
    assert err[0].startswith("attnfuzz: the campaign document is invalid (campaign: $.budget")
    assert err[0].endswith(f"written as {out / 'campaign.invalid.json'} instead")
    if builder == "refuses":  # no document: nothing to render the reports from
        assert err[1:] == [
            f"attnfuzz: could not write {', '.join(REPORTS)} in {out} "
            "(no campaign document to render it from)"
        ]
        assert not any((out / name).exists() for name in REPORTS)
    else:  # each report is rendered on its own, from what there is
        assert err[1:] == []
        assert all((out / name).exists() for name in REPORTS)
    assert "exit status 1" in captured.out and "NOT all written" in captured.out
    assert_cleaned(out)


def test_a_report_that_cannot_be_written_is_told_and_the_others_are_written(
    tmp_path, monkeypatch, capsys
):
    real = pathlib.Path.write_text

    def write_text(self: Path, data: str, *args, **kwargs) -> int:
        if "report.html" in self.name:  # its temporary file too
            raise OSError(errno.EIO, "Input/output error")
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    out = tmp_path / "out"
    code = campaign(out, "--profile", "ci")
    captured = capsys.readouterr()
    assert code == 1, captured
    assert captured.err.splitlines() == [
        f"attnfuzz: could not write report.html in {out} (Input/output error)"
    ]
    assert json.loads((out / "campaign.json").read_text())["findings"]
    assert (out / "summary.md").exists() and (out / "junit.xml").exists()
    assert not (out / "report.html").exists() and (out / CASE).exists()
    assert f"reports: {out / 'junit.xml'}, {out / 'summary.md'}\n" in captured.out
    assert_cleaned(out)


def test_a_full_disk_under_out_prints_each_case_and_one_line_and_exits_1(
    tmp_path, monkeypatch, capsys
):
    """ENOSPC on every write of the controller under --out (the workers' scratch spared,
    as their own writes are not the point here): half a file written, then the error."""
    out = tmp_path / "out"
    real = pathlib.Path.write_text

    def full(self: Path, data: str, *args, **kwargs) -> int:
        if self.is_relative_to(out) and not self.is_relative_to(out / ".work"):
            real(self, data[: len(data) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    code = campaign(out, "--profile", "ci")
    captured = capsys.readouterr()
    assert code == 1, captured
    err = captured.err
    head = f"attnfuzz: could not write {out / CASE} (No space left on device); the case:\n"
    assert err.startswith(head)
    case, _, rest = err[len(head) :].partition("\n}\n")
    case_doc = json.loads(case + "\n}")
    assert case_doc["schema"] == "attnfuzz.case/1" and case_doc["target"] == TARGET
    assert case_doc["verdict"]["key"] == "values" and case_doc["case"]["batch"]
    assert rest.splitlines() == [
        f"attnfuzz: could not write campaign.json, {', '.join(REPORTS)} in {out} "
        "(No space left on device)"
    ]
    assert "Traceback" not in captured.out + err
    assert "NOT WRITTEN (No space left on device" in captured.out
    assert "exit status 1" in captured.out
    assert not [p for p in out.rglob("*") if p.is_file()]  # no half file under a result's name
    assert_cleaned(out)


def test_an_artifact_that_cannot_be_fetched_is_said_and_the_verdict_stands(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    out = tmp_path / "out"
    code = campaign(out, "--profile", "dev", "--db", f"{tmp_path / 'db'}+{NO_GITHUB}")
    captured = capsys.readouterr()
    assert code == 0, captured  # the mutant caught: an empty corpus is still a search
    # Progress lines ("[  5.0s] ...", every few seconds) may come first on a slow machine.
    lines = [line for line in captured.out.splitlines() if not line.startswith("[")]
    note = lines[0]
    assert note.startswith(
        f"attnfuzz: note: --db {NO_GITHUB}: the artifact could not be fetched ("
    ), note
    assert note.endswith("); the corpus starts empty") and "()" not in note
    assert "(its GitHub artifact could not be fetched)" in lines[1]
    doc = json.loads((out / "campaign.json").read_text())
    assert doc["database_note"] == note.removeprefix("attnfuzz: note: ")
    assert f"> **Database**: `{doc['database_note']}`" in (out / "summary.md").read_text()
    assert_cleaned(out)


def test_run_says_the_same_of_an_artifact_that_cannot_be_fetched(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    code = main(["run", "--target", TARGET, "--impl", MUTANT, "--max-examples", "20",
                 "--out", str(tmp_path / "cases"), "--db", NO_GITHUB])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1, captured  # the finding, as without the database
    assert captured.err.startswith(
        f"attnfuzz: note: --db {NO_GITHUB}: the artifact could not be fetched ("
    )
    # Not fetched (nor warned about) again. Other lines may follow: a run slowed by a
    # busy machine reports its progress on stderr too.
    notes = [line for line in captured.err.splitlines() if line.startswith("attnfuzz: note:")]
    assert len(notes) == 1 and captured.err.count("could not be fetched") == 1
    assert notes[0].endswith("; the corpus starts empty")


def test_the_controller_fetches_into_the_cache_the_workers_read(tmp_path):
    """A worker's Hypothesis storage is $HYPOTHESIS_STORAGE_DIRECTORY; the controller
    names the same directory; with a local directory, both use its cache."""
    from attnfuzz.harness.database import artifact_cache

    home = tmp_path / "hypothesis"
    code = (
        "from hypothesis.database import GitHubArtifactDatabase as G; "
        "print(G('nobody', 'nothing', 'attnfuzz-db').path)"
    )
    env = {"HYPOTHESIS_STORAGE_DIRECTORY": str(home), "PATH": ""}
    worker = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert Path(worker) == artifact_cache(NO_GITHUB, home)
    local = f"{tmp_path / 'db'}+{NO_GITHUB}"
    assert (
        artifact_cache(local, home)
        == artifact_cache(local)
        == (tmp_path / "db" / ".github-artifacts" / "attnfuzz-db")
    )


def _fields() -> dict:
    """The smallest campaign the builder accepts."""
    return dict(
        runs=[], findings=[], started="2025-01-01T00:00:00Z", finished="2025-01-01T00:00:01Z",
        seconds=1.0, environment={},
    )  # fmt: skip


def test_a_cached_download_is_read_without_a_note_and_an_expired_one_is_said(tmp_path, monkeypatch):
    """What the controller fetched, the workers read; an expired download is read
    as Hypothesis' fallback, and the note says so rather than an empty corpus."""
    from datetime import UTC, datetime
    from zipfile import ZipFile

    from attnfuzz.harness.database import artifact_cache, fetch_artifact

    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    spec = f"{tmp_path / 'db'}+{NO_GITHUB}"
    cache = artifact_cache(spec)
    cache.mkdir(parents=True)
    fresh = cache / (datetime.now(UTC).isoformat().replace(":", "_") + ".zip")
    with ZipFile(fresh, "w") as zf:
        zf.writestr("0123456789abcdef/0", b"\0")
    assert fetch_artifact(spec) == (None, False)  # nothing fetched, nothing to say
    expired = fresh.rename(cache / "2000-01-01T00_00_00+00_00.zip")
    note, empty = fetch_artifact(spec)
    assert not empty and note.startswith(f"--db {NO_GITHUB}: the artifact could not be fetched (")
    assert note.endswith(f"; an older download is read ({expired.name})")
