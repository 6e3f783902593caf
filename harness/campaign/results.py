"""A campaign's results: case files, campaign.json's findings, the exit status, the summary.

Nothing here may lose a campaign: each case file, ``campaign.json`` and each
report is written on its own, atomically (a temporary file renamed, removed
when the write fails), and what cannot be written is told in one line on
stderr (a case that cannot be written is printed there whole, as ``attnfuzz
run`` does); the exit status is then 1, whatever the verdicts.

A document its schema refuses is written as ``campaign.invalid.json`` with a
top-level ``note`` saying why, never as ``campaign.json``: readers of that name
(``attnfuzz report``, the baseline kept in ``previous/``, CI) rely on its schema,
and an absent ``campaign.json`` with an exit status of 1 cannot be misread.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from attnfuzz.harness.campaign.collect import Snapshot
from attnfuzz.harness.definitions import (
    CAMPAIGN_SCHEMA,
    EXIT_ERROR,
    EXIT_FOUND,
    EXIT_INCOMPLETE,
    EXIT_LATENT,
    EXIT_OK,
    INCOMPLETE,
    LATENT,
    SURVIVED,
    RunStatus,
)
from attnfuzz.harness.errors import UsageError, one_line
from attnfuzz.reports.document import (
    check_campaign,
    no_verdict,
    no_verdict_text,
    outcome_counts,
    run_verdict,
)

CAMPAIGN_JSON = "campaign.json"
INVALID_JSON = "campaign.invalid.json"  # a document its schema refuses: see above


def exit_status(campaign: dict[str, Any], signum: int | None = None) -> int:
    """See the package docstring: must-pass findings that are live, then attnfuzz's own
    errors, then interrupts, then mutants that survived, then latent findings (exit 5),
    then runs with no verdict (none or too few examples judged)."""
    runs = campaign["runs"]
    if any(r["findings"] and r["kind"] != "mutant" and not r.get("latent") for r in runs):
        return EXIT_FOUND
    if any(r["status"] == RunStatus.ERROR for r in runs):  # attnfuzz failed: no verdict, no finding
        return EXIT_ERROR
    if campaign["interrupted"]:
        return 128 + (signum or signal.SIGINT)
    if any(run_verdict(r) == SURVIVED for r in runs):
        return EXIT_FOUND
    if any(run_verdict(r) == LATENT for r in runs):
        return EXIT_LATENT
    if any(no_verdict(r) for r in runs):
        return EXIT_INCOMPLETE
    return EXIT_OK


def verdict_word(run: dict[str, Any]) -> str:
    """The run's verdict as the console shows it: the reports' word, in capitals."""
    return run_verdict(run).upper()


def why(err: OSError) -> str:
    """``No space left on device``: an OSError in a few words."""
    return one_line(err.strerror or err)


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)``, then ``tmp`` renamed to ``path``: a full disk never leaves half
    a file under ``path`` (the previous one stays), nor the temporary file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """A result file of the campaign, atomically (:func:`write_atomically`)."""
    write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class CaseWriter:
    """Writes each finding's case file, again whenever a smaller case arrives.

    A case file that cannot be written (a full disk) is kept in :attr:`unwritten`
    and tried again at each call; what is still there at the end goes to stderr
    (:meth:`print_unwritten`).
    """

    def __init__(self, out: Path, device: str):
        self.out, self.device = out, device
        self.shown = out  # the directory as printed
        self.example_timeout: float | None = None  # recorded in each case file
        self.written: dict[str, str] = {}
        self.paths: dict[str, Path] = {}  # finding id -> its case file
        self.derived: dict[str, dict[str, Any]] = {}
        # finding id -> (its case file, the case document, why it could not be written)
        self.unwritten: dict[str, tuple[Path, dict[str, Any], str]] = {}

    def write(self, finding: dict[str, Any]) -> bool:
        from attnfuzz.harness.campaign.findings import example_of
        from attnfuzz.harness.casefile import case_document
        from attnfuzz.harness.oracle import Mismatch, Verdict

        # What a finding's replays and reachability say arrives after its case (when
        # the run's search ends): a case file is written again when any of it changes.
        later = [finding.get(k) for k in ("reachability", "history_dependent", "flaky")]
        text = json.dumps([finding["case"], finding["verdict"], *later], sort_keys=True)
        if self.written.get(finding["id"]) == text:
            finding["derived"] = self.derived[finding["id"]]
            if finding["id"] in self.unwritten:  # the disk may have room by now
                path, doc, _ = self.unwritten[finding["id"]]
                self._save(finding["id"], path, doc)
            return False
        case = example_of(finding["case"])  # a trace's: written as a trace case file
        verdict = Verdict([Mismatch(**m) for m in finding["verdict"]["mismatches"]])
        verdict.step = finding.get("step")
        doc = case_document(
            finding["target"],
            finding["implementation"],
            case,
            verdict,
            self.device,
            example_timeout=self.example_timeout,
        )
        if finding.get("reachability") is not None:
            doc["reachability"] = finding["reachability"]
        if finding.get("history_dependent"):
            doc["history_dependent"] = True
        if finding.get("flaky"):
            doc["flaky"] = finding["flaky"]
        finding["derived"] = self.derived[finding["id"]] = doc["derived"]
        self.paths[finding["id"]] = self.out / finding["case_file"]
        self._save(finding["id"], self.out / finding["case_file"], doc)
        new = finding["id"] not in self.written
        self.written[finding["id"]] = text
        return new

    def withdraw(self, kept: set[str]) -> list[str]:
        """Remove the case files written for findings that are no longer findings (a
        timeout whose replay under a longer limit passed: the machine was slow), and
        say so; a case file is never left to say what the campaign does not."""
        lines = []
        for fid in sorted(set(self.written) - kept):
            self.paths.pop(fid).unlink(missing_ok=True)
            del self.written[fid]
            self.unwritten.pop(fid, None)
            lines.append(
                f"WITHDRAWN {fid}: a timeout that did not hang again under a longer limit "
                "(or was not judged again before the budget ended): its case file removed, "
                "its run INCOMPLETE"
            )
        return lines

    def _save(self, fid: str, path: Path, doc: dict[str, Any]) -> None:
        from attnfuzz.harness.casefile import write_case

        try:
            write_atomically(path, lambda tmp: write_case(tmp, doc))
        except OSError as err:
            self.unwritten[fid] = (path, doc, why(err))
        else:
            self.unwritten.pop(fid, None)

    def print_unwritten(self, stream: TextIO | None = None) -> None:
        """Each case that could not be written, whole, as ``attnfuzz run`` prints one."""
        stream = stream or sys.stderr
        for path, doc, reason in self.unwritten.values():
            shown = self.shown / path.relative_to(self.out)
            print(f"attnfuzz: could not write {shown} ({reason}); the case:", file=stream)
            print(json.dumps(doc, indent=2), file=stream, flush=True)


def report_new(snap: Snapshot, writer: CaseWriter, progress: Any, started: float) -> None:
    for f in sorted(snap.findings.values(), key=lambda f: f["found"]):
        if writer.write(f):
            where = f"-> {writer.shown / f['case_file']}"
            if f["id"] in writer.unwritten:
                where += f" NOT WRITTEN ({writer.unwritten[f['id']][2]}: the case goes to stderr)"
            at = f" at step {f['step']}" if f.get("step") is not None else ""
            if f.get("history_dependent"):
                at += " (HISTORY-DEPENDENT: passes in a new process; search it with --trace)"
            if f.get("flaky"):
                at += f" (FLAKY: failed {f['flaky']['failed']} of {f['flaky']['replays']} replays)"
            progress.say(
                f"[{f['found'] - started:6.1f}s] FOUND {f['target']} / {f['implementation']} "
                f"[{f['key']}]{at} {where}"
            )


def finding_mark(finding: Mapping[str, Any]) -> str:
    """`` FLAKY 2/10`` or `` HISTORY-DEPENDENT``: what replays in new processes said."""
    if finding.get("flaky"):
        return f" FLAKY {finding['flaky']['failed']}/{finding['flaky']['replays']}"
    return " HISTORY-DEPENDENT" if finding.get("history_dependent") else ""


def summary_lines(
    campaign: dict[str, Any], out: Path, code: int, results: Results | None = None
) -> list[str]:
    """The console's summary; ``results``: what was written (None: everything)."""
    lines = []
    marks = {f["id"]: finding_mark(f) for f in campaign["findings"]}
    for run in campaign["runs"]:
        keys = ", ".join(f.rsplit("--", 1)[-1] + marks.get(f, "") for f in run["findings"])
        lines.append(
            f"{verdict_word(run):<8} {run['target']} / {run['implementation']} ({run['kind']}): "
            f"{run['examples']} {'traces' if run.get('traced') else 'examples'}, "
            f"{run['examples_per_second']:.1f}/s"
            + (f"  [{keys}]" if keys else "")
            + (f"  {run['error']}" if run.get("error") else "")
            + (f"  ({no_verdict_text(run)})" if no_verdict_text(run) else "")
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
    if results is None or results.complete:
        wrote = f"; wrote {out / CAMPAIGN_JSON}" + (f" and {out / 'cases'}/" if n else "")
    else:
        wrote = "; its results are NOT all written: see stderr"
    lines.append(
        f"{outcome_counts(campaign)[0]} in {campaign['seconds']:.1f}s"
        + (" (interrupted)" if campaign["interrupted"] else "")
        + wrote
    )
    lines.append(f"exit status {code}")
    return lines


def report_renderers() -> dict[str, Callable[[Mapping[str, Any]], str]]:
    """The reports of :mod:`attnfuzz.reports`, each rendered from the campaign alone."""
    from attnfuzz.reports.html import report_html
    from attnfuzz.reports.junit import junit_xml
    from attnfuzz.reports.markdown import summary_markdown

    return {"junit.xml": junit_xml, "summary.md": summary_markdown, "report.html": report_html}


@dataclass
class Results:
    """What :func:`write_results` wrote, and why each thing it did not write was not."""

    campaign: dict[str, Any]  # the document; what its builder was given, if it refused
    out: Path
    refused: str | None = None  # why the document is not campaign.json (its check's line)
    written: list[str] = field(default_factory=list)  # names in out
    failed: dict[str, list[str]] = field(default_factory=dict)  # why -> names not written
    cases: int = 0  # case files not written (CaseWriter.unwritten)

    @property
    def complete(self) -> bool:
        return self.refused is None and not self.failed and not self.cases

    @property
    def reports(self) -> list[Path]:
        return [self.out / n for n in self.written if n in report_renderers()]

    def status(self, signum: int | None = None) -> int:
        """:func:`exit_status`, or 1 when anything was not written: the user must look."""
        return exit_status(self.campaign, signum) if self.complete else EXIT_FOUND

    def summary(self, shown: Path, code: int) -> list[str]:
        """:func:`summary_lines`; of a refused document, as much as it can say."""
        try:
            return summary_lines(self.campaign, shown, code, self)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            if self.refused is None:
                raise  # a valid document: a bug of ours, not to be hidden
            return [
                f"no summary: the campaign document is invalid ({type(err).__name__}: {err})",
                f"exit status {code}",
            ]

    def problems(self, shown: Path) -> list[str]:
        """One line per thing not written, and why (files that failed alike: one line)."""
        lines = []
        if self.refused is not None:
            where = (
                f"written as {shown / INVALID_JSON} instead"
                if INVALID_JSON in self.written
                else f"not written as {CAMPAIGN_JSON}"
            )
            lines.append(f"attnfuzz: the campaign document is invalid ({self.refused}); {where}")
        for reason, names in self.failed.items():
            lines.append(f"attnfuzz: could not write {', '.join(names)} in {shown} ({reason})")
        return lines

    def fail(self, name: str, reason: str) -> None:
        self.failed.setdefault(reason, []).append(name)


def write_results(
    build: Callable[..., dict[str, Any]], fields: dict[str, Any], writer: CaseWriter
) -> Results:
    """Build the campaign document (``build(**fields)``: ``campaign_record``) and write
    it and the reports into ``writer.out``, each on its own: see the module docstring.

    A document its builder refuses is kept as the builder was given it: its data is
    the campaign's, and no report can be rendered from it.
    """
    out = writer.out
    built = True
    try:
        campaign = build(**fields)
    except UsageError as err:  # the builder checks what it builds: its refusal loses nothing
        campaign, built, refused = {"schema": CAMPAIGN_SCHEMA, **fields}, False, str(err)
    else:
        try:
            check_campaign(campaign)  # whatever the builder checked: this is what is written
            refused = None
        except UsageError as err:
            refused = str(err)
    results = Results(campaign, out, refused, cases=len(writer.unwritten))
    if refused is None:
        name, doc = CAMPAIGN_JSON, campaign
    else:
        name, doc = INVALID_JSON, {"note": f"not {CAMPAIGN_JSON}: {refused}", **campaign}
    try:
        # default=repr: an invalid document may hold what JSON cannot; it is still written
        write_text(out / name, json.dumps(doc, indent=2, default=repr) + "\n")
        results.written.append(name)
    except OSError as err:
        results.fail(name, why(err))
    if refused is None:  # one left by an earlier campaign is no longer this one's
        with contextlib.suppress(OSError):
            (out / INVALID_JSON).unlink(missing_ok=True)
    for name, render in report_renderers().items():
        if not built:
            results.fail(name, "no campaign document to render it from")
            continue
        try:
            text = render(campaign)
        except Exception as err:  # one report is not worth the others: told, exit 1
            results.fail(name, f"cannot render it: {type(err).__name__}: {one_line(err, 200)}")
            continue
        try:
            write_text(out / name, text)
            results.written.append(name)
        except OSError as err:
            results.fail(name, why(err))
    return results
