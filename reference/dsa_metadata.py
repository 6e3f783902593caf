"""Reference of the DeepSeek sparse attention (DSA) metadata of a step.

DSA attends, for every query row, to the ``index_topk`` keys its indexer picks
out of the keys visible to that row. A DSA backend therefore describes a step
per *query row* as well as per request:

- ``cache_seqlens[r]``: request ``r``'s KV length ``kv_len_r``, the cached
  tokens and the step's own; ``cu_seqlens_k`` its prefix sums (leading 0);
- ``seqlens_expanded[i]``: the keys visible to query row ``i``, causally: row
  ``j`` of a request with ``q_len`` rows sees ``kv_len - q_len + 1 + j`` keys,
  and never fewer than 0 (a padding request's rows can have ``kv_len < q_len``;
  consumers read these lengths as unsigned, so a negative one is ~4e9 keys);
- ``dsa_cache_seqlens[i] = min(seqlens_expanded[i], index_topk)``: the keys the
  sparse attention reads for row ``i``; ``dsa_cu_seqlens_k`` its prefix sums;
- ``cu_seqlens_q``: the query layout the attention runs: one row per sequence
  (``0, 1, 2, ...``) in decode, target verify and draft extend, where every row
  is its own sparse sequence; the requests' query lengths in an extend;
- ``page_table_1``: per query row (decode, verify, draft extend) or per request
  (extend), the request's row of the request-to-token table, as far as its KV
  reaches (``[:kv_len]``): attention and the indexer read no further;
- ``real_page_table``: the same rows in pages of ``page_size`` tokens, entry
  ``j`` the page of token ``j * page_size`` (``slot // page_size``), for the
  ``ceil(kv_len / page_size)`` pages the request's KV spans;
- extend only, the indexer's key window of each query token:
  ``indexer_ks = sum of kv_len of the requests before``, ``indexer_ke =
  indexer_ks + seqlens_expanded``, and ``token_to_batch_idx``, its request.

Four steps (``dsa_phase``), ``N = next_n`` speculative tokens per request:

- **decode**: one row per request, ``kv_len = seq_len`` (the new token's included);
- **target verify**: ``N`` rows per request, ``kv_len = seq_len + N``
  (the committed tokens and the draft tree);
- **draft extend** (spec v2): ``N`` rows per request over the verified window,
  the forward's ``seq_len`` already holding them: ``kv_len = seq_len``;
- **extend** (prefill, eager only): ``q_len`` rows over a cached prefix.

Eager or replayed. Decode, target verify and draft extend replay a CUDA graph
captured at request counts ``capture_bs`` (the config's capture sizes over
``next_n``, up to ``max_num_seqs``): a step of ``R`` requests runs in the graph
of the smallest captured ``bs >= R``, eagerly when there is none or the step is
forced eager. The graph runs ``bs`` requests: the runner pads with requests of
forward ``seq_len = SEQ_LEN_FILL`` on the reserved row 0 of the table (slot 0
throughout), which the metadata describes as any other request.

Case mapping: request ``r`` has ``computed_r = batch.num_computed_tokens[r]``
cached tokens and ``q_r = batch.q_lens[r]`` new ones. Decode: ``seq_len =
computed_r + 1``. Target verify: ``seq_len = computed_r + q_r`` committed,
before the tree. Draft extend: ``seq_len = computed_r + q_r + N``. Extend:
``q_len = q_r`` over ``computed_r``. The table is ``max_model_len + N`` wide
(the engine's request-to-token pool over-allocates past the model's context
for speculative tokens); a request owns distinct pages for its KV, and stale
slot ids lie past it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Case, EngineConfig, cdiv

DECODE = "decode"
TARGET_VERIFY = "target_verify"
DRAFT_EXTEND = "draft_extend"
EXTEND = "extend"
PHASES = (DECODE, TARGET_VERIFY, DRAFT_EXTEND, EXTEND)
GRAPH_PHASES = (DECODE, TARGET_VERIFY, DRAFT_EXTEND)

SEQ_LEN_FILL = 1
"""Forward ``seq_len`` of a padding request (SGLang's ``get_cuda_graph_seq_len_fill_value``)."""
PAD_ROW = 0
"""The request-pool row of padding requests, all zeros (the reserved slot)."""

PARAMS: dict[str, tuple[int, int]] = {
    "dsa_phase": (0, 3),  # decode, target verify, draft extend, extend
    "dsa_index_topk": (1, 8),  # the indexer's top-k: small, so that it clamps
    "dsa_page_log2": (0, 2),  # page_size 1, 2 or 4 (DeepSeek's 64, scaled down)
}

_DATA_SEED_SALT = 0x19016  # keeps the table stream apart from other targets' streams


def phase_of(case: Case) -> str:
    return PHASES[case.param("dsa_phase")]


def page_size_of(case: Case) -> int:
    return 1 << case.param("dsa_page_log2")


def capture_bs(config: EngineConfig) -> tuple[int, ...]:
    """The request counts the runner captured graphs at (those the request pool holds)."""
    sizes = {size // config.next_n for size in config.cudagraph_capture_sizes}
    return tuple(sorted(bs for bs in sizes if 1 <= bs <= config.max_num_seqs))


def graph_bs(case: Case) -> int | None:
    """The padded request count the step replays at, or None when it runs eagerly."""
    if not case.batch.use_cudagraph or phase_of(case) not in GRAPH_PHASES:
        return None
    return min((bs for bs in capture_bs(case.config) if bs >= case.batch.num_reqs), default=None)


def forward_seq_lens(case: Case) -> list[int]:
    """Each request's ``seq_len`` as the forward batch holds it (module docstring)."""
    phase, N, batch = phase_of(case), case.config.next_n, case.batch
    pairs = zip(batch.num_computed_tokens, batch.q_lens, strict=True)
    if phase == DECODE:
        return [computed + 1 for computed, _ in pairs]
    if phase == DRAFT_EXTEND:
        return [computed + q + N for computed, q in pairs]
    return [computed + q for computed, q in pairs]


@dataclass
class DsaMetadataInputs:
    """One step as the DSA backend finds it (host integers, device tensors)."""

    phase: str
    next_n: int  # N: query rows per request in target verify and draft extend
    index_topk: int
    page_size: int
    req_to_token: torch.Tensor  # int32 [max_num_seqs + 1, max_model_len + N]; row 0 zeros
    req_pool_indices: torch.Tensor  # int64 [R]
    seq_lens: torch.Tensor  # int64 [R]: the forward's seq_len (module docstring)
    extend_seq_lens: torch.Tensor  # int64 [R]: query rows of each request
    graph_bs: int | None  # bs of the graph replayed, None: eager
    capture_bs: tuple[int, ...]
    context_len: int  # the model's context (max_model_len); the table is wider
    config: EngineConfig

    @property
    def num_reqs(self) -> int:
        return int(self.req_pool_indices.shape[0])


@dataclass
class DsaMetadataOutputs:
    """What the sparse attention and the indexer read. The page tables may be
    wider than the longest KV (a graph's buffer is as wide as the table); the
    extend-only fields are None in the other steps."""

    cache_seqlens: torch.Tensor
    cu_seqlens_k: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seqlens_expanded: torch.Tensor
    dsa_cache_seqlens: torch.Tensor
    dsa_cu_seqlens_k: torch.Tensor
    page_table_1: torch.Tensor
    real_page_table: torch.Tensor
    indexer_ks: torch.Tensor | None = None
    indexer_ke: torch.Tensor | None = None
    token_to_batch_idx: torch.Tensor | None = None


@dataclass
class DsaMetadataExpected:
    cache_seqlens: np.ndarray  # [requests run]
    cu_seqlens_k: np.ndarray  # [requests run + 1]
    cu_seqlens_q: np.ndarray
    seqlens_expanded: np.ndarray  # [query rows]
    dsa_cache_seqlens: np.ndarray  # [query rows]
    dsa_cu_seqlens_k: np.ndarray  # [query rows + 1]
    page_table_1: np.ndarray  # [table rows, longest kv_len]; entries past a row's kv_len: 0
    page_table_lens: np.ndarray  # [table rows]: the entries of each row that are read
    real_page_table: np.ndarray  # [table rows, most pages]
    real_page_table_lens: np.ndarray  # [table rows]: the pages of each row that are read
    indexer_ks: np.ndarray | None
    indexer_ke: np.ndarray | None
    token_to_batch_idx: np.ndarray | None


def paged_table(
    gen: torch.Generator, shape: tuple[int, int], page: int, rows: np.ndarray, kv_lens: list[int]
) -> np.ndarray:
    """A request-to-token table of ``shape``: request ``r`` owns distinct pages for its
    ``kv_lens[r]`` tokens on row ``rows[r]`` (token ``j`` at ``page_id * page + j % page``),
    stale slot ids lie past them, and the reserved row 0 is all zeros."""
    owned = sum(cdiv(kv, page) for kv in kv_lens)
    num_pages = 1 + owned + 2  # the reserved page 0, the owned pages, two spare
    pages = (1 + torch.randperm(num_pages - 1, generator=gen)).numpy().astype(np.int64)
    table = torch.randint(0, num_pages * page, shape, generator=gen).numpy().astype(np.int32)
    table[PAD_ROW] = 0
    start = 0
    for row, kv_len in zip(rows, kv_lens, strict=True):
        positions = np.arange(kv_len)
        table[row, :kv_len] = pages[start + positions // page] * page + positions % page
        start += cdiv(kv_len, page)
    return table


def make_inputs(case: Case, device: torch.device | str = "cpu") -> DsaMetadataInputs:
    """The table and the step of ``case``, from its seed."""
    config, batch = case.config, case.batch
    phase, N, page = phase_of(case), config.next_n, page_size_of(case)
    seq_lens = forward_seq_lens(case)
    q_lens = {DECODE: [1] * batch.num_reqs, EXTEND: list(batch.q_lens)}.get(
        phase, [N] * batch.num_reqs
    )
    kv_lens = [s + N if phase == TARGET_VERIFY else s for s in seq_lens]
    R = batch.num_reqs
    num_rows = max(config.max_num_seqs, R) + 1
    width = config.max_model_len + N
    gen = torch.Generator().manual_seed(batch.seed ^ _DATA_SEED_SALT)
    rows = (1 + torch.randperm(num_rows - 1, generator=gen)[:R]).numpy().astype(np.int64)
    table = paged_table(gen, (num_rows, width), page, rows, kv_lens)
    return DsaMetadataInputs(
        phase=phase,
        next_n=N,
        index_topk=case.param("dsa_index_topk"),
        page_size=page,
        req_to_token=torch.as_tensor(table).to(device),
        req_pool_indices=torch.as_tensor(rows).to(device),
        seq_lens=torch.as_tensor(np.asarray(seq_lens, dtype=np.int64)).to(device),
        extend_seq_lens=torch.as_tensor(np.asarray(q_lens, dtype=np.int64)).to(device),
        graph_bs=graph_bs(case),
        capture_bs=capture_bs(config),
        context_len=config.max_model_len,
        config=config,
    )


def requests_run(inputs: DsaMetadataInputs) -> tuple[list[int], list[int], list[int]]:
    """The table row, KV length and query rows of every request the kernels run:
    the real ones, then a replayed graph's padding ones."""
    N, R = inputs.next_n, inputs.num_reqs
    rows = [int(x) for x in inputs.req_pool_indices.cpu()]
    seq_lens = [int(x) for x in inputs.seq_lens.cpu()]
    q_lens = [int(x) for x in inputs.extend_seq_lens.cpu()]
    num_pad = (inputs.graph_bs or R) - R
    rows += [PAD_ROW] * num_pad
    seq_lens += [SEQ_LEN_FILL] * num_pad
    q_lens += [1 if inputs.phase == DECODE else N] * num_pad  # rows as every request
    extra = N if inputs.phase == TARGET_VERIFY else 0
    return rows, [s + extra for s in seq_lens], q_lens


def _prefix_sums(values: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(values, dtype=np.int64)]).astype(np.int64)


def reference(case: Case | None, inputs: DsaMetadataInputs) -> DsaMetadataExpected:
    """The metadata by the rules of the module docstring, one request at a time."""
    table = inputs.req_to_token.cpu().numpy()
    page, extend = inputs.page_size, inputs.phase == EXTEND
    rows, kv_lens, q_lens = requests_run(inputs)
    expanded: list[int] = []
    table_rows: list[tuple[int, int]] = []  # (request-pool row, kv_len) of each table row
    ks: list[int] = []
    owner: list[int] = []
    for r, (row, kv_len, q_len) in enumerate(zip(rows, kv_lens, q_lens, strict=True)):
        visible = [max(kv_len - q_len + 1 + j, 0) for j in range(q_len)]
        expanded += visible
        table_rows += [(row, kv_len)] * (1 if extend else q_len)
        ks += [sum(kv_lens[:r])] * q_len
        owner += [r] * q_len
    lens = np.asarray([kv for _, kv in table_rows], dtype=np.int64)
    page_lens = np.asarray([cdiv(kv, page) for kv in lens], dtype=np.int64)
    page_table = np.zeros((len(table_rows), int(lens.max(initial=0))), dtype=np.int64)
    real = np.zeros((len(table_rows), int(page_lens.max(initial=0))), dtype=np.int64)
    for t, (row, kv_len) in enumerate(table_rows):
        page_table[t, :kv_len] = table[row, :kv_len]
        real[t, : page_lens[t]] = table[row, 0:kv_len:page] // page
    dsa = [min(e, inputs.index_topk) for e in expanded]
    layout = q_lens if extend else [1] * len(expanded)
    return DsaMetadataExpected(
        cache_seqlens=np.asarray(kv_lens, dtype=np.int64),
        cu_seqlens_k=_prefix_sums(kv_lens),
        cu_seqlens_q=_prefix_sums(layout),
        seqlens_expanded=np.asarray(expanded, dtype=np.int64),
        dsa_cache_seqlens=np.asarray(dsa, dtype=np.int64),
        dsa_cu_seqlens_k=_prefix_sums(dsa),
        page_table_1=page_table,
        page_table_lens=lens,
        real_page_table=real,
        real_page_table_lens=page_lens,
        indexer_ks=np.asarray(ks, dtype=np.int64) if extend else None,
        indexer_ke=np.asarray(ks, dtype=np.int64) + np.asarray(expanded, dtype=np.int64)
        if extend
        else None,
        token_to_batch_idx=np.asarray(owner, dtype=np.int64) if extend else None,
    )
