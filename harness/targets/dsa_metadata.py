"""Target ``dsa-metadata``: the DeepSeek sparse attention metadata of a step (#19016).

Decode, target verify, draft extend (spec v2) and extend, eager and replayed
in a CUDA graph at a padded request count: per-request KV lengths, per-row
visible keys and their top-k clamp, the page table and its paged form, and the
indexer's key windows (:mod:`attnfuzz.reference.dsa_metadata`). No other target
builds these: ``mtp-seq-lens`` and ``flatten-decode`` are vLLM's indexer
metadata of a decode, not the per-row expansion of every step of DSA.

The oracle compares every length and prefix sum exactly over the rows the
kernels run (a graph's padding requests included) and each page-table row over
the entries read, ``[:kv_len]`` (and its pages): a graph's buffer is as wide as
the table, and what lies past a request's KV is never read (SGLang's fused
kernel leaves it, its torch fallback fills it). A table narrower than a row's
KV is a ``shape`` mismatch. Integer widths are the engine's choice.

Why the rest of a row is never read, from its consumers (SGLang 0.5.23): the
top-k transform (``dsa/dsa_topk_backend.py``, sgl-kernel's ``topk_transform``
kernels) reads ``page_table_1[row, pos]`` for ``pos < seqlens_expanded[row]``,
and ``transform_index_page_table`` only indices chosen within that length; the
indexer's paged logits (``dsa/dsa_indexer.py: _get_topk_paged``, DeepGEMM's
``fp8_paged_mqa_logits``) read ``real_page_table`` up to ``cdiv(context_len, P)``.
Its native path passes ``block_tables[::next_n]``, so a request's first expanded
row is read up to the request's KV, not the row's own visible keys: the bound
compared is the request's ``kv_len`` on every row for that reason.
"""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import Check, Mismatch, expect_equal
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.reference import dsa_metadata as ref
from attnfuzz.reference.batch import Batch, Case

INDEX_DTYPES = (torch.int32, torch.int64)
LENGTHS = (
    "cache_seqlens",
    "cu_seqlens_k",
    "cu_seqlens_q",
    "seqlens_expanded",
    "dsa_cache_seqlens",
    "dsa_cu_seqlens_k",
)
INDEXER = ("indexer_ks", "indexer_ke", "token_to_batch_idx")


def _index_meta(name: str, got: object, ndim: int) -> list[Mismatch]:
    """An integer tensor of ``ndim`` dimensions (the caller checks the sizes)."""
    if not isinstance(got, torch.Tensor):
        return [Mismatch(Check.TYPE, name, "a torch.Tensor", type(got).__name__)]
    if got.dtype not in INDEX_DTYPES:
        return [Mismatch(Check.DTYPE, name, "torch.int32 or torch.int64", str(got.dtype))]
    if got.dim() != ndim:
        return [Mismatch(Check.SHAPE, name, f"a {ndim}-D tensor", str(list(got.shape)))]
    return []


def _compare_table(name: str, got: object, want: np.ndarray, lens: np.ndarray) -> list[Mismatch]:
    """Row ``t`` of ``got`` holds ``want[t, :lens[t]]``; its other entries are never read."""
    wrong = _index_meta(name, got, 2)
    if wrong:
        return wrong
    rows, width = want.shape
    if got.shape[0] != rows or got.shape[1] < width:
        return [Mismatch(Check.SHAPE, name, f"[{rows}, at least {width}]", str(list(got.shape)))]
    read = np.arange(width)[None, :] < lens[:, None]
    seen = got[:, :width].to(torch.int64).cpu().numpy()
    # Entries nobody reads are not compared: they take the expected value here.
    seen = np.where(read, seen, want)
    label = f"{name}[:, :{width}], each row's entries up to its KV length"
    return expect_equal(name, torch.as_tensor(seen), want, label=label)


def compare(
    case: Case,
    inputs: ref.DsaMetadataInputs,
    expected: ref.DsaMetadataExpected,
    got: ref.DsaMetadataOutputs,
) -> list[Mismatch]:
    out: list[Mismatch] = []
    names = LENGTHS + (INDEXER if expected.indexer_ks is not None else ())
    for name in names:
        want = getattr(expected, name)
        value = getattr(got, name, None)
        wrong = _index_meta(name, value, 1)
        if not wrong and value.shape[0] != len(want):
            wrong = [Mismatch(Check.SHAPE, name, f"[{len(want)}]", str(list(value.shape)))]
        out += wrong or expect_equal(name, value.to(torch.int64), want)
    out += _compare_table(
        "page_table_1", getattr(got, "page_table_1", None), expected.page_table_1,
        expected.page_table_lens,
    )  # fmt: skip
    out += _compare_table(
        "real_page_table", getattr(got, "real_page_table", None), expected.real_page_table,
        expected.real_page_table_lens,
    )  # fmt: skip
    return out


def reference_impl(inputs: ref.DsaMetadataInputs) -> ref.DsaMetadataOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    e = ref.reference(None, inputs)
    device = inputs.req_to_token.device

    def dev(x: np.ndarray | None) -> torch.Tensor | None:
        return None if x is None else torch.as_tensor(x).to(device)

    return ref.DsaMetadataOutputs(
        cache_seqlens=dev(e.cache_seqlens),
        cu_seqlens_k=dev(e.cu_seqlens_k),
        cu_seqlens_q=dev(e.cu_seqlens_q),
        seqlens_expanded=dev(e.seqlens_expanded),
        dsa_cache_seqlens=dev(e.dsa_cache_seqlens),
        dsa_cu_seqlens_k=dev(e.dsa_cu_seqlens_k),
        page_table_1=dev(e.page_table_1),
        real_page_table=dev(e.real_page_table),
        indexer_ks=dev(e.indexer_ks),
        indexer_ke=dev(e.indexer_ke),
        token_to_batch_idx=dev(e.token_to_batch_idx),
    )


def reach_speculative_replay(case: Case) -> bool:
    """A target verify or draft extend replayed in a CUDA graph (where #19016 lived)."""
    return ref.phase_of(case) in (ref.TARGET_VERIFY, ref.DRAFT_EXTEND) and (
        ref.graph_bs(case) is not None
    )


def trigger_context_len_table(case: Case) -> bool:
    """A replayed speculative step whose longest KV passes the model's context length:
    a table sized by ``context_len`` lacks its last columns."""
    if not reach_speculative_replay(case):
        return False
    N = case.config.next_n
    extra = N if ref.phase_of(case) == ref.TARGET_VERIFY else 0
    return max(ref.forward_seq_lens(case)) + extra > case.config.max_model_len


def smallest_context_len_table() -> Case:
    """One request at the context limit, verified with one draft token (N = 2): its
    KV is 9 tokens, one past max_model_len = 8; the graph of one request."""
    from attnfuzz.harness.testing import spec_config

    config = spec_config(max_model_len=8, cudagraph_capture_sizes=(2, 4))
    params = (("dsa_index_topk", 1), ("dsa_page_log2", 0), ("dsa_phase", 1))
    return Case(config, Batch((6,), (1,), seed=0), params)


def build() -> Target:
    from attnfuzz.kernels import dsa_metadata as k

    return Target(
        name="dsa-metadata",
        summary="DeepSeek sparse attention metadata (decode, target verify, draft extend, "
        "extend), eager and replayed at a padded request count: KV lengths, per-row "
        "visible keys and top-k lengths, page tables, indexer key windows",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        params=dict(ref.PARAMS),
        # Not guided: the bug's condition (a KV past the context) is drawn near the
        # limit often enough by the strategies' boundary lengths.
        guided=(),
        implementations=(
            Implementation("triton", k.dsa_metadata, Kind.FIXED, "one program per request"),
            Implementation("reference", reference_impl, Kind.REFERENCE, "the reference's loops"),
            Implementation.mutant(
                "pr19016-context-len-table",
                k.mutant_context_len_table,
                "#19016: a graph's page tables are context_len wide, a speculative "
                "step's KV reaches next_n tokens past it",
                reach=reach_speculative_replay,
                trigger=trigger_context_len_table,
                smallest=smallest_context_len_table,
            ),
        ),
    )
