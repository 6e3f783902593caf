"""vLLM 0.33.0's V2 runner with a standalone draft model (``vllm-standalone-ar``): its
``StandaloneARSpeculator`` run whole after each step by the runner's own
``sample_tokens``, each draft sub-step's metadata a build judged by the step's
properties, and a mutant of its draft decode caught."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_standalone_ar

    return runner_step_standalone_ar


def config(num_spec: int):
    """next_n = num_spec + 1, pages of 16 tokens (a Triton kernel block size)."""
    return spec_config(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=16, max_model_len=64,
        cudagraph_capture_sizes=(2, 4, 8), num_spec=num_spec,
    )  # fmt: skip


def decodes(num_spec: int) -> tuple[Batch, ...]:
    """Two requests prefill (5 and 3 tokens) and decode with every draft; request 7
    then rejects them all, request 8 accepts them all; both decode again."""
    q = 1 + num_spec
    pages = ((1,), (2,))
    return (
        Batch((0, 0), (5, 3), req_ids=(7, 8), pages=pages, new_pages=(1, 1)),
        Batch((5, 3), (q, q), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
        Batch((5 + 1, 3 + q), (q, q), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
    )


def run(trace: Trace) -> list[ref.RunnerStepOutputs]:
    engine = adapter().StandaloneAREngine()
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


@pytest.mark.parametrize("num_spec", [3])
def test_the_standalone_speculator_builds_each_draft_sub_step_and_every_property_holds(
    monkeypatch, num_spec
):
    """After each step the runner's ``sample_tokens`` runs ``StandaloneARSpeculator
    .propose``: its draft prefill over each request's query and correction token
    (``num_tokens + num_reqs`` rows, its Triton expansion kernel) and ``num_spec - 1``
    draft decodes of one token per request, each built by the drafter's Triton builder,
    on every engine (no graph: the speculator captures none). Every property holds."""
    adapter()  # before vLLM
    import vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator as standalone
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    calls = Calls(monkeypatch)

    for name in ("propose", "_multi_step_decode"):
        calls.count(standalone.StandaloneARSpeculator, name)
    calls.count(standalone, "prepare_prefill_inputs")
    for name in ("_build_attn_metadata", "_build_uniform_attn_metadata"):
        calls.count(DraftModelSpeculator, name)
    outs = run(Trace(config(num_spec), decodes(num_spec)))
    for out in outs:
        assert ref.violations(out) == []
    for out, step in zip(outs[1:], decodes(num_spec), strict=False):
        for how in ("eager", "padded", "fresh"):
            subs = [b for b in out.builds if b.how == how and b.draft is not None]
            assert [b.draft for b in subs] == list(range(num_spec)), how
            assert subs[0].num_tokens == sum(step.q_lens) + len(step.q_lens), how
            assert "StandaloneARSpeculator" in subs[0].where
    # Each engine proposes after each step (the fresh engine after its warm-up too).
    assert calls["propose"] >= 3 * 2 and calls["prepare_prefill_inputs"] == calls["propose"]
    assert calls["_multi_step_decode"] == calls["propose"]
    assert calls["_build_uniform_attn_metadata"] == (num_spec - 1) * calls["propose"]


def test_a_draft_decode_seeded_from_stale_positions_is_caught(monkeypatch):
    """A mutant of the standalone speculator: ``_multi_step_decode`` seeds its draft
    positions from its own position buffer as the last proposal left it, not from the
    draft prefill's last accepted positions (two buffers mixed up). The eager engine's
    buffer holds what its proposals before left, the fresh engine's what its warm-up's
    left: the draft decodes' positions and slot mappings disagree (history
    invariance), and no other property."""
    adapter()  # before vLLM
    import vllm.v1.worker.gpu.spec_decode.standalone_ar.speculator as standalone

    original = standalone.StandaloneARSpeculator._multi_step_decode

    def stale(self, input_batch, num_rejected, num_reqs, *args, **kwargs):
        expanded = self.expanded_positions
        seeded = expanded.clone()
        seeded[self.last_token_indices[:num_reqs]] = self.input_buffers.positions[:num_reqs]
        self.expanded_positions = seeded
        try:
            return original(self, input_batch, num_rejected, num_reqs, *args, **kwargs)
        finally:
            self.expanded_positions = expanded

    monkeypatch.setattr(standalone.StandaloneARSpeculator, "_multi_step_decode", stale)
    # A third decode: the eager engine has proposed twice before it, the fresh one (its
    # one warm-up step) once, so their buffers differ.
    steps = (*decodes(2), Batch((9, 9), (3, 3), req_ids=(7, 8), pages=((1,), (2,)),
                                new_pages=(0, 0)))  # fmt: skip
    outs = run(Trace(config(2), steps))
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert ("history invariance", "positions", "fresh.draft1") in found, found
    assert {prop for prop, _, _ in found} == {"history invariance"}, found


def test_with_a_data_parallel_peer_vllm_s_draft_forward_fails_its_own_assertion():
    """Why the implementation runs one rank, observed on vLLM 0.33.0: with a peer, the
    first step's idle-rank dummy run (``_dummy_run(1, uniform_decode=True)``, padded to
    the peer's 8 tokens) calls ``StandaloneARSpeculator.propose`` with the target's
    ``dp_sync_state``, whose ``num_tokens_across_dp`` the draft prefill passes to
    ``set_forward_context`` for its own 8 + 1 tokens (a correction token a request);
    the tiny model is a MoE, so ``DPMetadata.make`` asserts the two agree, and fails in
    vLLM's code."""

    class WithPeer(adapter().StandaloneAREngine):
        data_parallel = True

    case = Trace(config(2), decodes(2)).cases()[0]
    with pytest.raises(AssertionError, match="^8 9$") as failed:
        WithPeer()(ref.make_inputs(case))
    assert failed.traceback[-1].path.name == "forward_context.py"
    assert "_dummy_run" in {entry.name for entry in failed.traceback}
