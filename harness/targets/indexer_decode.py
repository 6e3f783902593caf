"""Target ``indexer-decode``: the sparse indexer's decode path (bug A, #39542)."""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.devices import in_case_dtype
from attnfuzz.harness.oracle import (
    Mismatch,
    expect_close,
    expect_equal,
    expect_meta,
    expect_topk_rows,
)
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import indexer_decode as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.runner import DEEPSEEK_V32_CG_SUPPORTS


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
    # Every row the decode path does not own must be as it was: exactly, but for
    # the step's prefill rows, which hold the prefill branch's top-k, a set per row
    # ("any order", as the decode rows are judged): glue that runs the whole
    # forward recomputes them in its own kernel's order (vLLM's CPU top-512 writes
    # a short row's positions in position order). Same check, one pass, so the
    # first row reported is still the lowest.
    untouched = ~(expected.checked_rows | expected.free_rows)
    prefill = slice(inputs.num_decode_tokens, int(inputs.query_start_loc[-1]))  # decodes first
    got_rows = buffer.detach().cpu().clone()
    got_rows[prefill] = got_rows[prefill].sort(dim=1).values
    want_rows = np.array(expected.buffer, copy=True)
    want_rows[prefill] = np.sort(want_rows[prefill], axis=1)
    out += expect_equal("topk_indices_buffer", got_rows, want_rows, untouched, "unchanged")
    rows = np.flatnonzero(expected.checked_rows)
    out += expect_topk_rows(
        "topk_indices_buffer",
        buffer[torch.as_tensor(rows, device=buffer.device)],
        expected.logits[expected.logit_row[rows]],
        expected.context_lens[rows],
        K,
        row_ids=rows.tolist(),
    )
    # The engine's kernel leaves columns past a row's context uncleaned (vLLM 0.33.0
    # utils/deep_gemm.py:fp8_fp4_paged_mqa_logits): a row is judged on its visible keys.
    visible = torch.arange(M).unsqueeze(0) < torch.as_tensor(expected.row_context_lens)[:, None]
    seen = torch.where(visible, logits.detach().cpu(), float("-inf"))
    out += expect_close("logits", seen, expected.logits, rows=expected.logit_rows)
    return out


def reference_impl(inputs: ref.IndexerDecodeInputs) -> ref.IndexerDecodeOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    expected = ref.reference(None, inputs)
    inputs.topk_indices_buffer.copy_(torch.as_tensor(expected.buffer))
    return ref.IndexerDecodeOutputs(torch.as_tensor(expected.logits).to(inputs.q.device))


def _split(case: Case):
    return ref.describe(case)[1]


# The zoo's metadata of each mutant: ``reach`` (the case runs the code the bug
# lives in), ``trigger`` (the bug's condition holds) and ``smallest`` (the
# smallest trigger, derived by hand on the example engine of docs/domain.md, section 7).


def reach_padding(case: Case) -> bool:
    """Decodes that require padding: the pack / unpack path, where #39542 lived."""
    return _split(case).requires_padding


def reach_decodes(case: Case) -> bool:
    """The step has decodes: their top-k runs (into ``buffer[:B*L]`` in the overlap mutant)."""
    return _split(case).num_decodes > 0


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


def reach_engine_padding(case: Case) -> bool:
    """The engine's native path packs padded decodes: where #39542 lived upstream
    (beyond ``next_n = 2`` vLLM flattens decode tokens and never unpacks)."""
    return ref.native_path(case.config) and reach_padding(case)


def trigger_engine_writeback(case: Case) -> bool:
    """#39542's write-back condition on the engine's native path."""
    return ref.native_path(case.config) and trigger_writeback(case)


# The example engine with next_n = 3 (capture sizes multiples of 3): the smallest
# engine whose decodes may be ragged, since vLLM splits native steps (next_n <= 2)
# with the uniform rule (reference/indexer_decode.py).
SPEC3 = dict(num_spec=2, cudagraph_capture_sizes=(3, 6, 12, 24, 48, 96))


def _spec_case(q_lens: tuple[int, ...], computed: tuple[int, ...], **config: object) -> Case:
    from attnfuzz.harness.testing import spec_config

    return Case(spec_config(**config), Batch(computed, q_lens, seed=0, use_cudagraph=True))


def smallest_writeback() -> Case:
    """docs/domain.md, bug A: next_n = 2, 3 requests x 2 tokens = 6 padded to capture size 8
    (2 and 4 are captured, so fewer requests are not padded): d = [2, 2, 2, 0]."""
    return _spec_case((2, 2, 2), (1, 1, 1))


def smallest_lengths() -> Case:
    """next_n = 3, ragged decodes d = [1, 2] and one prefill of 4 tokens after them:
    ``R = 3`` requests, ``B = 2`` scored. (With next_n = 2 the engine splits uniformly,
    so decodes are never ragged and a padded step has no prefill.)"""
    return _spec_case((1, 2, 4), (1, 1, 0), **SPEC3)


def smallest_overlap() -> Case:
    """next_n = 3, ragged decodes d = [1, 2]: ``B*L = 4 > N_d = 3``, the top-k view
    covers row 3, which the step does not own."""
    return _spec_case((1, 2), (1, 1), **SPEC3)


def build() -> Target:
    from attnfuzz.kernels import indexer_decode as k

    target = Target(
        runs_in="forward",
        name="indexer-decode",
        summary="sparse-attention indexer decode path: pack, paged MQA logits, top-k, write-back",
        make_inputs=in_case_dtype(ref.make_inputs),  # float inputs in the case's dtype
        # q, the key cache and the head weights: small integers, exact in each of
        # these; reduced precision is built on CUDA only (the interpreter computes in fp32).
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        reference=ref.reference,
        compare=compare,
        describe=ref.describe,
        # #39542 lives where decodes are ragged (short decodes: B*L > N_d), padded
        # decode tokens make sum(d) != N_d, and padding requests make R != B.
        guided=("short_decodes", "padded_tokens", "padding_requests"),
        # DeepSeek-V3.2's sparse MLA backends (FlashMLA, FlashInfer, AITER: UNIFORM_BATCH;
        # XPU: NEVER) bound the engine's mode: no FULL graphs of mixed steps.
        cg_supports=DEEPSEEK_V32_CG_SUPPORTS,
        varlen_decode=False,  # adaptive verification changes the builder's path
    )
    target.add(Implementation("triton", k.indexer_decode, "fixed", "Triton kernels, fixed path"))
    target.add(Implementation("reference", reference_impl, "reference", "the NumPy reference"))
    target.add(
        Implementation(
            "pr39542-writeback",
            k.mutant_writeback,
            "mutant",
            "#39542: writes buffer[:N_d] with sum(d) unpacked rows",
            trigger=trigger_writeback,
            reach=reach_padding,
            smallest=smallest_writeback,
        )
    )
    target.add(
        Implementation(
            "pr39542-lengths",
            k.mutant_lengths,
            "mutant",
            "#39542: top-k lengths not sliced to the scored rows",
            trigger=trigger_lengths,
            reach=reach_padding,
            smallest=smallest_lengths,
        )
    )
    target.add(
        Implementation(
            "pr39542-overlap",
            k.mutant_overlap,
            "mutant",
            "left open by #39542: top-k into the view buffer[:B*L] overlaps later rows",
            trigger=trigger_overlap,
            reach=reach_decodes,
            smallest=smallest_overlap,
        )
    )
    return target
