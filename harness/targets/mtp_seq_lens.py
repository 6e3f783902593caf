"""Target ``mtp-seq-lens``: per-token context lengths of native MTP (bug B, #42135)."""

from __future__ import annotations

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
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import mtp_seq_lens as ref
from attnfuzz.reference.batch import Case, build_common_metadata, split_decodes_and_prefills


def expect_consumable(name: str, lens: torch.Tensor, rows: int) -> list[Mismatch]:
    """What the paged MQA logits kernel asserts of its lengths before it runs."""
    from attnfuzz.kernels.indexer_ops import check_lengths

    try:
        check_lengths("paged_mqa_logits", "context_lens", lens, rows)
    except ValueError as err:  # the consumer refuses them: a finding
        return [Mismatch("consumer", name, "lengths the logits kernel accepts", str(err))]
    return []


def compare(
    case: Case, inputs: ref.MtpSeqLensInputs, expected: ref.MtpSeqLensExpected, got
) -> list[Mismatch]:
    B, L = inputs.num_decodes, inputs.max_decode_len
    lens = getattr(got, "context_lens", got)
    out = expect_meta("context_lens", lens, (B, L), torch.int32)
    if out:
        return out
    out += expect_inside("context_lens", lens, inputs.workspace)
    out += expect_contiguous("context_lens", lens)
    out += expect_strides("context_lens", lens, (L, 1))
    out += expect_consumable("context_lens", lens, B * L)
    out += expect_equal("context_lens", lens, expected.context_lens)
    out += expect_untouched_outside("workspace", inputs.workspace, expected.workspace_before, lens)
    return out


def reference_impl(inputs: ref.MtpSeqLensInputs) -> ref.MtpSeqLensOutputs:
    """The reference written into the flat table, as an implementation (a self-check)."""
    expected = ref.reference(None, inputs)
    B, L = expected.context_lens.shape
    out = inputs.workspace[: B * L].view(B, L)
    out.copy_(torch.from_numpy(expected.context_lens))  # in place: no allocation on device
    return ref.MtpSeqLensOutputs(out)


def _split(case: Case):
    meta = build_common_metadata(case.config, case.batch)
    return meta, split_decodes_and_prefills(meta, case.config.threshold)


def trigger_strided(case: Case) -> bool:
    """``B >= 2`` and ``L < next_n``: the ``[:B, :L]`` slice is not contiguous."""
    _, s = _split(case)
    return s.num_decodes >= 2 and 0 < s.max_decode_len < case.config.next_n


def trigger_noclamp(case: Case) -> bool:
    """Some decode has ``seq_len < L - 1`` (padding requests have 0): a negative length."""
    meta, s = _split(case)
    L = s.max_decode_len
    return any(int(meta.seq_lens[b]) - L + 1 < 0 for b in range(s.num_decodes))


def trigger_flat_capacity(case: Case) -> bool:
    _, s = _split(case)
    return s.num_decodes * s.max_decode_len > case.config.max_num_batched_tokens


def build() -> Target:
    from attnfuzz.kernels import mtp_seq_lens as k

    target = Target(
        name="mtp-seq-lens",
        summary="per-token context lengths [B, L] of native MTP, a view of the persistent table",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        graph_safe=True,
    )
    target.add(Implementation("triton", k.mtp_context_lens, "fixed", "flat table viewed [B, L]"))
    target.add(Implementation("reference", reference_impl, "reference", "the NumPy reference"))
    target.add(
        Implementation(
            "pr42135-strided",
            k.mutant_strided,
            "mutant",
            "#42135: [max_num_seqs, next_n] table sliced [:B, :L], not contiguous",
            trigger_strided,
        )
    )
    target.add(
        Implementation(
            "pr42135-copy",
            k.mutant_copy,
            "mutant",
            "#42135 first fix: .contiguous() per step, allocates under graph capture",
            trigger_strided,
        )
    )
    target.add(
        Implementation(
            "pr42135-noclamp",
            k.mutant_noclamp,
            "mutant",
            "lengths not clamped at 0: padding requests get negative lengths",
            trigger_noclamp,
        )
    )
    target.add(
        Implementation(
            "flat-capacity",
            k.mutant_flat_capacity,
            "mutant",
            "flat table of max_num_batched_tokens elements: B*L of ragged decodes overflows it",
            trigger_flat_capacity,
        )
    )
    return target
