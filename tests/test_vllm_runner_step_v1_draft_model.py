"""vLLM 0.33.0's V1 runner with a separate draft model (``vllm-v1-draft-model``): its
``DraftModelProposer`` run whole after each step by the runner's own ``sample_tokens``,
through the proposer's path for extra input slots (the expansion kernel, the new slot
mapping, every query one row longer), each draft forward a build judged by the step's
properties; the scheduler's drafting slots kept; a mutant of the padded forward's slot
mapping caught."""

from __future__ import annotations

from attnfuzz.adapters.vllm import limits
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def adapter():
    from attnfuzz.adapters.vllm import runner_step_v1_draft_model

    return runner_step_v1_draft_model


def run(engine, trace: Trace) -> list[ref.RunnerStepOutputs]:
    return [engine(ref.make_inputs(case)) for case in trace.cases()]


def test_the_expanded_query_is_a_build_and_every_property_holds(monkeypatch):
    """Three requests prefill 2, 3 and 4 tokens; then two of them decode with both
    drafts. After each step ``sample_tokens`` proposes with ``DraftModelProposer``,
    whose first forward takes the extra input slot: each request's query one row longer
    (its bonus token at the next position), ``seq_lens`` one longer, on every engine;
    the graph engine's second first pass (8 rows) padded to 9 with the padding slot.
    Every property holds."""
    a = adapter()  # before vLLM
    from vllm.v1.spec_decode import llm_base_proposer

    expanded = []
    original = llm_base_proposer.compute_new_slot_mapping

    def counted(*args, **kwargs):
        expanded.append(kwargs["num_new_tokens"])
        return original(*args, **kwargs)

    monkeypatch.setattr(llm_base_proposer, "compute_new_slot_mapping", counted)
    a.run.new_engine()
    outs = run(a.run, a.smallest_padding_slots_stale())
    for out in outs:
        assert ref.violations(out) == []
    first = [{b.how: {f.name: f.values.tolist() for f in b.fields} for b in out.builds
              if b.draft == 0} for out in outs]  # fmt: skip
    assert set(first[0]) == {"eager", "padded", "fresh"}
    assert first[0]["eager"]["query_start_loc"] == [0, 3, 7, 12]
    assert first[0]["eager"]["positions"] == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]
    assert first[0]["eager"]["seq_lens"] == [3, 4, 5]
    assert first[1]["eager"]["query_start_loc"] == [0, 4, 8]
    assert first[1]["padded"]["slot_mapping"] == first[1]["eager"]["slot_mapping"] + [-1]
    assert expanded and set(expanded) == {1}


def test_a_step_without_room_for_the_drafting_slots_is_declined():
    """vLLM's scheduler charges each request its tokens and one drafting slot: a step of
    14 tokens for 3 requests under a budget of 16 (17 rows of the draft forward) is no
    state vLLM reaches, declined and not drawn; 13 tokens are."""
    a = adapter()
    trace = a.smallest_padding_slots_stale()
    over = Case(trace.config, Batch((0, 0, 0), (4, 5, 5), req_ids=(1, 2, 3)))
    fits = Case(trace.config, Batch((0, 0, 0), (4, 4, 5), req_ids=(1, 2, 3)))
    assert "max_num_new_slots_for_drafting" in a.declines(over)
    assert "max_num_new_slots_for_drafting" in limits.draft_model_step_admits(ref.make_inputs(over))
    assert limits.draft_model_step_admits(ref.make_inputs(fits)) is None


def test_stale_padding_slots_are_caught():
    """The mutant ``vllm-v1-draft-model-padding-slots-stale`` (``_get_slot_mapping`` not
    padding the rows past the expanded query): the padded second proposal's padding
    row keeps a slot of the first proposal's, a key a request now reads."""
    a = adapter()
    trace = a.smallest_padding_slots_stale()
    assert a.reach_v1_draft_model(trace) and a.trigger_padding_slots_stale(trace)
    a.run_padding_slots_stale.new_engine()
    outs = run(a.run_padding_slots_stale, trace)
    found = {(v.prop, v.field, v.build) for out in outs for v in ref.violations(out)}
    assert found == {("padding writes no real KV", "slot_mapping", "padded.draft0")}, found


def test_a_query_not_lengthened_in_seq_lens_reads_short_of_its_own_key():
    """The mutant ``vllm-v1-draft-model-seq-lens-unextended`` (``extend_all_queries_by_N``
    leaving ``seq_lens`` as the target's): the bonus token's row writes its key at
    position 2 and reads the request's first 2 keys, caught by queries-read-their-own-
    keys on every build of the proposal (each draft decode after it reads one short
    too); ``vllm-v1-draft-model`` passes the same trace."""
    a = adapter()
    trace = a.smallest_seq_lens_unextended()
    assert a.reach_v1_draft_model(trace) and a.trigger_seq_lens_unextended(trace)
    a.run.new_engine()
    assert [ref.violations(out) for out in run(a.run, trace)] == [[]]
    a.run_seq_lens_unextended.new_engine()
    (out,) = run(a.run_seq_lens_unextended, trace)
    found = {(v.prop, v.field, v.build) for v in ref.violations(out)}
    assert ("queries read their own keys", "slot_mapping", "eager.draft0") in found
    assert {prop for prop, _, _ in found} == {"queries read their own keys"}
