"""Two ways to generate an engine's life, measured on the bugs of that life:
a trace strategy (what attnfuzz uses) against a Hypothesis ``RuleBasedStateMachine``.

    python benchmarks/trace_shrinking.py [--seeds 0 1 2] [--max-examples 1000]
                                         [--markdown FILE]

Both draw from the same small scheduler (:mod:`attnfuzz.strategies.traces`):

- **strategy**: ``Target.traces()``, a step count then each step's events
  (departures, arrivals, the step), as ``attnfuzz run --trace`` searches;
- **machine**: a ``RuleBasedStateMachine`` whose rules are the scheduler's
  events (``arrive``, ``leave``, ``step``), the implementation judged at each
  ``step`` rule, Hypothesis choosing and shrinking the sequence of rules.

For each bug of the engine's life (every mutant declared ``traced``, and a
user's output buffer sized by its first call) and seed, one derandomized
search of at most ``--max-examples`` lives in this process, each life a new
engine (``new_engine()``): whether it was found, the lives judged until the
first failure and in all (shrinking included), the seconds, and the minimized
life's steps and scheduled tokens (fewer is better).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _common import median, pin_one_core, table
from _markdown import command_line, write_section
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.harness.traces import new_engine
from attnfuzz.reference.batch import Case
from attnfuzz.strategies.batches import engine_configs
from attnfuzz.strategies.traces import _Scheduler
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)


@dataclass
class Outcome:
    found: bool
    to_failure: int | None
    lives: int
    seconds: float
    steps: int | None
    tokens: int | None


class _FirstCallBuffer:
    """``tests/stateful_impl.py``'s bug, resettable in one process: an output buffer
    sized by the engine's first step and reused (max-seq-len)."""

    def __init__(self) -> None:
        from attnfuzz.kernels.max_seq_len import max_seq_len_metadata

        self._fixed = max_seq_len_metadata
        self._out = None

    def new_engine(self) -> None:
        self._out = None

    def __call__(self, inputs):
        import dataclasses

        import torch

        got = self._fixed(inputs)
        if self._out is None:
            self._out = torch.empty_like(got.out)
        rows = min(got.out.shape[1], self._out.shape[1])
        self._out[:, :rows] = got.out[:, :rows]
        return dataclasses.replace(got, out=self._out[:, : got.out.shape[1]])


def bugs() -> list[tuple[Target, Implementation]]:
    out = []
    for name in target_names():
        target = get_target(name)
        out += [(target, i) for i in target.mutants if i.traced]
    seq = get_target("max-seq-len")
    buffer = Implementation(
        "first-call-buffer", _FirstCallBuffer(), Kind.USER, traced=True,
        description="an output buffer sized by the first step",
    )  # fmt: skip
    return [*out, (seq, buffer)]


def by_strategy(target: Target, impl: Implementation, seed: int, budget: int) -> Outcome:
    r = fuzz(target, impl, max_examples=budget, rng_seed=seed, database=None, traced=True)
    trace = r.case
    steps = tokens = None
    if trace is not None and r.verdict is not None:
        lived = trace.steps[: r.verdict.step + 1]
        steps, tokens = len(lived), sum(sum(s.q_lens) for s in lived)
    return Outcome(r.failed, r.examples_to_failure, r.examples, r.seconds, steps, tokens)


def by_machine(target: Target, impl: Implementation, seed: int, budget: int) -> Outcome:
    params = {name: st.integers(lo, hi) for name, (lo, hi) in target.params.items()}
    configs = engine_configs(
        fixes=impl.fixes, supports=target.cg_supports, varlen=target.varlen_decode
    )
    record = {"lives": 0, "to_failure": None, "last": []}

    class EngineLife(RuleBasedStateMachine):
        @initialize(config=configs, drawn=st.fixed_dictionaries(params))
        def start(self, config, drawn):
            record["lives"] += 1
            new_engine(impl)
            self.sched = _Scheduler(config)
            self.params = tuple(sorted(drawn.items()))
            self.steps = []
            record["last"] = self.steps

        @precondition(lambda self: hasattr(self, "sched") and self.sched.room > 0)
        @rule(prompt=st.integers(1, 255), resume=st.booleans())
        def arrive(self, prompt, resume):
            self.sched.roll_back()
            top = max(1, self.sched.config.max_model_len - 1)
            self.sched.arrive(min(prompt, top), resume)

        @precondition(lambda self: hasattr(self, "sched") and self.sched.running)
        @rule(which=st.integers(0, 15), preempted=st.booleans())
        def leave(self, which, preempted):
            self.sched.roll_back()
            req = self.sched.running[which % len(self.sched.running)]
            self.sched.leave(req, preempted)

        @precondition(lambda self: hasattr(self, "sched") and self.sched.running)
        @rule(data=st.data())
        def step(self, data):
            sched = self.sched
            sched.roll_back()
            for req in list(sched.running):  # at the model's length: finished
                if req.computed >= sched.config.max_model_len:
                    sched.leave(req, preempted=False)
            if not sched.running:
                return
            batch = sched.step(data.draw)
            self.steps.append(batch)
            case = Case(sched.config, batch, self.params)
            verdict = target.judge(impl, case) if len(self.steps) == 1 else _judge_on(case)
            if not verdict.ok and record["to_failure"] is None:
                record["to_failure"] = record["lives"]
            assert verdict.ok, str(verdict)

    def _judge_on(case):
        from attnfuzz.harness.judging import judge

        return judge(target, impl, case, fresh_engine=False)

    EngineLife._hypothesis_internal_use_seed = seed  # what @seed sets on a TestCase
    start = time.perf_counter()
    found = False
    try:
        run_state_machine_as_test(
            EngineLife,
            settings=settings(
                max_examples=budget, database=None, deadline=None, stateful_step_count=12
            ),
        )
    except AssertionError:
        found = True
    except HypothesisException:  # a flaky or unsatisfiable run: not found
        pass
    seconds = time.perf_counter() - start
    last = record["last"]
    steps = len(last) if found else None
    tokens = sum(sum(s.q_lens) for s in last) if found else None
    return Outcome(found, record["to_failure"], record["lives"], seconds, steps, tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-examples", type=int, default=1000)
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    where = pin_one_core()
    rows = []
    for target, impl in bugs():
        for how, search in (("strategy", by_strategy), ("machine", by_machine)):
            runs = [search(target, impl, s, args.max_examples) for s in args.seeds]
            found = [r for r in runs if r.found]
            rows.append(
                [
                    f"{target.name} / {impl.name}",
                    how,
                    f"{len(found)}/{len(runs)}",
                    ", ".join("-" if r.to_failure is None else str(r.to_failure) for r in runs),
                    ", ".join(str(r.steps) if r.found else "-" for r in runs),
                    ", ".join(str(r.tokens) if r.found else "-" for r in runs),
                    f"{median([r.lives for r in runs]):.0f}",
                    f"{median([r.seconds for r in runs]):.1f}",
                ]
            )
            print(" | ".join(rows[-1]), file=sys.stderr)
    header = [
        "bug",
        "generator",
        "found",
        "lives to failure (per seed)",
        "minimized steps",
        "minimized tokens",
        "lives judged (median)",
        "seconds (median)",
    ]
    text = table(header, rows)
    title = f"Trace strategy against state machine ({where}; seeds {args.seeds})"
    print(f"{title}\n\n{text}")
    if args.markdown is not None:
        command = command_line("trace_shrinking", sys.argv[1:])
        write_section(
            args.markdown,
            "trace_shrinking",
            "shrinking",
            [f"{title}: `{command}`.", "", *text.splitlines()],
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
