"""benchmarks/surface.py without the engines: its rules on a small fake package, its
counting and its JSON document.

The script itself runs every engine implementation under coverage.py; here the
package it parses is written in a temporary directory and coverage's report is
stood in, so that what it selects and how it counts is what is checked.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A package laid out as an engine's: a base builder, subclasses of it in other
# modules (one only through another subclass), look-alikes that are not.
FAKE = {
    "attention/backend.py": """
        from abc import ABC
        from typing import Generic, TypeVar

        M = TypeVar("M")

        class AttentionMetadataBuilder(ABC, Generic[M]):
            def build(self, common):
                return common

        def split_decodes(query_start_loc):
            return query_start_loc[1:] - query_start_loc[:-1]

        def unrelated(x):
            return x + 1
        """,
    "attention/backends/flash.py": """
        from attention import backend

        class FlashBuilder(backend.AttentionMetadataBuilder["FlashMetadata"]):
            def build(self, common):
                '''The metadata.'''
                if common.max_seq_len > 0:
                    return common
                return None

            def _helper(self):
                def inner():
                    return 1
                return inner()

        class FlashImpl:
            def forward(self, attn_metadata):
                return attn_metadata
        """,
    "other/mla.py": """
        from attention.backends.flash import FlashBuilder

        class MLABuilder(FlashBuilder):
            def build_for_cudagraph_capture(self, common):
                return self.build(common)

        class Lookalike(Other):
            def build(self):
                return 0
        """,
    "runner.py": """
        import typing

        if typing.TYPE_CHECKING:
            def typed(block_table): ...

        class Runner:
            def prepare(self):
                def fill(slot_mapping):
                    return slot_mapping
                return fill

            def sample(self, logits):
                return logits.argmax()
        """,
    # A runner and the modules it imports: one directly, one through another
    # (relatively, inside a function), one by ``from package import module``;
    # a module of the same directory it never imports.
    "worker/model_runner.py": """
        from fake.worker.input_prep import prepare

        def step(batch):
            from fake.worker import padding
            return padding.pad(prepare(batch).query_start_loc)
        """,
    "worker/input_prep.py": """
        def prepare(batch):
            from .slots import fill
            return fill(batch.slot_mapping)
        """,
    "worker/slots.py": """
        def fill(slot_mapping):
            return slot_mapping

        def log(message):
            return message
        """,
    "worker/padding.py": """
        def pad(seq_lens):
            return seq_lens
        """,
    "worker/unused.py": """
        def other(block_table):
            return block_table
        """,
    "layers/backend.py": """
        class AttentionBackend:
            def init_forward_metadata(self, batch): ...

        class TritonBackend(AttentionBackend):
            def init_cuda_graph_state(self, n):
                return n

            def init_forward_metadata_out_graph(self, batch):
                return batch

            def forward_decode(self, q, forward_metadata):
                return q
        """,
}


@pytest.fixture(scope="module")
def surface():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts' shared modules, as when run
    spec = importlib.util.spec_from_file_location("surface", ROOT / "benchmarks/surface.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["surface"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules["surface"]
    sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "fake"
    for name, text in FAKE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def names(functions) -> set[str]:
    return {f.name.removeprefix("fake/") for f in functions}


def test_the_builder_rule_takes_every_method_of_the_base_and_its_subclasses(surface, package):
    clause = surface.Select("class", ("**/*.py",), base="AttentionMetadataBuilder")
    assert names(surface.select(surface.Source(package), clause)) == {
        "attention/backend.py:AttentionMetadataBuilder.build",
        "attention/backends/flash.py:FlashBuilder.build",
        "attention/backends/flash.py:FlashBuilder._helper",  # its nested inner() is its lines
        # A subclass of a subclass, in a module that never names the base.
        "other/mla.py:MLABuilder.build_for_cudagraph_capture",
    }


def test_a_method_name_filter_keeps_the_metadata_and_graph_methods(surface, package):
    clause = surface.Select(
        "class", ("layers/*.py",), base="AttentionBackend", names=("metadata", "graph")
    )
    assert names(surface.select(surface.Source(package), clause)) == {
        "layers/backend.py:AttentionBackend.init_forward_metadata",
        "layers/backend.py:TritonBackend.init_cuda_graph_state",
        "layers/backend.py:TritonBackend.init_forward_metadata_out_graph",
    }


def test_the_refs_rule_takes_the_functions_that_name_metadata(surface, package):
    source = surface.Source(package)
    everywhere = surface.Select("refs", ("runner.py",))
    assert names(surface.select(source, everywhere)) == {
        "runner.py:typed",  # under `if TYPE_CHECKING:`, by its argument
        "runner.py:Runner.prepare",  # by its nested function's argument
    }
    module_level = surface.Select("refs", ("attention/**/*.py",), module_only=True)
    assert names(surface.select(source, module_level)) == {"attention/backend.py:split_decodes"}


def test_the_imports_rule_follows_the_runners_imports_inside_its_package(surface, package):
    clause = surface.Select(
        "imports", ("worker/model_runner.py",), within=("worker/input_prep.py", "worker/slots.py")
    )
    assert names(surface.select(surface.Source(package), clause)) == {
        "worker/model_runner.py:step",
        "worker/input_prep.py:prepare",
        "worker/slots.py:fill",  # reached through input_prep's relative import
    }  # padding.py is imported but outside `within`; unused.py is never imported
    inside = surface.Select("imports", ("worker/model_runner.py",), within=("worker/*.py",))
    assert "worker/padding.py:pad" in names(surface.select(surface.Source(package), inside))
    assert "worker/unused.py:other" not in names(surface.select(surface.Source(package), inside))


def test_a_function_is_in_the_first_part_that_selects_it_and_missing_files_are_absent(
    surface, package
):
    parts = (
        surface.Part("builders", (surface.Select("class", ("**/*.py",), base="FlashBuilder"),)),
        surface.Part("backends", (surface.Select("every", ("attention/backends/*.py",)),)),
        surface.Part("missing", (surface.Select("every", ("nowhere/*.py",)),)),
    )
    found = surface.surface(package, parts)
    assert names(found["builders"]) == {
        "attention/backends/flash.py:FlashBuilder.build",
        "attention/backends/flash.py:FlashBuilder._helper",
        "other/mla.py:MLABuilder.build_for_cudagraph_capture",
    }
    assert names(found["backends"]) == {"attention/backends/flash.py:FlashImpl.forward"}
    assert found["missing"] is None


def test_a_function_counts_its_body_lines_and_the_branches_leaving_them(surface, package):
    source = surface.Source(package)
    clause = surface.Select("class", ("attention/backends/*.py",), base="FlashBuilder")
    build = next(f for f in surface.select(source, clause) if f.name.endswith(".build"))
    # The module's lines: class (4), def (5), docstring (6), if (7), return (8), return (9).
    assert (build.first, build.last) == (6, 9)
    report = {  # coverage's JSON report of the file, as far as the count reads it
        "executed_lines": [2, 4, 5, 7, 8, 11],
        "missing_lines": [9, 12],
        "executed_branches": [[7, 8]],
        "missing_branches": [[7, 9], [12, -11]],
    }
    assert surface.count(build, report) == surface.Count(
        lines=3, lines_run=2, branches=2, branches_run=1
    )
    assert surface.count(build, {}) == surface.Count()  # a file coverage never reported


def test_the_json_document_has_the_published_schema(surface, tmp_path: Path):
    Count = surface.Count
    result = surface.EngineResult(
        "vllm",
        "0.33.0",
        {
            "builders": {"a.py:B.build": Count(10, 4, 6, 2), "a.py:B.other": Count(5, 0, 2, 0)},
            "drafters": {"b.py:f": Count(3, 3, 0, 0)},
            "graph-runner": None,  # absent in this release
        },
    )
    path = tmp_path / "surface.json"
    surface.write_json(path, [result])
    doc = json.loads(path.read_text())
    keys = {"lines_run", "lines", "branches_run", "branches"}
    assert set(doc) == {"vllm"}
    engine = doc["vllm"]
    assert set(engine) == keys | {"parts", "builders"}
    assert {k: engine[k] for k in keys} == {
        "lines_run": 7,
        "lines": 18,
        "branches_run": 2,
        "branches": 8,
    }
    assert set(engine["parts"]) == {"builders", "drafters", "graph-runner"}
    for part in engine["parts"].values():
        assert set(part) == keys | {"functions"}
    builders = engine["parts"]["builders"]
    assert builders["functions"] == {"a.py:B.build": 4, "a.py:B.other": 0}
    assert (builders["lines_run"], builders["lines"]) == (4, 15)
    # The first part's classes, each with whether it ran (no import verdict: it imports).
    assert engine["builders"] == {
        "a.py:B": {"lines_run": 4, "lines": 15, "branches_run": 2, "branches": 8,
                   "driven": "driven"},
    }  # fmt: skip
    assert engine["parts"]["graph-runner"] == {
        "lines_run": 0,
        "lines": 0,
        "branches_run": 0,
        "branches": 0,
        "functions": {},
    }


def test_the_tables_say_absent_and_the_rules_fit_a_markdown_cell(surface):
    Count = surface.Count
    result = surface.EngineResult(
        "sglang", "0.5.23", {"backends": {"x.py:f": Count(4, 0, 0, 0)}, "spec-runners": None}
    )
    text = surface.parts_table(result)
    assert "absent" in text.splitlines()[3] and "0/4" in text.splitlines()[2]
    assert surface.not_run(result, 5) == ["`x.py:f` (backends, 4 lines)"]
    for engine, parts in surface.SURFACE.items():
        assert engine in surface.NAMES
        for part in parts:
            for clause in part.clauses:
                assert "|" not in clause.describe(engine), part.name
                assert not any(g.startswith("/") for g in clause.files)


def test_each_builder_that_runs_no_line_says_why(surface):
    """A builder (a class of the first part) that ran is driven; one that did not either
    does not import here (the error, one line, no path of this machine) or imports and
    no implementation drives it; the summary counts the ones that import."""
    Count = surface.Count
    result = surface.EngineResult(
        "vllm",
        "0.33.0",
        {
            "builders": {
                "vllm/a.py:Ran.build": Count(4, 2, 0, 0),
                "vllm/a.py:Idle.build": Count(6, 0, 0, 0),
                "vllm/b/c.py:Vendor.build": Count(9, 0, 0, 0),
            },
            "drafters": {"vllm/d.py:f": Count(3, 3, 0, 0)},
        },
        imports={"vllm.a": None, "vllm.b.c": "ModuleNotFoundError: No module named 'aiter'"},
    )
    assert set(result.builders()) == {"vllm/a.py:Ran", "vllm/a.py:Idle", "vllm/b/c.py:Vendor"}
    rows = surface.builders_table(result).splitlines()[2:]
    assert "`b/c.py:Vendor`" in rows[0] and "does not import: ModuleNotFoundError" in rows[0]
    assert "`a.py:Idle`" in rows[1] and "imports; no implementation drives it" in rows[1]
    assert "`a.py:Ran`" in rows[2] and "driven" in rows[2]
    assert surface.builders_summary(result) == "1 of the 2 that import here run (3 in all)."
    assert surface.module_of("vllm/v1/attention/backends/flash_attn.py:B.build") == (
        "vllm.v1.attention.backends.flash_attn"
    )
    assert surface.module_of("sglang/srt/layers/__init__.py:f") == "sglang.srt.layers"
    error = (
        "ImportError: cannot import name 'f' from 'vllm.x' "
        "(/somewhere/venv/lib/python3.11/site-packages/vllm/x.py)"
    )
    assert surface.one_line(error) == "ImportError: cannot import name 'f' from 'vllm.x' vllm/x.py"
    assert "/" not in surface.one_line("OSError: /home/someone/lib.so: cannot open")
    assert len(surface.one_line("E: " + "x" * 300)) == 100


def test_the_command_written_to_the_docs_names_no_output_file(surface):
    argv = ["--examples", "50", "--json", "out.json", "--markdown", "docs/surface.md"]
    assert surface.reader_command(argv) == "python benchmarks/surface.py --examples 50"
    assert surface.reader_command(["--json=x.json"]) == "python benchmarks/surface.py"


def test_a_module_imports_or_not_whatever_failed_before_it(surface, tmp_path, monkeypatch):
    """A package whose ``__init__`` raises after loading a submodule leaves that
    submodule behind; a module importing it later is still reported as not importing
    (as vLLM's ``flashattn_mla_sparse`` after another module's failed import of
    ``vllm.vllm_flash_attn``), and a module that imports stays imported."""
    pkg = tmp_path / "fa_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from fa_pkg.interface import kernel\nraise ImportError('no CUDA extension')\n"
    )
    (pkg / "interface.py").write_text("def kernel():\n    pass\n")
    (tmp_path / "first_user.py").write_text("import fa_pkg\n")
    (tmp_path / "second_user.py").write_text("from fa_pkg.interface import kernel\n")
    (tmp_path / "plain.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ["first_user", "second_user", "plain", "fa_pkg", "fa_pkg.interface"]
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    verdicts = surface.import_each(["first_user", "second_user", "plain"])
    assert verdicts == {
        "first_user": "ImportError: no CUDA extension",
        "second_user": "ImportError: no CUDA extension",
        "plain": None,
    }
    assert "plain" in sys.modules and "fa_pkg.interface" not in sys.modules
    for name in names:
        sys.modules.pop(name, None)


def test_a_run_that_meets_its_engines_declared_defect_says_so(surface, monkeypatch):
    """An engine implementation that fails on a defect its engine declares for the
    installed release is tabled as failing on that defect, not as an unexplained
    failure; any other failure stays ``FAILED``."""
    from attnfuzz.harness import engines
    from attnfuzz.harness.engines import ShippedBug

    bug = ShippedBug("ref-1", "runner-step", "sglang-fa3", "0.5.23", None, "a defect")
    sglang = engines.get("sglang")  # declared by attnfuzz's plugin, installed or not

    def shipped_bug(self, target: str, impl: str) -> ShippedBug | None:
        return bug if impl == "sglang-fa3" else None

    monkeypatch.setattr(type(sglang), "shipped_bug", shipped_bug)
    assert surface._shipped_bug("runner-step", "sglang-fa3") is bug
    assert surface._shipped_bug("runner-step", "sglang-wave") is None
    assert surface._shipped_bug("runner-step", "triton") is None  # not an engine's
