"""Reports of a trace finding: the HTML page shows the trace step by step (each step's
summary line, its requests, which step failed and the mismatches under it); the
Markdown summary and JUnit XML say the failing step and list the steps; a case on
its own renders as before. Documents are hand-written (tests/trace_cases.py)."""

from __future__ import annotations

import importlib
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from attnfuzz.harness.campaign.document import campaign_record, finding_record, run_record
from attnfuzz.harness.casefile import case_document
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.testing import hand_case
from attnfuzz.reports import write_reports
from attnfuzz.reports.html import report_html
from attnfuzz.reports.junit import junit_xml
from attnfuzz.reports.markdown import summary_markdown

TESTS = Path(__file__).parent


@pytest.fixture
def tc(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    return importlib.import_module("trace_cases")


def _finding(doc: dict, **extra) -> dict:
    """campaign.json's record of a case file's document (a trace's or a case's)."""
    trace = "trace" in doc
    return finding_record(
        doc["target"],
        doc["implementation"],
        doc["trace"] if trace else doc["case"],
        doc["verdict"],
        derived=doc["derived"],
        shown_out=Path("out"),
        examples_to_failure=3,
        seconds_to_failure=0.5,
        step=doc["step"] if trace else None,
        **extra,
    )


def _campaign(tc, derived_steps: bool = True) -> dict:
    trace_doc = tc.trace_document()
    if not derived_steps:  # a document whose derived has no step lines: made from the batches
        del trace_doc["derived"]["steps"]
    case = hand_case((2, 2), (5, 7), num_spec=1)
    wrong = Verdict([Mismatch("values", "seq_lens[1]", "9", "8")])
    case_doc = json.loads(json.dumps(case_document("mtp-seq-lens", "triton", case, wrong)))
    findings = [_finding(trace_doc), _finding(case_doc)]
    runs = [
        run_record(
            tc.TARGET,
            tc.STATEFUL,
            "user",
            examples=12,
            seconds=2.0,
            status="fail",
            findings=[findings[0]["id"]],
            traced=True,
        ),
        run_record(
            "mtp-seq-lens",
            "triton",
            "fixed",
            examples=5,
            seconds=1.0,
            status="fail",
            findings=[findings[1]["id"]],
        ),
    ]
    return campaign_record(
        runs,
        findings,
        started="2026-01-01T00:00:00Z",
        finished="2026-01-01T00:00:03Z",
        seconds=3.0,
        environment={},
    )


class _Steps(HTMLParser):
    """Each ``li.step`` of the page: its classes, its text, and the headings and
    table header cells inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[dict] = []
        self.depth = 0  # of li elements, inside a step
        self.tag = ""

    def handle_starttag(self, tag, attrs):
        self.tag = tag
        classes = (dict(attrs).get("class") or "").split()
        if tag == "li" and "step" in classes and self.depth == 0:
            self.steps.append({"class": classes, "text": "", "h5": [], "th": []})
            self.depth = 1
        elif tag == "li" and self.depth:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "li" and self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if not self.depth:
            return
        step = self.steps[-1]
        step["text"] += data
        if self.tag in ("h5", "th"):
            step[self.tag].append(data)


def _steps(page: str) -> list[dict]:
    parser = _Steps()
    parser.feed(page)
    return parser.steps


@pytest.mark.parametrize("derived_steps", [True, False])
def test_html_shows_a_trace_step_by_step_with_its_failing_step_marked(tc, derived_steps):
    campaign = _campaign(tc, derived_steps)
    page = report_html(campaign)
    trace = tc.two_steps()
    zero, one = _steps(page)
    lines = tc.trace_document()["derived"]["steps"]
    assert "step-ok" in zero["class"] and "step-fails" in one["class"]
    assert zero["text"].startswith(f"ok step 0: {lines[0]}")
    assert one["text"].startswith(f"FAILS step 1: {lines[1]}")
    for step, shown in zip(trace.steps, (zero, one), strict=True):
        for r, request in enumerate(step.req_ids):
            cells = [request, step.q_lens[r], step.num_computed_tokens[r]]
            assert "".join(map(str, cells)) in shown["text"].replace(" ", "")
            assert json.dumps(list(step.pages[r])) in shown["text"]
    assert {"request", "q_len", "num_computed_tokens", "pages"} <= set(zero["th"])
    # The mismatches are the failing step's, under it, and nowhere else.
    assert zero["h5"] == [] and one["h5"][0] == "Mismatches at step 1"
    assert "expected" in one["th"] and "[2, 2, 4]" in one["text"]
    assert "Minimized trace: 2 steps of one engine, failing at step 1" in page
    assert page.count("[2, 2, 4]") == 1
    assert "user (traces)" in page  # the run's record: a trace run


def test_a_case_on_its_own_renders_as_before(tc):
    page = report_html(_campaign(tc))
    single = page[page.index('id="finding-mtp-seq-lens--triton--values"') :]
    single = single[: single.index("</section>")]
    assert "<h4>Mismatches</h4>" in single and "<h4>Minimized case</h4>" in single
    assert '<pre class="case">' in single and 'class="steps"' not in single
    assert "Derived quantities" in single


def test_markdown_and_junit_say_the_failing_step_and_list_the_steps(tc, tmp_path):
    campaign = _campaign(tc)
    lines = tc.trace_document()["derived"]["steps"]
    md = summary_markdown(campaign)
    assert f"Fails at step 1 of a trace of 2 steps of one engine: `{lines[1]}`" in md
    assert f"step 0 [ok]: {lines[0]}" in md and f"step 1 [FAILS]: {lines[1]}" in md
    assert "<summary>minimized trace</summary>" in md
    assert "| user (traces) |" in md
    root = ET.fromstring(junit_xml(campaign))
    (failure,) = [
        case.find("failure") for case in root.iter("testcase") if case.get("name") == tc.STATEFUL
    ]
    assert failure.get("message").endswith("(at step 1 of a trace)")
    assert "minimized trace, failing at step 1:" in failure.text
    assert f"step 1 [FAILS]: {lines[1]}" in failure.text
    # Everything renders and is written, the trace finding among the others.
    assert len(write_reports(campaign, tmp_path)) == 3
