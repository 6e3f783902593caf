"""vLLM 0.33.0's model runner V1 step on the FlexAttention backend, as the implementation
``vllm-v1-flex`` of ``runner-step``: ``FlexAttentionMetadataBuilder`` builds every step,
each request's computed tokens held to its offsets and the keys read as the kernel's mask
makes them; the drafter's stale offsets seen by the kept-apart implementation."""

from __future__ import annotations

import dataclasses

from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def flex():
    from attnfuzz.adapters.vllm import runner_step_flex

    return runner_step_flex


def prefill_then_decode(num_spec: int) -> Trace:
    """Two requests prefill 5 and 3 tokens (pages 1 and 2 of 16), then decode."""
    trace = flex().smallest_draft_offsets_stale()
    config = dataclasses.replace(trace.config, max_model_len=32, max_num_seqs=2,
                                 max_num_batched_tokens=16, num_spec=num_spec)  # fmt: skip
    q = 1 + num_spec
    return Trace(config, (
        Batch((0, 0), (5, 3), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((5, 3), (q, q), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 0)),
    ))  # fmt: skip


def test_the_flex_builder_builds_every_step_and_each_offset_is_the_context(monkeypatch):
    """``FlexAttentionMetadataBuilder.build`` runs on every build; a request's
    ``decode_offset`` is its context before the step's tokens, and its last token sees
    all its keys, through its pages (16 a page); every property holds."""
    m = flex()
    m.prepare()
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadataBuilder

    builds = Calls(monkeypatch)
    builds.count(FlexAttentionMetadataBuilder, "build")
    outs = run_trace(prefill_then_decode(0), m.FlexRunnerStepEngine())
    assert builds["build"] >= 4
    assert [ref.violations(o) for o in outs] == [[], []]
    (prefill,) = own(outs[0], "eager")
    assert values(prefill, "flex.decode_offset") == [0, 0]
    assert values(prefill, "kv_len") == [5, 3]
    (decode,) = own(outs[1], "eager")
    assert values(decode, "flex.decode_offset") == values(decode, "flex.context_lens") == [5, 3]
    assert values(decode, "kv_len") == [6, 4]
    assert decode.field("kv_slots").values[1][:4].tolist() == [32, 33, 34, 35]


def test_the_drafter_s_later_sub_steps_keep_the_first_pass_s_offsets():
    """One request prefills one token, two drafts: the second sub-step's draft token (at
    position 1, context 1) is handed the first pass's offset 0, so the mask lets it see
    key 0 alone. The kept-apart implementation says so; ``vllm-v1-flex`` leaves the
    later sub-steps' offsets unjudged."""
    m = flex()
    m.prepare()
    trace = m.smallest_draft_offsets_stale()
    (main,) = run_trace(trace, m.FlexRunnerStepEngine())
    assert ref.violations(main) == []
    (kept,) = run_trace(trace, m.draft_offsets_stale)
    found = ref.violations(kept)
    assert {(v.prop, v.field) for v in found} == {
        ("agreement within a build", "flex.decode_offset")
    }
    assert {v.build for v in found} == {"eager.draft1", "padded.draft1", "fresh.draft1"}
    later = {b.name: b for b in kept.builds}["eager.draft1"]
    assert values(later, "flex.decode_offset") == [0]
    assert values(later, "flex.context_lens") == [1]
    assert values(later, "kv_len") == [1]


def test_an_offset_off_by_one_fails_the_agreement_on_the_target_s_step(monkeypatch):
    """The agreement judges the offsets wherever they are wrong: a build whose offsets
    are one short fails it on the target's own forward."""
    m = flex()
    m.prepare()
    from vllm.v1.attention.backends.flex_attention import FlexAttentionMetadataBuilder

    original = FlexAttentionMetadataBuilder.build

    def build(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        meta.decode_offset[: meta.num_reqs] -= 1
        return meta

    monkeypatch.setattr(FlexAttentionMetadataBuilder, "build", build)
    outs = run_trace(prefill_then_decode(0), m.FlexRunnerStepEngine())
    assert ("agreement within a build", "flex.decode_offset", "eager") in {
        (v.prop, v.field, v.build) for v in ref.violations(outs[1])
    }


def test_pages_not_a_multiple_of_16_are_declined():
    m = flex()
    config = m.smallest_draft_offsets_stale().config
    assert "multiples of 16" in m.declines_config(dataclasses.replace(config, block_size=8))
    assert m.declines_config(config) is None


def test_a_full_capture_past_the_model_length_s_pages_raises_and_is_declined():
    """FULL graphs of a 66-token capture under ``max_model_len`` 48 (pages of 16, rows of
    8 columns): each dummy request's seq_len 66 takes 5 columns, the builder's persistent
    buffer 3 (the trace CI's search drew). The kept-apart entry raises in the capture;
    ``vllm-v1-flex`` declines it; FULL_AND_PIECEWISE (FULL for uniform decodes only), and
    a capture within the pages, run."""
    from attnfuzz.harness.registry import get_target

    m = flex()
    config = dataclasses.replace(
        m.smallest_capture_past_model_len().config, max_model_len=48, max_num_seqs=7,
        max_num_batched_tokens=90, num_spec=2, cudagraph_capture_sizes=(6, 39, 66),
    )  # fmt: skip
    step = Batch((0, 0), (15, 31), req_ids=(0, 1), pages=((1, 2), (3, 4, 5)), new_pages=(2, 3))
    trace = Trace(config, (step,))
    assert m.capture_past_model_len(config)
    why = m.declines(trace.case(0))
    assert why is not None and "vllm-v1-flex-capture-past-model-len" in why
    assert m.declines_engine(trace.case(0)) is None
    target = get_target("runner-step")
    verdict = target.judge_trace(target.resolve("vllm-v1-flex-capture-past-model-len"), trace)
    assert not verdict.ok and "RuntimeError" in str(verdict)
    for fine in (
        dataclasses.replace(config, cudagraph_mode="FULL_AND_PIECEWISE"),
        dataclasses.replace(config, cudagraph_capture_sizes=(6, 39, 48)),
    ):
        assert not m.capture_past_model_len(fine)
        assert target.judge_trace(target.resolve("vllm-v1-flex"), Trace(fine, (step,))).ok
