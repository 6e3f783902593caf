"""Showing a running campaign: plain lines, or a live table on a terminal."""

from __future__ import annotations

import time
from typing import TextIO

from attnfuzz.harness.campaign.collect import Snapshot
from attnfuzz.harness.campaign.timing import StartupState


def workers_text(n: int) -> str:
    return f"{n} worker" if n == 1 else f"{n} workers"


class StartupNotes:
    """The workers' start-up, said as it goes: before their first verdict a
    campaign is seconds of imports and first kernel calls, never silence."""

    def __init__(self, workers: int, started: float):
        self.workers, self.started = workers, started
        self.said_up = self.said_ready = False

    def stamp(self, now: float) -> str:
        return f"[{now - self.started:6.1f}s]"

    def begin(self, now: float) -> str:
        return (
            f"{self.stamp(now)} starting {workers_text(self.workers)}: each loads torch, "
            "Triton and the targets ..."
        )

    def lines(self, state: StartupState, now: float) -> list[str]:
        """What to say now that the workers are ``state``: each line once."""
        lines, who = [], workers_text(state.workers)
        if not self.said_up and state.all_up and not state.all_ready:
            self.said_up = True
            up = max(state.up.values()) - self.started
            what = "the first examples" if state.workers > 1 else "its first example"
            lines.append(
                f"{self.stamp(now)} {who} up after {up:.1f}s; judging {what} "
                "(forking a judging child, the first kernel calls) ..."
            )
        if not self.said_ready and state.all_ready:
            self.said_ready = self.said_up = True
            ready = max(state.ready.values()) - self.started
            lines.append(f"{self.stamp(now)} {who} ready (start-up {ready:.1f}s); fuzzing ...")
        return lines


def starting_text(startup: StartupState | None) -> str:
    """``starting: 1/2 workers ready`` while some worker has judged nothing yet."""
    if startup is None or startup.all_ready:
        return ""
    return f"starting: {len(startup.ready)}/{startup.workers} workers ready"


def to_floor(run: dict) -> int:
    """Examples a running run still owes its floor (0 once it reached it, or has none)."""
    return max(0, (run.get("min_examples") or 0) - run["examples"])


def remaining_text(snap: Snapshot, left: float | None) -> str:
    """What remains: the budget's seconds, or once it is spent, the floors still owed
    (a run that found nothing goes on to its floor whatever the clock says)."""
    if left is None:
        return ""
    if left > 0:
        return f", {left:.0f}s left"
    owing = [r for r in snap.runs if r.get("_running") and to_floor(r)]
    if not owing:
        return ", budget spent: finishing"
    runs = (
        "1 run finishing its floor"
        if len(owing) == 1
        else f"{len(owing)} runs finishing their floors"
    )
    return f", budget spent: {runs}, {sum(map(to_floor, owing))} examples to go"


class LineProgress:
    """Plain lines: findings as they come, a progress line every ``every`` seconds."""

    def __init__(self, stream: TextIO, every: float | None):
        self.stream, self.every, self.last = stream, every, time.monotonic()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def update(
        self,
        snap: Snapshot,
        elapsed: float,
        left: float | None,
        startup: StartupState | None = None,
    ) -> None:
        if self.every is None or time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        examples = sum(r["examples"] for r in snap.runs)
        done = sum(not r["_running"] for r in snap.runs)
        rest = remaining_text(snap, left)
        starting = starting_text(startup)
        starting += ", " if starting else ""
        self.say(
            f"[{elapsed:6.1f}s] {starting}{examples} examples, {len(snap.findings)} findings, "
            f"{done}/{len(snap.runs)} runs done{rest}"
        )


class LiveProgress:
    """A live table per target x implementation (rich), findings printed above it."""

    def __init__(self, title: str):
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.title = title
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def say(self, line: str) -> None:
        self.live.console.print(line, markup=False, highlight=False)

    def update(
        self,
        snap: Snapshot,
        elapsed: float,
        left: float | None,
        startup: StartupState | None = None,
    ) -> None:
        from rich.table import Table

        rest = remaining_text(snap, left)
        table = Table(title=f"{self.title} - {elapsed:.0f}s{rest}", title_justify="left")
        # Under the table: the title is as wide as the table already.
        table.caption, table.caption_justify = starting_text(startup) or None, "left"
        for name, justify in [
            ("target", "left"),
            ("implementation", "left"),
            ("kind", "left"),
            ("examples", "right"),
            ("failures", "right"),
            ("ex/s", "right"),
            ("time left", "right"),
        ]:
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        for u, run in enumerate(snap.runs):  # in the units' order
            if not run["_running"]:
                when = "done"
            elif run["_started"] is None:
                when = "waiting"
            elif startup is not None and u in startup.starting:
                when = "starting"  # no verdict yet: its judging child, the first kernel calls
            elif left is not None and left <= 0 and to_floor(run):
                when = f"floor: {to_floor(run)} to go"
            else:
                when = f"{left:.0f}s" if left is not None else "-"
            failures = str(len(run["findings"]))
            if run["findings"]:
                failures = f"[red]{failures}[/red]" if run["kind"] != "mutant" else failures
            table.add_row(
                run["target"],
                run["implementation"],
                run["kind"],
                str(run["examples"]),
                failures,
                f"{run['examples_per_second']:.1f}",
                when,
            )
        self.live.update(table)
