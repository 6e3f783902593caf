"""The stand-ins both engines' adapters share (``attnfuzz.adapters.standins``)."""

from __future__ import annotations

import sys
import types

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
