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
    the padded build (and the eager build's predictions, one row of four); the first
    step, whose rows are not due, holds every property."""
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
    } | {("agreement within a build", "prompt_logprobs.predicted", "eager")}, found
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


def test_the_prompt_rows_asked_by_token_id():
    """Odd ids that ask for prompt logprobs score rows by token id too, from row 0 to 2
    (never past the prompt's last row but one): each row the prompt's next token and
    another, a pad every third row; even ids and one-token prompts ask nothing."""
    a = adapter()
    assert a.prompt_token_id_rows(6, 5, 100) is None
    assert a.prompt_token_id_rows(3, 1, 100) is None
    start, rows = a.prompt_token_id_rows(9, 6, 100)
    assert start == 1 and rows.shape == (4, 2)
    assert rows[:, 0].tolist() == [a.prompt_token(9, p, 100) for p in (2, 3, 4, 5)]
    assert rows[2, 1] == -1 and -1 not in rows[[0, 1, 3], 1]
    start, rows = a.prompt_token_id_rows(15, 3, 100)
    assert start == 1 and rows.shape == (1, 2)  # row 2 would be the prompt's last


def from_row_one() -> Trace:
    """Request 9 (prompt logprobs, and by token id from row 1) prefills its 5-token
    prompt in chunks of 2 and 3 beside request 1, then both decode."""
    config = dataclasses.replace(adapter().smallest_chunks_dropped().config, max_num_seqs=4)
    return Trace(
        config,
        (
            Batch((0, 0), (2, 2), req_ids=(1, 9), pages=((2,), (1,)), new_pages=(1, 1),
                  prompt_lens=(2, 5)),
            Batch((2, 2), (1, 3), req_ids=(1, 9), pages=((2,), (1,)), new_pages=(0, 0),
                  prompt_lens=(2, 5)),
            Batch((3, 5), (1, 1), req_ids=(1, 9), pages=((2,), (1,)), new_pages=(0, 0),
                  prompt_lens=(2, 5)),
        ),
    )  # fmt: skip


def fields_of(out: ref.RunnerStepOutputs, how: str, prefix: str) -> dict[str, list[int]]:
    (build,) = out.of(how)
    return {f.name: f.values.tolist() for f in build.fields if f.name.startswith(prefix)}


def test_rows_scored_by_token_id_come_out_at_the_prompts_end_from_their_own_rows():
    """Request 9's 3 rows by token id (rows 1 to 3, after a chunk of 2 and one of 3) at
    the step its prompt ends: in the eager build each scores the prompt's next token
    near 0 and the other id (or the pad) far below, as the model predicted from the
    row's own token; its 4 prompt-logprob rows each predicted too. Every property
    holds."""
    a = adapter()
    a.prepare()
    engine = a.LogprobsRunnerStepEngine()
    outs = run(engine, from_row_one())
    for out in outs:
        assert ref.violations(out) == []
    eager = fields_of(outs[1], "eager", "prompt_")
    at = eager["prompt_token_id_logprobs.expected"].index(3)  # request 9's row
    assert eager["prompt_token_id_logprobs.rows"][at] == 3
    assert eager["prompt_token_id_logprobs.scored"][at] == 3
    assert eager["prompt_logprobs.predicted"][at] == 4
    padded = fields_of(outs[1], "padded", "prompt_")
    assert padded["prompt_token_id_logprobs.rows"][at] == 3
    assert "prompt_token_id_logprobs.scored" not in padded
    for out in (outs[0], outs[2]):
        by_id = fields_of(out, "eager", "prompt_token_id")
        assert set(by_id["prompt_token_id_logprobs.rows"]) == {0}


def test_rows_taken_one_off_fail_the_eager_predictions():
    """``prompt_logprobs.predicted`` and ``prompt_token_id_logprobs.scored`` fail on the
    defect they are there for: the prompt rows' hidden states taken one row off (as a
    wrong ``query_start_loc`` offset takes them). Rows, tokens and ids are the same."""
    a = adapter()
    a.prepare()
    from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker

    def one_off(name):
        original = getattr(PromptLogprobsWorker, name)

        def call(self, logits_fn, hidden_states, *args):
            return original(self, logits_fn, torch.roll(hidden_states, 1, 0), *args)

        return call

    engine = a.LogprobsRunnerStepEngine()
    with (
        mock.patch.object(PromptLogprobsWorker, "compute_prompt_logprobs",
                          one_off("compute_prompt_logprobs")),
        mock.patch.object(PromptLogprobsWorker, "compute_prompt_token_id_logprobs",
                          one_off("compute_prompt_token_id_logprobs")),
    ):  # fmt: skip
        outs = run(engine, from_row_one())
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {
        ("agreement within a build", "prompt_logprobs.predicted", "eager"),
        ("agreement within a build", "prompt_token_id_logprobs.scored", "eager"),
    }, found
