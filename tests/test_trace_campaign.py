"""Campaigns of traces: an implementation that lives across steps (or every one, with
``--trace``) is searched with traces, each judged by a new engine in a new process;
its finding is a trace case file failing at a step, and ``campaign.json``, the
summary and the reports say so.

The worker runs in this process, its search sized by an example count (a deadline of
seconds found nothing on a loaded machine); the rest reads hand-written worker files
(tests/trace_cases.py).
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import sys
import time
from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.campaign.document import campaign_record, finding_record
from attnfuzz.harness.campaign.findings import place_findings
from attnfuzz.harness.campaign.results import CaseWriter, summary_lines, write_results
from attnfuzz.harness.campaign.worker import run_item, write_json
from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.cli.campaign import options_from_args
from attnfuzz.harness.cli.dispatch import build_parser
from attnfuzz.reference.trace import Trace

TESTS = Path(__file__).parent
TRACED = "trace_cases:TRACED"  # first_call_buffer, declared traced


@pytest.fixture
def tc(monkeypatch):
    """tests/trace_cases.py (and stateful_impl, which it names) importable here."""
    monkeypatch.syspath_prepend(str(TESTS))
    return importlib.import_module("trace_cases")


def _scratch(root: Path) -> Path:
    for sub in ("items", "inflight", "faults", "started", "crashed"):
        (root / sub).mkdir(parents=True)
    return root


def _plan(items: list[dict], started: float, **fields) -> dict:
    return {
        "started": started,
        "budget": None,
        "deadline": None,
        "deadline_soft": False,
        "workers": 1,
        "profile": "ci",
        "derandomized": True,
        "seed": 0,
        "database": None,
        "scale": "small",
        "device": None,
        "example_timeout": 30.0,
        "items": items,
        "min_examples": 0,
        "mutants": [],
        **fields,
    }


# -- planning ---------------------------------------------------------------------------


def test_a_traced_implementation_and_the_trace_option_plan_trace_runs(tc):
    units = cp.plan_units([tc.TARGET], [tc.STATEFUL, TRACED], zoo=False)
    assert [(u.impl, u.traced) for u in units] == [(tc.STATEFUL, False), (TRACED, True)]
    # --trace: every selected implementation, whatever it declares.
    (unit,) = cp.plan_units([tc.TARGET], [tc.STATEFUL], zoo=False, trace=True)
    assert unit.traced
    (item,) = cp.plan_items([unit], workers=1, max_examples=10)
    assert item["traced"] is True
    argv = ["campaign", "--targets", tc.TARGET, "--impls", tc.STATEFUL, "--trace"]
    assert options_from_args(build_parser().parse_args(argv)).trace is True
    assert options_from_args(build_parser().parse_args(argv[:-1])).trace is False


# -- the worker -------------------------------------------------------------------------


def test_a_worker_searches_a_traced_implementation_with_traces(tc, tmp_path):
    """Each example a trace judged in a new process: the buffer sized by a trace's first
    step fails at a later one. (Judged as single cases by one long-lived child, its
    failure would be a case that passes on its own.)"""
    scratch = _scratch(tmp_path)
    # Sized by examples, not by a deadline: the verdict is the same on a loaded machine.
    (item,) = cp.plan_items([cp.Unit(tc.TARGET, TRACED, "user", True)], 1, 20)
    plan = _plan([item], time.time())
    was_enabled = faulthandler.is_enabled()
    try:
        state = run_item(scratch, plan, item)
    finally:  # the worker reports its own faults, then turns faulthandler off
        if was_enabled:
            faulthandler.enable(file=sys.__stderr__)
    assert state["status"] == "done" and state["traced"] is True
    finding = state["findings"]["shape"]
    trace = Trace.from_dict(finding["case"])
    assert 1 <= finding["step"] < len(trace.steps)  # a later step than the first
    assert any(label.startswith("steps=") for label in state["labels"])  # trace labels
    assert json.loads((scratch / "items" / f"{item['id']}.json").read_text())["traced"]


def test_a_single_step_worker_marks_a_finding_that_passes_alone_history_dependent(tc, tmp_path):
    """Judged as single cases by one long-lived child, the buffer sized by an earlier
    example fails a later one: the finding's case passes in a new process, so the
    worker never writes it as a case that silently passes. Its history, replayed as
    one engine's trace, fails: the finding is that trace, at its step
    (harness/history_trace.py); a history that failed as no trace would be marked
    history-dependent, as its case file and the console would say."""
    scratch = _scratch(tmp_path)
    (item,) = cp.plan_items([cp.Unit(tc.TARGET, tc.STATEFUL, "user", False)], 1, 40)
    plan = _plan([item], time.time())
    was_enabled = faulthandler.is_enabled()
    try:
        state = run_item(scratch, plan, item)
    finally:
        if was_enabled:
            faulthandler.enable(file=sys.__stderr__)
    findings = list(state["findings"].values())
    assert findings
    for finding in findings:
        if finding.get("history_dependent"):  # its history failed as no trace
            assert "step" not in finding
        else:  # the trace its history is, failing at its last step
            assert finding["from_history"] >= 2 and finding["confirmed"] == "confirmed"
            assert finding["step"] == len(finding["case"]["steps"]) - 1 >= 1
    shown = {"id": "f", "case_file": "f.json", "target": tc.TARGET}
    CaseWriter(tmp_path / "out", "cpu").write(findings[0] | shown | {"implementation": tc.STATEFUL})
    doc = read_case(tmp_path / "out" / "f.json")
    if findings[0].get("history_dependent"):
        assert doc["history_dependent"] is True
    else:
        assert doc["step"] == findings[0]["step"] and "history_dependent" not in doc


def test_a_trace_finding_on_engine_code_is_placed_at_its_failing_step(tc, monkeypatch):
    """Reachability of a trace is its failing step's, judged after the steps before it
    (as ``attnfuzz run`` computes it)."""
    import attnfuzz.harness.reachability as reachability

    seen = {}

    def reach(target, impl, case, judge):
        seen["case"], seen["verdict"] = case, judge(case)
        return None

    monkeypatch.setattr(reachability, "finding_reachability", reach)
    trace = tc.two_steps()
    log = type("Log", (), {})()
    log.state = {"findings": {"shape": {"case": trace.to_dict(), "step": 1}}}
    log.flush = lambda: None
    impl = type("Impl", (), {"engine": "vllm", "name": "x"})()
    target = type("Target", (), {"name": tc.TARGET})()
    judged = []
    place_findings(log, target, impl, lambda c: "single", lambda t: judged.append(t) or "trace")
    assert seen == {"case": trace.case(1), "verdict": "trace"}
    assert judged == [trace]  # step 0, then the step judged: one engine's life


# -- what the controller makes of the workers' files -------------------------------------


def _trace_state(tc, started: float) -> dict:
    doc = tc.trace_document()
    return {
        "status": "done",
        "traced": True,
        "started": started + 1,
        "updated": started + 3,
        "finished": started + 3,
        "first_example": started + 1,
        "deadline": None,
        "examples": 12,
        "labels": {"steps=2": 12},
        "timeline": [[1.0, 0], [3.0, 12]],
        "findings": {
            "shape": {
                "key": "shape",
                "case": doc["trace"],
                "step": doc["step"],
                "verdict": doc["verdict"],
                "examples_to_failure": 4,
                "seconds_to_failure": 0.5,
                "found": started + 2,
            }
        },
    }


def test_a_trace_finding_is_a_trace_case_file_and_campaign_json_says_so(tc, tmp_path):
    scratch = _scratch(tmp_path / "out" / ".work")
    now = time.time()
    (item,) = cp.plan_items([cp.Unit(tc.TARGET, tc.STATEFUL, "user", True)], 1, None)
    plan = _plan([item], now - 5)
    write_json(scratch / "items" / f"{item['id']}.json", _trace_state(tc, now - 5))
    snap = cp.collect(scratch, plan, [cp.Unit(tc.TARGET, tc.STATEFUL, "user", True)], final=True)
    (run,) = snap.runs
    assert run["traced"] is True and run["status"] == "fail"
    (finding,) = snap.findings.values()
    assert finding["step"] == 1 and finding["case"] == tc.trace_document()["trace"]

    out = scratch.parent
    writer = CaseWriter(out, "cpu")
    assert writer.write(finding)
    doc = read_case(out / finding["case_file"])
    assert isinstance(doc["case"], Trace) and doc["case"] == tc.two_steps()
    assert doc["step"] == 1 and len(doc["derived"]["steps"]) == 2

    record = finding_record(
        finding["target"],
        finding["implementation"],
        finding["case"],
        finding["verdict"],
        derived=finding["derived"],
        shown_out=Path("out"),
        examples_to_failure=finding["examples_to_failure"],
        seconds_to_failure=finding["seconds_to_failure"],
        step=finding["step"],
    )
    fields = dict(
        runs=snap.runs,
        findings=[record],
        started="2026-01-01T00:00:00Z",
        finished="2026-01-01T00:00:05Z",
        seconds=5.0,
        environment={},
    )
    results = write_results(campaign_record, fields, writer)
    assert results.complete, results.problems(out)
    campaign = json.loads((out / "campaign.json").read_text())
    assert campaign["runs"][0]["traced"] is True
    (written,) = campaign["findings"]
    assert written["step"] == 1 and written["case"]["steps"] == doc["trace"]["steps"]
    lines = summary_lines(campaign, Path("out"), 1)
    assert lines[0].startswith(f"FAIL     {tc.TARGET} / {tc.STATEFUL} (user): 12 traces")
    assert "at step 1" in (out / "junit.xml").read_text()
    summary = (out / "summary.md").read_text()
    assert "Fails at step 1 of a trace of 2 steps" in summary and "step 1 [FAILS]" in summary


def test_a_campaign_document_refuses_a_step_past_its_trace(tc):
    trace = tc.two_steps().to_dict()
    verdict = tc.trace_document()["verdict"]
    common = dict(derived={}, shown_out=Path("out"), examples_to_failure=1, seconds_to_failure=1.0)
    record = finding_record(tc.TARGET, tc.STATEFUL, trace, verdict, step=2, **common)
    run = {
        "target": tc.TARGET,
        "implementation": tc.STATEFUL,
        "kind": "user",
        "status": "fail",
        "examples": 1,
        "seconds": 1.0,
        "findings": [record["id"]],
    }
    when = dict(started="s", finished="f", seconds=1.0, environment={})
    with pytest.raises(Exception, match=r"findings\[0\]\.step is 2; its case is a trace of 2"):
        campaign_record([run], [record], **when)


def test_a_lost_worker_s_trace_is_replayed_step_by_step_in_a_new_process(tc, tmp_path):
    """The trace a worker was judging when it died is replayed alone: a finding at the
    step it fails at, its labels a trace's."""
    scratch = _scratch(tmp_path)
    now = time.time()
    (item,) = cp.plan_items([cp.Unit(tc.TARGET, tc.STATEFUL, "user", True)], 1, None)
    plan = _plan([item], now - 10)
    state = _trace_state(tc, now - 10) | {"status": "running", "findings": {}, "labels": {}}
    write_json(scratch / "items" / f"{item['id']}.json", state)
    inflight = {"case": tc.two_steps().to_dict(), "examples": 12, "started": now - 6}
    write_json(scratch / "inflight" / f"{item['id']}.json", inflight)
    (scratch / "crashed" / item["id"]).touch()
    units = [cp.Unit(tc.TARGET, tc.STATEFUL, "user", True)]
    snap = cp.collect(scratch, plan, units, final=True, replays=cp.Replays(plan))
    (finding,) = snap.findings.values()
    assert finding["key"] == "shape" and finding["step"] == 1
    assert finding["case"] == inflight["case"]
    (run,) = snap.runs
    assert run["examples"] == 13 and run["labels"].get("steps=2") == 1 and run["traced"]
