"""Target ``mla-block-table``: an MLA paged decode kernel's metadata of a speculative step (#21987).

Target verify and draft extend (spec v2), eager and replayed in a CUDA graph at
a padded request count: each request's KV length ``seq_lens_k``, the query
layout (``cu_seqlens_q``, ``seq_lens_q``, ``max_seq_len_q``) and its pages of
the block table, ``block_kv_indices`` (:mod:`attnfuzz.reference.mla_block_table`):
what FlashMLA and TRT-LLM's MLA decode kernel read. Each request carries an
accept count the metadata must not depend on. No other target builds these:
``dsa-metadata`` is the sparse backend's per-row expansion, ``spec-indptr`` the
extend kernel's CSR list of slots.

The oracle compares every length and prefix sum exactly over the requests the
kernel runs (a graph's padding ones included) and each block-table row over the
pages read, ``[:cdiv(seq_lens_k, P)]``: a graph's buffer is sized at capture and
what lies past a request's pages is never read. A table narrower than a row's
pages is a ``shape`` mismatch. In target verify a kernel that takes the query
dense (``[bs, N]``) may keep no layout (None). Integer widths are the engine's.

Why the rest of a row is never read, from its consumers (SGLang 0.5.23): SGLang
writes each row's ``[:cdiv(len, P)]`` only (``create_flashmla_kv_indices_triton``)
and leaves the rest as the buffer was made (-1, or 1 in FlashMLA's graph buffer)
or as earlier replays left it. FlashMLA's decode kernel
(``flash_mla_with_kvcache``, its ``splitkv_mla`` kernel) reads a row's entries
below ``ceil_div(seqlen_k, 64)``, given ``cache_seqlens`` = ``seq_lens_k`` (it
reads entry 0 of a row of length 0, which no step has: every KV holds at least
the step's N tokens). TRT-LLM's MLA decode (``trtllm_batch_decode_with_kv_cache_mla``,
given ``seq_lens=seq_lens_k``) is a closed kernel: that it reads no further is
inferred from trtllm-gen's published FMHA kernels, which clamp each page load to
``cdiv(seq_len_kv, P) - 1``, not read in its source.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import torch
from attnfuzz.harness.oracle import Check, Mismatch, expect_equal
from attnfuzz.harness.target import Implementation, Kind, Target
from attnfuzz.reference import mla_block_table as ref
from attnfuzz.reference.batch import Batch, Case

INDEX_DTYPES = (torch.int32, torch.int64)
SGLANG_CONTEXT_LEN = 4096
"""A model context TRT-LLM MLA's graph block table fits exactly: SGLang pads its
width to 4096-token multiples (``_calc_padded_blocks``), and real contexts
(4096, 32768, 163840) are such multiples."""

FLASHMLA_CONTEXT_LEN = 4095
"""A model context FlashMLA's graph block table fits with one token to spare: its rows
are ``(context_len + 64) // 64`` pages of 64 (``flashmla_backend.py``
``init_cuda_graph_state``), 4096 tokens here; a context a multiple of 64 has a page to
spare."""


class OwnCheck(StrEnum):
    """mla-block-table's own checks, beside the oracle's generic ones."""

    MAX_SEQ_LEN_Q = "max_seq_len_q"  # the query rows the kernel is launched for


def _index_meta(name: str, got: object, ndim: int) -> list[Mismatch]:
    """An integer tensor of ``ndim`` dimensions (the caller checks the sizes)."""
    if not isinstance(got, torch.Tensor):
        return [Mismatch(Check.TYPE, name, "a torch.Tensor", type(got).__name__)]
    if got.dtype not in INDEX_DTYPES:
        return [Mismatch(Check.DTYPE, name, "torch.int32 or torch.int64", str(got.dtype))]
    if got.dim() != ndim:
        return [Mismatch(Check.SHAPE, name, f"a {ndim}-D tensor", str(list(got.shape)))]
    return []


def _compare_lengths(name: str, got: object, want: np.ndarray) -> list[Mismatch]:
    wrong = _index_meta(name, got, 1)
    if not wrong and got.shape[0] != len(want):
        wrong = [Mismatch(Check.SHAPE, name, f"[{len(want)}]", str(list(got.shape)))]
    return wrong or expect_equal(name, got.to(torch.int64), want)


def _compare_blocks(got: object, want: np.ndarray, lens: np.ndarray) -> list[Mismatch]:
    """Row ``r`` of ``got`` holds ``want[r, :lens[r]]``; its other entries are never read."""
    name = "block_kv_indices"
    wrong = _index_meta(name, got, 2)
    if wrong:
        return wrong
    rows, width = want.shape
    if got.shape[0] != rows or got.shape[1] < width:
        return [Mismatch(Check.SHAPE, name, f"[{rows}, at least {width}]", str(list(got.shape)))]
    read = np.arange(width)[None, :] < lens[:, None]
    seen = got[:, :width].to(torch.int64).cpu().numpy()
    seen = np.where(read, seen, want)  # entries nobody reads take the expected value
    label = f"{name}[:, :{width}], each row's pages up to its KV length"
    return expect_equal(name, torch.as_tensor(seen), want, label=label)


def compare(
    case: Case,
    inputs: ref.MlaBlockTableInputs,
    expected: ref.MlaBlockTableExpected,
    got: ref.MlaBlockTableOutputs,
) -> list[Mismatch]:
    out = _compare_lengths("seq_lens_k", getattr(got, "seq_lens_k", None), expected.seq_lens_k)
    out += _compare_blocks(
        getattr(got, "block_kv_indices", None), expected.block_kv_indices, expected.block_lens
    )
    dense = inputs.phase == ref.TARGET_VERIFY  # the layout may be the kernel's dense one
    for name in ("cu_seqlens_q", "seq_lens_q"):
        value = getattr(got, name, None)
        if value is None and dense:
            continue
        out += _compare_lengths(name, value, getattr(expected, name))
    max_q = getattr(got, "max_seq_len_q", None)
    if not (max_q is None and dense):
        plain = max_q if isinstance(max_q, int) and not isinstance(max_q, bool) else None
        if plain != expected.max_seq_len_q:
            out.append(
                Mismatch(
                    OwnCheck.MAX_SEQ_LEN_Q,
                    "max_seq_len_q",
                    str(expected.max_seq_len_q),
                    repr(max_q),
                )
            )
    return out


def reference_impl(inputs: ref.MlaBlockTableInputs) -> ref.MlaBlockTableOutputs:
    """The reference run as an implementation (a self-check of the harness)."""
    e = ref.reference(None, inputs)
    device = inputs.req_to_token.device
    return ref.MlaBlockTableOutputs(
        seq_lens_k=torch.as_tensor(e.seq_lens_k).to(device),
        block_kv_indices=torch.as_tensor(e.block_kv_indices).to(device),
        cu_seqlens_q=torch.as_tensor(e.cu_seqlens_q).to(device),
        seq_lens_q=torch.as_tensor(e.seq_lens_q).to(device),
        max_seq_len_q=e.max_seq_len_q,
    )


def reach_draft_extend_replay(case: Case) -> bool:
    """A draft extend replayed in a CUDA graph (the replay #21987 lived in)."""
    return ref.phase_of(case) == ref.DRAFT_EXTEND and ref.graph_bs(case) is not None


def trigger_accept_length_layout(case: Case) -> bool:
    """Every replayed draft extend: an accept count is at least 1, so the pre-fix
    KV, ``seq_len - accept``, is short of ``seq_len`` for every request (and the
    padding ones' layout, ``N + 1`` rows, is off too)."""
    return reach_draft_extend_replay(case)


def smallest_accept_length_layout() -> Case:
    """One request with one new token over none cached, draft extended with one row
    (next_n 1, so the capture sizes are request counts) in the graph of one
    request: forward ``seq_len`` 2, accept count 1, so the pre-fix replay reads 1
    key in 2 rows."""
    from attnfuzz.harness.testing import spec_config

    config = spec_config(num_spec=0, max_model_len=8, cudagraph_capture_sizes=(1,))
    params = (("mla_page_log2", 0), ("mla_phase", 1))
    return Case(config, Batch((0,), (1,), seed=0), params)


def smallest_accept_length_layout_trtllm() -> Case:
    """:func:`smallest_accept_length_layout` in pages of 32 tokens, the smallest TRT-LLM
    MLA runs with (SGLang's limits: :mod:`attnfuzz.adapters.sglang.limits`)."""
    case = smallest_accept_length_layout()
    return Case(case.config, case.batch, (("mla_page_log2", 5), ("mla_phase", 1)))


def reach_speculative_replay(case: Case) -> bool:
    """A target verify or draft extend replayed in a CUDA graph."""
    return ref.graph_bs(case) is not None


def trigger_kv_past_context(case: Case) -> bool:
    """A replayed step whose longest KV passes the model's context length: a graph
    block table sized by the context lacks its last pages (exact where the
    table is the context's width, as SGLang's is at :data:`SGLANG_CONTEXT_LEN`)."""
    return reach_speculative_replay(case) and max(ref.kv_lens_of(case)) > case.config.max_model_len


def trigger_kv_past_flashmla_table(case: Case) -> bool:
    """A replayed step whose longest KV passes what FlashMLA's graph block table rows
    reach, ``(context_len + 64) // 64`` pages of 64 tokens."""
    reach = (case.config.max_model_len + 64) // 64 * 64
    return reach_speculative_replay(case) and max(ref.kv_lens_of(case)) > reach


def smallest_kv_past_flashmla_table() -> Case:
    """One request verified with two draft tokens (N = 3) in the graph of one request, at
    the longest prefix SGLang reaches (:mod:`attnfuzz.adapters.sglang.limits`) in a
    context of :data:`FLASHMLA_CONTEXT_LEN`: ``context_len - 4`` committed, plus the S = 3
    tokens the verify before accepted (the accept count of seed 4), which an overlapped
    step adds before its length check. Its KV is 4094 + 3 = 4097 tokens: 65 pages of 64
    in a graph table of 64. N = 2 never crosses: its KV reaches at most 4095 + 0."""
    from attnfuzz.harness.testing import spec_config

    config = spec_config(
        num_spec=2, max_model_len=FLASHMLA_CONTEXT_LEN, cudagraph_capture_sizes=(3,)
    )
    params = (("mla_page_log2", 6), ("mla_phase", 0))
    return Case(config, Batch((FLASHMLA_CONTEXT_LEN - 2,), (1,), seed=4), params)


def smallest_kv_past_context() -> Case:
    """One request verified with two draft tokens (N = 3) in the graph of one request,
    at the longest prefix SGLang reaches (:mod:`attnfuzz.adapters.sglang.limits`):
    ``context_len - 4`` committed, plus the S = 2 tokens the verify before accepted
    (the accept count of seed 2), which an overlapped step adds before its length
    check. Its KV is 4094 + 3 = 4097 tokens, one past a 4096-token context, in pages
    of 32 (TRT-LLM MLA's smallest): 129 pages in a graph table of 128. N = 2 never
    crosses the context: its KV reaches at most ``context_len - 4 + 2 + 2``."""
    from attnfuzz.harness.testing import spec_config

    config = spec_config(num_spec=2, max_model_len=SGLANG_CONTEXT_LEN, cudagraph_capture_sizes=(3,))
    params = (("mla_page_log2", 5), ("mla_phase", 0))
    return Case(config, Batch((SGLANG_CONTEXT_LEN - 3,), (1,), seed=2), params)


def build() -> Target:
    from attnfuzz.kernels import mla_block_table as k

    return Target(
        name="mla-block-table",
        summary="MLA paged decode metadata of a speculative step (target verify, draft "
        "extend), eager and replayed at a padded request count: KV lengths, query layout, "
        "block table; independent of the accept counts",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        checks=OwnCheck,
        params=dict(ref.PARAMS),
        # Not guided: #21987 is met by every replayed draft extend, and a KV past the
        # context is drawn near the limit by the strategies' boundary lengths.
        guided=(),
        implementations=(
            Implementation("triton", k.mla_block_table, Kind.FIXED, "one program per request"),
            Implementation("reference", reference_impl, Kind.REFERENCE, "the reference's loops"),
            Implementation.mutant(
                "pr21987-accept-length-layout",
                k.mutant_accept_length_layout,
                "#21987: a replayed draft extend lays its queries out by the accept counts "
                "(accept + 1 rows, max 1) and reads seq_len - accept keys",
                reach=reach_draft_extend_replay,
                trigger=trigger_accept_length_layout,
                smallest=smallest_accept_length_layout,
            ),
        ),
    )
