"""The campaign document (``campaign.json``): checking it, reading verdicts off it.

It is built by :mod:`attnfuzz.harness.campaign.document`; the reports render it.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnfuzz.harness.casefile import load_json
from attnfuzz.harness.definitions import (
    CAMPAIGN_FAIL,
    CAMPAIGN_INCOMPLETE,
    CAMPAIGN_LATENT,
    CAMPAIGN_PASS,
    CAMPAIGN_SCHEMA,
    CAUGHT,
    ERROR,
    FAIL,
    INCOMPLETE,
    LATENT,
    NOT_RUN,
    PASS,
    SURVIVED,
    RunStatus,
)
from attnfuzz.harness.errors import UsageError, one_line  # noqa: F401 (one_line: for the reports)
from attnfuzz.harness.oracle import UNSHRUNK_CHECKS
from attnfuzz.harness.reachability import is_latent as latent_reachability
from attnfuzz.harness.reachability import reachability_lines
from attnfuzz.harness.schemas import validate

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


# -- reading a finding -----------------------------------------------------------


def case_label(finding: Mapping[str, Any]) -> str:
    """How a report names a finding's case: minimized, unless it hung (never shrunk)."""
    what = "trace" if is_trace(finding) else "case"
    if finding.get("check") in UNSHRUNK_CHECKS:
        return f"{what} as it ran (not shrunk: it hung)"
    return f"minimized {what}"


def is_trace(finding: Mapping[str, Any]) -> bool:
    """The finding's case is a trace of one engine's steps (its ``step`` says which fails)."""
    return finding.get("step") is not None and isinstance(finding["case"].get("steps"), list)


# How a report marks each step of a trace, as ``attnfuzz repro`` prints them.
STEP_OK, STEP_FAILS, STEP_NOT_RUN = "ok", "FAILS", "not run"


def trace_steps(finding: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A trace finding's steps, in order: each its index ``k``, its ``batch`` (as the
    case file holds it), its ``summary`` line (``derived.steps[k]``, else made from
    the batches) and its ``mark`` (:data:`STEP_OK` before the failing step,
    :data:`STEP_FAILS` at it, :data:`STEP_NOT_RUN` after); [] for a case on its own."""
    if not is_trace(finding):
        return []
    steps, failed = finding["case"]["steps"], finding["step"]
    lines = (finding.get("derived") or {}).get("steps")
    if not (isinstance(lines, list) and len(lines) == len(steps)):
        lines = _summaries(steps)
    out = []
    for k, (batch, summary) in enumerate(zip(steps, lines, strict=True)):
        mark = STEP_OK if k < failed else STEP_FAILS if k == failed else STEP_NOT_RUN
        out.append({"k": k, "batch": batch, "summary": str(summary), "mark": mark})
    return out


def _summaries(steps: list[Any]) -> list[str]:
    """Each step's line (:func:`~attnfuzz.reference.trace.step_summary`), for a finding
    whose ``derived`` lacks them; a step that is no batch has none."""
    from attnfuzz.reference.batch import Batch
    from attnfuzz.reference.trace import step_summary

    out, prev = [], None
    for step in steps:
        try:
            batch = Batch.from_dict(step)
            out.append(step_summary(prev, batch))
        except (KeyError, TypeError, ValueError, AttributeError):
            batch = None
            out.append("")
        prev = batch
    return out


def step_rows(batch: Mapping[str, Any]) -> list[list[Any]]:
    """A step's requests, one row each: request id, q_len, num_computed_tokens,
    seq_len, pages and how many of them are new this step (blank where the step
    does not say: a step on its own)."""
    q_lens = list(batch.get("q_lens") or [])
    computed = list(batch.get("num_computed_tokens") or [])
    ids = list(batch.get("req_ids") or range(len(q_lens)))
    pages = list(batch.get("pages") or [])
    new = list(batch.get("new_pages") or [])
    rows = []
    for r, q in enumerate(q_lens):
        c = computed[r] if r < len(computed) else None
        rows.append(
            [
                ids[r] if r < len(ids) else r,
                q,
                "" if c is None else c,
                "" if c is None else c + q,
                json.dumps(pages[r]) if r < len(pages) else "",
                new[r] if r < len(new) else "",
            ]
        )
    return rows


STEP_COLUMNS = ["request", "q_len", "num_computed_tokens", "seq_len", "pages", "new pages"]
"""The header of :func:`step_rows`."""


def step_extras(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A step's fields other than its requests' (seed, use_cudagraph, ...)."""
    per_request = {"q_lens", "num_computed_tokens", "req_ids", "pages", "new_pages"}
    return {k: v for k, v in batch.items() if k not in per_request}


def trace_setting(finding: Mapping[str, Any]) -> dict[str, Any]:
    """A trace finding's case less its steps: the engine config and the parameters."""
    return {k: v for k, v in finding["case"].items() if k != "steps"}


def step_derived(finding: Mapping[str, Any]) -> dict[str, Any]:
    """``derived`` less the step lines: a trace's is its failing step's quantities."""
    return {k: v for k, v in (finding.get("derived") or {}).items() if k != "steps"}


def trace_text(finding: Mapping[str, Any]) -> list[str]:
    """A trace finding's steps as plain lines, as ``attnfuzz run`` prints them: the
    config, then each step's mark and summary line and its batch."""
    setting = trace_setting(finding)
    lines = [f"{k}: " + json.dumps(v) for k, v in setting.items()]  # config, params
    for step in trace_steps(finding):
        lines.append(f"step {step['k']} [{step['mark']}]: {step['summary']}")
        lines.append("  " + json.dumps(step["batch"]))
    derived = step_derived(finding)
    if derived:
        lines.append(f"derived (step {finding['step']}): " + json.dumps(derived))
    return lines


def is_latent(finding: Mapping[str, Any]) -> bool:
    """The finding's engine code fails only where a FULL graph replays (see
    ``harness.reachability``)."""
    return latent_reachability(finding.get("reachability"))


def reachability_text(finding: Mapping[str, Any]) -> list[str]:
    """Where the finding can happen, as ``run`` and ``repro`` print it; [] for
    attnfuzz's own code (or a document older than reachability)."""
    reach = finding.get("reachability")
    return reachability_lines(reach) if reach else []


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
    for i, f in enumerate(doc["findings"]):
        steps = f["case"].get("steps")
        if "step" in f and not (isinstance(steps, list) and f["step"] < len(steps)):
            has = f"a trace of {len(steps)} steps" if isinstance(steps, list) else "no trace"
            raise UsageError(f"{where}: findings[{i}].step is {f['step']}; its case is {has}")
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
    """The run found nothing and judged fewer examples than its floor, or says why it
    has no verdict (``incomplete``: a timeout that a longer limit passed)."""
    short = run["examples"] < run.get("min_examples", 0) or bool(run.get("incomplete"))
    return run["status"] == RunStatus.PASS and short


def run_verdict(run: Mapping[str, Any]) -> str:
    """``caught``/``survived`` for a mutant, ``pass``/``FAIL`` otherwise (``LATENT``: every
    finding latent, see :func:`is_latent`); ``ERROR`` when
    the run could not go on, ``not run`` when it judged no example at all,
    ``INCOMPLETE`` when it found nothing short of its floor (``min_examples``)."""
    if run["status"] == RunStatus.ERROR:
        return ERROR
    if run["status"] == RunStatus.NOT_RUN or (
        run["examples"] == 0 and run["status"] == RunStatus.PASS
    ):
        return NOT_RUN
    if below_floor(run):  # a failure counts at any count; a pass or a miss only at the floor
        return INCOMPLETE
    if run["kind"] == "mutant":
        return CAUGHT if run["status"] == RunStatus.FAIL else SURVIVED
    if run["status"] == RunStatus.FAIL and run.get("latent"):
        return LATENT  # a defect, though no step of the engine runs it on such metadata
    return PASS if run["status"] == RunStatus.PASS else FAIL


def no_verdict(run: Mapping[str, Any]) -> bool:
    """The run says nothing: it judged no example, or too few to pass or survive."""
    return run_verdict(run) in (NOT_RUN, INCOMPLETE)


def no_verdict_text(run: Mapping[str, Any]) -> str:
    """Why a run has no verdict, for a report: ``incomplete: 120 of 200 examples, ...``,
    or ``not run: the time budget ended before a worker was ready``; else empty."""
    verdict = run_verdict(run)
    if verdict == INCOMPLETE:
        return incomplete_text(run)
    if verdict == NOT_RUN and run.get("incomplete"):
        return f"not run: {run['incomplete']}"
    return ""


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


def outcome_counts(campaign: Mapping[str, Any]) -> tuple[str, bool]:
    """The one wording of a campaign's counts, shared by the console, summary.md and
    report.html: ``2 findings`` (failures of what must pass), then, where mutants ran,
    ``3 of 4 mutants caught`` (runs, not their findings); and whether any mutant ran."""
    findings = sum(not expected_finding(campaign, f) for f in campaign["findings"])
    mutants = [r for r in campaign["runs"] if r["kind"] == "mutant"]
    text = plural(findings, "finding")
    if mutants:
        caught = sum(run_verdict(r) == CAUGHT for r in mutants)
        text += f", {caught} of {plural(len(mutants), 'mutant')} caught"
    return text, bool(mutants)


def no_finding_text(campaign: Mapping[str, Any]) -> str:
    """What the findings section says when it has none."""
    if any(r["kind"] == "mutant" for r in campaign["runs"]):
        return "No implementation other than the mutants failed."
    return "No implementation failed."


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
