"""The ``attnfuzz`` command: exit codes, case files, replay, user implementations."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from attnfuzz.harness.casefile import read_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.definitions import CASE_SCHEMA as SCHEMA
from attnfuzz.harness.errors import UsageError


def run(tmp_path, *args: str) -> int:
    return main(["run", "--db", str(tmp_path / "db"), "--out", str(tmp_path / "cases"), *args])


def test_list_names_targets_implementations_and_mutants(capsys):
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert "indexer-decode" in text and "pr39542-overlap" in text and "mutant" in text
    assert main(["list", "--json"]) == 0
    rows = {row["target"]: row for row in json.loads(capsys.readouterr().out)}
    impls = {i["name"]: i["kind"] for i in rows["indexer-decode"]["implementations"]}
    assert impls["triton"] == "fixed" and impls["pr39542-writeback"] == "mutant"
    for row in rows.values():  # every target ships its fixed path and the reference
        kinds = [i["kind"] for i in row["implementations"]]
        assert "fixed" in kinds and "reference" in kinds and "mutant" in kinds, row["target"]


def test_run_passes_on_triton(tmp_path, capsys):
    assert run(tmp_path, "--target", "indexer-decode", "--impl", "triton",
               "--max-examples", "20", "--seed", "0") == 0  # fmt: skip
    assert "PASS" in capsys.readouterr().out
    assert not (tmp_path / "cases").exists()


def test_run_finds_a_mutant_writes_the_case_and_repro_replays_it(tmp_path, capsys):
    # Seed 1: the README's example, bug A as production met it (seed 0 minimizes to
    # padded one-token decodes, which meet the same write-back without drafts).
    code = run(tmp_path, "--target", "indexer-decode", "--impl", "pr39542-writeback",
               "--max-examples", "500", "--seed", "1")  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    (path,) = (tmp_path / "cases").glob("*.json")
    assert f"attnfuzz repro {path}" in out and "minimized case:" in out
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA and doc["implementation"] == "pr39542-writeback"
    assert doc["verdict"]["key"].startswith("exception:")
    assert doc["derived"]["next_n"] >= 2 and set(doc["environment"]) >= {"torch", "hypothesis"}
    # The same verdict on replay; the fixed implementation passes it.
    assert main(["repro", str(path)]) == 1
    assert doc["verdict"]["mismatches"][0]["got"] in capsys.readouterr().out
    assert main(["repro", str(path), "--impl", "triton"]) == 0


@pytest.mark.slow
def test_a_found_failure_is_retried_first_from_the_database(tmp_path, capsys):
    # Random draws (a database is read): a budget the search cannot run out of first, on
    # a mutant of plain torch glue that a search meets after some dozen examples.
    args = ["--target", "unpadding", "--impl", "stale-slots", "--max-examples", "3000"]
    assert run(tmp_path, *args) == 1
    assert any((tmp_path / "db").rglob("*")), "the failure was not saved"
    capsys.readouterr()
    assert run(tmp_path, *args) == 1
    assert "first failure after 1 examples" in capsys.readouterr().out  # the saved one


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--target", "nope"], "unknown target 'nope'"),
        (["run", "--target", "indexer-decode", "--impl", "nope"], "unknown implementation"),
        (["run", "--target", "indexer-decode", "--impl", "no_such_mod:f"], "cannot load"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("bad", ["0", "-3", "many"])
def test_bad_numbers_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--target", "indexer-decode", "--max-examples", bad])
    assert exc.value.code == 2
    assert "--max-examples" in capsys.readouterr().err


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bad_case_files_are_usage_errors(tmp_path, capsys):
    good = {"schema": SCHEMA, "target": "indexer-decode", "implementation": "triton",
            "case": {"config": {}, "batch": {}}}  # fmt: skip
    cases = {
        "truncated.json": '{"schema": "attnfuzz.case/1", "tar',
        "list.json": "[1, 2]",
        "schema.json": json.dumps({**good, "schema": "attnfuzz.case/99"}),
        "fields.json": json.dumps(good),
    }
    for name, text in cases.items():
        path = write(tmp_path, name, text)
        with pytest.raises(UsageError):
            read_case(path)
        assert main(["repro", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and "unsupported schema" in err
    assert "fields.json: $.case.config: 'max_model_len' is a required property" in err
    assert main(["repro", str(tmp_path / "missing.json")]) == 2


def test_a_case_too_large_for_memory_is_a_one_line_usage_error(tmp_path, capsys):
    from attnfuzz.harness.targets.indexer_decode import smallest_writeback

    case = smallest_writeback().to_dict()
    # Past the engine's int32 metadata: refused as it is read.
    case["config"]["max_model_len"] = 10**15
    doc = {"schema": SCHEMA, "target": "indexer-decode", "implementation": "triton", "case": case}
    path = write(tmp_path, "huge.json", json.dumps(doc))
    assert main(["repro", str(path)]) == 2
    err = capsys.readouterr().err
    assert "$.case.config.max_model_len: 1000000000000000 is greater than the maximum" in err
    assert err.count("\n") == 1
    # In range, but its block table alone would need more memory than a machine has.
    case["config"].update(max_model_len=2**31 - 1, max_num_seqs=2**31 - 1, block_size=1)
    path = write(tmp_path, "huge.json", json.dumps(doc))
    assert main(["repro", str(path)]) == 2
    err = capsys.readouterr().err
    assert "too large to replay" in err and err.count("\n") == 1


USER_MODULE = textwrap.dedent(
    """
    from attnfuzz.kernels.indexer_decode import indexer_decode

    def mine(inputs):
        return indexer_decode(inputs)

    def broken(inputs):
        # forgets the decode path's write-back entirely
        from attnfuzz.reference.indexer_decode import IndexerDecodeOutputs, reference
        return IndexerDecodeOutputs(__import__("torch").as_tensor(reference(None, inputs).logits))
    """
)


def test_user_implementation_by_module_attribute(tmp_path):
    """The console script finds the user's module from the working directory."""
    write(tmp_path, "my_indexer.py", USER_MODULE)
    exe = [sys.executable, "-c", "from attnfuzz.harness.cli import main; raise SystemExit(main())"]
    common = ["run", "--target", "indexer-decode", "--max-examples", "15", "--seed", "1",
              "--db", "db", "--out", "cases"]  # fmt: skip
    ok = subprocess.run([*exe, *common, "--impl", "my_indexer:mine"], cwd=tmp_path,
                        capture_output=True, text=True)  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([*exe, *common, "--impl", "my_indexer:broken"], cwd=tmp_path,
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (case,) = (tmp_path / "cases").glob("*.json")
    # A case file never makes attnfuzz import a module: the user names it again.
    replay = subprocess.run([*exe, "repro", str(case)], cwd=tmp_path, capture_output=True,
                            text=True)  # fmt: skip
    assert replay.returncode == 2 and "--impl my_indexer:broken" in replay.stderr
    replay = subprocess.run([*exe, "repro", str(case), "--impl", "my_indexer:broken"],
                            cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert replay.returncode == 1, replay.stdout + replay.stderr


def test_version_prints_the_distribution_s_version(capsys):
    import attnfuzz

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"attnfuzz {attnfuzz.__version__}"


def test_project_defaults_apply_and_the_command_line_wins():
    from attnfuzz.harness.cli import build_parser

    config = {"max_examples": 7, "targets": ["indexer-decode"], "mutants": ["a", "b:C"],
              "scale": "production", "cases": Path("kept"), "workers": 3}  # fmt: skip
    parser = build_parser(config)
    args = parser.parse_args(["campaign"])
    assert (args.max_examples, args.targets, args.mutants) == (7, ["indexer-decode"], ["a", "b:C"])
    assert (args.scale, args.workers) == ("production", 3)
    args = parser.parse_args(["campaign", "--max-examples", "3", "--mutants", "x", "-n", "1"])
    assert (args.max_examples, args.mutants, args.workers) == (3, ["x"], 1)  # replaced, not added
    args = parser.parse_args(["run", "--target", "t"])
    assert (args.max_examples, args.out, args.scale) == (7, Path("kept"), "production")
    assert parser.parse_args(["zoo"]).mutants == ["a", "b:C"]
    plain = build_parser()  # no project: attnfuzz's own defaults
    assert plain.parse_args(["run", "--target", "t"]).max_examples == 200
    assert plain.parse_args(["campaign"]).mutants is None


def test_a_broken_project_table_is_a_usage_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.attnfuzz]\nmax_exampels = 5\n")
    monkeypatch.chdir(tmp_path)
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_exampels" in err and "pyproject.toml" in err


def test_list_names_targets_that_could_not_be_built(monkeypatch, capsys):
    from attnfuzz.harness import registry

    monkeypatch.setattr(registry, "unavailable_targets", lambda: {"their-target": "ImportError: x"})
    assert main(["list"]) == 0
    assert "their-target: unavailable target (ImportError: x)" in capsys.readouterr().out
    assert main(["list", "--json"]) == 0
    rows = {r["target"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["their-target"]["unavailable"] == "ImportError: x"
    assert rows["their-target"]["implementations"] == []


def test_the_replay_line_names_the_program_as_it_runs_here(tmp_path, monkeypatch):
    """``replay: ...`` is typed again as printed: ``attnfuzz`` only where that name on
    PATH is the program that ran; after ``setup.sh`` without an activated venv it is
    ``.venv/bin/attnfuzz``; ``python -m attnfuzz`` names the interpreter."""
    from attnfuzz.harness.definitions import invoked_as

    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / "attnfuzz"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert invoked_as(str(program)) == ".venv/bin/attnfuzz"
    monkeypatch.setenv("PATH", str(bin_dir))
    assert invoked_as(str(program)) == "attnfuzz"
    main_py = tmp_path / "attnfuzz" / "__main__.py"
    assert invoked_as(str(main_py)).endswith(" -m attnfuzz")
    assert invoked_as("/usr/bin/pytest") == "attnfuzz"  # inside another program
