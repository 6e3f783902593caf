"""SGLang's Frozen-KV MTP draft graph runner (runner-step's ``sglang-frozen-kv-mtp``):
hand traces, the engine functions they run, and a planted wrong value caught."""

from __future__ import annotations

from attnfuzz.adapters.sglang.testing import (
    arrive_then_decode,
    calls_counted,
    field_values,
    life,
    requires_sglang,
)
from attnfuzz.harness.testing import spec_config
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch, Case

pytestmark = requires_sglang
RUNNER = "sglang.srt.speculative.frozen_kv_mtp_cuda_graph_runner"
WORKER = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"


def _sglang(module: str):
    """SGLang's ``module``, imported once the adapters set SGLang up."""
    import importlib

    from attnfuzz.adapters.sglang.runner_step_frozen_kv_mtp import prepare

    prepare()
    return importlib.import_module(module)


def _life() -> list[ref.RunnerStepOutputs]:
    """Three requests arrive (an extend), then verify together (two drafts each) on one
    new engine's frozen draft: the draft of the next round, three requests in the draft
    graph of five."""
    from attnfuzz.adapters.sglang.runner_step_frozen_kv_mtp import run

    return life(run, arrive_then_decode(num_spec=2))


def test_the_draft_after_a_verify_of_three_requests_replays_the_graph_of_five():
    first, second = _life()
    assert [b.how for b in first.builds if b.how != "capture"] == ["eager", "fresh"]
    assert [b.how for b in second.builds] == ["eager", "padded", "replay", "fresh"]
    for how in ("padded", "replay"):
        (b,) = second.of(how)
        assert (b.num_reqs, b.num_tokens) == (3, 9)
        # The committed prefix num_computed + 1, the rope phase at its last slot
        # (set_frozen_kv_positions); the padding rows: row 0, the fill length 1.
        assert field_values(second, how, "seq_lens") == [6, 4, 2, 1, 1], how
        assert field_values(second, how, "positions") == [5, 3, 1, 0, 0], how
        assert field_values(second, how, "req_pool_indices")[3:] == [0, 0], how
        # The draft reads the target's keys: request 0's prefix of 6 on pages 1, 2 (of 4).
        assert field_values(second, how, "kv_len") == [6, 4, 2, 1, 1], how
        assert field_values(second, how, "kv_slots")[0][:6] == [4, 5, 6, 7, 8, 9], how
    assert field_values(second, "eager", "seq_lens") == [6, 4, 2]
    assert ref.violations(first) == [] and ref.violations(second) == []


def test_every_capture_batch_size_is_captured_once_at_the_engine_start():
    first, second = _life()
    captures = list(first.of("capture"))
    # The draft's graphs: the capture sizes over next_n (2, 4, 8, 16 tokens; 3 a request).
    assert sorted(len(b.field("seq_lens").values) for b in captures) == [1, 2, 5]
    for b in captures:
        assert set(b.field("seq_lens").values.tolist()) == {1}  # the fill value
    assert list(second.of("capture")) == []


def test_the_frozen_runner_s_and_worker_s_functions_run():
    """The graph runner's __init__, capture, can_run_graph and execute, and the worker's
    own metadata methods (the real class's), each run by a trace."""
    Runner = _sglang(RUNNER).FrozenKVMTPCudaGraphRunner
    Worker = _sglang(WORKER).FrozenKVMTPDraftWorker
    watched = [
        (Runner, "__init__"),
        (Runner, "capture_one_shape"),
        (Runner, "can_run_graph"),
        (Runner, "execute"),
        (Worker, "_init_frozen_kv_metadata"),
        (Worker, "_init_frozen_kv_metadata_capture_cuda_graph"),
        (Worker, "_init_frozen_kv_metadata_replay_cuda_graph"),
    ]
    with calls_counted(watched) as calls:
        _life()
    assert set(calls) == {f"{o.__name__}.{n}" for o, n in watched}
    assert calls["FrozenKVMTPDraftWorker._init_frozen_kv_metadata_capture_cuda_graph"] == 3


def test_a_wrong_slot_in_the_replay_s_metadata_is_caught(monkeypatch):
    """A slot planted in the persistent kv_indices after the worker's replay metadata:
    the replay and the padded build differ from the eager one there, and in the keys
    the draft reads."""
    Worker = _sglang(WORKER).FrozenKVMTPDraftWorker
    own = Worker._init_frozen_kv_metadata_replay_cuda_graph

    def planted(self, forward_batch, bs, seq_lens_sum):
        own(self, forward_batch, bs, seq_lens_sum)
        self.draft_attn_backend.cuda_graph_kv_indices[1] += 1  # request 0's second slot

    monkeypatch.setattr(Worker, "_init_frozen_kv_metadata_replay_cuda_graph", planted)
    _, second = _life()
    found = {(v.prop, v.field, v.build) for v in ref.violations(second)}
    assert found == {
        ("padding invariance", "kv_indices", "padded"),
        ("replay equals eager", "kv_indices", "replay"),
        ("padding invariance", "kv_slots", "padded"),
        ("replay equals eager", "kv_slots", "replay"),
    }


def test_a_config_without_drafts_has_no_frozen_draft():
    from attnfuzz.adapters.sglang.runner_step_frozen_kv_mtp import declines

    config = spec_config(num_spec=0, max_num_seqs=8, cudagraph_capture_sizes=(2, 4))
    why = declines(Case(config, Batch((5,), (1,), seed=1)))
    assert why is not None and "no Frozen-KV MTP draft" in why
    one = spec_config(num_spec=1, max_num_seqs=8, cudagraph_capture_sizes=(2, 4))
    assert declines(Case(one, Batch((5,), (2,), seed=1))) is None
