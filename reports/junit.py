"""JUnit XML: one ``testcase`` per target x implementation, for CI test-result views.

The usual shape: ``testsuites > testsuite`` (one per target) ``> testcase``
(``classname`` ``attnfuzz.<target>``, ``name`` the implementation, ``time`` in
seconds) holding a ``failure`` (the minimized case, its mismatches and the
replay command), an ``error`` (the run could not go on) or ``skipped``. A
caught mutant is a passing test case; a mutant that survived is a failure.

A run with no verdict is ``skipped``: one that judged nothing, and one that
found nothing in fewer examples than its floor (``INCOMPLETE``, its message
``incomplete: 120 of 200 examples, the time budget ended``). Not an
``error``: that is the harness failing, and a CI view paints both alike; not
a pass either. The exit status (3) is what fails the job.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from attnfuzz.reports.document import (
    CAUGHT,
    ERROR,
    FAIL,
    INCOMPLETE,
    LATENT,
    NOT_RUN,
    SURVIVED,
    case_label,
    incomplete_text,
    is_trace,
    mismatch_line,
    one_line,
    printable,
    reachability_text,
    run_verdict,
    targets,
    trace_text,
)


def _finding_text(finding: Mapping[str, Any]) -> str:
    lines = [f"{finding['id']}  [{finding['key']}]"]
    lines += [f"  {mismatch_line(m)}" for m in finding["verdict"]["mismatches"]]
    lines += reachability_text(finding)
    if finding.get("examples_to_failure") is not None:
        lines.append(
            f"first failure after {finding['examples_to_failure']} examples, "
            f"{finding.get('seconds_to_failure') or 0:.2f}s"
        )
    if is_trace(finding):  # step by step, the failing one marked
        lines.append(f"{case_label(finding)}, failing at step {finding['step']}:")
        lines += ["  " + line for line in trace_text(finding)]
    else:
        lines.append(f"{case_label(finding)}:")
        lines.append("  " + json.dumps(finding["case"]))
        if finding.get("derived"):
            lines.append("  derived: " + json.dumps(finding["derived"]))
    lines.append(f"case file: {finding['case_file']}")
    lines.append(f"replay: {finding['repro']}")
    return printable("\n".join(lines))


def _testcase(run: Mapping[str, Any], findings: Mapping[str, Mapping[str, Any]]) -> ET.Element:
    case = ET.Element(
        "testcase",
        classname=f"attnfuzz.{printable(run['target'])}",
        name=printable(run["implementation"]),
        time=f"{run['seconds']:.3f}",
    )
    verdict = run_verdict(run)
    found = [findings[f] for f in run.get("findings", []) if f in findings]
    body = "\n\n".join(_finding_text(f) for f in found)
    if verdict in (FAIL, LATENT):
        first = found[0]["verdict"]["mismatches"][0] if found else None
        message = mismatch_line(first) if first else "failed (no finding recorded)"
        if found and is_trace(found[0]):
            message += f" (at step {found[0]['step']} of a trace)"
        if verdict == LATENT:  # a defect all the same: only a FULL graph replay meets it
            message = "LATENT: " + message
        kind = LATENT.lower() if verdict == LATENT else found[0]["check"] if found else "fail"
        el = ET.SubElement(case, "failure", message=one_line(message), type=kind)
        el.text = body
    elif verdict == SURVIVED:
        ET.SubElement(
            case,
            "failure",
            message=f"mutant survived {run['examples']} examples: the harness missed its bug",
            type=SURVIVED,
        )
    elif verdict == ERROR:
        el = ET.SubElement(
            case,
            "error",
            message=one_line(run.get("error") or "the run could not go on"),
            type="error",
        )
        el.text = printable(run.get("error") or "")
    elif verdict == NOT_RUN:
        ET.SubElement(case, "skipped", message="not run: no example was judged")
    elif verdict == INCOMPLETE:
        ET.SubElement(case, "skipped", message=one_line(incomplete_text(run)))
    out = [f"kind: {run['kind']}", f"verdict: {verdict}", f"examples: {run['examples']}"]
    if run.get("traced"):
        out.append("examples are traces: one engine's life over several steps each")
    if run.get("labels"):
        out.append("scenario classes: " + json.dumps(run["labels"]))
    if verdict == CAUGHT and body:
        out += ["", body]
    ET.SubElement(case, "system-out").text = printable("\n".join(out))
    return case


def junit_xml(campaign: Mapping[str, Any]) -> str:
    """The campaign as a JUnit XML document (UTF-8, with declaration)."""
    findings = {f["id"]: f for f in campaign["findings"]}
    root = ET.Element("testsuites", name="attnfuzz")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for target in targets(campaign):
        runs = [r for r in campaign["runs"] if r["target"] == target]
        verdicts = [run_verdict(r) for r in runs]
        counts = {
            "tests": len(runs),
            "failures": sum(v in (FAIL, SURVIVED, LATENT) for v in verdicts),
            "errors": verdicts.count(ERROR),
            "skipped": verdicts.count(NOT_RUN) + verdicts.count(INCOMPLETE),
        }
        suite = ET.SubElement(
            root,
            "testsuite",
            name=printable(target),
            **{k: str(v) for k, v in counts.items()},
            time=f"{sum(r['seconds'] for r in runs):.3f}",
            timestamp=printable(campaign["started"]),
        )
        props = ET.SubElement(suite, "properties")
        meta = {
            "profile": campaign.get("profile"),
            "seed": campaign.get("seed"),
            "interrupted": campaign.get("interrupted", False),
            **(campaign.get("environment") or {}),
        }
        for name, value in meta.items():
            ET.SubElement(props, "property", name=printable(name), value=printable(value))
        for run in runs:
            suite.append(_testcase(run, findings))
        for k, v in counts.items():
            totals[k] += v
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", str(totals["errors"]))
    root.set("skipped", str(totals["skipped"]))
    root.set("time", f"{campaign['seconds']:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
