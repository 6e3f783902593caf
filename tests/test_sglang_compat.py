"""SGLang's binding across releases, found by feature detection (``adapters/sglang/compat.py``).

These run without SGLang: the APIs probed are stand-in modules. What the real
releases do is measured by ``benchmarks/releases.py --engine sglang bugs``.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
from attnfuzz.adapters.sglang import compat, shipped
from attnfuzz.adapters.sglang.plugin import SGLANG
from attnfuzz.adapters.sglang.testing import requires_sglang


def _needs_sglang_environment(test):  # noqa: ANN001, ANN202
    """A test whose fake release still goes through SGLang's environment set-up,
    which imports transformers (installed with SGLang): it runs where SGLang is
    installed, as CI's engine job has it, and skips elsewhere, saying why."""
    for mark in requires_sglang:
        test = mark(test)
    return test


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
     ("0.5.11", "sglang", "#24743"), ("0.5.12", "sglang", "#24401"),
     ("0.5.13", "sglang", "#24401"), ("0.5.14", "sglang", None), ("0.5.23", "sglang", None),
     ("0.5.9", "sglang-dsa", "#19016"), ("0.5.10", "sglang-dsa", None),
     ("0.5.9", "sglang-trtllm-mla", "#21987"), ("0.5.10", "sglang-trtllm-mla", None),
     ("0.5.23", "sglang-trtllm-mla", None)],
)  # fmt: skip
def test_the_shipped_bugs_hold_on_the_releases_that_ship_them(version, impl, ships):
    from dataclasses import replace

    targets = {
        "sglang-triton": "spec-indptr",
        "sglang-dsa": "dsa-metadata",
        "sglang-trtllm-mla": "mla-block-table",
    }
    target = targets.get(impl, "graph-input-padding")
    engine = replace(SGLANG, installed_version=lambda: version)
    bug = engine.shipped_bug(target, impl)
    assert (bug.ref if bug else None) == ships
    assert SGLANG.shipped_bugs == shipped.SHIPPED_BUGS
    for b in shipped.SHIPPED_BUGS:  # both releases in the supported range, in order
        assert compat.release_key(compat.OLDEST) <= compat.release_key(b.last_buggy)
        if b.first_fixed is None:  # present in the newest release: shipped up to it
            assert b.last_buggy == compat.NEWEST, b.ref
            continue
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


@_needs_sglang_environment
def test_the_dsa_adapter_binds_0_5_9s_native_sparse_backend(nsa_release):
    from attnfuzz.adapters.sglang import dsa_backend

    assert compat.binding_problem("dsa_backend", "run", "0.5.9") is None
    assert dsa_backend._nsa()
    assert dsa_backend._backend_class() is NativeSparseAttnBackend


@_needs_sglang_environment
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


@_needs_sglang_environment
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


@_needs_sglang_environment
def test_the_graph_runner_binds_0_5_11s_populate_from_forward_batch(nsa_release, monkeypatch):
    from attnfuzz.adapters.sglang import graph_runner

    runner = types.ModuleType(compat.DECODE_POPULATE.module)
    runner.DecodeInputBuffers = DecodeInputBuffers  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, compat.DECODE_POPULATE.module, runner)
    assert compat.ALTERNATIVES["graph_runner"][-1] == (
        compat.DECODE_POPULATE,
        compat.DECODE_BUFFERS_SWA,
    )
    assert compat.binding_problem("graph_runner", "run", "0.5.11") is None
    assert graph_runner._populate()
    # #24743 reverted is re-created in the registry's fill: no registry, no mutant.
    why = compat.binding_problem("graph_runner", "upstream_stale_swa_slots", "0.5.11")
    assert why is not None and "\n" not in why


@_needs_sglang_environment
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


# -- the TRT-LLM MLA backend of 0.5.9 and 0.5.10 (the capture/replay pair) --------------


class TRTLLMMLABackend:
    """0.5.9's backend as far as the binding looks: the capture/replay pair."""

    def init_forward_metadata(self, forward_batch: object) -> None: ...

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None: ...

    def init_forward_metadata_replay_cuda_graph(
        self, bs: int, spec_info: object = None, seq_lens_cpu: object = None
    ) -> None: ...


@dataclasses.dataclass
class EagleDraftInput:
    """0.5.9's draft input as far as the adapter builds it (``eagle_info.py``)."""

    accept_length: object = None
    accept_length_cpu: object = None
    num_tokens_per_req: int = -1


@pytest.fixture
def trtllm_old_release(monkeypatch):
    """SGLang as 0.5.9 looks to the TRT-LLM MLA adapter: the backend with the capture/replay
    pair, ``EagleDraftInput`` and no ``EagleDraftExtendInput``, none of 0.5.23's kernels,
    translator, replay view or draft-extend fill (None in ``sys.modules``: import fails)."""
    # The runner's ForwardBatch module is in every release: loaded as a process running
    # the adapter has it, before the later releases' modules it imports are hidden.
    from attnfuzz.adapters.sglang import trtllm_mla

    trtllm_mla.prepare()
    import sglang.srt.model_executor.forward_batch_info  # noqa: F401

    backend = types.ModuleType(compat.TRTLLM_MLA_BACKEND.module)
    backend.TRTLLMMLABackend = TRTLLMMLABackend  # type: ignore[attr-defined]
    eagle_info = types.ModuleType(compat.EAGLE_DRAFT_ACCEPT_LENGTH.module)
    eagle_info.EagleDraftInput = EagleDraftInput  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, backend.__name__, backend)
    monkeypatch.setitem(sys.modules, eagle_info.__name__, eagle_info)
    gone = (*compat.KV_INDICES_KERNELS, compat.KV_INDEX_TRANSLATOR, compat.REPLAY_FB_VIEW)
    for api in (*gone, compat.DRAFT_EXTEND_FILL):
        monkeypatch.setitem(sys.modules, api.module, None)
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    compat.binding._missing.cache_clear()
    yield
    compat.binding._missing.cache_clear()


def test_the_trtllm_mla_adapter_has_a_form_for_each_release_line():
    forms = compat.ALTERNATIVES["trtllm_mla"]
    assert compat.TRTLLM_MLA_GRAPH in forms[0] and compat.REPLAY_FB_VIEW_GLOBAL in forms[0]
    assert forms[1] == (
        compat.TRTLLM_MLA_CAPTURE_OLD,
        compat.TRTLLM_MLA_REPLAY_OLD,
        compat.EAGLE_DRAFT_ACCEPT_LENGTH,
    )


@_needs_sglang_environment
def test_the_trtllm_mla_adapter_binds_0_5_9s_capture_replay_pair(trtllm_old_release):
    from attnfuzz.adapters.sglang import trtllm_mla

    for attr in ("run", "run_context_len"):
        assert compat.binding_problem("trtllm_mla", attr, "0.5.9") is None
    assert trtllm_mla._old()


@_needs_sglang_environment
def test_the_upstream_mutant_of_21987_refuses_where_the_bug_ships(trtllm_old_release):
    """0.5.9 ships #21987 in its own replay: no fix to revert, the mutant refuses in one
    line naming the release its ``init_forward_metadata_out_graph`` form binds from."""
    why = compat.binding_problem("trtllm_mla", "upstream_pr21987_accept_length_layout", "0.5.9")
    assert why is not None and "\n" not in why
    assert why.startswith(f"SGLang 0.5.9: {compat.TRTLLM_MLA_GRAPH} is missing; it binds from")
    assert "SGLang 0.5.23" in why


@_needs_sglang_environment
def test_a_release_without_either_trtllm_mla_form_is_refused(trtllm_old_release, monkeypatch):
    class Between:  # 0.5.13 to 0.5.22: out_graph, but not 0.5.23's kernels
        def init_forward_metadata(self, forward_batch: object) -> None: ...

        def init_forward_metadata_out_graph(self, forward_batch: object) -> None: ...

    monkeypatch.setattr(sys.modules[compat.TRTLLM_MLA_BACKEND.module], "TRTLLMMLABackend", Between)
    why = compat.binding_problem("trtllm_mla", "run", "0.5.14")
    assert why is not None and why.endswith("(nor any older form of it)")


@_needs_sglang_environment
def test_0_5_9s_draft_extend_carries_the_accept_counts_as_accept_length(trtllm_old_release):
    """0.5.9's ``accept_length`` in a v2 draft extend is the count with the bonus token
    (``eagle_info_v2.py``: ``accept_length.add_(1)  # Include the bonus token``), as a
    case's ``accept_lens``: handed over unchanged."""
    import torch
    from attnfuzz.adapters.sglang import trtllm_mla

    accept = torch.tensor([1, 3], dtype=torch.int32)
    spec = trtllm_mla._draft_extend_input(3, accept)
    assert isinstance(spec, EagleDraftInput)
    assert spec.accept_length is accept and spec.num_tokens_per_req == 3
    assert spec.accept_length_cpu is None  # as the v2 worker leaves it


class _ReplayRecorder:
    """A backend that records the replay's call (0.5.9's signature)."""

    def init_forward_metadata_replay_cuda_graph(self, **kwargs: object) -> None:
        self.call = kwargs


@_needs_sglang_environment
def test_0_5_9s_draft_extend_replay_pads_as_its_runner_does(trtllm_old_release):
    """``EAGLEDraftExtendCudaGraphRunner.replay`` of 0.5.9: padding requests of the fill
    length with accept count ``N``, the whole buffers passed, ``accept_length`` the
    padded buffer's first ``bs`` rows; the padded ``req_pool_indices`` as the buffer held
    them (that runner does not reset them)."""
    import torch
    from attnfuzz.adapters.sglang import trtllm_mla

    N, max_bs, bs, fill = 2, 4, 3, 1
    inputs = types.SimpleNamespace(graph_bs=bs, next_n=N, req_to_token=torch.zeros(5, 8))
    buffers = trtllm_mla._buffers(inputs, max_bs, fill)
    buffers.req_pool_indices.fill_(7)  # a previous replay's rows
    accept = torch.tensor([1, 2], dtype=torch.int32)
    fb = types.SimpleNamespace(
        batch_size=2,
        input_ids=torch.zeros(2 * N, dtype=torch.int64),
        seq_lens=torch.tensor([5, 6]),
        seq_lens_cpu=torch.tensor([5, 6]),
        seq_lens_sum=11,
        req_pool_indices=torch.tensor([1, 2]),
        extend_seq_lens=torch.tensor([N, N], dtype=torch.int32),
        spec_info=trtllm_mla._draft_extend_input(N, accept),
    )
    backend = _ReplayRecorder()
    trtllm_mla._replay_draft_extend_old(backend, inputs, fb, buffers, fill)
    call = backend.call
    assert call["bs"] == bs and call["seq_lens_sum"] == 11 + fill
    assert call["seq_lens"] is buffers.seq_lens and call["seq_lens_cpu"] is buffers.seq_lens_cpu
    assert call["seq_lens"].tolist() == [5, 6, fill, fill]
    assert call["req_pool_indices"].tolist() == [1, 2, 7, 7]
    assert call["spec_info"].accept_length.tolist() == [1, 2, N]


# -- the decode graph runner of 0.5.13 (the registry, before runner_utils) ----------------


def _allocate_decode_buffers(*, max_bs: int, vocab_size: int, num_tokens_per_bs: int) -> object:
    """0.5.13's ``cuda_graph_runner._allocate_decode_buffers``, as far as the adapter calls it."""
    return types.SimpleNamespace(max_bs=max_bs, vocab_size=vocab_size, width=num_tokens_per_bs)


def _old_build_replay_fb_view(*, bs: int, seq_len_fill_value: int) -> object:
    """0.5.13's ``build_replay_fb_view``: no ``global_num_tokens_cpu``."""
    return types.SimpleNamespace(bs=bs, fill=seq_len_fill_value)


class CudaGraphBufferRegistry:
    def fill_from(self, forward_batch: object) -> None: ...


@pytest.fixture
def registry_0_5_13(monkeypatch):
    """SGLang as 0.5.13 looks to the graph runner: the buffer registry, the buffers and
    ``build_replay_fb_view`` in ``cuda_graph_runner.py``; no ``runner_utils``, no
    ``runner/decode_cuda_graph_runner.py`` (None in ``sys.modules``: import fails)."""
    import enum

    registry = types.ModuleType(compat.DECODE_REGISTRY.module)
    registry.build_decode_registry = lambda **kwargs: None  # type: ignore[attr-defined]
    registry.CudaGraphBufferRegistry = CudaGraphBufferRegistry  # type: ignore[attr-defined]
    registry.PaddingPolicy = enum.Enum("PaddingPolicy", "FOREACH_COPY ZERO")  # type: ignore[attr-defined]
    runner = types.ModuleType(compat.OLD_REPLAY_FB_VIEW.module)
    runner._allocate_decode_buffers = _allocate_decode_buffers  # type: ignore[attr-defined]
    runner.build_replay_fb_view = _old_build_replay_fb_view  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, registry.__name__, registry)
    monkeypatch.setitem(sys.modules, runner.__name__, runner)
    for gone in (compat.GRAPH_RUNNER_REGISTRY[0], compat.REPLAY_FB_VIEW):
        monkeypatch.setitem(sys.modules, gone.module, None)
    monkeypatch.delenv(compat.ANY_RELEASE, raising=False)
    compat.binding._missing.cache_clear()
    yield
    compat.binding._missing.cache_clear()


@_needs_sglang_environment
def test_the_graph_runner_binds_0_5_13s_registry(registry_0_5_13):
    from attnfuzz.adapters.sglang import graph_runner

    assert compat.ALTERNATIVES["graph_runner"][1] == compat.GRAPH_RUNNER_REGISTRY_0_5_13
    assert compat.binding_problem("graph_runner", "run", "0.5.13") is None
    assert not graph_runner._populate()


@_needs_sglang_environment
def test_0_5_13s_buffers_and_view_take_their_own_arguments(registry_0_5_13):
    """Each release's constructor and view get the arguments they take of both spellings."""
    from attnfuzz.adapters.sglang import graph_runner

    buffers = graph_runner._decode_buffers(
        max_bs=4, vocab_size=1, num_tokens_per_bs=2, num_tokens_per_req=2, num_dp_ranks=1
    )
    assert (buffers.max_bs, buffers.vocab_size, buffers.width) == (4, 1, 2)
    view = graph_runner._replay_fb_view(bs=4, seq_len_fill_value=1, global_num_tokens_cpu=None)
    assert (view.bs, view.fill) == (4, 1)
