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

Every item this plugin makes carries the marker ``attnfuzz`` (``-m attnfuzz``).
A failure's message is the verdict, then the case as a case file
(``attnfuzz.case/1``), ready to save and replay with ``attnfuzz repro``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.harness.target import Implementation
    from attnfuzz.reference.batch import Case

IMPL_OPTION = "--attnfuzz-impl"
CASES_OPTION = "--attnfuzz-cases"
MUTANTS_OPTION = "--attnfuzz-mutants"
IMPL_INI = "attnfuzz_impl"
CASES_INI = "attnfuzz_cases"
MUTANTS_INI = "attnfuzz_mutants"
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


class _State:
    """What the options and ini keys say, parsed once per session."""

    def __init__(self, config: pytest.Config) -> None:
        self.fuzz: list[tuple[str, str]] = [
            _pair(text, IMPL_OPTION) for text in config.getoption("attnfuzz_impl")
        ]
        self.impls: dict[str, str] = dict(_pair(text, IMPL_INI) for text in config.getini(IMPL_INI))
        self.impls.update(self.fuzz)  # the command line wins
        asked = [Path(d).resolve() for d in config.getoption("attnfuzz_cases")]
        for d in asked:
            if not d.is_dir():
                raise pytest.UsageError(f"{CASES_OPTION} {d}: not a directory")
        self.case_dirs = asked + [Path(d).resolve() for d in config.getini(CASES_INI)]
        self.asked_dirs = asked
        self.mutants: list[str] = [
            *config.getini(MUTANTS_INI),
            *config.getoption("attnfuzz_mutants"),
        ]
        self._registered = False

    def register_mutants(self) -> None:
        """Register the user's mutants, once, before the first name is resolved (not
        at start-up: a suite that runs none of attnfuzz's items imports nothing)."""
        if self._registered:
            return
        from attnfuzz.harness.registry import add_mutants

        for spec in self.mutants:
            add_mutants(spec)
        self._registered = True

    def holds_case(self, path: Path) -> bool:
        return path.suffix == ".json" and any(path.is_relative_to(d) for d in self.case_dirs)


def _pair(text: str, where: str) -> tuple[str, str]:
    target, sep, impl = text.strip().partition("=")
    if not sep or not target.strip() or not impl.strip():
        raise pytest.UsageError(f"{where} {text!r}: expected TARGET=IMPL, e.g. mtp-seq-lens=pkg:fn")
    return target.strip(), impl.strip()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: a test item made by attnfuzz's plugin (fuzz run or case file)"
    )
    state = _State(config)
    config.stash[_STATE] = state
    # Directories asked for on the command line are collected like test paths.
    # (Workers of pytest-xdist get the controller's arguments: nothing is added twice.)
    have = {Path(a.split("::")[0]).resolve() for a in config.args}
    for d in state.asked_dirs:
        if d not in have:
            config.args.append(str(d))


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


def failure_text(target: str, impl: Implementation, case: Case, verdict: Verdict) -> str:
    """The verdict, then the case as a case file and how to replay it."""
    from attnfuzz.harness.casefile import case_document
    from attnfuzz.harness.definitions import finding_id, repro_command

    document = case_document(target, impl.name, case, verdict)
    name = finding_id(target, impl.name, verdict.key) + ".json"  # as `attnfuzz run` names it
    return (
        f"{target} / {impl.name}: {verdict}\n"
        f"case file (save as {name}; replay: {repro_command(name, impl.name)}):\n"
        + json.dumps(document, indent=2)
    )


class CaseFailure(AssertionError):
    """A case an implementation fails; the message is :func:`failure_text`'s."""

    def __init__(self, target: str, impl: Implementation, case: Case, verdict: Verdict) -> None:
        self.verdict, self.case = verdict, case
        super().__init__(failure_text(target, impl, case, verdict))


def _failures(err: BaseException) -> Iterator[BaseException]:
    """The failing cases inside ``err`` (Hypothesis groups distinct ones)."""
    if isinstance(err, BaseExceptionGroup):
        for inner in err.exceptions:
            yield from _failures(inner)
    elif hasattr(err, "verdict") and hasattr(err, "case"):
        yield err


def _usage_error(err: BaseException) -> bool:
    from attnfuzz.harness.target import UsageError

    return isinstance(err, UsageError)


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
        from attnfuzz.harness.registry import get_target

        self.config.stash[_STATE].register_mutants()
        self.target = get_target(self.target_name)
        self.impl = self.target.resolve(self.impl_spec)
        self.impl.prepare()
        self.obj = fuzz_test(self.target, self.impl)

    def runtest(self) -> None:
        self.obj()

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        found = list(_failures(excinfo.value))
        if found:
            return "\n\n".join(
                failure_text(self.target.name, self.impl, e.case, e.verdict)  # type: ignore[attr-defined]
                for e in found
            )
        if _usage_error(excinfo.value):
            return f"{self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"attnfuzz fuzz {self.target_name} / {self.impl_spec}"


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
        state.register_mutants()
        spec = state.impls.get(self.name)
        if spec is None and ":" in self.found_on:
            raise _Unnamed(
                f"{self.path.name} was found on {self.found_on!r}, which is not registered: "
                f"name the implementation to replay it on with {IMPL_OPTION} "
                f"{self.name}=IMPL or the ini key {IMPL_INI}"
            )
        target, impl, case, _ = load_case(self.path, spec, note_dtype=False)
        impl.prepare()
        verdict = target.judge(impl, case)
        if not verdict.ok:
            raise CaseFailure(target.name, impl, case, verdict)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        found = list(_failures(excinfo.value))
        if found:
            return f"{self.path.name}: {found[0]}"
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

    def implementation(self, target: str) -> str | None:
        """The implementation under test of ``target`` (``--attnfuzz-impl`` or the
        ini key ``attnfuzz_impl``), or None."""
        return self.impls.get(target)

    def __call__(self, target: str, case: Case, impl: str | None = None) -> Verdict:
        """Judge ``case`` on ``impl`` (default: the implementation under test of
        ``target``); a failure raises :class:`CaseFailure` (an ``AssertionError``)
        whose message is the verdict and the case file. Returns the passing verdict."""
        from attnfuzz.harness.registry import get_target
        from attnfuzz.harness.target import UsageError

        self.state.register_mutants()
        spec = impl or self.impls.get(target)
        if spec is None:
            raise UsageError(
                f"attnfuzz_judge: no implementation of {target} named: pass impl=..., "
                f"{IMPL_OPTION} {target}=IMPL or the ini key {IMPL_INI}"
            )
        t = get_target(target)
        implementation = t.resolve(spec)
        verdict = t.judge(implementation, case)
        if not verdict.ok:
            raise CaseFailure(t.name, implementation, case, verdict)
        return verdict


@pytest.fixture(scope="session")
def attnfuzz_judge(pytestconfig: pytest.Config) -> SuiteJudge:
    """``attnfuzz_judge(target, case, impl=None)``: judge a case, fail with its verdict
    and case file (session-scoped, so that ``@given`` tests may use it)."""
    return SuiteJudge(pytestconfig.stash[_STATE])
