"""vLLM 0.33.0's model runner V1 step of an MLA model, as the implementation
``vllm-v1-mla`` of ``runner-step``: the Triton MLA backend's ``MLACommonMetadataBuilder``
builds every step, its metadata judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def mla():
    from attnfuzz.adapters.vllm import runner_step_mla

    return runner_step_mla


def hybrid():
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid


def test_the_mla_builder_builds_a_decode_padded_for_a_full_graph(monkeypatch):
    """The runner's own ``_build_attention_metadata`` calls the Triton MLA backend's
    builder (``MLACommonMetadataBuilder``) on every step and in the capture runs: a
    prefill, then a one-token decode padded to the FULL graph of 2 requests, whose
    padding row is a decode of no key (seq_len 0, the null page), replayed and built
    afresh; the correct engine holds every property."""
    m = mla()
    m.prepare()
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(MLACommonMetadataBuilder, "build", "build_for_cudagraph_capture")
    engine = m.MLARunnerStepEngine()
    first, second = run_trace(m.smallest_full_decode(), engine)
    assert calls["build"] > 0 and calls["build_for_cudagraph_capture"] > 0
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert isinstance(builder, MLACommonMetadataBuilder)
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "mla.prefill.query_start_loc") == [0, 3]
    assert prefill.field("mla.decode.seq_lens") is None  # a prefill alone: no decode
    (eager,) = own(second, "eager")
    (padded,) = own(second, "padded")
    (replay,) = own(second, "replay")
    (fresh,) = own(second, "fresh")
    assert values(eager, "mla.decode.seq_lens") == values(fresh, "mla.decode.seq_lens") == [4]
    assert values(padded, "mla.decode.seq_lens") == values(replay, "mla.decode.seq_lens") == [4, 0]
    table = values(padded, "mla.decode.block_table")
    assert [row[0] for row in table] == [1, 0]
    assert padded.field("mla.prefill.query_start_loc") is None
    captured = [b for b in first.builds if b.how == "capture"]
    assert any(b.field("mla.decode.seq_lens") is not None for b in captured)


def test_a_mixed_step_splits_decodes_from_a_chunked_prefill():
    """With one draft (reorder threshold 2), a 2-token decode stays a decode beside a
    12-token chunk of a prompt of 5 computed tokens, a prefill whose context is
    gathered from the cache in one chunk (``build_mla_chunked_context_metadata``)."""
    m = mla()
    config = hybrid().smallest_full_spec_decode().config
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3, 5), (2, 12), req_ids=(0, 1), pages=((1,), (2, 3)), new_pages=(0, 1)),
    )
    _, out = run_trace(Trace(config, steps), m.run)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    assert values(eager, "mla.decode.seq_lens") == [5]
    assert values(eager, "mla.decode.block_table")[0][:1] == [1]
    assert values(eager, "mla.prefill.query_start_loc") == [0, 12]
    assert values(eager, "mla.prefill.context_lens") == [5]
    assert values(eager, "mla.prefill.block_table")[0][:2] == [2, 3]
    assert values(eager, "mla.prefill.chunk0.cu_seq_lens") == [0, 5]
    assert values(eager, "mla.prefill.chunk0.starts") == [0]
    assert values(eager, "mla.prefill.chunk0.token_to_seq") == [0] * 5
    assert values(eager, "mla.prefill.chunk0.query_start_loc") == [0, 12]


def test_a_speculative_decode_is_one_multi_token_decode_in_a_full_graph():
    """``TritonMLAMetadataBuilder``'s ``QueryLenSupport.UNIFORM``: with one draft a
    2-token query is a decode, padded to the FULL graph of 4 tokens (2 requests), the
    drafter's sub-step built by the same builder."""
    m = mla()
    _, out = run_trace(hybrid().smallest_full_spec_decode(), m.run)
    assert ref.violations(out) == []
    (padded,) = own(out, "padded")
    (replay,) = own(out, "replay")
    assert values(padded, "mla.decode.seq_lens") == values(replay, "mla.decode.seq_lens") == [7, 0]
    drafts = [b for b in out.of("eager") if b.draft is not None]
    assert drafts and all(b.field("mla.decode.seq_lens") is not None for b in drafts)


def test_the_mutant_fails_replay_equals_eager_on_its_smallest_trace():
    """The correct engine holds every property on the trace; the mutant's decode
    seq_lens, a copy, leave the FULL graph replaying the capture's lengths (and the
    keys derived from them, ``kv_len`` and ``kv_slots``)."""
    m = mla()
    trace = m.smallest_full_decode
    assert all(ref.violations(out) == [] for out in run_trace(trace(), m.MLARunnerStepEngine()))
    *_, out = run_trace(trace(), m.decode_seq_lens_copied)
    found = ref.violations(out)
    assert {(v.prop, v.field, v.build) for v in found} == {
        ("replay equals eager", "mla.decode.seq_lens", "replay"),
        ("replay equals eager", "kv_len", "replay"),
        ("replay equals eager", "kv_slots", "replay"),
    }


@pytest.mark.parametrize(("block_size", "declined"), [(8, True), (24, True), (32, False)])
def test_declines_page_sizes_the_triton_mla_backend_has_no_kernel_for(block_size, declined):
    """``TritonMLABackend.get_supported_kernel_block_sizes``: multiples of 16."""
    m = mla()
    smallest = m.smallest_full_decode()
    config = dataclasses.replace(smallest.config, block_size=block_size)
    case = next(iter(Trace(config, smallest.steps).cases()))
    assert (m.declines(case) is not None) == declined


def test_each_engine_reserves_its_scratch_in_a_workspace_manager_of_its_own():
    """vLLM's workspace manager is process-wide (``vllm/v1/worker/workspace.py``), and
    the Triton MLA builder reserves its logits scratch there when it is made, growing
    the buffer after ``torch.accelerator.empty_cache()``, which raises with no
    accelerator. Another engine of the process (the indexer's) left a manager with a
    one-byte buffer: the engine is still made and runs, in a manager of its own that
    holds the builder's reservation, as a vLLM worker's would."""
    import torch

    m = mla()
    m.prepare()
    from vllm.v1.worker import workspace

    workspace.reset_workspace_manager()
    workspace.init_workspace_manager(torch.device("cpu"))
    left = workspace.current_workspace_manager()
    with pytest.MonkeyPatch.context() as patch:  # the other engine's own stand-in
        patch.setattr(torch.accelerator, "empty_cache", lambda: None)
        left.get_simultaneous(((1,), torch.uint8))
    engine = m.MLARunnerStepEngine()
    first, second = run_trace(m.smallest_full_decode(), engine)
    assert ref.violations(first) == [] and ref.violations(second) == []
    own = workspace.current_workspace_manager()
    assert own is not left
    assert own._workspace_size_bytes(own._current_workspaces[0]) > 1  # the reservation
