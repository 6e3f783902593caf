"""How often the trace strategy draws the steady steps of issue 40, measured on its draws.

    python benchmarks/strategies.py [--examples 1000] [--seeds 0 1 2] [--markdown FILE]

For each seed, ``--examples`` draws of ``traces()`` (SMALL, no target's parameters,
no fixes; nothing judged): the share of traces, and of their consecutive step pairs,
that change one quantity only (``strategies.traces.step_change``: the decode length,
the order of the same decode lengths, the real token count under the same padded
size).
``--markdown FILE`` rewrites the section ``strategies:shares`` of FILE.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter
from pathlib import Path

from _common import table
from _markdown import command_line, write_section
from attnfuzz.strategies.traces import CHANGES, step_change, traces
from hypothesis import HealthCheck, given, seed, settings


def drawn(strategy, examples: int, at: int) -> list:  # noqa: ANN001
    out: list = []

    @seed(at)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def draw(x) -> None:  # noqa: ANN001
        out.append(x)

    draw()
    return out


def percent(count: int, of: int) -> str:
    return f"{100 * count / of:.1f}%" if of else "-"


def measure(examples: int, at: int) -> dict[str, str]:
    lives = drawn(traces(), examples, at)
    kinds: Counter = Counter()
    pairs = with_change = 0
    for trace in lives:
        changes = [step_change(trace.config, a, b) for a, b in itertools.pairwise(trace.steps)]
        pairs += len(changes)
        kinds.update(c for c in changes if c is not None)
        with_change += any(c is not None for c in changes)
    return {
        "traces with a one-quantity change": percent(with_change, len(lives)),
        "step pairs with a one-quantity change": percent(sum(kinds.values()), pairs),
        **{f"step pairs changing {k}": percent(kinds[k], pairs) for k in CHANGES},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--markdown", type=Path, default=None, help="docs page to update")
    args = parser.parse_args()
    runs = []
    for at in args.seeds:
        runs.append(measure(args.examples, at))
        print(f"seed {at}: {runs[-1]}", file=sys.stderr)
    header = ["measure", *(f"seed {s}" for s in args.seeds)]
    rows = [[name, *(r[name] for r in runs)] for name in runs[0]]
    text = table(header, rows)
    command = command_line("strategies", sys.argv[1:])
    print(f"`{command}` ({args.examples} traces a seed):\n\n{text}")
    if args.markdown is not None:
        lines = [f"`{command}` ({args.examples} traces a seed):", "", text]
        write_section(args.markdown, "strategies", "shares", lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
