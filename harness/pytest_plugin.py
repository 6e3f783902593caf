"""attnfuzz's pytest plugin (entry point ``pytest11: attnfuzz``).

pytest loads it in every run where attnfuzz is installed, so it does nothing
unless asked: importing it imports nothing beyond pytest, and a suite that
uses none of its options, ini keys or fixtures collects and runs exactly as
without it (``-p no:attnfuzz`` disables it). What it offers (docs/pytest.md, "Using
attnfuzz from pytest"):

- ``--attnfuzz-impl TARGET=IMPL`` (repeatable; ``IMPL`` a registered name or
  ``module:attribute``): one test item per pair, ``attnfuzz::TARGET[IMPL]``,
  a Hypothesis test of ``IMPL`` against the target's oracle. It runs under the
  suite's Hypothesis settings (profile, ``--hypothesis-seed``, example
  database, ``--hypothesis-show-statistics``), with attnfuzz's corpus key, so
  a database shared with ``attnfuzz run --db`` replays the same failures. The
  pair also names the implementation under test of ``TARGET`` for the two
  below; the ini key ``attnfuzz_impl`` (lines ``TARGET=IMPL``) names it
  without adding fuzz items, and the command line wins.
- the session fixture ``attnfuzz_judge``: ``attnfuzz_judge(target, case,
  impl=None)`` judges ``case`` on ``impl`` (default: the implementation under
  test of ``target``) and fails the test with the verdict and the case file.
- case files as tests: every ``*.json`` under a directory of the ini key
  ``attnfuzz_cases`` (collected when pytest's collection reaches it) or of
  ``--attnfuzz-cases DIR`` (always collected) is one test item that replays
  the case on the implementation under test of its target, or, when none is
  named, on the implementation the file names.
- a user's mutants: ``--attnfuzz-mutants MODULE[:ATTR]`` (repeatable) or the
  ini key ``attnfuzz_mutants`` registers the mutants a module declares
  (``attnfuzz.mutant``), so that the names above may name them.

Every name the options and ini keys give is checked when pytest starts: a
module that does not import, an unknown target or implementation, a mutant
named like an implementation the target already has is a one-line usage error
(exit status 4) before anything is collected.

Each case is judged in a child process (:class:`~attnfuzz.harness.isolation.IsolatedJudge`,
as ``attnfuzz run`` judges), so that an implementation that segfaults, aborts
or hangs fails its own test with a ``crash`` or ``timeout`` verdict and the
rest of the session runs. A hang is not shrunk (each step would cost a whole
timeout): a fuzz item reports the case as it ran, and ``attnfuzz_judge`` raises
:class:`CaseTimeout`, which is not an ``Exception``, so that the test's own
Hypothesis search ends at once. ``--attnfuzz-in-process`` (ini
``attnfuzz_in_process``) judges in the pytest process instead: faster, and a
crash ends the session.

Traces of one engine's steps: an implementation that lives across steps
(``Implementation.traced``) is fuzzed with traces, a trace case file replays its
steps in order, and ``attnfuzz_judge`` takes a trace as it takes a case; each
trace is judged by a new engine in a child of its own (in process: the
implementation's ``new_engine()`` only), and fails at the step that fails.

Every item this plugin makes carries the marker ``attnfuzz`` (``-m attnfuzz``).
A failure's message is short, as ``torch.testing``'s: the verdict (check,
where, expected and got), the case file it was written to (under
``--attnfuzz-out``, default ``.attnfuzz/cases`` in the rootdir) and the
command that replays it.

This module holds the hooks, the options and the fixture; the session's state
is ``harness/pytest_session.py``'s, the test items and the judge
``harness/pytest_items.py``'s, the failure report ``harness/pytest_report.py``'s.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest
from attnfuzz.harness.pytest_items import CaseFile, FuzzItem, SuiteJudge

# `name as name`: importable from the plugin as they always were.
from attnfuzz.harness.pytest_items import CaseItem as CaseItem
from attnfuzz.harness.pytest_report import CaseFailure as CaseFailure
from attnfuzz.harness.pytest_report import CaseTimeout as CaseTimeout
from attnfuzz.harness.pytest_report import elide_cases, judged_failures
from attnfuzz.harness.pytest_session import (
    CASES_INI,
    CASES_OPTION,
    IMPL_INI,
    IMPL_OPTION,
    IN_PROCESS_INI,
    IN_PROCESS_OPTION,
    MARKER,
    MUTANTS_INI,
    MUTANTS_OPTION,
    OUT_OPTION,
    STATE,
    TIMEOUT_INI,
    TIMEOUT_OPTION,
    SessionState,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnfuzz", "attnfuzz: fuzz attention metadata against its oracle")
    group.addoption(
        IMPL_OPTION,
        action="append",
        default=[],
        metavar="TARGET=IMPL",
        help="fuzz IMPL (a registered name or module:attribute) against TARGET's oracle "
        "as one test item under the suite's Hypothesis settings; IMPL is also the "
        "implementation attnfuzz_judge and case files use for TARGET (repeatable)",
    )
    group.addoption(
        CASES_OPTION,
        action="append",
        default=[],
        metavar="DIR",
        help="collect every *.json case file under DIR as a test that replays it (repeatable)",
    )
    group.addoption(
        MUTANTS_OPTION,
        action="append",
        default=[],
        metavar="MODULE[:ATTR]",
        help="register the mutants MODULE declares (its MUTANTS, or ATTR), so that "
        "--attnfuzz-impl and case files can name them (repeatable)",
    )
    group.addoption(
        IN_PROCESS_OPTION,
        action="store_true",
        default=False,
        help="judge each case in the pytest process, not in a child: faster, but an "
        "implementation that crashes ends the session and one that hangs hangs it",
    )
    group.addoption(
        TIMEOUT_OPTION,
        default=None,
        metavar="SECONDS",
        help="a case judged in a child that gives no verdict within SECONDS fails with "
        "the timeout check (default: a case file's own, else 30)",
    )
    group.addoption(
        OUT_OPTION,
        default=None,
        metavar="DIR",
        help="where the case file of each failure is written (default: .attnfuzz/cases "
        "in the rootdir)",
    )
    parser.addini(
        MUTANTS_INI,
        type="linelist",
        default=[],
        help="MODULE[:ATTR] lines: mutants to register, as --attnfuzz-mutants",
    )
    parser.addini(
        IMPL_INI,
        type="linelist",
        default=[],
        help="TARGET=IMPL lines: the implementation under test of each target, for "
        "attnfuzz_judge and case files (adds no fuzz item; --attnfuzz-impl wins)",
    )
    parser.addini(
        CASES_INI,
        type="paths",
        default=[],
        help="directories whose *.json files are attnfuzz case files, collected as tests",
    )
    parser.addini(
        IN_PROCESS_INI,
        type="bool",
        default=False,
        help="judge in the pytest process, as --attnfuzz-in-process",
    )
    parser.addini(
        TIMEOUT_INI,
        type="string",
        default="",
        help="seconds, as --attnfuzz-example-timeout (the option wins)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a test item made by attnfuzz's plugin (fuzz run or case file)"
    )
    state = SessionState(config)
    config.stash[STATE] = state
    if (state.named or state.mutants) and not config.getoption("help"):
        state.check()
    # Directories asked for on the command line are collected like test paths.
    # (Workers of pytest-xdist get the controller's arguments: nothing is added twice.)
    have = {Path(a.split("::")[0]).resolve() for a in config.args}
    for d in state.asked_dirs:
        if d not in have:
            config.args.append(str(d))


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None:
        state.close()


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The way down to a directory of ``--attnfuzz-cases`` is not ignored, even where
    ``norecursedirs`` would skip it (``.attnfuzz/``, hidden) and pytest dropped it
    from the arguments as lying under another one."""
    state = config.stash.get(STATE, None)
    if state is None or not state.asked_dirs:
        return None
    path = collection_path.resolve()
    for d in state.asked_dirs:
        if d.is_relative_to(path) or path.is_relative_to(d):
            return False
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(STATE, None)
    if state is None or not state.case_dirs or not state.holds_case(file_path.resolve()):
        return None
    return CaseFile.from_parent(parent, path=file_path)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so that they see these items
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    for item in items:
        without_deadline(item)
    made: list[pytest.Item] = []
    for target, impl in state.fuzz:
        name = f"{target}[{impl}]"
        made.append(FuzzItem.from_parent(session, name=name, nodeid=f"attnfuzz::{name}"))
    if made:
        items.extend(made)
        # Reported as collected, so that pytest's counts ("collected N items") include them.
        report = pytest.CollectReport("attnfuzz", "passed", None, made)
        session.ihook.pytest_collectreport(report=report)


def without_deadline(item: pytest.Item) -> None:
    """A ``@given`` test that uses ``attnfuzz_judge`` runs without Hypothesis' deadline.

    Each judgement runs in a child process, so its time is the machine's load, not
    the implementation's: a deadline would make the verdict depend on the machine
    (a DeadlineExceeded, then a FlakyFailure, on a loaded CI runner). A hang is
    already the judge's ``timeout`` verdict (``--attnfuzz-example-timeout``). The
    settings are set as Hypothesis' own pytest plugin sets them on a test.
    """
    from hypothesis import is_hypothesis_test, settings

    if "attnfuzz_judge" not in getattr(item, "fixturenames", ()):
        return
    if not isinstance(item, pytest.Function) or not is_hypothesis_test(item.obj):
        return
    fn = getattr(item.obj, "__func__", item.obj)
    current = getattr(fn, "_hypothesis_internal_use_settings", None) or settings.default
    fn._hypothesis_internal_use_settings = settings(parent=current, deadline=None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """The case file of each failing case is written when its test's failure is
    reported: the case Hypothesis reports (the shrunk one), not each one it tried."""
    state = item.config.stash.get(STATE, None)
    if state is not None and call.excinfo is not None:
        for failure in judged_failures(call.excinfo.value):
            if failure.shown is None and failure.unsaved is None:
                state.save(failure)
            notes = getattr(failure, "__notes__", None)
            if notes:  # Hypothesis' example: its case, many lines, is the case file's
                failure.__notes__ = [elide_cases(note) for note in notes]
    return (yield)


@pytest.fixture(scope="session")
def attnfuzz_judge(pytestconfig: pytest.Config) -> SuiteJudge:
    """``attnfuzz_judge(target, case, impl=None)``: judge a case, fail with its verdict
    and case file (session-scoped, so that ``@given`` tests may use it)."""
    return SuiteJudge(pytestconfig.stash[STATE])
