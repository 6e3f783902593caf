"""Markdown for CI job summaries (GitHub-flavoured): verdict table, findings, repro commands.

Every text taken from the campaign goes into a code span or a fenced block
whose fence is longer than any backtick run in it, so that nothing from an
exception message is read as Markdown or HTML.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from attnfuzz.harness.definitions import markdown_table
from attnfuzz.reports.document import (
    CAUGHT,
    ERROR,
    FAIL,
    INCOMPLETE,
    LATENT,
    PASS,
    SURVIVED,
    budget_text,
    campaign_verdict,
    case_label,
    compact_json,
    expected_finding,
    fmt_seconds,
    mismatch_line,
    no_finding_text,
    no_verdict_text,
    one_line,
    plural,
    printable,
    reachability_text,
    run_verdict,
    targets,
    trace_steps,
    trace_text,
)

MAX_MISMATCHES = 8  # per finding, as the console prints them
# campaign.json's timing parts, as the time line names them
TIME_PARTS = {
    "startup": "start-up",
    "fuzzing": "fuzzing",
    "shrinking": "shrinking",
    "other": "other",
}


def code(text: object, limit: int = 300) -> str:
    """An inline code span holding ``text`` literally, safe in a table cell."""
    s = one_line(text, limit)
    if not s:
        return ""
    ticks = max((len(run) for run in re.findall(r"`+", s)), default=0) + 1
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    # GFM splits table cells at "|" even inside a code span; "\|" is its escape there.
    return "`" * ticks + pad + s.replace("|", "\\|") + pad + "`" * ticks


def fenced(text: str, info: str = "") -> str:
    """A fenced code block holding ``text`` literally."""
    text = printable(text)
    fence = "`" * max(3, max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    """Markdown table lines (:func:`markdown_table`); ``align``: ``l``/``r`` per column."""
    return markdown_table(header, rows, align, pad=False).splitlines()


_SHOWN = {
    PASS: PASS,
    CAUGHT: CAUGHT,
    FAIL: f"**{FAIL}**",
    SURVIVED: f"**{SURVIVED}**",
    LATENT: f"**{LATENT}**",
}


def verdict_cell(run: Mapping[str, Any]) -> str:
    v = run_verdict(run)
    return _SHOWN.get(v, f"**{v}**" if v == ERROR else v)


def rate(run: Mapping[str, Any]) -> float:
    return run["examples"] / run["seconds"] if run["seconds"] else 0.0


def time_line(campaign: Mapping[str, Any]) -> str | None:
    """``Time: 60.1 s = start-up 9.6 s + fuzzing 48.0 s + ...``: campaign.json's timing
    (means over the workers), the parts rounded so that they add up as printed."""
    timing = campaign.get("timing")
    if not timing:
        return None  # a document from before timing
    parts = split_tenths(campaign["seconds"], [timing[k] for k in TIME_PARTS])
    text = " + ".join(
        f"{name} {x:.1f} s" for name, x in zip(TIME_PARTS.values(), parts, strict=True)
    )
    note = "" if timing.get("ready", 0) is not None else "; not every one judged an example"
    workers = plural(len(timing.get("per_worker") or []) or campaign.get("workers", 1), "worker")
    return f"Time: {campaign['seconds']:.1f} s = {text} ({workers}{note})"


def header_lines(campaign: Mapping[str, Any]) -> list[str]:
    parts = [f"profile {code(campaign.get('profile', '-'))}"]
    if campaign.get("seed") is not None:
        parts.append(f"seed {code(campaign['seed'])}")
    parts.append(plural(campaign.get("workers", 1), "worker"))
    parts.append(
        f"{fmt_seconds(campaign['seconds'])} s (budget: {budget_text(campaign.get('budget'))})"
    )
    env = campaign.get("environment") or {}
    versions = ", ".join(f"{k} {v}" for k, v in env.items())
    lines = [
        f"## attnfuzz campaign: {campaign_verdict(campaign)}",
        "",
        ", ".join(parts) + f"; started {code(campaign['started'])}",
    ]
    timing = time_line(campaign)
    if timing:
        lines += ["", timing]
    if versions:
        lines += ["", code(versions, 400)]
    if campaign.get("interrupted"):
        lines += ["", "> **Interrupted**: the runs below stopped early; what they found is kept."]
    if campaign.get("database_note"):  # an empty corpus is a search, but the user must know
        lines += ["", f"> **Database**: {code(campaign['database_note'], 400)}"]
    return lines


def verdict_table(campaign: Mapping[str, Any]) -> list[str]:
    findings = {f["id"]: f for f in campaign["findings"]}
    rows = []
    for run in campaign["runs"]:
        keys = [code(findings[f]["key"]) for f in run.get("findings", []) if f in findings]
        if run_verdict(run) == ERROR and run.get("error"):
            keys.append(code(run["error"], 160))
        if no_verdict_text(run):  # incomplete, or not run: why
            keys.append(no_verdict_text(run))
        rows.append(
            [
                code(run["target"]),
                code(run["implementation"]),
                run["kind"] + (" (traces)" if run.get("traced") else ""),
                verdict_cell(run),
                str(run["examples"]),
                f"{rate(run):.1f}",
                fmt_seconds(run["seconds"]),
                ", ".join(keys),
            ]
        )
    header = ["target", "implementation", "kind", "verdict", "examples", "ex/s", "s", "findings"]
    return table(header, rows, "llllrrrl")


def finding_lines(finding: Mapping[str, Any], level: str = "####") -> list[str]:
    lines = [
        f"{level} {code(finding['target'])} / {code(finding['implementation'])}: "
        f"{code(finding['key'])}",
        "",
    ]
    if finding.get("examples_to_failure") is not None:
        lines += [
            f"First failure after {plural(finding['examples_to_failure'], 'example')} "
            f"({fmt_seconds(finding.get('seconds_to_failure'))} s):",
            "",
        ]
    steps = trace_steps(finding)
    if steps:  # a trace: which of its steps fails, and what the scheduler did there
        failed = steps[finding["step"]]
        lines += [
            f"Fails at step {failed['k']} of a trace of {plural(len(steps), 'step')} of one "
            f"engine: {code(failed['summary'], 400)}",
            "",
        ]
    mismatches = finding["verdict"]["mismatches"]
    lines += [f"- {code(mismatch_line(m), 400)}" for m in mismatches[:MAX_MISMATCHES]]
    if len(mismatches) > MAX_MISMATCHES:
        lines.append(f"- ... and {len(mismatches) - MAX_MISMATCHES} more")
    reach = reachability_text(finding)
    if reach:
        status = finding["reachability"]["status"].upper()
        lines += ["", f"Reachability: **{status}**", "", fenced("\n".join(reach), "text")]
    lines += ["", fenced(finding["repro"], "console"), ""]
    if steps:  # step by step, as `attnfuzz run` prints a trace
        text, language = "\n".join(trace_text(finding)), "text"
    else:
        text, language = compact_json(finding["case"]), "json"
        if finding.get("derived"):
            text += "\n\nderived: " + json.dumps(finding["derived"])
    lines += [f"<details><summary>{case_label(finding)}</summary>", "", fenced(text, language), ""]
    lines += ["</details>", ""]
    return lines


def coverage_lines(campaign: Mapping[str, Any]) -> list[str]:
    """Scenario classes per target: share of the examples of each run."""
    lines = []
    for target in targets(campaign):
        runs = [r for r in campaign["runs"] if r["target"] == target]
        labels = sorted({k for r in runs for k in r.get("labels", {})})
        if not labels:
            continue
        rows = []
        for label in labels:
            cells = []
            for r in runs:
                n = r.get("labels", {}).get(label, 0)
                cells.append(f"{100 * n / r['examples']:.0f}%" if r["examples"] else "-")
            rows.append([code(label), *cells])
        header = ["scenario class", *(code(r["implementation"]) for r in runs)]
        lines += [f"{code(target)}", "", *table(header, rows, "l" + "r" * len(runs)), ""]
    return lines


def incomplete_lines(campaign: Mapping[str, Any]) -> list[str]:
    """A note under the verdicts when some run found nothing short of its floor."""
    short = [r for r in campaign["runs"] if run_verdict(r) == INCOMPLETE]
    if not short:
        return []
    names = ", ".join(f"{code(r['target'])} / {code(r['implementation'])}" for r in short)
    return [
        f"> **{INCOMPLETE}**: {plural(len(short), 'run')} found nothing in fewer examples "
        f"than their floor, so they neither pass nor survive: {names}. A longer budget "
        "(or fewer runs per worker) gives them a verdict.",
        "",
    ]


def _mutant_lines(
    campaign: Mapping[str, Any],
    mutants: list[Mapping[str, Any]],
    survived: list[Mapping[str, Any]],
    short: list[Mapping[str, Any]],
) -> list[str]:
    """The mutants' section: how many were caught, which survived, each caught one's case."""
    caught = [f for f in campaign["findings"] if expected_finding(campaign, f)]
    lines: list[str] = []
    heading = (
        f"### Mutants: {sum(run_verdict(r) == CAUGHT for r in mutants)} of "
        f"{len(mutants)} caught, {len(survived)} survived"
    )
    lines += [heading + (f", {len(short)} incomplete" if short else ""), ""]
    if survived:
        names = ", ".join(f"{code(r['target'])} / {code(r['implementation'])}" for r in survived)
        lines += [f"Survived (the harness missed their bug): {names}", ""]
    if caught:
        rows = [
            [
                code(f["target"]),
                code(f["implementation"]),
                code(f["key"]),
                str(
                    f.get("examples_to_failure")
                    if f.get("examples_to_failure") is not None
                    else "-"
                ),
                fmt_seconds(f.get("seconds_to_failure")),
                code(f["repro"]),
            ]
            for f in caught
        ]
        header = ["target", "mutant", "check", "examples", "s", "replay"]
        lines += [*table(header, rows, "lllrrl"), ""]
    return lines


def summary_markdown(campaign: Mapping[str, Any]) -> str:
    """The campaign summary: verdicts, then findings (unexpected first) with repro commands."""
    lines = [*header_lines(campaign), "", *verdict_table(campaign), ""]
    lines += incomplete_lines(campaign)
    unexpected = [f for f in campaign["findings"] if not expected_finding(campaign, f)]
    lines += [f"### Findings ({len(unexpected)})", ""]
    if not unexpected:
        lines += [no_finding_text(campaign), ""]
    for finding in unexpected:
        lines += finding_lines(finding)
    survived = [r for r in campaign["runs"] if run_verdict(r) == SURVIVED]
    short = [r for r in campaign["runs"] if r["kind"] == "mutant" and run_verdict(r) == INCOMPLETE]
    mutants = [r for r in campaign["runs"] if r["kind"] == "mutant"]
    if mutants:
        lines += _mutant_lines(campaign, mutants, survived, short)
    events = campaign.get("events") or []
    if events:
        lines += [f"### Harness events ({len(events)})", ""]
        lines += ["Not findings: the harness lost a worker, for the reason each line gives.", ""]
        for e in events:
            lines.append(
                f"- {code(e['target'])} / {code(e['implementation'])}, shard {e['shard']}: "
                f"{e['event']}: {code(e['detail'])}"
            )
        lines.append("")
    cov = coverage_lines(campaign)
    if cov:
        lines += ["<details><summary>Scenario-class coverage</summary>", "", *cov, "</details>", ""]
    return "\n".join(lines).rstrip() + "\n"


def split_tenths(total: float, parts: list[float]) -> list[float]:
    """``parts`` rounded to tenths so that they add up to ``total`` rounded to tenths
    (largest remainders): a line of text whose sum is right as printed."""
    want = round(float(f"{total:.1f}") * 10)  # the total as printed
    tenths = [int(p * 10) for p in parts]
    rest = sorted(range(len(parts)), key=lambda i: parts[i] * 10 - tenths[i], reverse=True)
    for i in rest[: max(0, want - sum(tenths))]:
        tenths[i] += 1
    return [t / 10 for t in tenths]
