"""The test items of attnfuzz's pytest plugin (``harness/pytest_plugin.py``) and
the judge of its ``attnfuzz_judge`` fixture.

- :class:`FuzzItem`, ``attnfuzz::TARGET[IMPL]``: a Hypothesis search of
  ``TARGET``'s cases for one that ``IMPL`` fails, under the suite's settings
  (of traces of one engine's steps for an implementation that lives across
  steps, ``Implementation.traced``).
- :class:`CaseFile` and its :class:`CaseItem`: a case file replayed as a test
  (a trace case file's trace step by step, by one new engine in a child).
- :class:`SuiteJudge`: judges a case (or a trace) inside the suite's own tests.

Each fails with the short report of ``harness/pytest_report.py``, never a
traceback through this module. Importing this imports nothing beyond pytest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from attnfuzz.harness.pytest_report import CaseFailure, CaseTimeout, display_path, judged_failures
from attnfuzz.harness.pytest_session import IMPL_INI, IMPL_OPTION, MARKER, STATE, SessionState

if TYPE_CHECKING:
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.reference.batch import Case
    from attnfuzz.reference.trace import Trace


def _usage_error(err: BaseException) -> bool:
    from attnfuzz.harness.errors import UsageError

    return isinstance(err, UsageError)


class _Hung(BaseException):
    """Ends a fuzz item's search on a hang, with the case as it ran: not an
    ``Exception``, so that Hypothesis lets it through instead of shrinking it."""

    def __init__(self, case: Case | Trace, verdict: Verdict) -> None:
        super().__init__(str(verdict))
        self.case, self.verdict = case, verdict


class FuzzItem(pytest.Item):
    """``--attnfuzz-impl TARGET=IMPL``: Hypothesis searches ``TARGET``'s cases for one
    that ``IMPL`` fails, under the suite's settings, and shrinks it. An implementation
    that lives across steps (``Implementation.traced``) is searched with traces, each
    judged by a new engine (in a child of its own, unless in process)."""

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

        self.state = self.config.stash[STATE]
        self.target, self.impl = self.state.resolve(self.target_name, self.impl_spec)
        self.timeout = self.state.timeout_for()
        if self.timeout is None:  # in a child, the judge prepares it before forking
            self.impl.prepare()
        self.obj = fuzz_test(self.target, self.impl, judge=self._judge, traced=self.impl.traced)

    def _judge(self, case: Case | Trace) -> Verdict:
        from attnfuzz.harness.oracle import Check

        verdict = self.state.judge(self.target, self.impl, case, self.timeout)
        if verdict.key == Check.TIMEOUT:
            raise _Hung(case, verdict)
        return verdict

    def _history_note(self, case: Case | Trace, verdict: Verdict) -> str:
        """What replays of the failing case in new processes said, when it does not
        fail each time (:meth:`SessionState.confirmation`)."""
        from attnfuzz.harness.confirm import Status

        c = self.state.confirmation(self.target, self.impl, case, verdict)
        if c is not None and c.status is Status.HISTORY_DEPENDENT:
            return (
                "(HISTORY-DEPENDENT: this case passes in a new process; it failed only "
                "after other examples ran in the same one: fuzz it with traces, "
                "attnfuzz run --trace)"
            )
        if c is not None and c.status is Status.FLAKY:
            return (
                f"(FLAKY: it failed {c.failed} of {c.replays} replays of this case, "
                "each in a new process)"
            )
        return ""

    def _failure(self, case: Case | Trace, verdict: Verdict, note: str = "") -> CaseFailure:
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
            found = [
                self._failure(e.case, e.verdict, self._history_note(e.case, e.verdict))
                for e in _findings(err)
            ]
            if not found:
                raise
            if len(found) == 1:
                raise found[0] from None
            raise ExceptionGroup(f"{len(found)} distinct failures", found) from None

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        found = list(judged_failures(excinfo.value))
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
    """Replays a case file's case: passes when the implementation passes it. A trace
    case file's trace is replayed step by step by one new engine (in a child of its
    own, unless in process), and fails at the step that fails."""

    def __init__(self, *, found_on: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found_on = found_on
        self.add_marker(MARKER)
        self.extra_keyword_matches.add("attnfuzz")

    def runtest(self) -> None:
        from attnfuzz.harness.casefile.load import resolve_case

        state = self.config.stash[STATE]
        spec = state.impls.get(self.name)
        if spec is None and ":" in self.found_on:
            raise _Unnamed(
                f"{self.path.name} was found on {self.found_on!r}, which is not registered: "
                f"name the implementation to replay it on with {IMPL_OPTION} "
                f"{self.name}=IMPL or the ini key {IMPL_INI}"
            )
        target, impl, case, doc = resolve_case(self.path, spec, note_dtype=False)
        timeout = state.timeout_for(doc["settings"].get("example_timeout"))
        if timeout is None:
            impl.prepare()
        verdict = state.judge(target, impl, case, timeout)
        if not verdict.ok:
            shown = display_path(self.path, state.here)
            note = ""
            if doc.get("step") is not None and doc["step"] != verdict.step:
                note = f"(its case file records it failing at step {doc['step']})"
            raise CaseFailure(
                target.name,
                impl.name,
                case,
                verdict,
                found_on=self.found_on,
                shown=shown,
                note=note,
            )

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style=None) -> str:  # type: ignore[override]
        found = list(judged_failures(excinfo.value))
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

    def __init__(self, state: SessionState) -> None:
        self.state = state
        self.impls = state.impls

    def __repr__(self) -> str:  # as pytest and Hypothesis print the test's arguments
        named = ", ".join(f"{t}={i}" for t, i in self.impls.items())
        return f"attnfuzz_judge({named})"

    def implementation(self, target: str) -> str | None:
        """The implementation under test of ``target`` (``--attnfuzz-impl`` or the
        ini key ``attnfuzz_impl``), or None."""
        return self.impls.get(target)

    def __call__(self, target: str, case: Case | Trace, impl: str | None = None) -> Verdict:
        """Judge ``case`` on ``impl`` (default: the implementation under test of
        ``target``), in a child process unless ``--attnfuzz-in-process``; a
        :class:`~attnfuzz.reference.trace.Trace` step by step by one new engine. A failure
        raises :class:`CaseFailure` (an ``AssertionError``), a hang :class:`CaseTimeout`,
        each saying the verdict, the case file and the replay command. Returns the
        passing verdict."""
        __tracebackhide__ = True  # the failure is the test's, not this frame's
        from attnfuzz.harness.errors import UsageError
        from attnfuzz.harness.oracle import Check

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
