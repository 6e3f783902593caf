"""Targets from other distributions (entry points) and a user's own mutants."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from attnfuzz.harness import registry
from attnfuzz.harness.errors import UsageError
from attnfuzz.harness.registry import (
    add_mutants,
    get_target,
    target_names,
    unavailable_targets,
)

BUILTIN = "slot-mapping"

PLUGIN = '''
import dataclasses

from attnfuzz.harness.registry import get_target


def build():
    """slot-mapping under another name: a target of another distribution."""
    base = get_target("slot-mapping")
    impls = {n: base.implementations[n] for n in ("triton", "reference", "stale-padding")}
    return dataclasses.replace(base, name="my-slots", implementations=impls)


def build_wrong_name():
    return dataclasses.replace(get_target("slot-mapping"), name="other")


def build_not_a_target():
    return 42


def build_raises():
    raise RuntimeError("no GPU here")
'''

USER_MUTANTS = """
import attnfuzz.harness.registry as registry
from attnfuzz.harness.targets.slot_mapping import reference_impl, smallest_position


def first_slot_off_by_one(inputs):
    out = reference_impl(inputs)
    out.slot_mapping[0] += 1
    return out


MUTANTS = [
    registry.mutant(
        "slot-mapping", "user-first-slot", first_slot_off_by_one,
        description="the first token's slot one too far",
        reach=lambda case: True, trigger=lambda case: True, smallest=smallest_position,
    ),
    registry.mutant("mtp-seq-lens", "user-fixed", first_slot_off_by_one, fixes={"next_n": 1}),
]
ONE = MUTANTS[0]
NOT_MUTANTS = [MUTANTS[0], "slot-mapping"]
EMPTY = []
UNKNOWN_TARGET = [registry.mutant("no-such-target", "x", first_slot_off_by_one)]
CLASH = [registry.mutant("slot-mapping", "triton", first_slot_off_by_one)]
BAD_NAME = [registry.mutant("slot-mapping", "pkg.mod:attr", first_slot_off_by_one)]
"""


def _clear() -> None:
    for cached in (registry._plugins, registry.target_names, registry.get_target):
        cached.cache_clear()


@pytest.fixture
def fresh_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A registry built anew (targets, entry points, user mutants) and rebuilt
    after the test, with ``tmp_path`` importable."""
    monkeypatch.syspath_prepend(str(tmp_path))
    _clear()
    yield tmp_path
    _clear()
    for name in [m for m in sys.modules if m.startswith("attnfuzz_test_")]:
        del sys.modules[name]


def _entry_points(monkeypatch: pytest.MonkeyPatch, **points: str) -> None:
    eps = [
        importlib.metadata.EntryPoint(name, value, registry.ENTRY_POINT_GROUP)
        for name, value in points.items()
    ]

    real = importlib.metadata.entry_points

    def entry_points(**selection):  # other libraries (torch, ...) look up their own groups
        if selection == {"group": registry.ENTRY_POINT_GROUP}:
            return importlib.metadata.EntryPoints(eps)
        return real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


def test_a_target_of_another_distribution_is_listed_built_and_judged(fresh_registry, monkeypatch):
    (fresh_registry / "attnfuzz_test_plugin.py").write_text(PLUGIN)
    _entry_points(monkeypatch, **{"my-slots": "attnfuzz_test_plugin:build"})
    assert "my-slots" in target_names(), unavailable_targets()
    assert BUILTIN in target_names()
    assert unavailable_targets() == {}
    target = get_target("my-slots")
    assert target.name == "my-slots" and [m.name for m in target.mutants] == ["stale-padding"]
    case = target.mutants[0].smallest()
    assert target.judge(target.resolve("triton"), case, "cpu").ok
    assert not target.judge(target.resolve("stale-padding"), case, "cpu").ok


def test_a_broken_entry_point_is_unavailable_with_its_reason_and_the_rest_still_work(
    fresh_registry, monkeypatch
):
    (fresh_registry / "attnfuzz_test_plugin.py").write_text(PLUGIN)
    _entry_points(
        monkeypatch,
        **{
            "my-slots": "attnfuzz_test_plugin:build",
            "missing-module": "attnfuzz_test_no_such_module:build",
            "raises": "attnfuzz_test_plugin:build_raises",
            "not-a-target": "attnfuzz_test_plugin:build_not_a_target",
            "wrong-name": "attnfuzz_test_plugin:build_wrong_name",
        },
    )
    names = target_names()
    assert "my-slots" in names and BUILTIN in names
    reasons = unavailable_targets()
    assert sorted(reasons) == ["missing-module", "not-a-target", "raises", "wrong-name"]
    assert not set(reasons) & set(names)
    assert "ModuleNotFoundError" in reasons["missing-module"]
    assert "RuntimeError: no GPU here" in reasons["raises"]
    assert "returned int, not an attnfuzz Target" in reasons["not-a-target"]
    assert "built target 'other'" in reasons["wrong-name"]
    for name, reason in reasons.items():
        assert "\n" not in reason and f"entry point {name} = " in reason
        with pytest.raises(UsageError, match=f"target '{name}' is unavailable: "):
            get_target(name)
    assert get_target(BUILTIN).name == BUILTIN


def test_an_entry_point_named_like_a_built_in_target_or_another_is_a_usage_error(
    fresh_registry, monkeypatch
):
    (fresh_registry / "attnfuzz_test_plugin.py").write_text(PLUGIN)
    _entry_points(monkeypatch, **{BUILTIN: "attnfuzz_test_plugin:build"})
    with pytest.raises(UsageError, match=f"named like the built-in target '{BUILTIN}'"):
        target_names()
    eps = [
        importlib.metadata.EntryPoint("my-slots", "attnfuzz_test_plugin:build", "g")
        for _ in range(2)
    ]
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **s: eps if s == {"group": registry.ENTRY_POINT_GROUP} else real(**s),
    )
    _clear()
    with pytest.raises(UsageError, match="both name target 'my-slots'"):
        target_names()


def test_a_users_mutants_join_their_targets_and_are_caught(fresh_registry):
    (fresh_registry / "attnfuzz_test_mutants.py").write_text(USER_MUTANTS)
    assert add_mutants("attnfuzz_test_mutants") == [
        ("slot-mapping", "user-first-slot"),
        ("mtp-seq-lens", "user-fixed"),
    ]
    target = get_target("slot-mapping")
    impl = target.resolve("user-first-slot")
    assert impl.kind == "mutant" and impl in target.mutants
    assert impl.description == "the first token's slot one too far"
    assert not target.judge(impl, impl.smallest(), "cpu").ok
    assert get_target("mtp-seq-lens").resolve("user-fixed").fixes == {"next_n": 1}
    # Again (a campaign worker, a second flag): nothing new, nothing refused.
    assert add_mutants("attnfuzz_test_mutants:MUTANTS") == add_mutants("attnfuzz_test_mutants")
    assert add_mutants("attnfuzz_test_mutants:ONE") == [("slot-mapping", "user-first-slot")]
    assert [m.name for m in target.mutants].count("user-first-slot") == 1


@pytest.mark.parametrize(
    "spec, why",
    [
        ("attnfuzz_test_no_such_module", "cannot load mutants .*ModuleNotFoundError"),
        ("attnfuzz_test_mutants:NOPE", "has no attribute 'NOPE'"),
        ("attnfuzz_test_mutants:NOT_MUTANTS", "str 'slot-mapping' is not a mutant"),
        ("attnfuzz_test_mutants:first_slot_off_by_one", "expected a mutant or a list of them"),
        ("attnfuzz_test_mutants:EMPTY", "declares no mutants"),
        ("attnfuzz_test_mutants:UNKNOWN_TARGET", "unknown target 'no-such-target'"),
        ("attnfuzz_test_mutants:CLASH", "already has an implementation 'triton' \\(fixed"),
        ("attnfuzz_test_mutants:BAD_NAME", "'pkg.mod:attr' is not a plain name"),
        (":MUTANTS", "expected MODULE or MODULE:ATTRIBUTE"),
    ],
)
def test_a_wrong_mutant_declaration_is_a_one_line_usage_error_and_adds_nothing(
    fresh_registry, spec, why
):
    (fresh_registry / "attnfuzz_test_mutants.py").write_text(USER_MUTANTS)
    before = dict(get_target("slot-mapping").implementations)
    with pytest.raises(UsageError, match=why) as err:
        add_mutants(spec)
    assert "\n" not in str(err.value)
    assert get_target("slot-mapping").implementations == before


def test_a_module_that_fails_to_import_is_reported_with_its_error(fresh_registry):
    (fresh_registry / "attnfuzz_test_broken.py").write_text(
        textwrap.dedent("""
            raise ImportError("needs a GPU")
        """)
    )
    with pytest.raises(UsageError, match="ImportError: needs a GPU"):
        add_mutants("attnfuzz_test_broken")


def test_a_user_implementation_may_be_an_implementation_with_fixes(fresh_registry):
    """``--impl module:attr`` naming an :class:`Implementation` keeps its fixes and
    description, under the spec's name and kind "user" (a must-pass)."""
    (fresh_registry / "attnfuzz_test_impl.py").write_text(
        textwrap.dedent("""
            from attnfuzz.harness.target import Implementation
            from attnfuzz.harness.targets.indexer_decode import reference_impl

            K512 = Implementation(
                "mine", reference_impl, "mutant", "my kernel: K = 512", fixes={"topk": 512}
            )
        """)
    )
    target = get_target("indexer-decode")
    impl = target.resolve("attnfuzz_test_impl:K512")
    assert (impl.name, impl.kind, impl.fixes) == ("attnfuzz_test_impl:K512", "user", {"topk": 512})
    assert impl.description == "my kernel: K = 512"
    with pytest.raises(UsageError, match=r"topk=\d+ \(requires topk=512\)"):
        target.judge(impl, target.resolve("pr39542-overlap").smallest(), "cpu")
