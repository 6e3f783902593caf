"""A self-contained HTML report: tables, inline SVG plots, every finding with its case.

The page reads top down in the order a reader acts on it: the campaign's
verdict and one verdict per run, then each finding with its replay command
and case, then the plots, the mutants caught, and last the campaign's settings
and environment (folded). It is one file with its style inline, no script and
no external resource, so it opens offline and as a CI artifact. It is built as
an ``xml.etree`` tree and serialized once: every text from the campaign (an
exception message above all) is escaped by the serializer, never pasted into
markup.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from attnfuzz.harness.definitions import CAMPAIGN_INCOMPLETE, CAMPAIGN_PASS, LATENT
from attnfuzz.reports.document import (
    CAUGHT,
    NOT_RUN,
    PASS,
    STEP_COLUMNS,
    STEP_FAILS,
    STEP_NOT_RUN,
    STEP_OK,
    budget_text,
    campaign_verdict,
    case_label,
    compact_json,
    expected_finding,
    fmt_seconds,
    is_latent,
    is_trace,
    no_finding_text,
    no_verdict_text,
    outcome_counts,
    plural,
    printable,
    reachability_text,
    run_verdict,
    step_derived,
    step_extras,
    step_rows,
    targets,
    trace_setting,
    trace_steps,
)
from attnfuzz.reports.svg import coverage_svg, timeline_svg

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #222;
       padding: 0 1rem; line-height: 1.4; }
h1 { font-size: 1.5rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre { font-family: ui-monospace, monospace; font-size: .85rem; }
/* Wrap long lines at spaces only (JSON breaks after ", " or ": "), never inside a token
   such as null; a token wider than the page scrolls instead. */
pre { background: #f6f8fa; padding: .5rem; overflow-x: auto; white-space: pre-wrap;
      overflow-wrap: normal; word-break: normal; }
.verdict { font-weight: 600; padding: .05rem .4rem; border-radius: .25rem; }
.good { background: #d8f0dd; color: #14532d; } .bad { background: #fbd5d2; color: #7f1d1d; }
.meh { background: #fdf0c4; color: #6b4f00; }
.banner { padding: .5rem 1rem; border-radius: .25rem; margin: 1rem 0; }
section.finding { border: 1px solid #ddd; border-radius: .25rem; padding: 0 1rem; margin: 1rem 0; }
svg.plot { display: block; margin: .5rem 0 1.5rem; max-width: 100%; height: auto; }
p.tally { margin-top: -.5rem; } details { margin: 2rem 0; }
details > summary { font-size: 1.25rem; font-weight: 600; cursor: pointer; }
ol.steps { padding-left: 0; list-style: none; }
li.step { border-left: 3px solid #ddd; padding-left: .75rem; margin: .5rem 0; }
li.step-fails { border-left-color: #b91c1c; } li.step-not-run { opacity: .6; }
p.step-extras { margin-top: -.5rem; }
"""


def _el(parent: ET.Element, tag: str, text: Any = None, **attrs: Any) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_"): str(v) for k, v in attrs.items()})
    if text is not None:
        el.text = printable(text)
    return el


def _css_class(verdict: str) -> str:
    """Good, bad or neither, for a run's verdict and the campaign's (PASS, FAIL, INCOMPLETE)."""
    if verdict in (PASS, CAUGHT, CAMPAIGN_PASS):
        return "verdict good"
    return "verdict meh" if verdict in (NOT_RUN, CAMPAIGN_INCOMPLETE) else "verdict bad"


def anchor(finding_id: str) -> str:
    """An HTML id for a finding (letters, digits, ``-`` and ``_`` only)."""
    return "finding-" + re.sub(r"[^0-9A-Za-z_-]", "_", finding_id)


def _table(parent: ET.Element, header: list[str]) -> ET.Element:
    """A table with its header row; returns the ``tbody`` to add rows to."""
    table = _el(parent, "table")
    row = _el(_el(table, "thead"), "tr")
    for h in header:
        _el(row, "th", h)
    return _el(table, "tbody")


def _row(body: ET.Element, cells: list[Any], numeric: tuple[int, ...] = ()) -> ET.Element:
    """A row of text or element cells; columns in ``numeric`` align right."""
    tr = _el(body, "tr")
    for i, cell in enumerate(cells):
        td = _el(tr, "td", **({"class_": "num"} if i in numeric else {}))
        if isinstance(cell, ET.Element):
            td.append(cell)
        else:
            td.text = printable(cell)
    return tr


def _code(text: Any) -> ET.Element:
    el = ET.Element("code")
    el.text = printable(text)
    return el


def _tally(campaign: Mapping[str, Any]) -> str:
    """``3 runs: 1 pass, 1 caught, 1 FAIL; 1 finding; started ..., 1.00 s, profile ci``."""
    verdicts: dict[str, int] = {}
    for run in campaign["runs"]:
        verdict = run_verdict(run)
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    counts = ", ".join(f"{n} {v}" for v, n in verdicts.items())
    parts = [plural(len(campaign["runs"]), "run") + (f": {counts}" if counts else "")]
    parts.append(outcome_counts(campaign)[0])
    when = f"started {campaign['started']}, {fmt_seconds(campaign['seconds'])} s"
    when += f", profile {campaign.get('profile') or '-'}"
    if campaign.get("seed") is not None:
        when += f", seed {campaign['seed']}"
    return "; ".join([*parts, when])


def _environment(main: ET.Element, campaign: Mapping[str, Any]) -> None:
    """Settings and versions: needed to reproduce a campaign, not to read its verdicts,
    so they come last and folded."""
    details = _el(main, "details", id="environment")
    _el(details, "summary", "Campaign settings and environment")
    rows = [
        ("started", campaign["started"]),
        ("finished", campaign["finished"]),
        ("wall time", f"{fmt_seconds(campaign['seconds'])} s"),
        ("budget", budget_text(campaign.get("budget"))),
        ("profile", campaign.get("profile")),
        ("seed", campaign.get("seed")),
        ("workers", campaign.get("workers")),
        ("example database", campaign.get("database")),
        ("interrupted", "yes" if campaign.get("interrupted") else "no"),
    ]
    rows += [(k, v) for k, v in (campaign.get("environment") or {}).items()]
    body = _table(details, ["campaign", ""])
    for k, v in rows:
        _row(body, [k, "-" if v is None or v == "" else v])


def _verdicts(main: ET.Element, campaign: Mapping[str, Any]) -> None:
    findings = {f["id"]: f for f in campaign["findings"]}
    header = ["target", "implementation", "kind", "verdict", "examples", "ex/s", "seconds"]
    body = _table(main, [*header, "findings"])
    for run in campaign["runs"]:
        verdict = run_verdict(run)
        badge = ET.Element("span", {"class": _css_class(verdict)})
        badge.text = verdict
        links = ET.Element("span")
        for fid in run.get("findings", []):
            if fid in findings:
                a = _el(links, "a", href="#" + anchor(fid))
                a.append(_code(findings[fid]["key"]))
                a.tail = " "
        if run.get("error"):
            _el(links, "span", run["error"])
        if no_verdict_text(run):  # incomplete, or not run: why
            _el(links, "span", no_verdict_text(run))
        rate = run["examples"] / run["seconds"] if run["seconds"] else 0.0
        _row(
            body,
            [
                run["target"],
                _code(run["implementation"]),
                run["kind"] + (" (traces)" if run.get("traced") else ""),
                badge,
                run["examples"],
                f"{rate:.1f}",
                fmt_seconds(run["seconds"]),
                links,
            ],
            numeric=(4, 5, 6),
        )


def _finding(parent: ET.Element, finding: Mapping[str, Any], expected: bool) -> None:
    """One finding: what failed, the command that replays it, the case, then the facts."""
    sec = _el(parent, "section", class_="finding", id=anchor(finding["id"]))
    h = _el(sec, "h3")
    h.append(_code(f"{finding['target']} / {finding['implementation']}"))
    word = "mutant caught" if expected else LATENT if is_latent(finding) else "FAIL"
    h[-1].tail = f" {word}: "
    h.append(_code(finding["key"]))
    _el(sec, "h4", "Replay")
    _el(_el(sec, "pre", class_="repro"), "code", finding["repro"])
    trace = is_trace(finding)
    if not trace:  # a trace's are under its failing step
        _el(sec, "h4", "Mismatches")
        _mismatches(sec, finding)
    reach = reachability_text(finding)
    if reach:
        _el(sec, "h4", "Reachability")
        _el(_el(sec, "pre", class_="reachability"), "code", "\n".join(reach))
    if trace:
        _trace(sec, finding)
    else:
        _el(sec, "h4", case_label(finding).capitalize())
        _el(_el(sec, "pre", class_="case"), "code", compact_json(finding["case"]))
        if finding.get("derived"):
            _el(sec, "h4", "Derived quantities")
            _el(_el(sec, "pre", class_="derived"), "code", json.dumps(finding["derived"]))
    facts = _table(sec, ["finding", ""])
    _row(facts, ["id", _code(finding["id"])])
    _row(facts, ["first failing check", finding["check"]])
    if finding.get("examples_to_failure") is not None:
        _row(facts, ["examples to first failure", finding["examples_to_failure"]])
        _row(facts, ["seconds to first failure", fmt_seconds(finding.get("seconds_to_failure"))])
    _row(facts, ["case file", _code(finding["case_file"])])


def _mismatches(parent: ET.Element, finding: Mapping[str, Any]) -> None:
    body = _table(parent, ["check", "where", "expected", "got"])
    for m in finding["verdict"]["mismatches"]:
        _row(body, [m["check"], _code(m["where"]), m["expected"], m["got"]])


STEP_CLASS = {STEP_OK: "verdict good", STEP_FAILS: "verdict bad", STEP_NOT_RUN: "verdict meh"}


def _trace(sec: ET.Element, finding: Mapping[str, Any]) -> None:
    """A trace finding step by step: the engine config, then each step (its summary
    line, its requests, marked ok, FAILS or not run), the failing one with its
    mismatches and derived quantities."""
    steps = trace_steps(finding)
    failed = finding["step"]
    title = f"{case_label(finding).capitalize()}: {plural(len(steps), 'step')} of one engine"
    _el(sec, "h4", f"{title}, failing at step {failed}")
    _el(_el(sec, "pre", class_="case"), "code", compact_json(trace_setting(finding)))
    listing = _el(sec, "ol", class_="steps", start="0")
    for step in steps:
        k, mark = step["k"], step["mark"]
        item = _el(listing, "li", class_=f"step step-{mark.replace(' ', '-').lower()}")
        item.set("id", f"{anchor(finding['id'])}-step-{k}")
        head = _el(item, "p", class_="step-head")
        _el(head, "span", mark, class_=STEP_CLASS[mark]).tail = " "
        strong = _el(head, "strong", f"step {k}")
        strong.tail = printable(f": {step['summary']}") if step["summary"] else None
        body = _table(item, STEP_COLUMNS)
        for row in step_rows(step["batch"]):
            _row(body, row, numeric=(1, 2, 3))
        extras = step_extras(step["batch"])
        if extras:
            _el(_el(item, "p", class_="step-extras"), "code", json.dumps(extras))
        if k == failed:
            _el(item, "h5", f"Mismatches at step {k}")
            _mismatches(item, finding)
            derived = step_derived(finding)
            if derived:
                _el(item, "h5", f"Derived quantities of step {k}")
                _el(_el(item, "pre", class_="derived"), "code", json.dumps(derived))


def report_html(campaign: Mapping[str, Any]) -> str:
    """The whole page, ``<!DOCTYPE html>`` included."""
    html = ET.Element("html", lang="en")
    head = _el(html, "head")
    _el(head, "meta", charset="utf-8")
    _el(head, "meta", name="viewport", content="width=device-width, initial-scale=1")
    _el(head, "title", f"attnfuzz campaign {campaign['started']}: {campaign_verdict(campaign)}")
    _el(head, "style", STYLE)
    main = _el(_el(html, "body"), "main")

    verdict = campaign_verdict(campaign)
    h1 = _el(main, "h1", "attnfuzz campaign ")
    _el(h1, "span", verdict, class_=_css_class(verdict))
    _el(main, "p", _tally(campaign), class_="tally")
    if campaign.get("interrupted"):
        _el(
            main,
            "p",
            "Interrupted: the runs stopped early; everything below is what ran.",
            class_="banner meh",
        )

    _el(main, "h2", "Verdicts", id="verdicts")
    _el(
        main,
        "p",
        "A mutant re-creates a known bug: it should fail (caught); one that passes survived. "
        "Every other implementation should pass; LATENT: engine code that fails only on "
        "metadata a FULL graph replay builds, where its Python does not run.",
    )
    _verdicts(main, campaign)

    # What needs a reader's action comes before what describes the search.
    unexpected = [f for f in campaign["findings"] if not expected_finding(campaign, f)]
    caught = [f for f in campaign["findings"] if expected_finding(campaign, f)]
    section = _el(main, "section", id="findings")
    _el(section, "h2", f"Findings ({len(unexpected)})")
    if not unexpected:
        _el(section, "p", no_finding_text(campaign))
    for f in unexpected:
        _finding(section, f, expected=False)

    findings = {f["id"]: f for f in campaign["findings"]}
    _el(main, "h2", "Examples over time")
    for target in targets(campaign):
        runs = [r for r in campaign["runs"] if r["target"] == target]
        main.append(timeline_svg(target, runs, findings))

    _el(main, "h2", "Scenario-class coverage")
    for target in targets(campaign):
        runs = [r for r in campaign["runs"] if r["target"] == target]
        main.append(coverage_svg(target, runs))

    # Expected outcomes, each linked from the verdict table: after the plots.
    section = _el(main, "section", id="mutants-caught")
    _el(section, "h2", f"Mutants caught ({len(caught)})")
    for f in caught:
        _finding(section, f, expected=True)

    _environment(main, campaign)
    return "<!DOCTYPE html>\n" + ET.tostring(html, encoding="unicode", method="html") + "\n"
