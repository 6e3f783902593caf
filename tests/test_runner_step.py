"""runner-step's own semantics: its properties on hand-made builds, its comparison, what
attnfuzz's own runner builds, and each mutant caught by its own property only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from attnfuzz.harness.oracle import Check
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.targets.runner_step import (
    OwnCheck,
    compare,
    overflows_row,
    trigger_reused_row,
)
from attnfuzz.harness.testing import judge_example
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.trace import Trace
from hypothesis import HealthCheck, given, settings

# A step of 2 requests (query lengths 2 and 1, lengths 5 and 3) and 3 tokens, padded
# for a graph of 4 tokens and 3 requests; pages of 4 tokens, a cache of 10 pages.
RANGES = {"seq_lens": (0, 8), "block_table": (0, 9), "slot_mapping": (-1, 39)}


def build(how: str, pad: bool = False, **changed) -> ref.StepBuild:
    values = {
        "query_start_loc": [0, 2, 3],
        "seq_lens": [5, 3],
        "block_table": [[4, 7], [2, 0]],
        "slot_mapping": [19, 28, 10],
    }
    if pad:  # a padding request and a padded token
        values["query_start_loc"] += [3]
        values["seq_lens"] += [0]
        values["block_table"] += [[0, 0]]
        values["slot_mapping"] += [-1]
    values |= changed
    tokens = len(values["slot_mapping"])
    fields = tuple(
        ref.Field(name, ref.FIELD_ROWS[name], np.array(v), RANGES.get(name, (0, tokens)))
        for name, v in values.items()
    )
    return ref.StepBuild(how, 2, 3, fields)


def outputs(*builds: ref.StepBuild) -> ref.RunnerStepOutputs:
    return ref.RunnerStepOutputs(builds)


EXPECTED = ref.RunnerStepExpected(num_reqs=2, num_tokens=3)


def mismatches(*builds: ref.StepBuild) -> list[str]:
    return [str(m) for m in compare(None, None, EXPECTED, outputs(*builds))]


def test_builds_that_agree_on_their_real_rows_and_stay_in_range_hold_every_property():
    """Padding rows differ from the eager build by design (it has none): only real rows
    are compared, and padding rows are judged by their range alone."""
    step = outputs(
        build("eager"), build("padded", pad=True), build("replay", pad=True), build("fresh")
    )
    assert ref.violations(step) == []
    assert compare(None, None, EXPECTED, step) == []


@pytest.mark.parametrize(
    "how, check",
    [
        ("padded", OwnCheck.PADDING_INVARIANCE),
        ("replay", OwnCheck.REPLAY_EQUALS_EAGER),
        ("fresh", OwnCheck.HISTORY_INVARIANCE),
        ("backend", OwnCheck.AGREEMENT),
    ],
)
def test_a_real_row_that_differs_from_the_eager_build_fails_its_property(how, check):
    wrong = build(how, pad=True, seq_lens=[5, 4, 0])  # request 1's length
    (message,) = mismatches(build("eager"), wrong)
    assert message == (
        f"[{check}] {how}.seq_lens: expected the eager build's real rows, got 1 of 2 real "
        "values differ; first at [1]: 4 where eager has 3"
    )


def test_a_block_table_row_is_compared_whole_on_the_columns_both_builds_hold():
    """Without the entries its consumer reads, a row is compared on every column both
    builds hold (columns past the narrower build's width are not compared)."""
    stale = build("fresh", block_table=[[4, 7], [2, 5]])
    (message,) = mismatches(build("eager"), stale)
    assert message.startswith("[history-invariance] fresh.block_table:")
    assert message.endswith("first at [1, 1]: 5 where eager has 0")
    assert not mismatches(build("eager"), build("fresh", block_table=[[4, 7, 0], [2, 0, 5]]))


def with_reads(b: ref.StepBuild, lengths: list[int]) -> ref.StepBuild:
    """``b`` with its block table's consumer reading each row's first ``lengths``."""
    fields = tuple(
        dataclasses.replace(f, row_lengths=np.array(lengths)) if f.name == "block_table" else f
        for f in b.fields
    )
    return dataclasses.replace(b, fields=fields)


def test_a_block_table_row_is_compared_on_the_entries_its_consumer_reads():
    """vLLM's rows keep an earlier request's pages past the current one's
    (``_gather_block_tables_kernel`` copies a request's own pages only), and its
    kernel reads a row's first ``cdiv(seq_len, block_size)``: builds agree on those."""
    eager = with_reads(build("eager"), [2, 1])
    assert not mismatches(eager, with_reads(build("fresh", block_table=[[4, 7], [2, 5]]), [2, 1]))
    (message,) = mismatches(eager, with_reads(build("fresh", block_table=[[4, 7], [3, 5]]), [2, 1]))
    assert message.endswith("first at [1, 0]: 3 where eager has 2")
    # A build whose consumer reads an entry the other's does not: they differ there.
    (message,) = mismatches(eager, with_reads(build("fresh", block_table=[[4, 7], [2, 5]]), [2, 2]))
    assert message.endswith("first at [1, 1]: 5 where eager has no read entry")


def on_backend(**values: list) -> ref.StepBuild:
    """The step's eager build by another backend, holding ``values`` (fields by request)."""
    fields = tuple(ref.Field(name, "requests", np.array(v)) for name, v in values.items())
    return ref.StepBuild("backend", 2, 3, fields, where="another backend")


def test_another_backends_build_agrees_with_the_eager_build_on_the_fields_both_hold():
    """Each backend names its metadata its own way: the fields both builds hold (what
    every backend derives from the step) must agree; the others are compared with nothing."""
    eager = build("eager")
    assert mismatches(eager, on_backend(seq_lens=[5, 3], cache_seqlens=[9, 9])) == []
    (message,) = mismatches(eager, on_backend(seq_lens=[5, 2], cache_seqlens=[9, 9]))
    assert message == (
        "[agreement-across-backends] backend.seq_lens: expected the eager build's real rows, "
        "got 1 of 2 real values differ; first at [1]: 2 where eager has 3"
    )
    # It alone fails: the other properties do not compare another backend's build.
    (v,) = ref.violations(outputs(eager, build("padded", pad=True), on_backend(seq_lens=[4, 3])))
    assert (v.prop, v.build, v.field) == ("agreement across backends", "backend", "seq_lens")
    assert ref.agreement_across_backends(outputs(eager, build("fresh", seq_lens=[5, 4]))) == []
    # Its real sizes are the step's.
    short = dataclasses.replace(on_backend(seq_lens=[5, 3]), num_reqs=1)
    found = mismatches(eager, short)
    assert found[0] == "[values] backend.num_reqs: expected 2 (the step's requests), got 1"
    assert found[1].startswith("[agreement-across-backends] backend: expected the eager")


def test_a_value_outside_its_consumers_range_fails_safe_padding_and_says_which_row():
    padding = build("padded", pad=True, block_table=[[4, 7], [2, 0], [-1, -1]])
    (message,) = mismatches(build("eager"), padding)
    assert message == (
        "[safe-padding] padded.block_table: expected values its consumer accepts, got 2 "
        "values outside [0, 9]; first at [2, 0] (padding row): -1"
    )
    real = build("capture", slot_mapping=[19, 28, 40])  # a capture run is judged too
    (message,) = mismatches(build("eager"), real)
    assert "capture.slot_mapping" in message and "outside [-1, 39]" in message
    # A padding row inside the range is never compared with anything: it passes.
    assert not mismatches(build("eager"), build("padded", pad=True, slot_mapping=[19, 28, 10, 3]))


def with_kv(b: ref.StepBuild, kv_slots: bool = True) -> ref.StepBuild:
    """``b`` with its slot mapping marked as the KV write's, and (``kv_slots``) each
    request's read KV slots: request 0 keys 0-4 on pages 4 and 7, request 1 keys 0-2
    on page 2."""
    fields = tuple(
        dataclasses.replace(f, writes_kv=True) if f.name == "slot_mapping" else f for f in b.fields
    )
    if kv_slots:
        slots = np.array([[16, 17, 18, 19, 28], [8, 9, 10, 0, 0]])
        lengths = np.array([5, 3])
        if b.how == "padded":  # a padding request, reading nothing
            slots, lengths = np.vstack([slots, np.zeros((1, 5), int)]), np.append(lengths, 0)
        fields += (ref.Field("kv_slots", "requests", slots, row_lengths=lengths),)
    return dataclasses.replace(b, fields=fields)


def test_a_padding_token_that_writes_a_real_requests_kv_slot_fails_padding_writes():
    """A padding token's slot in range (it passes safe padding) that a real request of
    the step reads: the padded forward writes its key over that request's. With the
    property returning nothing this test fails."""
    eager = with_kv(build("eager"))
    padded = build("padded", pad=True, slot_mapping=[19, 28, 10, 18])
    stale = with_kv(padded)
    (message,) = mismatches(eager, stale)
    assert message == (
        "[padding-writes-no-real-kv] padded.slot_mapping: expected no real request's read "
        "slots, got 1 padding values name a KV slot a real request reads; first at [3]: "
        "slot 18, read by request 0 (kv_slots of padded)"
    )
    # A build without kv_slots is judged on the eager build's of its sub-step.
    (v,) = ref.padding_writes_no_real_kv(outputs(eager, with_kv(padded, kv_slots=False)))
    assert (v.field, v.build) == ("slot_mapping", "padded") and "kv_slots of eager" in v.detail
    # PAD_SLOT_ID writes nothing; a slot no real request reads (page 0, or a key past a
    # request's length) is harmless; neither build holding kv_slots: nothing to say.
    for padding in (-1, 0, 11):
        fine = with_kv(build("padded", pad=True, slot_mapping=[19, 28, 10, padding]))
        assert not mismatches(eager, fine), padding
    plain = with_kv(build("eager"), kv_slots=False)
    assert not ref.padding_writes_no_real_kv(outputs(plain, with_kv(padded, kv_slots=False)))
    # A capture run (a dummy forward before any request is served) is of no step's
    # requests: nothing its tokens write is read.
    capture = dataclasses.replace(stale, how="capture", num_reqs=0, num_tokens=0)
    assert not ref.padding_writes_no_real_kv(outputs(eager, capture))
    # A field not marked as the KV write is never judged by it.
    assert not ref.padding_writes_no_real_kv(outputs(build("eager"), padded))


def with_state(b: ref.StepBuild, slots: list, null_slot: int | None = None) -> ref.StepBuild:
    """``b`` with a linear layer's state index per request (``Field.writes_state``)."""
    state = ref.Field(
        "state_indices", "requests", np.array(slots), (-1, 9), writes_state=True,
        null_slot=null_slot,
    )  # fmt: skip
    return dataclasses.replace(b, fields=(*b.fields, state))


def test_a_padding_row_that_names_a_real_requests_state_slot_fails_padding_writes_state():
    """A padding request's state slot in range (it passes safe padding) that a real
    request of the step holds: the padded forward updates that request's state with
    the padding row's tokens. With the property returning nothing this test fails."""
    eager = with_state(build("eager"), [3, 5])
    stale = with_state(build("padded", pad=True), [3, 5, 3])
    (message,) = mismatches(eager, stale)
    assert message == (
        "[padding-writes-no-real-state] padded.state_indices: expected no real request's "
        "state slot, got 1 padding rows name a state slot a real request holds; first at "
        "[2]: slot 3, request 0's"
    )
    # PAD_SLOT_ID (skipped) and a slot no real request holds are harmless.
    for padding in (-1, 0, 7):
        fine = with_state(build("padded", pad=True), [3, 5, padding])
        assert not mismatches(eager, fine), padding
    # A capture run is of no step's requests; an unmarked field is never judged by it.
    capture = dataclasses.replace(stale, how="capture", num_reqs=0, num_tokens=0)
    assert not ref.padding_writes_no_real_state(outputs(eager, capture))
    unmarked = dataclasses.replace(
        stale,
        fields=tuple(dataclasses.replace(f, writes_state=False) for f in stale.fields),
    )
    assert not ref.padding_writes_no_real_state(outputs(eager, unmarked))


def dummy(slot_mapping: list, slots: list, live: tuple[int, ...]) -> ref.StepBuild:
    """A dummy run between two steps (no real rows): one dummy request of one token
    padded to two requests, its KV write ``slot_mapping`` and its state slots
    ``slots``; ``live``: the eager build's rows the engine held while it ran."""
    fields = (
        ref.Field("slot_mapping", "tokens", np.array(slot_mapping), (-1, 39), writes_kv=True),
        ref.Field("state_indices", "requests", np.array(slots), (-1, 9), writes_state=True),
    )
    return ref.StepBuild("dummy", 0, 0, fields, live=live)


def test_a_dummy_run_that_writes_a_held_requests_kv_or_state_fails_writes_nothing_live():
    """A dummy run between two steps (a data-parallel rank idle while its peers run a
    step) whose KV write or state slot names one of a request the engine held while it
    ran: the dummy forward overwrites that request's cached key or state. With the
    dummy branch of either property returning nothing this test fails."""
    eager = with_state(with_kv(build("eager")), [3, 5])
    # Both requests held: slot 18 (request 0's key 2) and state slot 5 (request 1's).
    messages = mismatches(eager, dummy([18, -1], [5, 0], live=(0, 1)))
    assert messages == [
        "[dummy-run-writes-nothing-live] dummy.slot_mapping: expected no slot of a held "
        "request, got 1 dummy-run values name a KV slot a request held while it ran reads; "
        "first at [0]: slot 18, read by request 0 (kv_slots of eager)",
        "[dummy-run-writes-nothing-live] dummy.state_indices: expected no slot of a held "
        "request, got 1 dummy-run rows name a state slot a request held while it ran "
        "(eager) holds; first at [0]: slot 5, request 1's",
    ]
    # A request new to the step held nothing while the dummy run ran: its slots are free.
    assert not mismatches(eager, dummy([18, -1], [3, 0], live=(1,)))
    assert not mismatches(eager, dummy([-1, -1], [5, 0], live=(0,)))
    # PAD_SLOT_ID and the null block write nothing; the same build as a capture run (of
    # an engine that serves nothing yet) is not judged.
    assert not mismatches(eager, dummy([-1, -1], [0, 0], live=(0, 1)))
    capture = dataclasses.replace(dummy([18, -1], [5, 0], live=(0, 1)), how="capture")
    assert not mismatches(eager, capture)


def test_padding_writes_state_reads_a_slot_per_token_and_skips_the_null_slot():
    """A 2-D state field (a slot per query token, as a speculative decode's) fails at
    the padding row one of whose slots a real row holds. The null slot (vLLM's null
    block, ``Field.null_slot``) is no request's: padding that names it passes, even
    where a broken real row names it too."""
    eager = with_state(build("eager"), [[3, 4], [5, 6]])
    stale = with_state(build("padded", pad=True), [[3, 4], [5, 6], [0, 6]])
    (message,) = mismatches(eager, stale)
    assert message.endswith("first at [2]: slot 6, request 1's")
    nulled = with_state(build("padded", pad=True), [[3, 4], [0, 0], [0, 0]], null_slot=0)
    assert not ref.padding_writes_no_real_state(outputs(eager, nulled))
    unnamed = with_state(build("padded", pad=True), [[3, 4], [0, 0], [0, 0]])
    assert ref.padding_writes_no_real_state(outputs(eager, unnamed))


def with_windows(b: ref.StepBuild, windows: list, lengths: list) -> ref.StepBuild:
    """``b`` with each token's window of key slots (``windows``, ``lengths`` of each row
    read), its ``slot_mapping`` naming the window it writes into (``Field.read_in``)."""
    fields = [
        dataclasses.replace(f, read_in="windows") if f.name == "slot_mapping" else f
        for f in b.fields
    ]
    fields.append(
        ref.Field("windows", "tokens", np.array(windows), (-1, 39), row_lengths=np.array(lengths))
    )
    return dataclasses.replace(b, fields=tuple(fields))


def test_a_query_whose_window_lacks_the_key_it_writes_fails_reading_its_own_key():
    """Each real token reads the slot it writes (``slot_mapping`` 19, 28, 10 among the
    read entries of its window); a window that ends one key short of it fails, in every
    build of the step's requests, and says which row. A padding token, an entry past a
    row's length and a capture run are not judged. With the property returning nothing
    this test fails."""
    windows, lengths = [[18, 19, -1], [27, 28, 5], [9, 10, 0]], [2, 2, 2]
    assert not mismatches(with_windows(build("eager"), windows, lengths))
    padded = with_windows(build("padded", pad=True), [*windows, [0, 0, 0]], [*lengths, 1])
    assert not ref.queries_read_their_own_keys(outputs(padded))
    short = with_windows(build("eager"), windows, [2, 1, 2])  # 28 no longer read
    (message,) = mismatches(short)
    assert message == (
        "[queries-read-their-own-keys] eager.slot_mapping: expected each slot among those "
        "its query reads, got 1 of 3 real rows write a key they do not read; first row 1 "
        "writes slot 28, reads 1 slots of windows (last 27)"
    )
    capture = dataclasses.replace(short, how="capture", num_reqs=0, num_tokens=0)
    assert not ref.queries_read_their_own_keys(outputs(capture))
    unmarked = with_windows(build("eager"), windows, [2, 1, 2])
    unmarked = dataclasses.replace(
        unmarked, fields=tuple(dataclasses.replace(f, read_in=None) for f in unmarked.fields)
    )
    assert not ref.queries_read_their_own_keys(outputs(unmarked))


def test_a_token_is_held_to_its_requests_keys_where_the_keys_read_are_a_requests():
    """Where the keys read are a request's (``kv_slots``, rows ``requests``, as vLLM's
    kernels read a sequence's first ``seq_lens`` keys), each token is held to the keys
    of the request ``query_start_loc`` puts it in: tokens 0-1 are request 0's (slots 19
    and 28 among 18, 19, 28), token 2 request 1's (10). A request that stops one key
    short fails at its token; a negative slot writes no key; a build with no
    ``query_start_loc`` holding the tokens fails. With the per-token mapping removed
    (each token held to row ``i`` of the requests' table) this test fails."""
    kv = ref.Field("kv_slots", "requests", np.array([[18, 19, 28], [9, 10, 0]]),
                   row_lengths=np.array([3, 2]))  # fmt: skip

    def reading(b: ref.StepBuild, table: ref.Field = kv) -> ref.StepBuild:
        fields = [dataclasses.replace(f, read_in="kv_slots") if f.name == "slot_mapping"
                  else f for f in b.fields]  # fmt: skip
        return dataclasses.replace(b, fields=(*fields, table))

    assert not ref.queries_read_their_own_keys(outputs(reading(build("eager"))))
    short = dataclasses.replace(kv, row_lengths=np.array([2, 2]))  # 28 no longer read
    (v,) = ref.queries_read_their_own_keys(outputs(reading(build("eager"), short)))
    assert v.detail == ("1 of 3 real rows write a key they do not read; first row 1 "
                        "writes slot 28, reads 2 slots of kv_slots (last 19)")  # fmt: skip
    skipped = reading(build("eager", slot_mapping=[19, -1, 10]), short)
    assert not ref.queries_read_their_own_keys(outputs(skipped))
    cut = reading(build("eager", query_start_loc=[0, 1, 2]))
    (v,) = ref.queries_read_their_own_keys(outputs(cut))
    assert v.detail == "3 real tokens beyond the build's query_start_loc"


def test_every_build_but_a_capture_run_reports_the_steps_real_sizes():
    short = ref.StepBuild("padded", 3, 3, build("padded", pad=True).fields)
    found = compare(None, None, EXPECTED, outputs(build("eager"), short))
    assert str(found[0]) == "[values] padded.num_reqs: expected 2 (the step's requests), got 3"
    assert found[1].check == OwnCheck.PADDING_INVARIANCE and found[1].where == "padded"
    capture = ref.StepBuild("capture", 0, 0, build("capture").fields)
    assert compare(None, None, EXPECTED, outputs(build("eager"), capture)) == []


def test_a_micro_batch_wholly_in_the_padding_is_judged_by_safety_alone():
    """vLLM's V2 runner splits at the middle of the padded count, so its second
    micro-batch may hold no real token: no real row to compare, its padding rows held
    to their consumers' ranges; one past the step that claims tokens is still wrong."""

    def micro(tokens: int, seq_len: int) -> ref.StepBuild:
        values = {"query_start_loc": [0, 0], "seq_lens": [seq_len],
                  "block_table": [[2, 0]], "slot_mapping": [-1]}  # fmt: skip
        fields = tuple(
            ref.Field(name, ref.FIELD_ROWS[name], np.array(v), RANGES.get(name, (0, 1)))
            for name, v in values.items()
        )
        return ref.StepBuild("microbatch", 0, tokens, fields, first_token=3)

    assert mismatches(build("eager"), micro(0, 3)) == []
    (unsafe,) = compare(None, None, EXPECTED, outputs(build("eager"), micro(0, 9)))
    assert unsafe.check == OwnCheck.SAFE_PADDING and "seq_lens" in str(unsafe)
    (claims,) = ref.microbatch_agreement(outputs(build("eager"), micro(1, 3)))
    assert "tokens [3, 4) of a step of 3 tokens" in claims.detail


def test_the_micro_batches_of_a_partition_hold_each_token_of_the_step_once():
    """The step of 3 tokens cut as a context-parallel split cuts it, tokens [0, 1) and
    [1, 3) on two ranks (one partition), tiles it; a token in none of them or in two is
    a violation of micro-batch agreement, which each micro-batch alone passes; micro-
    batches of no partition (a dual-batch overlap's, its sets from several forwards) are
    not held together. With the tiling removed this test fails."""
    eager = build("eager")

    def segment(first: int, n: int, partition: str | None = "cp") -> ref.StepBuild:
        f = eager.field("slot_mapping")
        assert f is not None
        rows = ref.Field("slot_mapping", "tokens", f.values[first : first + n], f.accepts)
        reqs = 2 if first == 1 and n == 2 else 1  # tokens [1, 3): requests 0 and 1
        return ref.StepBuild("microbatch", reqs, n, (rows,), first_token=first,
                             partition=partition)  # fmt: skip

    assert ref.microbatch_agreement(outputs(eager, segment(1, 2), segment(0, 1))) == []
    (lost,) = ref.microbatch_agreement(outputs(eager, segment(0, 1), segment(1, 1)))
    assert lost.detail == "tokens [2, 3) of eager in none of its micro-batches"
    (gap,) = ref.microbatch_agreement(outputs(eager, segment(1, 2)))
    assert gap.detail == "tokens [0, 1) in none of the micro-batches of eager"
    (twice,) = ref.microbatch_agreement(outputs(eager, segment(0, 2), segment(1, 2)))
    assert twice.detail == "tokens [1, 2) in two of the micro-batches of eager"
    assert ref.microbatch_agreement(outputs(eager, segment(0, 1, None))) == []


def test_outputs_without_an_eager_build_or_of_another_type_fail():
    (missing,) = compare(None, None, EXPECTED, outputs(build("padded", pad=True)))
    assert (missing.check, missing.where) == (Check.TYPE, "builds")
    assert missing.got == "builds: padded"
    (wrong,) = compare(None, None, EXPECTED, {"builds": ()})
    assert (wrong.check, wrong.got) == (Check.TYPE, "dict")


def drafted(b: ref.StepBuild, draft: int, num_tokens: int) -> ref.StepBuild:
    """``b`` as the drafter's sub-step ``draft`` of ``num_tokens`` real tokens."""
    return dataclasses.replace(b, draft=draft, num_tokens=num_tokens)


def test_a_draft_sub_step_is_compared_with_the_eager_build_of_its_own_sub_step():
    """A drafter's sub-step (one token per request after its first pass) holds its own
    real tokens: its builds agree with the eager one of the same sub-step, not with the
    step's, and report the step's requests."""
    loop = dict(query_start_loc=[0, 1, 2], seq_lens=[6, 4], slot_mapping=[20, 29])
    padded_loop = dict(query_start_loc=[0, 1, 2, 2], seq_lens=[6, 4, 0])
    eager, eager_loop = build("eager"), drafted(build("eager", **loop), 1, 2)
    padded_loop = drafted(
        build("padded", **loop | padded_loop | {"slot_mapping": [20, 29, -1]}), 1, 2
    )
    holds = (eager, eager_loop, build("padded", pad=True), padded_loop)
    assert mismatches(*holds) == []
    # The loop's padded build off by one on a real row (a rejected draft kept).
    wrong = drafted(build("padded", **loop | {"seq_lens": [7, 4]}), 1, 2)
    (message,) = mismatches(eager, eager_loop, wrong)
    assert message.startswith("[padding-invariance] padded.draft1.seq_lens:")
    assert message.endswith("first at [0]: 7 where eager.draft1 has 6")
    found = mismatches(eager, eager_loop, drafted(build("fresh", **loop), 1, 2), wrong)
    assert [m.split(":")[0] for m in found] == ["[padding-invariance] padded.draft1.seq_lens"]
    # A sub-step no eager build holds is compared with nothing: the outputs are wrong.
    (missing,) = mismatches(eager, padded_loop)
    assert missing == (
        "[type] builds: expected an eager build of each draft sub-step, got none of [1]"
    )
    # A sub-step's requests are still the step's.
    short = mismatches(eager, eager_loop, dataclasses.replace(padded_loop, num_reqs=1))[0]
    assert short.startswith("[values] padded.draft1.num_reqs: expected 2")


def test_a_proposal_after_the_previous_step_holds_that_steps_requests():
    """A proposal made after the previous step (reported once this step came, as vLLM's
    V2 runner's sampler verdict needs) holds the previous step's requests, which may
    outnumber this step's: each of its builds must hold as many as its eager build."""
    three = dict(query_start_loc=[0, 1, 2, 3], seq_lens=[6, 4, 2], slot_mapping=[20, 29, 7])
    three |= {"block_table": [[4, 7], [2, 0], [3, 0]]}
    proposal = dataclasses.replace(drafted(build("eager", **three), 1, 3), num_reqs=3)
    before = dataclasses.replace(proposal, proposed_before=True)
    padded = dataclasses.replace(before, how="padded")
    assert mismatches(build("eager"), before, padded) == []
    # Made within the step, three requests where the step has two is wrong.
    (wrong,) = mismatches(build("eager"), proposal)
    assert wrong.startswith("[values] eager.draft1.num_reqs: expected 2 (the step's requests)")
    # A build of the earlier proposal that holds fewer requests than its eager build.
    short = dataclasses.replace(padded, num_reqs=2)
    assert (
        "[values] padded.draft1.num_reqs: expected 3 (eager.draft1's requests), got 2"
    ) in mismatches(build("eager"), before, short)


# -- attnfuzz's own runner ----------------------------------------------------------------------


def _run(impl: str, trace: Trace) -> list[ref.RunnerStepOutputs]:
    t = get_target("runner-step")
    fn = t.resolve(impl).fn
    fn.new_engine()
    return [fn(ref.make_inputs(case)) for case in trace.cases()]


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_the_runner_pads_a_decode_for_its_graph_and_captures_on_its_first_step_only(impl):
    """next_n = 1: one decode of one token replays the decode graph of 2 tokens and
    2 requests. The engine's first step starts with its capture runs (one per FULL
    graph); padding rows hold empty queries at T, length 0, the null page, slot -1."""
    t = get_target("runner-step")
    trace = t.resolve("padded-count-offsets").smallest()
    trace = Trace(trace.config, trace.steps * 2)  # the same step again, on the same engine
    first, second = _run(impl, trace)
    hows = [b.how for b in first.builds]
    full_graphs = len(ref.capture_steps(trace.config))
    assert hows == ["capture"] * full_graphs + ["eager", "replay", "padded", "fresh"]
    assert [b.how for b in second.builds] == ["eager", "replay", "padded", "fresh"]
    padded = next(first.of("padded"))
    values = {f.name: f.values.tolist() for f in padded.fields}
    assert values["query_start_loc"] == [0, 1, 1]
    assert values["seq_lens"] == [1, 0]
    assert values["slot_mapping"] == [trace.steps[0].pages[0][0] * 4, -1]
    assert values["positions"] == [0, 0]
    assert set(values["block_table"][1]) == {0}
    assert ref.violations(first) == [] and ref.violations(second) == []


# -- the mutants: each caught by its own property, and only by it ---------------------------------

MUTANT_CHECKS = {
    "padded-count-offsets": OwnCheck.PADDING_INVARIANCE,
    "stale-replay-rows": OwnCheck.REPLAY_EQUALS_EAGER,
    "reused-row-pages": OwnCheck.HISTORY_INVARIANCE,
    "slot-id-as-padding-page": OwnCheck.SAFE_PADDING,
}


def test_every_mutant_has_a_property():
    own = {m.name for m in get_target("runner-step").mutants if m.engine is None}
    assert own == set(MUTANT_CHECKS)  # an engine's mutants are the engine's tests


@pytest.mark.parametrize("mutant, check", sorted(MUTANT_CHECKS.items()))
def test_each_mutant_fails_its_smallest_trace_on_its_own_property_only(mutant, check):
    t = get_target("runner-step")
    impl = t.resolve(mutant)
    trace = impl.smallest()
    verdict = judge_example(t, impl, trace, "cpu")
    assert {m.check for m in verdict.mismatches} == {check}, verdict
    for fixed in ("triton", "reference"):
        assert judge_example(t, t.resolve(fixed), trace, "cpu").ok, fixed


@pytest.mark.slow
@pytest.mark.parametrize("mutant, check", sorted(MUTANT_CHECKS.items()))
def test_each_trigger_is_exact_and_only_its_property_fails(mutant, check):
    """On drawn traces, a mutant fails exactly where its trigger says, and never on
    another property's check."""
    t = get_target("runner-step")
    impl = t.resolve(mutant)

    @settings(
        max_examples=12, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(t.traces())
    def check_trace(trace):
        verdict = judge_example(t, impl, trace, "cpu")
        lived = trace.prefix(verdict.step + 1) if verdict.step is not None else trace
        assert impl.trigger(lived) == (not verdict.ok), (trace, verdict)
        # A mutant's own bounds check may raise first: reused-row-pages' append past the
        # table's width (a numpy row append past its end raises too).
        raised = {Check.EXCEPTION} if overflows(impl, lived) else set()
        assert {m.check for m in verdict.mismatches} <= {check} | raised, verdict

    check_trace()


def overflows(impl, trace) -> bool:
    """Whether the mutant's table row overflows on ``trace`` (reused-row-pages only)."""
    return impl.name == "reused-row-pages" and overflows_row(trace)


def _reuse_trace(
    old_pages: tuple[int, ...], new_pages: tuple[int, ...], block_size: int, max_model_len: int
):
    """Request 0 prefills on row 0 into ``old_pages`` and finishes; request 1 arrives
    with ``new_pages`` and takes row 0."""
    from attnfuzz.harness.testing import spec_config
    from attnfuzz.reference.batch import Batch

    prefill = (len(old_pages) - 1) * block_size + 1
    config = spec_config(
        num_spec=0,
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=1,
        max_num_batched_tokens=prefill,
        cudagraph_capture_sizes=(1,),
    )
    old = Batch(
        (0,), (prefill,), 0, True, req_ids=(0,), pages=(old_pages,), new_pages=(len(old_pages),)
    )
    new = Batch((0,), (1,), 0, True, req_ids=(1,), pages=(new_pages,), new_pages=(1,))
    return Trace(config, (old, new))


@pytest.mark.parametrize(
    "old_pages, new_pages, block_size, max_model_len, expected",
    [
        ((1, 2, 3), (1,), 1, 8, set()),  # the reused row's front page is the new one's own
        ((1, 2, 3), (4,), 1, 8, {OwnCheck.HISTORY_INVARIANCE}),
        ((1, 2), (3,), 64, 128, {Check.EXCEPTION}),  # the kept count overflows a row of 2
    ],
)
def test_reused_row_pages_fails_where_its_consumers_read(
    old_pages, new_pages, block_size, max_model_len, expected
):
    """reused-row-pages' trigger and verdict on a row reuse: the old pages kept in front
    are wrong only where they differ from the new request's own (found by CI: a trigger
    that said every reuse fails), and an overflow raises (found by CI too)."""
    t = get_target("runner-step")
    impl = t.resolve("reused-row-pages")
    trace = _reuse_trace(old_pages, new_pages, block_size, max_model_len)
    verdict = judge_example(t, impl, trace, "cpu")
    assert {m.check for m in verdict.mismatches} == expected, verdict
    assert trigger_reused_row(trace) == bool(expected)
    assert overflows_row(trace) == (expected == {Check.EXCEPTION})
    assert judge_example(t, t.resolve("triton"), trace, "cpu").ok
