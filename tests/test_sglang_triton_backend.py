"""SGLang's Triton attention backend (speculative metadata) against ``spec-indptr``."""

from __future__ import annotations

import pytest
import torch
from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import spec_config
from attnfuzz.kernels._triton import device
from attnfuzz.reference import spec_indptr as ref
from attnfuzz.reference.batch import Batch, Case

pytestmark = requires_sglang

TARGET = "spec-indptr"
ENGINE = "sglang-triton"
UPSTREAM = "upstream-pr27545-draft-extend-stride"


def case(phase: int, topk: int, steps: int, draft_tokens: int, graph: bool) -> Case:
    """Three requests of committed lengths 4, 1 and 7 in the graph of 4 (or eager)."""
    config = spec_config(num_spec=0, cudagraph_capture_sizes=(1, 2, 4))
    params = {
        "spec_phase": phase,
        "spec_topk": topk,
        "spec_steps": steps,
        "spec_draft_tokens": draft_tokens,
    }
    batch = Batch((3, 0, 6), (1, 1, 1), seed=3, use_cudagraph=graph)
    return Case(config, batch, tuple(sorted(params.items())))


def hand_inputs(phase: str, graph_bs: int | None) -> ref.SpecIndptrInputs:
    """Two requests on rows 2 and 1 of a 5-row pool (it holds the graph of 4),
    committed lengths 2 and 1, N = 2;
    row 0 is the reserved one, zeros; graphs of 1 and 4 requests."""
    table = torch.tensor(
        [[0, 0, 0, 0, 0], [7, 8, 9, 40, 41], [3, 4, 5, 6, 42], [43] * 5, [44] * 5],
        dtype=torch.int32,
        device=device(),
    )
    return ref.SpecIndptrInputs(
        phase=phase,
        spec=ref.SpecConfig(topk=2, num_steps=1, num_draft_tokens=2),
        req_to_token=table,
        req_pool_indices=torch.tensor([2, 1], device=device()),
        seq_lens=torch.tensor([2, 1], device=device()),
        graph_bs=graph_bs,
        capture_bs=(1, 4),
        config=spec_config(),
    )


def run(impl: str, inputs: ref.SpecIndptrInputs) -> ref.SpecIndptrOutputs:
    return get_target(TARGET).implementations[impl].fn(inputs)


def test_target_verify_eager_by_hand():
    """Rows 2 and 1, committed 2 and 1, N = 2: SGLang's eager verify metadata."""
    got = run(ENGINE, hand_inputs(ref.TARGET_VERIFY, None))
    assert got.qo_indptr.tolist() == [0, 2, 4]
    assert got.kv_indptr.tolist() == [0, 2, 3]
    assert got.kv_indices.tolist() == [3, 4, 7]
    assert got.mask_indptr.tolist() == [0, 8, 14]
    assert got.max_extend_len == 2


def test_target_verify_replay_pads_as_the_runner_pads():
    """Two requests in the graph of 4: the padding requests read row 0's first slot."""
    got = run(ENGINE, hand_inputs(ref.TARGET_VERIFY, 4))
    assert got.qo_indptr.tolist() == [0, 2, 4, 6, 8]
    assert got.kv_indptr.tolist() == [0, 2, 3, 4, 5]
    assert got.kv_indices[:5].tolist() == [3, 4, 7, 0, 0]
    assert got.mask_indptr.tolist() == [0, 8, 14, 20, 26]


@pytest.mark.parametrize("graph_bs", [None, 4])
def test_draft_extend_reads_the_committed_prefix(graph_bs):
    """Spec v2's draft extend: N rows per request, KV over the prefix before the window."""
    got = run(ENGINE, hand_inputs(ref.DRAFT_EXTEND, graph_bs))
    rows = 1 + (graph_bs or 2)
    assert got.qo_indptr.tolist() == [0, 2, 4, 6, 8][:rows]
    assert got.kv_indptr.tolist() == [0, 2, 3, 3, 3][:rows]
    assert got.kv_indices[:3].tolist() == [3, 4, 7]


def test_upstream_pr27545_strides_by_num_steps_plus_one():
    """topk 2, one step, N = 3: the pre-fix replay lays the queries 2 apart."""
    inputs = hand_inputs(ref.DRAFT_EXTEND, 4)
    inputs.spec = ref.SpecConfig(topk=2, num_steps=1, num_draft_tokens=3)
    assert run(ENGINE, inputs).qo_indptr.tolist() == [0, 3, 6, 9, 12]
    assert run(UPSTREAM, inputs).qo_indptr.tolist() == [0, 2, 4, 6, 8]
    eager = hand_inputs(ref.DRAFT_EXTEND, None)
    eager.spec = inputs.spec
    assert run(UPSTREAM, eager).qo_indptr.tolist() == [0, 3, 6]  # eager is unaffected


@pytest.mark.parametrize("phase", [0, 1])
@pytest.mark.parametrize("graph", [False, True])
def test_engine_passes_a_generated_case_of_each_path(phase, graph):
    target = get_target(TARGET)
    c = case(phase, 2, 2, 5, graph=graph)
    assert target.judge(target.resolve(ENGINE), c).ok
    assert target.judge(target.resolve(UPSTREAM), c).ok is not (phase == 1 and graph)


def test_kv_indices_are_int64_slots_of_the_table():
    got = run(ENGINE, hand_inputs(ref.TARGET_VERIFY, None))
    assert got.kv_indices.dtype == torch.int64 and got.kv_indptr.dtype == torch.int32
