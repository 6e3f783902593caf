"""For test suites that run vLLM's own code: skip, saying why, where vLLM is not installed.

CI installs vLLM (``ATTNFUZZ_VLLM=1 ./setup.sh``) and sets
``ATTNFUZZ_REQUIRE_VLLM=1``: there a missing vLLM fails these tests instead.
"""

from __future__ import annotations

import collections
import functools
import os
from typing import Any

import pytest
from attnfuzz.adapters.vllm import ENGINE, unavailable
from attnfuzz.harness.testing import require_variable

_REASON = unavailable()
if _REASON is not None and os.environ.get(require_variable(ENGINE)) == "1":
    raise RuntimeError(f"{require_variable(ENGINE)}=1 but {_REASON}")

requires_vllm = [pytest.mark.vllm, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]
"""``pytestmark`` of a module that runs vLLM's own code: marked ``vllm`` (``-m vllm``
selects it), skipped where vLLM is not installed."""


class Calls(collections.Counter[str]):
    """How many times each function a test wraps (by name) was called while it ran; the
    wrapping is the test's ``monkeypatch``'s, undone at its end."""

    def __init__(self, monkeypatch: Any) -> None:
        super().__init__()
        self._monkeypatch = monkeypatch

    def count(self, owner: object, *names: str) -> None:
        """Count the calls of each of ``names``, attributes of ``owner``, from now on."""
        for name in names:
            original = getattr(owner, name)

            # functools.wraps: inspect.signature (a mutant binding the arguments) still
            # sees the original's parameters.
            @functools.wraps(original)
            def counted(
                *args: Any, _name: str = name, _original: Any = original, **kwargs: Any
            ) -> Any:
                self[_name] += 1
                return _original(*args, **kwargs)

            self._monkeypatch.setattr(owner, name, counted)


def run_trace(trace: Any, run: Any) -> list[Any]:
    """Every step of ``trace`` (a ``Trace``) on a new engine of ``run`` (an implementation
    of ``runner-step`` with ``new_engine``), its outputs in order."""
    from attnfuzz.reference.runner_step import make_inputs

    run.new_engine()
    return [run(make_inputs(case)) for case in trace.cases()]


def own(out: Any, how: str) -> list[Any]:
    """The builds ``how`` of the step's own forward (the drafter's sub-steps left out)."""
    return [b for b in out.of(how) if b.draft is None]


def values(build: Any, name: str) -> list:
    """Field ``name`` of ``build``, as a list."""
    return build.field(name).values.tolist()


def full_spec_decode(block_size: int = 64) -> Any:
    """``runner_step_hybrid.smallest_full_spec_decode`` at pages of ``block_size`` (a
    sparse MLA backend's 64 by default) and 128 positions: a prefill of 5 tokens, then
    a verify of 2 padded to the FULL graph of 2 requests."""
    import dataclasses

    from attnfuzz.adapters.vllm import runner_step_hybrid
    from attnfuzz.reference.trace import Trace

    trace = runner_step_hybrid.smallest_full_spec_decode()
    config = dataclasses.replace(trace.config, block_size=block_size, max_model_len=128)
    return Trace(config, trace.steps)


def unsafe_with_req_id_per_token_shifted(monkeypatch: Any, trace: Any, run: Any) -> set[str]:
    """The fields safe padding fails in the last step of ``trace`` on ``run`` when
    ``SparseMLACommonMetadataBuilder._build_req_id_per_token`` puts every token one
    request on (the sparse MLA builders' shared map)."""
    from attnfuzz.reference import runner_step as ref
    from vllm.model_executor.layers.attention.sparse_mla_attention import (
        SparseMLACommonMetadataBuilder as Builder,
    )

    original = Builder._build_req_id_per_token

    def shifted(self: Any, common_attn_metadata: Any) -> Any:
        return original(self, common_attn_metadata) + 1

    monkeypatch.setattr(Builder, "_build_req_id_per_token", shifted)
    last = run_trace(trace, run)[-1]
    return {v.field for v in ref.violations(last) if v.prop == "safe padding"}


def kept_apart_verdict(fixed: str, kept: str, witness: Any) -> Any:
    """The ``runner-step`` verdict of the kept-apart entry ``kept`` on ``witness``, after
    asserting that the implementation ``fixed`` passes it and ``kept`` does not."""
    from attnfuzz.harness.registry import get_target

    target = get_target("runner-step")
    assert target.judge_trace(target.resolve(fixed), witness).ok
    verdict = target.judge_trace(target.resolve(kept), witness)
    assert not verdict.ok
    return verdict


# Runs a standalone script with attnfuzz unimportable (-I: neither the checkout nor
# PYTHONPATH on the path; the editable install's path hook answered None). A second
# argument, where given, goes first on the path: a vLLM tree that replaces the installed one.
_BOOT = """\
import runpy, sys
sys.modules["attnfuzz"] = None
script = sys.argv[1]
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
sys.argv = [script]
runpy.run_path(script, run_name="__main__")
"""


def run_without_attnfuzz(script: Any, tree: Any = None) -> Any:
    """``script`` (a path) run in a new interpreter where attnfuzz cannot be imported,
    ``tree`` (a vLLM tree, :func:`vllm_with_lines`) first on its path: its
    ``CompletedProcess``."""
    import subprocess
    import sys

    extra = [str(tree)] if tree is not None else []
    return subprocess.run(
        [sys.executable, "-I", "-c", _BOOT, str(script), *extra],
        cwd=script.parent, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def vllm_with_lines(into: Any, changes: dict[str, tuple[str, str]]) -> Any:
    """The installed vLLM linked into ``into`` (``cp -rs``), each file of ``changes``
    (a path under the package: its line and the line in its place) written out changed;
    the directory to put first on a script's path. Skips the test where a file has no
    such line (another release) or ``cp`` is missing."""
    import importlib.util
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("cp") is None:
        pytest.skip("links the tree with cp -rs")
    installed = Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
    tree = Path(into)
    subprocess.run(["cp", "-rs", str(installed), str(tree / "vllm")], check=True)
    for file, (line, fixed) in changes.items():
        changed = tree / "vllm" / file
        text = changed.resolve().read_text()
        if text.count(line) != 1:
            pytest.skip(f"this vLLM release's {file} has no line {line!r}")
        changed.unlink()
        changed.write_text(text.replace(line, fixed))
    return tree
