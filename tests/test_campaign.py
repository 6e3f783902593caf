"""``attnfuzz campaign``: planning, budgets, workers, databases, fault isolation, exit status.

The end-to-end tests run real campaigns (a pytest-xdist run in a subprocess)
with budgets of seconds or small example caps; the rest test the pieces on
the files a campaign's workers write.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.campaign.budget import item_deadline
from attnfuzz.harness.campaign.document import campaign_record, run_record
from attnfuzz.harness.campaign.worker import write_json
from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.cli import main, parse_duration
from attnfuzz.harness.definitions import (
    CAMPAIGN_SCHEMA,
    CASE_SCHEMA,
    INCOMPLETE,
    finding_id,
    merge_timelines,
)
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.testing import hand_case
from attnfuzz.reference.batch import Case
from attnfuzz.reports.document import run_verdict

TESTS = Path(__file__).parent
ID = "indexer-decode"
MUTANTS = [m.name for m in get_target(ID).mutants]
ZOO_ID = "unpadding"
ZOO_MUTANTS = [m.name for m in get_target(ZOO_ID).mutants]


@pytest.fixture
def impls(monkeypatch):
    """``campaign_impls`` importable here; the campaign passes its directory to the workers."""
    monkeypatch.syspath_prepend(str(TESTS))
    return importlib.import_module("campaign_impls")


def campaign(tmp_path: Path, *args: str, out: str = "out") -> tuple[int, dict]:
    code = main(["campaign", "--out", str(tmp_path / out), "--db", str(tmp_path / "db"), *args])
    doc = json.loads((tmp_path / out / "campaign.json").read_text())
    return code, doc


def by_impl(doc: dict) -> dict[str, dict]:
    return {r["implementation"]: r for r in doc["runs"]}


def findings_of(doc: dict, impl: str) -> dict[str, dict]:
    return {f["key"]: f for f in doc["findings"] if f["implementation"] == impl}


# -- pieces ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), ("2m30s", 150)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["10x", "0", "", "m", "1h-5m", "-3"])
def test_bad_durations(text):
    with pytest.raises(Exception, match="duration"):
        parse_duration(text)


def test_default_plan_is_every_target_against_its_fixed_implementation():
    units = cp.plan_units(None, None, zoo=False)
    assert {u.target for u in units} == set(target_names())
    assert all(u.kind == "fixed" for u in units)
    assert {u.impl for u in units if u.target == ID} == {"triton"}


def test_zoo_adds_every_mutant_and_names_apply_where_registered():
    units = cp.plan_units([ID], ["reference"], zoo=True)
    assert [u.impl for u in units] == ["reference", *MUTANTS]
    assert {u.kind for u in units} == {"reference", "mutant"}
    # A mutant of one target is not asked of another.
    units = cp.plan_units(None, [MUTANTS[0]], zoo=False)
    assert {(u.target, u.impl) for u in units} == {(ID, MUTANTS[0])}


def test_user_implementations_apply_to_every_selected_target(impls):
    units = cp.plan_units([ID, ID], ["campaign_impls:raises"], zoo=False)
    assert units == [cp.Unit(ID, "campaign_impls:raises", "user")]


@pytest.mark.parametrize(
    "targets, impls_, message",
    [
        (["no-such-target"], None, "unknown target"),
        ([ID], ["no-such-impl"], "no selected target has"),
        ([ID], ["no_such_module:fn"], "cannot load implementation"),
    ],
)
def test_planning_usage_errors(targets, impls_, message):
    with pytest.raises(UsageError, match=message):
        cp.plan_units(targets, impls_, zoo=False)


def test_shards_keep_every_worker_busy_and_split_example_caps():
    assert cp.shards_per_unit(1, 2) == 2 and cp.shards_per_unit(2, 2) == 1
    assert cp.shards_per_unit(3, 2) == 2 and cp.shards_per_unit(3, 1) == 1
    units = [cp.Unit(ID, "reference", "reference")]
    items = cp.plan_items(units, workers=2, max_examples=5)
    assert [(i["shard"], i["max_examples"]) for i in items] == [(0, 3), (1, 2)]
    assert len({i["id"] for i in items}) == 2


def test_a_unit_gets_its_share_of_the_time_left(tmp_path):
    (tmp_path / "started").mkdir()
    now = time.time()
    items = [{"id": f"u{i}"} for i in range(4)]
    plan = {"deadline": now + 100, "workers": 2, "items": items}
    # 4 units on 2 workers: two rounds of units, half the time each.
    first = item_deadline(tmp_path, plan, items[0])
    assert first is not None and 45 < first - now <= 50.5
    item_deadline(tmp_path, plan, items[1])
    third = item_deadline(tmp_path, plan, items[2])  # 2 left on 2 workers: all that is left
    assert third is not None and abs(third - plan["deadline"]) < 1e-6
    assert item_deadline(tmp_path, {**plan, "deadline": None}, items[3]) is None


def test_finding_ids_are_file_names():
    fid = finding_id(ID, "pkg.mod:fn/x", "exception:RuntimeError")
    assert fid == "indexer-decode--pkg.mod_fn_x--exception_RuntimeError"
    assert "/" not in fid and ":" not in fid


def test_timelines_of_shards_add_up():
    merged = merge_timelines([[[0.0, 0], [1.0, 10], [2.0, 20]], [[0.5, 0], [1.5, 5]]])
    assert merged == [[0.0, 0], [0.5, 0], [1.0, 10], [1.5, 15], [2.0, 25]]
    assert all(b[0] - a[0] >= 0.25 for a, b in zip(merged, merged[1:], strict=False))


def _run(
    kind: str,
    findings: int = 0,
    status: str | None = None,
    examples: int = 5,
    floor: int | None = None,
) -> dict:
    """A run as the campaign records it (the one builder of campaign.json's runs)."""
    status = status or ("fail" if findings else "pass" if examples else "not run")
    findings_ = [f"f{i}" for i in range(findings)]
    return run_record(
        ID,
        "impl",
        kind,
        examples=examples,
        seconds=1.0,
        status=status,
        findings=findings_,
        min_examples=floor,
    )


@pytest.mark.parametrize(
    "runs, interrupted, signum, code",
    [
        ([_run("fixed"), _run("mutant", 1)], False, None, 0),
        ([_run("fixed", 1), _run("mutant", 1)], False, None, 1),
        ([_run("user", 1)], False, None, 1),
        ([_run("reference", 1)], False, None, 1),
        ([_run("fixed"), _run("mutant", 0)], False, None, 1),  # a mutant survived
        ([_run("fixed", status="error")], False, None, 4),  # attnfuzz's fault: no finding
        ([_run("fixed", status="error"), _run("user", 1)], False, None, 1),  # a finding first
        ([_run("fixed"), _run("mutant", 0)], True, signal.SIGINT, 130),
        ([_run("fixed")], True, signal.SIGTERM, 143),
        ([_run("fixed", 1)], True, signal.SIGTERM, 1),  # a must-pass finding first
        # A run that judged nothing is neither a pass nor a catch nor a survivor.
        ([_run("fixed", examples=0)], False, None, 3),
        ([_run("user", examples=0), _run("mutant", 1)], False, None, 3),
        ([_run("fixed"), _run("mutant", examples=0)], False, None, 3),
        ([_run("fixed", examples=0), _run("mutant", 0)], False, None, 1),  # a survivor first
        ([_run("fixed", examples=0)], True, signal.SIGINT, 130),
        # Found nothing short of the floor: no verdict, neither a pass nor a survivor ...
        ([_run("fixed", floor=200)], False, None, 3),
        ([_run("fixed", examples=200, floor=200), _run("mutant", floor=200)], False, None, 3),
        # ... while a failure counts at any count, and a survivor or a finding wins.
        ([_run("mutant", 1, floor=200), _run("fixed", examples=200, floor=200)], False, None, 0),
        ([_run("fixed", 1, floor=200)], False, None, 1),
        ([_run("fixed", floor=200), _run("mutant", examples=200, floor=200)], False, None, 1),
        ([_run("user", 1), _run("mutant", floor=200)], False, None, 1),
    ],
)
def test_exit_status(runs, interrupted, signum, code):
    assert cp.exit_status({"runs": runs, "interrupted": interrupted}, signum) == code


def _scratch(tmp_path: Path, fault: str | None, crashed: bool = False):
    """The files a worker leaves behind when it dies judging a case."""
    for sub in ("items", "inflight", "faults", "crashed"):
        (tmp_path / sub).mkdir()
    now = time.time()
    plan = {
        "started": now - 10,
        "example_timeout": 4.0,
        "items": [{"id": "u000s00", "unit": 0, "shard": 0}],
    }
    state = {
        "status": "running",
        "started": now - 9,
        "updated": now - 8,
        "first_example": now - 9,
        "examples": 7,
        "labels": {"mixed": 7},
        "timeline": [[1.0, 0], [2.0, 7]],
        "findings": {},
    }
    case = hand_case((2, 2), (3, 5)).to_dict()
    write_json(tmp_path / "items" / "u000s00.json", state)
    write_json(
        tmp_path / "inflight" / "u000s00.json", {"case": case, "examples": 9, "started": now - 7}
    )
    if fault is not None:
        (tmp_path / "faults" / "u000s00.log").write_text(fault)
    if crashed:
        (tmp_path / "crashed" / "u000s00").touch()
    return plan, case


ABORT_LOG = """Fatal Python error: Aborted

Thread 0x00007f49333ff6c0 (most recent call first):
  File "/somewhere/execnet/gateway_base.py", line 534 in read

Current thread 0x00007f493466cb80 (most recent call first):
  File "/somewhere/campaign_worker.py", line 50 in check
"""


def test_a_lost_worker_s_case_is_a_finding_only_if_it_fails_again_alone(tmp_path, impls):
    """xdist marks the item of a worker that died: the case it was judging is
    replayed in isolation, a finding if it fails there (with the replay's verdict)."""
    plan, case = _scratch(tmp_path, ABORT_LOG, crashed=True)
    plan["device"] = None
    units = [cp.Unit(ID, "campaign_impls:raises", "user")]
    snap = cp.collect(tmp_path, plan, units, final=True, replays=cp.Replays(plan))
    (finding,) = snap.findings.values()
    assert finding["key"] == "exception:ValueError" and finding["case"] == case
    assert finding["verdict"]["mismatches"][0]["got"].startswith("ValueError: refusing 2")
    assert finding["examples_to_failure"] == 10  # nine judged before it
    assert finding["id"] == f"{ID}--campaign_impls_raises--exception_ValueError"
    (run,) = snap.runs
    assert run["status"] == "fail" and run["examples"] == 10 and run["findings"] == [finding["id"]]
    assert snap.settled == 1 and not snap.events


@pytest.mark.parametrize("fault", [ABORT_LOG, None])
def test_a_lost_worker_whose_case_passes_alone_is_a_harness_event(tmp_path, fault):
    """A worker SIGKILLed from outside while judging a case the implementation gets right."""
    plan, _ = _scratch(tmp_path, fault, crashed=True)
    plan["device"] = None
    units = [cp.Unit(ID, "reference", "reference")]
    snap = cp.collect(tmp_path, plan, units, final=True, replays=cp.Replays(plan))
    assert not snap.findings
    (event,) = snap.events
    assert event["event"] == "worker-lost" and event["implementation"] == "reference"
    assert "passed when replayed alone" in event["detail"]
    assert ("Fatal Python error: Aborted" if fault else "killed") in event["detail"]
    (run,) = snap.runs
    assert run["status"] == "pass" and run["examples"] == 7 and snap.settled == 1


def test_a_case_in_flight_when_the_campaign_stopped_is_not_a_finding(tmp_path):
    plan, _ = _scratch(tmp_path, fault=None, crashed=False)
    snap = cp.collect(tmp_path, plan, [cp.Unit(ID, "reference", "reference")], final=True)
    assert not snap.findings and snap.runs[0]["status"] == "pass"


def test_a_harness_failure_is_an_error_run_and_a_unit_that_never_ran_too(tmp_path):
    plan, _ = _scratch(tmp_path, fault=None)
    (tmp_path / "inflight" / "u000s00.json").unlink()
    state = json.loads((tmp_path / "items" / "u000s00.json").read_text())
    write_json(tmp_path / "items" / "u000s00.json", state | {"status": "error", "error": "boom"})
    plan["items"].append({"id": "u000s01", "unit": 0, "shard": 1})
    units = [cp.Unit(ID, "triton", "fixed")]
    snap = cp.collect(tmp_path, plan, units, final=True, pytest_status="pytest exit code 3")
    (run,) = snap.runs
    assert (
        run["status"] == "error" and run["error"] == "boom; shard 1 never ran (pytest exit code 3)"
    )
    assert cp.exit_status({"runs": snap.runs, "interrupted": False}) == 4  # attnfuzz failed
    # Stopped on purpose (a signal, the deadline): a unit that never ran is no error.
    snap = cp.collect(tmp_path, plan, units, final=True, interrupted=True, pytest_status="x")
    assert snap.runs[0]["error"] == "boom"


def _ended_at_deadline(tmp_path: Path) -> None:
    """The worker of ``_scratch`` ended its unit at the unit's deadline, having found nothing."""
    (tmp_path / "inflight" / "u000s00.json").unlink()
    path = tmp_path / "items" / "u000s00.json"
    state = json.loads(path.read_text())
    ended = {"deadline": state["updated"], "finished": state["updated"] + 0.1}
    write_json(path, state | {"status": "done", **ended})


@pytest.mark.parametrize("kind", ["fixed", "mutant"])
def test_a_run_short_of_its_floor_is_incomplete_neither_pass_nor_survived(tmp_path, kind):
    """Its budget ended after 7 examples: the machine's speed, not the search, would
    decide a pass (or a survivor). The run says so, with its count and why."""
    plan, _ = _scratch(tmp_path, fault=None)
    _ended_at_deadline(tmp_path)
    plan["min_examples"] = 200
    snap = cp.collect(tmp_path, plan, [cp.Unit(ID, "reference", kind)], final=True)
    (run,) = snap.runs
    assert run["status"] == "pass" and run["examples"] == 7  # what happened, as before
    assert run["min_examples"] == 200 and run["incomplete"] == "the time budget ended"
    assert run_verdict(run) == INCOMPLETE and cp.verdict_word(run) == INCOMPLETE
    assert cp.exit_status({"runs": snap.runs, "interrupted": False}) == 3
    # Its whole example cap judged, the run is complete: the floor is at most the cap.
    plan["items"][0]["max_examples"] = 7
    (run,) = cp.collect(tmp_path, plan, [cp.Unit(ID, "reference", kind)], final=True).runs
    assert run["min_examples"] == 7 and "incomplete" not in run
    assert run_verdict(run) == ("pass" if kind == "fixed" else "survived")


def test_a_lost_worker_s_unit_short_of_its_floor_says_so(tmp_path):
    """SIGKILLed mid-run after 7 examples, the case it was judging passing alone: a
    harness event, and a run with no verdict (not a pass) that says why."""
    plan, _ = _scratch(tmp_path, None, crashed=True)
    plan.update(device=None, min_examples=200)
    units = [cp.Unit(ID, "reference", "reference")]
    snap = cp.collect(tmp_path, plan, units, final=True, replays=cp.Replays(plan))
    (event,) = snap.events
    assert event["event"] == "worker-lost"
    (run,) = snap.runs
    assert run_verdict(run) == INCOMPLETE and run["examples"] == 7
    assert run["incomplete"] == "its worker was lost"
    assert cp.exit_status({"runs": snap.runs, "interrupted": False}) == 3


def test_every_report_shows_an_incomplete_run_with_its_count_and_why(tmp_path):
    from attnfuzz.reports.junit import junit_xml
    from attnfuzz.reports.markdown import summary_markdown

    short = run_record(
        ID, "triton", "fixed", examples=120, seconds=9.0, status="pass", min_examples=200,
        incomplete="the time budget ended",
    )  # fmt: skip
    mutant = run_record(
        ID, MUTANTS[0], "mutant", examples=80, seconds=9.0, status="pass", min_examples=200,
        incomplete="its worker was lost",
    )  # fmt: skip
    doc = campaign_record(
        [short, mutant], [], started="2025-01-01T00:00:00Z", finished="2025-01-01T00:00:10Z",
        seconds=10.0, environment={}, budget_seconds=10.0, min_examples=200,
    )  # fmt: skip
    assert doc["budget"] == {"seconds": 10.0, "max_examples": None, "min_examples": 200}
    assert [cp.verdict_word(r) for r in doc["runs"]] == [INCOMPLETE, INCOMPLETE]
    summary = summary_markdown(doc)
    assert summary.startswith(f"## attnfuzz campaign: {INCOMPLETE}")
    assert "| fixed | INCOMPLETE | 120 |" in summary
    assert "incomplete: 120 of 200 examples, the time budget ended" in summary
    assert "0 survived, 1 incomplete" in summary and "floor 200 examples per run" in summary
    junit = junit_xml(doc)
    assert '<skipped message="incomplete: 120 of 200 examples, the time budget ended"' in junit
    assert '<skipped message="incomplete: 80 of 200 examples, its worker was lost"' in junit
    assert 'skipped="2"' in junit and 'failures="0"' in junit and "<failure" not in junit
    lines = cp.results.summary_lines(doc, tmp_path, 3)
    assert any(
        line.startswith(f"{INCOMPLETE} {ID} / triton (fixed): 120 examples") for line in lines
    )
    assert "(incomplete: 120 of 200 examples, the time budget ended)" in lines[0]
    # A document from before the floor (no min_examples) reads as it always did.
    old = run_record(ID, "triton", "fixed", examples=120, seconds=9.0, status="pass")
    assert run_verdict(old) == "pass"


def test_live_progress_renders_a_row_per_run():
    progress = cp.LiveProgress("campaign")
    progress.console.file = StringIO()
    snap = cp.Snapshot(
        runs=[
            run_record(ID, "triton", "fixed", examples=12, seconds=4.0, status="pass")
            | {"_running": True, "_started": 1.0}  # what collect() adds while it runs
        ]
    )
    with progress:
        progress.update(snap, elapsed=5.0, left=55.0)
    text = progress.console.file.getvalue()
    assert "triton" in text and "12" in text and "55s" in text


def test_progress_past_the_budget_says_what_the_floors_still_need():
    """Once the budget is spent a run that found nothing goes on to its floor: the
    progress says so, and how many examples remain, never a bare "0s left"."""

    def running(examples: int) -> dict:
        record = run_record(ID, "triton", "fixed", examples=examples, seconds=4.0,
                            status="pass", min_examples=200)  # fmt: skip
        return record | {"_running": True, "_started": 1.0}

    snap = cp.Snapshot(runs=[running(150), running(200)])
    assert cp.progress.remaining_text(snap, 12.0) == ", 12s left"
    assert cp.progress.remaining_text(snap, 0.0) == (
        ", budget spent: 1 run finishing its floor, 50 examples to go"
    )
    lines = StringIO()
    cp.LineProgress(lines, every=0.0).update(snap, elapsed=70.0, left=0.0)
    assert "50 examples to go" in lines.getvalue() and "0s left" not in lines.getvalue()
    live = cp.LiveProgress("campaign")
    live.console.file, live.console.width = StringIO(), 160
    with live:
        live.update(snap, elapsed=70.0, left=0.0)
    assert "floor: 50 to go" in live.console.file.getvalue()


# -- command line: usage errors ------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--targets", "nope"], "unknown target"),
        (["--impls", "nope"], "no selected target has"),
        (["--db", "ftp://host/db"], "expected a directory or redis://"),
        (["--db", "redis://127.0.0.1:1"], "cannot reach Redis"),
    ],
)
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, args, message):
    assert main(["campaign", "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--budget", "10x"],
        ["-n", "0"],
        ["--max-examples", "0"],
        ["--min-examples", "-1"],
        ["--profile", "x"],
    ],
)
def test_bad_flags_exit_2(args):
    with pytest.raises(SystemExit) as exc:
        main(["campaign", *args])
    assert exc.value.code == 2


def test_an_unknown_profile_from_the_environment_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(cp.PROFILE_ENV, "nightly")
    assert main(["campaign", "--out", str(tmp_path / "out")]) == 2
    assert "unknown profile 'nightly'" in capsys.readouterr().err


# -- campaigns -------------------------------------------------------------------------


@pytest.mark.slow
def test_zoo_campaign_catches_every_mutant_and_writes_one_case_per_distinct_failure(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(cp.PROFILE_ENV, "ci")  # derandomized: the same cases every time
    # The zoo of a target whose six mutants each fall within 300 examples: the campaign's
    # bookkeeping is what is judged here (each mutant's own search is test_entries').
    code, doc = campaign(
        tmp_path, "--targets", ZOO_ID, "--impls", "reference", "--zoo", "--max-examples", "300",
        "-n", "2",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert doc["schema"] == CAMPAIGN_SCHEMA and doc["profile"] == "ci" and doc["seed"] == 0
    assert doc["workers"] == 2 and doc["database"] == "none" and not doc["interrupted"]
    assert doc["budget"] == {"seconds": None, "max_examples": 300, "min_examples": 200}
    assert set(doc["environment"]) >= {"torch", "hypothesis", "device"}
    runs = by_impl(doc)
    assert set(runs) == {"reference", *ZOO_MUTANTS}
    assert runs["reference"]["status"] == "pass" and runs["reference"]["examples"] == 300
    assert runs["reference"]["min_examples"] == 200  # 300 judged: the floor reached, a pass
    for run in runs.values():
        assert run["labels"] and run["seconds"] > 0 and run["examples_per_second"] > 0
        counts = [n for _, n in run["timeline"]]
        assert counts == sorted(counts) and counts[-1] == run["examples"]
    ids = [f["id"] for f in doc["findings"]]
    assert len(ids) == len(set(ids)), "findings are deduplicated"
    for name in ZOO_MUTANTS:
        assert runs[name]["status"] == "fail" and runs[name]["findings"]
    for f in doc["findings"]:
        assert (f["target"], f["key"]) == (ZOO_ID, f["verdict"]["key"])
        assert f["id"] == finding_id(ZOO_ID, f["implementation"], f["key"])
        assert f["case_file"] == f"cases/{f['id']}.json" and f["examples_to_failure"] >= 1
        path = tmp_path / "out" / f["case_file"]
        assert f["repro"] == f"attnfuzz repro {path}"
        case_doc = read_case(path)
        assert case_doc["schema"] == CASE_SCHEMA and case_doc["case"] == Case.from_dict(f["case"])
        assert case_doc["verdict"] == f["verdict"] and f["derived"]["next_n"] >= 1
        # The case replays the same failure (latent, 5, for an engine's defect that
        # only a FULL replay meets); the fixed implementation passes it.
        assert main(["repro", str(path)]) == (
            5 if (f.get("reachability") or {}).get("status") == "latent" else 1
        )
        assert main(["repro", str(path), "--impl", "triton"]) == 0
    assert sorted(p.name for p in (tmp_path / "out" / "cases").iterdir()) == sorted(
        f"{i}.json" for i in ids
    )
    assert not (tmp_path / "out" / ".work").exists()
    assert not list((tmp_path / "out").glob(".work-unfinished-*"))
    # Not a TTY: plain lines, each finding as it came, then the summary.
    assert "\x1b[" not in out and out.count("FOUND") == len(ids)
    assert "exit status 0" in out


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_campaign_and_what_ran_is_still_written(tmp_path, signum):
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "attnfuzz.harness.cli", "campaign", "--targets", ID,
        "--impls", "reference", MUTANTS[0], "--budget", "5m", "--out", str(out),
        "--db", str(tmp_path / "db"), "-n", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not (out / "cases").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (out / "cases").exists(), "no finding within two minutes"
        time.sleep(1.0)  # the reference has judged something too
        sent = time.time()
        proc.send_signal(signum)
        text, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.time() - sent < 15, "stopping took too long"
    assert proc.returncode == 128 + signum, text
    doc = json.loads((out / "campaign.json").read_text())
    assert doc["interrupted"] and doc["budget"]["seconds"] == 300
    assert doc["seconds"] < 120
    runs = by_impl(doc)
    assert runs["reference"]["examples"] > 0 and runs[MUTANTS[0]]["findings"]
    for f in doc["findings"]:
        assert (out / f["case_file"]).exists()
    assert "interrupted" in text


@pytest.mark.slow
def test_a_budget_is_honoured(tmp_path):
    """Wall clock from the start, worker start-up included: the campaign ends within a
    few seconds of its budget however loaded the machine (workers cut a call short at
    the deadline), and says how many examples each run judged."""
    start = time.time()
    code, doc = campaign(tmp_path, "--targets", ID, "--impls", "reference", "--budget", "20s",
                         "-n", "2", "--quiet")  # fmt: skip
    wall = time.time() - start
    assert code in (0, 3)  # 3: on a machine too slow to judge anything in 20 s
    assert doc["budget"]["seconds"] == 20 and doc["seconds"] < 20 + 6 and wall < 20 + 10


def test_a_budget_too_short_for_the_floor_is_incomplete_never_pass_nor_survived(tmp_path, capsys):
    """The bug report's campaign, the machine's load standing in for by a floor out of
    reach: what found nothing in its share of the budget says so (exit 3), never
    PASS for the reference nor SURVIVED for the mutant; a mutant caught counts."""
    code, doc = campaign(tmp_path, "--targets", ID, "--impls", "reference", "pr39542-lengths",
                         "--budget", "10s", "--min-examples", "1000000", "--quiet")  # fmt: skip
    out = capsys.readouterr().out
    assert code == 3, out
    assert doc["budget"] == {"seconds": 10, "max_examples": None, "min_examples": 1000000}
    verdicts = {r["implementation"]: run_verdict(r) for r in doc["runs"]}
    assert verdicts["reference"] in (INCOMPLETE, "not run"), verdicts  # not run: no example
    assert verdicts["pr39542-lengths"] in (INCOMPLETE, "not run", "caught"), verdicts
    for run in doc["runs"]:
        assert run["min_examples"] == 1000000
        if run_verdict(run) == INCOMPLETE:
            assert run["incomplete"] == "the time budget ended"
            line = f"{INCOMPLETE} {ID} / {run['implementation']} ({run['kind']}): "
            assert line + f"{run['examples']} examples" in out
    assert f"## attnfuzz campaign: {INCOMPLETE}" in (tmp_path / "out" / "summary.md").read_text()
    assert "exit status 3" in out and "SURVIVED" not in out and "PASS " not in out


def test_a_user_implementation_s_replay_line_names_it_again(tmp_path, impls):
    """A case file never makes attnfuzz import anything: the printed replay of a
    finding on ``module:attribute`` must pass ``--impl`` itself, and must work."""
    code, doc = campaign(tmp_path, "--targets", ID, "--impls", "campaign_impls:raises",
                         "--max-examples", "20", "--profile", "ci", "--quiet")  # fmt: skip
    assert code == 1
    (finding,) = doc["findings"]
    argv = shlex.split(finding["repro"])
    assert argv[:2] == ["attnfuzz", "repro"], finding["repro"]
    assert argv[-2:] == ["--impl", "campaign_impls:raises"], finding["repro"]
    assert main(argv[1:]) == 1  # the replay fails as the campaign's run did


@pytest.mark.slow
def test_a_user_s_mutants_run_in_the_campaign_s_workers(tmp_path):
    """``--mutants`` registers a user's mutants here and, through the plan, in every
    worker (a fresh process): the mutant runs on its target, and is caught. In a
    subprocess, so that this process's registry stays as it was."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "attnfuzz.harness.cli", "campaign", "--targets", ID,
         "--impls", "reference", "--mutants", "campaign_impls:MUTANTS", "--max-examples",
         "100", "--profile", "ci", "--quiet", "--out", str(out), "--db", str(tmp_path / "db")],
        cwd=TESTS, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "campaign.json").read_text())
    run = by_impl(doc)["user-raises"]
    assert run["kind"] == "mutant" and run["status"] == "fail", run
    assert set(by_impl(doc)) == {"reference", "user-raises"}


def test_a_bad_mutants_spec_is_a_usage_error_before_any_work(tmp_path, capsys):
    for command in (["campaign", "--out", str(tmp_path / "out")], ["zoo", "--out", str(tmp_path)]):
        assert main([*command, "--targets", ID, "--mutants", "no_such_module_here"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "no_such_module_here" in err, err
    assert not (tmp_path / "out").exists() and not list(tmp_path.iterdir())


@pytest.mark.slow
def test_two_workers_share_one_unit(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFUZZ_KEEP_WORK", "1")  # keep the workers' files to look at
    code, doc = campaign(tmp_path, "--targets", ID, "--impls", "reference", "--max-examples",
                         "40", "--profile", "ci", "-n", "2", "--quiet")  # fmt: skip
    assert code == 0
    kept = tmp_path / "out" / ".work-kept" / "items"
    shards = [json.loads(p.read_text()) for p in sorted(kept.iterdir())]
    assert len(shards) == 2 and len({s["pid"] for s in shards}) == 2
    assert [s["examples"] for s in shards] == [20, 20]
    assert by_impl(doc)["reference"]["examples"] == 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url():
    """A real redis-server on loopback, on a free port, stopped at the end."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("ATTNFUZZ_REQUIRE_SYSTEM_DEPS") == "1":
            pytest.fail("redis-server is not installed (ATTNFUZZ_REQUIRE_SYSTEM_DEPS=1)")
        pytest.skip("redis-server is not installed (setup.sh installs it with apt)")
    import redis

    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        else:
            pytest.fail("redis-server did not start")
        yield f"redis://127.0.0.1:{port}", client
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _replays_first(tmp_path: Path, db: str) -> list[dict]:
    """Two campaigns on one database: the second replays the failure first.

    The first campaign draws at random (a database is not read by a derandomized
    one), and how soon it meets the mutant varies: typically within 100 examples,
    once not within 300. Its budget is large enough that finding it is not what
    this test measures; a campaign ends its run at the first finding anyway.
    """
    docs = []
    for run in ("first", "second"):
        args = ["--targets", ID, "--impls", MUTANTS[0], "--max-examples", "3000", "--db", db]
        code = main(
            ["campaign", *args, "--out", str(tmp_path / run), "--profile", "dev", "--quiet"]
        )
        assert code == 0
        docs.append(json.loads((tmp_path / run / "campaign.json").read_text()))
    first, second = (d["findings"] for d in docs)
    assert first and second and docs[1]["database"] == db
    assert min(f["examples_to_failure"] for f in second) == 1, "not replayed first"
    return docs


@pytest.mark.slow
def test_the_directory_database_replays_a_failure_first(tmp_path):
    _replays_first(tmp_path, str(tmp_path / "db"))
    assert any((tmp_path / "db").rglob("*"))


@pytest.mark.slow
def test_the_redis_database_replays_a_failure_first(tmp_path, redis_url):
    url, client = redis_url
    _replays_first(tmp_path, url)
    assert client.keys("*"), "nothing was saved in Redis"
    assert not (tmp_path / "db").exists()


@pytest.mark.slow
def test_a_worker_killed_from_outside_is_a_harness_event_not_a_finding(tmp_path):
    """SIGKILL one worker mid-campaign: the reference's case it was judging passes when
    replayed alone, so the loss is reported as an event and the campaign still passes.
    Counted in examples, not seconds, so the verdict does not hang on the machine's
    speed: the surviving shard judges its whole cap of 150, over the floor of 100
    (a 40 s budget once left 195 of a floor of 200 on a loaded machine: INCOMPLETE)."""
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "attnfuzz.harness.cli", "campaign", "--targets", ID,
        "--impls", "reference", "--max-examples", "300", "--min-examples", "100",
        "--out", str(out), "--db", str(tmp_path / "db"), "-n", "2", "--quiet",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        victim = None
        deadline = time.time() + 120
        while victim is None and time.time() < deadline:
            time.sleep(0.2)
            for path in (out / ".work" / "items").glob("*.json"):
                state = json.loads(path.read_text() or "{}")
                if state.get("examples", 0) > 0:
                    victim = state["pid"]
        assert victim is not None, "no worker judged anything within two minutes"
        os.kill(victim, signal.SIGKILL)
        text, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    doc = json.loads((out / "campaign.json").read_text())
    assert proc.returncode == 0, text
    assert not doc["findings"]
    (run,) = doc["runs"]
    assert run["examples"] > 150, run  # the survivor's whole cap and the victim's first
    (event,) = doc["events"]
    assert event["event"] == "worker-lost" and event["implementation"] == "reference"
    assert "worker-lost" in text and "Harness events" in (out / "summary.md").read_text()


def test_a_dtype_a_selected_target_cannot_build_in_is_refused_while_planning(monkeypatch):
    """Before any worker starts (on a CPU the device check refuses it even earlier)."""
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "bfloat16")
    assert cp.plan_units([ID], None, zoo=False)  # indexer-decode builds in bfloat16
    with pytest.raises(UsageError, match="ATTNFUZZ_DTYPE"):
        cp.plan_units([ID, "mtp-seq-lens"], None, zoo=False)  # float32 only


def test_a_budget_that_ends_before_any_worker_is_ready_says_why(tmp_path, capsys):
    """Workers take seconds to load torch, Triton and the targets: a one-second budget
    ends first. Every run is NOT RUN (never pass), exit 3, and the console,
    campaign.json, summary.md and report.html each say why."""
    code, doc = campaign(tmp_path, "--targets", ID, "--impls", "reference", "triton",
                         "--budget", "1s", "-n", "1")  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 3, printed
    why = "the time budget ended before a worker was ready"
    for run in doc["runs"]:
        assert run["examples"] == 0 and why in run["incomplete"], run
    assert printed.count(f"(not run: {why}") == len(doc["runs"]), printed
    for report in ("summary.md", "report.html"):
        assert f"not run: {why}" in (tmp_path / "out" / report).read_text(), report
