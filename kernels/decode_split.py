"""The decode/prefill split as torch glue on the host ``query_start_loc``, and its mutants.

``split_decodes_and_prefills`` and ``split_decodes_prefills_and_extends`` are
attnfuzz's own vectorized implementations of the rules of
:mod:`attnfuzz.reference.decode_split` (one boolean mask per rule, the first
prefill found with ``argmax``), returning Python integers. The mutants
re-create the ways the split went or could go wrong, each differing from the
fixed path in one place.
"""

from __future__ import annotations

import torch
from attnfuzz.reference.decode_split import DecodeSplitInputs, DecodeSplitOutputs


def _query_lens(inp: DecodeSplitInputs) -> tuple[torch.Tensor, torch.Tensor]:
    qsl = torch.as_tensor(inp.meta.query_start_loc)
    return qsl, qsl[1:] - qsl[:-1]


def _split(
    inp: DecodeSplitInputs,
    *,
    uniform_rule: bool = True,
    padding_is_decode: bool = True,
    padded_tokens_are_decode: bool = True,
    padded_is_decode_graph: bool = False,
) -> tuple[int, int, int, int]:
    qsl, q = _query_lens(inp)
    num_reqs, num_tokens, thr = inp.meta.num_reqs, inp.meta.num_actual_tokens, inp.decode_threshold
    if int(q[0]) > thr:
        return 0, num_reqs, 0, num_tokens
    if inp.require_uniform and uniform_rule:
        is_prefill = q != q[0]
        if padding_is_decode:  # zero-length padding requests keep the graph's size
            is_prefill &= q != 0
    else:
        is_prefill = q > thr
    if padded_is_decode_graph and (num_tokens > int(qsl[-1]) or bool((q == 0).any())):
        is_prefill = torch.zeros_like(is_prefill)  # padded: the first request speaks for all
    if not inp.treat_short_extends_as_decodes:
        is_prefill |= torch.as_tensor(inp.is_prefilling)
    if not bool(is_prefill.any()):
        decode_tokens = num_tokens if padded_tokens_are_decode else int(qsl[-1])
        return num_reqs, 0, decode_tokens, num_tokens - decode_tokens
    first = int(is_prefill.int().argmax())
    decode_tokens = int(qsl[first])
    return first, num_reqs - first, decode_tokens, num_tokens - decode_tokens


def _split_extends(
    inp: DecodeSplitInputs, *, fresh_only: bool = True
) -> tuple[int, int, int, int, int, int]:
    qsl, q = _query_lens(inp)
    num_reqs, num_tokens, thr = inp.meta.num_reqs, inp.meta.num_actual_tokens, inp.decode_threshold
    longer = q > thr
    if not bool(longer.any()):
        return num_reqs, 0, 0, num_tokens, 0, 0
    fresh = longer
    if fresh_only:  # a prefill has no context: its whole sequence is this step's
        fresh = longer & (torch.as_tensor(inp.seq_lens_upper_bound) == q)
    first_extend = int(longer.int().argmax())
    decode_tokens = int(qsl[first_extend])
    if not bool(fresh.any()):
        rest = num_tokens - decode_tokens
        return first_extend, num_reqs - first_extend, 0, decode_tokens, rest, 0
    first_prefill = int(fresh.int().argmax())
    prefill_tokens = num_tokens - int(qsl[first_prefill])
    extend_tokens = num_tokens - decode_tokens - prefill_tokens
    return (
        first_extend,
        first_prefill - first_extend,
        num_reqs - first_prefill,
        decode_tokens,
        extend_tokens,
        prefill_tokens,
    )


def decode_split(inp: DecodeSplitInputs) -> DecodeSplitOutputs:
    """Fixed: both splits by the rules of the reference."""
    return DecodeSplitOutputs(_split(inp), _split_extends(inp))


def mutant_ragged_where_uniform(inp: DecodeSplitInputs) -> DecodeSplitOutputs:
    """``require_uniform`` ignored: the ragged rule keeps decodes of another length
    than the first, which a uniform ``[B, L]`` consumer cannot lay out."""
    return DecodeSplitOutputs(_split(inp, uniform_rule=False), _split_extends(inp))


def mutant_padding_as_prefills(inp: DecodeSplitInputs) -> DecodeSplitOutputs:
    """Zero-length padding requests count as prefills under the uniform rule, as
    before #29644: ``num_decodes`` is not the captured size."""
    return DecodeSplitOutputs(_split(inp, padding_is_decode=False), _split_extends(inp))


def mutant_real_decode_tokens(inp: DecodeSplitInputs) -> DecodeSplitOutputs:
    """A decode-only step counts ``query_start_loc[-1]`` (the real tokens) as decode
    tokens, leaving the padded tokens to no one: the counts no longer add up."""
    return DecodeSplitOutputs(_split(inp, padded_tokens_are_decode=False), _split_extends(inp))


def mutant_padded_as_decode_graph(inp: DecodeSplitInputs) -> DecodeSplitOutputs:
    """A padded step whose first request is a decode is taken for a captured decode
    graph: no request is checked for its length. True of the graphs that pad decode
    steps only; wrong on a FULL step of a mixed batch (``cudagraph_mode=FULL`` with a
    backend that keeps it), whose prefill chunks the builder then runs as decodes."""
    return DecodeSplitOutputs(_split(inp, padded_is_decode_graph=True), _split_extends(inp))


def mutant_extends_as_prefills(inp: DecodeSplitInputs) -> DecodeSplitOutputs:
    """Every request longer than the threshold is a prefill: extends (chunks with
    cached context) are run as prefills with no context."""
    return DecodeSplitOutputs(_split(inp), _split_extends(inp, fresh_only=False))
