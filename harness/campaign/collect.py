"""Reading what the workers wrote: runs, deduplicated findings and harness events."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnfuzz.harness.campaign.document import run_record
from attnfuzz.harness.campaign.plan import Unit
from attnfuzz.harness.definitions import RunStatus, case_size, finding_id, merge_timelines
from attnfuzz.reports.document import is_latent

# Why a run that found nothing stopped short of its floor, most telling first.
WORKER_LOST = "its worker was lost"
NEVER_STARTED = "a shard never started"
INTERRUPTED = "stopped before its time was up"
TIME_BUDGET = "the time budget ended"
SEARCH_ENDED = "the search ended before its cap"
# A call ran past the per-example timeout, and its case passed under a longer one.
TOO_SLOW = "a call ran past --example-timeout and passed within a longer limit: too slow a machine"
# Workers start in seconds to a minute (torch, Triton, the targets): a shorter budget ends first.
BEFORE_READY = "the time budget ended before a worker was ready (a longer --budget gives one)"
# A timeout the budget left no time to judge again under a longer limit: no finding yet.
UNCONFIRMED = "a timeout the time budget ended before it was judged again"
SHORT_REASONS = (
    WORKER_LOST, NEVER_STARTED, BEFORE_READY, INTERRUPTED, TIME_BUDGET, SEARCH_ENDED, TOO_SLOW,
    UNCONFIRMED,
)  # fmt: skip


def run_floor(plan: dict[str, Any], items: list[dict[str, Any]]) -> int:
    """A run's example floor: the campaign's, at most the examples its shards may judge."""
    floor = plan.get("min_examples", 0)
    caps = [item.get("max_examples") for item in items]
    if caps and all(c is not None for c in caps):
        floor = min(floor, sum(caps))  # a run that judged its whole cap is complete
    return floor


def short_reason(state: dict[str, Any] | None, lost: bool) -> str:
    """Why one shard ended before it could judge more (see :data:`SHORT_REASONS`)."""
    if state is None:
        return NEVER_STARTED
    if lost:
        return WORKER_LOST
    deadline, end = state.get("deadline"), state.get("finished") or state["updated"]
    if state.get("status") == "interrupted" and (deadline is None or end < deadline):
        return INTERRUPTED
    return TIME_BUDGET if deadline is not None else SEARCH_ENDED


def worker_fault(scratch: Path, item_id: str) -> str:
    """How a lost worker died, from its own fault log (a harness event, not a verdict)."""
    from attnfuzz.harness.faults import describe_fault

    try:
        text = (scratch / "faults" / f"{item_id}.log").read_text(errors="replace")
    except OSError:
        text = ""
    fault = describe_fault(text)
    return fault[1] if fault else "killed without a Python fault report"


class Replays:
    """Cases a lost worker was judging, replayed once each in isolation.

    A worker is lost to what happens outside the implementation too (a
    SIGKILL, the machine's memory): its in-flight case is a finding only
    when it fails again, alone, in a fresh child.
    """

    def __init__(self, plan: dict[str, Any]):
        self.plan = plan
        self.verdicts: dict[str, Any] = {}

    def verdict(self, item_id: str, unit: Unit, case_dict: dict[str, Any]) -> Any:
        """The replay's verdict; a trace (``case_dict`` with ``steps``) is replayed
        step by step, in a new process."""
        if item_id not in self.verdicts:
            from attnfuzz.harness.campaign.findings import example_of
            from attnfuzz.harness.isolation import IsolatedJudge
            from attnfuzz.harness.registry import get_target
            from attnfuzz.reference.trace import Trace

            target = get_target(unit.target)
            impl = target.resolve(unit.impl)
            timeout = self.plan["example_timeout"]
            found = example_of(case_dict)
            with IsolatedJudge(target, impl, self.plan["device"], timeout) as judge:
                self.verdicts[item_id] = (
                    judge.judge_trace(found) if isinstance(found, Trace) else judge.judge(found)
                )
        return self.verdicts[item_id]


@dataclass
class Snapshot:
    """The campaign as its files say it is now."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # the harness's, not findings
    settled: int = 0  # work units that ended (done, error, interrupted, or died judging)


def collect(
    scratch: Path,
    plan: dict[str, Any],
    units: list[Unit],
    *,
    final: bool = False,
    interrupted: bool = False,
    pytest_status: str | None = None,
    replays: Replays | None = None,
) -> Snapshot:
    """Merge the work units' files into runs, deduplicated findings and events.

    A shard whose worker died (xdist's crash mark says so) has ended; the
    case it left in flight is replayed in isolation (``replays``) and is a
    finding if it fails there, else the loss is a ``worker-lost`` event.
    """
    from attnfuzz.harness.campaign.findings import failing_step
    from attnfuzz.harness.campaign.worker import read_json

    items_by_unit: dict[int, list[dict[str, Any]]] = {u: [] for u in range(len(units))}
    for item in plan["items"]:
        items_by_unit[item["unit"]].append(item)
    snap = Snapshot()
    for u, unit in enumerate(units):
        states, errors = [], []
        short: set[str] = set()  # why shards ended, should the run fall short of its floor
        settled_before = snap.settled
        keyed: dict[str, dict[str, Any]] = {}
        for item in items_by_unit[u]:
            state = read_json(scratch / "items" / f"{item['id']}.json")
            if state is None:
                if final and not interrupted and pytest_status is not None:
                    errors.append(f"shard {item['shard']} never ran ({pytest_status})")
                budget_ended = plan.get("deadline") and time.time() >= plan["deadline"]
                short.add(BEFORE_READY if budget_ended else short_reason(None, False))
                continue
            states.append(state)
            if state.get("status") != "running":
                snap.settled += 1
            if state.get("status") == RunStatus.ERROR:
                errors.append(state.get("error") or "the harness failed")
            found = list(state["findings"].values())
            lost = (scratch / "crashed" / item["id"]).exists()
            short.add(short_reason(state, lost and state.get("status") == "running"))
            if lost and state.get("status") == "running":  # the worker died: the shard ended
                snap.settled += 1
                inflight = read_json(scratch / "inflight" / f"{item['id']}.json")
                event = {
                    "event": "worker-lost",
                    "target": unit.target,
                    "implementation": unit.impl,
                    "shard": item["shard"],
                    "detail": worker_fault(scratch, item["id"]),
                }
                verdict = None
                if inflight is not None and replays is not None:
                    verdict = replays.verdict(item["id"], unit, inflight["case"])
                if verdict is not None and not verdict.ok:
                    count_dead_example(state, inflight, plan)
                    found.append(
                        {
                            "key": verdict.key,
                            "case": inflight["case"],
                            "verdict": {
                                "key": verdict.key,
                                "mismatches": [m.to_dict() for m in verdict.mismatches],
                            },
                            "examples_to_failure": inflight["examples"] + 1,
                            "seconds_to_failure": inflight["started"]
                            - (state.get("first_example") or inflight["started"]),
                            "found": inflight["started"],
                        }
                    )
                    if "steps" in inflight["case"]:  # a trace: the step it fails at
                        found[-1]["step"] = failing_step(inflight["case"], verdict)
                else:
                    event["detail"] += (
                        "; the case it was judging passed when replayed alone"
                        if verdict is not None
                        else "; it was between two cases"
                    )
                    snap.events.append(event)
            for f in found:
                known = keyed.get(f["key"])
                if known is None:
                    keyed[f["key"]] = dict(f)
                    continue
                first = min(known, f, key=lambda x: x["found"])
                small = min(known, f, key=lambda x: case_size(x["case"]))
                keyed[f["key"]] = small | {
                    k: first[k] for k in ("examples_to_failure", "seconds_to_failure", "found")
                }
        examples = sum(s["examples"] for s in states)
        seconds = sum(max(0.0, (s.get("finished") or s["updated"]) - s["started"]) for s in states)
        labels: dict[str, int] = {}
        for s in states:
            for label, count in s["labels"].items():
                labels[label] = labels.get(label, 0) + count
        ids = []
        for key, f in sorted(keyed.items(), key=lambda kv: kv[1]["found"]):
            fid = finding_id(unit.target, unit.impl, key)
            ids.append(fid)
            snap.findings[fid] = {
                "id": fid,
                "target": unit.target,
                "implementation": unit.impl,
                "key": key,
                "check": f["verdict"]["mismatches"][0]["check"],
                "case_file": f"cases/{fid}.json",
                "case": f["case"],
                "verdict": f["verdict"],
                "examples_to_failure": f["examples_to_failure"],
                "seconds_to_failure": round(f["seconds_to_failure"], 3),
                "found": f["found"],
            }
            if f.get("step") is not None:  # a trace: the step it fails at
                snap.findings[fid]["step"] = f["step"]
            if f.get("history_dependent"):  # passes in a new process
                snap.findings[fid]["history_dependent"] = True
            if f.get("flaky"):  # fails some of its replays, or none
                snap.findings[fid]["flaky"] = f["flaky"]
            if f.get("reachability") is not None:  # engine code, once its run has ended
                snap.findings[fid]["reachability"] = f["reachability"]
        status = (
            RunStatus.ERROR
            if errors
            else RunStatus.FAIL
            if ids
            else RunStatus.PASS
            if examples
            else RunStatus.NOT_RUN
        )
        running = snap.settled - settled_before < len(items_by_unit[u])
        floor = run_floor(plan, items_by_unit[u])
        why = None
        if any(st.get("slow") for st in states):  # a timeout no finding: no verdict either
            short = {TOO_SLOW}  # why its search ended early, too
        elif any(st.get("unconfirmed") for st in states):
            short = {UNCONFIRMED}
        # A run that judged nothing, or too little, says why (never a silent NOT RUN).
        if (
            final
            and status in (RunStatus.PASS, RunStatus.NOT_RUN)
            and (examples < floor or bool(short & {TOO_SLOW, UNCONFIRMED}))
        ):
            why = "; ".join(r for r in SHORT_REASONS if r in short)
        run = run_record(
            unit.target,
            unit.impl,
            unit.kind,
            examples=examples,
            seconds=seconds,
            status=status,
            labels=labels,
            timeline=merge_timelines([s["timeline"] for s in states]),
            findings=ids,
            error="; ".join(errors) if errors else None,
            min_examples=floor,
            incomplete=why,
            latent=bool(ids) and all(is_latent(snap.findings[fid]) for fid in ids),
            traced=unit.traced,
        )
        if not final:
            run["_running"] = running
            run["_started"] = min((s["started"] for s in states), default=None)
        snap.runs.append(run)
    return snap


def count_dead_example(
    state: dict[str, Any], inflight: dict[str, Any], plan: dict[str, Any]
) -> None:
    """The example a worker died on was judged too: its verdict is the replay's."""
    from attnfuzz.harness.campaign.findings import example_of
    from attnfuzz.harness.traces import trace_labels
    from attnfuzz.reference.trace import Trace
    from attnfuzz.strategies.batches import scenario_labels

    examples = max(state["examples"], inflight["examples"] + 1)
    end = max(state["updated"], inflight["started"])
    if examples > state["examples"]:
        found = example_of(inflight["case"])
        labels = trace_labels(found) if isinstance(found, Trace) else scenario_labels(found)
        for label in labels:
            state["labels"][label] = state["labels"].get(label, 0) + 1
    state["examples"], state["updated"] = examples, end
    state["timeline"].append([round(end - plan["started"], 3), examples])
