"""Target ``spec-indptr``: the extend-attention indices of a speculative step (#27545).

Target verify and draft extend, eager and replayed in a CUDA graph at a padded
request count: ``qo_indptr``, ``kv_indptr``, ``kv_indices`` and the tree mask's
``mask_indptr`` (:mod:`attnfuzz.reference.spec_indptr`). No other target builds
these: ``slot-mapping`` and ``draft-block-tables`` describe vLLM's per-token
slots and block tables, not a CSR list of slots with a query layout.

The oracle compares every index pointer exactly over the requests the kernel
runs (the padding ones of a graph included), and ``kv_indices`` over the
entries the kernel reads, ``kv_indices[:kv_indptr[-1]]``: a replayed graph
hands a buffer sized for its largest capture whose tail no request reads. The
index tensors' integer width is the engine's choice (SGLang holds ``qo_indptr``
as int32 eager and in an int64 buffer replayed; the kernels load either).

Why the tail is never read, from its consumers (SGLang 0.5.23): the extend
kernels (``triton_ops/extend_attention.py``: ``_fwd_kernel``,
``_fwd_kernel_unified``; ``verify_splitkv.py``, ``verify_mla.py``) read
``kv_indices[kv_indptr[i] + j]`` for ``j < kv_indptr[i + 1] - kv_indptr[i]``
over the requests of ``qo_indptr``; FlashInfer's paged prefill bounds its tiles
by ``kv_indptr[bs]`` (a tile may read the next request's entries, masked in the
compute, never past the last). SGLang's graph buffer past ``kv_indptr[bs]``
holds zeros or what earlier replays wrote.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import torch
from attnfuzz.harness.oracle import Check, Mismatch, expect_equal
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.reference import spec_indptr as ref
from attnfuzz.reference.batch import Batch, Case

INDEX_DTYPES = (torch.int32, torch.int64)


class OwnCheck(StrEnum):
    """spec-indptr's own checks, beside the oracle's generic ones."""

    MAX_EXTEND_LEN = "max_extend_len"  # the query rows the kernel's grid is sized for


def _index_meta(name: str, got: object, length: int | None) -> list[Mismatch]:
    """A 1-D integer tensor of ``length`` elements (None: any length, the caller checks it)."""
    if not isinstance(got, torch.Tensor):
        return [Mismatch(Check.TYPE, name, "a torch.Tensor", type(got).__name__)]
    if got.dtype not in INDEX_DTYPES:
        return [Mismatch(Check.DTYPE, name, "torch.int32 or torch.int64", str(got.dtype))]
    if got.dim() != 1 or (length is not None and got.shape[0] != length):
        want = f"[{length}]" if length is not None else "a 1-D tensor"
        return [Mismatch(Check.SHAPE, name, want, str(list(got.shape)))]
    return []


def compare(
    case: Case,
    inputs: ref.SpecIndptrInputs,
    expected: ref.SpecIndptrExpected,
    got: ref.SpecIndptrOutputs,
) -> list[Mismatch]:
    out: list[Mismatch] = []
    pointers = ["qo_indptr", "kv_indptr"]
    if expected.mask_indptr is not None:
        pointers.append("mask_indptr")
    for name in pointers:
        want = getattr(expected, name)
        value = getattr(got, name, None)
        wrong = _index_meta(name, value, len(want))
        out += wrong or expect_equal(name, value.to(torch.int64), want)
    indices = getattr(got, "kv_indices", None)
    wrong = _index_meta("kv_indices", indices, None)
    total = len(expected.kv_indices)
    if not wrong and indices.shape[0] < total:
        wrong = [
            Mismatch(Check.SHAPE, "kv_indices", f"at least [{total}]", str(list(indices.shape)))
        ]
    if not wrong:
        read = np.s_[:total]  # what the kernel reads; a longer buffer's tail is unread
        out += expect_equal(
            "kv_indices", indices[read].to(torch.int64), expected.kv_indices, at=read
        )
    else:
        out += wrong
    max_extend_len = getattr(got, "max_extend_len", None)
    if max_extend_len != expected.max_extend_len:
        out.append(
            Mismatch(
                OwnCheck.MAX_EXTEND_LEN,
                "max_extend_len",
                str(expected.max_extend_len),
                str(max_extend_len),
            )
        )
    return out


def reference_impl(inputs: ref.SpecIndptrInputs) -> ref.SpecIndptrOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    e = ref.reference(None, inputs)
    device = inputs.req_to_token.device

    def dev(x: np.ndarray | None) -> torch.Tensor | None:
        return None if x is None else torch.as_tensor(x).to(device)

    return ref.SpecIndptrOutputs(
        dev(e.qo_indptr), dev(e.kv_indptr), dev(e.kv_indices), dev(e.mask_indptr), e.max_extend_len
    )


def reach_draft_extend_replay(case: Case) -> bool:
    """A draft extend replayed in a CUDA graph (the code #27545 lives in)."""
    return ref.phase_of(case) == ref.DRAFT_EXTEND and ref.graph_bs(case) is not None


def trigger_draft_extend_stride(case: Case) -> bool:
    """``N != num_steps + 1`` (only possible with ``topk > 1``): the replayed query
    stride differs from the runner's layout at the first request's end already.
    (#27545 saw NaN from two requests on: one request's accepted rows come first,
    within the shorter stride.)"""
    spec = ref.spec_config_of(case)
    return reach_draft_extend_replay(case) and spec.num_draft_tokens != spec.num_steps + 1


def smallest_draft_extend_stride() -> Case:
    """topk 2, one step, N = 3 (the tree's root and both candidates): a replayed draft
    extend of one request with one committed token, in the graph of one request
    (next_n 1, so the capture sizes are request counts)."""
    from attnfuzz.harness.testing import spec_config

    config = spec_config(num_spec=0, cudagraph_capture_sizes=(1, 2, 4))
    params = (("spec_draft_tokens", 3), ("spec_phase", 1), ("spec_steps", 1), ("spec_topk", 2))
    return Case(config, Batch((0,), (1,), seed=0), params)


def build() -> Target:
    from attnfuzz.kernels import spec_indptr as k

    return Target(
        name="spec-indptr",
        summary="extend-attention indices of a speculative step (target verify, draft "
        "extend), eager and replayed at a padded request count: qo/kv/mask indptr, kv_indices",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        checks=OwnCheck,
        params=dict(ref.PARAMS),
        # Not guided: the bug's condition is a configuration (topk > 1), not a distance.
        guided=(),
        implementations=(
            Implementation("triton", k.spec_indptr, Kind.FIXED, "one program per request"),
            Implementation("reference", reference_impl, Kind.REFERENCE, "the reference's loops"),
            Implementation.mutant(
                "pr27545-draft-extend-stride",
                k.mutant_draft_extend_stride,
                "#27545: replayed draft extend strides queries num_steps + 1 apart, "
                "the runner lays out num_draft_tokens per request",
                reach=reach_draft_extend_replay,
                trigger=trigger_draft_extend_stride,
                smallest=smallest_draft_extend_stride,
            ),
        ),
    )
