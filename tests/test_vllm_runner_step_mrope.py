"""vLLM 0.33.0's V2 runner with an M-RoPE model (``vllm-mrope``): the default model
state's ``RopeState`` (``init_prefill_positions``, ``prepare_positions``' kernel) handed
the model, each channel's row judged by the step's properties and against the 1-D
positions, and a mutant of the computed tokens it positions from caught."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_mrope

    return runner_step_mrope


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def channels(build: ref.StepBuild) -> list[list[int]]:
    return [build.field(f"mrope.positions[{c}]").values.tolist() for c in range(3)]


def test_the_model_state_hands_the_model_its_rope_positions_and_every_property_holds():
    """A request prefills 3 tokens, then decodes its 4th in a FULL graph of 2 tokens: the
    default model state keeps a ``RopeState`` of three channels, and every build of the
    step's tokens gives each channel the token's position (the decode's 3); every
    property holds."""
    a = adapter()
    a.prepare()
    engine = a.MRoPERunnerStepEngine()
    prefill, decode = run(engine, a.smallest_computed_one_short())
    rope = engine.eager.runner.model_state.rope_state
    assert rope is not None and rope.num_dims == 3
    for out in (prefill, decode):
        assert ref.violations(out) == []
    (eager,) = prefill.of("eager")
    assert channels(eager) == [[0, 1, 2]] * 3
    for how in ("eager", "padded", "replay", "fresh"):
        (build,) = decode.of(how)
        assert [row[:1] for row in channels(build)] == [[3]] * 3, how


def test_computed_tokens_one_short_are_caught():
    """The mutant ``vllm-mrope-computed-one-short`` (``prepare_positions`` handing its
    kernel the computed tokens one short): the decode token's channels are 2 where its
    position is 3, in every build of the step; the first prefill is untouched."""
    a = adapter()
    trace = a.smallest_computed_one_short()
    assert a.trigger_computed_one_short(trace)
    assert not a.trigger_computed_one_short(Trace(trace.config, trace.steps[:1]))
    a.run_computed_one_short.new_engine()
    prefill, decode = run(a.run_computed_one_short, trace)
    assert ref.violations(prefill) == []
    found = {(v.prop, v.field, v.build) for v in ref.violations(decode)}
    assert found == {
        ("agreement within a build", f"mrope.positions[{c}]", how)
        for c in range(3)
        for how in ("eager", "padded", "replay", "fresh")
    }, found
