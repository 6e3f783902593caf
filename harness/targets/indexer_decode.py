"""Target ``indexer-decode``: the sparse indexer's decode path (bug A, #39542)."""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import (
    Mismatch,
    expect_close,
    expect_equal,
    expect_meta,
    expect_topk_rows,
)
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import indexer_decode as ref
from attnfuzz.reference.batch import Case


def compare(
    case: Case,
    inputs: ref.IndexerDecodeInputs,
    expected: ref.IndexerDecodeExpected,
    got: ref.IndexerDecodeOutputs,
) -> list[Mismatch]:
    B, L, M, K = inputs.num_decodes, inputs.max_decode_len, inputs.max_model_len, inputs.topk
    buffer = inputs.topk_indices_buffer
    logits = getattr(got, "logits", got)
    out = expect_meta("logits", logits, (B * L, M), torch.float32)
    out += expect_meta("topk_indices_buffer", buffer, expected.buffer.shape, torch.int32)
    if out:
        return out
    # Every row the decode path does not own must be exactly as it was.
    untouched = ~(expected.checked_rows | expected.free_rows)
    out += expect_equal("topk_indices_buffer", buffer, expected.buffer, untouched, "unchanged")
    rows = np.flatnonzero(expected.checked_rows)
    out += expect_topk_rows(
        "topk_indices_buffer",
        buffer[torch.as_tensor(rows, device=buffer.device)],
        expected.logits[expected.logit_row[rows]],
        expected.context_lens[rows],
        K,
        row_ids=rows.tolist(),
    )
    out += expect_close("logits", logits, expected.logits, rows=expected.logit_rows)
    return out


def reference_impl(inputs: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    expected = ref.reference(None, inputs)
    inputs.topk_indices_buffer.copy_(torch.as_tensor(expected.buffer))
    return ref.IndexerDecodeOutputs(torch.as_tensor(expected.logits).to(inputs.q.device))


def _split(case: Case):
    return ref.describe(case)[1]


def trigger_writeback(case: Case) -> bool:
    """``sum(d) != N_d``: the unpacked rows do not fill ``buffer[:N_d]``."""
    s = _split(case)
    return s.requires_padding and sum(s.decode_lens) != s.num_decode_tokens


def trigger_lengths(case: Case) -> bool:
    """Padded path with requests beyond the scored decodes (so ``R != B``)."""
    meta, s = ref.describe(case)
    return s.requires_padding and meta.num_reqs != s.num_decodes


def trigger_overlap(case: Case) -> bool:
    """``B*L > N_d``: the top-k view runs past the decode rows."""
    s = _split(case)
    return s.requires_padding and s.num_decodes * s.max_decode_len > s.num_decode_tokens


def build() -> Target:
    from attnfuzz.kernels import indexer_decode as k

    target = Target(
        name="indexer-decode",
        summary="sparse-attention indexer decode path: pack, paged MQA logits, top-k, write-back",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
    )
    target.add(Implementation("triton", k.indexer_decode, "fixed", "Triton kernels, fixed path"))
    target.add(Implementation("reference", reference_impl, "reference", "the NumPy reference"))
    target.add(
        Implementation(
            "pr39542-writeback",
            k.mutant_writeback,
            "mutant",
            "#39542: writes buffer[:N_d] with sum(d) unpacked rows",
            trigger_writeback,
        )
    )
    target.add(
        Implementation(
            "pr39542-lengths",
            k.mutant_lengths,
            "mutant",
            "#39542: top-k lengths not sliced to the scored rows",
            trigger_lengths,
        )
    )
    target.add(
        Implementation(
            "pr39542-overlap",
            k.mutant_overlap,
            "mutant",
            "left open by #39542: top-k into the view buffer[:B*L] overlaps later rows",
            trigger_overlap,
        )
    )
    return target
