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
     ("0.5.11", "sglang", "#24743"), ("0.5.12", "sglang", None), ("0.5.23", "sglang", None),
     ("0.5.9", "sglang-dsa", "#19016"), ("0.5.10", "sglang-dsa", None)],
)  # fmt: skip
def test_the_shipped_bugs_hold_on_the_releases_that_ship_them(version, impl, ships):
    from dataclasses import replace

    targets = {"sglang-triton": "spec-indptr", "sglang-dsa": "dsa-metadata"}
    target = targets.get(impl, "graph-input-padding")
    engine = replace(SGLANG, installed_version=lambda: version)
    bug = engine.shipped_bug(target, impl)
    assert (bug.ref if bug else None) == ships
    assert SGLANG.shipped_bugs == shipped.SHIPPED_BUGS
    for b in shipped.SHIPPED_BUGS:  # both releases in the supported range, in order
        assert compat.release_key(compat.OLDEST) <= compat.release_key(b.last_buggy)
        assert compat.release_key(b.last_buggy) < compat.release_key(b.first_fixed)
        assert compat.release_key(b.first_fixed) <= compat.release_key(compat.NEWEST)


# -- the DSA backend of 0.5.9 and 0.5.10 (nsa_backend.py) ------------------------------


class NativeSparseAttnBackend:
    """0.5.9's backend as far as the binding looks: the capture/replay pair, and a replay
    whose draft extend reads the accept counts (as 0.5.9's and 0.5.10's does)."""

    def init_forward_metadata(self, forward_batch: object) -> None: ...

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None: ...

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, spec_info: object = None, seq_lens_cpu: object = None
    ) -> None:
        extend_seq_lens = spec_info.accept_length[:bs]  # type: ignore[attr-defined]
        del extend_seq_lens


@pytest.fixture
def nsa_release(monkeypatch):
    """SGLang as 0.5.9 looks: ``nsa_backend.NativeSparseAttnBackend``, no ``dsa_backend``,
    no fused metadata kernels, no buffer registry (None in ``sys.modules``: import fails)."""
    nsa = types.ModuleType(compat.NSA_BACKEND.module)
    nsa.NativeSparseAttnBackend = NativeSparseAttnBackend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, compat.NSA_BACKEND.module, nsa)
    for gone in (compat.DSA_BACKEND, compat.DSA_FUSED, compat.DSA_EXPAND, compat.DECODE_REGISTRY):
        monkeypatch.setitem(sys.modules, gone.module, None)
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    compat.binding._missing.cache_clear()
    yield
    compat.binding._missing.cache_clear()


def test_the_dsa_adapter_has_a_form_for_each_release_line():
    forms = compat.ALTERNATIVES["dsa_backend"]
    assert compat.DSA_GRAPH in forms[0] and compat.REPLAY_FB_VIEW in forms[0]
    assert forms[1] == (compat.NSA_BACKEND, compat.NSA_CAPTURE, compat.NSA_REPLAY)


def test_the_dsa_adapter_binds_0_5_9s_native_sparse_backend(nsa_release):
    from attnfuzz.adapters.sglang import dsa_backend

    assert compat.binding_problem("dsa_backend", "run", "0.5.9") is None
    assert dsa_backend._nsa()
    assert dsa_backend._backend_class() is NativeSparseAttnBackend


def test_without_the_fused_kernels_the_fused_replay_refuses_in_one_line(nsa_release):
    for attr in ("run_fused", "upstream_pr19016_context_len_table"):
        why = compat.binding_problem("dsa_backend", attr, "0.5.9")
        assert why is not None and "\n" not in why
        assert why.startswith(f"SGLang 0.5.9: importing {compat.DSA_FUSED.module} failed"), why


def test_the_metadata_s_sparse_fields_are_read_under_either_name():
    from attnfuzz.adapters.sglang.dsa_backend import _sparse

    assert _sparse(types.SimpleNamespace(nsa_seqlens_expanded=1), "seqlens_expanded") == 1
    both = types.SimpleNamespace(dsa_cu_seqlens_k=2, nsa_cu_seqlens_k=3)
    assert _sparse(both, "cu_seqlens_k") == 2


def _dsa_case(phase: int, graph: bool = True):
    from attnfuzz.harness.testing import spec_config
    from attnfuzz.reference.batch import Batch, Case

    config = spec_config(max_model_len=8, cudagraph_capture_sizes=(2, 4))
    params = (("dsa_index_topk", 1), ("dsa_page_log2", 0), ("dsa_phase", phase))
    return Case(config, Batch((3,), (1,), seed=0, use_cudagraph=graph), params)


def test_a_replayed_draft_extend_is_declined_where_the_replay_reads_accept_counts(
    nsa_release, monkeypatch
):
    from attnfuzz.adapters.sglang import dsa_backend
    from attnfuzz.reference import dsa_metadata as ref

    monkeypatch.setattr(dsa_backend, "prepare", lambda: None)
    monkeypatch.setattr(compat, "installed_version", lambda: "0.5.9")
    replayed = _dsa_case(ref.PHASES.index(ref.DRAFT_EXTEND))
    assert ref.graph_bs(replayed) is not None
    why = dsa_backend.declines(replayed)
    assert why is not None and why.startswith("SGLang 0.5.9's NativeSparseAttnBackend")
    assert "spec_info.accept_length" in why
    assert dsa_backend.declines(_dsa_case(ref.PHASES.index(ref.DRAFT_EXTEND), graph=False)) is None
    assert dsa_backend.declines(_dsa_case(ref.PHASES.index(ref.TARGET_VERIFY))) is None


def test_sglang_dsa_declines_through_its_adapter():
    from attnfuzz.adapters.sglang.plugin import IMPLEMENTATIONS

    impls = {impl.name: impl for impl in IMPLEMENTATIONS["dsa-metadata"]}
    for name in ("sglang-dsa", "sglang-dsa-fused"):
        assert repr(impls[name].declines) == "<sglang dsa_backend.declines>"


# -- the decode graph runner of 0.5.11 and 0.5.12 (populate_from_forward_batch) ---------


class DecodeInputBuffers:
    """0.5.11's runner buffers as far as the binding looks."""

    @classmethod
    def create(cls, *, max_bs: int, is_hybrid_swa: bool = False) -> DecodeInputBuffers: ...

    def populate_from_forward_batch(self, *, forward_batch: object, raw_bs: int) -> None: ...


def test_the_graph_runner_binds_0_5_11s_populate_from_forward_batch(nsa_release, monkeypatch):
    from attnfuzz.adapters.sglang import graph_runner

    runner = types.ModuleType(compat.DECODE_POPULATE.module)
    runner.DecodeInputBuffers = DecodeInputBuffers  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, compat.DECODE_POPULATE.module, runner)
    assert compat.ALTERNATIVES["graph_runner"][1] == (
        compat.DECODE_POPULATE,
        compat.DECODE_BUFFERS_SWA,
    )
    assert compat.binding_problem("graph_runner", "run", "0.5.11") is None
    assert graph_runner._populate()
    # #24743 reverted is re-created in the registry's fill: no registry, no mutant.
    why = compat.binding_problem("graph_runner", "upstream_stale_swa_slots", "0.5.11")
    assert why is not None and "\n" not in why


def test_the_graph_runner_refuses_a_runner_without_the_sliding_window_buffer(
    nsa_release, monkeypatch
):
    class Older:
        @classmethod
        def create(cls, *, max_bs: int) -> Older: ...

        def populate_from_forward_batch(self) -> None: ...

    runner = types.ModuleType(compat.DECODE_POPULATE.module)
    runner.DecodeInputBuffers = Older  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, compat.DECODE_POPULATE.module, runner)
    why = compat.binding_problem("graph_runner", "run", "0.5.10")
    assert why is not None and why.endswith("(nor any older form of it)")
