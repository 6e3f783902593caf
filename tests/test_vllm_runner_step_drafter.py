"""vLLM 0.33.0's V1 drafter (``EagleProposer``) run whole after the runner's step, in the
implementation ``vllm-v1`` of ``runner-step``: each draft sub-step's metadata is a build
of the step, judged by the step's properties, and a mutant of a draft build is caught."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def config(num_spec: int, **overrides):
    """next_n = num_spec + 1, capture sizes 2, 4 and 8, FULL_AND_PIECEWISE (vLLM's
    default), pages of 16 tokens (the Triton backend's kernel block size)."""
    base = dict(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=16, max_model_len=64,
        cudagraph_capture_sizes=(2, 4, 8), runner="v1", num_spec=num_spec,
    )  # fmt: skip
    return spec_config(**{**base, **overrides})


def decodes(num_spec: int) -> tuple[Batch, ...]:
    """Two requests prefill (5 and 3 tokens), decode with every draft, then one decodes
    with its drafts and the other with none. Request 7 rejects every draft in steps 2
    and 3 (the steps' ``rejected``, which V1's rejection sampler is made to decide): the
    padded drafter batch keeps the rejected ones as rows; request 8 accepts all."""
    q = 1 + num_spec
    return (
        Batch((0, 0), (5, 3), req_ids=(7, 8), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((5, 3), (q, q), req_ids=(7, 8), pages=((1,), (2,)), new_pages=(0, 0),
              rejected=(num_spec, 0)),
        Batch((6, 3 + q), (q, 1), req_ids=(7, 8), pages=((1,), (2,)), new_pages=(0, 0),
              rejected=(num_spec, 0)),
    )  # fmt: skip


def adapter():
    """The adapter, imported before vLLM (it sets what vLLM reads at import)."""
    from attnfuzz.adapters.vllm import runner_step_v1

    return runner_step_v1


def run(trace: Trace) -> list[ref.RunnerStepOutputs]:
    engine = adapter().RunnerStepEngine()
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


@pytest.mark.parametrize("num_spec", [2, 3])
def test_the_drafter_s_own_code_builds_each_draft_sub_step_and_every_property_holds(
    monkeypatch, num_spec
):
    """Each step, every engine's drafter proposes: its first pass over the step's tokens
    and ``num_spec - 1`` draft sub-steps of one token per request, each built by the
    drafter's own Triton builder; the graph engine pads the draft sub-steps to its
    piecewise graphs (slot -1). Every property holds on every build."""
    adapter()  # before vLLM
    import vllm.v1.spec_decode.llm_base_proposer as base
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder

    calls = Calls(monkeypatch)

    proposer = base.SpecDecodeBaseProposer
    for name in (
        "propose", "prepare_inputs_padded", "prepare_next_token_ids_padded",
        "build_per_group_and_layer_attn_metadata", "_update_positions_dependent_metadata",
        "_determine_batch_execution_and_padding", "dummy_run",
    ):  # fmt: skip
        calls.count(proposer, name)
    calls.count(TritonAttentionMetadataBuilder, "build_for_drafting")
    calls.count(base, "eagle_step_update_slot_mapping_and_metadata")
    outs = run(Trace(config(num_spec), decodes(num_spec)))
    for out in outs:
        assert ref.violations(out) == []
        for how in ("eager", "padded", "fresh"):
            subs = [b.draft for b in out.of(how) if b.draft is not None]
            assert subs == list(range(num_spec)), how
    # Step 2: request 7 rejected every draft: its first draft sub-step's length is its
    # computed tokens and the bonus one (5 + 1), plus the one it drafts.
    (loop,) = [b for b in outs[1].of("eager") if b.draft == 1]
    assert loop.field("seq_lens").values.tolist()[0] == 5 + 1 + 1
    padded = [b for b in outs[1].of("padded") if b.draft == 1][0]
    slots = padded.field("slot_mapping").values
    assert len(slots) > 2 and slots[2:].tolist() == [-1] * (len(slots) - 2)
    steps = len(outs) * 3  # eager, padded and fresh engines; the fresh warm-ups too
    assert calls["propose"] >= steps and calls["prepare_inputs_padded"] >= 3
    assert calls["_update_positions_dependent_metadata"] >= steps * (num_spec - 1)
    for name in (
        "prepare_next_token_ids_padded", "build_per_group_and_layer_attn_metadata",
        "_determine_batch_execution_and_padding", "dummy_run", "build_for_drafting",
        "eagle_step_update_slot_mapping_and_metadata",
    ):  # fmt: skip
        assert calls[name] > 0, name


def test_a_wrong_padding_slot_of_a_draft_sub_step_is_caught(monkeypatch):
    """A mutant of the drafter: the draft step's padding rows (the piecewise graph's)
    write a slot past the KV cache, not ``PADDING_SLOT_ID``. Only the graph
    engine pads the draft batch: its draft sub-steps fail safe padding, and so does its
    drafter's next dummy run (the idle rank's), whose slot mapping is what the buffer
    holds (``_get_slot_mapping``); nothing else fails."""
    adapter()  # before vLLM
    import vllm.v1.spec_decode.llm_base_proposer as base

    original = base.eagle_step_update_slot_mapping_and_metadata

    def past_the_cache(*args, **kwargs):
        original(*args, **kwargs)
        batch, padded = kwargs["positions_1d"].shape[0], kwargs["input_batch_size"]
        kwargs["out_slot_mapping"][batch:padded] = 1 << 30

    monkeypatch.setattr(base, "eagle_step_update_slot_mapping_and_metadata", past_the_cache)
    outs = run(Trace(config(2), decodes(2)))
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {
        ("safe padding", "slot_mapping", "padded.draft1"),
        ("safe padding", "slot_mapping", "dummy"),
    }


def test_rejected_drafts_kept_in_a_padded_drafter_loop_are_caught(monkeypatch):
    """A mutant of the drafter: where it dispatches graphs, ``prepare_inputs_padded``
    counts no rejected draft, so the draft loop's lengths keep the rejected tokens.
    The graph engine's draft sub-steps disagree with the eager engine's on real rows."""
    adapter()  # before vLLM
    import vllm.v1.spec_decode.llm_base_proposer as base
    from vllm.config import CUDAGraphMode

    original = base.SpecDecodeBaseProposer.prepare_inputs_padded

    def none_rejected(self, *args, **kwargs):
        cm, to_sample, rejected = original(self, *args, **kwargs)
        if self.cudagraph_dispatcher.cudagraph_mode != CUDAGraphMode.NONE:
            rejected.zero_()
        return cm, to_sample, rejected

    monkeypatch.setattr(base.SpecDecodeBaseProposer, "prepare_inputs_padded", none_rejected)
    outs = run(Trace(config(2), decodes(2)))
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert ("padding invariance", "seq_lens", "padded.draft1") in found
    assert {build for _, _, build in found} == {"padded.draft1"}


def test_a_step_past_the_drafter_s_length_limit_proposes_nothing():
    """A request at 64 tokens (the most vLLM's scheduler lets it reach under the case's
    ``max_model_len`` of 65, which the drafter's config derives its own from) with 2
    drafts to propose does not fit in the drafter
    (``_input_fits_in_drafter``): no engine proposes, and the graph engine, one of two
    data-parallel ranks, runs its drafter's dummy run instead (``sample_tokens``)."""
    pages = ((1, 2, 3, 4),)
    steps = (
        Batch((0,), (16,), req_ids=(3,), pages=pages, new_pages=(4,)),
        Batch((61,), (3,), req_ids=(3,), pages=pages, new_pages=(0,)),
    )
    first, out = run(Trace(config(2, max_model_len=65), steps))
    assert [b.draft for b in first.of("eager")] == [None, 0, 1]
    assert ref.violations(out) == []
    assert [b.draft for b in out.builds if b.how not in ref.NO_REAL_ROWS] == [None] * 4
    dummies = [b for b in out.of("dummy") if "SpecDecodeBaseProposer.dummy_run" in b.where]
    # A forward per draft (2) of each dummy run: the idle rank's, then sample_tokens'.
    assert len(dummies) == 2 * 2


def test_the_unpadded_drafter_batch_drops_each_rejected_draft_and_every_property_holds():
    """``vllm-v1-unpadded-drafts``: the runner proposes on the valid sampled tokens and
    ``prepare_inputs`` drops each request's rejected drafts from the first pass. In
    step 2 request 7 accepts none of its 2 drafts and request 8 both: the
    first pass keeps 1 + 3 tokens, its offsets [0, 1, 4], its sequence lengths the
    upper bound less the rejected (8 - 2, 6), the positions of the kept tokens."""
    from attnfuzz.adapters.vllm import runner_step_unpadded_drafts as unpadded

    engine = unpadded.UnpaddedRunnerStepEngine()
    outs = [engine(ref.make_inputs(case)) for case in Trace(config(2), decodes(2)).cases()]
    for out in outs:
        assert ref.violations(out) == []
    first = {b.how: b for b in outs[1].builds if b.draft == 0}
    assert set(first) == {"eager", "padded", "fresh"}
    eager = first["eager"]
    assert eager.num_tokens == 4
    assert eager.field("query_start_loc").values[:3].tolist() == [0, 1, 4]
    assert eager.field("seq_lens").values[:2].tolist() == [6, 6]
    assert eager.field("positions").values[:4].tolist() == [5, 3, 4, 5]
    assert unpadded.declines(Trace(config(0), decodes(0)).cases()[0]) is not None
