"""A downstream engine's MTP metadata builder: the per-token context lengths.

``context_lens`` is this project's implementation of attnfuzz's target
``mtp-seq-lens`` (native multi-token prediction, ``[B, L]`` lengths
``max(seq_len[b] - L + 1 + j, 0)`` in a view of the persistent workspace),
written in plain torch. ``context_lens_noclamp`` is the same with a known bug
of that target: no clamp at 0, so the padding requests of a padded CUDA graph
(``seq_len`` 0) get negative lengths; ``MUTANTS`` declares it as this project's
own mutant ``builder-noclamp``, so that attnfuzz checks its search still finds it.
"""

from __future__ import annotations

import attnfuzz
import torch

# The implementation's inputs and outputs are the target's reference dataclasses
# (attnfuzz's README, "Testing your own implementation").
from attnfuzz.reference.mtp_seq_lens import MtpSeqLensInputs, MtpSeqLensOutputs


def _build(inp: MtpSeqLensInputs, clamp: bool) -> MtpSeqLensOutputs:
    B, L = inp.num_decodes, inp.max_decode_len
    # The first B * L elements of the persistent flat table: contiguous, and the
    # same memory every step, as a replayed CUDA graph needs.
    table = inp.flat_table[: B * L].view(B, L)
    offsets = torch.arange(1 - L, 1, dtype=torch.int32, device=table.device)  # j - L + 1
    torch.add(inp.seq_lens[:B, None], offsets, out=table)
    if clamp:
        table.clamp_(min=0)
    return MtpSeqLensOutputs(table)


def context_lens(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """The fixed builder."""
    return _build(inp, clamp=True)


def context_lens_noclamp(inp: MtpSeqLensInputs) -> MtpSeqLensOutputs:
    """The builder with the bug: negative lengths for padding requests."""
    return _build(inp, clamp=False)


# This project's known bug, kept as a mutant: `--mutants mtp_builder` (campaign,
# zoo) or the pytest ini key attnfuzz_mutants registers it under this name.
MUTANTS = [
    attnfuzz.mutant(
        "mtp-seq-lens",
        "builder-noclamp",
        context_lens_noclamp,
        description="the builder without its clamp at 0: padding requests get negative lengths",
    )
]
