"""vLLM 0.33.0's V2 runner with one MTP module a draft (``vllm-mtp-modules``): its
``MultiModuleMTPSpeculator`` run whole after each step by the runner's own
``sample_tokens``, each module's forward a build judged by the step's properties, and a
mutant of its trailing-slot padding caught."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, requires_vllm
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_mtp_modules

    return runner_step_mtp_modules


def config():
    """Two drafts (two MTP modules), capture sizes 2, 4 and 8, FULL_AND_PIECEWISE,
    pages of 16 tokens (a Triton kernel block size)."""
    return spec_config(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=16, max_model_len=64,
        cudagraph_capture_sizes=(2, 4, 8), num_spec=2,
    )  # fmt: skip


def decodes() -> tuple[Batch, ...]:
    """Two requests prefill (5 and 3 tokens) and decode with both drafts; request 7
    then rejects them both (its last decode's trailing input re-prefilled), request 8
    accepts both; both decode again with their drafts."""
    pages = ((1,), (2,))
    return (
        Batch((0, 0), (5, 3), req_ids=(7, 8), pages=pages, new_pages=(1, 1)),
        Batch((5, 3), (3, 3), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
        Batch((6, 6), (3, 3), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
    )


def run(trace: Trace) -> list[ref.RunnerStepOutputs]:
    engine = adapter().MTPModulesEngine()
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_each_mtp_module_s_forward_is_a_build_and_every_property_holds(monkeypatch):
    """After each step the runner's ``sample_tokens`` runs ``MultiModuleMTPSpeculator
    .propose``: its input kernel, its graph dispatch (the graph engine replays its FULL
    graph once the step is a uniform decode), then one forward a module over the step's
    query, on every engine; its graphs were captured. Every property holds."""
    adapter()  # before vLLM
    import vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator as modules

    calls = Calls(monkeypatch)

    calls.count(modules.MultiModuleMTPSpeculator, "capture")
    for name in ("prepare_input_buffers", "pad_trailing_draft_slots", "update_draft_inputs"):
        calls.count(modules, name)
    outs = run(Trace(config(), decodes()))
    for out in outs:
        assert ref.violations(out) == []
    for out, step in zip(outs[1:], decodes(), strict=False):
        for how in ("eager", "fresh"):
            subs = [b for b in out.builds if b.how == how and b.draft is not None]
            assert [b.draft for b in subs] == [0, 1], how
            assert all(b.num_tokens == sum(step.q_lens) for b in subs), how
    assert [b.draft for b in outs[2].builds if b.how == "replay" and b.draft is not None]
    assert calls["capture"] >= 1 and calls["prepare_input_buffers"] >= 6
    assert calls["pad_trailing_draft_slots"] == calls["prepare_input_buffers"]


def test_trailing_draft_slots_left_unpadded_are_caught(monkeypatch):
    """A mutant of the multi-module speculator: ``pad_trailing_draft_slots`` not run, so
    the slot a rejection leaves past a request's re-prefilled query keeps the slot of
    whatever position an earlier proposal left in the buffer (the stale write the
    padding prevents). Request 7 rejects both drafts: the eager engine's slot there is
    its own history's, the fresh engine's and the replayed graph's another."""
    adapter()  # before vLLM
    import vllm.v1.worker.gpu.spec_decode.multi_module_mtp.speculator as modules

    monkeypatch.setattr(modules, "pad_trailing_draft_slots", lambda *args, **kwargs: None)
    outs = run(Trace(config(), decodes()))
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert ("history invariance", "slot_mapping", "fresh.draft0") in found, found
    assert {field for _, field, _ in found} == {"slot_mapping"}, found


def test_a_first_decode_that_rejects_past_a_short_prompt_reprefills_before_position_0():
    """vLLM 0.33.0's own finding (``vllm-mtp-modules-reprefill-before-prompt``): after a
    one-token prompt, a decode that rejects all three drafts makes the draft pass
    re-prefill two tokens before the query's first (position 1), the first at position
    -1, in every module's forward. Two rejected re-prefill one, at position 0: every
    property holds. ``vllm-mtp-modules`` declines the step (its searches judge the
    rest); the mutant-kind entry keeps the case."""
    from attnfuzz.harness.errors import InvalidCase
    from attnfuzz.harness.registry import get_target

    a = adapter()
    trace = a.smallest_reprefill_before_prompt()
    drafting = trace.steps[1]
    assert a.reprefill_before_prompt(drafting) and a.trigger_reprefill_before_prompt(trace)
    near = dataclasses.replace(drafting, rejected=(2,))
    assert not a.reprefill_before_prompt(near) and a.reach_reprefill(trace)
    longer = dataclasses.replace(drafting, num_computed_tokens=(2,))  # a 2-token prompt
    assert not a.reprefill_before_prompt(longer)

    target = get_target("runner-step")
    kept = target.implementations["vllm-mtp-modules-reprefill-before-prompt"]
    verdict = target.judge_trace(kept, trace)
    assert verdict.step == 2 and {m.check for m in verdict.mismatches} == {"safe-padding"}
    for m in verdict.mismatches:
        assert m.where.endswith(".positions") and m.got.endswith(": -1"), m
    with pytest.raises(InvalidCase, match="kept apart as vllm-mtp-modules-reprefill"):
        target.judge_trace(target.implementations["vllm-mtp-modules"], trace)
    after = dataclasses.replace(trace.steps[2], num_computed_tokens=(3,))
    fixed = dataclasses.replace(trace, steps=(trace.steps[0], near, after))
    assert target.judge_trace(target.implementations["vllm-mtp-modules"], fixed).ok
