"""What a campaign unit makes of its findings once its search has ended: each is
replayed in new processes (:func:`confirm_findings`, the policy of
:mod:`attnfuzz.harness.confirm`) and placed where the engine runs its code
(:func:`place_findings`); and how a finding's recorded case reads back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnfuzz.harness.oracle import UNSHRUNK_CHECKS, Check, Verdict
from attnfuzz.harness.traces import lived
from attnfuzz.reference.trace import Trace

ItemLog = Any  # harness.campaign.worker.ItemLog (which imports this module)


def confirm_findings(
    log: ItemLog,
    isolated: Any,
    histories: dict[str, list[Any]],
    deadline: float | None,
    target: Any = None,
    max_judgements: int = 0,
) -> None:
    """Replay each finding in new processes (:func:`~attnfuzz.harness.confirm.confirm`),
    as ``attnfuzz run`` does: one that fails only after what ran before it becomes the
    trace its history is, cut down within ``max_judgements`` traces judged
    (:func:`~attnfuzz.harness.history_trace.trace_after_history`; ``from_history``: the
    steps of that history), else is marked ``history_dependent``; one that comes
    and goes ``flaky`` (how often it failed), a
    timeout that a longer limit passes is no finding (``slow``: the run is
    incomplete), and a timeout that a longer limit turns into another failure is
    that failure. A budget that ends first leaves a finding as it was found."""
    from attnfuzz.harness.confirm import Status, confirm
    from attnfuzz.harness.history_trace import trace_after_history
    from attnfuzz.harness.isolation import OutOfTime
    from attnfuzz.harness.oracle import Mismatch

    findings = log.state["findings"]
    for key, entry in list(findings.items()):
        if "confirmed" in entry:
            continue
        found = example_of(entry["case"])
        verdict = Verdict(
            [Mismatch(**m) for m in entry["verdict"]["mismatches"]], step=entry.get("step")
        )
        try:
            c = confirm(isolated, found, verdict, histories.get(key, []), deadline)
        except OutOfTime:  # the budget ended first: not known, and not claimed
            if key == Check.TIMEOUT:  # a timeout judged only once says nothing yet
                del findings[key]
                log.state["unconfirmed"] = log.state.get("unconfirmed", 0) + 1
            continue
        if c.status is Status.HISTORY_DEPENDENT and target is not None:
            try:
                replayed = trace_after_history(
                    target, isolated, histories[key], verdict, max_judgements, deadline
                )
            except OutOfTime:  # the budget ended first: history-dependent, as confirmed
                replayed = None
            if replayed is not None:
                history, c = replayed
                entry["case"] = history.trace.to_dict()
                entry["step"] = failing_step(entry["case"], history.verdict)
                entry["verdict"] = {
                    "key": history.verdict.key,
                    "mismatches": [m.to_dict() for m in history.verdict.mismatches],
                }
                entry["from_history"] = history.lived
        entry["confirmed"] = c.status.value
        if c.status is Status.SLOW:
            del findings[key]
            log.state["slow"] = log.state.get("slow", 0) + 1
        elif c.status is Status.HISTORY_DEPENDENT:
            entry["history_dependent"] = True
        elif c.status is Status.FLAKY:
            entry["flaky"] = c.flaky_record()
        elif c.verdict is not verdict:  # a timeout that a longer limit made a verdict
            del findings[key]
            entry["key"] = c.verdict.key
            entry["verdict"] = {
                "key": c.verdict.key,
                "mismatches": [m.to_dict() for m in c.verdict.mismatches],
            }
            findings.setdefault(c.verdict.key, entry)
    log.flush()


def place_findings(
    log: ItemLog, target: Any, impl: Any, judge: Any, judge_trace: Any = None
) -> None:
    """Where each finding on engine code can happen (``harness.reachability``), in its
    entry: judged by this unit's isolated child, once its search has ended. A trace's
    is its failing step's, judged after the steps before it (``judge_trace``), as
    ``attnfuzz run`` computes it (:func:`~attnfuzz.harness.traces.reachable_step`)."""
    if impl.engine is None or not log.state["findings"]:
        return
    from attnfuzz.harness.reachability import finding_reachability
    from attnfuzz.harness.runner import RunResult
    from attnfuzz.harness.traces import reachable_step

    for entry in log.state["findings"].values():
        if entry.get("key") == Check.TIMEOUT:  # how fast this machine runs it: no reachability
            continue
        found = example_of(entry["case"])
        verdict = Verdict(step=entry.get("step"))  # a trace's failing step, else None
        result = RunResult(target.name, impl.name, case=found, verdict=verdict)
        reach = finding_reachability(target, impl, *reachable_step(result, judge_trace, judge))
        if reach is not None:
            entry["reachability"] = reach.to_dict()
    log.flush()


def example_of(case_dict: dict[str, Any]) -> Any:
    """The case a finding's (or an in-flight) ``case`` holds: a
    :class:`~attnfuzz.reference.trace.Trace` when it has ``steps``, else a
    :class:`~attnfuzz.reference.batch.Case`."""
    from attnfuzz.reference.batch import Case
    from attnfuzz.reference.trace import Trace

    return Trace.from_dict(case_dict) if "steps" in case_dict else Case.from_dict(case_dict)


def failing_step(trace_dict: dict[str, Any], verdict: Verdict) -> int:
    """The step a trace fails at: its verdict's, else (a child that crashed or hung
    says no step) its last, as its case file records it
    (:func:`~attnfuzz.harness.casefile.case_document`)."""
    return verdict.step if verdict.step is not None else len(trace_dict["steps"]) - 1


def shrink_tied_findings(
    log: Any, target: Any, impl: Any, judge_trace: Callable[[Trace], Verdict], budget: int
) -> None:
    """Each traced finding shrunk further by the moves Hypothesis cannot make
    (:func:`~attnfuzz.harness.trace_shrink.shrink_tied`), at most ``budget``
    judgements each; a smaller failing trace replaces the finding's case at once, so
    that whatever ``judge_trace`` raises to end the unit (its deadline) keeps it."""
    from attnfuzz.harness.trace_shrink import shrink_tied

    for key in list(log.state["findings"]):
        case = log.state["findings"][key]["case"]
        if "steps" not in case or key in UNSHRUNK_CHECKS:
            continue

        def fails(candidate: Trace, key: str = key) -> Verdict | None:
            verdict = judge_trace(candidate)
            log.judged([])
            if verdict.ok or verdict.key != key:
                return None
            log.found(lived(candidate, verdict).to_dict(), verdict)
            return verdict

        shrink_tied(target, Trace.from_dict(case), fails, budget, impl)
