"""vLLM 0.33.0's CPU worker's model runner V1 step of DeepSeek-V4's sliding-window cache,
as the implementation ``vllm-v1-sparse-swa-cpu`` of ``runner-step``: the CPU platform's
``DeepseekV4CPUSparseSWAMetadataBuilder`` builds every step, the keys the CPU layer reads
held to the CUDA kernels' reading of the same metadata; the CPU builder's plans as they
ship seen failing every build; a mutant of the CPU reading seen failing."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def swa_cpu():
    from attnfuzz.adapters.vllm import runner_step_sparse_swa_cpu

    return runner_step_sparse_swa_cpu


def prefills_then_decodes(num_spec: int) -> Trace:
    """:func:`smallest_prefill_past_first_row`, then both requests decode ``1 + num_spec``
    tokens."""
    trace = swa_cpu().smallest_prefill_past_first_row()
    q = 1 + num_spec
    last = Batch((5, 3), (q, q), req_ids=(0, 1), pages=((1,), (3,)), new_pages=(0, 0))
    return Trace(dataclasses.replace(trace.config, num_spec=num_spec), (*trace.steps, last))


def test_the_cpu_builder_builds_and_the_cpu_layer_reads_the_keys_the_metadata_names(
    monkeypatch,
):
    """The CPU worker's runner builds every step by the CPU platform's builder: two
    prefills (5 and 3 tokens on pages 1 and 3 of 64), then a decode of each; the CPU
    layer's windows through each token's block-table row read the keys the CUDA reading
    names; every property holds."""
    m = swa_cpu()
    m.prepare()
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    builds = Calls(monkeypatch)
    builds.count(m._builder(), "build")
    engine = m.SparseSWACPURunnerStepEngine()
    outs = run_trace(prefills_then_decodes(0), engine)
    assert type(engine.eager.runner) is CPUModelRunner and builds["build"] >= 2
    assert [ref.violations(o) for o in outs] == [[], []]
    (prefills,) = own(outs[0], "eager")
    assert values(prefills, "cpu.kv_len") == values(prefills, "kv_len") == [5, 3]
    slots = prefills.field("cpu.kv_slots").values
    assert slots[0][:5].tolist() == [64, 65, 66, 67, 68]
    assert slots[1][:3].tolist() == [192, 193, 194]
    (decodes,) = own(outs[1], "eager")
    assert values(decodes, "cpu.kv_len") == values(decodes, "kv_len") == [6, 4]
    assert prefills.field("swa.tile_sched_fresh") is None


def test_with_drafts_the_first_pass_reads_alike_on_both_readings():
    """Two drafts a step: the drafter's first pass (the step's tokens) reads its windows
    alike on both readings; its later sub-step has no CPU reading (kept apart)."""
    m = swa_cpu()
    m.prepare()
    outs = run_trace(prefills_then_decodes(2), m.SparseSWACPURunnerStepEngine())
    assert [ref.violations(o) for o in outs] == [[], []]
    builds = {b.name: b for b in outs[1].builds}
    first, later = builds["eager.draft0"], builds["eager.draft1"]
    assert values(first, "cpu.kv_len") == values(first, "kv_len") == [8, 6]
    assert later.field("cpu.kv_len") is None


def test_the_cpu_builder_as_it_ships_fails_every_build_and_the_error_is_vllm_s():
    """``build_tile_scheduler`` of the CPU builder names the V4 layer types only; the
    shared build reads ``c1a`` too: a ``KeyError`` raised inside vLLM (a finding, not
    attnfuzz's fault), on the smallest step there is."""
    from attnfuzz.harness.blame import attnfuzz_fault

    m = swa_cpu()
    m.prepare()
    assert {"c1a", "c2a"} <= set(m.layer_types())
    with pytest.raises(KeyError, match="c1a") as shipped:
        run_trace(m.smallest_any_step(), m.tile_keys)
    assert attnfuzz_fault(shipped.value, shipped.tb) is None


def test_the_mutant_fails_the_request_map_and_the_cpu_reading_on_its_smallest_trace():
    """The prefill tokens' requests left at zero: the map disagrees with the query
    offsets, and the second prefill's window is read through the first request's page
    (slots 64 on, not 192) by the CPU layer alone (the prefills' gather goes by
    request, so the CUDA reading is unchanged)."""
    m = swa_cpu()
    m.prepare()
    (out,) = run_trace(m.smallest_prefill_past_first_row(), m.prefill_owner_zeroed)
    found = ref.violations(out)
    assert found and {v.prop for v in found} == {"agreement within a build"}
    assert {v.field for v in found} == {"swa.token_to_req_indices", "cpu.kv_len", "cpu.kv_slots"}


def test_graphs_are_declined():
    m = swa_cpu()
    trace = m.smallest_any_step()
    config = dataclasses.replace(trace.config, cudagraph_mode="FULL", cudagraph_capture_sizes=(1,))
    assert "captures none" in m.declines_config(config)
    assert m.declines_config(trace.config) is None
