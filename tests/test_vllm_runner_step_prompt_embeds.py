"""vLLM 0.33.0's V2 runner with prompt embeddings (``vllm-prompt-embeds``): the default
model state's ``PromptEmbedsState`` lays each request's prompt rows over its tokens'
embeddings in the ``inputs_embeds`` buffer the model is handed; every token's row is
judged by the step's properties and against the row its request's prompt gave its
position, and a mutant of the overlay's computed tokens is caught."""

from __future__ import annotations

import numpy as np
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_prompt_embeds

    return runner_step_prompt_embeds


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def tags(build: ref.StepBuild) -> list[int]:
    return ref.real_rows(build, build.field("prompt_embeds.tag")).tolist()


def test_the_tags_helpers_say_which_rows_are_prompt_embeddings():
    """Even ids carry embeddings, ids 2 mod 4 a mixed prompt whose every third position
    is a token id; a tag names the request and the position."""
    a = adapter()
    assert [a.has_embeds(r) for r in (0, 1, 2, 3, 4)] == [True, False, True, False, True]
    assert [a.is_mixed(r) for r in (0, 2, 4, 6)] == [False, True, False, True]
    assert [a.is_token_id(p) for p in range(4)] == [True, False, False, True]
    assert a.tag(4, 3) - a.tag(4, 0) == 3 and a.tag(2, 0) != a.tag(4, 0)


def mixed_and_chunked() -> Trace:
    """Request 2 (a mixed prompt of 5 tokens) prefills 3 of them beside request 1 (token
    ids, 2), then its last 2 beside request 1's decode, then both decode on a FULL graph
    of 2 tokens."""
    return Trace(
        adapter().smallest_computed_one_short().config,
        (
            Batch((0, 0), (3, 2), req_ids=(2, 1), pages=((1,), (2,)), new_pages=(1, 1),
                  prompt_lens=(5, 2)),
            Batch((3, 2), (2, 1), req_ids=(2, 1), pages=((1,), (2,)), new_pages=(0, 0),
                  prompt_lens=(5, 2)),
            Batch((5, 3), (1, 1), req_ids=(2, 1), pages=((1,), (2,)), new_pages=(0, 0),
                  prompt_lens=(5, 2)),
        ),
    )  # fmt: skip


def test_each_token_is_handed_the_row_its_prompt_gave_its_position_and_every_property_holds():
    """A mixed prompt chunked over two steps beside a prompt of token ids: each of its
    positions is handed its own embedding row (the token-id positions 0 and 3, and every
    token of request 1, a token's embedding: -1), in every build of the step's tokens
    (the runner orders the batch as it will);
    the decodes past the prompt take token embeddings. Every property holds."""
    a = adapter()
    a.prepare()
    engine = a.EmbedsRunnerStepEngine()
    outs = run(engine, mixed_and_chunked())
    for out in outs:
        assert ref.violations(out) == []
    t = a.tag
    want = [[-1, t(2, 1), t(2, 2), -1, -1], [-1, t(2, 4), -1], [-1, -1]]
    for out, rows in zip(outs, want, strict=True):
        for how in ("eager", "padded", "fresh"):
            (build,) = out.of(how)
            assert sorted(tags(build)) == sorted(rows), how  # in the runner's batch order
            assert build.field("prompt_embeds.expected") is not None
    (replay,) = outs[-1].of("replay")
    assert tags(replay) == [-1, -1]
    runner = engine.eager.runner
    assert runner.uses_inputs_embeds and runner.model_state.prompt_embeds_state is not None


def test_a_row_other_than_its_positions_fails_agreement_within_a_build():
    """The property on these fields alone: a real token handed another position's row
    fails it; a padding token's row does not count."""
    expected = np.array([5, -1], dtype=np.int64)

    def build(handed: list[int]) -> ref.StepBuild:
        fields = (
            ref.Field("prompt_embeds.tag", "tokens", np.array(handed),
                      agrees_with="prompt_embeds.expected"),
            ref.Field("prompt_embeds.expected", "tokens", expected),
        )  # fmt: skip
        return ref.StepBuild("padded", 1, 1, fields)

    assert ref.agreement_within_a_build(ref.RunnerStepOutputs((build([5, 9]),))) == []
    (v,) = ref.agreement_within_a_build(ref.RunnerStepOutputs((build([4, -1]),)))
    assert (v.prop, v.field, v.build) == (
        "agreement within a build",
        "prompt_embeds.tag",
        "padded",
    )


def test_computed_tokens_one_short_are_caught_on_the_decode_alone():
    """The mutant ``vllm-prompt-embeds-computed-one-short``: the decode after a 3-token
    prompt of embeddings takes the prompt's last row (position 2) in every build of its
    token but the replay, which replay-equals-eager holds to the eager one; the prefill,
    whose computed tokens are 0 either way, holds every property."""
    a = adapter()
    a.prepare()
    trace = a.smallest_computed_one_short()
    assert a.trigger_computed_one_short(trace)
    assert not a.trigger_computed_one_short(Trace(trace.config, trace.steps[:1]))
    a.run_computed_one_short.new_engine()
    prefill, decode = run(a.run_computed_one_short, trace)
    assert ref.violations(prefill) == []
    found = {(v.prop, v.field, v.build) for v in ref.violations(decode)}
    assert found == {
        ("agreement within a build", "prompt_embeds.tag", how)
        for how in ("eager", "padded", "fresh")
    }, found
    (eager,) = decode.of("eager")
    assert tags(eager) == [a.tag(4, 2)]
