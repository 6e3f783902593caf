"""Target ``decode-split``: the decode/prefill split every backend's metadata starts from.

vLLM's ``split_decodes_and_prefills`` (ragged or uniform rule, short extends
as decodes or as prefills) and ``split_decodes_prefills_and_extends`` on the
step's common metadata, padded steps included. The oracle checks each count
on its own: an integer its consumers can use (``operator.index`` on the host,
no bool), the exact value, and the invariants the consumers rely on (the
counts add up to ``num_reqs`` and ``num_actual_tokens``).
"""

from __future__ import annotations

import dataclasses
import operator

import torch
from attnfuzz.harness.oracle import Mismatch
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import decode_split as ref
from attnfuzz.reference.batch import Batch, Case, CommonMetadata

SPLIT = ("num_decodes", "num_prefills", "num_decode_tokens", "num_prefill_tokens")
SPLIT_EXTENDS = (
    "num_decodes",
    "num_extends",
    "num_prefills",
    "num_decode_tokens",
    "num_extend_tokens",
    "num_prefill_tokens",
)


def _count(where: str, value: object) -> tuple[int | None, list[Mismatch]]:
    """The integer a consumer reads from ``value``, or why it cannot.

    Python ints, and 0-d integer tensors on the host (consumers slice and add
    with them; ``__index__`` serves both); not bools, not device tensors (a
    consumer's ``int()`` would synchronize the device)."""
    if isinstance(value, bool):
        return None, [Mismatch("type", where, "an integer", "bool")]
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.device.type != "cpu" or value.is_floating_point():
            got = f"tensor {list(value.shape)} {value.dtype} on {value.device}"
            return None, [Mismatch("type", where, "an integer on the host", got)]
        if value.dtype == torch.bool:
            return None, [Mismatch("type", where, "an integer", "bool tensor")]
    try:
        return operator.index(value), []
    except TypeError:
        return None, [Mismatch("type", where, "an integer", type(value).__name__)]


def _expect_counts(
    name: str, fields: tuple[str, ...], expected: tuple, got: object, num_reqs: int, num_tokens: int
) -> list[Mismatch]:
    if not isinstance(got, tuple | list) or len(got) != len(fields):
        return [Mismatch("shape", name, f"a tuple of {len(fields)} counts", repr(got)[:160])]
    out: list[Mismatch] = []
    values: dict[str, int] = {}
    for field, want, value in zip(fields, expected, got, strict=True):
        n, bad = _count(f"{name}.{field}", value)
        out += bad
        if n is None:
            continue
        values[field] = n
        if n != want:
            out.append(Mismatch("values", f"{name}.{field}", str(want), str(n)))
    if len(values) == len(fields):
        reqs = [v for f, v in values.items() if not f.endswith("_tokens")]
        tokens = [v for f, v in values.items() if f.endswith("_tokens")]
        if sum(reqs) != num_reqs or min(reqs) < 0:
            out.append(Mismatch("invariant", f"{name} requests", f"sum {num_reqs}", str(reqs)))
        if sum(tokens) != num_tokens or min(tokens) < 0:
            out.append(Mismatch("invariant", f"{name} tokens", f"sum {num_tokens}", str(tokens)))
    return out


def compare(
    case: Case, inputs: ref.DecodeSplitInputs, expected: ref.DecodeSplitOutputs, got
) -> list[Mismatch]:
    R, T = inputs.meta.num_reqs, inputs.meta.num_actual_tokens
    out = _expect_counts("split", SPLIT, expected.split, getattr(got, "split", None), R, T)
    out += _expect_counts(
        "split_extends",
        SPLIT_EXTENDS,
        expected.split_extends,
        getattr(got, "split_extends", None),
        R,
        T,
    )
    return out


def reference_impl(inputs: ref.DecodeSplitInputs) -> ref.DecodeSplitOutputs:
    return ref.reference(None, inputs)


# The zoo's metadata of each mutant (docs/domain.md, section 8, for the convention).


def _inputs(case: Case, **changes: object) -> ref.DecodeSplitInputs:
    return dataclasses.replace(ref.make_inputs(case), **changes)


def reach_uniform(case: Case) -> bool:
    """The uniform rule is asked for."""
    return bool(case.param("require_uniform"))


def trigger_ragged_where_uniform(case: Case) -> bool:
    """The uniform and the ragged rules split the step differently (decodes of
    another length than the first one, within the threshold)."""
    if not case.param("require_uniform"):
        return False
    return ref.split(_inputs(case)) != ref.split(_inputs(case, require_uniform=False))


def trigger_padding_as_prefills(case: Case) -> bool:
    """Uniform rule, a padded step with padding requests (``R_pad > R``), the first
    request a decode, and no real request a prefill (so the padding requests
    are where the decodes end)."""
    inputs = ref.make_inputs(case)
    meta = inputs.meta
    if not (case.param("require_uniform") and meta.num_reqs > meta.num_real_reqs):
        return False
    if int(meta.query_lens[0]) > inputs.decode_threshold:
        return False
    short_prefills = not inputs.treat_short_extends_as_decodes
    return not (short_prefills and inputs.is_prefilling[: meta.num_real_reqs].any())


def reach_padded(case: Case) -> bool:
    """The step was padded for a graph with more tokens than it scheduled."""
    meta = ref.make_inputs(case).meta
    return meta.num_actual_tokens > meta.num_real_tokens


def trigger_real_decode_tokens(case: Case) -> bool:
    """A padded step (``T_pad > T``) that the split finds made of decodes only."""
    return reach_padded(case) and ref.split(ref.make_inputs(case))[1] == 0


def _padded_for_graph(meta: CommonMetadata) -> bool:
    return meta.num_actual_tokens > meta.num_real_tokens or meta.num_reqs > meta.num_real_reqs


def reach_padded_graph(case: Case) -> bool:
    """The step was padded for a graph: more tokens, or more requests (a mixed FULL
    graph has ``min(num_tokens, max_num_seqs)`` requests), than it scheduled."""
    return _padded_for_graph(ref.make_inputs(case).meta)


def trigger_padded_mixed(case: Case) -> bool:
    """A padded step, its first request a decode, that the split cuts by length: a
    request longer than the threshold (or, under the uniform rule, of another length
    than the first) makes it mixed: a FULL step of a mixed batch."""
    inputs = ref.make_inputs(case)
    if not _padded_for_graph(inputs.meta):
        return False
    if int(inputs.meta.query_lens[0]) > inputs.decode_threshold:
        return False
    no_length_rule = _inputs(case, decode_threshold=2**31 - 1, require_uniform=False)
    return ref.split(inputs) != ref.split(no_length_rule)


def reach_longer(case: Case) -> bool:
    """Some request is longer than the threshold: the three-way split looks at context."""
    inputs = ref.make_inputs(case)
    return bool((inputs.meta.query_lens > inputs.decode_threshold).any())


def trigger_extends(case: Case) -> bool:
    """The three-way split finds extends (chunks with cached context) in the step."""
    return ref.split_extends(ref.make_inputs(case))[1] > 0


def _case(q_lens: tuple[int, ...], computed: tuple[int, ...], require_uniform: int = 0) -> Case:
    from attnfuzz.harness.testing import spec_config

    params = (
        ("decode_threshold", 0),
        ("require_uniform", require_uniform),
        ("short_extends_as_prefills", 0),
    )
    return Case(spec_config(), Batch(computed, q_lens, seed=0, use_cudagraph=True), params)


def smallest_ragged_where_uniform() -> Case:
    """next_n = 2, d = [1, 2]: uniform splits (1, 1, 1, 2), ragged (2, 0, 3, 0)."""
    return _case((1, 2), (1, 1), require_uniform=1)


def smallest_padding_as_prefills() -> Case:
    """Three decodes of 2 tokens padded to the graph of 8 (``d = [2, 2, 2, 0]``),
    uniform rule: (4, 0, 8, 0); with the padding request a prefill, (3, 1, 6, 2)."""
    return _case((2, 2, 2), (1, 1, 1), require_uniform=1)


def smallest_real_decode_tokens() -> Case:
    """The same padded step under the ragged rule: ``N_d = 8``, not the 6 real tokens."""
    return _case((2, 2, 2), (1, 1, 1))


def smallest_padded_mixed() -> Case:
    """``cudagraph_mode=FULL`` on a backend that keeps it for every step (``ALWAYS``):
    one decode and a prefill chunk of 2 tokens, 3 tokens padded to the graph of 4, and
    2 requests to 4 (``CudagraphDispatcher._create_padded_batch_descriptor``: a mixed
    FULL graph has ``min(num_tokens, max_num_seqs)`` requests). The split is
    (1, 3, 1, 3): the decode, then the prefill and the padding requests after it; as a
    decode graph, (4, 0, 4, 0)."""
    from attnfuzz.harness.testing import spec_config

    config = spec_config(
        num_spec=0,
        max_num_batched_tokens=4,
        cudagraph_capture_sizes=(4,),
        cudagraph_mode="FULL",
        cg_support="ALWAYS",
    )
    params = (("decode_threshold", 0), ("require_uniform", 0), ("short_extends_as_prefills", 0))
    return Case(config, Batch((1, 0), (1, 2), seed=0, use_cudagraph=True), params)


def smallest_extends() -> Case:
    """One 3-token chunk with one cached token (threshold 2): one extend of 3 tokens."""
    return _case((3,), (1,))


def build() -> Target:
    from attnfuzz.kernels import decode_split as k

    target = Target(
        name="decode-split",
        summary="decode/prefill(/extend) split of a step: request and token counts",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        params=dict(ref.PARAMS),
        describe=ref.describe,
        # The uniform rule meets padding requests (R_pad > R: padding as prefills),
        # graph-padded tokens (T_pad > T: real decode tokens) and decodes of
        # another length (ragged where uniform); each grows towards its bug.
        guided=("padding_requests", "padded_tokens", "short_decodes"),
    )
    target.add(Implementation("triton", k.decode_split, "fixed", "torch masks on the host"))
    target.add(Implementation("reference", reference_impl, "reference", "the reference rules"))
    target.add(
        Implementation(
            "ragged-where-uniform",
            k.mutant_ragged_where_uniform,
            "mutant",
            "require_uniform ignored: decodes of another length than the first kept",
            trigger=trigger_ragged_where_uniform,
            reach=reach_uniform,
            smallest=smallest_ragged_where_uniform,
        )
    )
    padding = dict(
        trigger=trigger_padding_as_prefills,
        reach=reach_uniform,
        smallest=smallest_padding_as_prefills,
    )
    target.add(
        Implementation(
            "padding-as-prefills",
            k.mutant_padding_as_prefills,
            "mutant",
            "#29644: zero-length padding requests are prefills under the uniform rule",
            **padding,
        )
    )
    target.add(
        Implementation(
            "real-decode-tokens",
            k.mutant_real_decode_tokens,
            "mutant",
            "decode-only step counts the real tokens, not num_actual_tokens",
            trigger=trigger_real_decode_tokens,
            reach=reach_padded,
            smallest=smallest_real_decode_tokens,
        )
    )
    target.add(
        Implementation(
            "padded-as-decode-graph",
            k.mutant_padded_as_decode_graph,
            "mutant",
            "a padded step taken for a decode graph, its lengths unchecked: wrong on a "
            "padded mixed step",
            trigger=trigger_padded_mixed,
            reach=reach_padded_graph,
            smallest=smallest_padded_mixed,
        )
    )
    target.add(
        Implementation(
            "extends-as-prefills",
            k.mutant_extends_as_prefills,
            "mutant",
            "three-way split ignores context: extends counted as prefills",
            trigger=trigger_extends,
            reach=reach_longer,
            smallest=smallest_extends,
        )
    )
    return target
