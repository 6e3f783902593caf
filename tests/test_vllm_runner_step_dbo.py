"""vLLM 0.33.0's V1 runner step with dual-batch overlap, as the implementation
``vllm-v1-dbo`` of ``runner-step``: a step both data-parallel ranks agree to split runs
as two micro-batches, each judged against the step's eager unsplit build."""

from __future__ import annotations

import numpy as np
import pytest
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case, EngineConfig

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_dbo

    return runner_step_dbo


def config(mode: str = "FULL_AND_PIECEWISE") -> EngineConfig:
    """Pages of 16 tokens (the Triton backend's), capture sizes 2, 4 and 8, no drafter."""
    return EngineConfig(
        max_model_len=64, max_num_seqs=4, max_num_batched_tokens=16, block_size=16,
        num_spec=0, cudagraph_capture_sizes=(2, 4, 8), cudagraph_mode=mode, runner="v1",
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
both ranks pad to 8, split at token 4, inside the second request."""

DECODE = Batch((2, 2, 4), (1, 1, 1), req_ids=(3, 4, 5), pages=((1,), (2,), (3,)),
               new_pages=(1, 1, 1))  # fmt: skip
"""Three decodes beside a peer decoding 4: both FULL decode graphs of 4, split at 2."""

ALONE = Batch((0,), (5,), req_ids=(6,), pages=((4,),), new_pages=(1,))
"""A prefill of 5 tokens beside a peer decoding 4: both pad to 8, and a split at token 4
would leave the peer's second micro-batch empty (``is_last_ubatch_empty``), so the ranks
do not split."""


def test_a_split_cuts_a_request_and_each_micro_batch_holds_its_part():
    (out,) = run(adapter().DboRunnerStepEngine(), CUT)
    first, second = out.of("microbatch")
    assert (first.first_token, first.num_reqs, first.num_tokens) == (0, 2, 4)
    assert (second.first_token, second.num_reqs, second.num_tokens) == (4, 1, 1)
    # The cut request's first part reads its keys up to its 2nd token; the rest, all 3.
    assert values(first, "query_start_loc") == [0, 2, 4]
    assert values(first, "seq_lens") == [2, 2] and values(first, "kv_len") == [2, 2]
    assert values(second, "query_start_loc")[:2] == [0, 1]
    assert values(second, "seq_lens")[:1] == [3]
    # The padded tail (to the peer's 8 tokens) is the second micro-batch's.
    assert values(second, "slot_mapping") == [34, -1, -1, -1]
    # The step's own build: what the whole forward writes, padding included.
    (padded,) = out.of("padded")
    assert values(padded, "slot_mapping") == [16, 17, 32, 33, 34, -1, -1, -1]


def test_a_step_the_peer_leaves_too_small_is_not_split():
    (out,) = run(adapter().DboRunnerStepEngine(), ALONE)
    assert list(out.of("microbatch")) == []
    (padded,) = out.of("padded")
    assert padded.field("query_start_loc") is not None


def test_a_split_decode_is_padded_across_ranks_captured_then_replayed():
    """FULL graphs: the first split decode of 4 tokens captures a micro-batched graph
    (UBatchWrapper._capture_ubatches), the next replays it; the second micro-batch holds
    the DP padding's request (seq_len 0, slot -1) past the real one."""
    engine = adapter().DboRunnerStepEngine()
    again = Batch(DECODE.num_computed_tokens, DECODE.q_lens, req_ids=(7, 8, 9),
                  pages=DECODE.pages, new_pages=DECODE.new_pages)  # fmt: skip
    captured, replayed = run(engine, DECODE, again, mode="FULL")
    for out, how in ((captured, "_capture_ubatches"), (replayed, "replayed")):
        first, second = out.of("microbatch")
        assert how in first.where and how in second.where
        assert (first.num_reqs, first.num_tokens, second.num_reqs, second.num_tokens) == (
            2, 2, 1, 1,
        )  # fmt: skip
        assert values(second, "seq_lens") == [5, 0]
        assert values(second, "slot_mapping") == [52, -1]


def test_the_mutant_fails_on_the_micro_batch_offsets_alone_on_its_smallest_trace():
    """The micro-batch's offsets not rebased: micro-batch agreement fails on them, and
    so does queries-read-their-own-keys, which reads each token's request through the
    same offsets (they no longer start at 0); nothing else, and no other build."""
    dbo = adapter()
    trace = dbo.smallest_not_rebased()
    assert dbo.trigger_not_rebased(trace)
    dbo.run_not_rebased.new_engine()
    (case,) = trace.cases()
    found = ref.violations(dbo.run_not_rebased(ref.make_inputs(case)))
    assert {(v.prop, v.field, v.build) for v in found} == {
        ("micro-batch agreement", "query_start_loc", "microbatch"),
        ("queries read their own keys", "slot_mapping", "microbatch"),
    }
    (keys,) = [v for v in found if v.prop == "queries read their own keys"]
    assert keys.detail.endswith("beyond the build's query_start_loc")


def test_microbatch_agreement_judges_a_cut_request_through_its_key_reads():
    """The property alone, on hand-made builds: a first micro-batch whose cut request
    reads all its keys (the eager length) fails on kv_len; shortened, it holds."""

    def build(how, reqs, tokens, fields, first=0):
        return ref.StepBuild(how, reqs, tokens, tuple(
            ref.Field(n, rows, np.asarray(v)) for n, rows, v in fields
        ), first_token=first)  # fmt: skip

    eager = build("eager", 2, 5, [("query_start_loc", "offsets", [0, 2, 5]),
                                  ("kv_len", "requests", [2, 3]),
                                  ("seq_lens", "requests", [2, 3])])  # fmt: skip
    good = build("microbatch", 2, 4, [("query_start_loc", "offsets", [0, 2, 4]),
                                      ("kv_len", "requests", [2, 2]),
                                      ("seq_lens", "requests", [2, 2])])  # fmt: skip
    long = build("microbatch", 2, 4, [("query_start_loc", "offsets", [0, 2, 4]),
                                      ("kv_len", "requests", [2, 3]),
                                      ("seq_lens", "requests", [2, 3])])  # fmt: skip
    assert ref.microbatch_agreement(ref.RunnerStepOutputs((eager, good))) == []
    (v,) = ref.microbatch_agreement(ref.RunnerStepOutputs((eager, long)))
    assert v.field == "kv_len"


def test_the_micro_batch_code_of_vllm_computes_the_builds(monkeypatch):
    import vllm.v1.worker.gpu_model_runner as gmr
    import vllm.v1.worker.ubatch_utils as uu

    calls = Calls(monkeypatch)

    calls.count(gmr, "maybe_create_ubatch_slices")
    calls.count(gmr, "split_attn_metadata")
    calls.count(uu, "_make_metadata_with_slice")
    calls.count(gmr.GPUModelRunner, "_allow_microbatching")
    run(adapter().DboRunnerStepEngine(), CUT, mode="NONE")
    for name in ("maybe_create_ubatch_slices", "split_attn_metadata",
                 "_make_metadata_with_slice", "_allow_microbatching"):  # fmt: skip
        assert calls[name] > 0, name


@pytest.mark.parametrize("threshold", [1])
def test_vllm_refuses_a_threshold_below_the_micro_batches(threshold):
    from vllm.config import ParallelConfig

    with pytest.raises(ValueError, match="at least the number of microbatches"):
        ParallelConfig(enable_dbo=True, dbo_decode_token_threshold=threshold)
