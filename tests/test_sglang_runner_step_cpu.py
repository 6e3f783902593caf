"""SGLang's attention backends of a CPU server, and torch's FlexAttention one, beside the
Triton engine (runner-step's ``sglang-cpu-backends``): Intel AMX's, torch SDPA's and
FlexAttention's eager builds, held to Triton's by agreement across backends, and the
kernel stand-ins Intel AMX is built with."""

from __future__ import annotations

import pytest
from attnfuzz.adapters.sglang.testing import arrive_then_decode, life
from attnfuzz.adapters.sglang.testing import sglang_test as _sglang
from attnfuzz.reference import runner_step as ref


def _backend(out, where: str):
    (build,) = [b for b in out.builds if b.how == "backend" and b.where.startswith(where)]
    return {f.name: f.values.tolist() for f in build.fields}


def _eager(out):
    (build,) = [b for b in out.builds if b.how == "eager"]
    return {f.name: f.values.tolist() for f in build.fields}


@_sglang
def test_both_cpu_backends_read_the_keys_triton_reads_on_a_decode():
    from attnfuzz.adapters.sglang import runner_step_cpu

    arrive, step = life(runner_step_cpu.run, arrive_then_decode(num_spec=0))
    for out in (arrive, step):
        triton = _eager(out)
        for where in ("intel_amx_backend.py", "torch_native_backend.py", "torch_flex_backend.py"):
            backend = _backend(out, where)
            assert backend["kv_len"] == triton["kv_len"], where
            assert backend["kv_slots"] == triton["kv_slots"], where
        assert ref.violations(out) == []
    assert _backend(step, "intel_amx_backend.py")["kv_len"] == [6, 4, 2]
    assert "amx.seq_lens" not in _backend(step, "intel_amx_backend.py")  # a decode: none
    # FlexAttention's masks: an extend's pads each request's queries to its sequence.
    assert _backend(arrive, "torch_flex_backend.py")["flex.q_len"] == [5, 3, 1]
    assert _backend(step, "torch_flex_backend.py")["flex.q_len"] == [1, 1, 1]
    assert _backend(step, "torch_flex_backend.py")["flex.kv_len"] == [6, 4, 2]


@_sglang
def test_a_flex_mask_short_of_its_request_s_keys_fails_agreement_within_the_build(monkeypatch):
    """A FlexAttention backend whose decode masks take the KV before the step's token (its
    key forgotten): the forward would hand flex_attention a mask of one key fewer than
    the keys it reads; ``flex.kv_len`` disagrees with ``seq_lens``."""
    from attnfuzz.adapters.sglang import runner_step_cpu

    runner_step_cpu.prepare()
    from sglang.srt.layers.attention import torch_flex_backend

    real = torch_flex_backend.create_block_mask

    def one_short(mask_mod, b, h, q_len, kv_len, **kwargs):
        short = mask_mod is torch_flex_backend.TorchFlexAttnBackend._decode_mask
        return real(mask_mod, b, h, q_len, kv_len - 1 if short else kv_len, **kwargs)

    monkeypatch.setattr(torch_flex_backend, "create_block_mask", one_short)
    _, step = life(runner_step_cpu.run, arrive_then_decode(num_spec=0))
    found = {(v.prop, v.field) for v in ref.violations(step)}
    assert ("agreement within a build", "flex.kv_len") in found


@_sglang
def test_intel_amx_derives_a_verify_s_extend_metadata_and_torch_native_is_declined():
    """A verify of two tokens a request: Intel AMX's extend metadata, from the verify's
    spec_info, is the whole KV (prefix and window), the window, and each request's first
    token; torch_native and flex_attention, with no verify, run no build of it."""
    from attnfuzz.adapters.sglang import runner_step_cpu

    _, verify = life(runner_step_cpu.run, arrive_then_decode(num_spec=1))
    amx = _backend(verify, "intel_amx_backend.py")
    assert amx["amx.seq_lens"] == [7, 5, 3]
    assert amx["amx.extend_seq_lens"] == [2, 2, 2]
    assert amx["amx.extend_start_loc"] == [0, 2, 4]
    assert amx["kv_slots"] == _eager(verify)["kv_slots"]
    for where in ("torch_native_backend.py", "torch_flex_backend.py"):
        assert not [b for b in verify.builds if b.where.startswith(where)]
    assert ref.violations(verify) == []


@_sglang
def test_a_verify_s_window_forgotten_by_intel_amx_fails_agreement_across_backends(monkeypatch):
    """An Intel AMX whose verify metadata takes the committed prefix as the whole KV (the
    draft window forgotten): in range, and caught only by Triton's KV lengths."""
    from attnfuzz.adapters.sglang import runner_step_cpu

    runner_step_cpu.prepare()
    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend

    real = IntelAMXAttnBackend._build_extend_metadata

    def window_forgotten(self, forward_batch):
        seq_lens, extend_lens, start_loc, mask = real(self, forward_batch)
        if forward_batch.forward_mode.is_target_verify():
            seq_lens = forward_batch.seq_lens
        return seq_lens, extend_lens, start_loc, mask

    monkeypatch.setattr(IntelAMXAttnBackend, "_build_extend_metadata", window_forgotten)
    _, verify = life(runner_step_cpu.run, arrive_then_decode(num_spec=1))
    found = {(v.prop, v.field) for v in ref.violations(verify)}
    assert ("agreement across backends", "kv_len") in found
    assert ("agreement across backends", "kv_slots") in found


@_sglang
def test_the_cpu_kernel_stand_ins_exist_while_built_and_are_never_callable():
    """Where SGLang's CPU kernels are not installed: while Intel AMX is built,
    ``sgl_kernel`` imports and its two attention operators exist; calling one raises
    (no implementation); after it, no ``sgl_kernel`` module is left behind."""
    import sys

    import torch
    from attnfuzz.adapters.sglang import runner_step_cpu

    installed = "sgl_kernel" in sys.modules
    with runner_step_cpu.cpu_kernels():
        import sgl_kernel  # noqa: F401

        for op in runner_step_cpu.CPU_OPS:
            assert hasattr(torch.ops.sgl_kernel, op)
    assert ("sgl_kernel" in sys.modules) == installed
    if not installed:
        with pytest.raises((NotImplementedError, RuntimeError)):
            torch.ops.sgl_kernel.decode_attention_cpu()
