"""vLLM 0.33.0's model runner V1 step of a sparse-attention MLA model on the XPU sparse MLA
backend, as the implementation ``vllm-v1-xpu-mla-sparse`` of ``runner-step``:
``XPUMLASparseMetadataBuilder`` builds every step (the drafter's too), each token routed
as a decode and mapped to its request in the builder's buffer, judged by the step's
properties."""

from __future__ import annotations

import dataclasses

import pytest
from attnfuzz.adapters.vllm.testing import Calls, own, requires_vllm, run_trace, values
from attnfuzz.reference import runner_step as ref
from attnfuzz.reference.batch import Batch
from attnfuzz.reference.trace import Trace

pytestmark = [*requires_vllm]


def xpu():
    from attnfuzz.adapters.vllm import runner_step_xpu_mla_sparse

    return runner_step_xpu_mla_sparse


def verify_beside_a_chunk() -> Trace:
    """Two requests prefill 3 and 5 tokens, then request 0 verifies 2 tokens (one draft)
    beside a chunk of 3 more of request 1; FULL_AND_PIECEWISE asked for, graphs of 4
    and 8 tokens."""
    from attnfuzz.adapters.vllm import runner_step_hybrid

    config = runner_step_hybrid.smallest_full_spec_decode().config
    steps = (
        Batch((0, 0), (3, 5), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(1, 1)),
        Batch((3, 5), (2, 3), req_ids=(0, 1), pages=((1,), (2,)), new_pages=(0, 0)),
    )
    return Trace(config, steps)


def test_the_xpu_builder_builds_every_step_routing_every_token_as_a_decode(monkeypatch):
    """A prefill, then a verify beside a chunk: ``XPUMLASparseMetadataBuilder.build`` builds
    every forward (the drafter's too), its metadata all decodes (``num_decodes`` the
    requests, ``num_decode_tokens`` the tokens, no prefill), each token's request in the
    builder's buffer; the NEVER builder leaves PIECEWISE of FULL_AND_PIECEWISE; every
    property holds."""
    m = xpu()
    m.prepare()
    from vllm.config import CUDAGraphMode
    from vllm.v1.attention.backends.mla.xpu_mla_sparse import XPUMLASparseMetadataBuilder

    built = []
    original = XPUMLASparseMetadataBuilder.build

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        meta = original(self, common_prefix_len, common_attn_metadata, fast_build)
        built.append((meta.num_reqs, meta.num_actual_tokens, meta.num_decodes,
                      meta.num_prefills, meta.num_decode_tokens))  # fmt: skip
        return meta

    monkeypatch.setattr(XPUMLASparseMetadataBuilder, "build", build)
    calls = Calls(monkeypatch)
    calls.count(XPUMLASparseMetadataBuilder, "build")
    engine = m.XPUMLASparseRunnerStepEngine()
    first, second = run_trace(verify_beside_a_chunk(), engine)
    assert calls["build"] > 0 and len(calls) == 1
    builder = engine.graphs.runner.attn_groups[0][0].get_metadata_builder()
    assert isinstance(builder, XPUMLASparseMetadataBuilder)
    assert engine.graphs.vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert ref.violations(first) == [] and ref.violations(second) == []
    assert all(d == r and p == 0 and dt == t for r, t, d, p, dt in built)
    assert (2, 5, 2, 0, 5) in built
    (eager,) = own(second, "eager")
    assert values(eager, "sparse.req_id_per_token") == [0, 0, 1, 1, 1]
    assert values(eager, "xpu_sparse.query_start_loc") == [0, 2, 5]
    assert values(eager, "xpu_sparse.mqa") == [1, 1, 1, 1, 1]
    assert [row[0] for row in values(eager, "sparse.block_table")] == [1, 2]
    assert any(b.draft is not None and b.field("sparse.req_id_per_token") for b in second.builds)


def test_a_token_mapped_past_the_step_s_requests_is_unsafe(monkeypatch):
    """Safe padding holds ``sparse.req_id_per_token`` to the block table's rows: a build
    that maps every token one request on fails it."""
    m = xpu()
    m.prepare()
    from vllm.v1.attention.backends.mla.xpu_mla_sparse import XPUMLASparseMetadataBuilder

    original = XPUMLASparseMetadataBuilder.build

    def shifted(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        meta.req_id_per_token = meta.req_id_per_token + 1
        return meta

    monkeypatch.setattr(XPUMLASparseMetadataBuilder, "build", shifted)
    _, second = run_trace(verify_beside_a_chunk(), m.XPUMLASparseRunnerStepEngine())
    unsafe = {v.field for v in ref.violations(second) if v.prop == "safe padding"}
    assert unsafe == {"sparse.req_id_per_token"}


def test_a_token_routed_to_the_mha_path_is_unsafe(monkeypatch):
    """``xpu_sparse.mqa`` holds every token to ``forward_mqa``: a build that counts one
    token fewer as a decode fails it (the XPU backend has no MHA path)."""
    m = xpu()
    m.prepare()
    from vllm.v1.attention.backends.mla.xpu_mla_sparse import XPUMLASparseMetadataBuilder

    original = XPUMLASparseMetadataBuilder.build

    def short(self, *args, **kwargs):
        meta = original(self, *args, **kwargs)
        meta.num_decode_tokens -= 1
        return meta

    monkeypatch.setattr(XPUMLASparseMetadataBuilder, "build", short)
    _, second = run_trace(verify_beside_a_chunk(), m.XPUMLASparseRunnerStepEngine())
    unsafe = {v.field for v in ref.violations(second) if v.prop == "safe padding"}
    assert unsafe == {"xpu_sparse.mqa"}


def test_full_graphs_are_declined_as_vllm_refuses_them():
    """The NEVER builder: vLLM's mode resolution raises for FULL (declined), turns
    FULL_DECODE_ONLY into PIECEWISE; pages of 8 run (the backend takes any)."""
    m = xpu()
    m.prepare()
    import torch
    from vllm.config import CUDAGraphMode

    config = verify_beside_a_chunk().config
    full = dataclasses.replace(config, cudagraph_mode="FULL")
    assert "NEVER" in m.declines_config(full)
    with pytest.raises(ValueError, match="NEVER"):
        m._XPUMLASparseEngine(full, torch.device("cpu"), "FULL")
    decode_only = m._XPUMLASparseEngine(config, torch.device("cpu"), "FULL_DECODE_ONLY")
    assert decode_only.vllm_config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert m.declines_config(dataclasses.replace(config, block_size=8)) is None
    assert m.declines_config(dataclasses.replace(config, runner="v2")) is not None
