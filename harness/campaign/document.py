"""Building ``campaign.json``: one record per run, one per finding, and the document.

The one builder of the document, for ``attnfuzz campaign`` and for tests alike;
what it means (verdicts, checks) is read off it by :mod:`attnfuzz.reports.document`,
which also checks it before it is returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnfuzz.harness.definitions import (
    CAMPAIGN_SCHEMA,
    KINDS,
    STATUSES,
    finding_id,
    repro_command,
)
from attnfuzz.harness.errors import one_line
from attnfuzz.reports.document import check_campaign


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
    step: int | None = None,
    history_dependent: bool = False,
    flaky: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One finding of ``campaign.json``: ``verdict`` as its case file records it
    (``key`` and ``mismatches``), the case file under ``cases/``, the replay
    command naming ``shown_out`` (the results directory as the user gave it), and
    for engine code where it can happen (``reachability``, as case files hold it).

    A trace's finding: ``case`` is the trace (``config``, ``steps``, ``params``, as
    a trace case file's ``trace``) and ``step`` the step it fails at; ``derived``
    is then its failing step's, with one line per step (``derived["steps"]``)."""
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
    if step is not None:
        record["step"] = step
    if history_dependent:  # a single-step case that passes in a new process
        record["history_dependent"] = True
    if flaky:  # how often its replays in new processes failed
        record["flaky"] = dict(flaky)
    if reachability is not None:
        record["reachability"] = dict(reachability)
    return record


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
    traced: bool = False,
) -> dict[str, Any]:
    """One run's record. ``error`` is the one-line reason of a run with status "error";
    ``latent``: the run found something and every finding is latent; ``traced``: its
    examples were traces of one engine's steps (written only then).

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
    if traced:
        run["traced"] = True
    return run


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
    (:mod:`.timing`), written only when given.
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
