"""vLLM 0.33.0's V2 worker start-up as ``vllm`` runs it: ``profile_cudagraph_memory``
captures the graphs over a minimal KV cache before the real one exists, each forward of
it a capture build judged over that cache's pages, and the mutant
``vllm-profile-state-slots`` (dummy rows naming a page the minimal cache has not) caught
there alone."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]

PROFILE = "cudagraph_utils.py: profile_cudagraph_memory"


def adapter():
    from attnfuzz.adapters.vllm import runner_step_profile

    return runner_step_profile


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_start_up_profiles_the_graphs_over_a_minimal_kv_cache(monkeypatch):
    """Two requests at most, capture sizes 1 and 2: vLLM's profiling sizes its KV cache
    at ``min(max_num_reqs, max capture size) = 2`` pages and captures over it, then the
    worker's cache (``num_blocks``: 2 requests of 2 pages, the null page and two spare)
    replaces it. Each profiling forward is a capture build whose block table and slots
    are judged within 2 pages; the worker's captures within 7. Every property holds."""
    a = adapter()  # before vLLM
    import vllm.v1.worker.gpu.cudagraph_utils as cg
    from attnfuzz.adapters.vllm import runner_step

    calls = Calls(monkeypatch)
    calls.count(cg, "_init_minimal_kv_cache_for_profiling")
    calls.count(cg, "_teardown_profiling_state")
    trace = a.smallest_state_slots()
    assert a.reach_profile(trace)
    engine = runner_step.RunnerStepEngine()
    outs = run(engine, trace)
    assert calls["_init_minimal_kv_cache_for_profiling"] == 1
    assert calls["_teardown_profiling_state"] == 1
    assert ref.violations(outs[0]) == []
    captures = [b for b in outs[0].builds if b.how == "capture"]
    profiled = [b for b in captures if b.where == PROFILE]
    worker = [b for b in captures if b.where != PROFILE]
    assert profiled and worker
    assert {b.field("block_table").accepts for b in profiled} == {(0, 1)}
    assert {b.field("slot_mapping").accepts for b in profiled} == {(-1, 2 * 16 - 1)}
    pages = runner_step.num_blocks(trace.config)
    assert pages == 7
    assert {b.field("block_table").accepts for b in worker} == {(0, pages - 1)}


def test_no_profiling_where_nothing_is_captured(monkeypatch):
    """Cudagraph mode NONE (the eager and fresh engines): the worker does not profile."""
    a = adapter()
    import vllm.v1.worker.gpu.cudagraph_utils as cg
    from attnfuzz.adapters.vllm import runner_step

    calls = Calls(monkeypatch)
    calls.count(cg, "_init_minimal_kv_cache_for_profiling")
    trace = a.smallest_state_slots()
    eager = dataclasses.replace(
        trace, config=dataclasses.replace(trace.config, cudagraph_mode="NONE")
    )
    assert not a.reach_profile(eager)
    outs = run(runner_step.RunnerStepEngine(), eager)
    assert calls["_init_minimal_kv_cache_for_profiling"] == 0
    assert not [b for b in outs[0].builds if b.where == PROFILE]


def test_dummy_state_slots_past_the_profiling_cache_are_caught():
    """The mutant: profiling's capture of 2 dummy requests names page 2 of a 2-page
    cache (request 1's state slot). Safe padding fails on profiling's builds alone: the
    worker's captures name the same pages within its 7."""
    a = adapter()
    trace = a.smallest_state_slots()
    assert a.trigger_state_slots(trace)
    a.run_state_slots.new_engine()
    outs = run(a.run_state_slots, trace)
    found = [v for out in outs for v in ref.violations(out)]
    # Profiling's two captures of 2 dummy requests, a warm-up and a capture each.
    assert len(found) == 4
    assert {(v.prop, v.field, v.build) for v in found} == {
        ("safe padding", "block_table", "capture")
    }
    assert all("outside [0, 1]" in v.detail and v.detail.endswith(": 2") for v in found)
    worker = dataclasses.replace(
        outs[0], builds=tuple(b for b in outs[0].builds if b.where != PROFILE)
    )
    assert ref.violations(worker) == []


def test_v1_start_up_profiles_the_graphs_over_a_minimal_kv_cache(monkeypatch):
    """The V1 runner (``vllm-v1``) likewise: ``GPUModelRunner.profile_cudagraph_memory``
    initializes its KV cache at ``min(max_num_reqs, max capture size) = 2`` pages
    (``_init_minimal_kv_cache_for_profiling``: vLLM's own ``initialize_kv_cache``) and
    captures the first two descriptors of each mode over it; then the engine's own
    cache (7 pages). The profiling capture's forwards are judged within 2 pages: the
    same block table that passes within the worker's cache fails there with a page
    past it."""
    a = adapter()  # before vLLM
    import vllm.v1.worker.gpu_model_runner as gmr
    from attnfuzz.adapters.vllm import runner_step, runner_step_v1

    calls = Calls(monkeypatch)
    calls.count(gmr.GPUModelRunner, "_init_minimal_kv_cache_for_profiling")
    calls.count(gmr.GPUModelRunner, "_cleanup_profiling_kv_cache")
    v2 = a.smallest_state_slots()
    trace = dataclasses.replace(v2, config=dataclasses.replace(v2.config, runner="v1"))
    outs = run(runner_step_v1.RunnerStepEngine(), trace)
    assert calls["_init_minimal_kv_cache_for_profiling"] == 1
    assert calls["_cleanup_profiling_kv_cache"] == 1
    assert ref.violations(outs[0]) == []
    where = "gpu_model_runner.py: GPUModelRunner.profile_cudagraph_memory"
    captures = [b for b in outs[0].builds if b.how == "capture" and b.field("block_table")]
    profiled = [b for b in captures if b.where == where]
    worker = [b for b in captures if b.where != where]
    assert profiled and worker
    assert {b.field("block_table").accepts for b in profiled} == {(0, 1)}
    assert {b.field("block_table").accepts for b in worker} == {
        (0, runner_step.num_blocks(trace.config) - 1)
    }
    # A page one past the profiling cache: safe padding fails on the profiling build.
    build = profiled[0]
    table = build.field("block_table")
    table.values[-1, 0] = 2
    out = dataclasses.replace(outs[0], builds=(build,))
    found = ref.safe_padding(out)
    assert [(v.field, v.detail.endswith(": 2")) for v in found] == [("block_table", True)]


def test_v1_profiling_hands_its_first_full_capture_fewer_keys_than_queries():
    """What vLLM 0.33.0's V1 profiling was seen doing (kept apart, not triaged): the
    first FULL descriptor is captured with ``profile_seq_lens = min(max_model_len,
    max_num_tokens // num_tokens)``, here 16 // 9 = 1, below its requests' query of
    ``1 + num_spec = 3``. The ROCm Octave backend derives each query token's key count
    from it, ``seq_len - q_len + i + 1``, so the capture hands its decode kernel -1 and
    0 keys: outside what the kernel reads. The worker's own captures hand it 3 keys at
    most. Octave's engine does not profile in ``vllm-v1-rocm-octave`` (its builds are
    the backend's, not the runner's start-up)."""
    a = adapter()  # before vLLM
    from attnfuzz.adapters.vllm import runner_step_rocm as rocm
    from attnfuzz.reference.batch import Batch, EngineConfig

    class ProfiledOctave(rocm._OctaveEngine):
        profiles = True

    class Engine(rocm.OctaveRunnerStepEngine):
        engine_type = ProfiledOctave

    config = EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=2, cudagraph_capture_sizes=(3, 9), runner="v1",
    )  # fmt: skip
    pages = ((1,), (2,), (3,))
    step = Batch((0, 0, 0), (2, 3, 4), req_ids=(7, 8, 9), pages=pages, new_pages=(1, 1, 1))
    trace = Trace(config, (step,))
    assert a is not None
    (out,) = run(Engine(), trace)
    found = ref.violations(out)
    assert [(v.prop, v.field) for v in found] == [("safe padding", "octave.q_to_klen")]
    profiled = [b for b in out.builds if b.field("octave.q_to_klen") is not None]
    first = profiled[0]
    assert first.where == "gpu_model_runner.py: GPUModelRunner.profile_cudagraph_memory"
    assert first.field("seq_lens").values.tolist() == [1, 1, 1]
    assert first.field("octave.q_to_klen").values.tolist() == [-1, 0, 1] * 3
