"""SGLang's binding across releases, found by feature detection (``adapters/sglang/compat.py``).

These run without SGLang: the APIs probed are stand-in modules. What the real
releases do is measured by ``benchmarks/releases.py --engine sglang bugs``.
"""

from __future__ import annotations

import sys
import types

import pytest
from attnfuzz.adapters.sglang import compat, shipped
from attnfuzz.adapters.sglang.plugin import SGLANG

FAKE = "attnfuzz_fake_sglang"


@pytest.fixture
def fake_release(monkeypatch):
    """``FAKE.backend``: a backend with only the capture/replay pair of 0.5.12 and older."""
    pkg = types.ModuleType(FAKE)
    pkg.__path__ = []
    backend = types.ModuleType(f"{FAKE}.backend")

    class Backend:
        def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None: ...

        def init_forward_metadata_replay_cuda_graph(self, bs: int) -> None: ...

    backend.Backend = Backend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, FAKE, pkg)
    monkeypatch.setitem(sys.modules, f"{FAKE}.backend", backend)
    compat.binding._missing.cache_clear()
    yield
    compat.binding._missing.cache_clear()


def _api(attr: str) -> compat.Api:
    return compat.Api(f"{FAKE}.backend", attr)


def test_an_adapter_binds_the_older_form_where_the_newer_is_missing(fake_release, monkeypatch):
    new = (_api("Backend.init_forward_metadata_out_graph"),)
    old = (
        _api("Backend.init_forward_metadata_capture_cuda_graph"),
        _api("Backend.init_forward_metadata_replay_cuda_graph"),
    )
    monkeypatch.setitem(compat.REQUIRES, "fake_adapter", (_api("Backend"),))
    monkeypatch.setitem(compat.ALTERNATIVES, "fake_adapter", (new, old))
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    assert compat.binding_problem("fake_adapter", "run", "0.5.12") is None
    assert not compat.has(new[0]) and all(compat.has(a) for a in old)


def test_a_release_without_any_form_is_refused_in_one_line_naming_the_newest(
    fake_release, monkeypatch
):
    new = (_api("Backend.init_forward_metadata_out_graph"),)
    older = (_api("Backend.init_forward_metadata_replay"),)
    monkeypatch.setitem(compat.ALTERNATIVES, "fake_adapter", (new, older))
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    why = compat.binding_problem("fake_adapter", "run", "0.5.12")
    assert why == (
        f"SGLang 0.5.12: {FAKE}.backend.Backend.init_forward_metadata_out_graph is missing "
        "(nor any older form of it)"
    )


def test_the_upstream_mutant_of_27545_needs_the_fix_it_reverts():
    """On a release that ships #27545 there is no fix to revert: the mutant refuses,
    naming the release that brought the function it patches."""
    apis = compat.requirements("triton_backend", "upstream_pr27545_draft_extend_stride")
    assert compat.TRITON_DRAFT_EXTEND_BUFFERS in apis
    assert compat.TRITON_DRAFT_EXTEND_BUFFERS.since == "0.5.13"


def test_the_triton_adapter_has_a_form_for_each_release_line():
    forms = compat.ALTERNATIVES["triton_backend"]
    assert forms[0] == (compat.TRITON_GRAPH, compat.TRITON_GRAPH_IN, compat.REPLAY_FB_VIEW)
    assert (compat.TRITON_CAPTURE_OLD, compat.TRITON_REPLAY_OLD) in forms


@pytest.mark.parametrize(
    "version, impl, ships",
    [("0.5.12", "sglang-triton", "#27545"), ("0.5.10", "sglang-triton", "#27545"),
     ("0.5.13", "sglang-triton", None), ("0.5.9", "sglang-triton", "draft-extend-kv"),
     ("0.5.11", "sglang", "#24743"), ("0.5.12", "sglang", None), ("0.5.23", "sglang", None)],
)  # fmt: skip
def test_the_shipped_bugs_hold_on_the_releases_that_ship_them(version, impl, ships):
    from dataclasses import replace

    target = "spec-indptr" if impl == "sglang-triton" else "graph-input-padding"
    engine = replace(SGLANG, installed_version=lambda: version)
    bug = engine.shipped_bug(target, impl)
    assert (bug.ref if bug else None) == ships
    assert SGLANG.shipped_bugs == shipped.SHIPPED_BUGS
    for b in shipped.SHIPPED_BUGS:  # both releases in the supported range, in order
        assert compat.release_key(compat.OLDEST) <= compat.release_key(b.last_buggy)
        assert compat.release_key(b.last_buggy) < compat.release_key(b.first_fixed)
        assert compat.release_key(b.first_fixed) <= compat.release_key(compat.NEWEST)
