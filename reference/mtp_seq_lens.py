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

Storage. The table is metadata that a CUDA graph replays, so it lives in the
engine's persistent workspace, allocated once at start-up, and is *viewed* per
step: what the step hands on is never new storage. The workspace holds

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

Where the lengths may live (vLLM 0.33.0, ``vllm/v1/attention/backends/mla/indexer.py``,
``DeepseekV32IndexerMetadataBuilder``). The builder runs eagerly, before a
graph replays, so temporaries inside the call are fine (``_prepare_decode_tensors``
computes the table from ``sub``/``add`` temporaries and copies it in). What a
graph needs is that the lengths it reads sit in memory that existed before the
step and keeps its address: a persistent buffer. That is

- the workspace above, or an implementation's own persistent buffer standing
  for it (an engine's builder allocates its ``decode_seq_lens_buffer`` at
  start-up); such a buffer of ``n`` elements is loaded with the step's stale
  ``workspace[:n]`` before the step, so that what the step leaves untouched in
  it is checkable as in the workspace (:class:`MtpSeqLensOutputs`);
- or the step's own ``seq_lens``, itself a persistent buffer of the model
  runner: with ``next_n == 1`` (plain decode) the formula is ``seq_len[b]``
  and ``build`` passes ``seq_lens[:B]`` through, viewed ``[B, 1]``
  (``seq_lens.unsqueeze(-1)``), writing nothing.

Which path the engine takes (``_supports_native_decode``, ``_use_flattening``
and ``use_native`` in ``build``). With ``next_n`` in ``(1, 2)`` every platform
has a native kernel and the engine takes this path (adaptive verification,
which can flatten on some GPUs, is not modelled). With ``next_n > 2`` the
platform decides: Blackwell with DeepGEMM, and Hopper for the ``next_n`` its
kernel supports, take the native path; every other platform, the CPU one
included, *flattens* the decodes: split by the ragged rule, one length per
decode token, ``[N_d, 1]``. This target describes the native path; an
implementation says which path it took (:class:`MtpSeqLensOutputs`), and a
flattened answer is accepted only where the engine may flatten, judged here
only for what a graph and the logits kernel need of it (persistent storage,
shape, dtype, contiguity): its values are the target ``flatten-decode``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from attnfuzz.reference.batch import (
    Case,
    CommonMetadata,
    DecodeSplit,
    EngineConfig,
    build_common_metadata,
    split_decodes_and_prefills,
)

_DATA_SEED_SALT = 0x42135  # keeps the workspace stream apart from the page-id stream

NATIVE = "native"
"""The native path: one ``[B, L]`` table of lengths, the uniform split."""
FLATTENING = "flattening"
"""The flattening path: one length per decode token, ``[N_d, 1]``, the ragged split."""


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
    # What the engine's builder receives: its limits and the step's common
    # metadata (the host copy ``seq_lens`` above was made from).
    config: EngineConfig
    common: CommonMetadata

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
    """The lengths, the persistent buffer they live in, and the path taken."""

    context_lens: torch.Tensor  # int32 [B, L], a contiguous view of persistent memory
    # The implementation's own persistent buffer, when the lengths live there
    # rather than in the workspace: it held ``workspace[:buffer.numel()]`` before
    # the step, and the step may change it only under ``context_lens``. None:
    # the inputs' workspace (or the step's ``seq_lens``).
    buffer: torch.Tensor | None = None
    path: str = NATIVE  # FLATTENING: ``[N_d, 1]``, where the engine may flatten


@dataclass
class MtpSeqLensExpected:
    context_lens: np.ndarray  # int32 [B, L]
    workspace_before: np.ndarray  # the workspace as the step found it
    seq_lens_before: np.ndarray  # the step's seq_lens, which nothing may write
    paths: tuple[str, ...] = (NATIVE,)  # the paths the engine may take
    flattened_tokens: int = 0  # N_d of the ragged split: rows of a flattened answer


def engine_paths(config: EngineConfig) -> tuple[str, ...]:
    """The decode paths the engine may take under ``config``: native only for
    ``next_n <= 2``, where every platform has a native kernel; either beyond,
    as the platform decides (vLLM 0.33.0 ``indexer.py:_supports_native_decode``)."""
    return (NATIVE,) if config.next_n <= 2 else (NATIVE, FLATTENING)


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
        config=config,
        common=meta,
    )


def reference(case: Case | None, inputs: MtpSeqLensInputs) -> MtpSeqLensExpected:
    """The expected table, slot by slot, the buffers before the step, and the paths
    the engine may take (with the rows a flattened answer has)."""
    seq_lens = inputs.seq_lens.cpu().numpy()
    B, L = inputs.num_decodes, inputs.max_decode_len
    context_lens = np.zeros((B, L), dtype=np.int32)
    for b in range(B):
        for j in range(L):
            context_lens[b, j] = max(int(seq_lens[b]) - L + 1 + j, 0)
    ragged = split_decodes_and_prefills(inputs.common, inputs.config.threshold)
    return MtpSeqLensExpected(
        context_lens,
        inputs.workspace.cpu().numpy().copy(),
        seq_lens.copy(),
        paths=engine_paths(inputs.config),
        flattened_tokens=ragged.num_decode_tokens,
    )
