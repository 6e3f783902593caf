"""attnfuzz's own faults are never findings; the code under test's exceptions always are.

The rule (:mod:`attnfuzz.harness.blame`) reads where an exception was raised.
Code is placed in a module by its globals' ``__name__``, which is all the rule
reads, so these tests compile small functions "in" an adapter, a stand-in, an
engine or a user's module without any engine installed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from attnfuzz.harness import blame
from attnfuzz.harness.blame import ContractError, attnfuzz_fault, transparent, under_test
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import EXIT_ERROR, EXIT_FOUND, EXIT_USAGE
from attnfuzz.harness.errors import HarnessError, UsageError
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.target import Implementation
from attnfuzz.harness.testing import hand_case
from attnfuzz.reference.history import FieldHistory, RemovedField, renamed_alias

PACKAGE = Path(blame.__file__).resolve().parent.parent
TARGET = "mtp-seq-lens"


def module_code(name: str, source: str) -> types.ModuleType:
    """``source`` run as module ``name`` (its frames are that module's)."""
    module = types.ModuleType(name)
    filename = PACKAGE / (name.removeprefix("attnfuzz.").replace(".", "/") + ".py")
    exec(compile(source, str(filename), "exec"), module.__dict__)
    return module


GLUE = """
def glue(inputs):
    return inputs.config.max_num_blocks_per_req  # an API this release lacks

def calls(fn, inputs):
    return fn(inputs)

def refuses(inputs):
    raise ContractError("paged_mqa_logits: block_table must be int32")

def through_torch(inputs):
    return torch.cat([inputs.config])  # a wrong call into torch, made by the glue
"""


def adapter() -> types.ModuleType:
    module = module_code("attnfuzz.adapters.vllm._probe", GLUE)
    module.ContractError, module.torch = ContractError, torch
    return module


def engine() -> types.ModuleType:
    return module_code(
        "vllm.v1.attention._probe",
        "def build(inputs):\n    return inputs.config.no_such_field\n",
    )


def raised(fn, *args) -> BaseException:
    try:
        fn(*args)
    except BaseException as err:  # noqa: BLE001 - the exception is what is tested
        return err
    raise AssertionError("did not raise")


def fault_of(fn, *args):
    err = raised(fn, *args)
    return attnfuzz_fault(err, err.__traceback__.tb_next)  # below this test's frame


class Inputs:
    config = object()


# -- the rule ---------------------------------------------------------------------


def test_an_exception_raised_in_an_adapters_glue_is_attnfuzzs_naming_file_and_line():
    fault = fault_of(adapter().glue, Inputs())
    assert fault is not None
    assert fault.file == "adapters/vllm/_probe.py" and fault.line == 3
    assert fault.function == "glue" and fault.error.startswith("AttributeError: ")
    assert str(fault).startswith("attnfuzz error at adapters/vllm/_probe.py:3 in glue: ")


def test_a_library_call_the_glue_got_wrong_is_the_glues():
    fault = fault_of(adapter().through_torch, Inputs())
    assert fault is not None and fault.function == "through_torch"
    assert fault.error.startswith("TypeError")


def test_an_exception_raised_in_the_engines_code_is_a_finding_even_called_from_glue():
    assert fault_of(adapter().calls, engine().build, Inputs()) is None


def test_a_stand_ins_contract_refusal_is_a_finding_its_own_fault_is_not():
    assert fault_of(adapter().refuses, Inputs()) is None
    stand_in = module_code(
        "attnfuzz.adapters.vllm.vendor_ops_probe", "def logits(q):\n    return q.shape * None\n"
    )
    fault = fault_of(stand_in.logits, torch.zeros(2))
    assert fault is not None and fault.file == "adapters/vllm/vendor_ops_probe.py"


def test_a_call_a_stand_ins_signature_refuses_is_the_stand_ins_fault():
    """The engine calls a vendor function with a keyword the stand-in lacks: Python raises
    in the engine's frame, before the stand-in runs, yet the stand-in is what is wrong
    (its vendor's function takes that keyword). A call the engine's own function refuses
    stays a finding."""
    stand_in = module_code(
        "attnfuzz.adapters.sglang.vendor_probe",
        "def get_schedule(lens, heads):\n    return lens\n",
    )
    caller = module_code(
        "sglang.kernels.ops._probe",
        "def plan(lens):\n    return vendor.get_schedule(lens, 1, use_legacy=True)\n"
        "def own(lens, heads):\n    return lens\n"
        "def plan_own(lens):\n    return own(lens, 1, use_legacy=True)\n",
    )
    caller.vendor = stand_in
    fault = fault_of(caller.plan, [1])
    assert fault is not None, "a stand-in's missing keyword blamed on the engine"
    assert fault.file == "adapters/sglang/vendor_probe.py" and fault.line == 1
    assert fault.function == "get_schedule" and "unexpected keyword" in fault.error
    assert fault_of(caller.plan_own, [1]) is None


def test_the_users_code_and_our_kernels_are_under_test():
    user = module_code("my_project.builders", "def build(inputs):\n    return inputs.nope\n")
    assert fault_of(user.build, Inputs()) is None
    kernel = module_code("attnfuzz.kernels._probe", "def k(inputs):\n    return inputs.nope\n")
    assert fault_of(kernel.k, Inputs()) is None


def test_engine_code_with_a_fix_reverted_is_under_test_where_it_lives():
    glue = adapter()
    reverted = module_code(
        "attnfuzz.adapters.vllm._reverted", "class Proposer:\n    def build(self):\n        1 / 0\n"
    )
    assert fault_of(reverted.Proposer().build) is not None
    under_test(reverted.Proposer)
    assert fault_of(reverted.Proposer().build) is None
    assert fault_of(glue.glue, Inputs()) is not None  # only what was marked


def test_harness_code_that_calls_the_implementation_is_transparent():
    harness = module_code("attnfuzz.harness._caller", "def call(fn, x):\n    return fn(x)\n")
    assert fault_of(harness.call, torch.cat, 3) is not None  # a builtin raised: whose?
    transparent(harness.call)
    assert fault_of(harness.call, torch.cat, 3) is None  # the implementation's call


# -- through the judge and the command line --------------------------------------------


def case():
    return hand_case((2, 2), (3, 5))


def test_the_judge_raises_harness_error_for_glue_and_judges_the_engine():
    target = get_target(TARGET)
    glue = Implementation("probe", adapter().glue, "engine")
    with pytest.raises(HarnessError, match=r"adapters/vllm/_probe.py:3 in glue: AttributeError"):
        target.judge(glue, case())
    verdict = target.judge(Implementation("probe", engine().build, "engine"), case())
    assert verdict.key == "exception:AttributeError"


def test_run_reports_an_attnfuzz_error_exit_4_and_writes_no_case(tmp_path, monkeypatch, capsys):
    module = adapter()
    monkeypatch.setitem(sys.modules, "attnfuzz_probe_glue", module)
    out = tmp_path / "cases"
    code = main(
        ["run", "--target", TARGET, "--impl", "attnfuzz_probe_glue:glue", "--seed", "0",
         "--max-examples", "5", "--out", str(out), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == EXIT_ERROR, text
    assert "ERROR mtp-seq-lens / attnfuzz_probe_glue:glue  [attnfuzz error]" in text
    assert "attnfuzz error at adapters/vllm/_probe.py:3 in glue: AttributeError" in text
    assert "FAIL" not in text and not (out.exists() and any(out.iterdir()))


def test_run_of_engine_code_that_raises_stays_a_finding(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "attnfuzz_probe_engine", engine())
    code = main(
        ["run", "--target", TARGET, "--impl", "attnfuzz_probe_engine:build", "--seed", "0",
         "--max-examples", "5", "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    assert code == EXIT_FOUND
    assert "FAIL mtp-seq-lens / attnfuzz_probe_engine:build  [exception:AttributeError]" in (
        capsys.readouterr().out
    )


def test_an_implementation_that_cannot_be_prepared_is_one_usage_line(tmp_path, monkeypatch, capsys):
    def broken() -> None:
        raise ModuleNotFoundError("No module named 'vllm.v1.worker.gpu'")

    def fn(inputs):
        return inputs

    fn.prepare = broken  # as an engine's adapter prepares before the judge forks
    monkeypatch.setitem(sys.modules, "attnfuzz_probe_prepare", types.SimpleNamespace(fn=fn))
    code = main(
        ["run", "--target", TARGET, "--impl", "attnfuzz_probe_prepare:fn", "--seed", "0",
         "--max-examples", "2", "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == EXIT_USAGE
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "ModuleNotFoundError: No module named 'vllm.v1.worker.gpu'" in err[0]
    assert "Traceback" not in captured.err + captured.out


# -- the contract's history ------------------------------------------------------------


def test_a_removed_field_reads_with_its_history_and_is_a_usage_error():
    from attnfuzz.reference.max_seq_len import MaxSeqLenInputs

    target = get_target("max-seq-len")
    inputs = target.make_inputs(_max_seq_len_case(), torch.device("cpu"))
    assert isinstance(inputs, MaxSeqLenInputs)
    with pytest.raises(RemovedField, match=r"renamed to seq_lens_cpu_upper_bound in 0\.2\.0"):
        inputs.seq_lens_upper_bound  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'no_such_field'"):
        inputs.no_such_field  # noqa: B018

    def written_for_0_1(inp):
        return inp.seq_lens_upper_bound

    impl = Implementation("old", written_for_0_1, "user")
    with pytest.raises(UsageError, match=r"MaxSeqLenInputs\.seq_lens_upper_bound was renamed"):
        target.judge(impl, _max_seq_len_case())


def _max_seq_len_case():
    case = hand_case((2, 2, 2), (3, 9, 0), num_spec=1)
    return dataclasses.replace(case, params=(("capturing", 0),))


def test_a_renamed_field_keeps_its_old_name_with_a_deprecation_warning():
    @dataclass
    class Outputs(FieldHistory):
        seq_lens: int
        lens = renamed_alias("seq_lens", "0.2.0")

    out = Outputs(7)
    with pytest.warns(DeprecationWarning, match="renamed to seq_lens in 0.2.0"):
        assert out.lens == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert out.seq_lens == 7


def test_a_misspelt_field_of_a_public_dataclass_is_the_readers_fault():
    from attnfuzz.reference.max_seq_len import MaxSeqLenInputs

    inputs = MaxSeqLenInputs.__new__(MaxSeqLenInputs)
    user = module_code("my_project.bounds", "def bound(inputs):\n    return inputs.seq_len\n")
    assert fault_of(user.bound, inputs) is None
    assert fault_of(adapter().calls, lambda inp: inp.seq_len, inputs) is None  # a user lambda
    glue = module_code("attnfuzz.adapters.vllm._typo", "def run(inputs):\n    return inputs.x\n")
    assert fault_of(glue.run, inputs).function == "run"


def test_a_campaign_run_attnfuzz_failed_on_is_error_exit_4_no_finding(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    out = tmp_path / "out"
    code = main(
        ["campaign", "--targets", TARGET, "--impls", "blame_probe:glue", "--max-examples", "5",
         "--out", str(out), "--db", str(tmp_path / "db")]
    )  # fmt: skip
    doc = json.loads((out / "campaign.json").read_text())
    assert code == EXIT_ERROR
    (run,) = doc["runs"]
    assert run["status"] == "error" and doc["findings"] == []
    assert run["error"].startswith("attnfuzz error at adapters/vllm/_probe.py:3 in glue: Attri")
    assert not (out / "cases").exists() or not any((out / "cases").iterdir())
    assert "ERROR" in (out / "summary.md").read_text()
