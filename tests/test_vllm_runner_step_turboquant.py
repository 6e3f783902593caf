"""vLLM 0.33.0's model runner V1 step on the TurboQuant backend (``vllm-v1-turboquant``),
and the finding kept apart under async scheduling
(``vllm-v1-turboquant-async-verify-past-rejection``): a verify after a rejection reads
keys past its sequence through TurboQuant's prefill path."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def tq():
    from attnfuzz.adapters.vllm import runner_step_turboquant

    return runner_step_turboquant


def test_the_turboquant_builder_builds_every_step_and_capture(monkeypatch):
    """``TurboQuantMetadataBuilder`` builds every step and the capture runs; scheduled
    synchronously, a verify after a rejection reads its 4 keys through the prefill
    path (its host length exact), and every property holds."""
    m = tq()
    m.prepare()
    from vllm.v1.attention.backends.turboquant_attn import TurboQuantMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(TurboQuantMetadataBuilder, "build", "build_for_cudagraph_capture")
    base = m.smallest_verify_past_rejection()
    graphs = dataclasses.replace(base.config, cudagraph_mode="FULL_AND_PIECEWISE")
    outs = run_trace(Trace(graphs, base.steps), m.TurboQuantRunnerStepEngine())
    assert min(calls.values()) > 0 and len(calls) == 2
    assert [ref.violations(out) for out in outs] == [[], [], []]
    (eager,) = own(outs[2], "eager")
    assert values(eager, "seq_lens") == [4]
    assert values(eager, "tq.prefill.seq_lens_cpu") == [4]
    assert values(eager, "kv_len") == [4]


def test_async_a_verify_after_a_rejection_reads_a_key_past_its_sequence():
    """The finding: scheduled asynchronously, the step after a rejected draft sends the
    optimistic count (3 computed, not 2); the device's seq_lens is corrected to 4, the
    host upper bound stays 5, and TurboQuant's prefill path reads 5 keys, slot 20
    (position 4) past the sequence. A new engine, sent the true count, reads 4."""
    m = tq()
    trace = m.smallest_verify_past_rejection()
    assert m.reach_verify_after_drafts(trace) and m.trigger_verify_past_rejection(trace)
    first, second, third = run_trace(trace, m.run_async)
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(third, "eager")
    (fresh,) = own(third, "fresh")
    assert values(eager, "seq_lens") == values(fresh, "seq_lens") == [4]
    assert values(eager, "tq.prefill.seq_lens_cpu") == [5]
    assert values(fresh, "tq.prefill.seq_lens_cpu") == [4]
    assert eager.field("kv_slots").values[0][:5].tolist() == [16, 17, 18, 19, 20]
    found = {(v.prop, v.field, v.build) for v in ref.violations(third)}
    assert ("history invariance", "kv_len", "fresh") in found
    assert ("history invariance", "tq.prefill.seq_lens_cpu", "fresh") in found


def test_async_without_a_rejection_or_with_a_one_token_query_holds():
    """The trigger's edges: every draft accepted (the bound is exact), or a one-token
    query after the rejection (the decode path reads the device's seq_lens)."""
    m = tq()
    base = m.smallest_verify_past_rejection()
    pages = ((1,),)
    accepted = Trace(base.config, (
        base.steps[0],
        Batch((1,), (2,), req_ids=(0,), pages=pages, new_pages=(0,)),
        Batch((3,), (2,), req_ids=(0,), pages=pages, new_pages=(0,)),
    ))  # fmt: skip
    decode = Batch((2,), (1,), req_ids=(0,), pages=pages, new_pages=(0,))
    one_token = Trace(base.config, (*base.steps[:2], decode))
    for trace in (accepted, one_token):
        assert not m.trigger_verify_past_rejection(trace)
        assert [ref.violations(out) for out in run_trace(trace, m.run_async)] == [[], [], []]
