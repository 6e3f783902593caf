"""What the trace strategy draws for an engine's life, measured on its draws.

    python benchmarks/strategies.py [--examples 1000] [--seeds 0 1 2] [--markdown FILE]

For each seed, ``--examples`` draws of ``traces()`` (SMALL, no target's parameters,
no fixes; nothing judged): the share of traces, and of their consecutive step pairs,
that change one quantity only (``strategies.traces.step_change``: the decode length,
the order of the same decode lengths, the real token count under the same padded
size); and the share of traces that hold a step of each kind a runner-step
implementation drives differently: a step padded for a graph, a graph config (the
runners capture every size before the first step), a decode step with drafts (the
drafters' first pass) and with two or more (their draft loop), decode steps only
after the first (the scheduler's steady state, the steps SGLang's graph runners
replay), a request preempted and resumed, a request that leaves (finished, or
preempted), a rollback of rejected drafts, one across a page boundary
(``strategies.traces.page_rollbacks``), one with pages of 16 tokens or more, one
followed by a single-token step of the same request, a step whose request count is
at a tile boundary (``strategies.batches.TILE_BOUNDARIES``), one a graph pads past
a boundary its real count is under; the share of steps each data-parallel peer of a
vLLM runner step meets (``strategies.traces.data_parallel_peer``: not drawn, chosen
from the step's sizes); and, over as many single-step cases (``cases()``), the
share at a tile boundary and padded past one.
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
from attnfuzz.reference.batch import Case
from attnfuzz.strategies.batches import cases, scenario_labels
from attnfuzz.strategies.traces import (
    CHANGES,
    PEERS,
    data_parallel_peer,
    held_through_dummy,
    page_rollbacks,
    step_change,
    traces,
)
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


# What a runner-step implementation drives differently, by the trace's steps.
REACH = (
    "a step padded for a graph",
    "graphs to capture",
    "a decode step with drafts",
    "a decode step with 2+ drafts",
    "decode steps only after the first",
    "a preempted request resumed",
    "a request that leaves",
    "drafts rolled back",
    "a rollback across a page",
    "a rollback across a page of 16+ tokens",
    "a rollback across a page, then one token",
    "a request held through a dummy run",
    "a step at a tile boundary",
    "a step padded past a tile",
)


TILE_LABELS = {  # scenario_labels' names of the tile kinds
    "at_tile_boundary": "a step at a tile boundary",
    "padded_past_tile": "a step padded past a tile",
}


def tile_kinds(config, step) -> set[str]:  # noqa: ANN001
    """Whether ``step``'s request count is at a tile boundary, and whether a graph pads
    it past a boundary its real count is under (``scenario_labels``)."""
    return {TILE_LABELS[x] for x in scenario_labels(Case(config, step)) if x in TILE_LABELS}


def kinds_of(trace) -> list[str]:  # noqa: ANN001
    """The :data:`REACH` kinds ``trace`` holds a step of."""
    config, out = trace.config, []
    labels = [set(scenario_labels(Case(config, step))) for step in trace.steps]
    if any(any(x.startswith("padded") or x == "requires_padding" for x in ls) for ls in labels):
        out.append("a step padded for a graph")
    if config.cudagraph_mode != "NONE" and config.cudagraph_capture_sizes:
        out.append("graphs to capture")
    decodes = [sum(q <= config.threshold for q in step.q_lens) for step in trace.steps]
    if config.num_spec >= 1 and any(decodes):
        out.append("a decode step with drafts")
    if config.num_spec >= 2 and any(decodes):
        out.append("a decode step with 2+ drafts")
    later = list(zip(decodes[1:], trace.steps[1:], strict=True))
    if later and all(d == step.num_reqs for d, step in later):
        out.append("decode steps only after the first")
    seen: set[int] = set()
    for prev, step in itertools.pairwise(trace.steps):
        seen |= set(prev.req_ids)
        if any(r in seen and r not in prev.req_ids for r in step.req_ids):
            out.append("a preempted request resumed")
            break
    if any(set(prev.req_ids) - set(step.req_ids) for prev, step in itertools.pairwise(trace.steps)):
        out.append("a request that leaves")
    for prev, step in itertools.pairwise(trace.steps):
        was = dict(zip(prev.req_ids, prev.seq_lens, strict=True))
        now = dict(zip(step.req_ids, step.num_computed_tokens, strict=True))
        if any(r in was and now[r] < was[r] for r in now):
            out.append("drafts rolled back")
            break
    crossed = [page_rollbacks(config, a, b) for a, b in itertools.pairwise(trace.steps)]
    if any(crossed):
        out.append("a rollback across a page")
        if config.block_size >= 16:  # the page sizes most engines' backends take
            out.append("a rollback across a page of 16+ tokens")
    for rolled, step in zip(crossed, trace.steps[1:], strict=True):
        if any(q == 1 for r, q in zip(step.req_ids, step.q_lens, strict=True) if r in rolled):
            out.append("a rollback across a page, then one token")
            break
    if held_through_dummy(trace.steps):
        out.append("a request held through a dummy run")
    for step in trace.steps:
        out.extend(tile_kinds(config, step) - set(out))
    return out


def measure(examples: int, at: int) -> dict[str, str]:
    singles = drawn(cases(), examples, at)
    tiles = Counter(k for case in singles for k in tile_kinds(case.config, case.batch))
    lives = drawn(traces(), examples, at)
    kinds: Counter = Counter()
    pairs = with_change = 0
    for trace in lives:
        changes = [step_change(trace.config, a, b) for a, b in itertools.pairwise(trace.steps)]
        pairs += len(changes)
        kinds.update(c for c in changes if c is not None)
        with_change += any(c is not None for c in changes)
    reach = Counter()
    for trace in lives:
        reach.update(set(kinds_of(trace)))
    steps = [step for trace in lives for step in trace.steps]
    peers = Counter(data_parallel_peer(s.q_lens, s.num_computed_tokens) for s in steps)
    return {
        **{f"traces with {k}": percent(reach[k], len(lives)) for k in REACH},
        "traces with a one-quantity change": percent(with_change, len(lives)),
        "step pairs with a one-quantity change": percent(sum(kinds.values()), pairs),
        **{f"step pairs changing {k}": percent(kinds[k], pairs) for k in CHANGES},
        **{f"steps beside a data-parallel peer: {k}": percent(peers[k], len(steps)) for k in PEERS},
        **{f"single-step cases with {k}": percent(tiles[k], len(singles)) for k in REACH[-2:]},
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
