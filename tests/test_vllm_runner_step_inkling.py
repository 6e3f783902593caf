"""vLLM 0.33.0's model runner V1 step of an Inkling model (``vllm-v1-inkling``,
``vllm-v1-inkling-rocm``): ``InklingSconvMetadataBuilder`` of the short-convolution
state's sliding-window group builds every step and capture, judged by the step's
properties."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def inkling():
    from attnfuzz.adapters.vllm import runner_step_inkling

    return runner_step_inkling


def spec_decode() -> Trace:
    """``smallest_full_spec_decode``: a prefill of 5 tokens on page 1 (pages of 16), then
    a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    return runner_step_hybrid.smallest_full_spec_decode()


@pytest.mark.parametrize("platform", ["nvidia", "amd"])
def test_the_sconv_builder_builds_every_step_and_capture(monkeypatch, platform):
    """Each platform's builder builds the prefill, the verify (eager, padded, replayed)
    and the capture runs of the 4-token window group; every property holds. The
    prefill's tokens store their state in page 1's quarters (blocks 4 to 7, slots 16
    on); the verify's padding tokens store none."""
    m = inkling()
    m.prepare()
    builder = m._module(platform).InklingSconvMetadataBuilder
    calls = Calls(monkeypatch)
    calls.count(builder, "build")
    engine = (
        m.InklingRunnerStepEngine() if platform == "nvidia" else m.RocmInklingRunnerStepEngine()
    )
    first, second = run_trace(spec_decode(), engine)
    (group,) = engine.graphs.runner.attn_groups[1]
    assert type(group.get_metadata_builder()) is builder
    assert calls["build"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (prefill,) = own(first, "eager")
    assert values(prefill, "sconv.slot_mapping") == [16, 17, 18, 19, 20]
    (replay,) = own(second, "replay")
    assert values(replay, "sconv.slot_mapping") == [21, 22, -1, -1]
    assert values(replay, "sconv.seq_idx") == [0, 0, 0, 0]


def test_pages_of_no_whole_convolution_blocks_are_declined():
    """The group's blocks are 4 tokens: pages of 16 hold four, pages of 18 do not."""
    m = inkling()
    config = spec_decode().config
    assert "whole convolution blocks" in m.declines_config(
        dataclasses.replace(config, block_size=18)
    )
    assert m.declines_config(config) is None


def test_a_sconv_slot_mapping_made_anew_each_build_fails_replay_equals_eager(monkeypatch):
    """A ``build`` that hands the kernel a copy of the group's slot mapping (not the
    runner's buffer, rewritten in place) is captured by the FULL graph, whose replay
    stores at the capture's slots: replay equals eager fails on ``sconv.slot_mapping``."""
    m = inkling()
    m.prepare()
    builder = m._module("nvidia").InklingSconvMetadataBuilder
    original = builder.build

    def copied(self, *args, **kwargs):
        metadata = copy.copy(original(self, *args, **kwargs))
        metadata.slot_mapping = metadata.slot_mapping.clone()
        return metadata

    monkeypatch.setattr(builder, "build", copied)
    _, second = run_trace(spec_decode(), m.InklingRunnerStepEngine())
    stale = {v.field for v in ref.violations(second) if v.prop == "replay equals eager"}
    assert "sconv.slot_mapping" in stale


def test_padding_tokens_that_store_at_the_last_real_slot_fail_safe_padding(monkeypatch):
    """A ``build`` whose padding tokens repeat the last real token's slot (where the
    kernel requires -1) stores a padding row's state over a real token's: padding
    writes no real state fails on ``sconv.slot_mapping`` of the padded verify."""
    m = inkling()
    m.prepare()
    builder = m._module("nvidia").InklingSconvMetadataBuilder
    original = builder.build

    def repeated(self, common_prefix_len, common_attn_metadata, fast_build=False):
        metadata = original(self, common_prefix_len, common_attn_metadata, fast_build)
        real = int(common_attn_metadata.query_start_loc_cpu[-1])
        if 0 < real < metadata.slot_mapping.shape[0]:
            metadata.slot_mapping[real:] = metadata.slot_mapping[real - 1]
        return metadata

    monkeypatch.setattr(builder, "build", repeated)
    _, second = run_trace(spec_decode(), m.InklingRunnerStepEngine())
    found = {(v.prop, v.field, v.build) for v in ref.violations(second)}
    assert ("padding writes no real state", "sconv.slot_mapping", "padded") in found
