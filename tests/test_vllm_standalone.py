"""``attnfuzz export --standalone`` of vLLM's two findings of bug A's write-back
(docs/findings.md: ``vllm-rocm``, ``vllm-deepseek-v41-amd``): a script that needs only
vLLM and torch, run here where attnfuzz cannot be imported.

No vLLM release fixes these lines yet, so "the first fixed release" is stood for by
the installed one with #39542's slice applied to the one file each finding is in: the
installed package's files linked into a tree (``cp -rs``), that file written out with
the fixed line, the tree first on the script's path."""

from __future__ import annotations

from pathlib import Path

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm, run_without_attnfuzz, vllm_with_lines
from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.oracle import Verdict
from attnfuzz.reference.batch import Batch, Case, EngineConfig

pytestmark = requires_vllm

# The witness of docs/findings.md (seed 0): one request of 2 tokens (next_n = 2) padded
# to the graph of 4, d = [2, 0].
CONFIG = EngineConfig(
    max_model_len=8,
    max_num_seqs=2,
    max_num_batched_tokens=4,
    block_size=1,
    num_spec=1,
    cudagraph_capture_sizes=(4,),
    topk=1,
    num_heads=1,
    head_dim=1,
)
WITNESS = Case(CONFIG, Batch((0,), (2,), seed=0, use_cudagraph=True))
EAGER = Case(CONFIG, Batch((0,), (2,), seed=0, use_cudagraph=False))  # not padded

# The line each finding's file still has, and #39542's slice in its place.
FILES = {
    "vllm-rocm": (
        "v1/attention/ops/rocm_aiter_mla_sparse.py",
        "topk_indices_buffer[:num_decode_tokens, : topk_indices.shape[-1]] = (",
        "topk_indices_buffer[: topk_indices.shape[0], : topk_indices.shape[-1]] = (",
    ),
    "vllm-deepseek-v41-amd": (
        "models/deepseek_v41/amd/ops/sparse_indexer.py",
        "topk_indices_buffer[:num_decode_tokens, : unpacked.shape[-1]] = unpacked",
        "topk_indices_buffer[: unpacked.shape[0], : unpacked.shape[-1]] = unpacked",
    ),
}
IMPLS = list(FILES)
ERROR = "The expanded size of the tensor (4) must match the existing size (2)"


def _export(tmp_path: Path, case: Case, implementation: str) -> Path:
    doc = case_document("indexer-decode", implementation, case, Verdict())
    path = write_case(tmp_path / f"{implementation}.json", doc)
    script = tmp_path / "repro.py"
    assert main(["export", "--standalone", str(path), "-o", str(script)]) == 0
    source = script.read_text()
    assert "import attnfuzz" not in source and "from attnfuzz" not in source
    return script


@pytest.fixture(scope="module")
def fixed_tree(tmp_path_factory) -> Path:
    """The installed vLLM, linked, with #39542's slice in both files."""
    changes = {file: (line, fixed) for file, line, fixed in FILES.values()}
    return vllm_with_lines(tmp_path_factory.mktemp("vllm-fixed"), changes)


@pytest.mark.parametrize("implementation", IMPLS)
def test_standalone_shows_the_writeback_failure_on_the_witness(tmp_path, implementation):
    """The witness: the installed glue fails at the write-back (exit 1); the same glue
    with #39542's slice writes the two real rows."""
    done = run_without_attnfuzz(_export(tmp_path, WITNESS, implementation))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "decode_lens [2, 0] (2 real decode tokens), requires_padding True" in out, out
    assert f"as installed: RuntimeError: {ERROR}" in out, out
    assert "with #39542's slice: topk_indices_buffer[:2] = [[" in out, out


@pytest.mark.parametrize("implementation", IMPLS)
def test_standalone_passes_a_step_without_padding(tmp_path, implementation):
    """The same request run eagerly (no graph, no padding request): the installed glue
    writes its rows and the script exits 0."""
    done = run_without_attnfuzz(_export(tmp_path, EAGER, implementation))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "requires_padding False" in out, out
    assert "RuntimeError" not in out, out


@pytest.mark.parametrize("implementation", IMPLS)
def test_standalone_passes_the_witness_on_the_fixed_glue(tmp_path, fixed_tree, implementation):
    """The witness, against the glue with #39542's slice (the tree above): no failure,
    the script finds no line to change and exits 0."""
    done = run_without_attnfuzz(_export(tmp_path, WITNESS, implementation), fixed_tree)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "as installed: topk_indices_buffer[:2] = [[" in out, out
    assert "nothing to change" in out and "RuntimeError" not in out, out


def test_standalone_refuses_a_step_with_prefills(tmp_path, capsys):
    """The defect is in the decode branch of a decode-only step: a case with prefill
    tokens is refused (exit 2), not written as a script that shows something else."""
    case = Case(CONFIG, Batch((0, 0), (1, 3), seed=0, use_cudagraph=False))
    doc = case_document("indexer-decode", "vllm-rocm", case, Verdict())
    path = write_case(tmp_path / "prefill.json", doc)
    assert main(["export", "--standalone", str(path), "-o", str(tmp_path / "r.py")]) == 2
    assert "prefill tokens" in capsys.readouterr().err
    assert not (tmp_path / "r.py").exists()
