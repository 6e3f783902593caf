"""Bad input of every kind is one line on stderr (``attnfuzz: error: ...``) and exit
status 2, before any work; nothing reaches the terminal unbounded or raw.

Case files (sizes, numbers, nesting, types, ranges, what the path names),
messages (one bounded printable line), a closed stdout, devices and dtypes,
the dtype a case file records, and exported tests that stay out of this
project's own pytest and ruff runs.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import attnfuzz
import pytest
import torch
from attnfuzz.harness import devices
from attnfuzz.harness.casefile import (
    MAX_CASE_BYTES,
    case_document,
    read_case,
    write_case,
)
from attnfuzz.harness.casefile.load import resolve_case as load_case
from attnfuzz.harness.cli import main, one_line
from attnfuzz.harness.definitions import CASE_SCHEMA as SCHEMA
from attnfuzz.harness.errors import InvalidCase, UsageError
from attnfuzz.harness.export import LINE, _literal, export_case
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.registry import get_target
from attnfuzz.harness.testing import hand_case
from attnfuzz.reference.batch import Case
from attnfuzz.reference.trace import Trace

TARGET = "indexer-decode"
CUDA = torch.cuda.is_available()
BIN = Path(sys.executable).parent
ROOT = Path(attnfuzz.__file__).parent  # the checkout, for an editable install


@pytest.fixture(autouse=True)
def _no_dtype_setting(monkeypatch):
    monkeypatch.delenv("ATTNFUZZ_DTYPE", raising=False)


def _doc(**changes) -> dict:
    case = hand_case((2, 2, 2), (5, 9, 3)).to_dict()
    for where, fields in changes.items():
        case[where] = {**case.get(where, {}), **fields}
    return {"schema": SCHEMA, "target": TARGET, "implementation": "triton", "case": case}


def _write(path: Path, content: dict | str | bytes) -> Path:
    if isinstance(content, dict):
        content = json.dumps(content, ensure_ascii=False)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _one_line_error(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("attnfuzz: error: ") and err.count("\n") == 1, err[:2000]
    assert len(err) < 700 and "\x1b" not in err, err[:2000]
    for fragment in fragments:
        assert fragment in err, err
    return err


def _repro_and_export(tmp_path, capsys, path: Path, *fragments: str) -> None:
    """Both commands that read a case file refuse it the same way, and export writes nothing."""
    assert main(["repro", str(path)]) == 2
    _one_line_error(capsys, *fragments)
    out = tmp_path / "exported"
    assert main(["export", str(path), "-o", str(out)]) == 2
    _one_line_error(capsys, *fragments)
    assert not out.exists()


# -- 1. case files -------------------------------------------------------------


def test_an_integer_too_long_for_python_is_a_one_line_error(tmp_path, capsys):
    text = json.dumps(_doc()).replace('"seed": 7', '"seed": ' + "9" * 5000)
    path = _write(tmp_path / "digits.json", text)
    _repro_and_export(tmp_path, capsys, path, "an integer of 5000 digits")


def test_a_case_file_over_the_size_cap_is_refused_unread(tmp_path, capsys, monkeypatch):
    # Well-formed JSON whose one field name is megabytes long: once echoed whole.
    doc = _doc(batch={"x" * (3 * MAX_CASE_BYTES): 1})
    path = _write(tmp_path / "large.json", doc)
    _repro_and_export(tmp_path, capsys, path, "large.json: 3 MiB", "at most 1 MiB")
    # 200 MB (sparse): refused from its size alone, never read.
    huge = tmp_path / "huge.json"
    with huge.open("wb") as f:
        f.truncate(200 << 20)
    opened = []
    real_open = Path.open

    def spy(self, *args, **kwargs):
        opened.append(self)
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spy)
    assert main(["repro", str(huge)]) == 2
    _one_line_error(capsys, "200 MiB", "at most 1 MiB")
    assert huge not in opened


BAD_FILES = {
    "empty.json": ("", "the file is empty"),
    "blank.json": ("  \n\t\n", "the file is empty"),
    "truncated.json": ('{"schema": "attnfuzz.case/1", "tar', "not valid JSON"),
    "binary.json": (b"\x89PNG\r\n\x1a\n\x00\xff" * 100, "not a text file"),
    "nul.json": ('{"schema": "\x00"}', "not valid JSON"),
    "bomb.json": ("[" * 100_000, "nested too deeply"),
    "nested.json": (
        {**_doc(), "verdict": {"key": "k", "x": [[[[[[[[1]]]]]]]]}},
        "nested too deeply",
    ),
    "array.json": ("[1, 2]", "holds one JSON object"),
    # Which of case and trace a file holds: the reason first, never the document.
    "case_and_trace.json": (
        {**_doc(), "trace": {"config": _doc()["case"]["config"], "steps": []}},
        "case_and_trace.json: holds both case and trace; a case file holds one",
    ),
    "neither.json": (
        {k: v for k, v in _doc().items() if k != "case"},
        "neither.json: holds neither case nor trace",
    ),
    "case_and_step.json": (
        {**_doc(), "step": 0},
        "case_and_step.json: holds step beside case; step is the step a trace fails at",
    ),
    "case_list.json": ({**_doc(), "case": []}, "$.case: [] is not of type 'object'"),
    "config_list.json": (
        {**_doc(), "case": {"config": [], "batch": {}}},
        "$.case.config: [] is not of type 'object'",
    ),
    "verdict.json": ({**_doc(), "verdict": "x"}, "$.verdict: 'x' is not of type 'object'"),
    "target_type.json": ({**_doc(), "target": 3}, "$.target: 3 is not of type 'string'"),
    "long_name.json": (
        {**_doc(), "implementation": "i" * 5000},
        "long_name.json: $.implementation: does not match the schema (maxLength): 'iii",
    ),
    "long_key.json": ({**_doc(), "derived": {"k" * 5000: 1}}, "longer than 40 characters"),
    "config_field.json": (
        _doc(config={"\x1b[31mred": 1}),
        "$.case.config: Additional properties are not allowed ('\\x1b[31mred' was",
    ),
    "bool.json": (_doc(config={"topk": True}), "$.case.config.topk: True is not of type 'integer'"),
    "nan.json": (json.dumps(_doc()).replace('"topk": 4', '"topk": NaN'), "config.topk"),
    "list_str.json": (
        _doc(batch={"q_lens": "222"}),
        "$.case.batch.q_lens: '222' is not of type 'array'",
    ),
    "flag.json": (
        _doc(batch={"use_cudagraph": 1}),
        "$.case.batch.use_cudagraph: 1 is not of type 'boolean'",
    ),
    "dtype.json": (
        {**_doc(), "settings": {"dtype": "float64"}},
        "$.settings.dtype: 'float64' is not one of",
    ),
    "settings.json": (
        {**_doc(), "settings": {"dtype": "float32", "x": 1}},
        "$.settings: Additional properties are not allowed ('x' was unexpected)",
    ),
    "case_dtype.json": ({**_doc(), "case": {**_doc()["case"], "dtype": "float32"}}, "'dtype'"),
    "range.json": (
        _doc(config={"max_model_len": 10**15}),
        "$.case.config.max_model_len: 1000000000000000 is greater than the maximum",
    ),
    # In Python's range but not int64's: NumPy overflowed building the metadata.
    "overflow.json": (
        _doc(config={"max_model_len": 2**64}, batch={"num_computed_tokens": [2**63, 9, 3]}),
        "$.case.config.max_model_len: 18446744073709551616 is greater than the maximum",
    ),
    "negative.json": (_doc(batch={"q_lens": [2, -(2**40), 2]}), "batch.q_lens[1]"),
    "param.json": (
        _doc(params={"window": 2**31}),
        "$.case.params.window: 2147483648 is greater than the maximum of 2147483647",
    ),
    # In range, but its tensors would overflow torch's size arithmetic or be absurd.
    "tensors.json": (
        _doc(config={"topk": 2**31 - 1, "max_num_batched_tokens": 2**31 - 1}),
        "too large to replay",
    ),
    "table.json": (
        _doc(config={"max_model_len": 2**31 - 1, "max_num_seqs": 2**31 - 1, "block_size": 1}),
        "too large to replay: its block table",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_case_files_are_one_line_errors(tmp_path, capsys, name):
    content, fragment = BAD_FILES[name]
    path = _write(tmp_path / name, content)
    with pytest.raises(UsageError):
        read_case(path)
    fragments = fragment if isinstance(fragment, tuple) else (fragment,)
    _repro_and_export(tmp_path, capsys, path, f"{name}: ", *fragments)  # the file, then why


def _continuing_step() -> Case:
    """Step 1 of persistent-batch's smallest workspace-first-step trace, on its own:
    its request continues from step 0 (it gains none of its pages), which is not there."""
    trace = get_target("persistent-batch").implementations["workspace-first-step"].smallest()
    assert trace.steps[1].req_ids == (0,) and trace.steps[1].new_pages == (0,)
    return trace.case(1)


def test_a_case_on_its_own_is_a_new_engines_first_step(tmp_path, capsys):
    """A single case with scheduler fields is what a trace of one step is: every request
    new. One that continues from a step that is not there is refused in one line, the
    reason first, by every reader, the API, and the judge, before anything runs."""
    case = _continuing_step()
    doc = {"schema": SCHEMA, "target": "persistent-batch", "implementation": "triton"}
    path = _write(tmp_path / "continuing.json", {**doc, "case": case.to_dict()})
    reason = "not a first step an engine can have: request 0 is new, yet gains 0 of 1 pages"
    _repro_and_export(tmp_path, capsys, path, f"continuing.json: {reason}")
    for call in (attnfuzz.load_case, attnfuzz.replay):
        with pytest.raises(InvalidCase, match=reason):
            call(path)
    with pytest.raises(InvalidCase, match=reason):
        attnfuzz.judge("persistent-batch", "triton", case)
    # As a trace of one step it is refused too; after the step it continues, it passes.
    one_step = Trace.of_case(case)
    with pytest.raises(InvalidCase, match="step 0: request 0 is new, yet gains 0 of 1 pages"):
        attnfuzz.judge("persistent-batch", "triton", one_step)
    lived = get_target("persistent-batch").implementations["workspace-first-step"].smallest()
    assert attnfuzz.judge("persistent-batch", "triton", lived).ok


def test_paths_that_are_no_case_file(tmp_path, capsys):
    (tmp_path / "dir").mkdir()
    (tmp_path / "to_dir.json").symlink_to(tmp_path / "dir")
    (tmp_path / "dangling.json").symlink_to(tmp_path / "nowhere.json")
    for name, fragment in [
        ("dir", "it is a directory"),
        ("to_dir.json", "it is a directory"),
        ("dangling.json", "No such file or directory"),
        ("missing.json", "No such file or directory"),
    ]:
        _repro_and_export(tmp_path, capsys, tmp_path / name, "cannot read case file", fragment)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "case.json"
    os.mkfifo(fifo)
    cmd = [sys.executable, "-c", "from attnfuzz.harness.cli import main; raise SystemExit(main())"]
    done = subprocess.run(
        [*cmd, "repro", str(fifo)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr


def test_a_good_case_file_still_replays(tmp_path, capsys):
    path = _write(tmp_path / "ok.json", _doc())
    assert main(["repro", str(path)]) == 0
    assert "PASS" in capsys.readouterr().out


# -- 2. messages -----------------------------------------------------------------


def test_one_line_escapes_and_bounds():
    assert one_line("plain é text") == "plain é text"
    # line breaks are whitespace (one space), other control characters escaped
    assert one_line("a\nb\x1b[2J\x07\u2028\ud800") == "a b\\x1b[2J\\x07 \\ud800"
    assert one_line(" a \t\r\n  b\x0b\x85") == " a b"
    assert one_line("\n a\n") == "a"
    # runs of plain spaces stay: an indented, aligned line keeps its layout
    assert one_line("  v2 FULL       decode  fails") == "  v2 FULL       decode  fails"
    assert one_line("\x7f\xad\ufffe") == "\\x7f\\xad\\ufffe"  # XML cannot hold the last
    cut = one_line("x" * 10_000, 500)
    assert len(cut) == 500 and cut.endswith("...")
    assert len(one_line("\x00" * 10_000, 50)) == 50


def test_usage_errors_print_one_bounded_printable_line(tmp_path, capsys):
    # A usage error that quotes its input: the path of a missing case file.
    missing = tmp_path / ("\x1b[2J\x1b]0;title\x07" + "a" * 200) / ("\n" + "b" * 200) / "c.json"
    assert main(["repro", str(missing)]) == 2
    err = _one_line_error(capsys, "cannot read case file", "\\x1b[2J")
    assert err.rstrip("\n").endswith("...") and "\x07" not in err


def test_argument_errors_are_one_bounded_printable_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["list", "\x1b]0;title\x07", "y" * 5000])
    assert exc.value.code == 2
    _one_line_error(capsys, "unrecognized arguments: \\x1b]0;title\\x07")
    with pytest.raises(SystemExit) as exc:
        main(["run", "--target", TARGET, "--max-examples", "many"])
    assert exc.value.code == 2
    _one_line_error(capsys, "run: argument --max-examples", "(see attnfuzz run --help)")


# -- 3. a closed stdout --------------------------------------------------------------


def _attnfuzz() -> str:
    exe = BIN / "attnfuzz"
    if not exe.exists():
        pytest.skip("the attnfuzz console script is not installed next to this interpreter")
    return str(exe)


def test_a_stdout_closed_early_is_no_traceback(tmp_path):
    read, write = os.pipe()
    os.close(read)  # nobody reads: the first write breaks the pipe
    try:
        done = subprocess.run(
            [_attnfuzz(), "list"], stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == "", done.stderr


def test_list_into_head_and_true(tmp_path):
    exe = shlex.quote(_attnfuzz())
    script = f"{exe} list | head -1; {exe} list --json | true; echo status ${{PIPESTATUS[0]}}"
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    lines = done.stdout.splitlines()
    # list opens with each engine's line (the installed release, or how to install it)
    from attnfuzz.harness import engines

    statuses = [engine.status() for engine in engines.engines().values()]
    assert len(lines) == 2 and lines[0] in (statuses or [lines[0]]), done.stdout
    assert lines[1] in ("status 0", "status 141")  # 0 only if it wrote before `true` exited
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


# -- 4. devices and dtypes ---------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "repro", "zoo"])
def test_unknown_devices_are_refused_before_any_work(tmp_path, capsys, command):
    case = _write(tmp_path / "ok.json", _doc())
    args = {
        "run": ["run", "--target", TARGET, "--out", str(tmp_path / "out")],
        "repro": ["repro", str(case)],
        "zoo": ["zoo", "--targets", TARGET, "--seeds", "1", "--out", str(tmp_path / "out")],
    }[command]
    assert main([*args, "--device", "bogus"]) == 2
    _one_line_error(capsys, "--device 'bogus': unknown device (known here: cpu")
    if not CUDA:
        assert main([*args, "--device", "cuda"]) == 2
        _one_line_error(capsys, "--device cuda: torch sees no CUDA device")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["run", "repro", "zoo"])
def test_bad_dtype_settings_are_refused_before_any_work(tmp_path, capsys, monkeypatch, command):
    case = _write(tmp_path / "ok.json", _doc())
    args = {
        "run": ["run", "--target", TARGET, "--out", str(tmp_path / "out")],
        "repro": ["repro", str(case)],
        "zoo": ["zoo", "--targets", TARGET, "--seeds", "1", "--out", str(tmp_path / "out")],
    }[command]
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "float64")
    assert main(args) == 2
    _one_line_error(capsys, "ATTNFUZZ_DTYPE='float64': expected one of float32, float16, bfloat16")
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "float16")
    assert main([*args, "--device", "cpu"]) == 2
    _one_line_error(capsys, "ATTNFUZZ_DTYPE='float16' needs a CUDA device")
    assert not (tmp_path / "out").exists()


def test_check_device_with_and_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.check_device("cpu") == "cpu"
    for name in ("cuda", "cuda:0", "gpu", "cpu:0", "CUDA", "cuda:-1", "cuda:x", ""):
        with pytest.raises(UsageError, match="--device"):
            devices.check_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert devices.known_devices() == ["cpu", "cuda", "cuda:0", "cuda:1"]
    assert [devices.check_device(n) for n in ("cuda", "cuda:1")] == ["cuda", "cuda:1"]
    with pytest.raises(UsageError, match=r"cuda:2: this machine has 2 CUDA device\(s\)"):
        devices.check_device("cuda:2")
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "bfloat16")
    assert devices.check_device("cuda:0") == "cuda:0"
    with pytest.raises(UsageError, match="needs a CUDA device"):
        devices.check_device("cpu")


# -- 5. the dtype a case file records -------------------------------------------------


def _finding(tmp_path: Path, name: str = "case.json", **changes) -> Path:
    verdict = Verdict([Mismatch("values", "x[0]", "1", "2")])
    doc = case_document(TARGET, "triton", hand_case((2, 2, 2), (5, 9, 3)), verdict)
    doc["settings"].update(changes)
    return write_case(tmp_path / name, doc)


def test_case_files_record_the_dtype_and_old_ones_read_as_float32(tmp_path, monkeypatch):
    verdict = Verdict([Mismatch("values", "x[0]", "1", "2")])
    case = hand_case((2, 2, 2), (5, 9, 3))
    assert case_document(TARGET, "triton", case, verdict)["settings"] == {"dtype": "float32"}
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "bfloat16")
    doc = case_document(TARGET, "triton", case, verdict, "cuda")
    assert doc["settings"] == {"dtype": "bfloat16"} and doc["case"] == case.to_dict()
    path = write_case(tmp_path / "bf16.json", doc)
    assert read_case(path)["settings"] == {"dtype": "bfloat16"}
    assert load_case(path)[2].dtype == "bfloat16"
    old = _write(tmp_path / "old.json", _doc())  # written before cases recorded a dtype
    assert read_case(old)["settings"] == {"dtype": "float32"}
    assert load_case(old)[2].dtype == "float32"


def test_replay_uses_the_recorded_dtype_not_the_environment(tmp_path, monkeypatch, capsys):
    path = _finding(tmp_path)
    monkeypatch.setenv("ATTNFUZZ_DTYPE", "bfloat16")
    target, impl, case, _ = load_case(path)
    assert case.dtype == "float32"
    err = capsys.readouterr().err
    assert err.startswith("attnfuzz: note: ATTNFUZZ_DTYPE=bfloat16 is not used") and (
        err.count("\n") == 1 and "float32" in err
    ), err
    assert target.make_inputs(case, "cpu").q.dtype == torch.float32
    assert target.judge(impl, case, "cpu").ok  # in float32 on the CPU, whatever the setting
    export_case(path, tmp_path / "out")  # exporting says nothing: the test embeds the dtype
    assert capsys.readouterr().err == ""


def test_a_reduced_precision_case_needs_cuda_on_replay(tmp_path, capsys):
    path = _finding(tmp_path, dtype="bfloat16")
    if CUDA:
        target, impl, case, _ = load_case(path)
        assert target.make_inputs(case, "cuda").q.dtype == torch.bfloat16
        return
    assert main(["repro", str(path)]) == 2
    _one_line_error(capsys, "the case's dtype 'bfloat16' needs a CUDA device")


def test_the_exported_test_embeds_the_dtype(tmp_path):
    source = export_case(_finding(tmp_path, dtype="bfloat16"), tmp_path / "out").read_text()
    assert '\nDTYPE = "bfloat16"\n' in source
    assert 'Case.from_dict({**CASE, "dtype": DTYPE})' in source


# -- 6. exported tests: ruff-clean, outside this project's own runs -------------------


def _ruff() -> str:
    exe = BIN / "ruff"
    if not exe.exists():
        pytest.skip("ruff is not installed next to this interpreter")
    return str(exe)


LONG = (
    "RuntimeError: the write-back of the decode rows "
    + "overwrote row 17 of the prefill block; " * 12
    + '\x1b[31m "quoted" \\ back\tslash\u2028é'
    + "x" * 300
)


def test_exported_files_pass_ruff_with_default_and_project_settings(tmp_path):
    out = tmp_path / "regressions"
    cases = {
        "long.json": Verdict([Mismatch("values", "logits[3, 17]", "1.0", LONG)]),
        "many.json": Verdict(
            [Mismatch("values" * 20, f"row {i}" * 30, "x" * 95, "y") for i in range(3)]
        ),
        "deep.json": Verdict([Mismatch("values", "x", "1", "2")]),
    }
    for name, verdict in cases.items():
        many = name == "many.json"
        case = hand_case((2,) * 40, tuple(range(40))) if many else hand_case((2,), (5,))
        doc = case_document(TARGET, "triton", case, verdict)
        if name == "deep.json":
            doc["derived"] = {"k" * 40: {"k" * 40: [[10**39, -(10**39), 1e308, "s" * 200]]}}
        path = export_case(write_case(tmp_path / name, doc), out)
        source = path.read_text()
        assert max(map(len, source.splitlines())) <= LINE, path
        values = {
            n.targets[0].id: ast.literal_eval(n.value)
            for n in ast.parse(source).body
            if isinstance(n, ast.Assign)
        }
        assert values["FOUND"] == json.loads(json.dumps(doc["verdict"]))
        assert values["DERIVED"] == doc["derived"]
    ruff = _ruff()
    settings = [["--isolated"], ["--isolated", "--line-length", "100"]]
    if (ROOT / "pyproject.toml").exists():  # this project's own settings
        settings.append(["--config", str(ROOT / "pyproject.toml")])
    for extra in settings:
        for check in (["check"], ["format", "--check", "--diff"]):
            done = subprocess.run([ruff, *check, *extra, str(out)], capture_output=True, text=True)
            assert done.returncode == 0, (check, extra, done.stdout + done.stderr)


@pytest.mark.parametrize("seed", range(5))
def test_literals_stay_within_the_line_and_read_back(seed):
    import random

    rng = random.Random(seed)
    alphabet = "ab \t\n\\\"'\x00\x1b\u2028é\U0001f600"

    def value(depth: int):
        kind = rng.randrange(6 if depth < 5 else 3)
        if kind == 0:
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(300)))
        if kind == 1:
            return rng.choice([10**39, -1, 0.1, 1e308, True, None])
        if kind == 2:
            return rng.randrange(10**6)
        if kind in (3, 4):
            return [value(depth + 1) for _ in range(rng.randrange(6))]
        return {"k" * rng.randrange(41): value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(20):
        data = {"top": value(1)}
        text = "FOUND = " + _literal(data, 0, 8)
        assert max(map(len, text.splitlines())) <= LINE, text
        assert ast.literal_eval(text.partition(" = ")[2]) == data


def test_exporting_prints_the_interpreter_that_has_attnfuzz(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(_finding(tmp_path)), "-o", str(out)]) == 0
    (path,) = out.glob("*.py")
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"wrote {path}",
        f"run: {shlex.quote(sys.executable)} -m pytest {shlex.quote(str(path))}",
    ]


@pytest.mark.skipif(not (ROOT / "pyproject.toml").exists(), reason="not a checkout")
def test_this_projects_pytest_and_ruff_skip_exported_tests(tmp_path):
    """A failing test exported into tests/regressions of a checkout breaks neither its
    pytest run nor its ruff run; naming the file still runs it."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests" / "regressions").mkdir(parents=True)
    (tmp_path / "tests" / "test_ok.py").write_text("def test_ok():\n    pass\n")
    exported = tmp_path / "tests" / "regressions" / "test_exported.py"
    exported.write_text("def test_exported():\n    assert False  " + "#" * 200 + "\n")
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist"]
    done = subprocess.run(pytest_cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    done = subprocess.run(
        [*pytest_cmd, str(exported)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout + done.stderr
    for check in (["check"], ["format", "--check"]):
        done = subprocess.run([_ruff(), *check, "."], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "tests/regressions/" in (ROOT / ".gitignore").read_text().splitlines()


# -- 7. budgets are durations, one syntax for every command ----------------------------


def test_zoo_budgets_are_durations_as_campaign_s(capsys):
    from attnfuzz.harness.cli.dispatch import build_parser

    parser = build_parser()
    for text, want in (("10", 10.0), ("90s", 90.0), ("1m", 60.0), ("1h30m", 5400.0)):
        for command in ("zoo", "campaign"):
            assert parser.parse_args([command, "--budget", text]).budget == want
        assert parser.parse_args(["zoo", "--shrink-budget", text]).shrink_budget == want
    for bad in ("inf", "nan", "0", "soon"):
        with pytest.raises(SystemExit) as exc:
            main(["zoo", "--budget", bad])
        assert exc.value.code == 2
        _one_line_error(capsys, "zoo: argument --budget: expected a ", "duration")
