"""SGLang's environment on a machine without a GPU (adapters/sglang/_engine.py): each
stand-in and workaround on its own.

The Triton-interpreter mask fix and the assert-stripping recompiler are tested
without SGLang (on a minimal kernel and function of their own); what touches
SGLang's modules is marked ``sglang`` and skips where it is not installed.
"""

from __future__ import annotations

import ast
import difflib
import subprocess
import sys

import pytest
import torch
from attnfuzz.adapters import standins
from attnfuzz.adapters.sglang import _engine
from attnfuzz.adapters.sglang.testing import requires_sglang
from attnfuzz.kernels import _triton


def needs_sglang(test):  # noqa: ANN001, ANN201
    """Marked ``sglang``; skipped where SGLang is not installed (failed under
    ATTNFUZZ_REQUIRE_SGLANG=1)."""
    for mark in reversed(requires_sglang):
        test = mark(test)
    return test


# A scalar condition and'ed with a block one, as SGLang's
# _fused_dsa_target_verify_metadata_kernel builds its mask.
MASK_KERNEL = """
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch, triton, triton.language as tl
if sys.argv[1] == "fixed":
    from attnfuzz.adapters.sglang import _engine
    assert _engine.interpreter_bool_masks()

@triton.jit
def copy_row(src, dst, n, row, rows, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = (row < rows) & (offs < n)
    tl.store(dst + offs, tl.load(src + offs, mask=mask, other=0), mask=mask)

src = torch.arange(1, 9, dtype=torch.int32)
dst = torch.zeros(8, dtype=torch.int32)
copy_row[(1,)](src, dst, 5, 0, 2, BLOCK=8)
print(dst.tolist())
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )


def test_the_interpreter_refuses_a_scalar_and_block_mask_and_the_fix_gets_past_it():
    bare = _run(MASK_KERNEL, "bare")
    assert bare.returncode != 0 and "mask has unsupported dtype" in bare.stderr, bare.stderr
    fixed = _run(MASK_KERNEL, "fixed")
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.strip().splitlines()[-1] == "[1, 2, 3, 4, 5, 0, 0, 0]"


@pytest.mark.skipif(_triton.INTERPRET, reason="compiled kernels only: a GPU")
def test_the_mask_fix_is_never_applied_where_kernels_are_compiled():
    assert _engine.interpreter_bool_masks() is False


def wrapper(x: torch.Tensor, n: int = 3) -> torch.Tensor:
    assert x.is_cuda
    assert n > 0, "a check that stays"
    if n > 1:
        assert x.is_cuda, "nested"
        y = x + n
    else:
        y = x
    return y * 2


def _changed_lines(fn) -> tuple[list[str], list[str]]:
    """The lines the stripped definition removes from ``fn``'s own and adds to it,
    as ``ast.unparse`` writes both (decorators aside)."""
    original = standins.function_tree(fn)
    original.decorator_list = []
    before = ast.unparse(original).splitlines()
    after = ast.unparse(standins.stripped_tree(fn)).splitlines()
    diff = list(difflib.ndiff(before, after))
    removed = [line[2:].strip() for line in diff if line.startswith("- ")]
    added = [line[2:].strip() for line in diff if line.startswith("+ ")]
    return removed, added


def _only_cuda_asserts_removed(fn) -> None:
    removed, added = _changed_lines(fn)
    assert removed, "nothing was removed"
    assert all(line.startswith("assert ") and "is_cuda" in line for line in removed), removed
    assert set(added) <= {"pass"}, added  # a block left empty keeps a `pass`


def test_without_cuda_asserts_drops_only_the_cuda_asserts():
    x = torch.arange(3)
    copy = standins.without_cuda_asserts(wrapper)
    with pytest.raises(AssertionError):
        wrapper(x)  # a CPU tensor
    assert torch.equal(copy(x), (x + 3) * 2)
    with pytest.raises(AssertionError, match="a check that stays"):
        copy(x, n=0)
    # Same file and lines: a traceback through the copy points into the original source.
    assert copy.__code__.co_filename == wrapper.__code__.co_filename
    assert copy.__code__.co_firstlineno == wrapper.__code__.co_firstlineno


def _cuda_assert_lines(fn) -> set[int]:
    return {
        node.lineno
        for node in ast.walk(standins.function_tree(fn))
        if isinstance(node, ast.Assert) and "is_cuda" in ast.unparse(node.test)
    }


def test_the_stripped_tree_is_the_source_less_the_cuda_asserts():
    assert len(_cuda_assert_lines(wrapper)) == 2
    removed, added = _changed_lines(wrapper)
    assert removed == ["assert x.is_cuda", "assert x.is_cuda, 'nested'"] and added == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks the real GPU there")
def test_device_capability_answers_inside_and_restores_after():
    real = torch.cuda.get_device_capability
    with _engine.device_capability((9, 0)):
        assert torch.cuda.get_device_capability() == (9, 0)
    assert torch.cuda.get_device_capability is real


STAND_IN = """
from attnfuzz.adapters.sglang import _engine
_engine.configure_environment()
import transformers.utils.import_utils as iu
import torchvision.transforms as T
assert not iu.is_torchvision_available(), "transformers must still see no torchvision"
try:
    T.Compose([])
except RuntimeError as err:
    print("called:", err)
import sglang.srt.layers.attention.dsa_backend
print("imported")
"""


@needs_sglang
def test_torchvision_is_stood_in_and_transformers_still_sees_it_absent():
    done = _run(STAND_IN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "is attnfuzz's stand-in; the engine called it" in done.stdout
    assert done.stdout.strip().endswith("imported")


@needs_sglang
@pytest.mark.parametrize(
    "module, function",
    [
        ("sglang.kernels.ops.attention.pad", "seqlens_expand_triton"),
        ("sglang.kernels.ops.attention.dsa.metadata", "fused_dsa_decode_metadata"),
        ("sglang.kernels.ops.attention.dsa.metadata", "fused_dsa_target_verify_metadata"),
        ("sglang.kernels.ops.attention.dsa.metadata", "fused_dsa_draft_extend_metadata"),
    ],
)
def test_sglang_wrappers_lose_only_their_cuda_asserts(module, function):
    import importlib

    _engine.prepare()
    fn = getattr(importlib.import_module(module), function)
    assert _cuda_assert_lines(fn), f"{function} no longer asserts is_cuda: drop the workaround"
    assert not standins.function_tree(fn).decorator_list, "a decorator would be dropped"
    _only_cuda_asserts_removed(fn)


@needs_sglang
def test_server_args_are_published_for_the_call_and_restored():
    from sglang.srt.runtime_context import get_context, get_spec

    before = get_context()._server_args
    spec = dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=3)
    with _engine.server_args(speculative_eagle_topk=2, speculative_num_steps=2, **spec) as args:
        assert get_context().server_args is args
        # SGLang's backends read their settings from the published bags.
        assert get_spec().speculative_eagle_topk == 2
        assert get_spec().speculative_num_draft_tokens == 3
    assert get_context()._server_args is before


KERNELS = "attnfuzz_fake_kernels"
"""A kernels package that does not exist: the stand-in's test subject."""

IMPORTER = f"""
import {KERNELS}.kvcacheio as unguarded  # at load, no fallback: stood in
try:
    import {KERNELS}.flash_attn as guarded  # a fallback: left to fail
except ImportError:
    guarded = None


def lazily():
    import {KERNELS}.inside_a_function  # noqa: F401  (called later: left to fail)
"""


@pytest.fixture
def kernel_finder(monkeypatch):
    """The kernels' stand-in finder, for :data:`KERNELS` only; its modules removed after."""
    monkeypatch.setattr(_engine, "KERNEL_PACKAGES", (KERNELS,))
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, _engine._KernelStandInFinder()])
    yield
    for name in [m for m in sys.modules if m.split(".")[0] == KERNELS]:
        del sys.modules[name]


def _load(tmp_path, module_name: str) -> dict:
    """``IMPORTER`` run as the module ``module_name``'s top-level code, from a file."""
    path = tmp_path / "importer.py"
    path.write_text(IMPORTER)
    namespace = {"__name__": module_name}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def test_an_sglang_module_s_unguarded_kernel_import_is_stood_in(kernel_finder, tmp_path):
    """0.5.9 and 0.5.10 import sgl_kernel at load: the stand-in answers that import only."""
    loaded = _load(tmp_path, "sglang.srt.attnfuzz_fake")
    assert loaded["unguarded"].__name__ == f"{KERNELS}.kvcacheio"
    assert loaded["guarded"] is None  # its fallback, as without the stand-in
    with pytest.raises(ModuleNotFoundError):
        loaded["lazily"]()


def test_nobody_else_s_kernel_import_is_stood_in(kernel_finder, tmp_path):
    with pytest.raises(ModuleNotFoundError):
        _load(tmp_path, "not_sglang")


def test_the_kernel_stand_in_goes_in_only_where_the_kernels_do_not_import(monkeypatch):
    monkeypatch.setattr(_engine, "KERNEL_PACKAGES", ("torch",))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    _engine.stand_in_kernels.cache_clear()
    try:
        assert _engine.stand_in_kernels() is False  # torch imports: nothing stood in
        monkeypatch.setattr(_engine, "KERNEL_PACKAGES", (KERNELS,))
        _engine.stand_in_kernels.cache_clear()
        assert _engine.stand_in_kernels() is True
        assert isinstance(sys.meta_path[-1], _engine._KernelStandInFinder)
    finally:
        _engine.stand_in_kernels.cache_clear()


def test_an_sglang_module_s_unguarded_server_import_is_stood_in(monkeypatch, tmp_path):
    """0.5.23's model runner module imports uvicorn at load (distributed/gated_launch.py):
    the server's stand-in answers that import only, as the kernels' does."""
    monkeypatch.setattr(_engine, "SERVER_PACKAGES", (KERNELS,))
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, _engine._ServerStandInFinder()])
    try:
        with pytest.raises(ModuleNotFoundError):  # nobody else's import (first: uncached)
            _load(tmp_path, "not_sglang")
        loaded = _load(tmp_path, "sglang.srt.attnfuzz_fake")
        assert loaded["unguarded"].__name__ == f"{KERNELS}.kvcacheio"
        assert loaded["guarded"] is None
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == KERNELS]:
            del sys.modules[name]


def test_the_server_stand_in_goes_in_only_where_the_server_does_not_import(monkeypatch):
    monkeypatch.setattr(_engine, "SERVER_PACKAGES", ("torch",))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    _engine.stand_in_server.cache_clear()
    try:
        assert _engine.stand_in_server() is False
        monkeypatch.setattr(_engine, "SERVER_PACKAGES", (KERNELS,))
        _engine.stand_in_server.cache_clear()
        assert _engine.stand_in_server() is True
        assert isinstance(sys.meta_path[-1], _engine._ServerStandInFinder)
    finally:
        _engine.stand_in_server.cache_clear()


@needs_sglang
def test_vllm_still_finds_its_device_after_sglang_was_set_up_first(tmp_path):
    """SGLang imports some of vLLM's modules at load: set up first in a process, it
    must leave vLLM its CPU platform (else vLLM's own code, judged later in the same
    process, fails to find a device, and that reads as a finding on vLLM)."""
    import subprocess
    import sys

    pytest.importorskip("attnfuzz.adapters.vllm.testing")
    from attnfuzz.adapters.vllm import unavailable as vllm_unavailable

    if vllm_unavailable() is not None:
        pytest.skip(vllm_unavailable())
    script = (
        "from attnfuzz.adapters.sglang import _engine\n"
        "_engine.prepare()\n"
        "from sglang.srt.layers.attention import triton_backend\n"
        "from attnfuzz.harness.registry import get_target\n"
        "from attnfuzz.harness.testing import hand_case\n"
        "t = get_target('mtp-seq-lens')\n"
        "verdict = t.judge(t.resolve('vllm'), hand_case((2, 2), (3, 4), num_spec=1))\n"
        "print('ok' if verdict.ok else verdict)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert done.stdout.strip().splitlines()[-1:] == ["ok"], done.stdout + done.stderr
