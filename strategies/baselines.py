"""Baseline case generators that the zoo measures attnfuzz's strategies against.

Both produce the same :class:`~attnfuzz.reference.batch.Case` values as
:func:`attnfuzz.strategies.batches.cases` and only cases the engine could
produce (``reference.invariants.violations`` is empty), so that every arm is
judged by the same oracle on the same kind of input:

- :func:`naive_random_cases`: uniform sampling of the same ranges as the
  shipped strategies, with none of their design (no step shapes drawn first,
  no boundary bias, no "capture up to the largest decode step"): what a
  fuzzer without domain knowledge would draw.
- :func:`grid_cases`: a fixed list of tidy batches like the ones engine test
  suites hand-pick: pure decode with every ``q_len == next_n`` and no
  padding, pure prefill, mixed; ``next_n`` 1..4; a few sizes.

Neither is a Hypothesis strategy: they feed a plain loop, which is what a
baseline is, and nothing shrinks their failures.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping

from attnfuzz.reference.batch import Batch, Case, EngineConfig
from attnfuzz.reference.invariants import violations
from attnfuzz.strategies.batches import _BLOCK_SIZES, SMALL, Scale

ParamRanges = Mapping[str, tuple[int, int]]


def _uniform_config(
    rng: random.Random, scale: Scale, fixes: Mapping[str, int | str] | None = None
) -> EngineConfig:
    """The ranges of ``batches.engine_configs``, each drawn uniformly and independently;
    a field in ``fixes`` takes its value (and draws nothing: without fixes, the
    stream of draws is unchanged)."""
    fixed = dict(fixes or {})

    def pick(name: str, draw: Callable[[], int]) -> int:  # integer fields only
        return fixed[name] if name in fixed else draw()

    top_next_n = min(
        scale.max_next_n,
        fixed.get("max_model_len", scale.max_next_n),
        fixed.get("max_num_batched_tokens", scale.max_next_n),
    )
    next_n = pick("next_n", lambda: rng.randint(1, top_next_n))
    top_len = fixed.get("max_model_len", scale.max_model_len)
    block_size = pick("block_size", lambda: rng.choice([b for b in _BLOCK_SIZES if b <= top_len]))
    low_len = max(8, next_n)
    max_model_len = pick(
        "max_model_len", lambda: rng.randint(low_len, max(low_len, scale.max_model_len))
    )
    max_num_seqs = pick("max_num_seqs", lambda: rng.randint(1, scale.max_num_seqs))
    max_num_batched_tokens = pick(
        "max_num_batched_tokens",
        lambda: rng.randint(next_n, max(next_n, scale.max_num_batched_tokens)),
    )
    max_graph_reqs = max(1, min(max_num_seqs, max_num_batched_tokens // next_n))
    # 1 to 4 distinct capture request counts, as the strategy's list; the largest
    # decode step is not favoured (that is a design choice of the strategy).
    count = rng.randint(1, min(4, max_graph_reqs))
    capture_reqs = rng.sample(range(1, max_graph_reqs + 1), count)
    return EngineConfig(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_spec=next_n - 1,
        cudagraph_capture_sizes=tuple(sorted(n * next_n for n in capture_reqs)),
        topk=pick("topk", lambda: rng.randint(1, scale.topk)),
        num_heads=pick("num_heads", lambda: rng.randint(1, scale.num_heads)),
        head_dim=pick("head_dim", lambda: rng.randint(1, scale.head_dim)),
        cudagraph_mode=fixed.get("cudagraph_mode", EngineConfig.cudagraph_mode),
    )


def _uniform_batch(rng: random.Random, config: EngineConfig) -> Batch:
    """Uniform request count and query lengths, then the engine's reorder (decodes first)."""
    num_reqs = rng.randint(1, min(config.max_num_seqs, config.max_num_batched_tokens))
    top = min(config.max_model_len, config.max_num_batched_tokens)  # the longest valid q_len
    q_lens = [rng.randint(1, top) for _ in range(num_reqs)]
    q_lens.sort(key=lambda q: q > config.threshold)  # stable: decodes first, order kept
    computed = [rng.randint(0, config.max_model_len - q) for q in q_lens]
    return Batch(
        tuple(computed),
        tuple(q_lens),
        seed=rng.randint(0, 2**32 - 1),
        use_cudagraph=rng.random() < 0.5,
    )


def naive_random_case(
    rng: random.Random,
    scale: Scale = SMALL,
    params: ParamRanges | None = None,
    fixes: Mapping[str, int | str] | None = None,
) -> Case:
    """One uniformly drawn valid case; an invalid draw is redrawn whole (config included).

    ``fixes`` (an implementation's, see ``batches.engine_configs``) fixes config fields.
    """
    while True:
        config = _uniform_config(rng, scale, fixes)
        batch = _uniform_batch(rng, config)
        # The cheap check first: most rejections are batches over the token budget.
        if sum(batch.q_lens) > config.max_num_batched_tokens or violations(config, batch):
            continue
        drawn = tuple(
            (name, rng.randint(lo, hi)) for name, (lo, hi) in sorted((params or {}).items())
        )
        return Case(config, batch, drawn)


def naive_random_cases(
    rng: random.Random,
    scale: Scale = SMALL,
    params: ParamRanges | None = None,
    fixes: Mapping[str, int | str] | None = None,
) -> Iterator[Case]:
    """An endless stream of :func:`naive_random_case` draws from ``rng``.

    ``params`` maps each target parameter to its inclusive range
    (``Target.params``); each is drawn uniformly. ``fixes`` fixes config fields.
    """
    while True:
        yield naive_random_case(rng, scale, params, fixes)


def _grid_config(
    next_n: int, scale: Scale, fixes: Mapping[str, int | str] | None = None
) -> EngineConfig:
    """A tidy engine: round limits, capture sizes for 1, 2, 4 and 8 decodes;
    a field in ``fixes`` takes its value."""
    fixed = dict(fixes or {})
    max_num_seqs = fixed.get("max_num_seqs", min(8, scale.max_num_seqs))
    max_num_batched_tokens = fixed.get(
        "max_num_batched_tokens", min(256, scale.max_num_batched_tokens)
    )
    capture = [n * next_n for n in (1, 2, 4, 8) if n <= max_num_seqs]
    return EngineConfig(
        max_model_len=fixed.get("max_model_len", min(128, scale.max_model_len)),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=fixed.get("block_size", 16),
        num_spec=next_n - 1,
        cudagraph_capture_sizes=tuple(s for s in capture if s <= max_num_batched_tokens),
        topk=fixed.get("topk", min(4, scale.topk)),
        num_heads=fixed.get("num_heads", min(2, scale.num_heads)),
        head_dim=fixed.get("head_dim", min(8, scale.head_dim)),
        cudagraph_mode=fixed.get("cudagraph_mode", EngineConfig.cudagraph_mode),
    )


def _grid_batches(config: EngineConfig) -> Iterator[tuple[tuple[int, ...], tuple[int, ...], bool]]:
    """(q_lens, computed, use_cudagraph) of the tidy steps of one engine."""
    next_n, prefill = config.next_n, 16
    for reqs in (1, 2, 4, 8):  # pure decode at a captured size: replayed unpadded
        if reqs <= config.max_num_seqs:
            yield (next_n,) * reqs, tuple(20 + 5 * r for r in range(reqs)), True
    # Pure decode of a size no graph captured, run eagerly.
    reqs = min(3, config.max_num_seqs)
    yield (next_n,) * reqs, tuple(30 + r for r in range(reqs)), False
    for reqs in (1, 2, 4):  # pure prefill: a first chunk and a continued one
        if reqs <= config.max_num_seqs:
            yield (prefill,) * reqs, (0,) * reqs, True
            yield (prefill,) * reqs, (prefill,) * reqs, True
    for decodes, prefills in ((1, 1), (2, 1), (1, 2), (2, 2)):  # mixed: decodes then prefills
        if decodes + prefills <= config.max_num_seqs:
            q_lens = (next_n,) * decodes + (prefill,) * prefills
            yield q_lens, (24,) * decodes + (0,) * prefills, True


def grid_cases(
    scale: Scale = SMALL,
    params: ParamRanges | None = None,
    seed: int = 0,
    fixes: Mapping[str, int | str] | None = None,
) -> list[Case]:
    """The fixed grid of tidy cases, in the order a test suite would list them.

    Target parameters sit at the low end of their ranges (a default); ``seed``
    only moves the data seeds (page ids, queries), never a size, so the grid
    is the same list of batches for every seed. Steps a scale cannot hold are
    left out. ``fixes`` (an implementation's) fixes config fields, ``next_n``
    included.
    """
    fixed = tuple((name, lo) for name, (lo, _) in sorted((params or {}).items()))
    out: list[Case] = []
    next_ns = (
        [fixes["next_n"]] if fixes and "next_n" in fixes else range(1, min(4, scale.max_next_n) + 1)
    )
    for next_n in next_ns:
        config = _grid_config(next_n, scale, fixes)
        for q_lens, computed, use_cudagraph in _grid_batches(config):
            batch = Batch(
                computed, q_lens, seed=seed * 1000 + len(out), use_cudagraph=use_cudagraph
            )
            if not violations(config, batch):
                out.append(Case(config, batch, fixed))
    return out
