"""``attnfuzz export`` and ``attnfuzz repro``: regression tests from case files, exit codes,
one-line errors for bad input."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import CASE_SCHEMA as SCHEMA
from attnfuzz.harness.export import export_case
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.runner import fuzz
from attnfuzz.harness.testing import hand_case

TARGET = "indexer-decode"


@pytest.fixture(scope="module")
def mutant_case(tmp_path_factory) -> Path:
    """The minimized case the fuzzer finds on bug A's write-back mutant."""
    target = get_target(TARGET)
    impl = target.resolve("pr39542-writeback")
    result = fuzz(target, impl, max_examples=300, rng_seed=0, database=None)
    assert result.failed
    doc = case_document(TARGET, impl.name, result.case, result.verdict)
    return write_case(tmp_path_factory.mktemp("cases") / "writeback.json", doc)


def _pytest(path: Path) -> subprocess.CompletedProcess:
    """Run pytest on one file, from its own directory: nothing but attnfuzz is needed."""
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(path.parent),
        str(path),
    ]
    return subprocess.run(cmd, cwd=path.parent, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_exported_test_fails_on_the_bug_and_passes_on_the_fix(mutant_case, tmp_path, capsys):
    out = tmp_path / "regressions"
    assert main(["export", str(mutant_case), "-o", str(out)]) == 0
    assert main(["export", str(mutant_case), "-o", str(out), "--impl", "triton"]) == 0
    printed = capsys.readouterr().out
    buggy, fixed = sorted(out.glob("test_*.py"), key=lambda p: "__on_triton" in p.name)
    run = f"run: {shlex.quote(sys.executable)} -m pytest {shlex.quote(str(fixed))}"
    assert f"wrote {buggy}" in printed and run in printed
    assert "__on_triton" in fixed.name and buggy.name.startswith("test_indexer_decode__")

    failing = _pytest(buggy)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "fails the exported case" in failing.stdout and "RuntimeError" in failing.stdout
    passing = _pytest(fixed)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "1 passed" in passing.stdout


def test_exported_file_is_standalone_and_embeds_the_case(mutant_case, tmp_path):
    path = export_case(mutant_case, tmp_path)
    tree = ast.parse(path.read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"__future__", "attnfuzz"}
    values = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
    }
    doc = json.loads(mutant_case.read_text())
    assert values["CASE"] == doc["case"] and values["FOUND"] == doc["verdict"]
    assert values["TARGET"] == TARGET and values["IMPLEMENTATION"] == "pr39542-writeback"
    tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert tests == [path.stem]
    # Exporting again writes the same file; -o may name the file itself.
    assert export_case(mutant_case, tmp_path) == path
    assert export_case(mutant_case, tmp_path / "named.py").read_text() == path.read_text()


def _case_file(tmp_path: Path, name: str, case=None, verdict=None, implementation="triton"):
    case = case or hand_case((2, 2, 2), (5, 9, 3))
    verdict = verdict or Verdict([Mismatch("values", "x[0]", "1", "2")])
    return write_case(tmp_path / name, case_document(TARGET, implementation, case, verdict))


def test_strings_from_the_case_file_stay_data(tmp_path):
    """Whatever the verdict says, it enters the generated file as a string literal."""
    evil = '"""\nimport os; os.system("echo owned")\n"""\\ {x} \x00 \u2028 \ud800 é'
    path = _case_file(tmp_path, "evil.json", verdict=Verdict([Mismatch(evil, evil, evil, evil)]))
    source = export_case(path, tmp_path / "out").read_text()
    tree = ast.parse(source)
    found = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "FOUND"
    )
    assert ast.literal_eval(found)["mismatches"][0]["got"] == evil
    assert "import os" not in [line.strip() for line in source.splitlines()]


def test_different_cases_with_the_same_key_get_different_files(tmp_path):
    a = _case_file(tmp_path, "a.json", hand_case((2, 2, 2), (5, 9, 3)))
    b = _case_file(tmp_path, "b.json", hand_case((2, 2), (5, 9)))
    assert export_case(a, tmp_path / "out") != export_case(b, tmp_path / "out")
    assert len(list((tmp_path / "out").glob("*.py"))) == 2


def test_repro_exit_codes(mutant_case, capsys):
    assert main(["repro", str(mutant_case)]) == 1
    assert "FAIL (exception:RuntimeError)" in capsys.readouterr().out
    assert main(["repro", str(mutant_case), "--impl", "triton"]) == 0
    assert "PASS" in capsys.readouterr().out


def _doc(**case_changes) -> dict:
    case = hand_case((2, 2, 2), (5, 9, 3)).to_dict()
    for where, fields in case_changes.items():
        case[where] = {**case.get(where, {}), **fields}
    return {"schema": SCHEMA, "target": TARGET, "implementation": "triton", "case": case}


BAD_CASES = {
    "truncated.json": ('{"schema": "attnfuzz.case/1", "target": "ind', "not valid JSON"),
    "binary.json": (b"\x89PNG\r\n\x1a\n\x00\xff", "not a text file"),
    "deep.json": ("[" * 100_000, "nested too deeply"),
    "schema.json": ({**_doc(), "schema": "attnfuzz.case/2"}, "unsupported schema"),
    "target.json": ({**_doc(), "target": "no-such-target"}, "unknown target 'no-such-target'"),
    "impl.json": ({**_doc(), "implementation": "nope"}, "unknown implementation 'nope'"),
    "user.json": ({**_doc(), "implementation": "mod:fn"}, "replay it with --impl mod:fn"),
    "float.json": (
        _doc(batch={"q_lens": [2.5, 2, 2]}),
        "$.case.batch.q_lens[0]: 2.5 is not of type 'integer'",
    ),
    "string.json": (_doc(config={"topk": "4"}), "$.case.config.topk: '4' is not of type 'integer'"),
    "field.json": (
        _doc(batch={"q_len": [2]}),
        "$.case.batch: Additional properties are not allowed ('q_len' was",
    ),
    "too_long.json": (
        _doc(batch={"num_computed_tokens": [63, 9, 3]}),
        "not a batch the engine can produce: a seq_len exceeds max_model_len=64",
    ),
    "param.json": (_doc(params={"window": 4}), "not a batch the engine can produce"),
    "capture.json": (_doc(config={"cudagraph_capture_sizes": [3]}), "capture size 3"),
}


@pytest.mark.parametrize("name", sorted(BAD_CASES))
@pytest.mark.parametrize("command", ["repro", "export"])
def test_bad_input_is_a_one_line_error_with_exit_2(tmp_path, capsys, name, command):
    content, message = BAD_CASES[name]
    path = tmp_path / name
    if isinstance(content, dict):
        content = json.dumps(content)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [command, str(path)] + (["-o", str(tmp_path / "out")] if command == "export" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnfuzz: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (tmp_path / "out").exists()  # nothing exported from bad input


def test_unknown_impl_on_the_command_line_is_exit_2(mutant_case, tmp_path, capsys):
    out = ["-o", str(tmp_path / "out")]
    assert main(["repro", str(mutant_case), "--impl", "nope"]) == 2
    assert "unknown implementation 'nope'" in capsys.readouterr().err
    assert main(["export", str(mutant_case), "--impl", "nope", *out]) == 2
    assert "unknown implementation 'nope'" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.json"), *out]) == 2
    assert "cannot read case file" in capsys.readouterr().err


def test_export_standalone_without_a_hook_is_a_one_line_usage_error(tmp_path, capsys):
    """attnfuzz's own implementation has no standalone reproduction: exit 2, one line."""
    case = hand_case((2, 2, 2), (5, 9, 3))
    verdict = Verdict([Mismatch("values", "x[0]", "1", "2")])
    doc = case_document("indexer-decode", "triton", case, verdict)
    path = write_case(tmp_path / "case.json", doc)
    assert main(["export", "--standalone", str(path), "-o", str(tmp_path / "repro.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnfuzz: error: ") and err.count("\n") == 1, err
    assert "no standalone reproduction" in err, err
    assert not (tmp_path / "repro.py").exists()
