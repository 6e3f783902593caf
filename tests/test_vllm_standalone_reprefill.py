"""``attnfuzz export --standalone`` of the multi-module MTP drafter's re-prefill below
position 0 (docs/findings.md: ``vllm-mtp-modules-reprefill-before-prompt``): a script of
a runner-step trace that needs only vLLM and torch, run here where attnfuzz cannot be
imported.

No vLLM release bounds the re-prefill yet, so "the first fixed release" is stood for by
the installed one with the kernel's re-prefill count bounded by the tokens before the
query: the installed package's files linked into a tree (``cp -rs``), the speculator's
file written out with that line, the tree first on the script's path."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from attnfuzz.adapters.vllm.testing import requires_vllm, run_without_attnfuzz, vllm_with_lines
from attnfuzz.harness.casefile import case_document, write_case
from attnfuzz.harness.cli import main
from attnfuzz.harness.oracle import Verdict
from attnfuzz.reference.trace import Trace

pytestmark = requires_vllm

IMPL = "vllm-mtp-modules-reprefill-before-prompt"
FILE = "v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py"
# The bound a fix would add: no more re-prefilled tokens than the request has before its
# query (its first target position).
BOUNDED = (
    "num_reprefill_tokens = min(max(0, num_rejected - 1), "
    "tl.load(target_positions_ptr + query_start).to(tl.int32))"
)


def _smallest() -> Trace:
    from attnfuzz.adapters.vllm import runner_step_mtp_modules

    return runner_step_mtp_modules.smallest_reprefill_before_prompt()


def _two_rejected() -> Trace:
    """The smallest trace with two drafts rejected, not three: one token re-prefilled, at
    position 0 (every property holds on it)."""
    trace = _smallest()
    steps = list(trace.steps)
    steps[1] = dataclasses.replace(steps[1], rejected=(2,))
    steps[2] = dataclasses.replace(steps[2], num_computed_tokens=(3,))
    return dataclasses.replace(trace, steps=tuple(steps))


def _export(tmp_path: Path, trace: Trace) -> Path:
    path = write_case(tmp_path / "case.json", case_document("runner-step", IMPL, trace, Verdict()))
    script = tmp_path / "repro.py"
    assert main(["export", "--standalone", str(path), "-o", str(script)]) == 0
    source = script.read_text()
    assert "import attnfuzz" not in source and "from attnfuzz" not in source
    return script


@pytest.fixture(scope="module")
def bounded_tree(tmp_path_factory) -> Path:
    """The installed vLLM, linked, with the re-prefill count bounded."""
    from attnfuzz.adapters.vllm.standalone_reprefill import LINE

    return vllm_with_lines(tmp_path_factory.mktemp("vllm-bounded"), {FILE: (LINE, BOUNDED)})


def test_standalone_shows_a_draft_position_below_zero_on_the_witness(tmp_path):
    """The smallest trace: one token before a query of four, three rejected; the kernel
    as installed re-prefills two tokens, the first at position -1 (exit 1)."""
    done = run_without_attnfuzz(_export(tmp_path, _smallest()))
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "request 0: 1 tokens before a query of 4, 3 rejected: draft positions [-1, 0, 1]" in out
    assert "draft positions below 0 (request, position): [(0, -1)]" in out, out


def test_standalone_passes_two_rejected_drafts(tmp_path):
    """Two drafts rejected: one token re-prefilled, at position 0; the script exits 0."""
    done = run_without_attnfuzz(_export(tmp_path, _two_rejected()))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "2 rejected: draft positions [0, 1, 2]" in out, out


def test_standalone_passes_the_witness_with_the_reprefill_bounded(tmp_path, bounded_tree):
    """The witness against the kernel with the bound (the tree above): one token
    re-prefilled, at position 0, and the script exits 0."""
    done = run_without_attnfuzz(_export(tmp_path, _smallest()), bounded_tree)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "3 rejected: draft positions [0, 1]" in out, out
