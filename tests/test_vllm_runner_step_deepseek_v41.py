"""vLLM 0.33.0's model runner V1 step of DeepSeek-V4.1's attention layers, as the
implementation ``vllm-v1-deepseek-v41`` of ``runner-step``: the compressed-MLA, sparse
indexer, SWA and compressor builders run on every build and capture, each field their
consumers read judged by the step's properties; a mutant of the sparse indexer's
prefill rows seen failing."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def deepseek_v41():
    from attnfuzz.adapters.vllm import runner_step_deepseek_v41

    return runner_step_deepseek_v41


def spec_decode() -> Trace:
    """``smallest_full_spec_decode`` at pages of 32 (the SWA cache's)."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    return Trace(dataclasses.replace(trace.config, block_size=32), trace.steps)


def test_every_builder_runs_and_a_padding_token_writes_nothing(monkeypatch):
    """A prefill of 5 tokens, then a verify of 2 padded to the FULL graph of 4 tokens:
    every DeepSeek-V4.1 builder runs in every build and capture; the compressed slots
    are each group's last token's (ratio 2: every other token), the ring's a row of the
    request's block (its first page, 1: slots 8 on); a padding token writes no
    compressed row; every property holds."""
    m = deepseek_v41()
    m.prepare()
    from vllm.models.deepseek_v41.compressor import CompressorMetadataBuilder
    from vllm.models.deepseek_v41.sparse_mla import (
        DeepseekV4SparseMLAMetadataBuilder,
        DeepseekV41SparseSWAMetadataBuilder,
    )
    from vllm.v1.attention.backends.mla.sparse_indexer import (
        DeepseekV41SparseIndexerMetadataBuilder,
    )

    builders = (
        DeepseekV4SparseMLAMetadataBuilder, DeepseekV41SparseIndexerMetadataBuilder,
        DeepseekV41SparseSWAMetadataBuilder, CompressorMetadataBuilder,
    )  # fmt: skip
    calls = {cls.__name__: Calls(monkeypatch) for cls in builders}
    for cls in builders:
        calls[cls.__name__].count(cls, "build")
    first, second = run_trace(spec_decode(), m.DeepseekV41RunnerStepEngine())
    assert all(c["build"] > 0 for c in calls.values())
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "mla2.slot_mapping") == [-1, 64, -1, 65, -1]
    assert values(prefill, "mla1.slot_mapping") == [128, 129, 130, 131, 132]
    assert values(prefill, "ring.slot_mapping") == [8, 9, 10, 11, 12]
    (replay,) = own(second, "replay")
    assert values(replay, "mla2.slot_mapping") == [66, -1, -1, -1]
    assert values(replay, "ring.token_to_req_indices") == [0, 0, 0, 0]
    assert values(replay, "swa.lens") == [6, 7, 0, 0]


def test_the_indexers_read_compressed_contexts_past_index_topk():
    """A request prefills 66 tokens, then a chunk of 10 more beside a decode, then both
    decode in a FULL graph of 4 tokens: past ``index_topk`` compressed keys the
    indexers run; each decode row's context is its tokens over the ratio, each prefill
    token's K range its own request's gathered keys (76 at ratio 1, 38 at ratio 2)."""
    m = deepseek_v41()
    config = dataclasses.replace(
        spec_decode().config, num_spec=0, max_model_len=96, max_num_batched_tokens=80,
        cudagraph_capture_sizes=(4,),
    )  # fmt: skip
    pages = ((1, 2, 3), (4,))
    steps = (
        Batch((0, 0), (66, 3), req_ids=(0, 1), pages=pages, new_pages=(3, 1),
              prompt_lens=(76, 3)),
        Batch((66, 3), (10, 1), req_ids=(0, 1), pages=pages, new_pages=(0, 0),
              prompt_lens=(76, 3)),
        Batch((76, 4), (1, 1), req_ids=(0, 1), pages=pages, new_pages=(0, 0)),
    )  # fmt: skip
    outs = run_trace(Trace(config, steps), m.run)
    assert all(ref.violations(out) == [] for out in outs)
    (chunk,) = own(outs[1], "eager")
    assert values(chunk, "idx1.prefill.gather_lens") == [0, 76]
    assert values(chunk, "idx2.prefill.gather_lens") == [0, 38]
    assert values(chunk, "idx2.sparse.prefill.ke")[1:] == [33, 34, 34, 35, 35, 36, 36, 37, 37, 38]
    assert values(chunk, "idx2.sparse.decode.row_ke") == [2]
    (replay,) = own(outs[2], "replay")
    assert values(replay, "idx1.decode.seq_lens") == [5, 77, 0, 0]
    assert values(replay, "idx2.sparse.decode.row_ke") == [2, 38, 0, 0]
    assert values(replay, "idx1.decode.schedule_stale") == [0] * 4


def test_prefill_rows_rebased_share_the_decode_rows_scratch():
    """The mutant ``vllm-v1-deepseek-v41-sparse-rows-shared`` on its smallest trace: the
    prefill chunk's scratch rows start at row 0, the decode row's; the real builder's
    start after it; nothing else fails."""
    m = deepseek_v41()
    trace = m.smallest_sparse_decodes_and_prefills()
    assert m.trigger_sparse_decodes_and_prefills(trace) and m.reach_v41(trace)
    (good,) = run_trace(trace, m.run)
    assert ref.violations(good) == []
    (eager,) = own(good, "eager")
    assert set(values(eager, "idx2.sparse.scratch_shared")) == {0}
    (bad,) = run_trace(trace, m.sparse_rows_shared)
    (eager,) = own(bad, "eager")
    assert set(values(eager, "idx2.sparse.scratch_shared")) == {1}
    failing = ref.violations(bad)
    assert {(v.prop, v.field) for v in failing} == {("safe padding", "idx2.sparse.scratch_shared")}


def test_a_full_capture_past_a_rows_reach_is_declined_as_the_dummy_past_row_family():
    """V1's mixed FULL captures give each dummy request the capture's token count as its
    seq_len, which the SWA builder keeps: a FULL engine with a size past a row's reach
    (rows of 128 tokens here) is declined; FULL_AND_PIECEWISE captures only uniform
    decodes FULL (their seq_len the decode's), so it runs."""
    m = deepseek_v41()
    config = dataclasses.replace(
        spec_decode().config,
        max_model_len=122,
        max_num_batched_tokens=256,
        cudagraph_capture_sizes=(4, 232),
    )
    why = m.declines_config(dataclasses.replace(config, cudagraph_mode="FULL"))
    assert why is not None and "vllm-dummy-past-row" in why
    assert (
        m.declines_config(dataclasses.replace(config, cudagraph_mode="FULL_AND_PIECEWISE")) is None
    )
    assert m.declines_config(dataclasses.replace(config, cudagraph_capture_sizes=(4, 128))) is None


def _decodes_after_prompts(config) -> Trace:
    """Two requests prefill prompts of 4 and 6 tokens, then decode one token each."""
    prompts = Batch(
        (0, 0), (4, 6), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1), prompt_lens=(4, 6)
    )
    decodes = Batch((4, 6), (1, 1), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 0))
    return Trace(config, (prompts, decodes))


def test_which_steps_a_full_mixed_graph_replays_with_its_captures_split():
    """The rule the engine's entry declines by, on sizes alone: a step of mode FULL is
    replayed right only where its real tokens are decodes, and decodes in the capture
    too (``_dummy_run``'s ``min(P, max_num_seqs)`` requests)."""
    m = deepseek_v41()
    witness = m.smallest_full_split()
    (step,) = witness.steps
    assert m.full_split_differs(witness.config, step)  # a prefill in a capture of decodes
    for mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE"):
        assert not m.full_split_differs(
            dataclasses.replace(witness.config, cudagraph_mode=mode), step
        )
    config = dataclasses.replace(
        witness.config, max_model_len=64, max_num_seqs=2, max_num_batched_tokens=16
    )
    on_decodes = _decodes_after_prompts(dataclasses.replace(config, cudagraph_capture_sizes=(2,)))
    on_prefills = _decodes_after_prompts(dataclasses.replace(config, cudagraph_capture_sizes=(4,)))
    assert not m.full_split_differs(on_decodes.config, on_decodes.steps[1])
    assert m.full_split_differs(on_prefills.config, on_prefills.steps[1])  # [2, 2] captured
    case = witness.cases()[0]
    assert "full-split-captured" in m.declines(case) and m.declines_engine(case) is None


def _kept_apart_checks(trace: Trace) -> set[str]:
    """``vllm-v1-deepseek-v41`` declines ``trace`` as the kept-apart finding's; the
    checks its entry, ``vllm-v1-deepseek-v41-full-split-captured``, fails."""
    from attnfuzz.harness.errors import InvalidCase
    from attnfuzz.harness.registry import get_target

    target = get_target("runner-step")
    with pytest.raises(InvalidCase, match="full-split-captured"):
        target.judge_trace(target.resolve("vllm-v1-deepseek-v41"), trace)
    verdict = target.judge_trace(target.resolve("vllm-v1-deepseek-v41-full-split-captured"), trace)
    return {x.check for x in verdict.mismatches}


def _decodes_beside_an_idle_rank() -> Trace:
    """Seed 1's minimized case of ``vllm-v1-deepseek-v41``: three requests verify one
    draft each (6 tokens); graphs of 2, 4, 6, 8 and 12 tokens, ``max_num_seqs`` 4."""
    config = dataclasses.replace(
        deepseek_v41().smallest_full_split().config, max_model_len=159, max_num_seqs=4,
        max_num_batched_tokens=179, num_spec=1, cudagraph_capture_sizes=(2, 4, 6, 8, 12),
    )  # fmt: skip
    step = Batch(
        (95, 147, 72), (2, 2, 2), seed=2007, req_ids=(3, 4, 5),
        pages=((6, 7, 8, 5), (1, 2, 9, 10, 3), (11, 12, 4)), new_pages=(4, 5, 3),
        prompt_lens=(95, 147, 72),
    )  # fmt: skip
    return Trace(config, (step,))


def test_the_idle_ranks_dummy_run_replays_a_capture_holding_a_prefill():
    """The rule covers the idle rank's dummy run beside a peer that runs the step: one
    request of 2 tokens padded across the ranks to the peer's 6, whose FULL graph was
    captured on requests of 1, 1, 1 and 3 tokens. The replay runs the prefill path on a
    padding row, whose gather length (6) no build of the dummy run wrote: it would
    gather from position -6. The step's own graph (8 tokens, captured on four decodes)
    is replayed right."""
    m = deepseek_v41()
    trace = _decodes_beside_an_idle_rank()
    (step,) = trace.steps
    assert m.full_split_differs(trace.config, step) and m.trigger_full_split(trace)
    (out,) = run_trace(trace, m.run)
    failing = ref.violations(out)
    assert {(v.prop, v.build) for v in failing} == {("safe padding", "dummy")}
    assert "swa.prefill.gather_start" in {v.field for v in failing}
    assert _kept_apart_checks(trace) == {"safe-padding"}


def test_a_full_mixed_graph_replays_the_split_it_was_captured_with():
    """vLLM 0.33.0's own finding (``vllm-v1-deepseek-v41-full-split-captured``): its
    witness, a prompt of 2 tokens replayed in a FULL graph captured on two one-token
    requests, reads decode rows the step's build did not write (eager lengths 1 and 2,
    replayed 0); replay equals eager alone fails, on the replay. ``vllm-v1-deepseek-v41``
    declines the step, so its searches judge the rest."""
    m = deepseek_v41()
    trace = m.smallest_full_split()
    assert m.trigger_full_split(trace) and m.reach_full_mixed(trace)
    (out,) = run_trace(trace, m.run)
    (eager,) = own(out, "eager")
    (replay,) = own(out, "replay")
    assert values(eager, "swa.lens") == [1, 2]
    assert values(replay, "swa.lens")[:2] == [0, 0]
    failing = ref.violations(out)
    assert {(v.prop, v.build) for v in failing} == {("replay equals eager", "replay")}
    assert "swa.lens" in {v.field for v in failing}
    assert _kept_apart_checks(trace) == {"replay-equals-eager"}


def test_decodes_fail_in_a_full_graph_captured_on_prefills_and_pass_on_decodes():
    """The rule's other half, on the engine: two one-token decodes replayed in a FULL
    graph of 4 tokens captured on two requests of 2 tokens (prefills at ``next_n`` 1)
    fail replay equals eager; in a graph of 2 captured on two decodes every property
    holds."""
    m = deepseek_v41()
    config = dataclasses.replace(
        m.smallest_full_split().config, max_model_len=64, max_num_seqs=2,
        max_num_batched_tokens=16,
    )  # fmt: skip
    _, bad = run_trace(
        _decodes_after_prompts(dataclasses.replace(config, cudagraph_capture_sizes=(4,))), m.run
    )
    assert "replay equals eager" in {v.prop for v in ref.violations(bad)}
    _, good = run_trace(
        _decodes_after_prompts(dataclasses.replace(config, cudagraph_capture_sizes=(2,))), m.run
    )
    assert own(good, "replay") and ref.violations(good) == []


def _one_request_chunk(tokens: int, keys: int, prefill: int) -> tuple:
    """A prefill chunk of one request, its first ``tokens`` tokens each scoring the
    request's ``keys`` gathered rows, and indexer metadata of ``prefill`` prefill tokens
    holding it (what ``_freeze_indexer`` keeps of them)."""
    chunk = SimpleNamespace(
        start=0, end=tokens, ks=np.zeros(tokens, dtype=np.int64), ke=np.full(tokens, keys),
        cu=np.array([0, keys]), block_table=np.array([[1]]), num_reqs=1, skip=False, rows=keys,
    )  # fmt: skip
    return chunk, SimpleNamespace(num_decode_tokens=0, num_prefill_tokens=prefill, chunks=[chunk])


def test_a_replayed_chunk_whose_requests_are_not_the_steps_is_judged_not_a_crash():
    """A replay's prefill chunks are its capture's, its ``token_to_req`` the step's: a
    token whose request is none of its chunk's has no K rows there, which the fields
    say (-1, out of range) rather than indexing past the chunk's offsets."""
    m = deepseek_v41()
    _, f = _one_request_chunk(tokens=4, keys=4, prefill=4)
    keyless = np.zeros(4, dtype=bool)
    fields = m._chunk_fields(f, "idx1", np.array([0, 0, 1, 1]), keyless, (1, 4), 8, 4, 128)
    by_name = {x.name: x.values.tolist() for x in fields}
    assert by_name["idx1.prefill.k_before_request"] == [0, 0, -1, -1]
    assert by_name["idx1.prefill.k_past_request"] == [0, 0, -1, -1]


def test_a_prefill_token_with_no_compressed_key_may_be_in_no_chunk():
    """vLLM makes no indexer chunk of requests with no compressed key
    (``build_prefill_chunk_metadata``: "Skip when total_seq_lens is 0") and the indexer
    fills every token's top-k with -1 first (``SparseMQAIndexer.forward``): a token of a
    one-token request at ratio 2 in no chunk is covered as its consumer needs; a token
    with keys in no chunk, or a token in two, is not. Seed 0's search met the first on
    a step whose last request holds one token (its chunk skipped)."""
    m = deepseek_v41()
    chunk, f = _one_request_chunk(tokens=2, keys=1, prefill=3)
    token_to_req = np.array([0, 0, 1])
    keyless = m._keyless(token_to_req, np.array([3, 1]) // 2, 3)
    assert keyless.tolist() == [False, False, True]

    def cover(keyless, chunks):
        f.chunks = chunks
        fields = m._chunk_fields(f, "idx2", token_to_req, keyless, (2, 3), 8, 4, 64)
        return {x.name: x.values.tolist() for x in fields}["idx2.prefill.cover"]

    assert cover(keyless, [chunk]) == [0, 0, 0]
    assert cover(np.zeros(3, dtype=bool), [chunk]) == [0, 0, -1]  # a keyed token in none
    assert cover(keyless, [chunk, chunk]) == [1, 1, 0]  # tokens in two chunks
