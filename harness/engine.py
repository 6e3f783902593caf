"""The one fuzz engine: corpus key and search loop.

``attnfuzz run`` (:func:`attnfuzz.harness.runner.fuzz`), a campaign's workers
(:mod:`attnfuzz.harness.campaign.worker`), the zoo, the benchmarks and the
pytest plugin all search through :func:`fuzz_test`, with settings from
:func:`~attnfuzz.harness.settings.fuzz_settings` and a database from
:func:`~attnfuzz.harness.database.open_database`: Hypothesis
generates, shrinks and remembers; this module wires a target's oracle into a
property, labels scenario classes with :func:`hypothesis.event`, feeds the
target's boundary statistics to :func:`hypothesis.target` and names the corpus.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.settings import fuzz_settings
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.traces import trace_labels
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies.batches import SMALL, Scale, scenario_labels
from hypothesis import event, example, given
from hypothesis import settings as Settings
from hypothesis import target as guide


def corpus_key(target: str, implementation: str, traced: bool = False) -> bytes:
    """The example-database key of a target and implementation: it names only what
    is fuzzed, so saved failures survive edits of the harness and are shared by
    ``attnfuzz run``, ``attnfuzz campaign`` and the pytest plugin. Trace runs
    (``traced``) keep their own corpus: their examples are traces."""
    key = f"attnfuzz.campaign/{target}/{implementation}"
    return f"{key}/trace".encode() if traced else key.encode()


# ---------------------------------------------------------------------------
# The search loop
# ---------------------------------------------------------------------------


class Finding(Exception):
    """A failing case, raised inside the property so that Hypothesis shrinks it.

    Each verdict key has its own subclass (:func:`finding_class`), so that
    Hypothesis tells distinct failures apart when it reports several bugs.
    """

    def __init__(self, verdict: Verdict, case: Case | None = None):
        super().__init__(str(verdict))
        self.verdict = verdict
        self.case = case


_FINDINGS: dict[str, type[Finding]] = {}


def finding_class(key: str) -> type[Finding]:
    """The subclass of :class:`Finding` of one verdict key (one per key, made once)."""
    if key not in _FINDINGS:
        _FINDINGS[key] = type(f"Finding[{key}]", (Finding,), {"__module__": __name__})
    return _FINDINGS[key]


Example = Case | Trace  # one step on its own, or one engine's steps
Judge = Callable[[Example], Verdict]
OnCase = Callable[[Example, Verdict, list[str]], None]


def fuzz_test(
    target: Target,
    impl: Implementation,
    *,
    settings: Settings | None = None,
    judge: Judge | None = None,
    scale: Scale = SMALL,
    on_case: OnCase | None = None,
    examples: Sequence[Case] = (),
    traced: bool = False,
) -> Callable[[], None]:
    """A Hypothesis test of ``impl`` over ``target.cases(scale, impl)``; call it to search.

    The cases are drawn with ``impl.fixes``' engine values. For each case it
    emits the case's scenario labels with :func:`hypothesis.event`, judges the
    case (``judge``; by default :meth:`Target.judge` in this process on the
    kernels' device), feeds each of ``target.guided`` present in the verdict's
    statistics to :func:`hypothesis.target` (labelled by its name; the search
    maximizes it), calls ``on_case(case, verdict, labels)``, and raises
    :func:`finding_class` ``(verdict.key)`` (a :class:`Finding`) on a failing
    verdict, so that Hypothesis shrinks it.

    ``examples`` are judged first, in order, as Hypothesis explicit examples
    (:func:`hypothesis.example`): never shrunk, and a failing one ends the search.
    ``settings`` defaults to :func:`fuzz_settings` ``()`` (the active profile).
    The test's database key is :func:`corpus_key` of the target and
    implementation, whatever the test's name. A ``judge`` or ``on_case`` may
    raise a :class:`BaseException` that is not an :class:`Exception` to end
    the search: Hypothesis lets it through. Seed the test with
    :func:`hypothesis.seed` for a derandomized run.

    ``traced``: the examples are traces (``target.traces(scale, impl)``), each
    judged as one engine's life (by default :meth:`Target.judge_trace` in this
    process), and their corpus is :func:`corpus_key` of the implementation's
    trace runs.
    """
    if judge is None:

        def judge(example: Example) -> Verdict:
            if isinstance(example, Trace):
                return target.judge_trace(impl, example)
            return target.judge(impl, example)

    guided = tuple(target.guided)
    labelled = trace_labels if traced else scenario_labels

    def check(case: Example) -> None:
        labels = labelled(case)
        for label in labels:
            event(label)
        verdict = judge(case)
        for name in guided:
            if name in verdict.statistics:
                guide(float(verdict.statistics[name]), label=name)
        if on_case is not None:
            on_case(case, verdict, labels)
        if not verdict.ok:
            raise finding_class(verdict.key)(verdict, case)

    check.__name__ = re.sub(r"\W", "_", f"fuzz_{target.name}_{impl.name}")
    for case in reversed(examples):  # the outermost @example runs first
        check = example(case)(check)
    drawn = target.traces(scale, impl) if traced else target.cases(scale, impl)
    test = (settings if settings is not None else fuzz_settings())(given(drawn)(check))
    # One corpus per target and implementation (and its trace runs), shared by every command.
    key = corpus_key(target.name, impl.name, traced)
    test._hypothesis_internal_database_key = key  # type: ignore[attr-defined]
    return test
