"""attnfuzz's pytest plugin (entry point ``pytest11: attnfuzz``).

pytest loads it in every run where attnfuzz is installed, so it does nothing
unless asked: importing it imports nothing beyond pytest, and a suite that
uses none of its options, ini keys or fixtures collects and runs exactly as
without it (``-p no:attnfuzz`` disables it). What it offers (README: "Using
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

Every item this plugin makes carries the marker ``attnfuzz`` (``-m attnfuzz``).
A failure's message is short, as ``torch.testing``'s: the verdict (check,
where, expected and got), the case file it was written to (under
``--attnfuzz-out``, default ``.attnfuzz/cases`` in the rootdir) and the
command that replays it.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from attnfuzz.harness.isolation import IsolatedJudge
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.harness.target import Implementation, Target
    from attnfuzz.reference.batch import Case

IMPL_OPTION = "--attnfuzz-impl"
CASES_OPTION = "--attnfuzz-cases"
MUTANTS_OPTION = "--attnfuzz-mutants"
IN_PROCESS_OPTION = "--attnfuzz-in-process"
TIMEOUT_OPTION = "--attnfuzz-example-timeout"
OUT_OPTION = "--attnfuzz-out"
IMPL_INI = "attnfuzz_impl"
CASES_INI = "attnfuzz_cases"
MUTANTS_INI = "attnfuzz_mutants"
IN_PROCESS_INI = "attnfuzz_in_process"
TIMEOUT_INI = "attnfuzz_example_timeout"
MARKER = "attnfuzz"

_STATE = pytest.StashKey["_State"]()


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


class _State:
    """What the options and ini keys say, parsed once per session, and the judges."""

    def __init__(self, config: pytest.Config) -> None:
        self.fuzz: list[tuple[str, str]] = [
            _pair(text, IMPL_OPTION) for text in config.getoption("attnfuzz_impl")
        ]
        ini = [_pair(text, IMPL_INI) for text in config.getini(IMPL_INI)]
        self.impls: dict[str, str] = dict(ini)
        self.impls.update(self.fuzz)  # the command line wins
        # Where each name came from, for the usage errors.
        self.named: dict[tuple[str, str], str] = {pair: IMPL_INI for pair in ini}
        self.named.update({pair: IMPL_OPTION for pair in self.fuzz})
        asked = [Path(d).resolve() for d in config.getoption("attnfuzz_cases")]
        for d in asked:
            if not d.is_dir():
                raise pytest.UsageError(f"{CASES_OPTION} {d}: not a directory")
        self.case_dirs = asked + [Path(d).resolve() for d in config.getini(CASES_INI)]
        self.asked_dirs = asked
        self.mutants: list[tuple[str, str]] = [
            *((MUTANTS_INI, spec) for spec in config.getini(MUTANTS_INI)),
            *((MUTANTS_OPTION, spec) for spec in config.getoption("attnfuzz_mutants")),
        ]
        self.in_process = bool(
            config.getoption("attnfuzz_in_process") or config.getini(IN_PROCESS_INI)
        )
        option = config.getoption("attnfuzz_example_timeout")
        ini_timeout = config.getini(TIMEOUT_INI).strip()
        self.timeout: float | None = (
            _seconds(option, TIMEOUT_OPTION)
            if option is not None
            else _seconds(ini_timeout, TIMEOUT_INI)
            if ini_timeout
            else None
        )
        out = config.getoption("attnfuzz_out")
        self.out = Path(out).resolve() if out else config.rootpath / ".attnfuzz" / "cases"
        self.here = config.invocation_params.dir  # case files are shown relative to it
        self.device: str | None = None  # where the kernels run, for case files
        self._resolved: dict[tuple[str, str], tuple[Target, Implementation]] = {}
        self._judges: dict[tuple[str, str, float], IsolatedJudge] = {}
        self._written: dict[Path, str] = {}  # case files written this session: their case

    def check(self) -> None:
        """Register the mutants and resolve every name given, at start-up: a
        mistake is one line, not a traceback per test (and none ignored)."""
        from attnfuzz.harness.cli.args import one_line
        from attnfuzz.harness.devices import check_device
        from attnfuzz.harness.registry import add_mutants
        from attnfuzz.harness.target import UsageError

        def refuse(where: str, err: Exception) -> NoReturn:
            raise pytest.UsageError(one_line(f"{where}: {err}")) from None

        for where, spec in self.mutants:
            try:
                add_mutants(spec)
            except UsageError as err:
                refuse(where, err)
        for (target, spec), where in self.named.items():
            try:
                self.resolve(target, spec)
            except UsageError as err:
                refuse(f"{where} {target}={spec}", err)
        try:
            self.device = check_device()  # ATTNFUZZ_DTYPE this machine cannot run
        except UsageError as err:
            raise pytest.UsageError(one_line(err)) from None

    def resolve(self, target: str, spec: str) -> tuple[Target, Implementation]:
        """The target and implementation ``spec`` names (resolved once a session)."""
        if (target, spec) not in self._resolved:
            from attnfuzz.harness.registry import get_target

            t = get_target(target)
            self._resolved[target, spec] = (t, t.resolve(spec))
        return self._resolved[target, spec]

    def timeout_for(self, recorded: float | None = None) -> float | None:
        """The per-case timeout: the option's, else a case file's, else the default;
        None when judging in process (nothing times out there)."""
        from attnfuzz.harness.isolation import DEFAULT_TIMEOUT_S

        if self.in_process:
            return None
        return self.timeout or recorded or DEFAULT_TIMEOUT_S

    def judge(
        self, target: Target, impl: Implementation, case: Case, timeout: float | None
    ) -> Verdict:
        """``target.judge(impl, case)``, in a child unless in process: a crash or a
        hang is then the verdict (``crash``, ``timeout``), never the session's end."""
        if timeout is None:
            return target.judge(impl, case)
        key = (target.name, impl.name, timeout)
        judge = self._judges.get(key)
        if judge is None:  # one child per implementation, kept for the session
            from attnfuzz.harness.isolation import IsolatedJudge

            judge = self._judges[key] = IsolatedJudge(target, impl, timeout_s=timeout)
        return judge.judge(case)

    def save(self, failure: _Judged) -> None:
        """Write ``failure``'s case file (named as ``attnfuzz run`` names it)."""
        from attnfuzz.harness.casefile import case_document, write_case
        from attnfuzz.harness.definitions import finding_id

        if self.device is None:
            from attnfuzz.kernels._triton import device

            self.device = str(device())
        doc = case_document(
            failure.target,
            failure.impl,
            failure.case,
            failure.verdict,
            self.device,
            example_timeout=failure.timeout,
        )
        name = finding_id(failure.target, failure.impl, failure.verdict.key)
        # Another test's case of the same finding, written this session, is kept.
        body = json.dumps(doc["case"], sort_keys=True)
        path, n = self.out / f"{name}.json", 1
        while self._written.get(path, body) != body:
            n += 1
            path = self.out / f"{name}-{n}.json"
        self._written[path] = body
        try:
            write_case(path, doc)
        except OSError as err:  # the case is not lost: it goes into the message
            failure.unsaved = (
                f"could not write {path} ({err.strerror or err}); the case: "
                + json.dumps(doc["case"])
            )
            return
        failure.shown = _shown(path, self.here)

    def holds_case(self, path: Path) -> bool:
        return path.suffix == ".json" and any(path.is_relative_to(d) for d in self.case_dirs)

    def close(self) -> None:
        for judge in self._judges.values():
            judge.close()
        self._judges.clear()


def _pair(text: str, where: str) -> tuple[str, str]:
    target, sep, impl = text.strip().partition("=")
    if not sep or not target.strip() or not impl.strip():
        raise pytest.UsageError(f"{where} {text!r}: expected TARGET=IMPL, e.g. mtp-seq-lens=pkg:fn")
    return target.strip(), impl.strip()


def _seconds(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise pytest.UsageError(f"{where} {text!r}: expected a number of seconds > 0")
    return value


def _shown(path: Path, here: Path) -> str:
    """``path`` as the user types it: relative to where pytest was started, if under it."""
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a test item made by attnfuzz's plugin (fuzz run or case file)"
    )
    state = _State(config)
    config.stash[_STATE] = state
    if (state.named or state.mutants) and not config.getoption("help"):
        state.check()
    # Directories asked for on the command line are collected like test paths.
    # (Workers of pytest-xdist get the controller's arguments: nothing is added twice.)
    have = {Path(a.split("::")[0]).resolve() for a in config.args}
    for d in state.asked_dirs:
        if d not in have:
            config.args.append(str(d))


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None:
        state.close()


@pytest.hookimpl(tryfirst=True)
def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The way down to a directory of ``--attnfuzz-cases`` is not ignored, even where
    ``norecursedirs`` would skip it (``.attnfuzz/``, hidden) and pytest dropped it
    from the arguments as lying under another one."""
    state = config.stash.get(_STATE, None)
    if state is None or not state.asked_dirs:
        return None
    path = collection_path.resolve()
    for d in state.asked_dirs:
        if d.is_relative_to(path) or path.is_relative_to(d):
            return False
    return None


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    state = parent.config.stash.get(_STATE, None)
    if state is None or not state.case_dirs or not state.holds_case(file_path.resolve()):
        return None
    return CaseFile.from_parent(parent, path=file_path)


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect, so that they see these items
def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    made: list[pytest.Item] = []
    for target, impl in state.fuzz:
        name = f"{target}[{impl}]"
        made.append(FuzzItem.from_parent(session, name=name, nodeid=f"attnfuzz::{name}"))
    if made:
        items.extend(made)
        # Reported as collected, so that pytest's counts ("collected N items") include them.
        report = pytest.CollectReport("attnfuzz", "passed", None, made)
        session.ihook.pytest_collectreport(report=report)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """The case file of each failing case is written when its test's failure is
    reported: the case Hypothesis reports (the shrunk one), not each one it tried."""
    state = item.config.stash.get(_STATE, None)
    if state is not None and call.excinfo is not None:
        for failure in _failures(call.excinfo.value):
            if failure.shown is None and failure.unsaved is None:
                state.save(failure)
            notes = getattr(failure, "__notes__", None)
            if notes:  # Hypothesis' example: its case, many lines, is the case file's
                failure.__notes__ = [_elide_cases(note) for note in notes]
    return (yield)


def _elide_cases(text: str) -> str:
    """``text`` with each ``Case(...)`` repr (as Hypothesis prints a failing
    example's arguments, some twenty lines) written ``Case(...)``."""
    out: list[str] = []
    start = 0
    for found in re.finditer(r"\bCase\(", text):
        if found.start() < start:  # inside a case already elided
            continue
        end = _closing(text, found.end())
        if end is None:
            break
        out.append(text[start : found.end()] + "...")
        start = end
    return "".join(out) + text[start:]


def _closing(text: str, i: int) -> int | None:
    """The index of the ``)`` that closes the bracket open before ``text[i]``."""
    depth, quote = 1, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


class _Judged:
    """A case an implementation fails: the verdict, where its case file is and
    how to replay it, in a few lines (``str``)."""

    def __init__(
        self,
        target: str,
        impl: str,
        case: Case,
        verdict: Verdict,
        *,
        timeout: float | None = None,
        found_on: str | None = None,
        shown: str | None = None,
        note: str = "",
    ) -> None:
        super().__init__(f"{target} / {impl}: FAIL ({verdict.key})")
        self.target, self.impl, self.case, self.verdict = target, impl, case, verdict
        self.timeout = timeout  # the per-case timeout it was judged under, if in a child
        self.found_on = found_on or impl  # the implementation its case file names
        self.shown: str | None = shown  # the case file, once written
        self.unsaved: str | None = None  # why it could not be written, and the case
        self.note = note

    def __str__(self) -> str:
        from attnfuzz.harness.definitions import repro_command

        first, *rest = str(self.verdict).splitlines()
        lines = [f"{self.target} / {self.impl}: {first}", *rest]
        if self.note:
            lines.append(self.note)
        if self.shown is not None:
            replay = repro_command(self.shown, self.impl)
            if self.impl != self.found_on and ":" not in self.impl:
                replay += f" --impl {shlex.quote(self.impl)}"
            lines += [f"case file: {self.shown}", f"replay: {replay}"]
        else:
            lines.append(self.unsaved or "case file: written when pytest reports the failure")
        return "\n".join(lines)


class CaseFailure(_Judged, AssertionError):
    """A case an implementation fails (an ``AssertionError``)."""


class CaseTimeout(_Judged, BaseException):
    """A case that gave no verdict within the timeout, from ``attnfuzz_judge``. Not an
    ``Exception``: Hypothesis ends the test's search at once instead of shrinking
    it, each step of which would cost a whole timeout."""


def _failures(err: BaseException) -> Iterator[_Judged]:
    """The failing cases inside ``err`` (Hypothesis groups distinct ones)."""
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            yield from _failures(inner)
    elif isinstance(err, _Judged):
        yield err


def _usage_error(err: BaseException) -> bool:
    from attnfuzz.harness.target import UsageError

    return isinstance(err, UsageError)


class _Hung(BaseException):
    """Ends a fuzz item's search on a hang, with the case as it ran: not an
    ``Exception``, so that Hypothesis lets it through instead of shrinking it."""

    def __init__(self, case: Case, verdict: Verdict) -> None:
        super().__init__(str(verdict))
        self.case, self.verdict = case, verdict


class FuzzItem(pytest.Item):
    """``--attnfuzz-impl TARGET=IMPL``: Hypothesis searches ``TARGET``'s cases for one
    that ``IMPL`` fails, under the suite's settings, and shrinks it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target_name, _, rest = self.name.partition("[")
        self.impl_spec = rest[:-1]
        self.add_marker(MARKER)
        self.extra_keyword_matches.update({self.target_name, "attnfuzz"})

    def setup(self) -> None:
        # Built here, not at collection: the settings are those of the profile the
        # suite loaded, and collection stays free of torch for deselected items.
        # ``obj`` is what Hypothesis' own pytest plugin looks at (statistics, reporting).
        from attnfuzz.harness.engine import fuzz_test

        self.state = self.config.stash[_STATE]
        self.target, self.impl = self.state.resolve(self.target_name, self.impl_spec)
        self.timeout = self.state.timeout_for()
        if self.timeout is None:  # in a child, the judge prepares it before forking
            self.impl.prepare()
        self.obj = fuzz_test(self.target, self.impl, judge=self._judge)

    def _judge(self, case: Case) -> Verdict:
        from attnfuzz.harness.oracle import Check

        verdict = self.state.judge(self.target, self.impl, case, self.timeout)
        if verdict.key == Check.TIMEOUT:
            raise _Hung(case, verdict)
        return verdict

    def _failure(self, case: Case, verdict: Verdict, note: str = "") -> CaseFailure:
        return CaseFailure(
            self.target.name, self.impl.name, case, verdict, timeout=self.timeout, note=note
        )

    def runtest(self) -> None:
        try:
            self.obj()
        except _Hung as hung:
            note = "(the case as it ran: a timeout is not shrunk)"
            raise self._failure(hung.case, hung.verdict, note) from None
        except BaseException as err:
            # Hypothesis' failures, as this plugin's: its notes restate the case at length.
            found = [self._failure(e.case, e.verdict) for e in _findings(err)]
            if not found:
                raise
            if len(found) == 1:
                raise found[0] from None
            raise ExceptionGroup(f"{len(found)} distinct failures", found) from None

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        found = list(_failures(excinfo.value))
        if found:
            return "\n\n".join(map(str, found))
        if _usage_error(excinfo.value):
            return f"{self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"attnfuzz fuzz {self.target_name} / {self.impl_spec}"


def _findings(err: BaseException) -> Iterator[Any]:
    """The engine's failing cases (:class:`~attnfuzz.harness.engine.Finding`) in ``err``."""
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            yield from _findings(inner)
    elif hasattr(err, "verdict") and hasattr(err, "case"):
        yield err


class CaseFile(pytest.File):
    """One case file: one item replaying its case."""

    def collect(self) -> Iterator[pytest.Item]:
        from attnfuzz.harness.casefile import read_case

        doc = read_case(self.path)
        yield CaseItem.from_parent(self, name=doc["target"], found_on=doc["implementation"])

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        if _usage_error(excinfo.value):
            return f"not an attnfuzz case file: {excinfo.value}"
        return super().repr_failure(excinfo, style)  # type: ignore[arg-type]


class CaseItem(pytest.Item):
    """Replays a case file's case: passes when the implementation passes it."""

    def __init__(self, *, found_on: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found_on = found_on
        self.add_marker(MARKER)
        self.extra_keyword_matches.add("attnfuzz")

    def runtest(self) -> None:
        from attnfuzz.harness.export import load_case

        state = self.config.stash[_STATE]
        spec = state.impls.get(self.name)
        if spec is None and ":" in self.found_on:
            raise _Unnamed(
                f"{self.path.name} was found on {self.found_on!r}, which is not registered: "
                f"name the implementation to replay it on with {IMPL_OPTION} "
                f"{self.name}=IMPL or the ini key {IMPL_INI}"
            )
        target, impl, case, doc = load_case(self.path, spec, note_dtype=False)
        timeout = state.timeout_for(doc["settings"].get("example_timeout"))
        if timeout is None:
            impl.prepare()
        verdict = state.judge(target, impl, case, timeout)
        if not verdict.ok:
            shown = _shown(self.path, state.here)
            raise CaseFailure(
                target.name, impl.name, case, verdict, found_on=self.found_on, shown=shown
            )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        found = list(_failures(excinfo.value))
        if found:
            return str(found[0])
        if _usage_error(excinfo.value) or isinstance(excinfo.value, _Unnamed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"attnfuzz case {self.path.name} ({self.name})"


class _Unnamed(Exception):
    """A case file found on a user's implementation, which no option names."""


class SuiteJudge:
    """The ``attnfuzz_judge`` fixture: judges cases inside the suite's own tests."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.impls = state.impls

    def __repr__(self) -> str:  # as pytest and Hypothesis print the test's arguments
        named = ", ".join(f"{t}={i}" for t, i in self.impls.items())
        return f"attnfuzz_judge({named})"

    def implementation(self, target: str) -> str | None:
        """The implementation under test of ``target`` (``--attnfuzz-impl`` or the
        ini key ``attnfuzz_impl``), or None."""
        return self.impls.get(target)

    def __call__(self, target: str, case: Case, impl: str | None = None) -> Verdict:
        """Judge ``case`` on ``impl`` (default: the implementation under test of
        ``target``), in a child process unless ``--attnfuzz-in-process``. A failure
        raises :class:`CaseFailure` (an ``AssertionError``), a hang :class:`CaseTimeout`,
        each saying the verdict, the case file and the replay command. Returns the
        passing verdict."""
        __tracebackhide__ = True  # the failure is the test's, not this frame's
        from attnfuzz.harness.oracle import Check
        from attnfuzz.harness.target import UsageError

        spec = impl or self.impls.get(target)
        if spec is None:
            raise UsageError(
                f"attnfuzz_judge: no implementation of {target} named: pass impl=..., "
                f"{IMPL_OPTION} {target}=IMPL or the ini key {IMPL_INI}"
            )
        t, implementation = self.state.resolve(target, spec)
        timeout = self.state.timeout_for()
        verdict = self.state.judge(t, implementation, case, timeout)
        if verdict.ok:
            return verdict
        kind = CaseTimeout if verdict.key == Check.TIMEOUT else CaseFailure
        raise kind(t.name, implementation.name, case, verdict, timeout=timeout)


@pytest.fixture(scope="session")
def attnfuzz_judge(pytestconfig: pytest.Config) -> SuiteJudge:
    """``attnfuzz_judge(target, case, impl=None)``: judge a case, fail with its verdict
    and case file (session-scoped, so that ``@given`` tests may use it)."""
    return SuiteJudge(pytestconfig.stash[_STATE])
