"""Target ``dsa-metadata``: the reference by hand, the kernel, the mutant's trigger."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import dsa_metadata as t
from attnfuzz.harness.testing import spec_config
from attnfuzz.kernels import dsa_metadata as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import dsa_metadata as ref
from attnfuzz.reference.batch import Batch, Case

TARGET = "dsa-metadata"
MUTANT = "pr19016-context-len-table"


def case(phase: int, computed=(3, 0, 5), q=1, graph=True, topk=2, page_log2=0, **config) -> Case:
    """Three requests (one new token each unless ``q``), next_n 2; graphs of 1, 2 and
    4 requests (capture sizes 2, 4 and 8 over next_n)."""
    base = dict(cudagraph_capture_sizes=(2, 4, 8), max_model_len=16)
    base.update(config)
    params = {"dsa_phase": phase, "dsa_index_topk": topk, "dsa_page_log2": page_log2}
    batch = Batch(tuple(computed), (q,) * len(computed), seed=5, use_cudagraph=graph)
    return Case(spec_config(**base), batch, tuple(sorted(params.items())))


def hand_inputs(phase: str, graph_bs: int | None, page_size: int = 1) -> ref.DsaMetadataInputs:
    """Two requests on rows 2 and 1 of a 5-row pool, forward seq_lens 3 and 1, N = 2,
    top-k 2; row 0 is the reserved one. Extend: 2 and 1 new tokens."""
    table = torch.tensor(
        [[0] * 6, [8, 9, 10, 11, 40, 41], [4, 5, 6, 7, 12, 13], [43] * 6, [44] * 6],
        dtype=torch.int32,
        device=device(),
    )
    q = {ref.DECODE: [1, 1], ref.EXTEND: [2, 1]}.get(phase, [2, 2])
    return ref.DsaMetadataInputs(
        phase=phase,
        next_n=2,
        index_topk=2,
        page_size=page_size,
        req_to_token=table,
        req_pool_indices=torch.tensor([2, 1], device=device()),
        seq_lens=torch.tensor([3, 1], device=device()),
        extend_seq_lens=torch.tensor(q, device=device()),
        graph_bs=graph_bs,
        capture_bs=(1, 4),
        context_len=4,
        config=spec_config(),
    )


def test_target_verify_eager_by_hand():
    """KV 3 + 2 and 1 + 2; rows see 4, 5 and 2, 3 keys; top-k 2 clamps them all."""
    e = ref.reference(None, hand_inputs(ref.TARGET_VERIFY, None))
    assert e.cache_seqlens.tolist() == [5, 3]
    assert e.cu_seqlens_k.tolist() == [0, 5, 8]
    assert e.cu_seqlens_q.tolist() == [0, 1, 2, 3, 4]
    assert e.seqlens_expanded.tolist() == [4, 5, 2, 3]
    assert e.dsa_cache_seqlens.tolist() == [2, 2, 2, 2]
    assert e.dsa_cu_seqlens_k.tolist() == [0, 2, 4, 6, 8]
    assert e.page_table_lens.tolist() == [5, 5, 3, 3]
    assert e.page_table_1[0].tolist() == [4, 5, 6, 7, 12]
    assert e.page_table_1[2].tolist() == [8, 9, 10, 0, 0]  # past its KV: never read
    assert e.indexer_ks is None


def test_decode_replayed_pads_with_the_fill_length_on_row_zero():
    e = ref.reference(None, hand_inputs(ref.DECODE, 4))
    assert e.cache_seqlens.tolist() == [3, 1, 1, 1]
    assert e.seqlens_expanded.tolist() == [3, 1, 1, 1]
    assert e.dsa_cache_seqlens.tolist() == [2, 1, 1, 1]
    assert e.page_table_1[:, :1].tolist() == [[4], [8], [0], [0]]


def test_draft_extend_padding_rows_see_no_fewer_than_zero_keys():
    """A padding request's forward length 1 is shorter than its N = 2 rows: its first
    row sees max(1 - 2 + 1, 0) = 0 keys, never a negative count."""
    e = ref.reference(None, hand_inputs(ref.DRAFT_EXTEND, 4))
    assert e.cache_seqlens.tolist() == [3, 1, 1, 1]
    assert e.seqlens_expanded.tolist() == [2, 3, 0, 1, 0, 1, 0, 1]


def test_extend_by_hand_indexer_windows_and_pages():
    """Two new tokens over one cached (KV 3) and one over none (KV 1), page size 2."""
    e = ref.reference(None, hand_inputs(ref.EXTEND, None, page_size=2))
    assert e.cu_seqlens_q.tolist() == [0, 2, 3]
    assert e.seqlens_expanded.tolist() == [2, 3, 1]
    assert e.indexer_ks.tolist() == [0, 0, 3]
    assert e.indexer_ke.tolist() == [2, 3, 4]
    assert e.token_to_batch_idx.tolist() == [0, 0, 1]
    assert e.page_table_1.shape == (2, 3)  # one row per request in an extend
    assert e.real_page_table.tolist() == [[2, 3], [4, 0]]  # slot // 2 at tokens 0, 2
    assert e.real_page_table_lens.tolist() == [2, 1]


@pytest.mark.parametrize("phase", ref.PHASES)
@pytest.mark.parametrize("graph_bs", [None, 4])
@pytest.mark.parametrize("page_size", [1, 2])
def test_kernel_matches_the_hand_reference(phase, graph_bs, page_size):
    if phase == ref.EXTEND and graph_bs is not None:
        pytest.skip("an extend runs eagerly")
    inputs = hand_inputs(phase, graph_bs, page_size)
    got = kernels.dsa_metadata(inputs)
    assert get_target(TARGET).compare(None, inputs, ref.reference(None, inputs), got) == []


def test_mutant_sizes_the_graph_table_by_the_context_length():
    """context_len 4; the first request's verified KV is 5: the table lacks column 4."""
    inputs = hand_inputs(ref.TARGET_VERIFY, 4)
    got = kernels.mutant_context_len_table(inputs)
    assert got.page_table_1.shape[1] == 4
    found = get_target(TARGET).compare(None, inputs, ref.reference(None, inputs), got)
    assert {(m.check, m.where) for m in found} == {
        ("shape", "page_table_1"),
        ("shape", "real_page_table"),
    }


@pytest.mark.parametrize(
    ("c", "triggers"),
    [
        (case(1, computed=(14,)), True),  # 15 committed + 2 > 16
        (case(1, computed=(13,)), False),  # 14 + 2 = 16: the context holds it exactly
        (case(2, computed=(14,)), True),  # draft extend: 15 + 2 forward tokens
        (case(1, computed=(14,), graph=False), False),  # eager: sized by the step
        (case(0, computed=(14,)), False),  # decode: no speculative tokens
    ],
)
def test_trigger_is_exactly_where_the_mutant_differs(c, triggers):
    target = get_target(TARGET)
    assert t.trigger_context_len_table(c) is triggers
    assert target.judge(target.resolve(MUTANT), c).ok is not triggers


def test_compare_reads_each_table_row_up_to_its_kv_only():
    target = get_target(TARGET)
    inputs = hand_inputs(ref.TARGET_VERIFY, 4)
    expected = ref.reference(None, inputs)
    got = kernels.dsa_metadata(inputs)
    got.page_table_1[2, 3:] = -5  # past request 1's KV of 3
    assert target.compare(None, inputs, expected, got) == []
    got.page_table_1[2, 2] = -5
    (m,) = target.compare(None, inputs, expected, got)
    assert m.check == "values" and m.where.startswith("page_table_1")


def test_compare_wants_every_length_exactly():
    target = get_target(TARGET)
    inputs = hand_inputs(ref.DRAFT_EXTEND, 4)
    got = kernels.dsa_metadata(inputs)
    got = dataclasses.replace(got, seqlens_expanded=got.seqlens_expanded[:-1])
    (m,) = target.compare(None, inputs, ref.reference(None, inputs), got)
    assert (m.check, m.where) == ("shape", "seqlens_expanded")


def test_table_rows_hold_distinct_page_aligned_slots_and_row_zero_is_reserved():
    c = case(1, page_log2=1)
    inputs = ref.make_inputs(c)
    table = inputs.req_to_token.numpy()
    assert not table[ref.PAD_ROW].any()
    pages = []
    for row, s in zip(inputs.req_pool_indices, inputs.seq_lens, strict=True):
        kv = int(s) + 2
        slots = table[int(row), :kv]
        assert (slots % 2 == np.arange(kv) % 2).all()  # token j at offset j % page
        pages += sorted(set((slots // 2).tolist()))
    assert len(set(pages)) == len(pages) and 0 not in pages


def test_graph_size_and_forward_lengths_follow_the_phase():
    assert ref.graph_bs(case(0)) == 4
    assert ref.graph_bs(case(3)) is None  # an extend runs eagerly
    assert ref.forward_seq_lens(case(0)) == [4, 1, 6]  # decode: computed + 1
    assert ref.forward_seq_lens(case(1)) == [4, 1, 6]  # verify: committed
    assert ref.forward_seq_lens(case(2)) == [6, 3, 8]  # draft extend: + N
    assert ref.forward_seq_lens(case(3, q=2)) == [5, 2, 7]
