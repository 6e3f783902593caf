"""Target ``slot-mapping``: the KV-cache slot of every token of the step.

Every attention backend writes the step's keys and values through this
mapping, so every path depends on it. The oracle checks, each on its own:
exact shape and dtype, a view of the persistent buffer's first ``T_pad``
slots, the slot of every real token and ``-1`` for padded ones, and ``-1``
in every slot of the buffer past the view (the engine's contract, see
:mod:`attnfuzz.reference.slot_mapping`).

The metadata is prepared before a graph is replayed, not inside it (vLLM's
runners fill it while preparing the step's inputs), so the call itself is
not asked to be graph-safe; the address it writes is.
"""

from __future__ import annotations

import numpy as np
import torch
from attnfuzz.harness.oracle import Mismatch, expect_equal, expect_meta, expect_view_of
from attnfuzz.harness.target import Implementation, Target
from attnfuzz.reference import slot_mapping as ref
from attnfuzz.reference.batch import Batch, Case, build_common_metadata


def compare(
    case: Case, inputs: ref.SlotMappingInputs, expected: ref.SlotMappingExpected, got
) -> list[Mismatch]:
    T_pad, M = inputs.num_tokens_padded, inputs.max_num_tokens
    mapping = getattr(got, "slot_mapping", got)
    buffer = getattr(got, "buffer", None)
    out = expect_meta("slot_mapping", mapping, (T_pad,), torch.int64)
    out += expect_meta("slot_mapping_buffer", buffer, (M,), torch.int64)
    if out:
        return out
    out += expect_view_of("slot_mapping", mapping, buffer)
    out += expect_equal("slot_mapping", mapping, expected.slot_mapping)
    tail = np.s_[T_pad:]
    out += expect_equal(
        "slot_mapping_buffer", buffer[tail], expected.buffer[tail], check="padding", at=tail
    )
    return out


def reference_impl(inputs: ref.SlotMappingInputs) -> ref.SlotMappingOutputs:
    """The reference's loops as an implementation (a self-check of the harness)."""
    expected = ref.reference(None, inputs)
    buffer = inputs.slot_mapping_buffer
    buffer.copy_(torch.as_tensor(expected.buffer))
    return ref.SlotMappingOutputs(buffer[: inputs.num_tokens_padded], buffer)


# The zoo's metadata of each mutant. Triggers are exact: they compute what the
# mutant writes for the real tokens and compare it with the reference.


def _real_slots(case: Case, page: int | None = None, shift: int = 0) -> np.ndarray:
    """The real tokens' slots with pages of ``page`` tokens, positions shifted by ``shift``
    (block-table indices past the row read 0, as the kernel's masked load does)."""
    inputs = ref.make_inputs(case)
    page = page or inputs.block_size
    table = inputs.block_table.numpy()
    rows = inputs.req_state_rows.numpy()
    qsl, seq_lens = inputs.query_start_loc.numpy(), inputs.seq_lens.numpy()
    out = np.zeros(inputs.num_tokens, dtype=np.int64)
    for r in range(inputs.num_reqs):
        q_len = int(qsl[r + 1] - qsl[r])
        for j in range(q_len):
            pos = int(seq_lens[r]) - q_len + j + shift
            idx = pos // page
            entry = int(table[rows[r], idx]) if idx < table.shape[1] else 0
            out[int(qsl[r]) + j] = entry * page + pos % page
    return out


def reach_always(case: Case) -> bool:
    """Every step has real tokens, and every one of them is mapped."""
    return True


def reach_padded(case: Case) -> bool:
    """The runner pads the slot mapping: the view is ``T_pad`` slots long (a FULL
    step, or any graph step of Model Runner V2, see ``reference.slot_mapping``)."""
    meta = build_common_metadata(case.config, case.batch)
    return meta.padded or meta.slot_mapping_tokens > meta.num_real_tokens


def trigger_stale_padding(case: Case) -> bool:
    """The runner pads tokens, ``T_pad > T``: their slots hold stale ids unless written."""
    meta = build_common_metadata(case.config, case.batch)
    return meta.slot_mapping_tokens > meta.num_real_tokens


def trigger_position(case: Case) -> bool:
    """Some real token's slot moves when its position is one late."""
    return bool((_real_slots(case, shift=1) != _real_slots(case)).any())


def trigger_page_width(case: Case) -> bool:
    """Some real token's slot differs with pages of twice the block size."""
    return bool((_real_slots(case, page=2 * case.config.block_size) != _real_slots(case)).any())


def _spec_case(q_lens: tuple[int, ...], computed: tuple[int, ...], seed: int = 0) -> Case:
    from attnfuzz.harness.testing import spec_config

    return Case(spec_config(), Batch(computed, q_lens, seed=seed, use_cudagraph=True))


def smallest_stale_padding() -> Case:
    """next_n = 2, three decodes of 2 tokens = 6 padded to capture size 8: slots 6 and 7."""
    return _spec_case((2, 2, 2), (1, 1, 1))


def smallest_position() -> Case:
    """One token at position 0: its slot is ``page * 4``, the mutant's ``page * 4 + 1``."""
    return _spec_case((1,), (0,))


def smallest_page_width() -> Case:
    """One token at position 0 of page ``p != 0`` (seed 1): slot ``4p`` against ``8p``."""
    return _spec_case((1,), (0,), seed=1)


def build() -> Target:
    from attnfuzz.kernels import slot_mapping as k

    target = Target(
        runs_in="runner",
        name="slot-mapping",
        summary="the KV-cache slot of every token, -1 past the real ones, in the persistent buffer",
        make_inputs=ref.make_inputs,
        reference=ref.reference,
        compare=compare,
        # Stale slots sit in graph-padded token slots (T_pad > T).
        guided=("padded_tokens",),
    )
    target.add(Implementation("triton", k.slot_mapping, "fixed", "one program per request"))
    target.add(Implementation("reference", reference_impl, "reference", "the reference's loops"))
    target.add(
        Implementation(
            "stale-padding",
            k.mutant_stale_padding,
            "mutant",
            "padding written from T_pad, not T: padded tokens keep stale slots",
            trigger=trigger_stale_padding,
            reach=reach_padded,
            smallest=smallest_stale_padding,
        )
    )
    target.add(
        Implementation(
            "position-off-by-one",
            k.mutant_position,
            "mutant",
            "token j at seq_len - q_len + j + 1",
            trigger=trigger_position,
            reach=reach_always,
            smallest=smallest_position,
        )
    )
    target.add(
        Implementation(
            "page-width",
            k.mutant_page_width,
            "mutant",
            "pages of 2 * block_size: wrong page index and offset",
            trigger=trigger_page_width,
            reach=reach_always,
            smallest=smallest_page_width,
        )
    )
    return target
