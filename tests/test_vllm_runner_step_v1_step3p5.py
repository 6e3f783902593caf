"""vLLM 0.33.0's V1 runner with a Step3.5 model's MTP layers a draft
(``vllm-v1-step3p5-mtp``): its ``Step3p5MTPProposer`` run whole after each step by the
runner's own ``sample_tokens``, each draft forward a build judged by the step's
properties, and a mutant of a draft step's padding slots caught."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_step3p5

    return runner_step_v1_step3p5


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_each_draft_forward_is_a_build_and_every_property_holds():
    """Three requests prefill, then two of them decode with both drafts. After each step
    ``sample_tokens`` proposes with the runner's ``Step3p5MTPProposer`` (the runner's
    per-group block tables and slot mappings, its own attention groups): a first pass
    over the step's tokens, then a draft step of one token a request, on every engine.
    Every property holds."""
    a = adapter()
    engine = a.Step3p5RunnerStepEngine()
    outs = run(engine, a.smallest_padding_slots_stale())
    from vllm.v1.spec_decode.step3p5 import Step3p5MTPProposer

    assert isinstance(engine.eager.runner.drafter, Step3p5MTPProposer)
    for out in outs:
        assert ref.violations(out) == []
    for out, (reqs, tokens) in zip(outs, ((3, 9), (2, 6)), strict=True):
        for how in ("eager", "padded", "fresh"):
            subs = [b for b in out.builds if b.how == how and b.draft is not None]
            assert [(b.draft, b.num_tokens) for b in subs] == [(0, tokens), (1, reqs)], how
    (step,) = [b for b in outs[1].builds if b.how == "eager" and b.draft == 1]
    # Requests 7 and 9 accepted both drafts (5 and 7 tokens): draft positions 5 and 7.
    assert {f.name: f.values.tolist() for f in step.fields}["positions"] == [5, 7]


def test_stale_padding_slots_are_caught():
    """The mutant ``vllm-v1-step3p5-mtp-padding-slots-stale`` (the draft step's slot
    update not padding the rows past the batch): the padded draft step's padding rows
    keep the first pass's slots, keys requests 7 and 9 read."""
    a = adapter()
    trace = a.smallest_padding_slots_stale()
    assert a.trigger_padding_slots_stale(trace)
    a.run_padding_slots_stale.new_engine()
    outs = run(a.run_padding_slots_stale, trace)
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {("padding writes no real KV", "slot_mapping", "padded.draft1")}, found
