"""The one definition of the names and small rules several parts of attnfuzz share.

Schema ids, exit codes, default paths, the verdict words the reports print, how
a finding is named, how two cases of one finding are ordered, how shards'
timelines add up, how a Markdown table and a timestamp are written. Everything
else imports these from here, so a value changes in one place only.

This module imports nothing from attnfuzz (and nothing heavy), so any module
may import it without creating an import cycle.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

try:
    VERSION = version("attnfuzz")  # one source: pyproject.toml's version
except PackageNotFoundError:  # pragma: no cover - a checkout that was never installed
    VERSION = "0+unknown"

# -- schema ids (the "schema" field of each document attnfuzz writes) -----------------

CASE_SCHEMA = "attnfuzz.case/1"
CAMPAIGN_SCHEMA = "attnfuzz.campaign/1"
ZOO_SCHEMA = "attnfuzz.zoo/1"
REGRESSION_SCHEMA = "attnfuzz.regression/1"

# -- exit codes of the command line ---------------------------------------------------

EXIT_OK = 0
EXIT_FOUND = 1  # a failing case was found (or a mutant survived, or a case still fails)
EXIT_USAGE = 2  # the command line or an input file was refused; nothing ran
EXIT_INCOMPLETE = 3  # some run (or zoo seed) found nothing short of its example floor: no verdict
# attnfuzz's own code raised while judging (an adapter's glue, a stand-in, the
# harness): no verdict on the implementation, and never a finding or a case file.
EXIT_ERROR = 4
HARNESS_FAULT_NOTE = (
    "a fault of attnfuzz itself, not a finding on the implementation: no case was written; "
    "please report it with the line above"
)
# A finding on engine code that the engine never runs on such metadata (only a FULL
# graph replays it, where the Python does not run): harness.reachability.
EXIT_LATENT = 5
EXIT_BROKEN_PIPE = 128 + 13  # as a shell reports a command killed by SIGPIPE

# -- default paths, relative to the working directory --------------------------------

STATE_DIR = Path(".attnfuzz")
DEFAULT_DB = STATE_DIR / "db"  # Hypothesis' example database
DEFAULT_OUT = STATE_DIR / "campaign"  # a campaign's results
PREVIOUS = "previous"  # where a campaign moves the results of the one before
DEFAULT_CASES = STATE_DIR / "cases"  # `attnfuzz run`'s failing cases
DEFAULT_ZOO_OUT = STATE_DIR / "zoo"  # `attnfuzz zoo`'s scoreboard
DEFAULT_REGRESSIONS = Path("tests") / "regressions"  # `attnfuzz export`'s tests

PROFILE_ENV = "ATTNFUZZ_PROFILE"  # the Hypothesis profile when none is named
PROFILE_NAMES = ("ci", "fuzz", "dev")  # the campaign profiles (settings.PROFILES)
SCALE_NAMES = ("small", "production")  # the sizes drawn (strategies.batches.SCALES)

# -- implementation kinds, run statuses and verdict words ---------------------------


class Kind(StrEnum):
    """What an implementation is, as campaigns, reports and ``list --json`` write it.

    A :class:`StrEnum`: each member *is* its string (``Kind.MUTANT == "mutant"``),
    so files written before it read the same.
    """

    FIXED = "fixed"  # attnfuzz's own optimized code: must pass
    REFERENCE = "reference"  # the reference as an implementation (a self-check): must pass
    ENGINE = "engine"  # an engine's own code (an engine plugin's): must pass
    MUTANT = "mutant"  # a known bug: must be found
    USER = "user"  # a user's ``module:attribute``: must pass


KINDS = tuple(Kind)
"""Every kind, in the order campaign.json's schema lists them."""


class RunStatus(StrEnum):
    """What happened to a run (``campaign.json``'s ``runs[].status``); a ``str``, so
    documents are written and compared as before.

    A run that judged no example (a budget too short for the machine, a worker
    lost at once) is "not run": neither passed nor failed, neither caught nor survived.
    """

    PASS = "pass"  # examples judged, nothing failed
    FAIL = "fail"
    ERROR = "error"  # attnfuzz's own code failed: no verdict
    NOT_RUN = "not run"


STATUSES = tuple(RunStatus)


class RunVerdict(StrEnum):
    """Verdict words, one per outcome; the reports show exactly these. A mutant that
    fails was "caught"; one that passes "survived". Every other kind must pass.

    ``LATENT``: an engine implementation's run whose every finding is latent
    (harness.reachability: only a FULL graph replay meets the metadata that trips
    it). ``KILLED``: the zoo's word for a mutant every seed detected (one some seed
    missed "survived"). ``INCOMPLETE``: a run that found nothing short of its floor
    (and a zoo mutant with such seeds and no survivor), written as the campaign's word.
    """

    PASS = "pass"
    FAIL = "FAIL"
    CAUGHT = "caught"
    SURVIVED = "survived"
    ERROR = "ERROR"
    NOT_RUN = "not run"
    LATENT = "LATENT"
    KILLED = "killed"
    INCOMPLETE = "INCOMPLETE"


class CampaignVerdict(StrEnum):
    """A whole campaign's verdict: every run as it should be, or not, or some run
    judged nothing; ``LATENT`` when its only departures are latent runs (EXIT_LATENT)."""

    PASS = "PASS"
    FAIL = "FAIL"
    INCOMPLETE = "INCOMPLETE"
    LATENT = "LATENT"


# The words by their older names, as every module reads them.
PASS, FAIL, CAUGHT, SURVIVED, ERROR, NOT_RUN = (
    RunVerdict.PASS,
    RunVerdict.FAIL,
    RunVerdict.CAUGHT,
    RunVerdict.SURVIVED,
    RunVerdict.ERROR,
    RunVerdict.NOT_RUN,
)
LATENT, KILLED = RunVerdict.LATENT, RunVerdict.KILLED
CAMPAIGN_PASS, CAMPAIGN_FAIL = CampaignVerdict.PASS, CampaignVerdict.FAIL
CAMPAIGN_INCOMPLETE, CAMPAIGN_LATENT = CampaignVerdict.INCOMPLETE, CampaignVerdict.LATENT

# The example floor: a run (a campaign's target x implementation, a zoo seed) that
# found nothing is a pass, or a surviving mutant, only once it judged this many
# examples; one whose time budget ended sooner is INCOMPLETE (exit 3): on a loaded
# machine a budget, not the search, would otherwise decide the verdict. 200 is
# above the most examples any zoo mutant needed to its first detection (157, the
# zoo's scoreboard, docs/zoo.md), and it is what `attnfuzz run` judges and one round of the
# ci and dev profiles generates. A run capped lower (--max-examples) is complete
# at its cap; a mutant detected is caught at any count.
DEFAULT_MIN_EXAMPLES = 200

# The verdict of such a run, and of a zoo mutant with such seeds and no survivor:
# written as the campaign's own word, so that every report shows the two alike.
INCOMPLETE = RunVerdict.INCOMPLETE

# -- small shared rules ---------------------------------------------------------------


MAX_FINDING_ID = 160
"""Characters of a finding's id at most: with what its files add to it
(``.history.json``, a campaign's ``.ID.json.tmp``, the pytest plugin's ``-2.json``)
a file name stays well inside the 255 bytes a file system allows."""


def fit(parts: Sequence[str], room: int, strip: str = "_") -> list[str]:
    """``parts`` cut to ``room`` characters together: the longest first, all to one
    cap (so the short ones stay whole), each cut's trailing ``strip`` characters
    dropped. How a finding's id and an exported test's name are shortened."""
    cap = max(map(len, parts), default=0)
    while cap > 1 and sum(min(len(p), cap) for p in parts) > room:
        cap -= 1
    return [p[:cap].rstrip(strip) for p in parts]


def finding_id(target: str, implementation: str, key: str) -> str:
    """``<target>--<impl>--<key>``, usable as a file name: every character outside
    ``[0-9A-Za-z._=-]`` (``:`` and ``/`` among them) becomes ``_``.

    Past :data:`MAX_FINDING_ID` characters (an exception class of a long name, a
    user's long ``module:attribute``) the longest parts are cut (:func:`fit`) and
    ``_<digest>`` of the three, whole, ends the key's: still one id per finding,
    whose last ``--`` part still starts as its key's."""
    parts = [re.sub(r"[^0-9A-Za-z._=-]", "_", part) for part in (target, implementation, key)]
    whole = "--".join(parts)
    if len(whole) <= MAX_FINDING_ID:
        return whole
    digest = hashlib.sha256(json.dumps([target, implementation, key]).encode()).hexdigest()[:8]
    room = MAX_FINDING_ID - len("--") * (len(parts) - 1) - len(f"_{digest}")
    return "--".join(fit(parts, room, strip="_.-")) + f"_{digest}"


def invoked_as(argv0: str | None = None) -> str:
    """This process's attnfuzz command as the user can type it again here: ``attnfuzz``
    where that name on ``PATH`` is the program running (or where attnfuzz runs inside
    another program, pytest's plugin or the API), else the program's path (relative
    to the working directory when under it: ``.venv/bin/attnfuzz`` after ``setup.sh``)
    or ``PYTHON -m attnfuzz``."""
    argv0 = sys.argv[0] if argv0 is None and sys.argv else (argv0 or "")
    program = Path(argv0)
    if program.name == "attnfuzz":
        on_path = shutil.which("attnfuzz")
        if on_path is not None and Path(on_path).resolve() == program.resolve():
            return "attnfuzz"
        return shlex.quote(_as_typed(program))
    if program.name == "__main__.py" and program.parent.name == "attnfuzz":
        return f"{shlex.quote(_as_typed(Path(sys.executable)))} -m attnfuzz"
    return "attnfuzz"


def _as_typed(path: Path) -> str:
    """``path`` relative to the working directory when under it (``.venv/bin/x``)."""
    try:
        relative = path.absolute().relative_to(Path.cwd())
    except ValueError:
        return str(path.absolute())
    return str(relative) if "/" in str(relative) else f"./{relative}"


def repro_command(case_path: Path | str, implementation: str, program: str = "attnfuzz") -> str:
    """The command that replays a case file; a user's ``module:attribute`` is named
    again (``--impl``), since a case file never makes attnfuzz import anything by itself.
    ``program``: how attnfuzz is typed (:func:`invoked_as`, for a line printed to the
    user who just ran it; documents keep ``attnfuzz``)."""
    cmd = f"{program} repro {shlex.quote(str(case_path))}"
    return cmd + (f" --impl {shlex.quote(implementation)}" if ":" in implementation else "")


def case_size(case_dict: dict[str, Any]) -> tuple[int, str]:
    """Orders cases of one finding: the shorter printed case is the smaller; among
    equally long ones, the first in text order (so the order is total)."""
    text = json.dumps(case_dict, sort_keys=True, separators=(",", ":"))
    return len(text), text


TIMELINE_STEP_S = 0.25  # merged points closer than this keep only the later one


def merge_timelines(timelines: Sequence[Sequence[Sequence[float]]]) -> list[list[float]]:
    """Examples of all shards together over time, a few points a second at most.

    Each timeline is ``[seconds, examples so far]`` points of one shard; the
    result's point at each event time is the sum of every shard's latest count.
    """
    events = sorted((t, i, n) for i, tl in enumerate(timelines) for t, n in tl)
    last: list[float] = [0] * len(timelines)
    merged: list[list[float]] = []
    for t, i, n in events:
        last[i] = n
        point = [round(t, 3), sum(last)]
        if merged and point[0] - merged[-1][0] < TIMELINE_STEP_S:
            merged[-1] = point
        else:
            merged.append(point)
    return merged


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "", *, pad: bool = True
) -> str:
    """A Markdown table; ``align`` holds ``l`` or ``r`` per column (default: all
    left). With ``pad``, every column is padded to one width (for a terminal);
    without, cells are written as they are (smaller files, same rendering).
    Cells are written with ``str``: escaping ``|`` is the caller's business."""
    align = align or "l" * len(header)
    if len(align) != len(header):
        raise ValueError(f"align {align!r} does not give one letter per column of {list(header)}")
    cells = [[str(c) for c in row] for row in [header, *rows]]
    if pad:
        widths = [max(3, *(len(row[i]) for row in cells)) for i in range(len(header))]
    else:
        widths = [4 if a == "r" else 3 for a in align]

    def line(row: Sequence[str]) -> str:
        if not pad:
            return "| " + " | ".join(row) + " |"
        triples = zip(row, widths, align, strict=True)
        return (
            "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in triples) + " |"
        )

    rule = [
        "-" * (w - 1) + ":" if a == "r" else "-" * w for w, a in zip(widths, align, strict=True)
    ]
    return "\n".join([line(cells[0]), line(rule), *(line(r) for r in cells[1:])])


def timestamp(t: float | None = None) -> str:
    """UTC time ``t`` (seconds since the epoch; default now) in ISO 8601 to the
    second with a ``Z``, as campaign.json's ``started``/``finished`` hold it."""
    when = datetime.now(UTC) if t is None else datetime.fromtimestamp(t, UTC)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")
