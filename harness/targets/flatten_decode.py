"""Target ``flatten-decode``: the indexer's decode metadata, one flattened token per row.

The oracle checks, each on its own: the types, shapes and dtypes of the
buffers and of the step's views; each view starts at its persistent buffer's
first element (a replayed graph reads it there) and the context lengths are
contiguous (the logits kernel requires it); exact context lengths, the pages
each flattened token may read, decode lengths of 1, per-request decode
lengths; the zeroed tail of the context lengths; every other buffer row
unchanged; ``requires_padding`` False. A step without decodes has no decode
metadata and leaves every buffer unchanged. What a step may write is stated
in :mod:`attnfuzz.reference.flatten_decode`.
"""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import (
    Mismatch,
    expect_contiguous,
    expect_equal,
    expect_meta,
    expect_view_of,
)
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import flatten_decode as ref
from attnfuzz.reference.batch import Batch, Case, cdiv
from attnfuzz.reference.runner import DEEPSEEK_V32_CG_SUPPORTS

_FIELDS = ("context_lens", "block_table", "decode_lens", "per_req_decode_lens")


def _expect_buffers(got_buffers: object, before: ref.DecodeBuffers) -> list[Mismatch]:
    if not isinstance(got_buffers, ref.DecodeBuffers):
        return [Mismatch("type", "buffers", "DecodeBuffers", type(got_buffers).__name__)]
    out = []
    for name in _FIELDS:
        shape = getattr(before, name).shape
        out += expect_meta(f"{name}_buffer", getattr(got_buffers, name), shape, torch.int32)
    return out


def compare(
    case: Case,
    inputs: ref.FlattenDecodeInputs,
    expected: ref.FlattenDecodeExpected,
    got: ref.FlattenDecodeOutputs,
) -> list[Mismatch]:
    B, N_d = inputs.num_decodes, inputs.num_decode_tokens
    W = inputs.block_table.shape[1]
    before = expected.before
    bufs = getattr(got, "buffers", None)
    out = _expect_buffers(bufs, before)
    if out:
        return out
    assert isinstance(bufs, ref.DecodeBuffers)
    if B == 0:
        for name in _FIELDS:
            if getattr(got, name) is not None:
                out.append(Mismatch("metadata", name, "None (no decodes)", "a tensor"))
            buffer = getattr(bufs, name)
            out += expect_equal(f"{name}_buffer", buffer, getattr(before, name), check="unchanged")
        return out

    views = {name: getattr(got, name) for name in _FIELDS}
    shapes = {
        "context_lens": (N_d, 1),
        "block_table": (N_d, W),
        "decode_lens": (N_d,),
        "per_req_decode_lens": (B,),
    }
    for name in _FIELDS:
        out += expect_meta(name, views[name], shapes[name], torch.int32)
    if out:
        return out
    for name in _FIELDS:
        out += expect_view_of(name, views[name], getattr(bufs, name))
    out += expect_contiguous("context_lens", views["context_lens"])

    column = np.s_[:, 0]
    out += expect_equal(
        "context_lens", views["context_lens"][column], expected.context_lens, at=column
    )
    tail = np.s_[N_d:]
    out += expect_equal(
        "context_lens_buffer",
        bufs.context_lens[tail],
        expected.context_lens_buffer[tail],
        check="zeroed",
        at=tail,
    )
    # Only the entries a consumer may read are compared; the rest are free.
    table = views["block_table"].detach().cpu().numpy()
    read = torch.as_tensor(np.where(expected.pages, table, expected.block_table))
    out += expect_equal("block_table", read, expected.block_table)
    out += expect_equal("decode_lens", views["decode_lens"], expected.decode_lens)
    out += expect_equal(
        "per_req_decode_lens", views["per_req_decode_lens"], expected.per_req_decode_lens
    )
    for name, owned in (("block_table", N_d), ("decode_lens", N_d), ("per_req_decode_lens", B)):
        tail = np.s_[owned:]
        out += expect_equal(
            f"{name}_buffer",
            getattr(bufs, name)[tail],
            getattr(before, name)[tail],
            check="unchanged",
            at=tail,
        )
    requires_padding = getattr(got, "requires_padding", None)
    if requires_padding is not False:  # flattened tokens are never packed
        out.append(Mismatch("values", "requires_padding", "False", repr(requires_padding)))
    return out


def reference_impl(inputs: ref.FlattenDecodeInputs) -> ref.FlattenDecodeOutputs:
    """The reference's loops as an implementation (a self-check of the harness)."""
    expected = ref.reference(None, inputs)
    bufs = inputs.buffers
    B, N_d = inputs.num_decodes, inputs.num_decode_tokens
    if B == 0:
        return ref.FlattenDecodeOutputs(None, None, None, None, False, bufs)
    bufs.context_lens.copy_(torch.as_tensor(expected.context_lens_buffer))
    table = np.where(expected.pages, expected.block_table, expected.before.block_table[:N_d])
    bufs.block_table[:N_d] = torch.as_tensor(table)
    bufs.decode_lens[:N_d] = 1
    bufs.per_req_decode_lens[:B] = torch.as_tensor(expected.per_req_decode_lens)
    return ref.FlattenDecodeOutputs(
        bufs.context_lens[:N_d].unsqueeze(-1),
        bufs.block_table[:N_d],
        bufs.decode_lens[:N_d],
        bufs.per_req_decode_lens[:B],
        False,
        bufs,
    )


# The zoo's metadata of each mutant: ``reach`` (the case runs the code the bug
# lives in), ``trigger`` (the bug's condition holds, exactly) and ``smallest``.


def reach_decodes(case: Case) -> bool:
    """The step has decodes: the flattening path runs."""
    return ref.describe(case)[1].num_decodes > 0


def reach_padded(case: Case) -> bool:
    """A graph-padded step with decodes: ``N_d`` counts the padded tokens."""
    meta, split = ref.describe(case)
    return meta.padded and split.num_decodes > 0


def trigger_right_aligned(case: Case) -> bool:
    """Some real decode is shorter than the longest, ``0 < d[b] < L``."""
    d = ref.describe(case)[1].decode_lens
    return any(0 < x < max(d) for x in d)


def trigger_wrong_row(case: Case) -> bool:
    """Some real token ``i`` of decode ``b`` has ``i // L != b`` and that row's
    pages differ from its own on the pages it reads."""
    meta, split = ref.describe(case)
    L, qsl, bs = split.max_decode_len, meta.query_start_loc, case.config.block_size
    for b, d in enumerate(split.decode_lens):
        for j in range(d):
            i = int(qsl[b]) + j
            n = cdiv(int(meta.seq_lens[b]) - d + j + 1, bs)
            src = i // L
            if src != b and not np.array_equal(meta.block_table[src, :n], meta.block_table[b, :n]):
                return True
    return False


def trigger_padding_not_zeroed(case: Case) -> bool:
    """The graph pads decode tokens, ``sum(d) < N_d``, and a stale length sits there."""
    inputs = ref.make_inputs(case)
    lo, hi = inputs.num_real_decode_tokens, inputs.num_decode_tokens
    return inputs.num_decodes > 0 and bool((inputs.buffers.context_lens[lo:hi] != 0).any())


def trigger_unaligned_width(case: Case) -> bool:
    """The step has decodes and the runner's 128-token-aligned block table is wider
    than ``cdiv(max_model_len, block_size)``, the width #50302 replaced."""
    return reach_decodes(case) and ref.block_table_width(case.config) != (
        case.config.max_blocks_per_seq
    )


def _spec_case(q_lens: tuple[int, ...], computed: tuple[int, ...]) -> Case:
    from attnfuzz.harness.testing import spec_config

    return Case(spec_config(), Batch(computed, q_lens, seed=0, use_cudagraph=True))


def smallest_ragged() -> Case:
    """next_n = 2, two decodes ``d = [1, 2]``: ``L = 2``; decode 0 sees ``seq_len`` keys,
    not ``seq_len - 1``, and token 1 is decode 1's, not row ``1 // 2 = 0``'s."""
    return _spec_case((1, 2), (1, 1))


def smallest_padded() -> Case:
    """next_n = 2, three decodes of 2 tokens = 6 padded to capture size 8 (``R_pad = 4``,
    ``d = [2, 2, 2, 0]``): flattened tokens 6 and 7 belong to no request."""
    return _spec_case((2, 2, 2), (1, 1, 1))


def smallest_unaligned_width() -> Case:
    """One decode of one token; ``max_model_len = 64`` in pages of 4 is 16 pages, the
    runner's row 32 (128 tokens)."""
    return _spec_case((1,), (0,))


def build() -> Target:
    from attnfuzz.kernels import flatten_decode as k

    target = Target(
        name="flatten-decode",
        summary="the indexer's flattened decode metadata: per token its context length and pages",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        describe=ref.describe,
        # Right-aligned and wrong-row bugs need decodes shorter than the longest
        # (short decodes); stale lengths need graph-padded decode tokens.
        guided=("short_decodes", "padded_tokens"),
        # DeepSeek-V3.2's sparse MLA backends (FlashMLA, FlashInfer, AITER: UNIFORM_BATCH;
        # XPU: NEVER) bound the engine's mode: no FULL graphs of mixed steps.
        cg_supports=DEEPSEEK_V32_CG_SUPPORTS,
        varlen_decode=False,  # adaptive verification changes the builder's path
    )
    target.add(Implementation("triton", k.flatten_decode, "fixed", "one program per decode"))
    target.add(Implementation("reference", reference_impl, "reference", "the reference's loops"))
    target.add(
        Implementation(
            "right-aligned-on-max",
            k.mutant_right_aligned,
            "mutant",
            "context lengths seq_len - L + j + 1: short decodes of a ragged step see too few keys",
            trigger=trigger_right_aligned,
            reach=reach_decodes,
            smallest=smallest_ragged,
        )
    )
    target.add(
        Implementation(
            "row-by-max",
            k.mutant_wrong_row,
            "mutant",
            "token i takes block-table row i // L: ragged decodes read another request's pages",
            trigger=trigger_wrong_row,
            reach=reach_decodes,
            smallest=smallest_ragged,
        )
    )
    target.add(
        Implementation(
            "padding-not-zeroed",
            k.mutant_padding_not_zeroed,
            "mutant",
            "padded tokens' context lengths keep stale values",
            trigger=trigger_padding_not_zeroed,
            reach=reach_padded,
            smallest=smallest_padded,
        )
    )
    return target
