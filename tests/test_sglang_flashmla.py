"""SGLang's FlashMLA backend against ``mla-block-table``: eager and replayed, its
``flash_mla`` schedule stand-in, and the live graph-table defect at contexts just short
of a multiple of 64."""

from __future__ import annotations

import pytest
import torch
from attnfuzz.adapters.sglang import flashmla
from attnfuzz.adapters.sglang.testing import sglang_test
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import mla_block_table as t
from attnfuzz.harness.testing import nightly_seeds, spec_config
from attnfuzz.reference import mla_block_table as ref
from attnfuzz.reference.batch import Batch, Case

TARGET = "mla-block-table"
ENGINE, CONTEXT_LEN = "sglang-flashmla", "sglang-flashmla-context-len"


def case(phase: int, computed=(3, 0, 5), graph=True, **config) -> Case:
    """Three requests of one new token, next_n 2; graphs of 1, 2 and 4 requests; pages
    of 64 tokens (FlashMLA's one page size)."""
    base = dict(cudagraph_capture_sizes=(2, 4, 8), max_model_len=16)
    base.update(config)
    params = {"mla_phase": phase, "mla_page_log2": 6}
    batch = Batch(tuple(computed), (1,) * len(computed), seed=11, use_cudagraph=graph)
    return Case(spec_config(**base), batch, tuple(sorted(params.items())))


def run(impl: str, c: Case) -> ref.MlaBlockTableOutputs:
    return get_target(TARGET).implementations[impl].fn(ref.make_inputs(c))


@sglang_test
def test_target_verify_and_draft_extend_replayed_by_hand():
    """A verify: KV 4 + 2, 1 + 2, 6 + 2 and a padding request's 1 + 2 in the graph of 4,
    the queries dense (no layout); a draft extend: the forward's lengths, the window of
    N = 2 rows the backend lays each request's queries out by."""
    verify = run(ENGINE, case(0))
    assert verify.seq_lens_k.tolist() == [6, 3, 8, 3]
    assert verify.cu_seqlens_q is None and verify.max_seq_len_q is None
    extend = run(ENGINE, case(1))
    assert extend.seq_lens_k.tolist() == [6, 3, 8, 1]
    assert extend.cu_seqlens_q.tolist() == [0, 2, 4, 6, 8] and extend.max_seq_len_q == 2
    assert extend.block_kv_indices[3, 0].item() == 0  # the padding request's row 0


@sglang_test
@pytest.mark.parametrize("phase", [0, 1])
@pytest.mark.parametrize("graph", [False, True])
def test_engine_passes_each_path(phase, graph):
    target = get_target(TARGET)
    assert target.judge(target.resolve(ENGINE), case(phase, graph=graph)).ok


@sglang_test
def test_context_len_defect_a_verified_kv_past_a_4095_token_context():
    """SGLang's sizing at a context of 4095: a prefix of 4094 tokens (context_len - 4,
    plus the 3 the verify before accepted) + 3 query rows need 65 pages of 64, the
    graph's rows have (4095 + 64) // 64 = 64; the engine built with the table's width
    passes, and a KV of 4096 fits."""
    target = get_target(TARGET)
    smallest = t.smallest_kv_past_flashmla_table()
    assert t.trigger_kv_past_flashmla_table(smallest)
    verdict = target.judge(target.resolve(CONTEXT_LEN), smallest)
    assert [(m.check, m.where) for m in verdict.mismatches] == [("shape", "block_kv_indices")]
    assert target.judge(target.resolve(ENGINE), smallest).ok
    fits = Case(smallest.config, Batch((4092,), (1,), seed=4), smallest.params)  # KV 4096
    assert not t.trigger_kv_past_flashmla_table(fits)
    assert target.judge(target.resolve(CONTEXT_LEN), fits).ok
    inputs = ref.make_inputs(smallest)
    assert flashmla.run_context_len(inputs).block_kv_indices.shape[1] == 64


@sglang_test
@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, *nightly_seeds()])
def test_context_len_defect_minimizes_inside_sglangs_limits(seed, tmp_path, capsys):
    """``attnfuzz run`` finds the defect at each seed, its witness a step SGLang reaches
    (read with SGLang's limits themselves) with three query rows or more."""
    from attnfuzz.adapters.sglang.limits import flashmla_admits
    from attnfuzz.harness.casefile import read_case
    from attnfuzz.harness.cli import main

    argv = ["run", "--target", TARGET, "--impl", CONTEXT_LEN, "--seed", str(seed)]
    assert main([*argv, "--max-examples", "1000", "--out", str(tmp_path)]) == 1
    assert "[shape] block_kv_indices: expected [" in capsys.readouterr().out
    (path,) = tmp_path.glob("*.json")
    found = read_case(path)["case"]
    assert flashmla_admits(ref.make_inputs(found)) is None
    assert t.trigger_kv_past_flashmla_table(found) and found.config.next_n >= 3


def test_flashmla_admits_pages_of_64_and_the_scheduler_s_prefixes_only():
    """SGLang runs FlashMLA on pages of 64 only, and no running request verifies a prefix
    past ``context_len - 4 + S``."""
    from attnfuzz.adapters.sglang.limits import flashmla_admits

    smallest = t.smallest_kv_past_flashmla_table()
    assert flashmla_admits(ref.make_inputs(smallest)) is None
    pages_32 = Case(smallest.config, smallest.batch, (("mla_page_log2", 5), ("mla_phase", 0)))
    assert "pages of 64" in flashmla_admits(ref.make_inputs(pages_32))
    config = spec_config(num_spec=2, max_model_len=4095, cudagraph_capture_sizes=(3,))
    past = Case(config, Batch((4094,), (1,), seed=4), smallest.params)  # prefix 4095 > 4094
    assert "past 4094" in flashmla_admits(ref.make_inputs(past))


def test_the_legacy_schedule_has_the_vendor_s_shapes_and_refuses_other_lengths():
    """``flash_mla.get_mla_decoding_metadata``'s stand-in: ``[num_sm_parts, 8]`` and
    ``[batch + 1]`` int32; lengths not int32 refused as the op refuses them (a finding,
    never attnfuzz's fault)."""
    from attnfuzz.adapters.sglang.runner_step_deepseek_v4 import get_mla_decoding_metadata
    from attnfuzz.adapters.standins import VendorContractError
    from attnfuzz.harness.blame import attnfuzz_fault

    schedule, splits = get_mla_decoding_metadata(torch.tensor([5, 9], dtype=torch.int32), 32, 1)
    assert schedule.shape == (132, 8) and schedule.dtype == torch.int32
    assert splits.tolist() == [0, 1, 2] and splits.dtype == torch.int32
    assert get_mla_decoding_metadata(torch.tensor([5], dtype=torch.int32), 128, 1)[0].shape[0] == 66
    with pytest.raises(VendorContractError, match="int32") as refused:
        get_mla_decoding_metadata(torch.tensor([5]), 32, 1)
    assert attnfuzz_fault(refused.value, refused.tb) is None
