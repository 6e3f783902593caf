"""Examples per second per target and implementation, on 1 and 2 workers, and where the time goes.

    python benchmarks/throughput.py [--examples 300] [--workers 1 2] [--target T ...] [--impl I ...]
                                    [--judge in-process isolated] [--engine NAME] [--trace]
                                    [--markdown FILE --section engines|judges|workers|sglang|traces]

Implementations by default: ``triton``, ``reference`` and, where vLLM is
installed (``ATTNFUZZ_VLLM=1 ./setup.sh``), every engine implementation
(kind ``engine``: ``vllm``, ``vllm-cpu``, ...): vLLM 0.33.0's own code through
its adapter. A target is measured on the implementations it has.
``--engine sglang``: only that engine's implementations (SGLang 0.5.23's,
``ATTNFUZZ_SGLANG=1 ./setup.sh``).

A worker is a process pinned to its own CPU core (torch on one thread). Each
runs a derandomized campaign of ``--examples`` examples per target and
implementation (worker ``i`` with seed ``i``, so workers judge different
cases), after a warm-up run that compiles; the workers of a row start
together (a barrier) and their examples per second are summed. Time is split
into generation (Hypothesis: drawing, bookkeeping), inputs (tensors from the
seed), reference, implementation (the kernels) and oracle, in milliseconds
per example over all workers. The bar: >= 20 examples/s per core on every
target and implementation, and no failure (a failure would stop the run).

``--judge``: ``isolated`` judges each case in a child process
(:class:`~attnfuzz.harness.isolation.IsolatedJudge`), as ``attnfuzz run``,
``repro`` and campaign workers do; ``in-process`` calls ``Target.judge``
directly, as the test helpers and the zoo do. Both by default, side by side:
the difference is the price of fault isolation. Isolated rows count the
judge's phases inside the child and the round trip as generation.

``--trace``: each example is a trace of one engine's steps (``attnfuzz run
--trace``), each judged by a new engine (the isolated judge: a new process per
trace); the table then says steps per second per core, and the bar is on steps.

``--markdown FILE`` rewrites the section ``throughput:SECTION`` of FILE with the
table (``--section``: which of the pages' throughput tables this run is).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import queue
import sys
from collections import Counter
from pathlib import Path

from _common import table
from _markdown import command_line, write_section

BAR = 20.0
SECTIONS = ("engines", "judges", "workers", "sglang", "traces")
PHASES = ["generation", "inputs", "reference", "implementation", "oracle"]


def _worker(index, core, jobs, examples, barrier, results, traced=False) -> None:
    """Run every (target, impl, judge) job on one pinned core; report each timed campaign."""
    import contextlib

    import torch
    from attnfuzz.harness.isolation import IsolatedJudge
    from attnfuzz.harness.registry import get_target
    from attnfuzz.harness.runner import fuzz

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    for name, impl_name, how in jobs:
        target = get_target(name)
        impl = target.resolve(impl_name)
        steps = [0]

        def count(example, verdict, steps=steps) -> None:
            steps[0] += len(example.steps) if traced else 1

        with contextlib.ExitStack() as stack:
            judge = None
            if how == "isolated":  # the child is forked once and judges every case
                isolated = stack.enter_context(IsolatedJudge(target, impl))
                judge = isolated.judge_trace if traced else isolated.judge
            common = dict(database=None, judge=judge, traced=traced)
            fuzz(target, impl, max_examples=5, rng_seed=1000 + index, **common)
            barrier.wait()  # the workers of a row run at the same time
            steps[0] = 0
            r = fuzz(target, impl, max_examples=examples, rng_seed=index, on_case=count, **common)
        row = (name, impl_name, how, steps[0], r.seconds, dict(r.time_breakdown()), r.failed)
        results.put(row)


def measure(jobs: list[tuple[str, str]], workers: int, examples: int, traced: bool) -> dict:
    """``(target, impl) -> [per-worker results]`` for ``workers`` processes run side by side."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch or Triton state
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(i, cores[i % len(cores)], jobs, examples, barrier, results, traced),
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    out: dict = {}
    pending = workers * len(jobs)
    while pending:
        try:
            name, impl, how, n, seconds, phases, failed = results.get(timeout=5)
        except queue.Empty:
            if any(p.exitcode for p in procs):  # a crashed worker would leave the rest waiting
                for p in procs:
                    p.kill()
                raise RuntimeError("a worker died; run it alone to see why") from None
            continue
        out.setdefault((name, impl, how), []).append((n, seconds, phases, failed))
        pending -= 1
    for p in procs:
        p.join()
    return out


def main() -> int:
    from attnfuzz.harness.registry import get_target, target_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300, help="per worker")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--target", action="append", default=None)
    parser.add_argument("--impl", action="append", default=None)
    parser.add_argument("--engine", default=None, help="only this engine's implementations")
    parser.add_argument(
        "--judge", nargs="+", choices=["in-process", "isolated"], default=["in-process", "isolated"]
    )
    parser.add_argument("--trace", action="store_true", help="examples are traces: steps/s")
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    parser.add_argument("--section", choices=SECTIONS, default="workers", help="with --markdown")
    args = parser.parse_args()

    def chosen(t: str) -> list[str]:
        impls = get_target(t).implementations.items()
        if args.engine is not None:
            return [n for n, i in impls if i.kind == "engine" and i.engine == args.engine]
        return args.impl or [n for n, i in impls if i.kind in ("fixed", "reference", "engine")]

    jobs = [
        (t, i, how)
        for t in args.target or target_names()
        for i in chosen(t)
        if i in get_target(t).implementations
        and get_target(t).implementations[i].why_unavailable() is None
        for how in args.judge
    ]
    for t in args.target or target_names():
        for i, reason in get_target(t).unavailable().items():
            if i in chosen(t):
                print(f"not measured: {t} / {i}: {reason}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1

    measured = {w: measure(jobs, w, args.examples, args.trace) for w in args.workers}
    rows, ok = [], True
    for name, impl, how in jobs:
        for w in args.workers:
            runs = measured[w][name, impl, how]
            total = sum(n for n, _, _, _ in runs)
            rate = sum(n / s for n, s, _, _ in runs if s)
            phases: Counter = Counter()
            for _, _, p, _ in runs:
                phases.update(p)
            failed = any(f for _, _, _, f in runs)
            passed = not failed and rate / w >= BAR
            ok &= passed
            rows.append(
                [name, impl, how, w, total, f"{rate:.1f}", f"{rate / w:.1f}"]
                + [f"{1000 * phases[p] / max(total, 1):.1f}" for p in PHASES]
                + ["FAIL" if failed else ("yes" if passed else "NO")]
            )
    where = f"one core per worker of {platform.processor() or platform.machine()}"
    if cores < max(args.workers):
        where += f"; only {cores} core(s) here, so workers share"
    unit, short = ("step", "steps") if args.trace else ("example", "ex")
    title = f"Throughput ({where}; ms per {unit} by phase; bar: >= {BAR:.0f} {unit}s/s per core)"
    if args.trace:
        title = "Trace " + title[0].lower() + title[1:]
    header = [
        "target",
        "impl",
        "judge",
        "workers",
        f"{unit}s",
        f"{short}/s",
        f"{short}/s per core",
        *PHASES,
        "ok",
    ]
    text = table(header, rows)
    print(f"{title}\n\n{text}")
    if args.markdown is not None:
        command = command_line("throughput", sys.argv[1:])
        lines = [f"{title}: `{command}`.", "", *text.splitlines()]
        write_section(args.markdown, "throughput", args.section, lines)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
