"""The worker side of a campaign: one work unit, fuzzed until its deadline.

A work unit (an *item* of the campaign's pytest run) is one shard of one
target x implementation. Its worker runs Hypothesis over and over with fresh
seeds until the unit's deadline or example cap, and keeps everything it learns
on disk as it goes, in the campaign's scratch directory, so that nothing is
lost whatever happens to the process:

- ``items/<id>.json``: progress (examples, scenario labels, a timeline) and
  every distinct finding, rewritten atomically a few times a second and at
  once when a finding is new or smaller;
- ``inflight/<id>.json``: the case being judged, written before the judge and
  removed after it. Left behind, it is the case the worker was judging when
  the worker itself was lost;
- ``faults/<id>.log``: :mod:`faulthandler`'s report of the worker itself.

Every case is judged in a child of the worker
(:class:`~attnfuzz.harness.isolation.IsolatedJudge`): an implementation that
raises, hangs past the per-example timeout, aborts or segfaults gives a
``exception``, ``timeout`` or ``crash`` verdict and the unit goes on. A worker
that dies all the same (killed from outside, out of memory) leaves its
in-flight case; the controller (:mod:`attnfuzz.harness.campaign`) replays it
in isolation, and files it as a finding only if it fails there too.

The search is :func:`attnfuzz.harness.engine.fuzz_test`'s, as for
``attnfuzz run``: each distinct failure (its :attr:`Verdict.key`) raises its
own subclass of :class:`Finding`, so that Hypothesis tells them apart
(``report_multiple_bugs``) and shrinks each.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from attnfuzz.harness.campaign.budget import item_deadline, shard_floor, share_spent
from attnfuzz.harness.campaign.findings import (
    confirm_findings,
    failing_step,
    place_findings,
    shrink_tied_findings,
)
from attnfuzz.harness.campaign.timing import hypothesis_phase, note_phase
from attnfuzz.harness.database import open_database
from attnfuzz.harness.definitions import case_size
from attnfuzz.harness.engine import Finding, fuzz_test
from attnfuzz.harness.errors import HarnessError
from attnfuzz.harness.isolation import IsolatedJudge, OutOfTime
from attnfuzz.harness.oracle import UNSHRUNK_CHECKS, Verdict
from attnfuzz.harness.runner import HarnessFailed
from attnfuzz.harness.settings import PROFILES, fuzz_settings
from attnfuzz.harness.traces import lived
from attnfuzz.reference.trace import Trace
from hypothesis import seed, settings

PLAN = "plan.json"


class _Stop(BaseException):
    """Ends a Hypothesis run at the unit's deadline. Not an ``Exception``, so
    Hypothesis lets it through rather than taking it for a failure to shrink."""


def round_seed(base: int, item: dict[str, Any], n: int) -> int:
    """The seed of round ``n`` of a derandomized unit: distinct per shard and round."""
    text = f"{base}/{item['target']}/{item['impl']}/{item['shard']}/{n}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def write_json(path: Path, doc: Any) -> None:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class ItemLog:
    """What one work unit has done so far, kept in ``items/<id>.json``."""

    def __init__(self, scratch: Path, item: dict[str, Any], campaign_started: float):
        self.path = scratch / "items" / f"{item['id']}.json"
        self.inflight = scratch / "inflight" / f"{item['id']}.json"
        self.origin = campaign_started
        now = time.time()
        self.state: dict[str, Any] = {
            "id": item["id"],
            "unit": item["unit"],
            "shard": item["shard"],
            "target": item["target"],
            "implementation": item["impl"],
            "kind": item.get("kind"),
            "traced": bool(item.get("traced")),  # its examples are traces of one engine
            "pid": os.getpid(),
            "status": "running",
            "started": now,
            "updated": now,
            "deadline": None,
            "first_example": None,  # when the first example was judged: failures are timed from it
            "worker": os.environ.get("PYTEST_XDIST_WORKER"),  # these four: timing.campaign_timing's
            "first_verdict": None,  # its start-up ends: judging child forked, first call done
            "shrinking": 0.0,
            "shrinking_since": None,
            "examples": 0,
            "labels": {},
            "timeline": [[round(now - self.origin, 3), 0]],
            "rounds": [],
            "findings": {},
            "error": None,
        }
        self.labels: Counter = Counter()
        self._last_write = 0.0
        self.flush()

    @property
    def examples(self) -> int:
        return self.state["examples"]

    def before(self, case_dict: dict[str, Any]) -> None:
        """The case about to be judged: what the controller reports if we die now."""
        now = time.time()
        if self.state["first_example"] is None:
            self.state["first_example"] = now
            self.flush()
        doc = {"case": case_dict, "examples": self.examples, "started": now}
        write_json(self.inflight, doc | {"pid": os.getpid()})

    def after(self) -> None:
        self.inflight.unlink(missing_ok=True)

    def judged(self, labels: list[str]) -> None:
        self.state["examples"] += 1
        self.labels.update(labels)
        first = self.state["first_verdict"] is None  # "workers ready" is said from it: at once
        self.state["first_verdict"] = self.state["first_verdict"] or time.time()
        self.flush(force=first)

    def found(self, case_dict: dict[str, Any], verdict: Verdict) -> None:
        """Keep the smallest case of each distinct failure; write it out at once. A
        trace's (``case_dict`` a trace's) keeps the step it fails at (``step``)."""
        now = time.time()
        known = self.state["findings"].get(verdict.key)
        if known is not None and case_size(case_dict) >= case_size(known["case"]):
            return
        entry = {
            "key": verdict.key,
            "case": case_dict,
            "verdict": {
                "key": verdict.key,
                "mismatches": [m.to_dict() for m in verdict.mismatches],
            },
            "examples_to_failure": self.examples,
            "seconds_to_failure": now - self.state["first_example"],
            "found": now,
        }
        if "steps" in case_dict:  # a trace: the step it fails at
            entry["step"] = failing_step(case_dict, verdict)
        if known is not None:  # a smaller case of a known failure: when it was first seen stays
            for field in ("examples_to_failure", "seconds_to_failure", "found"):
                entry[field] = known[field]
        self.state["findings"][verdict.key] = entry
        self.flush()

    def flush(self, force: bool = True) -> None:
        now = time.time()
        if not force and now - self._last_write < 0.25:
            return
        elapsed = now - self.origin
        timeline = self.state["timeline"]
        # A few points a second at most, fewer as a long campaign goes on.
        if timeline[-1][1] != self.examples and elapsed - timeline[-1][0] >= max(
            0.25, elapsed / 400
        ):
            timeline.append([round(elapsed, 3), self.examples])
        self.state["labels"] = dict(self.labels)
        self.state["updated"] = now
        write_json(self.path, self.state)
        self._last_write = now

    def finish(self, status: str, error: str | None = None) -> None:
        note_phase(self.state, "ended")
        elapsed = round(time.time() - self.origin, 3)
        if self.state["timeline"][-1][1] != self.examples:
            self.state["timeline"].append([elapsed, self.examples])
        self.state["status"], self.state["error"] = status, error
        self.state["finished"] = time.time()
        self.flush()


def _leaves(err: BaseException) -> list[BaseException]:
    if isinstance(err, BaseExceptionGroup):
        return [leaf for sub in err.exceptions for leaf in _leaves(sub)]
    return [err]


def run_item(scratch: Path, plan: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """Fuzz one work unit until its deadline or cap; returns its final state.

    An implementation's exception, hang or crash is a finding. What ends the
    unit as ``error`` is the harness failing (the implementation cannot be
    loaded, a reference raises): recorded, then raised again.
    """
    log = ItemLog(scratch, item, plan["started"])
    deadline = item_deadline(scratch, plan, item)
    log.state["deadline"] = deadline
    # The implementation runs in a child (IsolatedJudge); this report is of the
    # worker itself dying, which the controller tells apart from a finding.
    fault_file = (scratch / "faults" / f"{item['id']}.log").open("w")
    faulthandler.enable(file=fault_file)
    try:
        _run_rounds(log, plan, item, deadline)
    except KeyboardInterrupt:
        log.finish("interrupted")
        raise
    except HarnessError as err:  # its message names the file and line in attnfuzz
        log.finish("error", str(err))
        raise
    except BaseException as err:
        log.finish("error", "".join(traceback.format_exception_only(err)).strip())
        raise
    else:
        log.finish("done")
    finally:
        faulthandler.disable()
        fault_file.close()
    return log.state


def _run_rounds(
    log: ItemLog, plan: dict[str, Any], item: dict[str, Any], deadline: float | None
) -> None:
    from attnfuzz.harness.registry import add_mutants, get_target
    from attnfuzz.strategies.batches import SCALES

    # A user's mutants live in their module, not in this fresh process's registry.
    for spec in plan.get("mutants", []):
        add_mutants(spec)
    target = get_target(item["target"])
    impl = target.resolve(item["impl"])
    if item["max_examples"] == 0:
        return
    timeout = float(plan["example_timeout"])
    device = plan["device"]
    database = None if plan["derandomized"] else open_database(plan["database"])

    floor = shard_floor(plan, item)
    # The profile's default budget is soft (see campaign.run): the floor comes first.
    hard_deadline = None if plan.get("deadline_soft") else plan["deadline"]

    def out_of_time() -> bool:
        found = bool(log.state["findings"])
        return share_spent(time.time(), deadline, hard_deadline, log.examples, floor, found)

    # An implementation that lives across steps, or a --trace campaign: each example is a
    # trace of one engine's steps, judged in a new child (IsolatedJudge.judge_trace).
    traced = bool(item.get("traced"))

    def judge(case) -> Verdict:
        if out_of_time():
            raise _Stop
        findings = log.state["findings"].values()
        if cap is not None and findings:
            # Shrinking is held to a count, as attnfuzz run's: at most the cap after
            # the first failure (a trace's each costs a process).
            first = min(f["examples_to_failure"] for f in findings)
            if log.examples - first >= cap:
                raise _Stop
        case_dict = case.to_dict()
        note_phase(log.state, hypothesis_phase())  # a shrink's start: timed to the run's end
        log.before(case_dict)
        try:
            # The campaign's deadline bounds even a hanging call: the budget holds.
            if traced:
                return isolated.judge_trace(case, deadline=hard_deadline)
            return isolated.judge(case, deadline=hard_deadline)
        except OutOfTime:
            raise _Stop from None
        except HarnessError as err:  # attnfuzz's own fault: through Hypothesis, unshrunk
            raise HarnessFailed(err) from err
        finally:
            log.after()

    # What the judging child ran up to each failure's first appearance (single steps):
    # its replay tells a history-dependent failure from a flaky one (harness.confirm).
    histories: dict[str, list[Any]] = {}

    def record(case, verdict: Verdict, labels: list[str]) -> None:
        log.judged(labels)
        if not verdict.ok:
            if not traced:
                histories.setdefault(verdict.key, list(isolated.history))
            log.found(lived(case, verdict).to_dict(), verdict)
            if verdict.key in UNSHRUNK_CHECKS:
                raise _Stop  # a hang ends the unit as it ends `attnfuzz run`: unshrunk

    profile = PROFILES[plan["profile"]]
    cap: int | None = item["max_examples"]
    # Every case is judged in a child of this worker: what the implementation
    # does to its process is a finding, never the end of the unit.
    with IsolatedJudge(target, impl, device, timeout) as isolated:
        n = 0
        while not out_of_time():
            # The corpus is replayed once, first; later runs look for new failures
            # (Hypothesis skips generation while replayed failures still fail).
            test = fuzz_test(
                target,
                impl,
                settings=fuzz_settings(
                    settings.get_profile(profile.hypothesis_profile),
                    max_examples=cap if cap is not None else profile.round_examples,
                    database=database,
                    reuse=n == 0,
                ),
                judge=judge,
                scale=SCALES[plan["scale"]],
                on_case=record,
                traced=traced,
            )
            if plan["derandomized"]:
                test = seed(round_seed(plan["seed"] or 0, item, n))(test)
            # else Hypothesis draws the seed: an explicit @seed would turn its database off.
            before = len(log.state["findings"])
            try:
                test()
            except _Stop:
                break
            except HarnessFailed as failed:
                raise failed.args[0] from None
            except BaseException as err:
                # Findings were recorded as they came; anything else is the harness's.
                if not all(isinstance(leaf, Finding) for leaf in _leaves(err)):
                    raise
            finally:  # the seed that replays this Hypothesis run, for the record
                note_phase(log.state, "ended")
                used = getattr(test, "_hypothesis_internal_use_seed", None)
                used = used or getattr(test, "_hypothesis_internal_use_generated_seed", None)
                log.state["rounds"].append(used)
            n += 1
            if cap is not None:
                break  # --max-examples: one Hypothesis run, as `attnfuzz run`
            if impl.kind == "mutant" and len(log.state["findings"]) > before:
                break  # the zoo asks whether a mutant is caught: it is
        # A history-dependent finding's history as a trace: cut within this count.
        history_cap = cap if cap is not None else profile.round_examples
        if traced:  # as `attnfuzz run`'s: the moves Hypothesis cannot make, within it too

            def judge_tied(trace: Trace) -> Verdict:
                if out_of_time():
                    raise _Stop
                log.before(trace.to_dict())
                try:
                    return isolated.judge_trace(trace, deadline=hard_deadline)
                except OutOfTime:
                    raise _Stop from None
                finally:
                    log.after()

            try:
                shrink_tied_findings(log, target, impl, judge_tied, history_cap)
            except _Stop:  # the unit's deadline: each finding keeps its smallest so far
                pass
        confirm_findings(log, isolated, histories, hard_deadline, target, history_cap)
        place_findings(
            log,
            target,
            impl,
            lambda c: isolated.judge(c, deadline=hard_deadline),
            lambda t: isolated.judge_trace(t, deadline=hard_deadline),
        )
