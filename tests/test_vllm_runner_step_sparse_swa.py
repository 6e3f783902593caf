"""vLLM 0.33.0's model runner V1 step of DeepSeek-V4's sliding-window cache on the sparse
SWA backend, as the implementation ``vllm-v1-sparse-swa`` of ``runner-step``:
``DeepseekSparseSWAMetadataBuilder`` builds every step, each token's window, the
prefills' gather lengths and the graph's padding rows judged by the step's properties; a
mutant of the window's clamp seen failing."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def sparse_swa():
    from attnfuzz.adapters.vllm import runner_step_sparse_swa

    return runner_step_sparse_swa


def spec_decode() -> Trace:
    """``smallest_full_spec_decode`` at pages of 32 (the backend's smallest)."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    return Trace(dataclasses.replace(trace.config, block_size=32), trace.steps)


def test_each_token_reads_its_window_and_a_padding_token_none(monkeypatch):
    """A prefill of 5 tokens, then a verify of 2 padded to the FULL graph of 4 tokens:
    each token's window is its causal extent through the request's page (slots 32 on),
    the graph's padding tokens are invalid, read nothing (their rows -1) and map to
    request 0; the builder runs in every build and in the capture runs; every property
    holds."""
    m = sparse_swa()
    m.prepare()
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(DeepseekSparseSWAMetadataBuilder, "build", "build_tile_scheduler")
    first, second = run_trace(spec_decode(), m.SparseSWARunnerStepEngine())
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "swa.lens") == [1, 2, 3, 4, 5]
    assert values(prefill, "swa.prefill.gather_lens") == [5]
    assert values(prefill, "kv_len") == [5]
    (eager,) = own(second, "eager")
    assert values(eager, "swa.lens") == [6, 7]
    assert values(eager, "swa.indices")[1][:8] == [32, 33, 34, 35, 36, 37, 38, -1]
    assert values(eager, "swa.tile_sched_fresh") == [1, 1]
    (replay,) = own(second, "replay")
    assert values(replay, "swa.lens") == [6, 7, 0, 0]
    assert values(replay, "swa.is_valid_token") == [1, 1, 0, 0]
    assert values(replay, "swa.token_to_req_indices") == [0, 0, 0, 0]
    assert set(values(replay, "swa.indices")[2]) == {-1}
    assert values(replay, "kv_len") == [7, 0]


def test_a_window_past_its_start_is_clamped_and_a_decode_after_a_prefill_prefills():
    """A request prefills 66 tokens, then a chunk of 10 more beside a decode, then both
    decode in a FULL graph of 4 tokens. Each token's window is its last 64 positions,
    the chunk's gather its query and the 63 positions before it; the builder asks for
    no reordering, so the decode after the chunk is a prefill of one token."""
    m = sparse_swa()
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
    assert values(chunk, "swa.lens") == [64] * 10 + [4]
    # The chunk's last token, at position 75, reads positions 12 to 75: slot 32 + 12 on.
    assert values(chunk, "swa.indices")[9][:2] == [44, 45]
    assert values(chunk, "swa.prefill.gather_lens") == [73, 4]
    assert values(chunk, "swa.prefill.gather_start") == [3, 0]
    assert values(chunk, "kv_len") == [73, 4]
    (replay,) = own(outs[2], "replay")
    assert values(replay, "swa.lens") == [64, 5, 0, 0]
    assert values(replay, "kv_len") == [64, 5, 0, 0]


def test_a_window_left_unclamped_reads_past_its_row():
    """The mutant ``vllm-v1-sparse-swa-window-unclamped`` on its smallest trace: the
    prefill's last token (position 64) has 65 keys where its row holds 64; the real
    builder's is 64; nothing else fails."""
    m = sparse_swa()
    trace = m.smallest_past_window()
    assert m.trigger_past_window(trace) and m.reach_swa(trace)
    (good,) = run_trace(trace, m.run)
    assert ref.violations(good) == []
    (eager,) = own(good, "eager")
    assert values(eager, "swa.lens")[-2:] == [64, 64]
    (bad,) = run_trace(trace, m.window_unclamped)
    (eager,) = own(bad, "eager")
    assert values(eager, "swa.lens")[-2:] == [64, 65]
    failing = ref.violations(bad)
    assert {(v.prop, v.field) for v in failing} == {("safe padding", "swa.lens")}


def test_the_drafter_s_later_sub_steps_keep_its_first_pass_s_request_map():
    """Two requests prefill 2 tokens each, two drafts: the drafter's first pass maps its
    tokens ``[0, 0, 1, 1]`` as its offsets place them; its second sub-step (one token a
    request, offsets ``[0, 1, 2]``) is handed ``[0, 0]``, so request 1's draft token
    reads request 0's window (slots 32 to 35 of page 1, not 64 to 66 of its page 2).
    The kept-apart implementation says so; ``vllm-v1-sparse-swa`` leaves that map of the
    later sub-steps unjudged."""
    m = sparse_swa()
    m.prepare()
    trace = m.smallest_draft_requests_stale()
    (main,) = run_trace(trace, m.SparseSWARunnerStepEngine())
    assert ref.violations(main) == []
    (kept,) = run_trace(trace, m.draft_requests_stale)
    found = ref.violations(kept)
    assert {(v.prop, v.field) for v in found} == {
        ("agreement within a build", "swa.token_to_req_indices")
    }
    assert {v.build for v in found} == {"eager.draft1", "padded.draft1", "fresh.draft1"}
    builds = {b.name: b for b in kept.builds}
    assert values(builds["eager.draft0"], "swa.token_to_req_indices") == [0, 0, 1, 1]
    later = builds["eager.draft1"]
    assert values(later, "swa.token_request") == [0, 1]
    assert values(later, "swa.token_to_req_indices") == [0, 0]
    assert later.field("swa.indices").values[1][:4].tolist() == [32, 33, 34, 35]
    assert values(later, "swa.slot_mapping") == [34, 66]


def test_a_request_map_against_its_offsets_fails_on_a_mutated_map(monkeypatch):
    """The agreement judges the map wherever it is wrong, not only in drafts: a build
    that hands every token to request 0 fails it on the target's own step."""
    m = sparse_swa()
    m.prepare()
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadataBuilder

    original = DeepseekSparseSWAMetadataBuilder.build

    def build(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        meta.token_to_req_indices.zero_()
        return meta

    monkeypatch.setattr(DeepseekSparseSWAMetadataBuilder, "build", build)
    trace = m.smallest_draft_requests_stale()
    trace = Trace(dataclasses.replace(trace.config, num_spec=0), trace.steps)
    (out,) = run_trace(trace, m.SparseSWARunnerStepEngine())
    assert ("agreement within a build", "swa.token_to_req_indices", "eager") in {
        (v.prop, v.field, v.build) for v in ref.violations(out)
    }
