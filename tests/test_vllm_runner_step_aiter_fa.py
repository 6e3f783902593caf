"""vLLM 0.33.0's model runner V1 step on the ROCm AITER FlashAttention backend, as the
implementation ``vllm-v1-aiter-fa`` of ``runner-step``:
``AiterFlashAttentionMetadataBuilder`` builds every step, its decode/extend/prefill
split and the extends' chunked context, judged by the step's properties and, beside
Triton's, by agreement across backends."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def aiter():
    from attnfuzz.adapters.vllm import runner_step_aiter_fa

    return runner_step_aiter_fa


def backends():
    from attnfuzz.adapters.vllm import runner_step_backends

    return runner_step_backends


def spec_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def three_way() -> Trace:
    """A decode of 2 tokens (one draft), an extend of 11 on 10 cached (across a page) and a
    new prompt of 3, in one step: the builder's three sub-batches."""
    config = dataclasses.replace(
        spec_decode().config, cudagraph_mode="FULL", cudagraph_capture_sizes=(16,)
    )
    steps = (
        Batch((0, 0), (3, 10), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3, 10, 0), (2, 11, 3), req_ids=(0, 1, 2), pages=((1,), (2, 3), (4,)),
              new_pages=(0, 1, 1)),
    )  # fmt: skip
    return Trace(config, steps)


def test_the_aiter_builder_builds_every_step_capture_and_draft(monkeypatch):
    """The runner's own ``_build_attention_metadata`` calls the AITER builder on every
    step, in the capture runs and for the drafter's sub-steps: a prefill, then a decode
    of ``next_n = 2`` padded to the FULL decode graph of 2 requests and replayed (the
    padding row a request of no key); the correct engine holds every property."""
    m = aiter()
    m.prepare()
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(
        AiterFlashAttentionMetadataBuilder,
        "build",
        "build_for_cudagraph_capture",
        "build_for_drafting",
    )
    engine = m.AiterFARunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    assert min(calls.values()) > 0 and len(calls) == 3
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    (padded,) = own(second, "padded")
    (replay,) = own(second, "replay")
    assert values(eager, "aiter.seq_lens") == [7]
    assert values(eager, "aiter.decode.max_query_len") == [2]
    assert values(padded, "aiter.seq_lens") == values(replay, "aiter.seq_lens") == [7, 0]
    assert values(replay, "aiter.query_start_loc")[:2] == [0, 2]
    assert values(eager, "kv_len") == values(replay, "kv_len")[:1] == [7]
    assert eager.field("aiter.prefill.query_start_loc") is None


def test_a_step_of_decodes_extends_and_prefills_is_split_three_ways():
    """The batch reordered decode, extend, prefill; the extend's context gathered in one
    chunk (its 10 cached keys) before its 11 new ones; the prefill reads its own 3; the
    sub-batches' offsets rebased to their first token."""
    m = aiter()
    _, out = run_trace(three_way(), m.run)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    assert values(eager, "aiter.query_start_loc") == [0, 2, 13, 16]
    assert values(eager, "aiter.seq_lens") == [5, 21, 3]
    assert values(eager, "aiter.decode.max_query_len") == [2]
    assert values(eager, "aiter.extend.query_start_loc") == [0, 11]
    assert values(eager, "aiter.extend.max_seq_len") == [21]
    assert values(eager, "aiter.extend.chunk0.cu_seq_lens") == [0, 10]
    assert values(eager, "aiter.extend.chunk0.starts") == [0]
    assert values(eager, "aiter.extend.chunk0.token_to_batch") == [0] * 10
    assert values(eager, "aiter.prefill.query_start_loc") == [0, 3]
    assert values(eager, "aiter.prefill.max_query_len") == [3]
    # Every request reads its whole sequence: the extend 10 gathered + 11 of its own.
    assert values(eager, "kv_len") == [5, 21, 3]
    extend_slots = eager.field("kv_slots").values[1][:21].tolist()
    assert extend_slots == [2 * 16 + j for j in range(16)] + [3 * 16 + j for j in range(5)]


def test_a_decode_bound_below_a_query_is_unsafe(monkeypatch):
    """Safe padding holds ``aiter.decode.max_query_len`` to at least every decode's
    query: a builder that states 1 for a decode of 2 tokens fails it."""
    m = aiter()
    m.prepare()
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    original = AiterFlashAttentionMetadataBuilder.build

    def build(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        if meta.decode_metadata is not None:
            meta.decode_metadata.max_query_len = 1
        return meta

    monkeypatch.setattr(AiterFlashAttentionMetadataBuilder, "build", build)
    _, second = run_trace(spec_decode(), m.AiterFARunnerStepEngine())
    unsafe = [v for v in ref.violations(second) if v.prop == "safe padding"]
    assert unsafe and {v.field for v in unsafe} == {"aiter.decode.max_query_len"}


@pytest.mark.parametrize("how", ["correct", "mutant"])
def test_an_extend_counted_as_a_prefill_is_told_by_another_backend(how):
    """``vllm-v1-backends`` holds the AITER builder's KV read to Triton's: an extend
    whose context the two-way split never gathers reads 2 keys where Triton reads 3."""
    b = backends()
    b.prepare()
    trace = b.smallest_aiter_extend()
    assert b.reach_aiter_extend(trace)
    run = b.run if how == "correct" else b.run_aiter_fa_extends_as_prefills
    outs = run_trace(trace, run)
    found = [v for out in outs for v in ref.violations(out)]
    if how == "correct":
        assert found == []
    else:
        assert {(v.prop, v.field) for v in found} == {
            ("agreement across backends", "kv_len"),
            ("agreement across backends", "kv_slots"),
        }


def test_block_sizes_off_the_kernel_blocks_are_declined():
    """16 and 32 divide every multiple of 16; 8 none."""
    m = aiter()
    config = spec_decode().config
    assert m.declines_config(config) is None
    assert m.declines_config(dataclasses.replace(config, block_size=64)) is None
    assert "16 and 32" in m.declines_config(dataclasses.replace(config, block_size=8))


def test_a_page_of_64_is_two_kernel_blocks_of_32():
    """``prepare_kernel_block_sizes`` splits a page of 64 into the backend's kernel blocks
    of 32: the builder is handed a block table of kernel blocks (page 2 is blocks 4 and
    5), whose range and read entries are counted in those: a decode reads its 41 keys
    at slots 128 on."""
    m = aiter()
    config = dataclasses.replace(
        spec_decode().config, block_size=64, max_model_len=128, max_num_batched_tokens=64
    )
    steps = (
        Batch((0,), (40,), req_ids=(3,), pages=((2,),), new_pages=(1,)),
        Batch((40,), (2,), req_ids=(3,), pages=((2,),), new_pages=(0,)),
    )
    outs = run_trace(Trace(config, steps), m.run)
    assert [ref.violations(out) for out in outs] == [[], []]
    (eager,) = own(outs[1], "eager")
    table = eager.field("aiter.block_table")
    assert table.values[0][:2].tolist() == [4, 5]
    assert table.accepts == (0, 2 * m.num_blocks(config) - 1)
    assert values(eager, "kv_len") == [42]
    assert eager.field("kv_slots").values[0][:42].tolist() == list(range(128, 170))
