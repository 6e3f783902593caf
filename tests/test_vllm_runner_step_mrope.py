"""vLLM 0.33.0's runners with an M-RoPE model: V1's own ``mrope_positions``
(``vllm-v1-mrope``: ``_init_mrope_positions``, ``_calc_mrope_positions``, their copy in
``_prepare_inputs``) and V2's ``RopeState`` (``vllm-mrope``: ``init_prefill_positions``,
``prepare_positions``' kernel) handed the model, each channel's row judged by the step's
properties and against the 1-D positions (the property alone too), and a mutant of each
runner's positions caught."""

from __future__ import annotations

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, EngineConfig
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_mrope

    return runner_step_v1_mrope


def v2_adapter():
    from attnfuzz.adapters.vllm import runner_step_mrope

    return runner_step_mrope


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def channels(build: ref.StepBuild) -> list[list[int]]:
    return [build.field(f"mrope.positions[{c}]").values.tolist() for c in range(3)]


def every_channel_is_the_position(prefill: ref.RunnerStepOutputs, decode: ref.RunnerStepOutputs):
    """Every property holds on both steps; the prefill's channels are 0, 1, 2 and every
    build of the decode's tokens gives its token position 3, in each channel and in the
    1-D positions."""
    for out in (prefill, decode):
        assert ref.violations(out) == []
    (eager,) = prefill.of("eager")
    assert channels(eager) == [[0, 1, 2]] * 3
    for how in ("eager", "padded", "replay", "fresh"):
        (build,) = decode.of(how)
        assert [row[:1] for row in channels(build)] == [[3]] * 3, how
        assert build.field("positions").values[:1].tolist() == [3], how


def caught_on_the_decode_alone(mutant, trigger, trace: Trace) -> None:
    """``mutant`` on ``trace`` (a prefill, then a decode of the same request): its
    trigger holds on the trace, not on the prefill alone; the prefill holds every
    property; the decode fails agreement within a build on each channel of every build
    of its tokens, and nothing else."""
    assert trigger(trace)
    assert not trigger(Trace(trace.config, trace.steps[:1]))
    mutant.new_engine()
    prefill, decode = run(mutant, trace)
    assert ref.violations(prefill) == []
    found = {(v.prop, v.field, v.build) for v in ref.violations(decode)}
    assert found == {
        ("agreement within a build", f"mrope.positions[{c}]", how)
        for c in range(3)
        for how in ("eager", "padded", "replay", "fresh")
    }, found


def test_the_runner_hands_the_model_its_m_rope_positions_and_every_property_holds():
    """A request prefills 3 tokens, then decodes its 4th on a FULL graph of 2 tokens: the
    runner keeps ``mrope_positions`` (the model config declares ``mrope_section``), and
    every build holds each channel's row beside the 1-D positions; the eager, padded,
    replayed and fresh builds give every channel of the decode token its position 3.
    Every property holds."""
    a = adapter()
    a.prepare()
    engine = a.MRoPERunnerStepEngine()
    prefill, decode = run(engine, a.smallest_completion_from_tokens())
    runner = engine.eager.runner
    assert runner.uses_mrope and runner.mrope_positions.gpu.shape[0] == 3
    every_channel_is_the_position(prefill, decode)


def test_a_channel_that_differs_from_its_position_fails_agreement_within_a_build():
    """The property alone: a build whose channel row differs from the 1-D positions on a
    real token fails it; on a padding token it does not."""
    positions = np.array([3, 1], dtype=np.int64)

    def build(channel: list[int]) -> ref.StepBuild:
        fields = (
            ref.Field("positions", "tokens", positions),
            ref.Field("mrope.positions[0]", "tokens", np.array(channel), agrees_with="positions"),
        )
        return ref.StepBuild("padded", 1, 1, fields)

    assert ref.agreement_within_a_build(ref.RunnerStepOutputs((build([3, 7]),))) == []
    (v,) = ref.agreement_within_a_build(ref.RunnerStepOutputs((build([4, 1]),)))
    assert (v.prop, v.field, v.build) == (
        "agreement within a build",
        "mrope.positions[0]",
        "padded",
    )
    # A capture run holds no step's tokens: not judged.
    capture = ref.StepBuild("capture", 0, 0, build([4, 1]).fields)
    assert ref.agreement_within_a_build(ref.RunnerStepOutputs((capture,))) == []


def test_a_completion_counted_from_the_tokens_is_caught():
    """The mutant ``vllm-v1-mrope-completion-one-past`` (``_calc_mrope_positions``
    counting a completion from the request's tokens): the decode token's channels are 4
    where its position is 3, in every build of the step; the prefill is untouched."""
    a = adapter()
    caught_on_the_decode_alone(
        a.run_completion_from_tokens,
        a.trigger_completion_from_tokens,
        a.smallest_completion_from_tokens(),
    )


def drafted(max_model_len: int) -> Trace:
    """One request prefills 4 tokens, then decodes twice a real token and 2 drafts (a
    FULL graph of 3 tokens): an engine whose drafter is an M-RoPE model where
    ``max_model_len`` is odd, a text one where it is even (``drafter_mrope``). The
    prefill's token count is not the channels' (a forward's tokens are its positions'
    last dimension)."""
    config = EngineConfig(
        max_model_len=max_model_len, max_num_seqs=1, max_num_batched_tokens=16,
        block_size=16, num_spec=2, cudagraph_capture_sizes=(3,),
        cudagraph_mode="FULL_AND_PIECEWISE", runner="v1",
    )  # fmt: skip
    steps = tuple(
        Batch((c,), (q,), req_ids=(7,), pages=((1,),), new_pages=(int(c == 0),))
        for c, q in ((0, 4), (4, 3), (7, 3))
    )
    return Trace(config, steps)


@pytest.mark.parametrize("max_model_len", [65, 64])
def test_a_text_and_an_m_rope_drafter_hand_their_positions_and_every_property_holds(
    max_model_len,
):
    """Drafts beside an M-RoPE target: the drafter is an M-RoPE model (its own
    ``mrope_positions``, each channel's row judged on every draft build, against its
    first channel) or a text one (``_set_positions`` hands it the target's first channel:
    1-D positions). Every property holds on every step, the draft builds' included."""
    a = adapter()
    a.prepare()
    engine = a.MRoPERunnerStepEngine()
    trace = drafted(max_model_len)
    outs = run(engine, trace)
    mrope = a.drafter_mrope(trace.config)
    assert mrope == (max_model_len % 2 == 1)
    assert engine.eager.runner.drafter.uses_mrope == mrope
    for out in outs:
        assert ref.violations(out) == []
    drafts = [b for b in outs[-1].builds if b.draft is not None]
    assert drafts
    for b in drafts:
        assert (b.field("mrope.positions[2]") is not None) == mrope, b.name
        assert b.field("positions") is not None


def test_a_drafter_that_writes_one_channel_fails_agreement_within_a_build(monkeypatch):
    """A defect of the M-RoPE drafter's own: ``_set_positions`` writes only the first
    channel of the target's positions, the others keep what the buffer held (zeros): the
    draft builds' other channels disagree with the first on real tokens."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    original = SpecDecodeBaseProposer._set_positions

    def first_channel_only(self, num_tokens, positions):
        if not self.uses_mrope:
            return original(self, num_tokens, positions)
        self.mrope_positions[:1, :num_tokens] = positions[:1]

    a = adapter()
    a.prepare()
    monkeypatch.setattr(SpecDecodeBaseProposer, "_set_positions", first_channel_only)
    engine = a.MRoPERunnerStepEngine()
    outs = run(engine, drafted(65))
    found = {(v.prop, v.field) for out in outs for v in ref.violations(out)}
    assert ("agreement within a build", "mrope.positions[1]") in found
    assert {prop for prop, _ in found} == {"agreement within a build"}, found


# -- the V2 runner ------------------------------------------------------------------------


def test_the_model_state_hands_the_model_its_rope_positions_and_every_property_holds():
    """A request prefills 3 tokens, then decodes its 4th in a FULL graph of 2 tokens: the
    default model state keeps a ``RopeState`` of three channels, and every build of the
    step's tokens gives each channel the token's position (the decode's 3); every
    property holds."""
    a = v2_adapter()
    a.prepare()
    engine = a.MRoPERunnerStepEngine()
    prefill, decode = run(engine, a.smallest_computed_one_short())
    rope = engine.eager.runner.model_state.rope_state
    assert rope is not None and rope.num_dims == 3
    every_channel_is_the_position(prefill, decode)


def test_computed_tokens_one_short_are_caught():
    """The mutant ``vllm-mrope-computed-one-short`` (``prepare_positions`` handing its
    kernel the computed tokens one short): the decode token's channels are 2 where its
    position is 3, in every build of the step; the first prefill is untouched."""
    a = v2_adapter()
    caught_on_the_decode_alone(
        a.run_computed_one_short, a.trigger_computed_one_short, a.smallest_computed_one_short()
    )
