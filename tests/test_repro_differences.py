"""``repro`` says where a case was recorded when that differs from the replay.

A case recorded by another attnfuzz, on CUDA, on another vLLM, that passes
here must not read as a plain ``PASS``: each difference is one line beside the
verdict, and ``--json`` carries them.
"""

from __future__ import annotations

import json

import attnfuzz
import pytest
from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import EXIT_OK
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.testing import hand_case

TARGET = "mtp-seq-lens"


def recorded_elsewhere(tmp_path, **environment):
    verdict = Verdict([Mismatch("values", "context_lens[0]", "1", "2")])
    doc = case_document(TARGET, "triton", hand_case((2, 2), (3, 4)), verdict)
    doc["environment"].update(environment)
    return write_case(tmp_path / "case.json", doc)


def test_each_difference_is_one_line_beside_the_verdict(tmp_path, capsys):
    path = recorded_elsewhere(tmp_path, attnfuzz="0.0.9", device="cuda:0")
    assert main(["repro", str(path)]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{TARGET} / triton: PASS"
    assert out[1:] == [
        f"  recorded with attnfuzz 0.0.9, replayed with {attnfuzz.__version__}",
        "  recorded with device cuda:0, replayed with cpu",
    ]


def test_the_same_environment_adds_nothing(tmp_path, capsys):
    path = recorded_elsewhere(tmp_path)
    assert main(["repro", str(path)]) == EXIT_OK
    assert capsys.readouterr().out.splitlines() == [f"{TARGET} / triton: PASS"]


def test_json_carries_the_differences(tmp_path, capsys):
    path = recorded_elsewhere(tmp_path, attnfuzz="0.0.9")
    assert main(["repro", str(path), "--json"]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is True and doc["key"] is None and doc["mismatches"] == []
    assert doc["differences"] == [
        {"what": "attnfuzz", "recorded": "0.0.9", "here": attnfuzz.__version__}
    ]


def test_an_engine_case_names_both_engine_versions(tmp_path, monkeypatch):
    from attnfuzz.harness.cli.repro import differences
    from attnfuzz.harness.registry import get_target

    vllm = pytest.importorskip("attnfuzz.adapters.vllm")  # the vLLM plugin, not vLLM
    monkeypatch.setattr(vllm, "installed_version", lambda: "0.20.0")
    verdict = Verdict([Mismatch("values", "context_lens[0]", "1", "2")])
    doc = case_document(TARGET, "vllm", hand_case((2, 2), (3, 4)), verdict)
    monkeypatch.setattr(vllm, "installed_version", lambda: "0.33.0")
    impl = get_target(TARGET).implementations["vllm"]
    assert differences(doc, impl, "cpu") == [
        {"what": "vllm", "recorded": "0.20.0", "here": "0.33.0"}
    ]
