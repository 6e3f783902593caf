"""Hypothesis strategies for engine configs and scheduler steps.

Every example is a :class:`~attnfuzz.reference.batch.Case`: small printable
integers plus one data seed, from which the targets build their tensors with a
``torch.Generator``. Nothing drawn is a tensor, so a failing case prints, saves
and replays as plain JSON, independent of the Hypothesis version.

The draws are shaped so that the rare meetings behind the historical bugs come
up with useful probability (``next_n > 1`` and ragged or padded decodes and
sizes that differ), and so that shrinking walks towards the smallest trigger:
``next_n``, request counts and lengths all shrink towards small values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from attnfuzz.reference.batch import (
    Batch,
    Case,
    CommonMetadata,
    DecodeSplit,
    EngineConfig,
    build_common_metadata,
    is_uniform_decode,
    split_decodes_and_prefills,
)
from attnfuzz.reference.runner import CUDAGRAPH_MODES, allowed_modes, step_plan
from attnfuzz.strategies import _constants  # noqa: F401  # before any draw: see there
from hypothesis import strategies as st


@dataclass(frozen=True)
class Scale:
    """Upper limits of the drawn sizes. ``SMALL`` is the default for campaigns."""

    max_model_len: int = 256
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    topk: int = 16
    num_heads: int = 4
    head_dim: int = 16
    max_next_n: int = 4


SMALL = Scale()
PRODUCTION = Scale(
    max_model_len=131072,
    max_num_seqs=256,
    max_num_batched_tokens=16384,
    topk=2048,
    num_heads=64,
    head_dim=128,
)
SCALES = {"small": SMALL, "production": PRODUCTION}

_BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)

# Request counts where a kernel's tile changes: attnfuzz's kernels size a tile of
# rows with ``kernels._triton.block`` (a power of two, at least 16; compiled, capped
# at 16 to 64 rows, past which another tile starts), so a count's tile changes
# past 16 and 32; the engines' kernels tile by powers of two too. The default
# scale keeps ``max_num_seqs <= 16``: without these, 17 is never drawn.
TILE_BOUNDARIES = (16, 32)
TILE_ODDS = 8  # one config in TILE_ODDS straddles a boundary


def tile_edges(least: int, most: int) -> list[int]:
    """The request counts in ``least..most`` at and around a tile boundary (B - 1, B,
    B + 1 for each B of :data:`TILE_BOUNDARIES`), in shrink order."""
    edges = (n for b in TILE_BOUNDARIES for n in (b - 1, b, b + 1))
    return [n for n in edges if least <= n <= most]


def request_count(draw: st.DrawFn, least: int, most: int) -> int:
    """A request count in ``least..most``: half the time at a tile boundary
    (:func:`tile_edges`) where the range reaches one, else any; a range that reaches
    none draws exactly as ``st.integers(least, most)``."""
    edges = tile_edges(least, most)
    if edges and draw(st.booleans()):
        return draw(st.sampled_from(edges))
    return draw(st.integers(least, most))


# The ``EngineConfig`` fields an implementation may fix (``Implementation.fixes``):
# an engine's kernel may accept one value only (vLLM's CPU sparse indexer runs
# ``topk == 512`` and no native MTP, so ``next_n == 1``). ``next_n`` stands for
# ``num_spec + 1``. ``cudagraph_mode`` is fixed to a name of
# ``reference.runner.CUDAGRAPH_MODES`` (vLLM's CPU platform captures no graphs:
# ``CpuPlatform.check_and_update_config`` empties the capture sizes, so its
# steps run eagerly and unpadded, as ``NONE``).
FIXABLE = (
    "next_n",
    "block_size",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "topk",
    "num_heads",
    "head_dim",
    "cudagraph_mode",
)


def config_value(config: EngineConfig, name: str) -> int | str:
    """The value of a :data:`FIXABLE` field of ``config``."""
    return config.next_n if name == "next_n" else getattr(config, name)


def fixes_problems(fixes: Mapping[str, int | str]) -> list[str]:
    """Why ``fixes`` cannot fix an engine config: unknown fields, values that are
    not integers >= 1 (a mode name for ``cudagraph_mode``), or values no valid
    config has together (``next_n`` above ``max_model_len`` or
    ``max_num_batched_tokens``). Empty when they can."""
    out = []
    for name, value in fixes.items():
        if name not in FIXABLE:
            out.append(f"cannot fix {name!r} (fixable: {', '.join(FIXABLE)})")
        elif name == "cudagraph_mode":
            if value not in CUDAGRAPH_MODES:
                modes = ", ".join(CUDAGRAPH_MODES)
                out.append(f"cudagraph_mode must be one of {modes}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            out.append(f"{name} must be fixed to an integer >= 1, got {value!r}")
    if out:
        return out
    next_n = fixes.get("next_n", 1)
    for limit in ("max_model_len", "max_num_batched_tokens"):
        if limit in fixes and fixes[limit] < next_n:
            out.append(f"next_n={next_n} does not fit {limit}={fixes[limit]}")
    return out


def fixes_violations(config: EngineConfig, fixes: Mapping[str, int | str]) -> list[str]:
    """``"field=value (requires field=wanted)"`` for each fixed field ``config`` differs in."""
    out = []
    for name, wanted in fixes.items():
        have = config_value(config, name)
        if have != wanted:
            out.append(f"{name}={have} (requires {name}={wanted})")
    return out


# Runner settings in shrink order: the engine's defaults first.
RUNNER_CHOICES = ("v2", "v1")
SUPPORT_CHOICES = ("UNIFORM_BATCH", "ALWAYS", "UNIFORM_SINGLE_TOKEN_DECODE", "NEVER")
MODE_ORDER = ("FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "FULL_DECODE_ONLY", "NONE")


@st.composite
def engine_configs(
    draw: st.DrawFn,
    scale: Scale = SMALL,
    fixes: Mapping[str, int | str] | None = None,
    supports: tuple[str, ...] = SUPPORT_CHOICES,
    varlen: bool = True,
) -> EngineConfig:
    """Engine limits, with ``max_num_batched_tokens`` both below and above ``max_model_len``.

    A field in ``fixes`` (see :data:`FIXABLE`) takes that value whatever the
    scale's limit for it (``topk=512`` at ``SMALL``), and is not drawn; the
    ranges of the fields drawn after it are bounded by it where they depend on
    it. Without ``fixes``, the draws (and so saved corpora, seeds and shrinking)
    are exactly those of an unfixed strategy. ``supports`` are the
    ``AttentionCGSupport`` values of the backends the target's code runs with:
    only modes one of them keeps are drawn. ``varlen`` False: no varlen decode
    graphs (they come with adaptive verification, which changes what the
    DeepSeek builders do).
    """
    fixed = dict(fixes or {})
    problems = fixes_problems(fixed)
    if problems:
        raise ValueError(f"fixes {fixed}: {'; '.join(problems)}")

    def pick(name: str, strategy: st.SearchStrategy) -> int | str:
        return fixed[name] if name in fixed else draw(strategy)

    # Unfixed, every bound below is the scale's own (the min/max are no-ops).
    top_next_n = min(
        scale.max_next_n,
        fixed.get("max_model_len", 2**62),
        fixed.get("max_num_batched_tokens", 2**62),
    )
    next_n = pick("next_n", st.integers(1, top_next_n))
    top_len = fixed.get("max_model_len", scale.max_model_len)
    block_size = pick("block_size", st.sampled_from([b for b in _BLOCK_SIZES if b <= top_len]))
    low_len = max(8, next_n)
    max_model_len = pick("max_model_len", st.integers(low_len, max(low_len, scale.max_model_len)))
    # One config in TILE_ODDS straddles a tile boundary B (TILE_BOUNDARIES) whatever
    # the scale: room for B + 1 or B + 2 requests, and (below) graphs captured under
    # B and above it, so that a step of B or fewer requests pads past the tile.
    tile = None
    if "max_num_seqs" not in fixed and draw(st.integers(0, TILE_ODDS - 1)) == TILE_ODDS - 1:
        tile = draw(st.sampled_from(TILE_BOUNDARIES))
        max_num_seqs = tile + draw(st.integers(1, 2))
    else:
        max_num_seqs = pick("max_num_seqs", st.integers(1, scale.max_num_seqs))
    # Enough for one full decode step (a straddling config: of every request); above
    # or below max_model_len alike.
    low_tokens = next_n * (max_num_seqs if tile is not None else 1)
    max_num_batched_tokens = pick(
        "max_num_batched_tokens",
        st.integers(low_tokens, max(low_tokens, scale.max_num_batched_tokens)),
    )
    # Capture sizes: multiples of next_n that a decode step can fill. Request
    # counts are drawn over a range that depends on neither next_n nor the
    # limits and folded into 1..max_graph_reqs, so that shrinking next_n or a
    # limit leaves the choices drawn after them in place.
    max_graph_reqs = min(max_num_seqs, max_num_batched_tokens // next_n)
    drawn = draw(st.lists(st.integers(1, scale.max_num_seqs), min_size=1, max_size=4))
    capture_reqs = [(n - 1) % max_graph_reqs + 1 for n in drawn]
    # Engines capture up to their largest decode step, so that every decode
    # step runs in some graph, padded unless its size was captured.
    if draw(st.booleans().map(lambda b: not b)):  # shrinks towards True
        capture_reqs.append(max_graph_reqs)
    sizes = {n * next_n for n in capture_reqs if n <= max_graph_reqs}
    # Half the engines also capture a size past their largest decode step, as
    # vLLM's default sizes do (up to twice it): mixed steps then fit a graph too.
    if draw(st.booleans()):
        top = max(1, max_num_batched_tokens // next_n)
        sizes.add(next_n * draw(st.integers(1, top)))
    if tile is not None and max_graph_reqs > tile:
        # The gap straddles the tile: a graph of B - 1 to B - 3 requests, none up to B,
        # one of max_graph_reqs (> B) above it.
        below = tile - draw(st.integers(1, 3))
        sizes = {s for s in sizes if not below < s // next_n < max_graph_reqs}
        sizes |= {below * next_n, max_graph_reqs * next_n}
    sizes = tuple(sorted(sizes))
    topk = pick("topk", st.integers(1, scale.topk))
    num_heads = pick("num_heads", st.integers(1, scale.num_heads))
    head_dim = pick("head_dim", st.integers(1, scale.head_dim))
    # How the runner runs steps, drawn last so that the sizes above shrink alike:
    # a mode, then a backend support the engine keeps it with
    # (reference.runner.mode_problem); each list starts at the engine's default.
    runner = draw(st.sampled_from(RUNNER_CHOICES))
    ordered = [x for x in SUPPORT_CHOICES if x in supports]
    modes = [m for m in MODE_ORDER if any(m in allowed_modes(x, next_n) for x in ordered)]
    if fixed.get("cudagraph_mode", modes[0]) not in modes:
        raise ValueError(f"no backend of {ordered} keeps cudagraph_mode={fixed['cudagraph_mode']}")
    mode = pick("cudagraph_mode", st.sampled_from(modes))
    support = draw(st.sampled_from([x for x in ordered if mode in allowed_modes(x, next_n)]))
    varlen = varlen and runner == "v2" and mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    varlen = varlen and draw(st.integers(0, 3)) == 3
    return EngineConfig(
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_spec=next_n - 1,
        cudagraph_capture_sizes=sizes,
        topk=topk,
        num_heads=num_heads,
        head_dim=head_dim,
        cudagraph_mode=mode,
        cg_support=support,
        runner=runner,
        varlen_decode=varlen,
        separate_kv_update=draw(st.booleans()),
    )


# Step shapes and decode-length patterns, in shrink order. Hypothesis starts a
# search with the simplest completions of each new prefix, so the first entry
# of each list also takes the largest share of the first examples: uniform
# decodes (the steps graphs pad) and "some fewer" (ragged decodes, whose first
# ones share a short length: the seams of bugs A and B at once).
SHAPES = ("uniform_decode", "mixed", "decode", "prefill")

# Decode lengths of "decode" and "mixed" steps (docs/domain.md, section 2):
# - "some_fewer": the first decodes carry fewer tokens, the rest ``next_n``;
# - "fewer": the drafter proposed fewer tokens this step, the same for every
#   decode: uniform, yet ``max_decode_len < next_n``;
# - "ragged": each length on its own in ``1..threshold`` (short prefill chunks);
# - "full": every decode carries ``next_n`` (mixed steps only: decode steps of
#   full decodes are the "uniform_decode" shape).
DECODE_LENGTHS = ("some_fewer", "fewer", "ragged", "full")


def _decode_lens(
    draw: st.DrawFn, pattern: str, num_decodes: int, next_n: int, threshold: int
) -> list[int]:
    """Wanted lengths of ``num_decodes`` decodes (the caller fits them to the budget)."""
    if pattern == "ragged":
        return [draw(st.integers(1, threshold)) for _ in range(num_decodes)]
    if pattern == "full":
        return [next_n] * num_decodes
    short = draw(st.integers(1, max(1, next_n - 1)))  # the real token and fewer drafts
    if pattern == "fewer":
        return [short] * num_decodes
    k = draw(st.integers(1, max(1, num_decodes - 1)))  # "some_fewer": one full at least
    return [short] * k + [next_n] * (num_decodes - k)


@st.composite
def batches(draw: st.DrawFn, config: EngineConfig) -> Batch:
    """One scheduler step that ``config`` admits, decodes first.

    A shape is drawn first so that each class keeps its share: uniform decodes
    (every ``q_len == next_n``, the ones graphs pad), decode steps whose
    lengths follow one of :data:`DECODE_LENGTHS` (fewer drafts, some fewer,
    short prefill chunks), mixed steps where prefills follow such decodes, and
    prefills only. Request counts reach ``max_num_seqs``; the last prefill of
    a step may take every token the budget has left, as chunked prefill does,
    so token counts reach ``max_num_batched_tokens``.
    """
    next_n, threshold = config.next_n, config.threshold
    shape = draw(st.sampled_from(SHAPES))
    budget = config.max_num_batched_tokens
    max_reqs = min(config.max_num_seqs, budget)  # every request needs >= 1 token
    if shape == "uniform_decode":
        max_reqs = max(1, min(max_reqs, budget // next_n))
    # Seams between requests (B >= 2, padding rows, prefills after decodes) need
    # several requests: half the steps have at least three when the limits allow.
    several = draw(st.booleans())
    least = 2 if shape == "mixed" and max_reqs > 1 else 1
    if several:
        least = max(least, min(3, max_reqs))
    num_reqs = request_count(draw, least, max_reqs)

    if shape == "uniform_decode":
        wanted = [next_n] * num_reqs
        num_prefills = 0
    else:
        if shape == "decode":
            num_decodes = num_reqs
        elif shape == "mixed" and num_reqs > 1:
            # Several decodes before the prefills, where the step has room for them.
            num_decodes = draw(st.integers(min(2 if several else 1, num_reqs - 1), num_reqs - 1))
        else:
            num_decodes = 0
        patterns = DECODE_LENGTHS if shape == "mixed" else DECODE_LENGTHS[:-1]
        pattern = draw(st.sampled_from(patterns)) if num_decodes else "full"
        wanted = _decode_lens(draw, pattern, num_decodes, next_n, threshold)
        num_prefills = num_reqs - num_decodes
    q_lens: list[int] = []
    for want in wanted:
        later = num_reqs - len(q_lens) - 1  # requests still to place, a token each
        q = max(1, min(want, budget - later))
        q_lens.append(q)
        budget -= q
    fill = num_prefills > 0 and draw(st.booleans())  # chunked prefill: the last takes the rest
    for i in range(num_prefills):
        left = num_prefills - i - 1  # requests still to place after this one
        top = min(budget - left, config.max_model_len)
        if top <= threshold:
            break  # no room for another prefill
        q = top if fill and left == 0 else draw(st.integers(threshold + 1, top))
        q_lens.append(q)
        budget -= q
    num_reqs = len(q_lens)
    if num_reqs == 0:  # a step needs a request; one decode always fits
        q_lens = [1]
    computed = []
    for q in q_lens:
        room = config.max_model_len - q
        computed.append(draw(st.integers(0, room)))
    seed = draw(st.integers(0, 2**32 - 1))
    # A step forced eager in one of eight (NONE steps come from the modes too).
    use_cudagraph = draw(st.integers(0, 7)) != 7  # shrinks towards True
    # Data parallelism in a quarter of the steps: another rank's token count,
    # a uniform decode or not (each rank pads to the largest, in the smaller mode).
    peer_tokens, peer_uniform = 0, False
    if draw(st.integers(0, 3)) == 3:
        peer_uniform = draw(st.booleans())
        if peer_uniform:
            top = max(1, min(config.max_num_seqs, config.max_num_batched_tokens // next_n))
            peer_tokens = next_n * draw(st.integers(1, top))
        else:  # mostly within the graphs, where the ranks pad to each other
            top = max(config.cudagraph_capture_sizes, default=config.max_num_batched_tokens)
            peer_tokens = draw(st.integers(1, max(top, 1)))
    return Batch(
        tuple(computed),
        tuple(q_lens),
        seed=seed,
        use_cudagraph=use_cudagraph,
        dp_peer_tokens=peer_tokens,
        dp_peer_uniform=peer_uniform,
    )


@st.composite
def cases(
    draw: st.DrawFn,
    scale: Scale = SMALL,
    params: Mapping[str, st.SearchStrategy[int]] | None = None,
    fixes: Mapping[str, int | str] | None = None,
    supports: tuple[str, ...] = SUPPORT_CHOICES,
    varlen: bool = True,
) -> Case:
    """An engine config, a step it admits, and the target's own parameters.

    ``params`` maps a parameter name to a strategy of integers, drawn after
    the step (so a target with parameters shrinks its batch the same way).
    ``fixes`` fixes engine-config fields, ``supports`` the backends' CUDA-graph
    support (see :func:`engine_configs`).
    """
    config = draw(engine_configs(scale, fixes, supports, varlen))
    batch = draw(batches(config))
    drawn = tuple((name, draw(strategy)) for name, strategy in sorted((params or {}).items()))
    return Case(config, batch, drawn)


def scenario_labels(case: Case) -> list[str]:
    """Scenario classes of a case, for ``hypothesis.event`` and coverage tables."""
    config, batch = case.config, case.batch
    meta = build_common_metadata(config, batch)
    split = split_decodes_and_prefills(meta, config.threshold)
    labels = [f"next_n={config.next_n}"]
    if config.next_n > 1:
        labels.append("next_n>1")
    if split.num_decodes and not split.num_prefills:
        labels.append("all_decode")
    elif split.num_prefills and not split.num_decodes:
        labels.append("all_prefill")
    else:
        labels.append("mixed")
    if is_uniform_decode(config, batch):
        labels.append("uniform_decode")
    if split.requires_padding:
        labels.append("requires_padding")
    if split.num_decodes and split.max_decode_len < config.next_n:
        labels.append("max_decode_len<next_n")
    real_d = split.decode_lens[: meta.num_real_reqs]
    if real_d and min(real_d) != max(real_d):
        labels.append("ragged_decode")  # short prefill chunks or fewer drafts
    elif len(real_d) >= 2 and real_d[0] < config.next_n:
        labels.append("fewer_drafts")  # several decodes, all with the same d < next_n
    step = step_plan(config, batch)
    labels.append(f"mode={step.mode}")
    labels.append(f"mode={step.mode},{'padded' if meta.padded else 'unpadded'}")
    labels.append(f"cudagraph_mode={config.cudagraph_mode}")
    labels.append(f"runner={config.runner}")
    if batch.dp_peer_tokens:
        labels.append("dp")
        own = min((s for s in config.cudagraph_capture_sizes if s >= step.num_tokens), default=0)
        if step.num_tokens_padded > max(own, step.num_tokens):
            labels.append("dp_padded")  # padded past this rank's own graph size
    if meta.padded:
        labels.append("padded")
        if meta.num_reqs > meta.num_real_reqs:
            labels.append("padding_requests")
        if config.next_n == 1:
            labels.append("padded_next_n=1")
        if split.num_prefills:
            labels.append("padded_mixed")
        elif real_d and min(real_d) != max(real_d):
            labels.append("padded_ragged_decode")
    elif not batch.use_cudagraph:
        labels.append("eager")
    if meta.slot_mapping_tokens > meta.num_actual_tokens:
        labels.append("padded_slot_mapping")
    if split.num_decodes and split.num_prefills:
        labels.append("prefills_follow_decodes")
    d = split.decode_lens
    if d and split.num_decodes * max(d) != split.num_decode_tokens:
        labels.append("B*L!=N_d")
    if d and sum(d) != split.num_decode_tokens:
        labels.append("sum(d)!=N_d")
    if batch.num_reqs == config.max_num_seqs:
        labels.append("at_max_num_seqs")
    if batch.num_reqs in tile_edges(1, batch.num_reqs):
        labels.append("at_tile_boundary")  # TILE_BOUNDARIES: B - 1, B or B + 1 requests
    if meta.padded and any(meta.num_real_reqs <= b < meta.num_reqs for b in TILE_BOUNDARIES):
        labels.append("padded_past_tile")  # a graph pads it past a tile its real count is under
    if sum(batch.q_lens) == config.max_num_batched_tokens:
        labels.append("at_max_num_batched_tokens")
    if config.max_num_batched_tokens < config.max_model_len:
        labels.append("max_num_batched_tokens<max_model_len")
    else:
        labels.append("max_num_batched_tokens>=max_model_len")
    return labels


# Measures of a case that grow as it nears the conditions of the historical bugs
# (docs/domain.md, section 8): a target names the ones that fit its bugs in
# ``Target.guided``, and the search maximizes them with ``hypothesis.target``.
BOUNDARY_MEASURES = ("padded_tokens", "padding_requests", "short_decodes", "step_tokens")


def boundary_measures(case: Case, meta: CommonMetadata, split: DecodeSplit) -> dict[str, int]:
    """Each of :data:`BOUNDARY_MEASURES` for ``case``, read off the target's view of the
    step (``meta`` and ``split``, as ``Target.describe`` gives them):

    - ``padded_tokens``: ``T_pad - T``, token slots a graph pads (stale slots,
      lengths not zeroed, padded decode tokens where ``sum(d) != N_d``);
    - ``padding_requests``: ``R_pad - R``, rows of padding requests (``seq_len = 0``
      rows, stored tables with padding rows, ``R != B``);
    - ``short_decodes``: real decodes with ``0 < d[b] < next_n`` (ragged decodes,
      ``max_decode_len < next_n``, ``B * L != N_d``);
    - ``step_tokens``: the step's real tokens ``T`` (masks and tables sized by
      the step outgrow those sized by ``max_model_len``).
    """
    real = split.decode_lens[: meta.num_real_reqs]
    return {
        "padded_tokens": meta.num_actual_tokens - meta.num_real_tokens,
        "padding_requests": meta.num_reqs - meta.num_real_reqs,
        "short_decodes": sum(1 for d in real if 0 < d < case.config.next_n),
        "step_tokens": meta.num_real_tokens,
    }
