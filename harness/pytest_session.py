"""The session of attnfuzz's pytest plugin (``harness/pytest_plugin.py``): the
names of its options and ini keys, and :class:`SessionState`, what they say,
parsed once per session, with the judges that judge each case (in a child
process, one per implementation, unless in process) and the case files written.

Importing this imports nothing beyond pytest: pytest imports the plugin in
every run where attnfuzz is installed, and the rest is imported on first use.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest
from attnfuzz.harness.pytest_report import display_path

if TYPE_CHECKING:
    from attnfuzz.harness.confirm import Confirmation
    from attnfuzz.harness.isolation import IsolatedJudge
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.harness.pytest_report import Judged
    from attnfuzz.harness.target import Implementation, Target
    from attnfuzz.reference.batch import Case
    from attnfuzz.reference.trace import Trace

# The names the hooks declare, the items mark and the usage errors say.
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

STATE = pytest.StashKey["SessionState"]()  # the config's: where hooks and items find it


class SessionState:
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
        # What each child judged up to the first failure of each check (a search's
        # shrinking judges failing cases after it): the history confirm() replays.
        self._histories: dict[tuple[str, str, str], list[Case]] = {}

    def check(self) -> None:
        """Register the mutants and resolve every name given, at start-up: a
        mistake is one line, not a traceback per test (and none ignored)."""
        from attnfuzz.harness.devices import check_device
        from attnfuzz.harness.errors import MESSAGE_LIMIT, UsageError, one_line
        from attnfuzz.harness.registry import add_mutants

        def refuse(where: str, err: Exception) -> NoReturn:
            raise pytest.UsageError(one_line(f"{where}: {err}", MESSAGE_LIMIT)) from None

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
            raise pytest.UsageError(one_line(err, MESSAGE_LIMIT)) from None

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
        self, target: Target, impl: Implementation, case: Case | Trace, timeout: float | None
    ) -> Verdict:
        """``target.judge(impl, case)``, in a child unless in process: a crash or a
        hang is then the verdict (``crash``, ``timeout``), never the session's end.

        A trace (:class:`~attnfuzz.reference.trace.Trace`) is judged step by step by
        one engine (:meth:`Target.judge_trace`), in a child of its own: nothing an
        earlier case left in a process is its engine's state."""
        from attnfuzz.reference.trace import Trace

        traced = isinstance(case, Trace)
        if timeout is None:
            return target.judge_trace(impl, case) if traced else target.judge(impl, case)
        key = (target.name, impl.name, timeout)
        judge = self._judges.get(key)
        if judge is None:  # one child per implementation, kept for the session
            from attnfuzz.harness.isolation import IsolatedJudge

            judge = self._judges[key] = IsolatedJudge(target, impl, timeout_s=timeout)
        verdict = judge.judge_trace(case) if traced else judge.judge(case)
        if not traced and not verdict.ok:
            self._histories.setdefault((target.name, impl.name, verdict.key), judge.history[:])
        return verdict

    def confirmation(
        self, target: Target, impl: Implementation, case: Case | Trace, verdict: Verdict
    ) -> Confirmation | None:
        """What replays of a failing ``case`` in new processes make of it
        (:func:`~attnfuzz.harness.confirm.confirm`, as ``attnfuzz run`` does): its
        history is what the implementation's long-lived child judged up to the first
        failure of its check, as ``attnfuzz run`` keeps it. None in process, where no
        new process judges it."""
        from attnfuzz.harness.confirm import confirm
        from attnfuzz.reference.trace import Trace

        judge = next((j for (t, i, _), j in self._judges.items() if (t, i) == (
            target.name, impl.name)), None)  # fmt: skip
        if judge is None:
            return None
        first = self._histories.pop((target.name, impl.name, verdict.key), None)
        history = [] if isinstance(case, Trace) else (first or list(judge.history))
        return confirm(judge, case, verdict, history)

    def save(self, failure: Judged) -> None:
        """Write ``failure``'s case file (named as ``attnfuzz run`` names it)."""
        from attnfuzz.harness.casefile import case_document, write_new_case
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
        found = doc["trace"] if "trace" in doc else doc["case"]  # a trace's: its steps
        # Another test's case of the same finding is kept, also one another xdist
        # worker writes at the same time: a file of its own (<name>-2.json).
        try:
            path = write_new_case(self.out, name, doc)
        except OSError as err:  # the case is not lost: it goes into the message
            failure.unsaved = (
                f"could not write {self.out / name}.json ({err.strerror or err}); the "
                + ("trace: " if "trace" in doc else "case: ")
                + json.dumps(found)
            )
            return
        failure.shown = display_path(path, self.here)

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
