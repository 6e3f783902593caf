"""Judging: one implementation run on one case, compared with the reference.

The declaration of a target (:mod:`attnfuzz.harness.target`) says what to
build, what the reference says and how to compare; this module runs it: it
refuses a case the target or the implementation cannot take, builds the
inputs on a device in the case's float dtype, runs the reference and then
the implementation, and returns the oracle's :class:`Verdict`. It needs the
declaration only as a type, so the declaration never depends on judging at
import time (``Target.judge`` calls :func:`judge`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import torch
from attnfuzz.harness.blame import attnfuzz_fault
from attnfuzz.harness.devices import check_dtype
from attnfuzz.harness.graph import allocations
from attnfuzz.harness.guards import (
    HarnessError,
    Lap,
    UsageError,
    fits_in_memory,
    reraise_interruption,
    sigint_noted,
)
from attnfuzz.harness.oracle import (
    Check,
    Mismatch,
    Verdict,
    exception_mismatch,
    expect_no_allocation,
    output_mismatch,
)
from attnfuzz.harness.traces import new_engine
from attnfuzz.reference.batch import Case, using_float_dtype
from attnfuzz.reference.history import RemovedField

if TYPE_CHECKING:
    from attnfuzz.harness.target import Implementation, Target

GENERIC_CHECKS = frozenset(Check)
"""The checks any target may report without declaring them: the oracle's own."""


def undeclared_checks(target: Target, mismatches: list[Mismatch]) -> list[str]:
    """The checks of ``mismatches`` that are neither generic nor among ``target.checks``."""
    known = GENERIC_CHECKS | set(target.checks)
    return sorted({str(m.check) for m in mismatches} - known)


def judge(
    target: Target,
    impl: Implementation,
    case: Case,
    device: torch.device | str | None = None,
    clock: Counter | None = None,
    fresh_engine: bool = True,
) -> Verdict:
    """Run ``impl`` on ``case`` and compare it with ``target``'s reference.

    ``fresh_engine``: the case is a step on its own, run by a new engine (the
    implementation's ``new_engine()``, when it has one, is called first); False
    for a step of a trace (:func:`attnfuzz.harness.traces.judge_trace`).

    A case the engine could not produce, or one ``impl`` was never meant to
    run (:meth:`Target.refuse_unfixed`), is refused with :class:`InvalidCase`
    before anything runs. An exception that attnfuzz's own code raised while
    the implementation ran (an adapter's glue, a stand-in:
    :mod:`~attnfuzz.harness.blame`) is a :class:`HarnessError`, never a
    finding; one that reads a field a reference dataclass no longer has
    (:class:`RemovedField`) is a :class:`UsageError` that gives the field's
    history. A mismatch whose check is neither generic (:class:`Check`) nor one
    the target declares (``Target.checks``) is a :class:`HarnessError`: the
    target's comparison and its declaration disagree. Float inputs are built in
    :meth:`Target.float_dtype_name` (a reduced precision needs a CUDA
    ``device``: :class:`UsageError` otherwise).

    The verdict's ``statistics`` hold the case's guided boundary measures
    (:meth:`Target.boundary`) and the target's ``statistics`` of the outputs.
    ``clock``, when given, accumulates the seconds spent in each phase:
    ``inputs``, ``reference``, ``implementation`` and ``oracle``.
    """
    lap = Lap(clock)
    if device is None:
        from attnfuzz.kernels._triton import device as kernel_device

        device = kernel_device()
    target.refuse_invalid(case, alone=fresh_engine)  # a new engine's: its first step
    target.refuse_unfixed(impl, case)
    dtype = target.float_dtype_name(case)
    check_dtype(dtype, torch.device(device), "the case's dtype" if case.dtype else None)
    with fits_in_memory(target.name), using_float_dtype(dtype):
        measured = target.boundary(case)  # of the case: in every verdict, failing ones too
        inputs = target.make_inputs(case, torch.device(device))
        lap("inputs")
        expected = target.reference(case, inputs)  # before the implementation writes its buffers
        lap("reference")
    allocated: list[str] = []
    with sigint_noted() as interrupted:
        try:
            if fresh_engine:
                new_engine(impl)
            if target.asks_graph_safety(impl):
                got, allocated = allocations(impl.fn, inputs)
            else:
                got = impl.fn(inputs)
        except BaseException as err:  # an exception of any class on a valid case is a finding
            reraise_interruption(err, interrupted)
            if isinstance(err, RemovedField):  # written against an older contract
                raise UsageError(f"implementation {impl.name}: {err}") from err
            # ... unless attnfuzz raised it: judged from below this frame.
            below = err.__traceback__.tb_next if err.__traceback__ is not None else None
            fault = attnfuzz_fault(err, below)
            if fault is not None:
                raise HarnessError(str(fault)) from err
            lap("implementation")
            return Verdict([exception_mismatch(impl.name, err)], dict(measured))
        lap("implementation")
        # Whatever came back is judged: an output the oracle cannot even read
        # (an attribute that raises, a tensor-like that is not) is a finding.
        try:
            mismatches = target.compare(case, inputs, expected, got)
        except BaseException as err:
            reraise_interruption(err, interrupted)
            mismatches = [output_mismatch(impl.name, err)]
        undeclared = undeclared_checks(target, mismatches)
        if undeclared:  # the harness's mistake, never the implementation's verdict
            raise HarnessError(
                f"target {target.name} reported check(s) {', '.join(undeclared)}, neither "
                f"generic nor declared in its checks ({', '.join(target.checks) or 'none'})"
            )
        # Graph safety first: an allocation is the finding even when values agree.
        verdict = Verdict(expect_no_allocation(impl.name, allocated) + mismatches)
        verdict.statistics.update(measured)
        if target.statistics is not None:
            try:
                verdict.statistics.update(target.statistics(got))
            except BaseException as err:
                reraise_interruption(err, interrupted)
                if verdict.ok:  # outputs already rejected have no counts; the verdict stands
                    verdict.mismatches.append(output_mismatch(impl.name, err))
    lap("oracle")
    return verdict
