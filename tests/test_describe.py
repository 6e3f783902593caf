"""The commands that print the registry: ``attnfuzz describe TARGET`` (each target's
inputs and outputs, read off its dataclasses) and the layout of ``attnfuzz list``."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from attnfuzz.harness.cli import main
from attnfuzz.harness.cli.describe import describe_dataclass
from attnfuzz.harness.registry import target_names

ROOT = Path(__file__).resolve().parent.parent


def reference_classes(target: str) -> tuple[type, type]:
    """The target's ``...Inputs`` and ``...Outputs``, found by the reference modules'
    naming (not by describe's own lookup, which this checks)."""
    try:
        module = importlib.import_module(f"attnfuzz.reference.{target.replace('-', '_')}")
    except ModuleNotFoundError:
        pytest.skip(f"{target} is not a built-in target: no reference module to read")
    found = []
    for suffix in ("Inputs", "Outputs"):
        classes = [
            c
            for name, c in vars(module).items()
            if name.endswith(suffix) and dataclasses.is_dataclass(c)
            if c.__module__ == module.__name__
        ]
        assert len(classes) == 1, (target, suffix, classes)
        found += classes
    return found[0], found[1]


def section(text: str, title: str, cls: type) -> str:
    """The lines of ``describe``'s text from ``TITLE: module.Class`` to the next blank title."""
    head = f"{title}: {cls.__module__}.{cls.__qualname__}\n"
    assert head in text, text
    rest = text.split(head, 1)[1]
    return rest.split("\noutputs: ", 1)[0] if title == "inputs" else rest


@pytest.mark.parametrize("target", target_names())
def test_describe_prints_every_field_of_both_dataclasses(target, capsys):
    inputs, outputs = reference_classes(target)
    assert main(["describe", target]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{target}: ")
    for title, cls in (("inputs", inputs), ("outputs", outputs)):
        rows = section(text, title, cls)
        for f in dataclasses.fields(cls):  # a row of its own, first column
            assert re.search(rf"^{re.escape(f.name)}\s", rows, re.M), (title, f.name, rows)
    assert main(["describe", target, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == target
    for key, cls in (("inputs", inputs), ("outputs", outputs)):
        assert doc[key]["class"] == f"{cls.__module__}.{cls.__qualname__}"
        names = [f["name"] for f in doc[key]["fields"] if not f["is_property"]]
        assert names == [f.name for f in dataclasses.fields(cls)], key


def test_an_unknown_target_is_one_usage_line(capsys):
    assert main(["describe", "no-such-target"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "unknown target 'no-such-target'" in err and "max-seq-len" in err


def test_dtypes_shapes_symbols_and_views_come_from_the_field_comments(capsys):
    assert main(["describe", "max-seq-len", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    fields = {f["name"]: f for f in doc["inputs"]["fields"]}
    bound = fields["seq_lens_cpu_upper_bound"]  # int32 [R_pad] on the host, fresh: ...
    assert (bound["type"], bound["dtype"], bound["shape"]) == ("tensor", "int32", "[R_pad]")
    assert fields["kv_cache"]["dtype"] == "float32"  # written fp32
    assert doc["symbols"]["R_pad"] == "num_reqs" and doc["symbols"]["R"] == "num_real_reqs"
    assert doc["views"] == {}  # no output of max-seq-len lives in persistent memory

    assert main(["describe", "flatten-decode", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["views"]["context_lens"] == "buffers.context_lens"
    buffers = next(f for f in doc["inputs"]["fields"] if f["name"] == "buffers")
    assert [f["name"] for f in buffers["fields"]][0] == "buffers.context_lens"  # nested, expanded
    assert main(["describe", "flatten-decode"]) == 0
    text = capsys.readouterr().out
    assert "must be views of persistent memory: context_lens (of buffers.context_lens)" in text

    assert main(["describe", "unpadding"]) == 0  # a shape is data, not rich markup
    assert "[max_num_seqs + 1]" in capsys.readouterr().out


@dataclass
class _Page:
    ids: torch.Tensor  # int64 [P]: page ids


@dataclass
class _Contract:
    """A contract written each way describe reads a field."""

    lens: torch.Tensor  # [B, L], int32, a contiguous view of the workspace
    # the decodes, as the engine counts them
    count: int
    """B: decodes."""
    pages: list[_Page] = dataclasses.field(default_factory=list)
    scale: float | None = None  # fmt: skip

    @property
    def total(self) -> int:
        """Tokens of all decodes.

        Not read by the oracle."""
        return 0


def test_fields_are_read_from_comments_docstrings_and_notes():
    rows = {f.name: f for f in describe_dataclass(_Contract).fields}
    assert list(rows) == ["lens", "count", "pages", "scale", "total"]
    lens = rows["lens"]
    assert (lens.dtype, lens.shape, lens.view_of) == ("int32", "[B, L]", "the workspace")
    count = rows["count"]
    assert (count.type, count.doc) == ("int", "B: decodes.")
    assert count.note == "the decodes, as the engine counts them"
    pages = rows["pages"]
    assert pages.type == "list[_Page]" and pages.default == "list()"
    assert [(f.name, f.dtype, f.shape) for f in pages.fields] == [("pages[].ids", "int64", "[P]")]
    assert rows["scale"].doc == "" and rows["scale"].type == "float | None"  # a pragma is no doc
    total = rows["total"]
    assert total.is_property and total.type == "int" and total.doc == "Tokens of all decodes."


# -- attnfuzz list -----------------------------------------------------------------


def test_list_columns_line_up_in_a_pipe(capsys):
    assert main(["list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert main(["list"]) == 0  # captured: not a tty
    lines = capsys.readouterr().out.splitlines()
    assert not any("\x1b" in line or line != line.rstrip() for line in lines)
    kind_at, description_at = set(), set()
    for row in rows:
        at = lines.index(f"{row['target']}: {row['summary']}")
        for line, impl in zip(lines[at + 1 :], row["implementations"], strict=False):
            assert line.startswith(f"  {impl['name']} "), (line, impl)  # one line each, in order
            kind = line.index(f" {impl['kind']} ", 2 + len(impl["name"])) + 1
            after = line[kind + len(impl["kind"]) :]
            kind_at.add(kind)
            description_at.add(len(line) - len(after.lstrip()))
            assert after.strip().startswith(impl["description"])  # never wrapped
    assert len(kind_at) == 1 and len(description_at) == 1, (kind_at, description_at)


def test_the_vllm_install_hint_names_the_checkout_and_the_pip_forms(monkeypatch):
    vllm = pytest.importorskip("attnfuzz.adapters.vllm")  # the vLLM plugin, not vLLM
    monkeypatch.setattr(vllm, "installed_version", lambda: None)
    reason = vllm.unavailable()
    assert reason is not None and "\n" not in reason
    assert f"{vllm.INSTALL} in a checkout" in reason
    assert f"pip install --no-deps -r {shlex.quote(str(vllm.REQUIREMENTS))}" in reason
    assert f"vllm=={vllm.VERSION}" in vllm.REQUIREMENTS.read_text().splitlines()
    # The pinned list is package data, so that a pip install has the file the hint names.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]
    shipped = package_data["attnfuzz.adapters.vllm"]
    assert vllm.REQUIREMENTS.name in shipped and "install.sh" in shipped
    lists = sorted(p.name for p in vllm.REQUIREMENTS.parent.glob("requirements-cpu*.txt"))
    assert set(lists) <= set(shipped), "a release range's pinned list is not package data"
