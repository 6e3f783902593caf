"""Reference of a decode CUDA-graph runner's input padding: what the graph's persistent
input buffers hold after a replayed step fills them.

A runner that replays decode (or speculative verify) steps in captured graphs
keeps one persistent buffer per input of the graph, allocated once at
start-up for the largest captured batch ``max_bs``. A step of ``raw_bs``
requests of ``w`` tokens each (``w = 1`` for a decode, ``next_n`` for a
verify) replays the graph of the smallest captured batch size ``bs >= raw_bs``;
the runner copies the step's own tensors into the buffers' heads and writes
the rows ``raw_bs .. bs`` (tokens ``raw_bs * w .. bs * w``) so that the graph
computes a harmless dummy request there. The graph reads each buffer's first
``bs`` rows (``bs * w`` tokens); the buffers hold whatever an earlier, larger
step left, so every row the graph reads must be written by this step.

The contract (SGLang's ``model_executor/cuda_graph_buffer_registry.py``,
``build_decode_registry``, the policies of each slot; ``DecodeInputBuffers``
of ``model_executor/runner_utils/buffers.py`` holds the storage), per field,
for the rows the graph reads:

- ``req_pool_indices`` (per request): the step's, then 0 (pool row 0);
- ``seq_lens`` and its host mirror ``seq_lens_cpu`` (per request): the step's,
  then the runner's fill value (the attention backend's
  ``get_cuda_graph_seq_len_fill_value()``, 1 for most);
- ``out_cache_loc`` (per token): the step's KV-cache slots, then slot 0, the
  padding slot the allocator never hands out: a padded token's keys and values
  land there and nowhere a request owns;
- ``out_cache_loc_swa`` (per token, models with a hybrid sliding-window pool):
  the step's slots in the sliding-window pool, then 0, that pool's padding
  slot (#24743: left stale, padded tokens wrote live sliding-window slots);
- ``positions`` (per token): the step's, then 0 (backends plan over the padded
  positions; stale out-of-range ones made illegal accesses);
- ``input_ids`` (per token): the step's; the padded tokens' ids are not part of
  the contract (the runner leaves them as they were: a padded token's output is
  never read, and a stale id is an id of an earlier step, inside the vocabulary).

Padding slot 0 is SGLang's convention (vLLM writes -1 and skips it:
:mod:`attnfuzz.reference.slot_mapping`). Rows past ``bs`` are not read by the
graph and not part of the contract either.

The replay-side view the attention backend plans from (SGLang's
``build_replay_fb_view``) carries three integers: ``batch_size = bs``,
``num_padding = bs - raw_bs`` and ``seq_lens_sum``, the step's sum plus
``(bs - raw_bs) * fill``: the sum over the padded ``seq_lens``.

Inputs from a case: the step's requests are the case's requests (``raw_bs``
of them), each of ``w = next_n`` tokens; ``seq_lens`` are the case's lengths;
the captured batch sizes are the case's capture sizes divided by ``w``, with
``max_num_seqs`` as the largest. Every stale value is one a reset would change
(never the padding value), so a row left stale shows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Case

_DATA_SEED_SALT = 0x24743
VOCAB = 1000
"""Token ids of the step are drawn below this."""

REQUEST_FIELDS = ("req_pool_indices", "seq_lens", "seq_lens_cpu")
TOKEN_FIELDS = ("input_ids", "positions", "out_cache_loc", "out_cache_loc_swa")
HOST_FIELDS = ("seq_lens_cpu",)
"""Fields that live in host memory (the runner's mirror of ``seq_lens``)."""
UNREAD_PADDING = ("input_ids",)
"""Fields whose padded rows are not part of the contract (left as they were)."""


def capture_batch_sizes(case: Case) -> tuple[int, ...]:
    """The captured batch sizes: capture sizes (tokens) over ``w``, up to ``max_num_seqs``."""
    config = case.config
    w = config.next_n
    sizes = {s // w for s in config.cudagraph_capture_sizes if s >= w}
    sizes = {s for s in sizes if 1 <= s < config.max_num_seqs}
    return tuple(sorted(sizes | {config.max_num_seqs}))


def padded_batch_size(case: Case) -> int:
    """``bs``: the smallest captured batch size that holds the step's requests."""
    raw_bs = case.batch.num_reqs
    return min(s for s in capture_batch_sizes(case) if s >= raw_bs)


def has_swa(case: Case) -> bool:
    """The model has a hybrid sliding-window pool (``out_cache_loc_swa`` exists)."""
    return bool(case.param("hybrid_swa"))


def fill_value(case: Case) -> int:
    return case.param("seq_len_fill_value")


@dataclass
class GraphInputPaddingInputs:
    """The step (the forward batch's tensors) and the persistent buffers as an earlier step
    left them (tensors on the implementation's device, host fields on the CPU)."""

    raw_bs: int
    bs: int  # the captured batch size replayed
    tokens_per_req: int  # w
    max_bs: int
    seq_len_fill_value: int
    step: dict[str, torch.Tensor]  # per-request fields [raw_bs], per-token [raw_bs * w]
    seq_lens_sum: int  # the step's sum of seq_lens
    buffers: dict[str, torch.Tensor]  # [max_bs] / [max_bs * w], stale

    @property
    def raw_num_tokens(self) -> int:
        return self.raw_bs * self.tokens_per_req

    @property
    def num_tokens(self) -> int:
        return self.bs * self.tokens_per_req


@dataclass
class GraphInputPaddingOutputs:
    graph: dict[str, torch.Tensor]  # what the graph reads: each buffer's first bs (bs * w) rows
    buffers: dict[str, torch.Tensor]  # the persistent buffers the implementation filled
    batch_size: int  # the replay view's
    num_padding: int
    seq_lens_sum: int | None


@dataclass
class GraphInputPaddingExpected:
    graph: dict[str, np.ndarray]  # expected rows; UNREAD_PADDING fields: real rows only
    batch_size: int
    num_padding: int
    seq_lens_sum: int


def _distinct(gen: torch.Generator, low: int, high: int, n: int) -> torch.Tensor:
    """``n`` distinct integers in ``[low, high)`` (int64)."""
    return torch.randperm(high - low, generator=gen)[:n].to(torch.int64) + low


def make_inputs(case: Case, device: torch.device | str = "cpu") -> GraphInputPaddingInputs:
    config, batch = case.config, case.batch
    w, raw_bs, bs = config.next_n, batch.num_reqs, padded_batch_size(case)
    max_bs = capture_batch_sizes(case)[-1]
    fill = fill_value(case)
    gen = torch.Generator().manual_seed(batch.seed ^ _DATA_SEED_SALT)
    n, max_tokens = raw_bs * w, max_bs * w
    num_slots = max(2 * max_tokens, config.max_num_batched_tokens * 4)
    seq_lens = torch.as_tensor(batch.seq_lens, dtype=torch.int64)
    # A request's tokens sit at the last w positions of its sequence.
    positions = (seq_lens.repeat_interleave(w) - w + torch.arange(w).repeat(raw_bs)).clamp(min=0)
    step = {
        "input_ids": torch.randint(0, VOCAB, (n,), generator=gen),
        "positions": positions,
        # Slot 0 is the padding slot of either pool: a request never owns it.
        "out_cache_loc": _distinct(gen, 1, num_slots, n),
        "req_pool_indices": _distinct(gen, 1, config.max_num_seqs + 1, raw_bs),
        "seq_lens": seq_lens,
        "seq_lens_cpu": seq_lens.clone(),
    }
    if has_swa(case):
        step["out_cache_loc_swa"] = _distinct(gen, 1, num_slots, n)
    # What an earlier step of max_bs requests left: never a padding value.
    stale = {
        "input_ids": torch.randint(0, VOCAB, (max_tokens,), generator=gen),
        "positions": torch.randint(1, config.max_model_len + 1, (max_tokens,), generator=gen),
        "out_cache_loc": torch.randint(1, num_slots, (max_tokens,), generator=gen),
        "req_pool_indices": torch.randint(1, config.max_num_seqs + 1, (max_bs,), generator=gen),
        "seq_lens": torch.randint(
            fill + 1, config.max_model_len + fill + 2, (max_bs,), generator=gen
        ),
    }
    stale["seq_lens_cpu"] = stale["seq_lens"].clone()
    if has_swa(case):
        stale["out_cache_loc_swa"] = torch.randint(1, num_slots, (max_tokens,), generator=gen)

    def place(name: str, t: torch.Tensor) -> torch.Tensor:
        return t.clone() if name in HOST_FIELDS else t.to(device)

    return GraphInputPaddingInputs(
        raw_bs=raw_bs,
        bs=bs,
        tokens_per_req=w,
        max_bs=max_bs,
        seq_len_fill_value=fill,
        step={name: place(name, t) for name, t in step.items()},
        seq_lens_sum=int(seq_lens.sum()),
        buffers={name: place(name, t) for name, t in stale.items()},
    )


def pad_value(name: str, fill: int) -> int | None:
    """The value of ``name``'s padded rows; None where they are not part of the contract."""
    if name in UNREAD_PADDING:
        return None
    if name in ("seq_lens", "seq_lens_cpu"):
        return fill
    return 0  # pool row 0, slot 0 of either pool, position 0


def reference(case: Case | None, inputs: GraphInputPaddingInputs) -> GraphInputPaddingExpected:
    """Each field's rows the graph reads: the step's rows, then the padding value."""
    graph: dict[str, np.ndarray] = {}
    for name, real in inputs.step.items():
        values = real.cpu().numpy().astype(np.int64)
        padded_n = inputs.bs if name in REQUEST_FIELDS else inputs.num_tokens
        pad = pad_value(name, inputs.seq_len_fill_value)
        if pad is None:
            graph[name] = values.copy()
            continue
        rows = np.full(padded_n, pad, dtype=np.int64)
        rows[: len(values)] = values
        graph[name] = rows
    padding = inputs.bs - inputs.raw_bs
    return GraphInputPaddingExpected(
        graph=graph,
        batch_size=inputs.bs,
        num_padding=padding,
        seq_lens_sum=inputs.seq_lens_sum + padding * inputs.seq_len_fill_value,
    )
