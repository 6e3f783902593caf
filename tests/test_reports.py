"""Campaign reports: JUnit XML, Markdown summary, HTML (in a real browser), regression reports."""

from __future__ import annotations

import copy
import html
import io
import json
import os
import re
import shutil
import struct
import subprocess
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from attnfuzz.harness.campaign.document import campaign_record, finding_record, run_record
from attnfuzz.harness.campaign.outdir import PREVIOUS, keep_previous
from attnfuzz.harness.casefile import case_document, environment, read_case, write_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import CAMPAIGN_SCHEMA, finding_id, repro_command, timestamp
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import RunResult, fuzz
from attnfuzz.harness.target import Implementation
from attnfuzz.reference.batch import Case
from attnfuzz.reports import write_reports
from attnfuzz.reports.document import campaign_verdict, check_campaign, run_verdict
from attnfuzz.reports.regression import compare, regression_markdown

# -- building a campaign's records from runs in this process (what the tests need) --


def record_finding(
    out: Path,
    target: str,
    implementation: str,
    case: Case,
    verdict: Verdict,
    *,
    device: str = "cpu",
    examples_to_failure: int | None = None,
    seconds_to_failure: float | None = None,
) -> dict[str, Any]:
    """Write the finding's case file under ``out/cases/`` and return its record."""
    assert not verdict.ok, "a finding needs a failing verdict"
    fid = finding_id(target, implementation, verdict.key)
    document = case_document(target, implementation, case, verdict, device)
    write_case(out / f"cases/{fid}.json", document)
    return finding_record(
        target,
        implementation,
        case.to_dict(),
        document["verdict"],
        derived=document["derived"],
        shown_out=out,
        examples_to_failure=examples_to_failure,
        seconds_to_failure=seconds_to_failure,
    )


class Timeline:
    """``[seconds since start, examples so far]`` points, a few a second at most.

    Call :meth:`tick` after every example; :meth:`close` adds the last point.
    """

    def __init__(self, per_second: float = 4.0, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.gap = clock, 1.0 / per_second
        self.start = clock()
        self.points: list[list[float]] = [[0.0, 0]]
        self.examples = 0

    def tick(self, examples: int | None = None) -> None:
        self.examples = self.examples + 1 if examples is None else examples
        t = self.clock() - self.start
        if t - self.points[-1][0] >= self.gap:
            self.points.append([round(t, 3), self.examples])

    def close(self) -> list[list[float]]:
        t = round(self.clock() - self.start, 3)
        if self.points[-1][1] != self.examples or len(self.points) == 1:
            self.points.append([max(t, self.points[-1][0]), self.examples])
        return self.points


def from_result(
    result: RunResult,
    kind: str,
    out: Path,
    *,
    device: str = "cpu",
    timeline: Sequence[Sequence[float]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A :class:`harness.runner.RunResult` as ``(run, findings)``; writes the case file."""
    findings = []
    if result.failed:
        findings.append(
            record_finding(
                out,
                result.target,
                result.implementation,
                result.case,
                result.verdict,
                device=device,
                examples_to_failure=result.examples_to_failure,
                seconds_to_failure=result.seconds_to_failure,
            )
        )
    run = run_record(
        result.target,
        result.implementation,
        kind,
        examples=result.examples,
        seconds=result.seconds,
        status="fail" if result.failed else "pass",
        labels=result.labels,
        timeline=timeline,
        findings=[f["id"] for f in findings],
    )
    return run, findings


HOSTILE = "bad <script>alert(1)</script> & co | `tick` \x1b[31m\x00"


def hostile(inputs):
    """A user implementation whose exception message tries to inject markup."""
    raise RuntimeError(HOSTILE)


def _run(out: Path, target, impl: Implementation, max_examples: int):
    timeline = Timeline(per_second=20)

    def counted(inputs, fn=impl.fn):
        timeline.tick()
        return fn(inputs)

    result = fuzz(
        target, replace(impl, fn=counted), max_examples=max_examples, rng_seed=0, database=None
    )
    return from_result(result, impl.kind, out, timeline=timeline.close())


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> tuple[dict, Path]:
    """A real campaign on indexer-decode: the reference passes, a mutant is caught, a
    user's implementation fails with a hostile message; plus a hand-recorded mutant
    that survived and a run that errored, so that every verdict appears."""
    out = tmp_path_factory.mktemp("campaign")
    target = get_target("indexer-decode")
    started, start = timestamp(), time.perf_counter()
    runs, findings = [], []
    plan = [
        (target.implementations["reference"], 40),
        (target.implementations["pr39542-writeback"], 300),
        (Implementation("my_module:hostile", hostile, "user"), 10),
    ]
    for impl, n in plan:
        run, found = _run(out, target, impl, n)
        runs.append(run)
        findings += found
    runs.append(
        run_record(
            "indexer-decode",
            "pr39542-overlap",
            "mutant",
            examples=5,
            seconds=0.2,
            status="pass",
            labels={"next_n=1": 5},
        )
    )
    runs.append(
        run_record(
            "other-target",
            "triton",
            "fixed",
            examples=0,
            seconds=0.01,
            status="error",
            error="ImportError: no module named <kernels> & co",
        )
    )
    doc = campaign_record(
        runs,
        findings,
        started=started,
        finished=timestamp(),
        seconds=time.perf_counter() - start,
        environment=environment("cpu"),
        max_examples=300,
        profile="ci",
        seed=0,
    )
    (out / "campaign.json").write_text(json.dumps(doc, indent=2))
    return doc, out


@pytest.fixture(scope="module")
def written(campaign) -> dict[str, Path]:
    doc, out = campaign
    return {p.name: p for p in write_reports(doc, out)}


def test_campaign_document_from_real_runs(campaign):
    doc, out = campaign
    assert doc["schema"] == CAMPAIGN_SCHEMA
    verdicts = {r["implementation"]: run_verdict(r) for r in doc["runs"]}
    assert verdicts == {
        "reference": "pass",
        "pr39542-writeback": "caught",
        "my_module:hostile": "FAIL",
        "pr39542-overlap": "survived",
        "triton": "ERROR",
    }
    assert campaign_verdict(doc) == "FAIL"
    ids = {f["implementation"]: f["id"] for f in doc["findings"]}
    assert ids["pr39542-writeback"] == "indexer-decode--pr39542-writeback--exception_RuntimeError"
    assert ":" not in ids["my_module:hostile"]  # a file name
    for f in doc["findings"]:
        case_doc = read_case(out / f["case_file"])  # the format `attnfuzz repro` reads
        assert case_doc["case"].to_dict() == f["case"]
        assert f["examples_to_failure"] >= 1 and f["seconds_to_failure"] is not None
    user = next(f for f in doc["findings"] if f["implementation"] == "my_module:hostile")
    # A case file never imports code: replaying a user's finding names it again.
    assert user["repro"].endswith("--impl my_module:hostile")
    mutant = next(r for r in doc["runs"] if r["implementation"] == "pr39542-writeback")
    assert sum(mutant["labels"].values()) > mutant["examples"]  # several classes per example
    points = mutant["timeline"]
    assert points[0] == [0.0, 0] and points[-1][1] == mutant["examples"]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(points, points[1:], strict=False))


def test_write_reports_writes_three_files(written):
    assert sorted(written) == ["junit.xml", "report.html", "summary.md"]
    assert all(p.stat().st_size > 500 for p in written.values())


def test_junit_xml_parses_and_has_the_usual_shape(campaign, written):
    doc, _ = campaign
    root = ET.parse(written["junit.xml"]).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["indexer-decode", "other-target"]
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert len(cases) == len(doc["runs"])  # one per target x implementation
    assert all(c.get("classname").startswith("attnfuzz.") for c in cases.values())
    assert all(float(c.get("time")) >= 0 for c in cases.values())
    # Counts agree with the children.
    for s in suites:
        kids = s.findall("testcase")
        assert int(s.get("tests")) == len(kids)
        assert int(s.get("failures")) == sum(len(c.findall("failure")) for c in kids)
        assert int(s.get("errors")) == sum(len(c.findall("error")) for c in kids)
    assert int(root.get("tests")) == 5 and int(root.get("failures")) == 2
    assert int(root.get("errors")) == 1
    # A caught mutant and the passing reference are passing test cases.
    for name in ("reference", "pr39542-writeback"):
        assert cases[name].find("failure") is None and cases[name].find("error") is None
    assert "caught" in cases["pr39542-writeback"].findtext("system-out")
    # The failure carries the minimized case, its mismatch and the replay command.
    failure = cases["my_module:hostile"].find("failure")
    assert failure.get("type") == "exception"
    assert "<script>alert(1)</script> & co" in failure.get("message")
    assert '"q_lens"' in failure.text and "attnfuzz repro" in failure.text
    assert "\\x1b" in failure.text and "\x1b" not in failure.text  # XML cannot hold it
    assert cases["pr39542-overlap"].find("failure").get("type") == "survived"
    assert "<kernels>" in cases["triton"].find("error").get("message")


def _outside_code(markdown: str) -> str:
    """Markdown with fenced blocks and code spans removed: what is read as markup."""
    text = re.sub(r"^(`{3,}).*?^\1", "", markdown, flags=re.S | re.M)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", text)


def test_summary_markdown(campaign, written):
    doc, out = campaign
    md = written["summary.md"].read_text()
    assert md.startswith("## attnfuzz campaign: FAIL")
    rows = [line for line in md.splitlines() if line.startswith("| `indexer-decode` | `")]
    assert len(rows) >= 4
    verdict_rows = {r.split("|")[2].strip(" `"): r for r in rows[:4]}
    assert "| caught |" in verdict_rows["pr39542-writeback"]
    assert "| **FAIL** |" in verdict_rows["my_module:hostile"]
    assert "| **survived** |" in verdict_rows["pr39542-overlap"]
    for f in doc["findings"]:
        assert f["repro"] in md or f["repro"].replace("|", "\\|") in md
    # Text from exceptions only ever appears inside code: never as markup.
    outside = _outside_code(md)
    assert "<script" not in outside and "<kernels>" not in outside
    assert "alert(1)</script> & co \\| " in md  # in a table-safe code span
    # Every table row has as many cells as its header.
    for block in re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M):
        lines = block.splitlines()
        widths = {len(re.split(r"(?<!\\)\|", line)) for line in lines}
        assert len(widths) == 1, lines


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def test_html_is_self_contained_and_escapes_exception_text(campaign, written):
    doc, _ = campaign
    page = written["report.html"].read_text()
    parsed = _Tags()
    parsed.feed(page)
    assert "script" not in parsed.tags  # the hostile message did not become an element
    assert parsed.tags.count("svg") == 2 * 2  # a timeline and a coverage plot per target
    text = "".join(parsed.text)
    assert "<script>alert(1)</script> & co" in text and "<kernels> & co" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page
    # Offline: no external resource of any kind.
    assert not re.search(r"(src|href)=\"(?!#)", page)
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    for f in doc["findings"]:
        assert f'id="finding-{f["id"]}"'.replace(":", "_") in page


def _png_size_and_colours(path: Path) -> tuple[int, int, int]:
    """Width, height, and the number of distinct byte values of the decoded (filtered)
    scanlines: a single-colour image, whatever the filter, has only a handful."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def _chromium() -> str:
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if exe is None:
        if os.environ.get("ATTNFUZZ_REQUIRE_SYSTEM_DEPS") == "1":
            pytest.fail("chromium is required (ATTNFUZZ_REQUIRE_SYSTEM_DEPS=1) but not installed")
        pytest.skip("chromium is not installed (setup.sh installs it); cannot render the report")
    return exe


def _browser(tmp_path: Path) -> list[str]:
    """chromium, headless, with a profile of its own: the command line before the URL."""
    return [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]


def test_html_renders_in_a_headless_browser(campaign, written, tmp_path):
    flags = _browser(tmp_path)
    doc, _ = campaign
    url = written["report.html"].resolve().as_uri()
    shot = tmp_path / "report.png"
    run = subprocess.run(
        [*flags, "--window-size=1200,1600", f"--screenshot={shot}", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    width, height, colours = _png_size_and_colours(shot)
    assert (width, height) == (1200, 1600)
    assert colours > 32, "the screenshot is (nearly) a single colour"

    dom = subprocess.run(
        [*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120
    ).stdout
    parsed = _Tags()
    parsed.feed(dom)
    # The browser built the tables and the plots.
    assert parsed.tags.count("tr") >= 1 + len(doc["runs"]) + len(doc["findings"])
    assert parsed.tags.count("svg") == 4
    assert parsed.tags.count("polyline") == len(doc["runs"])
    assert parsed.tags.count("circle") == len(doc["findings"])  # first failures marked
    assert "script" not in parsed.tags
    text = "".join(parsed.text)
    assert "<script>alert(1)</script> & co" in text
    for run in doc["runs"]:
        assert run["implementation"] in text


# Run in the page by the layout test (the report itself has no script): where the
# sections lie, and every place a case's JSON wraps, with the characters either side
# and whether a space ends the line (a boundary between tokens) or the break fell
# inside a token (``n|ull``).
LAYOUT_PROBE = r"""
(() => {
  const box = (el) => (el ? el.getBoundingClientRect() : null);
  const wraps = [];
  const range = document.createRange();
  for (const pre of document.querySelectorAll("pre.case")) {
    const walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
    let top = null, before = "\n";
    for (let node; (node = walker.nextNode()); ) {
      const s = node.data;
      for (let i = 0; i < s.length; i++) {
        if (/\s/.test(s[i])) { if (s[i] === "\n") top = null; before = s[i]; continue; }
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const r = range.getClientRects()[0];
        if (!r) continue;
        if (top !== null && r.top > top + 1) {
          wraps.push({at: s.slice(Math.max(0, i - 12), i) + "|" + s.slice(i, i + 12),
                      between_tokens: /\s/.test(before)});
        }
        top = r.top;
        before = s[i];
      }
    }
  }
  const first = document.querySelector("#findings section.finding");
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({
    screen: window.innerHeight,
    findings_top: box(document.querySelector("#findings"))?.top ?? null,
    heading_bottom: box(first?.querySelector("h3"))?.bottom ?? null,
    replay_bottom: box(first?.querySelector("pre.repro"))?.bottom ?? null,
    coverage_top: box(document.querySelector("svg.coverage"))?.top ?? null,
    environment_top: box(document.querySelector("#environment"))?.top ?? null,
    environment_open: document.querySelector("#environment")?.open ?? null,
    cases: document.querySelectorAll("pre.case").length,
    wraps,
  });
  document.body.append(probe);
})();
"""


def test_html_opens_on_verdicts_and_findings_and_wraps_case_json_between_tokens(
    campaign, written, tmp_path
):
    """A new user's first screen: the verdicts and the failing implementation's finding
    with its replay command, not the environment nor the plots; a case's JSON wraps at
    spaces, never inside a token (``n`` / ``ull``)."""
    flags = [*_browser(tmp_path), "--window-size=1280,900"]
    doc, _ = campaign
    page = written["report.html"]
    shot = tmp_path / "first-screen.png"
    run = subprocess.run(
        [*flags, f"--screenshot={shot}", page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    width, height, colours = _png_size_and_colours(shot)
    assert (width, height) == (1280, 900) and colours > 32

    probed = tmp_path / "probed.html"
    script = f"<script>{LAYOUT_PROBE}</script>"
    probed.write_text(page.read_text().replace("</body>", script + "</body>"))
    dom = subprocess.run(
        [*flags, "--virtual-time-budget=2000", "--dump-dom", probed.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, flags=re.S)
    assert found, dom[-2000:]
    layout = json.loads(html.unescape(found.group(1)))
    screen = min(layout["screen"], 900)
    # The findings, the first one's heading and its replay command: all in the first screen.
    assert layout["findings_top"] is not None and layout["findings_top"] < screen, layout
    assert layout["heading_bottom"] is not None and layout["heading_bottom"] <= screen, layout
    assert layout["replay_bottom"] is not None and layout["replay_bottom"] <= screen, layout
    # Then the plots; the environment last, folded.
    assert layout["findings_top"] < layout["coverage_top"] < layout["environment_top"], layout
    assert layout["environment_open"] is False
    assert layout["cases"] == len(doc["findings"])
    # A minimized case's config line is wider than the page: it wraps, between tokens.
    assert layout["wraps"], "no case JSON wrapped: the check below would prove nothing"
    inside = [w["at"] for w in layout["wraps"] if not w["between_tokens"]]
    assert not inside, inside


def test_reports_of_an_interrupted_campaign_with_no_runs(tmp_path):
    doc = campaign_record(
        [],
        [],
        started=timestamp(),
        finished=timestamp(),
        seconds=0.1,
        environment={"device": "cpu"},
        interrupted=True,
    )
    paths = write_reports(doc, tmp_path)
    assert campaign_verdict(doc) == "INCOMPLETE"
    assert "Interrupted" in (tmp_path / "summary.md").read_text()
    assert ET.parse(tmp_path / "junit.xml").getroot().get("tests") == "0"
    assert len(paths) == 3


def test_a_malformed_campaign_is_a_one_line_usage_error(campaign, tmp_path):
    doc, _ = campaign
    bad = copy.deepcopy(doc)
    bad["runs"][0]["findings"] = ["no-such-finding"]
    with pytest.raises(UsageError, match="names 'no-such-finding', which is no finding"):
        write_reports(bad, tmp_path)
    bad = copy.deepcopy(doc)
    bad["runs"][1]["kind"] = "bogus"
    with pytest.raises(UsageError, match=r"\$\.runs\[1\]\.kind: 'bogus' is not one of \['fixed',"):
        check_campaign(bad)
    assert not list(tmp_path.iterdir())


def test_a_passing_campaign_and_first_failures_on_their_line(tmp_path):
    """Timelines may count from the campaign's start (runs in sequence): the ring of a
    first failure sits where the run's own line reached that many examples."""
    runs = [
        run_record(
            "t",
            "triton",
            "fixed",
            examples=60,
            seconds=3.0,
            status="pass",
            timeline=[[0.0, 0], [3.0, 60]],
            labels={"a": 60},
        ),
        run_record(
            "t",
            "m",
            "mutant",
            examples=40,
            seconds=4.0,
            status="fail",
            timeline=[[3.0, 0], [5.0, 20], [7.0, 40]],
            findings=["t--m--values"],
        ),
    ]
    finding = {
        "id": "t--m--values",
        "target": "t",
        "implementation": "m",
        "key": "values",
        "check": "values",
        "case_file": "cases/t--m--values.json",
        "case": {},
        "verdict": {
            "key": "values",
            "mismatches": [{"check": "values", "where": "x[0]", "expected": "1", "got": "2"}],
        },
        "repro": "attnfuzz repro cases/t--m--values.json",
        "examples_to_failure": 10,
        "seconds_to_failure": 1.0,
    }
    doc = campaign_record(
        runs, [finding], started="s", finished="f", seconds=7.0, environment={}, database=None
    )
    write_reports(doc, tmp_path)
    assert campaign_verdict(doc) == "PASS"
    page = (tmp_path / "report.html").read_text()
    assert '<span class="verdict good">PASS</span>' in page
    ring = re.search(r'<circle cx="([\d.]+)" cy="([\d.]+)"', page)
    line = re.search(r'<polyline points="[^"]*" fill="none" stroke="#d55e00"', page).group()
    points = [tuple(map(float, p.split(","))) for p in line.split('"')[1].split()]
    # Halfway between (3 s, 0) and (5 s, 20): on the segment, not at 1.0 s.
    (x0, y0), (x1, y1) = points[0], points[1]
    assert float(ring.group(1)) == pytest.approx((x0 + x1) / 2, abs=0.2)
    assert float(ring.group(2)) == pytest.approx((y0 + y1) / 2, abs=0.2)
    assert ET.parse(tmp_path / "junit.xml").getroot().get("failures") == "0"


def test_timeline_keeps_a_few_points_a_second():
    now = [0.0]
    timeline = Timeline(per_second=2, clock=lambda: now[0])
    for _ in range(100):
        now[0] += 0.01
        timeline.tick()
    points = timeline.close()
    assert points[0] == [0.0, 0] and points[-1] == [1.0, 100]
    assert len(points) <= 2 * 1 + 2


# -- regression reports -----------------------------------------------------------


def _without(doc: dict, implementation: str) -> dict:
    """The campaign as if ``implementation`` had found nothing (and passed)."""
    doc = copy.deepcopy(doc)
    doc["findings"] = [f for f in doc["findings"] if f["implementation"] != implementation]
    for run in doc["runs"]:
        if run["implementation"] == implementation:
            run["findings"], run["status"] = [], "pass"
    return check_campaign(doc)


def _judged_only(doc: dict) -> dict:
    """The campaign without its runs that have no verdict (the errored one)."""
    doc = copy.deepcopy(doc)
    doc["runs"] = [r for r in doc["runs"] if r["status"] != "error" and r["examples"]]
    return doc


def test_compare_new_fixed_still_failing_and_mutants(campaign):
    doc, _ = campaign
    clean = _without(doc, "my_module:hostile")
    new = compare(clean, doc)
    assert [f["implementation"] for f in new["new"]] == ["my_module:hostile"]
    assert new["exit_status"] == 1 and not new["fixed"]
    # The campaign's other-target run errored: no verdict on it, so no "nothing new".
    fixed = compare(doc, clean)
    assert [f["implementation"] for f in fixed["fixed"]] == ["my_module:hostile"]
    assert fixed["exit_status"] == 3 and not fixed["new"]
    assert [r["verdict"] for r in fixed["no_verdict"]] == ["ERROR"]
    assert compare(doc, _judged_only(clean))["exit_status"] == 0
    same = compare(doc, _judged_only(doc))
    assert same["exit_status"] == 0 and len(same["still_failing"]) == 1
    assert not compare(doc, doc)["coverage"]
    # A mutant's finding is expected: losing it is reported, not counted as fixed.
    lost = compare(doc, _judged_only(_without(doc, "pr39542-writeback")))
    assert lost["exit_status"] == 0 and not lost["fixed"]
    assert lost["mutants"]["no_longer_caught"][0]["implementation"] == "pr39542-writeback"
    # A finding whose pair did not run again is unknown, not fixed.
    gone = copy.deepcopy(clean)
    gone["runs"] = [r for r in gone["runs"] if r["implementation"] != "my_module:hostile"]
    unknown = compare(doc, gone)
    assert not unknown["fixed"] and unknown["not_rerun"][0]["implementation"] == "my_module:hostile"


def _labelled(*runs: tuple[str, dict[str, int]]) -> dict:
    records = [
        run_record(t, "triton", "fixed", examples=20, seconds=1.0, status="pass", labels=labels)
        for t, labels in runs
    ]
    return campaign_record(records, [], started="a", finished="b", seconds=1.0, environment={})


def test_compare_coverage_gained_lost_and_changed():
    before = _labelled(("t", {"a": 20, "b": 10, "c": 1, "e": 6}))
    after = _labelled(("t", {"a": 20, "b": 2, "d": 2, "e": 5}), ("u", {"a": 20}))
    cov = compare(before, after, threshold=0.10)["coverage"]
    assert cov["t"]["gained"] == ["d"] and cov["t"]["lost"] == ["c"]
    # b moved from half of the examples to a tenth; e by five points only.
    assert cov["t"]["changed"] == [{"label": "b", "baseline_share": 0.5, "current_share": 0.1}]
    assert cov["u"] == {"gained": ["a"], "lost": [], "changed": []}  # a target new in current
    assert compare(before, after, threshold=0.5)["coverage"]["t"]["changed"] == []
    assert compare(before, before)["coverage"] == {}


def test_compare_coverage_reports_a_run_not_rerun_once_and_none_of_its_classes_as_lost():
    """A scenario class is lost only where its target x implementation ran in both
    campaigns and no run of the target saw it now; a run the current campaign did not
    judge (absent, or errored) is listed once as not rerun."""

    def run(target, impl, labels, status="pass", examples=20):
        return run_record(
            target, impl, "fixed", examples=examples, seconds=1.0, status=status, labels=labels
        )

    def doc(*runs):
        return campaign_record(list(runs), [], started="a", finished="b", seconds=1, environment={})

    before = doc(
        run("t", "triton", {"a": 20, "b": 5, "c": 3}),
        run("t", "cuda", {"a": 20, "only_cuda": 4}),
        run("t", "rocm", {"a": 20, "only_rocm": 2}),
        run("u", "triton", {"x": 20, "y": 3}),
    )
    after = doc(
        run("t", "triton", {"a": 20}),  # b and c gone from the rerun pair...
        run("t", "new", {"a": 20, "c": 1}),  # ...but c still seen by the target
        run("t", "rocm", {}, status="error", examples=0),
    )
    report = compare(before, after)
    assert report["coverage"] == {"t": {"gained": [], "lost": ["b"], "changed": []}}
    assert report["runs_not_rerun"] == [
        {"target": "t", "implementation": "cuda"},
        {"target": "t", "implementation": "rocm"},
        {"target": "u", "implementation": "triton"},
    ]
    coverage = regression_markdown(report).split("### Coverage")[1]
    assert "- lost: `b`" in coverage
    for pair in ("`t` / `cuda`", "`t` / `rocm`", "`u` / `triton`"):
        assert coverage.count(pair) == 1, pair
    assert not re.search(r"only_cuda|only_rocm|`x`|`y`", coverage), coverage


def _as_written_to(out: Path, doc: dict, cases_from: Path) -> None:
    """``doc`` as ``attnfuzz campaign --out OUT`` leaves it: its case files under
    ``OUT/cases``, each replay command naming OUT as the user gave it."""
    (out / "cases").mkdir(parents=True)
    for f in doc["findings"]:
        shutil.copy(cases_from / f["case_file"], out / f["case_file"])
        f["repro"] = repro_command(out / f["case_file"], f["implementation"])
    (out / "campaign.json").write_text(json.dumps(doc))


def test_report_replays_a_case_where_the_next_campaign_moved_it(
    campaign, tmp_path, monkeypatch, capsys
):
    """The README's flow: a campaign in runs/, the next one in runs/ moves it to
    runs/previous/, then ``report --baseline runs/previous --current runs``. A finding
    the new campaign fixed is replayed from runs/previous/cases/, where its case is
    now; a case file found nowhere is said to be so, with no command that fails."""
    doc, out = campaign
    monkeypatch.chdir(tmp_path)
    runs = Path("runs")
    first = copy.deepcopy(doc)
    _as_written_to(runs, first, out)
    keep_previous(runs, io.StringIO())  # what the next campaign does first
    _as_written_to(runs, _without(first, "my_module:hostile"), runs / PREVIOUS)
    hostile = next(f for f in first["findings"] if f["implementation"] == "my_module:hostile")
    moved = runs / PREVIOUS / hostile["case_file"]
    assert moved.is_file() and not (runs / hostile["case_file"]).exists()

    # 3: the current campaign's other-target run errored (no verdict on it).
    assert main(["report", "--baseline", "runs/previous", "--current", "runs"]) == 3
    printed = capsys.readouterr().out
    assert "### Fixed (1)" in printed
    assert f"`attnfuzz repro {moved} --impl my_module:hostile`" in printed
    assert hostile["repro"] not in printed  # runs/cases/...: moved away
    fixed = json.loads((runs / "regression.json").read_text())["fixed"]
    assert fixed[0]["case_path"] == str(moved) and fixed[0]["repro"].split()[2] == str(moved)
    assert read_case(moved)["case"].to_dict() == hostile["case"]  # what repro replays

    moved.unlink()
    # 3: the current campaign's other-target run errored (no verdict on it).
    assert main(["report", "--baseline", "runs/previous", "--current", "runs"]) == 3
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if "my_module:hostile" in line)
    assert "case file not found in" in row and f"`{moved}`" in row, row
    assert "attnfuzz repro" not in row, row
    fixed = json.loads((runs / "regression.json").read_text())["fixed"]
    assert fixed[0]["repro"] is None and str(moved) in fixed[0]["searched"]


def test_report_command(campaign, tmp_path, capsys):
    doc, out = campaign
    base = tmp_path / "old"
    base.mkdir()
    (base / "campaign.json").write_text(json.dumps(_without(doc, "my_module:hostile")))
    current = out / "campaign.json"
    code = main(
        [
            "report",
            "--baseline",
            str(base / "campaign.json"),
            "--current",
            str(current),
            "--out",
            str(tmp_path / "reg"),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 1
    assert "## attnfuzz regression report: new findings" in printed
    assert "### New findings (1)" in printed and "my_module:hostile" in printed
    assert (tmp_path / "reg" / "regression.md").read_text() in printed
    report = json.loads((tmp_path / "reg" / "regression.json").read_text())
    assert report["schema"] == "attnfuzz.regression/1" and len(report["new"]) == 1
    # Reversed: the finding is fixed; a campaign directory names its campaign.json. The
    # errored run of the current campaign leaves it without a verdict: exit 3, said.
    code = main(
        ["report", "--baseline", str(out), "--current", str(base), "--out", str(tmp_path / "reg2")]
    )
    assert code == 3
    printed = capsys.readouterr().out
    assert "### Fixed (1)" in printed and "### Runs without a verdict (1)" in printed


def test_a_campaign_that_judged_nothing_is_no_verdict_not_nothing_new(campaign):
    doc, _ = campaign
    baseline = _judged_only(_without(doc, "my_module:hostile"))
    nothing = copy.deepcopy(baseline)
    nothing["findings"] = []
    for run in nothing["runs"]:
        run.update(examples=0, status="not run", findings=[])
    report = compare(baseline, nothing)
    assert report["exit_status"] == 3 and not report["new"]
    text = regression_markdown(report)
    assert "no verdict" in text.splitlines()[0] and "no new finding" not in text
    assert "NOT RUN" in text.upper()
    # A baseline without mutants: the report does not claim they "ended as before".
    plain = _judged_only(_without(doc, "pr39542-writeback"))
    plain["runs"] = [r for r in plain["runs"] if r["kind"] != "mutant"]
    plain["findings"] = [f for f in plain["findings"] if f["implementation"] != "pr39542-writeback"]
    assert "No mutant ran in both campaigns." in regression_markdown(compare(plain, plain))


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"schema": "attnfuzz.campaign/1", "runs": [', "not valid JSON"),
        ("[]", "$: [] is not of type 'object'"),
        ('{"schema": "attnfuzz.campaign/9"}', "has schema 'attnfuzz.campaign/9'"),
        (
            '{"schema": "attnfuzz.campaign/1", "started": "x"}',
            "$: 'finished' is a required property",
        ),
        (b"\x89PNG\x00\xff", "not a text file"),
        ("[" * 100_000, "nested too deeply"),
    ],
)
def test_report_bad_input_exits_2_with_one_line(campaign, tmp_path, capsys, text, message):
    _, out = campaign
    bad = tmp_path / "bad.json"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    for args in (
        ["--baseline", str(bad), "--current", str(out)],
        ["--baseline", str(out), "--current", str(bad)],
    ):
        assert main(["report", *args, "--out", str(tmp_path / "reg")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert (
        main(
            [
                "report",
                "--baseline",
                str(tmp_path / "missing.json"),
                "--current",
                str(out),
                "--out",
                str(tmp_path / "reg"),
            ]
        )
        == 2
    )
    assert "cannot read campaign file" in capsys.readouterr().err
    assert not (tmp_path / "reg").exists()


def test_a_hung_case_is_not_called_minimized(campaign, tmp_path):
    import copy

    from attnfuzz.reports import write_reports

    doc, _ = campaign
    doc = copy.deepcopy(doc)
    finding = next(f for f in doc["findings"] if f["implementation"] == "my_module:hostile")
    paths = {p.name: p for p in write_reports(doc, tmp_path / "shrunk")}
    shrunk = {name: path.read_text() for name, path in paths.items()}
    assert all("not shrunk" not in text for text in shrunk.values())
    finding["check"] = "crash"  # a crash is shrunk (each case in a judging child)
    crashed = {p.name: p.read_text() for p in write_reports(doc, tmp_path / "crashed")}
    assert all("not shrunk" not in text for text in crashed.values())
    finding["check"] = "timeout"  # the search ended with the case that hung: unshrunk
    paths = {p.name: p for p in write_reports(doc, tmp_path / "hung")}
    for name in ("summary.md", "junit.xml", "report.html"):
        text = paths[name].read_text()
        assert "not shrunk" in text, name
        minimized = text.lower().count("minimized case")
        assert minimized == shrunk[name].lower().count("minimized case") - 1, name


def test_console_summary_and_html_count_findings_and_mutants_alike(campaign):
    """One vocabulary: findings are failures of what must pass; mutants are caught
    (runs), never "findings"; a campaign without mutants does not mention them."""
    from attnfuzz.harness.campaign.results import summary_lines
    from attnfuzz.reports.document import outcome_counts
    from attnfuzz.reports.html import report_html
    from attnfuzz.reports.markdown import summary_markdown

    doc, out = campaign
    words, _ = outcome_counts(doc)
    assert words == "1 finding, 1 of 2 mutants caught"  # pr39542-overlap survives
    assert any(line.startswith(words + " in ") for line in summary_lines(doc, out, 1))
    assert "### Mutants: 1 of 2 caught, 1 survived" in summary_markdown(doc)
    assert words in report_html(doc)
    plain = _judged_only(_without(doc, "my_module:hostile"))
    plain["runs"] = [r for r in plain["runs"] if r["kind"] != "mutant"]
    plain["findings"] = [f for f in plain["findings"] if f["implementation"] != "pr39542-writeback"]
    text = summary_markdown(plain)
    assert "No implementation failed." in text and "Mutants" not in text
    assert outcome_counts(plain)[0] == "0 findings"
