"""Target ``mtp-seq-lens``: per-token context lengths of native MTP (bug B, #42135).

The oracle checks what the logits kernel and a CUDA graph need of the table,
each property on its own: the path is one the engine may take; exact shape and
dtype; the lengths live in persistent memory that existed before the step
(``graph``: a view, inside its bounds, of the workspace, of the
implementation's own persistent buffer, or of the step's ``seq_lens``);
contiguity and strides; the consumer's own contract; exact values; and nothing
else written (the workspace, the implementation's buffer outside the lengths,
the step's ``seq_lens``).

Graph safety is judged on the outputs, not on the call (``graph_safe=False``):
the engine builds metadata eagerly, before a graph replays (vLLM 0.33.0,
``indexer.py:DeepseekV32IndexerMetadataBuilder.build``, whose
``_prepare_decode_tensors`` computes through temporaries), so what a graph
needs is that the lengths it reads keep their persistent address. A
``.contiguous()`` copy is new storage, and fails ``graph`` all the same.
"""

from __future__ import annotations

from enum import StrEnum

import torch
from attnfuzz.harness.oracle import (
    Mismatch,
    expect_contiguous,
    expect_equal,
    expect_inside,
    expect_meta,
    expect_strides,
    expect_untouched_outside,
)
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.reference import mtp_seq_lens as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.runner import DEEPSEEK_V32_CG_SUPPORTS


class OwnCheck(StrEnum):
    """mtp-seq-lens's own checks, beside the oracle's generic ones."""

    CONSUMER = "consumer"  # the logits kernel accepts the lengths
    PATH = "path"  # the builder's path (native MTP or flattening)


def expect_consumable(name: str, lens: torch.Tensor, rows: int) -> list[Mismatch]:
    """What the paged MQA logits kernel asserts of its lengths before it runs."""
    from attnfuzz.kernels.indexer_ops import check_lengths

    try:
        check_lengths("paged_mqa_logits", "context_lens", lens, rows)
    except ValueError as err:  # the consumer refuses them: a finding
        return [Mismatch(OwnCheck.CONSUMER, name, "lengths the logits kernel accepts", str(err))]
    return []


def expect_persistent(
    name: str, lens: torch.Tensor, buffers: dict[str, torch.Tensor]
) -> list[Mismatch]:
    """``graph``: ``lens`` is a view of one of the persistent ``buffers`` (memory that
    existed before the step, whose address a replayed graph keeps); ``view``: every
    element of it lies inside that buffer."""
    for buffer in buffers.values():
        if lens.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr():
            return expect_inside(name, lens, buffer)
    return [
        Mismatch(
            "graph",
            name,
            f"a view of a persistent buffer that existed before the step ({', '.join(buffers)})",
            "new storage",
        )
    ]


def compare(
    case: Case, inputs: ref.MtpSeqLensInputs, expected: ref.MtpSeqLensExpected, got
) -> list[Mismatch]:
    lens = getattr(got, "context_lens", got)
    own = getattr(got, "buffer", None)
    path = getattr(got, "path", ref.NATIVE)
    if path not in expected.paths:
        return [Mismatch(OwnCheck.PATH, "path", " or ".join(expected.paths), repr(path))]
    native = path == ref.NATIVE
    if native:
        shape = (inputs.num_decodes, inputs.max_decode_len)
    else:
        shape = (expected.flattened_tokens, 1)
    if not isinstance(lens, torch.Tensor):
        return expect_meta("context_lens", lens, shape, torch.int32)
    persistent = {"the workspace": inputs.workspace}
    if own is not None:
        if not isinstance(own, torch.Tensor) or own.numel() > inputs.workspace.numel():
            what = f"{own.numel()} elements" if isinstance(own, torch.Tensor) else type(own)
            return [
                Mismatch(
                    "view",
                    "buffer",
                    f"a tensor of at most the workspace's {inputs.workspace.numel()} elements",
                    str(what),
                )
            ]
        persistent = {"the implementation's own buffer": own}
    persistent["the step's seq_lens"] = inputs.seq_lens
    out = expect_persistent("context_lens", lens, persistent)
    meta = expect_meta("context_lens", lens, shape, torch.int32)
    if meta:
        return out + meta
    out += expect_contiguous("context_lens", lens)
    out += expect_strides("context_lens", lens, (shape[1], 1))
    out += expect_consumable("context_lens", lens, shape[0] * shape[1])
    if native:  # a flattened answer's values are the target flatten-decode's
        out += expect_equal("context_lens", lens, expected.context_lens)
    out += expect_untouched_outside("workspace", inputs.workspace, expected.workspace_before, lens)
    if own is not None and native:  # the flattening path zeroes its buffer's tail
        before = expected.workspace_before[: own.numel()]
        out += expect_untouched_outside("buffer", own.reshape(-1), before, lens)
    out += expect_equal("seq_lens", inputs.seq_lens, expected.seq_lens_before, check="unchanged")
    return out


def path_statistic(got) -> dict[str, int]:
    """How many cases each path judged (a flattened answer's values are not judged here)."""
    return {f"{getattr(got, 'path', ref.NATIVE)}_path": 1}


def reference_impl(inputs: ref.MtpSeqLensInputs) -> ref.MtpSeqLensOutputs:
    """The reference's formula as an implementation (a self-check of the harness).

    ``max(seq_len[b] - L + 1 + j, 0)`` in place, with torch ops on the inputs'
    device, into the first ``B * L`` elements of the flat table. Not the NumPy
    loops themselves: on a GPU their host round trip (``.cpu()``) allocates
    inside the call and could not be captured in a graph.
    """
    B, L = inputs.num_decodes, inputs.max_decode_len
    out = inputs.flat_table[: B * L].view(B, L)
    out.copy_(inputs.seq_lens[:B, None].expand(B, L))  # seq_len[b] in every slot of row b
    for j in range(L):
        out[:, j].add_(j - L + 1)
    out.clamp_(min=0)
    return ref.MtpSeqLensOutputs(out)


# The zoo's metadata of each mutant: ``reach`` (the case runs the code the bug
# lives in), ``trigger`` (the bug's condition holds) and ``smallest`` (the
# smallest trigger, derived by hand on the example engine of docs/domain.md, section 7).


def reach_table(case: Case) -> bool:
    """The step has decodes with ``next_n > 1``: the native path builds a ``[B, L]`` table."""
    _, s = ref.describe(case)
    return case.config.next_n > 1 and s.num_decodes > 0


def trigger_strided(case: Case) -> bool:
    """``B >= 2`` and ``L < next_n``: the slice ``[:B, :L]`` of a ``[S, next_n]`` table
    skips elements between rows (with ``B == 1`` the row stride is never used)."""
    _, s = ref.describe(case)
    return s.num_decodes >= 2 and 0 < s.max_decode_len < case.config.next_n


def reach_padded(case: Case) -> bool:
    """The step was padded for a graph (``seq_len = 0`` rows exist only there)."""
    meta, s = ref.describe(case)
    return meta.padded and s.num_decodes > 0


def trigger_noclamp(case: Case) -> bool:
    """Some slot is negative before the clamp: ``seq_len[b] - L + 1 < 0`` for a decode ``b``.

    Under the uniform rule real decodes have ``seq_len >= d == L``, so these are
    the padding requests of a padded graph, with ``L >= 2``."""
    meta, s = ref.describe(case)
    L = s.max_decode_len
    return any(int(meta.seq_lens[b]) - L + 1 < 0 for b in range(s.num_decodes))


def _spec_case(q_lens: tuple[int, ...], computed: tuple[int, ...]) -> Case:
    from attnfuzz.harness.testing import spec_config

    return Case(spec_config(), Batch(computed, q_lens, seed=0, use_cudagraph=True))


def smallest_strided() -> Case:
    """docs/domain.md, bug B: next_n = 2, two decodes with d = [1, 1]: ``B = 2, L = 1 < 2``."""
    return _spec_case((1, 1), (1, 1))


def smallest_noclamp() -> Case:
    """next_n = 2, 3 requests x 2 tokens = 6 padded to capture size 8 (2 and 4 are
    captured, so fewer requests are not padded): padding request 3 has seq_len 0."""
    return _spec_case((2, 2, 2), (1, 1, 1))


def build() -> Target:
    from attnfuzz.kernels import mtp_seq_lens as k

    return Target(
        name="mtp-seq-lens",
        summary="per-token context lengths [B, L] of native MTP, a view of persistent memory",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        checks=OwnCheck,
        describe=ref.describe,
        statistics=path_statistic,
        # Not guided: its bugs' conditions are thresholds, not distances, and
        # climbing a count of short decodes or padding requests drew the search
        # away from next_n = 2, vLLM's only native-path next_n on this platform,
        # where the upstream #42135 mutants live (docs/strategies.md).
        guided=(),
        # DeepSeek-V3.2's sparse MLA backends (FlashMLA, FlashInfer, AITER: UNIFORM_BATCH;
        # XPU: NEVER) bound the engine's mode: no FULL graphs of mixed steps.
        cg_supports=DEEPSEEK_V32_CG_SUPPORTS,
        varlen_decode=False,  # adaptive verification changes the builder's path
        implementations=(
            Implementation("triton", k.mtp_context_lens, Kind.FIXED, "flat table viewed [B, L]"),
            Implementation("reference", reference_impl, Kind.REFERENCE, "the NumPy reference"),
            Implementation.mutant(
                "pr42135-strided",
                k.mutant_strided,
                "#42135: [max_num_seqs, next_n] table sliced [:B, :L], not contiguous",
                reach=reach_table,
                trigger=trigger_strided,
                smallest=smallest_strided,
            ),
            Implementation.mutant(
                "pr42135-copy",
                k.mutant_copy,
                "#42135 first fix: .contiguous() per step, new storage a graph cannot hold",
                reach=reach_table,
                trigger=trigger_strided,
                smallest=smallest_strided,
            ),
            Implementation.mutant(
                "pr42135-noclamp",
                k.mutant_noclamp,
                "lengths not clamped at 0: padding requests get negative lengths",
                reach=reach_padded,
                trigger=trigger_noclamp,
                smallest=smallest_noclamp,
            ),
        ),
    )
