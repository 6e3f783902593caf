"""vLLM 0.33.0's model runner V1 step of a model with a kpool tail ring
(``vllm-v1-kpool-tail``): ``KpoolTailMetadataBuilder`` of the ring's group builds every
step and capture, judged by the step's properties."""

from __future__ import annotations

import copy
import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def kpool_tail():
    from attnfuzz.adapters.vllm import runner_step_kpool_tail

    return runner_step_kpool_tail


def spec_decode() -> Trace:
    """``smallest_full_spec_decode``: a prefill of 5 tokens on page 1 (pages of 16), then
    a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_the_tail_builder_builds_every_step_and_capture(monkeypatch):
    """The builder builds the prefill, the verify (eager, padded, replayed) and the
    capture runs; every property holds. The request's ring is block 1 of 8 rows: the
    prefill stores at slots 8 to 12, the verify at 13 and 14, its padding at none."""
    m = kpool_tail()
    m.prepare()
    from vllm.v1.attention.backends.mla.indexer import KpoolTailMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(KpoolTailMetadataBuilder, "build")
    engine = m.KpoolTailRunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    (group,) = engine.graphs.runner.attn_groups[1]
    assert type(group.get_metadata_builder()) is KpoolTailMetadataBuilder
    assert calls["build"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "kpool.slot_mapping") == [8, 9, 10, 11, 12]
    (replay,) = own(second, "replay")
    assert values(replay, "kpool.slot_mapping") == [13, 14, -1, -1]


def test_the_ring_is_a_power_of_two_of_pools_and_pages_it_does_not_divide_are_declined():
    """Pools of 4: one draft needs 2 pools (8 rows), five drafts 4 pools (16 rows), which
    pages of 8 do not hold."""
    m = kpool_tail()
    config = spec_decode().config
    assert [m.ring_rows(dataclasses.replace(config, num_spec=n)) for n in (0, 1, 5)] == [4, 8, 16]
    assert "16 rows" in m.declines_config(dataclasses.replace(config, num_spec=5, block_size=8))
    assert m.declines_config(config) is None


def test_a_tail_slot_mapping_made_anew_each_build_fails_replay_equals_eager(monkeypatch):
    """A ``build`` that hands the tail store a copy of its slot mapping (not the
    builder's buffer, rewritten in place) is captured by the FULL graph, whose replay
    stores at the capture's slots: replay equals eager fails on ``kpool.slot_mapping``."""
    m = kpool_tail()
    m.prepare()
    from vllm.v1.attention.backends.mla.indexer import KpoolTailMetadataBuilder

    original = KpoolTailMetadataBuilder.build

    def copied(self, *args, **kwargs):
        metadata = copy.copy(original(self, *args, **kwargs))
        metadata.slot_mapping = metadata.slot_mapping.clone()
        return metadata

    monkeypatch.setattr(KpoolTailMetadataBuilder, "build", copied)
    _, second = run_trace(spec_decode(), m.KpoolTailRunnerStepEngine())
    stale = {v.field for v in ref.violations(second) if v.prop == "replay equals eager"}
    assert "kpool.slot_mapping" in stale


def test_a_dummy_run_into_the_held_requests_ring_is_kept_apart():
    """``vllm-v1-kpool-tail-dummy-held-rows``, a finding of vLLM 0.33.0 kept apart: the
    idle rank's ``_dummy_run`` before the decode builds the ring's metadata from the
    persistent batch's row 0, which holds the running request: the dummy tokens store
    into that request's ring (block 1). ``vllm-v1-kpool-tail`` does not judge a dummy run
    against the requests it holds; the kept-apart entry does."""
    from attnfuzz.adapters.vllm.testing import kept_apart_verdict

    m = kpool_tail()
    witness = m.smallest_dummy_held_rows()
    assert m.trigger_dummy_held_rows(witness)
    verdict = kept_apart_verdict(
        "vllm-v1-kpool-tail", "vllm-v1-kpool-tail-dummy-held-rows", witness
    )
    assert verdict.mismatches and all(
        x.check == "dummy-run-writes-nothing-live" and x.where == "dummy.kpool.ring_block"
        and "slot 1," in x.got
        for x in verdict.mismatches
    )  # fmt: skip


def test_graph_padding_of_a_full_batch_stores_into_its_last_requests_ring():
    """One request at a time, one token in the FULL graph of 2: the dispatcher adds no
    padding request (``max_num_seqs`` 1), and ``compute_kpool_tail_slot_mapping`` maps
    the padding token to the request: slot 4, position 0's row of its ring (block 1),
    in the padded and replayed builds. The kept-apart entry fails *padding writes no
    real state* there; ``vllm-v1-kpool-tail`` declines the step; with room for a padding
    request (``max_num_seqs`` 2) the padding token stores nowhere and every property
    holds."""
    m = kpool_tail()
    trace = m.smallest_padding_last_request()
    case = trace.case(0)
    assert m.pads_past_the_last_request(case)
    why = m.declines(case)
    assert why is not None and "vllm-v1-kpool-tail-padding-last-request" in why
    assert m.declines_engine(case) is None
    (out,) = run_trace(trace, m.run)
    for how in ("padded", "replay"):
        (build,) = own(out, how)
        assert values(build, "kpool.slot_mapping") == [4, 4], how
    found = {(v.prop, v.field, v.build) for v in ref.violations(out)}
    assert found == {
        ("padding writes no real state", "kpool.slot_mapping", "padded"),
        ("padding writes no real state", "kpool.slot_mapping", "replay"),
    }
    roomy = Trace(dataclasses.replace(trace.config, max_num_seqs=2), trace.steps)
    assert not m.pads_past_the_last_request(roomy.case(0))
    (out,) = run_trace(roomy, m.run)
    (build,) = own(out, "padded")
    assert values(build, "kpool.slot_mapping")[1:] == [-1]
    assert ref.violations(out) == []
