"""A history-dependent failure becomes the trace its judging process lived
(harness/history_trace.py): replayed in a new process, cut down by delta
debugging, within a count of judgements (--max-examples), before any fresh
trace search.

``stateful_impl:previous_call_buffer`` sizes its output by the previous call
when that one padded to more requests: right on any step run first in a new
process, wrong right after a larger step. Its single-step search says
HISTORY-DEPENDENT; the history is its trace.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.campaign.worker import run_item
from attnfuzz.harness.history_trace import (
    history_as_trace,
    history_traces,
    minimize,
    roomy_home,
    trace_of_history,
)
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import nightly_seeds, spec_config
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace, trace_violations

TESTS = Path(__file__).parent
TARGET = "max-seq-len"
PREVIOUS = "stateful_impl:previous_call_buffer"
MAX_EXAMPLES = 20


def _steps(n: int) -> list[Batch]:
    """``n`` distinct single-request prefills (steps on their own)."""
    return [Batch(num_computed_tokens=(0,), q_lens=(k + 1,)) for k in range(n)]


PARAMS = (("capturing", 0),)  # max-seq-len's parameter


def _trace(steps: list[Batch]) -> Trace:
    return Trace(spec_config(num_spec=0), tuple(steps), PARAMS)


def _failing(step: int | None = None) -> Verdict:
    return Verdict([Mismatch("shape", "out", "[1]", "[2]")], step=step)


# -- delta debugging: counts, not times ---------------------------------------------


def test_minimize_keeps_the_one_earlier_step_the_failure_needs():
    steps = _steps(16)
    needed, calls = steps[5], []

    def fails(trace: Trace):
        calls.append(trace)
        return _failing(len(trace.steps) - 1) if needed in trace.steps else None

    cut, verdict, made = minimize(_trace(steps), fails, budget=100)
    assert cut.steps == (needed, steps[-1]) and verdict is not None
    assert made == len(calls) <= 2 * 4 * 2  # halves down to single steps: a few dozen at most


def test_minimize_stops_at_its_budget_with_the_smallest_failure_so_far():
    steps = _steps(16)

    def fails(trace: Trace):
        return _failing() if steps[5] in trace.steps else None

    cut, _, made = minimize(_trace(steps), fails, budget=3)
    assert made == 3 and steps[5] in cut.steps and cut.steps[-1] == steps[-1]


class _Judge:
    """Stands in for the isolated judge: a trace fails when it holds ``needed``."""

    def __init__(self, needed: Batch | None):
        self.needed, self.traces = needed, 0
        self.impl = get_target(TARGET).implementations["triton"]

    def judge_trace(self, trace: Trace, deadline=None) -> Verdict:
        self.traces += 1
        if self.needed is not None and self.needed in trace.steps:
            return _failing(len(trace.steps) - 1)
        return Verdict([])


def _history(n: int) -> list[Case]:
    config = spec_config(num_spec=0)
    return [Case(config, b, PARAMS) for b in _steps(n)]


@pytest.mark.parametrize("budget", [1, 2, 5, MAX_EXAMPLES])
def test_a_history_trace_costs_at_most_its_count_of_judgements(budget):
    history = _history(30)
    judge = _Judge(history[7].batch)
    got = trace_of_history(get_target(TARGET), judge, history, "shape", budget)
    assert judge.traces <= budget
    assert got is not None and got.judgements == judge.traces and got.lived == 30
    assert got.trace.steps[-1] == history[-1].batch and history[7].batch in got.trace.steps
    if budget == MAX_EXAMPLES:
        assert len(got.trace.steps) == 2


def test_a_history_that_does_not_fail_as_a_trace_gives_none():
    history = _history(6)
    judge = _Judge(None)
    assert trace_of_history(get_target(TARGET), judge, history, "shape", MAX_EXAMPLES) is None
    assert 1 <= judge.traces <= MAX_EXAMPLES


def test_a_history_of_steps_with_pages_is_a_life_of_new_requests():
    """Cases on their own that carry the scheduler's fields all number their requests
    from 0: as one engine's steps each gets ids no other step uses, so that every
    subset of them is a life an engine can have too."""
    target = get_target(TARGET)
    config = spec_config(num_spec=0, block_size=4)
    cases = [
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((0,), (1, 2)), new_pages=(1, 2)),
        Batch((0,), (6,), req_ids=(0,), pages=((3, 4),), new_pages=(2,)),
        Batch((0, 0), (2, 2), req_ids=(0, 1), pages=((5,), (6,)), new_pages=(1, 1)),
    ]
    cases = [Case(config, batch, PARAMS) for batch in cases]
    trace = history_as_trace(target, cases, cases[-1])
    assert trace is not None and len(trace.steps) == 3
    ids = [set(step.req_ids) for step in trace.steps]
    assert all(not (a & b) for i, a in enumerate(ids) for b in ids[i + 1 :])
    for keep in ([0, 2], [1, 2], [2]):
        assert trace_violations(Trace(config, tuple(trace.steps[k] for k in keep), PARAMS)) == []


# -- attnfuzz run and a campaign ---------------------------------------------------------


def attnfuzz(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    path = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    exe = [sys.executable, "-c", "from attnfuzz.harness.cli import main; raise SystemExit(main())"]
    return subprocess.run([*exe, *args], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, *nightly_seeds()])
def test_a_history_dependent_run_writes_the_trace_its_history_is(tmp_path, seed):
    """The single-step search says HISTORY-DEPENDENT; its history, replayed as one
    engine's trace in a new process, fails the same way and is cut to its two steps
    within --max-examples judgements: no fresh trace search. The case file's trace
    fails again under repro in a new process (exit 1)."""
    run = attnfuzz("run", "--target", TARGET, "--impl", PREVIOUS, "--seed", str(seed),
                   "--max-examples", str(MAX_EXAMPLES), "--out", "cases", cwd=tmp_path)  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert f"HISTORY-DEPENDENT {TARGET} / {PREVIOUS}" in out
    assert "searching again as traces" not in out
    said = re.search(r"cut to (\d+) step\(s\) in (\d+) judgements \(at most (\d+)\)", out)
    assert said is not None, out
    assert int(said[2]) <= int(said[3]) == MAX_EXAMPLES  # the bound: --max-examples traces
    # The whole run's count, the stated bound (docs/traces.md): the search and its
    # shrinking, 10 single-step replays and 5 of the history (each of its examples), the
    # history's traces, 10 confirming replays at most.
    history = int(re.search(r"the (\d+) the process judged up to it", out)[1])
    total = re.search(r"judgements to this case: (\d+) \((\d+) by the search and its "
                      r"shrinking, (\d+) in new processes\)", out)  # fmt: skip
    assert total is not None, out
    assert int(total[1]) == int(total[2]) + int(total[3])
    assert int(total[2]) <= 2 * MAX_EXAMPLES
    assert int(total[3]) <= 10 + 5 * history + int(said[2]) + 10
    assert f"{TARGET} / {PREVIOUS}: " in out and " examples in " in out  # the search's own
    (found,) = [p for p in (tmp_path / "cases").glob("*.json") if ".history" not in p.name]
    doc = json.loads(found.read_text())
    assert len(doc["trace"]["steps"]) == int(said[1]) == 2 and doc["step"] == 1
    replay = attnfuzz("repro", str(found), "--impl", PREVIOUS, cwd=tmp_path)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "at step 1" in replay.stdout


@pytest.fixture
def stateful(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    return importlib.import_module("stateful_impl")


def test_a_campaign_unit_turns_a_history_dependent_finding_into_its_trace(stateful, tmp_path):
    """A campaign's worker follows the same policy (one function): the finding it
    would have marked history-dependent is the trace its history is, with its step."""
    for sub in ("items", "inflight", "faults", "started", "crashed"):
        (tmp_path / sub).mkdir(parents=True)
    (item,) = cp.plan_items([cp.Unit(TARGET, PREVIOUS, "user", False)], 1, MAX_EXAMPLES)
    plan = {
        "started": time.time(), "budget": None, "deadline": None, "deadline_soft": False,
        "workers": 1, "profile": "ci", "derandomized": True, "seed": 0, "database": None,
        "scale": "small", "device": None, "example_timeout": 30.0, "items": [item],
        "min_examples": 0, "mutants": [],
    }  # fmt: skip
    was_enabled = faulthandler.is_enabled()
    try:
        state = run_item(tmp_path, plan, item)
    finally:
        if was_enabled:
            faulthandler.enable(file=sys.__stderr__)
    (finding,) = state["findings"].values()
    assert "history_dependent" not in finding and finding["confirmed"] == "confirmed"
    trace = Trace.from_dict(finding["case"])
    assert finding["from_history"] >= 2 and len(trace.steps) == 2 and finding["step"] == 1


def test_a_history_whose_larger_step_the_failing_config_refuses_replays_with_room():
    """The step before the failure padded to more requests than the failing case's
    config admits (``max_num_seqs`` 2 after 4 requests): under the failing config it is
    left out, and under its own the failing step is refused (past its model length).
    The failing config with the history's largest limits holds both, its graphs and
    mode unchanged (``roomy_home``). Seed 2's history of ``previous_call_buffer`` was
    this one: it fell back to a fresh search, which found nothing in 20 traces."""
    target = get_target(TARGET)
    big = spec_config(num_spec=0, max_num_seqs=7, max_model_len=32)
    small = spec_config(num_spec=0, max_num_seqs=2, max_model_len=64)
    larger = Case(big, Batch((8, 8, 8, 8), (1, 1, 1, 1)), PARAMS)
    failing = Case(small, Batch((40, 3), (1, 1)), PARAMS)
    traces = history_traces(target, [larger, failing])
    assert len(traces) == 1  # neither config alone holds both steps
    (trace,) = traces
    assert trace.config == roomy_home([larger, failing]).config
    assert trace.config.max_num_seqs == 7 and trace.config.max_model_len == 64
    assert trace.config.cudagraph_capture_sizes == small.cudagraph_capture_sizes
    assert [s.num_reqs for s in trace.steps] == [4, 2]
