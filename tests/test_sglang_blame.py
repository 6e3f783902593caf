"""Who is blamed for an exception in SGLang's implementations: attnfuzz's own code
(an adapter, a stand-in) is an attnfuzz error, never a finding; SGLang's code under
test (the real function, or one with its fix reverted) is a finding."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang import dsa_backend, trtllm_mla
from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import EXIT_ERROR
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import HarnessError
from attnfuzz.harness.targets import dsa_metadata

pytestmark = requires_sglang


def judge(target: str, impl: str, case):
    t = get_target(target)
    return t.judge(t.resolve(impl), case, "cpu")


@pytest.fixture
def broken_stand_in(monkeypatch):
    """The DSA adapter's model runner as a release that renamed a field it reads."""
    real = dsa_backend._model_runner

    def runner(*args, **kwargs):
        stand_in = real(*args, **kwargs)
        del stand_in.token_to_kv_pool.kv_cache_dim
        return stand_in

    monkeypatch.setattr(dsa_backend, "_model_runner", runner)


def test_a_stand_in_missing_what_sglang_reads_is_an_attnfuzz_error(broken_stand_in):
    """SGLang raises the AttributeError, on a stand-in of attnfuzz's: no finding on it."""
    with pytest.raises(HarnessError) as err:
        judge("dsa-metadata", "sglang-dsa", dsa_metadata.smallest_context_len_table())
    assert "kv_cache_dim" in str(err.value)


def test_an_adapter_s_own_fault_is_an_attnfuzz_error(monkeypatch):
    monkeypatch.setattr(trtllm_mla, "_outputs", None)
    with pytest.raises(HarnessError, match=r"adapters/sglang/trtllm_mla\.py:\d+"):
        judge("mla-block-table", "sglang-trtllm-mla",
              get_target("mla-block-table").resolve("upstream-pr21987-accept-length-layout")
              .smallest())  # fmt: skip


def test_run_of_a_faulty_adapter_exits_4_with_no_case(broken_stand_in, tmp_path, capsys):
    out = tmp_path / "cases"
    code = main(
        ["run", "--target", "dsa-metadata", "--impl", "sglang-dsa", "--seed", "0",
         "--max-examples", "5", "--out", str(out), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == EXIT_ERROR and "[attnfuzz error]" in text
    assert "FAIL" not in text and not out.exists()


def test_sglang_s_own_code_stays_a_finding():
    """The fix reverted in SGLang's function (under test): its failure is a finding."""
    verdict = judge(
        "dsa-metadata", "upstream-pr19016-context-len-table",
        dsa_metadata.smallest_context_len_table(),
    )  # fmt: skip
    assert not verdict.ok and verdict.key == "shape"


def test_a_fault_of_the_draft_extend_worker_stand_in_is_an_attnfuzz_error(monkeypatch):
    """The EAGLE worker that SGLang's draft-extend graph runner reads is attnfuzz's: a
    field it lacks (a release reading another name) fails in attnfuzz, though SGLang's
    runner is the code that read it, never as a finding on SGLang."""
    from attnfuzz.adapters.sglang import runner_step_draft_extend
    from attnfuzz.harness.testing import spec_config
    from attnfuzz.reference.batch import Batch
    from attnfuzz.reference.trace import Trace

    worker = runner_step_draft_extend._ExtendEngine._worker

    def without_backend(self):
        stand_in = worker(self)
        del stand_in.draft_extend_attn_backend
        return stand_in

    monkeypatch.setattr(runner_step_draft_extend._ExtendEngine, "_worker", without_backend)
    config = spec_config(num_spec=2, max_num_seqs=4, cudagraph_capture_sizes=(3, 6, 12))
    pages = ((1, 2), (3, 4))
    steps = (
        Batch((0, 0), (5, 4), 0, True, req_ids=(0, 1), pages=pages, new_pages=(2, 2)),
        Batch((5, 4), (3, 3), 0, True, req_ids=(0, 1), pages=pages, new_pages=(0, 0)),
    )
    t = get_target("runner-step")
    with pytest.raises(HarnessError) as err:
        t.judge_trace(t.resolve("sglang-eagle-draft-extend"), Trace(config, steps), "cpu")
    message = str(err.value)
    assert "draft_extend_attn_backend" in message and "attnfuzz error" in message, message


def test_a_fault_of_the_two_batch_overlap_rank_stand_in_is_an_attnfuzz_error(monkeypatch):
    """The rank's ScheduleBatch that SGLang's TboDPAttentionPreparer reads is attnfuzz's
    (``_engine.StandIn``): a field it lacks fails in attnfuzz, though SGLang's preparer
    is the code that read it, never as a finding on SGLang."""
    from attnfuzz.adapters.sglang import _engine, runner_step_tbo

    real = _engine.StandIn

    class WithoutExtendLens(real):
        def __init__(self, **fields):
            fields.pop("extend_lens", None)
            super().__init__(**fields)

    monkeypatch.setattr(_engine, "StandIn", WithoutExtendLens)
    t = get_target("runner-step")
    trace = runner_step_tbo.smallest_two_chunk_prefix_forgotten()
    with pytest.raises(HarnessError) as err:
        t.judge_trace(t.resolve("sglang-tbo"), trace, "cpu")
    assert "extend_lens" in str(err.value) and "attnfuzz error" in str(err.value)


def test_sglang_s_own_two_batch_overlap_defect_stays_a_finding():
    """The two-chunk split's defect, in SGLang's function (re-created): a finding."""
    from attnfuzz.adapters.sglang import runner_step_tbo

    t = get_target("runner-step")
    trace = runner_step_tbo.smallest_two_chunk_prefix_forgotten()
    verdict = t.judge_trace(t.resolve("sglang-tbo-two-chunk-prefix-forgotten"), trace, "cpu")
    assert not verdict.ok and "microbatch-agreement" in str(verdict)
