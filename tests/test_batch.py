"""The batch model against cases computed by hand from docs/domain.md."""

from __future__ import annotations

import numpy as np
import pytest
from attnfuzz.reference.batch import (
    PAD_PAGE,
    Batch,
    EngineConfig,
    build_common_metadata,
    split_decodes_and_prefills,
)
from attnfuzz.reference.invariants import violations


def spec_config(**kw) -> EngineConfig:
    base = dict(
        max_model_len=64,
        max_num_seqs=64,
        max_num_batched_tokens=256,
        block_size=4,
        num_spec=1,
        cudagraph_capture_sizes=(2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 104, 112, 128),
        topk=4,
    )
    base.update(kw)
    return EngineConfig(**base)


def test_smallest_trigger_of_bug_a_pads_6_tokens_to_8():
    """next_n = 2, 3 requests -> 6 tokens -> capture size 8: d = [2, 2, 2, 0], N_d = 8."""
    config = spec_config()
    batch = Batch((5, 7, 9), (2, 2, 2), seed=3)
    meta = build_common_metadata(config, batch)
    assert meta.padded and meta.num_reqs == 4 and meta.num_actual_tokens == 8
    assert meta.num_real_reqs == 3 and meta.num_real_tokens == 6
    assert meta.query_start_loc.tolist() == [0, 2, 4, 6, 6]
    assert meta.query_start_loc.dtype == np.int32
    assert meta.seq_lens.tolist() == [7, 9, 11, 0]
    assert (meta.block_table[3] == PAD_PAGE).all()
    assert meta.slot_mapping.dtype == np.int64 and meta.slot_mapping[6:].tolist() == [-1, -1]
    split = split_decodes_and_prefills(meta, config.threshold)
    assert split.num_decodes == 4 and split.num_decode_tokens == 8
    assert split.decode_lens == (2, 2, 2, 0) and sum(split.decode_lens) == 6
    assert split.requires_padding and split.max_decode_len == 2
    # The uniform rule sees the same padded step as four decodes.
    uniform = split_decodes_and_prefills(meta, config.threshold, require_uniform=True)
    assert (uniform.num_decodes, uniform.num_decode_tokens) == (4, 8)
    assert violations(config, batch, meta) == []


def test_bug_a_production_case_98_tokens_pad_to_104():
    """49 requests x 2 tokens = 98 tokens, captured at 104: 52 padded requests."""
    config = spec_config(max_model_len=4096, max_num_batched_tokens=2048, block_size=64)
    batch = Batch(tuple(100 + r for r in range(49)), (2,) * 49, seed=0)
    meta = build_common_metadata(config, batch)
    split = split_decodes_and_prefills(meta, config.threshold)
    assert meta.num_actual_tokens == 104 and meta.num_reqs == 52
    assert split.num_decode_tokens == 104 and sum(split.decode_lens) == 98
    assert split.requires_padding
    assert violations(config, batch, meta) == []


def test_slot_mapping_follows_the_block_table():
    config = spec_config(num_spec=0, cudagraph_capture_sizes=())
    batch = Batch((3, 0), (1, 6), seed=11)
    meta = build_common_metadata(config, batch)
    bs = config.block_size
    for r, (computed, q) in enumerate(zip(batch.num_computed_tokens, batch.q_lens, strict=True)):
        for j in range(q):
            pos = computed + j
            want = meta.block_table[r, pos // bs] * bs + pos % bs
            assert meta.slot_mapping[meta.query_start_loc[r] + j] == want


def test_ragged_split_counts_short_prefill_chunks_as_decodes():
    config = spec_config(num_spec=2)  # next_n = 3
    batch = Batch((10, 4, 0), (3, 1, 9), seed=1)
    meta = build_common_metadata(config, batch)
    split = split_decodes_and_prefills(meta, config.threshold)
    assert not meta.padded
    assert split.decode_lens == (3, 1) and split.num_decode_tokens == 4
    assert (split.num_prefills, split.num_prefill_tokens) == (1, 9)
    assert split.requires_padding
    uniform = split_decodes_and_prefills(meta, config.threshold, require_uniform=True)
    assert uniform.num_decodes == 1 and uniform.num_decode_tokens == 3


def test_unpadded_slices_back_to_the_real_batch():
    config = spec_config()
    meta = build_common_metadata(config, Batch((5, 7, 9), (2, 2, 2), seed=3))
    real = meta.unpadded(meta.num_real_tokens, meta.num_real_reqs)
    assert real.query_start_loc.tolist() == [0, 2, 4, 6]
    assert real.block_table.shape[0] == 3 and real.slot_mapping.shape == (6,)
    assert (real.num_reqs, real.num_actual_tokens, real.padded) == (3, 6, False)


@pytest.mark.parametrize(
    "batch, message",
    [
        (Batch((0, 0), (9, 1)), "decodes must come first"),
        (Batch((60,), (9,)), "exceeds max_model_len"),
        (Batch((0,), (0,)), "q_len >= 1"),
    ],
)
def test_validator_names_the_broken_invariant(batch, message):
    assert any(message in v for v in violations(spec_config(), batch))


def test_validator_catches_a_tampered_metadata():
    config = spec_config()
    batch = Batch((5, 7, 9), (2, 2, 2), seed=3)
    meta = build_common_metadata(config, batch)
    meta.slot_mapping[7] = 5
    assert any("slot -1" in v for v in violations(config, batch, meta))
    meta = build_common_metadata(config, batch)
    meta.max_seq_len = 65
    assert any("max_seq_len" in v for v in violations(config, batch, meta))
