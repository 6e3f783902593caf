"""vLLM 0.33.0's model runner V1 step on the b12x paged attention backend
(``vllm-v1-b12x``): ``B12xPagedMetadataBuilder`` builds every step and capture, judged
by the step's properties."""

from __future__ import annotations

import copy
import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def b12x():
    from attnfuzz.adapters.vllm import runner_step_b12x

    return runner_step_b12x


def spec_decode(block_size: int = 64) -> Trace:
    """``smallest_full_spec_decode`` at pages of ``block_size``: a prefill of 5 tokens,
    then a verify of 2 padded to the FULL graph of 2 requests."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    trace = runner_step_hybrid.smallest_full_spec_decode()
    config = dataclasses.replace(trace.config, block_size=block_size, max_model_len=256)
    return Trace(config, trace.steps)


def test_the_b12x_builder_builds_every_step_and_capture(monkeypatch):
    """The builder builds the prefill, the verify (eager, padded, replayed, the drafter's
    sub-step) and the capture runs of a cache of separate K and V planes; every property
    holds, the replay's padding request reads no key."""
    m = b12x()
    m.prepare()
    from vllm.v1.attention.backends.b12x import B12xPagedMetadataBuilder

    calls = Calls(monkeypatch)
    calls.count(B12xPagedMetadataBuilder, "build")
    engine = m.B12xRunnerStepEngine()
    first, second = run_trace(spec_decode(), engine)
    group = engine.graphs.runner.attn_groups[0][0]
    assert isinstance(group.get_metadata_builder(), B12xPagedMetadataBuilder)
    assert group.kv_cache_spec.num_head_slots == 2
    assert calls["build"] > 0
    assert ref.violations(first) == [] and ref.violations(second) == []
    (replay,) = own(second, "replay")
    assert values(replay, "seq_lens") == [7, 0]
    assert values(replay, "kv_len") == [7, 0]


def test_pages_under_the_smallest_kernel_page_are_declined():
    """b12x's kernel pages are 64 or 128 tokens: pages of 32 are declined, 128 are not."""
    m = b12x()
    config = spec_decode().config
    assert "64 or 128" in m.declines_config(dataclasses.replace(config, block_size=32))
    assert m.declines_config(dataclasses.replace(config, block_size=128)) is None


def test_a_builder_that_hands_a_copy_of_seq_lens_fails_replay_equals_eager(monkeypatch):
    """A ``build`` that hands the kernels a copy of the runner's ``seq_lens`` (not its
    persistent buffer) is captured by the FULL graph, whose replay reads the capture's
    lengths: replay equals eager fails on ``seq_lens``."""
    m = b12x()
    m.prepare()
    from vllm.v1.attention.backends.b12x import B12xPagedMetadataBuilder

    original = B12xPagedMetadataBuilder.build

    def copied(self, *args, **kwargs):
        metadata = copy.copy(original(self, *args, **kwargs))
        metadata.seq_lens = metadata.seq_lens.clone()
        return metadata

    monkeypatch.setattr(B12xPagedMetadataBuilder, "build", copied)
    _, second = run_trace(spec_decode(), m.B12xRunnerStepEngine())
    stale = {v.field for v in ref.violations(second) if v.prop == "replay equals eager"}
    assert "seq_lens" in stale
