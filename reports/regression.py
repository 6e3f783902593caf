"""Regression report: what changed between a baseline campaign and the current one.

Findings are matched by their id (target, implementation and verdict key).
For implementations that must pass:

- *new*: failing now, not in the baseline (exit status 1);
- *fixed*: in the baseline, and the current campaign ran that target x
  implementation without finding it again;
- *still failing*: in both;
- *not rerun*: in the baseline, but the current campaign did not run that pair
  (or the run errored), so nothing is known.

Exit status: 1 on any new finding; else 3 when some run of the current campaign
has no verdict (it judged nothing, or too little: NOT RUN, INCOMPLETE, ERROR),
since nothing judged is never "nothing new"; else 0.

Mutants are expected to fail, so their findings are not regressions; what is
compared is whether each one is still caught. Coverage compares, per target,
the scenario classes of the runs (target x implementation) that judged examples
in both campaigns: a class seen now and never in the baseline is gained; one
the baseline's rerun runs saw and no run of the target saw now is lost; one
whose share of those runs' examples moved by ``threshold`` or more changed. A
run of the baseline that the current campaign did not judge again is listed
once as not rerun: what it saw says nothing of the current code.

The replay command of each finding names its case file where it is now, found
from the campaign.json given (a campaign's ``cases/`` lie beside it, and the
next campaign in the same ``--out`` moves both to ``previous/``), not where
the campaign wrote it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import PREVIOUS, REGRESSION_SCHEMA, RunStatus, repro_command
from attnfuzz.harness.errors import UsageError
from attnfuzz.reports.document import (
    CAUGHT,
    ERROR,
    SURVIVED,
    expected_finding,
    load_campaign,
    no_verdict,
    run_verdict,
)
from attnfuzz.reports.markdown import code, table

SHARE_THRESHOLD = 0.10  # ten percentage points of a target's examples

Pair = tuple[str, str]  # (target, implementation): one run of a campaign


def case_places(f: Mapping[str, Any], campaign_dir: Path) -> list[Path]:
    """Where a finding's case file may be now, most likely first: beside its
    campaign.json; then, for a campaign.json kept elsewhere, in ``previous/`` of
    the directory the campaign wrote to (where the next campaign moved it), and
    last where it was written (which a later campaign may have reused)."""
    places = [campaign_dir / f["case_file"]]
    try:
        written = Path(shlex.split(f["repro"])[2])  # attnfuzz repro PATH [--impl ...]
    except (ValueError, IndexError):
        return places
    depth = len(Path(f["case_file"]).parts)
    if written.parts[-depth:] == Path(f["case_file"]).parts:
        out = Path(*written.parts[:-depth]) if len(written.parts) > depth else Path()
        places += [out / PREVIOUS / f["case_file"], written]
    return list(dict.fromkeys(places))


def _summary(f: Mapping[str, Any], campaign_dir: Path | None = None) -> dict[str, Any]:
    """A finding for the report; with ``campaign_dir`` (where its campaign.json is),
    its replay command names the case file where it is now, or ``repro`` is None
    and ``searched`` lists where it is not."""
    first = f["verdict"]["mismatches"][0] if f["verdict"]["mismatches"] else {}
    summary = {
        "id": f["id"],
        "target": f["target"],
        "implementation": f["implementation"],
        "key": f["key"],
        "check": f["check"],
        "first_mismatch": first,
        "case_file": f["case_file"],
        "repro": f["repro"],
    }
    if campaign_dir is not None:
        places = case_places(f, campaign_dir)
        found = next((p for p in places if p.is_file()), None)
        summary["case_path"] = None if found is None else str(found)
        summary["repro"] = None if found is None else repro_command(found, f["implementation"])
        if found is None:
            summary["searched"] = [str(p) for p in places]
    return summary


def _judged(run: Mapping[str, Any]) -> bool:
    """The run judged examples, so its scenario classes say what the search reached."""
    return run["status"] != "error" and run["examples"] > 0


def _shares(
    campaign: Mapping[str, Any], pairs: set[Pair] | None = None
) -> dict[str, dict[str, float]]:
    """Per target, each scenario class's share of the target's examples: of all its
    runs, or of the runs of ``pairs`` (target, implementation) only."""
    counts: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    for run in campaign["runs"]:
        t = run["target"]
        if pairs is not None and (t, run["implementation"]) not in pairs:
            continue
        totals[t] = totals.get(t, 0) + run["examples"]
        per = counts.setdefault(t, {})
        for label, n in run.get("labels", {}).items():
            per[label] = per.get(label, 0) + n
    return {
        t: {label: n / totals[t] for label, n in sorted(per.items()) if n} if totals[t] else {}
        for t, per in counts.items()
    }


def _pairs(campaign: Mapping[str, Any]) -> dict[Pair, Mapping[str, Any]]:
    return {(r["target"], r["implementation"]): r for r in campaign["runs"]}


def _rerun(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[set[Pair], list[Pair]]:
    """The pairs judged in both campaigns, and the baseline's judged pairs that the
    current campaign did not judge (in the baseline's order)."""
    judged_now = {pair for pair, r in _pairs(new).items() if _judged(r)}
    judged_then = [pair for pair, r in _pairs(old).items() if _judged(r)]
    both = {pair for pair in judged_then if pair in judged_now}
    return both, [pair for pair in judged_then if pair not in judged_now]


def _coverage(old: Mapping[str, Any], new: Mapping[str, Any], threshold: float) -> dict:
    both, _ = _rerun(old, new)
    seen_then, seen_now = _shares(old), _shares(new)
    before, after = _shares(old, both), _shares(new, both)  # like for like
    out = {}
    for target in sorted(set(seen_then) | set(seen_now)):
        b, a = before.get(target, {}), after.get(target, {})
        changed = [
            {"label": k, "baseline_share": round(b[k], 4), "current_share": round(a[k], 4)}
            for k in sorted(set(a) & set(b))
            if abs(a[k] - b[k]) >= threshold
        ]
        # Lost: a rerun saw it before and nothing of the target sees it now; a run not
        # rerun loses nothing (it is listed once as not rerun).
        gained = sorted(set(seen_now.get(target, {})) - set(seen_then.get(target, {})))
        lost = sorted(set(b) - set(seen_now.get(target, {})))
        if gained or lost or changed:
            out[target] = {"gained": gained, "lost": lost, "changed": changed}
    return out


def compare(
    baseline: Mapping[str, Any],
    current: Mapping[str, Any],
    threshold: float = SHARE_THRESHOLD,
    *,
    baseline_dir: Path | None = None,
    current_dir: Path | None = None,
) -> dict[str, Any]:
    """The regression report as a JSON-able dict; ``exit_status`` 1 on any new finding,
    else 3 when a run of ``current`` has no verdict, else 0.

    ``baseline_dir`` and ``current_dir``, the directories of the two campaign.json
    files, locate each finding's case file (see :func:`_summary`); without them the
    replay commands are the ones the campaigns recorded."""
    old = {f["id"]: f for f in baseline["findings"] if not expected_finding(baseline, f)}
    new = {f["id"]: f for f in current["findings"] if not expected_finding(current, f)}
    ran = {pair for pair, r in _pairs(current).items() if r["status"] != "error"}
    fixed, not_rerun = [], []
    for fid, f in old.items():
        if fid in new:
            continue
        bucket = fixed if (f["target"], f["implementation"]) in ran else not_rerun
        bucket.append(_summary(f, baseline_dir))

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
        "new": [_summary(f, current_dir) for fid, f in new.items() if fid not in old],
        "fixed": fixed,
        "still_failing": [_summary(f, current_dir) for fid, f in new.items() if fid in old],
        "not_rerun": not_rerun,
        "runs_not_rerun": [
            {"target": t, "implementation": i} for t, i in _rerun(baseline, current)[1]
        ],
        "errors": [
            {"target": r["target"], "implementation": r["implementation"], "error": r.get("error")}
            for r in current["runs"]
            if r["status"] == RunStatus.ERROR
        ],
        "no_verdict": [
            {
                "target": r["target"],
                "implementation": r["implementation"],
                "verdict": run_verdict(r),
            }
            for r in current["runs"]
            if no_verdict(r) or run_verdict(r) == ERROR
        ],  # fmt: skip
        "mutants": mutants,
        "mutants_compared": sum(
            run["kind"] == "mutant" and pair in old_runs for pair, run in _pairs(current).items()
        ),
        "coverage": _coverage(baseline, current, threshold),
        "share_threshold": threshold,
    }
    report["exit_status"] = 1 if report["new"] else 3 if report["no_verdict"] else 0
    return report


def _replay_cell(f: Mapping[str, Any]) -> str:
    if f["repro"] is not None:
        return code(f["repro"])
    # Say so rather than print a command that fails.
    return f"case file not found in {' nor '.join(code(p) for p in f['searched'])}"


def _finding_rows(items: list[dict[str, Any]]) -> list[str]:
    rows = [
        [code(f["target"]), code(f["implementation"]), code(f["key"]), _replay_cell(f)]
        for f in items
    ]
    return table(["target", "implementation", "check", "replay"], rows)


def regression_markdown(report: Mapping[str, Any]) -> str:
    """The report in Markdown, for a terminal or a CI job summary."""
    unjudged = report.get("no_verdict", [])
    verdict = (
        "new findings"
        if report["new"]
        else f"no verdict: {len(unjudged)} of the current runs judged too little"
        if unjudged
        else "no new finding"
    )
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
    if unjudged:
        lines += [f"### Runs without a verdict ({len(unjudged)})", ""]
        lines += [
            f"- {code(r['target'])} / {code(r['implementation'])}: {r['verdict']}" for r in unjudged
        ]
        lines.append("")
    m = report["mutants"]
    lines += ["### Mutants", ""]
    if not report.get("mutants_compared", 1):
        lines += ["No mutant ran in both campaigns."]
    elif not m["newly_caught"] and not m["no_longer_caught"]:
        lines += ["Every mutant in both campaigns ended as before."]
    for title, key in (("Newly caught", "newly_caught"), ("No longer caught", "no_longer_caught")):
        if m[key]:
            names = ", ".join(f"{code(e['target'])} / {code(e['implementation'])}" for e in m[key])
            lines += [f"- {title}: {names}"]
    lines += ["", "### Coverage", ""]
    if report["runs_not_rerun"]:
        names = ", ".join(
            f"{code(r['target'])} / {code(r['implementation'])}" for r in report["runs_not_rerun"]
        )
        lines += [f"Not rerun, so their scenario classes are not compared: {names}", ""]
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
    report = compare(old, new, baseline_dir=baseline.parent, current_dir=current.parent)
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
