"""The batch model: engine config, one scheduler step, its common attention metadata.

Everything here is plain NumPy and plain loops: it is the specification the
optimized implementations are checked against (see ``docs/domain.md``,
sections 1 to 4). Dtypes follow the engine: int32 for per-request fields and
block tables, int64 for ``slot_mapping``.

Modelling choices, stated once:

- Requests are ordered decodes first (the engine's reorder); a request is a
  decode when ``q_len <= decode_threshold``.
- CUDA-graph padding follows the runner's own decisions
  (:func:`attnfuzz.reference.runner.step_plan`): only a step replayed as a FULL
  graph has padded attention metadata, ``T_pad`` tokens and ``R_pad``
  requests; padding requests have ``q_len = 0`` and ``seq_len = 0``, their
  block-table rows hold ``PAD_PAGE`` and padded tokens map to slot ``-1``.
  Other steps run attention on the real batch; the slot mapping the runner
  computes is still padded with ``-1`` where it pads it (Model Runner V2, and
  backends that update the KV cache outside ``forward``):
  ``CommonMetadata.slot_mapping_tokens``.
- Block tables: every real request owns distinct pages; entries past its valid
  pages hold *stale* page ids (other requests' pages or spare pages), as a
  reused table row does in the engine. Page ids come from the batch's seed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import numpy as np
import torch
from attnfuzz.reference.runner import (
    DEFAULT_CG_SUPPORT,
    DEFAULT_CUDAGRAPH_MODE,
    DEFAULT_RUNNER,
    StepPlan,
    step_plan,
)

PAD_PAGE = 0
"""Block-table value of padding requests' rows."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEFAULT_FLOAT_DTYPE = "float32"
DTYPE_VARIABLE = "ATTNFUZZ_DTYPE"

# The dtype the inputs being built are in, when one is set (:func:`using_float_dtype`:
# ``Target.judge`` sets the target's choice, a case file's replay the recorded one):
# it wins over the environment.
_CASE_DTYPE: ContextVar[str | None] = ContextVar("attnfuzz_case_dtype", default=None)


def environment_dtype() -> str:
    """The name ``ATTNFUZZ_DTYPE`` asks for (``float32`` when unset or empty), unchecked."""
    return os.environ.get(DTYPE_VARIABLE) or DEFAULT_FLOAT_DTYPE


def float_dtype_name() -> str:
    """The name of the float dtype in force: the case's (see :func:`using_float_dtype`),
    else ``ATTNFUZZ_DTYPE``, else ``float32``."""
    return _CASE_DTYPE.get() or environment_dtype()


@contextmanager
def using_float_dtype(name: str | None) -> Iterator[None]:
    """Within the block, float inputs are built in ``name``; None keeps the dtype
    in force (an enclosing block's, else ``ATTNFUZZ_DTYPE``'s).

    Replaying a case file builds its inputs in the dtype it was found in,
    whatever ``ATTNFUZZ_DTYPE`` says; the environment is never modified.
    """
    if name is not None and name not in FLOAT_DTYPES:
        raise ValueError(f"float dtype {name!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    token = _CASE_DTYPE.set(name if name is not None else _CASE_DTYPE.get())
    try:
        yield
    finally:
        _CASE_DTYPE.reset(token)


def float_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype of a case's float inputs: the case's own when it records one (see
    :func:`using_float_dtype`), else ``ATTNFUZZ_DTYPE`` (default ``float32``).

    Targets draw small integers as data, exact in every one of these dtypes,
    so fp16 and bf16 inputs change no expected value. Reduced precision is a
    setting for CUDA runs; the interpreter computes in fp32.
    """
    case = _CASE_DTYPE.get()
    name = case or environment_dtype()
    where = f"the case's dtype {name}" if case else f"{DTYPE_VARIABLE}={name}"
    if name not in FLOAT_DTYPES:
        raise ValueError(f"{DTYPE_VARIABLE}={name!r}: expected one of {', '.join(FLOAT_DTYPES)}")
    if name != DEFAULT_FLOAT_DTYPE and torch.device(device).type != "cuda":
        raise ValueError(f"{where} needs a CUDA device (got {device})")
    return FLOAT_DTYPES[name]


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits and model dimensions; all small printable integers."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    num_spec: int = 0
    decode_threshold: int | None = None  # None: next_n
    cudagraph_capture_sizes: tuple[int, ...] = ()
    topk: int = 4  # K of the sparse indexer
    num_heads: int = 1  # indexer heads H
    head_dim: int = 4  # indexer head dim D
    # How the runner runs steps (attnfuzz.reference.runner): the engine's
    # cudagraph_mode, the attention backend's AttentionCGSupport, the model runner,
    # V2's varlen decode graphs (adaptive verification), and whether a backend
    # updates the KV cache outside forward (V1 then pads the slot mapping too).
    cudagraph_mode: str = DEFAULT_CUDAGRAPH_MODE
    cg_support: str = DEFAULT_CG_SUPPORT
    runner: str = DEFAULT_RUNNER
    varlen_decode: bool = False
    separate_kv_update: bool = False

    @property
    def next_n(self) -> int:
        return 1 + self.num_spec

    @property
    def threshold(self) -> int:
        return self.next_n if self.decode_threshold is None else self.decode_threshold

    @property
    def max_blocks_per_seq(self) -> int:
        """Block-table width W: enough pages for ``max_model_len`` tokens."""
        return cdiv(self.max_model_len, self.block_size)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["cudagraph_capture_sizes"] = list(self.cudagraph_capture_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> EngineConfig:
        d = dict(d)
        d["cudagraph_capture_sizes"] = tuple(d.get("cudagraph_capture_sizes", ()))
        return cls(**d)


def kv_cache_pages(config: EngineConfig) -> int:
    """Pages of the KV cache a runner of ``config`` allocates: the null page 0,
    ``max_blocks_per_seq`` pages for each of ``max_num_seqs`` requests, and a spare one;
    every page the scheduler hands out lies below (a trace's numbers pages from 1,
    freed ones reused first; a step on its own draws among ``sum(pages) + 2``)."""
    return 2 + config.max_num_seqs * config.max_blocks_per_seq


BLOCK_TABLE_TOKEN_ALIGNMENT = 128
"""Tokens a row of the model runner's block table is aligned to."""


def runner_table_width(max_model_len: int, block_size: int) -> int:
    """Columns of the model runner's persistent block table for pages of ``block_size``.

    The engine's contract (vLLM 0.33.0): ``MultiGroupBlockTable.__init__``
    (``vllm/v1/worker/block_table.py``) sizes each KV-cache group's table with
    ``get_block_table_width(n, block_size)``, ``n = cdiv(max_model_len,
    block_size)`` rounded up to a multiple of ``128 // gcd(128, block_size)``
    (whole 128-token spans), and ``AttentionGroup.create_metadata_builders``
    (``vllm/v1/worker/utils.py``) hands builders that width; each step hands
    on all its columns. Columns past ``n`` are never written by a request.
    """
    align = BLOCK_TABLE_TOKEN_ALIGNMENT // math.gcd(BLOCK_TABLE_TOKEN_ALIGNMENT, block_size)
    return cdiv(cdiv(max_model_len, block_size), align) * align


@dataclass(frozen=True)
class Batch:
    """One scheduler step: per request tokens already cached and tokens scheduled.

    ``seed`` builds every tensor of the case (page ids, queries, keys, ...)
    through a ``torch.Generator``; ``use_cudagraph = False`` forces the step
    eager (the runner's ``force_eager``), else the config's ``cudagraph_mode``
    decides (:func:`attnfuzz.reference.runner.step_plan`). ``dp_peer_tokens``
    is the largest token count of another data-parallel rank this step (0:
    one rank), ``dp_peer_uniform`` whether that rank runs a uniform decode.

    A step of a trace (:mod:`attnfuzz.reference.trace`) also says what the
    scheduler knows of its requests across steps: ``req_ids`` (each request's
    id, distinct), ``pages`` (each request's KV pages in order, as the
    scheduler's block table holds them: at least the pages its ``seq_len``
    needs) and ``new_pages`` (how many of them the request gained this step: the
    scheduler output's new block ids; all of them for a request new to the
    engine). Empty: a step on its own, its requests ``0..R-1``, all new, their
    pages drawn from the seed. ``finished``: the requests that finished since the
    step before (the scheduler output's finished request ids; a request left out
    and not finished was preempted, and may come back). ``rejected``: per request,
    how many of its drafts the step rejects (the next step's computed tokens roll
    back by as many); empty: not said (the next step's computed tokens say it).
    ``prompt_lens``: per request, the tokens it prefills before it decodes (its
    prompt; all it had, for a request back from preemption), as the scheduler knows
    them (a chunk of a longer prompt is no prefill's end); empty: not said (a request
    new to the engine prefills up to the end of its query).
    """

    num_computed_tokens: tuple[int, ...]
    q_lens: tuple[int, ...]
    seed: int = 0
    use_cudagraph: bool = True
    dp_peer_tokens: int = 0
    dp_peer_uniform: bool = False
    req_ids: tuple[int, ...] = ()
    pages: tuple[tuple[int, ...], ...] = ()
    new_pages: tuple[int, ...] = ()
    finished: tuple[int, ...] = ()
    rejected: tuple[int, ...] = ()
    prompt_lens: tuple[int, ...] = ()

    @property
    def num_reqs(self) -> int:
        return len(self.q_lens)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(c + q for c, q in zip(self.num_computed_tokens, self.q_lens, strict=True))

    def to_dict(self) -> dict:
        d: dict = {
            "num_computed_tokens": list(self.num_computed_tokens),
            "q_lens": list(self.q_lens),
            "seed": self.seed,
            "use_cudagraph": self.use_cudagraph,
            "dp_peer_tokens": self.dp_peer_tokens,
            "dp_peer_uniform": self.dp_peer_uniform,
        }
        if self.req_ids or self.pages or self.new_pages:  # a trace's step; absent otherwise
            d["req_ids"] = list(self.req_ids)
            d["pages"] = [list(p) for p in self.pages]
            d["new_pages"] = list(self.new_pages)
        if self.finished:
            d["finished"] = list(self.finished)
        if self.rejected:
            d["rejected"] = list(self.rejected)
        if self.prompt_lens:
            d["prompt_lens"] = list(self.prompt_lens)
        return d

    @property
    def request_ids(self) -> tuple[int, ...]:
        """Each request's id: ``req_ids``, or ``0..R-1`` for a step on its own."""
        return self.req_ids or tuple(range(self.num_reqs))

    @classmethod
    def from_dict(cls, d: dict) -> Batch:
        return cls(
            num_computed_tokens=tuple(int(x) for x in d["num_computed_tokens"]),
            q_lens=tuple(int(x) for x in d["q_lens"]),
            seed=int(d.get("seed", 0)),
            use_cudagraph=bool(d.get("use_cudagraph", True)),
            dp_peer_tokens=int(d.get("dp_peer_tokens", 0)),
            dp_peer_uniform=bool(d.get("dp_peer_uniform", False)),
            req_ids=tuple(int(x) for x in d.get("req_ids", ())),
            pages=tuple(tuple(int(x) for x in row) for row in d.get("pages", ())),
            new_pages=tuple(int(x) for x in d.get("new_pages", ())),
            finished=tuple(int(x) for x in d.get("finished", ())),
            rejected=tuple(int(x) for x in d.get("rejected", ())),
            prompt_lens=tuple(int(x) for x in d.get("prompt_lens", ())),
        )


def params_and_dtype_to_dict(params: tuple[tuple[str, int], ...], dtype: str | None) -> dict:
    """A case's (or trace's) target parameters and dtype as written: each only when set."""
    return ({"params": dict(params)} if params else {}) | (
        {"dtype": dtype} if dtype is not None else {}
    )


def params_and_dtype_from_dict(d: dict) -> tuple[tuple[tuple[str, int], ...], str | None]:
    """The parameters (sorted by name) and dtype a case's (or trace's) dict holds, checked."""
    params = d.get("params", {})
    if not isinstance(params, dict):
        raise TypeError(f"params must be an object, got {type(params).__name__}")
    dtype = d.get("dtype")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, got {dtype!r}")
    return tuple(sorted((str(k), v) for k, v in params.items())), dtype


@dataclass(frozen=True)
class Case:
    """What a fuzz example is: an engine config, one batch, and target parameters.

    ``params`` holds the few extra integers a target draws for itself (a
    FlexAttention query block size, a sliding window, ...), sorted by name.
    Everything is JSON-printable.
    """

    config: EngineConfig
    batch: Batch
    params: tuple[tuple[str, int], ...] = ()
    # The float dtype the case was found in (a name of FLOAT_DTYPES), recorded in
    # case files; None: the setting in force (``ATTNFUZZ_DTYPE``), as drawn cases are.
    # A setting of the replay, not part of the example: cases compare without it.
    dtype: str | None = field(default=None, compare=False)

    def param(self, name: str) -> int:
        for key, value in self.params:
            if key == name:
                return value
        raise KeyError(f"case has no parameter {name!r} (has: {[k for k, _ in self.params]})")

    def to_dict(self) -> dict:
        d = {"config": self.config.to_dict(), "batch": self.batch.to_dict()}
        return d | params_and_dtype_to_dict(self.params, self.dtype)

    @classmethod
    def from_dict(cls, d: dict) -> Case:
        return cls(
            EngineConfig.from_dict(d["config"]),
            Batch.from_dict(d["batch"]),
            *params_and_dtype_from_dict(d),
        )


@dataclass
class CommonMetadata:
    """The common attention metadata of one step (docs/domain.md section 3).

    ``num_reqs`` and ``num_actual_tokens`` are the (possibly padded) sizes the
    kernels see; ``num_real_reqs`` and ``num_real_tokens`` the scheduled ones.
    """

    query_start_loc: np.ndarray  # int32 [R+1]
    seq_lens: np.ndarray  # int32 [R]
    block_table: np.ndarray  # int32 [R, W]
    slot_mapping: np.ndarray  # int64 [T]
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    num_real_reqs: int
    num_real_tokens: int
    num_blocks: int  # pages in the KV cache
    padded: bool = False
    mode: str = "NONE"  # the step's runtime CUDA-graph mode (reference.runner.RUNTIME_MODES)
    # Tokens of the slot mapping the runner computes (padded with -1 past the real
    # tokens): T_pad on every graph step of Model Runner V2, and of V1 where a backend
    # updates the KV cache outside forward, even when the attention metadata is not
    # padded; ``slot_mapping`` above is the attention metadata's view.
    slot_mapping_tokens: int = 0

    @property
    def query_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc).astype(np.int32)

    def unpadded(self, num_tokens: int, num_reqs: int) -> CommonMetadata:
        """Per-request fields sliced back to ``num_reqs`` requests and ``num_tokens`` tokens."""
        return dataclasses.replace(
            self,
            query_start_loc=self.query_start_loc[: num_reqs + 1].copy(),
            seq_lens=self.seq_lens[:num_reqs].copy(),
            block_table=self.block_table[:num_reqs].copy(),
            slot_mapping=self.slot_mapping[:num_tokens].copy(),
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=int(np.diff(self.query_start_loc[: num_reqs + 1]).max(initial=0)),
            padded=False,
            slot_mapping_tokens=num_tokens,
        )


def is_uniform_decode(config: EngineConfig, batch: Batch) -> bool:
    """Every request carries exactly ``next_n`` tokens (a full-graph decode step)."""
    return batch.num_reqs > 0 and all(q == config.next_n for q in batch.q_lens)


def plan(config: EngineConfig, batch: Batch) -> StepPlan:
    """How the runner runs ``batch`` (:func:`attnfuzz.reference.runner.step_plan`)."""
    return step_plan(config, batch)


def padded_num_tokens(config: EngineConfig, batch: Batch) -> int | None:
    """``T_pad`` when the step's attention metadata is padded, else None."""
    p = step_plan(config, batch)
    return p.num_tokens_padded if p.padded else None


def build_block_table(config: EngineConfig, batch: Batch) -> tuple[np.ndarray, int]:
    """Block table [R, W] and the number of pages in the cache, from the seed.

    Real requests get distinct random pages (a trace's step: the pages the
    scheduler gave them, ``batch.pages``); entries past a request's valid
    pages hold stale ids drawn from the whole cache (they must never be read).
    """
    bs, width = config.block_size, config.max_blocks_per_seq
    needed = [cdiv(s, bs) for s in batch.seq_lens]
    gen = torch.Generator().manual_seed(batch.seed)
    if batch.pages:
        # Two spare pages past the largest one any request holds.
        num_blocks = max((max(p, default=0) for p in batch.pages), default=0) + 3
        stale = torch.randint(0, num_blocks, (batch.num_reqs, width), generator=gen)
        table = stale.numpy().astype(np.int32)
        for r, row in enumerate(batch.pages):
            n = min(len(row), width)
            table[r, :n] = row[:n]
        return table, num_blocks
    num_blocks = sum(needed) + 2  # two spare pages that no request owns
    pages = torch.randperm(num_blocks, generator=gen).numpy().astype(np.int32)
    stale = torch.randint(0, num_blocks, (batch.num_reqs, width), generator=gen)
    table = stale.numpy().astype(np.int32)
    start = 0
    for r, n in enumerate(needed):
        table[r, :n] = pages[start : start + n]
        start += n
    return table, num_blocks


def build_common_metadata(config: EngineConfig, batch: Batch) -> CommonMetadata:
    """The metadata of ``batch`` as the engine builds it, padded when replayed in a graph."""
    q_lens = np.asarray(batch.q_lens, dtype=np.int64)
    seq_lens = np.asarray(batch.seq_lens, dtype=np.int64)
    num_reqs, num_tokens = batch.num_reqs, int(q_lens.sum())
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    query_start_loc[1:] = np.cumsum(q_lens)
    block_table, num_blocks = build_block_table(config, batch)

    slot_mapping = np.empty(num_tokens, dtype=np.int64)
    bs = config.block_size
    for r in range(num_reqs):
        for j in range(int(q_lens[r])):
            pos = int(seq_lens[r] - q_lens[r]) + j
            slot_mapping[query_start_loc[r] + j] = int(block_table[r, pos // bs]) * bs + pos % bs

    meta = CommonMetadata(
        query_start_loc=query_start_loc,
        seq_lens=seq_lens.astype(np.int32),
        block_table=block_table,
        slot_mapping=slot_mapping,
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=int(q_lens.max(initial=0)),
        max_seq_len=int(seq_lens.max(initial=0)),
        num_real_reqs=num_reqs,
        num_real_tokens=num_tokens,
        num_blocks=num_blocks,
    )
    step = step_plan(config, batch)
    meta.mode = step.mode
    if step.padded:
        meta = pad_for_cudagraph(meta, step.num_tokens_padded, step.num_reqs_padded)
    meta.slot_mapping_tokens = max(step.slot_mapping_tokens, meta.num_actual_tokens)
    return meta


def pad_for_cudagraph(
    meta: CommonMetadata, num_tokens_padded: int, num_reqs_padded: int
) -> CommonMetadata:
    """Pad to a captured size: zero-length padding requests, slot -1 for padded tokens."""
    extra_reqs = num_reqs_padded - meta.num_reqs
    extra_tokens = num_tokens_padded - meta.num_actual_tokens
    assert extra_reqs >= 0 and extra_tokens >= 0
    width = meta.block_table.shape[1]
    return dataclasses.replace(
        meta,
        query_start_loc=np.concatenate(
            [meta.query_start_loc, np.full(extra_reqs, meta.query_start_loc[-1], np.int32)]
        ),
        seq_lens=np.concatenate([meta.seq_lens, np.zeros(extra_reqs, np.int32)]),
        block_table=np.concatenate(
            [meta.block_table, np.full((extra_reqs, width), PAD_PAGE, np.int32)]
        ),
        slot_mapping=np.concatenate([meta.slot_mapping, np.full(extra_tokens, -1, np.int64)]),
        num_reqs=num_reqs_padded,
        num_actual_tokens=num_tokens_padded,
        padded=True,
    )


@dataclass(frozen=True)
class DecodeSplit:
    """How a step divides into decodes (first) and prefills."""

    num_decodes: int
    num_prefills: int
    num_decode_tokens: int
    num_prefill_tokens: int
    decode_lens: tuple[int, ...] = field(default=())  # d[b], b < num_decodes

    @property
    def max_decode_len(self) -> int:
        return max(self.decode_lens, default=0)

    @property
    def requires_padding(self) -> bool:
        return bool(self.decode_lens) and min(self.decode_lens) != max(self.decode_lens)


def split_decodes_and_prefills(
    meta: CommonMetadata, decode_threshold: int, require_uniform: bool = False
) -> DecodeSplit:
    """Split as the engine does.

    Ragged rule: a request is a decode when ``q_len <= decode_threshold``.
    Uniform rule: decodes must share the first request's ``q_len`` (itself
    ``<= decode_threshold``); the first request of another nonzero length
    starts the prefills, and zero-length padding requests of a padded graph
    count as decodes wherever they sit (vLLM 0.33.0,
    ``vllm/v1/attention/backends/utils.py``, ``split_decodes_and_prefills``:
    ``is_prefill = (query_lens != query_lens[0]) & (query_lens != 0)``).
    In both rules a step of decodes only counts *all* ``num_actual_tokens``
    (padded tokens included) as decode tokens, which is how ``N_d`` and
    ``sum(d)`` come to differ.
    """
    q_lens = meta.query_lens
    num_reqs, num_tokens = meta.num_reqs, meta.num_actual_tokens
    if num_reqs == 0:
        return DecodeSplit(0, 0, 0, num_tokens)
    if require_uniform:
        if q_lens[0] > decode_threshold:  # a prefill first: no decodes, whatever the lengths
            num_decodes = 0
        else:
            is_prefill = [q != q_lens[0] and q != 0 for q in q_lens]
            num_decodes = is_prefill.index(True) if any(is_prefill) else num_reqs
    else:
        is_prefill = [q > decode_threshold for q in q_lens]
        num_decodes = is_prefill.index(True) if any(is_prefill) else num_reqs
    if num_decodes == num_reqs:
        num_decode_tokens = num_tokens
    else:
        num_decode_tokens = int(meta.query_start_loc[num_decodes])
    decode_lens = tuple(int(q) for q in q_lens[:num_decodes])
    return DecodeSplit(
        num_decodes=num_decodes,
        num_prefills=num_reqs - num_decodes,
        num_decode_tokens=num_decode_tokens,
        num_prefill_tokens=num_tokens - num_decode_tokens,
        decode_lens=decode_lens,
    )
