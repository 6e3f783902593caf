"""vLLM 0.33.0's model runner V1 step on the HPC attention backend (``vllm-v1-hpc``):
``HpcAttnMetadataBuilder`` builds every step and capture, its decode task map made by
the stand-in of hpc-ops' scheduler, judged by the step's properties."""

from __future__ import annotations

import copy
import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def hpc():
    from attnfuzz.adapters.vllm import runner_step_hpc

    return runner_step_hpc


def spec_decode(block_size: int = 64) -> Trace:
    """``smallest_full_spec_decode`` at pages of ``block_size``: a prefill of 5 tokens,
    then a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    config = dataclasses.replace(trace.config, block_size=block_size, max_model_len=256)
    return Trace(config, trace.steps)


def test_the_hpc_builder_builds_every_step_and_capture(monkeypatch):
    """The builder builds the prefill, the verify (eager, padded, replayed, the drafter's
    sub-step) and the capture runs, and schedules each decode; every property holds,
    the replay's padding request reads no key and its task map is the replay's."""
    m = hpc()
    m.prepare()
    from vllm.v1.attention.backends.hpc_attn import HpcAttnMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(HpcAttnMetadataBuilder, "build")
    engine = m.HpcRunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    group = engine.graphs.runner.attn_groups[0][0]
    assert isinstance(group.get_metadata_builder(), HpcAttnMetadataBuilder)
    assert calls["build"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (replay,) = own(second, "replay")
    # The verify's 2 queries a request: the decode kernel finds the padding request's
    # at rows 2 and 3, and reads none of its keys.
    assert values(replay, "query_start_loc") == [0, 2, 4]
    assert values(replay, "kv_len") == [7, 0]
    assert values(replay, "hpc.task_map_stale") == [0, 0]


def test_pages_off_the_kernel_page_and_more_than_three_drafts_are_declined():
    """HPC's kernel block is 64 tokens and its decode kernel takes up to 3 drafts."""
    m = hpc()
    config = spec_decode().config
    assert "64" in m.declines_config(dataclasses.replace(config, block_size=32))
    assert m.declines_config(dataclasses.replace(config, block_size=128)) is None
    assert "3 speculative" in m.declines_config(dataclasses.replace(config, num_spec=4))
    assert m.declines_config(dataclasses.replace(config, num_spec=3)) is None


def test_a_task_map_made_anew_each_build_fails_at_replay(monkeypatch):
    """A ``build`` that hands the kernel a task map of its own (not the builder's
    workspace, refilled in place) is captured by the FULL graph, whose replay reads the
    capture's schedule beside the step's lengths: ``hpc.task_map_stale`` is out of range
    at the replay."""
    m = hpc()
    m.prepare()
    from vllm.v1.attention.backends.hpc_attn import HpcAttnMetadataBuilder

    original = HpcAttnMetadataBuilder.build

    def own_map(self, *args, **kwargs):
        metadata = copy.copy(original(self, *args, **kwargs))
        metadata.task_map = metadata.task_map.clone()
        return metadata

    monkeypatch.setattr(HpcAttnMetadataBuilder, "build", own_map)
    _, second = run_trace(spec_decode(), m.HpcRunnerStepEngine())
    found = {(v.build, v.field) for v in ref.violations(second)}
    assert ("replay", "hpc.task_map_stale") in found


def test_a_schedule_of_the_drafts_count_is_stale(monkeypatch):
    """A ``build`` that hands the scheduler the drafts (``mtp``, as hpc's docstring
    names the argument) where the op takes the queries a request: the task map is a
    schedule of 1 query a request beside a decode of 2, stale on every verify."""
    from attnfuzz.adapters import hpc_ops

    m = hpc()
    m.prepare()
    assign = hpc_ops.assign_attention_decode_task

    def drafts(num_seq_kvcache, task_map, num_head_kv, num_seq_q, *args, **kwargs):
        return assign(num_seq_kvcache, task_map, num_head_kv, num_seq_q - 1 or 1, *args, **kwargs)

    monkeypatch.setattr(hpc_ops, "assign_attention_decode_task", drafts)
    _, second = run_trace(spec_decode(), m.HpcRunnerStepEngine())
    stale = {v.build for v in ref.violations(second) if v.field == "hpc.task_map_stale"}
    assert {"eager", "replay"} <= stale
