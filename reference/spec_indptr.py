"""Reference of the extend-attention indices of a speculative-decoding step.

An EAGLE-style engine verifies and re-drafts several tokens per request in one
forward; its attention runs the *extend* kernel over a flat layout of query
rows and a flat list of KV-cache slots, described by index pointers:

- ``qo_indptr[r] .. qo_indptr[r+1]``: the query rows of request ``r``;
- ``kv_indptr[r] .. kv_indptr[r+1]``: its entries of ``kv_indices``, the slots
  of the cached tokens it attends to (the request's row of the request-to-token
  table, ``req_to_token[row_r, 0 : kv_len_r]``), read before the step's own
  tokens, which the kernel takes from the forward's K and V;
- ``mask_indptr[r]``: where request ``r``'s block of the tree mask starts
  (target verify only): a block of ``q_len * (kv_len + q_len)`` booleans, one
  per (query row, key) pair, cached keys first.

The speculative configuration: ``topk`` candidates per draft step, ``num_steps``
draft steps, ``N = num_draft_tokens`` tokens of the tree that the target
verifies (``N = num_steps + 1`` when ``topk == 1``: a chain).

Two steps (``spec_phase``):

- **target verify**: every request has ``N`` query rows (its draft tree);
  ``kv_len = seq_len``, the tokens committed before the tree;
- **draft extend** (SGLang's spec v2): the draft model runs again over the
  whole verified window, ``N`` query rows per request, laid out ``N`` apart;
  ``kv_len`` is the committed prefix before the window.

Eager or replayed. The runner replays a CUDA graph captured at request counts
``capture_bs``: a step of ``R`` requests runs in the graph of the smallest
captured ``bs_pad >= R``, and eagerly when there is none or the step is forced
eager. The graph runs ``bs_pad`` requests: the runner pads with requests of
``seq_len = SEQ_LEN_FILL`` on the reserved row 0 of the table (all zeros: the
reserved slot 0). A padding request has ``N`` query rows as every other;
in target verify it reads its ``SEQ_LEN_FILL`` cached token(s); in draft
extend its forward length ``SEQ_LEN_FILL`` less its ``N`` window rows leaves no
prefix (``max(SEQ_LEN_FILL - N, 0) = 0``).

The ``max_extend_len`` the kernel's grid is sized by is the longest request's
query rows, ``N``.

Case mapping: request ``r`` of the batch has ``seq_len_r = batch.seq_lens[r]``
committed tokens; its table row holds distinct slots for positions
``0 .. seq_len_r + N - 1`` (the tree's slots follow the committed ones) and
stale slot ids after them; rows are drawn from ``1 .. max_num_seqs``. The
captured request counts are the config's capture sizes over ``next_n``, up to
``max_num_seqs``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Case, EngineConfig

TARGET_VERIFY = "target_verify"
DRAFT_EXTEND = "draft_extend"
PHASES = (TARGET_VERIFY, DRAFT_EXTEND)

SEQ_LEN_FILL = 1
"""``seq_len`` of a padding request (SGLang's ``get_cuda_graph_seq_len_fill_value``)."""
PAD_ROW = 0
"""The request-pool row of padding requests, all zeros (the reserved slot)."""

PARAMS: dict[str, tuple[int, int]] = {
    "spec_phase": (0, 1),  # 0: target verify, 1: draft extend
    "spec_topk": (1, 4),
    "spec_steps": (1, 4),
    "spec_draft_tokens": (2, 8),  # N when topk > 1, bounded by the tree's size
}

_DATA_SEED_SALT = 0x27545  # keeps the table stream apart from other targets' streams


@dataclass(frozen=True)
class SpecConfig:
    topk: int
    num_steps: int
    num_draft_tokens: int  # N


def spec_config_of(case: Case) -> SpecConfig:
    """The speculative configuration of ``case``: a chain of ``num_steps + 1``
    tokens when ``topk == 1``; else ``spec_draft_tokens``, at most the tree's
    root and its candidates (``topk`` at the first step, ``topk**2`` at each later one)."""
    topk, steps = case.param("spec_topk"), case.param("spec_steps")
    if topk == 1:
        return SpecConfig(1, steps, steps + 1)
    candidates = topk + (steps - 1) * topk * topk
    return SpecConfig(topk, steps, min(case.param("spec_draft_tokens"), candidates + 1))


def phase_of(case: Case) -> str:
    return PHASES[case.param("spec_phase")]


def capture_bs(config: EngineConfig) -> tuple[int, ...]:
    """The request counts the runner captured graphs at: those of the capture sizes
    the request pool holds (SGLang captures no graph of more requests than it runs)."""
    sizes = {size // config.next_n for size in config.cudagraph_capture_sizes}
    return tuple(sorted(bs for bs in sizes if 1 <= bs <= config.max_num_seqs))


def graph_bs(case: Case) -> int | None:
    """The padded request count the step replays at, or None when it runs eagerly."""
    if not case.batch.use_cudagraph:
        return None
    return min((bs for bs in capture_bs(case.config) if bs >= case.batch.num_reqs), default=None)


@dataclass
class SpecIndptrInputs:
    """One step as the attention backend finds it (host integers, device tensors)."""

    phase: str
    spec: SpecConfig
    req_to_token: torch.Tensor  # int32 [max_num_seqs + 1, max_model_len + N]; row 0 zeros
    req_pool_indices: torch.Tensor  # int64 [R]
    seq_lens: torch.Tensor  # int64 [R]: committed tokens, before the step's N
    graph_bs: int | None  # bs_pad of the graph replayed, None: eager
    capture_bs: tuple[int, ...]
    config: EngineConfig

    @property
    def num_reqs(self) -> int:
        return int(self.req_pool_indices.shape[0])


@dataclass
class SpecIndptrOutputs:
    """What the extend kernel reads. ``kv_indices`` may be a longer buffer: the
    kernel reads ``kv_indices[:kv_indptr[-1]]`` only. ``mask_indptr`` is None in
    draft extend (no tree mask)."""

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    mask_indptr: torch.Tensor | None
    max_extend_len: int


@dataclass
class SpecIndptrExpected:
    qo_indptr: np.ndarray  # [rows + 1]
    kv_indptr: np.ndarray  # [rows + 1]
    kv_indices: np.ndarray  # [kv_indptr[-1]]
    mask_indptr: np.ndarray | None  # [rows + 1], target verify only
    max_extend_len: int


def make_inputs(case: Case, device: torch.device | str = "cpu") -> SpecIndptrInputs:
    """The table and the step of ``case``, from its seed."""
    config, batch = case.config, case.batch
    spec = spec_config_of(case)
    N = spec.num_draft_tokens
    seq_lens = np.asarray(batch.seq_lens, dtype=np.int64)
    R = len(seq_lens)
    num_rows = max(config.max_num_seqs, R) + 1
    width = config.max_model_len + N
    gen = torch.Generator().manual_seed(batch.seed ^ _DATA_SEED_SALT)
    rows = (1 + torch.randperm(num_rows - 1, generator=gen)[:R]).numpy().astype(np.int64)
    owned = int((seq_lens + N).sum())
    num_slots = 1 + owned + 2  # the reserved slot 0, the owned slots, two spare
    slots = (1 + torch.randperm(num_slots - 1, generator=gen)).numpy().astype(np.int32)
    table = torch.randint(0, num_slots, (num_rows, width), generator=gen).numpy().astype(np.int32)
    table[PAD_ROW] = 0
    start = 0
    for r in range(R):
        n = int(seq_lens[r]) + N
        table[rows[r], :n] = slots[start : start + n]
        start += n
    return SpecIndptrInputs(
        phase=phase_of(case),
        spec=spec,
        req_to_token=torch.as_tensor(table).to(device),
        req_pool_indices=torch.as_tensor(rows).to(device),
        seq_lens=torch.as_tensor(seq_lens).to(device),
        graph_bs=graph_bs(case),
        capture_bs=capture_bs(config),
        config=config,
    )


def request_lengths(inputs: SpecIndptrInputs) -> tuple[list[int], list[int]]:
    """The request-pool row and the cached tokens read (``kv_len``) of every request
    the kernel runs: the real ones, then the padding ones of a replayed graph."""
    R, N = inputs.num_reqs, inputs.spec.num_draft_tokens
    rows = [int(x) for x in inputs.req_pool_indices.cpu()]
    kv_lens = [int(x) for x in inputs.seq_lens.cpu()]  # both phases: the committed tokens
    num_pad = (inputs.graph_bs or R) - R
    pad_len = SEQ_LEN_FILL if inputs.phase == TARGET_VERIFY else max(SEQ_LEN_FILL - N, 0)
    return rows + [PAD_ROW] * num_pad, kv_lens + [pad_len] * num_pad


def reference(case: Case | None, inputs: SpecIndptrInputs) -> SpecIndptrExpected:
    """The index pointers by the rules of the module docstring, one request at a time."""
    N = inputs.spec.num_draft_tokens
    table = inputs.req_to_token.cpu().numpy()
    rows, kv_lens = request_lengths(inputs)
    qo, kv, mask, indices = [0], [0], [0], []
    for row, kv_len in zip(rows, kv_lens, strict=True):
        qo.append(qo[-1] + N)
        kv.append(kv[-1] + kv_len)
        mask.append(mask[-1] + N * (kv_len + N))
        indices.extend(int(x) for x in table[row, :kv_len])
    return SpecIndptrExpected(
        qo_indptr=np.asarray(qo, dtype=np.int64),
        kv_indptr=np.asarray(kv, dtype=np.int64),
        kv_indices=np.asarray(indices, dtype=np.int64),
        mask_indptr=np.asarray(mask, dtype=np.int64) if inputs.phase == TARGET_VERIFY else None,
        max_extend_len=N,
    )
