"""SGLang's decode graph runner step on the HPC-Ops backend (runner-step's
``sglang-hpc-ops``): every build on pages of 64, its decode task map made by the
stand-in of hpc-ops' scheduler, judged by the step's properties."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.sglang.testing import arrive_then_decode as _arrive_then_decode
from attnfuzz.adapters.sglang.testing import field_values as _values
from attnfuzz.adapters.sglang.testing import life, requires_sglang
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang


def _life(trace: Trace) -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new engine of ``runner_step_hpc_ops.run``."""
    from attnfuzz.adapters.sglang import runner_step_hpc_ops

    return life(runner_step_hpc_ops.run, trace)


def _trace() -> Trace:
    """Three requests arrive, then decode in the graph of four, on pages of 64."""
    trace = _arrive_then_decode(num_spec=0)
    return Trace(dataclasses.replace(trace.config, block_size=64), trace.steps)


def test_a_decode_of_three_requests_replays_the_graph_of_four_with_its_task_map():
    """The eager decode and the graph's replay (its in-graph preparation run again by
    the graph stand-in) hold the step's lengths, pages and a task map of those lengths;
    the extend before holds its query offsets."""
    first, second = _life(_trace())
    assert _values(first, "eager", "cu_seqlens_q") == [0, 5, 8, 9]
    assert _values(first, "eager", "max_seq_len_q") == [5, 5, 5]
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    assert _values(second, "eager", "cache_seqlens_int32") == [6, 4, 2]
    for how in ("padded", "replay"):
        # The padding request: the fill length 1 on the reserved row 0, its page 0.
        assert _values(second, how, "cache_seqlens_int32") == [6, 4, 2, 1], how
        assert [row[:1] for row in _values(second, how, "page_table")] == [[1], [3], [5], [0]]
        assert _values(second, how, "hpc.task_map_stale") == [0, 0, 0, 0], how
        assert _values(second, how, "kv_slots")[0][:6] == [64, 65, 66, 67, 68, 69], how
    assert _values(second, "eager", "hpc.task_map_stale") == [0, 0, 0]
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_a_task_map_scheduled_at_capture_alone_fails_at_replay(monkeypatch):
    """A graph whose recorded preparation leaves the task map as its capture scheduled
    it (the schedule not recorded in the graph): the replay's decode kernel reads the
    last schedule made, the eager decode's of three requests, beside the replay's four
    lengths: ``hpc.task_map_stale`` out of range in the padded and replayed builds."""
    from sglang.srt.layers.attention.hpc_ops_backend import HPCOpsAttnBackend

    original = HPCOpsAttnBackend.init_forward_metadata_in_graph
    captured: set[int] = set()

    def scheduled_once(self, forward_batch):
        if forward_batch.batch_size not in captured:
            captured.add(forward_batch.batch_size)
            return original(self, forward_batch)
        workspace, self._decode_task_map = self._decode_task_map, None
        try:
            original(self, forward_batch)
        finally:
            self._decode_task_map = workspace
        self.forward_metadata.hpc_task_map = workspace

    monkeypatch.setattr(HPCOpsAttnBackend, "init_forward_metadata_in_graph", scheduled_once)
    _, second = _life(_trace())
    found = {(v.build, v.field) for v in ref.violations(second)}
    assert {("padded", "hpc.task_map_stale"), ("replay", "hpc.task_map_stale")} <= found
