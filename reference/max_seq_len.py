"""Reference of ``max_seq_len`` for the model state and the draft, and of its consumer (bug D).

``max_seq_len`` is the bound of the attention metadata that sizes kernel work:
a paged kernel walks ``cdiv(max_seq_len, block_size)`` block-table entries per
request. The metadata builder does not know the exact sequence lengths on the
host; it has ``seq_lens_cpu_upper_bound``, an int32 host tensor of one row per
request the kernels see (``R_pad``, padding requests included). The engine
builds it afresh each step (vLLM 0.33.0 ``vllm/v1/worker/gpu/model_runner.py``,
``GPUModelRunner.prepare_inputs``: ``np.zeros(num_reqs_padded)``, then
``num_computed_tokens + num_scheduled_tokens`` into the first ``R`` rows): rows
``[:R]`` bound this step's ``seq_len`` (the host counts every draft of the
previous step as accepted, so a bound may exceed the exact ``seq_len`` by up to
``num_spec``, never ``max_model_len``), and the padding rows ``[R:R_pad]`` are 0.
No row holds a stale value of an earlier step (the V1 runner's persistent
``optimistic_seq_lens_cpu`` is zeroed past ``R`` each step as well,
``vllm/v1/worker/gpu_model_runner.py``, ``GPUModelRunner._prepare_inputs``).

The fixed rule (docs/domain.md, bug D, upstream #40654 and #43991):

- model state (vLLM 0.33.0 ``DefaultModelState.prepare_attn`` and
  ``MambaHybridModelState.prepare_attn``): ``max_model_len`` while the step
  captures a graph (a captured graph serves every later replay); otherwise
  ``max(seq_lens_cpu_upper_bound[:num_reqs])``, ``num_reqs`` being ``R_pad`` in a
  full graph and ``R`` otherwise: the same value, since padding rows are 0;
- draft model (the MTP/EAGLE drafter's decode steps, which exist with
  ``num_spec >= 2``; ``TargetDependentARSpeculator.propose`` and
  ``DraftModelSpeculator._build_attn_metadata``): the same at capture (the
  draft's graphs are captured with metadata from the model state's capture
  branch), otherwise ``min(max(seq_lens_cpu_upper_bound[:R]) + num_spec,
  max_model_len)`` (the draft's sequences grow by up to ``num_spec`` tokens
  while it proposes). With one speculative token the drafter runs only its
  prefill, on the model state's metadata, and builds none of its own
  (``propose`` returns when ``num_speculative_tokens <= 1``; ``capture`` records
  no decode graph when ``num_speculative_steps == 1``): no draft bound then.

Invariant: ``max(seq_len[:R]) <= max_seq_len <= max_model_len`` on both paths,
and the bound is tight (exactly the rule above) outside capture.

The consumer stands in for an attention kernel. For each path and each of the
kernel's rows ``r`` (the ``num_reqs`` rows of the step, padding rows included) it
walks the entries ``i < cdiv(max_seq_len, block_size)`` of ``block_table[r]``:

- every walked entry is read (``pages_walked``); an id outside the cache
  ``[0, num_blocks)`` is counted (``oob_pages``) and never dereferenced;
- positions ``p`` of entry ``i`` with ``p < seq_len[r]`` are visible; an entry
  holding a visible position is a page the request needs (``pages_needed``);
- ``out[r] = sum over visible p of (p + 1) * kv[page(p), p % block_size]``: the
  weight makes a page read in the wrong place change the result.

Entries past a request's valid pages hold stale ids: pages of other requests,
*poisoned* pages no request owns (their keys are NaN), or garbage ids at or past
``num_blocks``. Masking by position keeps the poison out of ``out``; an
over-walk still reads stale ids: it shows as more ``pages_walked`` per
``pages_needed`` and, where it meets garbage, as ``oob_pages``.

Keys are small integers stored as fp32, so every sum is exact in fp32 whatever
the order of summation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    EngineConfig,
    build_common_metadata,
    cdiv,
    split_decodes_and_prefills,
)
from attnfuzz.reference.history import FieldHistory

_DATA_SEED_SALT = 0x43991  # keeps the data stream apart from the page-id stream

PATHS = ("model state", "draft")
"""The two metadata paths, in the order of the consumer's first dimension."""


def has_draft(num_spec_steps: int) -> bool:
    """The drafter builds metadata of its own: its decode steps run (``num_spec >= 2``)."""
    return num_spec_steps >= 2


@dataclass
class MaxSeqLenInputs(FieldHistory):
    """What the metadata builders receive for one step, and what their consumer reads.

    ``config``, ``common`` and ``split`` are the step as the engine's functions see
    it (the model state's ``prepare_attn`` gets the step's query lengths,
    ``query_start_loc``, real and padded request counts): an implementation may
    take its bound from any of them, so one that uses the wrong rows (the padded
    ones, the decodes only) can be written and judged.
    """

    removed: ClassVar[dict[str, str]] = {
        "seq_lens_upper_bound": "was renamed to seq_lens_cpu_upper_bound in 0.2.0, with "
        "another meaning: it was a persistent int32 [max_num_seqs] buffer whose rows >= R "
        "were stale; it is now int32 [R_pad], built afresh each step, rows >= R 0 (as vLLM "
        "0.33.0 builds it)",
        "upper_max": "was removed in 0.2.0: it is max(seq_lens_cpu_upper_bound[:num_real_reqs])",
    }

    config: EngineConfig  # the engine's limits: max_model_len, num_spec, capture sizes
    common: CommonMetadata  # the step on the host: query_start_loc, seq_lens, R_pad and R
    split: DecodeSplit  # the ragged decode/prefill split of ``common`` (decodes first)
    seq_lens_cpu_upper_bound: torch.Tensor  # int32 [R_pad] on the host, fresh: rows >= R are 0
    seq_lens: torch.Tensor  # int32 [R_pad] on the device: exact, 0 for padding requests
    block_table: torch.Tensor  # int32 [R_pad, W]; entries past the valid pages stale
    kv_cache: torch.Tensor  # fp32 [num_blocks, block_size, D]; unowned pages NaN
    num_reqs: int  # R_pad: rows the kernels see (padded in a graph)
    num_real_reqs: int  # R: scheduled requests
    capturing: bool  # the step captures a CUDA graph
    num_spec_steps: int  # num_spec; below 2: no draft metadata (see has_draft)
    max_model_len: int


@dataclass
class MaxSeqLenOutputs:
    """What an implementation returns.

    ``max_seq_len`` values may be host integers or 0-d integer tensors.
    ``pages_walked`` against ``pages_needed`` is the over-walk statistic of the
    step: ``pages_walked.sum() / pages_needed.sum()`` is 1 only when every walked
    entry held a visible position.
    """

    max_seq_len: int | torch.Tensor  # model state
    draft_max_seq_len: int | torch.Tensor | None  # None without draft metadata (has_draft)
    out: torch.Tensor  # fp32 [2, R_pad, D]: the consumer per path (zeros without a draft)
    pages_walked: torch.Tensor  # int32 [2, R_pad]: block-table entries read
    pages_needed: torch.Tensor  # int32 [2, R_pad]: walked entries holding a visible position
    oob_pages: torch.Tensor  # int32 [2, R_pad]: walked entries with an id outside the cache


@dataclass
class MaxSeqLenExpected:
    max_seq_len: int
    draft_max_seq_len: int | None
    lower: int  # max(seq_len[:R]): no valid bound is below it
    upper_max: int  # max(seq_lens_cpu_upper_bound[:R]): what "tight" means
    out: np.ndarray  # fp32 [2, R_pad, D]
    pages_walked: np.ndarray  # int32 [2, R_pad]
    pages_needed: np.ndarray  # int32 [2, R_pad]
    oob_pages: np.ndarray  # int32 [2, R_pad]


def describe(case: Case) -> CommonMetadata:
    return build_common_metadata(case.config, case.batch)


def _draw_upper_bounds(
    config: EngineConfig, meta: CommonMetadata, gen: torch.Generator
) -> np.ndarray:
    """The step's fresh host bounds, int32 ``[R_pad]``: rows ``[:R]`` bound ``seq_len``
    by up to ``num_spec`` (never past ``max_model_len``), padding rows are 0."""
    M, R = config.max_model_len, meta.num_real_reqs
    slack = torch.randint(0, config.num_spec + 1, (R,), generator=gen).numpy()
    upper = np.zeros(meta.num_reqs, dtype=np.int32)
    upper[:R] = np.minimum(meta.seq_lens[:R] + slack, M)
    return upper


def upper_bounds(case: Case) -> np.ndarray:
    """``seq_lens_cpu_upper_bound`` of ``case`` (int32 ``[R_pad]``), as ``make_inputs`` has it."""
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)
    return _draw_upper_bounds(case.config, describe(case), gen)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> MaxSeqLenInputs:
    """Build every tensor of ``case`` from its seed (same values on every machine)."""
    config = case.config
    meta = describe(case)
    bs, R = config.block_size, meta.num_real_reqs
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)
    upper = _draw_upper_bounds(config, meta, gen)

    # Stale entries of real rows: half keep their stale in-cache id, half hold
    # garbage past the cache (an id no page has).
    table = meta.block_table.copy()
    width = table.shape[1]
    garbage = torch.randint(
        meta.num_blocks, 2 * meta.num_blocks, (meta.num_reqs, width), generator=gen
    ).numpy()
    use_garbage = torch.randint(0, 2, (meta.num_reqs, width), generator=gen).numpy() == 1
    owned = np.zeros(meta.num_blocks, dtype=bool)
    for r in range(R):
        need = cdiv(int(meta.seq_lens[r]), bs)
        owned[table[r, :need]] = True
        stale = np.arange(width) >= need
        table[r] = np.where(stale & use_garbage[r], garbage[r], table[r])

    kv = torch.randint(-2, 3, (meta.num_blocks, bs, config.head_dim), generator=gen)
    kv = kv.to(torch.float32)
    kv[torch.from_numpy(~owned)] = float("nan")  # pages no request owns are poison

    def dev(x: np.ndarray | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(x).to(device)

    return MaxSeqLenInputs(
        config=config,
        common=meta,
        split=split_decodes_and_prefills(meta, config.threshold),
        seq_lens_cpu_upper_bound=torch.from_numpy(upper),  # on the host, as the engine has it
        seq_lens=dev(meta.seq_lens),
        block_table=dev(table.astype(np.int32)),
        kv_cache=dev(kv),
        num_reqs=meta.num_reqs,
        num_real_reqs=R,
        capturing=bool(case.param("capturing")),
        num_spec_steps=config.num_spec,
        max_model_len=config.max_model_len,
    )


def max_seq_lens(
    upper: np.ndarray, num_real_reqs: int, capturing: bool, num_spec_steps: int, max_model_len: int
) -> tuple[int, int | None]:
    """The fixed rule: ``(model state, draft)``; the draft is None without speculative decoding."""
    if capturing:
        model = draft = max_model_len
    else:
        top = max((int(u) for u in upper[:num_real_reqs]), default=0)
        model = top
        draft = min(top + num_spec_steps, max_model_len)
    return model, (draft if has_draft(num_spec_steps) else None)


def walk(
    kv: np.ndarray, table: np.ndarray, seq_lens: np.ndarray, max_seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The consumer on one path, walking ``cdiv(max_seq_len, block_size)`` entries per row.

    Returns ``out`` fp32 ``[R, D]`` and the int32 ``[R]`` counts ``pages_walked``,
    ``pages_needed`` and ``oob_pages`` (see the module docstring).
    """
    num_blocks, bs, D = kv.shape
    R = table.shape[0]
    out = np.zeros((R, D), dtype=np.float64)
    walked = np.zeros(R, dtype=np.int32)
    needed = np.zeros(R, dtype=np.int32)
    oob = np.zeros(R, dtype=np.int32)
    for r in range(R):
        seq_len = int(seq_lens[r])
        for i in range(cdiv(max_seq_len, bs)):
            page = int(table[r, i])
            walked[r] += 1
            if not 0 <= page < num_blocks:
                oob[r] += 1
                continue
            first, end = i * bs, min((i + 1) * bs, seq_len)  # visible positions [first, end)
            if end <= first:
                continue  # a stale page: its id is read from the table, its keys never
            needed[r] += 1
            weights = np.arange(first, end, dtype=np.float64) + 1
            out[r] += weights @ kv[page, : end - first].astype(np.float64)
    return out.astype(np.float32), walked, needed, oob


def reference(case: Case | None, inputs: MaxSeqLenInputs) -> MaxSeqLenExpected:
    """The expected bounds and the consumer on both paths (everything read off ``inputs``)."""
    upper = inputs.seq_lens_cpu_upper_bound.cpu().numpy()
    seq_lens = inputs.seq_lens.cpu().numpy()
    table = inputs.block_table.cpu().numpy()
    kv = inputs.kv_cache.cpu().numpy()
    R = inputs.num_real_reqs
    model, draft = max_seq_lens(
        upper, R, inputs.capturing, inputs.num_spec_steps, inputs.max_model_len
    )
    # Without a draft model nothing walks on the draft path.
    results = [walk(kv, table, seq_lens, bound) for bound in (model, draft or 0)]
    out, walked, needed, oob = (np.stack(x) for x in zip(*results, strict=True))
    return MaxSeqLenExpected(
        max_seq_len=model,
        draft_max_seq_len=draft,
        lower=max((int(s) for s in seq_lens[:R]), default=0),
        upper_max=max((int(u) for u in upper[:R]), default=0),
        out=out,
        pages_walked=walked,
        pages_needed=needed,
        oob_pages=oob,
    )
