"""vLLM 0.33.0's model runner V1 step on the FlashInfer backend as on an sm80 GPU (native
FlashInfer wrappers), as the implementation ``vllm-v1-flashinfer`` of ``runner-step``:
``FlashInferMetadataBuilder`` builds every step and plans its wrappers, a decode wrapper
for each FULL graph, judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def fi():
    from attnfuzz.adapters.vllm import runner_step_flashinfer

    return runner_step_flashinfer


def smallest_full_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_decode()


def smallest_full_spec_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_the_flashinfer_builder_plans_a_decode_padded_for_a_full_graph(monkeypatch):
    """The runner's ``_build_attention_metadata`` calls ``FlashInferMetadataBuilder`` on
    every step and in the capture runs: a prefill on the prefill wrapper, then a
    one-token decode padded to the FULL graph of 2 requests on that graph's decode
    wrapper (the padding row of no pages, its last page length 0), replayed; built
    afresh; the correct engine holds every property."""
    m = fi()
    m.prepare()
    from vllm.v1.attention.backends.flashinfer import FlashInferMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(
        FlashInferMetadataBuilder,
        "build",
        "build_for_cudagraph_capture",
        "_compute_flashinfer_kv_metadata",
    )
    engine = m.FlashInferRunnerStepEngine()
    first, second = run_trace(smallest_full_decode(), engine)
    assert min(calls.values()) > 0 and len(calls) == 3
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert isinstance(builder, FlashInferMetadataBuilder)
    assert builder.enable_cuda_graph and not builder.use_trtllm_decode_attention
    assert builder.use_fa2_native_decode
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "fi.decode") == [0]
    assert values(prefill, "fi.query_len") == [3]
    assert values(prefill, "kv_len") == [3]
    (eager,) = own(second, "eager")
    (padded,) = own(second, "padded")
    (replay,) = own(second, "replay")
    (fresh,) = own(second, "fresh")
    assert values(eager, "kv_len") == values(fresh, "kv_len") == [4]
    assert values(padded, "fi.paged_kv_indptr") == values(replay, "fi.paged_kv_indptr") == [0, 1, 1]
    assert values(replay, "fi.paged_kv_last_page_len") == [4, 0]
    assert values(replay, "fi.decode") == [1, 1]
    assert values(replay, "kv_len") == [4, 0]
    assert (2, 1) in builder._decode_wrappers_cudagraph


def test_a_mixed_step_plans_both_wrappers():
    """A decode beside a 12-token chunk of a prompt: the decode on the decode wrapper,
    the chunk on the prefill wrapper, whose paged indptr continues the decode's into
    the indices both read."""
    m = fi()
    config = dataclasses.replace(smallest_full_spec_decode().config, num_spec=0)
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3, 5), (1, 12), req_ids=(0, 1), pages=((1,), (2, 3)), new_pages=(0, 1)),
    )
    first, second = run_trace(Trace(config, steps), m.run)
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    assert values(eager, "fi.decode") == [1, 0]
    assert values(eager, "fi.query_len") == [1, 12]
    assert values(eager, "fi.paged_kv_indptr") == [0, 1, 3]
    assert values(eager, "kv_len") == [4, 17]


def test_a_speculative_step_plans_the_decode_per_request():
    """fa2 native decode takes a uniform speculative decode (``q_len_per_req``); the
    drafter's builds are FlashInfer's too; every property holds."""
    m = fi()
    trace = smallest_full_spec_decode()
    outs = run_trace(trace, m.run)
    assert all(ref.violations(out) == [] for out in outs)
    last = outs[-1]
    (eager,) = own(last, "eager")
    assert set(values(eager, "fi.query_len")) == {1 + trace.config.num_spec}
    assert any(b.draft is not None and b.field("fi.paged_kv_indptr") for b in last.builds)


@pytest.mark.parametrize("block_size", [8, 24])
def test_declines_block_sizes_without_a_kernel(block_size):
    """``get_supported_kernel_block_sizes``: 16, 32 and 64 off the trtllm-gen path (a
    block of a multiple of one is split into kernel blocks)."""
    m = fi()
    case = smallest_full_decode().cases()[0]
    case = dataclasses.replace(case, config=dataclasses.replace(case.config, block_size=block_size))
    assert "get_supported_kernel_block_sizes" in (m.declines(case) or "")


def test_the_mutant_fails_its_smallest_trace():
    """``vllm-v1-flashinfer-last-page-len-on-host``: the FULL graph's decode wrapper reads
    the capture's last page lengths; padding invariance and replay equals eager catch it."""
    m = fi()
    trace = m.smallest_stale_last_page()
    assert m.trigger_stale_last_page(trace)
    outs = run_trace(trace, m.last_page_len_on_host)
    found = {(v.prop, v.field) for out in outs for v in ref.violations(out)}
    assert ("replay equals eager", "kv_len") in found
    assert ("padding invariance", "fi.paged_kv_last_page_len") in found


WARM_UP = "mixed_batch_attention_warmup"


def test_the_start_up_warm_up_is_a_mixed_batch_judged_as_a_capture_run():
    """``kernel_warmup``'s FlashInfer attention warm-up: before the capture each engine
    runs ``_dummy_run(create_mixed_batch=True)`` of 16 tokens (one decode beside one
    15-token prompt chunk under two requests), its build judged as a capture run's."""
    m = fi()
    first, _ = run_trace(smallest_full_decode(), m.run)
    warm = [b for b in first.of("capture") if WARM_UP in b.where]
    assert len(warm) == 3  # the graph, eager and fresh engines each start up
    for build in warm:
        assert values(build, "fi.decode") == [1, 0]
        assert values(build, "fi.query_len") == [1, 15]
        assert values(build, "kv_len") == [1, 16]
    assert ref.violations(first) == []


def test_a_warm_up_reading_a_page_past_the_pool_fails_safe_padding(monkeypatch):
    """The warm-up's requests read the block table's rows as the runner holds them: page
    ids past the pool left there (as a larger cache's would be) make its build read
    outside the KV cache, and safe padding says so, of that build alone."""
    m = fi()
    start = m.v1._Engine.warm_up

    def stale(engine):
        table = engine.runner.input_batch.block_table[0].block_table
        for held in (table.cpu, table.gpu):
            held.fill_(engine.pool_size() + 5)
        start(engine)
        for held in (table.cpu, table.gpu):
            held.zero_()  # the capture after it reads a clean table

    monkeypatch.setattr(m.v1._Engine, "warm_up", stale)
    first, _ = run_trace(smallest_full_decode(), m.run)
    found = ref.safe_padding(first)
    assert {(v.prop, v.field, v.build) for v in found} == {
        ("safe padding", "fi.paged_kv_indices", "capture")
    }
    # The warm-up's builds alone: the engine's other builds hold every property.
    others = tuple(b for b in first.builds if WARM_UP not in b.where)
    assert ref.violations(dataclasses.replace(first, builds=others)) == []


def test_a_warm_up_past_the_builder_s_page_indices_is_kept_apart_and_fails():
    """``_dummy_run``'s mixed batch gives its prefill one key more than its tokens: with
    one request (no decodes) and 16 tokens of a 16-token model in pages of 16, 17 keys,
    2 pages, where ``FlashInferMetadataBuilder`` sized its page-index buffer for
    ``max_num_seqs * cdiv(max_model_len, 16)`` = 1. The engine's start-up then hands
    FlashInfer's plan an indptr past the indices it gives (the stand-in refuses it).
    ``vllm-v1-flashinfer`` declines such configs, naming the entry that keeps them
    apart, which fails its smallest trace; the others warm up (a row of vLLM's reaches
    128 tokens: the row is not what overflows)."""
    from attnfuzz.adapters.vllm import plugin  # noqa: F401 - the entries, registered
    from attnfuzz.harness.registry import get_target

    m = fi()
    base = smallest_full_decode().config
    past = dataclasses.replace(base, max_model_len=16, max_num_seqs=1, block_size=16)
    assert m.warm_up_pages(past) == (2, 1)
    assert "vllm-v1-flashinfer-warmup-page-indices" in (m.declines_config(past) or "")
    assert m.declines_config(past, warm_up=False) is None
    assert m.warm_up_past_page_indices(dataclasses.replace(past, max_num_seqs=2)) is None
    # A decode of one key, a prefill of 15 tokens and 16 keys: a page each, of 2.
    assert m.warm_up_pages(dataclasses.replace(past, max_num_seqs=2)) == (2, 2)
    assert m.warm_up_past_page_indices(dataclasses.replace(past, block_size=32)) is None
    assert m.warm_up_past_page_indices(base) is None
    m.prepare()
    from attnfuzz.adapters.sglang.flashinfer_stand_in import PlanContractError

    with pytest.raises(PlanContractError, match="indptr reaches 2, past the 1 entries"):
        m.FlashInferRunnerStepEngine().engine(past, torch.device("cpu"), past.cudagraph_mode)
    witness = m.smallest_warm_up_page_indices()
    case = witness.cases()[0]
    target = get_target("runner-step")
    assert target.unreachable(target.resolve("vllm-v1-flashinfer"), case) is None
    assert target.resolve("vllm-v1-flashinfer").declines(case)
    kept = target.resolve("vllm-v1-flashinfer-warmup-page-indices")
    assert kept.declines(case) is None and kept.trigger(witness)
    verdict = target.judge_trace(kept, witness)
    assert not verdict.ok and "indptr reaches 2" in str(verdict)
