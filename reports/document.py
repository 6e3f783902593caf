"""The campaign document (``campaign.json``): building it, checking it, reading verdicts off it.

A campaign runs every target x implementation; ``campaign.json`` records one
*run* per pair and one *finding* per distinct failure (target, implementation
and :attr:`Verdict.key`), each with its minimized case written under
``cases/``. The reports are rendered from this document alone, so a report can
be rebuilt from a saved ``campaign.json`` and two campaigns can be compared.

Outcomes depend on the implementation's kind. A *mutant* re-creates a known
bug: failing is the expected outcome ("caught"), passing means the harness
missed it ("survived"). Every other kind must pass ("pass"; "FAIL" otherwise).
A run that found nothing says so only once it judged its example floor
(``min_examples``): short of it (its time budget ended, its worker was lost)
it is "INCOMPLETE", neither a pass nor a survivor. A run's ``status`` is what
happened (``pass``: examples judged, nothing failed); its verdict is
:func:`run_verdict`'s.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnfuzz.harness.casefile import case_document, load_json, write_case
from attnfuzz.harness.definitions import (  # noqa: F401 (KINDS, STATUSES, repro_command: re-exported)
    CAMPAIGN_FAIL,
    CAMPAIGN_INCOMPLETE,
    CAMPAIGN_LATENT,
    CAMPAIGN_PASS,
    CAMPAIGN_SCHEMA,
    CAUGHT,
    ERROR,
    FAIL,
    INCOMPLETE,
    KINDS,
    LATENT,
    NOT_RUN,
    PASS,
    STATUSES,
    SURVIVED,
    finding_id,
    repro_command,
)
from attnfuzz.harness.errors import UsageError, one_line  # noqa: F401 (one_line: for the reports)
from attnfuzz.harness.oracle import UNSHRUNK_CHECKS, Verdict
from attnfuzz.harness.reachability import is_latent as latent_reachability
from attnfuzz.harness.reachability import reachability_lines
from attnfuzz.harness.schemas import validate
from attnfuzz.reference.batch import Case

if TYPE_CHECKING:
    from attnfuzz.harness.runner import RunResult

# -- text ---------------------------------------------------------------------

# Characters XML 1.0 cannot hold at all (not even escaped); exception messages
# may carry them (ANSI colours, NUL bytes), and a report must still parse.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def printable(text: object) -> str:
    """``text`` with every character XML cannot hold written as a Python escape."""
    return _NOT_XML.sub(lambda m: repr(m.group())[1:-1], str(text))


def mismatch_line(m: Mapping[str, Any]) -> str:
    """A mismatch as :class:`Mismatch` prints it: ``[check] where: expected X, got Y``."""
    return f"[{m.get('check')}] {m.get('where')}: expected {m.get('expected')}, got {m.get('got')}"


# -- building -----------------------------------------------------------------


def case_label(finding: Mapping[str, Any]) -> str:
    """How a report names a finding's case: minimized, unless the process died with it."""
    if finding.get("check") in UNSHRUNK_CHECKS:
        return "case as it ran (not shrunk: the process died or hung)"
    return "minimized case"


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


def finding_record(
    target: str,
    implementation: str,
    case: Mapping[str, Any],
    verdict: Mapping[str, Any],
    *,
    derived: Mapping[str, Any],
    shown_out: Path,
    examples_to_failure: int | None,
    seconds_to_failure: float | None,
    reachability: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One finding of ``campaign.json``: ``verdict`` as its case file records it
    (``key`` and ``mismatches``), the case file under ``cases/``, the replay
    command naming ``shown_out`` (the results directory as the user gave it), and
    for engine code where it can happen (``reachability``, as case files hold it)."""
    fid = finding_id(target, implementation, verdict["key"])
    case_file = f"cases/{fid}.json"
    record = {
        "id": fid,
        "target": target,
        "implementation": implementation,
        "key": verdict["key"],
        "check": verdict["mismatches"][0]["check"],
        "case_file": case_file,
        "case": dict(case),
        "verdict": dict(verdict),
        "derived": dict(derived),
        "repro": repro_command(shown_out / case_file, implementation),
        "examples_to_failure": examples_to_failure,
        "seconds_to_failure": seconds_to_failure,
    }
    if reachability is not None:
        record["reachability"] = dict(reachability)
    return record


def is_latent(finding: Mapping[str, Any]) -> bool:
    """The finding's engine code fails only where a FULL graph replays (see
    ``harness.reachability``)."""
    return latent_reachability(finding.get("reachability"))


def reachability_text(finding: Mapping[str, Any]) -> list[str]:
    """Where the finding can happen, as ``run`` and ``repro`` print it; [] for
    attnfuzz's own code (or a document older than reachability)."""
    reach = finding.get("reachability")
    return reachability_lines(reach) if reach else []


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


def run_record(
    target: str,
    implementation: str,
    kind: str,
    *,
    examples: int,
    seconds: float,
    status: str,
    labels: Mapping[str, int] | None = None,
    timeline: Sequence[Sequence[float]] | None = None,
    findings: Iterable[str] = (),
    error: str | None = None,
    min_examples: int | None = None,
    incomplete: str | None = None,
    latent: bool = False,
) -> dict[str, Any]:
    """One run's record. ``error`` is the one-line reason of a run with status "error";
    ``latent``: the run found something and every finding is latent.

    ``min_examples`` is the run's example floor (absent: none, as in documents
    older than it); ``incomplete`` says why a run that found nothing stopped
    short of it (``the time budget ended``), written only then."""
    assert kind in KINDS and status in STATUSES, (kind, status)
    run: dict[str, Any] = {
        "target": target,
        "implementation": implementation,
        "kind": kind,
        "examples": examples,
        "seconds": round(seconds, 3),
        "examples_per_second": round(examples / seconds, 3) if seconds > 0 else 0.0,
        "status": status,
        "labels": dict(sorted((labels or {}).items())),
        "timeline": (
            [list(p) for p in timeline] if timeline is not None else [[0.0, 0], [seconds, examples]]
        ),
        "findings": list(findings),
    }
    if error is not None:
        run["error"] = one_line(error)
    if min_examples is not None:
        run["min_examples"] = min_examples
    if incomplete is not None:
        run["incomplete"] = one_line(incomplete)
    if latent:
        run["latent"] = True
    return run


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


def campaign_record(
    runs: list[dict[str, Any]],
    findings: list[dict[str, Any]],
    *,
    started: str,
    finished: str,
    seconds: float,
    environment: dict[str, str],
    budget_seconds: float | None = None,
    max_examples: int | None = None,
    min_examples: int | None = None,
    profile: str = "dev",
    seed: int | None = None,
    workers: int = 1,
    database: str = "",
    interrupted: bool = False,
    events: list[dict[str, Any]] | None = None,
    timing: dict[str, Any] | None = None,
    database_note: str | None = None,
) -> dict[str, Any]:
    """The whole ``campaign.json`` document (checked before it is returned): the one
    builder of it, for ``attnfuzz campaign`` and for tests alike. ``events`` are the
    harness's own (a worker lost), written only when given. ``min_examples`` is the
    floor asked for (each run records its own, at most its share of ``max_examples``).
    ``timing`` splits ``seconds`` into start-up, fuzzing, shrinking and other
    (:mod:`attnfuzz.harness.campaign_timing`), written only when given.
    ``database_note`` says what of ``database`` could not be read (a GitHub
    artifact not fetched), written only when given."""
    budget: dict[str, Any] = {"seconds": budget_seconds, "max_examples": max_examples}
    if min_examples is not None:
        budget["min_examples"] = min_examples
    doc = {
        "schema": CAMPAIGN_SCHEMA,
        "started": started,
        "finished": finished,
        "seconds": round(seconds, 3),
        "budget": budget,
        "profile": profile,
        "seed": seed,
        "workers": workers,
        "database": database,
        "interrupted": interrupted,
        "environment": environment,
        "runs": runs,
        "findings": findings,
    }
    if events is not None:
        doc["events"] = events
    if timing is not None:
        doc["timing"] = timing
    if database_note is not None:
        doc["database_note"] = database_note
    return check_campaign(doc)


# -- checking and reading -------------------------------------------------------


def check_campaign(doc: Any, where: str = "campaign") -> dict[str, Any]:
    """Check the shape every report relies on; any problem is a one-line :class:`UsageError`.

    Types, required keys and the kind/status words are the published campaign
    schema's (:func:`attnfuzz.harness.schemas.validate`); what it cannot say is
    checked here: the schema version (named as such), finding ids unique, and
    each run's findings naming findings of the document.
    """
    if isinstance(doc, dict) and doc.get("schema") != CAMPAIGN_SCHEMA:
        raise UsageError(
            f"{where}: the document has schema {doc.get('schema')!r}, expected {CAMPAIGN_SCHEMA!r}"
        )
    validate(doc, "campaign", where)
    ids: set[str] = set()
    for i, f in enumerate(doc["findings"]):
        if f["id"] in ids:
            raise UsageError(f"{where}: findings[{i}] repeats the id {f['id']!r}")
        ids.add(f["id"])
    for i, r in enumerate(doc["runs"]):
        for fid in r.get("findings", []):
            if fid not in ids:
                raise UsageError(f"{where}: runs[{i}].findings names {fid!r}, which is no finding")
    return doc


def load_campaign(path: Path | str) -> dict[str, Any]:
    """Read and check a ``campaign.json``; every problem is a one-line :class:`UsageError`."""
    return check_campaign(load_json(path, "campaign file"), str(path))


# -- verdicts -----------------------------------------------------------------


def below_floor(run: Mapping[str, Any]) -> bool:
    """The run found nothing and judged fewer examples than its floor."""
    return run["status"] == "pass" and run["examples"] < run.get("min_examples", 0)


def run_verdict(run: Mapping[str, Any]) -> str:
    """``caught``/``survived`` for a mutant, ``pass``/``FAIL`` otherwise (``LATENT``: every
    finding latent, see :func:`is_latent`); ``ERROR`` when
    the run could not go on, ``not run`` when it judged no example at all,
    ``INCOMPLETE`` when it found nothing short of its floor (``min_examples``)."""
    if run["status"] == "error":
        return ERROR
    if run["status"] == NOT_RUN or (run["examples"] == 0 and run["status"] == "pass"):
        return NOT_RUN
    if below_floor(run):  # a failure counts at any count; a pass or a miss only at the floor
        return INCOMPLETE
    if run["kind"] == "mutant":
        return CAUGHT if run["status"] == "fail" else SURVIVED
    if run["status"] == "fail" and run.get("latent"):
        return LATENT  # a defect, though no step of the engine runs it on such metadata
    return PASS if run["status"] == "pass" else FAIL


def no_verdict(run: Mapping[str, Any]) -> bool:
    """The run says nothing: it judged no example, or too few to pass or survive."""
    return run_verdict(run) in (NOT_RUN, INCOMPLETE)


def incomplete_text(run: Mapping[str, Any]) -> str:
    """``incomplete: 120 of 200 examples, the time budget ended``, for a report."""
    why = f", {run['incomplete']}" if run.get("incomplete") else ""
    return f"incomplete: {run['examples']} of {run.get('min_examples', 0)} examples{why}"


def as_expected(run: Mapping[str, Any]) -> bool:
    """Nothing went wrong: a mutant caught, anything else passing (or with no verdict)."""
    return run_verdict(run) in (PASS, CAUGHT, NOT_RUN, INCOMPLETE)


def campaign_verdict(campaign: Mapping[str, Any]) -> str:
    """``FAIL`` if any run ended otherwise than it should (``LATENT`` if each such run
    is); ``INCOMPLETE`` if interrupted or a run judged nothing or too little (see
    :func:`no_verdict`); ``PASS`` otherwise."""
    runs = campaign["runs"]
    departures = [run_verdict(r) for r in runs if not as_expected(r)]
    if departures:
        return CAMPAIGN_LATENT if set(departures) == {LATENT} else CAMPAIGN_FAIL
    if campaign.get("interrupted") or any(no_verdict(r) for r in runs) or not runs:
        return CAMPAIGN_INCOMPLETE
    return CAMPAIGN_PASS


def kind_of(campaign: Mapping[str, Any], target: str, implementation: str) -> str | None:
    for run in campaign["runs"]:
        if run["target"] == target and run["implementation"] == implementation:
            return run["kind"]
    return None


def expected_finding(campaign: Mapping[str, Any], finding: Mapping[str, Any]) -> bool:
    """A mutant's finding is the expected outcome, not a bug report."""
    return kind_of(campaign, finding["target"], finding["implementation"]) == "mutant"


def targets(campaign: Mapping[str, Any]) -> list[str]:
    """Targets in the order their first run appears."""
    return list(dict.fromkeys(r["target"] for r in campaign["runs"]))


def compact_json(obj: Mapping[str, Any]) -> str:
    """A JSON object with one line per top-level key (a case: config, batch, params)."""
    items = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in obj.items()]
    return "{\n" + ",\n".join(items) + "\n}" if items else "{}"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def budget_text(budget: Mapping[str, Any] | None) -> str:
    """``600 s, at most 1000 examples per run, floor 200`` (or ``none``)."""
    budget = budget or {}
    parts = []
    if budget.get("seconds") is not None:
        parts.append(f"{fmt_seconds(budget['seconds'])} s")
    if budget.get("max_examples") is not None:
        parts.append(f"at most {budget['max_examples']} examples per run")
    text = ", ".join(parts) or "none"
    if budget.get("min_examples"):
        text += f"; floor {budget['min_examples']} examples per run"
    return text


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"
