"""The target model: a target as one declaration, kinds, check names, and judging apart."""

from __future__ import annotations

import ast
import dataclasses
import json
import warnings
from pathlib import Path

import pytest
from attnfuzz.harness import judging
from attnfuzz.harness.definitions import KINDS
from attnfuzz.harness.oracle import Check
from attnfuzz.harness.registry import get_target, target_names
from attnfuzz.harness.target import HarnessError, Implementation, Kind, Target, UsageError
from attnfuzz.harness.targets import slot_mapping as slots
from attnfuzz.kernels import slot_mapping as kernels

HARNESS = Path(__file__).resolve().parent.parent / "harness"


def _slots(**fields) -> Target:
    """A target of slot-mapping's reference and comparison, declared with ``fields``."""
    return Target("slots", "", slots.ref.make_inputs, slots.ref.reference, slots.compare, **fields)


STALE = Implementation.mutant(
    "stale-padding",
    kernels.mutant_stale_padding,
    "padded tokens keep stale slots",
    reach=slots.reach_padded,
    trigger=slots.trigger_stale_padding,
    smallest=slots.smallest_stale_padding,
)
FIXED = Implementation("triton", kernels.slot_mapping, Kind.FIXED, "one program per request")


# -- kinds --------------------------------------------------------------------------------


def test_a_kind_is_its_string_and_is_checked_on_construction():
    impl = Implementation("x", kernels.slot_mapping, "fixed")
    assert impl.kind is Kind.FIXED and impl.kind == "fixed"
    assert json.dumps({"kind": impl.kind}) == '{"kind": "fixed"}'
    assert dataclasses.replace(impl, kind="mutant").kind is Kind.MUTANT
    with pytest.raises(UsageError, match="kind 'fxed' is none of fixed, reference"):
        Implementation("x", kernels.slot_mapping, "fxed")
    assert tuple(Kind) == KINDS  # the kinds campaign.json's schema allows


def test_a_declared_mutant_carries_what_the_zoo_measures():
    assert STALE.kind is Kind.MUTANT and STALE.smallest is slots.smallest_stale_padding
    assert (STALE.reach, STALE.trigger) == (slots.reach_padded, slots.trigger_stale_padding)
    with pytest.raises(TypeError):  # reach, trigger and smallest: none left out
        Implementation.mutant("m", kernels.mutant_stale_padding, "", reach=slots.reach_padded)


# -- the declaration ------------------------------------------------------------------------


def test_implementations_are_declared_as_entries_and_kept_by_name():
    target = _slots(implementations=(FIXED, STALE), checks=slots.OwnCheck)
    assert list(target.implementations) == ["triton", "stale-padding"]
    assert target.mutants == [STALE] and target.checks == ("padding",)
    assert dataclasses.replace(target, name="again").implementations == target.implementations
    target.add(dataclasses.replace(FIXED, name="user-copy", kind=Kind.USER))  # attached later
    assert list(target.implementations)[-1] == "user-copy"
    with pytest.raises(UsageError, match="distinct names"):
        _slots(implementations=(FIXED, FIXED))
    with pytest.raises(UsageError, match="distinct names"):
        _slots(implementations=(FIXED, kernels.slot_mapping))


@pytest.mark.parametrize("checks", [("values",), ("padding", "padding"), ("",)])
def test_a_target_declares_distinct_checks_of_its_own(checks):
    with pytest.raises(UsageError, match="checks must be distinct names"):
        _slots(checks=checks)


def test_every_builtin_target_is_one_declaration_without_an_engine():
    for name in target_names():
        target = get_target(name)
        assert not set(target.checks) & set(Check), name
        for impl in target.implementations.values():
            assert isinstance(impl.kind, Kind), (name, impl.name)
            if impl.kind is Kind.MUTANT and impl.engine is None:
                assert None not in (impl.reach, impl.trigger, impl.smallest), (name, impl.name)
    for path in sorted((HARNESS / "targets").glob("*.py")):  # engines attach from their plugin
        assert "vllm_impl" not in path.read_text(), path.name
        assert not [m for m, _ in _imports(path, top=True) if "adapters" in m], path.name


# -- check names ------------------------------------------------------------------------------


def _tail_written(inputs):
    """The fixed kernel, then a slot written past the view: slot-mapping's own check."""
    out = kernels.slot_mapping(inputs)
    out.buffer[-1] = 7
    return out


def test_a_check_neither_generic_nor_declared_is_a_harness_error():
    case = slots.smallest_stale_padding()
    tail = Implementation("tail-written", _tail_written, Kind.USER)
    declared = _slots(checks=("padding",))
    assert [m.check for m in declared.judge(tail, case, "cpu").mismatches] == ["padding"]
    assert declared.judge(FIXED, case, "cpu").ok
    assert [m.check for m in declared.judge(STALE, case, "cpu").mismatches] == ["values"]
    undeclared = _slots()
    with pytest.raises(HarnessError, match="check.s. padding, neither generic nor declared"):
        undeclared.judge(tail, case, "cpu")
    assert undeclared.judge(FIXED, case, "cpu").ok  # nothing reported, nothing to refuse
    assert not undeclared.judge(STALE, case, "cpu").ok  # generic checks need no declaring


def test_a_moved_check_is_a_deprecated_alias_of_its_string():
    with pytest.warns(DeprecationWarning, match="Check.WALK is deprecated.*max-seq-len"):
        assert Check.WALK == "walk"
    assert "walk" not in set(Check) and "invariant" in set(Check)
    with pytest.raises(ValueError):
        Check("walk")
    with pytest.raises(AttributeError), warnings.catch_warnings():
        warnings.simplefilter("error")
        Check.NO_SUCH_CHECK  # noqa: B018


# -- judging apart from the declaration ---------------------------------------------------------


def _imports(path: Path, top: bool = False) -> list[tuple[str, bool]]:
    """``(module, under TYPE_CHECKING)`` for every import of ``path``, at any depth
    (``top``: at module level only)."""
    tree = ast.parse(path.read_text())
    guarded = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    nodes = tree.body if top else ast.walk(tree)
    return [(n.module or "", id(n) in guarded) for n in nodes if isinstance(n, ast.ImportFrom)]


def test_judging_and_devices_do_not_import_the_declaration():
    """The declaration calls judging; judging names it as a type only, and devices
    not at all: no cycle, not even through an import inside a function."""
    target = "attnfuzz.harness.target"
    assert all(typing for module, typing in _imports(HARNESS / "judging.py") if module == target)
    assert target not in [module for module, _ in _imports(HARNESS / "devices.py")]
    assert judging.GENERIC_CHECKS == frozenset(Check)
