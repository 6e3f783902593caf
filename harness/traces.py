"""Judging a trace: one implementation kept across the steps of one engine's life.

:func:`judge_trace` starts a new engine (the implementation's ``new_engine()``,
when it has one) and judges each step of a
:class:`~attnfuzz.reference.trace.Trace` in order with
:func:`~attnfuzz.harness.judging.judge`, the implementation keeping whatever
it keeps between calls, and the reference judging each step on its own. The
first failing step ends the trace: its verdict, with ``step`` set, is the
trace's. In one process an implementation that keeps state in a module (a
user's buffer) is not new for each trace; the isolated judge
(:meth:`~attnfuzz.harness.isolation.IsolatedJudge.judge_trace`) runs every
trace in a fresh process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnfuzz.harness.errors import InvalidCase
from attnfuzz.harness.oracle import Verdict, exception_mismatch
from attnfuzz.reference.trace import Trace, first_step_violations, trace_violations

if TYPE_CHECKING:
    import torch
    from attnfuzz.harness.target import Implementation, Target
    from attnfuzz.reference.batch import Batch, Case


def new_engine(impl: Implementation) -> None:
    """Drop what ``impl`` keeps across steps, when it says how (``fn.new_engine()``):
    the next call is the first step of a new engine."""
    hook: Any = getattr(impl.fn, "new_engine", None)
    if callable(hook):
        hook()


def refuse_unjudgeable_trace(target: Target, impl: Implementation, trace: Trace) -> None:
    """:class:`InvalidCase` for a trace no engine could live
    (:func:`refuse_invalid_trace`), or a step of which ``impl`` cannot judge: one it
    declines or whose fixed fields differ, or (:class:`Unreachable`) one outside its
    engine's limits (:meth:`Target.refuse_unfixed`)."""
    refuse_invalid_trace(target, trace)
    for k in range(len(trace.steps)):
        target.refuse_unfixed(impl, trace.case(k), f"step {k}")


def refuse_invalid_trace(target: Target, trace: Trace, where: str | None = None) -> None:
    """:class:`InvalidCase` for a trace no engine could live: a step the target refuses,
    or steps that disagree on what a request holds."""
    for k in range(len(trace.steps)):
        target.refuse_invalid(trace.case(k), f"{where + ': ' if where else ''}step {k}")
    broken = trace_violations(trace)
    if broken:
        prefix = f"{where}: " if where else ""
        raise InvalidCase(f"{prefix}not a life an engine can have: {'; '.join(broken)}")


def refuse_continuing(step: Batch, prefix: str = "") -> None:
    """:class:`InvalidCase` for a step judged on its own (by a new engine, whose first
    step it is) whose scheduler fields say a request continues from an earlier step,
    as a trace's step 0 is refused (:func:`~attnfuzz.reference.trace.trace_violations`)."""
    continuing = first_step_violations(step)
    if continuing:
        more = f" (and {len(continuing) - 1} more)" if len(continuing) > 1 else ""
        raise InvalidCase(
            f"{prefix}not a first step an engine can have: {continuing[0]}{more}; a case "
            "on its own is a new engine's first step, one that continues others a trace's"
        )


def judge_trace(
    target: Target,
    impl: Implementation,
    trace: Trace,
    device: torch.device | str | None = None,
    clock: Counter | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Verdict:
    """The verdict of ``impl`` over ``trace``'s steps, judged one after another by one
    engine: the first failing step's verdict (``step`` set to its index), else a pass.

    ``on_step(k)`` is told before step ``k`` runs (the isolated judge's child tells
    its parent, so that a crash or a hang is placed at its step and each step has
    its own timeout).

    Its statistics are the largest each step reports (the guided measures of the
    step nearest a bug's condition). A trace or step that no engine could produce
    is refused (:class:`InvalidCase`) before anything runs.
    """
    from attnfuzz.harness.judging import judge

    refuse_unjudgeable_trace(target, impl, trace)
    if on_step is not None:
        on_step(0)
    try:
        new_engine(impl)
    except Exception as err:  # noqa: BLE001 - the implementation's own reset failed: a finding
        return Verdict([exception_mismatch(f"{impl.name}.new_engine", err)], step=0)
    statistics: dict[str, int] = {}
    for k in range(len(trace.steps)):
        if on_step is not None and k:
            on_step(k)
        verdict = judge(target, impl, trace.case(k), device, clock, fresh_engine=False)
        for name, value in verdict.statistics.items():
            statistics[name] = max(statistics.get(name, value), value)
        if not verdict.ok:
            verdict.step = k
            verdict.statistics = statistics
            return verdict
    return Verdict([], statistics)


def lived(example: Case | Trace, verdict: Verdict) -> Case | Trace:
    """What of ``example`` ran: a trace that failed at step ``k`` up to that step (the
    steps after it never ran, and a case file holds none of them); anything else whole."""
    if isinstance(example, Trace) and verdict.step is not None:
        return example.prefix(verdict.step + 1)
    return example


def trace_labels(trace: Trace) -> list[str]:
    """Scenario labels of a trace: its length, what happened across its steps, and
    every label of its steps (:func:`~attnfuzz.strategies.batches.scenario_labels`)."""
    from attnfuzz.strategies.batches import scenario_labels

    labels = {f"steps={len(trace.steps)}"}
    seen: dict[int, int] = {}
    for k in range(len(trace.steps)):
        step = trace.steps[k]
        ids = step.request_ids
        if k and any(i not in ids for i in seen):
            labels.add("request_left")
        if k and step.num_reqs < trace.steps[k - 1].num_reqs:
            labels.add("fewer_requests_than_before")
        if any(
            i in seen and c < seen[i] for i, c in zip(ids, step.num_computed_tokens, strict=True)
        ):
            labels.add("drafts_rolled_back")
        if (
            k
            and step.pages
            and any(
                p in {q for row in trace.steps[k - 1].pages for q in row}
                for i, row in zip(ids, step.pages, strict=True)
                if i not in seen
                for p in row
            )
        ):
            labels.add("pages_reused")
        seen = dict(zip(ids, step.seq_lens, strict=True))
        labels.update(scenario_labels(trace.case(k)))
    return sorted(labels)


def reachable_step(
    result: Any, judge_trace: Callable[[Trace], Any], judge: Callable[[Case], Any]
) -> tuple[Case, Callable[[Case], Any]]:
    """The case whose reachability a finding has, and how to judge variants of it: a
    trace's failing step, judged after the steps that led to it."""
    found = result.case
    if not isinstance(found, Trace):
        assert found is not None
        return found, judge
    assert result.verdict is not None and result.verdict.step is not None
    k = result.verdict.step

    def judge_step(case: Case) -> Any:
        lived = Trace(case.config, (*found.steps[:k], case.batch), case.params, case.dtype)
        return judge_trace(lived)

    return found.case(k), judge_step
