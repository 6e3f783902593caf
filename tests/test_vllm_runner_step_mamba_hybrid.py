"""vLLM 0.33.0's model runner V2 step of a hybrid model, as the implementation
``vllm-v2-mamba-hybrid`` of ``runner-step``: the V2 step whose model state is
``MambaHybridModelState`` (picked by ``init_model_state`` from the hybrid model
config) and whose second KV-cache group is a GDN linear-attention layer, its builder's
metadata judged by the step's properties."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_mamba_hybrid

    return runner_step_mamba_hybrid


def run_trace(trace: Trace, run=None) -> list[ref.RunnerStepOutputs]:
    engine = run or adapter().MambaHybridRunnerStepEngine()
    engine.new_engine()
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def gdn(build: ref.StepBuild, name: str) -> list:
    return build.field(f"gdn.{name}").values.tolist()


def test_the_hybrid_model_state_prepares_every_forward(monkeypatch):
    """``load_model``'s ``init_model_state`` picks ``MambaHybridModelState`` for the
    hybrid config; its ``prepare_attn`` builds the capture runs' metadata and the
    step's, into the GDN builder of the second group: the prefill (``non_spec_*``),
    then the speculative decode padded to the FULL graph of 2 requests (the padding
    request's state indices the null block 0, its accepted count 1), replayed, and
    built afresh."""
    m = adapter()
    m.prepare()
    from vllm.v1.worker.gpu.model_states.mamba_hybrid import MambaHybridModelState

    calls = Calls(monkeypatch)
    calls.count(MambaHybridModelState, "prepare_attn", "preprocess_state", "postprocess_state")
    engine = m.MambaHybridRunnerStepEngine()
    first, second = run_trace(m.smallest_full_spec_decode(), engine)
    assert ref.violations(first) == [] and ref.violations(second) == []
    assert all(calls[name] > 0 for name in ("prepare_attn", "preprocess_state"))
    assert calls["postprocess_state"] > 0  # sample_tokens between the steps
    assert type(engine.graphs.runner.model_state) is MambaHybridModelState
    assert any(f.name.startswith("gdn.") for b in own(first, "capture") for f in b.fields)
    (eager,) = own(first, "eager")
    slot = m.state_blocks(m.smallest_full_spec_decode().config, 0)
    assert gdn(eager, "non_spec_state_indices_tensor") == [slot[0]]
    (padded,) = own(second, "padded")
    assert gdn(padded, "spec_state_indices_tensor") == [slot, [0, 0]]
    assert gdn(padded, "num_accepted_tokens") == [1, 1]
    (replay,) = own(second, "replay")
    assert gdn(replay, "spec_state_indices_tensor") == [slot, [0, 0]]
    (fresh,) = own(second, "fresh")
    assert gdn(fresh, "spec_state_indices_tensor") == [slot]


def test_the_mutant_fails_safe_padding_on_its_smallest_trace():
    """``vllm-v2-mamba-hybrid-pad-slot-states``: the padding request's state indices
    PAD_SLOT_ID (-1) in the padded build and the replay, outside the state cache's
    lines, on the GDN state indices alone."""
    m = adapter()
    trace = m.smallest_full_spec_decode()
    assert m.trigger_full_spec_decode(trace)
    _, out = run_trace(trace, m.pad_slot_padding)
    got = {(v.prop, v.build) for v in ref.violations(out)}
    assert {("safe padding", "padded"), ("safe padding", "replay")} <= got
    assert {v.field for v in ref.violations(out)} == {"gdn.spec_state_indices_tensor"}


def test_gdn_s_graph_support_resolves_a_full_mode():
    """``initialize_kv_cache`` narrows the mode to what both groups' builders support:
    GDN's ``UNIFORM_BATCH`` keeps FULL graphs for uniform decodes only."""
    import dataclasses

    import torch

    m = adapter()
    config = dataclasses.replace(m.smallest_full_spec_decode().config, cudagraph_mode="FULL")
    engine = m._MambaHybridEngine(config, torch.device("cpu"), "FULL", "mtp", {})
    assert engine.runner.cudagraph_manager.cudagraph_mode.name == "FULL_AND_PIECEWISE"


def test_a_dummy_run_through_the_last_steps_rows_fails_writes_nothing_live():
    """``vllm-v2-mamba-hybrid-dummy-stale-rows`` (vLLM 0.26.0's
    ``get_dummy_block_tables``): the idle rank's dummy run before the decode reads the
    prefill's block-table row, so the GDN layer's state index of the dummy request is
    the running request's state block, which its kernels update in place; on vLLM
    0.33.0, which zeroes the rows first, it is the null block 0."""
    m = adapter()
    trace = m.smallest_dummy_stale_rows()
    assert m.trigger_dummy_stale_rows(trace) and m.reach_dummy_run(trace)
    slot = m.state_blocks(trace.config, 0)[0]
    fixed = run_trace(trace)
    assert [ref.violations(out) for out in fixed] == [[], []]
    (dummy,) = own(fixed[1], "dummy")
    assert dummy.live == (0,) and gdn(dummy, "non_spec_state_indices_tensor")[0] == 0
    first, second = run_trace(trace, m.dummy_stale_rows)
    assert ref.violations(first) == []  # no request held yet
    found = ref.violations(second)
    assert found and {(v.prop, v.build) for v in found} == {
        ("a dummy run writes nothing live", "dummy")
    }
    assert all(f"slot {slot}," in v.detail for v in found)
