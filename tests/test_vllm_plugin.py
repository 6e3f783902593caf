"""The vLLM plugin (``adapters/vllm/plugin.py``): its implementations where vLLM is
missing, the record of its version in case files and replays, and its adapter
references, checked without importing vLLM."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
from attnfuzz.adapters import vllm
from attnfuzz.harness.casefile import case_document, engine_versions, environment, read_case
from attnfuzz.harness.cli import _note_engine_version, main
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.registry import get_target, target_names, unavailable_mutants
from attnfuzz.harness.target import UsageError
from attnfuzz.harness.testing import hand_case


def engine_impls() -> list[tuple[str, str, str]]:
    """``(target, implementation, kind)`` of every implementation that is vLLM's own code."""
    return [
        (name, impl.name, impl.kind)
        for name in target_names()
        for impl in get_target(name).implementations.values()
        if impl.engine == vllm.ENGINE
    ]


@pytest.fixture
def no_vllm(monkeypatch):
    """As on a machine where vLLM is not installed."""
    monkeypatch.setattr(vllm, "installed_version", lambda: None)


def test_the_engine_under_test_is_registered_on_the_targets():
    impls = engine_impls()
    kinds = {kind for _, _, kind in impls}
    assert kinds == {"engine", "mutant"}, impls
    for name in ("mtp-seq-lens", "draft-block-tables", "max-seq-len", "flex-block-mask"):
        assert (name, "vllm", "engine") in impls


def test_list_shows_vllm_as_unavailable_with_the_install_line(no_vllm, capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "(unavailable)" in text
    assert f"unavailable: vLLM is not installed; install vLLM {vllm.VERSION} with: " in text
    assert vllm.INSTALL in text
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        for impl in row["implementations"]:
            if impl["engine"] == "vllm":
                assert impl["unavailable"] and vllm.INSTALL in impl["unavailable"]
            elif impl["engine"] is None:  # attnfuzz's own; another engine's says its own
                assert impl["unavailable"] is None


def test_choosing_vllm_without_it_is_one_usage_line(no_vllm, tmp_path, capsys):
    code = main(["run", "--target", "mtp-seq-lens", "--impl", "vllm", "--max-examples", "1",
                 "--out", str(tmp_path / "cases"), "--db", str(tmp_path / "db")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "cannot run" in err[0] and vllm.INSTALL in err[0]
    with pytest.raises(UsageError, match="not installed"):
        get_target("mtp-seq-lens").resolve("vllm")


def test_upstream_mutants_leave_the_zoo_saying_why(no_vllm):
    left = unavailable_mutants()
    upstream = [f"{t}/{i}" for t, i, kind in engine_impls() if kind == "mutant"]
    # Every vLLM mutant is left out, for one reason (another engine's may be too).
    reasons = [reason for reason, names in left.items() if set(names) & set(upstream)]
    assert len(reasons) == 1 and sorted(left[reasons[0]]) == sorted(upstream)
    for name in target_names():
        assert all(m.engine != vllm.ENGINE for m in get_target(name).mutants)


def _document(version: str | None, monkeypatch) -> dict:
    monkeypatch.setattr(vllm, "installed_version", lambda: version)
    case = hand_case((2, 2), (3, 4))
    verdict = Verdict([Mismatch("values", "context_lens", "1", "2")])
    return case_document("mtp-seq-lens", "vllm", case, verdict)


def test_case_files_record_the_engine_and_its_version(monkeypatch, tmp_path):
    doc = _document("0.33.0", monkeypatch)
    assert doc["engine"] == {"name": "vllm", "version": "0.33.0"}
    assert doc["environment"]["vllm"] == "0.33.0" == environment()["vllm"]
    path = tmp_path / "case.json"
    path.write_text(json.dumps(doc))
    assert read_case(path)["engine"] == doc["engine"]
    ours = case_document("mtp-seq-lens", "triton", hand_case((2, 2), (3, 4)), Verdict([]))
    assert "engine" not in ours  # attnfuzz's own kernels are no engine's code
    bad = dict(doc, engine={"name": "vllm"})
    path.write_text(json.dumps(bad))
    with pytest.raises(UsageError, match=r"\$\.engine: 'version' is a required property"):
        read_case(path)


def test_repro_says_when_the_installed_engine_differs(monkeypatch, capsys):
    doc = _document("0.33.0", monkeypatch)
    impl = get_target("mtp-seq-lens").implementations["vllm"]
    _note_engine_version(doc, impl)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(vllm, "installed_version", lambda: "0.34.1")
    assert engine_versions()["vllm"] == "0.34.1"  # beside any other engine installed
    _note_engine_version(doc, impl)
    err = capsys.readouterr().err
    assert "found on vllm 0.33.0" in err and "vllm 0.34.1 is installed here" in err


def test_every_adapter_the_plugin_names_is_a_function_of_its_module():
    """The plugin names adapter functions by module and attribute (importing an adapter
    sets vLLM up, some import vLLM): a rename must fail here, not when it runs. A module
    defines one with ``def`` or binds one a helper made (``judging_held``)."""
    from attnfuzz.adapters.vllm.plugin import VLLM

    adapters = Path(vllm.__file__).parent
    named = 0
    for target, impls in VLLM.implementations.items():
        assert target in target_names(), target
        for impl in impls:
            for call in (impl.fn, impl.declines):
                if call is None:
                    continue
                assert isinstance(call, vllm.EngineCall), (target, impl.name, call)
                tree = ast.parse((adapters / f"{call.module}.py").read_text())
                defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
                defined |= {
                    t.id
                    for n in tree.body
                    if isinstance(n, ast.Assign)
                    for t in n.targets
                    if isinstance(t, ast.Name)
                }
                assert call.attr in defined, f"{target}/{impl.name}: no {call!r}"
                named += 1
    assert named >= sum(len(impls) for impls in VLLM.implementations.values())


def test_vllm_s_runner_steps_stop_a_position_short_of_max_model_len():
    """vLLM's scheduler keeps the model's last position for the token a step samples
    (``Scheduler.schedule``; ``InputProcessor`` refuses a prompt of ``max_model_len``
    tokens): every vLLM implementation of ``runner-step`` says a step reaching it is
    unreachable, and draws its traces inside the limit."""
    from attnfuzz.harness.testing import spec_config
    from attnfuzz.reference.batch import Batch, Case
    from hypothesis import given, settings

    target = get_target("runner-step")
    impls = [i for i in target.implementations.values() if i.engine == vllm.ENGINE]
    assert len(impls) > 20
    config = spec_config(runner="v1")
    inside = Case(config, Batch((60,), (3,)))
    past = Case(config, Batch((61,), (3,)))
    for impl in impls:
        assert target.unreachable(impl, inside) is None, impl.name
        assert "max_model_len - 1 = 63" in target.unreachable(impl, past), impl.name

    # Its limits alone (its declines ask the installed vLLM).
    limited = dataclasses.replace(target.implementations["vllm-v1"], declines=None)

    @settings(max_examples=40, deadline=None, database=None)
    @given(target.traces(impl=limited))
    def drawn(trace):
        top = trace.config.max_model_len - 1
        assert all(s <= top for step in trace.steps for s in step.seq_lens)

    drawn()
