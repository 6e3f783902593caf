"""Regression report: what changed between a baseline campaign and the current one.

Findings are matched by their id (target, implementation and verdict key).
For implementations that must pass:

- *new*: failing now, not in the baseline (exit status 1);
- *fixed*: in the baseline, and the current campaign ran that target x
  implementation without finding it again;
- *still failing*: in both;
- *not rerun*: in the baseline, but the current campaign did not run that pair
  (or the run errored), so nothing is known.

Mutants are expected to fail, so their findings are not regressions; what is
compared is whether each one is still caught. Coverage compares, per target,
the share of examples in each scenario class: a class seen in one campaign
only is gained or lost, one whose share moved by ``threshold`` or more changed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import REGRESSION_SCHEMA
from attnfuzz.harness.target import UsageError
from attnfuzz.reports.document import (
    CAUGHT,
    SURVIVED,
    expected_finding,
    load_campaign,
    run_verdict,
)
from attnfuzz.reports.markdown import code, table

SHARE_THRESHOLD = 0.10  # ten percentage points of a target's examples


def _summary(f: Mapping[str, Any]) -> dict[str, Any]:
    first = f["verdict"]["mismatches"][0] if f["verdict"]["mismatches"] else {}
    return {
        "id": f["id"],
        "target": f["target"],
        "implementation": f["implementation"],
        "key": f["key"],
        "check": f["check"],
        "first_mismatch": first,
        "repro": f["repro"],
    }


def _shares(campaign: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Per target, each scenario class's share of all the target's examples."""
    counts: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for run in campaign["runs"]:
        t = run["target"]
        totals[t] = totals.get(t, 0) + run["examples"]
        per = counts.setdefault(t, {})
        for label, n in run.get("labels", {}).items():
            per[label] = per.get(label, 0) + n
    return {
        t: {label: n / totals[t] for label, n in sorted(per.items()) if n} if totals[t] else {}
        for t, per in counts.items()
    }


def _coverage(old: Mapping[str, Any], new: Mapping[str, Any], threshold: float) -> dict:
    before, after = _shares(old), _shares(new)
    out = {}
    for target in sorted(set(before) | set(after)):  # a target run once only: all gained/lost
        b, a = before.get(target, {}), after.get(target, {})
        changed = [
            {"label": k, "baseline_share": round(b[k], 4), "current_share": round(a[k], 4)}
            for k in sorted(set(a) & set(b))
            if abs(a[k] - b[k]) >= threshold
        ]
        gained, lost = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        if gained or lost or changed:
            out[target] = {"gained": gained, "lost": lost, "changed": changed}
    return out


def _pairs(campaign: Mapping[str, Any]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(r["target"], r["implementation"]): r for r in campaign["runs"]}


def compare(
    baseline: Mapping[str, Any], current: Mapping[str, Any], threshold: float = SHARE_THRESHOLD
) -> dict[str, Any]:
    """The regression report as a JSON-able dict; ``exit_status`` 1 on any new finding."""
    old = {f["id"]: f for f in baseline["findings"] if not expected_finding(baseline, f)}
    new = {f["id"]: f for f in current["findings"] if not expected_finding(current, f)}
    ran = {pair for pair, r in _pairs(current).items() if r["status"] != "error"}
    fixed, not_rerun = [], []
    for fid, f in old.items():
        if fid in new:
            continue
        (fixed if (f["target"], f["implementation"]) in ran else not_rerun).append(_summary(f))

    mutants: dict[str, list[dict[str, str]]] = {"newly_caught": [], "no_longer_caught": []}
    old_runs = _pairs(baseline)
    for pair, run in _pairs(current).items():
        if run["kind"] != "mutant" or pair not in old_runs:
            continue
        before, after = run_verdict(old_runs[pair]), run_verdict(run)
        entry = {"target": pair[0], "implementation": pair[1], "baseline": before, "current": after}
        if before == SURVIVED and after == CAUGHT:
            mutants["newly_caught"].append(entry)
        elif before == CAUGHT and after == SURVIVED:
            mutants["no_longer_caught"].append(entry)

    report = {
        "schema": REGRESSION_SCHEMA,
        "baseline": {k: baseline.get(k) for k in ("started", "profile", "seed")},
        "current": {k: current.get(k) for k in ("started", "profile", "seed")},
        "new": [_summary(f) for fid, f in new.items() if fid not in old],
        "fixed": fixed,
        "still_failing": [_summary(f) for fid, f in new.items() if fid in old],
        "not_rerun": not_rerun,
        "errors": [
            {"target": r["target"], "implementation": r["implementation"], "error": r.get("error")}
            for r in current["runs"]
            if r["status"] == "error"
        ],
        "mutants": mutants,
        "coverage": _coverage(baseline, current, threshold),
        "share_threshold": threshold,
    }
    report["exit_status"] = 1 if report["new"] else 0
    return report


def _finding_rows(items: list[dict[str, Any]]) -> list[str]:
    rows = [
        [code(f["target"]), code(f["implementation"]), code(f["key"]), code(f["repro"])]
        for f in items
    ]
    return table(["target", "implementation", "check", "replay"], rows)


def regression_markdown(report: Mapping[str, Any]) -> str:
    """The report in Markdown, for a terminal or a CI job summary."""
    verdict = "new findings" if report["new"] else "no new finding"
    lines = [
        f"## attnfuzz regression report: {verdict}",
        "",
        f"baseline started {code(report['baseline'].get('started'))}, "
        f"current started {code(report['current'].get('started'))}",
        "",
    ]
    sections = [
        ("New findings", "new"),
        ("Fixed", "fixed"),
        ("Still failing", "still_failing"),
        ("Not rerun, so unknown", "not_rerun"),
    ]
    for title, key in sections:
        items = report[key]
        lines += [f"### {title} ({len(items)})", ""]
        if items:
            lines += [*_finding_rows(items), ""]
            if key == "new":
                for f in items:
                    m = f["first_mismatch"]
                    if m:
                        text = (
                            f"[{m['check']}] {m['where']}: expected {m['expected']}, got {m['got']}"
                        )
                        lines += [f"- {code(f['id'])}: {code(text, 400)}"]
                lines.append("")
    if report["errors"]:
        lines += [f"### Runs that could not go on ({len(report['errors'])})", ""]
        lines += [
            f"- {code(e['target'])} / {code(e['implementation'])}: {code(e['error'] or '-')}"
            for e in report["errors"]
        ]
        lines.append("")
    m = report["mutants"]
    lines += ["### Mutants", ""]
    if not m["newly_caught"] and not m["no_longer_caught"]:
        lines += ["Every mutant in both campaigns ended as before."]
    for title, key in (("Newly caught", "newly_caught"), ("No longer caught", "no_longer_caught")):
        if m[key]:
            names = ", ".join(f"{code(e['target'])} / {code(e['implementation'])}" for e in m[key])
            lines += [f"- {title}: {names}"]
    lines += ["", "### Coverage", ""]
    if not report["coverage"]:
        lines += [
            f"No scenario class gained, lost or moved by {100 * report['share_threshold']:.0f} "
            "points or more.",
            "",
        ]
    for target, cov in report["coverage"].items():
        lines += [code(target), ""]
        if cov["gained"]:
            lines.append("- gained: " + ", ".join(code(x) for x in cov["gained"]))
        if cov["lost"]:
            lines.append("- lost: " + ", ".join(code(x) for x in cov["lost"]))
        if cov["changed"]:
            rows = [
                [
                    code(c["label"]),
                    f"{100 * c['baseline_share']:.0f}%",
                    f"{100 * c['current_share']:.0f}%",
                ]
                for c in cov["changed"]
            ]
            gap = [""] if cov["gained"] or cov["lost"] else []  # a table needs a blank line
            lines += [*gap, *table(["scenario class", "baseline", "current"], rows, "lrr")]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main_report(baseline: Path, current: Path, out: Path | None = None) -> int:
    """``attnfuzz report``: print the Markdown, write ``regression.md`` and ``regression.json``
    to ``out`` (default: the current campaign's directory); the exit status of :func:`compare`."""
    # A campaign's --out directory names its campaign.json.
    baseline, current = (p / "campaign.json" if p.is_dir() else p for p in (baseline, current))
    old, new = load_campaign(baseline), load_campaign(current)
    report = compare(old, new)
    report["baseline"]["path"], report["current"]["path"] = str(baseline), str(current)
    text = regression_markdown(report)
    out = current.parent if out is None else out
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "regression.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        (out / "regression.md").write_text(text, encoding="utf-8")
    except OSError as err:
        raise UsageError(
            f"cannot write the regression report to {out}: {err.strerror or err}"
        ) from err
    print(text, end="")
    print(f"written to {out / 'regression.md'} and {out / 'regression.json'}")
    return report["exit_status"]
