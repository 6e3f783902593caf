"""vLLM 0.33.0's model runner V1 step of an MLA model on ROCm's AITER MLA backend, as the
implementation ``vllm-v1-aiter-mla`` of ``runner-step``: ``AiterMLAMetadataBuilder``
builds every step, its decode metadata (the kernel's lengths, the per-token key indices
of ``_expand_page_indices_kernel``, the query offsets, their graph buffers, the
schedule asked of AITER) judged by the step's properties; two mutants of it seen
failing."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def aiter_mla():
    from attnfuzz.adapters.vllm import runner_step_aiter_mla

    return runner_step_aiter_mla


def spec_decode() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


def test_the_builder_builds_a_verify_padded_for_a_full_graph(monkeypatch):
    """A prefill of 5, then a verify of 2 tokens padded to the FULL graph of 2 requests:
    the runner's own step calls the AITER builder in every build and the capture runs;
    the padding request is given ``max_qo_len`` keys (``_uniform_padded_mtp_qo_len``),
    the query offsets are uniform, each key's index is its slot; every property holds."""
    m = aiter_mla()
    m.prepare()
    from vllm.v1.attention.backends.mla.rocm_aiter_mla import AiterMLAMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(AiterMLAMetadataBuilder, "build", "build_for_cudagraph_capture")
    first, second = run_trace(spec_decode(), m.AiterMLARunnerStepEngine())
    assert min(calls.values()) > 0 and len(calls) == 2
    assert ref.violations(first) == [] and ref.violations(second) == []
    (eager,) = own(second, "eager")
    assert values(eager, "aiter_mla.qo_indptr") == [0, 2]
    assert values(eager, "aiter_mla.paged_kv_indptr") == [0, 7]
    assert values(eager, "aiter_mla.paged_kv_indices") == [list(range(16, 23))]
    assert values(eager, "aiter_mla.schedule_stale") == [0]
    (replay,) = own(second, "replay")
    assert values(replay, "aiter_mla.qo_indptr") == [0, 2, 4]
    assert values(replay, "mla.decode.seq_lens") == [7, 2]  # the padding row: max_qo_len
    assert values(replay, "aiter_mla.paged_kv_indptr") == [0, 7, 9]
    assert values(replay, "aiter_mla.paged_kv_last_page_len") == [1, 1]
    assert values(replay, "aiter_mla.schedule_stale") == [0, 0]


def test_pages_of_one_token_are_any_block_size_the_backend_takes():
    """AITER MLA takes any block size (``MultipleOf(1)``), which the Triton backend does
    not: at pages of one token each key's index is its page."""
    m = aiter_mla()
    config = dataclasses.replace(spec_decode().config, block_size=1, cudagraph_mode="NONE")
    assert m.declines_config(config) is None
    steps = (
        Batch((0,), (3,), req_ids=(0,), pages=((4, 9, 2, 7),), new_pages=(4,)),
        Batch((3,), (1,), req_ids=(0,), pages=((4, 9, 2, 7),), new_pages=(0,)),
    )
    _, out = run_trace(Trace(config, steps), m.run)
    assert ref.violations(out) == []
    (eager,) = own(out, "eager")
    assert values(eager, "aiter_mla.paged_kv_indices") == [[4, 9, 2, 7]]
    assert values(eager, "kv_slots")[0][:4] == [4, 9, 2, 7]


def test_a_key_index_past_the_cache_is_unsafe(monkeypatch):
    """Safe padding holds ``aiter_mla.paged_kv_indices`` to the latent cache's slots and
    ``aiter_mla.qo_indptr`` to the decode's query rows: a builder that puts every key
    index a cache further and every query offset one row on fails both (and the
    schedule, made for the offsets before the shift, is stale)."""
    m = aiter_mla()
    m.prepare()
    from vllm.v1.attention.backends.mla.rocm_aiter_mla import AiterMLAMetadataBuilder

    original = AiterMLAMetadataBuilder._build_decode

    def shifted(self, *args, **kwargs):
        decode = original(self, *args, **kwargs)
        decode.paged_kv_indices = decode.paged_kv_indices + 10_000
        decode.qo_indptr = decode.qo_indptr + 1
        return decode

    monkeypatch.setattr(AiterMLAMetadataBuilder, "_build_decode", shifted)
    _, second = run_trace(spec_decode(), m.AiterMLARunnerStepEngine())
    unsafe = {v.field for v in ref.violations(second) if v.prop == "safe padding"}
    assert unsafe == {
        "aiter_mla.paged_kv_indices", "aiter_mla.qo_indptr", "aiter_mla.schedule_stale"
    }  # fmt: skip


def test_aiter_refuses_a_query_head_count_not_a_multiple_of_8():
    """The stand-in keeps AITER's own check (``get_mla_metadata_info_v1``); a refusal is
    the engine's misuse of AITER's contract, a finding (harness/blame.py)."""
    from attnfuzz.adapters.standins import VendorContractError
    from attnfuzz.harness.blame import attnfuzz_fault

    m = aiter_mla()
    with pytest.raises(VendorContractError, match="multiple of 8") as refused:
        m.get_mla_metadata_info_v1(4, 1, 12, torch.bfloat16, torch.bfloat16, False)
    assert attnfuzz_fault(refused.value, refused.tb) is None
    assert len(m.get_mla_metadata_info_v1(4, 1, 16, torch.bfloat16, torch.bfloat16, False)) == 6


def test_offsets_not_persistent_replays_the_capture_s_keys():
    """The mutant ``vllm-v1-aiter-mla-offsets-not-persistent``: the FULL graph's replay
    reads the capture's offsets (one key where eager reads 4), against a schedule made for
    the step's."""
    m = aiter_mla()
    trace = m.smallest_full_decode()
    assert m.trigger_full_decode(trace)
    _, out = run_trace(trace, m.offsets_not_persistent)
    replay = {v.field for v in ref.violations(out) if v.prop == "replay equals eager"}
    assert {"kv_len", "aiter_mla.paged_kv_indptr", "aiter_mla.schedule_stale"} <= replay
    _, fixed = run_trace(trace, m.run)
    assert ref.violations(fixed) == []


def test_a_schedule_kept_per_shape_is_stale_and_only_the_schedule_tells():
    """The mutant ``vllm-v1-aiter-mla-schedule-kept-per-shape``: the padded decode has a
    capture run's shape, so the builder keeps the capture's schedule; only
    ``aiter_mla.schedule_stale`` differs from the correct engine's."""
    m = aiter_mla()
    _, out = run_trace(m.smallest_full_decode(), m.schedule_kept_per_shape)
    failing = ref.violations(out)
    assert failing and {v.field for v in failing} == {"aiter_mla.schedule_stale"}
    assert {v.prop for v in failing} >= {"safe padding", "replay equals eager"}
