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


# -- what a configuration allows, per release: vLLM's split and prefill context parallelism

# The three MLA callers of vLLM 0.26.0 to 0.33.0 (mla_attention.py, sparse_mla_attention.py,
# indexer.py), with their own expressions; only their keywords matter here.
VLLM_CALLERS = """
def split(meta, decode_threshold=1, require_uniform=False, treat_short_extends_as_decodes=True):
    pass


class MLACommonMetadataBuilder:
    def build(self, meta):
        return split(meta, decode_threshold=self.reorder_batch_threshold,
                     require_uniform=self.query_len_support != QueryLenSupport.VARLEN,
                     treat_short_extends_as_decodes=not self.use_pcp)


class SparseMLACommonMetadataBuilder:
    def build(self, meta):
        return split(meta, treat_short_extends_as_decodes=not self.use_pcp,
                     require_uniform=self.require_uniform_decodes)


class DeepseekV32IndexerMetadataBuilder:
    def build(self, meta):
        return split(meta, require_uniform=not self.use_flattening,
                     treat_short_extends_as_decodes=not self.use_pcp)
"""


@pytest.fixture
def vllm_split_callee(tmp_path, monkeypatch):
    """vLLM's declaration of split_decodes_and_prefills (plugin and compat: data, no vLLM
    needed), over a package standing in for a release's callers."""
    import dataclasses

    from attnfuzz.adapters.vllm.plugin import _SPLIT_CALLEE

    package = tmp_path / "fake_vllm_for_callers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "builders.py").write_text(textwrap.dedent(VLLM_CALLERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    callers.calls_of.cache_clear()
    yield dataclasses.replace(_SPLIT_CALLEE, package="fake_vllm_for_callers", function="split")
    callers.calls_of.cache_clear()
    sys.modules.pop("fake_vllm_for_callers", None)


def pcp_witness():
    """The padding-as-prefill defect's witness: one decode of one token padded to a
    graph of 2 (a padding request), uniform rule, short extends as prefills (the
    combination vLLM's MLA builders pass only under prefill context parallelism)."""
    from attnfuzz.adapters.vllm.plugin import _padded_single_decode

    return _padded_single_decode()


def padding_as_prefills(case) -> bool:
    """attnfuzz's re-created defect (no vLLM), judged by the target's oracle."""
    from attnfuzz.harness.registry import get_target

    t = get_target("decode-split")
    return not t.judge(t.resolve("padding-as-prefills"), case).ok


@pytest.mark.parametrize("version", ["0.26.0", "0.27.1", "0.28.0", "0.29.0"])
def test_pcp_before_0_30_runs_no_padded_step_so_the_split_finding_is_latent(
    vllm_split_callee, version
):
    """0.26.0 to 0.29.x: PCP runs in the V2 runner only, PCPManager.validate_config
    refuses full graphs and partition_batch pads no request: no padded step reaches the
    split under PCP."""
    from attnfuzz.harness.reachability import LATENT

    found = callers_of(
        vllm_split_callee, {"require_uniform": 1, "short_extends_as_prefills": 1}, version
    )
    assert len(found.admitting) == 3
    assert found.runners() == {"v2"}
    assert found.modes_on("v2") == ("NONE", "PIECEWISE")
    assert not found.pads_requests("v2", "PIECEWISE")
    r = reachability(
        pcp_witness(), "builder", padding_as_prefills, lambda c: False,
        callee=vllm_split_callee, version=version,
    )  # fmt: skip
    assert r.status == LATENT, r.reason
    assert {(p.runner, p.cudagraph_mode) for p in r.pairs} == {("v2", "NONE"), ("v2", "PIECEWISE")}
    assert not any(p.fails for p in r.pairs)
    assert "v2 FULL_DECODE_ONLY, FULL_AND_PIECEWISE, FULL (" in r.reason
    assert f"fake_vllm_for_callers {version} accepts cudagraph_mode NONE, PIECEWISE only" in (
        r.reason
    )
    assert any("PCPManager.validate_config" in d for d in r.decided_by)


def test_pcp_from_0_30_pads_full_decode_only_graphs_so_the_split_finding_is_live_there(
    vllm_split_callee,
):
    """0.30.0: PCP keeps full graphs for decode-only routines and pads their request
    count: live on V2 FULL_DECODE_ONLY and FULL_AND_PIECEWISE, named with the
    configuration; never on V1 nor under FULL (refused with PCP)."""
    found = callers_of(
        vllm_split_callee, {"require_uniform": 1, "short_extends_as_prefills": 1}, "0.30.0"
    )
    assert found.modes_on("v2") == ("NONE", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
    assert found.pads_requests("v2", "FULL_DECODE_ONLY")
    assert not found.allows("v1", "FULL_DECODE_ONLY") and not found.allows("v2", "FULL")
    r = reachability(
        pcp_witness(), "builder", padding_as_prefills, lambda c: False,
        callee=vllm_split_callee, version="0.30.0",
    )  # fmt: skip
    assert r.status == LIVE, r.reason
    failing = {(p.runner, p.cudagraph_mode, p.step) for p in r.pairs if p.fails}
    assert failing == {("v2", "FULL_DECODE_ONLY", "FULL"), ("v2", "FULL_AND_PIECEWISE", "FULL")}
    assert {p.runner for p in r.pairs} == {"v2"}
    assert "FULL" not in {p.cudagraph_mode for p in r.pairs}
    for named in ("v2 FULL_DECODE_ONLY (FULL)", "--prefill-context-parallel-size > 1",
                  "an MLA backend whose decode needs uniform query lengths",
                  "(fake_vllm_for_callers 0.30.0)"):  # fmt: skip
        assert named in r.reason


@pytest.mark.parametrize("version", ["0.26.0", "0.29.0", "0.30.0"])
@pytest.mark.parametrize("where", ["v1", "FULL"])
def test_a_witness_that_fails_only_on_v1_or_full_mixed_steps_is_never_live_under_pcp(
    vllm_split_callee, version, where
):
    """A judge that fails only on the V1 runner, or only under cudagraph_mode FULL (the
    graphs of mixed steps): PCP runs on neither in any release, so it is not live."""

    def fails_there(case) -> bool:
        return where in (case.config.runner, case.config.cudagraph_mode)

    r = reachability(
        pcp_witness(), "builder", fails_there, lambda c: False,
        callee=vllm_split_callee, version=version,
    )  # fmt: skip
    assert r.status != LIVE, r.reason
    assert not any(p.fails for p in r.pairs)


def test_pcp_off_is_not_limited_by_the_pcp_releases(vllm_split_callee):
    """Short extends as decodes: PCP off, every runner and mode (the ranges are PCP's)."""
    found = callers_of(
        vllm_split_callee, {"require_uniform": 1, "short_extends_as_prefills": 0}, "0.26.0"
    )
    assert found.runners() is None and found.modes_on("v1") is None


def test_a_release_no_range_covers_does_not_reach_the_case(vllm_split_callee):
    """Before 0.26.0 no PCP range is declared: the calls are not taken as reaching it."""
    params = {"require_uniform": 1, "short_extends_as_prefills": 1}
    found = callers_of(vllm_split_callee, params, "0.25.1")
    assert not found.admitting
    assert all("is read for fake_vllm_for_callers 0.26.0" in why for _, why in found.refusing)
    r = reachability(
        pcp_witness(), "builder", padding_as_prefills, lambda c: False,
        callee=vllm_split_callee, version="0.25.1",
    )  # fmt: skip
    assert r.status == UNKNOWN


def test_a_configuration_that_pads_no_request_is_judged_on_the_unpadded_step(engine_source):
    """A release whose FULL steps under the configuration pad no request: the step is
    judged at its real request count."""
    import dataclasses

    from attnfuzz.harness.callers import Releases
    from attnfuzz.harness.reachability import LATENT

    pcp = dataclasses.replace(
        CALLEE.conditions[0],
        releases={False: (Releases("1.0", runners=("v2",), pads_requests=False),)},
    )
    callee = dataclasses.replace(CALLEE, conditions=(pcp,))
    r = reachability(
        pcp_witness(), "builder", padding_as_prefills, lambda c: False, callee=callee,
        version="1.2",
    )  # fmt: skip
    assert r.status == LATENT
    steps = {p.step for p in r.pairs}
    assert "FULL unpadded" in steps and "FULL" not in steps
