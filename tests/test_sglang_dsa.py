"""SGLang's DSA backend against ``dsa-metadata``: eager, both replay paths, #19016."""

from __future__ import annotations

import pytest
import torch
from attnfuzz.adapters.sglang import dsa_backend
from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import dsa_metadata as ref
from attnfuzz.reference.batch import Batch, Case

pytestmark = requires_sglang

TARGET = "dsa-metadata"
FALLBACK, FUSED = "sglang-dsa", "sglang-dsa-fused"
UPSTREAM = "upstream-pr19016-context-len-table"


def case(phase: int, computed=(3, 0, 5), graph=True, page_log2=1, **config) -> Case:
    """Three requests of one new token, next_n 2, top-k 3; graphs of 1, 2 and 4 requests."""
    base = dict(cudagraph_capture_sizes=(2, 4, 8), max_model_len=16)
    base.update(config)
    params = {"dsa_phase": phase, "dsa_index_topk": 3, "dsa_page_log2": page_log2}
    batch = Batch(tuple(computed), (1,) * len(computed), seed=11, use_cudagraph=graph)
    return Case(spec_config(**base), batch, tuple(sorted(params.items())))


def run(impl: str, c: Case) -> tuple[ref.DsaMetadataInputs, ref.DsaMetadataOutputs]:
    inputs = ref.make_inputs(c)
    return inputs, get_target(TARGET).implementations[impl].fn(inputs)


def test_target_verify_eager_by_hand():
    """KV 4 + 2, 1 + 2, 6 + 2: SGLang expands each request into N = 2 rows."""
    inputs, got = run(FALLBACK, case(1, graph=False))
    assert got.cache_seqlens.tolist() == [6, 3, 8]
    assert got.seqlens_expanded.tolist() == [5, 6, 2, 3, 7, 8]
    assert got.dsa_cache_seqlens.tolist() == [3, 3, 2, 3, 3, 3]
    assert got.page_table_1.shape[0] == 6


@pytest.mark.parametrize("phase", [0, 1, 2])
def test_both_replay_paths_agree_on_every_value_read(phase):
    """The torch fallback and the fused kernels: the same metadata over what is read
    (the reference's comparison), though they differ past each request's KV."""
    c = case(phase)
    target = get_target(TARGET)
    inputs, fallback = run(FALLBACK, c)
    _, fused = run(FUSED, c)
    expected = ref.reference(c, inputs)
    assert target.compare(c, inputs, expected, fallback) == []
    assert target.compare(c, inputs, expected, fused) == []
    for name in ("cache_seqlens", "seqlens_expanded", "dsa_cache_seqlens", "dsa_cu_seqlens_k"):
        assert torch.equal(getattr(fallback, name), getattr(fused, name)), name


def test_replayed_draft_extend_padding_rows_are_clamped_at_zero():
    """Three requests in the graph of 4: the padding request's forward length 1 is
    shorter than its N = 2 rows, and SGLang clamps its first row at 0 keys."""
    for impl in (FALLBACK, FUSED):
        _, got = run(impl, case(2))
        assert got.seqlens_expanded[-2:].tolist() == [0, 1], impl


@pytest.mark.parametrize("phase", [0, 1, 2, 3])
@pytest.mark.parametrize("graph", [False, True])
def test_engine_passes_a_generated_case_of_each_path(phase, graph):
    target = get_target(TARGET)
    c = case(phase, graph=graph)
    for impl in (FALLBACK, FUSED):
        assert target.judge(target.resolve(impl), c).ok, impl


def test_upstream_pr19016_truncates_a_verified_kv_past_the_context():
    """15 committed tokens + 2 drafts in a 16-token context: the pre-fix table is 16
    wide; the fixed one is the request-to-token table's 18."""
    target = get_target(TARGET)
    at_limit = case(1, computed=(14,))
    verdict = target.judge(target.resolve(UPSTREAM), at_limit)
    assert not verdict.ok
    assert {m.check for m in verdict.mismatches} == {"shape"}
    assert target.judge(target.resolve(FUSED), at_limit).ok
    assert target.judge(target.resolve(UPSTREAM), case(1, computed=(13,))).ok  # 16: fits


def test_paged_mqa_schedule_shares_the_blocks_out_evenly():
    """The stand-in of DeepGEMM's schedule: [num_sms + 1, 2] int32, starts in order,
    the last row the end of the work."""
    lens = torch.tensor([300, 10, 600], dtype=torch.int32)  # 2 + 1 + 3 blocks of 256
    got = dsa_backend.paged_mqa_schedule(lens, 64, 3)
    assert got.dtype == torch.int32 and got.shape == (4, 2)
    assert got.tolist() == [[0, 0], [1, 0], [2, 1], [3, 0]]


def test_fused_replay_restores_the_backend_module():
    dsa_backend.prepare()  # SGLang's environment first: it imports its stand-ins
    from sglang.srt.layers.attention import dsa_backend as module

    before = module.is_cuda
    with dsa_backend.fused_replay():
        assert module.is_cuda() is True
    assert module.is_cuda is before


def test_context_length_is_the_model_s_not_the_table_s():
    """The backend is built with the model's context (max_model_len); the pool is
    N tokens wider, as SGLang over-allocates it for speculative tokens."""
    inputs = ref.make_inputs(case(1))
    assert inputs.context_len == 16 and inputs.req_to_token.shape[1] == 18
