"""Reference of the per-token context lengths of native MTP (docs/domain.md, bug B).

With native multi-token prediction the indexer's decode path scores its
decodes as a ``[B, L]`` table (``B = num_decodes``, ``L = max_decode_len``),
and the logits kernel takes one context length per slot:

    context_lens[b, j] = max(seq_len[b] - L + 1 + j, 0)

Right-aligned: the last slot sees the whole sequence. This is the causal end
``seq_len[b] - d[b] + j + 1`` of docs/domain.md section 5 exactly when ``d[b] == L``,
which is why the native path splits the step with the *uniform* rule
(:func:`describe`): decodes share the first request's ``q_len``, a later request
of another length is a prefill, and the zero-length padding requests of a
graph (``seq_len = 0``) count as decodes. Their slots are the only ones the
clamp at 0 changes (``0 - L + 1 + j < 0`` for ``j < L - 1``).

Storage. The table is metadata that a CUDA graph replays, so it is written
into the engine's persistent workspace, allocated once at start-up, and
*viewed* per step: the call allocates nothing. The workspace holds

- the flat table, ``workspace[:max_num_batched_tokens]``: the accepted fix of
  #42135 views its first ``B * L`` elements as ``[B, L]``, contiguous, as the
  paged MQA logits kernel requires;
- the ``[max_num_seqs, next_n]`` table the code kept before that fix, after it,
  so that the historical code paths (the mutants) run without allocating too.

Why ``max_num_batched_tokens`` elements are enough: under the uniform rule
every decode has ``d[b] == L`` except padding requests, which exist only when a
graph pads the step to ``T_pad = B * L``; so ``B * L == N_d <= max_num_batched_tokens``
in every step. (With the ragged rule ``B * L`` could exceed the token budget,
e.g. ``d = [2, 1, 1, 1, 1]`` with a budget of 6, but the right-aligned formula
would then be wrong for the short decodes anyway: that is the flattening
path's business, not this one's.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    build_common_metadata,
    split_decodes_and_prefills,
)

_DATA_SEED_SALT = 0x42135  # keeps the workspace stream apart from the page-id stream


@dataclass
class MtpSeqLensInputs:
    """What the metadata builder has at hand for one step.

    ``seq_lens`` and ``workspace`` live on the implementation's device; the
    integers are host-side, as the builder knows them on the CPU.
    """

    seq_lens: torch.Tensor  # int32 [R]; padding requests: 0
    num_decodes: int  # B, padding requests included
    max_decode_len: int  # L
    workspace: torch.Tensor  # int32 [max_num_batched_tokens + max_num_seqs * next_n]
    max_num_batched_tokens: int
    max_num_seqs: int
    next_n: int

    @property
    def flat_table(self) -> torch.Tensor:
        """The flat int32 table of the accepted fix: ``max_num_batched_tokens`` elements."""
        return self.workspace[: self.max_num_batched_tokens]

    @property
    def table_2d(self) -> torch.Tensor:
        """The ``[max_num_seqs, next_n]`` table of the code before #42135."""
        start, size = self.max_num_batched_tokens, self.max_num_seqs * self.next_n
        return self.workspace[start : start + size].view(self.max_num_seqs, self.next_n)


@dataclass
class MtpSeqLensOutputs:
    context_lens: torch.Tensor  # int32 [B, L], a contiguous view into the workspace


@dataclass
class MtpSeqLensExpected:
    context_lens: np.ndarray  # int32 [B, L]
    workspace_before: np.ndarray  # the workspace as the step found it


def describe(case: Case) -> tuple[CommonMetadata, DecodeSplit]:
    """The step's metadata and its split by the uniform rule of the native MTP path."""
    meta = build_common_metadata(case.config, case.batch)
    return meta, split_decodes_and_prefills(meta, case.config.threshold, require_uniform=True)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> MtpSeqLensInputs:
    """Build the inputs of ``case``; the workspace holds stale values from the seed."""
    config = case.config
    meta, split = describe(case)
    gen = torch.Generator().manual_seed(case.batch.seed ^ _DATA_SEED_SALT)
    # Stale lengths of earlier steps (negative ones too): whatever a step does
    # not write stays, so every element the step must not touch is checkable.
    size = config.max_num_batched_tokens + config.max_num_seqs * config.next_n
    workspace = torch.randint(-9, config.max_model_len + 9, (size,), generator=gen)
    return MtpSeqLensInputs(
        seq_lens=torch.as_tensor(meta.seq_lens).to(device),
        num_decodes=split.num_decodes,
        max_decode_len=split.max_decode_len,
        workspace=workspace.to(torch.int32).to(device),
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        next_n=config.next_n,
    )


def reference(case: Case | None, inputs: MtpSeqLensInputs) -> MtpSeqLensExpected:
    """The expected table, slot by slot, and the workspace before the step."""
    seq_lens = inputs.seq_lens.cpu().numpy()
    B, L = inputs.num_decodes, inputs.max_decode_len
    context_lens = np.zeros((B, L), dtype=np.int32)
    for b in range(B):
        for j in range(L):
            context_lens[b, j] = max(int(seq_lens[b]) - L + 1 + j, 0)
    return MtpSeqLensExpected(context_lens, inputs.workspace.cpu().numpy().copy())
