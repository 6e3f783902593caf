"""Where a campaign's wall time went: start-up, fuzzing, shrinking and the rest.

A worker notes in its unit's file (``items/<id>.json``, see
:class:`~attnfuzz.harness.campaign.worker.ItemLog`) when the unit started,
its first verdict and its seconds of shrinking (:func:`note_phase`). The
controller reads the files (:func:`item_states`) to say the start-up as it
goes (:func:`startup_state`) and to account for the time at the end
(:func:`campaign_timing`, :func:`run_timing`). Both sides import this module,
which imports nothing of theirs (a worker starts no faster for it).

Each worker's time, from the campaign's start to its end, is split into four
parts that add up to the campaign's wall time:

- **start-up**: until the worker judged its first example (its process
  started and imported torch, Triton, the engine and the targets; its first
  unit forked a judging child and made the first kernel calls); for each later
  unit on it, from the unit's start to its first verdict; after a worker was
  lost, until its replacement's unit started;
- **shrinking**: Hypothesis' shrink phase, from its first case to the end of
  its run (the final replay of each failure included);
- **fuzzing**: the rest of each unit, from its first verdict to its end;
- **other**: between two units of one worker, and from its last unit's end to
  the campaign's end (waiting for the other workers, writing the reports).

The campaign's parts are the means over its workers, so they too add up to
its wall time. A run's parts are its units' (start to end, no "other"): they
add up to the run's ``seconds``.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTS = ("startup", "fuzzing", "shrinking", "other")


# -- the worker's side -------------------------------------------------------------------


def hypothesis_phase() -> str | None:
    """The phase of the Hypothesis run judging a case: ``generate``, ``shrink``... or None.

    Hypothesis tells a case's phase only to observability callbacks (a record
    per case, costly); this reads it where Hypothesis itself does for them
    (``StateForActualGivenExecution._runner._current_phase``), in about 10 us.
    None where not found: a Hypothesis without it, or a failure's final replay.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_execute_once_for_engine":
            runner = getattr(frame.f_locals.get("self"), "_runner", None)
            phase = getattr(runner, "_current_phase", None)
            return phase if isinstance(phase, str) else None
        frame = frame.f_back
    return None


def note_phase(state: dict[str, Any], phase: str | None) -> None:
    """A unit's ``state`` told the phase of its next case, or ``"ended"`` when a
    Hypothesis run ended: a shrink runs from its first case to its run's end (the
    failures' final replays included)."""
    since = state.get("shrinking_since")
    if phase == "shrink" and since is None:
        state["shrinking_since"] = time.time()
    elif phase == "ended" and since is not None:
        state["shrinking"] = state.get("shrinking", 0.0) + max(0.0, time.time() - since)
        state["shrinking_since"] = None


# -- the controller's side ---------------------------------------------------------------


@dataclass
class Parts:
    """Seconds in each part of :data:`PARTS`."""

    startup: float = 0.0
    fuzzing: float = 0.0
    shrinking: float = 0.0
    other: float = 0.0

    def add(self, other: Parts) -> None:
        for name in PARTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def record(self, names: tuple[str, ...] = PARTS) -> dict[str, float]:
        return {name: round(getattr(self, name), 3) for name in names}


def item_states(scratch: Path) -> list[dict[str, Any]]:
    """Every work unit's state as its worker last wrote it (units not started yet: none)."""
    from attnfuzz.harness.campaign.worker import read_json

    states = (read_json(p) for p in sorted((scratch / "items").glob("*.json")))
    return [s for s in states if isinstance(s, dict)]


def worker_of(state: dict[str, Any]) -> str:
    return state.get("worker") or f"pid {state.get('pid')}"


def unit_parts(state: dict[str, Any], start: float, end: float) -> Parts:
    """One unit's time within ``[start, end]``: start-up to its first verdict, then
    shrinking and fuzzing. ``end`` bounds a unit whose worker was lost (its last write)."""
    s = min(max(state["started"], start), end)
    e = min(max(state.get("finished") or state["updated"], s), end)
    verdict = state.get("first_verdict")
    ready = e if verdict is None else min(max(verdict, s), e)
    shrinking = state.get("shrinking", 0.0)
    if state.get("shrinking_since") is not None:  # a shrink cut short with its worker
        shrinking += max(0.0, e - state["shrinking_since"])
    shrinking = min(shrinking, e - ready)
    return Parts(startup=ready - s, fuzzing=e - ready - shrinking, shrinking=shrinking)


def run_timing(states: list[dict[str, Any]], unit: int, seconds: float) -> dict[str, float] | None:
    """A run's parts (its shards' sums), as its record in ``campaign.json`` has them:
    fuzzing takes the rest of its ``seconds`` (the example a lost worker died on)."""
    parts, any_state = Parts(), False
    for state in states:
        if state.get("unit") == unit:
            end = state.get("finished") or state["updated"]
            parts.add(unit_parts(state, state["started"], end))
            any_state = True
    if not any_state:
        return None
    fuzzing = round(max(0.0, seconds - round(parts.startup, 3) - round(parts.shrinking, 3)), 3)
    return {**parts.record(("startup",)), "fuzzing": fuzzing, **parts.record(("shrinking",))}


def worker_slots(states: list[dict[str, Any]], workers: int) -> list[list[dict[str, Any]]]:
    """The units each of the ``workers`` ran, in order of their start.

    xdist names its workers ``gw0`` to ``gw{N-1}``, and one that replaces a lost
    worker ``gwN`` and on: its units go on the slot of the worker lost first.
    """
    slots: list[list[dict[str, Any]]] = [[] for _ in range(max(workers, 1))]
    slot_of: dict[str, int] = {}

    def end_of(i: int) -> float:
        return max((s.get("finished") or s["updated"] for s in slots[i]), default=float("-inf"))

    for state in sorted(states, key=lambda s: s["started"]):
        name = worker_of(state)
        if name not in slot_of:
            n = int(name[2:]) if re.fullmatch(r"gw\d+", name) else None
            taken = set(slot_of.values())
            free = [i for i in range(len(slots)) if not slots[i] and i not in taken]
            lost = [i for i in range(len(slots)) if slots[i] and not slots[i][-1].get("finished")]
            if n is not None and n < len(slots):
                slot_of[name] = n
            elif n is not None and lost:
                slot_of[name] = min(lost, key=end_of)
            else:  # not named by xdist: a free slot while there is one
                slot_of[name] = free[0] if free else min(range(len(slots)), key=end_of)
        slots[slot_of[name]].append(state)
    return slots


def slot_parts(units: list[dict[str, Any]], start: float, end: float) -> tuple[Parts, float | None]:
    """One worker's parts over ``[start, end]`` (they add up to ``end - start``), and
    when it judged its first example (None: never)."""
    parts, t, pid, ready = Parts(), start, None, None
    for state in units:
        s = min(max(state["started"], t), end)
        gap = s - t
        if state.get("pid") != pid:  # a process starting (the first, or a replacement)
            parts.startup += gap
        else:
            parts.other += gap
        part = unit_parts(state, s, end)
        parts.add(part)
        if ready is None and state.get("first_verdict") is not None:
            ready = s + part.startup
        t, pid = s + part.startup + part.fuzzing + part.shrinking, state.get("pid")
    if not units:  # never started a unit: it never judged an example
        parts.startup += end - t
    else:
        parts.other += end - t
    return parts, ready


def campaign_timing(
    states: list[dict[str, Any]], workers: int, started: float, finished: float
) -> dict[str, Any]:
    """``campaign.json``'s ``timing``: the means over the workers of their parts,
    ``ready`` (seconds from the start until every worker had judged its first
    example; None if one never did) and each worker's own."""
    total, per_worker, ready_at = Parts(), [], []
    for units in worker_slots(states, workers):
        parts, ready = slot_parts(units, started, finished)
        total.add(parts)
        ready_at.append(ready)
        names = list(dict.fromkeys(worker_of(s) for s in units))  # two: one was replaced
        per_worker.append({"names": names, **parts.record(), "ready": rel(ready, started)})
    n = len(per_worker)
    mean = Parts(*(getattr(total, name) / n for name in PARTS))
    doc: dict[str, Any] = mean.record(PARTS[:3])
    # "other" takes the rounding: the parts add up to the rounded wall time exactly.
    doc["other"] = round(max(0.0, round(finished - started, 3) - sum(doc.values())), 3)
    times = [t for t in ready_at if t is not None]
    doc["ready"] = rel(max(times), started) if len(times) == len(ready_at) else None
    doc["per_worker"] = per_worker
    return doc


def rel(t: float | None, started: float) -> float | None:
    return None if t is None else round(t - started, 3)


@dataclass
class StartupState:
    """How far the workers' start-up has got, for the progress display."""

    workers: int  # that can start: the campaign's, at most one per work unit
    up: dict[str, float] = field(default_factory=dict)  # worker -> its first unit's start
    ready: dict[str, float] = field(default_factory=dict)  # worker -> its first verdict
    starting: set[int] = field(default_factory=set)  # runs started, none judged yet

    @property
    def all_up(self) -> bool:
        return len(self.up) >= self.workers

    @property
    def all_ready(self) -> bool:
        return len(self.ready) >= self.workers


def startup_state(states: list[dict[str, Any]], workers: int, items: int) -> StartupState:
    """The start-up from the units' ``states``, of ``workers`` sharing ``items`` units."""
    state = StartupState(workers=min(workers, items) if items else workers)
    judged: set[int] = set()
    for s in states:
        name = worker_of(s)
        state.up[name] = min(state.up.get(name, s["started"]), s["started"])
        if s.get("first_verdict") is not None:
            state.ready[name] = min(state.ready.get(name, s["first_verdict"]), s["first_verdict"])
            judged.add(s["unit"])
        elif s.get("status") == "running":
            state.starting.add(s["unit"])
    state.starting -= judged
    return state
