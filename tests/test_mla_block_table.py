"""Target ``mla-block-table``: the reference by hand, the kernel, #21987's trigger."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import mla_block_table as t
from attnfuzz.harness.testing import spec_config
from attnfuzz.kernels import mla_block_table as kernels
from attnfuzz.kernels._triton import device
from attnfuzz.reference import mla_block_table as ref
from attnfuzz.reference.batch import Batch, Case

TARGET = "mla-block-table"
MUTANT = "pr21987-accept-length-layout"


def case(phase: int, computed=(3, 0, 5), graph=True, page_log2=0, seed=5, **config) -> Case:
    """Three requests of one new token each, next_n 2; graphs of 1, 2 and 4 requests."""
    base = dict(cudagraph_capture_sizes=(2, 4, 8), max_model_len=16)
    base.update(config)
    params = {"mla_phase": phase, "mla_page_log2": page_log2}
    batch = Batch(tuple(computed), (1,) * len(computed), seed=seed, use_cudagraph=graph)
    return Case(spec_config(**base), batch, tuple(sorted(params.items())))


def hand_inputs(phase: str, graph_bs: int | None, page_size: int = 1) -> ref.MlaBlockTableInputs:
    """Two requests on rows 2 and 1 of a 5-row pool, forward seq_lens 3 and 1, N = 2,
    accept counts 2 and 1; row 0 is the reserved one."""
    table = torch.tensor(
        [[0] * 6, [8, 9, 10, 11, 40, 41], [4, 5, 6, 7, 12, 13], [43] * 6, [44] * 6],
        dtype=torch.int32,
        device=device(),
    )
    return ref.MlaBlockTableInputs(
        phase=phase,
        next_n=2,
        page_size=page_size,
        req_to_token=table,
        req_pool_indices=torch.tensor([2, 1], device=device()),
        seq_lens=torch.tensor([3, 1], device=device()),
        accept_lens=torch.tensor([2, 1], dtype=torch.int32, device=device()),
        graph_bs=graph_bs,
        capture_bs=(1, 4),
        context_len=4,
        config=spec_config(),
    )


def test_target_verify_eager_by_hand():
    """KV 3 + 2 and 1 + 2; N = 2 rows each; page 1: the pages are the slots."""
    e = ref.reference(None, hand_inputs(ref.TARGET_VERIFY, None))
    assert e.seq_lens_k.tolist() == [5, 3]
    assert e.cu_seqlens_q.tolist() == [0, 2, 4]
    assert e.seq_lens_q.tolist() == [2, 2]
    assert e.max_seq_len_q == 2
    assert e.block_lens.tolist() == [5, 3]
    assert e.block_kv_indices.tolist() == [[4, 5, 6, 7, 12], [8, 9, 10, 0, 0]]


def test_draft_extend_replayed_pads_with_the_fill_length_on_row_zero():
    """The forward's seq_len is the KV; two padding requests of KV 1 on row 0; page 2:
    entry j is the slot of token 2j halved."""
    e = ref.reference(None, hand_inputs(ref.DRAFT_EXTEND, 4, page_size=2))
    assert e.seq_lens_k.tolist() == [3, 1, 1, 1]
    assert e.cu_seqlens_q.tolist() == [0, 2, 4, 6, 8]
    assert e.block_lens.tolist() == [2, 1, 1, 1]
    assert e.block_kv_indices.tolist() == [[2, 3], [4, 0], [0, 0], [0, 0]]


def test_the_reference_ignores_the_accept_counts():
    inputs = hand_inputs(ref.DRAFT_EXTEND, 4)
    other = dataclasses.replace(inputs, accept_lens=torch.tensor([1, 2], dtype=torch.int32))
    a, b = ref.reference(None, inputs), ref.reference(None, other)
    assert a.seq_lens_k.tolist() == b.seq_lens_k.tolist()
    assert a.block_kv_indices.tolist() == b.block_kv_indices.tolist()


@pytest.mark.parametrize("phase", ref.PHASES)
@pytest.mark.parametrize("graph_bs", [None, 4])
@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_kernel_matches_the_hand_reference(phase, graph_bs, page_size):
    inputs = hand_inputs(phase, graph_bs, page_size)
    got = kernels.mla_block_table(inputs)
    assert get_target(TARGET).compare(None, inputs, ref.reference(None, inputs), got) == []


def test_mutant_lays_the_replay_out_by_the_accept_counts():
    """Accept counts 2 and 1, padding N = 2: rows 3, 2, 3, 3; KV seq_len - accept."""
    inputs = hand_inputs(ref.DRAFT_EXTEND, 4)
    got = kernels.mutant_accept_length_layout(inputs)
    assert got.seq_lens_q.tolist() == [3, 2, 3, 3]
    assert got.cu_seqlens_q.tolist() == [0, 3, 5, 8, 11]
    assert got.max_seq_len_q == 1
    assert got.seq_lens_k.tolist() == [1, 0, -1, -1]
    found = get_target(TARGET).compare(None, inputs, ref.reference(None, inputs), got)
    assert {m.where.split("[")[0] for m in found} == {
        "seq_lens_k",
        "block_kv_indices",
        "cu_seqlens_q",
        "seq_lens_q",
        "max_seq_len_q",
    }


@pytest.mark.parametrize(
    ("c", "triggers"),
    [
        (case(1), True),  # a replayed draft extend of 3 requests in the graph of 4
        (case(1, computed=(0,), seed=9), True),  # whatever the accept counts
        (case(1, graph=False), False),  # eager: the layout is built from the step
        (case(0), False),  # target verify: no accept counts in its replay
        (case(1, num_spec=0, cudagraph_capture_sizes=(1, 4)), True),  # N = 1
    ],
)
def test_trigger_is_exactly_where_the_mutant_differs(c, triggers):
    target = get_target(TARGET)
    assert t.trigger_accept_length_layout(c) is triggers
    assert target.judge(target.resolve(MUTANT), c).ok is not triggers


@pytest.mark.parametrize(
    ("c", "triggers"),
    [
        (case(0, computed=(4094,), max_model_len=4096), True),  # 4095 + 2 > 4096
        (case(0, computed=(4093,), max_model_len=4096), False),  # 4094 + 2 = 4096 fits
        (case(1, computed=(4094,), max_model_len=4096), True),  # 4095 + 2 forward tokens
        (case(0, computed=(4094,), max_model_len=4096, graph=False), False),  # eager
    ],
)
def test_kv_past_context_trigger(c, triggers):
    assert t.trigger_kv_past_context(c) is triggers
    assert get_target(TARGET).judge(get_target(TARGET).resolve("triton"), c).ok


def test_sglang_declines_a_request_that_commits_the_whole_context():
    assert t.beyond_sglang_max_req_len(case(0, computed=(15,))) is not None  # 16 committed
    assert t.beyond_sglang_max_req_len(case(0, computed=(14,))) is None  # 15 = 16 - 1


def test_compare_reads_each_row_up_to_its_pages_only():
    target = get_target(TARGET)
    inputs = hand_inputs(ref.TARGET_VERIFY, 4)
    expected = ref.reference(None, inputs)
    got = kernels.mla_block_table(inputs)
    got.block_kv_indices[1, 3:] = -5  # past request 1's KV of 3
    assert target.compare(None, inputs, expected, got) == []
    got.block_kv_indices[1, 2] = -5
    (m,) = target.compare(None, inputs, expected, got)
    assert m.check == "values" and m.where.startswith("block_kv_indices")


def test_a_table_narrower_than_a_rows_pages_is_a_shape_mismatch():
    inputs = hand_inputs(ref.TARGET_VERIFY, 4)
    got = kernels.mla_block_table(inputs)
    got = dataclasses.replace(got, block_kv_indices=got.block_kv_indices[:, :4])
    (m,) = get_target(TARGET).compare(None, inputs, ref.reference(None, inputs), got)
    assert (m.check, m.where) == ("shape", "block_kv_indices")


def test_the_layout_may_be_dense_in_target_verify_only():
    target = get_target(TARGET)
    for phase, allowed in ((ref.TARGET_VERIFY, True), (ref.DRAFT_EXTEND, False)):
        inputs = hand_inputs(phase, None)
        got = dataclasses.replace(
            kernels.mla_block_table(inputs), cu_seqlens_q=None, seq_lens_q=None, max_seq_len_q=None
        )
        found = target.compare(None, inputs, ref.reference(None, inputs), got)
        assert (found == []) is allowed, phase


def test_table_rows_hold_distinct_page_aligned_slots_and_accepts_lie_in_one_to_n():
    c = case(0, page_log2=1, computed=(3, 0, 5, 9))
    inputs = ref.make_inputs(c)
    table = inputs.req_to_token.numpy()
    assert not table[ref.PAD_ROW].any()
    assert inputs.req_to_token.shape[1] == 16 + 2  # max_model_len + N
    pages = []
    for row, kv in zip(inputs.req_pool_indices, ref.kv_lens_of(c), strict=True):
        slots = table[int(row), :kv]
        assert (slots % 2 == torch.arange(kv).numpy() % 2).all()
        pages += sorted(set((slots // 2).tolist()))
    assert len(set(pages)) == len(pages) and 0 not in pages
    assert all(1 <= a <= 2 for a in inputs.accept_lens.tolist())
