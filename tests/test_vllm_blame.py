"""attnfuzz's faults in vLLM's adapters and stand-ins are attnfuzz errors; vLLM's own are findings.

Each fault is injected as a release or a slip would bring it: a builder whose
buffer has another name (the adapter reads an attribute that is not there), a
stand-in that calls what is not callable, and vLLM's own code raising (the
#39542 write-back, reverted into 0.33.0).
"""

from __future__ import annotations

import re

import pytest
from attnfuzz.adapters.vllm import mtp_seq_lens as mtp_adapter
from attnfuzz.adapters.vllm import vendor_ops
from attnfuzz.adapters.vllm.testing import requires_vllm
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import EXIT_ERROR
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import HarnessError
from attnfuzz.harness.targets.indexer_decode import smallest_writeback
from attnfuzz.harness.testing import hand_case

pytestmark = requires_vllm


def judge(target: str, impl: str, case):
    t = get_target(target)
    return t.judge(t.resolve(impl), case, "cpu")


@pytest.fixture
def renamed_buffer(monkeypatch):
    """vLLM's indexer builder as a release that named its decode buffer otherwise."""
    base = mtp_adapter._builder_class()

    class Renamed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seq_lens_buffer = self.__dict__.pop("decode_seq_lens_buffer")

    monkeypatch.setattr(mtp_adapter, "_builder_class", lambda: Renamed)


def test_an_adapter_reading_an_api_the_release_lacks_is_an_attnfuzz_error(renamed_buffer):
    with pytest.raises(HarnessError) as err:
        judge("mtp-seq-lens", "vllm", hand_case((2, 2), (3, 5)))
    message = str(err.value)
    assert message.startswith("attnfuzz error at adapters/vllm/mtp_seq_lens.py:")
    assert "in _run: AttributeError" in message and "decode_seq_lens_buffer" in message


def test_run_of_such_an_adapter_exits_4_with_no_case(renamed_buffer, tmp_path, capsys):
    out = tmp_path / "cases"
    code = main(
        ["run", "--target", "mtp-seq-lens", "--impl", "vllm", "--seed", "0",
         "--max-examples", "5", "--out", str(out), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == EXIT_ERROR and "ERROR mtp-seq-lens / vllm  [attnfuzz error]" in text
    assert "FAIL" not in text and not out.exists()


def test_a_stand_ins_own_fault_is_an_attnfuzz_error(monkeypatch):
    monkeypatch.setattr(vendor_ops, "_weighted_relu", None)
    with pytest.raises(HarnessError, match=r"adapters/vllm/vendor_ops\.py:\d+ in _paged_logits"):
        judge("indexer-decode", "vllm", hand_case((2, 2, 2), (3, 5, 1)))


def test_vllms_own_exception_stays_a_finding():
    verdict = judge("indexer-decode", "upstream-pr39542-decode", smallest_writeback())
    assert verdict.key == "exception:RuntimeError"


# -- the runner step's drafters: their stand-ins' faults are attnfuzz's --------------------


def _draft_trace(runner: str):
    """Two requests prefill, then decode with both drafts: the drafter runs in step 1."""
    from attnfuzz.harness.testing import spec_config
    from attnfuzz.reference.batch import Batch
    from attnfuzz.reference.trace import Trace

    config = spec_config(
        max_num_seqs=4, max_num_batched_tokens=16, block_size=16, max_model_len=64,
        cudagraph_capture_sizes=(3, 6, 12), runner=runner, num_spec=2,
    )  # fmt: skip
    pages = ((1,), (2,))
    return Trace(
        config,
        (
            Batch((0, 0), (5, 4), req_ids=(7, 8), pages=pages, new_pages=(1, 1)),
            Batch((5, 4), (3, 3), req_ids=(7, 8), pages=pages, new_pages=(0, 0)),
        ),
    )


def judge_trace(impl: str, trace):
    t = get_target("runner-step")
    return t.judge_trace(t.resolve(impl), trace, "cpu")


def test_a_fault_of_the_v1_draft_model_stand_in_is_an_attnfuzz_error(monkeypatch):
    """The draft model the V1 EagleProposer runs is attnfuzz's: a hook it calls that a
    release would not give (here none) fails in attnfuzz, never as a finding on vLLM."""
    from attnfuzz.adapters.vllm import runner_step_drafter

    built = runner_step_drafter.DraftModel.__init__

    def without_hook(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.seen = None

    monkeypatch.setattr(runner_step_drafter.DraftModel, "__init__", without_hook)
    with pytest.raises(HarnessError) as err:
        judge_trace("vllm-v1", _draft_trace("v1"))
    assert re.search(r"adapters/vllm/runner_step_drafter\.py:\d+ in forward", str(err.value))


def test_a_fault_of_the_v2_target_model_s_logits_stand_in_is_an_attnfuzz_error(monkeypatch):
    """The V2 runner's sampler reads the target's logits from attnfuzz's model stand-in:
    logits it did not choose for the step's rows fail in attnfuzz (the call in vLLM's
    ``sample`` notwithstanding)."""
    from attnfuzz.adapters.vllm import runner_step

    chosen = runner_step._verdict
    monkeypatch.setattr(runner_step, "_verdict", lambda *args: chosen(*args)[1:])
    with pytest.raises(HarnessError) as err:
        judge_trace("vllm", _draft_trace("v2"))
    message = str(err.value)
    assert "adapters/vllm/runner_step.py" in message, message
    assert "chose no logits" in message
