"""vLLM 0.33.0's model runner V1 step of an MLA model as its CPU worker makes it, on the
AMX MLA backend, as the implementation ``vllm-v1-amx-mla`` of ``runner-step``."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def amx():
    from attnfuzz.adapters.vllm import runner_step_amx_mla

    return runner_step_amx_mla


def three_steps(num_spec: int) -> Trace:
    """:func:`smallest_mixed`, then both requests decode ``1 + num_spec`` tokens."""
    trace = amx().smallest_mixed()
    q = 1 + num_spec
    last = Batch((6, 34), (q, q), req_ids=(8, 7), pages=((3,), (1, 2)), new_pages=(0, 0))
    return Trace(dataclasses.replace(trace.config, num_spec=num_spec), (*trace.steps, last))


def test_the_amx_builder_reads_the_keys_the_mla_metadata_names(monkeypatch):
    """The CPU worker's runner builds every step by ``AMXMLAMetadataBuilder.build``: the
    decode (6 keys) first, then the prefill chunk (14 new tokens after 20), each read
    through ``req_to_token`` as the MLA metadata's block table and chunks name them;
    every property holds."""
    m = amx()
    m.prepare()
    from vllm.v1.attention.backends.mla.amx_mla import AMXMLAMetadataBuilder
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    builds = Calls(monkeypatch)
    builds.count(AMXMLAMetadataBuilder, "build")
    engine = m.AMXMLARunnerStepEngine()
    outs = run_trace(three_steps(0), engine)
    assert type(engine.eager.runner) is CPUModelRunner and builds["build"] >= 9
    assert [ref.violations(o) for o in outs] == [[], [], []]
    (mixed,) = own(outs[1], "eager")
    assert values(mixed, "amx.decode.seq_lens") == [6]
    assert values(mixed, "amx.prefill.seq_lens") == [34]
    assert values(mixed, "amx.prefill.extend_seq_lens") == [14]
    assert values(mixed, "amx.kv_len") == values(mixed, "kv_len") == [6, 34]
    # The prefill's prefix (20 keys on page 1) and its 14 new keys (12 more on page 1,
    # 2 on page 2), as req_to_token names them: page * 32 + offset.
    slots = mixed.field("amx.kv_slots").values[1][:34].tolist()
    assert slots == [32 + k for k in range(32)] + [64, 65]
    (decodes,) = own(outs[2], "eager")
    assert sorted(values(decodes, "amx.decode.seq_lens")) == [7, 35]


def test_a_decode_with_drafts_is_a_prefill_to_the_amx_builder():
    """AMX MLA's query lengths are ``SINGLE_ONLY`` (the reorder threshold 1): a decode
    of two tokens runs the extend kernel."""
    m = amx()
    m.prepare()
    outs = run_trace(three_steps(1), m.AMXMLARunnerStepEngine())
    assert [ref.violations(o) for o in outs] == [[], [], []]
    (last,) = own(outs[2], "eager")
    assert last.field("amx.decode.seq_lens") is None
    assert sorted(values(last, "amx.prefill.extend_seq_lens")) == [2, 2]


def test_the_mutant_fails_agreement_within_a_build_on_its_smallest_trace():
    """The prefills' lengths read from the decodes' rows: the extend kernel reads the
    prefill's prefix as 6 - 14 keys, not 20: ``amx.kv_len`` against ``kv_len``."""
    m = amx()
    m.prepare()
    outs = run_trace(m.smallest_mixed(), m.prefill_lens_unshifted)
    found = ref.violations(outs[1])
    assert found and {v.prop for v in found} == {"agreement within a build"}
    assert {v.field for v in found} == {"amx.kv_len", "amx.kv_slots"}
    assert ref.violations(outs[0]) == []


def test_it_declines_pages_the_amx_backend_does_not_take():
    m = amx()
    config = m.smallest_mixed().config
    assert m.declines_config(config) is None
    assert "multiples of 32" in m.declines_config(dataclasses.replace(config, block_size=16))
    assert "captures none" in m.declines_config(dataclasses.replace(config, cudagraph_mode="FULL"))


def test_pool_indices_off_the_table_are_judged_not_a_crash(monkeypatch):
    """A builder whose decodes name rows of ``req_to_token`` it does not have: the keys
    read through them are none, and the step fails its properties (the indices' range,
    the two readings of the cache) instead of raising in attnfuzz's reading."""
    m = amx()
    m.prepare()
    from vllm.v1.attention.backends.mla.amx_mla import AMXMLAMetadataBuilder

    original = AMXMLAMetadataBuilder.build

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        meta = original(self, common_prefix_len, common_attn_metadata, fast_build)
        if meta.decode is not None:
            meta.decode.req_pool_indices = meta.decode.req_pool_indices + 5
        return meta

    monkeypatch.setattr(AMXMLAMetadataBuilder, "build", build)
    outs = run_trace(m.smallest_mixed(), m.AMXMLARunnerStepEngine())
    fields = {v.field for v in ref.violations(outs[1])}
    assert {"amx.decode.req_pool_indices", "amx.kv_slots"} <= fields
