"""vLLM 0.33.0's V1 runner with a DFlash draft model (``vllm-v1-dflash``): its
``DFlashProposer`` run whole after each step by the runner's own ``sample_tokens``, its
query forward a build judged by the step's properties, and a mutant of the padded
query's slot mapping caught."""

from __future__ import annotations

from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_dflash

    return runner_step_v1_dflash


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_the_dflash_query_is_a_build_and_every_property_holds(monkeypatch):
    """Three requests prefill, then two of them decode with both drafts. After each step
    ``sample_tokens`` proposes with ``DFlashProposer``: ``set_inputs_first_pass`` (its
    expansion kernel), then one query forward of three rows a request (the bonus token
    and two masks) after each request's last valid token, on every engine; the graph
    engine's second proposal is padded to the drafter's capture size 9. Every property
    holds."""
    a = adapter()  # before vLLM
    from vllm.v1.spec_decode.dflash import DFlashProposer

    calls = []
    original = DFlashProposer.set_inputs_first_pass

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DFlashProposer, "set_inputs_first_pass", counted)
    outs = run(a.DFlashRunnerStepEngine(), a.smallest_padding_slots_stale())
    for out in outs:
        assert ref.violations(out) == []
    for out, reqs in zip(outs, (3, 2), strict=True):
        drafts = {b.how: b for b in out.builds if b.draft is not None}
        assert set(drafts) == {"eager", "padded", "fresh"}
        assert {(b.draft, b.num_reqs, b.num_tokens) for b in drafts.values()} == {
            (0, reqs, 3 * reqs)
        }
    drafts = {b.how: {f.name: f.values.tolist() for f in b.fields} for b in outs[1].builds
              if b.draft is not None}  # fmt: skip
    # Requests 7 (5 tokens) and 9 (7 tokens) accepted both drafts: queries at 5..7, 7..9.
    assert drafts["eager"]["query_start_loc"] == [0, 3, 6]
    assert drafts["eager"]["positions"] == [5, 6, 7, 7, 8, 9]
    assert drafts["eager"]["seq_lens"] == [8, 10] == drafts["eager"]["kv_len"]
    assert drafts["padded"]["slot_mapping"] == drafts["eager"]["slot_mapping"] + [-1] * 3
    assert len(calls) >= 6


def test_stale_padding_slots_are_caught():
    """The mutant ``vllm-v1-dflash-padding-slots-stale`` (``_get_slot_mapping`` not
    padding the rows past the query): the padded proposal's three padding rows keep
    request 9's query slots of the proposal before, keys request 9 now reads."""
    a = adapter()
    trace = a.smallest_padding_slots_stale()
    assert a.trigger_padding_slots_stale(trace)
    a.run_padding_slots_stale.new_engine()
    outs = run(a.run_padding_slots_stale, trace)
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {("padding writes no real KV", "slot_mapping", "padded.draft0")}, found
