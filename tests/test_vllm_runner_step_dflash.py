"""vLLM 0.33.0's V2 runner with a DFlash draft model (``vllm-dflash``): its
``DFlashSpeculator`` run whole after each step by the runner's own ``sample_tokens``, its
query forward a build judged by the step's properties, and a mutant of its query slot
padding caught."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_dflash

    return runner_step_dflash


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_the_dflash_query_is_a_build_and_every_property_holds(monkeypatch):
    """Two requests prefill 6 and 4 tokens, then decode with both drafts. After the
    prefill ``sample_tokens`` runs ``DFlashSpeculator.propose``: its input kernel, its
    graph dispatch (the graph engine replays the FULL graph of 3 queries, the capture
    size 9), then its one query forward, on every engine: three rows a request (the
    bonus token and two masks) at the positions after its prefill, the replay's three
    rows past them padding. Every property holds."""
    a = adapter()  # before vLLM
    import vllm.v1.worker.gpu.spec_decode.dflash.speculator as dflash

    calls = Calls(monkeypatch)
    calls.count(dflash, "prepare_dflash_inputs")
    outs = run(a.DFlashEngine(), a.smallest_query_slots_unpadded())
    for out in outs:
        assert ref.violations(out) == []
    drafts = {b.how: b for b in outs[1].builds if b.draft is not None}
    assert set(drafts) == {"eager", "replay", "fresh"}
    assert {(b.draft, b.num_reqs, b.num_tokens) for b in drafts.values()} == {(0, 2, 6)}
    eager = {f.name: f.values.tolist() for f in drafts["eager"].fields}
    # Request 8 (4 tokens) then request 7 (6 tokens), as the runner's batch orders them.
    assert eager["query_start_loc"] == [0, 3, 6]
    assert eager["positions"] == [4, 5, 6, 6, 7, 8]
    assert eager["seq_lens"] == [7, 9] == eager["kv_len"]
    replay = {f.name: f.values.tolist() for f in drafts["replay"].fields}
    assert replay["slot_mapping"] == eager["slot_mapping"] + [-1, -1, -1]
    assert calls["prepare_dflash_inputs"] >= 3


def test_query_slots_left_unpadded_are_caught():
    """The mutant ``vllm-dflash-query-slots-unpadded`` (the kernel's padding of the query
    slot mapping past the queries dropped): the replayed graph's three rows past the six
    query rows keep the prefill's slots, request 7's keys, which its draft query reads."""
    a = adapter()
    trace = a.smallest_query_slots_unpadded()
    assert a.trigger_query_slots_unpadded(trace)
    a.run_query_slots_unpadded.new_engine()
    outs = run(a.run_query_slots_unpadded, trace)
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {("padding writes no real KV", "slot_mapping", "replay.draft0")}, found
