"""Reference of the per-token context lengths of native MTP (domain.md, bug B).

The decode path of a model with native multi-token prediction scores its
decodes as a ``[B, L]`` table (``B = num_decodes``, ``L = max_decode_len``).
Token ``j`` of decode ``b`` sees

    context_lens[b, j] = max(seq_len[b] - L + 1 + j, 0)

keys: right-aligned, so the last slot sees the whole sequence; clamped at 0,
which padding requests (``seq_len = 0``) and sequences shorter than ``L`` need.

The table is metadata that a CUDA graph replays, so it lives in the engine's
persistent workspace, allocated once at start-up, and is *viewed* per step:
the call allocates nothing. Its consumer, the paged MQA logits kernel, takes
the lengths as one contiguous int32 array of ``B * L`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import Case, build_common_metadata, split_decodes_and_prefills

_DATA_SEED_SALT = 0x42135


@dataclass
class MtpSeqLensInputs:
    """What the metadata builder has at hand for one step."""

    seq_lens: torch.Tensor  # int32 [R] (padding requests: 0)
    num_decodes: int  # B
    max_decode_len: int  # L
    workspace: torch.Tensor  # int32 [flat_capacity + max_num_seqs * next_n], persistent
    flat_capacity: int  # elements reserved at the head of the workspace for the flat table
    max_num_batched_tokens: int
    max_num_seqs: int
    next_n: int


@dataclass
class MtpSeqLensOutputs:
    context_lens: torch.Tensor  # int32 [B, L], a contiguous view into the workspace


@dataclass
class MtpSeqLensExpected:
    context_lens: np.ndarray  # int32 [B, L]
    workspace_before: np.ndarray  # the workspace as the step found it


def flat_capacity(max_num_batched_tokens: int, max_num_seqs: int, next_n: int) -> int:
    """Elements of the flat table: room for every ``B * L`` the scheduler can produce.

    ``B <= max_num_seqs`` and ``L <= next_n``; with ragged decodes ``B * L`` can
    exceed ``max_num_batched_tokens`` (e.g. d = [2, 1, 1, 1, 1] with a budget of 6).
    """
    return max(max_num_batched_tokens, max_num_seqs * next_n)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> MtpSeqLensInputs:
    config = case.config
    meta = build_common_metadata(config, case.batch)
    split = split_decodes_and_prefills(meta, config.threshold)
    capacity = flat_capacity(config.max_num_batched_tokens, config.max_num_seqs, config.next_n)
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)
    # Stale lengths from earlier steps: whatever a step does not write stays.
    size = capacity + config.max_num_seqs * config.next_n
    workspace = torch.randint(-9, config.max_model_len + 9, (size,), generator=gen)
    return MtpSeqLensInputs(
        seq_lens=torch.as_tensor(meta.seq_lens).to(device),
        num_decodes=split.num_decodes,
        max_decode_len=split.max_decode_len,
        workspace=workspace.to(torch.int32).to(device),
        flat_capacity=capacity,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        next_n=config.next_n,
    )


def reference(case: Case | None, inputs: MtpSeqLensInputs) -> MtpSeqLensExpected:
    seq_lens = inputs.seq_lens.cpu().numpy()
    B, L = inputs.num_decodes, inputs.max_decode_len
    context_lens = np.zeros((B, L), dtype=np.int32)
    for b in range(B):
        for j in range(L):
            context_lens[b, j] = max(int(seq_lens[b]) - L + 1 + j, 0)
    return MtpSeqLensExpected(context_lens, inputs.workspace.cpu().numpy().copy())
