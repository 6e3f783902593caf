"""Reference of the metadata an MLA paged decode kernel reads for a speculative step.

FlashMLA and TRT-LLM's MLA decode kernel run a speculative step as a decode of
``N = next_n`` query rows per request over a paged KV cache. They read, per
request ``r`` the step runs:

- ``seq_lens_k[r]``: the KV length the kernel attends over;
- the query layout: ``seq_lens_q[r] = N`` rows, ``cu_seqlens_q`` their prefix
  sums (``0, N, 2N, ...``), and the longest query, ``max_seq_len_q = N``;
- ``block_kv_indices[r, :cdiv(seq_lens_k[r], P)]``: the request's pages, entry
  ``j`` the page of token ``j * P`` of its row of the request-to-token table
  (``req_to_token[row_r, j * P] // P``). The table may be wider (a graph's
  buffer is sized at capture); the kernel reads no page past the KV.

Two steps (``mla_phase``):

- **target verify**: ``seq_len`` committed tokens, then the ``N`` of the draft
  tree: ``seq_lens_k = seq_len + N``;
- **draft extend** (spec v2): the draft model re-runs the whole verified window
  of ``N`` rows, the forward's ``seq_len`` already holding it (the post-write
  length): ``seq_lens_k = seq_len``.

Each request also carries its **accept count** ``accept_lens[r]`` in ``1..N``:
the tokens the verify before accepted, the bonus token included (spec v2's
``num_accept_tokens``). None of the metadata depends on it: spec v2 re-runs the
whole window whatever was accepted. A correct implementation ignores it.

Eager or replayed, as ``reference/dsa_metadata.py``: a step of ``R`` requests
replays the graph of the smallest captured ``bs >= R`` (the config's capture
sizes over ``next_n``, up to ``max_num_seqs``), eagerly when there is none or
the step is forced eager. The runner pads with requests of forward ``seq_len =
SEQ_LEN_FILL`` on the reserved row 0 of the table (slot 0 throughout), whose
accept count is ``N`` (the draft-extend runner's fill), and the metadata
describes them as any other request: a padding request reads ``1 + N`` keys in
target verify and ``1`` in draft extend.

Case mapping (``reference/dsa_metadata.py``'s): request ``r`` has ``computed_r
= batch.num_computed_tokens[r]`` cached tokens and ``q_r = batch.q_lens[r]``
new ones. Target verify: ``seq_len = computed_r + q_r``. Draft extend:
``seq_len = computed_r + q_r + N``. The model's context is ``max_model_len``;
the request-to-token table is ``max_model_len + N`` wide (the engine's pool
over-allocates past the context for speculative tokens), so a KV reaches up to
``N`` tokens past the context. Accept counts come from the batch's seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Case, EngineConfig, cdiv
from attnfuzz.reference.dsa_metadata import (  # the same runners
    PAD_ROW,
    SEQ_LEN_FILL,
    capture_bs,
    paged_table,
)

TARGET_VERIFY = "target_verify"
DRAFT_EXTEND = "draft_extend"
PHASES = (TARGET_VERIFY, DRAFT_EXTEND)

PARAMS: dict[str, tuple[int, int]] = {
    "mla_phase": (0, 1),  # target verify, draft extend
    "mla_page_log2": (0, 6),  # page_size 1 to 64 (TRT-LLM MLA runs 32 and 64)
}

_DATA_SEED_SALT = 0x21987  # keeps the table stream apart from other targets' streams
_ACCEPT_SEED_SALT = 0x21988  # the accept counts' own stream


def phase_of(case: Case) -> str:
    return PHASES[case.param("mla_phase")]


def page_size_of(case: Case) -> int:
    return 1 << case.param("mla_page_log2")


def graph_bs(case: Case) -> int | None:
    """The padded request count the step replays at, or None when it runs eagerly."""
    if not case.batch.use_cudagraph:
        return None
    return min((bs for bs in capture_bs(case.config) if bs >= case.batch.num_reqs), default=None)


def forward_seq_lens(case: Case) -> list[int]:
    """Each request's ``seq_len`` as the forward batch holds it (module docstring)."""
    N, batch = case.config.next_n, case.batch
    extra = N if phase_of(case) == DRAFT_EXTEND else 0
    pairs = zip(batch.num_computed_tokens, batch.q_lens, strict=True)
    return [computed + q + extra for computed, q in pairs]


def kv_lens_of(case: Case) -> list[int]:
    """Each real request's KV length (``seq_lens_k``)."""
    extra = case.config.next_n if phase_of(case) == TARGET_VERIFY else 0
    return [s + extra for s in forward_seq_lens(case)]


def accept_counts(case: Case) -> list[int]:
    """Each request's accept count, ``1..N``, drawn from the batch's seed."""
    gen = torch.Generator().manual_seed(case.batch.seed ^ _ACCEPT_SEED_SALT)
    N = case.config.next_n
    return [int(a) + 1 for a in torch.randint(0, N, (case.batch.num_reqs,), generator=gen)]


@dataclass
class MlaBlockTableInputs:
    """One step as the MLA backend finds it (host integers, device tensors)."""

    phase: str
    next_n: int  # N: query rows per request
    page_size: int
    req_to_token: torch.Tensor  # int32 [max_num_seqs + 1, max_model_len + N]; row 0 zeros
    req_pool_indices: torch.Tensor  # int64 [R]
    seq_lens: torch.Tensor  # int64 [R]: the forward's seq_len (module docstring)
    accept_lens: torch.Tensor  # int32 [R]: accept counts, 1..N; the metadata ignores them
    graph_bs: int | None  # bs of the graph replayed, None: eager
    capture_bs: tuple[int, ...]
    context_len: int  # the model's context (max_model_len); the table is N wider
    config: EngineConfig

    @property
    def num_reqs(self) -> int:
        return int(self.req_pool_indices.shape[0])


@dataclass
class MlaBlockTableOutputs:
    """What the kernel reads. ``block_kv_indices`` may be wider than the longest
    KV's pages (a graph's buffer). The query layout may be None in target
    verify only, where a kernel that takes the query dense (``[bs, N]``, as
    TRT-LLM MLA does) keeps no layout: the dense one is the reference's."""

    seq_lens_k: torch.Tensor
    block_kv_indices: torch.Tensor
    cu_seqlens_q: torch.Tensor | None
    seq_lens_q: torch.Tensor | None
    max_seq_len_q: int | None


@dataclass
class MlaBlockTableExpected:
    seq_lens_k: np.ndarray  # [requests run]
    cu_seqlens_q: np.ndarray  # [requests run + 1]
    seq_lens_q: np.ndarray  # [requests run]
    max_seq_len_q: int
    block_kv_indices: np.ndarray  # [requests run, most pages]; past a row's pages: 0
    block_lens: np.ndarray  # [requests run]: the pages of each row that are read


def make_inputs(case: Case, device: torch.device | str = "cpu") -> MlaBlockTableInputs:
    """The table, the step and the accept counts of ``case``, from its seed."""
    config, batch = case.config, case.batch
    N, page, R = config.next_n, page_size_of(case), batch.num_reqs
    seq_lens, kv_lens = forward_seq_lens(case), kv_lens_of(case)
    num_rows = max(config.max_num_seqs, R) + 1
    width = config.max_model_len + N
    gen = torch.Generator().manual_seed(batch.seed ^ _DATA_SEED_SALT)
    rows = (1 + torch.randperm(num_rows - 1, generator=gen)[:R]).numpy().astype(np.int64)
    table = paged_table(gen, (num_rows, width), page, rows, kv_lens)
    return MlaBlockTableInputs(
        phase=phase_of(case),
        next_n=N,
        page_size=page,
        req_to_token=torch.as_tensor(table).to(device),
        req_pool_indices=torch.as_tensor(rows).to(device),
        seq_lens=torch.as_tensor(np.asarray(seq_lens, dtype=np.int64)).to(device),
        accept_lens=torch.tensor(accept_counts(case), dtype=torch.int32).to(device),
        graph_bs=graph_bs(case),
        capture_bs=capture_bs(config),
        context_len=config.max_model_len,
        config=config,
    )


def requests_run(inputs: MlaBlockTableInputs) -> tuple[list[int], list[int]]:
    """The table row and KV length of every request the kernel runs: the real
    ones, then a replayed graph's padding ones."""
    N, R = inputs.next_n, inputs.num_reqs
    rows = [int(x) for x in inputs.req_pool_indices.cpu()]
    seq_lens = [int(x) for x in inputs.seq_lens.cpu()]
    num_pad = (inputs.graph_bs or R) - R
    rows += [PAD_ROW] * num_pad
    seq_lens += [SEQ_LEN_FILL] * num_pad
    extra = N if inputs.phase == TARGET_VERIFY else 0
    return rows, [s + extra for s in seq_lens]


def reference(case: Case | None, inputs: MlaBlockTableInputs) -> MlaBlockTableExpected:
    """The metadata by the rules of the module docstring, one request at a time.
    ``inputs.accept_lens`` is not read: nothing here depends on it."""
    table = inputs.req_to_token.cpu().numpy()
    N, page = inputs.next_n, inputs.page_size
    rows, kv_lens = requests_run(inputs)
    block_lens = np.asarray([cdiv(kv, page) for kv in kv_lens], dtype=np.int64)
    blocks = np.zeros((len(rows), int(block_lens.max(initial=0))), dtype=np.int64)
    for r, (row, kv) in enumerate(zip(rows, kv_lens, strict=True)):
        blocks[r, : block_lens[r]] = table[row, 0:kv:page] // page
    bs = len(rows)
    return MlaBlockTableExpected(
        seq_lens_k=np.asarray(kv_lens, dtype=np.int64),
        cu_seqlens_q=np.arange(0, bs * N + 1, N, dtype=np.int64),
        seq_lens_q=np.full(bs, N, dtype=np.int64),
        max_seq_len_q=N,
        block_kv_indices=blocks,
        block_lens=block_lens,
    )
