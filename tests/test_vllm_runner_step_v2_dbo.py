"""vLLM 0.33.0's V2 runner step with dual-batch overlap, as the implementation
``vllm-dbo`` of ``runner-step``: a step both data-parallel ranks agree to split runs as
two micro-batches (``UBatchRunner``), each judged against the step's eager unsplit
build; the micro-batched FULL graphs are captured at start-up and replayed."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v2_dbo

    return runner_step_v2_dbo


def config(mode: str = "FULL_AND_PIECEWISE") -> EngineConfig:
    """Pages of 16 tokens, capture sizes 2, 4 and 8, no drafter, the V2 runner."""
    return EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2, 4, 8), cudagraph_mode=mode, runner="v2",
    )  # fmt: skip


def run(engine, *steps: Batch, mode: str = "FULL_AND_PIECEWISE") -> list[ref.RunnerStepOutputs]:
    """Each step on its own (its requests new), on ``engine``, every property holding."""
    outs = []
    for step in steps:
        out = engine(ref.make_inputs(Case(config(mode), step)))
        assert ref.violations(out) == [], step
        outs.append(out)
    return outs


def values(build: ref.StepBuild, name: str) -> list[int]:
    return build.field(name).values.tolist()


CUT = Batch((0, 0), (2, 3), req_ids=(1, 2), pages=((1,), (2,)), new_pages=(1, 1))
"""Two prefills of 2 and 3 tokens beside a peer prefilling 6 (``data_parallel_peer``):
both ranks take 6 tokens and split at token 3, inside the second request."""

DECODE = Batch((2, 2, 4), (1, 1, 1), req_ids=(3, 4, 5), pages=((1,), (2,), (3,)),
               new_pages=(1, 1, 1))  # fmt: skip
"""Three decodes beside a peer decoding 4: the micro-batched FULL graph of 4, split at 2."""

ONE = Batch((3,), (1,), req_ids=(6,), pages=((4,),), new_pages=(1,))
"""One decode of one token: below the thresholds of 2, never split."""


def test_a_split_cuts_a_request_and_each_micro_batch_holds_its_part():
    (out,) = run(adapter().DboRunnerStepEngine(), CUT)
    first, second = out.of("microbatch")
    assert (first.first_token, first.num_reqs, first.num_tokens) == (0, 2, 3)
    assert (second.first_token, second.num_reqs, second.num_tokens) == (3, 1, 2)
    # The cut request's first token is the first micro-batch's: it reads 1 key there.
    assert values(first, "query_start_loc") == [0, 2, 3]
    assert values(first, "seq_lens") == [2, 1] and values(first, "kv_len") == [2, 1]
    # Its last two tokens, rebased, reading all 3 keys; the DP padding's token after.
    assert values(second, "query_start_loc") == [0, 2]
    assert values(second, "seq_lens") == [3]
    assert values(second, "slot_mapping") == [33, 34, -1]
    # The step's own build: what the whole forward writes and sampling reads.
    (padded,) = out.of("padded")
    assert values(padded, "slot_mapping") == [16, 17, 32, 33, 34, -1]
    assert {f.name for f in padded.fields} == {
        "slot_mapping", "positions", "logits_indices", "cu_num_logits", "idx_mapping"
    }  # fmt: skip


def test_a_step_below_the_thresholds_is_not_split():
    (out,) = run(adapter().DboRunnerStepEngine(), ONE)
    assert list(out.of("microbatch")) == []
    (padded,) = out.of("padded")
    assert padded.field("query_start_loc") is not None


def test_a_split_decode_replays_the_micro_batched_graph_captured_at_start_up():
    """FULL graphs: capture_model captures the micro-batched twin of the uniform sizes
    (each micro-batch a capture build); a split decode of 4 tokens replays it, the
    second micro-batch holding the DP padding's request (seq_len 0, slot -1)."""
    engine = adapter().DboRunnerStepEngine()
    (out,) = run(engine, DECODE, mode="FULL")
    assert any(b.how == "capture" and "micro-batch" in b.where for b in out.builds)
    first, second = out.of("microbatch")
    assert "replayed" in first.where and "replayed" in second.where
    assert (first.num_reqs, first.num_tokens, second.num_reqs, second.num_tokens) == (2, 2, 1, 1)
    assert values(second, "seq_lens") == [5, 0]
    assert values(second, "slot_mapping") == [52, -1]


@pytest.mark.parametrize("step", [CUT, DECODE, ONE], ids=["cut", "decode", "one"])
def test_the_trigger_says_which_steps_split(step):
    dbo = adapter()
    (out,) = run(dbo.DboRunnerStepEngine(), step)
    assert dbo.splits(config(), step) == any(True for _ in out.of("microbatch"))


def test_the_mutant_fails_micro_batch_agreement_alone_on_its_smallest_trace():
    dbo = adapter()
    trace = dbo.smallest_not_rebased()
    assert dbo.trigger_not_rebased(trace)
    dbo.run_not_rebased.new_engine()
    (case,) = trace.cases()
    found = ref.violations(dbo.run_not_rebased(ref.make_inputs(case)))
    assert found and {v.prop for v in found} == {"micro-batch agreement"}
    assert {(v.field, v.build) for v in found} == {("query_start_loc", "microbatch")}


def test_the_micro_batch_code_of_vllm_computes_the_builds(monkeypatch):
    import vllm.v1.worker.gpu.dp_utils as dp
    import vllm.v1.worker.gpu.ubatch_utils as uu

    calls = Calls(monkeypatch)
    calls.count(dp, "check_ubatch_thresholds")
    calls.count(uu, "create_ubatch_slices")
    calls.count(uu, "_slice_input_batch")
    calls.count(uu, "_slice_seq_lens")
    calls.count(uu.UBatchRunner, "prepare")
    run(adapter().DboRunnerStepEngine(), CUT, mode="NONE")
    for name in ("check_ubatch_thresholds", "create_ubatch_slices", "_slice_input_batch",
                 "_slice_seq_lens", "prepare"):  # fmt: skip
        assert calls[name] > 0, name
