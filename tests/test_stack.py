"""Judging on a frame stack of its own (harness/stack.py): the same result, whatever depth
the caller starts at, and no chunk of CPython's frame stack mapped anew on every call."""

from __future__ import annotations

import resource
import sys

import pytest
from attnfuzz.harness import isolation, traces
from attnfuzz.harness.oracle import Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.stack import on_own_stack
from attnfuzz.harness.target import Implementation, Kind
from attnfuzz.harness.testing import hand_case
from attnfuzz.kernels import slot_mapping as kernels
from attnfuzz.reference.trace import Trace

CALLS = 2000


def _leaf() -> int:
    return 1


def _loop() -> int:
    """``CALLS`` calls of a small function from one frame: the hot loop of an engine."""
    total = 0
    for _ in range(CALLS):
        total += _leaf()
    return total


def _at_depth(depth: int, fn):  # noqa: ANN001, ANN202
    """``fn()`` from ``depth`` frames deeper than here."""
    return fn() if depth == 0 else _at_depth(depth - 1, fn)


def _worst_faults(run) -> int:  # noqa: ANN001
    """The most page faults one :func:`_loop` took, over every depth it can start at
    within two chunks of 16 KiB: where a call finds no room left in its chunk, each of
    the ``CALLS`` calls maps a new one and touches it."""
    worst = 0
    for depth in range(400):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        assert run(lambda d=depth: _at_depth(d, _loop)) == CALLS
        worst = max(worst, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return worst


def test_a_hot_loop_maps_no_chunk_per_call_on_its_own_stack():
    assert _worst_faults(lambda fn: on_own_stack(fn)) < CALLS // 10


@pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="CPython 3.13 and later keep a popped chunk for reuse"
)
def test_without_it_some_depth_maps_a_chunk_on_every_call():
    """The check above can fail: called at the depth it happens to find, the same loop
    maps (and faults in) a chunk on every call."""
    assert _worst_faults(lambda fn: fn()) >= CALLS


def test_the_result_and_the_exception_are_the_functions():
    assert on_own_stack(divmod, 7, 2) == (3, 1)
    assert on_own_stack(int, "ff", base=16) == 255
    with pytest.raises(ZeroDivisionError):
        on_own_stack(divmod, 1, 0)
    # Recursion as deep as the interpreter allows a judge still fits above it.
    limit = sys.getrecursionlimit()
    assert on_own_stack(_at_depth, limit - 100, _leaf) == 1


def _runs_on_own_stack() -> bool:
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code is on_own_stack.__code__:
            return True
        frame = frame.f_back
    return False


def test_every_judgement_runs_on_its_own_stack(monkeypatch):
    seen: list[bool] = []

    def slot_mapping(inputs):  # noqa: ANN001, ANN202
        seen.append(_runs_on_own_stack())
        return kernels.slot_mapping(inputs)

    target = get_target("slot-mapping")
    impl = Implementation("seen", slot_mapping, Kind.FIXED)
    assert target.judge(impl, hand_case((1,), (3,))).ok
    # A trace's judgement, from its first frame.
    monkeypatch.setattr(traces, "judge_trace", lambda *a: seen.append(_runs_on_own_stack()))
    target.judge_trace(impl, Trace(hand_case((1,), (3,)).config, ()))
    assert seen == [True, True]


def test_an_isolated_childs_trace_runs_on_its_own_stack(monkeypatch):
    """A trace judged in a child process (a campaign's, ``--isolate``) is judged there
    from the child's own frames, not through :meth:`Target.judge_trace`."""

    def judge_trace(*args) -> Verdict:  # noqa: ANN002
        if not _runs_on_own_stack():
            raise AssertionError("judged straight from the child's loop")
        return Verdict()

    monkeypatch.setattr(isolation, "judge_trace", judge_trace)  # the forked child's too
    target = get_target("slot-mapping")
    with isolation.IsolatedJudge(target, target.resolve("triton")) as judge:
        case = hand_case((1,), (3,))
        assert judge.judge_trace(Trace(case.config, (case.batch,))).ok
