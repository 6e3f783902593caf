"""vLLM 0.33.0's V2 runner with prompt logprobs (``vllm-prompt-logprobs``): each step
sampled as it ran, the sampler's ``PromptLogprobsWorker`` hands out each asking
request's rows at the step its prompt ends, a chunked prompt's kept across its steps;
the rows and the tokens they score are judged against the prompt's length, and a
mutant that keeps no chunk's rows is caught."""

from __future__ import annotations

import dataclasses
from unittest import mock

import torch
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_prompt_logprobs

    return runner_step_prompt_logprobs


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def logprob_rows(out: ref.RunnerStepOutputs, how: str) -> dict[str, list[int]]:
    (build,) = out.of(how)
    return {
        name: build.field(f"prompt_logprobs.{name}").values.tolist()
        for name in ("rows", "tokens", "expected")
    }


def test_who_asks_and_the_prompt_tokens():
    """Ids divisible by 3 ask, only when they arrive with nothing computed; a prompt's
    tokens are never the placeholder 0 and differ along the prompt."""
    a = adapter()
    assert [a.asks(r, 0) for r in range(4)] == [True, False, False, True]
    assert not a.asks(3, 16)
    tokens = [a.prompt_token(3, p, 128) for p in range(8)]
    assert 0 not in tokens and len(set(tokens)) == len(tokens)


def beside_a_plain_request() -> Trace:
    """``smallest_chunks_dropped``'s request 3 (a 5-token prompt in chunks of 3 and 2)
    beside request 1 (a 2-token prompt, no prompt logprobs), then both decode."""
    a = adapter()
    config = a.smallest_chunks_dropped().config
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
    """Request 3's 4 rows (its prompt's tokens 1 to 4 scored) come out at the step its
    prompt ends, the first chunk's kept; nothing before, nothing at its decode; request
    1, which did not ask, none. In the eager and the padded build alike; the fresh one
    carries none of these fields. Every property holds."""
    a = adapter()
    a.prepare()
    engine = a.LogprobsRunnerStepEngine()
    outs = run(engine, beside_a_plain_request())
    for out in outs:
        assert ref.violations(out) == []
    for how in ("eager", "padded"):
        steps = [logprob_rows(out, how) for out in outs]
        assert [sorted(s["rows"]) for s in steps] == [[0, 0], [0, 4], [0, 0]], how
        assert [sorted(s["tokens"]) for s in steps] == [[0, 0], [0, 4], [0, 0]], how
        assert steps[1]["rows"] == steps[1]["expected"], how
    (fresh,) = outs[1].of("fresh")
    assert fresh.field("prompt_logprobs.rows") is None
    assert engine.eager.runner.prompt_logprobs_worker.in_progress_prompt_logprobs == {"3": []}


def test_chunks_dropped_are_caught_at_the_prompts_end():
    """The mutant ``vllm-prompt-logprobs-chunks-dropped``: at the step request 3's prompt
    ends it hands out its last chunk's one row, which scores the prompt's token 4, not
    its token 1: rows and tokens both fail agreement within a build, in the eager and
    the padded build; the first step, whose rows are not due, holds every property."""
    a = adapter()
    a.prepare()
    trace = a.smallest_chunks_dropped()
    assert a.trigger_chunks_dropped(trace)
    assert not a.trigger_chunks_dropped(Trace(trace.config, trace.steps[:1]))
    a.run_chunks_dropped.new_engine()
    first, last = run(a.run_chunks_dropped, trace)
    assert ref.violations(first) == []
    found = {(v.prop, v.field, v.build) for v in ref.violations(last)}
    assert found == {
        ("agreement within a build", f"prompt_logprobs.{name}", how)
        for name in ("rows", "tokens")
        for how in ("eager", "padded")
    }, found
    assert logprob_rows(last, "eager") == {"rows": [1], "tokens": [0], "expected": [4]}


def test_the_trigger_holds_on_a_one_token_chunk_before_the_prompts_end():
    """The search's smallest witness at seed 0: request 0's 2-token prompt prefilled a
    token a step. Its first chunk's row is kept (it is not the prompt's last), so the
    defect shows at the second step; a prompt prefilled whole shows nothing."""
    a = adapter()
    config = a.smallest_chunks_dropped().config
    one_by_one = Trace(
        config,
        (
            Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(2,)),
            Batch((1,), (1,), req_ids=(0,), pages=((1,),), new_pages=(0,), prompt_lens=(2,)),
        ),
    )
    assert a.trigger_chunks_dropped(one_by_one)
    whole = Trace(
        config,
        (
            Batch((0,), (2,), req_ids=(0,), pages=((1,),), new_pages=(1,), prompt_lens=(2,)),
            Batch((2,), (1,), req_ids=(0,), pages=((1,),), new_pages=(0,), prompt_lens=(2,)),
        ),
    )
    assert not a.trigger_chunks_dropped(whole)


def three_requests() -> Trace:
    """Request 3 (asks prompt logprobs: a 5-token prompt in chunks of 3 and 2), request
    1 (asks its own token ids' logprobs, one id) and request 2 (asks the top logprob),
    then all decode: the sampler's per-request token ids beside its top-k column."""
    a = adapter()
    config = dataclasses.replace(a.smallest_chunks_dropped().config, max_num_seqs=4)
    return Trace(
        config,
        (
            Batch((0, 0, 0), (3, 2, 2), req_ids=(3, 1, 2), pages=((1,), (2,), (3,)),
                  new_pages=(1, 1, 1), prompt_lens=(5, 2, 2)),
            Batch((3, 2, 2), (2, 1, 1), req_ids=(3, 1, 2), pages=((1,), (2,), (3,)),
                  new_pages=(0, 0, 0), prompt_lens=(5, 2, 2)),
        ),
    )  # fmt: skip


def test_who_asks_for_sampled_logprobs():
    """Ids 1 mod 3 ask their own one to three token ids, ids 2 mod 6 the top logprob;
    multiples of 3 (prompt logprobs) neither."""
    a = adapter()
    assert [a.own_token_ids(r, 100) is not None for r in range(7)] == [
        False, True, False, False, True, False, False
    ]  # fmt: skip
    assert [len(a.own_token_ids(r, 100)) for r in (1, 4, 7, 10)] == [1, 2, 3, 1]
    assert [a.asks_top_logprob(r) for r in (2, 5, 8, 3)] == [True, False, True, False]


def test_each_request_s_own_token_ids_come_back_in_its_row():
    """The sampler's rows: request 1's own id after its sampled token, in the eager and
    the padded build at each step (the top-k path of request 2 beside it); every
    property holds."""
    a = adapter()
    a.prepare()
    engine = a.LogprobsRunnerStepEngine()
    for out in run(engine, three_requests()):
        assert ref.violations(out) == []
        for how in ("eager", "padded"):
            (build,) = out.of(how)
            own = build.field("sampled_logprobs.own_token_ids").values.tolist()
            asked = build.field("sampled_logprobs.asked_own").values.tolist()
            assert sorted(own) == sorted(asked) == [0, 0, 1], (how, own, asked)


def test_token_ids_read_by_batch_row_not_request_slot_are_caught():
    """``sampled_logprobs.own_token_ids`` fails on the defect it is there for: the
    sampler's ``_fill_logprob_token_ids_kernel`` handed batch rows for request slots
    (``expanded_idx_mapping``), so a request reads another slot's token ids once the
    batch's order is not its slots' (request 1 holds slot 1 at batch row 0)."""
    a = adapter()
    a.prepare()
    import vllm.v1.worker.gpu.sample.sampler as sampler

    original = sampler.compute_topk_scores

    def by_row(logits, *args, **kwargs):
        rows = kwargs["expanded_idx_mapping"].shape[0]
        kwargs["expanded_idx_mapping"] = torch.arange(rows, dtype=torch.int32)
        return original(logits, *args, **kwargs)

    engine = a.LogprobsRunnerStepEngine()
    with mock.patch.object(sampler, "compute_topk_scores", by_row):
        outs = run(engine, three_requests())
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {
        ("agreement within a build", "sampled_logprobs.own_token_ids", how)
        for how in ("eager", "padded")
    }, found
