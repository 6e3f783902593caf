"""SGLang's EAGLE draft graph runner (runner-step's ``sglang-eagle-draft``): hand traces
and drawn ones."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.sglang.testing import calls_counted, requires_sglang
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case
from attnfuzz.reference.trace import Trace

pytestmark = requires_sglang
TRITON = "sglang.srt.layers.attention.triton_backend"
DRAFT_RUNNER = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"


def _sglang(module: str):
    """SGLang's ``module``, imported once the adapters set SGLang up (its stand-ins for
    what a CPU lacks): a test run alone must not import SGLang before them."""
    import importlib

    from attnfuzz.adapters.sglang.runner_step_draft import prepare

    prepare()
    return importlib.import_module(module)


def _step(computed, q_lens, req_ids, pages, new_pages) -> Batch:
    return Batch(computed, q_lens, 0, True, req_ids=req_ids, pages=pages, new_pages=new_pages)


def _life(trace: Trace) -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new SGLang engine's draft."""
    from attnfuzz.adapters.sglang.runner_step_draft import run

    run.new_engine()
    return [run(ref.make_inputs(case)) for case in trace.cases()]


def _arrive_then_verify(num_spec: int = 2) -> Trace:
    """Three requests arrive (an extend), then verify together: the draft of the next
    round, three requests in the draft graph of four."""
    config = spec_config(num_spec=num_spec, max_num_seqs=4, cudagraph_capture_sizes=(3, 6, 12))
    w = config.next_n
    pages = ((1, 2), (3, 4), (5, 6))
    return Trace(
        config,
        (
            _step((0, 0, 0), (5, 3, 1), (0, 1, 2), pages, (2, 2, 2)),
            _step((5, 3, 1), (w, w, w), (0, 1, 2), pages, (0, 0, 0)),
        ),
    )


def _build(out: ref.RunnerStepOutputs, how: str) -> ref.StepBuild:
    (build,) = out.of(how)
    return build


def _values(build: ref.StepBuild, name: str) -> list:
    f = build.field(name)
    assert f is not None, name
    return f.values.tolist()


def test_the_draft_after_a_verify_of_three_requests_replays_the_graph_of_four():
    first, second = _life(_arrive_then_verify())
    assert [b.how for b in first.builds if b.how != "capture"] == ["eager", "fresh"]
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("padded", "replay"):
        b = _build(second, how)
        assert (b.num_reqs, b.num_tokens) == (3, 9)
        # The committed prefix num_computed + 1; the padding request: row 0, length 1.
        assert _values(b, "seq_lens") == [6, 4, 2, 1], how
        assert _values(b, "req_pool_indices")[3] == 0, how
        # Page size 4: the draft's two slots follow each request's prefix.
        assert _values(b, "out_cache_loc") == [[10, 11], [16, 17], [22, 23], [0, 0]], how
        # Draft step 0 reads the prefix and its own token; the padding row's offset
        # follows its position 0 (generate_draft_decode_kv_indices: kv_indptr from
        # positions).
        assert _values(b, "kv_indptr.0") == [0, 7, 12, 15, 16], how
        assert _values(b, "kv_indices.0")[0] == [4, 5, 6, 7, 8, 9, 10], how
    assert _build(second, "eager").field("kv_indptr.1") is None  # the last step reads none
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_the_draft_after_a_reused_row_keeps_every_property():
    """Request 1 finishes after the first verify; request 3 arrives in its row (the
    pool's freed row), and the next verify's draft reads that row's new slots: the
    eager, replayed and fresh builds agree."""
    trace = _arrive_then_verify()
    w = trace.config.next_n
    later = (
        # Requests 0 and 2 decode on (no draft accepted: num_computed + 1); 3 arrives.
        _step((6, 2, 0), (w, w, 4), (0, 2, 3), ((1, 2, 7), (5, 6), (3,)), (1, 0, 1)),
        _step((7, 3, 4), (w, w, w), (0, 2, 3), ((1, 2, 7), (5, 6), (3, 4)), (0, 0, 1)),
    )
    outs = _life(Trace(trace.config, trace.steps + later))
    rows = _values(_build(outs[1], "eager"), "req_pool_indices")
    assert [b.how for b in outs[3].builds] == ["eager", "padded", "replay", "fresh"]
    replay = _build(outs[3], "replay")
    assert _values(replay, "req_pool_indices")[:3] == [rows[0], rows[2], rows[1]]
    # Request 3's prefix of 5 (page 3, then page 4's first slot) and its draft token.
    assert _values(replay, "kv_indices.0")[2][:6] == [12, 13, 14, 15, 16, 17]
    for k, out in enumerate(outs):
        assert ref.violations(out) == [], f"step {k}"


def test_every_capture_batch_size_is_captured_once_at_the_engine_start():
    first, second = _life(_arrive_then_verify())
    captures = list(first.of("capture"))
    # The draft's graphs: the decode batch sizes (capture sizes over next_n).
    assert sorted(len(_values(b, "seq_lens")) for b in captures) == [1, 2, 4]
    for b in captures:
        assert (b.num_reqs, b.num_tokens) == (0, 0)
        assert set(_values(b, "seq_lens")) == {1}  # get_cuda_graph_seq_len_fill_value
    assert list(second.of("capture")) == []


def test_the_draft_runner_s_functions_run():
    """The draft runner's __init__, capture, can_run_graph and execute, and the
    multi-step backend's metadata functions, each run by a trace."""
    TritonMultiStepDraftBackend = _sglang(TRITON).TritonMultiStepDraftBackend
    EAGLEDraftCudaGraphRunner = _sglang(DRAFT_RUNNER).EAGLEDraftCudaGraphRunner

    watched = [
        (EAGLEDraftCudaGraphRunner, "__init__"),
        (EAGLEDraftCudaGraphRunner, "capture"),
        (EAGLEDraftCudaGraphRunner, "capture_one_shape"),
        (EAGLEDraftCudaGraphRunner, "can_run_graph"),
        (EAGLEDraftCudaGraphRunner, "execute"),
        (TritonMultiStepDraftBackend, "init_forward_metadata"),
        (TritonMultiStepDraftBackend, "init_cuda_graph_state"),
        (TritonMultiStepDraftBackend, "init_forward_metadata_out_graph"),
    ]
    with calls_counted(watched) as calls:
        _life(_arrive_then_verify())
    assert set(calls) == {f"{o.__name__}.{n}" for o, n in watched}
    # A capture for each of the 3 batch sizes, and the replay's.
    assert calls["TritonMultiStepDraftBackend.init_forward_metadata_out_graph"] == 4


def test_a_wrong_slot_in_the_replay_s_metadata_is_caught(monkeypatch):
    """A slot planted in draft step 0's persistent kv_indices after SGLang's replay
    preparation: the replay and the padded build differ from the eager one there, and
    in the draft's keys (step 0 is the last attending step of two)."""
    TritonMultiStepDraftBackend = _sglang(TRITON).TritonMultiStepDraftBackend

    own = TritonMultiStepDraftBackend.init_forward_metadata_out_graph

    def planted(self, forward_batch, in_capture=False):
        own(self, forward_batch, in_capture=in_capture)
        if not in_capture:
            self.cuda_graph_kv_indices[0, 1] += 1  # request 0's second prefix slot

    monkeypatch.setattr(TritonMultiStepDraftBackend, "init_forward_metadata_out_graph", planted)
    _, second = _life(_arrive_then_verify())
    found = {(v.prop, v.field, v.build) for v in ref.violations(second)}
    assert found == {
        ("padding invariance", "kv_indices.0", "padded"),
        ("replay equals eager", "kv_indices.0", "replay"),
        ("padding invariance", "kv_slots", "padded"),
        ("replay equals eager", "kv_slots", "replay"),
    }


def test_an_offset_past_the_buffer_in_a_padding_row_is_caught(monkeypatch):
    """A padding row's kv_indptr planted past draft step 0's kv_indices row: safe padding."""
    TritonMultiStepDraftBackend = _sglang(TRITON).TritonMultiStepDraftBackend

    own = TritonMultiStepDraftBackend.init_forward_metadata_out_graph

    def planted(self, forward_batch, in_capture=False):
        own(self, forward_batch, in_capture=in_capture)
        if not in_capture:
            self.kv_indptr[0, 4] = self.cuda_graph_kv_indices.shape[1] + 1  # the padding row's

    monkeypatch.setattr(TritonMultiStepDraftBackend, "init_forward_metadata_out_graph", planted)
    _, second = _life(_arrive_then_verify())
    found = {(v.prop, v.field, v.build) for v in ref.violations(second)}
    assert ("safe padding", "kv_indptr.0", "padded") in found
    assert ("safe padding", "kv_indptr.0", "replay") in found
    assert all(v.prop == "safe padding" for v in ref.violations(second))


def test_a_stand_in_s_error_is_attnfuzz_s_and_the_engine_s_is_a_finding():
    """Blame on both sides: a read of what the worker stand-in does not model fails in
    attnfuzz (never a finding against SGLang); an error raised inside SGLang's own draft
    runner is the engine's."""
    from attnfuzz.adapters.sglang import runner_step_draft as rs
    from attnfuzz.harness.blame import attnfuzz_fault

    EAGLEDraftCudaGraphRunner = _sglang(DRAFT_RUNNER).EAGLEDraftCudaGraphRunner

    inputs = ref.make_inputs(_arrive_then_verify().case(0))
    worker = rs._DraftEngine(inputs.config, inputs.device, graphs=False)._worker()
    with pytest.raises(AttributeError) as standin:
        worker.a_read_the_stand_in_does_not_model  # noqa: B018
    assert attnfuzz_fault(standin.value, standin.tb) is not None
    with pytest.raises(AttributeError) as engine:
        EAGLEDraftCudaGraphRunner.execute(None, None)
    assert attnfuzz_fault(engine.value, engine.tb) is None


def test_a_config_of_one_draft_step_is_declined():
    from attnfuzz.adapters.sglang.runner_step_draft import declines

    config = spec_config(num_spec=1, max_num_seqs=8, cudagraph_capture_sizes=(2, 4))
    why = declines(Case(config, Batch((5,), (2,), seed=1)))
    assert why is not None and "speculative_num_steps <= 1" in why
    assert declines(Case(_arrive_then_verify().config, Batch((5,), (3,), seed=1))) is None


def test_without_cuda_graphs_the_draft_is_eager_only():
    trace = _arrive_then_verify()
    config = dataclasses.replace(trace.config, cudagraph_mode="NONE")  # --disable-cuda-graph
    _, draft = _life(Trace(config, trace.steps))
    assert [b.how for b in draft.builds] == ["eager", "fresh"]
    assert ref.violations(draft) == []


# -- the draft extend (sglang-eagle-draft-extend) ----------------------------------------------


def _extend_life(trace: Trace) -> list[ref.RunnerStepOutputs]:
    """Every step of ``trace`` on one new SGLang engine's draft extend."""
    from attnfuzz.adapters.sglang.runner_step_draft_extend import run

    run.new_engine()
    return [run(ref.make_inputs(case)) for case in trace.cases()]


@pytest.mark.parametrize("num_spec", [1, 2])
def test_the_draft_extend_after_a_verify_of_three_requests_replays_the_graph_of_four(num_spec):
    """The draft extend over the verify's window: prefix num_computed, num_draft_tokens
    queries a request; three requests in the draft-extend graph of four."""
    trace = _arrive_then_verify(num_spec)
    w = trace.config.next_n
    config = dataclasses.replace(trace.config, cudagraph_capture_sizes=(w, 2 * w, 4 * w))
    first, second = _extend_life(Trace(config, trace.steps))
    # The capture sizes in tokens, over next_n: the decode batch sizes 1, 2 and 4.
    assert sorted(len(_values(b, "seq_lens")) for b in first.of("capture")) == [1, 2, 4]
    assert [b.how for b in first.builds if b.how != "capture"] == ["eager", "fresh"]
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("padded", "replay"):
        b = _build(second, how)
        assert (b.num_reqs, b.num_tokens) == (3, 3 * w)
        # The post-write length num_computed + next_n; the padding request: row 0,
        # the fill 1 (resolve_draft_extend_seq_len_fill_value), no prefix read.
        assert _values(b, "seq_lens") == [5 + w, 3 + w, 1 + w, 1], how
        assert _values(b, "req_pool_indices")[3] == 0, how
        assert _values(b, "qo_indptr") == [0, w, 2 * w, 3 * w, 4 * w], how
        assert _values(b, "kv_indptr") == [0, 5, 8, 9, 9], how
        assert _values(b, "kv_indices")[0] == [4, 5, 6, 7, 8], how
        assert _values(b, "positions")[:w] == list(range(5, 5 + w)), how
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_a_wrong_slot_in_the_draft_extend_replay_is_caught(monkeypatch):
    """A slot planted in the persistent kv_indices after SGLang's draft-extend replay
    preparation: the replay and the padded build differ from the eager one there, and
    so do the KV slots the kernel reads (``kv_slots``, derived from them)."""
    TritonAttnBackend = _sglang(TRITON).TritonAttnBackend

    own = TritonAttnBackend.init_forward_metadata_out_graph

    def planted(self, forward_batch, in_capture=False):
        own(self, forward_batch, in_capture=in_capture)
        if not in_capture and forward_batch.forward_mode.is_draft_extend_v2():
            self.cuda_graph_kv_indices[1] += 1  # request 0's second prefix slot

    monkeypatch.setattr(TritonAttnBackend, "init_forward_metadata_out_graph", planted)
    _, second = _extend_life(_arrive_then_verify())
    found = {(v.prop, v.field, v.build) for v in ref.violations(second)}
    assert found == {
        ("padding invariance", "kv_indices", "padded"),
        ("replay equals eager", "kv_indices", "replay"),
        ("padding invariance", "kv_slots", "padded"),
        ("replay equals eager", "kv_slots", "replay"),
    }


def test_a_config_without_drafts_has_no_draft_extend():
    from attnfuzz.adapters.sglang.runner_step_draft_extend import declines

    config = spec_config(num_spec=0, max_num_seqs=8, cudagraph_capture_sizes=(2, 4))
    why = declines(Case(config, Batch((5,), (1,), seed=1)))
    assert why is not None and "no draft extend" in why
    assert declines(Case(_arrive_then_verify(num_spec=1).config, Batch((5,), (2,), seed=1))) is None


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sglang-eagle-draft", "sglang-eagle-draft-extend"])
def test_a_derandomized_search_passes(name):
    from attnfuzz.harness.registry import get_target

    target = get_target("runner-step")
    impl = target.resolve(name)
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=5, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(target.traces(impl=impl))
    def search(trace: Trace) -> None:
        verdict = target.judge_trace(impl, trace)
        assert verdict.ok, verdict

    search()
