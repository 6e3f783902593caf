"""The stand-ins both engines' adapters share (``attnfuzz.adapters.standins``)."""

from __future__ import annotations

import sys
import types

import pytest
from attnfuzz.adapters.standins import in_sys_modules


def test_a_vendor_package_is_importable_for_the_block_alone():
    """The stand-in is importable inside the block and gone after; a module the block
    imports for the first time stays imported (its classes are not made anew later)."""
    vendor = types.ModuleType("attnfuzz_test_vendor")
    vendor.answer = 42  # type: ignore[attr-defined]
    sys.modules.pop("colorsys", None)
    with in_sys_modules({"attnfuzz_test_vendor": vendor}):
        import colorsys

        import attnfuzz_test_vendor  # type: ignore[import-not-found]

        assert attnfuzz_test_vendor.answer == 42
    assert "attnfuzz_test_vendor" not in sys.modules
    assert sys.modules["colorsys"] is colorsys


def test_a_module_already_there_is_put_back():
    """A name the block shadows gets its module back, not the stand-in."""
    original = sys.modules["json"]
    with in_sys_modules({"json": types.ModuleType("json")}):
        assert sys.modules["json"] is not original
    assert sys.modules["json"] is original


def test_a_module_stages_in_unpinned_memory_on_a_cpu_alone():
    """On a CPU a module's ``torch.zeros(..., pin_memory=True)`` makes the same tensor
    unpinned (CPU-only torch has no pinned allocator); the rest of torch is torch's; on
    another device the module is left as it is."""
    import torch
    from attnfuzz.adapters.standins import unpinned

    builder = types.ModuleType("attnfuzz_test_builder")
    builder.torch = torch  # type: ignore[attr-defined]
    with unpinned(builder, torch.device("cpu")):
        staged = builder.torch.zeros(3, dtype=torch.int32, pin_memory=True)
        assert staged.tolist() == [0, 0, 0] and not staged.is_pinned()
        assert builder.torch.arange(2).tolist() == [0, 1]
    assert builder.torch is torch
    with unpinned(builder, torch.device("meta")):
        assert builder.torch is torch


def test_a_package_this_install_lacks_is_stood_in_for_the_block_alone(tmp_path, monkeypatch):
    """An engine module importing an absent package at load imports within the block,
    keeps what it bound, and the package is gone after; a package that imports is left
    as it is."""
    from attnfuzz.adapters.standins import Unused, packages_stood_in

    (tmp_path / "attnfuzz_test_engine_mod.py").write_text(
        "from attnfuzz_test_absent.transforms import Resize\nimport json\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "attnfuzz_test_engine_mod", raising=False)
    with packages_stood_in("attnfuzz_test_absent", "json"):
        import attnfuzz_test_engine_mod  # type: ignore[import-not-found]
    assert isinstance(attnfuzz_test_engine_mod.Resize, Unused)
    assert not any(m.startswith("attnfuzz_test_absent") for m in sys.modules)
    assert attnfuzz_test_engine_mod.json is sys.modules["json"]  # the real one
    with pytest.raises(ModuleNotFoundError):  # the stand-in did not outlive its block
        import attnfuzz_test_absent  # type: ignore[import-not-found]  # noqa: F401
    sys.modules.pop("attnfuzz_test_engine_mod", None)
