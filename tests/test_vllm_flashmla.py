"""vllm-v1-flashmla: FlashMLA's decoding schedule stood in by its contract, and the one
field its builder's graph buffers are judged by."""

from __future__ import annotations

import pytest
import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref

pytestmark = requires_vllm


def flashmla():
    from attnfuzz.adapters.vllm import runner_step_flashmla

    return runner_step_flashmla


def test_the_schedule_refuses_what_flashmla_refuses():
    """A refusal is the engine's misuse of FlashMLA's contract: a finding, though
    attnfuzz's frame raised it (harness/blame.py), not attnfuzz's fault."""
    from attnfuzz.harness.blame import attnfuzz_fault

    fm = flashmla()
    with pytest.raises(fm.VendorContractError, match="int32") as refused:
        fm.decoding_schedule(torch.tensor([3], dtype=torch.int64), 2, 1)
    assert attnfuzz_fault(refused.value, refused.tb) is None


def test_one_short_request_is_one_split_of_the_first_part():
    """One request of 1 key, 2 query tokens a KV head: 132 parts (each 64 query tokens
    a KV head takes one SM); the first holds the request whole, the others nothing."""
    tiles, splits = flashmla().decoding_schedule(torch.tensor([1], dtype=torch.int32), 2, 1)
    assert tiles.shape == (132, 8) and tiles.dtype == torch.int32
    assert tiles[0, :5].tolist() == [0, 0, 0, 1, 0]
    assert splits.tolist() == [0, 1]


def test_a_long_request_is_split_across_parts_and_every_request_is_scheduled():
    """Parts shrink as the query tokens a KV head grow (132 // 2 for 65 to 128); a
    request longer than a part's payload is split, and the split offsets count each
    request's parts."""
    seqlens = torch.tensor([64 * 40, 3, 0], dtype=torch.int32)
    tiles, splits = flashmla().decoding_schedule(seqlens, 128, 1)
    assert tiles.shape == (66, 8)
    s = splits.tolist()
    assert s[0] == 0 and all(a <= b for a, b in zip(s, s[1:], strict=False))
    assert s[1] > 1  # the long request is split
    assert s[2] - s[1] == 1 and s[3] - s[2] == 1  # the short ones are whole
    assert int(tiles[:, 0].max()) <= len(seqlens)


def test_the_graph_buffers_dropped_fail_only_schedule_stale():
    """The mutant hands the kernel FlashMLA's fresh schedule, not the graph buffers' copy:
    the FULL graph's replay reads the capture's schedule; the fixed builder's passes."""
    fm = flashmla()
    trace = fm.smallest_full_decode()
    for run, fails in ((fm.run, False), (fm.schedule_not_persistent, True)):
        run.new_engine()
        found = [v for case in trace.cases() for v in ref.violations(run(ref.make_inputs(case)))]
        assert bool(found) == fails
        assert {v.field for v in found} <= {"flashmla.schedule_stale"}
