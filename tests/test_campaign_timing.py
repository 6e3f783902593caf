"""Where a campaign's time goes: start-up said as it goes, and accounted for at the end.

One short campaign (one target, one user implementation that fails, 20
examples) is run once for the end-to-end tests; the rest test the accounting
on the files a campaign's workers write, and the progress lines, directly.
"""

from __future__ import annotations

import json
import re
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from attnfuzz.harness import campaign as cp
from attnfuzz.harness.campaign.document import campaign_record, run_record
from attnfuzz.harness.campaign.progress import StartupNotes
from attnfuzz.harness.campaign.timing import (
    campaign_timing,
    hypothesis_phase,
    note_phase,
    startup_state,
)
from attnfuzz.harness.cli import main
from attnfuzz.reports.document import load_campaign
from attnfuzz.reports.markdown import split_tenths, summary_markdown
from hypothesis import given, settings
from hypothesis import strategies as st

TESTS = Path(__file__).parent
ID = "indexer-decode"
VERDICT = re.compile(r"^(PASS|FAIL|CAUGHT|SURVIVED|ERROR|INCOMPLETE|NOT RUN)\b", re.I)
TIME_LINE = re.compile(
    r"^Time: (\d+\.\d) s = start-up (\d+\.\d) s \+ fuzzing (\d+\.\d) s "
    r"\+ shrinking (\d+\.\d) s \+ other (\d+\.\d) s \((\d+) workers?\)$",
    re.M,
)


@pytest.fixture(scope="module")
def short_campaign(tmp_path_factory) -> tuple[int, str, Path]:
    """A campaign whose one run finds a failure and shrinks it: (exit status, console, out)."""
    tmp = tmp_path_factory.mktemp("timing")
    console = StringIO()
    with pytest.MonkeyPatch.context() as mp, redirect_stdout(console):
        mp.syspath_prepend(str(TESTS))  # campaign_impls, passed on to the workers
        code = main(["campaign", "--targets", ID, "--impls", "campaign_impls:raises",
                     "--max-examples", "20", "--profile", "ci", "--quiet", "-n", "1",
                     "--out", str(tmp / "out"), "--db", str(tmp / "db")])  # fmt: skip
    return code, console.getvalue(), tmp / "out"


# -- end to end ------------------------------------------------------------------------


def test_the_console_says_the_start_up_before_any_verdict(short_campaign):
    code, text, _ = short_campaign
    assert code == 1, text  # the user implementation's failure
    lines = text.splitlines()
    starting = [i for i, line in enumerate(lines) if "starting 1 worker" in line]
    ready = [i for i, line in enumerate(lines) if re.search(r"worker ready \(start-up ", line)]
    verdicts = [i for i, line in enumerate(lines) if VERDICT.match(line)]
    assert starting and ready and verdicts, text
    assert starting[0] == 1, text  # right after the title: never a silent start
    assert starting[0] < ready[0] < verdicts[0], text
    assert re.match(r"^\[\s*\d+\.\ds\] ", lines[ready[0]]), lines[ready[0]]


def test_campaign_json_timing_adds_up_to_its_duration(short_campaign):
    _, _, out = short_campaign
    doc = load_campaign(out / "campaign.json")  # schema-checked
    timing = doc["timing"]
    parts = [timing[k] for k in ("startup", "fuzzing", "shrinking", "other")]
    assert all(x >= 0 for x in parts), timing
    assert sum(parts) == pytest.approx(doc["seconds"], abs=0.005)
    assert timing["startup"] > 0 and timing["fuzzing"] > 0
    assert timing["shrinking"] > 0, timing  # the failure was shrunk
    assert 0 < timing["ready"] <= timing["startup"] + 0.005  # one worker, one unit
    (worker,) = timing["per_worker"]
    own = [worker[k] for k in ("startup", "fuzzing", "shrinking", "other")]
    assert sum(own) == pytest.approx(doc["seconds"], abs=0.005)
    (run,) = doc["runs"]
    assert sum(run["timing"].values()) == pytest.approx(run["seconds"], abs=0.005)
    assert run["timing"]["shrinking"] == pytest.approx(timing["shrinking"], abs=0.005)


def test_summary_md_has_the_time_line(short_campaign):
    _, _, out = short_campaign
    doc = json.loads((out / "campaign.json").read_text())
    match = TIME_LINE.search((out / "summary.md").read_text())
    assert match, (out / "summary.md").read_text()
    total, *parts, workers = match.groups()
    # The summary prints tenths of the duration, campaign.json thousandths: each within
    # half its own unit of the duration (28.8 beside 28.750 is right).
    assert float(total) == pytest.approx(doc["seconds"], abs=0.05 + 0.0005) and workers == "1"
    assert sum(map(float, parts)) == pytest.approx(float(total), abs=1e-9)  # as printed


# -- the accounting --------------------------------------------------------------------


def _unit(
    unit: int,
    worker: str,
    pid: int,
    started: float,
    verdict: float | None,
    end: float,
    shrinking: float = 0.0,
    status: str = "done",
) -> dict:
    """A unit's state as its worker writes it (``status`` running: its worker was lost)."""
    return {
        "unit": unit,
        "worker": worker,
        "pid": pid,
        "started": started,
        "first_verdict": verdict,
        "updated": end,
        "finished": None if status == "running" else end,
        "shrinking": shrinking,
        "shrinking_since": None,
        "status": status,
    }


def test_each_worker_s_parts_add_up_to_the_wall_time_and_so_do_their_means():
    """gw0: two units, a gap between them; gw1 lost mid-unit and replaced by gw3 (a
    new process: its start-up); gw2 never started a unit."""
    states = [
        _unit(0, "gw0", 1, 5.0, 8.0, 20.0, shrinking=3.0),
        _unit(1, "gw0", 1, 20.5, 21.0, 40.0),
        _unit(2, "gw1", 2, 6.0, 9.0, 15.0, status="running"),  # its worker died at 15
        _unit(3, "gw3", 3, 22.0, 23.0, 39.0),
    ]
    timing = campaign_timing(states, workers=3, started=0.0, finished=50.0)
    by_name = {tuple(w["names"]): w for w in timing["per_worker"]}
    gw0 = by_name[("gw0",)]
    assert gw0 == {"names": ["gw0"], "startup": 8.5, "fuzzing": 28.0, "shrinking": 3.0,
                   "other": 10.5, "ready": 8.0}  # fmt: skip
    lost = by_name[("gw1", "gw3")]  # the replacement goes on the lost worker's slot
    assert lost["startup"] == 9.0 + 7.0 + 1.0 and lost["other"] == 11.0
    assert by_name[()] == {"names": [], "startup": 50.0, "fuzzing": 0.0, "shrinking": 0.0,
                           "other": 0.0, "ready": None}  # fmt: skip
    for w in timing["per_worker"]:
        assert sum(w[k] for k in ("startup", "fuzzing", "shrinking", "other")) == 50.0
    parts = [timing[k] for k in ("startup", "fuzzing", "shrinking", "other")]
    assert sum(parts) == pytest.approx(50.0, abs=0.002) and timing["ready"] is None
    doc = campaign_record([], [], started="a", finished="b", seconds=50.0, environment={},
                          timing=timing)  # fmt: skip
    assert "(3 workers; not every one judged an example)" in summary_markdown(doc)


def test_a_shrink_runs_from_its_first_case_to_the_end_of_its_hypothesis_run():
    phases: list[str | None] = []
    state = {"shrinking": 0.0, "shrinking_since": None}

    @settings(max_examples=50, database=None, derandomize=True)
    @given(st.integers(0, 1000))
    def test(x: int) -> None:
        phases.append(hypothesis_phase())
        note_phase(state, phases[-1])
        assert x < 10

    with pytest.raises(AssertionError):
        test()
    assert "generate" in phases and "shrink" in phases
    assert state["shrinking_since"] is not None  # the final replay is part of it
    note_phase(state, "ended")
    assert state["shrinking"] > 0 and state["shrinking_since"] is None


@pytest.mark.parametrize(
    "total, parts", [(14.14, [3.115, 10.894, 0.0, 0.131]), (13.67, [5.95, 1.65, 2.75, 3.32])]
)
def test_the_time_line_adds_up_as_printed(total, parts):
    tenths = split_tenths(total, parts)
    assert round(sum(tenths), 1) == float(f"{total:.1f}")
    assert all(abs(a - b) < 0.1 + 1e-9 for a, b in zip(tenths, parts, strict=True))


def test_an_old_campaign_document_has_no_time_line():
    run = run_record(ID, "triton", "fixed", examples=12, seconds=4.0, status="pass")
    doc = campaign_record([run], [], started="a", finished="b", seconds=5.0, environment={})
    assert "Time:" not in summary_markdown(doc)
    timed = campaign_record([run], [], started="a", finished="b", seconds=5.0, environment={},
                            timing={"startup": 1.04, "fuzzing": 3.86, "shrinking": 0.0,
                                    "other": 0.1, "ready": 1.0, "per_worker": []})  # fmt: skip
    assert "Time: 5.0 s = start-up 1.0 s + fuzzing 3.9 s + shrinking 0.0 s + other 0.1 s" in (
        summary_markdown(timed)
    )


# -- the progress ----------------------------------------------------------------------


def test_start_up_lines_come_once_each_and_the_displays_say_starting():
    notes = StartupNotes(workers=2, started=100.0)
    assert notes.begin(100.5).startswith("[   0.5s] starting 2 workers")
    up = [_unit(0, "gw0", 1, 104.0, None, 104.5, status="running"),
          _unit(0, "gw1", 2, 105.0, None, 105.5, status="running")]  # fmt: skip
    state = startup_state(up, workers=2, items=2)
    assert state.starting == {0} and not state.all_ready
    (line,) = notes.lines(state, 105.6)
    assert line.startswith("[   5.6s] 2 workers up after 5.0s; judging the first examples")
    assert notes.lines(state, 106.0) == []
    stream = StringIO()
    cp.LineProgress(stream, every=0.0).update(_snapshot(), 6.0, 54.0, state)
    assert "starting: 0/2 workers ready" in stream.getvalue()
    live = cp.LiveProgress("campaign")
    live.console.file = StringIO()
    with live:
        live.update(_snapshot(), 6.0, 54.0, state)
    text = live.console.file.getvalue()
    assert "starting: 0/2 workers ready" in text and "starting" in text.split("triton")[-1]
    ready = [dict(u, first_verdict=109.0 + i) for i, u in enumerate(up)]
    (line,) = notes.lines(startup_state(ready, workers=2, items=2), 110.2)
    assert line == "[  10.2s] 2 workers ready (start-up 10.0s); fuzzing ..."
    assert notes.lines(startup_state(ready, workers=2, items=2), 111.0) == []


def _snapshot() -> cp.Snapshot:
    run = run_record(ID, "triton", "fixed", examples=0, seconds=1.0, status="pass")
    return cp.Snapshot(runs=[run | {"_running": True, "_started": 104.0}])
