"""vLLM 0.33.0's V1 runner with prompt logprobs (``vllm-v1-prompt-logprobs``):
``_get_prompt_logprobs_dict`` hands out each asking request's rows at the step its
prompt ends, a chunked prompt's filled across its steps from the hidden states at the
request's offset; the rows, the tokens they score and the tokens the rows' hidden states
predict are judged against the prompt's length, and a mutant that hands them out a step
early is caught, as is a row taken at the wrong offset."""

from __future__ import annotations

from unittest import mock

import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_prompt_logprobs

    return runner_step_v1_prompt_logprobs


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def logprob_rows(out: ref.RunnerStepOutputs, how: str) -> dict[str, list[int] | None]:
    (build,) = out.of(how)
    names = ("rows", "tokens", "predicted", "expected")
    fields = {name: build.field(f"prompt_logprobs.{name}") for name in names}
    return {name: None if f is None else f.values.tolist() for name, f in fields.items()}


def test_the_next_prompt_token_follows_from_the_token_alone():
    """The stand-in model predicts a row's target from the row's token, whatever the
    request: every prompt of ``prompt_token`` steps along the vocabulary alike."""
    a = adapter()
    for vocab_size in (128, 32000):
        for rid in (0, 3, 7, 299):
            for p in range(40):
                token = a.prompt_token(rid, p, vocab_size)
                want = a.prompt_token(rid, p + 1, vocab_size)
                assert a.next_prompt_token(token, vocab_size) == want


def chunked_beside_a_plain_request() -> Trace:
    """Request 3 (a 5-token prompt in chunks of 3 and 2, so it asks) beside request 1 (a
    2-token prompt, no prompt logprobs), then both decode."""
    config = adapter().smallest_handed_early().config
    return Trace(
        config,
        (
            Batch((0, 0), (3, 2), req_ids=(3, 1), pages=((1,), (2,)), new_pages=(1, 1),
                  prompt_lens=(5, 2)),
            Batch((3, 2), (2, 1), req_ids=(3, 1), pages=((1,), (2,)), new_pages=(0, 0),
                  prompt_lens=(5, 2)),
            Batch((5, 3), (1, 1), req_ids=(3, 1), pages=((1,), (2,)), new_pages=(0, 0),
                  prompt_lens=(5, 2)),
        ),
    )  # fmt: skip


def test_a_chunked_prompt_hands_out_each_row_once_at_its_end_and_every_property_holds():
    """Request 3's 4 rows come out at the step its prompt ends, each scoring the
    prompt's next token and predicted from its own row; nothing before, nothing at its
    decode; request 1, which did not ask, none. The padded build carries rows and
    tokens, the fresh one none of these fields. Every property holds."""
    a = adapter()
    a.prepare()
    engine = a.LogprobsRunnerStepEngine()
    outs = run(engine, chunked_beside_a_plain_request())
    for out in outs:
        assert ref.violations(out) == []
    eager = [logprob_rows(out, "eager") for out in outs]
    rows = engine.eager.runner.input_batch.req_ids.index("3")
    for name in ("rows", "tokens", "predicted", "expected"):
        assert [s[name][rows] for s in eager] == [0, 4, 0], name
        assert [s[name][1 - rows] for s in eager] == [0, 0, 0], name
    padded = [logprob_rows(out, "padded") for out in outs]
    assert [s["rows"][rows] for s in padded] == [0, 4, 0]
    assert all(s["predicted"] is None for s in padded)
    assert all(v is None for v in logprob_rows(outs[1], "fresh").values())
    assert engine.eager.runner.num_prompt_logprobs == {}  # done with once handed out


def test_handed_early_is_caught_at_the_chunk_one_short_of_the_prompts_end():
    """The mutant ``vllm-v1-prompt-logprobs-handed-early``: request 3's first chunk of 4
    ends one token short of its 5-token prompt, and its 4 rows come out there, where
    none is due: rows, tokens and predictions fail agreement within a build (the
    engine's own step holds every property)."""
    a = adapter()
    a.prepare()
    trace = a.smallest_handed_early()
    assert a.trigger_handed_early(trace)
    assert not a.trigger_handed_early(chunked_beside_a_plain_request())
    a.run_handed_early.new_engine()
    (out,) = run(a.run_handed_early, trace)
    found = {(v.prop, v.field, v.build) for v in ref.violations(out)}
    assert found == {
        ("agreement within a build", f"prompt_logprobs.{name}", how)
        for name, hows in (("rows", ("eager", "padded")), ("tokens", ("eager", "padded")),
                           ("predicted", ("eager",)))
        for how in hows
    }, found  # fmt: skip
    assert logprob_rows(out, "eager") == {
        "rows": [4], "tokens": [4], "predicted": [4], "expected": [0]
    }  # fmt: skip
    a.run.new_engine()
    (own,) = run(a.run, trace)
    assert ref.violations(own) == []


def test_a_row_taken_at_the_wrong_offset_fails_its_prediction():
    """``prompt_logprobs.predicted`` catches what rows and tokens cannot: the runner's
    hidden states shifted by one row (as a wrong ``query_start_loc`` offset takes them)
    give request 3 its rows and targets, but each row's token is another's."""
    a = adapter()
    a.prepare()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._get_prompt_logprobs_dict

    def shifted(self, hidden_states, num_scheduled_tokens):
        return original(self, torch.roll(hidden_states, 1, 0), num_scheduled_tokens)

    engine = a.LogprobsRunnerStepEngine()
    with mock.patch.object(GPUModelRunner, "_get_prompt_logprobs_dict", shifted):
        outs = run(engine, chunked_beside_a_plain_request())
    assert ref.violations(outs[0]) == []
    found = {(v.prop, v.field, v.build) for v in ref.violations(outs[1])}
    assert found == {("agreement within a build", "prompt_logprobs.predicted", "eager")}, found


def test_the_fresh_engine_never_asks():
    """Its warm-up adds request 3 with none computed, as if it arrived: the eager and
    the graph engine's request 3 asks, the fresh engine's does not (its step's fields
    would be another history's), and the step holds every property."""
    a = adapter()
    a.prepare()
    engine = a.LogprobsRunnerStepEngine()
    made = []
    original = engine.engine

    def keep(*args):
        made.append(original(*args))
        return made[-1]

    engine.engine = keep
    config = a.smallest_handed_early().config
    trace = Trace(
        config,
        (
            Batch((0,), (1,), req_ids=(3,), pages=((1,),), new_pages=(1,), prompt_lens=(3,)),
            Batch((1,), (2,), req_ids=(3,), pages=((1,),), new_pages=(0,), prompt_lens=(3,)),
        ),
    )
    first, second = run(engine, trace)
    assert ref.violations(second) == []
    assert logprob_rows(second, "eager")["rows"] == [2]
    graphs, eager, fresh_first, fresh_second = made
    assert graphs.asked == eager.asked == {"3": 3}
    assert fresh_second.asking is False and fresh_second.asked == {}
    assert fresh_second.runner.num_prompt_logprobs == {}
