"""What every registered target and mutant promises the zoo and the oracle."""

from __future__ import annotations

import pytest
from attnfuzz.harness.registry import get_target, target_names
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_a_case_with_wrong_target_parameters_is_refused_not_judged():
    import dataclasses

    from attnfuzz.harness.target import InvalidCase

    t = get_target("flex-block-mask")
    impl = t.resolve("pr39353-capacity")
    case = impl.smallest()
    ((name, _),) = case.params
    for params, why in (
        (((name, 9),), "outside [0, 4]"),  # out of range
        ((), "takes parameters"),  # missing
        (((name, 1), ("window", 3)), "takes parameters"),  # unknown extra
    ):
        bad = dataclasses.replace(case, params=params)
        assert why in " ".join(t.param_violations(bad))
        with pytest.raises(InvalidCase, match=why.replace("[", r"\[")):
            t.judge(impl, bad)


def test_an_allocation_failure_building_a_case_is_a_usage_error_and_other_errors_stay():
    """Building a case that does not fit in memory is refused in one line
    (``CaseTooLarge``), before the implementation runs; any other error of the
    harness's own code still surfaces as itself."""
    from dataclasses import replace

    from attnfuzz.harness.target import CaseTooLarge
    from attnfuzz.harness.targets.mtp_seq_lens import smallest_strided
    from attnfuzz.reference.batch import Case

    target = get_target("mtp-seq-lens")
    impl = target.implementations["triton"]
    case = smallest_strided()
    huge = Case(replace(case.config, max_model_len=10**15), case.batch, case.params)
    with pytest.raises(CaseTooLarge, match="does not fit in memory"):
        target.judge(impl, huge, "cpu")

    def broken(case, device):
        raise RuntimeError("a bug in make_inputs")

    with pytest.raises(RuntimeError, match="a bug in make_inputs"):
        replace(target, make_inputs=broken).judge(impl, case, "cpu")


def test_an_implementations_fixes_shape_its_cases_and_its_judge_refuses_others():
    """A kernel built for one top-k and no native MTP (``fixes``) is only given
    such cases, at any scale, and a case outside them is refused in one line
    naming the field, the case's value and the requirement: never judged."""
    import dataclasses

    from attnfuzz.harness.target import Implementation, InvalidCase, UsageError

    t = get_target("indexer-decode")
    impl = dataclasses.replace(
        t.implementations["reference"], name="ref-512", fixes={"topk": 512, "next_n": 1}
    )
    judged = [0]

    @settings(
        max_examples=25, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(t.cases(impl=impl))
    def check(case):
        assert case.config.topk == 512 and case.config.next_n == 1
        assert t.judge(impl, case, "cpu").ok
        judged[0] += 1

    check()
    assert judged[0] == 25
    case = t.implementations["pr39542-lengths"].smallest()
    assert case.config.next_n > 1
    with pytest.raises(InvalidCase) as err:
        t.judge(impl, case, "cpu")
    message = str(err.value)
    assert "\n" not in message and "ref-512" in message
    assert f"topk={case.config.topk} (requires topk=512)" in message
    assert f"next_n={case.config.next_n} (requires next_n=1)" in message
    with pytest.raises(UsageError, match="cannot fix 'seq_len'"):
        Implementation("bad", impl.fn, "user", fixes={"seq_len": 3})


def test_declined_cases_are_never_drawn_and_are_refused_in_one_line():
    """An implementation that declines some cases (an engine release that runs them
    through other code) is never given one: its search draws around them, a replayed
    one is refused in one line with the reason, and the zoo's baselines skip them."""
    import dataclasses

    from attnfuzz.harness.target import InvalidCase
    from attnfuzz.harness.zoo.arms import run_arm

    t = get_target("flatten-decode")

    def single_token_steps(case):
        split = t.describe(case)[1]
        if split.num_decodes and max(split.decode_lens) == 1:
            return "this engine does not flatten single-token decodes"
        return None

    judged: list = []

    def recording(inputs):
        judged.append(inputs.split)
        return t.implementations["reference"].fn(inputs)

    impl = dataclasses.replace(
        t.implementations["reference"], name="ref-multi", fn=recording,
        declines=single_token_steps,
    )  # fmt: skip

    @settings(max_examples=40, database=None, deadline=None)
    @given(t.cases(impl=impl))
    def drawn(case):
        assert single_token_steps(case) is None
        assert t.judge(impl, case, "cpu").ok

    drawn()
    from attnfuzz.harness.targets.flatten_decode import smallest_unaligned_width

    case = smallest_unaligned_width()  # the target's own case; no engine needed
    assert single_token_steps(case) is not None  # 1 request, 1 token
    with pytest.raises(InvalidCase) as err:
        t.judge(impl, case, "cpu")
    message = str(err.value)
    assert "\n" not in message and "ref-multi" in message
    assert message.endswith("this engine does not flatten single-token decodes")
    judged.clear()
    for arm in ("naive-random", "grid"):
        run_arm(arm, t, impl, seed=0, budget_s=None, max_examples=30, device="cpu")
    assert judged and all(s.num_decodes == 0 or max(s.decode_lens) > 1 for s in judged)


def test_an_engines_limits_bound_the_search_the_shrinking_and_every_replay(
    tmp_path, capsys, monkeypatch
):
    """An implementation that declares its engine's limits (``admits``, of the target's
    inputs; ``params`` narrowing a target parameter to them) is never given a case
    outside them: the search draws none, a failure minimizes inside them (here the
    bug fails every step, so an unbounded search ends at the smallest case of all),
    the zoo's baselines skip them, and judging or replaying one is refused in one line
    as unreachable for that engine, with its reason: never a pass or a fail."""
    import dataclasses

    from attnfuzz.harness.casefile import case_document, write_case
    from attnfuzz.harness.cli import main
    from attnfuzz.harness.oracle import Verdict
    from attnfuzz.harness.runner import fuzz
    from attnfuzz.harness.target import Implementation, Unreachable, UsageError
    from attnfuzz.harness.targets.mla_block_table import smallest_accept_length_layout
    from attnfuzz.harness.zoo.arms import run_arm
    from attnfuzz.reference import mla_block_table as ref

    t = get_target("mla-block-table")

    def drafts_and_big_pages(inputs):
        if inputs.page_size not in (2, 4):
            return f"page size {inputs.page_size} (the engine's pages are 2 or 4: engine.py)"
        if inputs.next_n < 2:
            return "no draft token (the engine drafts one at least: engine.py)"
        return None

    judged: list = []

    def off_by_one(inputs):  # a bug every step meets
        judged.append(inputs)
        out = t.implementations["reference"].fn(inputs)
        return dataclasses.replace(out, seq_lens_k=out.seq_lens_k + 1)

    impl = Implementation(
        "limited", off_by_one, "user", engine="myengine",
        admits=drafts_and_big_pages, params={"mla_page_log2": (1, 2)},
    )  # fmt: skip
    run = fuzz(t, impl, max_examples=60, rng_seed=0, database=None, device="cpu")
    assert run.failed and judged
    assert all(drafts_and_big_pages(inputs) is None for inputs in judged)
    assert run.case.config.next_n == 2 and ref.page_size_of(run.case) == 2  # shrunk to the wall

    outside = smallest_accept_length_layout()  # next_n 1, page 1
    with pytest.raises(Unreachable) as err:
        t.judge(impl, outside, "cpu")
    message = str(err.value)
    assert "\n" not in message and message.startswith("unreachable for myengine")
    assert message.endswith("page size 1 (the engine's pages are 2 or 4: engine.py)")

    judged.clear()
    for arm in ("naive-random", "grid"):
        run_arm(arm, t, impl, seed=0, budget_s=None, max_examples=20, device="cpu")
    assert judged and all(drafts_and_big_pages(inputs) is None for inputs in judged)

    monkeypatch.setitem(t.implementations, impl.name, impl)
    path = tmp_path / "outside.json"
    write_case(path, case_document(t.name, impl.name, outside, Verdict([])))
    judged.clear()
    assert main(["repro", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"attnfuzz: error: {path}: unreachable")
    assert "(the engine drafts" not in err and "page size 1" in err and not judged

    with pytest.raises(UsageError, match="outside mla-block-table's range"):
        t.add(dataclasses.replace(impl, name="wide", params={"mla_page_log2": (1, 9)}))


# mtp-seq-lens: its bug conditions are thresholds, and guiding drew its search away
# from vLLM's native path (see its build()). spec-indptr: its bug's condition is a
# configuration (topk > 1), not a distance. dsa-metadata: its bug's condition (a KV
# past the context) sits at the length limit, which the strategies draw often.
# mla-block-table: #21987's condition is the step's kind (a replayed draft extend),
# and a KV past the context sits at the length limit as dsa-metadata's.
UNGUIDED = {"mtp-seq-lens", "spec-indptr", "dsa-metadata", "mla-block-table"}


@pytest.mark.parametrize("target", target_names())
def test_every_guided_statistic_is_in_every_verdict_and_points_at_a_bug(target):
    """Each name in ``guided`` is in the statistics of every judged case (the
    search gets a value each time), failing verdicts included, and is positive
    on the smallest trigger of at least one of the target's mutants: a guided
    measure that no bug's condition raises would steer the search nowhere."""
    from attnfuzz.harness.target import Implementation
    from attnfuzz.harness.testing import judge_example
    from attnfuzz.strategies.batches import BOUNDARY_MEASURES

    t = get_target(target)
    # Every target guides but those of UNGUIDED, each for its reason.
    assert bool(t.guided) == (target not in UNGUIDED), f"{target}: guided {t.guided}"
    if not t.guided:
        return  # test_an_unguided_target_observes_nothing: such a search observes nothing
    assert t.statistics is not None or set(t.guided) <= set(BOUNDARY_MEASURES)
    reference = t.resolve("reference")

    @settings(
        max_examples=20, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(t.cases())
    def check(case):
        statistics = t.judge(reference, case, "cpu").statistics
        assert set(t.guided) <= set(statistics), case
        assert all(statistics[name] >= 0 for name in t.guided)

    check()

    def crash(inputs):
        raise RuntimeError("boom")

    case = t.mutants[0].smallest()  # a trace for a bug of the engine's life
    failing = judge_example(t, Implementation("crash", crash, "user"), case, "cpu")
    assert not failing.ok
    boundary = [n for n in t.guided if n in BOUNDARY_MEASURES]
    assert set(boundary) <= set(failing.statistics)
    raised = [
        m.name
        for m in t.mutants
        if any(judge_example(t, reference, m.smallest(), "cpu").statistics[n] > 0 for n in t.guided)
    ]
    assert raised, f"no guided statistic of {target} is raised by any mutant's smallest case"


def test_boundary_measures_count_padding_and_short_decodes():
    """Bug C's smallest case (docs/domain.md): 3 decodes of next_n = 2 (6 tokens)
    replayed in a graph of 8: two padded tokens, one padding request."""
    from attnfuzz.harness.targets.draft_block_tables import smallest_padded_table
    from attnfuzz.harness.targets.mtp_seq_lens import smallest_strided

    t = get_target("unpadding")
    padded = smallest_padded_table()
    assert t.boundary(padded) == {"padded_tokens": 2, "padding_requests": 1}
    strided = smallest_strided()  # two decodes with L = 1 < next_n
    assert get_target("indexer-decode").boundary(strided)["short_decodes"] == 2
    assert get_target("flex-block-mask").boundary(padded) == {"step_tokens": 6}


def test_targets_declare_their_dtypes_and_the_variable_may_only_pick_one_of_them(monkeypatch):
    """``Target.dtypes`` is the source of truth (the first is the default);
    ``ATTNFUZZ_DTYPE`` overrides it with another of the target's dtypes only, and
    a case's recorded dtype wins over the variable."""
    import dataclasses

    import torch
    from attnfuzz.harness.target import InvalidCase, Target, UsageError

    for name in target_names():
        assert get_target(name).dtypes[0] == torch.float32, name
    indexer, slots = get_target("indexer-decode"), get_target("slot-mapping")
    assert indexer.dtype_names == ["float32", "float16", "bfloat16"]
    assert slots.dtype_names == ["float32"]
    monkeypatch.delenv("ATTNFUZZ_DTYPE", raising=False)
    assert indexer.float_dtype_name() == slots.float_dtype_name() == "float32"
    half_first = dataclasses.replace(indexer, dtypes=(torch.bfloat16, torch.float32))
    assert half_first.float_dtype_name() == "bfloat16"  # the target's default, no variable

    monkeypatch.setenv("ATTNFUZZ_DTYPE", "float16")
    assert indexer.float_dtype_name() == "float16"
    with pytest.raises(
        UsageError, match="ATTNFUZZ_DTYPE=float16: slot-mapping builds its inputs in float32 only"
    ):
        slots.float_dtype_name()
    case = slots.mutants[0].smallest()
    with pytest.raises(UsageError, match="slot-mapping builds its inputs in float32 only"):
        slots.judge(slots.resolve("triton"), case, "cpu")  # refused before anything runs
    assert slots.float_dtype_name(dataclasses.replace(case, dtype="float32")) == "float32"
    with pytest.raises(InvalidCase, match="the case's dtype bfloat16: slot-mapping builds"):
        slots.float_dtype_name(dataclasses.replace(case, dtype="bfloat16"))
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "float64")
    with pytest.raises(UsageError, match="ATTNFUZZ_DTYPE='float64': expected one of"):
        indexer.float_dtype_name()
    with pytest.raises(UsageError, match="dtypes must be distinct, among float32"):
        Target("t", "", slots.make_inputs, slots.reference, slots.compare, dtypes=(torch.float64,))


def test_judge_builds_inputs_in_the_targets_dtype_and_refuses_reduced_precision_off_cuda(
    monkeypatch,
):
    import dataclasses

    from attnfuzz.harness.target import UsageError
    from attnfuzz.reference.batch import float_dtype_name

    indexer = get_target("indexer-decode")
    seen: list[str] = []

    def spy(case, device):
        seen.append(float_dtype_name())
        return indexer.make_inputs(case, device)

    spying = dataclasses.replace(indexer, make_inputs=spy)
    impl = indexer.resolve("reference")
    case = indexer.mutants[0].smallest()
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "float32")
    assert spying.judge(impl, case, "cpu").ok and seen == ["float32"]
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "bfloat16")
    with pytest.raises(UsageError, match="ATTNFUZZ_DTYPE='bfloat16' needs a CUDA device"):
        spying.judge(impl, case, "cpu")
    # A recorded dtype wins over the variable, on replay.
    assert spying.judge(impl, dataclasses.replace(case, dtype="float32"), "cpu").ok
    assert seen == ["float32", "float32"]


def test_indexer_prefill_rows_are_judged_as_sets_and_every_other_untouched_row_exactly():
    """The step's prefill rows hold the prefill branch's top-k, a set per row: glue
    that recomputes them may write them in another order. Another set there, or
    any change to a row outside the step, is still "unchanged" failing."""
    import torch
    from attnfuzz.harness.target import Implementation
    from attnfuzz.harness.targets.indexer_decode import SPEC3, reference_impl
    from attnfuzz.harness.testing import hand_case
    from attnfuzz.reference.indexer_decode import describe

    t = get_target("indexer-decode")
    case = hand_case((1, 2, 4), (4, 4, 0), use_cudagraph=False, **SPEC3)
    split = describe(case)[1]
    first, end = split.num_decode_tokens, split.num_decode_tokens + split.num_prefill_tokens
    assert split.num_prefill_tokens > 0

    def rewrite(change):
        def fn(inputs):
            out = reference_impl(inputs)
            change(inputs.topk_indices_buffer)
            return out

        return Implementation("rewrite", fn, "user")

    def reverse_prefill_rows(buf):
        before = buf[first:end].clone()
        buf[first:end] = before.flip(1)
        assert not torch.equal(before, buf[first:end])  # an exact comparison would fail

    def replace_a_prefill_index(buf):
        buf[first, 0] = buf[first].max() + 1

    def reverse_a_stale_row(buf):
        buf[end + 1] = buf[end + 1].flip(0)

    assert t.judge(rewrite(reverse_prefill_rows), case, "cpu").ok
    for change, row in ((replace_a_prefill_index, first), (reverse_a_stale_row, end + 1)):
        verdict = t.judge(rewrite(change), case, "cpu")
        assert verdict.key == "unchanged", change.__name__
        assert verdict.mismatches[0].where.startswith(f"topk_indices_buffer[{row}, ")


def _no_graph_impl():
    """An implementation whose backends support no CUDA graph (``cg_supports``)."""
    from attnfuzz.harness.target import Implementation

    t = get_target("slot-mapping")
    return t, Implementation(
        "no-graph", t.resolve("reference").fn, "user", "backends of no graph",
        cg_supports=("NEVER",),
    )  # fmt: skip


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_an_implementations_cg_supports_narrow_what_is_drawn(data):
    """Its cases are drawn with its backends' support alone, and the modes it keeps."""
    t, impl = _no_graph_impl()
    case = data.draw(t.cases(impl=impl))
    assert case.config.cg_support == "NEVER"
    assert case.config.cudagraph_mode in ("NONE", "PIECEWISE")
    t.refuse_unfixed(impl, case)  # drawn: judged


def test_a_case_of_another_support_is_refused():
    """A case whose backends keep FULL graphs is not one the implementation's engine
    runs: refused in one line naming its support; a support vLLM does not name is a
    usage error where the implementation is declared."""
    from dataclasses import replace

    from attnfuzz.harness.errors import InvalidCase, UsageError
    from attnfuzz.harness.target import Implementation
    from hypothesis import find

    t, impl = _no_graph_impl()
    case = find(t.cases(), lambda c: c.config.cg_support != "NEVER")
    with pytest.raises(InvalidCase, match=f"cg_support {case.config.cg_support}: .* NEVER"):
        t.refuse_unfixed(impl, case)
    assert impl.supports(("NEVER", "ALWAYS")) == ("NEVER",)
    assert replace(impl, cg_supports=None).supports(("ALWAYS",)) == ("ALWAYS",)
    with pytest.raises(UsageError, match="cg_supports"):
        Implementation("x", impl.fn, "user", "x", cg_supports=("SOMETIMES",))
