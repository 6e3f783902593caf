"""vLLM 0.33.0's model runner V2 step, whole, as the implementation ``vllm`` of
``runner-step``: ``execute_model`` with its own padding, graph dispatch, data-parallel
padding, capture runs and dummy runs, judged by the step's properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.lookahead import num_lookahead_tokens
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace
from attnfuzz.strategies import batches, traces
from hypothesis import HealthCheck, assume, given, settings

pytestmark = requires_vllm


def adapter():
    from attnfuzz.adapters.vllm import runner_step

    return runner_step


def small_config(**overrides):
    """next_n = 2, a few capture sizes, FULL_AND_PIECEWISE (vLLM's default)."""
    base = dict(max_num_seqs=4, max_num_batched_tokens=16, cudagraph_capture_sizes=(2, 4, 8))
    return spec_config(**{**base, **overrides})


def run_trace(trace: Trace) -> list[ref.RunnerStepOutputs]:
    rs = adapter()
    engine = rs.RunnerStepEngine()
    outs = []
    for case in trace.cases():
        out = engine(ref.make_inputs(case))
        assert ref.violations(out) == [], case
        outs.append(out)
    return outs


def builds(out: ref.RunnerStepOutputs, how: str) -> list[ref.StepBuild]:
    return list(out.of(how))


def tokens_of(build: ref.StepBuild) -> int:
    """The build's padded token rows (the positions its forward reads)."""
    return len(build.field("positions").values)


def test_a_decode_below_every_capture_size_is_padded_to_the_graph_and_replayed():
    """One request prefills 5 tokens, then decodes next_n = 2; capture sizes 4 and 8
    (decode graphs of 2 and 4 requests): the runner dispatches the decode graph of 4
    tokens, one padding request, and replays it; capture ran for every size."""
    config = small_config(cudagraph_capture_sizes=(4, 8))
    steps = (
        Batch((0,), (5,), req_ids=(7,), pages=((1, 2),), new_pages=(2,)),
        Batch((5,), (2,), req_ids=(7,), pages=((1, 2),), new_pages=(0,)),
    )
    first, out = run_trace(Trace(config, steps))
    (eager,) = builds(out, "eager")
    assert (eager.num_reqs, eager.num_tokens, tokens_of(eager)) == (1, 2, 2)
    (padded,) = builds(out, "padded")
    assert (padded.num_reqs, padded.num_tokens) == (1, 2)
    # The peer rank this step has (derived from its sizes) decides how far it pads.
    assert tokens_of(padded) >= 4 and len(padded.field("seq_lens").values) >= 2
    assert padded.field("seq_lens").values[1:].tolist() == [0] * (
        len(padded.field("seq_lens").values) - 1
    )
    assert padded.field("slot_mapping").values[2:].tolist() == [-1] * (tokens_of(padded) - 2)
    assert len(builds(out, "replay")) == 1 and len(builds(out, "fresh")) == 1
    captured = {tokens_of(b) for b in builds(first, "capture")}
    assert set(config.cudagraph_capture_sizes) <= captured


def test_capture_runs_cover_every_capture_size_of_each_mode():
    for mode in ("FULL", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        config = small_config(cudagraph_mode=mode)
        case = Case(config, Batch((0,), (3,), req_ids=(0,), pages=((1,),), new_pages=(1,)))
        (out,) = run_trace(Trace.of_case(case))
        captured = {tokens_of(b) for b in builds(out, "capture")}
        assert set(config.cudagraph_capture_sizes) <= captured, mode


def test_data_parallel_padding_pads_to_the_peers_graph():
    """A peer decoding more requests (derived from the step: ``_peer``'s third kind):
    the ranks agree on the larger count and this rank pads its decode (a FULL decode
    graph) up to the peer's graph, past the graph its own step would take."""
    rs = adapter()
    config = small_config()
    for prompt in range(1, 9):
        steps = (
            Batch((0,), (prompt,), req_ids=(0,), pages=((1, 2, 3),), new_pages=(3,)),
            Batch((prompt,), (2,), req_ids=(0,), pages=((1, 2, 3),), new_pages=(0,)),
        )
        trace = Trace(config, steps)
        peer = rs._peer(ref.make_inputs(trace.case(1)), 2)
        if peer is not None and peer.uniform == 2 and peer.num_reqs > 1:
            break
    else:
        pytest.fail("no step meets a busier peer")
    _, out = run_trace(trace)
    (padded,) = builds(out, "padded")
    assert tokens_of(padded) == peer.num_tokens > 2  # 2: the graph of this step alone
    assert len(padded.field("seq_lens").values) == peer.num_reqs
    assert builds(out, "replay")


def test_an_idle_rank_runs_a_dummy_step_padded_to_the_peers_graph():
    """Each step this rank also runs ``execute_dummy_batch`` while the peer runs the
    step: a dummy batch of one request, dispatched with the peer's tokens."""
    config = small_config()
    step = Batch((4, 4), (2, 2), req_ids=(0, 1), pages=((1, 2), (3, 4)), new_pages=(2, 2))
    (out,) = run_trace(Trace.of_case(Case(config, step)))
    (dummy,) = builds(out, "dummy")  # the step's own dummy run, after the capture runs
    assert dummy.num_reqs == dummy.num_tokens == 0 and dummy.live == ()  # none held yet
    assert tokens_of(dummy) == 4  # the peer's 4 tokens, a decode graph of 4


def test_rows_reused_drafts_rejected_and_a_fresh_engine_agree():
    """persistent-batch's three steps: a finished request's row goes to an arrival, a
    rejected draft rolls back; every build of every step holds its properties."""
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2, 3)), new_pages=(1, 2)),
        Batch((5, 0), (2, 4), req_ids=(1, 2), pages=((2, 3), (4,)), new_pages=(0, 1)),
        Batch((6, 4), (2, 2), req_ids=(1, 2), pages=((2, 3), (4, 5)), new_pages=(0, 1)),
    )
    outs = run_trace(Trace(small_config(), steps))
    last = outs[-1]
    (fresh,) = builds(last, "fresh")
    assert fresh.field("idx_mapping") is None  # the rows are the engine's history
    assert fresh.field("seq_lens").values[:2].tolist() == [8, 6]


def test_a_new_engine_drops_the_runners():
    rs = adapter()
    case = Case(small_config(), Batch((0,), (1,), req_ids=(0,), pages=((1,),), new_pages=(1,)))
    rs.run(ref.make_inputs(case))
    first = rs.ENGINE.graphs
    rs.run.new_engine()
    assert rs.ENGINE.graphs is None
    out = rs.run(ref.make_inputs(case))
    assert rs.ENGINE.graphs is not first and builds(out, "capture")


@settings(
    max_examples=5,  # vllm's derandomized search in test_entries judges more
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(traces.traces(batches.SMALL, varlen=False, max_steps=3, lookahead=num_lookahead_tokens))
def test_drawn_traces_hold_every_property(trace):
    """On the traces the implementation takes, its requests holding the MTP drafter's
    lookahead: a capture size past a row's reach is declined, kept apart as
    vllm-dummy-past-row (its own tests below)."""
    rs = adapter()
    config = dataclasses.replace(trace.config, runner="v2")
    assume(all(rs.declines(Case(config, step)) is None for step in trace.steps))
    run_trace(Trace(config, trace.steps))


def test_an_idle_ranks_dummy_request_outgrows_the_model_within_its_row():
    """Observed on vLLM 0.33.0, kept as a difference, not a finding: a rank with nothing
    to run (``execute_dummy_batch``: ``_dummy_run(1, uniform_decode=True)``) while its
    peer runs two prefills of 6 tokens agrees on the peer's 12 tokens, dispatched to
    the PIECEWISE graph of 16, whose descriptor has no request count;
    ``execute_model``'s dummy branch then takes ``batch_desc.num_reqs or num_reqs`` = 1
    request and ``InputBatch.make_dummy(1, 16)`` gives it all 16 tokens: ``seq_lens``
    16 past ``max_model_len`` 8 (the same engine's capture of 16 spreads them over 2
    requests of 8). Its consumer, the attention kernel, reads keys through the
    request's block-table row, which reaches past 16 (vLLM sizes rows in whole spans
    of 128 tokens): safe padding holds, and no consumer was shown to break on it."""
    config = small_config(
        max_model_len=8, max_num_seqs=2, num_spec=0, cudagraph_capture_sizes=(2, 16)
    )
    step = Batch((0, 0), (6, 6), req_ids=(0, 1), pages=((1, 2), (3, 4)), new_pages=(2, 2))
    out = adapter().RunnerStepEngine()(ref.make_inputs(Case(config, step)))
    assert ref.violations(out) == []
    (dummy,) = builds(out, "dummy")
    assert "_dummy_run" in dummy.where and dummy.field("seq_lens").values.tolist() == [16]
    table = dummy.field("block_table").values
    assert table.shape[1] * config.block_size >= 16
    captured = [b for b in builds(out, "capture") if tokens_of(b) == 16 and b is not dummy]
    assert captured and all(b.field("seq_lens").values.tolist() == [8, 8] for b in captured)


def test_a_capture_size_past_a_rows_reach_is_kept_apart_and_fails_safe_padding():
    """``vllm-dummy-past-row``: with a capture size of 132 and rows of 128 pages of one
    token, the capture's one dummy request has ``seq_len`` 132, which the attention
    kernel reads through a row of 128 pages; ``vllm`` declines such configs (the finding
    kept apart), so its searches stay on the others."""
    from attnfuzz.adapters.vllm import plugin
    from attnfuzz.harness.registry import get_target

    witness = plugin._smallest_dummy_past_row()
    case = witness.cases()[0]
    target = get_target("runner-step")
    assert target.resolve("vllm").declines(case)
    verdict = target.judge_trace(target.resolve("vllm-dummy-past-row"), witness)
    assert not verdict.ok
    # Each capture-kind run of 132 tokens (vLLM runs the size's forward more than once).
    assert verdict.mismatches and all(
        (m.check, m.where) == ("safe-padding", "capture.seq_lens") and ": 132" in m.got
        for m in verdict.mismatches
    )


def test_a_stand_in_s_error_is_attnfuzz_s_and_the_engine_s_is_a_finding():
    """Blame on both sides of the runner-step adapter: a read of what a stand-in does not
    model fails in attnfuzz (never a finding against vLLM); an error raised inside
    vLLM's own code is the engine's."""
    from attnfuzz.harness.blame import attnfuzz_fault

    rs = adapter()
    with pytest.raises(AttributeError) as standin:
        rs._HeldDrafts(1).attribute_the_adapter_does_not_model  # noqa: B018
    assert attnfuzz_fault(standin.value, standin.tb) is not None
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    with pytest.raises(AttributeError) as engine:
        split_decodes_and_prefills(None)
    assert attnfuzz_fault(engine.value, engine.tb) is None


def test_a_step_whose_pages_do_not_hold_the_drafters_lookahead_is_declined():
    """vLLM's scheduler reserves num_spec KV slots past an MTP request's scheduled tokens
    (VllmConfig.num_lookahead_tokens); a step whose request holds fewer pages than that
    is a state vLLM never builds. The false alarm it made: 12 + 4 tokens on one page of
    16, the drafts at positions 16 to 18 read a block-table entry the request does not
    own. Two pages hold them; without drafts there is no lookahead."""
    from attnfuzz.adapters.vllm import lookahead

    rs = adapter()
    config = small_config(block_size=16, num_spec=3, max_model_len=64)
    one_page = Batch((12,), (4,), req_ids=(5,), pages=((21,),), new_pages=(0,))
    two_pages = dataclasses.replace(one_page, pages=((21, 23),), new_pages=(1,))
    assert "lookahead of 3 tokens" in lookahead.declines(Case(config, one_page), 3)
    assert rs.declines(Case(config, one_page)) is not None
    assert rs.declines(Case(config, two_pages)) is None
    assert lookahead.declines(Case(config, two_pages), 3) is None
    assert lookahead.declines(Case(config, one_page), 0) is None
    assert lookahead.declines(Case(config, one_page), 1) is not None  # 17 keys, 2 pages
    short = dataclasses.replace(one_page, q_lens=(1,))  # 12 + 1 + 3 = 16: one page holds it
    assert lookahead.declines(Case(config, short), 3) is None
    # DFlash reserves one more: 12 + 1 + 4 = 17 keys need a second page.
    assert rs.declines(Case(config, short), lookahead.dflash_num_lookahead_tokens) is not None
    assert rs.declines(Case(config, short)) is None


@pytest.mark.parametrize(
    "impl, speculator",
    [
        ("vllm", "MTP"),
        ("vllm-mtp-modules", "MTP_MODULES"),
        ("vllm-standalone-ar", "STANDALONE_AR"),
        ("vllm-dflash", "DFLASH"),
        ("vllm-v1", "MTP"),
        ("vllm-v1-dflash", "DFLASH"),
        ("vllm-v1-draft-model", "STANDALONE_AR"),
        ("vllm-v1-step3p5-mtp", "STEP3P5_MTP"),
    ],
)
@pytest.mark.parametrize("num_spec", [0, 1, 3])
def test_each_implementation_reserves_the_lookahead_vllm_s_scheduler_does(
    impl, speculator, num_spec
):
    """A drawn trace's requests hold the pages of ``Implementation.lookahead``: for each
    drafter, vLLM's own ``VllmConfig.num_lookahead_tokens`` of the speculative config the
    adapter builds (what ``Scheduler.schedule`` reserves through ``allocate_slots``)."""
    from attnfuzz.adapters.vllm import runner_step_speculator as speculating
    from attnfuzz.harness.registry import get_target

    rs = adapter()
    config = small_config(num_spec=num_spec)
    vllm_config = rs._vllm_config(config, "NONE", getattr(speculating, speculator))
    declared = get_target("runner-step").implementations[impl].lookahead
    assert declared is not None
    assert declared(config) == vllm_config.num_lookahead_tokens


def test_the_start_up_warm_up_runs_its_own_steps_and_leaves_the_buffers_to_the_first(
    monkeypatch,
):
    """``warmup_kernels`` (``enable_jit_warmup``, on by default) before the capture: a
    prefill of its own requests, decodes with and without drafts and their samples, a
    greedy pass again under drafts, then a step finishing them. The engine holds none of
    its requests after it, but its block tables keep their pages, which the first step
    meets; that step holds every property."""
    import torch

    rs = adapter()
    rs.prepare()
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    outputs: list = []
    execute = GPUModelRunner.execute_model

    def counting(self, scheduler_output, *args, **kwargs):
        outputs.append(scheduler_output)
        return execute(self, scheduler_output, *args, **kwargs)

    monkeypatch.setattr(GPUModelRunner, "execute_model", counting)
    config = small_config()
    engine = rs.RunnerStepEngine().engine(config, torch.device("cpu"), config.cudagraph_mode)
    warm = [o for o in outputs if any(r.startswith("_warmup_") for r in o.num_scheduled_tokens)]
    assert len(warm) >= 4  # a prefill, then decodes of every shape
    assert any(o.scheduled_spec_decode_tokens for o in warm)  # with drafts
    assert any(o.finished_req_ids for o in outputs)  # and finished
    r = engine.runner
    assert not r.req_states.req_id_to_index
    assert int(r.block_tables.block_tables[0].gpu.max()) > 0  # the warm-up's pages left
    run_trace(Trace(config, (Batch((0,), (3,), req_ids=(0,), pages=((1,),), new_pages=(1,)),)))


def test_a_warm_up_of_no_requests_under_drafts_is_kept_apart_and_crashes_the_engine():
    """With drafts (``decode_query_len`` 4) and a budget of 4 tokens, ``_warmup_kernels``
    runs none of its requests of 5 prompt tokens, then decodes its request 0: vLLM
    0.33.0's start-up raises IndexError. vLLM's config checks accept the budget (it is
    above the lookahead of 3); a budget of 3 they refuse, and the strategies do not draw
    it (``limits.config_admits``). ``vllm`` declines such configs, naming the entry
    that keeps them apart; a budget of 5 warms up."""
    import torch
    from attnfuzz.adapters.vllm import limits, plugin
    from attnfuzz.harness.registry import get_target

    rs = adapter()
    config = small_config(max_num_seqs=1, max_num_batched_tokens=4, num_spec=3)
    case = Case(config, Batch((0,), (1,), req_ids=(0,), pages=((1, 2, 3, 4),), new_pages=(4,)))
    assert "vllm-warmup-no-requests" in (rs.declines(case) or "")
    assert limits.config_admits(config, num_lookahead_tokens) is None
    refused = dataclasses.replace(config, max_num_batched_tokens=3)
    assert "_set_max_num_scheduled_tokens" in limits.config_admits(refused, num_lookahead_tokens)
    budget = dataclasses.replace(config, max_num_batched_tokens=5)
    assert rs.warm_up_without_requests(budget) is None
    assert rs.warm_up_without_requests(dataclasses.replace(config, num_spec=0)) is None
    rs.prepare()
    with pytest.raises(IndexError) as raised:
        rs.RunnerStepEngine().engine(config, torch.device("cpu"), config.cudagraph_mode)
    assert any(str(f.path).endswith("gpu/warmup.py") for f in raised.traceback)
    # The entry kept apart fails its smallest trace, with the engine's own error.
    witness = plugin._smallest_warm_up_without_requests()
    target = get_target("runner-step")
    assert target.unreachable(target.resolve("vllm"), witness.cases()[0]) is None
    assert target.resolve("vllm").declines(witness.cases()[0])
    verdict = target.judge_trace(target.resolve("vllm-warmup-no-requests"), witness)
    assert not verdict.ok and "IndexError" in str(verdict)


def test_the_engines_refuse_configs_vllm_s_config_checks_refuse():
    """vLLM refuses to start with a step budget below ``max_num_seqs``
    (``SchedulerConfig.verify_max_model_len``), or under drafts one not above the
    drafter's lookahead (``VllmConfig._set_max_num_scheduled_tokens``: DFlash reserves
    ``num_spec + 1``, EAGLE and MTP ``num_spec``, n-gram none): a runner-step
    implementation refuses such a case as unreachable (``Implementation.admits``), so
    its searches draw none and its witnesses shrink to none."""
    from attnfuzz.adapters.vllm import limits
    from attnfuzz.adapters.vllm.lookahead import dflash_num_lookahead_tokens
    from attnfuzz.harness.registry import get_target

    config = small_config(max_num_seqs=4, max_num_batched_tokens=3, num_spec=1)
    assert "verify_max_model_len" in limits.config_admits(config, num_lookahead_tokens)
    fits = dataclasses.replace(config, max_num_batched_tokens=4)
    assert limits.config_admits(fits, num_lookahead_tokens) is None
    dflash = dataclasses.replace(fits, max_num_seqs=1, max_num_batched_tokens=2)  # next_n 2
    assert limits.config_admits(dflash, num_lookahead_tokens) is None
    refused = limits.config_admits(dflash, dflash_num_lookahead_tokens)
    assert "_set_max_num_scheduled_tokens" in refused
    assert limits.config_admits(dflash, None) is None  # n-gram
    target = get_target("runner-step")
    step = Batch((0,), (1,), req_ids=(0,), pages=((1, 2),), new_pages=(2,))
    assert "verify_max_model_len" in target.unreachable(target.resolve("vllm"), Case(config, step))
    assert target.unreachable(target.resolve("vllm"), Case(dflash, step)) is None
    for name in ("vllm-dflash", "vllm-v1-dflash"):
        assert target.unreachable(target.resolve(name), Case(dflash, step)) == refused
