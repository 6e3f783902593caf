"""Reachability from who calls the code, with which arguments, under which configuration.

A finding on ``split_decodes_and_prefills`` is judged with arguments the case draws;
whether an engine passes them is read from its callers (``harness/callers.py``). The
first tests use a small package written here, standing in for an engine's source;
tests/test_vllm_decode_split.py reads the installed vLLM's own callers.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
from attnfuzz.harness import callers
from attnfuzz.harness.callers import Argument, Callee, Condition, callers_of
from attnfuzz.harness.reachability import LIVE, UNKNOWN, reachability
from attnfuzz.harness.targets.decode_split import smallest_padding_as_prefills

ENGINE_SOURCE = """
def split(meta, decode_threshold=1, require_uniform=False, treat_short_extends_as_decodes=True):
    return split(meta)  # a recursive call is no caller


class UniformBuilder:
    def build(self, meta):
        return split(meta, require_uniform=True,
                     treat_short_extends_as_decodes=not self.use_pcp)


class PlainBuilder:
    def build(self, meta):
        return split(meta)


class OddBuilder:
    def build(self, meta):
        return split(meta, require_uniform=self.something_undeclared,
                     treat_short_extends_as_decodes=False)
"""

CALLEE = Callee(
    "fake_engine_for_callers",
    "split",
    (
        Argument("require_uniform", "require_uniform", False),
        Argument(
            "short_extends_as_prefills",
            "treat_short_extends_as_decodes",
            True,
            to_case=lambda v: int(not v),
        ),
    ),
    (
        Condition(
            "not self.use_pcp",
            {True: "context parallelism off", False: "--context-parallel > 1"},
            runners={False: ("v2",)},
            source="config.py: parallelism runs on v2 only",
        ),
    ),
)


@pytest.fixture
def engine_source(tmp_path, monkeypatch):
    package = tmp_path / "fake_engine_for_callers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "builders.py").write_text(textwrap.dedent(ENGINE_SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    callers.calls_of.cache_clear()
    yield
    callers.calls_of.cache_clear()
    sys.modules.pop("fake_engine_for_callers", None)


def test_every_call_is_found_with_its_keywords_and_the_definition_is_not_one(engine_source):
    calls = callers.calls_of("fake_engine_for_callers", "split")
    assert [c.function for c in calls] == [
        "UniformBuilder.build",
        "PlainBuilder.build",
        "OddBuilder.build",
    ]
    assert dict(calls[0].keywords) == {
        "require_uniform": "True",
        "treat_short_extends_as_decodes": "not self.use_pcp",
    }


def test_a_combination_only_one_configuration_passes_names_it_and_its_runners(engine_source):
    found = callers_of(CALLEE, {"require_uniform": 1, "short_extends_as_prefills": 1})
    assert [a.call.function for a in found.admitting] == ["UniformBuilder.build"]
    assert found.runners() == {"v2"}
    assert found.configurations() == ["UniformBuilder under --context-parallel > 1"]
    why = dict((c.function, w) for c, w in found.refusing)
    assert why["PlainBuilder.build"] == "require_uniform left at its default False"
    assert "no declared meaning" in why["OddBuilder.build"]  # never guessed reachable


def test_defaults_and_literals_admit_without_a_configuration(engine_source):
    found = callers_of(CALLEE, {"require_uniform": 0, "short_extends_as_prefills": 0})
    assert [a.call.function for a in found.admitting] == ["PlainBuilder.build"]
    assert found.runners() is None  # every runner


def test_reachability_plans_only_the_runners_a_caller_runs_on(engine_source):
    case = smallest_padding_as_prefills()
    params = dict(case.params) | {"short_extends_as_prefills": 1}
    case = case.__class__(case.config, case.batch, tuple(sorted(params.items())))
    r = reachability(case, "builder", lambda c: True, lambda c: False, callee=CALLEE)
    assert r.status == LIVE
    assert {p.runner for p in r.pairs} == {"v2"}
    assert "--context-parallel > 1" in r.reason
    assert "does not run v1 (the calls that pass these arguments need --context-parallel > 1" in (
        r.reason
    )
    assert any("UniformBuilder.build calls split(" in d for d in r.decided_by)


def test_a_combination_no_call_passes_is_unknown_never_live(engine_source):
    case = smallest_padding_as_prefills()  # require_uniform 1, short extends as decodes
    params = dict(case.params) | {"require_uniform": 0, "short_extends_as_prefills": 1}
    case = case.__class__(case.config, case.batch, tuple(sorted(params.items())))
    r = reachability(case, "builder", lambda c: True, lambda c: False, callee=CALLEE)
    assert r.status == UNKNOWN and not r.pairs
    assert "is known to pass" in r.reason and "OddBuilder.build" in r.reason
