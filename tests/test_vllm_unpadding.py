"""vLLM 0.33.0's graph padding (model runner V2) and ``unpadded`` as the implementation ``vllm``."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets import unpadding as target_module
from attnfuzz.harness.testing import assert_detected, assert_passes
from attnfuzz.reference import unpadding as ref

pytestmark = requires_vllm

TARGET = "unpadding"
UPSTREAM = "upstream-pr36580-stale-slots"


def test_vllm_passes():
    assert_passes(TARGET, "vllm", max_examples=100)


def test_upstream_pr36580_detected():
    assert_detected(TARGET, UPSTREAM, max_examples=300)


def test_vllm_unpadded_is_views_with_the_padded_max_query_len():
    """Fidelity: the reference's ``unpadded`` copies (host NumPy) and recomputes
    ``max_query_len``; vLLM's slices (views of the padded fields, which are views of
    the runner's persistent buffers) and keeps ``max_query_len``. The oracle asks for
    views, and the maximum over the real requests equals the padded one because padding
    requests carry no token; the copying mutant is still caught."""
    from attnfuzz.adapters.vllm import unpadding as adapter

    case = target_module.smallest_padded()
    out = adapter.run(ref.make_inputs(case))
    for field in ref.FIELDS:
        unpadded, padded = getattr(out.unpadded, field), getattr(out.padded, field)
        assert unpadded.data_ptr() == padded.data_ptr() == out.buffers[field].data_ptr()
    assert out.unpadded.max_query_len == 2
    assert out.padded.slot_mapping[6:].tolist() == [-1, -1]
    t = get_target(TARGET)
    assert t.judge(t.resolve("vllm"), case).ok
    assert not t.judge(t.resolve("unpadded-copy"), case).ok


def test_upstream_pr36580_leaves_the_padded_tokens_stale():
    from attnfuzz.adapters.vllm import unpadding as adapter

    case = target_module.smallest_padded()
    inputs = ref.make_inputs(case)
    stale = inputs.slot_mapping_buffer[6:8].tolist()
    assert adapter.upstream_stale_slots(inputs).padded.slot_mapping[6:].tolist() == stale
    t = get_target(TARGET)
    assert not t.judge(t.resolve(UPSTREAM), case).ok
    assert not t.judge(t.resolve("stale-slots"), case).ok
