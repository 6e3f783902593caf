"""Judging in a child process, so that nothing an implementation does ends the command.

An implementation under test may raise anything (``SystemExit`` and
``KeyboardInterrupt`` included), hang, abort, segfault, call ``os._exit``,
flood the terminal or change global state. :class:`IsolatedJudge` runs
:meth:`Target.judge` in a child process forked from the caller (the kernels
and the user's module are already imported, so a new child costs
milliseconds) and turns what happened into a :class:`Verdict`:

- the call returned or raised: the child's verdict (an exception of any class
  raised by the implementation is the ``exception`` check);
- no verdict within ``timeout_s``: the ``timeout`` check, with the frame the
  child was in (:mod:`faulthandler` writes it just before the deadline);
- the child died: the ``crash`` check, with the signal or exit status and,
  for a fatal signal, the frame it died in.

A new child is forked for the next case after a timeout or a crash. The
child ignores SIGINT: Ctrl-C is the caller's to handle, so a
``KeyboardInterrupt`` seen in the child is always the implementation's own.
Its standard output and error go to a file of the judge's own (kept to its
last :data:`OUTPUT_CAP` bytes), never to the terminal.

The same judge serves ``attnfuzz run``, ``attnfuzz repro`` and each campaign
worker, so the three report the same checks for the same case.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import time
import traceback
from collections import Counter
from typing import Any

from attnfuzz.harness.blame import attnfuzz_fault
from attnfuzz.harness.errors import HarnessError, UsageError
from attnfuzz.harness.faults import crash_mismatch, describe_fault, exit_detail, timeout_mismatch
from attnfuzz.harness.lifetime import die_with_parent, scratch_dir
from attnfuzz.harness.oracle import Check, Mismatch, Verdict
from attnfuzz.harness.stack import on_own_stack
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.harness.traces import judge_trace
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace

DEFAULT_TIMEOUT_S = 30.0  # per example; the first Triton call on a GPU compiles
# faulthandler dumps the hung child's frames this long before it is killed.
DUMP_LEAD_S = 0.5
OUTPUT_CAP = 4 << 20  # bytes of the children's stdout/stderr kept
HISTORY = 32  # cases a judge remembers its child judged (IsolatedJudge.history)


class OutOfTime(Exception):
    """The deadline passed while a case was being judged: it has no verdict."""


def _child(
    conn: Any,
    parent_end: Any,
    target: Target | str,
    impl: Implementation | str,
    device: str | None,
    timeout_s: float,
    fault_path: str,
    output_path: str,
    parent_pid: int,
) -> None:
    """The child's loop: judge each case it is sent until the pipe closes."""
    die_with_parent(parent_pid)  # a judge killed from outside takes its child with it
    parent_end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's
    if isinstance(target, str):  # spawned: names, resolved here
        from attnfuzz.harness.registry import get_target

        target = get_target(target)
        impl = target.resolve(impl)
    if device is None or str(device).startswith("cpu"):
        import torch

        # Examples are tiny tensors: a second thread only contends, badly on a
        # loaded machine (vLLM's repeat_interleave: 24 ms a call on two threads, 6 us on one).
        torch.set_num_threads(1)
    out = os.open(output_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    fault_file = open(fault_path, "w")  # noqa: SIM115 - open for the child's life
    # The judge alone says how a crash is reported: a fatal-signal handler that a
    # library installed in the parent (vLLM's code loads tvm_ffi, which installs
    # one for SIGSEGV) would otherwise run after faulthandler's dump, abort, and
    # turn a segfault into a SIGABRT or lose its frame.
    faulthandler.disable()
    for name in ("SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    faulthandler.enable(file=fault_file)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        clock: Counter = Counter()
        traced = "steps" in message  # a trace (this child is new), else one case

        def arm() -> None:  # the hung frame is dumped just before the parent's deadline
            faulthandler.dump_traceback_later(max(timeout_s - DUMP_LEAD_S, 0.1), file=fault_file)

        def on_step(k: int) -> None:
            # Each step has its own timeout, and a crash or hang is placed at its step.
            arm()
            conn.send(("step", k))

        arm()
        try:
            if traced:
                trace = Trace.from_dict(message)
                verdict = on_own_stack(judge_trace, target, impl, trace, device, clock, on_step)
            else:
                verdict = target.judge(impl, Case.from_dict(message), device, clock)
            reply: tuple = ("verdict", _verdict_state(verdict), dict(clock))
        except UsageError as err:
            reply = ("usage", f"{type(err).__name__}\n{err}")
        except HarnessError as err:
            reply = ("harness", str(err))
        except BaseException as err:  # noqa: BLE001 - the harness failed (a reference raised): where
            fault = attnfuzz_fault(err, err.__traceback__)
            reply = ("harness", str(fault) if fault else _one_exception(err))
        finally:
            faulthandler.cancel_dump_traceback_later()
        fault_file.seek(0)
        fault_file.truncate()
        conn.send(reply)


def _one_exception(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(err)).strip().replace("\n", " ")


def _verdict_state(verdict: Verdict) -> dict[str, Any]:
    return {
        "mismatches": [m.to_dict() for m in verdict.mismatches],
        "statistics": dict(verdict.statistics),
        "step": verdict.step,
    }


class IsolatedJudge:
    """``judge(case)`` like :meth:`Target.judge`, in a child process.

    Use as a context manager (or call :meth:`close`): the child is ended on exit.
    """

    def __init__(
        self,
        target: Target,
        impl: Implementation,
        device: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ):
        self.target, self.impl, self.device = target, impl, device
        self.timeout_s = float(timeout_s)
        self._dir = scratch_dir("judge")  # named by its owner: swept if it is killed
        self._fault_path = self._dir / "fault.log"
        self._output_path = self._dir / "output.log"
        self._proc: Any = None
        self._conn: Any = None
        self.children = 0  # children started: 1 + one per crash, timeout or fresh replay
        # The cases the running child judged, oldest first (the last HISTORY of them):
        # what ran before a case in the same process, should its verdict depend on it.
        self.history: list[Case] = []

    # -- the child ------------------------------------------------------------

    def _context(self) -> Any:
        import torch
        from attnfuzz.kernels._triton import device as kernel_device

        # A child forked from a process that has touched CUDA cannot use it, and asking
        # whether CUDA is there (as the kernels' import does) touches it: a CUDA judge spawns.
        cuda = torch.device(self.device or kernel_device()).type == "cuda"
        forks = "fork" in multiprocessing.get_all_start_methods()
        spawn = cuda or torch.cuda.is_initialized() or not forks
        return multiprocessing.get_context("spawn" if spawn else "fork")

    def _start(self) -> None:
        ctx = self._context()
        parent_end, child_end = ctx.Pipe()
        self._fault_path.write_text("")
        forked = ctx.get_start_method() == "fork"
        if forked:  # an engine's adapter imports the engine once, here, not in every child
            # So does the oracle's first assert_close (torch.distributed.tensor, 0.5 s).
            with contextlib.suppress(ImportError):
                importlib.import_module("torch.distributed.tensor")
            try:
                self.impl.prepare()
            except Exception as err:  # noqa: BLE001 - the engine would not load: one line
                what = " ".join(f"{type(err).__name__}: {err}".split())  # the CLI trims it
                raise UsageError(f"cannot load implementation {self.impl.name}: {what}") from err
        self._proc = ctx.Process(
            target=_child,
            args=(
                child_end,
                parent_end,
                self.target if forked else self.target.name,
                self.impl if forked else self.impl.name,
                self.device,
                self.timeout_s,
                str(self._fault_path),
                str(self._output_path),
                os.getpid(),
            ),
            daemon=True,
            name=f"attnfuzz-judge-{self.target.name}",
        )
        self._proc.start()
        child_end.close()
        self._conn = parent_end
        self.children += 1
        self.history = []

    def _stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()
        self._conn.close()
        self._proc = self._conn = None

    def close(self) -> None:
        self._stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> IsolatedJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _trim_output(self) -> None:
        try:
            if self._output_path.stat().st_size > OUTPUT_CAP:
                with self._output_path.open("r+b") as f:
                    f.seek(-OUTPUT_CAP // 2, os.SEEK_END)
                    tail = f.read()
                    f.seek(0)
                    f.truncate()
                    f.write(tail)
        except OSError:
            pass

    # -- judging --------------------------------------------------------------

    def judge(
        self, case: Case, clock: Counter | None = None, deadline: float | None = None
    ) -> Verdict:
        """The verdict on ``case``; a child that hangs or dies is the verdict.

        ``deadline`` (``time.time()``) bounds the wait whatever the timeout:
        past it the child is killed and :class:`OutOfTime` raised, the case
        left unjudged, so that a budget holds even while a call hangs.

        The child lives on from case to case (each case a new engine, for an
        implementation with ``new_engine()``); what it keeps otherwise (a
        module's state) leaks from one case into the next: :meth:`judge_fresh`
        judges a case in a new process, and :attr:`history` says what ran before.
        """
        if self._proc is None or not self._proc.is_alive():
            self._stop()
            self._start()
        self.history = [*self.history[-(HISTORY - 1) :], case]
        return self._ask(case.to_dict(), self.timeout_s, clock, deadline)

    def judge_fresh(
        self, case: Case, clock: Counter | None = None, deadline: float | None = None
    ) -> Verdict:
        """The verdict on ``case`` in a new process: nothing judged before can leak into it."""
        self._stop()
        return self.judge(case, clock, deadline)

    def judge_trace(
        self, trace: Trace, clock: Counter | None = None, deadline: float | None = None
    ) -> Verdict:
        """The verdict on ``trace`` (:func:`~attnfuzz.harness.traces.judge_trace`), its
        steps judged in order in a new process, the timeout applying to each step: a
        crash or a hang is the verdict of the step it happened in (``step``)."""
        self._stop()
        self._start()
        return self._ask(trace.to_dict(), self.timeout_s, clock, deadline)

    def _ask(
        self, message: dict, timeout_s: float, clock: Counter | None, deadline: float | None
    ) -> Verdict:
        """Send ``message`` (a case, or a trace) and wait for its verdict, ``timeout_s``
        for each step (a trace's child says when it starts one)."""
        where = self.impl.name
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):  # died between two cases: a fresh child
            self._stop()
            self._start()
            self._conn.send(message)
        step: int | None = None  # the step the child last said it started
        while True:
            started = time.monotonic()
            wait = timeout_s
            cut = deadline is not None and deadline - time.time() < wait
            if cut:
                wait = max(deadline - time.time(), 0.0)
            reply = None
            # Whichever comes first: a message, the child's end, or the wait's end.
            ready = multiprocessing.connection.wait([self._conn, self._proc.sentinel], wait)
            if self._conn in ready:
                try:
                    reply = self._conn.recv()
                except (EOFError, OSError):
                    reply = None
            if reply is not None and reply[0] == "step":
                step = reply[1]
                continue
            break
        if not ready and cut:
            self._stop()
            raise OutOfTime
        self._trim_output()
        if reply is None:
            verdict = self._fault_verdict(where, time.monotonic() - started, timeout_s)
            verdict.step = step
            return verdict
        kind, *body = reply
        if kind == "usage":
            name, _, message = body[0].partition("\n")
            from attnfuzz.harness import target as target_module

            raise getattr(target_module, name, UsageError)(message)
        if kind == "harness":
            raise HarnessError(body[0])
        state, phases = body
        if clock is not None:
            clock.update(phases)
        verdict = Verdict([Mismatch(**m) for m in state["mismatches"]])
        verdict.statistics = state["statistics"]
        verdict.step = state["step"]
        return verdict

    def _fault_verdict(self, where: str, waited: float, timeout_s: float) -> Verdict:
        """The child hung (no reply within the timeout) or died: say which, and where."""
        # A child that closed the pipe is dying (faulthandler may still be writing).
        self._proc.join(timeout=max(timeout_s - waited, 0.0))
        alive = self._proc.is_alive()
        if alive:
            self._proc.kill()
        self._proc.join()
        exitcode = self._proc.exitcode
        try:
            fault = describe_fault(self._fault_path.read_text(errors="replace"))
        except OSError:
            fault = None
        self._stop()
        if alive:
            detail = fault[1] if fault else ""
            return Verdict([timeout_mismatch(where, timeout_s, detail)])
        detail = exit_detail(exitcode)
        if fault is not None and fault[0] == Check.CRASH:
            detail = f"{detail} ({fault[1]})"
        return Verdict([crash_mismatch(where, detail)])
