"""A campaign's results: case files, campaign.json's findings, the exit status, the summary."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from attnfuzz.harness.campaign.collect import Snapshot
from attnfuzz.harness.definitions import EXIT_FOUND, EXIT_INCOMPLETE, EXIT_OK, INCOMPLETE, SURVIVED
from attnfuzz.reports.document import incomplete_text, no_verdict, run_verdict


def exit_status(campaign: dict[str, Any], signum: int | None = None) -> int:
    """See the package docstring: must-pass findings and errors, then interrupts, then
    mutants that survived, then runs with no verdict (none or too few examples judged)."""
    runs = campaign["runs"]
    if any(r["status"] == "error" for r in runs):
        return EXIT_FOUND
    if any(r["findings"] and r["kind"] != "mutant" for r in runs):
        return EXIT_FOUND
    if campaign["interrupted"]:
        return 128 + (signum or signal.SIGINT)
    if any(run_verdict(r) == SURVIVED for r in runs):
        return EXIT_FOUND
    if any(no_verdict(r) for r in runs):
        return EXIT_INCOMPLETE
    return EXIT_OK


def verdict_word(run: dict[str, Any]) -> str:
    """The run's verdict as the console shows it: the reports' word, in capitals."""
    return run_verdict(run).upper()


class CaseWriter:
    """Writes each finding's case file, again whenever a smaller case arrives."""

    def __init__(self, out: Path, device: str):
        self.out, self.device = out, device
        self.shown = out  # the directory as printed
        self.example_timeout: float | None = None  # recorded in each case file
        self.written: dict[str, str] = {}
        self.derived: dict[str, dict[str, Any]] = {}

    def write(self, finding: dict[str, Any]) -> bool:
        from attnfuzz.harness.casefile import case_document, write_case
        from attnfuzz.harness.oracle import Mismatch, Verdict
        from attnfuzz.reference.batch import Case

        text = json.dumps(finding["case"], sort_keys=True)
        if self.written.get(finding["id"]) == text:
            finding["derived"] = self.derived[finding["id"]]
            return False
        case = Case.from_dict(finding["case"])
        verdict = Verdict([Mismatch(**m) for m in finding["verdict"]["mismatches"]])
        doc = case_document(
            finding["target"],
            finding["implementation"],
            case,
            verdict,
            self.device,
            example_timeout=self.example_timeout,
        )
        finding["derived"] = self.derived[finding["id"]] = doc["derived"]
        write_case(self.out / finding["case_file"], doc)
        new = finding["id"] not in self.written
        self.written[finding["id"]] = text
        return new


def report_new(snap: Snapshot, writer: CaseWriter, progress: Any, started: float) -> None:
    for f in sorted(snap.findings.values(), key=lambda f: f["found"]):
        if writer.write(f):
            progress.say(
                f"[{f['found'] - started:6.1f}s] FOUND {f['target']} / {f['implementation']} "
                f"[{f['key']}] -> {writer.shown / f['case_file']}"
            )


def summary_lines(campaign: dict[str, Any], out: Path, code: int) -> list[str]:
    lines = []
    for run in campaign["runs"]:
        keys = ", ".join(f.rsplit("--", 1)[-1] for f in run["findings"])
        lines.append(
            f"{verdict_word(run):<8} {run['target']} / {run['implementation']} ({run['kind']}): "
            f"{run['examples']} examples, {run['examples_per_second']:.1f}/s"
            + (f"  [{keys}]" if keys else "")
            + (f"  {run['error']}" if run.get("error") else "")
            + (f"  ({incomplete_text(run)})" if run_verdict(run) == INCOMPLETE else "")
        )
    for event in campaign.get("events", []):
        lines.append(
            f"EVENT    {event['target']} / {event['implementation']}: {event['event']} "
            f"(shard {event['shard']}): {event['detail']}"
        )
    short = [r for r in campaign["runs"] if run_verdict(r) == INCOMPLETE]
    if short:
        lines.append(
            f"{INCOMPLETE}: {len(short)} run(s) found nothing in fewer examples than their "
            "floor (--min-examples): no verdict; a longer --budget or fewer runs gives one"
        )
    n = len(campaign["findings"])
    lines.append(
        f"{n} finding{'s' if n != 1 else ''} in {campaign['seconds']:.1f}s"
        + (" (interrupted)" if campaign["interrupted"] else "")
        + f"; wrote {out / 'campaign.json'}"
        + (f" and {out / 'cases'}/" if n else "")
    )
    lines.append(f"exit status {code}")
    return lines


def write_reports(campaign: dict[str, Any], out: Path) -> list[Path]:
    """The reports of :mod:`attnfuzz.reports`, where this version has them."""
    import attnfuzz.reports as reports

    write_reports = getattr(reports, "write_reports", None)
    if write_reports is None:
        return []
    return list(write_reports(campaign, out))
