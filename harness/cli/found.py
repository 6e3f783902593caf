"""What ``attnfuzz run`` makes of a failure of its search: its replays in new
processes (:class:`Found`, the policy of :mod:`attnfuzz.harness.confirm`), and a
history-dependent one's history, said and written (:func:`report_history`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from attnfuzz.harness.confirm import Confirmation
    from attnfuzz.harness.runner import RunResult
    from attnfuzz.reference.batch import Case


class Found:
    """A failure of the search, and what its replays in new processes made of it
    (:func:`~attnfuzz.harness.confirm.confirm`)."""

    def __init__(self, result: RunResult):
        self.result = result
        self.confirmation: Confirmation | None = None  # None: not replayed (interrupted)
        self.reach: Any = None

    def confirm(self, isolated: Any, history: list[Case]) -> None:
        from attnfuzz.harness.confirm import confirm

        r = self.result
        assert r.case is not None and r.verdict is not None
        self.confirmation = confirm(isolated, r.case, r.verdict, history)

    @property
    def reportable(self) -> bool:
        """Whether it has reachability: a finding on the engine's code that is not a
        timeout (where code runs says nothing of how fast this machine runs it)."""
        from attnfuzz.harness.confirm import Status
        from attnfuzz.harness.oracle import Check

        c = self.confirmation
        return (
            c is not None
            and c.status in (Status.CONFIRMED, Status.FLAKY)
            and c.verdict.key != Check.TIMEOUT
        )

    def lines(self, timeout: float) -> list[str]:
        """What the replays said, for the console."""
        from attnfuzz.harness.confirm import Status
        from attnfuzz.harness.oracle import Check

        c, r = self.confirmation, self.result
        if c is None:
            return []
        what = "trace" if r.traced else "case"
        out = []
        if r.flaky:
            out.append("Hypothesis' own replay of the failure passed: it does not always recur")
        if c.timeout_s is not None:
            again = (
                "no verdict either"
                if c.verdict.key == Check.TIMEOUT
                else f"it failed [{c.verdict.key}]"
            )
            out.append(
                f"no verdict within {timeout:g}s; judged again in a new process within "
                f"{c.timeout_s:g}s: {again}"
            )
        elif c.status is Status.FLAKY:
            out.append(
                f"it failed {c.failed} of {c.replays} replays of the same {what}, each in a new "
                "process" + ("" if c.failed else ", and what ran before it does not bring it back")
            )
        else:
            out.append(f"confirmed: it failed again in each of {c.replays} new processes")
        return out


class HistoryDependent:
    """A single-step failure that a new process does not reproduce: the minimized case,
    its verdict where it failed, and the cases the judging process ran before it."""

    def __init__(self, result: RunResult, before: list[Case]):
        assert result.case is not None and result.verdict is not None
        self.case, self.verdict = result.case, result.verdict
        self.examples_to_failure = result.examples_to_failure
        self.before = before  # oldest first; the last is the case that first failed


def report_history(target: str, impl: str, found: HistoryDependent, out: Path) -> Path | None:
    """Say that the failure is history-dependent and write what preceded it."""
    from attnfuzz.harness.casefile import write_new_case
    from attnfuzz.harness.definitions import finding_id

    print(
        f"HISTORY-DEPENDENT {target} / {impl}  [{found.verdict.key}]: the minimized case "
        "fails after other examples ran in the same process, and passes in a new one"
    )
    print(
        f"  the first failure came after {found.examples_to_failure} examples; the "
        f"{len(found.before)} the process judged up to it, oldest first:"
    )
    for case in found.before[-4:]:
        print("    " + json.dumps(case.to_dict()))
    doc = {
        "target": target,
        "implementation": impl,
        "history_dependent": True,
        "verdict": {
            "key": found.verdict.key,
            "mismatches": [m.to_dict() for m in found.verdict.mismatches],
        },
        "minimized_case": found.case.to_dict(),
        "preceding": [case.to_dict() for case in found.before],
    }
    name = finding_id(target, impl, found.verdict.key) + ".history"
    try:
        path = write_new_case(out, name, doc)
    except OSError as err:
        print(
            f"attnfuzz: could not write {out / name}.json ({err.strerror or err})", file=sys.stderr
        )
        path = None
    if path is not None:
        print(f"  written to {path}")
    return path
