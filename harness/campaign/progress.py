"""Showing a running campaign: plain lines, or a live table on a terminal."""

from __future__ import annotations

import time
from typing import TextIO

from attnfuzz.harness.campaign.collect import Snapshot


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

    def update(self, snap: Snapshot, elapsed: float, left: float | None) -> None:
        if self.every is None or time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        examples = sum(r["examples"] for r in snap.runs)
        done = sum(not r["_running"] for r in snap.runs)
        rest = f", {left:.0f}s left" if left is not None else ""
        self.say(
            f"[{elapsed:6.1f}s] {examples} examples, {len(snap.findings)} findings, "
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

    def update(self, snap: Snapshot, elapsed: float, left: float | None) -> None:
        from rich.table import Table

        rest = f", {left:.0f}s left" if left is not None else ""
        table = Table(title=f"{self.title} - {elapsed:.0f}s{rest}", title_justify="left")
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
        for run in snap.runs:
            if not run["_running"]:
                when = "done"
            elif run["_started"] is None:
                when = "waiting"
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
