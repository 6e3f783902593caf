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


# -- SGLang's limits (adapters/sglang/limits.py): no SGLang needed to read them -----------------

SGLANG_IMPLS = (
    "sglang-trtllm-mla",
    "upstream-pr21987-accept-length-layout",
    "sglang-trtllm-mla-context-len",
)


def sglang_case(phase: int, prefix: int, N: int, page_log2: int = 5, seed: int = 0) -> Case:
    """One request of a 4096-token context verifying ``prefix`` committed tokens
    with ``N`` query rows, in the graph of one request."""
    config = spec_config(max_model_len=4096, num_spec=N - 1, cudagraph_capture_sizes=(N,))
    params = (("mla_page_log2", page_log2), ("mla_phase", phase))
    return Case(config, Batch((prefix - 1,), (1,), seed=seed), params)


def first_seed(N: int, accept: int) -> int:
    """The first batch seed whose one request's accept count is ``accept``."""
    return next(s for s in range(64) if ref.accept_counts(sglang_case(0, 8, N, seed=s)) == [accept])


@pytest.mark.parametrize(
    ("phase", "prefix", "N", "accept", "admitted"),
    [
        (0, 4093, 2, 1, True),  # context_len - 4 + S: the longest a verify reaches
        (0, 4094, 2, 1, False),
        (0, 4094, 2, 2, True),  # KV 4096: N = 2 never crosses the context
        (0, 4095, 2, 2, False),  # the unreachable witness seed 1 once minimized to
        (0, 4094, 3, 2, True),  # KV 4097: the smallest crossing, S = 2 (seed 2)
        (0, 4095, 3, 2, False),
        (0, 4095, 3, 3, True),
        (1, 4095, 3, 1, True),  # draft extend: S is the step before's, up to N
        (1, 4096, 3, 3, False),
    ],
)
def test_sglang_admits_a_prefix_up_to_the_schedulers_limit(phase, prefix, N, accept, admitted):
    from attnfuzz.adapters.sglang.limits import trtllm_mla_admits

    c = sglang_case(phase, prefix, N, seed=first_seed(N, accept))
    assert ref.accept_counts(c) == [accept]
    why = trtllm_mla_admits(ref.make_inputs(c))
    assert (why is None) is admitted, why
    if not admitted:
        assert f"prefix of {prefix} tokens" in why and "init_req_max_new_tokens" in why


@pytest.mark.parametrize("page_log2", [0, 1, 2, 3, 4, 5, 6])
def test_sglang_admits_trtllm_mlas_page_sizes_only(page_log2):
    from attnfuzz.adapters.sglang.limits import trtllm_mla_admits

    why = trtllm_mla_admits(ref.make_inputs(sglang_case(0, 8, 2, page_log2)))
    assert (why is None) is (page_log2 in (5, 6)), why
    if why is not None:
        assert why.startswith(f"page size {1 << page_log2}: ")
        assert "_mla_backend_page_constraints" in why


@pytest.mark.parametrize("name", SGLANG_IMPLS)
def test_sglangs_cases_are_drawn_inside_its_limits(name):
    """Every case drawn for an SGLang implementation lies inside SGLang's limits, read
    here from the limits themselves (not the declaration), with few draws rejected:
    Hypothesis' filter health check stays on."""
    from attnfuzz.adapters.sglang.limits import trtllm_mla_admits
    from hypothesis import HealthCheck, given, settings

    target = get_target(TARGET)
    impl = target.implementations[name]  # declared whether or not SGLang is installed
    slow = [HealthCheck.too_slow, HealthCheck.data_too_large]

    @settings(max_examples=150, database=None, deadline=None, derandomize=True,
              suppress_health_check=slow)  # fmt: skip
    @given(target.cases(impl=impl))
    def drawn(c):
        assert trtllm_mla_admits(ref.make_inputs(c)) is None

    drawn()


def test_sglangs_unreachable_witness_is_refused_not_judged():
    """4095 committed tokens verified with N = 2 drafts in pages of 1 token (what seed 1
    once minimized to) is no state SGLang reaches: refused in one line, naming why,
    whether SGLang is installed or not (the refusal comes before the engine runs)."""
    from attnfuzz.harness.errors import Unreachable

    target = get_target(TARGET)
    witness = sglang_case(0, 4095, 2, page_log2=0)
    assert t.trigger_kv_past_context(witness)  # KV 4097 in a graph sized for 4096
    for name in SGLANG_IMPLS:
        with pytest.raises(Unreachable) as err:
            target.judge(target.implementations[name], witness, "cpu")
        message = str(err.value)
        assert "\n" not in message and message.startswith("unreachable for sglang, not judged")
        assert message.endswith("only (arg_groups/overrides.py: _mla_backend_page_constraints)")
    in_pages = sglang_case(0, 4095, 2)  # in TRT-LLM's pages, still past the scheduler
    with pytest.raises(Unreachable, match="prefix of 4095 tokens, past 4094"):
        target.judge(target.implementations[SGLANG_IMPLS[2]], in_pages, "cpu")


def test_sglangs_smallest_cases_lie_inside_its_limits():
    from attnfuzz.adapters.sglang.limits import trtllm_mla_admits

    for c in (t.smallest_kv_past_context(), t.smallest_accept_length_layout_trtllm()):
        assert trtllm_mla_admits(ref.make_inputs(c)) is None
    smallest = t.smallest_kv_past_context()
    assert t.trigger_kv_past_context(smallest) and ref.kv_lens_of(smallest) == [4097]


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
