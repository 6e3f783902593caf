"""Reference of the decode/prefill split every attention backend starts from.

vLLM (0.33.0, ``vllm/v1/attention/backends/utils.py``) has two splitters that
every builder calls on the step's common metadata, after the model runner
reordered the batch (decodes, short extends, long extends, prefills):

``split_decodes_and_prefills(meta, decode_threshold, require_uniform,
treat_short_extends_as_decodes)`` returns ``(num_decodes, num_prefills,
num_decode_tokens, num_prefill_tokens)``. The rules, as the fixed code states them:

- the decodes are the leading requests before the first request that is a
  *prefill*; there are none when the first request is longer than the threshold;
- *ragged rule*: a request is a prefill when ``q_len > decode_threshold``;
  zero-length padding requests are decodes;
- *uniform rule* (``require_uniform``): a request is a prefill when its
  ``q_len`` differs from the first request's and is not 0, so the zero-length
  padding requests of a padded graph are decodes wherever they sit
  (#29644: ``num_decodes`` must be the captured size);
- ``treat_short_extends_as_decodes=False``: a request still prefilling its
  prompt (``is_prefilling``) is a prefill whatever its length;
- a step made of decodes only counts all ``num_actual_tokens``, padded
  tokens included, as decode tokens; otherwise ``N_d = query_start_loc[B]``.

``split_decodes_prefills_and_extends(meta, decode_threshold)`` returns
``(num_decodes, num_extends, num_prefills, num_decode_tokens,
num_extend_tokens, num_prefill_tokens)``: decodes as by the ragged rule; after
them the *extends* (longer than the threshold, with cached context); the
prefills start at the first request longer than the threshold that has no
context (``seq_len == q_len`` on the host upper bound of the lengths).

Invariants of both: the request counts add up to ``num_reqs`` and the token
counts to ``num_actual_tokens``; decodes come first.

Types. Consumers use the counts as Python integers: slice bounds, sums, and
``if n > 0``. ``split_decodes_prefills_and_extends`` returns its last two
counts as 0-d CPU int64 tensors when the step has extends *and* prefills
(``num_tokens - query_start_loc[first_prefill]`` without ``.item()``), though
it declares ``tuple[int, ...]``. Both 0.33.0 consumers (``rocm_aiter_fa.py``
and ``cp_utils.split_dcp_context_queries``) only use them as slice bounds and
in sums, which a 0-d integer tensor serves through ``__index__``; so the
oracle asks what the consumers need (``operator.index`` works, on the host,
the exact value) and the declared type is noted in the report, not judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from attnfuzz.reference.batch import Case, CommonMetadata, DecodeSplit, build_common_metadata

_DATA_SEED_SALT = 0xD5
"""Keeps the is_prefilling draws apart from the page-id stream of the same seed."""

PARAMS: dict[str, tuple[int, int]] = {
    # 0: the engine's threshold (next_n); k > 0: a builder's own threshold k
    "decode_threshold": (0, 4),
    "require_uniform": (0, 1),
    # 0: treat_short_extends_as_decodes=True (vLLM's default); 1: False
    "short_extends_as_prefills": (0, 1),
}


@dataclass
class DecodeSplitInputs:
    """What a builder hands the splitters: the step's metadata and its arguments."""

    meta: CommonMetadata  # padded where the graph pads
    decode_threshold: int
    require_uniform: bool
    treat_short_extends_as_decodes: bool
    is_prefilling: np.ndarray  # bool [R_pad]: still in its prompt; padding rows False
    seq_lens_upper_bound: np.ndarray  # int32 [R_pad]: host bound of seq_lens (exact here)


@dataclass
class DecodeSplitOutputs:
    split: tuple  # (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens)
    # (num_decodes, num_extends, num_prefills, num_decode_tokens, num_extend_tokens,
    #  num_prefill_tokens)
    split_extends: tuple


def threshold(case: Case) -> int:
    k = case.param("decode_threshold")
    return case.config.threshold if k == 0 else k


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    """The step's metadata and its split as this target's parameters ask for."""
    meta = build_common_metadata(case.config, case.batch)
    inputs = make_inputs(case)
    d, p, nd, np_ = split(inputs)
    return meta, DecodeSplit(d, p, nd, np_, tuple(int(q) for q in meta.query_lens[:d]))


def _is_prefilling(case: Case, meta: CommonMetadata) -> np.ndarray:
    """Which real requests are still in their prompt, drawn from the seed.

    A request with no cached token is in its prompt. Of the others, each is a
    short or long extend (a later chunk of its prompt) from a seeded coin on,
    as the runner orders them after the decodes (decodes, short extends, long
    extends, prefills). Short prompts with no context may still sit among the
    decodes (the runner would move them last): the rules are stated per
    position, so the splitters are judged on such steps as well. Padding
    requests are not prefilling (the runner clears their rows).
    """
    rng = np.random.default_rng([case.batch.seed, _DATA_SEED_SALT])
    out = np.zeros(meta.num_reqs, dtype=bool)
    computed = case.batch.num_computed_tokens
    coins = rng.integers(0, 2, size=meta.num_real_reqs).astype(bool)
    seen_extend = False
    for r in range(meta.num_real_reqs):
        if computed[r] == 0:
            out[r] = True
        else:
            # extends follow the decodes: once one is drawn, the rest are too
            seen_extend = seen_extend or bool(coins[r])
            out[r] = seen_extend
    return out


def make_inputs(case: Case, device: object = "cpu") -> DecodeSplitInputs:
    meta = build_common_metadata(case.config, case.batch)
    return DecodeSplitInputs(
        meta=meta,
        decode_threshold=threshold(case),
        require_uniform=bool(case.param("require_uniform")),
        treat_short_extends_as_decodes=not case.param("short_extends_as_prefills"),
        is_prefilling=_is_prefilling(case, meta),
        seq_lens_upper_bound=meta.seq_lens.copy(),
    )


def split(inputs: DecodeSplitInputs) -> tuple[int, int, int, int]:
    """``split_decodes_and_prefills`` by the rules of the module docstring, request by request."""
    meta = inputs.meta
    q = [int(x) for x in meta.query_lens]
    num_reqs, num_tokens, thr = meta.num_reqs, meta.num_actual_tokens, inputs.decode_threshold
    if q[0] > thr:  # a prefill first: no decodes, under either rule
        return 0, num_reqs, 0, num_tokens
    first_prefill = num_reqs
    for r in range(num_reqs):
        if inputs.require_uniform:
            prefill = q[r] != q[0] and q[r] != 0
        else:
            prefill = q[r] > thr
        if not inputs.treat_short_extends_as_decodes and inputs.is_prefilling[r]:
            prefill = True
        if prefill:
            first_prefill = r
            break
    if first_prefill == num_reqs:  # decodes only: padded tokens are decode tokens
        return num_reqs, 0, num_tokens, 0
    decode_tokens = int(meta.query_start_loc[first_prefill])
    return first_prefill, num_reqs - first_prefill, decode_tokens, num_tokens - decode_tokens


def split_extends(inputs: DecodeSplitInputs) -> tuple[int, int, int, int, int, int]:
    """``split_decodes_prefills_and_extends``: decodes, extends, prefills, request by request."""
    meta = inputs.meta
    q = [int(x) for x in meta.query_lens]
    num_reqs, num_tokens, thr = meta.num_reqs, meta.num_actual_tokens, inputs.decode_threshold
    longer = [r for r in range(num_reqs) if q[r] > thr]
    if not longer:
        return num_reqs, 0, 0, num_tokens, 0, 0
    first_extend = longer[0]
    fresh = [r for r in longer if int(inputs.seq_lens_upper_bound[r]) == q[r]]
    decode_tokens = int(meta.query_start_loc[first_extend])
    if not fresh:
        return (
            first_extend,
            num_reqs - first_extend,
            0,
            decode_tokens,
            num_tokens - decode_tokens,
            0,
        )
    first_prefill = fresh[0]
    prefill_tokens = num_tokens - int(meta.query_start_loc[first_prefill])
    return (
        first_extend,
        first_prefill - first_extend,
        num_reqs - first_prefill,
        decode_tokens,
        num_tokens - decode_tokens - prefill_tokens,
        prefill_tokens,
    )


def reference(case: Case | None, inputs: DecodeSplitInputs) -> DecodeSplitOutputs:
    return DecodeSplitOutputs(split(inputs), split_extends(inputs))
