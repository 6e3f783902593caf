"""``attnfuzz export --standalone``: a finding on engine code as a script that needs only
the engine and torch, run here where attnfuzz cannot be imported."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.oracle import Mismatch, Verdict
from attnfuzz.harness.targets import mla_block_table as t
from attnfuzz.reference.batch import Batch

pytestmark = requires_sglang

# Runs the script with attnfuzz unimportable (-I: neither the checkout nor PYTHONPATH
# on the path). Where no GPU is, SGLang imports torchvision at load, whose only wheel
# for this torch is a CUDA build: an empty package answers it, after transformers has
# recorded it as absent (attnfuzz's own CPU set-up does the same).
BOOT = """\
import importlib.abc, importlib.machinery, runpy, sys, types
sys.modules["attnfuzz"] = None
import torch
if not torch.cuda.is_available():
    import transformers.utils.import_utils

    class Empty(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            def attribute(name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return type(name, (), {})
            module.__getattr__ = attribute
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Empty())
script = sys.argv[1]
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
"""

SHAPE = Verdict([Mismatch("shape", "block_kv_indices", "[1, at least 129]", "[1, 128]")])


def _export(tmp_path: Path, case, implementation: str, verdict: Verdict = SHAPE) -> list[str]:
    doc = case_document("mla-block-table", implementation, case, verdict)
    path = write_case(tmp_path / f"{implementation}.json", doc)
    return ["export", "--standalone", str(path), "-o", str(tmp_path / "repro.py")]


def _run_without_attnfuzz(script: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-c", BOOT, str(script)],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.parametrize(
    ("seq_len", "wrong"),
    [(t.SGLANG_CONTEXT_LEN - 3, True), (100, False)],
    ids=["witness", "short"],
)
def test_standalone_trtllm_mla_context_len_shows_the_wrong_width(tmp_path, seq_len, wrong):
    """The witness (KV 4097 tokens in pages of 32: 129 pages) shows the 128-page row and
    exits 1; a short request fits its row and the script exits 0."""
    witness = t.smallest_kv_past_context()
    case = dataclasses.replace(witness, batch=Batch((seq_len,), (1,), seed=2))
    assert main(_export(tmp_path, case, "sglang-trtllm-mla-context-len")) == 0
    script = tmp_path / "repro.py"
    source = script.read_text()
    assert "import attnfuzz" not in source and "from attnfuzz" not in source
    done = _run_without_attnfuzz(script)
    assert done.returncode == (1 if wrong else 0), done.stdout + done.stderr
    # The forward's seq_len (the committed tokens and the query's one) and the N verified.
    kv = seq_len + 1 + witness.config.num_spec + 1
    pages = -(-kv // 32)
    line = (
        f"request 0: block_kv_indices row width: 128 pages; the request's KV of {kv} tokens "
        f"needs {pages} pages of 32"
    )
    assert line in done.stdout, done.stdout + done.stderr
    assert ("too narrow" in done.stdout) == wrong


@pytest.mark.parametrize(
    ("seq_len", "wrong"),
    [(t.FLASHMLA_CONTEXT_LEN - 2, True), (t.FLASHMLA_CONTEXT_LEN - 3, False)],
    ids=["witness", "fits"],
)
def test_standalone_flashmla_context_len_shows_the_wrong_width(tmp_path, seq_len, wrong):
    """FlashMLA's witness (a verified KV of 4097 tokens: 65 pages of 64) shows the 64-page
    row and exits 1; one token shorter (4096) fits its row and the script exits 0."""
    witness = t.smallest_kv_past_flashmla_table()
    case = dataclasses.replace(witness, batch=Batch((seq_len,), (1,), seed=4))
    verdict = Verdict([Mismatch("shape", "block_kv_indices", "[1, at least 65]", "[1, 64]")])
    assert main(_export(tmp_path, case, "sglang-flashmla-context-len", verdict)) == 0
    script = tmp_path / "repro.py"
    source = script.read_text()
    assert "import attnfuzz" not in source and "from attnfuzz" not in source
    done = _run_without_attnfuzz(script)
    assert done.returncode == (1 if wrong else 0), done.stdout + done.stderr
    kv = seq_len + 1 + witness.config.next_n
    line = (
        f"request 0: block_kv_indices row width: 64 pages; the request's KV of {kv} tokens "
        f"needs {-(-kv // 64)} pages of 64"
    )
    assert line in done.stdout, done.stdout + done.stderr
    assert ("too narrow" in done.stdout) == wrong
